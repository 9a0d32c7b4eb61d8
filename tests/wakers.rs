//! What a waker costs the default clock's timer: a task waiting for room in a full key
//! table holds one timer entry, released when it is dropped; a waker that blocks delays
//! only itself, other waiters of its own limiter included; the timer's threads stay
//! bounded, and a hand-over to a fresh thread is decided per wake, not per round.
//! The tests share the process-wide timer, so they run one at a time.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use paceline::{KeyedLimiter, Limiter, Quota};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn poll<F: Future + ?Sized>(future: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

/// A waker that only counts its wake-ups; its `Arc`'s strong count says who holds it.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A keyed limiter at its key bound, full of keys limited for an hour.
fn full_table() -> KeyedLimiter<u32> {
    let limiter = KeyedLimiter::new(Quota::per_hour(1)).with_max_keys(1_000);
    for key in 0..10_000u32 {
        let _ = limiter.check_key(&key);
    }
    limiter
}

#[test]
fn a_task_waiting_for_room_in_the_key_table_leaves_nothing_in_the_timer() {
    let _serial = serial();
    let limiter = full_table();
    let task = Arc::new(Count::default());
    let waker = Waker::from(task.clone());
    let new_key = u32::MAX;
    // Many such waits, each polled once and dropped: none keeps the task alive.
    for _ in 0..2_000 {
        let mut wait =
            Box::pin(limiter.until_key_ready_within(&new_key, Duration::from_secs(7200)));
        assert!(poll(wait.as_mut(), &waker).is_pending());
    }
    assert_eq!(
        Arc::strong_count(&task),
        2,
        "dropped waits left their task's waker in the timer"
    );
    // One wait re-polled as a `select!` loop does: one registration, replaced in place.
    let mut wait = Box::pin(limiter.until_key_ready_within(&new_key, Duration::from_secs(7200)));
    for _ in 0..10_000 {
        assert!(poll(wait.as_mut(), &waker).is_pending());
    }
    assert!(
        Arc::strong_count(&task) <= 3,
        "{} clones of one task's waker after 10 000 polls",
        Arc::strong_count(&task) - 2
    );
    drop(wait);
    assert_eq!(Arc::strong_count(&task), 2);
    assert_eq!(
        task.0.load(Ordering::SeqCst),
        0,
        "woken before a slot freed"
    );
}

/// A waker that blocks in `wake` until released (or 5 s).
struct Blocking(Mutex<mpsc::Receiver<()>>);

impl Wake for Blocking {
    fn wake(self: Arc<Self>) {
        let _ = self.0.lock().unwrap().recv_timeout(Duration::from_secs(5));
    }
}

#[test]
fn realtime_a_blocking_waker_strands_no_other_waiter_of_its_own_limiter() {
    let _serial = serial();
    let limiter = Arc::new(Limiter::new(Quota::per_second(500).with_burst(1)));
    limiter.check().unwrap();
    let (release, released) = mpsc::channel();
    let waker = Waker::from(Arc::new(Blocking(Mutex::new(released))));
    let mut hostile = Box::pin(limiter.until_ready()); // due in 2 ms; its wake blocks
    assert!(poll(hostile.as_mut(), &waker).is_pending());
    let start = Instant::now();
    let waits: Vec<_> = [Duration::ZERO, Duration::from_millis(100)]
        .into_iter()
        .map(|delay| {
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                // One books right behind the blocking waiter, one during its stall.
                std::thread::sleep(delay);
                limiter.wait();
                start.elapsed()
            })
        })
        .collect();
    let elapsed: Vec<Duration> = waits.into_iter().map(|t| t.join().unwrap()).collect();
    let _ = release.send(());
    for elapsed in elapsed {
        assert!(
            elapsed < Duration::from_millis(2500),
            "a waiter of the blocked limiter returned after {elapsed:?}"
        );
    }
    drop(hostile);
}

/// The threads of this process named `name`, from `/proc`.
fn threads_named(name: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// A waker that sleeps in `wake`, and records the thread it ran on.
struct Slow(Duration, Arc<Mutex<HashSet<ThreadId>>>);

impl Wake for Slow {
    fn wake(self: Arc<Self>) {
        self.1.lock().unwrap().insert(std::thread::current().id());
        std::thread::sleep(self.0);
    }
}

type Waiting = Pin<Box<dyn Future<Output = ()> + Send>>;

/// `wakers.len()` limiters with one waiter each, due together, woken through `wakers`.
/// Returns the waiting futures, to be dropped once the wakers have run.
fn waiters_woken_by(wakers: Vec<Waker>) -> Vec<Waiting> {
    wakers
        .into_iter()
        .map(|waker| {
            let limiter = Arc::new(Limiter::new(Quota::per_second(50).with_burst(1)));
            limiter.check().unwrap();
            let mut wait: Waiting = Box::pin(async move { limiter.until_ready().await });
            assert!(poll(wait.as_mut(), &waker).is_pending());
            wait
        })
        .collect()
}

#[test]
#[cfg(target_os = "linux")]
fn realtime_blocking_wakers_keep_the_timer_threads_bounded() {
    let _serial = serial();
    let (releases, wakers): (Vec<_>, Vec<_>) = (0..40)
        .map(|_| {
            let (release, released) = mpsc::channel::<()>();
            (
                release,
                Waker::from(Arc::new(Blocking(Mutex::new(released)))),
            )
        })
        .unzip();
    let waiting = waiters_woken_by(wakers);
    let start = Instant::now();
    let mut peak = 0;
    while start.elapsed() < Duration::from_millis(800) {
        peak = peak.max(threads_named("paceline-timer"));
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(releases);
    // Another limiter is still served while the blocked ones drain.
    let other = Limiter::new(Quota::per_second(100).with_burst(1));
    other.check().unwrap();
    let start = Instant::now();
    other.wait();
    assert!(start.elapsed() < Duration::from_secs(3));
    drop(waiting);
    assert!(
        peak <= 4,
        "{peak} timer threads alive at once for 40 blocking wakers"
    );
}

#[test]
fn realtime_wakers_that_each_take_a_little_cause_no_hand_over() {
    let _serial = serial();
    let threads = Arc::new(Mutex::new(HashSet::new()));
    let wakers = (0..300)
        .map(|_| Waker::from(Arc::new(Slow(Duration::from_micros(200), threads.clone()))))
        .collect();
    let waiting = waiters_woken_by(wakers);
    std::thread::sleep(Duration::from_millis(1000));
    let served_by = threads.lock().unwrap().len();
    drop(waiting);
    // Timing the round handed over every 10 ms of it (8 threads here); timing each wake
    // hands over only when one wake is stalled that long, which a loaded machine's
    // scheduler may still do once or twice.
    assert!(
        served_by <= 3,
        "300 wakes of 0.2 ms were spread over {served_by} timer threads"
    );
}
