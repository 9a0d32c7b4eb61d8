//! How many cells per period, and how many at once.

use core::fmt;
use core::time::Duration;

use crate::gcra::Params;

/// A rate limit: a number of cells per period, plus a burst (by default equal to the count).
///
/// Cells are spaced by the *emission interval* `period / count` (truncated to whole
/// nanoseconds); the burst is how many may go at once after the limiter has been idle.
///
/// # Examples
///
/// ```
/// use paceline::Quota;
/// use std::time::Duration;
///
/// // 100 per second, at most 10 at once.
/// let q = Quota::per_second(100).with_burst(10);
/// assert_eq!(q.burst(), 10);
/// assert_eq!(q.emission_interval(), Duration::from_millis(10));
///
/// // From runtime values, with an error instead of a panic.
/// assert!(Quota::try_new(0, Duration::from_secs(1)).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    params: Params,
}

/// Why a [`Quota`] could not be built.
///
/// # Examples
///
/// ```
/// use paceline::{Quota, QuotaError};
/// use std::time::Duration;
///
/// assert_eq!(Quota::try_new(5, Duration::ZERO), Err(QuotaError::ZeroPeriod));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QuotaError {
    /// The count of cells per period was 0.
    ZeroCount,
    /// The period was zero.
    ZeroPeriod,
    /// The burst was 0.
    ZeroBurst,
    /// `period / count` is below one nanosecond.
    IntervalTooShort,
    /// `period / count` is longer than `u64::MAX` nanoseconds (about 584 years).
    IntervalTooLong,
    /// Text that is not a rate ([`Quota`]'s `FromStr`: `"10/second"`, `"100 per 2
    /// minutes"`).
    Unparsable,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuotaError::ZeroCount => "a quota needs a count of at least 1 cell per period",
            QuotaError::ZeroPeriod => "a quota needs a period longer than zero",
            QuotaError::ZeroBurst => "a quota needs a burst of at least 1 cell",
            QuotaError::IntervalTooShort => {
                "period / count is below one nanosecond, the finest interval paceline keeps"
            }
            QuotaError::IntervalTooLong => {
                "period / count is longer than about 584 years, the longest interval paceline \
                 keeps"
            }
            QuotaError::Unparsable => {
                "not a rate: write a count, \"/\" or \"per\", an optional number and a unit \
                 (second, minute, hour, day, month or year), as \"10/second\" or \"100 per 2 \
                 minutes\""
            }
        })
    }
}

impl core::error::Error for QuotaError {}

debug_as_display!(QuotaError);

/// A rate as text, in the grammar the Python `limits` package (and so slowapi and
/// flask-limiter) reads: a count, `/` or `per`, an optional number, and a unit (`second`,
/// `minute`, `hour`, `day`, `month` of 30 days, `year` of 365 days; plural or not, or `s`,
/// `sec`, `m`, `min`, `h`, `hr`, `d`), with any spaces between. The burst is the count, as
/// for [`Quota::per_second`].
///
/// # Errors
///
/// [`QuotaError::Unparsable`] for text that is not a rate, or the error
/// [`Quota::try_new`] gives for its count and period.
///
/// # Examples
///
/// ```
/// use paceline::Quota;
/// use std::time::Duration;
///
/// assert_eq!("10/second".parse(), Ok(Quota::per_second(10)));
/// assert_eq!("5 per minute".parse(), Ok(Quota::per_minute(5)));
/// let q: Quota = "100/2 hours".parse().unwrap();
/// assert_eq!((q.burst(), q.emission_interval()), (100, Duration::from_secs(72)));
/// assert!("ten a second".parse::<Quota>().is_err());
/// ```
impl core::str::FromStr for Quota {
    type Err = QuotaError;

    fn from_str(text: &str) -> Result<Quota, QuotaError> {
        /// The digits at the start of `s`, as a number, and the rest.
        fn number(s: &str) -> Option<(u64, &str)> {
            let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let n = s[..end].parse().ok()?;
            Some((n, s[end..].trim_start()))
        }
        let s = text.trim();
        let (count, rest) = number(s).ok_or(QuotaError::Unparsable)?;
        let count = u32::try_from(count).map_err(|_| QuotaError::Unparsable)?;
        let rest = match rest.strip_prefix('/') {
            Some(rest) => rest,
            None => rest
                .strip_prefix("per")
                .filter(|r| r.starts_with(char::is_whitespace))
                .ok_or(QuotaError::Unparsable)?,
        }
        .trim_start();
        let (times, unit) = match number(rest) {
            Some((n, unit)) => (n, unit),
            None => (1, rest),
        };
        /// Each unit's names (matched without regard to case) and its length in seconds.
        const UNITS: [(&[&str], u64); 6] = [
            (&["s", "sec", "secs", "second", "seconds"], 1),
            (&["m", "min", "mins", "minute", "minutes"], 60),
            (&["h", "hr", "hrs", "hour", "hours"], 3_600),
            (&["d", "day", "days"], 86_400),
            (&["month", "months"], 30 * 86_400),
            (&["y", "year", "years"], 365 * 86_400),
        ];
        let unit = unit.trim_end();
        let unit_secs = UNITS
            .iter()
            .find(|(names, _)| names.iter().any(|name| name.eq_ignore_ascii_case(unit)))
            .map(|&(_, secs)| secs)
            .ok_or(QuotaError::Unparsable)?;
        let secs = times
            .checked_mul(unit_secs)
            .ok_or(QuotaError::IntervalTooLong)?;
        Quota::try_new(count, core::time::Duration::from_secs(secs))
    }
}

const NANOS_PER_SECOND: u64 = 1_000_000_000;

impl Quota {
    /// `n` cells per `period_nanos`, burst `n`; the interval is clamped to at least 1 ns.
    const fn per_nanos(n: u32, period_nanos: u64) -> Quota {
        assert!(n > 0, "a quota needs a count of at least 1 cell per period");
        let interval = period_nanos / n as u64;
        let interval = if interval == 0 { 1 } else { interval };
        // Both are at least 1, so `new` cannot fail.
        match Params::new(interval, n) {
            Some(params) => Quota { params },
            None => panic!("unreachable: interval and burst are at least 1"),
        }
    }

    /// `n` cells per second, burst `n`.
    ///
    /// An interval below 1 ns (more than a billion per second) is clamped to 1 ns.
    ///
    /// # Panics
    ///
    /// If `n == 0`. Use [`Quota::try_new`] for runtime values.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::Quota;
    /// const API: Quota = Quota::per_second(100);
    /// assert_eq!(API.emission_interval().as_millis(), 10);
    /// ```
    pub const fn per_second(n: u32) -> Quota {
        Quota::per_nanos(n, NANOS_PER_SECOND)
    }

    /// `n` cells per minute, burst `n`.
    ///
    /// # Panics
    ///
    /// If `n == 0`. Use [`Quota::try_new`] for runtime values.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::Quota;
    /// assert_eq!(Quota::per_minute(60).emission_interval().as_secs(), 1);
    /// ```
    pub const fn per_minute(n: u32) -> Quota {
        Quota::per_nanos(n, 60 * NANOS_PER_SECOND)
    }

    /// `n` cells per hour, burst `n`.
    ///
    /// # Panics
    ///
    /// If `n == 0`. Use [`Quota::try_new`] for runtime values.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::Quota;
    /// assert_eq!(Quota::per_hour(3600).emission_interval().as_secs(), 1);
    /// ```
    pub const fn per_hour(n: u32) -> Quota {
        Quota::per_nanos(n, 3600 * NANOS_PER_SECOND)
    }

    /// `count` cells per `period`, burst `count`.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroCount`], [`QuotaError::ZeroPeriod`], [`QuotaError::IntervalTooShort`]
    /// when `period / count` is below 1 ns, [`QuotaError::IntervalTooLong`] when it is
    /// beyond 584 years. A burst window (`count` intervals) past 584 years is accepted and
    /// saturates, like [`Quota::with_burst`]'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Quota, QuotaError};
    /// use std::time::Duration;
    ///
    /// let q = Quota::try_new(3, Duration::from_millis(30))?;
    /// assert_eq!(q.emission_interval(), Duration::from_millis(10));
    /// assert_eq!(Quota::try_new(10, Duration::from_nanos(5)), Err(QuotaError::IntervalTooShort));
    /// # Ok::<(), QuotaError>(())
    /// ```
    pub fn try_new(count: u32, period: Duration) -> Result<Quota, QuotaError> {
        if count == 0 {
            return Err(QuotaError::ZeroCount);
        }
        if period.is_zero() {
            return Err(QuotaError::ZeroPeriod);
        }
        let interval = period.as_nanos() / u128::from(count);
        if interval == 0 {
            return Err(QuotaError::IntervalTooShort);
        }
        let interval = u64::try_from(interval).map_err(|_| QuotaError::IntervalTooLong)?;
        Params::new(interval, count)
            .map(|params| Quota { params })
            .ok_or(QuotaError::ZeroCount)
    }

    /// The same rate with a different burst.
    ///
    /// A burst window (`burst * emission interval`) past `u64::MAX` nanoseconds (584 years)
    /// saturates there: within any limiter's lifetime that is the same as "unlimited
    /// backlog", so `Quota::per_hour(1).with_burst(u32::MAX)` is fine.
    ///
    /// # Panics
    ///
    /// If `burst == 0`; use [`Quota::try_with_burst`] for runtime values.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::Quota;
    /// assert_eq!(Quota::per_second(100).with_burst(1).burst(), 1);
    /// ```
    pub fn with_burst(self, burst: u32) -> Quota {
        match self.try_with_burst(burst) {
            Ok(quota) => quota,
            Err(err) => panic!("Quota::with_burst({burst}): {err}"),
        }
    }

    /// The same rate with a different burst, or an error.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroBurst`] for 0, the only burst that cannot be (a window past 584
    /// years saturates, as in [`Quota::with_burst`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Quota, QuotaError};
    /// assert_eq!(Quota::per_second(1).try_with_burst(0), Err(QuotaError::ZeroBurst));
    /// assert_eq!(Quota::per_second(1).try_with_burst(40).unwrap().burst(), 40);
    /// assert_eq!(Quota::per_hour(1).try_with_burst(u32::MAX).unwrap().burst(), u32::MAX);
    /// ```
    pub fn try_with_burst(self, burst: u32) -> Result<Quota, QuotaError> {
        Params::new(self.params.interval(), burst)
            .map(|params| Quota { params })
            .ok_or(QuotaError::ZeroBurst)
    }

    /// How many cells may go at once.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(paceline::Quota::per_minute(30).burst(), 30);
    /// ```
    pub const fn burst(&self) -> u32 {
        self.params.burst()
    }

    /// The spacing between cells at the sustained rate: `period / count`, truncated to whole
    /// nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(paceline::Quota::per_second(3).emission_interval(), Duration::from_nanos(333_333_333));
    /// ```
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.params.interval())
    }

    pub(crate) const fn params(&self) -> &Params {
        &self.params
    }

    pub(crate) const fn from_params(params: Params) -> Quota {
        Quota { params }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn const_constructors_clamp_sub_nanosecond_intervals() {
        let q = Quota::per_second(u32::MAX);
        assert_eq!(q.emission_interval(), Duration::from_nanos(1));
        assert_eq!(q.burst(), u32::MAX);
        assert_eq!(Quota::per_hour(u32::MAX).burst(), u32::MAX);
    }

    #[test]
    #[should_panic(expected = "at least 1 cell")]
    fn per_second_zero_panics() {
        let _ = Quota::per_second(0);
    }

    #[test]
    #[should_panic(expected = "with_burst(0)")]
    fn with_burst_zero_panics() {
        let _ = Quota::per_second(1).with_burst(0);
    }
}
