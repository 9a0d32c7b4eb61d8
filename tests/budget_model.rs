//! A budget on a `ManualClock` against a reference model: random sequences of waiting
//! and deadline asks, `try_acquire`, cancellations, settles, drops, time steps, and an
//! upstream's word (a dimension's remaining count and reset, a `Retry-After`). Every
//! decision (who is admitted, in which order, who is refused or times out) equals the
//! model's; the in-flight cap holds at every step; nothing is ever charged in part; and
//! every window's settled cost stays within the bound `docs/BUDGETS.md` proves.

#![allow(clippy::needless_range_loop)] // two dimensions, indexed alike in the model and the budget

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use paceline::budget::{Acquire, Budget, BudgetError, Turn};
use paceline::clock::ManualClock;
use paceline::upstream::DimensionSignal;
use paceline::Quota;
use proptest::prelude::*;

const NAMES: [&str; 2] = ["requests", "tokens"];
const CAP: u32 = 3;
const MS: u64 = 1_000_000;
/// The longest wait the upstream's word may impose.
const MAX_HOLD_MS: u64 = 1_000;

/// requests: 5/s, burst 3; tokens: 100/s, burst 40.
fn quotas() -> [Quota; 2] {
    [
        Quota::per_second(5).with_burst(3),
        Quota::per_second(100).with_burst(40),
    ]
}

fn interval(d: usize) -> u64 {
    quotas()[d].emission_interval().as_nanos() as u64
}

fn tau(d: usize) -> u64 {
    interval(d) * u64::from(quotas()[d].burst())
}

#[derive(Clone, Debug)]
enum Op {
    /// Wait for a turn of these costs, with an optional deadline in ms.
    Ask([u32; 2], Option<u64>),
    Try([u32; 2]),
    Advance(u64),
    /// Drop the i-th pending ask.
    Cancel(usize),
    /// Settle the i-th held turn.
    Settle(usize, [Option<u32>; 2]),
    /// Drop the i-th held turn.
    End(usize),
    /// A response: dimension d has this many left, whole again in this many ms.
    Left(usize, u32, u64),
    /// A 429 with `Retry-After` of this many ms.
    RetryAfter(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let cost = || [0u32..=3, 0u32..=40];
    let actual = || {
        [
            proptest::option::of(0u32..=5),
            proptest::option::of(0u32..=70),
        ]
    };
    prop_oneof![
        3 => (cost(), proptest::option::of(0u64..2_000)).prop_map(|(c, d)| Op::Ask(c, d)),
        1 => cost().prop_map(Op::Try),
        3 => (0u64..700).prop_map(Op::Advance),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => (any::<usize>(), actual()).prop_map(|(i, a)| Op::Settle(i, a)),
        1 => any::<usize>().prop_map(Op::End),
        1 => (0usize..2, 0u32..=40, 0u64..2_000).prop_map(|(d, r, ms)| Op::Left(d, r, ms)),
        1 => (0u64..2_000).prop_map(Op::RetryAfter),
    ]
}

/// One admission, as the bound needs it.
#[derive(Clone, Debug)]
struct Admission {
    at: u64,
    estimate: [u32; 2],
    actual: [u32; 2],
    /// When it was admitted and when it ended (settled or dropped), in the model's
    /// count of events.
    admitted: u64,
    ended: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Admission(usize),
    Floor(usize, u64),
}

/// The reference model: the specification written the plainest way.
#[derive(Default)]
struct Model {
    now: u64,
    admissions: Vec<Admission>,
    /// Admissions (by index) and floors (dimension, instant), in order.
    history: Vec<Event>,
    /// Nothing admitted before this instant.
    held: u64,
    in_flight: u32,
    /// Waiting asks: (ask id, costs, deadline).
    queue: VecDeque<(usize, [u32; 2], Option<u64>)>,
    /// Admissions and ends so far.
    events: u64,
}

impl Model {
    /// TAT of `d`: every admission replayed from 0 with its current cost (estimate while
    /// open, actual once settled), and every floor in its place.
    fn tat(&self, d: usize) -> u128 {
        self.history.iter().fold(0u128, |x, e| match *e {
            Event::Admission(i) => {
                let a = &self.admissions[i];
                x.max(u128::from(a.at)) + u128::from(a.actual[d]) * u128::from(interval(d))
            }
            Event::Floor(dim, at) if dim == d => x.max(u128::from(at)),
            Event::Floor(..) => x,
        })
    }

    /// The upstream says `d` has `r` left, whole again in `reset_ms`: at most `r` now, or
    /// with none left nothing before the reset (capped), then `d`'s own pace.
    fn left(&mut self, d: usize, r: u32, reset_ms: u64) {
        let floor = if r > 0 {
            self.now + tau(d).saturating_sub(u64::from(r) * interval(d))
        } else {
            self.now + reset_ms.min(MAX_HOLD_MS) * MS + tau(d) - interval(d)
        };
        self.history.push(Event::Floor(d, floor));
    }

    fn conforms(&self, cells: [u32; 2], at: u64) -> bool {
        at >= self.held
            && (0..2).all(|d| {
                self.tat(d) + u128::from(cells[d]) * u128::from(interval(d))
                    <= u128::from(at) + u128::from(tau(d))
            })
    }

    fn admit(&mut self, cells: [u32; 2]) -> usize {
        self.in_flight += 1;
        self.events += 1;
        self.admissions.push(Admission {
            at: self.now,
            estimate: cells,
            actual: cells,
            admitted: self.events,
            ended: None,
        });
        self.history
            .push(Event::Admission(self.admissions.len() - 1));
        self.admissions.len() - 1
    }

    /// Admits or times out queued asks, first come first served; returns what happened
    /// to whom, in order.
    fn pump(&mut self) -> Vec<(usize, Outcome)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.queue.len() {
            let (ask, cells, deadline) = self.queue[i];
            if i == 0 && self.in_flight < CAP && self.conforms(cells, self.now) {
                self.queue.pop_front();
                let admission = self.admit(cells);
                out.push((ask, Outcome::Admitted(admission)));
                continue;
            }
            if deadline.is_some_and(|d| d <= self.now) {
                self.queue.remove(i);
                out.push((ask, Outcome::TimedOut));
                continue;
            }
            i += 1;
        }
        out
    }

    /// When an ask of `cells` joining now would be admitted, by the rates alone.
    fn estimate(&self, cells: [u32; 2]) -> Option<u64> {
        let mut tats = [self.tat(0), self.tat(1)];
        let mut at = u128::from(self.now.max(self.held));
        for c in self.queue.iter().map(|q| q.1).chain([cells]) {
            for d in 0..2 {
                let need = tats[d] + u128::from(c[d]) * u128::from(interval(d));
                at = at.max(need.saturating_sub(u128::from(tau(d))));
            }
            for d in 0..2 {
                tats[d] = tats[d].max(at) + u128::from(c[d]) * u128::from(interval(d));
            }
        }
        u64::try_from(at).ok()
    }

    fn remaining(&self, d: usize) -> u32 {
        if self.held > self.now {
            return 0;
        }
        let backlog = self.tat(d).max(u128::from(self.now)) - u128::from(self.now);
        (u128::from(tau(d)).saturating_sub(backlog) / u128::from(interval(d))) as u32
    }

    fn end(&mut self, admission: usize) {
        self.events += 1;
        self.admissions[admission].ended = Some(self.events);
        self.in_flight -= 1;
    }

    /// The bound's `U` for admission `m`: the total under-estimate, in dimension `d`, of
    /// the turns in flight when it was admitted (itself included).
    fn under_estimate_at(&self, m: usize, d: usize) -> u64 {
        let at = self.admissions[m].admitted;
        self.admissions
            .iter()
            .filter(|a| a.admitted <= at && a.ended.is_none_or(|e| e > at))
            .map(|a| u64::from(a.actual[d].saturating_sub(a.estimate[d])))
            .sum()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Admitted(usize),
    TimedOut,
}

fn costs(cells: [u32; 2]) -> [(&'static str, u32); 2] {
    [(NAMES[0], cells[0]), (NAMES[1], cells[1])]
}

fn poll(
    future: &mut Pin<Box<Acquire<ManualClock>>>,
) -> Poll<Result<Turn<ManualClock>, BudgetError>> {
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn a_budget_decides_as_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let clock = ManualClock::new();
        let [requests, tokens] = quotas();
        let budget = Budget::builder()
            .rate(NAMES[0], requests)
            .rate(NAMES[1], tokens)
            .in_flight(CAP)
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut model = Model::default();
        // Pending asks: (ask id, future). Held turns: (admission index, turn).
        let mut pending: Vec<(usize, Pin<Box<Acquire<ManualClock>>>)> = Vec::new();
        let mut held: Vec<(usize, Turn<ManualClock>)> = Vec::new();
        let mut asks = 0usize;
        for op in ops {
            // What the real budget did after this op, in order, and what the model did.
            let mut real: Vec<(usize, Outcome)> = Vec::new();
            let mut expected: Vec<(usize, Outcome)> = Vec::new();
            match op {
                Op::Ask(cells, deadline) => {
                    let ask = asks;
                    asks += 1;
                    let mut future = Box::pin(match deadline {
                        Some(ms) => budget.acquire_within(&costs(cells), Duration::from_millis(ms)),
                        None => budget.acquire(&costs(cells)),
                    });
                    let refused = deadline.and_then(|ms| {
                        let at = model.estimate(cells);
                        let wait = at.map_or(u64::MAX, |at| at - model.now);
                        (wait > ms * MS).then_some(wait)
                    });
                    match poll(&mut future) {
                        Poll::Ready(Err(BudgetError::NotWithin { wait })) => {
                            let expected_wait = refused.expect("refused at once, the model did not");
                            let expected_wait = if expected_wait == u64::MAX {
                                Duration::MAX
                            } else {
                                Duration::from_nanos(expected_wait)
                            };
                            prop_assert_eq!(wait, expected_wait);
                        }
                        Poll::Ready(Ok(turn)) => {
                            prop_assert!(refused.is_none());
                            prop_assert!(model.queue.is_empty());
                            prop_assert!(model.in_flight < CAP && model.conforms(cells, model.now));
                            let admission = model.admit(cells);
                            held.push((admission, turn));
                        }
                        Poll::Pending => {
                            prop_assert!(refused.is_none());
                            model.queue.push_back((ask, cells, deadline.map(|ms| model.now + ms * MS)));
                            pending.push((ask, future));
                        }
                        // A deadline of 0 that the rates meet but the queue or the
                        // permits do not: out at once (the model times it out in its pump).
                        Poll::Ready(Err(BudgetError::TimedOut)) => {
                            prop_assert!(refused.is_none());
                            model.queue.push_back((ask, cells, deadline.map(|ms| model.now + ms * MS)));
                            real.push((ask, Outcome::TimedOut));
                        }
                        Poll::Ready(Err(other)) => prop_assert!(false, "{other}"),
                    }
                }
                Op::Try(cells) => {
                    let admit = model.queue.is_empty()
                        && model.in_flight < CAP
                        && model.conforms(cells, model.now);
                    match budget.try_acquire(&costs(cells)) {
                        Ok(turn) => {
                            prop_assert!(admit);
                            held.push((model.admit(cells), turn));
                        }
                        Err(e) => {
                            prop_assert!(!admit);
                            prop_assert_eq!(e, BudgetError::WouldWait);
                        }
                    }
                }
                Op::Advance(ms) => {
                    clock.advance(Duration::from_millis(ms));
                    model.now += ms * MS;
                }
                Op::Cancel(i) if !pending.is_empty() => {
                    let (ask, future) = pending.remove(i % pending.len());
                    drop(future);
                    model.queue.retain(|q| q.0 != ask);
                }
                Op::Settle(i, actual) if !held.is_empty() => {
                    let (admission, turn) = held.remove(i % held.len());
                    let named: Vec<(&str, u32)> = (0..2)
                        .filter_map(|d| actual[d].map(|a| (NAMES[d], a)))
                        .collect();
                    turn.settle(&named).unwrap();
                    let a = &mut model.admissions[admission];
                    for d in 0..2 {
                        if let Some(cells) = actual[d] {
                            a.actual[d] = cells;
                        }
                    }
                    model.end(admission);
                }
                Op::End(i) if !held.is_empty() => {
                    let (admission, turn) = held.remove(i % held.len());
                    drop(turn);
                    model.end(admission);
                }
                Op::Left(d, r, ms) => {
                    let (remaining, reset) = (r.to_string(), format!("{ms}ms"));
                    let headers = [
                        (format!("x-ratelimit-remaining-{}", NAMES[d]), remaining.as_bytes()),
                        (format!("x-ratelimit-reset-{}", NAMES[d]), reset.as_bytes()),
                    ];
                    let signal = DimensionSignal::read(200, headers, std::time::SystemTime::now());
                    budget.follow(&signal, Duration::from_millis(MAX_HOLD_MS));
                    model.left(d, r, ms);
                }
                Op::RetryAfter(ms) => {
                    let value = format!("{}.{:03}", ms / 1_000, ms % 1_000);
                    let signal = DimensionSignal::read(
                        429,
                        [("retry-after", value.as_bytes())],
                        std::time::SystemTime::now(),
                    );
                    budget.follow(&signal, Duration::from_millis(MAX_HOLD_MS));
                    model.held = model.held.max(model.now + ms.min(MAX_HOLD_MS) * MS);
                }
                _ => {}
            }
            // Run every pending ask, first come first served, until nothing changes.
            loop {
                let mut progress = false;
                let mut j = 0;
                while j < pending.len() {
                    match poll(&mut pending[j].1) {
                        Poll::Pending => j += 1,
                        Poll::Ready(outcome) => {
                            let (ask, _) = pending.remove(j);
                            progress = true;
                            match outcome {
                                Ok(turn) => {
                                    // Its model admission is filled in below.
                                    real.push((ask, Outcome::Admitted(usize::MAX)));
                                    held.push((usize::MAX, turn));
                                }
                                Err(BudgetError::TimedOut) => real.push((ask, Outcome::TimedOut)),
                                Err(other) => prop_assert!(false, "{other}"),
                            }
                        }
                    }
                }
                if !progress {
                    break;
                }
            }
            expected.extend(model.pump());
            // The same asks, in the same order, with the same outcomes.
            let real_kinds: Vec<_> = real.iter().map(|(a, o)| (*a, matches!(o, Outcome::TimedOut))).collect();
            let expected_kinds: Vec<_> = expected.iter().map(|(a, o)| (*a, matches!(o, Outcome::TimedOut))).collect();
            prop_assert_eq!(&real_kinds, &expected_kinds);
            // Held turns admitted just now get their model admission's index.
            let mut fresh = expected.iter().filter_map(|(_, o)| match o {
                Outcome::Admitted(i) => Some(*i),
                Outcome::TimedOut => None,
            });
            for h in held.iter_mut().filter(|h| h.0 == usize::MAX) {
                h.0 = fresh.next().unwrap();
            }
            prop_assert!(budget.in_flight() <= CAP);
            prop_assert_eq!(budget.in_flight(), model.in_flight);
            prop_assert_eq!(budget.waiting(), model.queue.len());
            for d in 0..2 {
                prop_assert_eq!(budget.remaining(NAMES[d]).unwrap(), model.remaining(d));
            }
        }
        // The settle bound, per dimension, over every window from one admission to a later
        // one: settled cost <= b + w/T + U, `U` the total under-estimate of the turns in
        // flight at the window's last admission (at most the cap times the largest single
        // under-estimate). In nanoseconds: cells*T <= tau + w + U*T.
        let admissions = &model.admissions;
        for d in 0..2 {
            let largest = admissions
                .iter()
                .map(|a| u64::from(a.actual[d].saturating_sub(a.estimate[d])))
                .max()
                .unwrap_or(0);
            for m in 0..admissions.len() {
                let under = model.under_estimate_at(m, d);
                prop_assert!(under <= u64::from(CAP) * largest);
                let mut sum = 0u128;
                for i in (0..=m).rev() {
                    sum += u128::from(admissions[i].actual[d]);
                    let w = u128::from(admissions[m].at - admissions[i].at);
                    let bound = u128::from(tau(d)) + w + u128::from(under) * u128::from(interval(d));
                    prop_assert!(
                        sum * u128::from(interval(d)) <= bound,
                        "dimension {}: {} cells in {} ns, U = {}", NAMES[d], sum, w, under
                    );
                }
            }
        }
    }
}
