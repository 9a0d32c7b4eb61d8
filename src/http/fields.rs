//! The IETF `RateLimit-Policy` / `RateLimit` fields and the legacy `X-RateLimit-*` ones.

use super::*;

/// A limit's policy as the `RateLimit-Policy` field writes it: `q` cells per `w` seconds,
/// the sustained rate. `w` is the burst window in whole seconds (at least 1) or, when the
/// rate is not a whole number of cells in it, the first longer whole number of seconds
/// (at most a minute longer) in which it is within 1 % of one; `q` is the cells the rate
/// admits in `w`, rounded down. So `q / w` is never above the real rate, and a client that
/// spaces its requests `w / q` apart is never refused (2/s with a burst of 3 is `q=4;w=2`,
/// 100/s with a burst of 1 is `q=100;w=1`, one cell per 700 ms is `q=10;w=7`). The policy
/// is a rate, not a burst: how many a client may send at once is what `r` says (the
/// burst, when it has been idle).
pub(super) fn policy(quota: Quota) -> (u64, u64) {
    let interval = quota.emission_interval().as_nanos().max(1);
    let window = quota
        .emission_interval()
        .checked_mul(quota.burst())
        .unwrap_or(Duration::MAX);
    let first = ceil_secs(window).max(1);
    let cells = |w: u64| u128::from(w) * 1_000_000_000 / interval;
    let mut best = (cells(first), first);
    for w in first..first.saturating_add(60) {
        let q = cells(w);
        // Within 1 % of the rate: q T >= 0.99 w.
        if q * interval * 100 >= u128::from(w) * 99_000_000_000 {
            best = (q, w);
            break;
        }
        // Else the closest so far: q / w above best.0 / best.1.
        if q * u128::from(best.1) > best.0 * u128::from(w) {
            best = (q, w);
        }
    }
    (u64::try_from(best.0).unwrap_or(u64::MAX), best.1)
}

/// The `RateLimit-Policy` field's name (made at compile time: `from_static` checks a name
/// when it runs).
pub(super) const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field's name.
pub(super) const STATE: HeaderName = HeaderName::from_static("ratelimit");
/// The default refusal body's content type.
pub(super) const TEXT: &str = "text/plain; charset=utf-8";

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) for every
/// limit that applies to this request, and the legacy `X-RateLimit-*` fields of the
/// tightest of them when asked for.
pub(super) fn put_fields<'a, C: Clock>(
    config: &Config<C>,
    limits: impl Iterator<Item = (&'a Limit<C>, &'a Option<ClientKey>)>,
    headers: &mut http::HeaderMap,
) {
    put_states(
        config,
        limits.map(|(limit, key)| {
            let state = key.as_ref().map(|key| limit.store.snapshot(key));
            (limit, state)
        }),
        headers,
    );
}

/// [`put_fields`] from each limit's state, read once by the caller. One limit's items are
/// the prebuilt ones when they fit (`prebuilt.rs`); several are joined.
pub(super) fn put_states<'a, C: Clock>(
    config: &Config<C>,
    mut states: impl Iterator<Item = (&'a Limit<C>, Option<Snapshot>)>,
    headers: &mut http::HeaderMap,
) {
    if let ([_], false) = (config.limits.as_slice(), config.legacy_headers) {
        // One limit, no legacy fields (the usual case): its two items, as they are.
        if let Some((limit, Some(state))) = states.next() {
            let t = ceil_secs(state.until_full());
            let policy = limit.prebuilt.policy(state.quota()).or_else(|| {
                let (q, w) = policy(state.quota());
                HeaderValue::from_str(&policy_item(&limit.field_name, q, w)).ok()
            });
            if let Some(policy) = policy {
                headers.insert(POLICY, policy);
            }
            if let Some(item) = limit.prebuilt.state(state.remaining(), t) {
                headers.insert(STATE, item);
            }
        }
        return;
    }
    let (mut policies, mut items) = (Joined::None, Joined::None);
    // The tightest limit: the fewest cells left, then the longest until full.
    let mut tightest: Option<(u32, u64, u64)> = None;
    for (limit, state) in states {
        let Some(state) = state else { continue };
        let (q, w) = policy(state.quota());
        let t = ceil_secs(state.until_full());
        let text = |s: String| HeaderValue::from_str(&s).ok();
        let policy = limit
            .prebuilt
            .policy(state.quota())
            .or_else(|| text(policy_item(&limit.field_name, q, w)));
        let item = limit.prebuilt.state(state.remaining(), t);
        policies.push(policy);
        items.push(item);
        let candidate = (state.remaining(), t, q);
        let tighter = |&(r, until, _): &(u32, u64, u64)| {
            candidate.0 < r || (candidate.0 == r && candidate.1 > until)
        };
        if tightest.as_ref().is_none_or(tighter) {
            tightest = Some(candidate);
        }
    }
    for (name, values) in [(POLICY, policies), (STATE, items)] {
        if let Some(value) = values.value() {
            headers.insert(name, value);
        }
    }
    if let (true, Some((remaining, reset, limit))) = (config.legacy_headers, tightest) {
        for (name, value) in [
            ("x-ratelimit-limit", limit),
            ("x-ratelimit-remaining", u64::from(remaining)),
            ("x-ratelimit-reset", reset),
        ] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
        }
    }
}

/// A structured-field list being joined: one value is kept as it is (a prebuilt value's
/// clone, no allocation), several are joined with `, `.
enum Joined {
    None,
    One(HeaderValue),
    Many(Vec<u8>),
}

impl Joined {
    fn push(&mut self, value: Option<HeaderValue>) {
        let Some(value) = value else { return };
        *self = match core::mem::replace(self, Joined::None) {
            Joined::None => Joined::One(value),
            Joined::One(first) => {
                let mut joined = first.as_bytes().to_vec();
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(value.as_bytes());
                Joined::Many(joined)
            }
            Joined::Many(mut joined) => {
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(value.as_bytes());
                Joined::Many(joined)
            }
        };
    }

    fn value(self) -> Option<HeaderValue> {
        match self {
            Joined::None => None,
            Joined::One(value) => Some(value),
            Joined::Many(joined) => HeaderValue::from_bytes(&joined).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::policy;
    use crate::Quota;
    use core::time::Duration;

    #[test]
    fn the_policy_is_the_rate_within_a_percent_and_never_above_it() {
        let every = |ms: u64, burst: u32| {
            Quota::try_new(1, Duration::from_millis(ms))
                .unwrap()
                .with_burst(burst)
        };
        assert_eq!(policy(Quota::per_second(2).with_burst(3)), (4, 2));
        assert_eq!(policy(Quota::per_second(100).with_burst(1)), (100, 1));
        assert_eq!(policy(Quota::per_second(50).with_burst(10)), (50, 1));
        assert_eq!(policy(Quota::per_second(2).with_burst(1)), (2, 1));
        assert_eq!(policy(every(700, 1)), (10, 7));
        assert_eq!(policy(Quota::per_minute(1)), (1, 60));
        for (ms, burst) in [
            (700, 1),
            (333, 2),
            (1_234, 1),
            (7, 3),
            (45_000, 1),
            (60_001, 2),
        ] {
            let quota = every(ms, burst);
            let (q, w) = policy(quota);
            let rate = 1000.0 / ms as f64;
            let announced = q as f64 / w as f64;
            assert!(announced <= rate * (1.0 + 1e-12), "{ms} {burst}: {q}/{w}");
            assert!(announced >= rate * 0.95, "{ms} {burst}: {q}/{w}");
        }
    }
}
