//! A shared budget across real processes: this test binary starts copies of itself as
//! children (the ignored test `child`), which open one budget file and log every turn.
//!
//! A turn's record is three `CLOCK_MONOTONIC` stamps every process reads alike: before
//! asking, after the turn came, and before ending it. Its admission lies inside the first
//! two (the rates are checked on what is provably inside a window, as in
//! `shared_processes.rs`), and its permit is held over at least the last two (more than
//! the cap of those spans overlapping is a proven breach).

#![cfg(unix)]

use std::fs::{self, OpenOptions};
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use paceline::budget::BudgetError;
use paceline::shared::{OnMismatch, SharedBudget, SharedBudgetError, SharedError};
use paceline::Quota;

mod common;
use common::children::{
    assert_bounded, finish, finish_all, kill_at_random_points, logged, logging_vars, monotonic,
    role_and_file, spawn, var, Log, CHILD_ARGS,
};
use common::dir::Dir;

/// Requests: 40 per second (T = 25 ms), bursts of 4.
const REQUEST_T: u64 = 25_000_000;
const REQUEST_BURST: u64 = 4;
/// Tokens: 3 000 per second, bursts of 300; each call books 100 and settles 50-150.
const TOKENS_PER_SECOND: u64 = 3_000;
const TOKEN_BURST: u64 = 300;
const ESTIMATE: u32 = 100;
const CAP: u32 = 3;
/// How long the sharing test's calls take at least, in milliseconds (up to twice that).
const HOLD_MS: u64 = 100;
/// How soon a waiter must notice that what held it up belongs to a process that is gone
/// (it looks every 50 ms; generous for a loaded machine, well below the once a second
/// every waiter looks).
const QUICKLY: Duration = Duration::from_millis(600);

/// The requests' rate: 40 per second, bursts of [`REQUEST_BURST`].
fn requests() -> Quota {
    Quota::per_second(40).with_burst(REQUEST_BURST as u32)
}

/// The tokens' rate: [`TOKENS_PER_SECOND`], bursts of [`TOKEN_BURST`].
fn tokens() -> Quota {
    Quota::per_second(TOKENS_PER_SECOND as u32).with_burst(TOKEN_BURST as u32)
}

/// The budget of the tests: both rates, at most [`CAP`] turns in flight.
fn open(path: &Path) -> SharedBudget {
    SharedBudget::builder()
        .rate("requests", requests())
        .rate("tokens", tokens())
        .in_flight(CAP)
        .open(path)
        .unwrap()
}

/// A directory of the test's own, named `name`, and the budget in it (`budget`), opened.
fn opened(name: &str) -> (Dir, PathBuf, SharedBudget) {
    let dir = Dir::new(name);
    let file = dir.path("budget");
    let budget = open(&file);
    (dir, file, budget)
}

/// A thread that waits up to 10 s for a turn of one token on `budget`.
fn one_token_waiter(budget: &SharedBudget) -> thread::JoinHandle<Result<(), SharedBudgetError>> {
    let budget = budget.clone();
    thread::spawn(move || {
        budget
            .acquire_blocking_within(&[("tokens", 1)], Duration::from_secs(10))
            .map(drop)
    })
}

/// Reads `child`'s stdout until a line starting with `word`.
fn expect_line(child: &mut Child, word: &str) -> String {
    let out = child.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "no {word} line");
        if line.contains(word) {
            return line;
        }
    }
}

/// One turn: asked, came, ended (clock stamps), and the tokens it settled.
#[derive(Clone, Copy, Debug)]
struct Record {
    asked: u64,
    came: u64,
    ended: u64,
    tokens: u64,
}

/// The records of every child's log in `dir`, by when they asked.
fn records(dir: &Path) -> Vec<Record> {
    let mut all: Vec<_> = logged(dir)
        .into_iter()
        .map(|[asked, came, ended, tokens]| Record {
            asked,
            came,
            ended,
            tokens,
        })
        .collect();
    all.sort_unstable_by_key(|r| r.asked);
    all
}

/// The most turns provably in flight at one instant.
fn most_in_flight(records: &[Record]) -> usize {
    let mut events: Vec<(u64, i64)> = records
        .iter()
        .filter(|r| r.came < r.ended)
        .flat_map(|r| [(r.came, 1), (r.ended, -1)])
        .collect();
    // Ends before starts at one instant: only spans that provably overlap count.
    events.sort_unstable();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// A hammering thread: asks for turns (blocking or awaiting), holds each `hold` ms plus
/// up to as many again, settles 50-150 tokens, until `until`.
fn hammer(budget: &SharedBudget, log: &Log, until: Instant, seed: u64, awaits: bool, hold: u64) {
    let mut x = seed | 1;
    while Instant::now() < until {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let asked = monotonic();
        let cost = [("tokens", ESTIMATE)];
        // A deadline, so that a child of a broken budget fails instead of hanging.
        let patience = Duration::from_secs(20);
        let turn = if awaits {
            futures::executor::block_on(budget.acquire_within(&cost, patience))
        } else {
            budget.acquire_blocking_within(&cost, patience)
        }
        .unwrap();
        let came = monotonic();
        thread::sleep(Duration::from_millis(hold + x % hold.max(1)));
        let tokens = 50 + x % 101;
        let ended = monotonic();
        turn.settle(&[("tokens", tokens as u32)]).unwrap();
        log.record([asked, came, ended, tokens]);
    }
}

#[test]
#[ignore = "a child process of the tests in this file, started by them"]
fn child() {
    let Some((role, path)) = role_and_file() else {
        return;
    };
    if role == "open" {
        match SharedBudget::builder()
            .rate("requests", requests())
            .options(OnMismatch::Adopt)
            .open(&path)
        {
            Ok(_) => println!("OPENED"),
            Err(e) => println!("REFUSED {e}"),
        }
        return;
    }
    let budget = Arc::new(open(&path));
    match role.as_str() {
        "hammer" => {
            let secs: f64 = var("PACELINE_SECS").parse().unwrap();
            let log = Arc::new(Log::create(Path::new(&var("PACELINE_LOG"))));
            let until = Instant::now() + Duration::from_secs_f64(secs);
            let seed: u64 = var("PACELINE_INDEX").parse().unwrap();
            let hold: u64 = var("PACELINE_HOLD_MS").parse().unwrap();
            let workers: Vec<_> = (0..3u64)
                .map(|t| {
                    let (budget, log) = (budget.clone(), log.clone());
                    thread::spawn(move || hammer(&budget, &log, until, seed * 31 + t, t == 1, hold))
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
        }
        "hold" => {
            // Takes every permit, says so, and waits to be killed.
            let turns: Vec<_> = (0..CAP)
                .map(|_| budget.acquire_blocking(&[("tokens", 1)]).unwrap())
                .collect();
            println!("READY {}", turns.len());
            thread::sleep(Duration::from_secs(60));
        }
        "queue" => {
            // Waits in the queue (every permit is taken), says so, and waits to be killed.
            let waiting = budget.acquire(&[("tokens", 1)]);
            let mut waiting = Box::pin(waiting);
            let waker = std::task::Waker::noop();
            let polled = waiting
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker));
            assert!(polled.is_pending());
            println!("QUEUED");
            thread::sleep(Duration::from_secs(60));
        }
        "ask" => {
            // One turn of PACELINE_TOKENS tokens; says when it came.
            let tokens: u32 = var("PACELINE_TOKENS").parse().unwrap();
            let turn = budget
                .acquire_blocking_within(&[("tokens", tokens)], Duration::from_secs(20))
                .unwrap();
            println!("ADMITTED {}", monotonic());
            drop(turn);
        }
        other => panic!("no role {other}"),
    }
}

fn assert_within_budget(records: &[Record]) {
    let requests: Vec<_> = records.iter().map(|r| (r.asked, r.came)).collect();
    let windows = [50_000_000, 250_000_000, 1_000_000_000];
    assert_bounded(&requests, &windows, REQUEST_BURST, REQUEST_T);
    let most = most_in_flight(records);
    assert!(
        most <= CAP as usize,
        "{most} turns in flight; the cap is {CAP}"
    );
    // Tokens: what was settled by turns wholly inside the run is within the rate's
    // bound over it, plus the under-estimates of the turns in flight at once.
    let (first, last) = (
        records[0].asked,
        records.iter().map(|r| r.ended).max().unwrap(),
    );
    let settled: u64 = records.iter().map(|r| r.tokens).sum();
    let bound =
        TOKEN_BURST + (last - first) * TOKENS_PER_SECOND / 1_000_000_000 + u64::from(CAP) * 50 + 1;
    assert!(
        settled <= bound,
        "{settled} tokens settled; the bound is {bound}"
    );
}

#[test]
fn processes_share_the_rates_and_the_in_flight_cap() {
    let (dir, file, _) = opened("budget-share");
    let start = |i| {
        spawn(
            "hammer",
            &logging_vars(&dir.0, &file, i, 3.0, ("PACELINE_HOLD_MS", HOLD_MS)),
        )
    };
    finish_all((0..4).map(start).collect());
    let records = records(&dir.0);
    assert!(records.len() >= 30, "only {} turns in 3 s", records.len());
    assert_within_budget(&records);
    // Twelve threads holding their turns 100-200 ms want about 80 in flight: the cap
    // binds (and the rates nearly do). Every process was served.
    for i in 0..4 {
        let log = fs::read(dir.path(&format!("{i}.log"))).unwrap();
        assert!(
            log.len() >= 32 * 3,
            "process {i} had {} turns",
            log.len() / 32
        );
    }
}

#[test]
fn processes_killed_at_random_points_leave_the_others_served_and_bounded() {
    let (dir, file, _) = opened("budget-kill");
    let mut next = 0usize;
    let mut start = |secs| {
        next += 1;
        let vars = logging_vars(&dir.0, &file, next, secs, ("PACELINE_HOLD_MS", 10));
        spawn("hammer", &vars)
    };
    let running = (0..4).map(|_| start(4.0)).collect();
    // Killed holding turns, waiting for a permit, or inside the file's lock.
    let until = Instant::now() + Duration::from_secs(3);
    let killed = kill_at_random_points(running, until, 50..300, 0x9e37_79b9_7f4a_7c15, || {
        start(1.5)
    });
    assert!(killed >= 5, "only {killed} kills");
    assert_within_budget(&records(&dir.0));
    // The budget is whole: every permit can be had again.
    let budget = open(&file);
    let turns: Vec<_> = (0..CAP)
        .map(|_| {
            budget
                .acquire_blocking_within(&[("tokens", 1)], Duration::from_secs(5))
                .unwrap()
        })
        .collect();
    assert_eq!(budget.in_flight().unwrap(), CAP);
    drop(turns);
}

#[test]
fn the_permits_of_a_killed_process_return_to_the_others() {
    let (_dir, file, budget) = opened("budget-held");
    let mut holder = spawn("hold", &[("PACELINE_FILE", file.display().to_string())]);
    expect_line(&mut holder, "READY");
    assert_eq!(budget.in_flight().unwrap(), CAP);
    assert!(matches!(
        budget.try_acquire(&[("tokens", 1)]),
        Err(SharedBudgetError::Budget(BudgetError::WouldWait))
    ));
    // A waiter, then the kill: the waiter gets a permit without asking again.
    let waiter = one_token_waiter(&budget);
    thread::sleep(Duration::from_millis(100));
    // Killed and not yet reaped (a zombie, as under a parent that reaps late): gone.
    holder.kill().unwrap();
    let started = Instant::now();
    waiter.join().unwrap().unwrap();
    // The waiter looks under the lock every 50 ms, and clears out what is gone.
    assert!(started.elapsed() < QUICKLY, "{:?}", started.elapsed());
    holder.wait().unwrap();
    assert_eq!(budget.in_flight().unwrap(), 0);
}

#[test]
fn a_heavy_caller_of_one_process_is_not_overtaken_by_light_ones_of_another() {
    let (_dir, file, budget) = opened("budget-fifo");
    // Every token spent: 300 come back in 100 ms, 10 in 3.3 ms.
    let spent = budget.try_acquire(&[("tokens", 300)]).unwrap();
    drop(spent);
    let ask = |tokens: u32| {
        spawn(
            "ask",
            &[
                ("PACELINE_FILE", file.display().to_string()),
                ("PACELINE_TOKENS", tokens.to_string()),
            ],
        )
    };
    let mut heavy = ask(300);
    // The heavy caller is in the queue before the light ones arrive.
    let started = Instant::now();
    while budget.waiting().unwrap() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the heavy caller never queued"
        );
        thread::sleep(Duration::from_millis(1));
    }
    let mut light: Vec<_> = (0..3).map(|_| ask(10)).collect();
    let when = |child: &mut Child| -> u64 {
        let line = expect_line(child, "ADMITTED");
        line.split_whitespace().last().unwrap().parse().unwrap()
    };
    let heavy_at = when(&mut heavy);
    for child in &mut light {
        let light_at = when(child);
        assert!(light_at >= heavy_at, "a light caller went first");
    }
    finish(heavy, Duration::from_secs(30));
    for child in light {
        finish(child, Duration::from_secs(30));
    }
}

#[test]
fn a_waiter_behind_a_killed_head_moves_up() {
    let (_dir, file, budget) = opened("budget-dead-head");
    let mut turns: Vec<_> = (0..CAP)
        .map(|_| budget.try_acquire(&[("tokens", 1)]).unwrap())
        .collect();
    let mut head = spawn("queue", &[("PACELINE_FILE", file.display().to_string())]);
    expect_line(&mut head, "QUEUED");
    let waiter = one_token_waiter(&budget);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(budget.waiting().unwrap(), 2);
    head.kill().unwrap();
    head.wait().unwrap();
    turns.pop();
    let started = Instant::now();
    waiter.join().unwrap().unwrap();
    assert!(started.elapsed() < QUICKLY, "{:?}", started.elapsed());
}

#[test]
fn a_file_removed_under_its_processes_is_made_again_and_shared_again() {
    let (_dir, file, first) = opened("budget-removed");
    let held = first.try_acquire(&[("tokens", 1)]).unwrap();
    fs::remove_file(&file).unwrap();
    // A process that opens the path now makes a new file; the one that had it open goes
    // on in that new file too, so they still share one cap.
    let second = open(&file);
    let turns: Vec<_> = (0..CAP)
        .map(|_| second.try_acquire(&[("tokens", 1)]).unwrap())
        .collect();
    assert!(
        first.try_acquire(&[("tokens", 1)]).is_err(),
        "the cap is shared again"
    );
    assert_eq!(first.in_flight().unwrap(), CAP);
    // The turn from before the removal ends in the file it was taken in.
    held.settle(&[("tokens", 1)]).unwrap();
    drop(turns);
    assert_eq!(first.in_flight().unwrap(), 0);
}

#[test]
fn a_process_of_another_pid_namespace_is_refused() {
    // SAFETY: `geteuid` has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let unshare = Command::new("unshare").arg("--version").output();
    if !root || !unshare.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: needs root and unshare to start a process in a PID namespace");
        return;
    }
    let (_dir, file, _) = opened("budget-pidns");
    // Ids recorded there name other processes here: a live holder would look gone, a
    // dead one alive. Refused at opening, with the reason.
    let out = Command::new("unshare")
        .args(["--pid", "--fork"])
        .arg(std::env::current_exe().unwrap())
        .args(CHILD_ARGS)
        .env("PACELINE_CHILD", "open")
        .env("PACELINE_FILE", &file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    if !said.contains("OPENED") && !said.contains("REFUSED") {
        // `unshare` itself was refused (a container without the capability).
        eprintln!("skipped: unshare --pid could not start the child: {out:?}");
        return;
    }
    if said.contains("OPENED") {
        panic!("opened from another PID namespace: {said}");
    }
    assert!(said.contains("another PID namespace"), "{said}");
    // The same child in this namespace opens it.
    let mut here = spawn("open", &[("PACELINE_FILE", file.display().to_string())]);
    expect_line(&mut here, "OPENED");
    finish(here, Duration::from_secs(30));
}

/// The identity a budget file records for process `pid`: its id, and its start time's
/// low 32 bits where `/proc` tells it.
fn identity(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let start = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_ascii_whitespace().nth(19))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    u64::from(pid) << 32 | start & 0xffff_ffff
}

/// Writes `holder` into the budget file's lock word (as a process stopped or killed
/// inside the lock leaves it).
fn plant_lock(file: &Path, holder: u64) {
    let f = OpenOptions::new().write(true).open(file).unwrap();
    f.write_at(&holder.to_ne_bytes(), 512).unwrap();
}

#[test]
fn a_lock_left_by_a_dead_process_is_taken_over_and_one_held_by_a_live_one_is_not() {
    let (_dir, file, budget) = opened("budget-lock");
    let turn = budget.try_acquire(&[("tokens", 10)]).unwrap();

    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    plant_lock(&file, u64::from(pid) << 32);
    let started = Instant::now();
    assert_eq!(budget.in_flight().unwrap(), 1);
    assert!(started.elapsed() < Duration::from_millis(500));

    // A process that still runs (here, stopped) keeps the lock: calls fail after the
    // patience, changing nothing, and work again once it lets go.
    let mut stopped = Command::new("sleep").arg("30").spawn().unwrap();
    // SAFETY: signalling a child of ours.
    unsafe { libc::kill(stopped.id() as i32, libc::SIGSTOP) };
    plant_lock(&file, identity(stopped.id()));
    let started = Instant::now();
    let err = budget.try_acquire(&[("tokens", 1)]).unwrap_err();
    assert!(
        matches!(err, SharedBudgetError::File(SharedError::Locked { pid, .. }) if pid == u64::from(stopped.id())),
        "{err}"
    );
    assert!(started.elapsed() >= paceline::shared::LOCK_PATIENCE);
    let err = turn.settle(&[("tokens", 5)]).unwrap_err();
    let turn = err.into_turn();
    stopped.kill().unwrap();
    stopped.wait().unwrap();
    assert_eq!(
        budget.in_flight().unwrap(),
        1,
        "nothing changed while locked"
    );
    turn.settle(&[("tokens", 5)]).unwrap();
    assert_eq!(budget.in_flight().unwrap(), 0);
}

#[test]
fn a_forked_childs_copy_of_a_turn_ends_nothing() {
    let (_dir, _, budget) = opened("budget-fork");
    let turn = budget.try_acquire(&[("tokens", 10)]).unwrap();
    // SAFETY: the child only drops the turn it copied and exits at once.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        drop(turn);
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(
        budget.in_flight().unwrap(),
        1,
        "the parent's turn is still in flight"
    );
    drop(turn);
    assert_eq!(budget.in_flight().unwrap(), 0);
}

#[test]
fn a_file_of_another_budget_is_refused_or_adopted_and_never_taken_for_a_limiter() {
    let (_dir, file, _) = opened("budget-mismatch");
    let other = SharedBudget::builder()
        .rate("requests", Quota::per_second(5))
        .open(&file)
        .unwrap_err();
    assert!(
        matches!(other, SharedError::BudgetMismatch { .. }),
        "{other}"
    );
    assert!(other.to_string().contains("tokens"), "{other}");
    // The same rates named in another order are the same budget.
    let reordered = SharedBudget::builder()
        .rate("tokens", tokens())
        .rate("requests", requests())
        .in_flight(CAP)
        .open(&file)
        .unwrap();
    let turn = reordered.try_acquire(&[("tokens", 7)]).unwrap();
    assert_eq!(turn.cost("tokens"), Some(7));
    assert_eq!(turn.cost("requests"), Some(1));
    drop(turn);
    let adopted = SharedBudget::builder()
        .rate("requests", Quota::per_second(5))
        .options(OnMismatch::Adopt)
        .open(&file)
        .unwrap();
    assert_eq!(adopted.dimensions().count(), 2);
    assert_eq!(adopted.in_flight_limit(), Some(CAP));
    let replaced = SharedBudget::builder()
        .rate("requests", Quota::per_second(5))
        .options(OnMismatch::Replace)
        .open(&file)
        .unwrap_err();
    assert!(
        matches!(replaced, SharedError::BadBudget { .. }),
        "{replaced}"
    );
    let limiter = paceline::shared::SharedLimiter::open(&file, Quota::per_second(5)).unwrap_err();
    assert!(matches!(limiter, SharedError::Kind { .. }), "{limiter}");
    for bad in [
        SharedBudget::builder().open(&file),
        SharedBudget::builder().in_flight(0).open(&file),
        SharedBudget::builder()
            .rate("", Quota::per_second(1))
            .open(&file),
        SharedBudget::builder()
            .rate("a".repeat(33), Quota::per_second(1))
            .open(&file),
    ] {
        assert!(matches!(bad, Err(SharedError::BadBudget { .. })), "{bad:?}");
    }
}
