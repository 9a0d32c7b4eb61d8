//! A reader-writer lock for a read-mostly hot path: reader slots that are try-locks.
//!
//! # Implementation notes
//!
//! Why it exists: with one reader count per keyed shard, every `check_key` would write
//! that count, and its cache line would move between cores on most checks. Here each
//! reader takes a slot of its own (one per core or more): a word that a reader takes with one
//! compare-and-swap and gives back with a plain release store, a single read-modify-write
//! per read (a `RwLock` per slot would cost two).
//!
//! A reader that finds every slot taken counts itself in a shared reader count instead of
//! waiting for one: with more threads than cores, a thread can be descheduled holding a
//! slot, and readers that waited for slots would then wait for the scheduler (16 threads
//! on 2 cores checked keys at a third of governor's speed that way).
//!
//! **Fork.** `fork` copies the calling thread only: a reader of another thread caught
//! holding a slot (or counted in the shared word) at a fork would hold it in the child for
//! ever, and the child's first writer would wait for it for ever. So every lock's words
//! live in one allocation whose address is in a registry, and the fork's child handler
//! (`clock::gate`) frees every registered lock's words: the forking thread is never inside
//! a read (no code of the caller's runs there), so no holder came along. Writers hold their
//! mutex inside the fork gate, so a fork never copies a write half done, nor the mutex held.
//! The hot path pays nothing for it.

use crate::clock::gate;
use crate::sync::{AtomicU32, Backoff, Mutex, Ordering};

/// A slot nobody holds.
const FREE: u32 = 0;
/// A slot one reader holds.
const READ: u32 = 1;
/// A slot the writer holds.
const WRITE: u32 = 2;
/// The shared reader count's flag for a writer holding the lock (the count below it).
const WRITER: u32 = 1 << 31;

/// A reader-writer lock built for a read-mostly hot path shared by many threads.
///
/// It has *reader slots*, each a word on its own cache line. A reader takes a free slot
/// (the one of the CPU it runs on, if free, else the next free one) with one
/// compare-and-swap and releases it with a store, so readers on different threads write no
/// common cache line, and a read costs one read-modify-write. A writer takes every slot
/// (waiting for each reader to leave), which excludes every reader.
///
/// A reader that finds every slot held by other readers counts itself in a shared word
/// instead (one read-modify-write on a line all such readers share), so no reader ever
/// waits for another reader, only for a writer; a writer also waits for that count.
///
/// Writers take a mutex first (one writer at a time); a reader that finds a slot taken
/// by the writer queues on that mutex instead of spinning, so a long write (a sweep of a
/// large table) parks the readers it holds up.
pub(crate) struct ReadMostly<T> {
    /// The reader slots (a power of two of them), then the shared word: readers that
    /// found no free slot, plus [`WRITER`] while a writer holds the lock. One allocation,
    /// registered for forks (module docs).
    words: Box<[crossbeam_utils::CachePadded<AtomicU32>]>,
    /// One writer at a time; where readers wait for a writer to finish.
    write_lock: Mutex<()>,
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

// The slot a thread reads through first, and reads left before it looks at its CPU again.
#[cfg(not(loom))]
std::thread_local! {
    static HINT: core::cell::Cell<(usize, u32)> = const { core::cell::Cell::new((0, 0)) };
}

/// The slot hint of the calling thread: the CPU it runs on, read again every
/// [`REFRESH`] reads (threads migrate). Any value is correct; only a value shared by two
/// threads running at once costs speed, as the second then looks for another slot.
///
/// A per-thread counter (crossbeam's `ShardedLock` does that) would give two concurrently
/// running threads the same slot whenever their indices agree modulo the slot count,
/// and they would then collide on every read.
#[cfg(not(loom))]
#[inline]
fn slot_hint() -> usize {
    // During thread-local destruction the hint is gone; any slot is correct, only slower.
    HINT.try_with(|hint| {
        let (cpu, left) = hint.get();
        if left == 0 {
            return refresh_hint(hint);
        }
        hint.set((cpu, left - 1));
        cpu
    })
    .unwrap_or(0)
}

/// [`slot_hint`]'s look at the current CPU, once every [`REFRESH`] reads.
#[cfg(not(loom))]
#[cold]
fn refresh_hint(hint: &core::cell::Cell<(usize, u32)>) -> usize {
    let cpu = current_cpu();
    hint.set((cpu, REFRESH));
    cpu
}

/// Under loom every thread starts at slot 0: the models then cover readers that find
/// their slot taken and move on.
#[cfg(loom)]
fn slot_hint() -> usize {
    0
}

/// After a reader found its hinted slot taken and read through `slot` instead: start
/// there next time (until the next look at the CPU), so two threads that share a CPU
/// hint for a while settle on different slots instead of colliding on every read.
#[cfg(not(loom))]
fn settle_on(slot: usize) {
    let _ = HINT.try_with(|hint| hint.set((slot, hint.get().1)));
}

#[cfg(loom)]
fn settle_on(_slot: usize) {}

/// Reads between two looks at the current CPU.
#[cfg(not(loom))]
const REFRESH: u32 = 255;

#[cfg(all(target_os = "linux", not(miri), not(loom)))]
fn current_cpu() -> usize {
    // SAFETY: `sched_getcpu` takes no arguments and has no preconditions; it returns -1
    // (handled below) where the kernel cannot tell.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or_else(|_| thread_index())
}

/// Elsewhere (and under Miri, which has no `sched_getcpu`), a per-thread index.
#[cfg(all(any(not(target_os = "linux"), miri), not(loom)))]
fn current_cpu() -> usize {
    thread_index()
}

/// This thread's index: distinct per thread (until the counter wraps).
#[cfg(not(loom))]
fn thread_index() -> usize {
    use std::sync::atomic::AtomicUsize;
    // Relaxed: only the counter's own atomicity matters (distinct values), nothing is
    // published through it. (std's atomic, not the shim's: never built under loom.)
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
        let lock = Self {
            words: (0..=slots)
                .map(|_| crossbeam_utils::CachePadded::new(AtomicU32::new(FREE)))
                .collect(),
            write_lock: Mutex::new(()),
            value: core::cell::UnsafeCell::new(value),
        };
        forks::register(&lock.words);
        lock
    }

    /// The reader slots.
    #[inline]
    fn slots(&self) -> &[crossbeam_utils::CachePadded<AtomicU32>] {
        &self.words[..self.words.len() - 1]
    }

    /// The shared word.
    #[inline]
    fn shared(&self) -> &AtomicU32 {
        &self.words[self.words.len() - 1]
    }

    /// Shared access, excluding writers only.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        // The slots are a power of two, so the mask keeps every index in range.
        let mask = self.words.len() - 2;
        let start = slot_hint() & mask;
        // Acquire on taking the slot: a writer's changes, released with the slot, are
        // visible to this reader. Relaxed on failure: nothing is read through it.
        if self.words[start]
            .compare_exchange(FREE, READ, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return self.guard(start);
        }
        self.read_slow(start)
    }

    /// Runs `f` with `a`'s value and `b`'s, both read-locked at once. The locks are
    /// taken in the order of their addresses: a reader waits only for a writer, and a
    /// writer holds no other lock while it waits, so threads reading two locks each, in
    /// either order, never wait on each other in a cycle (taken in the callers' own
    /// order, a reader holding `a` could wait for `b`'s writer, which waits for a reader
    /// holding `b` that waits for `a`'s writer, which waits for the first). One lock
    /// given twice is read once: a second read could wait for a writer that waits for
    /// the first.
    pub(crate) fn read_both<R>(
        a: &ReadMostly<T>,
        b: &ReadMostly<T>,
        f: impl FnOnce(&T, &T) -> R,
    ) -> R {
        if core::ptr::eq(a, b) {
            let value = a.read();
            return f(&value, &value);
        }
        let (a, b) = if (a as *const ReadMostly<T>) < (b as *const ReadMostly<T>) {
            let a = a.read();
            (a, b.read())
        } else {
            let b = b.read();
            (a.read(), b)
        };
        f(&a, &b)
    }

    /// [`ReadMostly::read`] when the hinted slot was taken or a writer is waiting.
    #[cold]
    fn read_slow(&self, start: usize) -> ReadGuard<'_, T> {
        let slots = self.slots();
        let mask = slots.len() - 1;
        loop {
            let mut writer = false;
            for i in 0..=mask {
                let slot = (start + i) & mask;
                // Look before the compare-and-swap: a slot in use stays in its holder's
                // cache (a failed compare-and-swap would take the line from it, or from a
                // writer taking the slots one by one). Relaxed: only a hint; the exchange
                // decides.
                match slots[slot].load(Ordering::Relaxed) {
                    FREE => {}
                    WRITE => {
                        writer = true;
                        continue;
                    }
                    _ => continue,
                }
                // Orderings as in `read`.
                match slots[slot].compare_exchange(FREE, READ, Ordering::Acquire, Ordering::Relaxed)
                {
                    Ok(_) => {
                        settle_on(slot);
                        return self.guard(slot);
                    }
                    Err(WRITE) => writer = true,
                    Err(_) => {}
                }
            }
            if !writer {
                // Every slot is held by a reader (some perhaps descheduled while holding
                // it): count this reader in the shared word rather than wait for them.
                // Acquire: a writer's changes, released with the flag, are visible to
                // this reader.
                if self.shared().fetch_add(1, Ordering::Acquire) & WRITER == 0 {
                    return self.guard_shared();
                }
                // A writer came first: step back out. Relaxed: this reader read nothing.
                self.shared().fetch_sub(1, Ordering::Relaxed);
            }
            // Wait for the writer on its mutex rather than spinning through a long write
            // (a sweep of a large table); inside the fork gate, as every hold of it.
            drop(gate::lock(&self.write_lock));
        }
    }

    #[inline]
    fn guard(&self, slot: usize) -> ReadGuard<'_, T> {
        ReadGuard {
            lock: self,
            slot: Some(&self.words[slot]),
        }
    }

    /// The guard of a reader counted in the shared word.
    fn guard_shared(&self) -> ReadGuard<'_, T> {
        ReadGuard {
            lock: self,
            slot: None,
        }
    }

    /// Runs `f` with exclusive access.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let _one_writer = gate::lock(&self.write_lock);
        for slot in self.slots() {
            let mut backoff = Backoff::new();
            // Acquire: every reader that held this slot released it (its reads of the
            // value happen before our writes).
            while slot
                .compare_exchange_weak(FREE, WRITE, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                backoff.snooze();
            }
        }
        // Acquire (the fetch_or and each load): every reader counted in the shared word
        // released it (its reads happen before our writes). A reader that counts itself
        // after the flag is up sees it and steps back out.
        self.shared().fetch_or(WRITER, Ordering::Acquire);
        let mut backoff = Backoff::new();
        while self.shared().load(Ordering::Acquire) != WRITER {
            backoff.snooze();
        }
        /// Gives the slots back even if `f` panics, so the lock stays usable.
        struct Release<'a, T>(&'a ReadMostly<T>);
        impl<T> Drop for Release<'_, T> {
            fn drop(&mut self) {
                // Release: our writes happen before the reads of any reader counted later.
                self.0.shared().fetch_and(!WRITER, Ordering::Release);
                for slot in self.0.slots() {
                    // Release: our writes happen before any later reader's reads.
                    slot.store(FREE, Ordering::Release);
                }
            }
        }
        let _release = Release(self);
        // SAFETY: we hold every slot and the shared count is zero under our flag, so no
        // reader holds the value, and the mutex excludes other writers: this is the only
        // reference to the value until `_release` drops.
        f(unsafe { &mut *self.value.get() })
    }
}

impl<T> Drop for ReadMostly<T> {
    fn drop(&mut self) {
        forks::unregister(&self.words);
    }
}

/// The registry of every lock's words, for the fork's child handler (module docs).
#[cfg(not(loom))]
pub(crate) mod forks {
    use std::sync::{Mutex, PoisonError};

    use super::{AtomicU32, Ordering};
    use crate::clock::gate;

    type Words = [crossbeam_utils::CachePadded<AtomicU32>];

    /// A registered lock's words.
    struct Entry(*const Words);

    // SAFETY: the pointer is only read by the fork's child handler, under the registry's
    // lock, while the words it points to are alive (see `forget_readers`).
    unsafe impl Send for Entry {}

    /// Each registered lock's words. Changed only inside the fork gate, so a child never
    /// finds it held.
    static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

    pub(super) fn register(words: &Words) {
        let _inside = gate::enter();
        // Nothing here panics half-way, so poisoning breaks no invariant.
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        registry.push(Entry(words));
    }

    pub(super) fn unregister(words: &Words) {
        let _inside = gate::enter();
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = registry.iter().position(|e| core::ptr::eq(e.0, words)) {
            registry.swap_remove(i);
        }
    }

    /// In a forked child, before it has any thread but the forking one: every slot and
    /// shared count is freed (their holders did not come along; module docs).
    pub(crate) fn forget_readers() {
        let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in registry.iter() {
            // The gate kept every thread out of the registry and out of a write across
            // the fork, and the child's only thread is the forking one, in no read.
            // SAFETY: registered words stay allocated until `Drop` unregisters them,
            // under the lock we hold; nothing else touches them now (above).
            let words = unsafe { &*entry.0 };
            for word in words {
                // Relaxed: the child has no other thread yet.
                word.store(FREE_WORD, Ordering::Relaxed);
            }
        }
    }

    /// A free slot, and an empty shared word.
    const FREE_WORD: u32 = super::FREE;
}

/// Loom models never fork.
#[cfg(loom)]
mod forks {
    pub(super) fn register<T: ?Sized>(_words: &T) {}
    pub(super) fn unregister<T: ?Sized>(_words: &T) {}
}

/// The guard of [`ReadMostly::read`]: the value, and what keeps writers out while the
/// value is borrowed.
///
/// It holds the lock rather than a `&'a T`: a reference in a guard would stay protected
/// for as long as a function the guard was moved into runs, so a writer that got in after
/// the guard dropped inside such a function would alias it (the reason std's
/// `RwLockReadGuard` holds a pointer; Miri caught it here). Two words, so it is returned
/// in registers.
pub(crate) struct ReadGuard<'a, T> {
    lock: &'a ReadMostly<T>,
    /// The reader's own slot, or `None` for a place in the shared count.
    slot: Option<&'a AtomicU32>,
}

impl<T> core::ops::Deref for ReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the guard keeps writers out (its slot or its place in the shared count)
        // for as long as it lives, and the returned reference cannot outlive it: a writer
        // holds every slot and waits for the shared count to empty before it makes a
        // `&mut T`.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: this reader's reads of the value happen before the next writer's writes
        // (it takes the slot, or waits for the shared count, with Acquire).
        match self.slot {
            Some(slot) => slot.store(FREE, Ordering::Release),
            None => {
                self.lock.shared().fetch_sub(1, Ordering::Release);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::ReadMostly;
    use std::sync::Arc;

    #[test]
    fn readers_see_every_write_and_writers_exclude_readers() {
        // Four threads, two slots (so readers share and move on): each read sees a
        // consistent pair, every write lands.
        let rounds = if cfg!(miri) { 20 } else { 2_000 };
        let lock = Arc::new(ReadMostly::new((0u64, 0u64), 2));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..rounds {
                        lock.write(|(a, b)| {
                            *a += 1;
                            *b += 1;
                        });
                        for _ in 0..10 {
                            let pair = *lock.read();
                            assert_eq!(pair.0, pair.1, "a read saw half a write");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.read(), (4 * rounds, 4 * rounds));
    }

    #[test]
    fn a_reader_never_waits_for_readers_and_a_writer_waits_for_all_of_them() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // One slot, held: a second read on the same thread would wait for ever if readers
        // waited for slots; it counts itself in the shared word instead (as a reader
        // whose slot holder was descheduled does).
        let lock = ReadMostly::new(0u32, 1);
        let holder = lock.read();
        let counted = lock.read();
        assert!(counted.slot.is_none(), "counted in the shared word");
        drop(holder);
        // A writer waits for the reader counted in the shared word, though every slot is
        // free.
        let wrote = AtomicBool::new(false);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                lock.write(|v| *v += 1);
                wrote.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(
                !wrote.load(Ordering::SeqCst),
                "a write while a reader held the value"
            );
            assert_eq!(*counted, 0);
            drop(counted);
            writer.join().unwrap();
        });
        assert!(wrote.load(Ordering::SeqCst));
        assert_eq!(*lock.read(), 1);
        // Both kinds of reader gave their place back: the writer got in, and gets in again.
        assert_eq!(lock.write(|v| *v), 1);
    }

    #[test]
    fn a_panicking_writer_leaves_the_lock_usable() {
        let lock = ReadMostly::new(1u32, 2);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lock.write(|_| panic!("inside the write"))
        }));
        assert!(panicked.is_err());
        assert_eq!(*lock.read(), 1);
        assert_eq!(lock.write(|v| *v), 1);
    }

    #[test]
    fn slot_counts_round_up_to_a_power_of_two() {
        for (asked, got) in [(0, 1), (1, 1), (3, 4), (8, 8)] {
            let lock = ReadMostly::new(7u8, asked);
            assert_eq!(lock.slots().len(), got);
            assert_eq!(*lock.read(), 7);
            assert_eq!(lock.write(|v| *v), 7);
        }
    }
}
