//! What a limit's refusals send, built once: under a flood the refusals are the hot path,
//! and formatting headers and a body for each would cost the layer several times what an
//! admission costs.
//!
//! For the quota a limit was made with, its `RateLimit-Policy` item, its `RateLimit` item
//! for no cell left and `t` from 0 to [`MAX_SECS`], its `Retry-After` values and its
//! default refusal body for waits up to `MAX_SECS` seconds are made when the limit is. A
//! refusal clones them (a reference count each). Anything else (a quota changed since,
//! longer waits, cells left) is put together per refusal: slower, and the same bytes.

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
}

impl Prebuilt {
    pub(super) fn new(name: &str, field_name: &str, quota: Quota) -> Prebuilt {
        let (q, w) = policy(quota);
        let value = |text: String| HeaderValue::from_str(&text).ok();
        // A field name is printable ASCII (checked when the limit was made), so these are
        // valid header values; a value that were not would only lose its fast path.
        Prebuilt {
            quota,
            policy: value(policy_item(field_name, q, w)).unwrap_or(HeaderValue::from_static("")),
            none_left: (0..=MAX_SECS)
                .filter_map(|t| value(state_item(field_name, 0, t)))
                .collect(),
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
}
