//! The fleet limiter's quota as its scripts take it, for `paceline.redis`.

use crate::args::quota;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The fleet limiter's quota arguments for `count` cells per `per` seconds with `burst`:
/// `(interval, tolerance)` in whole nanoseconds, as the Rust `RedisLimiter` sends them
/// (the interval truncated to the nanosecond, as every paceline quota; the tolerance
/// `interval × burst`). A `ValueError` in the Python API's words for a quota no limiter
/// takes, one finer than Redis time's microsecond, or a burst window past what the
/// scripts keep exact.
#[pyfunction]
pub(crate) fn redis_quota(count: u32, per: f64, burst: u32) -> PyResult<(u64, u64)> {
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
