//! `paceline.Budget`'s Rust half: a `paceline::budget::Budget` on the default clock, or a
//! `paceline::shared::SharedBudget` in a file every process of the host maps; its
//! waiting future polled from Python (`BudgetWaiting`, woken through a callback the
//! event loop bridges with `call_soon_threadsafe`), blocking waits for threads (the GIL
//! released, signals answered), and turns (`BudgetTurn`). The queue, the admission and
//! the settle arithmetic are all the Rust crate's; `pysrc/paceline/_budget.py` checks
//! the Python values and awaits.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, SystemTime};

use paceline::budget::{Acquire, Budget, BudgetError, Turn};
use paceline::shared::{SharedAcquire, SharedBudget, SharedBudgetError, SharedStep, SharedTurn};
use paceline::upstream::DimensionSignal;
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

use crate::args::{max_wait, quota, rate_rows};
use crate::shared::{open_options, shared_error};
use crate::wait::{calling, unparker, SIGNAL_CHECK};

/// Locks, ignoring poisoning: every section below leaves its value whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A budget error in Python's words: a deadline is a `TimeoutError`, bad costs a
/// `ValueError` (nothing was booked either way).
pub(crate) fn budget_error(e: BudgetError) -> PyErr {
    match e {
        BudgetError::NotWithin { .. } | BudgetError::TimedOut => {
            PyTimeoutError::new_err(e.to_string())
        }
        other => PyValueError::new_err(other.to_string()),
    }
}

/// A shared budget's error in Python's words: the budget's as [`error`], the file's as
/// `crate::shared::shared_error`.
fn shared_budget_error(e: SharedBudgetError) -> PyErr {
    match e {
        SharedBudgetError::Budget(e) => budget_error(e),
        SharedBudgetError::File(e) => shared_error(e),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// Seconds as a duration: finite and not negative (a `ValueError` otherwise).
pub(crate) fn hold_seconds(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a number of seconds from 0 to about 584 years, got {s}"
        ))
    })
}

/// Costs as the Rust API takes them.
fn costs(costs: &[(String, u32)]) -> Vec<(&str, u32)> {
    costs.iter().map(|(n, c)| (n.as_str(), *c)).collect()
}

/// A budget shared by threads and event loops (and, shared, by processes).
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct BudgetCore {
    budget: Kind,
}

/// Where a budget lives.
enum Kind {
    Local(Budget),
    Shared(SharedBudget),
}

/// A budget of `rates` (`(name, count, per, burst)`) and an optional in-flight cap.
#[pyfunction]
#[pyo3(signature = (rates, in_flight=None))]
pub(crate) fn new_budget(
    rates: Vec<(String, u32, f64, u32)>,
    in_flight: Option<u32>,
) -> PyResult<BudgetCore> {
    let mut builder = Budget::builder();
    for (name, count, per, burst) in rates {
        builder = builder.rate(name, quota(count, per, burst)?);
    }
    if let Some(cap) = in_flight {
        builder = builder.in_flight(cap);
    }
    let budget = builder
        .build()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(BudgetCore {
        budget: Kind::Local(budget),
    })
}

/// The budget of `rates` and `in_flight` in the file at `path`, shared by every process
/// that opens it.
#[pyfunction]
#[pyo3(signature = (path, rates, in_flight, mismatch, trust_user=None, trust_group=None))]
pub(crate) fn new_shared_budget(
    py: Python<'_>,
    path: std::path::PathBuf,
    rates: Vec<(String, u32, f64, u32)>,
    in_flight: Option<u32>,
    mismatch: &str,
    trust_user: Option<u32>,
    trust_group: Option<u32>,
) -> PyResult<BudgetCore> {
    let mut builder = SharedBudget::builder();
    for (name, count, per, burst) in rates {
        builder = builder.rate(name, quota(count, per, burst)?);
    }
    if let Some(cap) = in_flight {
        builder = builder.in_flight(cap);
    }
    let builder = builder.options(open_options(mismatch, trust_user, trust_group, None)?);
    let budget = py.detach(|| builder.open(&path)).map_err(shared_error)?;
    Ok(BudgetCore {
        budget: Kind::Shared(budget),
    })
}

#[pymethods]
impl BudgetCore {
    /// A turn now, or None (someone waits ahead, a rate or the cap says not yet).
    fn try_acquire(
        &self,
        py: Python<'_>,
        costs_: Vec<(String, u32)>,
    ) -> PyResult<Option<BudgetTurn>> {
        match &self.budget {
            Kind::Local(b) => match b.try_acquire(&costs(&costs_)) {
                Ok(turn) => Ok(Some(BudgetTurn::new(Held::Local(turn)))),
                Err(BudgetError::WouldWait) => Ok(None),
                Err(e) => Err(budget_error(e)),
            },
            Kind::Shared(b) => match py.detach(|| b.try_acquire(&costs(&costs_))) {
                Ok(turn) => Ok(Some(BudgetTurn::new(Held::Shared(turn)))),
                Err(SharedBudgetError::Budget(BudgetError::WouldWait)) => Ok(None),
                Err(e) => Err(shared_budget_error(e)),
            },
        }
    }

    /// A wait for a turn, to poll from an event loop; `timeout` in seconds or None.
    fn acquire(&self, costs_: Vec<(String, u32)>, timeout: Option<f64>) -> PyResult<BudgetWaiting> {
        let future = self.future(&costs_, timeout)?;
        Ok(BudgetWaiting {
            future: Mutex::new(Some(future)),
            again_in: Mutex::new(None),
        })
    }

    /// Blocks this thread for a turn (the GIL released), answering signals within
    /// [`SIGNAL_CHECK`]: a handler that raises (Ctrl-C) ends the wait with its
    /// exception, and the place is given up.
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        costs_: Vec<(String, u32)>,
        timeout: Option<f64>,
    ) -> PyResult<BudgetTurn> {
        let mut future = self.future(&costs_, timeout)?;
        let waker = unparker();
        loop {
            let polled = py.detach(|| {
                let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
                if polled.is_pending() {
                    // A wake-up unparks us early; so may a signal.
                    thread::park_timeout(SIGNAL_CHECK);
                }
                polled
            });
            match polled {
                Poll::Ready(Ok(turn)) => return Ok(BudgetTurn::new(turn)),
                Poll::Ready(Err(e)) => return Err(e.into()),
                // Dropping `future` on the error gives the place up.
                Poll::Pending => py.check_signals()?,
            }
        }
    }

    /// Seconds a turn of `costs` would wait if asked for now, by the rates as they stand
    /// (`inf`: never).
    fn wait_time(&self, costs_: Vec<(String, u32)>) -> PyResult<f64> {
        let wait = match &self.budget {
            Kind::Local(b) => b.wait_time(&costs(&costs_)).map_err(budget_error)?,
            Kind::Shared(b) => b.wait_time(&costs(&costs_)).map_err(shared_budget_error)?,
        };
        Ok(if wait == Duration::MAX {
            f64::INFINITY
        } else {
            wait.as_secs_f64()
        })
    }

    /// Cells of `name` its rate would admit now.
    fn remaining(&self, name: &str) -> PyResult<u32> {
        match &self.budget {
            Kind::Local(b) => b.remaining(name).map_err(budget_error),
            Kind::Shared(b) => b.remaining(name).map_err(shared_budget_error),
        }
    }

    fn in_flight(&self) -> PyResult<u32> {
        match &self.budget {
            Kind::Local(b) => Ok(b.in_flight()),
            Kind::Shared(b) => b.in_flight().map_err(shared_error),
        }
    }

    /// Steers the budget by a response (`paceline::budget::Budget::follow`): its status
    /// and raw headers; no wait longer than `max_hold` seconds. Returns how many of the
    /// budget's dimensions the response reported.
    fn follow(
        &self,
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        max_hold: f64,
    ) -> PyResult<usize> {
        let max_hold = hold_seconds("max_hold", max_hold)?;
        let fields = headers.iter().map(|(n, v)| (n.as_str(), v.as_slice()));
        let signal = DimensionSignal::read(status, fields, SystemTime::now());
        match &self.budget {
            Kind::Local(b) => Ok(b.follow(&signal, max_hold)),
            Kind::Shared(b) => b.follow(&signal, max_hold).map_err(shared_error),
        }
    }

    /// Holds every turn for `seconds` from now.
    fn hold_for(&self, seconds: f64) -> PyResult<()> {
        let seconds = hold_seconds("seconds", seconds)?;
        match &self.budget {
            Kind::Local(b) => b.hold_for(seconds),
            Kind::Shared(b) => b.hold_for(seconds).map_err(shared_error)?,
        }
        Ok(())
    }

    /// The dimensions as the budget holds them: `(name, interval in ns, burst)` (a
    /// shared budget's are its file's).
    fn rates(&self) -> Vec<(String, u64, u32)> {
        let rates: Vec<(&str, paceline::Quota)> = match &self.budget {
            Kind::Local(b) => b.dimensions().collect(),
            Kind::Shared(b) => b.dimensions().collect(),
        };
        rate_rows(rates.into_iter())
    }

    /// The in-flight cap as the budget holds it.
    fn in_flight_limit(&self) -> Option<u32> {
        match &self.budget {
            Kind::Local(b) => b.in_flight_limit(),
            Kind::Shared(b) => b.in_flight_limit(),
        }
    }

    fn waiting(&self) -> PyResult<usize> {
        match &self.budget {
            Kind::Local(b) => Ok(b.waiting()),
            Kind::Shared(b) => b.waiting().map_err(shared_error),
        }
    }
}

impl BudgetCore {
    fn future(&self, costs_: &[(String, u32)], timeout: Option<f64>) -> PyResult<Wait> {
        let costs = costs(costs_);
        let max = timeout.map(|t| max_wait(Some(t))).transpose()?;
        Ok(match (&self.budget, max) {
            (Kind::Local(b), None) => Wait::Local(b.acquire(&costs)),
            (Kind::Local(b), Some(max)) => Wait::Local(b.acquire_within(&costs, max)),
            (Kind::Shared(b), None) => Wait::Shared(b.acquire(&costs)),
            (Kind::Shared(b), Some(max)) => Wait::Shared(b.acquire_within(&costs, max)),
        })
    }
}

/// A wait for either kind of budget's turn.
enum Wait {
    Local(Acquire),
    Shared(SharedAcquire),
}

/// Either kind of budget's error, turned into Python's when it is raised.
enum Failure {
    Local(BudgetError),
    Shared(SharedBudgetError),
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Local(e) => budget_error(e),
            Failure::Shared(e) => shared_budget_error(e),
        }
    }
}

impl Future for Wait {
    type Output = Result<Held, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Wait::Local(f) => Pin::new(f)
                .poll(cx)
                .map(|r| r.map(Held::Local).map_err(Failure::Local)),
            Wait::Shared(f) => Pin::new(f)
                .poll(cx)
                .map(|r| r.map(Held::Shared).map_err(Failure::Shared)),
        }
    }
}

/// Either kind of budget's turn.
enum Held {
    Local(Turn),
    Shared(SharedTurn),
}

/// A wait for a budget's turn, polled from an event loop.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct BudgetWaiting {
    /// `None` once answered or cancelled.
    future: Mutex<Option<Wait>>,
    /// A shared budget's wait: seconds until it should be polled again.
    again_in: Mutex<Option<f64>>,
}

#[pymethods]
impl BudgetWaiting {
    /// Polls: the turn once admitted, or None, and `wake` is called (from any thread)
    /// when it should be polled again. Raises for bad costs or a deadline.
    fn poll(&self, wake: Py<PyAny>) -> PyResult<Option<BudgetTurn>> {
        let mut slot = lock(&self.future);
        let Some(future) = slot.as_mut() else {
            return Err(PyValueError::new_err("this wait is over"));
        };
        if let Wait::Shared(shared) = future {
            // Nothing but its own clock wakes a shared budget's waiter: the loop's timer
            // does that (`again_in`), with no thread waiting for the GIL to wake it.
            drop(wake);
            return match shared.step() {
                SharedStep::Ready(outcome) => {
                    *slot = None;
                    outcome
                        .map(|turn| Some(BudgetTurn::new(Held::Shared(turn))))
                        .map_err(shared_budget_error)
                }
                SharedStep::Pending(again_in) => {
                    *lock(&self.again_in) = Some(again_in.as_secs_f64());
                    Ok(None)
                }
            };
        }
        let waker = calling(wake);
        match Pin::new(future).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(outcome) => {
                *slot = None;
                outcome
                    .map(|turn| Some(BudgetTurn::new(turn)))
                    .map_err(PyErr::from)
            }
            Poll::Pending => Ok(None),
        }
    }

    /// Seconds until a shared budget's pending wait should be polled again (`None`: the
    /// wait calls `wake` instead).
    fn again_in(&self) -> Option<f64> {
        lock(&self.again_in).take()
    }

    /// Gives the place up (the task was cancelled): it has spent nothing.
    fn cancel(&self) {
        let future = lock(&self.future).take();
        drop(future);
    }
}

/// An admitted turn.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct BudgetTurn {
    /// `None` once ended.
    turn: Mutex<Option<Held>>,
}

impl BudgetTurn {
    fn new(turn: Held) -> BudgetTurn {
        BudgetTurn {
            turn: Mutex::new(Some(turn)),
        }
    }
}

#[pymethods]
impl BudgetTurn {
    /// Ends the turn with the real costs of the dimensions named; the permit returns.
    /// A bad dimension raises `ValueError` and leaves the turn as it was; a turn already
    /// ended raises `RuntimeError`.
    fn settle(&self, costs_: Vec<(String, u32)>) -> PyResult<()> {
        // Taken out, then settled with no lock of ours held: settling wakes the budget's
        // next caller, which may run Python code.
        let Some(turn) = lock(&self.turn).take() else {
            return Err(PyRuntimeError::new_err(
                "this turn has already ended (settled or released)",
            ));
        };
        let (err, turn) = match turn {
            Held::Local(turn) => match turn.settle(&costs(&costs_)) {
                Ok(()) => return Ok(()),
                Err(e) => (budget_error(e.error().clone()), Held::Local(e.into_turn())),
            },
            Held::Shared(turn) => match turn.settle(&costs(&costs_)) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let err = match e.error() {
                        SharedBudgetError::Budget(b) => budget_error(b.clone()),
                        other => PyRuntimeError::new_err(other.to_string()),
                    };
                    (err, Held::Shared(e.into_turn()))
                }
            },
        };
        *lock(&self.turn) = Some(turn);
        Err(err)
    }

    /// Ends the turn keeping its estimate (nothing to correct, or an exception); the
    /// permit returns. Nothing happens if it has already ended.
    fn release(&self) {
        let turn = lock(&self.turn).take();
        drop(turn);
    }

    /// Whether the turn has ended.
    fn ended(&self) -> bool {
        lock(&self.turn).is_none()
    }

    /// The cells charged to `name` at admission, or None.
    fn cost(&self, name: &str) -> Option<u32> {
        lock(&self.turn).as_ref().and_then(|t| match t {
            Held::Local(t) => t.cost(name),
            Held::Shared(t) => t.cost(name),
        })
    }
}

/// Adds this file's classes and functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BudgetCore>()?;
    m.add_class::<BudgetWaiting>()?;
    m.add_class::<BudgetTurn>()?;
    m.add_function(wrap_pyfunction!(new_budget, m)?)?;
    m.add_function(wrap_pyfunction!(new_shared_budget, m)?)?;
    Ok(())
}
