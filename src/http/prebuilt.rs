//! What a limit's refusals send, built once: under a flood the refusals are the hot path,
//! and formatting headers and a body for each would cost the layer several times what an
//! admission costs.
//!
//! For the quota a limit was made with, its `RateLimit-Policy` item, its `RateLimit` item
//! for no cell left and `t` from 0 to [`MAX_SECS`], its `Retry-After` values and its
//! default refusal body for waits up to `MAX_SECS` seconds are made when the limit is.
//!
//! The usual refusal (one limit, no cell left, the default body, not gRPC) is cached
//! whole, its field map and body made the first time its values come up: the check's
//! wait finds its slot with one division, the refused request's future holds it by a
//! reference count, and the response is made when polled, one clone of a four-field map
//! (about half the cost of inserting the four fields into a new one) and one of the body.
//! Other refusals clone the pieces (a reference count each) into a new map. Anything else
//! (a quota changed since, longer waits, cells left) is put together per refusal: slower,
//! and the same bytes.

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
    /// `Retry-After: s` for `s` in `0..=MAX_SECS`, static (cloned and dropped without a
    /// reference count).
    retry_after: Vec<HeaderValue>,
    /// The default refusals for no cell left, each made on first use (a limit's refusals
    /// mostly repeat a few): slot `2 * secs + k` holds the fields for `Retry-After: secs`
    /// and `RateLimit` `t = secs + gap + k`, in the order the slower path writes them
    /// (`Content-Type`, `Retry-After`, `RateLimit-Policy`, `RateLimit`), and the body for
    /// `secs`. Empty when the policy item could not be made.
    refusals: Box<[OnceLock<Arc<Cached>>]>,
    /// The whole seconds, rounded down, between a refused client's next cell and its full
    /// burst, `(burst - 1) T`: `t` rounds up the wait plus that, `Retry-After` the wait
    /// alone, so `t - secs` is `gap` or `gap + 1`.
    gap: u64,
    /// `(burst - 1) T` in nanoseconds (the quota's room for one cell) is `gap` whole
    /// seconds and `g` nanoseconds; this is `1 s - g`: a wait `q` whole seconds and `r`
    /// nanoseconds after a whole second (`r` in `1..=1 s`) has `t = secs + gap + 1` when
    /// `r + g` passes a second, that is when `r - 1` reaches this.
    k_from: u64,
}

/// One usual refusal's header fields and body (`Prebuilt::refusals`). A refused
/// request's future holds it by its reference count and makes the response only when
/// polled, straight into the poll's result: a response is several times the size of the
/// pointer, and moving it through the layer's frames costs a refusal more than the count.
#[derive(Debug)]
pub(crate) struct Cached {
    fields: http::HeaderMap,
    body: Bytes,
}

impl Cached {
    /// The refusal: a 429 with the cached fields and body, each cloned (a reference count
    /// or a static pointer per value, two allocations for the map).
    pub(super) fn response<R: RefusalBody>(&self) -> Response<R> {
        let mut response = Response::new(R::from_bytes(self.body.clone()));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        *response.headers_mut() = self.fields.clone();
        response
    }
}

/// The decimal digits of `0..=MAX_SECS`, static: a `Retry-After` value from them is
/// cloned and dropped without a reference count.
fn static_secs(secs: u64) -> Option<&'static str> {
    const DIGITS: &str = "0123456789\
        1011121314151617181920212223242526272829303132333435\
        3637383940414243444546474849505152535455565758596061";
    let secs = usize::try_from(secs)
        .ok()
        .filter(|s| *s <= MAX_SECS as usize)?;
    let (at, len) = if secs < 10 {
        (secs, 1)
    } else {
        (10 + 2 * (secs - 10), 2)
    };
    DIGITS.get(at..at + len)
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
        let room = quota.params().room_for_one();
        let gap = room / NANOS;
        // No slots without a policy item: nothing is cached, every refusal takes the slower
        // path (and `at` need not check).
        let slots = if policy.is_empty() {
            0
        } else {
            2 * (MAX_SECS + 1)
        };
        Prebuilt {
            quota,
            none_left,
            refusals: (0..slots).map(|_| OnceLock::new()).collect(),
            gap,
            k_from: NANOS - room % NANOS,
            state_start: Bytes::from(format!("{field_name};r=")),
            bodies: (0..=MAX_SECS)
                .map(|s| Bytes::from(default_body(name, s)))
                .collect(),
            body_start: Bytes::from(format!("Too Many Requests: limit \"{name}\", retry in ")),
            retry_after: (0..=MAX_SECS)
                .map(|s| {
                    static_secs(s).map_or_else(|| HeaderValue::from(s), HeaderValue::from_static)
                })
                .collect(),
            policy,
        }
    }

    /// The `RateLimit-Policy` item, if `quota` is the one it was made for.
    pub(super) fn policy(&self, quota: Quota) -> Option<HeaderValue> {
        (quota == self.quota && !self.policy.is_empty()).then(|| self.policy.clone())
    }

    /// The default refusal's header fields and body for a state with no cell left, if
    /// they are prebuilt for its quota and waits: the usual refusal, to be cloned whole.
    #[inline]
    pub(super) fn none_left(&self, state: &Snapshot) -> Option<&Arc<Cached>> {
        if state.remaining() != 0 {
            return None;
        }
        let secs = ceil_secs(state.until_next()).max(1);
        self.cached(state.quota(), secs, ceil_secs(state.until_full()))
    }

    /// [`Prebuilt::none_left`] for a one-cell refusal as its check found it, its slot found
    /// with one division: a wait of `q` whole seconds and `r` more nanoseconds, `r` in
    /// `1..=1 s` (`q` and `r - 1` are the wait less a nanosecond, divided by a second),
    /// is `Retry-After: q + 1`, and the wait plus the room rounded up is `t = q + 1 + gap`,
    /// plus one if `r` and the room's nanoseconds past its whole seconds add up to more
    /// than a second.
    #[inline]
    pub(super) fn refused(&self, refused: &OneRefused) -> Option<&Arc<Cached>> {
        // A spent cell's refusal (a new key refused by the key bound is full sooner). A
        // wait or room too long to add up is over `MAX_SECS`: nothing is cached for it.
        if !refused.spent || refused.params != *self.quota.params() {
            return None;
        }
        let less = refused.wait.checked_sub(1)?;
        let (q, r_less) = (less / NANOS, less % NANOS);
        self.at(q + 1, u64::from(r_less >= self.k_from))
    }

    /// The cached refusal for no cell left, `Retry-After: secs` and `t` seconds until
    /// full, if `quota` is the one the pieces were made for and `secs` and `t` are within
    /// them.
    fn cached(&self, quota: Quota, secs: u64, t: u64) -> Option<&Arc<Cached>> {
        if quota != self.quota {
            return None;
        }
        let k = t
            .checked_sub(secs)?
            .checked_sub(self.gap)
            .filter(|k| *k <= 1)?;
        self.at(secs, k)
    }

    /// The cached refusal for `Retry-After: secs` and `t = secs + gap + k` (`k` 0 or 1),
    /// made on first use, if both are within [`MAX_SECS`].
    #[inline]
    fn at(&self, secs: u64, k: u64) -> Option<&Arc<Cached>> {
        let slot = self
            .refusals
            .get(usize::try_from(secs.checked_mul(2)?.checked_add(k)?).ok()?)?;
        if let Some(cached) = slot.get() {
            return Some(cached);
        }
        self.make(slot, secs, secs.checked_add(self.gap)?.checked_add(k)?)
    }

    /// Fills `slot` with the refusal for `secs` and `t` (out of line: once per slot).
    #[cold]
    #[inline(never)]
    fn make<'a>(
        &self,
        slot: &'a OnceLock<Arc<Cached>>,
        secs: u64,
        t: u64,
    ) -> Option<&'a Arc<Cached>> {
        let secs = usize::try_from(secs).ok()?;
        let retry_after = self.retry_after.get(secs)?;
        let body = self.bodies.get(secs)?;
        let state = self.none_left.get(usize::try_from(t).ok()?)?;
        Some(slot.get_or_init(|| {
            let mut fields = http::HeaderMap::with_capacity(4);
            fields.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
            fields.insert(RETRY_AFTER, retry_after.clone());
            fields.insert(POLICY, self.policy.clone());
            fields.insert(STATE, state.clone());
            Arc::new(Cached {
                fields,
                body: body.clone(),
            })
        }))
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

/// Nanoseconds in a second.
const NANOS: u64 = 1_000_000_000;

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
        for secs in (0..=MAX_SECS + 1).chain([1 << 40, u64::MAX]) {
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
                        let Some(found) = pre.cached(quota, secs, t) else {
                            continue;
                        };
                        let Cached { fields, body } = &**found;
                        cached += 1;
                        assert_eq!(&body[..], default_body("per-ip", secs).as_bytes());
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
            assert!(pre.cached(Quota::per_hour(9), 1, 1 + pre.gap).is_none());
        }
    }

    use proptest::prelude::*;

    proptest! {
        /// A one-cell refusal finds, by its one division, the very refusal its snapshot
        /// finds by rounding both durations: the same slot, or neither.
        #[test]
        fn a_refusal_finds_its_snapshots_refusal(
            period_ms in 1u64..=90_000,
            burst in 1u32..=70,
            wait in prop_oneof![
                0u64..=70 * NANOS,
                (1u64..=70).prop_map(|s| s * NANOS),
                (1u64..=70).prop_map(|s| s * NANOS - 1),
                (0u64..=70).prop_map(|s| s * NANOS + 1),
                any::<u64>(),
            ],
            table_full in any::<bool>(),
        ) {
            let quota = Quota::try_new(1, core::time::Duration::from_millis(period_ms))
                .and_then(|q| q.try_with_burst(burst))
                .unwrap();
            let pre = Prebuilt::new("per-ip", "\"per-ip\"", quota);
            // Beside `wait`, the waits whose fraction of a second and the room's meet at a
            // whole second, and their neighbours.
            let meet = pre.k_from;
            let waits = (0..3u64)
                .flat_map(|s| [meet - 1, meet, meet + 1].map(|w| s * NANOS + w))
                .chain([wait]);
            // A check refuses only with a wait above zero (a zero wait would be admitted).
            for wait in waits.filter(|w| *w > 0) {
                let refused = if table_full {
                    OneRefused::no_slot(*quota.params(), wait)
                } else {
                    OneRefused::spent(*quota.params(), wait)
                };
                let by_division = pre.refused(&refused).map(Arc::as_ptr);
                let by_snapshot = pre.none_left(&refused.snapshot()).map(Arc::as_ptr);
                // A key-bound refusal takes the slower path, whatever its snapshot finds.
                if !(table_full && by_division.is_none()) {
                    prop_assert_eq!(by_division, by_snapshot, "wait {}", wait);
                }
            }
        }
    }
}
