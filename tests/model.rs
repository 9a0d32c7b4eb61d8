//! The limiter against an independent reference model of the spec's formula.
//!
//! The model keeps the theoretical arrival time in `u128` nanoseconds and applies the
//! formula literally: admit `n` cells at `t` iff `max(TAT, t) + n*T - t <= b*T`, then
//! `TAT = max(TAT, t) + n*T`; a denial waits `TAT - (b - n)*T - t`. Every decision, every
//! wait and every `remaining()` of the real limiter must equal it.

use std::time::Duration;

use pacer::clock::ManualClock;
use pacer::{Denied, Limiter, Quota};
use proptest::prelude::*;

// The one reference model, shared with the fuzz targets (see its module docs).
#[path = "../src/testing/reference_model.rs"]
#[allow(dead_code)]
mod reference_model;
use reference_model::{Model, Outcome};

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check,
    CheckN(u32),
    Remaining,
}

fn quota() -> impl Strategy<Value = Quota> {
    // Intervals from 1 ns to 10 s, bursts from 1 to 50.
    (1u64..10_000_000_000, 1u32..50).prop_map(|(interval, burst)| {
        Quota::try_new(1, Duration::from_nanos(interval))
            .unwrap()
            .try_with_burst(burst)
            .unwrap()
    })
}

fn ops(max_step: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => (0..max_step).prop_map(Op::Advance),
            1 => Just(Op::Advance(0)),
            4 => Just(Op::Check),
            3 => (0u32..60).prop_map(Op::CheckN),
            1 => Just(Op::Remaining),
        ],
        1..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_decision_wait_and_remaining_equal_the_model(
        (quota, ops) in quota().prop_flat_map(|q| {
            let step = q.emission_interval().as_nanos() as u64 * 3;
            (Just(q), ops(step.max(2)))
        })
    ) {
        let clock = ManualClock::new();
        let limiter = Limiter::with_clock(quota, clock.clone());
        let mut model = Model::new(quota);
        let mut now = 0u128;
        for op in ops {
            match op {
                Op::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                    now += u128::from(d);
                }
                Op::Check => {
                    let real = limiter.check().map_err(Denied::from);
                    prop_assert_eq!(Outcome::of(real), model.check_n(now, 1));
                }
                Op::CheckN(n) => {
                    prop_assert_eq!(Outcome::of(limiter.check_n(n)), model.check_n(now, n));
                }
                Op::Remaining => {
                    prop_assert_eq!(u128::from(limiter.remaining()), model.remaining(now));
                }
            }
            prop_assert_eq!(u128::from(limiter.remaining()), model.remaining(now));
        }
    }

    #[test]
    fn saturated_burst_windows_equal_the_saturating_model(
        interval in 1_000_000_000u64..10_000_000_000_000,
        burst in prop_oneof![Just(u32::MAX), 1_000_000u32..u32::MAX],
        ops in prop::collection::vec(
            prop_oneof![
                2 => (0u64..u64::MAX / 4).prop_map(Op::Advance),
                2 => any::<u32>().prop_map(Op::CheckN),
                1 => (0u32..1_000).prop_map(Op::CheckN),
                1 => Just(Op::Check),
                1 => Just(Op::Remaining),
            ],
            1..60,
        )
    ) {
        // Bursts whose window (burst * interval) is past u64::MAX ns: accepted, saturated.
        let quota = Quota::try_new(1, Duration::from_nanos(interval))
            .unwrap()
            .with_burst(burst);
        let clock = ManualClock::new();
        let limiter = Limiter::with_clock(quota, clock.clone());
        let mut model = Model::new(quota);
        let mut now = 0u128;
        for op in ops {
            match op {
                Op::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                    now = (now + u128::from(d)).min(u128::from(u64::MAX));
                }
                Op::Check => {
                    let real = limiter.check().map_err(Denied::from);
                    prop_assert_eq!(Outcome::of(real), model.check_n(now, 1));
                }
                Op::CheckN(n) => {
                    prop_assert_eq!(Outcome::of(limiter.check_n(n)), model.check_n(now, n));
                }
                Op::Remaining => {}
            }
            prop_assert_eq!(u128::from(limiter.remaining()), model.remaining(now));
        }
    }

    #[test]
    fn no_window_admits_more_than_burst_plus_its_length_over_the_interval(
        (quota, ops) in quota().prop_flat_map(|q| {
            let step = q.emission_interval().as_nanos() as u64 * 2;
            (Just(q), ops(step.max(2)))
        })
    ) {
        let clock = ManualClock::new();
        let limiter = Limiter::with_clock(quota, clock.clone());
        let t = quota.emission_interval().as_nanos();
        let b = u128::from(quota.burst());
        let mut now = 0u128;
        let mut admitted: Vec<(u128, u128)> = Vec::new();
        for op in ops {
            let n = match op {
                Op::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                    now += u128::from(d);
                    continue;
                }
                Op::Check | Op::Remaining => 1,
                Op::CheckN(n) => n,
            };
            if limiter.check_n(n).is_ok() && n > 0 {
                admitted.push((now, u128::from(n)));
            }
        }
        // Every window [t_i, t_j] between two admissions holds at most b + (t_j - t_i) / T.
        for i in 0..admitted.len() {
            let mut cells = 0;
            for j in i..admitted.len() {
                cells += admitted[j].1;
                let w = admitted[j].0 - admitted[i].0;
                prop_assert!(cells <= b + w / t, "{cells} cells in a window of {w} ns");
            }
        }
    }
}

#[test]
fn a_fresh_limiter_admits_a_full_burst_at_once() {
    let limiter = Limiter::with_clock(Quota::per_second(10), ManualClock::new());
    assert_eq!(limiter.remaining(), 10);
    for _ in 0..10 {
        limiter.check().unwrap();
    }
    assert_eq!(limiter.remaining(), 0);
    assert_eq!(
        limiter.check().unwrap_err().wait_time(),
        Duration::from_millis(100)
    );
}

#[test]
fn the_sustained_rate_is_the_quota_however_long_each_call_takes() {
    // 100/s with a burst of 10, callers that take 3 ms each and retry when denied.
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(Quota::per_second(100).with_burst(10), clock.clone());
    let mut admitted = 0u32;
    for _ in 0..10_000 {
        if limiter.check().is_ok() {
            admitted += 1;
        }
        clock.advance(Duration::from_millis(3));
    }
    // Checks at 0, 3 ms, ..., 29.997 s: the burst plus one cell per 10 ms of that span,
    // b + floor(29_997 / 10), and not a cell more.
    assert_eq!(admitted, 10 + 29_997 / 10);
}
