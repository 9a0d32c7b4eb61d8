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

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) for every
/// limit that applies to this request, and the legacy `X-RateLimit-*` fields of the
/// tightest of them when asked for.
pub(super) fn put_fields<'a, C: Clock>(
    config: &Config<C>,
    limits: impl Iterator<Item = (&'a Limit<C>, &'a Option<ClientKey>)>,
    headers: &mut http::HeaderMap,
) {
    let mut policies = Vec::new();
    let mut states = Vec::new();
    // The tightest limit: the fewest cells left, then the longest until full.
    let mut tightest: Option<(u32, u64, u64)> = None;
    for (limit, key) in limits {
        let Some(key) = key else { continue };
        let state: Snapshot = limit.limiter.snapshot_key(key);
        let (q, w) = policy(state.quota());
        let t = ceil_secs(state.until_full());
        policies.push(format!("{};q={q};w={w}", limit.field_name));
        states.push(format!(
            "{};r={};t={t}",
            limit.field_name,
            state.remaining()
        ));
        let candidate = (state.remaining(), t, q);
        let tighter = |&(r, until, _): &(u32, u64, u64)| {
            candidate.0 < r || (candidate.0 == r && candidate.1 > until)
        };
        if tightest.as_ref().is_none_or(tighter) {
            tightest = Some(candidate);
        }
    }
    for (name, items) in [("ratelimit-policy", policies), ("ratelimit", states)] {
        if let Ok(value) = HeaderValue::from_str(&items.join(", ")) {
            if !items.is_empty() {
                headers.insert(HeaderName::from_static(name), value);
            }
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
