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

mod args;
mod asgi;
mod budget;
mod cells;
mod cores;
mod fleet;
mod follow;
mod pair;
mod ready;
mod redis;
mod shared;
mod wait;

use cells::{table_full, TableFull};
use cores::{
    new_core, new_keyed_core, new_shared_core, new_shared_keyed_core, Core, KeyedCore, SharedCore,
    SharedKeyedCore,
};
use follow::Followers;
use redis::redis_quota;
use wait::{NoRoom, Ticket};

use pyo3::prelude::*;

/// The module. Declared free-threading safe: every class is `frozen` and synchronised in
/// Rust (atomics and paceline's own locks), and no Python object is shared unguarded.
#[pymodule(gil_used = false)]
fn _paceline(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Core>()?;
    m.add_class::<KeyedCore>()?;
    m.add_class::<SharedCore>()?;
    m.add_class::<SharedKeyedCore>()?;
    m.add_class::<Ticket>()?;
    m.add_class::<ready::Ready>()?;
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
    m.add_class::<Followers>()?;
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
    m.add_class::<asgi::BuiltLimit>()?;
    m.add_function(wrap_pyfunction!(asgi::build_limit, m)?)?;
    m.add_class::<asgi::KeyReader>()?;
    m.add_function(wrap_pyfunction!(asgi::new_key_reader, m)?)?;
    m.add_function(wrap_pyfunction!(new_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_keyed_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_shared_core, m)?)?;
    m.add_function(wrap_pyfunction!(new_shared_keyed_core, m)?)?;
    budget::register(m)?;
    fleet::register(m)?;
    Ok(())
}
