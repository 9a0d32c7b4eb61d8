//! One limit of the layer as Python describes it, built (and checked) once: its key
//! source, its shared file, its quota per key, what Python computes per request.

use std::sync::Arc;
use std::time::Duration;

use paceline::http::{self as layer, ClientKey, KeySource, Limit};
use paceline::shared::SharedKeyedLimiter;
use paceline::Quota;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::request::PythonRequest;

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
    let quota = crate::args::quota(count, per, burst)?;
    let options = crate::shared::open_options(mismatch, trust_user, trust_group, Some(name))?;
    let limiter = py
        .detach(|| SharedKeyedLimiter::open_with(&path, quota, capacity, options))
        .map_err(crate::shared::shared_error)?;
    Ok(SharedTable {
        limiter: Arc::new(limiter),
    })
}

/// A tiered limit's key carries its quota: `"{count}/{per in ns}/{burst}\u{1f}{key}"`, or
/// `"\u{1f}{key}"` for the limit's own, made by Python's `quota_for` (so a client whose
/// quota changes starts a bucket of the new one). Python prefixes every key of such a
/// limit, so the client's own text always follows the first `\u{1f}` and never reads as a
/// quota.
pub(super) fn tiered(key: &ClientKey) -> Option<Quota> {
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

pub(super) fn source(spec: &Bound<'_, PyTuple>, id: u64) -> PyResult<KeySource> {
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
    pub(super) id: u64,
    pub(super) limit: Limit,
    /// Kept in a shared file: a decision may wait for another process's claim.
    pub(super) shared: bool,
}

/// Builds one limit from its spec; every check of the Rust layer runs here.
#[pyfunction]
pub(crate) fn build_limit(py: Python<'_>, spec: LimitSpec) -> PyResult<BuiltLimit> {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    // Relaxed: an id only has to be unique.
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let quota = crate::args::quota(spec.count, spec.per, spec.burst)?;
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
    Ok(BuiltLimit {
        id,
        limit,
        shared: spec.table.is_some(),
    })
}
