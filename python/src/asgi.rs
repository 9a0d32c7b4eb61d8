//! The Rust half of `paceline.asgi`: paceline's HTTP layer itself, deciding each ASGI
//! request from its head ([`RateLimitLayer::decide`]), so a Python server's decisions, keys
//! and header values are the Rust layer's.
//!
//! A request's head (method, path, headers, the client's address or name) goes to the
//! layer; the decision comes back to Python as a typed outcome: [`Admitted`] (with the
//! fields to add), [`Refused`] (the response to send, and why), or a [`Waiting`] to await
//! in wait mode, whose waker calls back into the event loop. The GIL is let go while the
//! layer decides: storing a new client in a shared file may wait for another process.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use paceline::http::{
    self as layer, ClientKey, Decision, Head, KeySource, Limit, MissingKey, PeerName,
    RateLimitLayer,
};
use paceline::shared::SharedKeyedLimiter;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

/// Keys that Python computed for the limits keyed by a callable, by limit index.
#[derive(Clone)]
struct PythonKeys(Arc<[Option<String>]>);

/// The layer for one middleware (Python's `RateLimitMiddleware`, or a `RouteLimit`).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct AsgiCore {
    layer: RateLimitLayer,
}

/// One limit as Python describes it (`Limit._spec()`): its name, quota (count, per,
/// burst), key spec, `max_keys`, and store: a shared file's path, key capacity,
/// `on_mismatch` and the user and group trusted, or None for an in-process limit. A key spec is `("peer", prefix)`,
/// `("proxies", [networks], forwarded, prefix)`, `("header", name)`, `("global",)` or
/// `("callable",)`.
#[derive(FromPyObject)]
pub(crate) struct LimitSpec(
    String,
    u32,
    f64,
    u32,
    Py<PyTuple>,
    Option<usize>,
    Option<SharedSpec>,
);

/// A shared limit's file: path, capacity, `on_mismatch`, trusted user and group.
type SharedSpec = (std::path::PathBuf, u64, String, Option<u32>, Option<u32>);

fn source(spec: &Bound<'_, PyTuple>, index: usize) -> PyResult<KeySource> {
    let kind: String = spec.get_item(0)?.extract()?;
    let bad = |what: String| PyValueError::new_err(what);
    Ok(match kind.as_str() {
        "peer" => KeySource::peer_ip().ipv6_prefix(spec.get_item(1)?.extract()?),
        "proxies" => {
            let networks: Vec<String> = spec.get_item(1)?.extract()?;
            let networks = networks
                .iter()
                .map(|n| {
                    n.parse()
                        .map_err(|e| bad(format!("a trusted proxy network {n:?}: {e}")))
                })
                .collect::<PyResult<Vec<_>>>()?;
            let mut source =
                KeySource::behind_proxies(networks).ipv6_prefix(spec.get_item(3)?.extract()?);
            if spec.get_item(2)?.extract::<bool>()? {
                source = source.forwarded_header();
            }
            source
        }
        "header" => {
            let name: String = spec.get_item(1)?.extract()?;
            let name = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|_| bad(format!("{name:?} is not a header name")))?;
            KeySource::header(name)
        }
        "global" => KeySource::global(),
        "callable" => KeySource::from_fn(move |head| {
            let keys = head.extensions().get::<PythonKeys>()?;
            let key = keys.0.get(index)?.as_ref()?;
            Some(ClientKey::Text(key.as_str().into()))
        }),
        other => return Err(bad(format!("unknown key source {other:?}"))),
    })
}

#[pyfunction]
#[pyo3(signature = (limits, headers_on_success, legacy_headers, wait_up_to, missing, exempt_options=true))]
pub(crate) fn new_asgi_core(
    py: Python<'_>,
    limits: Vec<LimitSpec>,
    headers_on_success: bool,
    legacy_headers: bool,
    wait_up_to: Option<f64>,
    missing: Option<String>,
    exempt_options: bool,
) -> PyResult<AsgiCore> {
    if limits.is_empty() {
        return Err(PyValueError::new_err(
            "a RateLimitMiddleware needs at least one limit",
        ));
    }
    let mut layer = RateLimitLayer::new()
        .headers_on_success(headers_on_success)
        .legacy_headers(legacy_headers);
    for (i, LimitSpec(name, count, per, burst, key, max_keys, shared)) in limits.iter().enumerate()
    {
        let quota = crate::quota(*count, *per, *burst)?;
        let source = source(key.bind(py), i)?;
        let limit = match shared {
            None => {
                let limit = Limit::try_new(name, quota, source)
                    .map_err(|e| PyValueError::new_err(e.to_string()))?;
                match *max_keys {
                    Some(max) => limit.with_max_keys(max),
                    None => limit,
                }
            }
            Some((path, capacity, mismatch, trust_user, trust_group)) => {
                // The file holds this limit, by name: another limit on the same path is an
                // error, never a second limit sharing its buckets.
                let options =
                    crate::open_options(mismatch, *trust_user, *trust_group, Some(name.clone()))?;
                let opened = py
                    .detach(|| SharedKeyedLimiter::open_with(path, quota, *capacity, options))
                    .map_err(crate::shared_error)?;
                Limit::shared(name, opened, source)
                    .map_err(|e| PyValueError::new_err(e.to_string()))?
            }
        };
        layer = layer.limit(limit);
    }
    if !exempt_options {
        // Python decides what is exempt (its `exempt` callable) before it asks the layer.
        layer = layer.exempt(|_| false);
    }
    if let Some(max) = wait_up_to {
        let max = Duration::try_from_secs_f64(max).map_err(|_| {
            PyValueError::new_err(format!("wait_up_to must be seconds >= 0, got {max}"))
        })?;
        layer = layer.wait_up_to(max);
    }
    layer = match missing.as_deref() {
        None => layer,
        Some("shared") => layer.on_missing_key(MissingKey::Shared),
        Some("skip") => layer.on_missing_key(MissingKey::Skip),
        Some(other) => match other
            .parse::<u16>()
            .ok()
            .and_then(|s| http::StatusCode::from_u16(s).ok())
        {
            Some(status) => layer.on_missing_key(MissingKey::Refuse(status)),
            None => {
                return Err(PyValueError::new_err(format!(
                    "on_missing_key must be \"shared\", \"skip\" or an HTTP status, got {other:?}"
                )))
            }
        },
    };
    Ok(AsgiCore { layer })
}

/// The request's head, as the layer reads it.
fn head(
    method: &str,
    path: &str,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    client: Option<(String, u16)>,
    keys: Option<Vec<Option<String>>>,
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
        // A field the http crate cannot hold is not one a key is read from.
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(&name),
            http::HeaderValue::from_bytes(&value),
        ) {
            map.append(name, value);
        }
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
    if let Some(keys) = keys {
        request.extensions_mut().insert(PythonKeys(keys.into()));
    }
    request
}

/// ASGI `(name, value)` byte pairs of a header map.
fn pairs(py: Python<'_>, headers: &http::HeaderMap) -> Vec<(Py<PyBytes>, Py<PyBytes>)> {
    headers
        .iter()
        .map(|(name, value)| {
            (
                PyBytes::new(py, name.as_str().as_bytes()).unbind(),
                PyBytes::new(py, value.as_bytes()).unbind(),
            )
        })
        .collect()
}

/// A request the layer admitted: `fields`, the `(name, value)` pairs to add to its
/// response (empty unless the middleware adds them to responses that passed).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Admitted {
    #[pyo3(get)]
    fields: Vec<(Py<PyBytes>, Py<PyBytes>)>,
}

/// A request the layer refused: the response to send (`status`, `headers` as ASGI pairs,
/// `body`), the `limit` that admits it last and the `wait` in seconds until it would (None
/// and 0.0 for a request without a key), and whether a key table had no room for the
/// client (`table_full`: a 503, not a spent quota).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Refused {
    #[pyo3(get)]
    status: u16,
    #[pyo3(get)]
    headers: Vec<(Py<PyBytes>, Py<PyBytes>)>,
    #[pyo3(get)]
    body: Py<PyBytes>,
    #[pyo3(get)]
    limit: Option<String>,
    #[pyo3(get)]
    wait: f64,
    #[pyo3(get)]
    table_full: bool,
}

fn admitted(py: Python<'_>, admitted: layer::Admitted) -> Admitted {
    Admitted {
        fields: admitted
            .fields()
            .map_or_else(Vec::new, |fields| pairs(py, fields)),
    }
}

fn refused(py: Python<'_>, refused: layer::Refused<Bytes>) -> Refused {
    let (limit, wait, table_full) = (
        refused.limit().map(str::to_owned),
        refused.wait().as_secs_f64(),
        refused.is_table_full(),
    );
    let response = refused.into_response();
    Refused {
        status: response.status().as_u16(),
        headers: pairs(py, response.headers()),
        body: PyBytes::new(py, response.body()).unbind(),
        limit,
        wait,
        table_full,
    }
}

#[pymethods]
impl AsgiCore {
    /// Decides a request: `Admitted`, `Refused`, or a `Waiting` to await in wait mode.
    #[pyo3(signature = (method, path, headers, client, keys=None))]
    fn check<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        path: &str,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        client: Option<(String, u16)>,
        keys: Option<Vec<Option<String>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = head(method, path, headers, client, keys);
        // The GIL let go: storing a new client in a shared file may wait (briefly) for
        // another process's claim of its bucket.
        let decision = py.detach(|| self.layer.decide::<Bytes>(&Head::of(&request)));
        Ok(match decision {
            Decision::Admit(a) => Bound::new(py, admitted(py, a))?.into_any(),
            Decision::Refuse(r) => Bound::new(py, refused(py, r))?.into_any(),
            Decision::Wait(waiting) => Bound::new(
                py,
                Waiting {
                    future: Mutex::new(Some(Box::pin(waiting))),
                },
            )?
            .into_any(),
        })
    }
}

/// A request waiting its booked turn (wait mode). Dropped or cancelled before its turn,
/// it gives every booking back.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Waiting {
    future: Mutex<Option<std::pin::Pin<Box<layer::Waiting<Bytes>>>>>,
}

/// Calls a Python callable when woken (from whichever thread wakes it).
struct CallBack(Py<PyAny>);

impl Wake for CallBack {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        Python::attach(|py| {
            // A loop closed meanwhile: the waiter is gone too.
            let _ = self.0.call0(py);
        });
    }
}

#[pymethods]
impl Waiting {
    /// Polls the wait: its outcome (`Admitted` or `Refused`) once the turn came, or None,
    /// and `wake` is called (from any thread) when it should be polled again.
    fn poll<'py>(&self, py: Python<'py>, wake: Py<PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut slot = self.future.lock().unwrap_or_else(|e| e.into_inner());
        let Some(future) = slot.as_mut() else {
            return Err(PyValueError::new_err("this wait is over"));
        };
        let waker = Waker::from(Arc::new(CallBack(wake)));
        let mut cx = Context::from_waker(&waker);
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(outcome) => {
                *slot = None;
                Ok(Some(match outcome {
                    Ok(a) => Bound::new(py, admitted(py, a))?.into_any(),
                    Err(r) => Bound::new(py, refused(py, r))?.into_any(),
                }))
            }
            Poll::Pending => Ok(None),
        }
    }

    /// Gives every booking back (the client went away).
    fn cancel(&self) {
        let future = self.future.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(future);
    }
}
