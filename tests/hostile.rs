//! The promises under hostile conditions: a cancelling thread preempted at the worst
//! moment, wakers that panic or sleep, clocks that break their contract, key floods
//! through the waiting path. Each test fails on the code before its fix.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use paceline::clock::{Clock, ManualClock};
use paceline::{KeyedLimiter, Limiter, Quota};

const SEC: u64 = 1_000_000_000;

fn poll_once<F: Future>(future: std::pin::Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

/// A clock set by hand that never wakes anyone by itself, and that can stall the next
/// thread to read it: that thread reports in, then waits for a release before returning
/// the time it read *before* stalling (a thread preempted right after its clock read).
#[derive(Clone, Default)]
struct StallingClock(Arc<StallingInner>);

#[derive(Default)]
struct StallingInner {
    now: AtomicU64,
    stall: Mutex<Option<(mpsc::Sender<Event>, mpsc::Receiver<()>)>>,
}

#[derive(Debug, PartialEq)]
enum Event {
    Stalled,
    Done,
}

impl StallingClock {
    fn set(&self, t: u64) {
        self.0.now.store(t, Ordering::SeqCst);
    }
}

impl Clock for StallingClock {
    fn now(&self) -> u64 {
        let t = self.0.now.load(Ordering::SeqCst);
        let stall = self.0.stall.lock().unwrap().take();
        if let Some((report, release)) = stall {
            report.send(Event::Stalled).unwrap();
            release.recv().unwrap();
        }
        t
    }

    fn wake_at(&self, _at: u64, _waker: Waker) {}
}

#[test]
fn a_cancel_preempted_across_the_instant_never_admits_more_than_the_burst() {
    // The report's sequence: burst 4 at 1/s. Spend it, book 4 more (instant 4 s), and drop
    // the waiter while its thread may read the clock at 3.9 s and stall there; meanwhile
    // time reaches 5 s and a check is admitted. Whatever the cancel does, at 5 s at most
    // 4 cells may be admitted in total.
    let clock = StallingClock::default();
    let limiter = Arc::new(Limiter::with_clock(
        Quota::per_second(1).with_burst(4),
        clock.clone(),
    ));
    limiter.check_n(4).unwrap();
    let (report, events) = mpsc::channel();
    let (release, released) = mpsc::channel();
    let canceller = {
        let limiter = limiter.clone();
        let clock = clock.clone();
        let report = report.clone();
        std::thread::spawn(move || {
            let mut waiter = Box::pin(limiter.until_n_ready(4));
            assert!(poll_once(waiter.as_mut(), Waker::noop()).is_pending());
            clock.set(3_900_000_000);
            // The next clock read (if the cancel makes one) stalls.
            *clock.0.stall.lock().unwrap() = Some((report.clone(), released));
            drop(waiter);
            report.send(Event::Done).unwrap();
        })
    };
    let first = events.recv().unwrap();
    clock.0.stall.lock().unwrap().take(); // disarm, whether or not it fired
    clock.set(5 * SEC);
    let checked = limiter.check().is_ok();
    let _ = release.send(());
    if first == Event::Stalled {
        assert_eq!(events.recv().unwrap(), Event::Done);
    }
    canceller.join().unwrap();
    let admitted_now = u32::from(checked) + limiter.remaining();
    assert!(
        admitted_now <= 4,
        "{admitted_now} cells admissible at 5 s with burst 4"
    );
}

/// A waker that panics when woken.
struct Panicking;

impl Wake for Panicking {
    fn wake(self: Arc<Self>) {
        panic!("a hostile waker (this panic is expected)");
    }
}

/// A waker that sleeps in `wake` for as long as it is told.
struct Sleepy(Duration);

impl Wake for Sleepy {
    fn wake(self: Arc<Self>) {
        std::thread::sleep(self.0);
    }
}

/// Books one cell on `limiter` (burst spent) with `waker`, leaving the future alive.
fn book_with<'a>(
    limiter: &'a Limiter,
    waker: &Waker,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
    let mut waiter = Box::pin(limiter.until_ready());
    assert!(poll_once(waiter.as_mut(), waker).is_pending());
    waiter
}

/// How long a blocking `wait()` on a fresh 100/s limiter with its burst spent takes; fails
/// after 3 s instead of hanging.
fn blocking_wait_elapsed() -> Duration {
    let limiter = Limiter::new(Quota::per_second(100).with_burst(1));
    limiter.check().unwrap();
    let (done, finished) = mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        limiter.wait();
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(3))
        .expect("the timer thread no longer serves other limiters");
    start.elapsed()
}

#[test]
fn realtime_a_panicking_waker_stops_neither_the_timer_nor_its_own_limiter() {
    let hostile = Limiter::new(Quota::per_second(200).with_burst(1));
    hostile.check().unwrap();
    let waker = Waker::from(Arc::new(Panicking));
    let waiter = book_with(&hostile, &waker);
    // Let the timer wake it (and catch the panic), then check others are still served.
    std::thread::sleep(Duration::from_millis(30));
    let elapsed = blocking_wait_elapsed();
    assert!(elapsed >= Duration::from_millis(9));
    drop(waiter);
    // The hostile limiter itself still paces its next waiters.
    let start = Instant::now();
    hostile.wait();
    hostile.wait();
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn realtime_a_sleeping_waker_delays_only_its_own_wake_up() {
    let hostile = Limiter::new(Quota::per_second(100).with_burst(1));
    hostile.check().unwrap();
    let waker = Waker::from(Arc::new(Sleepy(Duration::from_secs(4))));
    let _waiter = book_with(&hostile, &waker);
    // The sleepy waker is due in 10 ms and then holds the timer thread for 4 s; another
    // limiter's waiter, due 10 ms after its own start, must not wait for it.
    std::thread::sleep(Duration::from_millis(20));
    let elapsed = blocking_wait_elapsed();
    assert!(
        elapsed < Duration::from_millis(1500),
        "another limiter's waiter waited {elapsed:?} behind a sleeping waker"
    );
}

#[test]
fn zero_cells_are_granted_at_once_even_behind_waiters() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(Quota::per_second(1).with_burst(1), clock);
    limiter.check().unwrap();
    let mut queued = pin!(limiter.until_ready());
    assert!(poll_once(queued.as_mut(), Waker::noop()).is_pending());
    let mut nothing = pin!(limiter.until_n_ready(0));
    assert_eq!(
        poll_once(nothing.as_mut(), Waker::noop()),
        Poll::Ready(Ok(()))
    );
    let mut nothing_within = pin!(limiter.until_n_ready_within(0, Duration::ZERO));
    assert_eq!(
        poll_once(nothing_within.as_mut(), Waker::noop()),
        Poll::Ready(Ok(()))
    );
}

/// A clock that breaks the contract: `wake_at` wakes on the calling thread at once,
/// whatever `at` is.
#[derive(Clone, Default)]
struct EagerClock {
    now: Arc<AtomicU64>,
    asked: Arc<AtomicUsize>,
}

impl Clock for EagerClock {
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn wake_at(&self, _at: u64, waker: Waker) {
        self.asked.fetch_add(1, Ordering::SeqCst);
        waker.wake();
    }
}

#[test]
fn a_clock_that_wakes_early_on_the_calling_thread_is_tolerated() {
    let clock = EagerClock::default();
    let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    limiter.check().unwrap();
    let woken = Arc::new(Flag::default());
    let waker = Waker::from(woken.clone());
    let mut waiter = pin!(limiter.until_ready());
    // Before the fix this overflowed the stack: book -> wake_at -> fire -> wake_at -> ...
    assert!(poll_once(waiter.as_mut(), &waker).is_pending());
    let asked = clock.asked.load(Ordering::SeqCst);
    assert!(asked <= 32, "asked the clock {asked} times");
    assert!(!woken.0.load(Ordering::SeqCst), "woken before its instant");
    // Once the instant has come, the next poll (or `wake_due_waiters`) completes it.
    clock.now.store(100_000_000, Ordering::SeqCst);
    assert_eq!(poll_once(waiter.as_mut(), &waker), Poll::Ready(()));
}

#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn waiting_on_keys_respects_the_key_bound() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::with_clock(Quota::per_hour(1), clock.clone()).with_max_keys(1_000);
    let bound = 1_000 + 256;
    let mut ready = 0;
    let mut pending = Vec::new();
    for key in 0..100_000u32 {
        let mut waiter = Box::pin(limiter.until_key_ready(&key));
        match poll_once(waiter.as_mut(), Waker::noop()) {
            Poll::Ready(()) => ready += 1,
            Poll::Pending => {
                if pending.len() < 10 {
                    pending.push(waiter);
                }
            }
        }
    }
    assert!(limiter.len() <= bound, "{} keys stored", limiter.len());
    assert!((1_000..=bound).contains(&ready), "{ready} admitted");
    // The refused ones booked nothing and wait for a slot; once the stored keys are
    // replenished (an hour later) they are admitted, still within the bound.
    let flag = Arc::new(Flag::default());
    let waker = Waker::from(flag.clone());
    for waiter in &mut pending {
        assert!(poll_once(waiter.as_mut(), &waker).is_pending());
    }
    clock.advance(Duration::from_secs(3_600));
    assert!(
        flag.0.load(Ordering::SeqCst),
        "the clock woke the slot waiters"
    );
    for waiter in &mut pending {
        assert_eq!(poll_once(waiter.as_mut(), &waker), Poll::Ready(()));
    }
    assert!(limiter.len() <= bound);
    // A deadline shorter than the time until a slot frees is refused at once.
    let limiter = KeyedLimiter::with_clock(Quota::per_hour(1), ManualClock::new()).with_max_keys(1);
    for key in 0..10_000u32 {
        let _ = limiter.check_key(&key); // fills every shard with a limited key
    }
    let mut late = pin!(limiter.until_key_ready_within(&u32::MAX, Duration::from_secs(60)));
    match poll_once(late.as_mut(), Waker::noop()) {
        Poll::Ready(Err(e)) => assert!(e.wait_time() > Duration::from_secs(60)),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Seconds to drop `count` booked waiters in booking order (front first, as a task group
/// that fails cancels them), each giving its cells back and moving everyone behind up.
fn cancel_front_first(count: u32) -> f64 {
    let limiter = Limiter::with_clock(Quota::per_second(1_000).with_burst(1), ManualClock::new());
    limiter.check().unwrap();
    let mut waiters: Vec<_> = (0..count)
        .map(|_| Box::pin(limiter.until_ready()))
        .collect();
    for waiter in &mut waiters {
        assert!(poll_once(waiter.as_mut(), Waker::noop()).is_pending());
    }
    let started = Instant::now();
    drop(waiters);
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(limiter.next_waiter_due_in(), None);
    assert_eq!(
        limiter.peek_n(1).unwrap(),
        Duration::from_millis(1),
        "every cell came back"
    );
    elapsed
}

#[test]
fn cancelling_n_waiters_costs_about_n_cancellations() {
    // Ten times the waiters: about ten times the time when each cancellation costs O(1),
    // a hundred times when each one rewrites everyone behind it. Best of three each.
    let best = |count| {
        (0..3)
            .map(|_| cancel_front_first(count))
            .fold(f64::MAX, f64::min)
    };
    let (small, large) = (best(2_000), best(20_000));
    assert!(
        large < 35.0 * small,
        "2 000 in {small:.4} s, 20 000 in {large:.4} s"
    );
}
