//! The waiter queue: booked places, fired in order, refunded on cancel.
//!
//! # Implementation notes
//!
//! **Invariant.** Every linked waiter has booked its cost in the cell's TAT (the same word
//! `check()` reads), and its *instant* (when its booking becomes admissible) is stored in
//! its node. Instants never decrease along the list: bookings happen under the queue lock
//! in list order, and each moves the TAT forward by its cost from at least where the last
//! one left it.
//!
//! **Why plain checks cannot overtake.** A linked waiter whose instant is after `now` has
//! pushed the TAT beyond `now + tau`, so `check()` at `now` has no room: it is denied
//! until the last booking's instant, exactly as if the waiters had been admitted first.
//!
//! **Firing.** When the front's instant has come, [`Waiters::fire_due`] unlinks the due
//! prefix, marks each node fired and wakes them in order (FIFO, heavy requests included),
//! with the wakers collected under the lock and woken after it.
//!
//! **Cancelling is exact.** A waiter dropped before its instant unlinks itself, gives its
//! cost back to the TAT and moves every waiter behind it up by that cost. This is the state
//! the queue would have had if it had never asked: no waiter behind it can have booked
//! into a gap (a gap means the TAT had fallen behind the clock, which cannot happen while
//! an earlier booking is still in the future), and no plain check was admitted meanwhile
//! (see above). A waiter whose instant has passed but which has not been fired yet keeps
//! its cells: they were admissible at its instant and later bookings may rely on that.
//!
//! **One timer per queue.** The queue asks its clock to wake it at the front's instant,
//! and re-arms only when the front's instant is earlier than the wake-up already asked
//! for. 100 000 waiters cost one timer entry.

use core::ptr::NonNull;
use core::task::Waker;
use std::sync::{Arc, Weak};
use std::task::Wake;

use super::list::{self, Link, LinkedList, Pointers};
use crate::cell::Cell;
use crate::clock::Clock;
use crate::gcra::{self, Params};
use crate::sync::{AtomicBool, Mutex, Ordering, UnsafeCell};
use crate::wake_list::WakeList;

/// One waiter's node, embedded in its (pinned) future.
pub(crate) struct Waiter {
    pointers: Pointers<Waiter>,
    /// Only touched under the queue lock.
    slot: UnsafeCell<Slot>,
    /// Set by `fire` under the queue lock, as its last access to the node; read by the
    /// owning future without the lock. Once it reads `true` the node is out of the list
    /// and nobody else touches it, so the future may complete and free it.
    fired: AtomicBool,
}

#[derive(Debug, Default)]
struct Slot {
    /// Limiter time at which the booking becomes admissible.
    instant: u64,
    /// The booked cost in nanoseconds (`n * T`).
    cost: u64,
    /// The task to wake when fired.
    waker: Option<Waker>,
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
unsafe fn slot<R>(node: NonNull<Waiter>, f: impl FnOnce(&mut Slot) -> R) -> R {
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
unsafe fn fired(node: NonNull<Waiter>, order: Ordering) -> bool {
    // SAFETY: `node` is live (caller's contract); the field is atomic, so a shared
    // reference to it may coexist with the queue's accesses to the other fields.
    unsafe { (*node.as_ptr()).fired.load(order) }
}

/// The state under the queue lock.
#[derive(Debug)]
struct State {
    list: LinkedList<Waiter>,
    /// The earliest instant for which a wake-up is outstanding with the clock.
    armed: Option<u64>,
}

impl State {
    /// Whether the clock must be asked to wake the queue at `instant`; records it if so.
    fn arm(&mut self, instant: u64) -> bool {
        if self.armed.is_some_and(|armed| armed <= instant) {
            return false;
        }
        self.armed = Some(instant);
        true
    }

    fn arm_front(&mut self) -> Option<u64> {
        let front = self.list.front()?;
        // SAFETY: a linked node is live (list rule 3) and we hold the lock.
        let instant = unsafe { slot(front, |s| s.instant) };
        self.arm(instant).then_some(instant)
    }
}

/// The outcome of a first poll.
pub(crate) enum Booking {
    /// Admitted now; nothing linked.
    Ready,
    /// Not within the deadline; nothing booked. Carries the wait in nanoseconds.
    TooLate(u64),
    /// Booked and linked; the node will be fired at its instant.
    Linked,
}

/// A queue of waiters beside one cell, with its clock.
pub(crate) struct Waiters<C> {
    clock: C,
    /// The clock reading that is limiter time 0.
    origin: u64,
    state: Mutex<State>,
    /// The waker handed to the clock: fires this queue. It holds a `Weak`, so a clock that
    /// keeps it (a `ManualClock` never advanced again) forms no reference cycle.
    fire: Waker,
}

/// The clock's handle on a queue.
struct Fire<C>(Weak<Waiters<C>>);

impl<C: Clock> Wake for Fire<C> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(waiters) = self.0.upgrade() {
            waiters.fire(true);
        }
    }
}

impl<C> core::fmt::Debug for Waiters<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Waiters")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Waiters<C> {
    pub(crate) fn new(clock: C, origin: u64) -> Arc<Waiters<C>> {
        Arc::new_cyclic(|weak| Waiters {
            clock,
            origin,
            state: Mutex::new(State {
                list: LinkedList::new(),
                armed: None,
            }),
            fire: Waker::from(Arc::new(Fire(weak.clone()))),
        })
    }

    /// Limiter time now.
    pub(crate) fn now(&self) -> u64 {
        self.clock.now().saturating_sub(self.origin)
    }

    fn schedule(&self, instant: Option<u64>) {
        if let Some(instant) = instant {
            self.clock
                .wake_at(self.origin.saturating_add(instant), self.fire.clone());
        }
    }

    /// Books `cost` at `now` (limiter time, read by the caller just before) within
    /// `max_wait` and, unless it is admissible at once, links `node` to be woken through
    /// `waker` at its instant.
    ///
    /// # Safety
    ///
    /// `node` is pinned, has never been linked, and is not dropped before
    /// [`Waiters::cancel`] (or a fire) has unlinked it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn book(
        &self,
        cell: &Cell,
        params: &Params,
        node: NonNull<Waiter>,
        now: u64,
        cost: u64,
        max_wait: u64,
        waker: &Waker,
    ) -> Booking {
        let arm = {
            let mut state = self.state.lock();
            let tolerance = params.tau().saturating_add(max_wait);
            let tat = match cell.acquire(now, cost, tolerance) {
                Ok(tat) => tat,
                Err(wait) => return Booking::TooLate(wait),
            };
            let instant = gcra::ready_at(tat, params);
            if instant <= now {
                return Booking::Ready;
            }
            // SAFETY: `node` is live and unlinked (caller's contract); we hold the lock.
            unsafe {
                slot(node, |s| {
                    *s = Slot {
                        instant,
                        cost,
                        waker: Some(waker.clone()),
                    }
                });
                state.list.push_back(node);
            }
            state.arm(instant).then_some(instant)
        };
        self.schedule(arm);
        Booking::Linked
    }

    /// A later poll of a linked node: `true` once it has been fired; otherwise refreshes
    /// its waker.
    ///
    /// # Safety
    ///
    /// `node` was linked by [`Waiters::book`] on this queue and is live.
    pub(crate) unsafe fn poll_linked(&self, node: NonNull<Waiter>, waker: &Waker) -> bool {
        // The common case, a poll after the fire's wake-up, takes no lock. Acquire pairs
        // with the fire's Release store, its last access to the node: after this load
        // nobody else touches the node, so the caller may complete and free it.
        // SAFETY: `node` is live (caller's contract).
        if unsafe { fired(node, Ordering::Acquire) } {
            return true;
        }
        let now = self.now();
        let (fired_now, due, _old) = {
            let _state = self.state.lock();
            // Relaxed: `fire` stores under this lock, which orders it before us.
            // SAFETY: `node` is live (caller's contract) and we hold the lock.
            if unsafe { fired(node, Ordering::Relaxed) } {
                (true, false, None)
            } else {
                // SAFETY: as above.
                unsafe {
                    slot(node, |s| {
                        let old = match &s.waker {
                            Some(w) if w.will_wake(waker) => None,
                            _ => s.waker.replace(waker.clone()),
                        };
                        (false, s.instant <= now, old)
                    })
                }
            }
            // `_old`, a replaced waker, is dropped after the lock is released.
        };
        if fired_now {
            return true;
        }
        if due {
            // The timer is late (or there is none): fire the due prefix ourselves.
            self.fire_due();
            let _state = self.state.lock();
            // Relaxed under the lock, as above. `fire_due` popped every node due at `now`,
            // this one included.
            // SAFETY: `node` is live (caller's contract).
            return unsafe { fired(node, Ordering::Relaxed) };
        }
        false
    }

    /// Drops a linked node: unlinks it and, if its instant is still ahead, refunds its cost
    /// and moves everyone behind it up.
    ///
    /// # Safety
    ///
    /// `node` was linked by [`Waiters::book`] on this queue, beside `cell`, and is live.
    pub(crate) unsafe fn cancel(&self, cell: &Cell, node: NonNull<Waiter>) {
        let now = self.now();
        let (arm, _waker) = {
            let mut state = self.state.lock();
            // Relaxed: `fire` stores under this lock, which orders it before us.
            // SAFETY: `node` is live (caller's contract).
            let fired = unsafe { fired(node, Ordering::Relaxed) };
            // SAFETY: `node` is live and we hold the lock.
            let (instant, cost, waker) =
                unsafe { slot(node, |s| (s.instant, s.cost, s.waker.take())) };
            if fired {
                // Already unlinked by `fire_due`; its cells were spent at its instant.
                return;
            }
            // SAFETY: `node` is live and linked in this list; we hold the lock.
            let mut behind = unsafe { list::next(node) };
            // SAFETY: as above.
            let removed = unsafe { state.list.remove(node) };
            debug_assert!(removed, "a linked, unfired waiter is in its list");
            if instant > now {
                cell.refund(cost);
                while let Some(later) = behind {
                    // SAFETY: `later` is linked, so live (list rule 3); we hold the lock.
                    unsafe {
                        slot(later, |s| s.instant = s.instant.saturating_sub(cost));
                        behind = list::next(later);
                    }
                }
            }
            (state.arm_front(), waker)
        };
        self.schedule(arm);
    }

    /// Fires every waiter whose instant has come, in queue order, and re-arms the timer for
    /// the next one.
    pub(crate) fn fire_due(&self) {
        self.fire(false);
    }

    /// [`Waiters::fire_due`]; `from_clock` when the clock delivered the wake-up we asked for.
    fn fire(&self, from_clock: bool) {
        let mut due = WakeList::new();
        let mut from_clock = from_clock;
        loop {
            let now = self.now();
            let (arm, more) = {
                let mut state = self.state.lock();
                if from_clock || state.armed.is_some_and(|armed| armed <= now) {
                    // The wake-up we asked for has come, or is due and will find nothing.
                    // A clock may deliver it early by its own reading (a coarse clock lags
                    // the timer that serves it): forgetting it here makes `arm_front` ask
                    // again, instead of waiting for a wake-up that was already spent.
                    state.armed = None;
                    from_clock = false;
                }
                while !due.is_full() {
                    let Some(front) = state.list.front() else {
                        break;
                    };
                    // SAFETY: a linked node is live (list rule 3) and we hold the lock.
                    let waker =
                        unsafe { slot(front, |s| (s.instant <= now).then(|| s.waker.take())) };
                    let Some(waker) = waker else { break };
                    state.list.pop_front();
                    // The last access to the node: Release, so that a future that sees
                    // `true` without the lock (`poll_linked`) sees every access above
                    // done, and may free the node.
                    // SAFETY: `front` is still live: its future cannot complete before it
                    // reads this `true`.
                    unsafe { (*front.as_ptr()).fired.store(true, Ordering::Release) };
                    if let Some(waker) = waker {
                        due.push(waker);
                    }
                }
                (state.arm_front(), due.is_full())
            };
            due.wake_all();
            self.schedule(arm);
            if !more {
                return;
            }
        }
    }

    /// The clock time at which the front waiter is due, if any.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        let state = self.state.lock();
        let front = state.list.front()?;
        // SAFETY: a linked node is live (list rule 3) and we hold the lock.
        let instant = unsafe { slot(front, |s| s.instant) };
        Some(self.origin.saturating_add(instant))
    }

    /// Whether no waiter is linked.
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().list.is_empty()
    }
}
