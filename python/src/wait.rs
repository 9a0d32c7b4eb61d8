//! Waiting from Python: a booked turn (`Ticket`), a thread blocked on it with the GIL
//! released and Python's signals answered, and a new key's wait for room (`NoRoom`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use paceline::shared::{OwnedSharedKeyReservation, OwnedSharedReservation};
use paceline::{OwnedKeyReservation, OwnedReservation, TextKey};
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;

pyo3::create_exception!(
    _paceline,
    NoRoom,
    pyo3::exceptions::PyException,
    "A keyed limiter has no room to store a new key yet: args[0] is the seconds until room is expected (internal: acquire waits and books again)."
);

/// The seconds a `NoRoom` carries.
pub(crate) fn no_room_wait(py: Python<'_>, e: &PyErr) -> Duration {
    let seconds = e
        .value(py)
        .getattr("args")
        .and_then(|args| args.get_item(0))
        .and_then(|s| s.extract::<f64>())
        .unwrap_or(0.0);
    Duration::try_from_secs_f64(seconds).unwrap_or(SIGNAL_CHECK)
}

/// Sleeps `d` (GIL released), looking for signals at least every [`SIGNAL_CHECK`].
pub(crate) fn sleep(py: Python<'_>, d: Duration) -> PyResult<()> {
    let until = std::time::Instant::now() + d.max(Duration::from_micros(100));
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        py.detach(|| thread::sleep(left.min(SIGNAL_CHECK)));
        py.check_signals()?;
    }
}

/// A booked turn: its instant, and a way to give it back.
pub(crate) enum Held {
    Direct(OwnedReservation),
    Keyed(OwnedKeyReservation<TextKey, paceline::clock::DefaultClock>),
    Shared(OwnedSharedReservation),
    SharedKeyed(OwnedSharedKeyReservation),
}

impl Held {
    pub(crate) fn ready_in(&self) -> Duration {
        match self {
            Held::Direct(r) => r.ready_in(),
            Held::Keyed(r) => r.ready_in(),
            Held::Shared(r) => r.ready_in(),
            Held::SharedKeyed(r) => r.ready_in(),
        }
    }

    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            Held::Direct(r) => Pin::new(r).poll(cx),
            Held::Keyed(r) => Pin::new(r).poll(cx),
            Held::Shared(r) => Pin::new(r).poll(cx),
            Held::SharedKeyed(r) => Pin::new(r).poll(cx),
        }
    }
}

/// A booked turn (Python's view of a paceline reservation).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Ticket {
    /// `None` once used or cancelled.
    held: Mutex<Option<Held>>,
}

impl Ticket {
    pub(crate) fn new(held: Held) -> Ticket {
        Ticket {
            held: Mutex::new(Some(held)),
        }
    }
}

#[pymethods]
impl Ticket {
    /// Seconds until the turn comes (0.0 once it has).
    pub(crate) fn ready_in(&self) -> f64 {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().map_or(0.0, |h| h.ready_in().as_secs_f64())
    }

    /// Gives the cells back if the turn has not come (waiters behind move up); once it
    /// has, they stay spent.
    pub(crate) fn cancel(&self) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(held);
    }

    /// The turn is used: forget it without giving anything back.
    pub(crate) fn done(&self) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(held) = held {
            // Its instant has come (the caller checked), so dropping keeps its cells.
            drop(held);
        }
    }
}

/// How long a blocked thread sleeps between two looks for Python signals.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(20);

/// Unparks the blocked thread when its turn is fired.
struct Unpark(Thread);

impl Wake for Unpark {
    // `wake_by_ref` is the trait's: a reference count more, once per wake-up.
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A waker that unparks this thread (a blocked caller parks between polls).
pub(crate) fn unparker() -> Waker {
    Waker::from(Arc::new(Unpark(thread::current())))
}

/// A waker that calls the Python callable `wake`, from whichever thread wakes it: an
/// event loop's way to be told to poll again.
pub(crate) fn calling(wake: Py<PyAny>) -> Waker {
    Waker::from(Arc::new(CallBack(wake)))
}

struct CallBack(Py<PyAny>);

impl Wake for CallBack {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        Python::attach(|py| {
            // A loop closed meanwhile: its waiter is gone too.
            let _ = self.0.call0(py);
        });
    }
}

/// Blocks (GIL released) until `held`'s turn comes, looking for signals at least every
/// [`SIGNAL_CHECK`], as Python's own blocking calls do: a signal handler that raises
/// (Ctrl-C's `KeyboardInterrupt`) ends the wait with its exception, and `held` is dropped,
/// which gives the cells back if the turn has not come.
pub(crate) fn block(py: Python<'_>, mut held: Held) -> PyResult<()> {
    let waker = unparker();
    let mut cx = Context::from_waker(&waker);
    loop {
        if held.poll(&mut cx).is_ready() {
            return Ok(());
        }
        let sleep = held
            .ready_in()
            .clamp(Duration::from_micros(1), SIGNAL_CHECK);
        // A fire unparks us early; so may a signal (the wait is then only shorter).
        py.detach(|| thread::park_timeout(sleep));
        py.check_signals()?;
    }
}

/// [`block`] with a deadline: past it, `held` is dropped (the turn given back) and the
/// wait ends with `TimeoutError`.
pub(crate) fn block_until(
    py: Python<'_>,
    mut held: Held,
    deadline: Option<std::time::Instant>,
) -> PyResult<()> {
    let waker = unparker();
    let mut cx = Context::from_waker(&waker);
    loop {
        if held.poll(&mut cx).is_ready() {
            return Ok(());
        }
        let wait = held.ready_in();
        if let Some(deadline) = deadline {
            if std::time::Instant::now() + wait > deadline {
                return Err(PyTimeoutError::new_err(format!(
                    "the turn is {:.6} s away, past the timeout; it was given back",
                    wait.as_secs_f64()
                )));
            }
        }
        let sleep = wait.clamp(Duration::from_micros(1), SIGNAL_CHECK);
        py.detach(|| thread::park_timeout(sleep));
        py.check_signals()?;
    }
}
