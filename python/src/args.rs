//! Python's arguments as paceline's values (a quota, a timeout, a count), and what is
//! wrong with them in Python's words.

use std::time::Duration;

use paceline::{Denied, Quota, QuotaError};
use pyo3::exceptions::{PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

/// `count` cells per `per` seconds with `burst`, or a `ValueError` saying why not, in the
/// Python API's words.
pub(crate) fn quota(count: u32, per: f64, burst: u32) -> PyResult<Quota> {
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

/// A budget's dimensions as Python reads them: `(name, interval in ns, burst)`.
pub(crate) fn rate_rows<'a>(
    dimensions: impl Iterator<Item = (&'a str, Quota)>,
) -> Vec<(String, u64, u32)> {
    dimensions
        .map(|(name, q)| {
            let interval = u64::try_from(q.emission_interval().as_nanos()).unwrap_or(u64::MAX);
            (name.to_owned(), interval, q.burst())
        })
        .collect()
}

/// A number of seconds as Python writes a float: `1e+300`, not three hundred digits.
pub(crate) struct Seconds(f64);

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
pub(crate) fn max_wait(timeout: Option<f64>) -> PyResult<Duration> {
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
pub(crate) fn check_n(n: u32, burst: u32) -> PyResult<()> {
    if n > burst {
        return Err(PyValueError::new_err(format!(
            "n = {n} is more than the burst ({burst}): it can never be admitted"
        )));
    }
    Ok(())
}

/// What a refused booking raises: the wait was longer than the timeout.
pub(crate) fn too_late(denied: Denied) -> PyErr {
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

/// The largest count of cells a call takes (a u32), as the Python layer names it.
const MAX_COUNT: u32 = u32::MAX;

/// A call's `n` on the hot path: absent is 1; an `int` (not a `bool`) from 0 to
/// `MAX_COUNT`; anything else the same `TypeError` or `ValueError` as the Python layer's.
pub(crate) fn count(n: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let Some(n) = n else { return Ok(1) };
    if n.is_exact_instance_of::<PyInt>() {
        if let Ok(n) = n.extract::<u32>() {
            return Ok(n);
        }
    }
    if n.is_instance_of::<PyBool>() || !n.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "n must be an int, got {}",
            n.get_type().name()?
        )));
    }
    n.extract::<u32>()
        .map_err(|_| PyValueError::new_err(format!("n must be between 0 and {MAX_COUNT}, got {n}")))
}

/// An optional argument as it was given, an explicit `None` included (`Some(None)`), for
/// `#[pyo3(from_py_with = given)]`: only an omitted one takes the signature's default.
pub(crate) fn given<'py>(arg: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(Some(arg.clone()))
}

/// A keyed call's key: a `str`, or the Python layer's `TypeError`.
pub(crate) fn text<'a, 'py>(key: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyString>> {
    key.cast::<PyString>()
        .map_err(|_| match key.get_type().name() {
            Ok(name) => PyTypeError::new_err(format!("key must be a str, got {name}")),
            Err(e) => e,
        })
}
