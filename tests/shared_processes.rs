//! Shared limiters across real processes: this test binary starts copies of itself as
//! children (the ignored test `child`), which open one file and log every admission.
//!
//! An admission's instant is bracketed by two `CLOCK_MONOTONIC` stamps every process reads
//! alike: before and after a check, or, for a waiter, before and after its booking plus
//! the wait the booking reported. The bound is then checked on what is *provably* inside a
//! window: no window of length `w` holds more than `burst + w/T` admissions whose brackets
//! lie wholly inside it. A preempted thread only widens its bracket, so a loaded machine
//! cannot make a correct limiter fail; an over-admission with tight brackets fails it.

#![cfg(unix)]

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use paceline::shared::{SharedKeyedLimiter, SharedLimiter};

mod common;
use common::children::{
    assert_bounded, finish, finish_all, kill_at_random_points, logged, logging_vars, monotonic,
    most_in_window, role_and_file, spawn, var, Log,
};
use common::dir::Dir;
use paceline::Quota;

/// 200 per second (T = 5 ms), bursts of 10.
const T_NS: u64 = 5_000_000;
const BURST: u64 = 10;
/// The windows the bound is checked over, in nanoseconds.
const WINDOWS: [u64; 4] = [20_000_000, 100_000_000, 500_000_000, 1_000_000_000];

fn quota() -> Quota {
    Quota::per_second(200).with_burst(BURST as u32)
}

/// Admission brackets `(earliest, latest)` from every log file in `dir`.
fn brackets(dir: &Path) -> Vec<(u64, u64)> {
    let mut all: Vec<_> = logged(dir).into_iter().map(|[e, l]| (e, l)).collect();
    all.sort_unstable();
    all
}

/// Admissions whose bracket ends within `[from, to]`.
fn count_between(brackets: &[(u64, u64)], from: u64, to: u64) -> u64 {
    brackets
        .iter()
        .filter(|&&(_, e)| e >= from && e <= to)
        .count() as u64
}

/// One thread of a hammering child: `mode` 0 checks, 1 blocks for booked turns, 2 awaits
/// them; keyed children spread over `keys` keys.
fn hammer(
    mode: u64,
    until: Instant,
    log: &Log,
    direct: Option<&SharedLimiter>,
    keyed: Option<(&SharedKeyedLimiter, u64)>,
    seed: u64,
) {
    let mut i = seed;
    while Instant::now() < until {
        i = i.wrapping_add(1);
        if let Some((keyed, keys)) = keyed {
            let key = format!("key-{}", i % keys);
            let before = monotonic();
            if keyed.check_key(&key).is_ok() {
                log.record([before, monotonic()]);
            }
            continue;
        }
        let limiter = direct.unwrap();
        match mode {
            0 => {
                let before = monotonic();
                if limiter.check().is_ok() {
                    log.record([before, monotonic()]);
                }
            }
            _ => {
                let before = monotonic();
                let turn = limiter.reserve(1).unwrap();
                let wait = turn.ready_in().as_nanos() as u64;
                let after = monotonic();
                if mode == 1 {
                    turn.wait();
                } else {
                    futures::executor::block_on(turn);
                }
                log.record([before + wait, after + wait]);
            }
        }
    }
}

#[test]
#[ignore = "a child process of the tests in this file, started by them"]
fn child() {
    let Some((role, path)) = role_and_file() else {
        return;
    };
    match role.as_str() {
        "hammer" | "keyed" => {
            let secs: f64 = var("PACELINE_SECS").parse().unwrap();
            let threads: u64 = var("PACELINE_THREADS").parse().unwrap();
            let mode = var("PACELINE_INDEX").parse::<u64>().unwrap() % 3;
            let log = Arc::new(Log::create(Path::new(&var("PACELINE_LOG"))));
            let until = Instant::now() + Duration::from_secs_f64(secs);
            let direct =
                (role == "hammer").then(|| Arc::new(SharedLimiter::open(&path, quota()).unwrap()));
            let keyed = (role == "keyed")
                .then(|| Arc::new(SharedKeyedLimiter::open(&path, quota(), 1024).unwrap()));
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (log, direct, keyed) = (log.clone(), direct.clone(), keyed.clone());
                    thread::spawn(move || {
                        hammer(
                            (mode + t) % 3,
                            until,
                            &log,
                            direct.as_deref(),
                            keyed.as_deref().map(|k| (k, 8)),
                            t * 7919,
                        )
                    })
                })
                .collect();
            for worker in workers {
                worker.join().unwrap();
            }
        }
        "first" => {
            // Admits the only cell of a 10 s quota, and says when.
            let limiter =
                SharedLimiter::open(&path, Quota::try_new(1, Duration::from_secs(10)).unwrap())
                    .unwrap();
            let before = monotonic();
            limiter.check().unwrap();
            println!("RESULT {before} {}", monotonic());
        }
        "second" => {
            let limiter =
                SharedLimiter::open(&path, Quota::try_new(1, Duration::from_secs(10)).unwrap())
                    .unwrap();
            let before = monotonic();
            let wait = limiter.check().unwrap_err().wait_time().as_nanos();
            println!("RESULT {before} {} {wait}", monotonic());
        }
        other => panic!("no role {other}"),
    }
}

#[test]
fn eight_processes_checking_and_waiting_share_one_quota() {
    let dir = Dir::new("eight");
    let file = dir.0.join("quota");
    // Made before the children, so they all attach to one file.
    SharedLimiter::open(&file, quota()).unwrap();
    let started = monotonic();
    let start = |i| {
        spawn(
            "hammer",
            &logging_vars(&dir.0, &file, i, 3.0, ("PACELINE_THREADS", 3)),
        )
    };
    finish_all((0..8).map(start).collect());
    let ended = monotonic();
    let all = brackets(&dir.0);
    assert_bounded(&all, &WINDOWS, BURST, T_NS);
    // Every process's callers together keep the limiter busy: the rate is the quota's.
    let (from, to) = (
        started + 1_000_000_000,
        ended.min(started + 3_000_000_000) - 300_000_000,
    );
    let admitted = count_between(&all, from, to);
    let ideal = (to - from) / T_NS;
    assert!(
        admitted * 10 >= ideal * 8 && admitted <= ideal + BURST + 1,
        "{admitted} admitted in {} ms, ideal {ideal}",
        (to - from) / 1_000_000
    );
}

#[test]
fn processes_killed_at_random_points_leave_the_others_served_and_bounded() {
    let dir = Dir::new("kill");
    let file = dir.0.join("quota");
    SharedLimiter::open(&file, quota()).unwrap();
    let secs = 4.0;
    let mut next = 0usize;
    let mut start = |secs| {
        next += 1;
        let vars = logging_vars(&dir.0, &file, next, secs, ("PACELINE_THREADS", 2));
        spawn("hammer", &vars)
    };
    let running = (0..6).map(|_| start(secs)).collect();
    let until = Instant::now() + Duration::from_secs_f64(secs - 1.0);
    let killed = kill_at_random_points(running, until, 100..400, 0x2545_f491_4f6c_dd1d, || {
        start(1.5)
    });
    assert!(killed >= 5, "only {killed} kills");
    assert_bounded(&brackets(&dir.0), &WINDOWS, BURST, T_NS);
    // The processes that attached after the kills were served.
    for id in next - 2..=next {
        let log = fs::read(dir.0.join(format!("{id}.log"))).unwrap();
        assert!(log.len() >= 16, "replacement {id} was never admitted");
    }
}

/// The numbers a child printed on its `RESULT` line (the harness prints around it).
fn result(out: &str) -> Vec<u64> {
    let line = out.lines().find_map(|l| l.split("RESULT ").nth(1)).unwrap();
    line.split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect()
}

#[test]
fn processes_started_seconds_apart_agree_on_time() {
    let dir = Dir::new("time");
    let file = dir.0.join("quota");
    let out = finish(
        spawn("first", &[("PACELINE_FILE", file.display().to_string())]),
        Duration::from_secs(30),
    );
    let first = result(&out);
    thread::sleep(Duration::from_secs(2));
    let out = finish(
        spawn("second", &[("PACELINE_FILE", file.display().to_string())]),
        Duration::from_secs(30),
    );
    let second = result(&out);
    // The first admitted its cell at some a in [first0, first1]; the second checked at b in
    // [second0, second1] and was told to wait a + 10 s - b.
    let wait = second[2];
    let longest = first[1] + 10_000_000_000 - second[0];
    let shortest = (first[0] + 10_000_000_000).saturating_sub(second[1]);
    // A millisecond beyond the brackets either way: the processes' clocks agree to that.
    assert!(
        wait + 1_000_000 >= shortest && wait <= longest + 1_000_000,
        "told to wait {wait} ns, expected {shortest}..={longest}"
    );
}

#[test]
fn keyed_processes_share_each_keys_quota() {
    let dir = Dir::new("keyed");
    let file = dir.0.join("keys");
    SharedKeyedLimiter::open(&file, quota(), 1024).unwrap();
    let start = |i| {
        spawn(
            "keyed",
            &logging_vars(&dir.0, &file, i, 2.0, ("PACELINE_THREADS", 2)),
        )
    };
    finish_all((0..4).map(start).collect());
    // Eight keys: together at most 8 times one key's bound in any window.
    let all = brackets(&dir.0);
    for w in [20_000_000u64, 200_000_000, 1_000_000_000] {
        let most = most_in_window(&all, w);
        let bound = 8 * (BURST + w / T_NS + 1) as usize;
        assert!(most <= bound, "{most} in {w} ns, bound {bound}");
    }
    assert!(
        all.len() as u64 >= 8 * 2 * 200 * 8 / 10,
        "only {} admissions",
        all.len()
    );
}

#[test]
fn a_forked_child_shares_the_parents_quota() {
    let dir = Dir::new("fork");
    let file = dir.0.join("quota");
    let limiter = SharedLimiter::open(&file, quota()).unwrap();
    let keyed = SharedKeyedLimiter::open(dir.0.join("keys"), quota(), 64).unwrap();
    let run = |name: &str| {
        let log = Log::create(&dir.0.join(format!("{name}.log")));
        let until = Instant::now() + Duration::from_millis(1_500);
        let mut keyed_admitted = 0;
        while Instant::now() < until {
            let before = monotonic();
            if limiter.check().is_ok() {
                log.record([before, monotonic()]);
            }
            if keyed.check_key("one key").is_ok() {
                keyed_admitted += 1;
            }
        }
        keyed_admitted
    };
    // SAFETY: the child runs `run` and `_exit`s; it never returns into the harness.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let admitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run("child")));
        let code = match admitted {
            Ok(n) => {
                fs::write(dir.0.join("child.keyed"), n.to_string()).unwrap();
                0
            }
            Err(_) => 1,
        };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    let ours = run("parent");
    let mut status = 0;
    // SAFETY: `pid` is our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    assert_bounded(&brackets(&dir.0), &WINDOWS, BURST, T_NS);
    let theirs: u64 = fs::read_to_string(dir.0.join("child.keyed"))
        .unwrap()
        .parse()
        .unwrap();
    // One key, two processes, 1.5 s: the burst and 300 more at most.
    assert!(ours + theirs <= BURST + 1_500 / 5 + 2, "{ours} + {theirs}");
}
