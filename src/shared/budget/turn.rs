//! A caller's turn on a shared budget: its permit and its charge, until it settles or is
//! dropped.

use core::fmt;
use std::sync::Arc;

use super::{settled, Inner, SharedBudgetError, SharedSettleError};
use crate::shared::process;

/// An admitted turn of a [`SharedBudget`](super::SharedBudget): an in-flight permit and a
/// charge in every dimension, held until the call is over.
///
/// [`SharedTurn::settle`] ends it with the real cost; dropping it ends it keeping the
/// estimate (also on a panic or a cancellation). Either way the permit returns at once,
/// for every process. A turn belongs to the process that acquired it: a forked child's
/// copy ends nothing (the parent's does), and the turns of a process that is gone are
/// ended at their estimates by the others.
///
/// # Examples
///
/// ```
/// # use paceline::{shared::SharedBudget, Quota};
/// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-u-{}", std::process::id()));
/// let budget = SharedBudget::builder()
///     .rate("tokens", Quota::per_minute(10_000))
///     .in_flight(1)
///     .open(&path)?;
/// let turn = budget.try_acquire(&[("tokens", 2_000)])?;
/// assert_eq!(turn.cost("tokens"), Some(2_000));
/// assert!(budget.try_acquire(&[]).is_err()); // the one permit is taken
/// turn.settle(&[("tokens", 1_500)])?; // 500 tokens come back
/// assert!(budget.try_acquire(&[]).is_ok());
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a turn ends it at once: its permit returns, its estimate stays charged"]
pub struct SharedTurn {
    inner: Arc<Inner>,
    ticket: u64,
    cells: Box<[u32]>,
    /// The process it belongs to.
    owner: u64,
    ended: bool,
}

impl SharedTurn {
    pub(super) fn new(inner: Arc<Inner>, ticket: u64, cells: Box<[u32]>) -> SharedTurn {
        SharedTurn {
            inner,
            ticket,
            cells,
            owner: process::identity(),
            ended: false,
        }
    }

    /// Ends the turn with its real cost: each dimension named costs that many cells
    /// instead of what was charged (the others keep their charge), and the permit
    /// returns. Less gives the difference back as far as no later admission (in any
    /// process) relied on it; more delays the callers behind.
    ///
    /// # Errors
    ///
    /// A dimension the budget does not have or one named twice, or the file's lock held
    /// by a stopped process: the [`SharedSettleError`] gives the turn back unchanged.
    ///
    /// # Examples
    ///
    /// See [`SharedTurn`].
    pub fn settle(mut self, actual: &[(&str, u32)]) -> Result<(), SharedSettleError> {
        let fail = |error, turn| {
            Err(SharedSettleError {
                error: Box::new(error),
                turn,
            })
        };
        let actual = match settled(&self.inner, actual) {
            Ok(actual) => actual,
            Err(e) => return fail(SharedBudgetError::Budget(e), self),
        };
        if !self.mine() {
            self.ended = true;
            return Ok(());
        }
        match self.inner.end(self.ticket, &self.cells, Some(&actual)) {
            Ok(()) => {
                self.ended = true;
                Ok(())
            }
            Err(e) => fail(SharedBudgetError::File(e), self),
        }
    }

    /// The cells charged to `dimension` at admission (`None`: no such dimension).
    ///
    /// # Examples
    ///
    /// See [`SharedTurn`].
    pub fn cost(&self, dimension: &str) -> Option<u32> {
        let d = self
            .inner
            .config
            .names
            .iter()
            .position(|n| n == dimension)?;
        self.cells.get(d).copied()
    }

    /// Whether this process is the one that acquired the turn (not a fork's child).
    fn mine(&self) -> bool {
        process::identity() == self.owner
    }
}

impl Drop for SharedTurn {
    fn drop(&mut self) {
        if !self.ended && self.mine() {
            // A file locked past patience by a stopped process: the turn stays on record
            // until this process is gone (its permit with it).
            let _ = self.inner.end(self.ticket, &self.cells, None);
        }
    }
}

impl fmt::Debug for SharedTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let costs: Vec<_> = self
            .inner
            .config
            .names
            .iter()
            .zip(self.cells.iter())
            .collect();
        f.debug_struct("SharedTurn")
            .field("costs", &costs)
            .finish_non_exhaustive()
    }
}
