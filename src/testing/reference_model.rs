//! The spec's GCRA formula as an independent reference model, in `u128` nanoseconds.
//!
//! One model for every check that compares paceline with the spec: the fuzz bodies in
//! `src/testing/fuzzing.rs` use it as a module, and `tests/model.rs` includes this same
//! file with `#[path]` (integration tests cannot see the library's `cfg(test)` code). It
//! names only paceline's public API, as `paceline::…` (the library is its own `paceline` in
//! test and fuzzing builds), so it compiles the same in both places. It shares no
//! code with the limiter: admission is the formula written out, and `remaining` is the
//! spec's definition (the largest `k` that would be admitted), found by binary search.

use paceline::{Denied, Quota};

/// What a request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Admitted,
    /// Denied for now; the wait in nanoseconds.
    Wait(u128),
    /// More than the burst: never admissible.
    Never,
}

impl Outcome {
    /// The outcome of a real limiter call.
    pub(crate) fn of(result: Result<(), Denied>) -> Outcome {
        match result {
            Ok(()) => Outcome::Admitted,
            Err(Denied::NotUntil(e)) => Outcome::Wait(e.wait_time().as_nanos()),
            Err(Denied::InsufficientCapacity(_)) => Outcome::Never,
        }
    }
}

/// The formula's state: interval `t`, burst `b` and the theoretical arrival time.
#[derive(Debug)]
pub(crate) struct Model {
    t: u128,
    b: u128,
    tat: u128,
}

impl Model {
    /// A fresh limiter of `quota` (TAT 0).
    pub(crate) fn new(quota: Quota) -> Model {
        Model {
            t: quota.emission_interval().as_nanos(),
            b: u128::from(quota.burst()),
            tat: 0,
        }
    }

    /// Changes the quota: the TAT keeps its meaning in time (paceline's `set_quota`).
    pub(crate) fn set_quota(&mut self, quota: Quota) {
        self.t = quota.emission_interval().as_nanos();
        self.b = u128::from(quota.burst());
    }

    /// The theoretical arrival time.
    pub(crate) fn tat(&self) -> u128 {
        self.tat
    }

    /// Books `n` cells at `now` within an unlimited wait, like a waiter's first poll:
    /// returns the booking's TAT, or `None` for more than the burst.
    pub(crate) fn book(&mut self, now: u128, n: u32) -> Option<u128> {
        let n = u128::from(n);
        if n > self.b {
            return None;
        }
        self.tat = self.tat.max(now) + n * self.t;
        Some(self.tat)
    }

    /// Gives back `cost` nanoseconds of a cancelled booking.
    pub(crate) fn refund(&mut self, cost: u128) {
        self.tat -= cost;
    }

    /// When a booking of `cost` that left `tat` may proceed: `tat - max(tau, cost)`, or 0
    /// (the cost exceeds tau only after a change to a smaller burst window: the booking
    /// then proceeds when its own cost fits).
    pub(crate) fn ready_at(&self, tat: u128, cost: u128) -> u128 {
        tat.saturating_sub(self.tau().max(cost))
    }

    /// The interval `T` in nanoseconds.
    pub(crate) fn interval(&self) -> u128 {
        self.t
    }

    /// `b*T`, saturated at `u64::MAX` ns as the spec allows (a window past 584 years).
    fn tau(&self) -> u128 {
        (self.b * self.t).min(u128::from(u64::MAX))
    }

    fn admits(&self, now: u128, n: u128) -> bool {
        self.tat.max(now) + n * self.t - now <= self.tau()
    }

    /// Admit `n` cells at `now` iff `max(TAT, now) + n*T - now <= b*T`, then
    /// `TAT = max(TAT, now) + n*T`; a denial waits `TAT - (b - n)*T - now`. With paceline's
    /// documented edge: a TAT past `u64::MAX` ns is never admitted (wait `u64::MAX`).
    pub(crate) fn check_n(&mut self, now: u128, n: u32) -> Outcome {
        let n = u128::from(n);
        if n > self.b {
            return Outcome::Never;
        }
        if n == 0 {
            return Outcome::Admitted;
        }
        if n * self.t > u128::from(u64::MAX) {
            // Within a saturated burst window, but no TAT can hold it: never.
            return Outcome::Wait(u128::from(u64::MAX));
        }
        if !self.admits(now, n) {
            return Outcome::Wait(self.tat - (self.tau() - n * self.t) - now);
        }
        let tat = self.tat.max(now) + n * self.t;
        if tat > u128::from(u64::MAX) {
            return Outcome::Wait(u128::from(u64::MAX));
        }
        self.tat = tat;
        Outcome::Admitted
    }

    /// Whether `check_n(n)` would admit at `now`: the formula, and a new TAT that does not
    /// pass `u64::MAX` ns (the documented edge).
    fn would_admit(&self, now: u128, n: u128) -> bool {
        self.admits(now, n) && self.tat.max(now) + n * self.t <= u128::from(u64::MAX)
    }

    /// The largest `k <= b` that `check_n(k)` would admit at `now` (0 if none).
    pub(crate) fn remaining(&self, now: u128) -> u128 {
        // `would_admit` is monotone in k: binary search for its last true value.
        let (mut lo, mut hi) = (0u128, self.b);
        if !self.would_admit(now, 0) {
            return 0;
        }
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.would_admit(now, mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}
