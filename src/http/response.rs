//! Refusals: `429` (or gRPC `RESOURCE_EXHAUSTED`) with `Retry-After` from the longest
//! wait, the `503` of a key table with no room for a new client, and the `500` of a server
//! that passes no peer address.

use super::*;

/// The limit that will admit the request last, and when: a request needs every limit,
/// so a client told less than the longest wait among them would be refused again. Reads
/// each limit's state (`states`, read after the request's own cells were given back).
pub(super) fn longest_wait(states: &[Option<Snapshot>], refused: RefusedBy) -> RefusedBy {
    if let [Some(state)] = states {
        // One limit: the state read is the refusal's own, but a request of several cells
        // (`Limit::cost`) waits for all of them, longer than for the next one.
        return RefusedBy {
            limit: 0,
            wait: state.until_next().max(refused.wait),
            table_full: false,
        };
    }
    states
        .iter()
        .enumerate()
        .filter_map(|(i, state)| {
            Some(RefusedBy {
                limit: i,
                wait: state.as_ref()?.until_next(),
                table_full: false,
            })
        })
        .fold(refused, |longest, other| {
            if other.wait > longest.wait {
                other
            } else {
                longest
            }
        })
}

/// Whole seconds, rounded up: a client told this never retries before its turn.
pub(super) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

pub(super) fn plain_refusal<R: RefusalBody>(why: &NoKey) -> Response<R> {
    let (status, text) = match why {
        NoKey::Refuse(status) => (*status, format!("{status}\n")),
        NoKey::NoPeerAddress(limit) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            no_peer_address_message(limit),
        ),
        NoKey::Unaffordable { limit, cost, burst } => (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "Too Many Requests: this request costs {cost} cells of limit \"{limit}\", more \
                 than its burst of {burst}: it can never be admitted\n"
            ),
        ),
    };
    let mut response = Response::new(R::from_text(text));
    *response.status_mut() = status;
    response
}

/// Each limit's state for the request's key in it (`None` where the limit does not apply).
pub(super) fn states<C: Clock>(
    config: &Config<C>,
    keys: &[Option<ClientKey>],
) -> Vec<Option<Snapshot>> {
    config
        .limits
        .iter()
        .zip(keys)
        .map(|(limit, key)| key.as_ref().map(|key| limit.store.snapshot(key)))
        .collect()
}

/// Whether the request speaks gRPC (its refusal is then a `RESOURCE_EXHAUSTED` trailer
/// set, not a 429).
#[inline]
pub(super) fn grpc(head: &Head<'_>) -> bool {
    head.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The limit whose cached refusals fit the layer's refusals, if any: its only limit, with
/// the default body and no legacy fields (and the request not gRPC: [`grpc`]).
#[inline]
pub(super) fn usual_limit<C: Clock>(config: &Config<C>) -> Option<&Prebuilt> {
    match (
        config.limits.as_slice(),
        &config.body,
        config.legacy_headers,
    ) {
        ([limit], None, false) => Some(&limit.prebuilt),
        _ => None,
    }
}

/// The 429 (or gRPC `RESOURCE_EXHAUSTED`) for a refused request. Each limit's state is
/// read once, for the wait and the fields; the headers and the default body come
/// prebuilt when they fit (`prebuilt.rs`).
pub(super) fn refusal<C: Clock, R: RefusalBody>(
    config: &Config<C>,
    states: &[Option<Snapshot>],
    grpc: bool,
    refused: RefusedBy,
) -> Response<R> {
    if refused.table_full {
        return unavailable(config, grpc, refused);
    }
    if let [Some(state)] = states {
        // Prebuilt for a wait until the next cell; a costlier request waits longer.
        let one_cell = refused.wait <= state.until_next();
        if let Some(cached) = usual_limit(config).and_then(|p| p.none_left(state)) {
            if !grpc && one_cell {
                return cached.response();
            }
        }
    }
    let refused = longest_wait(states, refused);
    let retry_after = ceil_secs(refused.wait).max(1);
    let limit = &config.limits[refused.limit];
    let name = &limit.name;
    let mut response = if grpc {
        let mut response = Response::new(R::from_text(String::new()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(
            HeaderName::from_static("grpc-status"),
            HeaderValue::from_static("8"),
        );
        if let Ok(message) =
            HeaderValue::from_str(&format!("rate limited by {name}: retry in {retry_after} s"))
        {
            headers.insert(HeaderName::from_static("grpc-message"), message);
        }
        response
    } else {
        let (content_type, body) = match &config.body {
            Some((content_type, body)) => {
                let info = RefusalInfo {
                    limit: name,
                    wait: refused.wait,
                };
                (content_type.clone(), R::from_text(body(&info)))
            }
            None => (
                HeaderValue::from_static(TEXT),
                R::from_bytes(limit.prebuilt.body(retry_after)),
            ),
        };
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(CONTENT_TYPE, content_type);
        response
    };
    response
        .headers_mut()
        .insert(RETRY_AFTER, limit.prebuilt.retry_after(retry_after));
    put_states(
        config,
        config.limits.iter().zip(states.iter().copied()),
        response.headers_mut(),
    );
    response
}

/// The answer to a request a limit's key table had no room to track
/// ([`TableFull::Unavailable`]): `503` (gRPC `UNAVAILABLE`) with `Retry-After`, and no
/// `RateLimit` field, which would tell the client it spent a quota it never touched.
fn unavailable<C: Clock, R: RefusalBody>(
    config: &Config<C>,
    grpc: bool,
    refused: RefusedBy,
) -> Response<R> {
    let retry_after = ceil_secs(refused.wait).max(1);
    let name = &config.limits[refused.limit].name;
    let text = format!(
        "limit \"{name}\" is tracking as many clients as it has room for: retry in {retry_after} s"
    );
    let mut response = if grpc {
        let mut response = Response::new(R::from_text(String::new()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(
            HeaderName::from_static("grpc-status"),
            HeaderValue::from_static("14"),
        );
        if let Ok(message) = HeaderValue::from_str(&text) {
            headers.insert(HeaderName::from_static("grpc-message"), message);
        }
        response
    } else {
        let mut response = Response::new(R::from_text(format!("Service Unavailable: {text}\n")));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
        response
    };
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

#[cfg(test)]
mod tests {
    use super::ceil_secs;
    use core::time::Duration;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::from_millis(900)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_nanos(2_000_000_001)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }
}
