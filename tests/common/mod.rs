//! What the real-time waiting tests share: the 50-waiter pacing job and its bounds, a tokio
//! runtime, tokio waiters, and tokio timeouts racing wake-ups.

#![allow(dead_code)] // each test crate uses a different part

#[cfg(unix)]
pub(crate) mod children;
pub(crate) mod dir;

use std::sync::Arc;
use std::time::Duration;

use paceline::clock::Clock;
use paceline::Limiter;

/// A tokio runtime of two workers, with tokio's timer.
pub(crate) fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

/// 50 waiters at 500/s, burst 1: the last is due 49 * 2 ms = 98 ms after the first.
pub(crate) const WAITERS: usize = 50;
pub(crate) const IDEAL: Duration = Duration::from_millis(98);
/// Upper bound on a loaded 2-core CI machine; the lower bound is exact.
pub(crate) const SLACK: Duration = Duration::from_secs(3);

pub(crate) fn assert_paced(elapsed: Duration, what: &str) {
    // quanta and std::time may disagree by a hair: allow 1 ms on the low side.
    assert!(
        elapsed + Duration::from_millis(1) >= IDEAL,
        "{what}: finished early, {elapsed:?}"
    );
    assert!(elapsed <= IDEAL + SLACK, "{what}: too slow, {elapsed:?}");
}

/// `waiters` tokio tasks each waiting for a cell of `limiter`, all run to the end. Runs
/// inside a tokio runtime with timers.
pub(crate) async fn tokio_waiters<C: Clock>(limiter: &Arc<Limiter<C>>, waiters: usize) {
    let tasks: Vec<_> = (0..waiters)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.until_ready().await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// `rounds` rounds of 200 tokio tasks waiting on `limiter` (1000/s, burst 1: waiter i is
/// due at about i ms) under a timeout that lands within a millisecond of that, on either
/// side. After each round nothing may be left booked or linked. Runs inside a tokio
/// runtime with timers.
pub(crate) async fn timeouts_race_wake_ups<C: Clock>(limiter: Arc<Limiter<C>>, rounds: u64) {
    for round in 0..rounds {
        let tasks: Vec<_> = (0..200u64)
            .map(|i| {
                let limiter = limiter.clone();
                let jitter = (i * 7 + round * 13) % 2_000;
                let timeout = Duration::from_micros(i * 1_000 + jitter);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(timeout, limiter.until_ready()).await;
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        // Whatever raced, nothing is left booked beyond the burst window: after one more
        // interval the whole burst is back, and no waiter is left in the queue.
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            limiter.next_waiter_due_in(),
            None,
            "round {round}: a node leaked"
        );
        assert_eq!(limiter.remaining(), 1, "round {round}: capacity lost");
        limiter.check().unwrap();
    }
}

/// A clock set by hand that never wakes anyone by itself: waiters are driven by polls and
/// `wake_due_waiters`, as a late timer (which the `Clock` contract allows) would leave them.
#[derive(Clone, Debug, Default)]
pub(crate) struct SetClock(Arc<std::sync::atomic::AtomicU64>);

impl SetClock {
    /// Sets the reading, in nanoseconds; it may go backwards.
    pub(crate) fn set(&self, t: Duration) {
        let nanos = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        self.0.store(nanos, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for SetClock {
    fn now(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn wake_at(&self, _at: u64, _waker: std::task::Waker) {}
}

/// The interval the runtime API tests use: 100 ms.
pub(crate) const T: Duration = Duration::from_millis(100);

/// One cell per [`T`] with `burst`.
pub(crate) fn quota(burst: u32) -> paceline::Quota {
    paceline::Quota::try_new(1, T).unwrap().with_burst(burst)
}

/// One poll with a waker that does nothing.
pub(crate) fn poll<F: std::future::Future + ?Sized>(
    future: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// The fused two-lane check (`check_n_with` and its keyed forms) as three steps, the model
/// it is checked against: look at the execution lane `$exec` (`$peek`), and if the cells
/// are there take them from the booking lane `$booked`, then from `$exec` (`$check`);
/// with the arguments `$arg`. Returns from the function it stands in.
#[allow(unused_macros)] // each test crate uses a different part
macro_rules! stepwise {
    ($booked:ident, $exec:ident, $peek:ident, $check:ident, $($arg:expr),+) => {{
        if !$exec.$peek($($arg),+)?.is_zero() {
            return Err($exec.$check($($arg),+).unwrap_err());
        }
        $booked.$check($($arg),+)?;
        $exec.$check($($arg),+)
    }};
}
#[allow(unused_imports)]
pub(crate) use stepwise;
