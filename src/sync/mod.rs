//! The one place where paceline gets its synchronisation primitives.
//!
//! Under `cfg(loom)` every atomic, mutex, thread-local and spin hint comes from [`loom`],
//! so the model checker sees each of them; otherwise they are the `std` ones. Nothing else
//! in the crate names `std::sync::atomic` or `std::sync::Mutex` directly (the timer and
//! coarse clock threads, which loom builds leave out, say why they do).
//!
//! * this file — the std/loom switch, made once: atomics, `UnsafeCell`, `Mutex`,
//!   `thread_local!`;
//! * `read_mostly` — the keyed shards' reader-writer lock: reader slots taken with one
//!   compare-and-swap (built on this file's atomics, so loom checks it too);
//! * `backoff` — spinning after a failed compare-and-swap (counted in hints for the
//!   locks, timed for a limiter's word), visible to loom;
//! * `wake_list` — a batch of wakers collected under a lock and woken after it.
//!
//! The lock wrappers ignore poisoning: every critical section in paceline leaves its data
//! consistent before any code that could panic (waking a `Waker` happens outside the lock),
//! so a poisoned lock carries no broken invariant.

#[cfg(all(not(loom), target_has_atomic = "64"))]
pub(crate) use core::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{fence, AtomicU32, Ordering};
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(all(not(loom), not(target_has_atomic = "64")))]
pub(crate) use portable_atomic::AtomicU64;

/// A spin-wait hint; under loom, a point where another thread may run.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::hint::spin_loop();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

#[cfg(loom)]
pub(crate) use loom::thread_local;
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use std::thread_local;

mod backoff;
#[cfg(feature = "std")]
mod read_mostly;
#[cfg(feature = "std")]
mod wake_list;

#[cfg(feature = "std")]
pub(crate) use backoff::Backoff;
pub(crate) use backoff::CasBackoff;
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use read_mostly::forks as read_mostly_forks;
#[cfg(feature = "std")]
pub(crate) use read_mostly::ReadMostly;
#[cfg(feature = "std")]
pub(crate) use wake_list::{Panic, WakeList};

#[cfg(loom)]
use loom::sync as imp;
#[cfg(all(feature = "std", not(loom)))]
use std::sync as imp;

/// An `UnsafeCell` with loom's closure API, so the same code runs under both.
#[cfg(all(feature = "std", not(loom)))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(all(feature = "std", not(loom)))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    /// Gives `f` a shared raw pointer to the contents.
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Gives `f` a unique raw pointer to the contents.
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A mutex whose `lock` never fails (see the module docs on poisoning).
#[cfg(any(feature = "std", loom))]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(imp::Mutex<T>);

/// The guard of [`Mutex`].
#[cfg(any(feature = "std", loom))]
pub(crate) type MutexGuard<'a, T> = imp::MutexGuard<'a, T>;

#[cfg(any(feature = "std", loom))]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(imp::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
