//! An `acquire` that need not wait: the cells are taken in the call itself, and what it
//! returns is [`Ready`], an awaitable that completes at once, so no coroutine, future or
//! task is made. An `acquire` that must wait (or whose arguments the fast path does not
//! take) returns the Python layer's coroutine instead ([`Slow`]).

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyRuntimeError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

/// The awaitable of an `acquire` whose cells were taken in the call: `await` finishes at
/// once with `None`. Stateless, so one object serves every such call, on any thread.
/// It has a coroutine's four methods (`__await__`, `send`, `throw`, `close`), so
/// `asyncio.iscoroutine` holds and `asyncio.create_task` and `asyncio.run` take it.
#[pyclass(frozen, module = "paceline._paceline", name = "Ready")]
pub(crate) struct Ready;

#[pymethods]
impl Ready {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Finished at once: an iterator with nothing to yield (`StopIteration`, value None).
    fn __next__(&self) -> Option<()> {
        None
    }

    fn send(&self, _value: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(PyStopIteration::new_err(()))
    }

    /// What is thrown in raises out, as from a coroutine that has finished its work.
    #[pyo3(signature = (typ, value=None, _traceback=None))]
    fn throw(
        &self,
        typ: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let value = match value {
            Some(value) if !value.is_none() => value.clone(),
            _ if typ.is_instance_of::<PyType>() => typ.call0()?,
            _ => typ.clone(),
        };
        Err(PyErr::from_value(value))
    }

    fn close(&self) {}

    fn __repr__(&self) -> &'static str {
        "<paceline acquired: ready>"
    }
}

/// The one `Ready` object.
static READY: PyOnceLock<Py<Ready>> = PyOnceLock::new();

pub(crate) fn ready(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(READY
        .get_or_try_init(py, || Py::new(py, Ready))?
        .clone_ref(py)
        .into_any())
}

/// Where an `acquire` that must wait goes: the Python limiter's `_acquire` (a bound
/// method, so the limiter itself). Held strongly, so that the core's bound `acquire`
/// alone (`acquire = Limiter(...).acquire`) keeps its limiter alive; the limiter holds
/// the core too, and the garbage collector sees this side of that cycle through the
/// core's `__traverse__` and breaks it with `__clear__` ([`Slow::traverse`],
/// [`Slow::clear`]).
pub(crate) struct Slow(Mutex<Option<Py<PyAny>>>);

impl Slow {
    pub(crate) fn new() -> Slow {
        Slow(Mutex::new(None))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Py<PyAny>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Set once, by the limiter that owns the core.
    pub(crate) fn bind(&self, method: Py<PyAny>) -> PyResult<()> {
        let mut slot = self.lock();
        if slot.is_some() {
            return Err(PyRuntimeError::new_err(
                "this core is bound to its limiter already",
            ));
        }
        *slot = Some(method);
        Ok(())
    }

    /// The coroutine `method(*args)`.
    pub(crate) fn call<'py>(
        &self,
        py: Python<'py>,
        args: Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Cloned out, so that the lock is not held while Python runs.
        let method = self.lock().as_ref().map(|m| m.clone_ref(py));
        match method {
            Some(method) => method.bind(py).call1(args),
            None => Err(PyRuntimeError::new_err("this core has no limiter bound")),
        }
    }

    /// The garbage collector's visit. The lock is only tried: a thread stopped while it
    /// holds it (the free-threaded collector stops them all) would otherwise deadlock
    /// the collection; then the reference goes unvisited, and the cycle waits for a later
    /// collection.
    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(slot) = self.0.try_lock() {
            if let Some(method) = slot.as_ref() {
                visit.call(method)?;
            }
        }
        Ok(())
    }

    /// Breaks the cycle (the collector's `__clear__`).
    pub(crate) fn clear(&self) {
        let method = self.lock().take();
        drop(method);
    }
}
