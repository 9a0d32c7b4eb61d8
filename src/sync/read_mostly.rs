//! A reader-writer lock for a read-mostly hot path: a reader slot per core.
//!
//! # Implementation notes
//!
//! Why it exists, measured (README, "Keyed storage"): with a plain `RwLock` per keyed
//! shard, every `check_key` wrote the shard's one reader count, that cache line moved
//! between cores on most checks, and 2-thread runs gave 0.5–3.2x governor's throughput;
//! with a reader slot per core, 2.09–2.17x in paired rounds. crossbeam's `ShardedLock`
//! is the same idea and met the throughput target too, but its fixed eight slots (a
//! kilobyte per lock) put memory per key 0.1 % over governor's; here the slot count
//! follows the core count.

/// A reader-writer lock built for a read-mostly hot path shared by many threads.
///
/// It has one `RwLock<()>` per *reader slot*, each on its own cache line; a thread reads
/// through the slot of the CPU it runs on, and a writer locks every slot. Readers on
/// different threads therefore write no common cache line, where a plain `RwLock` has
/// every reader write its one reader count: on two or more cores that line moves between
/// them on nearly every read. (crossbeam's `ShardedLock` is the same idea with a fixed
/// eight slots, a kilobyte per lock; here the slot count follows the core count, so the
/// keyed limiter's locks cost no more memory than a dashmap's shards.)
///
/// Under loom, `crate::sync` swaps in loom's `RwLock` behind the same three methods.
pub(crate) struct ReadMostly<T> {
    slots: Box<[crossbeam_utils::CachePadded<std::sync::RwLock<()>>]>,
    value: core::cell::UnsafeCell<T>,
}

// SAFETY: as for `std::sync::RwLock<T>`: the lock owns a `T` and hands out `&mut T` to one
// thread at a time (so `T: Send` suffices to move it), and `&T` to many at once (so sharing
// the lock needs `T: Sync` too).
unsafe impl<T: Send> Send for ReadMostly<T> {}
// SAFETY: see `Send`.
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}

impl<T> core::fmt::Debug for ReadMostly<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReadMostly").finish_non_exhaustive()
    }
}

/// The slot hint of the calling thread: the CPU it runs on, read again every
/// [`REFRESH`] reads (threads migrate). Any value is correct; only a value shared by two
/// threads running at once costs speed, as their reads then write one cache line.
///
/// A per-thread counter (crossbeam's `ShardedLock` does that) gives two concurrently
/// running threads the same slot whenever their indices agree modulo the slot count:
/// measured, half the runs of two threads on two slots shared a slot, and known-key
/// checks during a key flood ran at 0.2x instead of 0.8x of their quiet speed.
fn slot_hint() -> usize {
    std::thread_local! {
        static HINT: core::cell::Cell<(usize, u32)> = const { core::cell::Cell::new((0, 0)) };
    }
    // During thread-local destruction the hint is gone; any slot is correct, only slower.
    HINT.try_with(|hint| {
        let (cpu, left) = hint.get();
        if left == 0 {
            let cpu = current_cpu();
            hint.set((cpu, REFRESH));
            cpu
        } else {
            hint.set((cpu, left - 1));
            cpu
        }
    })
    .unwrap_or(0)
}

/// Reads between two looks at the current CPU.
const REFRESH: u32 = 255;

#[cfg(all(target_os = "linux", not(miri)))]
fn current_cpu() -> usize {
    // SAFETY: `sched_getcpu` takes no arguments and has no preconditions; it returns -1
    // (handled below) where the kernel cannot tell.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or_else(|_| thread_index())
}

/// Elsewhere (and under Miri, which has no `sched_getcpu`), a per-thread index.
#[cfg(any(not(target_os = "linux"), miri))]
fn current_cpu() -> usize {
    thread_index()
}

/// This thread's index: distinct per thread (until the counter wraps).
fn thread_index() -> usize {
    use std::sync::atomic::AtomicUsize;
    // Relaxed: only the counter's own atomicity matters (distinct values), nothing is
    // published through it.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    INDEX.try_with(|index| *index).unwrap_or(0)
}

impl<T> ReadMostly<T> {
    /// A lock with `slots` reader slots, rounded up to a power of two (at least one).
    pub(crate) fn new(value: T, slots: usize) -> Self {
        let slots = slots.max(1).next_power_of_two();
        Self {
            slots: (0..slots).map(|_| Default::default()).collect(),
            value: core::cell::UnsafeCell::new(value),
        }
    }

    /// Shared access, excluding writers only.
    pub(crate) fn read(&self) -> impl core::ops::Deref<Target = T> + '_ {
        // `slots.len()` is a power of two, so the mask keeps the index in range.
        let slot = &self.slots[slot_hint() & (self.slots.len() - 1)];
        let guard = slot.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        ReadGuard {
            // SAFETY: a writer holds the write lock of every slot, this one included, for
            // as long as its `&mut T` lives; we hold this slot's read lock until the guard
            // drops, so no `&mut T` exists meanwhile.
            value: unsafe { &*self.value.get() },
            _slot: guard,
        }
    }

    /// Runs `f` with exclusive access.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.write_from(0, f)
    }

    /// Write-locks slots `i..` in order (every writer takes them in the same order, so
    /// writers cannot deadlock), then runs `f`. One stack frame holds each guard, so
    /// locking them all needs no allocation.
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
struct ReadGuard<'a, T> {
    value: &'a T,
    _slot: std::sync::RwLockReadGuard<'a, ()>,
}

impl<T> core::ops::Deref for ReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value
    }
}

#[cfg(test)]
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
