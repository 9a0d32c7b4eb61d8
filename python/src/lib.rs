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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use paceline::{
    Denied, KeyedLimiter, Limiter, OwnedKeyReservation, OwnedReservation, Quota, QuotaError,
    TextKey,
};
use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;

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
}

impl Held {
    fn ready_in(&self) -> Duration {
        match self {
            Held::Direct(r) => r.ready_in(),
            Held::Keyed(r) => r.ready_in(),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            Held::Direct(r) => Pin::new(r).poll(cx),
            Held::Keyed(r) => Pin::new(r).poll(cx),
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

/// What a Python limiter needs of a paceline limiter, direct (key `()`) or keyed.
trait Cell: Send + Sync + 'static {
    type Key;
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
    fn set_quota(&self, quota: Quota);
}

impl Cell for Limiter {
    type Key = ();

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

    fn set_quota(&self, quota: Quota) {
        Limiter::set_quota(self, quota);
    }
}

impl Cell for KeyedLimiter<TextKey> {
    type Key = TextKey;

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

    fn set_quota(&self, quota: Quota) {
        KeyedLimiter::set_quota(self, quota);
    }
}

/// A booking cell and, unless turned off, an execution cell of the same quota (module
/// docs), with the burst they share.
struct Pair<L: Cell> {
    booked: Arc<L>,
    exec: Option<Arc<L>>,
    burst: AtomicU32,
}

impl<L: Cell> Pair<L> {
    fn new(make: impl Fn() -> L, burst: u32, execution_bound: bool) -> Pair<L> {
        Pair {
            booked: Arc::new(make()),
            exec: execution_bound.then(|| Arc::new(make())),
            burst: AtomicU32::new(burst),
        }
    }

    fn burst(&self) -> u32 {
        // Relaxed: a setting read alone; the limiters hold the quota that decides.
        self.burst.load(Ordering::Relaxed)
    }

    /// Takes `n` cells now if nobody waits ahead and they fit; never waits.
    fn try_acquire(&self, key: &L::Key, n: u32) -> PyResult<bool> {
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
        let held = self
            .booked
            .reserve(key, n, max_wait(timeout)?)
            .map_err(too_late)?;
        Ok(Ticket::new(held))
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
        let booked = self
            .booked
            .reserve(key, n, max_wait(timeout)?)
            .map_err(too_late)?;
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
        self.booked.set_quota(quota);
        if let Some(exec) = &self.exec {
            exec.set_quota(quota);
        }
        // Relaxed: as in `burst`.
        self.burst.store(burst, Ordering::Relaxed);
        Ok(())
    }
}

/// A limiter shared by threads and event loops (see the module docs).
#[pyclass(frozen, module = "paceline._paceline")]
struct Core(Pair<Limiter>);

#[pymethods]
impl Core {
    #[new]
    fn new(count: u32, per: f64, burst: u32, execution_bound: bool) -> PyResult<Core> {
        let quota = quota(count, per, burst)?;
        Ok(Core(Pair::new(
            || Limiter::new(quota),
            burst,
            execution_bound,
        )))
    }

    /// The burst.
    fn burst(&self) -> u32 {
        self.0.burst()
    }

    /// Seconds between cells.
    fn interval(&self) -> f64 {
        self.0.booked.quota().emission_interval().as_secs_f64()
    }

    fn try_acquire(&self, n: u32) -> PyResult<bool> {
        self.0.try_acquire(&(), n)
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
    fn acquire_blocking(&self, py: Python<'_>, n: u32, timeout: Option<f64>) -> PyResult<()> {
        self.0.acquire_blocking(py, &(), n, timeout)
    }

    fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
        self.0.set_quota(count, per, burst)
    }
}

/// A limiter per key (str), shared by threads and event loops.
#[pyclass(frozen, module = "paceline._paceline")]
struct KeyedCore(Pair<KeyedLimiter<TextKey>>);

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
            if let Some(max) = max_keys {
                limiter.set_max_keys(max);
            }
            limiter
        };
        Ok(KeyedCore(Pair::new(make, burst, execution_bound)))
    }

    fn burst(&self) -> u32 {
        self.0.burst()
    }

    fn try_acquire(&self, key: String, n: u32) -> PyResult<bool> {
        self.0.try_acquire(&key.into(), n)
    }

    fn remaining(&self, key: String) -> u32 {
        self.0.remaining(&key.into())
    }

    fn wait_time(&self, key: String, n: u32) -> PyResult<f64> {
        self.0.wait_time(&key.into(), n)
    }

    #[pyo3(signature = (key, n, timeout=None))]
    fn book(&self, key: String, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
        self.0.book(&key.into(), n, timeout)
    }

    fn run(&self, key: String, n: u32) -> PyResult<Option<Ticket>> {
        self.0.run(&key.into(), n)
    }

    #[pyo3(signature = (key, n, timeout=None))]
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: String,
        n: u32,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        self.0.acquire_blocking(py, &key.into(), n, timeout)
    }

    fn set_quota(&self, count: u32, per: f64, burst: u32) -> PyResult<()> {
        self.0.set_quota(count, per, burst)
    }

    fn __len__(&self) -> usize {
        self.0.booked.len()
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
