//! The Rust half of `paceline.asgi`: paceline's tower layer itself, run on each request's
//! head, so a Python server's decisions, keys and header values are the Rust layer's.
//!
//! The layer wraps a service that only answers "passed"; a request's head (method, path,
//! headers, the client address) goes through it, and its answer comes back to Python as
//! what to do: pass (with the fields to add when asked), or send this refusal. In wait
//! mode a request that must wait gets a `Waiting` to await; its waker calls back into the
//! event loop.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use paceline::http::{
    ClientKey, Head, KeySource, Limit, MissingKey, RateLimit, RateLimitLayer, ResponseFuture,
};
use paceline::shared::SharedKeyedLimiter;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use tower_layer::Layer;
use tower_service::Service;

/// The service behind the layer: "passed", marked so a refusal is never mistaken for it.
#[derive(Clone, Copy)]
struct Pass;

/// The mark on a passed request's response.
#[derive(Clone, Copy)]
struct Passed;

type Answer = Ready<Result<http::Response<String>, Infallible>>;

impl Service<http::Request<()>> for Pass {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Answer {
        let mut response = http::Response::new(String::new());
        response.extensions_mut().insert(Passed);
        ready(Ok(response))
    }
}

/// Keys that Python computed for the limits keyed by a callable, by limit index.
#[derive(Clone)]
struct PythonKeys(Arc<[Option<String>]>);

type Pending = Pin<Box<ResponseFuture<Answer, String, Infallible>>>;

/// The content type of the refusals that Python answers itself: the body is then the
/// limit's name and the wait in nanoseconds, for its `RefusalInfo`.
const FOR_PYTHON: &str = "application/x-paceline-refusal";

/// The layer for one middleware (Python's `RateLimitMiddleware`).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct AsgiCore {
    service: RateLimit<Pass>,
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
#[pyo3(signature = (limits, headers_on_success, legacy_headers, wait_up_to, missing, python_refusals, exempt_options=true))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_asgi_core(
    py: Python<'_>,
    limits: Vec<LimitSpec>,
    headers_on_success: bool,
    legacy_headers: bool,
    wait_up_to: Option<f64>,
    missing: Option<String>,
    python_refusals: bool,
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
    if python_refusals {
        layer = layer.refusal_body(http::HeaderValue::from_static(FOR_PYTHON), |info| {
            format!("{}\n{}", info.wait().as_nanos(), info.limit())
        });
    }
    Ok(AsgiCore {
        service: layer.layer(Pass),
    })
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
        // ASGI writes the client's address as text ("203.0.113.7", "::1"); a host that
        // is not an address (a unix socket's path) leaves the request with none.
        if let Ok(ip) = host.parse::<IpAddr>() {
            request.extensions_mut().insert(SocketAddr::new(ip, port));
        }
    }
    if let Some(keys) = keys {
        request.extensions_mut().insert(PythonKeys(keys.into()));
    }
    request
}

/// What Python does with a request: `(True, fields)` to pass it, adding `fields`; or
/// `(False, status, headers, body, refusal)` to answer it so, where `refusal` is
/// `(limit, wait seconds)` when Python writes the refusal itself.
fn outcome<'py>(
    py: Python<'py>,
    response: http::Response<String>,
) -> PyResult<Bound<'py, PyTuple>> {
    let fields: Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                PyBytes::new(py, name.as_str().as_bytes()),
                PyBytes::new(py, value.as_bytes()),
            )
        })
        .collect();
    if response.extensions().get::<Passed>().is_some() {
        return PyTuple::new(
            py,
            [
                true.into_pyobject(py)?.to_owned().into_any(),
                fields.into_pyobject(py)?,
            ],
        );
    }
    let for_python = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|t| t == FOR_PYTHON);
    let status = response.status().as_u16();
    let body = response.into_body();
    let refusal = if for_python {
        let (wait, limit) = body.split_once('\n').unwrap_or(("0", ""));
        let wait = wait.parse::<u64>().unwrap_or(0) as f64 / 1e9;
        Some((limit.to_owned(), wait))
    } else {
        None
    };
    PyTuple::new(
        py,
        [
            false.into_pyobject(py)?.to_owned().into_any(),
            status.into_pyobject(py)?.into_any(),
            fields.into_pyobject(py)?,
            PyBytes::new(py, body.as_bytes()).into_any(),
            refusal.into_pyobject(py)?,
        ],
    )
}

#[pymethods]
impl AsgiCore {
    /// Decides a request: its outcome (see `outcome`), or a `Waiting` to await in wait
    /// mode.
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
        // The layer's service takes `&mut`: a clone per request (two reference counts).
        let mut future: Pending = Box::pin(self.service.clone().call(request));
        let mut cx = Context::from_waker(Waker::noop());
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(response)) => Ok(outcome(py, response)?.into_any()),
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => Ok(Bound::new(
                py,
                Waiting {
                    future: Mutex::new(Some(future)),
                },
            )?
            .into_any()),
        }
    }
}

/// A request waiting its booked turn (wait mode). Dropped or cancelled before its turn,
/// it gives every booking back.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Waiting {
    future: Mutex<Option<Pending>>,
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
    /// Polls the wait: its outcome once the turn came, or None, and `wake` is called
    /// (from any thread) when it should be polled again.
    fn poll<'py>(&self, py: Python<'py>, wake: Py<PyAny>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let mut slot = self.future.lock().unwrap_or_else(|e| e.into_inner());
        let Some(future) = slot.as_mut() else {
            return Err(PyValueError::new_err("this wait is over"));
        };
        let waker = Waker::from(Arc::new(CallBack(wake)));
        let mut cx = Context::from_waker(&waker);
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(response)) => {
                *slot = None;
                Ok(Some(outcome(py, response)?))
            }
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => Ok(None),
        }
    }

    /// Gives every booking back (the client went away).
    fn cancel(&self) {
        let future = self.future.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(future);
    }
}

/// One limit's key source on its own: a request's client key as text, for a limit kept
/// in Redis (`paceline.asgi.Limit(redis=...)`), which Python decides through
/// `paceline.redis`. The key is read as the layer reads it (the peer address grouped by
/// its IPv6 prefix, behind trusted proxies only; a header; one global key); text keys
/// come whole, and Python bounds them with a digest every process computes alike.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct KeyReader {
    source: KeySource,
}

/// A [`KeyReader`] for a key spec as [`LimitSpec`] holds it (not `("callable",)`:
/// Python calls those itself).
#[pyfunction]
pub(crate) fn new_key_reader(spec: &Bound<'_, PyTuple>) -> PyResult<KeyReader> {
    let kind: String = spec.get_item(0)?.extract()?;
    if kind == "callable" {
        return Err(PyValueError::new_err(
            "a key function is called by Python, not read by a KeyReader",
        ));
    }
    Ok(KeyReader {
        source: source(spec, 0)?,
    })
}

#[pymethods]
impl KeyReader {
    /// The request's key as text, or None when it has none.
    fn key(
        &self,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        client: Option<(String, u16)>,
    ) -> Option<String> {
        let request = head("GET", "/", headers, client, None);
        Some(match self.source.key_of(&Head::of(&request))? {
            ClientKey::Ip(ip) => ip.to_string(),
            ClientKey::Text(text) => text.into(),
            ClientKey::Global => "*".to_owned(),
        })
    }
}
