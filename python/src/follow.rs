//! Following upstreams from Python: one follower per upstream, in a bounded table.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::args::{max_wait, too_late};
use crate::cores::{Core, KeyedCore, SharedCore, SharedKeyedCore};
use crate::wait::{block_until, Held, Ticket};
use paceline::upstream::{Follower, FollowerConfig, Sent, Signal};
use paceline::{Limiter, OwnedReservation, Quota};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The quota in force of a core of any of the four kinds (a keyed core's is every key's).
pub(crate) fn core_quota(py: Python<'_>, core: &Py<PyAny>) -> PyResult<Quota> {
    let core = core.bind(py);
    if let Ok(c) = core.cast::<Core>() {
        return Ok(c.get().0.booked.quota());
    }
    if let Ok(c) = core.cast::<SharedCore>() {
        return Ok(c.get().0.booked.quota());
    }
    if let Ok(c) = core.cast::<KeyedCore>() {
        return Ok(c.get().0.booked.quota());
    }
    if let Ok(c) = core.cast::<SharedKeyedCore>() {
        return Ok(c.get().0.booked.quota());
    }
    Err(PyValueError::new_err("not a paceline core"))
}

/// One follower per upstream (a host, or whatever key the caller picks), in a bounded
/// table: `paceline::upstream::Followers`, for Python. Each follower's limiter carries
/// what its upstream says (holds, an announced or learned pace); the caller's own
/// limiter (`core`) stays as the caller set it, and its quota is each follower's
/// configured one.
#[pyclass(frozen, module = "paceline._paceline")]
pub(crate) struct Followers {
    table: paceline::upstream::Followers,
    core: Py<PyAny>,
}

/// A timeout in seconds as the longest wait: `None` is none.
pub(crate) fn wait_budget(timeout: Option<f64>) -> PyResult<Duration> {
    max_wait(timeout)
}

#[pymethods]
impl Followers {
    /// Followers for the limiter `core` (its quota is theirs): holds of at most `max_hold`
    /// seconds, announced quotas above the core's followed only if `above_configured`,
    /// forgotten after `revert_after` seconds without an announcement.
    #[new]
    #[pyo3(signature = (core, max_hold, above_configured, revert_after=None))]
    pub(crate) fn new(
        py: Python<'_>,
        core: Py<PyAny>,
        max_hold: f64,
        above_configured: bool,
        revert_after: Option<f64>,
    ) -> PyResult<Followers> {
        let seconds = |name: &str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                PyValueError::new_err(format!(
                    "{name} must be a number of seconds from 0 to about 584 years, got {s}"
                ))
            })
        };
        let mut config = FollowerConfig::default()
            .max_hold(seconds("max_hold", max_hold)?)
            .above_configured(above_configured)
            // Python's default, as for its limiters: an event loop that stalled does not
            // send the late requests together.
            .execution_bound(true);
        if let Some(after) = revert_after {
            config = config.revert_after(seconds("revert_after", after)?);
        }
        let configured = core_quota(py, &core)?;
        Ok(Followers {
            table: paceline::upstream::Followers::new(configured, config),
            core,
        })
    }

    /// Takes the turn of `key`'s upstream now if it is free (nobody waits, the pace has
    /// room); never waits.
    pub(crate) fn acquire_now(&self, key: &str) -> bool {
        let follower = self.table.get(key);
        let mut limiters = core::iter::once(follower.limiter()).chain(follower.execution_limiter());
        if !limiters
            .clone()
            .all(|l| l.peek().is_zero() && l.next_waiter_due_in().is_none())
        {
            return false;
        }
        // Room a moment ago; a racing caller may have taken it, and then the cells taken
        // stay spent (the strict side).
        limiters.all(|l| l.check().is_ok())
    }

    /// Books the turn of `key`'s upstream within `timeout` seconds (None: no maximum).
    #[pyo3(signature = (key, timeout=None))]
    pub(crate) fn book(&self, key: &str, timeout: Option<f64>) -> PyResult<Ticket> {
        let follower = self.table.get(key);
        let held = Arc::clone(follower.limiter())
            .reserve_within_owned(1, wait_budget(timeout)?)
            .map_err(too_late)?;
        Ok(Ticket::new(Held::Direct(held)))
    }

    /// Takes the turn again from the execution limiter, at the moment the request is sent:
    /// a ticket, ready at once when the caller is on time.
    pub(crate) fn run(&self, key: &str) -> PyResult<Option<Ticket>> {
        let follower = self.table.get(key);
        let Some(run) = follower.execution_limiter() else {
            return Ok(None);
        };
        let held = Arc::clone(run)
            .reserve_within_owned(1, Duration::MAX)
            .map_err(too_late)?;
        realign(&follower, run, &held);
        Ok(Some(Ticket::new(Held::Direct(held))))
    }

    /// Blocks the calling thread (GIL released) for the turn of `key`'s upstream, within
    /// `timeout` seconds: `TimeoutError` if the turn is further away, or a hold moves it
    /// past the deadline while it waits (the turn is then given back).
    #[pyo3(signature = (key, timeout=None))]
    pub(crate) fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: &str,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let follower = self.table.get(key);
        let budget = wait_budget(timeout)?;
        let deadline = std::time::Instant::now().checked_add(budget);
        for limiter in core::iter::once(follower.limiter()).chain(follower.execution_limiter()) {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            let held = Arc::clone(limiter)
                .reserve_within_owned(1, left)
                .map_err(too_late)?;
            if !Arc::ptr_eq(limiter, follower.limiter()) {
                realign(&follower, limiter, &held);
            }
            block_until(py, Held::Direct(held), deadline)?;
        }
        Ok(())
    }

    /// The instant a request to `key`'s upstream leaves (to pass to `observe`).
    pub(crate) fn sent(&self, key: &str) -> u64 {
        self.table.get(key).sent().nanos()
    }

    /// Reads a response (its status, and its headers as `(name, value)` pairs) to a request
    /// sent at `sent` and steers `key`'s follower; returns the hold applied in seconds (or
    /// None), and whether waiting turns may have moved (a hold, a new pace).
    pub(crate) fn observe(
        &self,
        py: Python<'_>,
        key: &str,
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        sent: u64,
    ) -> PyResult<(Option<f64>, bool)> {
        let signal = Signal::read(
            status,
            headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
            SystemTime::now(),
        );
        let follower = self.table.get(key);
        let before = follower.limiter().quota();
        // The caller may have changed its own limiter's quota: the configured one.
        follower.set_configured(core_quota(py, &self.core)?);
        let hold = follower.apply(&signal, Sent::from_nanos(sent));
        let moved = hold.is_some() || follower.limiter().quota() != before;
        Ok((hold.map(|d| d.as_secs_f64()), moved))
    }

    /// The pace `key`'s follower keeps now: `(1, seconds between requests, burst)`.
    pub(crate) fn quota(&self, key: &str) -> (u32, f64, u32) {
        let quota = self.table.get(key).limiter().quota();
        (1, quota.emission_interval().as_secs_f64(), quota.burst())
    }

    /// Whether `key`'s follower's pace is above the caller's own quota (it may be, with
    /// `above_configured`).
    pub(crate) fn above_configured(&self, key: &str) -> bool {
        let follower = self.table.get(key);
        follower.limiter().quota().emission_interval() < follower.configured().emission_interval()
    }

    /// The rate `key`'s upstream announced (requests per second), if one is in force.
    pub(crate) fn announced(&self, key: &str) -> Option<f64> {
        self.table.get(key).announced()
    }

    /// Seconds until `key`'s upstream takes a request (0.0: now); spends nothing.
    pub(crate) fn wait_time(&self, key: &str) -> f64 {
        self.table.get(key).limiter().peek().as_secs_f64()
    }

    pub(crate) fn __len__(&self) -> usize {
        self.table.len()
    }
}

/// After a request booked its turn `held` on the execution limiter `run`: when that turn
/// is an interval or more away (it resumed late, after a stall), holds the booking
/// limiter until the execution limiter admits again (`Follower::until_ready`'s
/// realignment). A moment's lag (timer jitter) holds nothing.
fn realign(follower: &Follower, run: &Limiter, held: &OwnedReservation) {
    if held.ready_in() >= run.quota().emission_interval() {
        let next = run.peek();
        if !next.is_zero() {
            follower.limiter().hold_for(next);
        }
    }
}
