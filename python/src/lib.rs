//! `paceline._paceline`: the Rust half of the Python package. Booking, the FIFO queue
//! and the arithmetic stay in paceline; Python's event loops only sleep until a booked
//! instant (see `pysrc/paceline/__init__.py`).
//!
//! Every limiter here is two paceline limiters of the same quota: the *booking* one, in
//! whose FIFO queue every caller takes its place, and (unless turned off) the
//! *execution* one, which a caller takes its cells from again at the moment its work
//! actually runs. A caller that resumes on time finds them free; one that resumes late
//! (an event loop that stalled) books there and waits again, so the work never runs
//! faster than the quota however late the loop was.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use paceline::{
    Denied, KeyedLimiter, Limiter, OwnedKeyReservation, OwnedReservation, Quota, QuotaError,
};
use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;

/// `count` cells per `per` seconds with `burst`, or a `ValueError` saying why not.
fn quota(count: u32, per: f64, burst: u32) -> PyResult<Quota> {
    let period = Duration::try_from_secs_f64(per).map_err(|_| {
        PyValueError::new_err(format!(
            "per must be a positive number of seconds, got {per}"
        ))
    })?;
    let invalid = |e: QuotaError| PyValueError::new_err(e.to_string());
    Quota::try_new(count, period)
        .map_err(invalid)?
        .try_with_burst(burst)
        .map_err(invalid)
}

/// A `Duration` from optional seconds: `None` means no maximum.
fn max_wait(timeout: Option<f64>) -> PyResult<Duration> {
    match timeout {
        None => Ok(Duration::MAX),
        Some(t) => Duration::try_from_secs_f64(t).map_err(|_| {
            PyValueError::new_err(format!("timeout must be None or seconds >= 0, got {t}"))
        }),
    }
}

/// `n` over the burst can never be admitted: a `ValueError`, before anything is booked.
fn check_n(n: u32, burst: u32) -> PyResult<()> {
    if n > burst {
        return Err(PyValueError::new_err(format!(
            "n = {n} is more than the burst ({burst}): it can never be admitted"
        )));
    }
    Ok(())
}

/// What a refused booking raises: the wait was longer than the timeout.
fn too_late(denied: Denied) -> PyErr {
    match denied {
        Denied::NotUntil(e) => PyTimeoutError::new_err(format!(
            "the turn is {:.6} s away, longer than the timeout; nothing was booked",
            e.wait_time().as_secs_f64()
        )),
        Denied::InsufficientCapacity(e) => PyValueError::new_err(e.to_string()),
    }
}

/// A booked turn: its instant, and a way to give it back.
enum Held {
    Direct(OwnedReservation),
    Keyed(OwnedKeyReservation<String, paceline::clock::DefaultClock>),
}

impl Held {
    fn ready_in(&self) -> Duration {
        match self {
            Held::Direct(r) => r.ready_in(),
            Held::Keyed(r) => r.ready_in(),
        }
    }

    fn wait(self) {
        match self {
            Held::Direct(r) => r.wait(),
            Held::Keyed(r) => r.wait(),
        }
    }
}

/// A booked turn (Python's view of a paceline reservation).
#[pyclass(frozen, module = "paceline._paceline")]
struct Ticket {
    /// `None` once used or cancelled.
    held: Mutex<Option<Held>>,
}

impl Ticket {
    fn new(held: Held) -> Ticket {
        Ticket {
            held: Mutex::new(Some(held)),
        }
    }
}

#[pymethods]
impl Ticket {
    /// Seconds until the turn comes (0.0 once it has).
    fn ready_in(&self) -> f64 {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().map_or(0.0, |h| h.ready_in().as_secs_f64())
    }

    /// Gives the cells back if the turn has not come (waiters behind move up); once it
    /// has, they stay spent.
    fn cancel(&self) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(held);
    }

    /// The turn is used: forget it without giving anything back.
    fn done(&self) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(held) = held {
            // Its instant has come (the caller checked), so dropping keeps its cells.
            drop(held);
        }
    }
}

/// Blocks (GIL released) until `held`'s turn comes.
fn block(py: Python<'_>, held: Held) {
    py.detach(move || held.wait());
}

/// A limiter shared by threads and event loops (see the module docs).
#[pyclass(frozen, module = "paceline._paceline")]
struct Core {
    booked: Arc<Limiter>,
    exec: Option<Arc<Limiter>>,
}

#[pymethods]
impl Core {
    #[new]
    fn new(count: u32, per: f64, burst: u32, execution_bound: bool) -> PyResult<Core> {
        let quota = quota(count, per, burst)?;
        Ok(Core {
            booked: Arc::new(Limiter::new(quota)),
            exec: execution_bound.then(|| Arc::new(Limiter::new(quota))),
        })
    }

    /// The burst.
    fn burst(&self) -> u32 {
        self.booked.quota().burst()
    }

    /// Seconds between cells.
    fn interval(&self) -> f64 {
        self.booked.quota().emission_interval().as_secs_f64()
    }

    /// Takes `n` cells now if nobody waits ahead and they fit; never waits.
    fn try_acquire(&self, n: u32) -> PyResult<bool> {
        check_n(n, self.burst())?;
        if let Some(exec) = &self.exec {
            if !exec.peek_n(n).unwrap_or(Duration::MAX).is_zero() {
                return Ok(false);
            }
        }
        if self.booked.check_n(n).is_err() {
            return Ok(false);
        }
        // The execution cell had room a moment ago; a racing caller may have taken it,
        // and then these cells stay spent (the strict side).
        Ok(self
            .exec
            .as_ref()
            .is_none_or(|exec| exec.check_n(n).is_ok()))
    }

    /// Cells admissible right now.
    fn remaining(&self) -> u32 {
        let booked = self.booked.remaining();
        self.exec
            .as_ref()
            .map_or(booked, |exec| booked.min(exec.remaining()))
    }

    /// Books `n` cells in the FIFO queue within `timeout` seconds (None: no maximum).
    #[pyo3(signature = (n, timeout=None))]
    fn book(&self, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
        check_n(n, self.burst())?;
        let held = Arc::clone(&self.booked)
            .reserve_within_owned(n, max_wait(timeout)?)
            .map_err(too_late)?;
        Ok(Ticket::new(Held::Direct(held)))
    }

    /// Takes `n` cells from the execution cell at the moment the work runs: a ticket to
    /// wait for (ready at once when the caller is on time), or None without the bound.
    fn run(&self, n: u32) -> PyResult<Option<Ticket>> {
        let Some(exec) = &self.exec else {
            return Ok(None);
        };
        let held = Arc::clone(exec)
            .reserve_within_owned(n, Duration::MAX)
            .map_err(too_late)?;
        Ok(Some(Ticket::new(Held::Direct(held))))
    }

    /// Blocks the calling thread (GIL released) for a booked turn, then the execution
    /// cell.
    #[pyo3(signature = (n, timeout=None))]
    fn acquire_blocking(&self, py: Python<'_>, n: u32, timeout: Option<f64>) -> PyResult<()> {
        check_n(n, self.burst())?;
        let booked = Arc::clone(&self.booked)
            .reserve_within_owned(n, max_wait(timeout)?)
            .map_err(too_late)?;
        block(py, Held::Direct(booked));
        if let Some(exec) = &self.exec {
            let run = Arc::clone(exec)
                .reserve_within_owned(n, Duration::MAX)
                .map_err(too_late)?;
            block(py, Held::Direct(run));
        }
        Ok(())
    }

    /// Changes the quota of both cells; booked turns keep their places.
    fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
        let quota = quota(count, per, burst)?;
        self.booked.set_quota(quota);
        if let Some(exec) = &self.exec {
            exec.set_quota(quota);
        }
        Ok(())
    }
}

/// A limiter per key (str), shared by threads and event loops.
#[pyclass(frozen, module = "paceline._paceline")]
struct KeyedCore {
    booked: Arc<KeyedLimiter<String>>,
    exec: Option<Arc<KeyedLimiter<String>>>,
    burst: Mutex<u32>,
}

#[pymethods]
impl KeyedCore {
    #[new]
    #[pyo3(signature = (count, per, burst, execution_bound, max_keys=None))]
    fn new(
        count: u32,
        per: f64,
        burst: u32,
        execution_bound: bool,
        max_keys: Option<usize>,
    ) -> PyResult<KeyedCore> {
        let quota = quota(count, per, burst)?;
        let make = || {
            let limiter = KeyedLimiter::new(quota);
            Arc::new(match max_keys {
                Some(max) => limiter.with_max_keys(max),
                None => limiter,
            })
        };
        Ok(KeyedCore {
            booked: make(),
            exec: execution_bound.then(make),
            burst: Mutex::new(burst),
        })
    }

    fn burst(&self) -> u32 {
        *self.burst.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_acquire(&self, key: String, n: u32) -> PyResult<bool> {
        check_n(n, self.burst())?;
        if let Some(exec) = &self.exec {
            if !exec.peek_key_n(&key, n).unwrap_or(Duration::MAX).is_zero() {
                return Ok(false);
            }
        }
        if self.booked.check_key_n(&key, n).is_err() {
            return Ok(false);
        }
        Ok(self
            .exec
            .as_ref()
            .is_none_or(|exec| exec.check_key_n(&key, n).is_ok()))
    }

    fn remaining(&self, key: String) -> u32 {
        let booked = self.booked.remaining_key(&key);
        self.exec
            .as_ref()
            .map_or(booked, |exec| booked.min(exec.remaining_key(&key)))
    }

    #[pyo3(signature = (key, n, timeout=None))]
    fn book(&self, key: String, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
        check_n(n, self.burst())?;
        let held = Arc::clone(&self.booked)
            .reserve_key_within_owned(key, n, max_wait(timeout)?)
            .map_err(too_late)?;
        Ok(Ticket::new(Held::Keyed(held)))
    }

    fn run(&self, key: String, n: u32) -> PyResult<Option<Ticket>> {
        let Some(exec) = &self.exec else {
            return Ok(None);
        };
        let held = Arc::clone(exec)
            .reserve_key_within_owned(key, n, Duration::MAX)
            .map_err(too_late)?;
        Ok(Some(Ticket::new(Held::Keyed(held))))
    }

    #[pyo3(signature = (key, n, timeout=None))]
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: String,
        n: u32,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        check_n(n, self.burst())?;
        let booked = Arc::clone(&self.booked)
            .reserve_key_within_owned(key.clone(), n, max_wait(timeout)?)
            .map_err(too_late)?;
        block(py, Held::Keyed(booked));
        if let Some(exec) = &self.exec {
            let run = Arc::clone(exec)
                .reserve_key_within_owned(key, n, Duration::MAX)
                .map_err(too_late)?;
            block(py, Held::Keyed(run));
        }
        Ok(())
    }

    fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
        let quota = quota(count, per, burst)?;
        self.booked.set_quota(quota);
        if let Some(exec) = &self.exec {
            exec.set_quota(quota);
        }
        *self.burst.lock().unwrap_or_else(|e| e.into_inner()) = burst;
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.booked.len()
    }
}

/// The module. Declared free-threading safe: every class is `frozen` and synchronised in
/// Rust (atomics and paceline's own locks), and no Python object is shared unguarded.
#[pymodule(gil_used = false)]
fn _paceline(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Core>()?;
    m.add_class::<KeyedCore>()?;
    m.add_class::<Ticket>()?;
    Ok(())
}
