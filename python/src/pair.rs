//! A booking limiter and its execution limiter, and what this process's calls came to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::args::{check_n, max_wait, quota, too_late};
use crate::cells::{Cell, Took};
use crate::wait::{block, no_room_wait, sleep, Held, NoRoom, Ticket};
use paceline::Denied;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A booking cell and, unless turned off, an execution cell of the same quota (module
/// docs), and what this process's calls on it came to.
pub(crate) struct Pair<L: Cell> {
    pub(crate) booked: Arc<L>,
    pub(crate) exec: Option<Arc<L>>,
    pub(crate) stats: Stats,
    /// Where this object's last realignment of a direct cell held its booking cell to
    /// (ns on [`elapsed`]'s scale), so that the late waiters of one stall, resuming one
    /// after another, hold it once per [`SLACK`] rather than once each ([`Pair::realign`]).
    /// Relaxed: a hint between this object's own realignments; a race holds once more or
    /// once less than it might, and the next late waiter puts either right.
    held_to: AtomicU64,
}

/// How far behind the execution cell may fall before the booking cell is held for it
/// ([`Pair::realign`]): a few of an event loop's timer ticks.
const SLACK: Duration = Duration::from_millis(5);

/// Nanoseconds since this process first asked.
fn elapsed() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Counts of this limiter object's calls (`stats()`): the Rust crate's `metrics` counters
/// for Python. Relaxed: independent counters, read together only as a report.
///
/// Every update is made attached to the interpreter (the `Python` token its methods
/// take). With the GIL that means holding it, so no two updates run at once and a plain
/// load and store counts exactly, where an atomic read-modify-write would cost about as
/// much as a limiter's decision; a free-threaded build adds atomically ([`add`]).
#[derive(Default)]
pub(crate) struct Stats {
    admitted: AtomicU64,
    waited: AtomicU64,
    refused: AtomicU64,
    /// The waits of the `waited` calls, summed, and the longest (ns).
    wait_total: AtomicU64,
    wait_max: AtomicU64,
}

impl Stats {
    pub(crate) fn admitted(&self, py: Python<'_>) {
        add(py, &self.admitted, 1);
    }

    pub(crate) fn refused(&self, py: Python<'_>) {
        add(py, &self.refused, 1);
    }

    /// A booking: admitted when its turn is now, else waited for `wait`.
    pub(crate) fn booked(&self, py: Python<'_>, wait: Duration) {
        if wait.is_zero() {
            return self.admitted(py);
        }
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        add(py, &self.waited, 1);
        add(py, &self.wait_total, nanos);
        #[cfg(Py_GIL_DISABLED)]
        self.wait_max.fetch_max(nanos, Ordering::Relaxed);
        #[cfg(not(Py_GIL_DISABLED))]
        self.wait_max.store(
            self.wait_max.load(Ordering::Relaxed).max(nanos),
            Ordering::Relaxed,
        );
    }

    /// The report: `admitted`, `waited`, `refused`, `wait_seconds_total`,
    /// `wait_seconds_max`.
    pub(crate) fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        dict.set_item("admitted", get(&self.admitted))?;
        dict.set_item("waited", get(&self.waited))?;
        dict.set_item("refused", get(&self.refused))?;
        let seconds = |c: &AtomicU64| Duration::from_nanos(get(c)).as_secs_f64();
        dict.set_item("wait_seconds_total", seconds(&self.wait_total))?;
        dict.set_item("wait_seconds_max", seconds(&self.wait_max))?;
        Ok(dict)
    }
}

/// `d` in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Adds `by` to `counter`, attached to the interpreter (see [`Stats`]).
#[inline]
fn add(_attached: Python<'_>, counter: &AtomicU64, by: u64) {
    #[cfg(Py_GIL_DISABLED)]
    counter.fetch_add(by, Ordering::Relaxed);
    #[cfg(not(Py_GIL_DISABLED))]
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl<L: Cell> Pair<L> {
    pub(crate) fn new(booked: Arc<L>, exec: Option<Arc<L>>) -> Pair<L> {
        Pair {
            booked,
            exec,
            stats: Stats::default(),
            held_to: AtomicU64::new(0),
        }
    }

    pub(crate) fn burst(&self) -> u32 {
        self.booked.quota().burst()
    }

    /// [`Pair::take_now`], counted as admitted or refused.
    pub(crate) fn try_acquire(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<Took> {
        let taken = self.take_now(py, key, n)?;
        if taken == Took::Yes {
            self.stats.admitted(py);
        } else {
            self.stats.refused(py);
        }
        Ok(taken)
    }

    /// `acquire`'s first step: [`Pair::take_now`], counted only when admitted (otherwise
    /// the booking that follows is what counts).
    pub(crate) fn acquire_now(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<bool> {
        let taken = self.take_now(py, key, n)? == Took::Yes;
        if taken {
            self.stats.admitted(py);
        }
        Ok(taken)
    }

    /// Takes `n` cells now if nobody waits ahead and they fit; never waits (but for
    /// another process's claim of a new key's bucket, at most
    /// `paceline::shared::CLAIM_PATIENCE`, the GIL let go).
    ///
    /// `n` over the burst raises `ValueError`, checked only once it was not admitted
    /// (admitted, it fitted the burst): the admission reads the quota once.
    pub(crate) fn take_now(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<Took> {
        // Both cells in one step that looks at the execution cell first.
        let took = match &self.exec {
            Some(exec) => self.booked.take_with(py, exec, key, n),
            None => self.booked.take(py, key, n),
        };
        if took == Took::Yes {
            return Ok(took);
        }
        check_n(n, self.burst())?;
        // The execution cell's table had no room for a key the booking cell refuses
        // anyway, stored there with its cells spent: a refusal, not a full table.
        if took == Took::TableFull
            && self.booked.has_room(key)
            && !self.booked.wait_time(key, n).is_zero()
        {
            return Ok(Took::No);
        }
        Ok(took)
    }

    /// Seconds until `n` cells would be admitted (0.0: now); spends nothing.
    pub(crate) fn wait_time(&self, key: &L::Key, n: u32) -> PyResult<f64> {
        check_n(n, self.burst())?;
        let booked = self.booked.wait_time(key, n);
        let wait = self
            .exec
            .as_ref()
            .map_or(booked, |exec| booked.max(exec.wait_time(key, n)));
        Ok(wait.as_secs_f64())
    }

    pub(crate) fn remaining(&self, key: &L::Key) -> u32 {
        let booked = self.booked.remaining(key);
        self.exec
            .as_ref()
            .map_or(booked, |exec| booked.min(exec.remaining(key)))
    }

    /// Books `n` cells in the FIFO queue within `timeout` seconds (None: no maximum).
    /// A new key the limiter has no room for yet raises `NoRoom` with the seconds until
    /// room is expected (within the timeout; beyond it, `TimeoutError`): the caller waits
    /// and books again.
    pub(crate) fn book(
        &self,
        py: Python<'_>,
        key: &L::Key,
        n: u32,
        timeout: Option<f64>,
    ) -> PyResult<Ticket> {
        check_n(n, self.burst())?;
        let held = self.reserve(py, key, n, timeout)?;
        Ok(Ticket::new(held))
    }

    /// Books `n` cells within `timeout` seconds, counted: admitted (the turn is now),
    /// waited, or refused (too far away: `TimeoutError`); no room for a new key yet is
    /// `NoRoom` (see [`Pair::book`]).
    pub(crate) fn reserve(
        &self,
        py: Python<'_>,
        key: &L::Key,
        n: u32,
        timeout: Option<f64>,
    ) -> PyResult<Held> {
        let max = max_wait(timeout)?;
        match self.booked.reserve(py, key, n, max) {
            Ok(held) => {
                self.stats.booked(py, held.ready_in());
                Ok(held)
            }
            Err(Denied::NotUntil(e)) if e.is_table_full() && e.wait_time() <= max => {
                Err(NoRoom::new_err(e.wait_time().as_secs_f64()))
            }
            Err(denied) => {
                self.stats.refused(py);
                Err(too_late(denied))
            }
        }
    }

    /// Takes `n` cells from the execution cell at the moment the work runs: a ticket to
    /// wait for (ready at once when the caller is on time), or None without the bound
    /// (`NoRoom` as [`Pair::book`]).
    pub(crate) fn run(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<Option<Ticket>> {
        let Some(exec) = &self.exec else {
            return Ok(None);
        };
        let held = match exec.reserve(py, key, n, Duration::MAX) {
            Ok(held) => held,
            Err(Denied::NotUntil(e)) if e.is_table_full() => {
                return Err(NoRoom::new_err(e.wait_time().as_secs_f64()))
            }
            Err(denied) => return Err(too_late(denied)),
        };
        self.realign(py, key, n, &held);
        Ok(Some(Ticket::new(held)))
    }

    /// After a late waiter booked its execution cells for later (`held`): holds the
    /// booking cell until the execution cell admits again, so that the turns booked
    /// from now on (and those booked for before then, moved) come when their work can
    /// run. Otherwise every later waiter would wait twice, its booked turn and then its
    /// execution cells, for as long as the load lasts, and the next stall would find
    /// them all waiting for execution cells, with nothing left to space them when they
    /// resume together.
    ///
    /// Only a wait of a whole interval, and of [`SLACK`], or more counts: a waiter a
    /// moment late (timer jitter) waits that moment, and holding the booking cell for it
    /// would push every later turn back by each such moment, for good. An event loop
    /// resumes waiters in rounds of its timer's resolution (about a millisecond), so at
    /// 10 000/s every round's waiters but the first wait an interval or more for their
    /// execution cells; holding for each of them would drift 20 000 tasks from 2.0 s
    /// to 3.3 s, where nothing is late but the rounds. A direct cell is also held again
    /// only once the execution cell is [`SLACK`] further behind than the last hold left
    /// it: a hold moves every turn booked (it costs the length of the queue), and the late
    /// waiters of one stall each find the execution cell one interval further behind. A
    /// keyed cell's holds are its key's alone, and made for each.
    fn realign(&self, py: Python<'_>, key: &L::Key, n: u32, held: &Held) {
        if held.ready_in() < self.booked.quota().emission_interval().max(SLACK) {
            return;
        }
        let Some(exec) = &self.exec else { return };
        let next = exec.wait_time(key, n);
        if next.is_zero() || next == Duration::MAX {
            return;
        }
        if L::DIRECT {
            let until = elapsed().saturating_add(nanos(next));
            let held_to = self.held_to.load(Ordering::Relaxed);
            if until < held_to.saturating_add(nanos(SLACK)) {
                return;
            }
            self.held_to.fetch_max(until, Ordering::Relaxed);
        }
        self.booked.hold(py, key, next);
    }

    /// Blocks the calling thread (GIL released) for a booked turn, then the execution
    /// cell; a new key with no room yet waits for room first (within the timeout).
    pub(crate) fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: &L::Key,
        n: u32,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        check_n(n, self.burst())?;
        let deadline = max_wait(timeout)?;
        let started = std::time::Instant::now();
        let booked = loop {
            let left = (deadline != Duration::MAX)
                .then(|| deadline.saturating_sub(started.elapsed()).as_secs_f64());
            match self.reserve(py, key, n, left) {
                Ok(held) => break held,
                Err(e) if e.is_instance_of::<NoRoom>(py) => sleep(py, no_room_wait(py, &e))?,
                Err(e) => return Err(e),
            }
        };
        block(py, booked)?;
        if let Some(exec) = &self.exec {
            let run = loop {
                match exec.reserve(py, key, n, Duration::MAX) {
                    Ok(held) => {
                        self.realign(py, key, n, &held);
                        break held;
                    }
                    Err(Denied::NotUntil(e)) if e.is_table_full() => sleep(py, e.wait_time())?,
                    Err(denied) => return Err(too_late(denied)),
                }
            };
            block(py, run)?;
        }
        Ok(())
    }

    /// Changes the quota of both cells; booked turns keep their places.
    pub(crate) fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
        let quota = quota(count, per, burst)?;
        self.booked.set_quota(quota)?;
        if let Some(exec) = &self.exec {
            exec.set_quota(quota)?;
        }
        Ok(())
    }

    /// Holds every cell (of `key`) back for `seconds`, in both cells.
    pub(crate) fn hold(&self, py: Python<'_>, key: &L::Key, seconds: f64) -> PyResult<()> {
        let d = Duration::try_from_secs_f64(seconds).map_err(|_| {
            PyValueError::new_err(format!(
                "seconds must be a finite number >= 0, got {seconds}"
            ))
        })?;
        if let Some(max) = self.booked.max_hold().filter(|max| d > *max) {
            return Err(PyValueError::new_err(format!(
                "a shared limiter holds at most {} seconds (a hold lives in the file, past \
                 the process that set it), got {seconds}",
                max.as_secs()
            )));
        }
        self.booked.hold(py, key, d);
        if let Some(exec) = &self.exec {
            exec.hold(py, key, d);
        }
        Ok(())
    }

    /// Forgets what was spent and held, in both cells.
    pub(crate) fn reset(&self, key: &L::Key) -> PyResult<()> {
        self.booked.reset(key)?;
        if let Some(exec) = &self.exec {
            exec.reset(key)?;
        }
        Ok(())
    }

    /// The quota as `(rate, per seconds, burst)`: one cell per interval, so the rate is the
    /// burst's count over the burst window.
    pub(crate) fn quota(&self) -> (u32, f64, u32) {
        let quota = self.booked.quota();
        let interval = quota.emission_interval().as_secs_f64();
        (1, interval, quota.burst())
    }
}
