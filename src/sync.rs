//! The one place where pacer gets its synchronisation primitives.
//!
//! Under `cfg(loom)` every atomic, mutex and spin hint comes from [`loom`], so the model
//! checker sees each of them; otherwise they are the `std` ones, and crossbeam's
//! `ShardedLock` for the read-mostly lock. Nothing else in the crate names
//! `std::sync::atomic` or `std::sync::Mutex` directly.
//!
//! The lock wrappers ignore poisoning: every critical section in pacer leaves its data
//! consistent before any code that could panic (waking a `Waker` happens outside the lock),
//! so a poisoned lock carries no broken invariant.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

#[cfg(loom)]
use loom::sync as imp;
#[cfg(not(loom))]
use std::sync as imp;

/// An `UnsafeCell` with loom's closure API, so the same code runs under both.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
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
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(imp::Mutex<T>);

/// The guard of [`Mutex`].
pub(crate) type MutexGuard<'a, T> = imp::MutexGuard<'a, T>;

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

/// A reader-writer lock built for a read-mostly hot path shared by many threads.
///
/// Outside loom this is crossbeam's `ShardedLock`: a reader locks only the slot of its own
/// thread (one of eight cache-padded locks), so readers on different threads never write
/// the same cache line; a writer locks all eight. With a plain `RwLock` every reader
/// writes the lock's one reader count, and on two or more cores that line moves between
/// them on nearly every read. Under loom it is loom's `RwLock`, which has the same
/// semantics.
#[derive(Debug)]
pub(crate) struct ReadMostly<T> {
    #[cfg(not(loom))]
    lock: crossbeam_utils::sync::ShardedLock<T>,
    #[cfg(loom)]
    lock: loom::sync::RwLock<T>,
}

impl<T> ReadMostly<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(loom))]
            lock: crossbeam_utils::sync::ShardedLock::new(value),
            #[cfg(loom)]
            lock: loom::sync::RwLock::new(value),
        }
    }

    pub(crate) fn read(&self) -> impl core::ops::Deref<Target = T> + '_ {
        self.lock
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn write(&self) -> impl core::ops::DerefMut<Target = T> + '_ {
        self.lock
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Exponential backoff for a failed compare-and-swap.
///
/// crossbeam's `Backoff` spins with `core::hint::spin_loop`, which loom cannot see, so a
/// model with it would never yield to the other threads. This one goes through the shim:
/// under loom every step is a `loom::hint::spin_loop`, which lets loom schedule another
/// thread.
#[derive(Debug)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    /// The largest step: at most `2^MAX_STEP` spin hints per failed attempt, so a thread
    /// never sits out for more than a few hundred nanoseconds.
    const MAX_STEP: u32 = 6;

    pub(crate) const fn new() -> Self {
        Self { step: 0 }
    }

    /// Spins for a while that doubles on every call, up to `2^MAX_STEP` hints.
    pub(crate) fn spin(&mut self) {
        // Under loom one hint is one scheduling point; more would only grow the model.
        #[cfg(loom)]
        loom::hint::spin_loop();
        #[cfg(not(loom))]
        for _ in 0..(1u32 << self.step) {
            core::hint::spin_loop();
        }
        if self.step < Self::MAX_STEP {
            self.step += 1;
        }
    }
}
