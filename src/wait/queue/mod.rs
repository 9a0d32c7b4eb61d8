//! The waiter queue: booked places, fired in order, refunded on cancel.
//!
//! # Implementation notes
//!
//! **Invariant.** Every linked waiter has booked its cost in the limiter's TAT (the same word
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
//! **Spent is spent.** A waiter whose instant has come keeps its cells when it is dropped,
//! whether or not it was fired (the timer may be late; a reservation's holder may have
//! acted on it), and a quota change never moves a reached instant later. A keyed limiter
//! reads the time for this no earlier than its last sweep, so a waiter of a key that was
//! forgotten (its TAT, and so every instant in it, had passed) and stored again never
//! refunds into the new word.
//!
//! **Cancelling is exact, and decided on the state it changes.** A cancelled waiter whose
//! instant has not come gives its cost back only if *no plain admission has happened
//! since the last booking*: then
//! the word still holds the tail's booked TAT, and a compare-and-swap from exactly that
//! value to the value minus the cost makes the state the queue would have had if the
//! waiter had never asked (every waiter behind it moves up by the cost; none can have
//! booked into a gap, since a gap means the TAT had fallen behind the clock, which cannot
//! happen while an earlier booking is still in the future). Bookings and refunds happen
//! under the queue lock, so only a plain admission (`check()`, or a first poll admitted at
//! once) can make the word differ from the tail's TAT, and plain admissions only move it
//! forward. A plain admission while waiters are linked must fit after all of them, so it
//! happens at or after every linked waiter's instant: the cancelled waiter's cells were
//! then admissible at its instant and someone was admitted behind them. It keeps them,
//! and if the admission races the refund, the refund's compare-and-swap fails. No clock is
//! read to decide this, so a cancelling thread preempted for any length of time cannot
//! hand back cells that were already relied on (the clock reading of "Spent is spent"
//! only ever keeps more cells spent).
//!
//! **Limiters whose word other processes share** (`crate::shared`) book and admit
//! without this queue's lock. The refund rule above covers an admission after our last
//! booking (the word no longer holds our tail's TAT). One *between* our bookings (another
//! process booked after our waiter `X` and before our next one `Y`) is seen when `Y`
//! books: its TAT does not follow the tail's directly. A refund of `X` would move `Y` up
//! but not the other process's booking, which that process knows nothing about, so no
//! waiter booked before such a gap gives cells back. In one process a gap only comes from
//! a plain admission, which happens after every earlier linked instant, so this changes
//! nothing there.
//!
//! **Moving up, in O(1).** A refund moves every waiter behind the cancelled one up by its
//! cost. Writing that into each of them made cancelling `N` waiters cost `N²` (a task
//! group failing with 50 000 waiters took seconds). Instead the cost is added to one
//! field, the `lag` of the node that was behind: a node's TAT is the one written in its
//! slot minus the lags summed from the front through it (less what that sum was when the
//! slot was written, its `base`). The front's lag is all the lag ahead of it, and the
//! list's total is all the lag ahead of the tail, so the front's instant, the tail's TAT
//! (a refund's expected word) and a node leaving the front (its lag handed on to the
//! next) all stay O(1). A read of a node in the middle of the list (a reservation's
//! `ready_in`) writes every lag into its slot once, O(list), and reads in O(1) from then
//! until the next refund; a quota change does the same as it re-reads every instant. The
//! lags are added in wrapping arithmetic: only their differences are used, and those are
//! at most the cells given back ahead of a booking, all of which its TAT counts.
//!
//! Deciding whether a cancelled waiter's instant has come needs its own instant: the walk
//! from the front stops at the first waiter whose instant has not come (instants never
//! decrease along the list, and moving up keeps that, as it moves a whole suffix by the
//! same amount), so it reads only waiters that are due and about to be fired.
//!
//! **Re-entrant clocks.** A clock may wake the queue on the calling thread from inside
//! `wake_at` (it should only do so when the instant has come). Such a wake-up is noticed,
//! not recursed into: the firing round that asked handles it in another pass. A clock
//! that keeps waking early
//! that way is given up on after a few rounds (the waiters are then fired by later polls
//! or `fire_due`) instead of overflowing the stack.
//!
//! **Arm before waking.** A firing round asks the clock for the next front's instant
//! before it wakes the tasks it unlinked: a task's waker is foreign code and may block,
//! and the queue's next wake-up must not wait for it (it is with the clock already, which
//! hands a stuck timer's work to another thread).
//!
//! **Fork.** A forked child inherits the list but not the threads whose futures own its
//! nodes, and the C library reuses those threads' stacks for the child's new threads: a
//! node that lived on one is gone. So the first lock taken in a new fork generation
//! (`clock/fork.rs`) forgets the whole list without touching a node, and starts a new
//! list epoch. Their bookings stay in the word (spent, as by a waiter that never comes
//! back). A future of the forking thread itself, the one thread that came along, finds
//! its node of an old epoch: it is *orphaned*, out of every list, and finishes at its own
//! instant through its clock ([`Progress::Orphaned`]); dropped, it gives nothing back.
//!
//! **One timer per queue.** The queue asks its clock to wake it at the front's instant,
//! and re-arms only when the front's instant is earlier than the wake-up already asked
//! for. 100 000 waiters cost one timer entry.

use core::ptr::NonNull;
use core::task::Waker;
use std::sync::{Arc, Weak};
use std::task::Wake;

mod changes;
mod state;

use super::list::{self, LinkedList};
pub(crate) use super::node::Waiter;
use super::node::{fired, slot, Slot};
use crate::cell::{Ours, TatWord};
use crate::clock::gate::{self, Gated};
use crate::clock::Clock;
use crate::gcra::{self, Params};
use crate::sync::{thread_local, Mutex, Ordering, Panic, WakeList};
use state::State;

/// What a later poll of a linked node finds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Fired: the turn has come, and the node is out of the list.
    Fired,
    /// Still linked; its waker is the latest task's.
    Linked,
    /// A fork made the queue forget the node (module docs, "Fork"): it is in no list and
    /// its turn comes at this limiter time.
    Orphaned(u64),
}

/// The outcome of a first poll.
pub(crate) enum Booking {
    /// Admitted now; nothing linked.
    Ready,
    /// Not within the deadline; nothing booked. Carries the wait in nanoseconds.
    TooLate(u64),
    /// Booked and linked; the node will be fired at its instant. The caller passes the
    /// `Arm` to [`Waiters::schedule`] once it holds no lock.
    Linked(Arm),
    /// The word stopped being the target's while it was booked on (a shared key's slot
    /// given to another key); nothing booked, nothing linked: look the word up again.
    Moved,
}

/// A wake-up the clock must be asked for, handed out by `book` and `cancel` so that the
/// caller asks after releasing its own locks (asking may run wakers on this thread).
#[must_use = "pass it to Waiters::schedule"]
#[derive(Debug)]
pub(crate) struct Arm(Option<u64>);

/// A queue of waiters beside one cell, with its clock.
pub(crate) struct Waiters<C: Clock> {
    clock: C,
    state: Mutex<State>,
    /// The waker handed to the clock: fires this queue. It holds a `Weak`, so a clock that
    /// keeps it (a `ManualClock` never advanced again) forms no reference cycle.
    fire: Waker,
}

/// The clock's handle on a queue.
struct Fire<C: Clock>(Weak<Waiters<C>>);

// The queue (by address) whose `schedule` is inside `Clock::wake_at` on this thread, and
// whether the clock woke it re-entrantly. (loom's `thread_local!` has no `const` form.)
#[cfg(not(loom))]
thread_local! {
    static ASKING: core::cell::Cell<(usize, bool)> = const { core::cell::Cell::new((0, false)) };
}
#[cfg(loom)]
thread_local! {
    static ASKING: core::cell::Cell<(usize, bool)> = core::cell::Cell::new((0, false));
}

impl<C: Clock> Wake for Fire<C> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(waiters) = self.0.upgrade() {
            let me = Arc::as_ptr(&waiters).addr();
            let reentrant = ASKING.with(|asking| {
                let (queue, _) = asking.get();
                let reentrant = queue == me;
                if reentrant {
                    // Woken from inside our own `wake_at`: `schedule` takes it from here.
                    asking.set((queue, true));
                }
                reentrant
            });
            if !reentrant {
                waiters.fire(true);
            }
        }
    }
}

impl<C: Clock> core::fmt::Debug for Waiters<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Waiters").finish_non_exhaustive()
    }
}

/// Consecutive early re-entrant wake-ups after which `schedule` stops asking the clock.
const MAX_EARLY_WAKES: u32 = 16;

impl<C: Clock> Waiters<C> {
    pub(crate) fn new(clock: C) -> Arc<Waiters<C>> {
        Arc::new_cyclic(|weak| Waiters {
            clock,
            state: Mutex::new(State {
                list: LinkedList::new(),
                lag: 0,
                seq: 0,
                gap_before: 0,
                settled: true,
                armed: None,
                armed_in: 0,
                asked_clock: false,
                generation: crate::clock::forks(),
                epoch: 0,
            }),
            fire: Waker::from(Arc::new(Fire(weak.clone()))),
        })
    }

    /// The queue lock; in a process forked since the list was last touched, the list is
    /// forgotten first (module docs, "Fork").
    fn lock(&self) -> Gated<'_, State> {
        // Read before the lock: it changes only in a child being born, and its first read
        // in a process may wait out a fork in progress (`clock/fork.rs`), which must not
        // happen holding the lock (the child would inherit it held).
        let generation = crate::clock::forks();
        // Inside the gate: no fork copies the lock held (`clock/gate.rs`).
        let mut state = gate::lock(&self.state);
        if state.generation != generation {
            state.generation = generation;
            // Forgotten without reading a node: some are on stacks the child reused.
            state.list = LinkedList::new();
            state.lag = 0;
            state.settled = true;
            state.epoch = state.epoch.wrapping_add(1);
            state.armed = None;
        }
        state
    }

    /// Asks the clock for the wake-up `book` or `cancel` left to arm. Call it holding no
    /// lock.
    pub(crate) fn schedule(&self, arm: Arm) {
        if let Some(instant) = arm.0 {
            if self.ask_once(instant) {
                // The clock woke us on this thread: fire what is due, and arm the next.
                let early = u32::from(self.clock.now() < instant);
                self.fire_round(true, early);
            }
        }
    }

    /// Asks the clock once to wake the queue at `instant`; returns whether it did so on
    /// this very thread, from inside `wake_at` (see the module docs): the caller then
    /// fires what is due itself.
    fn ask_once(&self, instant: u64) -> bool {
        let me = core::ptr::from_ref(self).addr();
        let outer = ASKING.with(|asking| asking.replace((me, false)));
        self.clock.wake_at(instant, self.fire.clone());
        let (_, woken) = ASKING.with(|asking| asking.replace(outer));
        woken
    }

    /// Books `cost` at `now` (limiter time, read by the caller just before) within
    /// `max_wait` on `cell` (while `ours` says it is the target's word) and, unless it is
    /// admissible at once, links `node` to be woken through `waker` at its instant.
    ///
    /// # Safety
    ///
    /// `node` is pinned, has never been linked, and is not dropped before
    /// [`Waiters::cancel`] (or a fire) has unlinked it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn book(
        &self,
        cell: &TatWord,
        ours: Ours<'_>,
        params: &Params,
        node: NonNull<Waiter>,
        now: u64,
        cost: u64,
        max_wait: u64,
        waker: &Waker,
    ) -> Booking {
        let arm = {
            let mut state = self.lock();
            let tolerance = params.tau().saturating_add(max_wait);
            let tat = match cell.acquire_if(now, cost, tolerance, ours) {
                Some(Ok(tat)) => tat,
                Some(Err(wait)) => return Booking::TooLate(wait),
                None => return Booking::Moved,
            };
            let window = gcra::ready_window(cost, params);
            let instant = tat.saturating_sub(window);
            if instant <= now {
                return Booking::Ready;
            }
            let booked = Slot {
                tat,
                cost,
                cells: (cost / params.interval().max(1)).max(1),
                window,
                waker: Some(waker.clone()),
                epoch: state.epoch,
                ..Slot::default()
            };
            // SAFETY: `node` is live, pinned and unlinked (caller's contract); we hold the
            // lock.
            unsafe { state.push_back(node, booked) };
            state.arm(instant).then_some(instant)
        };
        Booking::Linked(Arm(arm))
    }

    /// A later poll of a linked node: whether it has been fired (or orphaned by a fork);
    /// while it is linked, refreshes its waker.
    ///
    /// # Safety
    ///
    /// `node` was linked by [`Waiters::book`] on this queue and is live.
    pub(crate) unsafe fn poll_linked(&self, node: NonNull<Waiter>, waker: &Waker) -> Progress {
        // The common case, a poll after the fire's wake-up, takes no lock. Acquire pairs
        // with the fire's Release store, its last access to the node: after this load
        // nobody else touches the node, so the caller may complete and free it.
        // SAFETY: `node` is live (caller's contract).
        if unsafe { fired(node, Ordering::Acquire) } {
            return Progress::Fired;
        }
        let now = self.clock.now();
        let (progress, due, _old) = {
            let state = self.lock();
            let front_due = state.front_instant().is_some_and(|front| front <= now);
            // Relaxed: `fire` stores under this lock, which orders it before us.
            // SAFETY: `node` is live (caller's contract) and we hold the lock.
            if unsafe { fired(node, Ordering::Relaxed) } {
                (Progress::Fired, false, None)
            } else {
                // SAFETY: as above.
                unsafe {
                    slot(node, |s| {
                        if s.epoch != state.epoch {
                            // The lag ahead of it is lost with the list: its instant as
                            // last written, never earlier than its true one.
                            return (Progress::Orphaned(s.instant_at(s.base)), false, None);
                        }
                        let old = match &s.waker {
                            Some(w) if w.will_wake(waker) => None,
                            _ => s.waker.replace(waker.clone()),
                        };
                        // If this node is due, so is the front (instants never decrease
                        // along the list): firing the due prefix fires it.
                        (Progress::Linked, front_due, old)
                    })
                }
            }
            // `_old`, a replaced waker, is dropped after the lock is released.
        };
        if !due {
            return progress;
        }
        // The timer is late (or there is none): fire the due prefix ourselves.
        self.fire_due();
        let _state = self.lock();
        // Relaxed under the lock, as above. `fire_due` popped every node due at `now`,
        // this one if it was.
        // SAFETY: `node` is live (caller's contract).
        if unsafe { fired(node, Ordering::Relaxed) } {
            Progress::Fired
        } else {
            Progress::Linked
        }
    }

    /// Drops a linked node: unlinks it and, if its instant has not come and no plain
    /// admission has relied on its cells (module docs), refunds its cost and moves everyone
    /// behind it up.
    ///
    /// `word` is the cell beside the queue with the time now, as its owner reads it (a
    /// keyed limiter's never earlier than its last sweep); `None` when the word is gone (a
    /// keyed limiter forgot the key, which it only does once every booking in it is past):
    /// then there is nothing to refund.
    ///
    /// # Safety
    ///
    /// `node` was linked by [`Waiters::book`] on this queue, beside `word`, and is live.
    pub(crate) unsafe fn cancel(
        &self,
        word: Option<(&TatWord, u64)>,
        node: NonNull<Waiter>,
    ) -> Arm {
        let (arm, _waker) = {
            let mut state = self.lock();
            // Relaxed: `fire` stores under this lock, which orders it before us.
            // SAFETY: `node` is live (caller's contract).
            if unsafe { fired(node, Ordering::Relaxed) } {
                // Already unlinked by `fire_due`; its cells were spent at its instant.
                return Arm(None);
            }
            // SAFETY: `node` is live and we hold the lock.
            if unsafe { slot(node, |s| s.epoch) } != state.epoch {
                // Orphaned by a fork: in no list, and nothing to refund (module docs). Its
                // waker goes with the node, after the lock.
                return Arm(None);
            }
            // SAFETY: as above.
            let (cost, lag, waker) = unsafe { slot(node, |s| (s.cost, s.lag, s.waker.take())) };
            // Spent is spent: a booking whose instant has come keeps its cells, fired or
            // not (a reservation's holder may have acted on it; a late timer changes
            // nothing). The time is read after the holder's last action on it, so a
            // reservation dropped after use has its instant behind it by this reading.
            // SAFETY: `node` is linked in this list (not fired, this epoch); we hold the
            // lock.
            let refundable = word.filter(|&(_, now)| !unsafe { state.is_due(node, now) });
            // Something admitted after one of our later bookings (another process's
            // booking, on a shared word) sits between them: a refund would move it up
            // without its process knowing. Keep the cells.
            // SAFETY: as above.
            let refundable =
                refundable.filter(|_| unsafe { slot(node, |s| s.seq) } >= state.gap_before);
            let Some(tail) = state.list.back() else {
                unreachable!("a linked, unfired waiter is in its list")
            };
            // SAFETY: the tail is linked, so live (list rule 3); we hold the lock. The lag
            // ahead of the tail is the list's.
            let tail_tat = unsafe { slot(tail, |s| s.tat_at(state.lag)) };
            // SAFETY: `node` is live and linked in this list; we hold the lock.
            let behind = unsafe { list::next(node) };
            // SAFETY: as above.
            let removed = unsafe { state.list.remove(node) };
            debug_assert!(removed, "a linked, unfired waiter is in its list");
            // Everyone behind moves up by the refund: one write, to the next node's lag.
            let given = match refundable {
                Some((word, _)) if word.refund(tail_tat, cost) => cost,
                _ => 0,
            };
            state.hand_on_to(behind, lag, given);
            (state.arm_front(), waker)
        };
        // `_waker` is dropped here, after the lock.
        Arm(arm)
    }

    /// Fires every waiter whose instant has come, in queue order, and re-arms the timer for
    /// the next one.
    ///
    /// # Panics
    ///
    /// If a waiting task's waker panics: resumed once every due waiter has been woken and
    /// the timer re-armed.
    pub(crate) fn fire_due(&self) {
        self.fire(false);
    }

    /// [`Waiters::fire_due`]; `from_clock` when the clock delivered the wake-up we asked for.
    fn fire(&self, from_clock: bool) {
        self.fire_round(from_clock, 0);
    }

    /// Unlinks and wakes the due prefix, asking the clock for the next front's instant
    /// *before* waking anyone: a waker that blocks then delays only itself, since the
    /// queue's next wake-up is already with the clock (and a timer that hands its map to
    /// another thread delivers it), never recorded as armed and left unasked.
    ///
    /// `early` counts the re-entrant wake-ups that came before their instant so far (see
    /// the module docs, "Re-entrant clocks").
    fn fire_round(&self, from_clock: bool, mut early: u32) {
        let mut due = WakeList::new();
        let mut from_clock = from_clock;
        let mut panicked: Result<(), Panic> = Ok(());
        loop {
            let now = self.clock.now();
            let (arm, mut more) = {
                let mut state = self.lock();
                if from_clock || state.armed.is_some_and(|armed| armed <= now) {
                    // The wake-up we asked for has come, or is due and will find nothing.
                    // A clock may deliver it early by its own reading (a coarse clock lags
                    // the timer that serves it): forgetting it here makes `arm_front` ask
                    // again, instead of waiting for a wake-up that was already spent.
                    state.armed = None;
                    from_clock = false;
                }
                while !due.is_full() {
                    let Some((front, waker)) = state.pop_due(now) else {
                        break;
                    };
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
            if let Some(instant) = arm {
                if self.ask_once(instant) {
                    // Woken on this thread from inside `wake_at`: another pass fires it.
                    if self.clock.now() < instant {
                        early += 1;
                    }
                    if early > MAX_EARLY_WAKES {
                        // It keeps waking early: stop asking. The next booking asks again.
                        self.lock().armed = None;
                    } else {
                        from_clock = true;
                        more = true;
                    }
                }
            }
            panicked = panicked.and(due.wake_all());
            if !more {
                break;
            }
        }
        if let Err(panic) = panicked {
            // Every due waiter was woken and the timer re-armed: report the panic.
            std::panic::resume_unwind(panic);
        }
    }

    /// The limiter time at which the front waiter is due, if any.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.lock().front_instant()
    }

    /// Limiter time at which a linked node is due.
    ///
    /// # Safety
    ///
    /// `node` was linked by [`Waiters::book`] on this queue and is live.
    pub(crate) unsafe fn instant_of(&self, node: NonNull<Waiter>) -> u64 {
        let mut state = self.lock();
        // Relaxed under the lock, as in `cancel`.
        // SAFETY: live (caller's contract).
        let fired = unsafe { fired(node, Ordering::Relaxed) };
        // SAFETY: as above; we hold the lock.
        let orphaned = unsafe { slot(node, |s| s.epoch) } != state.epoch;
        if fired || orphaned {
            // A fired node's slot was brought up to date when it left the list; an
            // orphan's lag ahead is lost with the list (see `poll_linked`).
            // SAFETY: as above.
            return unsafe { slot(node, |s| s.instant_at(s.base)) };
        }
        // The lag ahead of a node in the middle of the list is spread over the nodes
        // ahead: write it into every slot once (O(list)), then each read is O(1) until a
        // waiter gives cells back again.
        if !state.settled {
            state.settle(|_| ());
        }
        // SAFETY: as above.
        unsafe { slot(node, |s| s.instant_at(0)) }
    }

    /// Whether no waiter is linked.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().list.is_empty()
    }
}

impl<C: Clock> Drop for Waiters<C> {
    /// A dropped queue takes its pending wake-ups out of the clock (a process-wide timer
    /// would otherwise keep them, and this allocation, until their instants).
    fn drop(&mut self) {
        if self.lock().asked_clock {
            self.clock.forget_waker(&self.fire);
        }
    }
}
