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
mod budget;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, SystemTime};

use paceline::shared::{
    OnMismatch, OpenOptions, OwnedSharedKeyReservation, OwnedSharedReservation, SharedError,
    SharedKeyedLimiter, SharedLimiter,
};
use paceline::upstream::{Follow, Following, Signal, Steer};
use paceline::{
    Denied, KeyedLimiter, Limiter, OwnedKeyReservation, OwnedReservation, Quota, QuotaError,
    TextKey,
};
use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyTimeoutError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `count` cells per `per` seconds with `burst`, or a `ValueError` saying why not, in the
/// Python API's words.
fn quota(count: u32, per: f64, burst: u32) -> PyResult<Quota> {
    let too_long = || {
        PyValueError::new_err(format!(
            "per / rate = {} s / {count} is too long: paceline keeps intervals up to about 584 \
             years",
            Seconds(per)
        ))
    };
    let period = Duration::try_from_secs_f64(per).map_err(|_| {
        if per.is_finite() && per > 0.0 {
            too_long()
        } else {
            PyValueError::new_err(format!(
                "per must be a positive, finite number of seconds, got {}",
                Seconds(per)
            ))
        }
    })?;
    if period.is_zero() && per > 0.0 {
        // Positive, but less than a nanosecond: not "0 seconds", as the user wrote more.
        return Err(PyValueError::new_err(format!(
            "per / rate = {} s / {count} is below one nanosecond, the finest interval \
             paceline keeps",
            Seconds(per)
        )));
    }
    let invalid = |e: QuotaError| match e {
        QuotaError::ZeroCount => PyValueError::new_err("rate must be at least 1"),
        QuotaError::ZeroPeriod => PyValueError::new_err("per must be more than 0 seconds"),
        QuotaError::ZeroBurst => PyValueError::new_err("burst must be at least 1"),
        QuotaError::IntervalTooShort => PyValueError::new_err(format!(
            "per / rate = {} s / {count} is below one nanosecond, the finest interval \
             paceline keeps",
            Seconds(per)
        )),
        QuotaError::IntervalTooLong => too_long(),
        other => PyValueError::new_err(other.to_string()),
    };
    Quota::try_new(count, period)
        .map_err(invalid)?
        .try_with_burst(burst)
        .map_err(invalid)
}

/// A number of seconds as Python writes a float: `1e+300`, not three hundred digits.
struct Seconds(f64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.0;
        if s != 0.0 && s.is_finite() && !(1e-4..1e16).contains(&s.abs()) {
            write!(f, "{s:e}")
        } else {
            write!(f, "{s:?}")
        }
    }
}

/// A `Duration` from optional seconds: `None` (or infinity, as for `asyncio.wait_for`)
/// means no maximum, and so does a timeout too long for any clock (past 584 years).
fn max_wait(timeout: Option<f64>) -> PyResult<Duration> {
    match timeout {
        None => Ok(Duration::MAX),
        Some(t) if t >= u64::MAX as f64 => Ok(Duration::MAX),
        Some(t) => Duration::try_from_secs_f64(t).map_err(|_| {
            PyValueError::new_err(format!(
                "timeout must be None or seconds >= 0, got {}",
                Seconds(t)
            ))
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

pyo3::create_exception!(
    _paceline,
    NoRoom,
    pyo3::exceptions::PyException,
    "A keyed limiter has no room to store a new key yet: args[0] is the seconds until room is expected (internal: acquire waits and books again)."
);

/// The seconds a `NoRoom` carries.
fn no_room_wait(py: Python<'_>, e: &PyErr) -> Duration {
    let seconds = e
        .value(py)
        .getattr("args")
        .and_then(|args| args.get_item(0))
        .and_then(|s| s.extract::<f64>())
        .unwrap_or(0.0);
    Duration::try_from_secs_f64(seconds).unwrap_or(SIGNAL_CHECK)
}

/// Sleeps `d` (GIL released), looking for signals at least every [`SIGNAL_CHECK`].
fn sleep(py: Python<'_>, d: Duration) -> PyResult<()> {
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

/// What a refused booking raises: the wait was longer than the timeout.
fn too_late(denied: Denied) -> PyErr {
    match denied {
        Denied::NotUntil(e) if e.is_table_full() => PyTimeoutError::new_err(format!(
            "no room to store this new key for {:.6} s (the limiter holds as many keys as it \
             has room for, each still limited), longer than the timeout; nothing was booked",
            e.wait_time().as_secs_f64()
        )),
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
    /// Books `n` cells within `max` (owning the limiter and key); the GIL is let go where
    /// booking may wait for another process (a shared key's bucket).
    fn reserve(
        self: &Arc<Self>,
        py: Python<'_>,
        key: &Self::Key,
        n: u32,
        max: Duration,
    ) -> Result<Held, Denied>;
    /// How long until `n` cells would be admitted (zero: now); spends nothing.
    fn wait_time(&self, key: &Self::Key, n: u32) -> Duration;
    /// Whether `n` cells would be admitted now; spends nothing.
    fn fits(&self, key: &Self::Key, n: u32) -> bool {
        self.wait_time(key, n).is_zero()
    }
    /// Takes `n` cells now, or nothing (the GIL is released if storing a new key may wait
    /// for another process).
    fn take(&self, py: Python<'_>, key: &Self::Key, n: u32) -> Took;
    fn remaining(&self, key: &Self::Key) -> u32;
    fn quota(&self) -> Quota;
    fn set_quota(&self, quota: Quota) -> PyResult<()>;
    /// Holds every cell (of `key`) back for `d`, booked turns included.
    fn hold(&self, py: Python<'_>, key: &Self::Key, d: Duration);
    /// Whether `key` is stored or could be (false: a check would find the table full).
    fn has_room(&self, _key: &Self::Key) -> bool {
        true
    }
    /// The longest hold it keeps (a shared file's outlive their process), if bounded.
    fn max_hold(&self) -> Option<Duration> {
        None
    }
    /// Forgets what was spent and held (a shared file's operator action).
    fn reset(&self, _key: &Self::Key) -> PyResult<()> {
        Err(PyTypeError::new_err(
            "reset() is for shared limiters: an in-process limiter's state ends with it",
        ))
    }
}

impl Cell for Limiter {
    type Key = ();

    fn key(_: String) {}

    fn reserve(
        self: &Arc<Self>,
        _: Python<'_>,
        (): &(),
        n: u32,
        max: Duration,
    ) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_within_owned(n, max)
            .map(Held::Direct)
    }

    fn wait_time(&self, (): &(), n: u32) -> Duration {
        self.peek_n(n).unwrap_or(Duration::MAX)
    }

    fn take(&self, _: Python<'_>, (): &(), n: u32) -> Took {
        self.check_n(n).into()
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

    fn hold(&self, _: Python<'_>, (): &(), d: Duration) {
        self.hold_for(d);
    }
}

impl Cell for KeyedLimiter<TextKey> {
    type Key = TextKey;

    fn key(key: String) -> TextKey {
        key.into()
    }

    fn reserve(
        self: &Arc<Self>,
        _: Python<'_>,
        key: &TextKey,
        n: u32,
        max: Duration,
    ) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_key_within_owned(key.clone(), n, max)
            .map(Held::Keyed)
    }

    fn wait_time(&self, key: &TextKey, n: u32) -> Duration {
        self.peek_key_n(key, n).unwrap_or(Duration::MAX)
    }

    fn take(&self, _: Python<'_>, key: &TextKey, n: u32) -> Took {
        self.check_key_n(key, n).into()
    }

    fn has_room(&self, key: &TextKey) -> bool {
        self.has_room_for(key)
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

    fn hold(&self, _: Python<'_>, key: &TextKey, d: Duration) {
        self.hold_key_for(key, d);
    }
}

impl Cell for SharedLimiter {
    type Key = ();

    fn key(_: String) {}

    fn reserve(
        self: &Arc<Self>,
        _: Python<'_>,
        (): &(),
        n: u32,
        max: Duration,
    ) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_within_owned(n, max)
            .map(Held::Shared)
    }

    fn wait_time(&self, (): &(), n: u32) -> Duration {
        self.peek_n(n).unwrap_or(Duration::MAX)
    }

    fn take(&self, _: Python<'_>, (): &(), n: u32) -> Took {
        self.check_n(n).into()
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

    fn hold(&self, _: Python<'_>, (): &(), d: Duration) {
        self.hold_for(d);
    }

    fn max_hold(&self) -> Option<Duration> {
        Some(paceline::shared::MAX_HOLD)
    }

    fn reset(&self, (): &()) -> PyResult<()> {
        SharedLimiter::reset(self);
        Ok(())
    }
}

impl Cell for SharedKeyedLimiter {
    // Bytes: every process, in any language, finds the same key in the same slot.
    type Key = String;

    fn key(key: String) -> String {
        key
    }

    fn reserve(
        self: &Arc<Self>,
        py: Python<'_>,
        key: &String,
        n: u32,
        max: Duration,
    ) -> Result<Held, Denied> {
        // Storing a new key may wait for another process's claim of its bucket.
        let limiter = Arc::clone(self);
        py.detach(|| limiter.reserve_key_within_owned(key, n, max))
            .map(Held::SharedKeyed)
    }

    fn wait_time(&self, key: &String, n: u32) -> Duration {
        self.peek_key_n(key, n).unwrap_or(Duration::MAX)
    }

    fn take(&self, py: Python<'_>, key: &String, n: u32) -> Took {
        // A stored key's check never waits; storing a new one may wait (briefly) for
        // another process's claim, so the GIL is let go for it.
        match self.check_key_n_if_stored(key, n) {
            Some(checked) => checked.into(),
            None => py.detach(|| self.check_key_n(key, n)).into(),
        }
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

    fn hold(&self, py: Python<'_>, key: &String, d: Duration) {
        py.detach(|| self.hold_key_for(key, d));
    }

    fn has_room(&self, key: &String) -> bool {
        self.has_room_for(key)
    }

    fn max_hold(&self) -> Option<Duration> {
        Some(paceline::shared::MAX_HOLD)
    }

    fn reset(&self, key: &String) -> PyResult<()> {
        self.reset_key(key);
        Ok(())
    }
}

/// What taking cells now came to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Took {
    Yes,
    No,
    /// A new key the keyed limiter had no room to store.
    TableFull,
}

impl From<Result<(), Denied>> for Took {
    fn from(checked: Result<(), Denied>) -> Took {
        match checked {
            Ok(()) => Took::Yes,
            Err(Denied::NotUntil(e)) if e.is_table_full() => Took::TableFull,
            Err(_) => Took::No,
        }
    }
}

/// `TABLE_FULL`: what a keyed limiter's `try_acquire` returns for a new key it had no
/// room to store. False in a condition, as a refusal; told apart with `is`.
#[pyclass(frozen, module = "paceline._paceline", name = "TableFull")]
struct TableFull;

#[pymethods]
impl TableFull {
    fn __bool__(&self) -> bool {
        false
    }

    fn __repr__(&self) -> &'static str {
        "paceline.TABLE_FULL"
    }
}

/// The one `TABLE_FULL` object.
static TABLE_FULL: pyo3::sync::PyOnceLock<Py<TableFull>> = pyo3::sync::PyOnceLock::new();

fn table_full(py: Python<'_>) -> PyResult<&Py<TableFull>> {
    TABLE_FULL.get_or_try_init(py, || Py::new(py, TableFull))
}

/// A keyed `try_acquire`'s answer: True, False, or `TABLE_FULL`.
fn took_object(py: Python<'_>, took: Took) -> PyResult<Py<PyAny>> {
    Ok(match took {
        Took::Yes => true.into_pyobject(py)?.to_owned().into_any().unbind(),
        Took::No => false.into_pyobject(py)?.to_owned().into_any().unbind(),
        Took::TableFull => table_full(py)?.clone_ref(py).into_any(),
    })
}

/// A shared file's error as Python's: the system's refusals as `OSError`, a file someone
/// else owns or can write as `PermissionError`, a file that is not what was asked for
/// (another quota, a damaged or foreign file) as `ValueError`; the fixes in Python's words.
fn shared_error(e: SharedError) -> PyErr {
    let describe = |q: Quota| {
        format!(
            "1 cell every {:?}, bursts of {}",
            q.emission_interval(),
            q.burst()
        )
    };
    match e {
        SharedError::Io { ref source, .. } => match source.kind() {
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(e.to_string()),
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(e.to_string()),
            _ => PyOSError::new_err(e.to_string()),
        },
        SharedError::NotLocal { .. } => PyOSError::new_err(e.to_string()),
        SharedError::Untrusted { owner, group, .. } => PyPermissionError::new_err(
            // The Rust message, with its options as Python's arguments.
            e.to_string()
                .replace(
                    &format!("OpenOptions::trust_user({owner})"),
                    &format!("trust_user={owner}"),
                )
                .replace(
                    &format!("OpenOptions::trust_group({group})"),
                    &format!("trust_group={group}"),
                ),
        ),
        SharedError::Capacity { asked } => PyValueError::new_err(format!(
            "capacity must be between 1 and {} keys, got {asked}",
            paceline::shared::MAX_CAPACITY
        )),
        SharedError::CapacityMismatch { path, file, asked } => PyValueError::new_err(format!(
            "{}: the file was made for {file} keys, not the {asked} asked for (pass \
             on_mismatch=\"adopt\" to use the file's)",
            path.display()
        )),
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

/// The options a shared file is opened with, from Python's arguments.
pub(crate) fn open_options(
    mismatch: &str,
    trust_user: Option<u32>,
    trust_group: Option<u32>,
    name: Option<String>,
) -> PyResult<OpenOptions> {
    let mut options = OpenOptions::new().on_mismatch(on_mismatch(mismatch)?);
    if let Some(uid) = trust_user {
        options = options.trust_user(uid);
    }
    if let Some(gid) = trust_group {
        options = options.trust_group(gid);
    }
    if let Some(name) = name {
        options = options.name(name);
    }
    Ok(options)
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
    fn try_acquire(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<Took> {
        let taken = self.take_now(py, key, n)?;
        if taken == Took::Yes {
            self.stats.admitted();
        } else {
            self.stats.refused();
        }
        Ok(taken)
    }

    /// `acquire`'s first step: [`Pair::take_now`], counted only when admitted (otherwise
    /// the booking that follows is what counts).
    fn acquire_now(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<bool> {
        let taken = self.take_now(py, key, n)? == Took::Yes;
        if taken {
            self.stats.admitted();
        }
        Ok(taken)
    }

    /// Takes `n` cells now if nobody waits ahead and they fit; never waits (but for
    /// another process's claim of a new key's bucket, at most
    /// `paceline::shared::CLAIM_PATIENCE`, the GIL let go).
    fn take_now(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<Took> {
        check_n(n, self.burst())?;
        if self.exec.as_ref().is_some_and(|exec| !exec.fits(key, n)) {
            // Not now; a new key with no room to store it is told so.
            return Ok(if self.booked.has_room(key) {
                Took::No
            } else {
                Took::TableFull
            });
        }
        let took = self.booked.take(py, key, n);
        if took != Took::Yes {
            return Ok(took);
        }
        // The execution cell had room a moment ago; a racing caller may have taken it,
        // and then these cells stay spent (the strict side).
        Ok(self
            .exec
            .as_ref()
            .map_or(Took::Yes, |exec| exec.take(py, key, n)))
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
    /// A new key the limiter has no room for yet raises `NoRoom` with the seconds until
    /// room is expected (within the timeout; beyond it, `TimeoutError`): the caller waits
    /// and books again.
    fn book(&self, py: Python<'_>, key: &L::Key, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
        check_n(n, self.burst())?;
        let held = self.reserve(py, key, n, timeout)?;
        Ok(Ticket::new(held))
    }

    /// Books `n` cells within `timeout` seconds, counted: admitted (the turn is now),
    /// waited, or refused (too far away: `TimeoutError`); no room for a new key yet is
    /// `NoRoom` (see [`Pair::book`]).
    fn reserve(
        &self,
        py: Python<'_>,
        key: &L::Key,
        n: u32,
        timeout: Option<f64>,
    ) -> PyResult<Held> {
        let max = max_wait(timeout)?;
        match self.booked.reserve(py, key, n, max) {
            Ok(held) => {
                self.stats.booked(held.ready_in());
                Ok(held)
            }
            Err(Denied::NotUntil(e)) if e.is_table_full() && e.wait_time() <= max => {
                Err(NoRoom::new_err(e.wait_time().as_secs_f64()))
            }
            Err(denied) => {
                self.stats.refused();
                Err(too_late(denied))
            }
        }
    }

    /// Takes `n` cells from the execution cell at the moment the work runs: a ticket to
    /// wait for (ready at once when the caller is on time), or None without the bound
    /// (`NoRoom` as [`Pair::book`]).
    fn run(&self, py: Python<'_>, key: &L::Key, n: u32) -> PyResult<Option<Ticket>> {
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
        Ok(Some(Ticket::new(held)))
    }

    /// Blocks the calling thread (GIL released) for a booked turn, then the execution
    /// cell; a new key with no room yet waits for room first (within the timeout).
    fn acquire_blocking(
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
                    Ok(held) => break held,
                    Err(Denied::NotUntil(e)) if e.is_table_full() => sleep(py, e.wait_time())?,
                    Err(denied) => return Err(too_late(denied)),
                }
            };
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
    fn hold(&self, py: Python<'_>, key: &L::Key, seconds: f64) -> PyResult<()> {
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
    fn reset(&self, key: &L::Key) -> PyResult<()> {
        self.booked.reset(key)?;
        if let Some(exec) = &self.exec {
            exec.reset(key)?;
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

/// One pair (and key) as something an upstream's signals steer: both cells held, both
/// quotas set.
struct PairKey<'a, 'py, L: Cell> {
    py: Python<'py>,
    pair: &'a Pair<L>,
    key: &'a L::Key,
}

impl<L: Cell> Steer for PairKey<'_, '_, L> {
    fn hold_for(&self, d: Duration) {
        self.pair.booked.hold(self.py, self.key, d);
        if let Some(exec) = &self.pair.exec {
            exec.hold(self.py, self.key, d);
        }
    }

    fn quota(&self) -> Quota {
        self.pair.booked.quota()
    }

    fn set_quota(&self, quota: Quota) {
        // A shared file whose quota slots are all held by dead writers keeps its quota:
        // following the upstream is best effort.
        let _ = self.pair.booked.set_quota(quota);
        if let Some(exec) = &self.pair.exec {
            let _ = exec.set_quota(quota);
        }
    }
}

/// Follows an upstream's signals for one core (and key): `paceline::upstream::Following`.
#[pyclass(frozen, module = "paceline._paceline")]
struct Follower {
    following: Following,
    core: Py<PyAny>,
    key: Option<String>,
    /// Whether announced quotas are followed (holds always are).
    quotas: bool,
}

#[pymethods]
impl Follower {
    /// Follows for `core` (and `key`, for a keyed core): holds of at most `max_hold`
    /// seconds, announced quotas above the core's quota now only if `above_configured`,
    /// back to that quota after `revert_after` seconds without an announcement.
    #[new]
    #[pyo3(signature = (core, key, max_hold, above_configured, revert_after=None, quotas=true))]
    fn new(
        py: Python<'_>,
        core: Py<PyAny>,
        key: Option<String>,
        max_hold: f64,
        above_configured: bool,
        revert_after: Option<f64>,
        quotas: bool,
    ) -> PyResult<Follower> {
        let seconds = |name: &str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                PyValueError::new_err(format!(
                    "{name} must be a finite number of seconds >= 0, got {s}"
                ))
            })
        };
        let mut follow = Follow::default()
            .max_hold(seconds("max_hold", max_hold)?)
            .above_configured(above_configured);
        if let Some(after) = revert_after {
            follow = follow.revert_after(seconds("revert_after", after)?);
        }
        let configured = steer(py, &core, &key, |s| s.quota())?;
        Ok(Follower {
            following: Following::new(configured, follow),
            core,
            key,
            quotas,
        })
    }

    /// Reads a response (its status, and its headers as `(name, value)` pairs) and steers
    /// the core; returns the hold applied in seconds, or None.
    fn apply(
        &self,
        py: Python<'_>,
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
    ) -> PyResult<Option<f64>> {
        let mut signal = Signal::read(
            status,
            headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
            SystemTime::now(),
        );
        if !self.quotas {
            signal.policy = None;
        }
        steer(py, &self.core, &self.key, |s| {
            self.following
                .apply(s, &signal)
                .map(|hold| hold.as_secs_f64())
        })
    }
}

/// Runs `f` on `core` (any of the four kinds; `key` for the keyed ones) as a `Steer`.
fn steer<R>(
    py: Python<'_>,
    core: &Py<PyAny>,
    key: &Option<String>,
    f: impl FnOnce(&dyn Steer) -> R,
) -> PyResult<R> {
    let core = core.bind(py);
    let keyed = || {
        key.clone()
            .ok_or_else(|| PyValueError::new_err("a keyed limiter is followed per key"))
    };
    if let Ok(c) = core.cast::<Core>() {
        return Ok(f(&PairKey {
            py,
            pair: &c.get().0,
            key: &(),
        }));
    }
    if let Ok(c) = core.cast::<SharedCore>() {
        return Ok(f(&PairKey {
            py,
            pair: &c.get().0,
            key: &(),
        }));
    }
    if let Ok(c) = core.cast::<KeyedCore>() {
        let key = TextKey::from(keyed()?);
        return Ok(f(&PairKey {
            py,
            pair: &c.get().0,
            key: &key,
        }));
    }
    if let Ok(c) = core.cast::<SharedKeyedCore>() {
        let key = keyed()?;
        return Ok(f(&PairKey {
            py,
            pair: &c.get().0,
            key: &key,
        }));
    }
    Err(PyValueError::new_err("not a paceline core"))
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

            fn try_acquire(&self, py: Python<'_>, n: u32) -> PyResult<bool> {
                Ok(self.0.try_acquire(py, &(), n)? == Took::Yes)
            }

            fn acquire_now(&self, py: Python<'_>, n: u32) -> PyResult<bool> {
                self.0.acquire_now(py, &(), n)
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
            fn book(&self, py: Python<'_>, n: u32, timeout: Option<f64>) -> PyResult<Ticket> {
                self.0.book(py, &(), n, timeout)
            }

            fn run(&self, py: Python<'_>, n: u32) -> PyResult<Option<Ticket>> {
                self.0.run(py, &(), n)
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

            fn hold(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
                self.0.hold(py, &(), seconds)
            }

            fn reset(&self) -> PyResult<()> {
                self.0.reset(&())
            }
        }
    };
    ($core:ident, keyed) => {
        #[pymethods]
        impl $core {
            fn burst(&self) -> u32 {
                self.0.burst()
            }

            /// True, False, or `TABLE_FULL` (a new key with no room to store it).
            fn try_acquire(&self, py: Python<'_>, key: String, n: u32) -> PyResult<Py<PyAny>> {
                let took = self.0.try_acquire(py, &self.0.key(key), n)?;
                took_object(py, took)
            }

            fn acquire_now(&self, py: Python<'_>, key: String, n: u32) -> PyResult<bool> {
                self.0.acquire_now(py, &self.0.key(key), n)
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
            fn book(
                &self,
                py: Python<'_>,
                key: String,
                n: u32,
                timeout: Option<f64>,
            ) -> PyResult<Ticket> {
                self.0.book(py, &self.0.key(key), n, timeout)
            }

            fn run(&self, py: Python<'_>, key: String, n: u32) -> PyResult<Option<Ticket>> {
                self.0.run(py, &self.0.key(key), n)
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

            fn hold(&self, py: Python<'_>, key: String, seconds: f64) -> PyResult<()> {
                self.0.hold(py, &self.0.key(key), seconds)
            }

            fn reset(&self, key: String) -> PyResult<()> {
                self.0.reset(&self.0.key(key))
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
#[pyo3(signature = (path, count, per, burst, execution_bound, mismatch, trust_user=None, trust_group=None))]
#[allow(clippy::too_many_arguments)]
fn new_shared_core(
    py: Python<'_>,
    path: std::path::PathBuf,
    count: u32,
    per: f64,
    burst: u32,
    execution_bound: bool,
    mismatch: &str,
    trust_user: Option<u32>,
    trust_group: Option<u32>,
) -> PyResult<SharedCore> {
    let quota = quota(count, per, burst)?;
    let options = open_options(mismatch, trust_user, trust_group, None)?;
    let booked = py
        .detach(|| SharedLimiter::open_with(&path, quota, options))
        .map_err(shared_error)?;
    let exec = execution_bound.then(|| Arc::new(booked.execution_lane()));
    Ok(SharedCore(Pair {
        booked: Arc::new(booked),
        exec,
        stats: Stats::default(),
    }))
}

#[pyfunction]
#[pyo3(signature = (path, count, per, burst, execution_bound, capacity, mismatch, trust_user=None, trust_group=None))]
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
    trust_user: Option<u32>,
    trust_group: Option<u32>,
) -> PyResult<SharedKeyedCore> {
    let quota = quota(count, per, burst)?;
    let options = open_options(mismatch, trust_user, trust_group, None)?;
    let booked = py
        .detach(|| SharedKeyedLimiter::open_with(&path, quota, capacity, options))
        .map_err(shared_error)?;
    let exec = execution_bound.then(|| Arc::new(booked.execution_lane()));
    Ok(SharedKeyedCore(Pair {
        booked: Arc::new(booked),
        exec,
        stats: Stats::default(),
    }))
}

/// The fleet limiter's quota arguments for `count` cells per `per` seconds with `burst`:
/// `(interval, tolerance)` in whole nanoseconds, as the Rust `RedisLimiter` sends them
/// (the interval truncated to the nanosecond, as every paceline quota; the tolerance
/// `interval × burst`). A `ValueError` in the Python API's words for a quota no limiter
/// takes, one finer than Redis time's microsecond, or a burst window past what the
/// scripts keep exact.
#[pyfunction]
fn redis_quota(count: u32, per: f64, burst: u32) -> PyResult<(u64, u64)> {
    let quota = quota(count, per, burst)?;
    let interval = u64::try_from(quota.emission_interval().as_nanos()).unwrap_or(u64::MAX);
    if interval < 1_000 {
        return Err(PyValueError::new_err(format!(
            "per / rate = {per:?} s / {count} is below 1 µs, the resolution of Redis time: \
             a fleet limiter keeps at most a million cells per second"
        )));
    }
    let window = u128::from(interval) * u128::from(burst);
    if window > u128::from(paceline::redis_scripts::MAX_WINDOW) {
        return Err(PyValueError::new_err(format!(
            "the burst window (per / rate × burst = {:.0} s) is longer than 2^52 ns (about \
             52 days), the most a fleet limiter keeps exact",
            window as f64 / 1e9
        )));
    }
    Ok((interval, window as u64))
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
    m.add_class::<TableFull>()?;
    m.add("NoRoom", m.py().get_type::<NoRoom>())?;
    m.add("TABLE_FULL", table_full(m.py())?.clone_ref(m.py()))?;
    m.add("MAX_CAPACITY", paceline::shared::MAX_CAPACITY)?;
    m.add("MAX_HOLD", paceline::shared::MAX_HOLD.as_secs_f64())?;
    // paceline.redis runs the Rust fleet limiter's very scripts (one source of truth).
    m.add("REDIS_DECIDE_SCRIPT", paceline::redis_scripts::DECIDE)?;
    m.add("REDIS_REFUND_SCRIPT", paceline::redis_scripts::REFUND)?;
    m.add("REDIS_MAX_WINDOW_NS", paceline::redis_scripts::MAX_WINDOW)?;
    m.add_function(wrap_pyfunction!(redis_quota, m)?)?;
    m.add_class::<Follower>()?;
    m.add_class::<asgi::AsgiCore>()?;
    m.add_class::<asgi::Admitted>()?;
    m.add_class::<asgi::Refused>()?;
    m.add_class::<asgi::Waiting>()?;
    m.add_class::<asgi::SharedTable>()?;
    m.add_function(wrap_pyfunction!(asgi::open_shared_table, m)?)?;
    m.add_function(wrap_pyfunction!(asgi::check_limit_name, m)?)?;
    m.add_function(wrap_pyfunction!(asgi::check_key_source, m)?)?;
    m.add_function(wrap_pyfunction!(asgi::parse_rates, m)?)?;
    m.add_function(wrap_pyfunction!(asgi::new_asgi_core, m)?)?;
    m.add_class::<asgi::KeyReader>()?;
    m.add_function(wrap_pyfunction!(asgi::new_key_reader, m)?)?;
    m.add_function(wrap_pyfunction!(new_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_keyed_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_shared_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_shared_keyed_core, m)?)?;
    budget::register(m)?;
    Ok(())
}
