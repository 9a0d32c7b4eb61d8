//! The pace a [`Follower`] keeps: the ceiling (the announced or observed pace, the
//! configured quota), the learned rate below it, the floor of
//! [`FollowerConfig::max_hold`](crate::upstream::FollowerConfig::max_hold), and the quota that
//! sets that pace on its limiters.

use core::time::Duration;

use super::{Follower, State, PACE_SHARE};
use crate::clock::Clock;
use crate::Quota;

const NANOS: f64 = 1e9;

impl<C: Clock> Follower<C> {
    /// Sets the limiters' quota to the pace now, re-spacing booked turns when it went
    /// down; `before` is the pace before the response being applied.
    pub(super) fn steer(&self, state: &mut State, now: u64, before: f64) {
        let ceiling = self.ceiling(state);
        state.learned.settle(now, ceiling);
        let pace = self.pace(state, now);
        if pace < before {
            state.lowered_at = now;
        }
        let quota = self.quota_for(state, pace);
        let set = state.set;
        if quota == set {
            return;
        }
        // Small steps of the learned rate's growth are not worth re-reading the queue.
        let (a, b) = (nanos_of(quota) as f64, nanos_of(set) as f64);
        let small = quota.burst() == set.burst()
            && quota != state.configured
            && set != state.configured
            && (a - b).abs() <= b * 0.01;
        if small {
            return;
        }
        let lower = nanos_of(quota) > nanos_of(set);
        for limiter in core::iter::once(&self.limiter).chain(self.run.as_ref()) {
            if lower {
                limiter.set_quota_respaced(quota);
            } else {
                limiter.set_quota(quota);
            }
        }
        state.set = quota;
    }

    /// The announced (or observed) pace and the configured quota, combined.
    pub(super) fn ceiling(&self, state: &State) -> f64 {
        let configured = rate_of(state.configured);
        let announced = state
            .announced
            .map(|(rate, _)| rate)
            .or_else(|| state.window.rate())
            .map(|rate| rate * PACE_SHARE);
        match announced {
            Some(a) if self.config.above_configured => a,
            Some(a) => a.min(configured),
            None => configured,
        }
    }

    /// The pace at `now`, requests per second.
    pub(super) fn pace(&self, state: &State, now: u64) -> f64 {
        let ceiling = self.ceiling(state);
        let pace = state
            .learned
            .rate_at(now)
            .map_or(ceiling, |learned| learned.min(ceiling));
        // Nothing the upstream says spaces requests further apart than `max_hold` (the
        // caller's own quota may).
        let floor = if self.config.max_hold.is_zero() {
            f64::INFINITY
        } else {
            1.0 / self.config.max_hold.as_secs_f64()
        };
        pace.max(floor.min(rate_of(state.configured)))
    }

    /// The quota for a pace: the configured one at (or above) its rate, else one request
    /// per interval.
    fn quota_for(&self, state: &State, pace: f64) -> Quota {
        let configured = rate_of(state.configured);
        if pace >= configured * (1.0 - 1e-9) && !(self.config.above_configured && pace > configured)
        {
            return state.configured;
        }
        Quota::try_new(1, Duration::from_nanos(nanos_per(pace))).unwrap_or(state.configured)
    }
}

/// Requests per second of a quota.
fn rate_of(quota: Quota) -> f64 {
    NANOS / (nanos_of(quota).max(1) as f64)
}

/// Nanoseconds between requests at a quota's rate.
fn nanos_of(quota: Quota) -> u64 {
    u64::try_from(quota.emission_interval().as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds between requests at `rate` per second.
pub(super) fn nanos_per(rate: f64) -> u64 {
    (NANOS / rate).clamp(1.0, u64::MAX as f64) as u64
}
