//! The IETF `RateLimit-Policy` / `RateLimit` fields and the legacy `X-RateLimit-*` ones.

use super::*;

/// A limit's policy as the `RateLimit-Policy` field writes it: `q` cells per `w` seconds,
/// with `w` the burst window in whole seconds (at least 1) and `q` the cells the
/// sustained rate admits in `w`, rounded down. So `q / w` is never above the real rate and
/// within one cell per window of it (2/s with a burst of 3 is `q=4;w=2`, 100/s with a
/// burst of 1 is `q=100;w=1`); the burst itself is what `r` says when the client is idle.
pub(super) fn policy(quota: Quota) -> (u64, u64) {
    let interval = quota.emission_interval().as_nanos().max(1);
    let window = quota
        .emission_interval()
        .checked_mul(quota.burst())
        .unwrap_or(Duration::MAX);
    let w = ceil_secs(window).max(1);
    let q = u128::from(w) * 1_000_000_000 / interval;
    (u64::try_from(q).unwrap_or(u64::MAX), w)
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
