//! The limiter against an independent reference model of the spec's formula.
//!
//! The model keeps the theoretical arrival time in `u128` nanoseconds and applies the
//! formula literally: admit `n` cells at `t` iff `max(TAT, t) + n*T - t <= b*T`, then
//! `TAT = max(TAT, t) + n*T`; a denial waits `TAT - (b - n)*T - t`. Every decision, every
//! wait and every `remaining()` of the real limiter must equal it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use paceline::clock::ManualClock;
use paceline::{Denied, Limiter, Quota};
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

/// A quota, and operations on it that advance the clock by up to `intervals` of its
/// emission intervals at a time.
fn quota_and_ops(intervals: u64) -> impl Strategy<Value = (Quota, Vec<Op>)> {
    quota().prop_flat_map(move |q| {
        let step = q.emission_interval().as_nanos() as u64 * intervals;
        (Just(q), ops(step.max(2)))
    })
}

/// Runs `ops` on a limiter of `quota` and on the model side by side: every decision and
/// every remaining count the same. Time stops at `u64::MAX` ns, as the clock's does.
fn same_as_the_model(quota: Quota, ops: Vec<Op>) -> Result<(), TestCaseError> {
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
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_decision_wait_and_remaining_equal_the_model(
        (quota, ops) in quota_and_ops(3)
    ) {
        same_as_the_model(quota, ops)?;
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
        same_as_the_model(quota, ops)?;
    }

    #[test]
    fn no_window_admits_more_than_burst_plus_its_length_over_the_interval(
        (quota, ops) in quota_and_ops(2)
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

#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    CheckN(u32),
    SetQuota(u64, u32),
    Wait(u32),
    Reserve(u32),
    Drop(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            3 => (0u64..300).prop_map(Step::Advance),
            3 => (0u32..4).prop_map(Step::CheckN),
            1 => (10u64..100, 1u32..5).prop_map(|(t, b)| Step::SetQuota(t, b)),
            3 => (0u32..5).prop_map(Step::Wait),
            2 => (0u32..5).prop_map(Step::Reserve),
            2 => any::<usize>().prop_map(Step::Drop),
        ],
        1..150,
    )
}

/// A booking the model holds: its id, booked TAT and cost.
type Booked = (usize, u128, u128);

/// Fires the due prefix: what a manual clock's `advance` (or a re-armed queue) does.
fn fire_due(model: &Model, queue: &mut Vec<Booked>, now: u128) {
    while queue
        .first()
        .is_some_and(|b| model.ready_at(b.1, b.2) <= now)
    {
        queue.remove(0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Quota changes interleaved with checks, waiters and reservations: every decision,
    /// every `remaining()`, the next due waiter and which bookings have finished equal a
    /// model where a change keeps the TAT in time and re-reads booked instants, and a
    /// cancelled booking gives its cost back unless a plain admission came after the
    /// last booking.
    #[test]
    fn quota_changes_with_checks_waiters_and_reservations_equal_the_model(
        first in (10u64..100, 1u32..5),
        steps in steps(),
    ) {
        let quota = |(t, b): (u64, u32)| {
            Quota::try_new(1, Duration::from_nanos(t)).unwrap().with_burst(b)
        };
        let clock = ManualClock::new();
        let limiter = Limiter::with_clock(quota(first), clock.clone());
        let mut model = Model::new(quota(first));
        let mut now = 0u128;
        let mut queue: Vec<Booked> = Vec::new();
        let mut admitted_since_booking = false;
        let mut burst = first.1;
        type Pending<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;
        let mut pending: Vec<(usize, Pending<'_>)> = Vec::new();
        let cx = &mut Context::from_waker(Waker::noop());
        for (id, step) in steps.into_iter().enumerate() {
            match step {
                Step::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                    now += u128::from(d);
                }
                Step::CheckN(n) => {
                    let expected = model.check_n(now, n);
                    prop_assert_eq!(Outcome::of(limiter.check_n(n)), expected);
                    if expected == Outcome::Admitted && n > 0 {
                        admitted_since_booking = true;
                    }
                }
                Step::SetQuota(t, b) => {
                    limiter.set_quota(quota((t, b)));
                    model.set_quota(quota((t, b)));
                    burst = b;
                }
                Step::Wait(n) | Step::Reserve(n) => {
                    let reserve = matches!(step, Step::Reserve(_));
                    let mut future: Pending<'_> = if reserve {
                        match limiter.reserve(n) {
                            Ok(r) => Box::pin(r),
                            Err(e) => {
                                prop_assert!(n > burst, "reserve({}) refused: {:?}", n, e);
                                continue;
                            }
                        }
                    } else {
                        let l = &limiter;
                        Box::pin(async move { let _ = l.until_n_ready(n).await; })
                    };
                    let ready = future.as_mut().poll(cx).is_ready();
                    // The model's first poll: a plain check, else a booking.
                    let expected_ready = if n == 0 {
                        true
                    } else if model.check_n(now, n) == Outcome::Admitted {
                        admitted_since_booking = true;
                        true
                    } else {
                        match model.book(now, n) {
                            None => true, // more than the burst: refused at once
                            Some(tat) if model.ready_at(tat, u128::from(n) * model.interval()) <= now => {
                                admitted_since_booking = true;
                                true
                            }
                            Some(tat) => {
                                queue.push((id, tat, u128::from(n) * model.interval()));
                                admitted_since_booking = false;
                                false
                            }
                        }
                    };
                    prop_assert_eq!(ready, expected_ready, "first poll of booking {}", id);
                    if !ready {
                        pending.push((id, future));
                    }
                }
                Step::Drop(i) => {
                    if pending.is_empty() {
                        continue;
                    }
                    let (id, future) = pending.remove(i % pending.len());
                    drop(future);
                    if let Some(pos) = queue.iter().position(|b| b.0 == id) {
                        let (_, _, cost) = queue.remove(pos);
                        if !admitted_since_booking {
                            model.refund(cost);
                            for later in &mut queue[pos..] {
                                later.1 -= cost;
                            }
                        }
                    }
                }
            }
            fire_due(&model, &mut queue, now);
            prop_assert_eq!(u128::from(limiter.remaining()), model.remaining(now));
            prop_assert_eq!(
                limiter.next_waiter_due_in().map(|d| d.as_nanos()),
                queue.first().map(|b| model.ready_at(b.1, b.2) - now)
            );
            for (id, future) in &mut pending {
                let done = future.as_mut().poll(cx).is_ready();
                prop_assert_eq!(done, !queue.iter().any(|b| b.0 == *id), "booking {}", id);
            }
            pending.retain_mut(|(id, _)| queue.iter().any(|b| b.0 == *id));
        }
    }
}
