//! [`DimensionSignal`]: what one response says about each of several limits by name
//! (requests, tokens, input and output tokens), for a [`Budget`](crate::budget::Budget)
//! to follow with [`Budget::follow`](crate::budget::Budget::follow).
//!
//! | Fields | Dimension | Reset |
//! |---|---|---|
//! | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (OpenAI style) | the suffix | Go duration text: `6m0s`, `12ms`, `1.5s` |
//! | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | the middle | an RFC 3339 instant |
//! | `RateLimit: "tokens";r=0;t=12` and `RateLimit-Policy: "tokens";q=100;w=60` (IETF) | the policy's name | seconds |
//! | `Retry-After` (on a `429` or `503`) | the whole budget | seconds or an HTTP-date |
//!
//! # Implementation notes
//!
//! Every value is hostile input, read as [`Signal`](super::Signal) reads its fields: a
//! value that cannot be read whole is ignored, numbers saturate (the budget caps every
//! wait it takes from them at its `max_hold`), absolute times are read against the
//! response's `Date` when the clocks disagree, and work is bounded: at most
//! [`MAX_DIMENSIONS`] dimensions are kept, each name at most 64 bytes. Where a dimension
//! is reported twice, the fewest left, the latest reset and the lowest rate win. A limit
//! counts over its policy's window (`w`), or, for the provider fields, a minute: both
//! providers state their limits per minute (requests, tokens, input and output tokens).
//! Dimension names are folded to lowercase with `_` for `-` (`input-tokens` is
//! `input_tokens`).

use core::time::Duration;
use std::collections::BTreeMap;
use std::time::SystemTime;

use super::date::{http_date, rfc3339};
use super::go::go_duration;
use super::sf::{self, Item, Number};
use super::signal::{retry_after, Clocks};

/// Dimensions read from one response; the rest are ignored.
pub const MAX_DIMENSIONS: usize = 16;

/// The longest dimension name read, in bytes.
const MAX_NAME: usize = 64;

/// What one response says about each dimension it names, and whether it holds them all.
///
/// # Examples
///
/// ```
/// use paceline::upstream::DimensionSignal;
/// use std::time::{Duration, SystemTime};
///
/// let headers = [
///     ("x-ratelimit-remaining-tokens", &b"0"[..]),
///     ("x-ratelimit-reset-tokens", &b"1.5s"[..]),
///     ("x-ratelimit-remaining-requests", &b"499"[..]),
/// ];
/// let signal = DimensionSignal::read(200, headers, SystemTime::now());
/// let tokens = signal.get("tokens").unwrap();
/// assert_eq!((tokens.remaining, tokens.reset), (0, Some(Duration::from_millis(1_500))));
/// assert_eq!(signal.get("requests").unwrap().remaining, 499);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DimensionSignal {
    retry_after: Option<Duration>,
    left: Vec<DimensionLeft>,
}

/// What is left of one named dimension.
///
/// # Examples
///
/// See [`DimensionSignal`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimensionLeft {
    /// The dimension's name, lowercase, `_` for `-` (`input_tokens`).
    pub name: String,
    /// Its limit, if the response says.
    pub limit: Option<u64>,
    /// The window `limit` counts over: the policy's `w`, or a minute for the provider
    /// fields (module docs).
    pub per: Option<Duration>,
    /// How much of it is left now.
    pub remaining: u64,
    /// How long until it is whole again, if the response says (saturating; not capped).
    pub reset: Option<Duration>,
}

/// A dimension's fields so far.
#[derive(Default)]
struct Acc {
    /// The lowest rate: a limit and its window.
    limit: Option<(u64, Duration)>,
    remaining: Option<u64>,
    reset: Option<Duration>,
}

/// Which of a dimension's values a field holds.
#[derive(Clone, Copy)]
enum Part {
    Limit,
    Remaining,
    Reset,
}

/// How a field spells its reset.
#[derive(Clone, Copy)]
enum Spelling {
    /// Go duration text.
    Go,
    /// An RFC 3339 instant.
    Instant,
}

/// `name` folded (lowercase, `_` for `-`), if it is a plausible dimension name.
pub(crate) fn fold(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then(|| name.to_ascii_lowercase().replace('-', "_"))
}

/// A provider field's dimension, part and spelling, if `name` (lowercase) is one.
fn provider_field(name: &str) -> Option<(&str, Part, Spelling)> {
    if let Some(rest) = name.strip_prefix("x-ratelimit-") {
        let parts = [
            ("limit-", Part::Limit),
            ("remaining-", Part::Remaining),
            ("reset-", Part::Reset),
        ];
        for (prefix, part) in parts {
            if let Some(dim) = rest.strip_prefix(prefix) {
                return Some((dim, part, Spelling::Go));
            }
        }
    } else if let Some(rest) = name.strip_prefix("anthropic-ratelimit-") {
        let parts = [
            ("-limit", Part::Limit),
            ("-remaining", Part::Remaining),
            ("-reset", Part::Reset),
        ];
        for (suffix, part) in parts {
            if let Some(dim) = rest.strip_suffix(suffix) {
                return Some((dim, part, Spelling::Instant));
            }
        }
    }
    None
}

impl DimensionSignal {
    /// Reads a response: its status and its headers as `(name, value)` pairs (names in
    /// any case). `now` is the wall-clock time, for absolute times.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::DimensionSignal;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let headers = [
    ///     ("retry-after", &b"3"[..]),
    ///     ("ratelimit", &br#""tokens";r=0;t=12, "requests";r=40;t=1"#[..]),
    ///     ("ratelimit-policy", &br#""tokens";q=40000;w=60"#[..]),
    /// ];
    /// let signal = DimensionSignal::read(429, headers, SystemTime::now());
    /// assert_eq!(signal.retry_after(), Some(Duration::from_secs(3)));
    /// let tokens = signal.get("tokens").unwrap();
    /// assert_eq!((tokens.limit, tokens.remaining), (Some(40_000), 0));
    /// // Not a hold: a value that cannot be read is ignored.
    /// let junk = [("x-ratelimit-reset-tokens", &b"-5s"[..]), ("retry-after", &b"soon"[..])];
    /// assert_eq!(DimensionSignal::read(429, junk, SystemTime::now()), DimensionSignal::default());
    /// ```
    pub fn read<'a, N: AsRef<str>>(
        status: u16,
        headers: impl IntoIterator<Item = (N, &'a [u8])>,
        now: SystemTime,
    ) -> DimensionSignal {
        let mut dims: BTreeMap<String, Acc> = BTreeMap::new();
        let mut retry: Vec<String> = Vec::new();
        let mut date = None;
        let mut ietf: Vec<(bool, String)> = Vec::new();
        let mut instants: Vec<(String, Duration)> = Vec::new();
        for (name, value) in headers {
            let Ok(value) = core::str::from_utf8(value) else {
                continue;
            };
            let value = value.trim();
            let name = name.as_ref().to_ascii_lowercase();
            match name.as_str() {
                "retry-after" if retry.len() < MAX_DIMENSIONS => retry.push(value.to_owned()),
                "date" => date = http_date(value),
                "ratelimit" | "ratelimit-policy" if ietf.len() < MAX_DIMENSIONS => {
                    ietf.push((name == "ratelimit", value.to_owned()));
                }
                _ => {
                    let Some((dim, part, spelling)) = provider_field(&name) else {
                        continue;
                    };
                    let Some(dim) = fold(dim) else { continue };
                    if !dims.contains_key(&dim) && dims.len() >= MAX_DIMENSIONS {
                        continue;
                    }
                    let acc = dims.entry(dim.clone()).or_default();
                    // Lines repeated and joined into one by an intermediary (`4, 0`):
                    // each member is one value (none of these spellings holds a comma).
                    let members = value.split(',').map(str::trim).take(MAX_DIMENSIONS);
                    for value in members.filter(|m| !m.is_empty()) {
                        match (part, spelling) {
                            (Part::Limit, _) => {
                                if let Some(n) = integer(value) {
                                    acc.limit_at_most(n, PROVIDER_WINDOW);
                                }
                            }
                            (Part::Remaining, _) => {
                                if let Some(n) = integer(value) {
                                    acc.remaining = Some(acc.remaining.map_or(n, |r| r.min(n)));
                                }
                            }
                            (Part::Reset, Spelling::Go) => {
                                acc.reset_at_least(go_duration(value));
                            }
                            // Read once the `Date` is known.
                            (Part::Reset, Spelling::Instant) => {
                                if let Some(at) = rfc3339(value) {
                                    instants.push((dim.clone(), at));
                                }
                            }
                        }
                    }
                }
            }
        }
        let clocks = Clocks::new(now, date);
        for (dim, at) in instants {
            if let Some(acc) = dims.get_mut(&dim) {
                acc.reset_at_least(Some(clocks.until(at)));
            }
        }
        for (state, value) in &ietf {
            for m in sf::members(value) {
                let (None, Item::Other(name)) = (m.key, m.item) else {
                    continue;
                };
                let Some(dim) = fold(name.trim_matches('"')) else {
                    continue;
                };
                if !dims.contains_key(&dim) && dims.len() >= MAX_DIMENSIONS {
                    continue;
                }
                let acc = dims.entry(dim).or_default();
                if *state {
                    if let Some(r) = m.number("r").and_then(Number::integer) {
                        acc.remaining = Some(acc.remaining.map_or(r, |old| old.min(r)));
                        acc.reset_at_least(m.number("t").map(Number::seconds));
                    }
                } else if let Some(q) = m.number("q").and_then(Number::integer) {
                    // A policy with no window says a quota, not a rate: a window of 0
                    // stands for "unknown", which no rate comparison picks.
                    let w = m.number("w").map_or(Duration::ZERO, Number::seconds);
                    acc.limit_at_most(q, w);
                }
            }
        }
        let retry_after = if status == 429 || status == 503 {
            retry.iter().filter_map(|v| retry_after(v, &clocks)).max()
        } else {
            None
        };
        let left = dims
            .into_iter()
            .filter_map(|(name, acc)| {
                Some(DimensionLeft {
                    name,
                    limit: acc.limit.map(|(q, _)| q),
                    per: acc.limit.map(|(_, w)| w).filter(|w| !w.is_zero()),
                    remaining: acc.remaining?,
                    reset: acc.reset,
                })
            })
            .collect();
        DimensionSignal { retry_after, left }
    }

    /// `Retry-After` (on a `429` or `503`): nothing at all should be sent for this long.
    ///
    /// # Examples
    ///
    /// See [`DimensionSignal::read`].
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Each dimension the response reports what is left of, by name.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::DimensionSignal;
    /// let headers = [("anthropic-ratelimit-input-tokens-remaining", &b"8000"[..])];
    /// let signal = DimensionSignal::read(200, headers, std::time::SystemTime::now());
    /// assert_eq!(signal.left()[0].name, "input_tokens");
    /// ```
    pub fn left(&self) -> &[DimensionLeft] {
        &self.left
    }

    /// What is left of dimension `name` (folded: `input-tokens` finds `input_tokens`).
    ///
    /// # Examples
    ///
    /// See [`DimensionSignal`].
    pub fn get(&self, name: &str) -> Option<&DimensionLeft> {
        let name = fold(name)?;
        self.left.iter().find(|l| l.name == name)
    }
}

/// The window the provider fields' limits count over (module docs).
const PROVIDER_WINDOW: Duration = Duration::from_secs(60);

impl Acc {
    /// A limit of `q` per `w` (`w` zero: unknown); the lowest rate is kept, and a known
    /// window over an unknown one.
    fn limit_at_most(&mut self, q: u64, w: Duration) {
        let lower = match self.limit {
            None => true,
            Some((old_q, old_w)) => match (w.is_zero(), old_w.is_zero()) {
                (true, true) => q < old_q,
                (true, false) => false,
                (false, true) => true,
                // q / w < old_q / old_w, cross-multiplied to stay in integers.
                (false, false) => {
                    u128::from(q) * old_w.as_nanos() < u128::from(old_q) * w.as_nanos()
                }
            },
        };
        if lower {
            self.limit = Some((q, w));
        }
    }

    fn reset_at_least(&mut self, reset: Option<Duration>) {
        if let Some(reset) = reset {
            self.reset = Some(self.reset.map_or(reset, |r| r.max(reset)));
        }
    }
}

/// A non-negative integer count (digits only; saturating).
fn integer(value: &str) -> Option<u64> {
    sf::number(value)?.integer()
}

#[cfg(test)]
mod tests;
