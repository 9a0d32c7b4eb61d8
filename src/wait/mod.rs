//! Waiting: booked, FIFO, cancel-safe async waiting and thread blocking.
//!
//! * `list` — the generic intrusive list (the only `unsafe` data structure);
//! * `queue` — waiters beside a cell: booking, firing, cancelling (its docs hold the
//!   invariant and the fairness argument);
//! * `future` — the future that books on first poll and refunds on drop;
//! * `block` — blocking a thread on that same future.

pub(crate) mod block;
pub(crate) mod future;
pub(crate) mod list;
pub(crate) mod queue;
