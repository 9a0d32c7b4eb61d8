//! The limiters Python holds (`Core`, `KeyedCore`, `SharedCore`, `SharedKeyedCore`),
//! with the methods they share, and their constructors.

use std::sync::Arc;

use crate::args::{count, given, quota, text};
use crate::cells::{took_object, Took};
use crate::pair::Pair;
use crate::ready::{ready, Slow};
use crate::shared::{open_options, shared_error};
use crate::wait::Ticket;
use paceline::shared::{SharedKeyedLimiter, SharedLimiter};
use paceline::{KeyedLimiter, Limiter, TextKey};
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyTuple};

/// The arguments an `acquire` passes on to the Python layer's coroutine, as it was
/// given them (`n` absent: 1), so that it checks them and raises what it raises.
fn slow_args<'py>(
    py: Python<'py>,
    key: Option<&Bound<'py, PyAny>>,
    n: Option<&Bound<'py, PyAny>>,
    timeout: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let n = match n {
        Some(n) => n.clone(),
        None => 1u32.into_pyobject(py)?.into_any(),
    };
    let timeout = timeout.map_or_else(|| py.None().into_bound(py), Bound::clone);
    match key {
        Some(key) => PyTuple::new(py, [key.clone(), n, timeout]),
        None => PyTuple::new(py, [n, timeout]),
    }
}

/// The methods every core has, for a direct (`keyed` absent) or keyed pair.
macro_rules! core_methods {
    (@pymethods $core:ident { $($methods:tt)* }) => {
        #[pymethods]
        impl $core {
            $($methods)*

            /// The burst.
            fn burst(&self) -> u32 {
                self.0.burst()
            }

            fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
                self.0.set_quota(count, per, burst)
            }

            /// Where an `acquire` that must wait goes (`ready.rs`): set once.
            fn bind(&self, method: Py<PyAny>) -> PyResult<()> {
                self.1.bind(method)
            }

            fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
                self.1.traverse(&visit)
            }

            fn __clear__(&self) {
                self.1.clear()
            }
        }
    };
    ($core:ident, direct) => {
        core_methods!(@pymethods $core {
            /// Seconds between cells.
            fn interval(&self) -> f64 {
                self.0.quota().1
            }

            /// `Limiter.try_acquire` itself: `n` checked here as the Python layer does.
            #[pyo3(signature = (n=None))]
            fn try_acquire(
                &self,
                py: Python<'_>,
                #[pyo3(from_py_with = given)] n: Option<Bound<'_, PyAny>>,
            ) -> PyResult<bool> {
                Ok(self.0.try_acquire(py, &(), count(n.as_ref())?)? == Took::Yes)
            }

            /// `Limiter.acquire` itself: `Ready` when the cells are taken now (nobody
            /// waits ahead, they fit), else the Python layer's coroutine, which checks
            /// the arguments and waits a booked turn.
            #[pyo3(signature = (n=None, timeout=None))]
            fn acquire<'py>(
                &self,
                py: Python<'py>,
                #[pyo3(from_py_with = given)] n: Option<Bound<'py, PyAny>>,
                timeout: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let n = n.as_ref();
                if timeout.is_none_or(|t| t.is_none()) {
                    if let Ok(count) = count(n) {
                        if let Ok(true) = self.0.acquire_now(py, &(), count) {
                            return Ok(ready(py)?.into_bound(py));
                        }
                    }
                }
                self.1.call(py, slow_args(py, None, n, timeout)?)
            }

            fn acquire_now(&self, py: Python<'_>, n: u32) -> PyResult<bool> {
                self.0.acquire_now(py, &(), n)
            }

            fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                self.0.stats.report(py)
            }

            fn remaining(&self) -> u32 {
                self.0.remaining(&())
            }

            fn wait_time(&self, n: u32) -> PyResult<f64> {
                self.0.wait_time(&(), n)
            }

            #[pyo3(signature = (n, timeout=None))]
            fn book(&self, py: Python<'_>, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
                self.0.book(py, &(), n, timeout)
            }

            fn run(&self, py: Python<'_>, n: u32) -> PyResult<Option<Ticket>> {
                self.0.run(py, &(), n)
            }

            #[pyo3(signature = (n, timeout=None))]
            fn acquire_blocking(
                &self,
                py: Python<'_>,
                n: u32,
                timeout: Option<f64>,
            ) -> PyResult<()> {
                self.0.acquire_blocking(py, &(), n, timeout)
            }

            fn hold(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
                self.0.hold(py, &(), seconds)
            }

            fn reset(&self) -> PyResult<()> {
                self.0.reset(&())
            }
        });
    };
    ($core:ident, keyed) => {
        core_methods!(@pymethods $core {
            /// True, False, or `TABLE_FULL` (a new key with no room to store it).
            /// `KeyedLimiter.try_acquire` itself: True, False, or `TABLE_FULL` (a new key
            /// with no room to store it); the arguments checked as the Python layer does.
            #[pyo3(signature = (key, n=None))]
            fn try_acquire(
                &self,
                py: Python<'_>,
                key: &Bound<'_, PyAny>,
                #[pyo3(from_py_with = given)] n: Option<Bound<'_, PyAny>>,
            ) -> PyResult<Py<PyAny>> {
                let key = text(key)?;
                let n = count(n.as_ref())?;
                let took = self.0.try_acquire(py, key.to_str()?, n)?;
                took_object(py, took)
            }

            /// `KeyedLimiter.acquire` itself (see the direct cores' `acquire`).
            #[pyo3(signature = (key, n=None, timeout=None))]
            fn acquire<'py>(
                &self,
                py: Python<'py>,
                key: &Bound<'py, PyAny>,
                #[pyo3(from_py_with = given)] n: Option<Bound<'py, PyAny>>,
                timeout: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let n = n.as_ref();
                if timeout.is_none_or(|t| t.is_none()) {
                    if let (Ok(text), Ok(count)) = (text(key), count(n)) {
                        if let Ok(text) = text.to_str() {
                            if let Ok(true) = self.0.acquire_now(py, text, count) {
                                return Ok(ready(py)?.into_bound(py));
                            }
                        }
                    }
                }
                self.1.call(py, slow_args(py, Some(key), n, timeout)?)
            }

            fn acquire_now(&self, py: Python<'_>, key: &str, n: u32) -> PyResult<bool> {
                self.0.acquire_now(py, key, n)
            }

            fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let report = self.0.stats.report(py)?;
                report.set_item("keys", self.len())?;
                Ok(report)
            }

            fn remaining(&self, key: &str) -> u32 {
                self.0.remaining(key)
            }

            fn wait_time(&self, key: &str, n: u32) -> PyResult<f64> {
                self.0.wait_time(key, n)
            }

            #[pyo3(signature = (key, n, timeout=None))]
            fn book(
                &self,
                py: Python<'_>,
                key: &str,
                n: u32,
                timeout: Option<f64>,
            ) -> PyResult<Ticket> {
                self.0.book(py, key, n, timeout)
            }

            fn run(&self, py: Python<'_>, key: &str, n: u32) -> PyResult<Option<Ticket>> {
                self.0.run(py, key, n)
            }

            #[pyo3(signature = (key, n, timeout=None))]
            fn acquire_blocking(
                &self,
                py: Python<'_>,
                key: &str,
                n: u32,
                timeout: Option<f64>,
            ) -> PyResult<()> {
                self.0.acquire_blocking(py, key, n, timeout)
            }

            fn hold(&self, py: Python<'_>, key: &str, seconds: f64) -> PyResult<()> {
                self.0.hold(py, key, seconds)
            }

            fn reset(&self, key: &str) -> PyResult<()> {
                self.0.reset(key)
            }

            fn __len__(&self) -> usize {
                self.len()
            }
        });
    };
}

/// A limiter shared by threads and event loops (see the module docs).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Core(pub(crate) Pair<Limiter>, Slow);
core_methods!(Core, direct);

/// A limiter per key (str), shared by threads and event loops.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct KeyedCore(pub(crate) Pair<KeyedLimiter<TextKey>>, Slow);
core_methods!(KeyedCore, keyed);

impl KeyedCore {
    pub(crate) fn len(&self) -> usize {
        self.0.booked.len()
    }
}

/// A limiter in a file every process of the host maps (`paceline::shared`).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct SharedCore(pub(crate) Pair<SharedLimiter>, Slow);
core_methods!(SharedCore, direct);

/// A limiter per key in a file every process of the host maps.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct SharedKeyedCore(pub(crate) Pair<SharedKeyedLimiter>, Slow);
core_methods!(SharedKeyedCore, keyed);

impl SharedKeyedCore {
    pub(crate) fn len(&self) -> usize {
        self.0.booked.len()
    }
}

/// Makes a core of each kind; module-level functions, since a pyclass takes one
/// `#[pymethods]` block and the methods above are shared by macro.
#[pyfunction]
pub(crate) fn new_core(count: u32, per: f64, burst: u32, execution_bound: bool) -> PyResult<Core> {
    let quota = quota(count, per, burst)?;
    Ok(Core(
        Pair::new(
            Arc::new(Limiter::new(quota)),
            execution_bound.then(|| Arc::new(Limiter::new(quota))),
        ),
        Slow::new(),
    ))
}

#[pyfunction]
#[pyo3(signature = (count, per, burst, execution_bound, max_keys=None))]
pub(crate) fn new_keyed_core(
    count: u32,
    per: f64,
    burst: u32,
    execution_bound: bool,
    max_keys: Option<usize>,
) -> PyResult<KeyedCore> {
    let quota = quota(count, per, burst)?;
    let booked = KeyedLimiter::new(quota);
    if let Some(max) = max_keys {
        booked.set_max_keys(max);
    }
    // A lane: each key hashed once for both cells, and found in the same shard of each.
    let exec = execution_bound.then(|| Arc::new(booked.execution_lane()));
    Ok(KeyedCore(Pair::new(Arc::new(booked), exec), Slow::new()))
}

/// A constructor of a shared core: opens (or makes) the shared file at `path` with
/// `$open` (of the path, the quota and the options, and the constructor's own arguments);
/// the execution cell is the file's second lane, so the bound at the moment work runs
/// holds across the processes too.
macro_rules! shared_core_constructor {
    (
        fn $name:ident($($arg:ident: $ty:ty),*) -> $core:ident
            = |$path:ident, $quota:ident, $options:ident| $open:expr
    ) => {
        #[pyfunction]
        #[pyo3(signature = (
            path, count, per, burst, execution_bound, $($arg,)* mismatch, trust_user=None,
            trust_group=None
        ))]
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(
            py: Python<'_>,
            $path: std::path::PathBuf,
            count: u32,
            per: f64,
            burst: u32,
            execution_bound: bool,
            $($arg: $ty,)*
            mismatch: &str,
            trust_user: Option<u32>,
            trust_group: Option<u32>,
        ) -> PyResult<$core> {
            let $quota = quota(count, per, burst)?;
            let $options = open_options(mismatch, trust_user, trust_group, None)?;
            let booked = py.detach(|| $open).map_err(shared_error)?;
            let exec = execution_bound.then(|| Arc::new(booked.execution_lane()));
            Ok($core(Pair::new(Arc::new(booked), exec), Slow::new()))
        }
    };
}

shared_core_constructor! {
    fn new_shared_core() -> SharedCore
        = |path, quota, options| SharedLimiter::open_with(&path, quota, options)
}

shared_core_constructor! {
    fn new_shared_keyed_core(capacity: u64) -> SharedKeyedCore
        = |path, quota, options| SharedKeyedLimiter::open_with(&path, quota, capacity, options)
}
