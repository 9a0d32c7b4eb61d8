//! A caller's turn on a fleet budget: its permit and its charge, until it settles or is
//! dropped.

use core::fmt;
use std::sync::Arc;

use super::{Inner, RedisBudgetError, RedisSettleError};

/// An admitted turn of a [`RedisBudget`](super::RedisBudget): an in-flight permit and a
/// charge in every dimension, held until the call is over.
///
/// [`RedisTurn::settle`] ends it with the real cost; dropping it ends it keeping the
/// estimate (in the background, on the tokio runtime it was dropped on; also on a panic
/// or a cancellation). Either way the permit returns for every client. While it is held,
/// its client renews its lease; a client gone for a lease has its turns ended by the
/// others.
///
/// # Examples
///
/// ```no_run
/// # async fn run(budget: paceline::redis::RedisBudget) -> Result<(), Box<dyn std::error::Error>> {
/// let turn = budget.acquire(&[("tokens", 2_000)]).await?;
/// assert_eq!(turn.cost("tokens"), Some(2_000));
/// turn.settle(&[("tokens", 1_500)]).await?; // 500 tokens come back
/// # Ok(()) }
/// ```
#[must_use = "dropping a turn ends it at once: its permit returns, its estimate stays charged"]
pub struct RedisTurn {
    inner: Arc<Inner>,
    ticket: u64,
    cells: Box<[u32]>,
    ended: bool,
}

impl RedisTurn {
    pub(super) fn new(inner: Arc<Inner>, ticket: u64, cells: Box<[u32]>) -> RedisTurn {
        RedisTurn {
            inner,
            ticket,
            cells,
            ended: false,
        }
    }

    /// Ends the turn with its real cost: each dimension named costs that many cells
    /// instead of what was charged (the others keep their charge), and the permit
    /// returns. Less gives the difference back as far as no later admission (of any
    /// client) relied on it; more delays the callers behind.
    ///
    /// # Errors
    ///
    /// A dimension the budget does not have or one named twice, or Redis failing: the
    /// [`RedisSettleError`] gives the turn back unchanged, to settle again or drop.
    ///
    /// # Examples
    ///
    /// See [`RedisTurn`].
    pub async fn settle(mut self, actual: &[(&str, u32)]) -> Result<(), RedisSettleError> {
        let settled = match self.inner.rules.settled(actual) {
            Ok(settled) => settled,
            Err(e) => return Err(RedisSettleError::new(RedisBudgetError::Budget(e), self)),
        };
        match self
            .inner
            .end(self.ticket, &self.cells, Some(&settled))
            .await
        {
            Ok(()) => {
                self.ended = true;
                self.inner.release();
                Ok(())
            }
            Err(e) => Err(RedisSettleError::new(e, self)),
        }
    }

    /// The cells charged to `dimension` at admission (`None`: no such dimension).
    ///
    /// # Examples
    ///
    /// See [`RedisTurn`].
    pub fn cost(&self, dimension: &str) -> Option<u32> {
        let d = self.inner.rules.index(dimension).ok()?;
        self.cells.get(d).copied()
    }
}

impl Drop for RedisTurn {
    fn drop(&mut self) {
        if !self.ended {
            self.inner
                .end_later(self.ticket, core::mem::take(&mut self.cells));
        }
    }
}

impl fmt::Debug for RedisTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let costs: Vec<_> = self
            .inner
            .rules
            .dimensions()
            .map(|(n, _)| n)
            .zip(self.cells.iter())
            .collect();
        f.debug_struct("RedisTurn")
            .field("costs", &costs)
            .finish_non_exhaustive()
    }
}
