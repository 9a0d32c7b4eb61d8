//! Waiting: booked, FIFO, cancel-safe async waiting and thread blocking.
//!
//! * `alarm` — a waiting task's one clock registration while it books nothing;
//! * `list` — the generic intrusive list (the only `unsafe` data structure);
//! * `node` — a waiter's node, embedded in its future;
//! * `queue` — waiters beside a cell: booking, firing, cancelling (its docs hold the
//!   invariant and the fairness argument);
//! * `future` — the future that books on first poll and refunds on drop;
//! * `block` — blocking a thread on that same future;
//! * `turn` — a booking held as a value, behind every reservation type.
//!
//! The functions here turn one [`future::Acquire`] into each public result type, so the
//! direct and the keyed limiter (and any later adapter) share one waiting path.

pub(crate) mod alarm;
pub(crate) mod block;
pub(crate) mod future;
pub(crate) mod list;
mod node;
pub(crate) mod queue;
pub(crate) mod turn;

use core::future::Future;
use core::time::Duration;

use crate::error::{Denied, InsufficientCapacity, NotUntil};
use future::{Acquire, Target};

/// One cell, no deadline: finishes at the booked instant.
pub(crate) fn ready<T: Target>(target: T) -> impl Future<Output = ()> {
    let acquire = Acquire::new(target, 1, u64::MAX);
    async move {
        if acquire.await.is_err() {
            // Only a booking past the end of representable time (584 years) is refused.
            never::<()>().await;
        }
    }
}

/// `n` cells, no deadline; `n` above the burst is an error at once.
pub(crate) fn n_ready<T: Target>(
    target: T,
    n: u32,
) -> impl Future<Output = Result<(), InsufficientCapacity>> {
    let acquire = Acquire::new(target, n, u64::MAX);
    async move {
        match acquire.await {
            Ok(()) => Ok(()),
            Err(Denied::InsufficientCapacity(e)) => Err(e),
            Err(Denied::NotUntil(_)) => never().await,
        }
    }
}

/// One cell within `max`, or nothing booked.
pub(crate) fn ready_within<T: Target>(
    target: T,
    max: Duration,
) -> impl Future<Output = Result<(), NotUntil>> {
    let acquire = Acquire::new(target, 1, duration_nanos(max));
    async move {
        match acquire.await {
            Ok(()) => Ok(()),
            Err(Denied::NotUntil(e)) => Err(e),
            Err(Denied::InsufficientCapacity(_)) => {
                unreachable!("one cell always fits a burst of at least one")
            }
        }
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

/// A future that never finishes: the fate of a booking beyond the end of representable
/// time (a TAT past `u64::MAX` nanoseconds, 584 years after the limiter's birth).
async fn never<T>() -> T {
    core::future::pending().await
}
