//! One reading of a limiter's state: what `RateLimit` and `X-RateLimit-*` headers need.

use core::time::Duration;

use crate::gcra::{self, Params};
use crate::quota::Quota;

/// A limiter's (or one key's) state at one instant, from one reading of its word: the
/// quota, how many cells a check would admit now, and how long until the next cell and
/// until the whole burst is back.
///
/// All four come from the same TAT and the same clock reading, so they agree with each
/// other (a header built from them never says "0 left, next in 0 s").
///
/// # Examples
///
/// ```
/// use paceline::{clock::ManualClock, Limiter, Quota};
/// use std::time::Duration;
///
/// let limiter = Limiter::with_clock(Quota::per_second(10), ManualClock::new());
/// limiter.check_n(10).unwrap();
/// let state = limiter.snapshot();
/// assert_eq!((state.burst(), state.remaining()), (10, 0));
/// assert_eq!(state.until_next(), Duration::from_millis(100));
/// assert_eq!(state.until_full(), Duration::from_secs(1));
/// // RateLimit: "default";r=0;t=1   RateLimit-Policy: "default";q=10;w=1
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Snapshot {
    quota: Quota,
    remaining: u32,
    until_next: Duration,
    until_full: Duration,
}

impl Snapshot {
    /// The state of a cell holding `tat` at `now` under `params`.
    pub(crate) fn of(params: Params, tat: u64, now: u64) -> Snapshot {
        let remaining = gcra::remaining(tat, now, &params);
        let until_next = if remaining > 0 {
            0
        } else {
            match gcra::admit(tat, now, params.interval(), params.tau()) {
                Ok(_) => 0,
                Err(wait) => wait,
            }
        };
        Snapshot {
            quota: Quota::from_params(params),
            remaining,
            until_next: Duration::from_nanos(until_next),
            until_full: Duration::from_nanos(tat.saturating_sub(now)),
        }
    }

    /// The state of a key that a keyed limiter at its key bound would refuse to store for
    /// `wait` nanoseconds: nothing admissible until then, then its whole burst.
    #[cfg(feature = "std")]
    pub(crate) fn refused(params: Params, wait: u64) -> Snapshot {
        Snapshot {
            quota: Quota::from_params(params),
            remaining: 0,
            until_next: Duration::from_nanos(wait),
            until_full: Duration::from_nanos(wait),
        }
    }

    /// The quota in force when the state was read.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_minute(30));
    /// assert_eq!(limiter.snapshot().quota(), paceline::Quota::per_minute(30));
    /// ```
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The burst: the most cells a check can ever admit at once (the header "limit").
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_second(5).with_burst(2));
    /// assert_eq!(limiter.snapshot().burst(), 2);
    /// ```
    pub fn burst(&self) -> u32 {
        self.quota.burst()
    }

    /// How many cells `check_n` would have admitted at that instant.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_hour(3));
    /// limiter.check().unwrap();
    /// assert_eq!(limiter.snapshot().remaining(), 2);
    /// ```
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// How long until one more cell would be admitted: zero while `remaining() > 0`.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_hour(1));
    /// assert!(limiter.snapshot().until_next().is_zero());
    /// limiter.check().unwrap();
    /// assert!(limiter.snapshot().until_next().as_secs() > 3500);
    /// ```
    pub fn until_next(&self) -> Duration {
        self.until_next
    }

    /// How long until the whole burst is available again (the header "reset"): zero when
    /// nothing is spent.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_second(2));
    /// assert!(limiter.snapshot().until_full().is_zero());
    /// limiter.check().unwrap();
    /// assert!(limiter.snapshot().until_full().as_millis() > 400);
    /// ```
    pub fn until_full(&self) -> Duration {
        self.until_full
    }
}

/// A one-cell refusal as the check found it, in the check's own integers: the quota then,
/// the nanoseconds until the key's next cell, and whether the key's cell refused (its
/// whole burst is back `room_for_one` after the next cell) or a keyed limiter at its key
/// bound refused to store a new key (its whole burst is back with the next cell). A
/// refusal flood makes one for every request: the HTTP layer's usual refusal finds its
/// cached fields from these alone, and [`OneRefused::snapshot`] converts them otherwise.
#[cfg(feature = "tower")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OneRefused {
    pub(crate) params: Params,
    /// Until the next cell (ns), above zero: a check refuses only what it cannot admit now.
    pub(crate) wait: u64,
    /// The key's own cell refused (not the key bound).
    pub(crate) spent: bool,
}

#[cfg(feature = "tower")]
impl OneRefused {
    /// A cell that refused one cell with `wait` nanoseconds to go.
    #[inline]
    pub(crate) fn spent(params: Params, wait: u64) -> OneRefused {
        OneRefused {
            params,
            wait,
            spent: true,
        }
    }

    /// A new key that a keyed limiter at its key bound refused to store for `wait`
    /// nanoseconds ([`Snapshot::refused`]).
    #[inline]
    pub(crate) fn no_slot(params: Params, wait: u64) -> OneRefused {
        OneRefused {
            params,
            wait,
            spent: false,
        }
    }

    /// The state it describes. A one-cell refusal means the TAT is `wait + room_for_one`
    /// ahead of now, so less than one interval of the burst window is free: nothing is
    /// admissible, the next cell is `wait` away and the whole burst `wait +
    /// room_for_one`. (Worked out from the refusal rather than by [`Snapshot::of`], whose
    /// divisions would find the same.) A key the key bound refused has nothing
    /// admissible until `wait`, then its whole burst.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let full = if self.spent {
            self.wait.saturating_add(self.params.room_for_one())
        } else {
            self.wait
        };
        Snapshot {
            quota: Quota::from_params(self.params),
            remaining: 0,
            until_next: Duration::from_nanos(self.wait),
            until_full: Duration::from_nanos(full),
        }
    }
}

#[cfg(all(test, feature = "tower"))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A refusal's wait says all a snapshot would read from the cell at that instant.
        #[test]
        fn after_refusal_is_the_cells_state(
            period in 1u64..=1 << 40,
            count in 1u32..=1_000,
            burst in 1u32..=1_000,
            now in any::<u64>(),
            ahead in prop_oneof![any::<u64>(), 0u64..1 << 42],
        ) {
            let Ok(quota) = Quota::try_new(count, core::time::Duration::from_nanos(period))
                .and_then(|quota| quota.try_with_burst(burst))
            else {
                return Ok(());
            };
            let params = *quota.params();
            let tat = now.saturating_add(ahead);
            if let Err(wait) = gcra::admit(tat, now, params.interval(), params.tau()) {
                // The end of representable time refuses for ever whatever the backlog.
                prop_assume!(tat.checked_add(params.interval()).is_some());
                prop_assert_eq!(
                    OneRefused::spent(params, wait).snapshot(),
                    Snapshot::of(params, tat, now)
                );
            }
            prop_assert_eq!(
                OneRefused::no_slot(params, ahead).snapshot(),
                Snapshot::refused(params, ahead)
            );
        }
    }
}
