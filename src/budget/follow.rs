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
//! `Retry-After` holds every turn until `now + min(retry_after, max_hold)`.
//!
//! A limit the upstream announces for a dimension with its window (`q` per `w`: a
//! policy's window, a minute for the provider fields) paces the dimension at that rate
//! when it is below the configured one: its interval becomes `min(w/q, max_hold)`, its
//! burst stays the configured count (a cost the budget accepted stays admissible), and
//! the backlog keeps its count of cells (`Ledger::set_params`): a slower rate frees no
//! cell, a faster one leaves no wait longer than its own. A later announcement at or
//! above the configured rate gives the configured quota back; a response that announces
//! nothing leaves the rate as it is.
//! So a budget configured above what its provider allows runs at the provider's rate
//! instead of spending each window's cells at once and waiting out the rest.
//!
//! So nothing the upstream says parks a one-cell turn longer than `max_hold`; a turn of
//! `c` cells then waits for its own `(c - 1) * T` as it would anyway. Waiters are not
//! woken: a floor, a hold or a slower rate only moves their instant later, and a waiter
//! woken early finds it not yet time and waits again. A faster rate wakes the head of the
//! queue, whose instant may have come earlier.

use core::time::Duration;

use super::{Budget, Ledger};
use crate::clock::Clock;
use crate::gcra::Params;
use crate::quota::Quota;
use crate::upstream::DimensionSignal;
use crate::wait::duration_nanos;

impl<C: Clock> Budget<C> {
    /// Steers the budget by what a response said (module docs): a dimension reported
    /// with nothing left admits nothing before its reset, one with `r` left admits at
    /// most `r` now, one whose announced limit is below its configured rate is paced at
    /// the announced rate (and given its configured rate back when an announcement
    /// reaches it), and a `Retry-After` holds the whole budget; no wait is taken longer
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
        let now = self.shared.clock.now();
        let mut state = self.shared.lock();
        let (reported, faster) = steer(
            &mut state.ledger,
            (&self.shared.names, &self.shared.quotas),
            signal,
            max_hold,
            now,
        );
        // A faster rate may bring the head's instant earlier than the alarm it sleeps on.
        let head = if faster { state.head_waker() } else { None };
        drop(state);
        super::methods::wake(head);
        reported
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

/// What a response said about a budget of `names` configured at `quotas`, applied to its
/// ledger at `now` (module docs): returns how many of its dimensions the response
/// reported, and whether a dimension's rate became faster.
pub(crate) fn steer(
    ledger: &mut Ledger,
    (names, quotas): (&[String], &[Quota]),
    signal: &DimensionSignal,
    max_hold: Duration,
    now: u64,
) -> (usize, bool) {
    let cap = duration_nanos(max_hold);
    let reported: Vec<_> = (names.iter().enumerate())
        .filter_map(|(d, name)| Some((d, signal.get(name)?)))
        .collect();
    let paces: Vec<_> = (reported.iter())
        .filter_map(|&(d, left)| Some((d, paced(quotas[d].params(), left.limit?, left.per?, cap))))
        .collect();
    let hold = signal
        .retry_after()
        .map(|r| now.saturating_add(duration_nanos(r).min(cap)));
    let mut faster = false;
    for &(d, params) in &paces {
        let (interval, tau) = ledger.pace(d);
        if (interval, tau) != (params.interval(), params.tau()) {
            faster |= params.interval() < interval;
            ledger.set_params(d, &params, now);
        }
    }
    // Floors at the pace now in force, the one just set included.
    for &(d, left) in &reported {
        let (interval, tau) = ledger.pace(d);
        let (interval, tau) = (u128::from(interval), u128::from(tau));
        let floor = if left.remaining > 0 {
            let spent = tau.saturating_sub(u128::from(left.remaining) * interval);
            u128::from(now) + spent
        } else {
            match left.reset {
                Some(r) => {
                    let reset = duration_nanos(r).min(cap);
                    u128::from(now) + u128::from(reset) + tau - interval.min(tau)
                }
                // None left and no reset: as `r = 0`, the next cell one interval on.
                None => u128::from(now) + tau,
            }
        };
        // Past the end of time: held for ever by the cap, which `max_hold` bounds
        // anyway (a floor this far means `max_hold` itself is centuries).
        ledger.floor(d, u64::try_from(floor).unwrap_or(u64::MAX));
    }
    if let Some(until) = hold {
        ledger.hold(until);
    }
    (reported.len(), faster)
}

/// A dimension's quota for an announced limit of `q` per `w` (module docs): the
/// `configured` one unless the announced rate is lower, then its interval (at most
/// `cap`) with the configured burst.
fn paced(configured: &Params, q: u64, w: Duration, cap: u64) -> Params {
    let configured = *configured;
    let announced = (w.as_nanos() / u128::from(q.max(1))).min(u128::from(cap));
    let announced = u64::try_from(announced).unwrap_or(u64::MAX);
    if q == 0 || announced <= configured.interval() {
        return configured;
    }
    // A burst window past the end of time (a huge burst at a slow announced rate):
    // the configured quota stays.
    Params::new(announced, configured.burst()).unwrap_or(configured)
}

#[cfg(test)]
mod tests;
