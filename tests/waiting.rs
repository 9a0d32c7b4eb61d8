//! Booked, FIFO, cancel-safe waiting: deterministic on a `ManualClock`, and on real
//! executors with generous bounds.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

mod common;

use common::{assert_paced, IDEAL, SLACK, WAITERS};
use paceline::clock::{Clock, ManualClock};
use paceline::{Denied, Limiter, Quota};

const T: Duration = Duration::from_millis(100);

/// A future polled by hand, with a waker that counts its wake-ups.
struct Probe<'a> {
    future: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    wakes: Arc<Wakes>,
    done: bool,
}

#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl<'a> Probe<'a> {
    fn new(future: impl Future<Output = ()> + Send + 'a) -> Probe<'a> {
        Probe {
            future: Box::pin(future),
            wakes: Arc::default(),
            done: false,
        }
    }

    fn woken(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }

    /// Polls once (unless finished); returns whether the future is finished.
    fn poll(&mut self) -> bool {
        if !self.done {
            let waker = Waker::from(self.wakes.clone());
            self.done = self
                .future
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready();
        }
        self.done
    }
}

/// A limiter of one cell per 100 ms, burst `burst`, with the burst already spent.
fn spent(burst: u32) -> (ManualClock, Limiter<ManualClock>) {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(
        Quota::try_new(1, T).unwrap().with_burst(burst),
        clock.clone(),
    );
    limiter.check_n(burst).unwrap();
    (clock, limiter)
}

#[test]
fn a_hundred_waiters_finish_in_booking_order_each_at_its_instant() {
    let (clock, limiter) = spent(1);
    let order = Mutex::new(Vec::new());
    let mut probes: Vec<_> = (0..100)
        .map(|i| {
            let (limiter, order) = (&limiter, &order);
            Probe::new(async move {
                limiter.until_ready().await;
                order.lock().unwrap().push(i);
            })
        })
        .collect();
    for p in &mut probes {
        assert!(
            !p.poll(),
            "the burst is spent: every waiter books and waits"
        );
    }
    for step in 1..=100 {
        clock.advance(T);
        // The advance woke exactly the waiter that came due, and nobody else.
        let woken: Vec<usize> = (0..100).filter(|&i| probes[i].woken() > 0).collect();
        assert_eq!(woken, (0..step).collect::<Vec<_>>());
        for p in &mut probes {
            p.poll();
        }
        assert_eq!(order.lock().unwrap().len(), step);
    }
    assert_eq!(*order.lock().unwrap(), (0..100).collect::<Vec<_>>());
}

#[test]
fn heavy_requests_are_not_overtaken_by_later_light_ones() {
    let (clock, limiter) = spent(5);
    let done = Mutex::new(Vec::new());
    let mut probes: Vec<_> = [(5u32, "heavy"), (1, "light-1"), (1, "light-2")]
        .into_iter()
        .map(|(n, name)| {
            let (limiter, done) = (&limiter, &done);
            Probe::new(async move {
                limiter.until_n_ready(n).await.unwrap();
                done.lock().unwrap().push(name);
            })
        })
        .collect();
    for p in &mut probes {
        assert!(!p.poll());
    }
    let mut at = Vec::new();
    for step in 1..=7 {
        clock.advance(T);
        for p in &mut probes {
            p.poll();
        }
        at.push((step, done.lock().unwrap().clone()));
    }
    // The heavy one needs 5 intervals; the light ones queue behind it.
    assert!(at[3].1.is_empty());
    assert_eq!(at[4].1, vec!["heavy"]);
    assert_eq!(at[5].1, vec!["heavy", "light-1"]);
    assert_eq!(at[6].1, vec!["heavy", "light-1", "light-2"]);
}

#[test]
fn cancelling_a_middle_waiter_moves_the_next_up_and_check_sees_the_refund() {
    let (clock, limiter) = spent(1);
    let mut a = Probe::new(limiter.until_ready());
    let mut b = Probe::new(limiter.until_ready());
    let mut c = Probe::new(limiter.until_ready());
    assert!(!a.poll() && !b.poll() && !c.poll());
    // Booked: a at 100 ms, b at 200 ms, c at 300 ms; a check would wait 400 ms.
    assert_eq!(limiter.check().unwrap_err().wait_time(), 4 * T);
    drop(b);
    assert_eq!(limiter.check().unwrap_err().wait_time(), 3 * T);
    clock.advance(T);
    assert!(a.poll());
    assert!(!c.poll());
    clock.advance(T);
    assert!(c.woken() > 0, "c moved up to 200 ms");
    assert!(c.poll());
    // Nothing is booked beyond now + T: a plain check gets the next cell at 300 ms.
    assert_eq!(limiter.check().unwrap_err().wait_time(), T);
}

#[test]
fn cancelling_the_front_waiter_rearms_the_timer_for_the_next() {
    let (clock, limiter) = spent(5);
    let mut heavy = Probe::new(async { limiter.until_n_ready(5).await.unwrap() });
    let mut light = Probe::new(limiter.until_ready());
    assert!(!heavy.poll() && !light.poll());
    drop(heavy);
    // light was due at 600 ms; with the heavy booking gone it is due at 100 ms.
    clock.advance(T);
    assert!(light.woken() > 0);
    assert!(light.poll());
}

#[test]
fn five_hundred_dropped_waiters_give_all_capacity_back() {
    let (clock, limiter) = spent(10);
    let before = limiter.check().unwrap_err().wait_time();
    let mut probes: Vec<_> = (0..500)
        .map(|i| {
            let limiter = &limiter;
            Probe::new(async move {
                limiter.until_n_ready(1 + i % 3).await.unwrap();
            })
        })
        .collect();
    for p in &mut probes {
        assert!(!p.poll());
    }
    // About 1000 cells booked at 100 ms each.
    assert!(limiter.check().unwrap_err().wait_time() > Duration::from_secs(99));
    // Drop in a scattered order: odd ones, then the rest from the back.
    let mut i = 0;
    probes.retain(|_| {
        i += 1;
        i % 2 == 0
    });
    while probes.pop().is_some() {}
    assert_eq!(limiter.check().unwrap_err().wait_time(), before);
    clock.advance(10 * T);
    assert_eq!(limiter.remaining(), 10);
    assert!(limiter.check_n(10).is_ok());
}

#[test]
fn futures_never_polled_book_nothing() {
    let (clock, limiter) = spent(3);
    let futures: Vec<_> = (0..100).map(|_| limiter.until_n_ready(3)).collect();
    let within: Vec<_> = (0..100)
        .map(|_| limiter.until_ready_within(Duration::from_secs(1)))
        .collect();
    drop(futures);
    drop(within);
    clock.advance(3 * T);
    assert_eq!(limiter.remaining(), 3);
    assert_eq!(limiter.next_waiter_due_in(), None);
}

#[test]
fn a_deadline_that_cannot_be_met_books_nothing_and_says_when() {
    let (clock, limiter) = spent(1);
    let before = limiter.check().unwrap_err().wait_time();
    let mut late = None;
    let mut probe = Probe::new(async {
        late = Some(limiter.until_ready_within(T / 2).await);
    });
    assert!(probe.poll());
    drop(probe);
    let late = late.unwrap().unwrap_err();
    assert_eq!(late.wait_time(), T);
    assert_eq!(limiter.check().unwrap_err().wait_time(), before);
    // Within a long enough deadline it books and waits.
    let mut ok = Probe::new(async { limiter.until_ready_within(T).await.unwrap() });
    assert!(!ok.poll());
    clock.advance(T);
    assert!(ok.poll());
    let mut too_big = None;
    let mut probe = Probe::new(async {
        too_big = Some(limiter.until_n_ready_within(2, Duration::MAX).await);
    });
    assert!(probe.poll());
    drop(probe);
    assert!(matches!(
        too_big,
        Some(Err(Denied::InsufficientCapacity(_)))
    ));
}

#[test]
fn more_than_the_burst_is_an_error_not_a_hang() {
    let (_clock, limiter) = spent(2);
    let mut result = None;
    let mut probe = Probe::new(async {
        result = Some(limiter.until_n_ready(3).await);
    });
    assert!(probe.poll(), "answered on the first poll");
    drop(probe);
    assert_eq!(result.unwrap().unwrap_err().requested(), 3);
}

#[test]
fn blocked_threads_take_booked_places_and_wake_on_advance() {
    let (clock, limiter) = spent(1);
    let limiter = Arc::new(limiter);
    let finished = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, finished) = (limiter.clone(), finished.clone());
            std::thread::spawn(move || {
                limiter.wait();
                finished.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    // Wait (really) until all four have booked: a check then waits 5 intervals.
    let start = Instant::now();
    while limiter.check().unwrap_err().wait_time() < 5 * T {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "threads never booked"
        );
        std::thread::yield_now();
    }
    assert_eq!(finished.load(Ordering::SeqCst), 0);
    for _ in 0..4 {
        clock.advance(T);
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(finished.load(Ordering::SeqCst), 4);
}

#[test]
fn an_embedding_runtime_drives_waiters_with_next_waiter_due_in_and_wake_due_waiters() {
    // A runtime that drives waiters itself: its clock's `wake_at` does nothing.
    let clock = common::SetClock::default();
    let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    limiter.check().unwrap();
    let mut a = Probe::new(limiter.until_ready());
    let mut b = Probe::new(limiter.until_ready());
    assert!(!a.poll() && !b.poll());
    let due_in = limiter.next_waiter_due_in().unwrap();
    assert_eq!(due_in, Duration::from_millis(100));
    clock.set(due_in);
    limiter.wake_due_waiters();
    assert_eq!((a.woken(), b.woken()), (1, 0));
    assert!(a.poll());
    assert_eq!(
        limiter.next_waiter_due_in(),
        Some(Duration::from_millis(100))
    );
}

// ---- real executors, real time: generous bounds, never flaky --------------------------
// (Named `realtime_*` so that the Miri run, which covers the manual-clock tests above, can
// skip them: under Miri real time crawls.)

fn rate_limiter() -> Arc<Limiter> {
    Arc::new(Limiter::new(Quota::per_second(500).with_burst(1)))
}

async fn run_waiters<S, F>(spawn: S) -> Duration
where
    S: Fn(Pin<Box<dyn Future<Output = ()> + Send>>) -> F,
    F: Future<Output = ()>,
{
    let limiter = rate_limiter();
    let start = Instant::now();
    let tasks: Vec<F> = (0..WAITERS)
        .map(|_| {
            let limiter = limiter.clone();
            spawn(Box::pin(async move { limiter.until_ready().await }))
        })
        .collect();
    futures::future::join_all(tasks).await;
    start.elapsed()
}

#[test]
fn realtime_tokio_current_thread() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let elapsed = rt.block_on(run_waiters(|f| async { tokio::spawn(f).await.unwrap() }));
    assert_paced(elapsed, "tokio current-thread");
}

#[test]
fn realtime_tokio_multi_thread() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let elapsed = rt.block_on(run_waiters(|f| async { tokio::spawn(f).await.unwrap() }));
    assert_paced(elapsed, "tokio multi-thread");
}

#[test]
fn realtime_smol_async_executor() {
    let ex = Arc::new(async_executor::Executor::new());
    let spawner = ex.clone();
    let elapsed = smol::block_on(ex.run(run_waiters(move |f| spawner.spawn(f))));
    assert_paced(elapsed, "async-executor");
}

#[test]
fn realtime_futures_block_on() {
    let elapsed = futures::executor::block_on(run_waiters(|f| f));
    assert_paced(elapsed, "futures::executor::block_on");
}

#[test]
fn realtime_timeouts_racing_wake_ups_lose_no_cells() {
    let rt = common::tokio_runtime();
    let limiter = Arc::new(Limiter::new(Quota::per_second(1_000).with_burst(1)));
    rt.block_on(common::timeouts_race_wake_ups(limiter, 5));
}

#[test]
fn realtime_async_waiters_are_not_starved_by_a_thread_hammering_check() {
    let limiter = Arc::new(Limiter::new(Quota::per_second(1_000).with_burst(1)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer_start = Instant::now();
    let hammer = {
        let (limiter, stop) = (limiter.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut admitted = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if limiter.check().is_ok() {
                    admitted += 1;
                }
            }
            admitted
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let start = Instant::now();
    rt.block_on(common::tokio_waiters(&limiter, 50));
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let hammered = hammer.join().unwrap();
    let span = hammer_start.elapsed();
    // 50 waiters at 1 ms each, shared with the hammer: far below the slack even if the
    // hammer took every gap.
    assert!(
        elapsed < Duration::from_secs(5),
        "waiters starved: {elapsed:?}"
    );
    // The hammer and the waiters share one quota: together at most burst + span / T.
    assert!(hammered + 50 <= 1 + span.as_millis() as u64 + 1);
}

#[test]
fn realtime_coarse_clock_paces_checks_and_waiters_never_early() {
    use paceline::clock::CoarseClock;
    let clock = CoarseClock::with_resolution(Duration::from_millis(1));
    let limiter = Limiter::with_clock(Quota::per_second(500).with_burst(1), clock);
    let start = Instant::now();
    futures::executor::block_on(async {
        for _ in 0..WAITERS {
            limiter.until_ready().await;
        }
    });
    // The pacing is exact in the clock's own time. Measured in real time it can look early
    // by the clock's lag at the first reading (a resolution, more if the upkeep thread was
    // descheduled on a loaded machine), so the lower bound allows 10 ms of lag.
    let elapsed = start.elapsed();
    assert!(
        elapsed + Duration::from_millis(10) >= IDEAL,
        "coarse clock: {elapsed:?}"
    );
    assert!(
        elapsed <= IDEAL + SLACK,
        "coarse clock too slow: {elapsed:?}"
    );
    let start = Instant::now();
    for _ in 0..10 {
        limiter.wait();
    }
    // Ten more cells at 2 ms each, after the last async one: at least 20 ms minus the lag.
    let elapsed = start.elapsed();
    assert!(
        elapsed + Duration::from_millis(10) >= Duration::from_millis(20),
        "blocking: {elapsed:?}"
    );
}

/// A clock whose wake-ups the test delivers by hand, whenever it likes (early included).
#[derive(Clone, Default)]
struct HandDelivered {
    now: Arc<std::sync::atomic::AtomicU64>,
    wakers: Arc<Mutex<Vec<Waker>>>,
}

impl Clock for HandDelivered {
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn wake_at(&self, _at: u64, waker: Waker) {
        self.wakers.lock().unwrap().push(waker);
    }
}

impl HandDelivered {
    fn deliver(&self) {
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap());
        for w in wakers {
            w.wake();
        }
    }
}

#[test]
fn a_wake_up_that_comes_early_is_asked_for_again() {
    let clock = HandDelivered::default();
    let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    limiter.check().unwrap();
    let mut waiter = Probe::new(limiter.until_ready());
    assert!(!waiter.poll());
    // The clock wakes the queue at 50 ms, before the waiter's 100 ms instant.
    clock.now.store(50_000_000, Ordering::SeqCst);
    clock.deliver();
    assert_eq!(waiter.woken(), 0, "not due yet");
    assert_eq!(
        clock.wakers.lock().unwrap().len(),
        1,
        "the queue asked to be woken again"
    );
    clock.now.store(100_000_000, Ordering::SeqCst);
    clock.deliver();
    assert_eq!(waiter.woken(), 1);
    assert!(waiter.poll());
}

#[test]
fn a_full_batch_of_due_waiters_still_arms_the_next_one() {
    // Waker batches hold 32: with exactly 32 waiters due, the pass that fills the batch
    // arms the 33rd, and that wake-up must still be asked for (it once was not, and the
    // 33rd waited for ever).
    let (clock, limiter) = spent(1);
    let mut probes: Vec<_> = (0..33).map(|_| Probe::new(limiter.until_ready())).collect();
    for p in &mut probes {
        assert!(!p.poll());
    }
    clock.advance(T * 32);
    assert_eq!((0..33).filter(|&i| probes[i].woken() > 0).count(), 32);
    clock.advance(T);
    assert_eq!(probes[32].woken(), 1, "the 33rd waiter was never woken");
    assert!(probes.iter_mut().all(|p| p.poll()));
}
