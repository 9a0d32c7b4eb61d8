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

mod asgi;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, SystemTime};

use paceline::shared::{
    OnMismatch, OwnedSharedKeyReservation, OwnedSharedReservation, SharedError, SharedKeyedLimiter,
    SharedLimiter,
};
use paceline::upstream::{FollowerConfig, Sent, Signal};
use paceline::{
    Denied, KeyedLimiter, Limiter, OwnedKeyReservation, OwnedReservation, Quota, QuotaError,
    TextKey,
};
use pyo3::exceptions::{PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `count` cells per `per` seconds with `burst`, or a `ValueError` saying why not, in the
/// Python API's words.
fn quota(count: u32, per: f64, burst: u32) -> PyResult<Quota> {
    let too_long = || {
        PyValueError::new_err(format!(
            "per / rate = {per:?} s / {count} is too long: paceline keeps intervals up to \
             u64::MAX nanoseconds (about 584 years)"
        ))
    };
    let period = Duration::try_from_secs_f64(per).map_err(|_| {
        if per.is_finite() && per > 0.0 {
            too_long()
        } else {
            PyValueError::new_err(format!(
                "per must be a positive, finite number of seconds, got {per}"
            ))
        }
    })?;
    let invalid = |e: QuotaError| match e {
        QuotaError::ZeroCount => PyValueError::new_err("rate must be at least 1"),
        QuotaError::ZeroPeriod => PyValueError::new_err("per must be more than 0 seconds"),
        QuotaError::ZeroBurst => PyValueError::new_err("burst must be at least 1"),
        QuotaError::IntervalTooShort => PyValueError::new_err(format!(
            "per / rate = {per:?} s / {count} is below one nanosecond, the finest interval \
             paceline keeps"
        )),
        QuotaError::IntervalTooLong => too_long(),
        other => PyValueError::new_err(other.to_string()),
    };
    Quota::try_new(count, period)
        .map_err(invalid)?
        .try_with_burst(burst)
        .map_err(invalid)
}

/// A `Duration` from optional seconds: `None` (or infinity, as for `asyncio.wait_for`)
/// means no maximum.
fn max_wait(timeout: Option<f64>) -> PyResult<Duration> {
    match timeout {
        None => Ok(Duration::MAX),
        Some(t) if t == f64::INFINITY => Ok(Duration::MAX),
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
    Keyed(OwnedKeyReservation<TextKey, paceline::clock::DefaultClock>),
    Shared(OwnedSharedReservation),
    SharedKeyed(OwnedSharedKeyReservation),
}

impl Held {
    fn ready_in(&self) -> Duration {
        match self {
            Held::Direct(r) => r.ready_in(),
            Held::Keyed(r) => r.ready_in(),
            Held::Shared(r) => r.ready_in(),
            Held::SharedKeyed(r) => r.ready_in(),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
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

/// How long a blocked thread sleeps between two looks for Python signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(20);

/// Unparks the blocked thread when its turn is fired.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Blocks (GIL released) until `held`'s turn comes, looking for signals at least every
/// [`SIGNAL_CHECK`], as Python's own blocking calls do: a signal handler that raises
/// (Ctrl-C's `KeyboardInterrupt`) ends the wait with its exception, and `held` is dropped,
/// which gives the cells back if the turn has not come.
fn block(py: Python<'_>, mut held: Held) -> PyResult<()> {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
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

/// What a Python limiter needs of a paceline limiter: in-process or shared across
/// processes, direct (key `()`) or keyed.
trait Cell: Send + Sync + 'static {
    type Key;
    /// The key a Python `str` names.
    fn key(key: String) -> Self::Key;
    /// Books `n` cells within `max` (owning the limiter and key).
    fn reserve(self: &Arc<Self>, key: &Self::Key, n: u32, max: Duration) -> Result<Held, Denied>;
    /// How long until `n` cells would be admitted (zero: now); spends nothing.
    fn wait_time(&self, key: &Self::Key, n: u32) -> Duration;
    /// Whether `n` cells would be admitted now; spends nothing.
    fn fits(&self, key: &Self::Key, n: u32) -> bool {
        self.wait_time(key, n).is_zero()
    }
    /// Takes `n` cells now, or nothing.
    fn take(&self, key: &Self::Key, n: u32) -> bool;
    fn remaining(&self, key: &Self::Key) -> u32;
    fn quota(&self) -> Quota;
    fn set_quota(&self, quota: Quota) -> PyResult<()>;
    /// Holds every cell (of `key`) back for `d`, booked turns included.
    fn hold(&self, key: &Self::Key, d: Duration);
}

impl Cell for Limiter {
    type Key = ();

    fn key(_: String) {}

    fn reserve(self: &Arc<Self>, (): &(), n: u32, max: Duration) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_within_owned(n, max)
            .map(Held::Direct)
    }

    fn wait_time(&self, (): &(), n: u32) -> Duration {
        self.peek_n(n).unwrap_or(Duration::MAX)
    }

    fn take(&self, (): &(), n: u32) -> bool {
        self.check_n(n).is_ok()
    }

    fn remaining(&self, (): &()) -> u32 {
        Limiter::remaining(self)
    }

    fn quota(&self) -> Quota {
        Limiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        Limiter::set_quota(self, quota);
        Ok(())
    }

    fn hold(&self, (): &(), d: Duration) {
        self.hold_for(d);
    }
}

impl Cell for KeyedLimiter<TextKey> {
    type Key = TextKey;

    fn key(key: String) -> TextKey {
        key.into()
    }

    fn reserve(self: &Arc<Self>, key: &TextKey, n: u32, max: Duration) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_key_within_owned(key.clone(), n, max)
            .map(Held::Keyed)
    }

    fn wait_time(&self, key: &TextKey, n: u32) -> Duration {
        self.peek_key_n(key, n).unwrap_or(Duration::MAX)
    }

    fn take(&self, key: &TextKey, n: u32) -> bool {
        self.check_key_n(key, n).is_ok()
    }

    fn remaining(&self, key: &TextKey) -> u32 {
        self.remaining_key(key)
    }

    fn quota(&self) -> Quota {
        KeyedLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        KeyedLimiter::set_quota(self, quota);
        Ok(())
    }

    fn hold(&self, key: &TextKey, d: Duration) {
        self.hold_key_for(key, d);
    }
}

impl Cell for SharedLimiter {
    type Key = ();

    fn key(_: String) {}

    fn reserve(self: &Arc<Self>, (): &(), n: u32, max: Duration) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_within_owned(n, max)
            .map(Held::Shared)
    }

    fn wait_time(&self, (): &(), n: u32) -> Duration {
        self.peek_n(n).unwrap_or(Duration::MAX)
    }

    fn take(&self, (): &(), n: u32) -> bool {
        self.check_n(n).is_ok()
    }

    fn remaining(&self, (): &()) -> u32 {
        SharedLimiter::remaining(self)
    }

    fn quota(&self) -> Quota {
        SharedLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        SharedLimiter::set_quota(self, quota).map_err(shared_error)
    }

    fn hold(&self, (): &(), d: Duration) {
        self.hold_for(d);
    }
}

impl Cell for SharedKeyedLimiter {
    // Bytes: every process, in any language, finds the same key in the same slot.
    type Key = String;

    fn key(key: String) -> String {
        key
    }

    fn reserve(self: &Arc<Self>, key: &String, n: u32, max: Duration) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_key_within_owned(key, n, max)
            .map(Held::SharedKeyed)
    }

    fn wait_time(&self, key: &String, n: u32) -> Duration {
        self.peek_key_n(key, n).unwrap_or(Duration::MAX)
    }

    fn take(&self, key: &String, n: u32) -> bool {
        self.check_key_n(key, n).is_ok()
    }

    fn remaining(&self, key: &String) -> u32 {
        self.remaining_key(key)
    }

    fn quota(&self) -> Quota {
        SharedKeyedLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        SharedKeyedLimiter::set_quota(self, quota).map_err(shared_error)
    }

    fn hold(&self, key: &String, d: Duration) {
        self.hold_key_for(key, d);
    }
}

/// A shared file's error as Python's: the system's refusals as `OSError`, a file that is
/// not what was asked for (another quota, a damaged or foreign file) as `ValueError`.
fn shared_error(e: SharedError) -> PyErr {
    let describe = |q: Quota| {
        format!(
            "1 cell every {:?}, bursts of {}",
            q.emission_interval(),
            q.burst()
        )
    };
    match e {
        SharedError::Io { .. } | SharedError::NotLocal { .. } => PyOSError::new_err(e.to_string()),
        SharedError::QuotaMismatch { path, file, asked } => PyValueError::new_err(format!(
            "{}: the file enforces {}, not the {} asked for (pass on_mismatch=\"adopt\" to \
             use the file's, or on_mismatch=\"replace\" to set yours for every process)",
            path.display(),
            describe(file),
            describe(asked)
        )),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// What to do with a file holding another quota: "refuse", "adopt" or "replace".
pub(crate) fn on_mismatch(name: &str) -> PyResult<OnMismatch> {
    match name {
        "refuse" => Ok(OnMismatch::Refuse),
        "adopt" => Ok(OnMismatch::Adopt),
        "replace" => Ok(OnMismatch::Replace),
        other => Err(PyValueError::new_err(format!(
            "on_mismatch must be \"refuse\", \"adopt\" or \"replace\", got {other:?}"
        ))),
    }
}

/// A booking cell and, unless turned off, an execution cell of the same quota (module
/// docs), and what this process's calls on it came to.
struct Pair<L: Cell> {
    booked: Arc<L>,
    exec: Option<Arc<L>>,
    stats: Stats,
}

/// Counts of this limiter object's calls (`stats()`): the Rust crate's `metrics` counters
/// for Python. Relaxed: independent counters, read together only as a report.
#[derive(Default)]
struct Stats {
    admitted: AtomicU64,
    waited: AtomicU64,
    refused: AtomicU64,
    /// The waits of the `waited` calls, summed, and the longest (ns).
    wait_total: AtomicU64,
    wait_max: AtomicU64,
}

impl Stats {
    fn admitted(&self) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A booking: admitted when its turn is now, else waited for `wait`.
    fn booked(&self, wait: Duration) {
        if wait.is_zero() {
            return self.admitted();
        }
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.waited.fetch_add(1, Ordering::Relaxed);
        self.wait_total.fetch_add(nanos, Ordering::Relaxed);
        self.wait_max.fetch_max(nanos, Ordering::Relaxed);
    }

    /// The report: `admitted`, `waited`, `refused`, `wait_seconds_total`,
    /// `wait_seconds_max`.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
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

impl<L: Cell> Pair<L> {
    fn key(&self, key: String) -> L::Key {
        L::key(key)
    }

    fn burst(&self) -> u32 {
        self.booked.quota().burst()
    }

    /// [`Pair::take_now`], counted as admitted or refused.
    fn try_acquire(&self, key: &L::Key, n: u32) -> PyResult<bool> {
        let taken = self.take_now(key, n)?;
        if taken {
            self.stats.admitted();
        } else {
            self.stats.refused();
        }
        Ok(taken)
    }

    /// `acquire`'s first step: [`Pair::take_now`], counted only when admitted (otherwise
    /// the booking that follows is what counts).
    fn acquire_now(&self, key: &L::Key, n: u32) -> PyResult<bool> {
        let taken = self.take_now(key, n)?;
        if taken {
            self.stats.admitted();
        }
        Ok(taken)
    }

    /// Takes `n` cells now if nobody waits ahead and they fit; never waits.
    fn take_now(&self, key: &L::Key, n: u32) -> PyResult<bool> {
        check_n(n, self.burst())?;
        if self.exec.as_ref().is_some_and(|exec| !exec.fits(key, n)) {
            return Ok(false);
        }
        if !self.booked.take(key, n) {
            return Ok(false);
        }
        // The execution cell had room a moment ago; a racing caller may have taken it,
        // and then these cells stay spent (the strict side).
        Ok(self.exec.as_ref().is_none_or(|exec| exec.take(key, n)))
    }

    /// Seconds until `n` cells would be admitted (0.0: now); spends nothing.
    fn wait_time(&self, key: &L::Key, n: u32) -> PyResult<f64> {
        check_n(n, self.burst())?;
        let booked = self.booked.wait_time(key, n);
        let wait = self
            .exec
            .as_ref()
            .map_or(booked, |exec| booked.max(exec.wait_time(key, n)));
        Ok(wait.as_secs_f64())
    }

    fn remaining(&self, key: &L::Key) -> u32 {
        let booked = self.booked.remaining(key);
        self.exec
            .as_ref()
            .map_or(booked, |exec| booked.min(exec.remaining(key)))
    }

    /// Books `n` cells in the FIFO queue within `timeout` seconds (None: no maximum).
    fn book(&self, key: &L::Key, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
        check_n(n, self.burst())?;
        let held = self.reserve(key, n, timeout)?;
        Ok(Ticket::new(held))
    }

    /// Books `n` cells within `timeout` seconds, counted: admitted (the turn is now),
    /// waited, or refused (too far away: `TimeoutError`).
    fn reserve(&self, key: &L::Key, n: u32, timeout: Option<f64>) -> PyResult<Held> {
        match self.booked.reserve(key, n, max_wait(timeout)?) {
            Ok(held) => {
                self.stats.booked(held.ready_in());
                Ok(held)
            }
            Err(denied) => {
                self.stats.refused();
                Err(too_late(denied))
            }
        }
    }

    /// Takes `n` cells from the execution cell at the moment the work runs: a ticket to
    /// wait for (ready at once when the caller is on time), or None without the bound.
    fn run(&self, key: &L::Key, n: u32) -> PyResult<Option<Ticket>> {
        let Some(exec) = &self.exec else {
            return Ok(None);
        };
        let held = exec.reserve(key, n, Duration::MAX).map_err(too_late)?;
        Ok(Some(Ticket::new(held)))
    }

    /// Blocks the calling thread (GIL released) for a booked turn, then the execution
    /// cell.
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: &L::Key,
        n: u32,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        check_n(n, self.burst())?;
        let booked = self.reserve(key, n, timeout)?;
        block(py, booked)?;
        if let Some(exec) = &self.exec {
            let run = exec.reserve(key, n, Duration::MAX).map_err(too_late)?;
            block(py, run)?;
        }
        Ok(())
    }

    /// Changes the quota of both cells; booked turns keep their places.
    fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
        let quota = quota(count, per, burst)?;
        self.booked.set_quota(quota)?;
        if let Some(exec) = &self.exec {
            exec.set_quota(quota)?;
        }
        Ok(())
    }

    /// Holds every cell (of `key`) back for `seconds`, in both cells.
    fn hold(&self, key: &L::Key, seconds: f64) -> PyResult<()> {
        let d = Duration::try_from_secs_f64(seconds).map_err(|_| {
            PyValueError::new_err(format!(
                "seconds must be a finite number >= 0, got {seconds}"
            ))
        })?;
        self.booked.hold(key, d);
        if let Some(exec) = &self.exec {
            exec.hold(key, d);
        }
        Ok(())
    }

    /// The quota as `(rate, per seconds, burst)`: one cell per interval, so the rate is the
    /// burst's count over the burst window.
    fn quota(&self) -> (u32, f64, u32) {
        let quota = self.booked.quota();
        let interval = quota.emission_interval().as_secs_f64();
        (1, interval, quota.burst())
    }
}

/// The quota in force of a core of any of the four kinds (a keyed core's is every key's).
fn core_quota(py: Python<'_>, core: &Py<PyAny>) -> PyResult<Quota> {
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
struct Followers {
    table: paceline::upstream::Followers,
    core: Py<PyAny>,
}

/// A timeout in seconds as the longest wait: `None` is none.
fn wait_budget(timeout: Option<f64>) -> PyResult<Duration> {
    max_wait(timeout)
}

#[pymethods]
impl Followers {
    /// Followers for the limiter `core` (its quota is theirs): holds of at most `max_hold`
    /// seconds, announced quotas above the core's followed only if `above_configured`,
    /// forgotten after `revert_after` seconds without an announcement.
    #[new]
    #[pyo3(signature = (core, max_hold, above_configured, revert_after=None))]
    fn new(
        py: Python<'_>,
        core: Py<PyAny>,
        max_hold: f64,
        above_configured: bool,
        revert_after: Option<f64>,
    ) -> PyResult<Followers> {
        let seconds = |name: &str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                PyValueError::new_err(format!(
                    "{name} must be a finite number of seconds >= 0, got {s}"
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
    fn acquire_now(&self, key: &str) -> bool {
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
    fn book(&self, key: &str, timeout: Option<f64>) -> PyResult<Ticket> {
        let follower = self.table.get(key);
        let held = Arc::clone(follower.limiter())
            .reserve_within_owned(1, wait_budget(timeout)?)
            .map_err(too_late)?;
        Ok(Ticket::new(Held::Direct(held)))
    }

    /// Takes the turn again from the execution limiter, at the moment the request is sent:
    /// a ticket, ready at once when the caller is on time.
    fn run(&self, key: &str) -> PyResult<Option<Ticket>> {
        let follower = self.table.get(key);
        let Some(run) = follower.execution_limiter() else {
            return Ok(None);
        };
        let held = Arc::clone(run)
            .reserve_within_owned(1, Duration::MAX)
            .map_err(too_late)?;
        Ok(Some(Ticket::new(Held::Direct(held))))
    }

    /// Blocks the calling thread (GIL released) for the turn of `key`'s upstream, within
    /// `timeout` seconds: `TimeoutError` if the turn is further away, or a hold moves it
    /// past the deadline while it waits (the turn is then given back).
    #[pyo3(signature = (key, timeout=None))]
    fn acquire_blocking(&self, py: Python<'_>, key: &str, timeout: Option<f64>) -> PyResult<()> {
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
            block_until(py, Held::Direct(held), deadline)?;
        }
        Ok(())
    }

    /// The instant a request to `key`'s upstream leaves (to pass to `observe`).
    fn sent(&self, key: &str) -> u64 {
        self.table.get(key).sent().nanos()
    }

    /// Reads a response (its status, and its headers as `(name, value)` pairs) to a request
    /// sent at `sent` and steers `key`'s follower; returns the hold applied in seconds (or
    /// None), and whether waiting turns may have moved (a hold, a new pace).
    fn observe(
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
    fn quota(&self, key: &str) -> (u32, f64, u32) {
        let quota = self.table.get(key).limiter().quota();
        (1, quota.emission_interval().as_secs_f64(), quota.burst())
    }

    /// Whether `key`'s follower's pace is above the caller's own quota (it may be, with
    /// `above_configured`).
    fn above_configured(&self, key: &str) -> bool {
        let follower = self.table.get(key);
        follower.limiter().quota().emission_interval() < follower.configured().emission_interval()
    }

    /// The rate `key`'s upstream announced (requests per second), if one is in force.
    fn announced(&self, key: &str) -> Option<f64> {
        self.table.get(key).announced()
    }

    /// Seconds until `key`'s upstream takes a request (0.0: now); spends nothing.
    fn wait_time(&self, key: &str) -> f64 {
        self.table.get(key).limiter().peek().as_secs_f64()
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }
}

/// [`block`] with a deadline: past it, `held` is dropped (the turn given back) and the
/// wait ends with `TimeoutError`.
fn block_until(
    py: Python<'_>,
    mut held: Held,
    deadline: Option<std::time::Instant>,
) -> PyResult<()> {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
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

/// The methods every core has, for a direct (`keyed` absent) or keyed pair.
macro_rules! core_methods {
    ($core:ident, direct) => {
        #[pymethods]
        impl $core {
            /// The burst.
            fn burst(&self) -> u32 {
                self.0.burst()
            }

            /// Seconds between cells.
            fn interval(&self) -> f64 {
                self.0.quota().1
            }

            fn try_acquire(&self, n: u32) -> PyResult<bool> {
                self.0.try_acquire(&(), n)
            }

            fn acquire_now(&self, n: u32) -> PyResult<bool> {
                self.0.acquire_now(&(), n)
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
            fn book(&self, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
                self.0.book(&(), n, timeout)
            }

            fn run(&self, n: u32) -> PyResult<Option<Ticket>> {
                self.0.run(&(), n)
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

            fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
                self.0.set_quota(count, per, burst)
            }

            fn hold(&self, seconds: f64) -> PyResult<()> {
                self.0.hold(&(), seconds)
            }
        }
    };
    ($core:ident, keyed) => {
        #[pymethods]
        impl $core {
            fn burst(&self) -> u32 {
                self.0.burst()
            }

            fn try_acquire(&self, key: String, n: u32) -> PyResult<bool> {
                self.0.try_acquire(&self.0.key(key), n)
            }

            fn acquire_now(&self, key: String, n: u32) -> PyResult<bool> {
                self.0.acquire_now(&self.0.key(key), n)
            }

            fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let report = self.0.stats.report(py)?;
                report.set_item("keys", self.len())?;
                Ok(report)
            }

            fn remaining(&self, key: String) -> u32 {
                self.0.remaining(&self.0.key(key))
            }

            fn wait_time(&self, key: String, n: u32) -> PyResult<f64> {
                self.0.wait_time(&self.0.key(key), n)
            }

            #[pyo3(signature = (key, n, timeout=None))]
            fn book(&self, key: String, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
                self.0.book(&self.0.key(key), n, timeout)
            }

            fn run(&self, key: String, n: u32) -> PyResult<Option<Ticket>> {
                self.0.run(&self.0.key(key), n)
            }

            #[pyo3(signature = (key, n, timeout=None))]
            fn acquire_blocking(
                &self,
                py: Python<'_>,
                key: String,
                n: u32,
                timeout: Option<f64>,
            ) -> PyResult<()> {
                self.0.acquire_blocking(py, &self.0.key(key), n, timeout)
            }

            fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
                self.0.set_quota(count, per, burst)
            }

            fn hold(&self, key: String, seconds: f64) -> PyResult<()> {
                self.0.hold(&self.0.key(key), seconds)
            }

            fn __len__(&self) -> usize {
                self.len()
            }
        }
    };
}

/// A limiter shared by threads and event loops (see the module docs).
#[pyclass(frozen, module = "paceline._paceline")]
struct Core(Pair<Limiter>);
core_methods!(Core, direct);

/// A limiter per key (str), shared by threads and event loops.
#[pyclass(frozen, module = "paceline._paceline")]
struct KeyedCore(Pair<KeyedLimiter<TextKey>>);
core_methods!(KeyedCore, keyed);

impl KeyedCore {
    fn len(&self) -> usize {
        self.0.booked.len()
    }
}

/// A limiter in a file every process of the host maps (`paceline::shared`).
#[pyclass(frozen, module = "paceline._paceline")]
struct SharedCore(Pair<SharedLimiter>);
core_methods!(SharedCore, direct);

/// A limiter per key in a file every process of the host maps.
#[pyclass(frozen, module = "paceline._paceline")]
struct SharedKeyedCore(Pair<SharedKeyedLimiter>);
core_methods!(SharedKeyedCore, keyed);

impl SharedKeyedCore {
    fn len(&self) -> usize {
        self.0.booked.len()
    }
}

/// Makes a core of each kind; module-level functions, since a pyclass takes one
/// `#[pymethods]` block and the methods above are shared by macro.
#[pyfunction]
fn new_core(count: u32, per: f64, burst: u32, execution_bound: bool) -> PyResult<Core> {
    let quota = quota(count, per, burst)?;
    Ok(Core(Pair {
        booked: Arc::new(Limiter::new(quota)),
        exec: execution_bound.then(|| Arc::new(Limiter::new(quota))),
        stats: Stats::default(),
    }))
}

#[pyfunction]
#[pyo3(signature = (count, per, burst, execution_bound, max_keys=None))]
fn new_keyed_core(
    count: u32,
    per: f64,
    burst: u32,
    execution_bound: bool,
    max_keys: Option<usize>,
) -> PyResult<KeyedCore> {
    let quota = quota(count, per, burst)?;
    let make = || {
        let limiter = KeyedLimiter::new(quota);
        if let Some(max) = max_keys {
            limiter.set_max_keys(max);
        }
        Arc::new(limiter)
    };
    Ok(KeyedCore(Pair {
        booked: make(),
        exec: execution_bound.then(make),
        stats: Stats::default(),
    }))
}

/// Opens (or makes) the shared file at `path`; the execution cell is the file's second
/// lane, so the bound at the moment work runs holds across the processes too.
#[pyfunction]
fn new_shared_core(
    py: Python<'_>,
    path: std::path::PathBuf,
    count: u32,
    per: f64,
    burst: u32,
    execution_bound: bool,
    mismatch: &str,
) -> PyResult<SharedCore> {
    let quota = quota(count, per, burst)?;
    let mismatch = on_mismatch(mismatch)?;
    let booked = py
        .detach(|| SharedLimiter::open_with(&path, quota, mismatch))
        .map_err(shared_error)?;
    let exec = execution_bound.then(|| Arc::new(booked.execution_lane()));
    Ok(SharedCore(Pair {
        booked: Arc::new(booked),
        exec,
        stats: Stats::default(),
    }))
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn new_shared_keyed_core(
    py: Python<'_>,
    path: std::path::PathBuf,
    count: u32,
    per: f64,
    burst: u32,
    execution_bound: bool,
    capacity: u64,
    mismatch: &str,
) -> PyResult<SharedKeyedCore> {
    let quota = quota(count, per, burst)?;
    let mismatch = on_mismatch(mismatch)?;
    let booked = py
        .detach(|| SharedKeyedLimiter::open_with(&path, quota, capacity, mismatch))
        .map_err(shared_error)?;
    let exec = execution_bound.then(|| Arc::new(booked.execution_lane()));
    Ok(SharedKeyedCore(Pair {
        booked: Arc::new(booked),
        exec,
        stats: Stats::default(),
    }))
}

/// The module. Declared free-threading safe: every class is `frozen` and synchronised in
/// Rust (atomics and paceline's own locks), and no Python object is shared unguarded.
#[pymodule(gil_used = false)]
fn _paceline(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Core>()?;
    m.add_class::<KeyedCore>()?;
    m.add_class::<SharedCore>()?;
    m.add_class::<SharedKeyedCore>()?;
    m.add_class::<Ticket>()?;
    m.add_class::<Followers>()?;
    m.add_class::<asgi::AsgiCore>()?;
    m.add_class::<asgi::Waiting>()?;
    m.add_function(wrap_pyfunction!(asgi::new_asgi_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_keyed_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_shared_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_shared_keyed_core, m)?)?;
    Ok(())
}
