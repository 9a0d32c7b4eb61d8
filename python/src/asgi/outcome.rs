//! What the layer decided, as Python reads it: `Admitted`, `Refused`, or a `Waiting`
//! polled from the event loop.

use std::future::Future;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use paceline::http::{self as layer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// ASGI `(name, value)` byte pairs of a header map.
pub(super) fn pairs(py: Python<'_>, headers: &http::HeaderMap) -> Vec<(Py<PyBytes>, Py<PyBytes>)> {
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

pub(super) fn admitted(py: Python<'_>, admitted: layer::Admitted) -> Admitted {
    Admitted {
        fields: admitted
            .fields()
            .map_or_else(Vec::new, |fields| pairs(py, fields)),
    }
}

pub(super) fn refused(py: Python<'_>, refused: layer::Refused<Bytes>) -> Refused {
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

/// A request waiting its booked turn (wait mode). Dropped or cancelled before its turn,
/// it gives every booking back.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Waiting {
    pub(super) future: Mutex<Option<std::pin::Pin<Box<layer::Waiting<Bytes>>>>>,
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
        let waker = crate::wait::calling(wake);
        let polled = future.as_mut().poll(&mut Context::from_waker(&waker));
        settled(py, &mut slot, polled)
    }

    /// Books every limit's turn without taking any yet (`paceline::http::Waiting::book`):
    /// `None` once booked (cancelled or dropped now, every turn is given back, the cells
    /// admitted at once included; `poll` then takes them), or the `Refused` when a turn
    /// is too far.
    fn book<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut slot = self.future.lock().unwrap_or_else(|e| e.into_inner());
        let Some(future) = slot.as_mut() else {
            return Err(PyValueError::new_err("this wait is over"));
        };
        let booked = future
            .as_mut()
            .book(&mut Context::from_waker(Waker::noop()));
        settled(py, &mut slot, booked)
    }

    /// Gives every booking back (the client went away).
    fn cancel(&self) {
        let future = self.future.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(future);
    }
}

/// A wait's poll as Python takes it: the outcome once it is over (the wait then ends), or
/// `None`.
fn settled<'py>(
    py: Python<'py>,
    slot: &mut Option<std::pin::Pin<Box<layer::Waiting<Bytes>>>>,
    polled: Poll<Result<layer::Admitted, layer::Refused<Bytes>>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match polled {
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
