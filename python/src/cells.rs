//! What the Python limiters need of paceline's four limiters (in-process or shared,
//! direct or keyed), and what taking cells came to (`TABLE_FULL`).

use std::sync::Arc;
use std::time::Duration;

use crate::shared::shared_error;
use crate::wait::Held;
use paceline::shared::{SharedKeyedLimiter, SharedLimiter};
use paceline::{Denied, KeyedLimiter, Limiter, Quota, TextKey};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// What a Python limiter needs of a paceline limiter: in-process or shared across
/// processes, direct (key `()`) or keyed.
pub(crate) trait Cell: Send + Sync + 'static {
    /// What names a key: `()` for a direct cell, the key's text (`str`) for a keyed one.
    type Key: ?Sized;
    /// Whether this is a direct cell (one cell, key `()`), not a keyed one.
    const DIRECT: bool;
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
    /// Takes `n` cells now, or nothing (the GIL is released if storing a new key may wait
    /// for another process).
    fn take(&self, py: Python<'_>, key: &Self::Key, n: u32) -> Took;
    /// Takes `n` cells from this cell and from `exec`, its execution cell, together, or
    /// none (`Pair::take_now`): in one step that looks at `exec` first, reads the clock
    /// once and, where it can, finds the key once.
    fn take_with(&self, py: Python<'_>, exec: &Self, key: &Self::Key, n: u32) -> Took;
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

/// The methods a direct limiter implements alike, in-process or shared: its booking held
/// as `Held::$held`; `$ty`'s own `remaining`, `quota` and `hold_for`.
macro_rules! direct_cell {
    ($ty:ident, $held:ident) => {
        type Key = ();
        const DIRECT: bool = true;

        fn reserve(
            self: &Arc<Self>,
            _: Python<'_>,
            (): &(),
            n: u32,
            max: Duration,
        ) -> Result<Held, Denied> {
            Arc::clone(self)
                .reserve_within_owned(n, max)
                .map(Held::$held)
        }

        fn wait_time(&self, (): &(), n: u32) -> Duration {
            self.peek_n(n).unwrap_or(Duration::MAX)
        }

        fn take(&self, _: Python<'_>, (): &(), n: u32) -> Took {
            self.check_n(n).into()
        }

        fn take_with(&self, _: Python<'_>, exec: &Self, (): &(), n: u32) -> Took {
            self.check_n_with(exec, n).into()
        }

        fn remaining(&self, (): &()) -> u32 {
            $ty::remaining(self)
        }

        fn quota(&self) -> Quota {
            $ty::quota(self)
        }

        fn hold(&self, _: Python<'_>, (): &(), d: Duration) {
            self.hold_for(d);
        }
    };
}

impl Cell for Limiter {
    direct_cell!(Limiter, Direct);

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        Limiter::set_quota(self, quota);
        Ok(())
    }
}

impl Cell for KeyedLimiter<TextKey> {
    type Key = str;
    const DIRECT: bool = false;

    fn reserve(
        self: &Arc<Self>,
        _: Python<'_>,
        key: &str,
        n: u32,
        max: Duration,
    ) -> Result<Held, Denied> {
        Arc::clone(self)
            .reserve_key_within_owned(TextKey::new(key), n, max)
            .map(Held::Keyed)
    }

    // The hot paths find a stored key by its text, making no `TextKey` for it.
    fn wait_time(&self, key: &str, n: u32) -> Duration {
        self.peek_text_n(key, n).unwrap_or(Duration::MAX)
    }

    fn take(&self, _: Python<'_>, key: &str, n: u32) -> Took {
        self.check_text_n(key, n).into()
    }

    fn take_with(&self, _: Python<'_>, exec: &Self, key: &str, n: u32) -> Took {
        self.check_text_n_with(key, exec, n).into()
    }

    fn has_room(&self, key: &str) -> bool {
        self.has_room_for(&TextKey::new(key))
    }

    fn remaining(&self, key: &str) -> u32 {
        self.remaining_key(&TextKey::new(key))
    }

    fn quota(&self) -> Quota {
        KeyedLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        KeyedLimiter::set_quota(self, quota);
        Ok(())
    }

    fn hold(&self, _: Python<'_>, key: &str, d: Duration) {
        self.hold_key_for(&TextKey::new(key), d);
    }
}

impl Cell for SharedLimiter {
    direct_cell!(SharedLimiter, Shared);

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        SharedLimiter::set_quota(self, quota).map_err(shared_error)
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
    type Key = str;
    const DIRECT: bool = false;

    fn reserve(
        self: &Arc<Self>,
        py: Python<'_>,
        key: &str,
        n: u32,
        max: Duration,
    ) -> Result<Held, Denied> {
        // Storing a new key may wait for another process's claim of its bucket.
        let limiter = Arc::clone(self);
        py.detach(|| limiter.reserve_key_within_owned(key, n, max))
            .map(Held::SharedKeyed)
    }

    fn wait_time(&self, key: &str, n: u32) -> Duration {
        self.peek_key_n(key, n).unwrap_or(Duration::MAX)
    }

    fn take(&self, py: Python<'_>, key: &str, n: u32) -> Took {
        // A stored key's check never waits; storing a new one may wait (briefly) for
        // another process's claim, so the GIL is let go for it.
        match self.check_key_n_if_stored(key, n) {
            Some(checked) => checked.into(),
            None => py.detach(|| self.check_key_n(key, n)).into(),
        }
    }

    fn take_with(&self, py: Python<'_>, exec: &Self, key: &str, n: u32) -> Took {
        // As `take`: the GIL let go only to store a new key.
        match self.check_key_n_with_if_stored(key, exec, n) {
            Some(checked) => checked.into(),
            None => py.detach(|| self.check_key_n_with(key, exec, n)).into(),
        }
    }

    fn remaining(&self, key: &str) -> u32 {
        self.remaining_key(key)
    }

    fn has_room(&self, key: &str) -> bool {
        self.has_room_for(key)
    }

    fn quota(&self) -> Quota {
        SharedKeyedLimiter::quota(self)
    }

    fn set_quota(&self, quota: Quota) -> PyResult<()> {
        SharedKeyedLimiter::set_quota(self, quota).map_err(shared_error)
    }

    fn hold(&self, py: Python<'_>, key: &str, d: Duration) {
        py.detach(|| self.hold_key_for(key, d));
    }

    fn max_hold(&self) -> Option<Duration> {
        Some(paceline::shared::MAX_HOLD)
    }

    fn reset(&self, key: &str) -> PyResult<()> {
        self.reset_key(key);
        Ok(())
    }
}

/// What taking cells now came to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Took {
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
pub(crate) struct TableFull;

#[pymethods]
impl TableFull {
    pub(crate) fn __bool__(&self) -> bool {
        false
    }

    pub(crate) fn __repr__(&self) -> &'static str {
        "paceline.TABLE_FULL"
    }
}

/// The one `TABLE_FULL` object.
pub(crate) static TABLE_FULL: pyo3::sync::PyOnceLock<Py<TableFull>> = pyo3::sync::PyOnceLock::new();

pub(crate) fn table_full(py: Python<'_>) -> PyResult<&Py<TableFull>> {
    TABLE_FULL.get_or_try_init(py, || Py::new(py, TableFull))
}

/// A keyed `try_acquire`'s answer: True, False, or `TABLE_FULL`.
pub(crate) fn took_object(py: Python<'_>, took: Took) -> PyResult<Py<PyAny>> {
    Ok(match took {
        Took::Yes => true.into_pyobject(py)?.to_owned().into_any().unbind(),
        Took::No => false.into_pyobject(py)?.to_owned().into_any().unbind(),
        Took::TableFull => table_full(py)?.clone_ref(py).into_any(),
    })
}
