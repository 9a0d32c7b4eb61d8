//! The Rust half of `paceline.asgi`: paceline's HTTP layer itself, deciding each ASGI
//! request from its head ([`RateLimitLayer::decide`]), so a Python server's decisions, keys
//! and header values are the Rust layer's.
//!
//! A request's head (method, path, headers, the client's address or name) goes to the
//! layer; the decision comes back to Python as a typed outcome: [`Admitted`] (with the
//! fields to add), [`Refused`] (the response to send, and why), or a [`Waiting`] to await
//! in wait mode, whose waker calls back into the event loop. The GIL is let go while the
//! layer decides: storing a new client in a shared file may wait for another process.

mod limit;
mod outcome;
mod request;

pub(crate) use limit::{
    build_limit, check_key_source, check_limit_name, open_shared_table, parse_rates, BuiltLimit,
    SharedTable,
};
pub(crate) use outcome::{Admitted, Refused, Waiting};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use paceline::http::{ClientKey, Decision, Head, KeySource, MissingKey, RateLimitLayer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use limit::source;
use outcome::{admitted, refused};
use request::{head, PythonRequest};

/// The layer for one middleware (Python's `RateLimitMiddleware`, or a `RouteLimit`).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct AsgiCore {
    layer: RateLimitLayer,
    /// Its limits' ids, in order ([`PythonRequest`]).
    ids: Arc<[u64]>,
    /// Some limit is kept in a shared file: the GIL is let go while deciding.
    shared: bool,
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
    let shared = limits.iter().any(|built| built.shared);
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
    Ok(AsgiCore { layer, ids, shared })
}

#[pymethods]
impl AsgiCore {
    /// Decides a request: `Admitted`, `Refused`, or a `Waiting` to await in wait mode.
    /// `keys`, `costs` and `skips` are what Python computed, by limit index.
    #[pyo3(signature = (method, path, headers, client, keys=None, costs=None, skips=None, wait_within=None))]
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
        wait_within: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let python =
            (keys.is_some() || costs.is_some() || skips.is_some()).then(|| PythonRequest {
                ids: Arc::clone(&self.ids),
                keys,
                costs,
                skips,
            });
        let request = head(method, path, headers, client, python, wait_within);
        // With a shared file, the GIL let go: storing a new client there may wait
        // (briefly) for another process's claim of its bucket. In memory a decision never
        // waits, and letting the GIL go would cost more than the decision.
        let head = Head::of(&request);
        let decision = if self.shared {
            py.detach(|| self.layer.decide::<Bytes>(&head))
        } else {
            self.layer.decide::<Bytes>(&head)
        };
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
        let request = head("GET", "/", headers, client, None, None);
        Some(match self.source.key_of(&Head::of(&request))? {
            ClientKey::Ip(ip) => ip.to_string(),
            ClientKey::Text(text) => text.into(),
            ClientKey::Global => "*".to_owned(),
        })
    }
}
