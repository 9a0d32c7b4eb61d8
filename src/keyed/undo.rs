//! What the HTTP middleware needs of a keyed limiter to take one cell from several
//! limits at once or none: an admission it can give back, and a booking within a maximum.

use core::future::Future;
use core::hash::Hash;
use core::time::Duration;

use super::waiting::KeyTarget;
use super::KeyedLimiter;
use crate::clock::Clock;
use crate::error::{Denied, NotUntil};
use crate::wait::{self, future::Acquire};

/// An admission that can be given back: the TAT it left and its cost.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Undo {
    tat: u64,
    cost: u64,
}

/// A wait for one key of a borrowed keyed limiter.
type KeyAcquire<'a, K, C> = Acquire<KeyTarget<&'a KeyedLimiter<K, C>, K>>;

/// One cell booked by [`KeyedLimiter::book_key_within`].
pub(crate) enum Booked<'a, K: Hash + Eq + Clone, C: Clock> {
    /// Admitted at once; [`KeyedLimiter::undo`] gives it back.
    Now(Undo),
    /// Booked for a later instant: await it; dropped before its instant, it gives the
    /// cell back.
    Later(core::pin::Pin<Box<KeyAcquire<'a, K, C>>>),
}

impl<K: Hash + Eq + Clone, C: Clock> KeyedLimiter<K, C> {
    /// `check_key`, returning what [`KeyedLimiter::undo`] needs to give the cell back
    /// (the HTTP middleware's several limits: a refusal by a later one undoes the earlier).
    pub(crate) fn check_key_undoably(&self, key: &K) -> Result<Undo, NotUntil> {
        self.acquire_one(key)
            .map(|(tat, cost)| Undo { tat, cost })
            .map_err(NotUntil::from_nanos)
    }

    /// Gives back the cell an admission took, if nothing was admitted on that key since
    /// (else it stays spent: the limit only errs on the strict side).
    pub(crate) fn undo(&self, key: &K, undo: Undo) {
        let _ = self.with_stored_cell(key, |cell, _| cell.refund(undo.tat, undo.cost));
    }

    /// Books one cell for `key` within `max` without waiting for it: admitted now (and
    /// undoable), or booked in the key's FIFO for a later instant (given back if the
    /// booking is dropped before it). The HTTP middleware's wait mode books every limit
    /// first, so a refusal by a later limit gives the earlier limits' cells back.
    pub(crate) fn book_key_within(
        &self,
        key: &K,
        max: Duration,
    ) -> Result<Booked<'_, K, C>, NotUntil> {
        use core::task::{Context, Poll, Waker};
        match self.check_key_undoably(key) {
            Ok(undo) => return Ok(Booked::Now(undo)),
            Err(e) if e.wait_time() > max => return Err(e),
            Err(_) => {}
        }
        let mut acquire = Box::pin(Acquire::new(self.target(key), 1, wait::duration_nanos(max)));
        // The first poll books (or admits, or refuses); the real waker comes with the
        // first poll of the request's own task.
        match acquire
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Pending | Poll::Ready(Ok(())) => Ok(Booked::Later(acquire)),
            Poll::Ready(Err(Denied::NotUntil(e))) => Err(e),
            Poll::Ready(Err(Denied::InsufficientCapacity(_))) => {
                unreachable!("one cell always fits a burst of at least one")
            }
        }
    }
}
