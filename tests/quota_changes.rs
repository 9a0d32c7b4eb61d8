//! Changing a quota while the limiter runs: the spent backlog keeps its meaning in time,
//! booked waiters keep their order, keyed limiters spare keys with a quota of their own.

use std::pin::pin;
use std::sync::Mutex;

use paceline::clock::ManualClock;
use paceline::{KeyedLimiter, Limiter, Quota};

mod common;
use common::{poll, quota, T};

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
fn a_slower_quota_respaced_moves_booked_turns_apart_in_order_and_cancels_exactly() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(1), clock.clone());
    limiter.check().unwrap();
    // Five booked turns 100 ms apart, at 100, 200, ..., 500 ms.
    let mut turns: Vec<_> = (0..5).map(|_| Box::pin(limiter.until_ready())).collect();
    for turn in &mut turns {
        assert!(poll(turn.as_mut()).is_pending());
    }
    clock.advance(T); // the first turn's instant has come: spent, it stays
    let slow = Quota::try_new(1, 3 * T).unwrap().with_burst(1);
    limiter.set_quota_respaced(slow);
    assert!(poll(turns[0].as_mut()).is_ready());
    // The others from 200 ms on, 300 ms apart: 200, 500, 800, 1100 ms.
    let due: [u32; 4] = [2, 5, 8, 11];
    for (i, at) in due.iter().enumerate() {
        clock.advance(T * *at - clock_now(&clock) - T / 2);
        assert!(
            poll(turns[i + 1].as_mut()).is_pending(),
            "turn {} early",
            i + 1
        );
        clock.advance(T / 2);
        assert!(
            poll(turns[i + 1].as_mut()).is_ready(),
            "turn {} late",
            i + 1
        );
    }
    // The word followed the tail: nothing before 1400 ms.
    assert_eq!(limiter.check().unwrap_err().wait_time(), 3 * T);
    // A turn given back before its instant returns exactly its new cost.
    let mut late = Box::pin(limiter.until_ready());
    assert!(poll(late.as_mut()).is_pending());
    drop(late);
    assert_eq!(limiter.check().unwrap_err().wait_time(), 3 * T);
    // A faster quota is set as set_quota does: booked turns keep their places.
    limiter.set_quota_respaced(quota(1));
    assert_eq!(limiter.quota(), quota(1));
}

fn clock_now(clock: &ManualClock) -> std::time::Duration {
    use paceline::clock::Clock;
    std::time::Duration::from_nanos(clock.now())
}
