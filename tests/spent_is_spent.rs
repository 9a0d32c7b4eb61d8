//! Spent is spent: once a waiter's or reservation's instant has come, no cancellation,
//! quota change or forgotten-and-restored key gives its cells back, and what the limiter
//! reports as admissible is admitted. Each test is a sequence that over-admitted before.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use paceline::clock::ManualClock;
use paceline::{KeyedLimiter, Limiter, Quota};

mod common;
use common::SetClock;

const MS: Duration = Duration::from_millis(1);

/// A clock, and `per_second` a second with a full second's burst (`wide`) or `narrow_burst`.
fn wide_and_narrow(per_second: u32, narrow_burst: u32) -> (SetClock, Quota, Quota) {
    let quota = Quota::per_second(per_second);
    (SetClock::default(), quota, quota.with_burst(narrow_burst))
}

fn poll<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_key_forgotten_and_stored_again_takes_no_refund_meant_for_its_old_word() {
    let clock = SetClock::default();
    let limiter = KeyedLimiter::with_clock(Quota::per_second(1).with_burst(1), clock.clone());
    limiter.check_key(&"k").unwrap();
    // Booked on the first word: TAT 2 s, due at 1 s.
    let mut first = Box::pin(limiter.until_key_ready(&"k"));
    assert!(poll(first.as_mut()).is_pending());
    // At 2 s the clock has not woken it (late, as the contract allows); the key's TAT has
    // passed, so it is forgotten, stored again by a check, and a second waiter books.
    clock.set(2000 * MS);
    limiter.retain_recent();
    limiter.check_key(&"k").unwrap();
    let mut second = Box::pin(limiter.until_key_ready(&"k"));
    assert!(poll(second.as_mut()).is_pending());
    // The first waiter's instant came and went: dropping it gives nothing back.
    drop(first);
    assert!(
        poll(second.as_mut()).is_pending(),
        "a refund for the old word let a second cell through at 2 s with burst 1"
    );
    assert!(limiter.check_key(&"k").is_err());
}

#[test]
fn a_clock_stepping_back_after_a_sweep_gives_no_key_a_second_burst() {
    let clock = SetClock::default();
    let quota = Quota::per_minute(10);
    let keyed = KeyedLimiter::with_clock(quota, clock.clone());
    let direct = Limiter::with_clock(quota, clock.clone());
    clock.set(Duration::from_secs(100));
    keyed.check_key_n(&7, 10).unwrap();
    direct.check_n(10).unwrap();
    clock.set(Duration::from_secs(200));
    keyed.retain_recent();
    assert!(keyed.is_empty());
    clock.set(Duration::from_secs(100) + Duration::from_nanos(1));
    assert!(direct.check().is_err());
    assert!(
        keyed.check_key(&7).is_err(),
        "20 cells within 1 ns after a backward step"
    );
    // Once time is past the sweep again, the keys are as new.
    clock.set(Duration::from_secs(200));
    assert!(keyed.check_key_n(&7, 10).is_ok());
}

#[test]
fn a_ready_reservation_keeps_its_cells_through_a_quota_change() {
    let (clock, wide, narrow) = wide_and_narrow(10, 5); // wide: T = 100 ms, burst 10
    let limiter = Limiter::with_clock(wide, clock.clone());
    limiter.check_n(10).unwrap();
    let turn = limiter.reserve(5).unwrap(); // due at 500 ms
    clock.set(500 * MS);
    assert!(turn.is_ready()); // its holder acts on it now
    limiter.set_quota(narrow);
    assert!(turn.is_ready(), "an instant that was reached moved later");
    drop(turn);
    limiter.set_quota(wide);
    // 10 + 5 cells by 500 ms with a 1 s burst window: nothing is left until 1 s.
    assert_eq!(limiter.remaining(), 0, "the used cells came back");
    assert!(limiter.check().is_err());
}

#[test]
fn a_waiter_dropped_once_its_instant_has_come_keeps_its_cells() {
    let clock = SetClock::default();
    let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    limiter.check().unwrap();
    let mut waiter = Box::pin(limiter.until_ready()); // due at 100 ms
    assert!(poll(waiter.as_mut()).is_pending());
    clock.set(150 * MS); // due, not yet woken (no timer fired)
    drop(waiter);
    assert!(limiter.check().is_err(), "its cell was handed out twice");
}

/// Every admission as (time, cells); asserts that in every window `[a, b]` the cells
/// admitted, weighed by the interval, add up to at most `b - a` plus `max_window`.
fn assert_windows(admitted: &[(Duration, u32)], interval: Duration, max_window: Duration) {
    for &(a, _) in admitted {
        for &(b, _) in admitted {
            if b < a {
                continue;
            }
            let cells: u32 = admitted
                .iter()
                .filter(|(t, _)| (a..=b).contains(t))
                .map(|(_, n)| n)
                .sum();
            assert!(
                interval * cells <= (b - a) + max_window,
                "{cells} cells in [{a:?}, {b:?}]: {admitted:?}"
            );
        }
    }
}

#[test]
fn a_heavy_waiter_across_two_quota_changes_never_passes_the_larger_burst() {
    let (clock, wide, narrow) = wide_and_narrow(1000, 1); // wide: T = 1 ms, burst 1000
    let limiter = Limiter::with_clock(wide, clock.clone());
    let mut admitted = vec![];
    limiter.check_n(1000).unwrap();
    admitted.push((Duration::ZERO, 1000));
    let mut heavy = pin!(limiter.until_n_ready(1000)); // due at 1 s
    assert!(poll(heavy.as_mut()).is_pending());
    limiter.set_quota(narrow);
    let mut heavy_done = false;
    // Greedy checks at each step, under whichever quota is in force.
    for (at, quota) in [(1000, narrow), (1500, narrow), (1999, wide), (2000, wide)] {
        clock.set(at * MS);
        limiter.set_quota(quota);
        if !heavy_done && poll(heavy.as_mut()).is_ready() {
            heavy_done = true;
            admitted.push((at * MS, 1000));
        }
        let n = limiter.remaining();
        if n > 0 {
            limiter.check_n(n).unwrap();
            admitted.push((at * MS, n));
        }
    }
    assert!(heavy_done);
    assert_windows(&admitted, MS, 1000 * MS);
}

#[test]
fn remaining_is_admitted_at_the_end_of_representable_time() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(Quota::per_hour(1).with_burst(u32::MAX), clock.clone());
    clock.advance(Duration::from_secs(10 * 3600));
    let n = limiter.remaining();
    let snapshot = limiter.snapshot();
    assert_eq!(snapshot.remaining(), n);
    assert!(n > 0);
    assert_eq!(
        limiter.peek_n(n).unwrap(),
        Duration::ZERO,
        "peek disagrees with remaining"
    );
    assert!(limiter.check_n(n).is_ok(), "remaining() said {n}");
    assert_eq!(limiter.remaining(), 0);
    assert!(limiter.check().is_err());
}

#[test]
fn a_new_key_at_the_key_bound_reports_the_wait_its_check_gets() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::with_clock(Quota::per_hour(1), clock.clone()).with_max_keys(1);
    for key in 0..1_000u32 {
        let _ = limiter.check_key(&key); // every shard holds one limited key
    }
    clock.advance(Duration::from_secs(3));
    let new = u32::MAX;
    assert_eq!(limiter.remaining_key(&new), 0);
    let snapshot = limiter.snapshot_key(&new);
    assert_eq!(snapshot.remaining(), 0);
    let wait = limiter.check_key(&new).unwrap_err().wait_time();
    assert_eq!(snapshot.until_next(), wait);
    assert!(wait > Duration::from_secs(3000));
    // A fresh limiter at its bound that never refused anyone says the same.
    let fresh = KeyedLimiter::with_clock(Quota::per_hour(1), ManualClock::new()).with_max_keys(1);
    for key in 0..1_000u32 {
        let _ = fresh.check_key(&key);
    }
    let probe = (1_000..2_000u32)
        .find(|k| fresh.check_key(k).is_err())
        .unwrap();
    let other = (probe + 1..3_000u32)
        .find(|k| fresh.remaining_key(k) == 0)
        .expect("unknown keys of a full shard have nothing admissible");
    assert!(fresh.check_key(&other).is_err());
}

#[cfg(feature = "stream")]
#[test]
fn a_throttled_stream_never_yields_an_item_whose_booking_was_refused() {
    use futures::Stream;
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(Quota::per_second(10), clock.clone());
    clock.advance(Duration::MAX); // the end of representable time
    assert!(limiter.check().is_err());
    let mut paced = pin!(paceline::stream::throttle(
        futures::stream::iter(0..5),
        &limiter
    ));
    for _ in 0..10 {
        match paced
            .as_mut()
            .poll_next(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Some(item)) => panic!("yielded {item} with no cell admitted"),
            Poll::Ready(None) | Poll::Pending => {}
        }
    }
}

#[test]
fn a_reservation_for_a_new_key_at_a_full_table_books_nothing_and_says_so() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::with_clock(Quota::per_hour(1), clock).with_max_keys(1);
    for key in 0..1_000u32 {
        let _ = limiter.check_key(&key);
    }
    let refused = (1_000..2_000u32).find_map(|k| limiter.reserve_key(&k, 1).err());
    match refused {
        Some(paceline::Denied::NotUntil(e)) => assert!(e.wait_time() > Duration::from_secs(3000)),
        other => panic!("a reservation without a slot: {other:?}"),
    }
}
