//! What programs read of a limiter without changing it: one consistent snapshot of its
//! state (what `RateLimit` headers need), and a peek at when cells would be admitted.

use std::time::Duration;

use paceline::clock::ManualClock;
use paceline::{KeyedLimiter, Limiter};

mod common;
use common::{quota, T};

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
