//! Following an upstream's word about each dimension: [`Budget::follow`] and
//! [`Budget::hold_for`].
//!
//! # Implementation notes
//!
//! The upstream's word only ever tightens: each dimension it reports gets a floor on its
//! TAT (`Ledger::floor`, kept through settles), the whole budget a hold. With `T` the
//! dimension's interval and `tau` its burst window, at `now`:
//!
//! * `r` left (`r > 0`): the TAT rises to at least `now + tau - r*T`, so at most `r`
//!   cells conform now (a no-op when our own count is already lower);
//! * none left, whole again in `X`: the TAT rises to at least `now + X' + tau - T`, where
//!   `X' = min(X, max_hold)`: not one cell before `X'`, then the dimension's own pace
//!   from empty (none left and no reset: `now + tau`, as `r = 0` above).
//!
//! `Retry-After` holds every turn until `now + min(retry_after, max_hold)`. So nothing
//! the upstream says parks a one-cell turn longer than `max_hold`; a turn of `c` cells
//! then waits for its own `(c - 1) * T` as it would anyway. The limits the upstream
//! announces are read, not followed: the quotas stay yours. Waiters are not woken: a
//! floor or a hold only moves their instant later, and a waiter woken early finds it
//! not yet time and waits again.

use core::time::Duration;

use super::Budget;
use crate::clock::Clock;
use crate::upstream::DimensionSignal;
use crate::wait::duration_nanos;

impl<C: Clock> Budget<C> {
    /// Steers the budget by what a response said (module docs): a dimension reported
    /// with nothing left admits nothing before its reset, one with `r` left admits at
    /// most `r` now, and a `Retry-After` holds the whole budget; no wait is taken longer
    /// than `max_hold`. Dimensions are matched by name, folded (`input-tokens` is
    /// `input_tokens`); those the budget lacks are ignored. Returns how many of the
    /// budget's dimensions the response reported.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::clock::ManualClock;
    /// use paceline::upstream::DimensionSignal;
    /// use paceline::Quota;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let clock = ManualClock::new();
    /// let budget = Budget::builder()
    ///     .rate("requests", Quota::per_minute(600))
    ///     .rate("tokens", Quota::per_minute(60_000))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// let headers = [
    ///     ("x-ratelimit-remaining-requests", &b"599"[..]),
    ///     ("x-ratelimit-remaining-tokens", &b"0"[..]),
    ///     ("x-ratelimit-reset-tokens", &b"2s"[..]),
    /// ];
    /// let signal = DimensionSignal::read(200, headers, SystemTime::now());
    /// assert_eq!(budget.follow(&signal, Duration::from_secs(60)), 2);
    /// assert!(budget.try_acquire(&[("tokens", 1)]).is_err()); // nothing before 2 s
    /// clock.advance(Duration::from_secs(2));
    /// assert!(budget.try_acquire(&[("tokens", 1)]).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn follow(&self, signal: &DimensionSignal, max_hold: Duration) -> usize {
        let cap = duration_nanos(max_hold);
        let now = self.shared.clock.now();
        let mut floors = Vec::new();
        for (d, name) in self.shared.names.iter().enumerate() {
            let Some(left) = signal.get(name) else {
                continue;
            };
            let params = self.shared.quotas[d].params();
            let (interval, tau) = (u128::from(params.interval()), u128::from(params.tau()));
            let floor = if left.remaining > 0 {
                let spent = tau.saturating_sub(u128::from(left.remaining) * interval);
                u128::from(now) + spent
            } else {
                let reset = left.reset.map_or(0, |r| duration_nanos(r).min(cap));
                u128::from(now) + u128::from(reset) + tau - interval.min(tau)
            };
            // Past the end of time: held for ever by the cap, which `max_hold` bounds
            // anyway (a floor this far means `max_hold` itself is centuries).
            floors.push((d, u64::try_from(floor).unwrap_or(u64::MAX)));
        }
        let hold = signal
            .retry_after()
            .map(|r| now.saturating_add(duration_nanos(r).min(cap)));
        if !floors.is_empty() || hold.is_some() {
            let mut state = self.shared.lock();
            for &(d, at) in &floors {
                state.ledger.floor(d, at);
            }
            if let Some(until) = hold {
                state.ledger.hold(until);
            }
        }
        floors.len()
    }

    /// Holds every turn for `duration` from now: nothing is admitted before then (a
    /// hold already longer stays). Not capped: the duration is yours.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::clock::ManualClock;
    /// use paceline::Quota;
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let budget = Budget::builder()
    ///     .rate("requests", Quota::per_second(10))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// budget.hold_for(Duration::from_secs(1));
    /// assert!(budget.try_acquire(&[]).is_err());
    /// assert_eq!(budget.remaining("requests")?, 0);
    /// clock.advance(Duration::from_secs(1));
    /// assert!(budget.try_acquire(&[]).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hold_for(&self, duration: Duration) {
        let until = self
            .shared
            .clock
            .now()
            .saturating_add(duration_nanos(duration));
        self.shared.lock().ledger.hold(until);
    }
}

#[cfg(test)]
mod tests;
