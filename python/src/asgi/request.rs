//! A request's head as the layer reads it, and what Python computed for it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use paceline::http::{Head, PeerName, WaitWithin};

/// What Python computed for one request, for the limits of the core that asks: keys from
/// functions, costs from functions, and the limits that do not apply, each by the limit's
/// position in `ids` (its [`BuiltLimit::id`]). A limit finds its own by its id, so one
/// built limit serves every core it is part of.
#[derive(Clone)]
pub(super) struct PythonRequest {
    pub(super) ids: Arc<[u64]>,
    pub(super) keys: Option<Vec<Option<String>>>,
    pub(super) costs: Option<Vec<u32>>,
    pub(super) skips: Option<Vec<bool>>,
}

impl PythonRequest {
    /// What Python computed for the limit `id` in `of` (the keys, costs or skips).
    pub(super) fn of<'a, T>(
        head: &'a Head<'_>,
        id: u64,
        of: fn(&Self) -> &Option<Vec<T>>,
    ) -> Option<&'a T> {
        let python = head.extensions().get::<PythonRequest>()?;
        let at = python.ids.iter().position(|&i| i == id)?;
        of(python).as_ref()?.get(at)
    }
}

/// The request's head, as the layer reads it.
pub(super) fn head(
    method: &str,
    path: &str,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    client: Option<(String, u16)>,
    python: Option<PythonRequest>,
    wait_within: Option<f64>,
) -> http::Request<()> {
    let mut request = http::Request::new(());
    if let Ok(method) = http::Method::from_bytes(method.as_bytes()) {
        *request.method_mut() = method;
    }
    if let Ok(uri) = path.parse() {
        *request.uri_mut() = uri;
    }
    let map = request.headers_mut();
    for (name, value) in headers {
        let Ok(name) = http::HeaderName::from_bytes(&name) else {
            continue; // a name no HTTP server accepts: no key is read from it
        };
        // An ASGI app answers in HTTP, never gRPC: a client's gRPC content type must not
        // turn its refusals into gRPC statuses (HTTP 200). It stays a key of its own
        // (`KeySource.header("content-type")`), behind a `0xFF 0xC0` that no other value
        // starts with (`field_value` writes `0xFF` only before `0x80`..`0xA0` or `0xFF`).
        if name == http::header::CONTENT_TYPE && value.starts_with(b"application/grpc") {
            let mut marked = Vec::with_capacity(value.len() + 2);
            marked.extend_from_slice(&[0xff, 0xc0]);
            marked.extend_from_slice(field_value(value).as_bytes());
            map.append(
                name,
                http::HeaderValue::from_bytes(&marked)
                    .unwrap_or(http::HeaderValue::from_static("")),
            );
            continue;
        }
        map.append(name, field_value(value));
    }
    if let Some((host, port)) = client {
        // ASGI writes the client's address as text ("203.0.113.7", "::1"); a host that is
        // not an address (a test client's "testclient") is the client by that name.
        match host.parse::<IpAddr>() {
            Ok(ip) => {
                request.extensions_mut().insert(SocketAddr::new(ip, port));
            }
            Err(_) if !host.is_empty() => {
                request.extensions_mut().insert(PeerName(host.into()));
            }
            Err(_) => {}
        }
    }
    if let Some(python) = python {
        request.extensions_mut().insert(python);
    }
    if let Some(left) = wait_within {
        let left = std::time::Duration::try_from_secs_f64(left.max(0.0)).unwrap_or_default();
        request.extensions_mut().insert(WaitWithin(left));
    }
    request
}

/// A field's value as the http crate holds it. A server may pass bytes the crate refuses
/// (control characters: uvicorn's h11 parser lets some through); dropping the field would
/// drop a proxy's `X-Forwarded-For` with them, and make the client keyless. So each such
/// byte `b` is written as `0xFF` followed by `0x80 | b` (a DEL as `0xFF 0xA0`, a `0xFF` the
/// client sent as `0xFF 0xFF`), and the entries around it are read as they are. The escape is one to one:
/// a value the crate takes and that holds no `0xFF` is kept as it is, every other value
/// comes out holding a `0xFF`, so two values that differ are two keys under
/// `KeySource.header`, never one bucket.
pub(super) fn field_value(value: Vec<u8>) -> http::HeaderValue {
    if !value.contains(&0xff) {
        if let Ok(value) = http::HeaderValue::from_bytes(&value) {
            return value;
        }
    }
    let mut escaped = Vec::with_capacity(value.len() + 8);
    for b in value {
        if b < 0x20 && b != b'\t' {
            escaped.extend_from_slice(&[0xff, 0x80 | b]);
        } else if b == 0x7f {
            escaped.extend_from_slice(&[0xff, 0xa0]);
        } else if b == 0xff {
            escaped.extend_from_slice(&[0xff, 0xff]);
        } else {
            escaped.push(b);
        }
    }
    http::HeaderValue::from_bytes(&escaped).unwrap_or(http::HeaderValue::from_static(""))
}
