//! A waiter's node: what a waiting future embeds and the queue links, and the two ways
//! the queue reaches into it (its slot, under the queue lock; its `fired` flag, without).
//! `queue` holds the invariants these rely on.

use core::ptr::NonNull;
use core::task::Waker;

use super::list::{Link, Pointers};
use crate::sync::{AtomicBool, Ordering, UnsafeCell};

/// One waiter's node, embedded in its (pinned) future.
pub(crate) struct Waiter {
    pub(super) pointers: Pointers<Waiter>,
    /// Only touched under the queue lock.
    pub(super) slot: UnsafeCell<Slot>,
    /// Set by `fire` under the queue lock, as its last access to the node; read by the
    /// owning future without the lock. Once it reads `true` the node is out of the list
    /// and nobody else touches it, so the future may complete and free it.
    pub(super) fired: AtomicBool,
}

#[derive(Debug, Default)]
pub(super) struct Slot {
    /// The TAT this booking left in the word, as of when it was written (at booking, or
    /// when the queue last settled its lags). The tail's, moved up by the lags, is what
    /// the word holds while no plain admission has happened since it booked.
    pub(super) tat: u64,
    /// The lag ahead of this node (see `lag`, summed from the front through this node)
    /// when `tat` was written. Wrapping arithmetic, like every lag.
    pub(super) base: u64,
    /// Nanoseconds by which this node and every node behind it moved up (a waiter ahead
    /// gave its cells back) and that are not yet written into their `tat`.
    pub(super) lag: u64,
    /// The booked cost in nanoseconds (`n * T`).
    pub(super) cost: u64,
    /// The cells booked (`n`), to price the booking again at another interval
    /// (`Waiters::respace`).
    pub(super) cells: u64,
    /// How far before its TAT the booking becomes admissible: `max(tau, cost)` of the
    /// quota at booking, or at the last quota change before its instant came.
    pub(super) window: u64,
    /// The task to wake when fired.
    pub(super) waker: Option<Waker>,
    /// The queue's list epoch when this node was linked (see `queue`, "Fork").
    pub(super) epoch: u64,
    /// The queue's booking number for this node (see `queue`, "Limiters whose word other
    /// processes share").
    pub(super) seq: u64,
}

impl Slot {
    /// The booking's TAT, given `ahead`: the lag summed from the front through this node.
    pub(super) fn tat_at(&self, ahead: u64) -> u64 {
        // The lag gained since `tat` was written is at most the cells given back ahead of
        // this booking, all of which its TAT counts: no underflow (saturating anyway).
        self.tat.saturating_sub(ahead.wrapping_sub(self.base))
    }

    /// Limiter time at which the booking becomes admissible, given `ahead` (as `tat_at`).
    pub(super) fn instant_at(&self, ahead: u64) -> u64 {
        self.tat_at(ahead).saturating_sub(self.window)
    }
}

impl Waiter {
    pub(crate) fn new() -> Waiter {
        Waiter {
            pointers: Pointers::new(),
            slot: UnsafeCell::new(Slot::default()),
            fired: AtomicBool::new(false),
        }
    }
}

/// Freeing a node is a write to all of it. Under loom, say so: a queue access to the slot
/// that is not ordered before the free (a `fired` flag published too weakly) is then
/// reported as a race, which loom could not see in the deallocation itself.
#[cfg(loom)]
impl Drop for Waiter {
    fn drop(&mut self) {
        self.slot.with_mut(|_| ());
    }
}

impl core::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Waiter")
    }
}

// SAFETY: a `Waiter`'s fields are touched only under its queue's lock (the slot) or by the
// list while holding that lock (the pointers), whichever thread that is; its contents
// (integers, a `Waker`) are `Send`. So the future that embeds it may move between threads.
unsafe impl Send for Waiter {}
// SAFETY: as for `Send`: `&Waiter` gives no unsynchronised access, every access to the
// cells inside goes through the queue lock.
unsafe impl Sync for Waiter {}

// SAFETY: `pointers` projects to the embedded field with `&raw mut`, creating no reference
// to the node.
unsafe impl Link for Waiter {
    unsafe fn pointers(target: NonNull<Self>) -> NonNull<Pointers<Self>> {
        // SAFETY: `target` is live (caller's contract), so the field address is non-null.
        unsafe { NonNull::new_unchecked(&raw mut (*target.as_ptr()).pointers) }
    }
}

/// Runs `f` on a node's slot.
///
/// # Safety
///
/// `node` is live and the caller holds the queue lock.
pub(super) unsafe fn slot<R>(node: NonNull<Waiter>, f: impl FnOnce(&mut Slot) -> R) -> R {
    // SAFETY: `node` is live (caller's contract); we read the field's address without
    // creating a reference to the whole node.
    let cell = unsafe { &(*node.as_ptr()).slot };
    // SAFETY: the queue lock is held, so this is the only access to the slot.
    cell.with_mut(|p| f(unsafe { &mut *p }))
}

/// Whether `fire` has unlinked the node.
///
/// # Safety
///
/// `node` is live.
pub(super) unsafe fn fired(node: NonNull<Waiter>, order: Ordering) -> bool {
    // SAFETY: `node` is live (caller's contract); the field is atomic, so a shared
    // reference to it may coexist with the queue's accesses to the other fields.
    unsafe { (*node.as_ptr()).fired.load(order) }
}
