//! What programs ask a limiter for beyond checking and waiting: header state, a peek,
//! quota changes at runtime, reservations, and throttled streams.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use paceline::clock::{Clock, ManualClock};
use paceline::{Denied, KeyedLimiter, Limiter, Quota};

const T: Duration = Duration::from_millis(100);

fn quota(burst: u32) -> Quota {
    Quota::try_new(1, T).unwrap().with_burst(burst)
}

fn poll<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_snapshot_reads_one_consistent_state() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(4), clock.clone());
    let fresh = limiter.snapshot();
    assert_eq!((fresh.burst(), fresh.remaining()), (4, 4));
    assert_eq!(
        (fresh.until_next(), fresh.until_full()),
        (Duration::ZERO, Duration::ZERO)
    );
    limiter.check_n(3).unwrap();
    let s = limiter.snapshot();
    assert_eq!(
        (s.remaining(), s.until_next(), s.until_full()),
        (1, Duration::ZERO, 3 * T)
    );
    limiter.check().unwrap();
    clock.advance(T / 4);
    let s = limiter.snapshot();
    assert_eq!(s.remaining(), 0);
    assert_eq!(s.until_next(), T * 3 / 4);
    assert_eq!(s.until_full(), 4 * T - T / 4);
    assert_eq!(s.quota(), quota(4));
    // A key: the same reading, and an unknown key is not stored by asking.
    let keyed = KeyedLimiter::with_clock(quota(2), clock.clone());
    keyed.check_key(&"a").unwrap();
    let a = keyed.snapshot_key(&"a");
    assert_eq!((a.remaining(), a.until_full()), (1, T));
    assert_eq!(keyed.snapshot_key(&"b").remaining(), 2);
    assert_eq!(keyed.len(), 1);
}

#[test]
fn peek_spends_nothing_and_agrees_with_check() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(5), clock.clone());
    limiter.check_n(5).unwrap();
    assert_eq!(limiter.peek_n(2).unwrap(), 2 * T);
    assert_eq!(limiter.peek_n(0).unwrap(), Duration::ZERO);
    assert!(limiter.peek_n(6).is_err());
    clock.advance(2 * T);
    assert_eq!(limiter.peek_n(2).unwrap(), Duration::ZERO);
    assert!(limiter.check_n(2).is_ok());
    assert_eq!(
        limiter.peek_n(1).unwrap(),
        limiter.check().unwrap_err().wait_time()
    );
}

#[test]
fn a_quota_change_keeps_the_spent_backlog_in_time() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(4), clock.clone());
    limiter.check_n(4).unwrap(); // backlog 400 ms
                                 // A smaller window (2 cells of 100 ms): the 400 ms stay spent, nothing until 300 ms.
    limiter.set_quota(quota(2));
    assert_eq!(limiter.check().unwrap_err().wait_time(), 3 * T);
    // A faster interval: the same backlog in time, new cells cost 10 ms each.
    limiter.set_quota(Quota::try_new(1, T / 10).unwrap().with_burst(50)); // window 500 ms
    assert_eq!(limiter.remaining(), 10);
    assert!(limiter.check_n(10).is_ok());
    assert!(limiter.check().is_err());
    assert_eq!(limiter.quota().burst(), 50);
}

#[test]
fn a_quota_change_requotes_booked_waiters_and_keeps_their_order() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(1), clock.clone());
    limiter.check().unwrap();
    let done = Mutex::new(Vec::new());
    let mut a = Box::pin(async {
        limiter.until_ready().await;
        done.lock().unwrap().push("a");
    });
    let mut b = Box::pin(async {
        limiter.until_ready().await;
        done.lock().unwrap().push("b");
    });
    assert!(poll(a.as_mut()).is_pending()); // due at 100 ms
    assert!(poll(b.as_mut()).is_pending()); // due at 200 ms
                                            // A burst of 3: both bookings fit the new window at once.
    limiter.set_quota(quota(3));
    assert!(poll(a.as_mut()).is_ready());
    assert!(poll(b.as_mut()).is_ready());
    assert_eq!(*done.lock().unwrap(), ["a", "b"]);
    // Their cells stay spent: the backlog is the whole new window (300 ms of 300 ms).
    assert_eq!(limiter.remaining(), 0);
    // And a smaller window pushes waiters back instead of forward.
    let mut c = pin!(limiter.until_ready());
    assert!(poll(c.as_mut()).is_pending()); // TAT 400 ms, due at 100 ms under burst 3
    limiter.set_quota(quota(1)); // due at 300 ms now
    clock.advance(2 * T);
    assert!(poll(c.as_mut()).is_pending());
    clock.advance(T);
    assert!(poll(c.as_mut()).is_ready());
}

#[test]
fn a_keyed_default_quota_change_applies_to_keys_without_their_own() {
    let clock = ManualClock::new();
    let keyed = KeyedLimiter::with_clock(quota(1), clock)
        .with_quota_for(|k: &u32| (*k == 0).then(|| quota(1)));
    keyed.check_key(&0).unwrap();
    keyed.check_key(&1).unwrap();
    keyed.set_quota(quota(3));
    assert!(keyed.check_key(&0).is_err(), "key 0 keeps its own quota");
    assert!(keyed.check_key_n(&1, 2).is_ok());
    assert!(keyed.check_key(&1).is_err());
}

#[test]
fn a_reservation_dropped_before_its_instant_gives_its_cells_back() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(2), clock.clone());
    limiter.check_n(2).unwrap();
    let first = limiter.reserve(2).unwrap();
    assert_eq!(first.ready_in(), 2 * T);
    let second = limiter.reserve(1).unwrap();
    assert_eq!(second.ready_in(), 3 * T);
    drop(first);
    assert_eq!(second.ready_in(), T, "the one behind moved up");
    clock.advance(T);
    assert!(second.is_ready());
    assert!(limiter
        .reserve(3)
        .is_err_and(|e| matches!(e, Denied::InsufficientCapacity(_))));
}

/// A clock that never wakes anyone: a reservation's instant passes without a fire.
#[derive(Clone, Default)]
struct Silent(Arc<AtomicU64>);

impl Clock for Silent {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn wake_at(&self, _at: u64, _waker: Waker) {}
}

#[test]
fn a_reservation_dropped_after_its_instant_keeps_its_cells() {
    let clock = Silent::default();
    let limiter = Limiter::with_clock(quota(1), clock.clone());
    limiter.check().unwrap();
    let turn = limiter.reserve(1).unwrap(); // due at 100 ms
    clock.0.store(150_000_000, Ordering::SeqCst);
    assert!(turn.is_ready());
    // Its holder acted on it, without awaiting it; the timer never fired it.
    drop(turn);
    assert_eq!(
        limiter.check().unwrap_err().wait_time(),
        T / 2,
        "the reserved cell stays spent"
    );
}

#[test]
fn awaiting_a_reservation_finishes_at_its_instant() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(1), clock.clone());
    limiter.check().unwrap();
    let mut turn = pin!(limiter.reserve(1).unwrap());
    assert!(poll(turn.as_mut()).is_pending());
    clock.advance(T);
    assert!(poll(turn.as_mut()).is_ready());
    let ready_now = limiter.reserve(1).unwrap();
    assert!(!ready_now.is_ready());
}

#[test]
fn a_throttled_stream_is_paced_on_a_manual_clock() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(2), clock.clone());
    let mut items = pin!(paceline::stream::throttle(
        futures::stream::iter(0..5),
        &limiter
    ));
    let next = |items: &mut Pin<&mut paceline::stream::Throttled<'_, _, _>>| {
        items
            .as_mut()
            .poll_next(&mut Context::from_waker(Waker::noop()))
    };
    // The burst: two at once, then one per interval.
    assert_eq!(next(&mut items), Poll::Ready(Some(0)));
    assert_eq!(next(&mut items), Poll::Ready(Some(1)));
    assert_eq!(next(&mut items), Poll::Pending);
    assert_eq!(next(&mut items), Poll::Pending);
    clock.advance(T);
    assert_eq!(next(&mut items), Poll::Ready(Some(2)));
    assert_eq!(next(&mut items), Poll::Pending);
    clock.advance(T);
    assert_eq!(next(&mut items), Poll::Ready(Some(3)));
    clock.advance(T);
    assert_eq!(next(&mut items), Poll::Ready(Some(4)));
    assert_eq!(next(&mut items), Poll::Ready(None));
}

#[test]
fn throttled_streams_sharing_a_limiter_are_served_in_order() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(1), clock.clone());
    limiter.check().unwrap();
    let mut a = pin!(paceline::stream::throttle(
        futures::stream::iter(["a1", "a2"]),
        &limiter
    ));
    let mut b = pin!(paceline::stream::throttle(
        futures::stream::iter(["b1"]),
        &limiter
    ));
    let cx = &mut Context::from_waker(Waker::noop());
    assert_eq!(a.as_mut().poll_next(cx), Poll::Pending); // a1 books 100 ms
    assert_eq!(b.as_mut().poll_next(cx), Poll::Pending); // b1 books 200 ms
    clock.advance(T);
    assert_eq!(
        b.as_mut().poll_next(cx),
        Poll::Pending,
        "b1 may not overtake a1"
    );
    assert_eq!(a.as_mut().poll_next(cx), Poll::Ready(Some("a1")));
    assert_eq!(a.as_mut().poll_next(cx), Poll::Pending); // a2 books 300 ms
    clock.advance(T);
    assert_eq!(b.as_mut().poll_next(cx), Poll::Ready(Some("b1")));
    clock.advance(T);
    assert_eq!(a.as_mut().poll_next(cx), Poll::Ready(Some("a2")));
}

#[test]
fn realtime_a_throttled_stream_on_tokio() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(Quota::per_second(200).with_burst(1)));
    let start = Instant::now();
    // An `Arc` makes the stream 'static, so it can be spawned.
    let task = rt.spawn(async move {
        paceline::stream::throttle(futures::stream::iter(0..20u32), limiter)
            .collect::<Vec<_>>()
            .await
    });
    let items = rt.block_on(task).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(items, (0..20).collect::<Vec<_>>());
    // 19 intervals of 5 ms after the first; generous upper bound for a loaded machine.
    assert!(elapsed >= Duration::from_millis(94), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[test]
fn owned_waits_and_reservations_outlive_the_borrow_and_give_cells_back() {
    let clock = ManualClock::new();
    let limiter = Arc::new(Limiter::with_clock(quota(1), clock.clone()));
    limiter.check().unwrap();
    // Owned: 'static futures and reservations, made from an Arc clone.
    let mut owned = Box::pin(Arc::clone(&limiter).until_ready_owned());
    assert!(poll(owned.as_mut()).is_pending());
    let turn = Arc::clone(&limiter).reserve_owned(1).unwrap();
    assert_eq!(turn.ready_in(), Duration::from_millis(200));
    turn.cancel(); // before its instant: given back
    drop(owned); // likewise
    assert_eq!(limiter.peek(), Duration::from_millis(100));
    // The keyed twins: a reservation per key, given back the same way.
    let keyed = Arc::new(KeyedLimiter::with_clock(quota(1), clock.clone()));
    keyed.check_key(&"k").unwrap();
    let turn = keyed.reserve_key(&"k", 1).unwrap();
    assert_eq!(turn.ready_in(), Duration::from_millis(100));
    assert_eq!(
        keyed.peek_key_n(&"k", 1).unwrap(),
        Duration::from_millis(200)
    );
    drop(turn);
    assert_eq!(
        keyed.peek_key_n(&"k", 1).unwrap(),
        Duration::from_millis(100)
    );
    let mut owned = Box::pin(Arc::clone(&keyed).until_key_ready_owned("k"));
    assert!(poll(owned.as_mut()).is_pending());
    clock.advance(Duration::from_millis(100));
    assert!(poll(owned.as_mut()).is_ready());
}
