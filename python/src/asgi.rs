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
use paceline::Quota;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

/// What Python computed for one request, for the limits of the core that asks: keys from
/// functions, costs from functions, and the limits that do not apply, each by the limit's
/// position in `ids` (its [`BuiltLimit::id`]). A limit finds its own by its id, so one
/// built limit serves every core it is part of.
#[derive(Clone)]
struct PythonRequest {
    ids: Arc<[u64]>,
    keys: Option<Vec<Option<String>>>,
    costs: Option<Vec<u32>>,
    skips: Option<Vec<bool>>,
}

impl PythonRequest {
    /// What Python computed for the limit `id` in `of` (the keys, costs or skips).
    fn of<'a, T>(head: &'a Head<'_>, id: u64, of: fn(&Self) -> &Option<Vec<T>>) -> Option<&'a T> {
        let python = head.extensions().get::<PythonRequest>()?;
        let at = python.ids.iter().position(|&i| i == id)?;
        of(python).as_ref()?.get(at)
    }
}

/// The layer for one middleware (Python's `RateLimitMiddleware`, or a `RouteLimit`).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct AsgiCore {
    layer: RateLimitLayer,
    /// Its limits' ids, in order ([`PythonRequest`]).
    ids: Arc<[u64]>,
}

/// One limit of the layer as Python describes it (`paceline.asgi._Spec`, made by
/// `Limit`): its name, quota, key source, key bound or shared file, what a request costs,
/// which methods it applies to, and what Python decides per request.
///
/// A key spec is `("peer", prefix)`, `("proxies", [networks], forwarded, prefix)`,
/// `("header", name)`, `("global",)` or `("callable",)` (Python computes the key).
#[derive(FromPyObject)]
pub(crate) struct LimitSpec {
    #[pyo3(attribute)]
    name: String,
    #[pyo3(attribute)]
    count: u32,
    #[pyo3(attribute)]
    per: f64,
    #[pyo3(attribute)]
    burst: u32,
    #[pyo3(attribute)]
    key: Py<PyTuple>,
    #[pyo3(attribute)]
    max_keys: Option<usize>,
    #[pyo3(attribute)]
    table: Option<Py<SharedTable>>,
    /// A fixed cost; `None`: Python computes each request's (`PythonCosts`).
    #[pyo3(attribute)]
    cost: Option<u32>,
    /// The methods it applies to (upper case); `None`: all.
    #[pyo3(attribute)]
    methods: Option<Vec<String>>,
    /// Whether Python says per request whether it applies (`PythonSkips`).
    #[pyo3(attribute)]
    python_when: bool,
    /// Whether keys carry their own quota (`quota_for`: see [`tiered`]).
    #[pyo3(attribute)]
    tiered: bool,
    #[pyo3(attribute)]
    admit_when_full: bool,
}

/// A shared file of one limit, opened (when the `Limit` is made, so a bad file fails at
/// start-up): `paceline.asgi.Limit(..., shared=path)`.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct SharedTable {
    limiter: Arc<SharedKeyedLimiter>,
}

#[pymethods]
impl SharedTable {
    /// Whether the file's path still leads to the file this process has open.
    fn is_current(&self) -> bool {
        self.limiter.is_current()
    }

    /// Keys stored in the file.
    fn __len__(&self) -> usize {
        self.limiter.len()
    }
}

/// Opens one limit's shared file (see [`SharedTable`]); the file holds that limit, by
/// name: another limit on the same path is an error, never a second limit sharing its
/// buckets.
#[pyfunction]
#[pyo3(signature = (path, name, count, per, burst, capacity, mismatch, trust_user=None, trust_group=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_shared_table(
    py: Python<'_>,
    path: std::path::PathBuf,
    name: String,
    count: u32,
    per: f64,
    burst: u32,
    capacity: u64,
    mismatch: &str,
    trust_user: Option<u32>,
    trust_group: Option<u32>,
) -> PyResult<SharedTable> {
    let quota = crate::quota(count, per, burst)?;
    let options = crate::open_options(mismatch, trust_user, trust_group, Some(name))?;
    let limiter = py
        .detach(|| SharedKeyedLimiter::open_with(&path, quota, capacity, options))
        .map_err(crate::shared_error)?;
    Ok(SharedTable {
        limiter: Arc::new(limiter),
    })
}

/// A tiered limit's key carries its quota: `"{count}/{per in ns}/{burst}\u{1f}{key}"`, or
/// `"\u{1f}{key}"` for the limit's own, made by Python's `quota_for` (so a client whose
/// quota changes starts a bucket of the new one). Python prefixes every key of such a
/// limit, so the client's own text always follows the first `\u{1f}` and never reads as a
/// quota.
fn tiered(key: &ClientKey) -> Option<Quota> {
    let ClientKey::Text(text) = key else {
        return None;
    };
    let (quota, _) = text.split_once('\u{1f}')?;
    if quota.is_empty() {
        return None;
    }
    let mut parts = quota.splitn(3, '/').map(str::parse::<u64>);
    let (Some(Ok(count)), Some(Ok(per)), Some(Ok(burst))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let (count, burst) = (u32::try_from(count).ok()?, u32::try_from(burst).ok()?);
    Quota::try_new(count, Duration::from_nanos(per))
        .and_then(|q| q.try_with_burst(burst))
        .ok()
}

/// Checks a limit name as the layer would, for `Limit(...)` (which fails at import).
#[pyfunction]
pub(crate) fn check_limit_name(name: &str) -> PyResult<()> {
    Limit::try_new(name, Quota::per_second(1), KeySource::global())
        .map(drop)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Checks a key spec as the layer would, for `KeySource` (which fails at import).
#[pyfunction]
pub(crate) fn check_key_source(spec: &Bound<'_, PyTuple>) -> PyResult<()> {
    source(spec, 0).map(drop)
}

/// A rate as text (`"10/second"`, `"100 per 2 hours"`; several separated by `;` or `,`):
/// each as `(count, per seconds, burst)`, or a `ValueError` naming the part that is not a
/// rate.
#[pyfunction]
pub(crate) fn parse_rates(text: &str) -> PyResult<Vec<(u32, f64, u32)>> {
    let parts: Vec<&str> = text
        .split([';', ','])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{text:?} is not a rate: write one as \"10/second\" or \"100 per 2 hours\""
        )));
    }
    parts
        .into_iter()
        .map(|part| {
            let quota: Quota = part
                .parse()
                .map_err(|e| PyValueError::new_err(format!("{part:?}: {e}")))?;
            let count = quota.burst();
            let per = quota.emission_interval().as_secs_f64() * f64::from(count);
            Ok((count, per, count))
        })
        .collect()
}

fn source(spec: &Bound<'_, PyTuple>, id: u64) -> PyResult<KeySource> {
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
            let key = PythonRequest::of(head, id, |p| &p.keys)?.as_ref()?;
            Some(ClientKey::Text(key.as_str().into()))
        }),
        other => return Err(bad(format!("unknown key source {other:?}"))),
    })
}

/// One limit of the layer, built once (when Python's `Limit` is made, so a bad one fails
/// where it is written) and shared by every core it is part of: its keys' counts live in
/// it, so rebuilding a core keeps them.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct BuiltLimit {
    id: u64,
    limit: Limit,
}

/// Builds one limit from its spec; every check of the Rust layer runs here.
#[pyfunction]
pub(crate) fn build_limit(py: Python<'_>, spec: LimitSpec) -> PyResult<BuiltLimit> {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    // Relaxed: an id only has to be unique.
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let quota = crate::quota(spec.count, spec.per, spec.burst)?;
    let source = source(spec.key.bind(py), id)?;
    let invalid = |e: layer::InvalidLimitName| PyValueError::new_err(e.to_string());
    let mut limit = match &spec.table {
        None => {
            let limit = Limit::try_new(&spec.name, quota, source).map_err(invalid)?;
            match spec.max_keys {
                Some(max) => limit.with_max_keys(max),
                None => limit,
            }
        }
        Some(table) => {
            Limit::shared(&spec.name, Arc::clone(&table.get().limiter), source).map_err(invalid)?
        }
    };
    limit = match spec.cost {
        Some(n) => limit.cost(n),
        None => limit.cost_fn(move |head| {
            PythonRequest::of(head, id, |p| &p.costs)
                .copied()
                .unwrap_or(1)
        }),
    };
    let methods: Option<Vec<http::Method>> = spec
        .methods
        .as_ref()
        .map(|names| {
            names
                .iter()
                .map(|m| {
                    http::Method::from_bytes(m.as_bytes())
                        .map_err(|_| PyValueError::new_err(format!("{m:?} is not a method")))
                })
                .collect()
        })
        .transpose()?;
    let python_when = spec.python_when;
    if methods.is_some() || python_when {
        limit = limit.only_when(move |head| {
            let method = methods.as_ref().is_none_or(|m| m.contains(head.method()));
            let skipped = python_when
                && PythonRequest::of(head, id, |p| &p.skips)
                    .copied()
                    .unwrap_or(false);
            method && !skipped
        });
    }
    if spec.tiered {
        limit = limit.quota_for(tiered);
    }
    if spec.admit_when_full {
        limit = limit.when_table_full(layer::TableFull::Admit);
    }
    Ok(BuiltLimit { id, limit })
}

#[pyfunction]
#[pyo3(signature = (limits, headers_on_success, legacy_headers, wait_up_to, missing, exempt_options=true))]
pub(crate) fn new_asgi_core(
    limits: Vec<PyRef<'_, BuiltLimit>>,
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
    for built in &limits {
        layer = layer.limit(built.limit.clone());
    }
    let ids: Arc<[u64]> = limits.iter().map(|built| built.id).collect();
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
    Ok(AsgiCore { layer, ids })
}

/// The request's head, as the layer reads it.
fn head(
    method: &str,
    path: &str,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    client: Option<(String, u16)>,
    python: Option<PythonRequest>,
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
        // turn its refusals into gRPC statuses (HTTP 200).
        if name == http::header::CONTENT_TYPE && value.starts_with(b"application/grpc") {
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
    request
}

/// A field's value as the http crate holds it. A server may pass bytes the crate refuses
/// (control characters: uvicorn's h11 parser lets some through); dropping the field would
/// drop a proxy's `X-Forwarded-For` with them, and make the client keyless. So each such
/// byte reads as `?`, and the entries around it are read as they are.
fn field_value(value: Vec<u8>) -> http::HeaderValue {
    match http::HeaderValue::from_bytes(&value) {
        Ok(value) => value,
        Err(_) => {
            let clean: Vec<u8> = value
                .into_iter()
                .map(|b| {
                    if (b < 0x20 && b != b'\t') || b == 0x7f {
                        b'?'
                    } else {
                        b
                    }
                })
                .collect();
            http::HeaderValue::from_bytes(&clean).unwrap_or(http::HeaderValue::from_static(""))
        }
    }
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
    /// `keys`, `costs` and `skips` are what Python computed, by limit index.
    #[pyo3(signature = (method, path, headers, client, keys=None, costs=None, skips=None))]
    #[allow(clippy::too_many_arguments)]
    fn check<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        path: &str,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        client: Option<(String, u16)>,
        keys: Option<Vec<Option<String>>>,
        costs: Option<Vec<u32>>,
        skips: Option<Vec<bool>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let python =
            (keys.is_some() || costs.is_some() || skips.is_some()).then(|| PythonRequest {
                ids: Arc::clone(&self.ids),
                keys,
                costs,
                skips,
            });
        let request = head(method, path, headers, client, python);
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
