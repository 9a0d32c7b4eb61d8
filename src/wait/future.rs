//! The waiting future: books on first poll, completes when fired, refunds when dropped.

use core::future::Future;
use core::pin::Pin;
use core::ptr::NonNull;
use core::task::{Context, Poll};
use std::sync::Arc;

use super::queue::{Booking, Waiter, Waiters};
use crate::cell::Cell;
use crate::clock::Clock;
use crate::error::{Denied, InsufficientCapacity, NotUntil};
use crate::gcra::Params;

/// What a waiting future waits on: a cell, its quota and its queue.
pub(crate) trait Target {
    type Clock: Clock;

    fn params(&self) -> Params;

    fn waiters(&self) -> Arc<Waiters<Self::Clock>>;

    /// Runs `f` on the cell; the cell must be the same one every time.
    fn with_cell<R>(&self, f: impl FnOnce(&Cell) -> R) -> R;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not polled yet: nothing booked.
    Unpolled,
    /// Booked and linked in `waiters`.
    Linked,
    /// Finished (admitted, refused, or too large).
    Done,
}

/// A request for `n` cells that waits its booked turn.
pub(crate) struct Acquire<T: Target> {
    target: T,
    n: u32,
    /// The longest wait accepted, in nanoseconds; `u64::MAX` for no deadline.
    max_wait: u64,
    phase: Phase,
    /// The queue the node is linked in, once `phase` is `Linked`.
    waiters: Option<Arc<Waiters<T::Clock>>>,
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
            max_wait,
            phase: Phase::Unpolled,
            waiters: None,
            node: Waiter::new(),
        }
    }

    fn first_poll(
        &mut self,
        node: NonNull<Waiter>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Denied>> {
        let params = self.target.params();
        let Some(cost) = params.cost(self.n) else {
            return Poll::Ready(Err(InsufficientCapacity::new(self.n, params.burst()).into()));
        };
        let waiters = self.target.waiters();
        let now = waiters.now();
        // Fast path without the queue lock: a request that fits now cannot be overtaking
        // anyone, because linked waiters leave no room before their instants.
        match self
            .target
            .with_cell(|cell| cell.acquire(now, cost, params.tau()))
        {
            Ok(_) => return Poll::Ready(Ok(())),
            Err(wait) if wait > self.max_wait => {
                return Poll::Ready(Err(NotUntil::from_nanos(wait).into()))
            }
            Err(_) => {}
        }
        let max_wait = self.max_wait;
        // SAFETY: `node` points into this pinned future, is in no list (phase Unpolled), and
        // `Drop` cancels it before the future's memory goes away.
        let booking = self.target.with_cell(|cell| unsafe {
            waiters.book(cell, &params, node, now, cost, max_wait, cx.waker())
        });
        match booking {
            Booking::Ready => Poll::Ready(Ok(())),
            Booking::TooLate(wait) => Poll::Ready(Err(NotUntil::from_nanos(wait).into())),
            Booking::Linked => {
                self.phase = Phase::Linked;
                self.waiters = Some(waiters);
                Poll::Pending
            }
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
            Phase::Done => Poll::Ready(Ok(())),
            Phase::Unpolled => {
                let poll = this.first_poll(node, cx);
                if poll.is_ready() {
                    this.phase = Phase::Done;
                }
                poll
            }
            Phase::Linked => {
                let Some(waiters) = &this.waiters else {
                    unreachable!("a linked future keeps its queue")
                };
                // SAFETY: the node was linked by `book` on `waiters` and lives in this
                // pinned future.
                if unsafe { waiters.poll_linked(node, cx.waker()) } {
                    this.phase = Phase::Done;
                    this.waiters = None;
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<T: Target> Drop for Acquire<T> {
    /// Where soundness lives: a linked node must leave the list before its memory goes.
    /// `cancel` takes the queue lock and unlinks it (or finds it already fired and
    /// unlinked), so when this returns no pointer to the node remains anywhere.
    fn drop(&mut self) {
        if self.phase != Phase::Linked {
            return;
        }
        if let Some(waiters) = self.waiters.take() {
            let node = NonNull::from(&self.node);
            // SAFETY: the node was linked by `book` on `waiters` beside this target's cell,
            // and is still alive: we are inside its owner's `drop`.
            self.target
                .with_cell(|cell| unsafe { waiters.cancel(cell, node) });
        }
    }
}
