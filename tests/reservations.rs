//! A booked turn held as a value: given back before its instant, kept after it, awaited
//! to its instant; owned forms on an `Arc` and the keyed twins.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use paceline::clock::ManualClock;
use paceline::{Denied, KeyedLimiter, Limiter};

mod common;
use common::SetClock;
use common::{poll, quota, T};

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

#[test]
fn a_reservation_dropped_after_its_instant_keeps_its_cells() {
    let clock = SetClock::default();
    let limiter = Limiter::with_clock(quota(1), clock.clone());
    limiter.check().unwrap();
    let turn = limiter.reserve(1).unwrap(); // due at 100 ms
    clock.set(Duration::from_millis(150));
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
