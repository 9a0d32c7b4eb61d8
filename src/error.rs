//! What a denied request learns.

use core::fmt;
use core::time::Duration;

use crate::gcra::{Params, Unfit};

/// The cost of `n` cells under `params`, or the error that says why they never fit:
/// more than the burst, or (with a burst window saturated at 584 years) a cost past the
/// end of representable time, which waits for ever.
pub(crate) fn cost(params: &Params, n: u32) -> Result<u64, Denied> {
    params.cost(n).map_err(|unfit| match unfit {
        Unfit::OverBurst => InsufficientCapacity::new(n, params.burst()).into(),
        Unfit::PastEndOfTime => NotUntil::from_nanos(u64::MAX).into(),
    })
}

/// A request that cannot go now, and how long until it could.
///
/// # Examples
///
/// ```
/// use paceline::{clock::ManualClock, Limiter, Quota};
/// use std::time::Duration;
///
/// let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
/// limiter.check().unwrap();
/// let denied = limiter.check().unwrap_err();
/// assert_eq!(denied.wait_time(), Duration::from_millis(100));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NotUntil {
    /// The wait in nanoseconds: turned into a `Duration` only when asked for, so that a
    /// denied check (the path a flood takes) does no division.
    wait: u64,
    /// A keyed limiter had no room to store a new key (see [`NotUntil::is_table_full`]).
    table_full: bool,
}

impl NotUntil {
    #[inline]
    pub(crate) fn from_nanos(wait: u64) -> NotUntil {
        NotUntil {
            wait,
            table_full: false,
        }
    }

    /// A new key that a keyed limiter had no room to store, for `wait` nanoseconds.
    #[cfg_attr(not(feature = "std"), allow(dead_code))] // keyed's and waiting's
    #[inline]
    pub(crate) fn no_room(wait: u64) -> NotUntil {
        NotUntil {
            wait,
            table_full: true,
        }
    }

    /// Whether the refusal came from a keyed limiter with no room to store a new key (its
    /// key bound reached, or every slot the key may use held by a key still limited), not
    /// from the key's own quota: the key spent nothing, and [`wait_time`](Self::wait_time)
    /// is the time until room is expected. An HTTP server answers it as a busy server, not
    /// as a client over its limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    ///
    /// // The bound is kept per shard: a few keys past it may be stored.
    /// let limiter = KeyedLimiter::new(Quota::per_hour(1)).with_max_keys(1);
    /// limiter.check_key(&0).unwrap();
    /// let spent = limiter.check_key(&0).unwrap_err();
    /// assert!(!spent.is_table_full());
    /// let no_room = (1..1000).find_map(|key| limiter.check_key(&key).err()).unwrap();
    /// assert!(no_room.is_table_full());
    /// ```
    pub fn is_table_full(&self) -> bool {
        self.table_full
    }

    /// How long after the check the same request would have been admitted (assuming no one
    /// else takes the room first).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{clock::ManualClock, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Quota::per_minute(1), ManualClock::new());
    /// limiter.check().unwrap();
    /// assert_eq!(limiter.check().unwrap_err().wait_time().as_secs(), 60);
    /// ```
    pub fn wait_time(&self) -> Duration {
        Duration::from_nanos(self.wait)
    }
}

impl fmt::Display for NotUntil {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.table_full {
            write!(
                f,
                "no room to store a new key: try again in {:?}",
                self.wait_time()
            )
        } else {
            write!(f, "rate limited: try again in {:?}", self.wait_time())
        }
    }
}

impl core::error::Error for NotUntil {}

/// A request for more cells than the burst: no amount of waiting can admit it.
///
/// # Examples
///
/// ```
/// use paceline::{Denied, Limiter, Quota};
///
/// let limiter = Limiter::new(Quota::per_second(5));
/// match limiter.check_n(6) {
///     Err(Denied::InsufficientCapacity(e)) => assert_eq!((e.requested(), e.burst()), (6, 5)),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct InsufficientCapacity {
    requested: u32,
    burst: u32,
}

impl InsufficientCapacity {
    pub(crate) fn new(requested: u32, burst: u32) -> InsufficientCapacity {
        InsufficientCapacity { requested, burst }
    }

    /// The number of cells asked for.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{Limiter, Quota};
    /// let err = Limiter::new(Quota::per_second(1)).wait_n(2).unwrap_err();
    /// assert_eq!(err.requested(), 2);
    /// ```
    pub fn requested(&self) -> u32 {
        self.requested
    }

    /// The quota's burst, the most that can ever be admitted at once.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{Limiter, Quota};
    /// let err = Limiter::new(Quota::per_second(1)).wait_n(2).unwrap_err();
    /// assert_eq!(err.burst(), 1);
    /// ```
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

impl fmt::Display for InsufficientCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cells requested but the burst is {}: the request can never be admitted",
            self.requested, self.burst
        )
    }
}

impl core::error::Error for InsufficientCapacity {}

/// Why `check_n` said no.
///
/// # Examples
///
/// ```
/// use paceline::{clock::ManualClock, Denied, Limiter, Quota};
///
/// let limiter = Limiter::with_clock(Quota::per_second(2), ManualClock::new());
/// assert!(limiter.check_n(2).is_ok());
/// assert!(matches!(limiter.check_n(1), Err(Denied::NotUntil(_))));
/// assert!(matches!(limiter.check_n(3), Err(Denied::InsufficientCapacity(_))));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Denied {
    /// Not now; the request fits the burst and will be admissible after the wait.
    NotUntil(NotUntil),
    /// Never: the request is larger than the burst.
    InsufficientCapacity(InsufficientCapacity),
}

/// Prints the inner error's message. `Denied` is that error, not a wrapper around it:
/// [`source`](core::error::Error::source) is `None`, so error reporters (anyhow, eyre)
/// print the message once, not twice.
impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denied::NotUntil(e) => e.fmt(f),
            Denied::InsufficientCapacity(e) => e.fmt(f),
        }
    }
}

impl core::error::Error for Denied {}

debug_as_display!(NotUntil, InsufficientCapacity, Denied);

from_variants!(Denied {
    NotUntil(NotUntil),
    InsufficientCapacity(InsufficientCapacity),
});
