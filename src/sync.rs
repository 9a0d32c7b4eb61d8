//! The one place where pacer gets its synchronisation primitives.
//!
//! Under `cfg(loom)` every atomic, mutex and spin hint comes from [`loom`], so the model
//! checker sees each of them; otherwise they are the `std` ones. Nothing else in the crate
//! names `std::sync::atomic` or `std::sync::Mutex` directly.
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
pub(crate) use loom::thread_local;
#[cfg(not(loom))]
pub(crate) use std::thread_local;

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
/// It has one `RwLock<()>` per *reader slot*, each on its own cache line; a thread reads
/// through the slot its thread index picks, and a writer locks every slot. Readers on
/// different threads therefore write no common cache line, where a plain `RwLock` has
/// every reader write its one reader count: on two or more cores that line moves between
/// them on nearly every read. (crossbeam's `ShardedLock` is the same idea with a fixed
/// eight slots, a kilobyte per lock; here the slot count follows the core count, so the
/// keyed limiter's locks cost no more memory than a dashmap's shards.)
///
/// Under loom it is loom's `RwLock`, with the same semantics.
pub(crate) struct ReadMostly<T> {
    #[cfg(not(loom))]
    slots: Box<[crossbeam_utils::CachePadded<std::sync::RwLock<()>>]>,
    #[cfg(not(loom))]
    value: core::cell::UnsafeCell<T>,
    #[cfg(loom)]
    lock: loom::sync::RwLock<T>,
}

// SAFETY: as for `std::sync::RwLock<T>`: the lock owns a `T` and hands out `&mut T` to one
// thread at a time (so `T: Send` suffices to move it), and `&T` to many at once (so sharing
// the lock needs `T: Sync` too).
#[cfg(not(loom))]
unsafe impl<T: Send> Send for ReadMostly<T> {}
// SAFETY: see `Send`.
#[cfg(not(loom))]
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}

impl<T> core::fmt::Debug for ReadMostly<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReadMostly").finish_non_exhaustive()
    }
}

/// This thread's index: distinct per thread (until the counter wraps), for picking a slot.
#[cfg(not(loom))]
fn thread_index() -> usize {
    use std::sync::atomic::AtomicUsize;
    // Relaxed: only the counter's own atomicity matters (distinct values), nothing is
    // published through it.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // During thread-local destruction the index is gone; any slot is correct, only slower.
    INDEX.try_with(|index| *index).unwrap_or(0)
}

impl<T> ReadMostly<T> {
    /// A lock with `slots` reader slots, rounded up to a power of two (at least one).
    pub(crate) fn new(value: T, slots: usize) -> Self {
        #[cfg(not(loom))]
        {
            let slots = slots.max(1).next_power_of_two();
            Self {
                slots: (0..slots).map(|_| Default::default()).collect(),
                value: core::cell::UnsafeCell::new(value),
            }
        }
        #[cfg(loom)]
        {
            let _ = slots;
            Self {
                lock: loom::sync::RwLock::new(value),
            }
        }
    }

    /// Shared access, excluding writers only.
    #[cfg(not(loom))]
    pub(crate) fn read(&self) -> impl core::ops::Deref<Target = T> + '_ {
        // `slots.len()` is a power of two, so the mask keeps the index in range.
        let slot = &self.slots[thread_index() & (self.slots.len() - 1)];
        let guard = slot.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        ReadGuard {
            // SAFETY: a writer holds the write lock of every slot, this one included, for
            // as long as its `&mut T` lives; we hold this slot's read lock until the guard
            // drops, so no `&mut T` exists meanwhile.
            value: unsafe { &*self.value.get() },
            _slot: guard,
        }
    }

    /// Shared access, excluding writers only.
    #[cfg(loom)]
    pub(crate) fn read(&self) -> impl core::ops::Deref<Target = T> + '_ {
        self.lock
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` with exclusive access.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(not(loom))]
        return self.write_from(0, f);
        #[cfg(loom)]
        return f(&mut self
            .lock
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()));
    }

    /// Write-locks slots `i..` in order (every writer takes them in the same order, so
    /// writers cannot deadlock), then runs `f`. One stack frame holds each guard, so
    /// locking them all needs no allocation.
    #[cfg(not(loom))]
    fn write_from<R>(&self, i: usize, f: impl FnOnce(&mut T) -> R) -> R {
        match self.slots.get(i) {
            Some(slot) => {
                let _guard = slot
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                self.write_from(i + 1, f)
            }
            // SAFETY: we hold the write lock of every slot, so no reader holds any slot and
            // no other writer runs: this is the only reference to the value.
            None => f(unsafe { &mut *self.value.get() }),
        }
    }
}

/// The guard of [`ReadMostly::read`]: the value, and the slot's read lock that keeps
/// writers out while the value is borrowed.
#[cfg(not(loom))]
struct ReadGuard<'a, T> {
    value: &'a T,
    _slot: std::sync::RwLockReadGuard<'a, ()>,
}

#[cfg(not(loom))]
impl<T> core::ops::Deref for ReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::ReadMostly;
    use std::sync::Arc;

    #[test]
    fn readers_see_every_write_and_writers_exclude_readers() {
        // Four threads, four slots: each read sees a consistent pair, every write lands.
        let lock = Arc::new(ReadMostly::new((0u64, 0u64), 4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        lock.write(|(a, b)| {
                            *a += 1;
                            *b += 1;
                        });
                        let pair = *lock.read();
                        assert_eq!(pair.0, pair.1, "a read saw half a write");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.read(), (200, 200));
    }

    #[test]
    fn slot_counts_round_up_to_a_power_of_two() {
        for (asked, got) in [(0, 1), (1, 1), (3, 4), (8, 8)] {
            let lock = ReadMostly::new(7u8, asked);
            assert_eq!(lock.slots.len(), got);
            assert_eq!(*lock.read(), 7);
            assert_eq!(lock.write(|v| *v), 7);
        }
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
