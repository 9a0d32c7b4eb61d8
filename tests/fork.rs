//! A process that forks keeps working limiters in the child: the one it inherited (its word
//! is copied with the process) and new ones. The default clock's timer thread and a coarse
//! clock's upkeep thread do not survive `fork`; paceline starts them again in the child.
//!
//! Each case forks a real child, which exits 0 when every wait returned in time and 1
//! otherwise; the parent kills a child that has not exited after `LIMIT` and fails.
//! The children print nothing and allocate little: another thread of the test harness may
//! hold a lock at the moment of the fork.

#![cfg(unix)]

use std::future::Future;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use paceline::clock::CoarseClock;
use paceline::{Limiter, Quota};

/// How long a child may take before it counts as hung (its waits add up to well under a
/// second; the rest is room for a loaded machine).
const LIMIT: Duration = Duration::from_secs(8);

/// Runs `child` in a forked child process and returns whether it exited 0 within `LIMIT`.
fn in_child(child: impl FnOnce() -> bool) -> Result<(), String> {
    // SAFETY: the child runs only `child` and then `_exit`s: it never returns into the
    // test harness, and `_exit` runs no destructors or atexit handlers of the parent.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        // SAFETY: `_exit` is async-signal-safe and ends the child here.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                Ok(())
            } else {
                Err(format!("the child failed (wait status {status:#x})"))
            };
        }
        if started.elapsed() > LIMIT {
            // SAFETY: `pid` is our child, still running.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(format!("the child hung: killed after {LIMIT:?}"));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// `serve` in a forked child, which must get through it within 4 s.
fn served_in_child(serve: impl FnOnce()) -> Result<(), String> {
    in_child(|| {
        let started = Instant::now();
        serve();
        started.elapsed() < Duration::from_secs(4)
    })
}

/// `waits` turns of 10 ms on `limiter` from this thread finish within `within`.
fn paced(limiter: &Limiter, waits: u32, within: Duration) -> bool {
    let started = Instant::now();
    for _ in 0..waits {
        limiter.wait();
    }
    started.elapsed() < within
}

fn hundred_per_second() -> Limiter {
    Limiter::new(Quota::per_second(100).with_burst(1))
}

#[test]
fn a_child_forked_after_async_waits_is_served_by_inherited_and_new_limiters() {
    let limiter = hundred_per_second();
    // The second wait sleeps: the default clock's timer thread starts in the parent.
    futures::executor::block_on(async {
        limiter.until_ready().await;
        limiter.until_ready().await;
    });
    let result = in_child(|| {
        let inherited = paced(&limiter, 5, Duration::from_secs(4));
        let fresh = paced(&hundred_per_second(), 5, Duration::from_secs(4));
        let asynchronous = futures::executor::block_on(async {
            let fresh = hundred_per_second();
            for _ in 0..3 {
                limiter.until_ready().await;
                fresh.until_ready().await;
            }
            true
        });
        inherited && fresh && asynchronous
    });
    result.unwrap();
    // The parent is still served too.
    assert!(paced(&limiter, 3, LIMIT));
}

#[test]
fn a_wake_up_pending_at_the_fork_is_served_in_the_child() {
    let limiter = Arc::new(Limiter::new(Quota::per_second(5).with_burst(1)));
    limiter.check().unwrap();
    // Another thread books the next turn (200 ms away) and sleeps on it: the limiter's
    // queue has asked the timer for that instant when we fork.
    let sleeper = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.wait())
    };
    while limiter.next_waiter_due_in().is_none() {
        thread::yield_now();
    }
    // In the child the sleeper's thread is gone but its booking is not: the child's turn
    // comes after it (400 ms), and the queue relies on the wake-up it already asked for.
    let result = served_in_child(|| limiter.wait());
    sleeper.join().unwrap();
    result.unwrap();
}

#[test]
fn a_coarse_clock_keeps_time_in_a_forked_child() {
    let clock = CoarseClock::with_resolution(Duration::from_millis(1));
    let limiter = Limiter::with_clock(Quota::per_second(100).with_burst(1), clock);
    limiter.check().unwrap();
    let result = in_child(|| {
        // The clock's reading must move in the child, or checks are refused for ever.
        thread::sleep(Duration::from_millis(50));
        let checked = limiter.check().is_ok();
        let started = Instant::now();
        for _ in 0..5 {
            limiter.wait();
        }
        checked && started.elapsed() < Duration::from_secs(4)
    });
    result.unwrap();
}

#[test]
fn children_forked_at_random_moments_of_a_busy_timer_are_served() {
    // Four threads keep the timer thread busy with wake-ups on one limiter while the main
    // thread forks; each child waits on another limiter the parent used, and a new one.
    let busy = Arc::new(Limiter::new(Quota::per_second(2_000).with_burst(1)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (busy, stop) = (Arc::clone(&busy), Arc::clone(&stop));
            thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    busy.wait();
                }
            })
        })
        .collect();
    let used = hundred_per_second();
    futures::executor::block_on(async {
        used.until_ready().await;
        used.until_ready().await;
    });
    let mut failures = Vec::new();
    for round in 0..12u64 {
        // Pseudo-random gaps of 0-19 ms between forks.
        thread::sleep(Duration::from_millis(round * 7919 % 20));
        if let Err(e) = in_child(|| {
            paced(&used, 3, Duration::from_secs(4))
                && paced(&hundred_per_second(), 3, Duration::from_secs(4))
        }) {
            failures.push(format!("round {round}: {e}"));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn a_turn_the_forking_thread_holds_across_the_fork_comes_at_its_instant_in_the_child() {
    let limiter = Arc::new(Limiter::new(Quota::per_second(5).with_burst(1)));
    limiter.check().unwrap();
    // Ours (200 ms away), and another thread's behind it (400 ms), both linked at the fork.
    let ours = Arc::clone(&limiter).reserve_owned(1).unwrap();
    let theirs = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.wait())
    };
    while limiter.next_waiter_due_in() >= Some(Duration::from_millis(250))
        || limiter.next_waiter_due_in().is_none()
    {
        thread::yield_now();
    }
    thread::sleep(Duration::from_millis(20));
    let result = in_child(|| {
        // The child's first touch of the queue forgets the parent's list; our turn keeps
        // its instant, outside it.
        let ready_in = ours.ready_in();
        let mine = Arc::clone(&limiter).reserve_owned(1).unwrap();
        let started = Instant::now();
        let before = ready_in <= Duration::from_millis(200) && ready_in > Duration::ZERO;
        // Nobody is linked in the child but `mine`; `ours` and the other thread's
        // booking stay spent, so `mine` comes after both.
        let behind = mine.ready_in() > ready_in;
        futures::executor::block_on(ours);
        let on_time = started.elapsed() + Duration::from_millis(1) >= ready_in;
        mine.wait();
        before && behind && on_time && started.elapsed() < Duration::from_secs(4)
    });
    theirs.join().unwrap();
    result.unwrap();
}

/// Set by this test's own prepare handler once a fork is under way.
static FORKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A prepare handler that makes the fork last: it tells the racing thread a fork has begun,
/// then holds the fork back long enough for that thread to reach the C library's fork
/// lock (which `pthread_atfork` waits for) before the process is copied.
extern "C" fn slow_prepare() {
    FORKING.store(true, std::sync::atomic::Ordering::SeqCst);
    thread::sleep(Duration::from_millis(200));
}

#[test]
fn a_budget_in_a_child_is_not_held_by_the_parents_other_threads() {
    // In the parent, another thread holds one of two permits and a third thread waits at
    // the head of the queue; the forking thread holds the other permit. None of those
    // threads exist in the child: the child's budget counts only its own turns, and its
    // queue does not wait behind a waiter that will never be polled.
    let budget = paceline::Budget::builder()
        .rate("requests", Quota::per_second(100).with_burst(3))
        .in_flight(2)
        .build()
        .unwrap();
    let mine = budget.try_acquire(&[]).unwrap();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let budget = budget.clone();
        thread::spawn(move || {
            let turn = budget.try_acquire(&[]).unwrap();
            held_tx.send(()).unwrap();
            end_rx.recv().unwrap();
            drop(turn);
        })
    };
    held_rx.recv().unwrap();
    let waiter = {
        let budget = budget.clone();
        thread::spawn(move || budget.acquire_blocking(&[]).map(drop))
    };
    while budget.waiting() == 0 {
        thread::sleep(Duration::from_millis(1));
    }
    let result = in_child(|| {
        let started = Instant::now();
        let a = budget.try_acquire(&[]);
        let b = budget.acquire_blocking(&[]);
        let full = budget.try_acquire(&[]).is_err();
        // The forking thread's turn from before the fork returns no permit here.
        drop(mine);
        let still_full = budget.try_acquire(&[]).is_err();
        let ended = a.is_ok() && b.is_ok();
        drop((a, b));
        // Then the rate paces a blocking wait (the timer thread started again).
        let paced = budget.acquire_blocking(&[]).is_ok();
        ended && full && still_full && paced && started.elapsed() < Duration::from_secs(4)
    });
    end_tx.send(()).unwrap();
    holder.join().unwrap();
    waiter.join().unwrap().unwrap();
    result.unwrap();
}

#[test]
fn a_child_forked_while_another_thread_is_inside_a_budget_is_served() {
    // Another thread takes and ends turns as fast as it can, so it is inside the budget's
    // lock at many of the forks; no child may find the lock held by a thread it lacks.
    let budget = paceline::Budget::builder()
        .rate("requests", Quota::per_second(1_000_000_000))
        .in_flight(1000)
        .build()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (budget, stop) = (budget.clone(), std::sync::Arc::clone(&stop));
        thread::spawn(move || {
            // Relaxed: a flag, publishing nothing.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(budget.try_acquire(&[]));
            }
        })
    };
    let failed = (0..300)
        .map(|_| in_child(|| budget.try_acquire(&[]).is_ok()))
        .find(Result::is_err);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    assert_eq!(failed, None);
}

#[test]
fn a_child_forked_while_another_thread_is_inside_a_limiters_queue_is_served() {
    // Another thread books and cancels turns as fast as it can, so it is inside the
    // limiter's queue lock at many of the forks.
    let limiter = std::sync::Arc::new(Limiter::new(Quota::per_second(1000).with_burst(1)));
    limiter.check().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (limiter, stop) = (
            std::sync::Arc::clone(&limiter),
            std::sync::Arc::clone(&stop),
        );
        thread::spawn(move || {
            // Relaxed: a flag, publishing nothing.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(limiter.reserve(1));
            }
        })
    };
    let failed = (0..300)
        .map(|_| in_child(|| limiter.reserve(1).is_ok()))
        .find(Result::is_err);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    assert_eq!(failed, None);
}

/// Runs in a process of its own (see
/// `a_child_copied_while_paceline_was_first_used_is_served`): another thread's first use
/// of something paceline runs threads for begins while this thread forks.
///
/// * `timer`: a limiter exists; the other thread's first wait asks the default clock's
///   timer for the first time.
/// * `coarse`: the other thread makes the first coarse clock.
fn race_first_use_with_a_fork(which: &str) {
    // SAFETY: `slow_prepare` is a plain function that never unwinds and lives for the
    // whole program.
    let registered = unsafe { libc::pthread_atfork(Some(slow_prepare), None, None) };
    assert_eq!(registered, 0);
    let limiter = Arc::new(Limiter::new(Quota::per_second(5).with_burst(1)));
    limiter.check().unwrap();
    let racer = {
        let limiter = Arc::clone(&limiter);
        let timer = which == "timer";
        thread::spawn(move || {
            while !FORKING.load(std::sync::atomic::Ordering::SeqCst) {
                thread::yield_now();
            }
            if timer {
                // Its turn is 200 ms away: it books and asks the timer, for the first time.
                limiter.wait();
            } else {
                drop(CoarseClock::with_resolution(Duration::from_millis(1)));
            }
        })
    };
    let result = served_in_child(|| {
        if which == "timer" {
            limiter.wait();
        } else {
            let coarse = CoarseClock::with_resolution(Duration::from_millis(1));
            let paced = Limiter::with_clock(Quota::per_second(50).with_burst(1), coarse);
            for _ in 0..3 {
                paced.wait();
            }
        }
    });
    racer.join().unwrap();
    result.unwrap();
}

/// The first wait on the default clock, or the first coarse clock, may come while another
/// thread forks (the C library runs only the fork handlers it had when the fork began):
/// the child must still be served. Each case needs a process in which the timer and the
/// coarse clocks never ran, so the test runs itself again in a new process.
#[test]
fn a_child_copied_while_paceline_was_first_used_is_served() {
    const MODE: &str = "PACELINE_TEST_FORK_RACE";
    if let Ok(which) = std::env::var(MODE) {
        race_first_use_with_a_fork(&which);
        return;
    }
    for which in ["timer", "coarse"] {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_child_copied_while_paceline_was_first_used_is_served",
                "--test-threads=1",
            ])
            .env(MODE, which)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > LIMIT * 2 {
                child.kill().unwrap();
                panic!("{which}: the process racing a fork hung");
            }
            thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "{which}: {status}");
    }
}

/// A task waker that writes a byte to a pipe when it is woken in another process than
/// the one that made it, then wakes its thread.
struct Spy {
    pid: u32,
    fd: i32,
    thread: thread::Thread,
}

impl std::task::Wake for Spy {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if std::process::id() != self.pid {
            // SAFETY: `fd` is the pipe's write end, open for the whole test; one byte from
            // a valid buffer.
            unsafe { libc::write(self.fd, b"x".as_ptr().cast(), 1) };
        }
        self.thread.unpark();
    }
}

#[test]
fn a_child_never_wakes_the_tasks_of_the_parents_other_threads() {
    // Threads of the parent wait on a budget (each future's alarm is with the default
    // clock's timer); the children inherit those alarms, and their timer rings them:
    // a task waker of a thread the child lacks must be neither woken nor dropped.
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two descriptors for `pipe` to fill.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let budget = paceline::Budget::builder()
        .rate("requests", Quota::per_second(20).with_burst(1))
        .in_flight(2)
        .build()
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (budget, stop, fd) = (budget.clone(), Arc::clone(&stop), fds[1]);
            thread::spawn(move || {
                // Relaxed: a flag, publishing nothing.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let spy = Spy {
                        pid: std::process::id(),
                        fd,
                        thread: thread::current(),
                    };
                    let waker = std::task::Waker::from(Arc::new(spy));
                    let mut acquire = std::pin::pin!(budget.acquire(&[]));
                    let mut cx = std::task::Context::from_waker(&waker);
                    while acquire.as_mut().poll(&mut cx).is_pending() {
                        thread::park_timeout(Duration::from_millis(200));
                    }
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    let failed = (0..10)
        .map(|_| {
            in_child(|| {
                // Long enough for the inherited alarms (50 ms apart) to come due.
                thread::sleep(Duration::from_millis(300));
                budget.acquire_blocking(&[]).is_ok()
            })
        })
        .find(Result::is_err);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for waiter in waiters {
        waiter.join().unwrap();
    }
    assert_eq!(failed, None);
    // SAFETY: the read end is ours; non-blocking, so an empty pipe reads nothing.
    let woken = unsafe {
        libc::fcntl(fds[0], libc::F_SETFL, libc::O_NONBLOCK);
        let mut buf = [0u8; 256];
        libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len())
    };
    assert!(woken <= 0, "{woken} parent task wakers woken in children");
}

#[test]
fn a_child_forked_while_other_threads_add_keys_is_served() {
    // Other threads insert new keys as fast as they can, so one holds a shard of the key
    // store at many of the forks.
    let limiter = Arc::new(paceline::KeyedLimiter::<u64>::new(
        Quota::per_second(1000).with_burst(5),
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..3u64)
        .map(|t| {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            thread::spawn(move || {
                let mut key = t << 40;
                // Relaxed: a flag, publishing nothing.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    key += 1;
                    let _ = limiter.check_key(&key);
                }
            })
        })
        .collect();
    let failed = (0..100)
        .map(|i| in_child(|| (0..2000u64).all(|k| limiter.check_key(&(u64::MAX - k - i)).is_ok())))
        .find(Result::is_err);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in busy {
        thread.join().unwrap();
    }
    assert_eq!(failed, None);
}
