//! What a limit's refusals send, built once: under a flood the refusals are the hot path,
//! and formatting headers and a body for each would cost the layer several times what an
//! admission costs.
//!
//! For the quota a limit was made with, its `RateLimit-Policy` item, its `RateLimit` item
//! for no cell left and `t` from 0 to [`MAX_SECS`], its `Retry-After` values and its
//! default refusal body for waits up to `MAX_SECS` seconds are made when the limit is. The
//! usual refusal (one limit, no cell left, the default body) clones a whole field map,
//! made the first time its values come up: one clone of a four-field map costs about half
//! of inserting the four fields into a new one. Other refusals clone the pieces (a
//! reference count each) into a new map. Anything else (a quota changed since, longer
//! waits, cells left) is put together per refusal: slower, and the same bytes.

use std::sync::OnceLock;

use bytes::Bytes;

use super::*;

/// The longest wait, in whole seconds, whose values are prebuilt.
pub(super) const MAX_SECS: u64 = 60;

/// One limit's prebuilt refusal pieces (module docs).
#[derive(Debug)]
pub(super) struct Prebuilt {
    /// The quota the pieces were made for.
    quota: Quota,
    /// `"name";q=..;w=..`.
    policy: HeaderValue,
    /// `"name";r=0;t={t}` for `t` in `0..=MAX_SECS`.
    none_left: Vec<HeaderValue>,
    /// `"name";r=`: the start of every other `RateLimit` item.
    state_start: Bytes,
    /// The default body for a `Retry-After` of `s` in `1..=MAX_SECS` (index `s`; 0 unused).
    bodies: Vec<Bytes>,
    /// The default body's text before and after the seconds, for longer waits.
    body_start: Bytes,
    /// `Retry-After: s` for `s` in `0..=MAX_SECS`.
    retry_after: Vec<HeaderValue>,
    /// Whole field maps of the default refusal for no cell left, each made on first use
    /// (a limit's refusals mostly repeat a few): slot `2 * secs + k` holds the fields for
    /// `Retry-After: secs` and `RateLimit` `t = secs + gap + k`, in the order the
    /// refusal writes them (`Content-Type`, `Retry-After`, `RateLimit-Policy`,
    /// `RateLimit`). A refusal clones one, which costs half of inserting four fields.
    refusals: Box<[OnceLock<http::HeaderMap>]>,
    /// The whole seconds, rounded down, between a refused client's next cell and its full
    /// burst, `(burst - 1) T`: `t` rounds up the wait plus that, `Retry-After` the wait
    /// alone, so `t - secs` is `gap` or `gap + 1`.
    gap: u64,
}

impl Prebuilt {
    pub(super) fn new(name: &str, field_name: &str, quota: Quota) -> Prebuilt {
        let (q, w) = policy(quota);
        let value = |text: String| HeaderValue::from_str(&text).ok();
        // A field name is printable ASCII (checked when the limit was made), so these are
        // valid header values; a value that were not would only lose its fast path.
        let policy = value(policy_item(field_name, q, w)).unwrap_or(HeaderValue::from_static(""));
        let none_left: Vec<HeaderValue> = (0..=MAX_SECS)
            .map_while(|t| value(state_item(field_name, 0, t)))
            .collect();
        let gap = quota
            .emission_interval()
            .checked_mul(quota.burst() - 1)
            .map_or(u64::MAX, |d| d.as_secs());
        Prebuilt {
            quota,
            policy,
            none_left,
            refusals: (0..2 * (MAX_SECS + 1)).map(|_| OnceLock::new()).collect(),
            gap,
            state_start: Bytes::from(format!("{field_name};r=")),
            bodies: (0..=MAX_SECS)
                .map(|s| Bytes::from(default_body(name, s)))
                .collect(),
            body_start: Bytes::from(format!("Too Many Requests: limit \"{name}\", retry in ")),
            retry_after: (0..=MAX_SECS).map(HeaderValue::from).collect(),
        }
    }

    /// The `RateLimit-Policy` item, if `quota` is the one it was made for.
    pub(super) fn policy(&self, quota: Quota) -> Option<HeaderValue> {
        (quota == self.quota && !self.policy.is_empty()).then(|| self.policy.clone())
    }

    /// The default refusal's header fields for no cell left, `Retry-After: secs` and
    /// `t` seconds until full, if they are prebuilt for `quota` and those values.
    pub(super) fn none_left_fields(
        &self,
        quota: Quota,
        secs: u64,
        t: u64,
    ) -> Option<http::HeaderMap> {
        if quota != self.quota || self.policy.is_empty() {
            return None;
        }
        let k = t
            .checked_sub(secs)?
            .checked_sub(self.gap)
            .filter(|k| *k <= 1)?;
        let slot = self
            .refusals
            .get(usize::try_from(secs.checked_mul(2)?.checked_add(k)?).ok()?)?;
        if let Some(fields) = slot.get() {
            return Some(fields.clone());
        }
        let retry_after = self.retry_after.get(usize::try_from(secs).ok()?)?;
        let state = self.none_left.get(usize::try_from(t).ok()?)?;
        let fields = slot.get_or_init(|| {
            let mut fields = http::HeaderMap::with_capacity(4);
            fields.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
            fields.insert(RETRY_AFTER, retry_after.clone());
            fields.insert(POLICY, self.policy.clone());
            fields.insert(STATE, state.clone());
            fields
        });
        Some(fields.clone())
    }

    /// The `RateLimit` item for `remaining` cells left and `t` seconds until full: cloned
    /// when prebuilt, else put together from its prebuilt start without `format!`.
    pub(super) fn state(&self, remaining: u32, t: u64) -> Option<HeaderValue> {
        if remaining == 0 {
            if let Some(value) = usize::try_from(t).ok().and_then(|t| self.none_left.get(t)) {
                return Some(value.clone());
            }
        }
        let mut bytes = Vec::with_capacity(self.state_start.len() + 26);
        bytes.extend_from_slice(&self.state_start);
        digits(u64::from(remaining), &mut bytes);
        bytes.extend_from_slice(b";t=");
        digits(t, &mut bytes);
        HeaderValue::from_maybe_shared(Bytes::from(bytes)).ok()
    }

    /// The `Retry-After` value for `secs`: cloned when prebuilt.
    pub(super) fn retry_after(&self, secs: u64) -> HeaderValue {
        usize::try_from(secs)
            .ok()
            .and_then(|i| self.retry_after.get(i).cloned())
            .unwrap_or_else(|| HeaderValue::from(secs))
    }

    /// The default body for a `Retry-After` of `secs`: shared when prebuilt, else put
    /// together without `format!`.
    pub(super) fn body(&self, secs: u64) -> Bytes {
        if let Some(body) = usize::try_from(secs).ok().and_then(|s| self.bodies.get(s)) {
            return body.clone();
        }
        let mut bytes = Vec::with_capacity(self.body_start.len() + 24);
        bytes.extend_from_slice(&self.body_start);
        digits(secs, &mut bytes);
        bytes.extend_from_slice(b" s\n");
        Bytes::from(bytes)
    }
}

/// Appends `n` in decimal.
fn digits(n: u64, out: &mut Vec<u8>) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// A `RateLimit-Policy` item: `"name";q=..;w=..`.
pub(super) fn policy_item(field_name: &str, q: u64, w: u64) -> String {
    format!("{field_name};q={q};w={w}")
}

/// A `RateLimit` item: `"name";r=..;t=..`.
pub(super) fn state_item(field_name: &str, r: u32, t: u64) -> String {
    format!("{field_name};r={r};t={t}")
}

/// The default refusal body.
pub(super) fn default_body(name: &str, retry_after: u64) -> String {
    format!("Too Many Requests: limit \"{name}\", retry in {retry_after} s\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prebuilt_pieces_are_the_formatted_ones() {
        let quota = Quota::per_hour(7).with_burst(3);
        let pre = Prebuilt::new("per-ip", "\"per-ip\"", quota);
        for (r, t) in [
            (0, 0),
            (0, 60),
            (0, 61),
            (0, 3_600),
            (2, 5),
            (u32::MAX, u64::MAX),
        ] {
            assert_eq!(
                pre.state(r, t).unwrap().as_bytes(),
                state_item("\"per-ip\"", r, t).as_bytes(),
                "{r} {t}"
            );
        }
        for secs in [1, 59, 60, 61, 86_400, u64::MAX] {
            assert_eq!(&pre.body(secs)[..], default_body("per-ip", secs).as_bytes());
        }
        let (q, w) = policy(quota);
        assert_eq!(
            pre.policy(quota).unwrap().as_bytes(),
            policy_item("\"per-ip\"", q, w).as_bytes()
        );
        assert!(pre.policy(Quota::per_hour(8)).is_none());
        for secs in [0, 1, 60, 61, 1 << 40] {
            assert_eq!(pre.retry_after(secs), HeaderValue::from(secs));
        }
    }

    /// The cached field maps hold the formatted values of the very `secs` and `t` asked
    /// for, asked in any order, and nothing for another quota.
    #[test]
    fn cached_refusal_fields_are_the_formatted_ones() {
        for quota in [
            Quota::per_minute(1),
            Quota::per_second(10).with_burst(25),
            Quota::per_hour(7).with_burst(3),
        ] {
            let pre = Prebuilt::new("per-ip", "\"per-ip\"", quota);
            let (q, w) = policy(quota);
            let mut cached = 0;
            for round in 0..2 {
                for secs in (0..=MAX_SECS + 2).rev() {
                    for t in secs..secs.saturating_add(pre.gap).saturating_add(4) {
                        let Some(fields) = pre.none_left_fields(quota, secs, t) else {
                            continue;
                        };
                        cached += 1;
                        let text = |name: &str| fields.get(name).unwrap().to_str().unwrap();
                        assert_eq!(fields.len(), 4, "{round} {secs} {t}");
                        assert_eq!(text("content-type"), TEXT);
                        assert_eq!(text("retry-after"), secs.to_string());
                        assert_eq!(text("ratelimit-policy"), policy_item("\"per-ip\"", q, w));
                        assert_eq!(text("ratelimit"), state_item("\"per-ip\"", 0, t));
                    }
                }
            }
            // Every `secs` and `t = secs + gap + k` (`k` 0 or 1) within `MAX_SECS`, in each
            // round.
            let expected = (0..=MAX_SECS)
                .flat_map(|secs| [0, 1].map(|k| secs + pre.gap + k))
                .filter(|t| *t <= MAX_SECS)
                .count();
            assert_eq!(cached, 2 * expected, "{quota:?}");
            // A per-hour limit with a burst is full more than a minute after its next
            // cell: its `t` is never prebuilt, and its refusals take the slower path.
            assert_eq!(expected == 0, pre.gap >= MAX_SECS, "{quota:?}");
            assert!(pre
                .none_left_fields(Quota::per_hour(9), 1, 1 + pre.gap)
                .is_none());
        }
    }
}
