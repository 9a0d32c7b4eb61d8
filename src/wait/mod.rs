//! Waiting: booked, FIFO, cancel-safe async waiting and thread blocking.
//!
//! * `alarm` — a waiting task's one clock registration while it books nothing;
//! * `list` — the generic intrusive list (the only `unsafe` data structure);
//! * `node` — a waiter's node, embedded in its future;
//! * `queue` — waiters beside a cell: booking, firing, cancelling (its docs hold the
//!   invariant and the fairness argument);
//! * `future` — the future that books on first poll and refunds on drop;
//! * `block` — blocking a thread on that same future;
//! * `deadline` — a wait that ends at a clock's deadline if it has not ended before;
//! * `turn` — a booking held as a value, behind every reservation type.
//!
//! The functions here turn one [`future::Acquire`] into each public result type, so the
//! direct and the keyed limiter (and any later adapter) share one waiting path.

pub(crate) mod alarm;
pub(crate) mod block;
#[cfg(all(feature = "std", not(loom)))]
pub(crate) mod deadline;
pub(crate) mod future;
pub(crate) mod list;
pub(crate) mod methods;
mod node;
pub(crate) mod queue;
pub(crate) mod turn;

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use crate::error::{Denied, InsufficientCapacity, NotUntil};
use future::{Acquire, Target};

/// One cell, no deadline: finishes at the booked instant.
pub(crate) fn ready<T: Target>(target: T) -> impl Future<Output = ()> {
    // Only a booking past the end of representable time (584 years) is refused: it never
    // finishes.
    Mapped {
        acquire: Acquire::new(target, 1, u64::MAX),
        map: |outcome: Result<(), Denied>| outcome.ok(),
    }
}

/// `n` cells, no deadline; `n` above the burst is an error at once.
pub(crate) fn n_ready<T: Target>(
    target: T,
    n: u32,
) -> impl Future<Output = Result<(), InsufficientCapacity>> {
    Mapped {
        acquire: Acquire::new(target, n, u64::MAX),
        map: |outcome| match outcome {
            Ok(()) => Some(Ok(())),
            Err(Denied::InsufficientCapacity(e)) => Some(Err(e)),
            Err(Denied::NotUntil(_)) => None,
        },
    }
}

/// One cell within `max`, or nothing booked.
pub(crate) fn ready_within<T: Target>(
    target: T,
    max: Duration,
) -> impl Future<Output = Result<(), NotUntil>> {
    Mapped {
        acquire: Acquire::new(target, 1, duration_nanos(max)),
        map: |outcome| match outcome {
            Ok(()) => Some(Ok(())),
            Err(Denied::NotUntil(e)) => Some(Err(e)),
            Err(Denied::InsufficientCapacity(_)) => {
                unreachable!("one cell always fits a burst of at least one")
            }
        },
    }
}

/// `n` cells within `max`, or nothing booked.
pub(crate) fn n_ready_within<T: Target>(
    target: T,
    n: u32,
    max: Duration,
) -> impl Future<Output = Result<(), Denied>> {
    Acquire::new(target, n, duration_nanos(max))
}

/// Nanoseconds of a duration, saturating at `u64::MAX`.
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// An [`Acquire`] whose outcome `map` turns into a public result, or into `None` for one
/// that never comes (a booking past the end of representable time, a TAT past `u64::MAX`
/// nanoseconds, 584 years after the limiter's birth: the future then stays pending).
///
/// A struct rather than an `async` block: a block that captures the `Acquire` and awaits
/// it lays out the capture and the awaited value apart, so it held the request twice, and
/// a waiting task's future is most of its memory (376 bytes against 208 for
/// leaky-bucket's, for 20 000 tasks waiting at once).
struct Mapped<T: Target, F> {
    acquire: Acquire<T>,
    map: F,
}

impl<T: Target, O, F: Fn(Result<(), Denied>) -> Option<O>> Future for Mapped<T, F> {
    type Output = O;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<O> {
        // SAFETY: `acquire` is pinned structurally: `Mapped` never moves it out, has no
        // `Drop` of its own and is `Unpin` only if `Acquire` is; `map` is only called.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: as above; `this` came from a pinned `Mapped`.
        let acquire = unsafe { Pin::new_unchecked(&mut this.acquire) };
        match acquire.poll(cx) {
            // A finished `Acquire` answers the same again, so a later poll maps it again.
            Poll::Ready(outcome) => (this.map)(outcome).map_or(Poll::Pending, Poll::Ready),
            Poll::Pending => Poll::Pending,
        }
    }
}
