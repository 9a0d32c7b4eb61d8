//! A budget kept in Redis, decided here: `paceline::budget::fleet` for
//! `paceline.redis.RedisBudget`, whose redis-py calls read and write the value (the
//! decisions, the value's format and the waiters' cadence are the Rust crate's, the
//! same as a Rust `RedisBudget`'s).

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use paceline::budget::fleet::{
    FleetError, FleetLook, FleetNext, FleetOp, FleetOutcome, FleetRules, FleetWait, FleetWrite,
};
use paceline::budget::BudgetError;
use paceline::upstream::DimensionSignal;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::{max_wait, quota, rate_rows};
use crate::budget::{budget_error, hold_seconds};

create_exception!(
    _paceline,
    FleetForeign,
    PyException,
    "The budget's Redis key holds a value that is not this budget's."
);

/// A write for the budget's write script: `(expect, value, ttl_ms, head, queue)`.
type Write = Option<(u64, Py<PyBytes>, u64, u64, u64)>;

fn write(py: Python<'_>, w: Option<FleetWrite>) -> Write {
    w.map(|w| {
        (
            w.expect,
            PyBytes::new(py, &w.value).unbind(),
            w.ttl_ms,
            w.head,
            w.queue,
        )
    })
}

/// The server's time, from `TIME`'s seconds and microseconds, in nanoseconds.
fn server_ns(secs: u64, micros: u64) -> u64 {
    secs.saturating_mul(1_000_000_000)
        .saturating_add(micros.saturating_mul(1_000))
}

fn foreign(e: FleetError) -> PyErr {
    FleetForeign::new_err(e.to_string())
}

fn full() -> PyErr {
    PyRuntimeError::new_err(format!(
        "the budget records {} callers already (turns in flight and waiters)",
        paceline::budget::fleet::MAX_CALLERS
    ))
}

/// Costs as the Rust API takes them.
fn named(costs: &[(String, u32)]) -> Vec<(&str, u32)> {
    costs.iter().map(|(n, c)| (n.as_str(), *c)).collect()
}

/// The rules of one fleet budget, and the decisions made with them.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct FleetCore {
    rules: FleetRules,
}

/// The rules for `rates` (`(name, count, per, burst)`) and an optional in-flight cap.
#[pyfunction]
#[pyo3(signature = (rates, in_flight=None))]
pub(crate) fn new_fleet_budget(
    rates: Vec<(String, u32, f64, u32)>,
    in_flight: Option<u32>,
) -> PyResult<FleetCore> {
    let rates = rates
        .into_iter()
        .map(|(name, count, per, burst)| Ok((name, quota(count, per, burst)?)))
        .collect::<PyResult<Vec<_>>>()?;
    let rules =
        FleetRules::new(rates, in_flight).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(FleetCore { rules })
}

/// Where a decision is made: the budget's value as read, the server's time in
/// nanoseconds, and the caller's owner id.
#[derive(Clone, Copy)]
struct At<'a> {
    value: Option<&'a [u8]>,
    now: u64,
    owner: u64,
}

impl FleetCore {
    /// Decides `op` on the value at `at`; the outcome and the write.
    fn decide(&self, at: At<'_>, op: FleetOp<'_>) -> PyResult<(FleetOutcome, Option<FleetWrite>)> {
        let d = self
            .rules
            .decide(at.value, at.now, at.owner, op)
            .map_err(foreign)?;
        Ok((d.outcome, d.write))
    }
}

/// A `#[pymethods]` block for `$class`: the `deciding` methods take, before their own
/// arguments, what every decision is made at — the budget's value as redis-py read it
/// (`value`), the server's `TIME` (`secs`, `micros`) and the caller's owner id (`owner`)
/// — bound in their bodies as the [`At`] named in their heads; the `other` methods are
/// as written.
macro_rules! fleet_methods {
    (
        impl $class:ident {
            deciding {
                $(
                    $(#[$attr:meta])*
                    fn $name:ident(&$self:ident, $py:ident, $at:ident $(, $arg:ident: $ty:ty)* $(,)?)
                        -> $out:ty $body:block
                )*
            }
            other { $($other:tt)* }
        }
    ) => {
        #[pymethods]
        impl $class {
            $(
                $(#[$attr])*
                #[allow(clippy::too_many_arguments)]
                fn $name(
                    &$self,
                    $py: Python<'_>,
                    value: Option<&[u8]>,
                    secs: u64,
                    micros: u64,
                    owner: u64,
                    $($arg: $ty,)*
                ) -> PyResult<$out> {
                    let $at = At {
                        value,
                        now: server_ns(secs, micros),
                        owner,
                    };
                    $body
                }
            )*
            $($other)*
        }
    };
}

fleet_methods! {
    impl FleetCore {
        deciding {
            /// A turn now: its ticket, or `None` (it would wait).
            fn try_now(&self, py, at, cells: Vec<u32>) -> (Option<u64>, Write) {
                let (outcome, w) = self.decide(at, FleetOp::TryNow { cells: &cells })?;
                let ticket = match outcome {
                    FleetOutcome::Admitted { ticket } => Some(ticket),
                    FleetOutcome::Refused(BudgetError::WouldWait) => None,
                    FleetOutcome::Refused(e) => return Err(budget_error(e)),
                    FleetOutcome::Full => return Err(full()),
                    other => unreachable!("a try is admitted or refused: {other:?}"),
                };
                Ok((ticket, write(py, w)))
            }

            /// Ends caller `ticket` of `owner`: settled (`actual`) or closed at its
            /// estimate. Whether it was on record.
            #[pyo3(signature = (value, secs, micros, owner, ticket, charged, actual=None))]
            fn end(
                &self,
                py,
                at,
                ticket: u64,
                charged: Vec<u32>,
                actual: Option<Vec<Option<u32>>>,
            ) -> (bool, Write) {
                let op = FleetOp::End {
                    ticket,
                    charged: &charged,
                    actual: actual.as_deref(),
                };
                let (outcome, w) = self.decide(at, op)?;
                Ok((outcome == FleetOutcome::Ended(true), write(py, w)))
            }

            /// Renews `owner`'s lease.
            fn renew(&self, py, at) -> Write {
                let (_, w) = self.decide(at, FleetOp::Renew)?;
                Ok(write(py, w))
            }

            /// `(in_flight, waiting, remaining per dimension)`.
            fn look(&self, py, at) -> ((u32, usize, Vec<u32>), Write) {
                match self.decide(at, FleetOp::Look)? {
                    (
                        FleetOutcome::Looked {
                            in_flight,
                            waiting,
                            remaining,
                        },
                        w,
                    ) => Ok(((in_flight, waiting, remaining.into()), write(py, w))),
                    (other, _) => unreachable!("a look is answered by a read: {other:?}"),
                }
            }

            /// Seconds a turn of `cells` would wait by the rates (`inf`: never).
            fn wait_time(&self, py, at, cells: Vec<u32>) -> (f64, Write) {
                match self.decide(at, FleetOp::WaitTime { cells: &cells })? {
                    (FleetOutcome::WaitTime(d), w) => {
                        let s = if d == Duration::MAX {
                            f64::INFINITY
                        } else {
                            d.as_secs_f64()
                        };
                        Ok((s, write(py, w)))
                    }
                    (other, _) => unreachable!("a wait time is answered by one: {other:?}"),
                }
            }

            /// Steers the budget by a response; how many of its dimensions it reported.
            fn follow(
                &self,
                py,
                at,
                status: u16,
                headers: Vec<(String, Vec<u8>)>,
                max_hold: f64,
            ) -> (usize, Write) {
                let max_hold = hold_seconds("max_hold", max_hold)?;
                let fields = headers.iter().map(|(n, v)| (n.as_str(), v.as_slice()));
                let signal = DimensionSignal::read(status, fields, SystemTime::now());
                let op = FleetOp::Follow {
                    signal: &signal,
                    max_hold,
                };
                match self.decide(at, op)? {
                    (FleetOutcome::Followed(n), w) => Ok((n, write(py, w))),
                    (other, _) => unreachable!("a follow is answered by a count: {other:?}"),
                }
            }

            /// Holds every turn for `seconds`.
            fn hold(&self, py, at, seconds: f64) -> Write {
                let duration = hold_seconds("seconds", seconds)?;
                let (_, w) = self.decide(at, FleetOp::Hold { duration })?;
                Ok(write(py, w))
            }
        }
        other {
            /// Each dimension's cells for `costs` (a `ValueError` for costs no turn can have).
            fn cells(&self, costs: Vec<(String, u32)>) -> PyResult<Vec<u32>> {
                Ok(self
                    .rules
                    .cells(&named(&costs))
                    .map_err(budget_error)?
                    .into())
            }

            /// Each dimension's settled cells for `costs` (`None` where not named).
            fn settled(&self, costs: Vec<(String, u32)>) -> PyResult<Vec<Option<u32>>> {
                Ok(self
                    .rules
                    .settled(&named(&costs))
                    .map_err(budget_error)?
                    .into())
            }

            /// Dimension `name`'s index (a `ValueError` for a name the budget lacks).
            fn index(&self, name: &str) -> PyResult<usize> {
                self.rules.index(name).map_err(budget_error)
            }

            /// The dimensions, sorted by name: `(name, interval in ns, burst)`.
            fn rates(&self) -> Vec<(String, u64, u32)> {
                rate_rows(self.rules.dimensions())
            }

            /// The in-flight cap.
            fn cap(&self) -> Option<u32> {
                self.rules.cap()
            }

            /// A waiter for `cells`, accepting at most `timeout` seconds (`None`: any wait).
            #[pyo3(signature = (cells, timeout=None))]
            fn waiter(slf: Py<Self>, cells: Vec<u32>, timeout: Option<f64>) -> PyResult<FleetWaiter> {
                let max = max_wait(timeout)?;
                let max = (max != Duration::MAX).then_some(max);
                Ok(FleetWaiter {
                    core: slf,
                    cells,
                    state: Mutex::new(Waiter {
                        wait: FleetWait::new(max),
                        pending: None,
                    }),
                })
            }
        }
    }
}

/// One caller's way to its turn (`paceline::budget::fleet::FleetWait`), stepped by
/// redis-py's calls.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct FleetWaiter {
    core: Py<FleetCore>,
    cells: Vec<u32>,
    state: Mutex<Waiter>,
}

struct Waiter {
    wait: FleetWait,
    /// The latest decision's outcome and its server time, until answered.
    pending: Option<(FleetOutcome, u64)>,
}

impl FleetWaiter {
    fn state(&self) -> std::sync::MutexGuard<'_, Waiter> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fleet_methods! {
    impl FleetWaiter {
        deciding {
            /// Decides this caller's next ask on `value` at the server's time: the write it
            /// needs (`None`: nothing to write; `answer` next either way).
            fn decide(&self, py, at) -> Write {
                let mut state = self.state();
                let op = state.wait.op(&self.cells, at.now);
                let (outcome, w) = self.core.get().decide(at, op)?;
                state.pending = Some((outcome, at.now));
                Ok(write(py, w))
            }
        }
        other {
            /// The ticket this caller may be on record with (to leave the queue with, or to end
            /// an admission never handed over).
            fn ticket(&self) -> Option<u64> {
                let state = self.state();
                match &state.pending {
                    Some((FleetOutcome::Admitted { ticket } | FleetOutcome::Waiting { ticket, .. }, _)) => {
                        Some(*ticket)
                    }
                    _ => state.wait.ticket(),
                }
            }

            /// The decision, written: the ticket once admitted, `None` while waiting (`look`
            /// says when to ask again); `TimeoutError` past a deadline, `RuntimeError` for a
            /// budget full of callers.
            fn answer(&self, head: u64, queue: u64, local_ns: u64) -> PyResult<Option<u64>> {
                let mut state = self.state();
                let Some((outcome, now)) = state.pending.take() else {
                    return Err(PyRuntimeError::new_err("answer() before decide()"));
                };
                match state.wait.answer(outcome, (head, queue), now, local_ns) {
                    FleetNext::Admitted { ticket } => Ok(Some(ticket)),
                    FleetNext::Waiting => Ok(None),
                    FleetNext::Failed(FleetOutcome::Refused(e)) => Err(budget_error(e)),
                    FleetNext::Failed(FleetOutcome::Full) => Err(full()),
                    FleetNext::Failed(other) => unreachable!("a wait fails refused or full: {other:?}"),
                    _ => unreachable!("FleetNext has no other outcome"),
                }
            }

            /// With the epochs just read (`None`: none since the answer) at the local clock:
            /// `None` to ask again now, else seconds to sleep before reading them again.
            #[pyo3(signature = (epochs, local_ns))]
            fn look(&self, epochs: Option<(u64, u64)>, local_ns: u64) -> Option<f64> {
                match self.state().wait.look(epochs, local_ns) {
                    FleetLook::Ask => None,
                    FleetLook::Sleep(d) => Some(d.as_secs_f64()),
                    _ => None,
                }
            }

            /// Whether its next ask is urgent (it was the head or the next in line).
            fn urgent(&self) -> bool {
                self.state().wait.urgent()
            }

            /// Its cells.
            fn cells(&self) -> Vec<u32> {
                self.cells.clone()
            }
        }
    }
}

/// Adds this file's classes and functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FleetCore>()?;
    m.add_class::<FleetWaiter>()?;
    m.add("FleetForeign", m.py().get_type::<FleetForeign>())?;
    m.add("BUDGET_READ_SCRIPT", paceline::redis_scripts::BUDGET_READ)?;
    m.add("BUDGET_WRITE_SCRIPT", paceline::redis_scripts::BUDGET_WRITE)?;
    m.add(
        "FLEET_RENEW_EVERY",
        paceline::budget::fleet::RENEW_EVERY.as_secs_f64(),
    )?;
    m.add("FLEET_LEASE", paceline::budget::fleet::LEASE.as_secs_f64())?;
    m.add_function(wrap_pyfunction!(new_fleet_budget, m)?)?;
    Ok(())
}
