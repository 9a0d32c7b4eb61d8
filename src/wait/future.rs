//! The waiting future: books on first poll, completes when fired, refunds when dropped.

use core::future::Future;
use core::pin::Pin;
use core::ptr::NonNull;
use core::task::{Context, Poll};
use std::sync::Arc;

use super::alarm::Alarm;
use super::queue::{Booking, Progress, Waiter, Waiters};
use crate::cell::{Ours, TatWord};
use crate::clock::Clock;
use crate::error::{self, Denied, NotUntil};
use crate::gcra::Params;

/// What a waiting future waits on: a cell, its quota, its queue and its time.
pub(crate) trait Target {
    type Clock: Clock;

    fn params(&self) -> Params;

    fn clock(&self) -> &Self::Clock;

    /// The queue for this cell (made on demand by a keyed limiter).
    fn waiters(&self) -> Arc<Waiters<Self::Clock>>;

    /// Runs `f` on the cell, storing it first if need be, with what tells whether the
    /// word is still the cell's ([`Ours`]: always, but for a shared key's slot, which may
    /// become another key's while `f` runs; `f`'s writes check it). `Err` carries the wait
    /// until there is room to store it (a keyed limiter at its bound); the cell must be
    /// the same one every time.
    fn with_word<R>(&self, f: impl FnOnce(&TatWord, Ours<'_>) -> R) -> Result<R, u64>;

    /// Runs `f` on the cell and the time now if the cell is stored; never stores it. The
    /// time is never earlier than anything the target forgot (a keyed limiter's sweeps).
    fn with_stored_word<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R>;
}

/// A target behind a reference or an `Arc` is the target: `Acquire<&Limiter>` waits on a
/// borrowed limiter, `Acquire<Arc<Limiter>>` is a wait that owns it (the owned forms, for
/// a wait kept in a struct, a spawned task or another language's object).
macro_rules! forward_target {
    ($($handle:ty),*) => {$(
        impl<T: Target> Target for $handle {
            type Clock = T::Clock;

            fn params(&self) -> Params {
                (**self).params()
            }

            fn clock(&self) -> &Self::Clock {
                (**self).clock()
            }

            fn waiters(&self) -> Arc<Waiters<Self::Clock>> {
                (**self).waiters()
            }

            fn with_word<R>(&self, f: impl FnOnce(&TatWord, Ours<'_>) -> R) -> Result<R, u64> {
                (**self).with_word(f)
            }

            fn with_stored_word<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R> {
                (**self).with_stored_word(f)
            }
        }
    )*};
}

forward_target!(&T, Arc<T>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not polled yet: nothing booked.
    Unpolled,
    /// A keyed limiter had no room to store the key: nothing booked; `alarm` wakes the
    /// task at limiter time `until`, and the first poll is tried again then.
    NoRoom { until: u64 },
    /// Booked and linked in `waiters`.
    Linked,
    /// Booked, but orphaned by a fork (see `queue`, "Fork"): in no list; `alarm` wakes the
    /// task at limiter time `until`, when the turn has come.
    Orphaned { until: u64 },
    /// Finished, with this outcome (admitted, refused, or too large); a poll after that
    /// answers the same again.
    Done(Result<(), Denied>),
}

/// A request for `n` cells that waits its booked turn.
pub(crate) struct Acquire<T: Target> {
    target: T,
    n: u32,
    /// The latest limiter time at which the request may be admitted; `u64::MAX` for no
    /// deadline. Fixed by the first poll from the wait the caller accepted.
    deadline: u64,
    /// The longest wait accepted, in nanoseconds; turned into `deadline` by the first poll.
    max_wait: u64,
    phase: Phase,
    /// The queue the node is linked in, once `phase` is `Linked`.
    waiters: Option<Arc<Waiters<T::Clock>>>,
    /// The task's clock registration while `phase` is `NoRoom`; made by the first such
    /// poll, reused by the next ones.
    alarm: Option<Alarm>,
    /// Linked into `waiters` while `phase` is `Linked`; pinned with the future.
    node: Waiter,
}

impl<T: Target> core::fmt::Debug for Acquire<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Acquire")
            .field("n", &self.n)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl<T: Target> Acquire<T> {
    pub(crate) fn new(target: T, n: u32, max_wait: u64) -> Acquire<T> {
        Acquire {
            target,
            n,
            deadline: u64::MAX,
            max_wait,
            phase: Phase::Unpolled,
            waiters: None,
            alarm: None,
            node: Waiter::new(),
        }
    }

    /// Nanoseconds from now until this request may proceed: 0 once admitted (or before
    /// the first poll, or refused).
    pub(crate) fn due_in(self: Pin<&Self>) -> u64 {
        let this = self.get_ref();
        match (&this.phase, &this.waiters) {
            (Phase::Linked, Some(waiters)) => {
                // SAFETY: the node was linked by `book` on `waiters` and lives in this
                // pinned future.
                let instant = unsafe { waiters.instant_of(NonNull::from(&this.node)) };
                instant.saturating_sub(this.target.clock().now())
            }
            (Phase::Orphaned { until }, _) => until.saturating_sub(this.target.clock().now()),
            _ => 0,
        }
    }

    /// While a keyed limiter has no room to store the key (nothing booked): nanoseconds
    /// from now until it will.
    pub(crate) fn room_wait(self: Pin<&Self>) -> Option<u64> {
        let this = self.get_ref();
        match this.phase {
            Phase::NoRoom { until } => Some(until.saturating_sub(this.target.clock().now()).max(1)),
            _ => None,
        }
    }

    /// Tries to admit or book; `now` is limiter time, read just before.
    fn first_poll(
        &mut self,
        node: NonNull<Waiter>,
        now: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Denied>> {
        let params = self.target.params();
        let cost = match error::cost(&params, self.n) {
            Ok(cost) => cost,
            Err(denied) => return Poll::Ready(Err(denied)),
        };
        if cost == 0 {
            // Zero cells are granted at once, whoever waits (they take no one's place).
            return Poll::Ready(Ok(()));
        }
        let max_wait = self.deadline.saturating_sub(now);
        loop {
            // Fast path without the queue lock: a request that fits now cannot be
            // overtaking anyone, because linked waiters leave no room before their instants.
            let fast = self
                .target
                .with_word(|cell, ours| cell.acquire_if(now, cost, params.tau(), ours));
            match fast {
                Ok(Some(Ok(_))) => return Poll::Ready(Ok(())),
                Ok(Some(Err(wait))) if wait > max_wait => {
                    return Poll::Ready(Err(NotUntil::from_nanos(wait).into()))
                }
                Ok(Some(Err(_))) => {}
                // The word became another key's: look it up again.
                Ok(None) => continue,
                Err(room) => return self.no_room(now, room, max_wait, cx),
            }
            let waiters = self.target.waiters();
            // SAFETY: `node` points into this pinned future, is in no list (phase Unpolled),
            // and `Drop` cancels it before the future's memory goes away.
            let booking = self.target.with_word(|cell, ours| unsafe {
                waiters.book(cell, ours, &params, node, now, cost, max_wait, cx.waker())
            });
            return match booking {
                Ok(Booking::Ready) => Poll::Ready(Ok(())),
                Ok(Booking::TooLate(wait)) => Poll::Ready(Err(NotUntil::from_nanos(wait).into())),
                Ok(Booking::Linked(arm)) => {
                    waiters.schedule(arm);
                    self.phase = Phase::Linked;
                    self.waiters = Some(waiters);
                    Poll::Pending
                }
                // Nothing booked or linked: again, on the word as it is now.
                Ok(Booking::Moved) => continue,
                Err(room) => self.no_room(now, room, max_wait, cx),
            };
        }
    }

    /// No room to store the key before `room` nanoseconds from `now`: wait for it (nothing
    /// booked), or give up if that is past the deadline.
    fn no_room(
        &mut self,
        now: u64,
        room: u64,
        max_wait: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Denied>> {
        if room > max_wait {
            return Poll::Ready(Err(NotUntil::no_room(room).into()));
        }
        let until = now.saturating_add(room);
        self.phase = Phase::NoRoom { until };
        self.alarm
            .get_or_insert_with(Alarm::new)
            .set(self.target.clock(), until, cx.waker());
        Poll::Pending
    }

    /// An orphaned booking (see `Phase::Orphaned`): ready at its instant, until then
    /// woken by the alarm.
    fn poll_orphaned(&mut self, until: u64, cx: &mut Context<'_>) -> Poll<Result<(), Denied>> {
        if self.target.clock().now() >= until {
            self.disarm();
            self.phase = Phase::Done(Ok(()));
            return Poll::Ready(Ok(()));
        }
        self.alarm
            .get_or_insert_with(Alarm::new)
            .set(self.target.clock(), until, cx.waker());
        Poll::Pending
    }

    /// Takes back the clock registration of a wait for room or an orphaned turn, if there
    /// is one.
    fn disarm(&mut self) {
        if let Some(alarm) = self.alarm.take() {
            alarm.cancel(self.target.clock());
        }
    }
}

impl<T: Target> Future for Acquire<T> {
    type Output = Result<(), Denied>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: we never move out of the returned `&mut Self`; `node` stays where the pin
        // put it, and the other fields are plain data whose moves the pin does not forbid.
        let this = unsafe { self.get_unchecked_mut() };
        let node = NonNull::from(&this.node);
        match this.phase {
            Phase::Done(outcome) => Poll::Ready(outcome),
            Phase::Unpolled | Phase::NoRoom { .. } => {
                let now = this.target.clock().now();
                if let Phase::NoRoom { until } = this.phase {
                    if now < until {
                        // Woken early: ask again for the same instant.
                        return this.no_room(now, until - now, u64::MAX, cx);
                    }
                } else {
                    this.deadline = now.saturating_add(this.max_wait);
                }
                let poll = this.first_poll(node, now, cx);
                if let Poll::Ready(outcome) = poll {
                    this.phase = Phase::Done(outcome);
                }
                if !matches!(this.phase, Phase::NoRoom { .. }) {
                    this.disarm();
                }
                poll
            }
            Phase::Linked => {
                let Some(waiters) = &this.waiters else {
                    unreachable!("a linked future keeps its queue")
                };
                // SAFETY: the node was linked by `book` on `waiters` and lives in this
                // pinned future.
                match unsafe { waiters.poll_linked(node, cx.waker()) } {
                    Progress::Fired => {
                        this.phase = Phase::Done(Ok(()));
                        this.waiters = None;
                        Poll::Ready(Ok(()))
                    }
                    Progress::Linked => Poll::Pending,
                    Progress::Orphaned(until) => {
                        this.waiters = None;
                        this.phase = Phase::Orphaned { until };
                        this.poll_orphaned(until, cx)
                    }
                }
            }
            Phase::Orphaned { until } => this.poll_orphaned(until, cx),
        }
    }
}

impl<T: Target> Drop for Acquire<T> {
    /// Where soundness lives: a linked node must leave the list before its memory goes.
    /// `cancel` takes the queue lock and unlinks it (or finds it already fired and
    /// unlinked), so when this returns no pointer to the node remains anywhere.
    fn drop(&mut self) {
        self.disarm();
        if self.phase != Phase::Linked {
            return;
        }
        if let Some(waiters) = self.waiters.take() {
            let node = NonNull::from(&self.node);
            // The cell is looked up, never stored anew: a keyed limiter that forgot the key
            // has nothing to refund (see `Waiters::cancel`).
            let arm = self
                .target
                // SAFETY: the node was linked by `book` on `waiters` beside this target's
                // cell, and is still alive: we are inside its owner's `drop`.
                .with_stored_word(|cell, now| unsafe { waiters.cancel(Some((cell, now)), node) })
                // SAFETY: as above.
                .unwrap_or_else(|| unsafe { waiters.cancel(None, node) });
            // After the cell's lock (a keyed shard's) is released.
            waiters.schedule(arm);
        }
    }
}
