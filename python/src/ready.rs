//! An `acquire` that need not wait: the cells are taken in the call itself, and what it
//! returns is [`Ready`], an awaitable that completes at once, so no coroutine, future or
//! task is made. An `acquire` that must wait (or whose arguments the fast path does not
//! take) returns the Python layer's coroutine instead ([`Slow`]).

use pyo3::exceptions::{PyRuntimeError, PyStopIteration};
use pyo3::prelude::*;
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

/// Where an `acquire` that must wait goes: the Python limiter's coroutine method, held
/// as a `weakref.WeakMethod` (the limiter holds its core, so a strong reference here
/// would be a cycle the garbage collector cannot see through a Rust object).
pub(crate) struct Slow(PyOnceLock<Py<PyAny>>);

impl Slow {
    pub(crate) fn new() -> Slow {
        Slow(PyOnceLock::new())
    }

    /// Set once, by the limiter that owns the core.
    pub(crate) fn bind(&self, py: Python<'_>, method: Py<PyAny>) -> PyResult<()> {
        self.0
            .set(py, method)
            .map_err(|_| PyRuntimeError::new_err("this core is bound to its limiter already"))
    }

    /// The coroutine `method(*args)`, for the limiter still alive.
    pub(crate) fn call<'py>(
        &self,
        py: Python<'py>,
        args: Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let gone = || PyRuntimeError::new_err("this core's limiter is gone");
        let weak = self.0.get(py).ok_or_else(gone)?;
        let method = weak.bind(py).call0()?;
        if method.is_none() {
            return Err(gone());
        }
        method.call1(args)
    }
}
