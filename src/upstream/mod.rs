//! Calls to an API that limits you: follow what it says, for every task at once.
//!
//! An upstream that answers "slow down" (a `429` or `503` with `Retry-After`, the IETF
//! `RateLimit-Policy` / `RateLimit` fields, the common `X-RateLimit-*` ones) should slow
//! *every* caller of the client, not each one on its own schedule. [`Signal::read`] reads
//! a response; a [`Following`] turns it into a hold ([`Limiter::hold_for`]: nothing before
//! the instant the upstream named, booked turns included, then the pace resumes, spaced)
//! and, when the upstream announces a quota below yours, that quota
//! ([`Limiter::set_quota`]: what was spent stays spent, waiters keep their order).
//!
//! ```
//! use paceline::upstream::{Follow, Following, Signal};
//! use paceline::{clock::ManualClock, Limiter, Quota};
//! use std::time::{Duration, SystemTime};
//!
//! let clock = ManualClock::new();
//! let api = Limiter::with_clock(Quota::per_second(100).with_burst(1), clock.clone());
//! let following = Following::new(api.quota(), Follow::default());
//! // A response: too many requests, come back in 2 s, and the quota is 50 per second.
//! let headers = [("retry-after", &b"2"[..]), ("ratelimit-policy", &b"\"api\";q=50;w=1"[..])];
//! following.apply(&api, &Signal::read(429, headers, SystemTime::now()));
//! assert!(api.check().is_err());
//! clock.advance(Duration::from_secs(2));
//! assert!(api.check().is_ok());
//! assert_eq!(api.quota(), Quota::per_second(50).with_burst(1));
//! ```
//!
//! The HTTP client layer (`http::client`, feature `tower`) and the Python package's
//! `paceline.httpx` transports do this for every response.

mod parse;

use core::time::Duration;
use std::sync::Mutex;
use std::time::Instant;

pub use parse::Signal;

use crate::clock::Clock;
use crate::{KeyedLimiter, Limiter, Quota};

/// How a client follows an upstream's signals: the longest hold it accepts, whether it
/// may go faster than configured when told so, and when it returns to its own quota.
///
/// # Examples
///
/// ```
/// use paceline::upstream::Follow;
/// use std::time::Duration;
///
/// let follow = Follow::default()
///     .max_hold(Duration::from_secs(60))      // a "Retry-After: 86400" holds 60 s
///     .revert_after(Duration::from_secs(30)); // the configured quota again after 30 s of silence
/// assert_eq!(follow.hold_cap(), Duration::from_secs(60));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Follow {
    max_hold: Duration,
    above_configured: bool,
    revert_after: Option<Duration>,
}

impl Default for Follow {
    /// Holds of up to 5 minutes, never faster than configured, an announced quota kept
    /// until another is announced.
    fn default() -> Follow {
        Follow {
            max_hold: Duration::from_secs(300),
            above_configured: false,
            revert_after: None,
        }
    }
}

impl Follow {
    /// The longest hold accepted: a longer `Retry-After` (a year, by mistake or malice)
    /// holds this long.
    ///
    /// # Examples
    ///
    /// ```
    /// let follow = paceline::upstream::Follow::default().max_hold(std::time::Duration::ZERO);
    /// assert!(follow.hold_cap().is_zero()); // holds are ignored
    /// ```
    pub fn max_hold(mut self, max: Duration) -> Follow {
        self.max_hold = max;
        self
    }

    /// The longest hold accepted.
    ///
    /// # Examples
    ///
    /// ```
    /// let follow = paceline::upstream::Follow::default();
    /// assert_eq!(follow.hold_cap().as_secs(), 300);
    /// ```
    pub fn hold_cap(&self) -> Duration {
        self.max_hold
    }

    /// Whether an announced quota above the configured one is adopted (by default it is
    /// not: the configured quota is the caller's own ceiling).
    ///
    /// # Examples
    ///
    /// ```
    /// let follow = paceline::upstream::Follow::default().above_configured(true);
    /// # let _ = follow;
    /// ```
    pub fn above_configured(mut self, allowed: bool) -> Follow {
        self.above_configured = allowed;
        self
    }

    /// Returns to the configured quota once the upstream has announced none for this long.
    ///
    /// # Examples
    ///
    /// ```
    /// let follow = paceline::upstream::Follow::default()
    ///     .revert_after(std::time::Duration::from_secs(60));
    /// # let _ = follow;
    /// ```
    pub fn revert_after(mut self, silence: Duration) -> Follow {
        self.revert_after = Some(silence);
        self
    }

    /// What `signal` asks of a limiter configured with `configured`: how long to hold,
    /// and which quota to adopt (`None`: keep the one in force).
    ///
    /// An announced policy of `q` per `w` becomes the quota that never admits more than
    /// `q` in any window `w` with the configured burst (or `q`, if smaller): `q - b + 1`
    /// per `w`, bursts of `b`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Follow, Signal};
    /// use paceline::Quota;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let headers = [("ratelimit-policy", &b"\"a\";q=50;w=1"[..])];
    /// let signal = Signal::read(200, headers, SystemTime::now());
    /// let (hold, quota) = Follow::default().decide(Quota::per_second(100).with_burst(1), &signal);
    /// assert_eq!((hold, quota), (None, Some(Quota::per_second(50).with_burst(1))));
    /// ```
    pub fn decide(&self, configured: Quota, signal: &Signal) -> (Option<Duration>, Option<Quota>) {
        let hold = signal
            .hold
            .map(|hold| hold.min(self.max_hold))
            .filter(|hold| !hold.is_zero());
        let quota = signal.policy.and_then(|(count, window)| {
            let burst = configured
                .burst()
                .min(u32::try_from(count).unwrap_or(u32::MAX));
            let per_window = u32::try_from(count - u64::from(burst) + 1).unwrap_or(u32::MAX);
            let announced = Quota::try_new(per_window, window)
                .ok()?
                .try_with_burst(burst)
                .ok()?;
            let slower = announced.emission_interval() >= configured.emission_interval();
            (slower || self.above_configured).then_some(announced)
        });
        (hold, quota)
    }
}

/// A limiter a [`Following`] can steer: hold it, read and set its quota.
pub trait Steer {
    /// Holds every cell back for `d` ([`Limiter::hold_for`]).
    fn hold_for(&self, d: Duration);
    /// The quota in force.
    fn quota(&self) -> Quota;
    /// Sets the quota in force ([`Limiter::set_quota`]).
    fn set_quota(&self, quota: Quota);
}

impl<C: Clock> Steer for Limiter<C> {
    fn hold_for(&self, d: Duration) {
        Limiter::hold_for(self, d);
    }

    fn quota(&self) -> Quota {
        Limiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) {
        Limiter::set_quota(self, quota);
    }
}

/// One key of a keyed limiter, to steer. The quota is the keyed limiter's default (every
/// key's without one of its own): a keyed limiter of upstream hosts follows each host's
/// holds alone, and the announced quota for all of them.
#[derive(Debug)]
pub struct KeyOf<'a, K: core::hash::Hash + Eq + Clone, C: Clock> {
    /// The limiter.
    pub limiter: &'a KeyedLimiter<K, C>,
    /// The key.
    pub key: &'a K,
}

impl<K: core::hash::Hash + Eq + Clone, C: Clock> Steer for KeyOf<'_, K, C> {
    fn hold_for(&self, d: Duration) {
        self.limiter.hold_key_for(self.key, d);
    }

    fn quota(&self) -> Quota {
        self.limiter.quota()
    }

    fn set_quota(&self, quota: Quota) {
        self.limiter.set_quota(quota);
    }
}

/// A [`Follow`] applied to one limiter over time: it remembers the configured quota and
/// when the upstream last announced one (for [`Follow::revert_after`]).
///
/// # Examples
///
/// See the [module docs](self).
#[derive(Debug)]
pub struct Following {
    follow: Follow,
    configured: Quota,
    /// When an announced quota was last adopted (or confirmed); `None` at the configured.
    adopted: Mutex<Option<Instant>>,
}

impl Following {
    /// Follows `follow` for a limiter configured with `configured`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Follow, Following};
    /// let following = Following::new(paceline::Quota::per_second(10), Follow::default());
    /// # let _ = following;
    /// ```
    pub fn new(configured: Quota, follow: Follow) -> Following {
        Following {
            follow,
            configured,
            adopted: Mutex::new(None),
        }
    }

    /// Applies `signal` to `limiter`: holds it if asked, adopts an announced quota, and
    /// returns to the configured one after the silence `follow` allows. Returns the hold
    /// applied, if any.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub fn apply(&self, limiter: &(impl Steer + ?Sized), signal: &Signal) -> Option<Duration> {
        let (hold, quota) = self.follow.decide(self.configured, signal);
        if let Some(hold) = hold {
            limiter.hold_for(hold);
        }
        let mut adopted = self.adopted.lock().unwrap_or_else(|e| e.into_inner());
        match quota {
            Some(quota) => {
                if limiter.quota() != quota {
                    limiter.set_quota(quota);
                }
                *adopted = Some(Instant::now());
            }
            None => {
                let silent = self
                    .follow
                    .revert_after
                    .is_some_and(|after| adopted.is_some_and(|at| at.elapsed() >= after));
                if silent {
                    limiter.set_quota(self.configured);
                    *adopted = None;
                }
            }
        }
        hold
    }
}
