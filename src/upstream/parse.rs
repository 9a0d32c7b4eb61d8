//! Reading what an upstream says about its limits, from a response's status and headers:
//! `Retry-After`, the IETF `RateLimit-Policy` and `RateLimit` fields (and their earlier
//! drafts' `RateLimit-Limit` / `-Remaining` / `-Reset`), and the common
//! `X-RateLimit-Limit` / `-Remaining` / `-Reset`.
//!
//! # Implementation notes
//!
//! Parsing is strict about what it accepts and quiet about the rest: a field it cannot read
//! whole is ignored (a server's typo must not hold a client for a year, nor crash it), and
//! every number is range-checked before it becomes time. Header values are bytes; a value
//! that is not ASCII is ignored.

use core::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

/// What a response says about the upstream's limits.
///
/// # Examples
///
/// ```
/// use paceline::upstream::Signal;
/// use std::time::{Duration, SystemTime};
///
/// let headers = [("retry-after", &b"3"[..]), ("ratelimit-policy", &b"\"api\";q=50;w=1"[..])];
/// let signal = Signal::read(429, headers, SystemTime::now());
/// assert_eq!(signal.hold, Some(Duration::from_secs(3)));
/// assert_eq!(signal.policy, Some((50, Duration::from_secs(1))));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Signal {
    /// Nothing should be sent for this long (`Retry-After`, or a field saying no request
    /// is left until a reset).
    pub hold: Option<Duration>,
    /// The quota the upstream announces: at most this many requests in any window of this
    /// length (the most restrictive of the policies it names).
    pub policy: Option<(u64, Duration)>,
}

impl Signal {
    /// Reads a response: its status and its headers as `(name, value)` pairs (names in any
    /// case). `now` is the wall-clock time, for `Retry-After` given as a date.
    ///
    /// `Retry-After` counts on a `429` or `503` only (elsewhere it is about redirects or
    /// other things); the `RateLimit` and `X-RateLimit` fields count on any status.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Signal;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let ok = [("x-ratelimit-remaining", &b"0"[..]), ("x-ratelimit-reset", &b"2"[..])];
    /// assert_eq!(Signal::read(200, ok, SystemTime::now()).hold, Some(Duration::from_secs(2)));
    /// // A value that cannot be read is ignored.
    /// let junk = [("retry-after", &b"soon"[..])];
    /// assert_eq!(Signal::read(429, junk, SystemTime::now()), Signal::default());
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
            let value = value.trim();
            match name.as_ref().to_ascii_lowercase().as_str() {
                "retry-after" => fields.retry_after = Some(value.to_owned()),
                "ratelimit-policy" => fields.policy.push(value.to_owned()),
                "ratelimit" => fields.state.push(value.to_owned()),
                "ratelimit-limit" | "x-ratelimit-limit" => fields.limit = int(value),
                "ratelimit-remaining" | "x-ratelimit-remaining" => {
                    fields.remaining = int(value);
                }
                "ratelimit-reset" | "x-ratelimit-reset" => fields.reset = int(value),
                _ => {}
            }
        }
        fields.signal(status, now)
    }
}

/// The fields read so far.
#[derive(Default)]
struct Fields {
    retry_after: Option<String>,
    policy: Vec<String>,
    state: Vec<String>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<u64>,
}

impl Fields {
    fn signal(&self, status: u16, now: SystemTime) -> Signal {
        let mut hold = None;
        if status == 429 || status == 503 {
            hold = self
                .retry_after
                .as_deref()
                .and_then(|v| retry_after(v, now));
        }
        // `RateLimit: "name";r=0;t=5`: nothing left until the reset.
        let state_hold = self
            .state
            .iter()
            .flat_map(|v| members(v))
            .filter(|m| m.param("r") == Some(0))
            .filter_map(|m| m.param("t").map(Duration::from_secs))
            .max();
        // `X-RateLimit-Remaining: 0` with `-Reset`: seconds, or a Unix time.
        let counter_hold = match (self.remaining, self.reset) {
            (Some(0), Some(reset)) => reset_delay(reset, now),
            _ => None,
        };
        for candidate in [state_hold, counter_hold] {
            hold = hold.max(candidate);
        }
        let policy = self
            .policy
            .iter()
            .flat_map(|v| members(v))
            .filter_map(|m| {
                // `"name";q=50;w=1`, or an earlier draft's `50;w=1` (the item is the quota).
                let quota = m.param("q").or(m.number)?;
                let window = m.param("w")?;
                (quota > 0 && window > 0).then(|| (quota, Duration::from_secs(window)))
            })
            // The most restrictive: the lowest rate (compared as quota over window, by
            // cross-multiplying to stay in integers).
            .min_by(|(q1, w1), (q2, w2)| {
                (u128::from(*q1) * w2.as_nanos()).cmp(&(u128::from(*q2) * w1.as_nanos()))
            });
        Signal { hold, policy }
    }
}

/// `Retry-After`: delta-seconds, or an HTTP-date (IMF-fixdate, RFC 850, asctime).
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    if let Some(seconds) = int(value) {
        return Some(Duration::from_secs(seconds));
    }
    let at = http_date(value)?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    // A date in the past: no hold.
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// A reset given as seconds from now, or as a Unix time (a number past 10^9, as servers
/// that send Unix times do: no server means a delay of 30 years).
fn reset_delay(reset: u64, now: SystemTime) -> Option<Duration> {
    if reset < 1_000_000_000 {
        return Some(Duration::from_secs(reset));
    }
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(reset.saturating_sub(now)))
}

/// A non-negative decimal integer of at most 15 digits (anything longer is no delay a
/// server means), and nothing else.
fn int(value: &str) -> Option<u64> {
    let value = value.trim();
    (!value.is_empty() && value.len() <= 15 && value.bytes().all(|b| b.is_ascii_digit()))
        .then(|| value.parse().ok())
        .flatten()
}

/// One member of a structured-field list: its bare item if it is an integer, and its
/// integer parameters.
struct Member<'a> {
    number: Option<u64>,
    params: Vec<(&'a str, u64)>,
}

impl Member<'_> {
    fn param(&self, key: &str) -> Option<u64> {
        self.params
            .iter()
            .find_map(|(k, v)| (*k == key).then_some(*v))
    }
}

/// The members of a structured-field list (RFC 9651, the parts these fields use: a string,
/// token or integer item with `;key=integer` parameters). A member that does not parse is
/// left out, never guessed at.
fn members(value: &str) -> Vec<Member<'_>> {
    split_outside_quotes(value, b',')
        .into_iter()
        .filter_map(|member| {
            let mut parts = split_outside_quotes(member, b';').into_iter();
            let item = parts.next()?.trim();
            let number = if item.starts_with('"') {
                // A string: the policy's name, which only has to be well formed.
                (item.len() >= 2 && item.ends_with('"')).then_some(None)?
            } else if let Some(n) = int(item) {
                Some(n)
            } else if item
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.*:/%!#$&'^`|~+".contains(&b))
                && !item.is_empty()
            {
                None
            } else {
                return None;
            };
            let params = parts
                .map(|param| {
                    let (key, value) = param.split_once('=')?;
                    Some((key.trim(), int(value)?))
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Member { number, params })
        })
        .collect()
}

/// Splits on `sep` outside double quotes (a quoted name may hold `,` or `;`).
fn split_outside_quotes(value: &str, sep: u8) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, b) in value.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            _ if b == sep && !quoted => {
                parts.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    parts
}

/// An HTTP-date as Unix seconds: `Sun, 06 Nov 1994 08:49:37 GMT` (IMF-fixdate),
/// `Sunday, 06-Nov-94 08:49:37 GMT` (RFC 850) or `Sun Nov  6 08:49:37 1994` (asctime).
fn http_date(value: &str) -> Option<u64> {
    let words: Vec<&str> = value.split_whitespace().collect();
    let (day, month, year, time) = match words.as_slice() {
        // IMF-fixdate.
        [_, day, month, year, time, "GMT"] => (*day, *month, *year, *time),
        // RFC 850: "06-Nov-94".
        [_, date, time, "GMT"] => {
            let mut parts = date.split('-');
            let (day, month, year) = (parts.next()?, parts.next()?, parts.next()?);
            let year = if year.len() == 2 {
                // Two-digit years: 70..99 are the 1900s, the rest the 2000s (RFC 9110).
                let y: u64 = year.parse().ok()?;
                return civil(if y >= 70 { 1900 + y } else { 2000 + y }, month, day, time);
            } else {
                year
            };
            (day, month, year, *time)
        }
        // asctime.
        [_, month, day, time, year] => (*day, *month, *year, *time),
        _ => return None,
    };
    civil(int(year)?, month, day, time)
}

/// Unix seconds of a proleptic Gregorian date and `hh:mm:ss` time, in UTC.
fn civil(year: u64, month: &str, day: &str, time: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    let day = int(day).filter(|d| (1..=31).contains(d))?;
    let mut hms = time.split(':').map(int);
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some() || h > 23 || m > 59 || s > 60 || !(1970..=9999).contains(&year) {
        return None;
    }
    // Days from 1970-01-01 (Howard Hinnant's days_from_civil, for years from 1970).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + h * 3_600 + m * 60 + s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn http_dates_in_all_three_forms() {
        // 784111777 is Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example).
        for date in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(http_date(date), Some(784_111_777), "{date}");
        }
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date("Sat, 29 Feb 2020 12:00:00 GMT"),
            Some(1_582_977_600)
        );
        for bad in [
            "",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "tomorrow",
        ] {
            assert_eq!(http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn retry_after_as_seconds_or_a_date() {
        let now = at(784_111_777);
        let read = |v: &str| Signal::read(429, [("Retry-After", v.as_bytes())], now).hold;
        assert_eq!(read("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            read("Sun, 06 Nov 1994 08:50:37 GMT"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(read("Sun, 06 Nov 1994 08:40:37 GMT"), Some(Duration::ZERO));
        for bad in ["-5", "1.5", "1e9", "99999999999999999999", "soon"] {
            assert_eq!(read(bad), None, "{bad}");
        }
        // Only on a refusal.
        assert_eq!(
            Signal::read(200, [("retry-after", &b"5"[..])], now).hold,
            None
        );
    }

    #[test]
    fn the_ietf_fields_and_their_earlier_drafts() {
        let now = at(1_700_000_000);
        let read =
            |h: &[(&str, &str)]| Signal::read(200, h.iter().map(|(n, v)| (*n, v.as_bytes())), now);
        let s = read(&[
            (
                "RateLimit-Policy",
                r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
            ),
            ("RateLimit", r#""burst";r=0;t=7"#),
        ]);
        // The lower rate: 1000 a day.
        assert_eq!(s.policy, Some((1000, Duration::from_secs(86_400))));
        assert_eq!(s.hold, Some(Duration::from_secs(7)));
        assert_eq!(
            read(&[("ratelimit-policy", "50;w=1")]).policy,
            Some((50, Duration::from_secs(1)))
        );
        assert_eq!(
            read(&[("ratelimit-policy", r#""a,b";q=5;w=1"#)]).policy,
            Some((5, Duration::from_secs(1)))
        );
        // Remaining cells left: no hold.
        assert_eq!(read(&[("ratelimit", r#""p";r=3;t=7"#)]).hold, None);
        // Broken members are left out.
        assert_eq!(
            read(&[("ratelimit-policy", r#""x";q=-1;w=1, "y";q=0;w=1, "z;q=5"#)]).policy,
            None
        );
    }

    #[test]
    fn x_ratelimit_reset_as_seconds_or_a_unix_time() {
        let now = at(1_700_000_000);
        let read = |remaining: &str, reset: &str| {
            Signal::read(
                200,
                [
                    ("X-RateLimit-Remaining", remaining.as_bytes()),
                    ("X-RateLimit-Reset", reset.as_bytes()),
                ],
                now,
            )
            .hold
        };
        assert_eq!(read("0", "30"), Some(Duration::from_secs(30)));
        assert_eq!(read("0", "1700000045"), Some(Duration::from_secs(45)));
        assert_eq!(read("1", "30"), None);
        assert_eq!(read("0", "-3"), None);
    }

    #[test]
    fn values_that_are_not_text_are_ignored() {
        let s = Signal::read(429, [("retry-after", &[0xff, 0xfe][..])], SystemTime::now());
        assert_eq!(s, Signal::default());
    }
}
