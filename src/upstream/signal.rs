//! [`Signal`]: what one response says about the upstream's limits, read from its status
//! and header fields: `Retry-After`, the IETF `RateLimit-Policy` and `RateLimit` fields
//! (and the earlier drafts' forms: `RateLimit-Limit` / `-Remaining` / `-Reset`, the
//! dictionary `RateLimit: limit=, remaining=, reset=`), and the common
//! `X-RateLimit-Limit` / `-Remaining` / `-Reset`.
//!
//! # Implementation notes
//!
//! Reading is strict about what becomes time and quiet about the rest: a value that cannot
//! be read whole is ignored (a server's typo must not hold a client for a year, nor crash
//! it), a parameter this crate does not use is skipped, and numbers of any length
//! saturate (the follower caps every wait it takes from them). Where a field comes twice,
//! the reading that waits longest wins (`Retry-After: 60` and `Retry-After: soon` hold
//! 60 s). Absolute times (an HTTP-date `Retry-After`, a Unix-time reset, in seconds or
//! milliseconds) are read against the response's `Date` when the two clocks disagree by
//! more than two seconds (an upstream whose clock is off says when *by its clock*), and
//! against the local clock otherwise (`Date` has whole seconds only). Header values are
//! bytes; a value that is not ASCII text is ignored.

use core::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

use super::date::http_date;
use super::sf::{self, Number};

/// Policies whose window is this long or shorter set a pace; longer ones are budgets
/// (see [`Signal::pace`]).
///
/// # Examples
///
/// ```
/// assert_eq!(paceline::upstream::PACE_WINDOW.as_secs(), 60);
/// ```
pub const PACE_WINDOW: Duration = Duration::from_secs(60);

/// Values of one field read; a response with more is hostile, and the rest are ignored.
const MAX_VALUES: usize = 16;

/// What a response says about the upstream's limits.
///
/// # Examples
///
/// ```
/// use paceline::upstream::{Policy, Signal};
/// use std::time::{Duration, SystemTime};
///
/// let headers = [("retry-after", &b"3"[..]), ("ratelimit-policy", &b"\"api\";q=50;w=1"[..])];
/// let signal = Signal::read(429, headers, SystemTime::now());
/// assert_eq!(signal.retry_after(), Some(Duration::from_secs(3)));
/// assert_eq!(signal.pace(), Some(Policy { quota: 50, window: Duration::from_secs(1) }));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signal {
    status: u16,
    retry_after: Option<Duration>,
    policies: Vec<Policy>,
    left: Vec<Left>,
}

/// A quota the upstream announces: at most `quota` requests per `window`.
///
/// # Examples
///
/// ```
/// use paceline::upstream::Policy;
/// use std::time::Duration;
/// let hourly = Policy { quota: 5_000, window: Duration::from_secs(3_600) };
/// assert!(hourly.is_budget());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Requests (quota units) per window; at least 1.
    pub quota: u64,
    /// The window; more than zero.
    pub window: Duration,
}

impl Policy {
    /// Whether the window is longer than [`PACE_WINDOW`]: then the policy is a budget to
    /// spend as needed (held when the upstream says it is spent), not a pace to spread
    /// requests at.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Policy;
    /// use std::time::Duration;
    /// assert!(!Policy { quota: 100, window: Duration::from_secs(60) }.is_budget());
    /// assert!(Policy { quota: 1_000, window: Duration::from_secs(86_400) }.is_budget());
    /// ```
    pub fn is_budget(&self) -> bool {
        self.window > PACE_WINDOW
    }

    /// Requests per second.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Policy;
    /// use std::time::Duration;
    /// assert_eq!(Policy { quota: 100, window: Duration::from_secs(4) }.rate(), 25.0);
    /// ```
    pub fn rate(&self) -> f64 {
        self.quota as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

/// What is left of a limit now, and when more comes.
///
/// # Examples
///
/// ```
/// use paceline::upstream::{Left, Reset, Signal};
/// use std::time::{Duration, SystemTime};
///
/// let headers = [("ratelimit", &b"\"api\";r=0;t=7"[..])];
/// let signal = Signal::read(200, headers, SystemTime::now());
/// let seven = Some(Reset::Rounded(Duration::from_secs(7)));
/// assert_eq!(signal.left(), [Left { remaining: 0, reset: seven }]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Left {
    /// Requests left now.
    pub remaining: u64,
    /// When more comes, if the upstream says.
    pub reset: Option<Reset>,
}

/// When a limit's quota comes back.
///
/// # Examples
///
/// ```
/// use paceline::upstream::Reset;
/// use std::time::Duration;
/// // `t=1`: a whole count of seconds, rounded up: anything up to a second.
/// let soon = Reset::Rounded(Duration::from_secs(1));
/// assert_eq!(soon.at_most(), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    /// A relative count of whole seconds (`t=`, `X-RateLimit-Reset: 30`): the server
    /// rounds up, so the quota comes back at most this long from now, and possibly up to
    /// a second sooner.
    Rounded(Duration),
    /// An exact time: a Unix time (seconds or milliseconds) or a fractional count of
    /// seconds, as this long from now.
    Exact(Duration),
}

impl Reset {
    /// The longest it may take.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Reset;
    /// use std::time::Duration;
    /// assert_eq!(Reset::Exact(Duration::from_millis(300)).at_most().as_millis(), 300);
    /// ```
    pub fn at_most(&self) -> Duration {
        match *self {
            Reset::Rounded(d) | Reset::Exact(d) => d,
        }
    }
}

/// Where absolute times are read from: the local clock, or the response's `Date` when the
/// two disagree by more than two seconds (module docs).
pub(super) struct Clocks {
    /// Unix time now, on the clock the upstream's absolute times are read against.
    now: Duration,
}

impl Clocks {
    pub(super) fn new(local: SystemTime, date: Option<u64>) -> Clocks {
        let local = local.duration_since(UNIX_EPOCH).unwrap_or_default();
        let now = match date.map(Duration::from_secs) {
            Some(date) if date.abs_diff(local) > Duration::from_secs(2) => date,
            _ => local,
        };
        Clocks { now }
    }

    /// How long until Unix time `at` (zero if it has passed).
    pub(super) fn until(&self, at: Duration) -> Duration {
        at.saturating_sub(self.now)
    }
}

/// The fields read so far, as text.
#[derive(Default)]
struct Fields {
    retry_after: Vec<String>,
    date: Option<String>,
    policy: Vec<String>,
    state: Vec<String>,
    limit: Vec<String>,
    remaining: Vec<String>,
    reset: Vec<String>,
}

impl Signal {
    /// Reads a response: its status and its headers as `(name, value)` pairs (names in any
    /// case). `now` is the wall-clock time, for absolute times (module docs).
    ///
    /// `Retry-After` counts on a `429` or `503` only (elsewhere it is about redirects or
    /// other things); the `RateLimit` and `X-RateLimit` fields count on any status.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Left, Reset, Signal};
    /// use std::time::{Duration, SystemTime};
    ///
    /// let ok = [("x-ratelimit-remaining", &b"0"[..]), ("x-ratelimit-reset", &b"2"[..])];
    /// let two = Some(Reset::Rounded(Duration::from_secs(2)));
    /// assert_eq!(Signal::read(200, ok, SystemTime::now()).left(), [Left { remaining: 0, reset: two }]);
    /// // A value that cannot be read is ignored.
    /// let junk = [("retry-after", &b"soon"[..])];
    /// assert_eq!(Signal::read(429, junk, SystemTime::now()).retry_after(), None);
    /// ```
    pub fn read<'a, N: AsRef<str>>(
        status: u16,
        headers: impl IntoIterator<Item = (N, &'a [u8])>,
        now: SystemTime,
    ) -> Signal {
        let mut fields = Fields::default();
        for (name, value) in headers {
            let Ok(value) = core::str::from_utf8(value) else {
                continue;
            };
            if !value.is_ascii() {
                continue;
            }
            let value = value.trim();
            // A count's field repeated on several lines may reach us joined into one by
            // an intermediary (`4, 0`): each member is then one value. (`Retry-After`'s
            // HTTP-date holds a comma, and the structured fields are lists already.)
            let (list, joined) = match name.as_ref().to_ascii_lowercase().as_str() {
                "retry-after" => (&mut fields.retry_after, false),
                "date" => {
                    fields.date = Some(value.to_owned());
                    continue;
                }
                "ratelimit-policy" => (&mut fields.policy, false),
                "ratelimit" => (&mut fields.state, false),
                "ratelimit-limit" | "x-ratelimit-limit" => (&mut fields.limit, true),
                "ratelimit-remaining" | "x-ratelimit-remaining" => (&mut fields.remaining, true),
                "ratelimit-reset" | "x-ratelimit-reset" => (&mut fields.reset, true),
                _ => continue,
            };
            let members: &mut dyn Iterator<Item = &str> = if joined {
                &mut value.split(',').map(str::trim).filter(|m| !m.is_empty())
            } else {
                &mut core::iter::once(value)
            };
            for member in members {
                if list.len() >= MAX_VALUES {
                    break;
                }
                list.push(member.to_owned());
            }
        }
        fields.signal(status, now)
    }

    /// The response's status.
    ///
    /// # Examples
    ///
    /// ```
    /// let signal = paceline::upstream::Signal::read(429, [("a", &b""[..])], std::time::SystemTime::now());
    /// assert_eq!(signal.status(), 429);
    /// ```
    pub fn status(&self) -> u16 {
        self.status
    }

    /// `Retry-After` (on a `429` or `503`): nothing should be sent for this long.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Signal;
    /// use std::time::{Duration, SystemTime};
    /// let two = [("retry-after", &b"60"[..]), ("retry-after", &b"1.5"[..])];
    /// assert_eq!(Signal::read(503, two, SystemTime::now()).retry_after(), Some(Duration::from_secs(60)));
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Every policy announced (`RateLimit-Policy`, and the earlier drafts' `RateLimit-Limit`
    /// with a window).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Signal;
    /// let value = &br#""burst";q=100;w=60, "daily";q=1000;w=86400"#[..];
    /// let signal = Signal::read(200, [("ratelimit-policy", value)], std::time::SystemTime::now());
    /// assert_eq!(signal.policies().len(), 2);
    /// ```
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The policy to pace by: the lowest rate among those whose window is at most
    /// [`PACE_WINDOW`] (longer windows are budgets: [`Policy::is_budget`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Policy, Signal};
    /// use std::time::Duration;
    /// let value = &br#""burst";q=100;w=60, "daily";q=1000;w=86400"#[..];
    /// let signal = Signal::read(200, [("ratelimit-policy", value)], std::time::SystemTime::now());
    /// assert_eq!(signal.pace(), Some(Policy { quota: 100, window: Duration::from_secs(60) }));
    /// ```
    pub fn pace(&self) -> Option<Policy> {
        self.policies
            .iter()
            .filter(|p| !p.is_budget())
            // The lowest rate, compared by cross-multiplying to stay in integers.
            .min_by(|a, b| {
                (u128::from(a.quota) * b.window.as_nanos())
                    .cmp(&(u128::from(b.quota) * a.window.as_nanos()))
            })
            .copied()
    }

    /// What is left of each limit the response reports (`RateLimit`, its earlier drafts'
    /// forms, `X-RateLimit-Remaining` with `-Reset`).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Signal;
    /// let value = &b"limit=10, remaining=4, reset=2"[..];
    /// let signal = Signal::read(200, [("ratelimit", value)], std::time::SystemTime::now());
    /// assert_eq!(signal.left()[0].remaining, 4);
    /// ```
    pub fn left(&self) -> &[Left] {
        &self.left
    }
}

impl Fields {
    fn signal(&self, status: u16, now: SystemTime) -> Signal {
        let clocks = Clocks::new(now, self.date.as_deref().and_then(http_date));
        let retry_after = if status == 429 || status == 503 {
            self.retry_after
                .iter()
                .filter_map(|v| retry_after(v, &clocks))
                .max()
        } else {
            None
        };
        let mut policies = Vec::new();
        for value in self.policy.iter().chain(&self.limit) {
            for m in sf::members(value) {
                // `"name";q=50;w=1`, or an earlier draft's `50;w=1` (the item is the quota).
                let quota = m.number("q").or(m.item.number()).and_then(Number::integer);
                let window = m.number("w").map(Number::seconds);
                if let (Some(quota), Some(window)) = (quota, window) {
                    if quota > 0 && !window.is_zero() && m.key.is_none() {
                        policies.push(Policy { quota, window });
                    }
                }
            }
        }
        let mut left = Vec::new();
        for value in &self.state {
            let mut dict = (None, None);
            for m in sf::members(value) {
                match m.key {
                    // The dictionary form of draft-07: `limit=10, remaining=0, reset=2`.
                    Some("remaining") => dict.0 = m.item.number().and_then(Number::integer),
                    Some("reset") => dict.1 = m.item.number().map(relative),
                    Some(_) => {}
                    // `"name";r=0;t=5`.
                    None => {
                        if let Some(remaining) = m.number("r").and_then(Number::integer) {
                            let reset = m.number("t").map(relative);
                            left.push(Left { remaining, reset });
                        }
                    }
                }
            }
            if let (Some(remaining), reset) = dict {
                left.push(Left { remaining, reset });
            }
        }
        // `X-RateLimit-Remaining` with `-Reset` (seconds, or a Unix time in seconds or
        // milliseconds); repeated, the fewest left and the latest reset.
        let remaining = self
            .remaining
            .iter()
            .filter_map(|v| sf::number(v)?.integer())
            .min();
        if let Some(remaining) = remaining {
            let reset = self
                .reset
                .iter()
                .filter_map(|v| Some(reset(sf::number(v)?, &clocks)))
                .max_by_key(Reset::at_most);
            left.push(Left { remaining, reset });
        }
        Signal {
            status,
            retry_after,
            policies,
            left,
        }
    }
}

/// A relative reset: whole seconds are the server's rounding up, a fraction is exact.
fn relative(n: Number) -> Reset {
    match n.integer() {
        Some(secs) => Reset::Rounded(Duration::from_secs(secs)),
        None => Reset::Exact(n.seconds()),
    }
}

/// Numbers past these are Unix times, in seconds and in milliseconds: no server means a
/// delay of 30 years.
const UNIX_SECONDS: u64 = 1_000_000_000;
const UNIX_MILLIS: u64 = 1_000_000_000_000;

fn reset(n: Number, clocks: &Clocks) -> Reset {
    if n.whole >= UNIX_MILLIS {
        let at = Duration::from_millis(n.whole);
        Reset::Exact(clocks.until(at))
    } else if n.whole >= UNIX_SECONDS {
        Reset::Exact(clocks.until(n.seconds()))
    } else {
        relative(n)
    }
}

/// `Retry-After`: delay-seconds (any number of digits, or with a fraction, as some
/// servers send), or an HTTP-date. A value an intermediary joined from two fields
/// (`60, soon`) counts by its longest readable part.
pub(super) fn retry_after(value: &str, clocks: &Clocks) -> Option<Duration> {
    if let Some(at) = http_date(value) {
        return Some(clocks.until(Duration::from_secs(at)));
    }
    // A date's own comma follows its day's name: a part that does not read as a number
    // is read as a date together with the part after it.
    let mut parts = sf::split_outside_quotes(value, b',')
        .take(sf::MAX_MEMBERS)
        .peekable();
    let mut longest = None;
    while let Some(part) = parts.next() {
        let part = part.trim();
        let read = match sf::number(part) {
            Some(n) => Some(n.seconds()),
            None => parts
                .peek()
                .and_then(|rest| http_date(&format!("{part},{rest}")))
                .map(|at| {
                    parts.next();
                    clocks.until(Duration::from_secs(at))
                }),
        };
        longest = longest.max(read);
    }
    longest
}

#[cfg(test)]
mod tests;
