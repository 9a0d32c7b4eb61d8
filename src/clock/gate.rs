//! The fork gate: paceline's locks that a forked child needs are never copied held.
//!
//! `fork` copies the calling thread only. A child copied while another thread held a
//! limiter's queue lock, a keyed limiter's map of queues or a budget's lock would find
//! that lock held for ever, and hang at its first wait. So each of those locks is taken
//! inside the gate, entered shared (before the lock, left after it), and the fork's
//! *prepare* handler (`fork.rs`) takes the gate exclusively and keeps it across the fork:
//! the copy is made while no thread is inside any of them.
//!
//! **Cheap to enter.** The gate is [`SHARDS`] read-write locks, each on a cache line of its
//! own; a thread enters the one its index picks (given out in turn as threads first enter),
//! so threads on different cores rarely touch one line, and the fork takes all of them. A
//! thread already inside the gate (one lock taken inside another) enters again without
//! locking: a second shared lock of a shard whose exclusive lock a fork is waiting for
//! would wait for ever.
//!
//! **Order.** The clock modules' prepare handlers run first (their hooks are added first):
//! the timer's waits until its thread is between wake-ups and keeps the timer's lock, and no
//! lock inside the gate is ever held while asking for the timer's lock, so every thread
//! inside the gate leaves it. Nothing under a gated lock forks, and wakers are woken after
//! the lock is let go.

use core::cell::Cell;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crossbeam_utils::CachePadded;

use super::fork::Hooks;

/// Shards of the gate: more than the cores of most machines that fork.
const SHARDS: usize = 16;

static GATE: [CachePadded<RwLock<()>>; SHARDS] =
    [const { CachePadded::new(RwLock::new(())) }; SHARDS];

/// The next thread's shard.
static NEXT: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// This thread's shard, once it has entered.
    static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
    /// How deep inside the gate this thread is.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Every shard, held exclusively by the forking thread across the fork.
    static HELD: Cell<Option<Vec<RwLockWriteGuard<'static, ()>>>> = const { Cell::new(None) };
}

/// The gate's hooks (added by `clock::forks`, after the clocks').
pub(super) static FORK_HOOKS: Hooks = Hooks::new(close, open, open_in_child);

/// Being inside the gate; leaving it on drop.
pub(crate) struct Inside {
    shard: Option<RwLockReadGuard<'static, ()>>,
}

impl Drop for Inside {
    fn drop(&mut self) {
        DEPTH.with(|depth| depth.set(depth.get() - 1));
        drop(self.shard.take());
    }
}

/// Enters the gate: hold the result while holding a lock a forked child must find free.
pub(crate) fn enter() -> Inside {
    let outer = DEPTH.with(|depth| {
        let d = depth.get();
        depth.set(d + 1);
        d == 0
    });
    let shard = outer.then(|| {
        let i = SHARD.with(|shard| {
            shard.get().unwrap_or_else(|| {
                // Relaxed: an index, publishing nothing.
                let i = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
                shard.set(Some(i));
                i
            })
        });
        // Nothing inside the gate panics half-way, so poisoning breaks no invariant.
        GATE[i].read().unwrap_or_else(PoisonError::into_inner)
    });
    Inside { shard }
}

/// Fork's prepare handler: waits for every thread to leave the gate, and keeps it closed.
fn close() {
    HELD.with(|held| {
        // Registered twice (`fork.rs`): the first run holds it already.
        let guards = held.take().unwrap_or_else(|| {
            GATE.iter()
                .map(|shard| shard.write().unwrap_or_else(PoisonError::into_inner))
                .collect()
        });
        held.set(Some(guards));
    });
}

/// Fork's parent handler: the gate opens.
fn open() {
    drop(HELD.with(Cell::take));
}

/// Fork's child handler: the key stores' reader slots held by threads that did not come
/// along are freed (`sync/read_mostly.rs`), then the gate opens.
fn open_in_child() {
    crate::sync::read_mostly_forks::forget_readers();
    open();
}

/// A lock taken inside the gate ([`lock`]); the lock goes first, then the gate.
pub(crate) struct Gated<'a, T> {
    guard: crate::sync::MutexGuard<'a, T>,
    _inside: Inside,
}

impl<T> core::ops::Deref for Gated<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> core::ops::DerefMut for Gated<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// Takes `mutex` inside the gate.
pub(crate) fn lock<T>(mutex: &crate::sync::Mutex<T>) -> Gated<'_, T> {
    let inside = enter();
    Gated {
        guard: mutex.lock(),
        _inside: inside,
    }
}
