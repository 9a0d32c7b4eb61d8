//! What can go wrong asking a shared budget for a turn, or settling one.

use core::fmt;

use super::super::error::SharedError;
use super::SharedTurn;
use crate::budget::BudgetError;

/// Why a [`SharedBudget`](super::SharedBudget) gave no turn: the budget's own answer (a
/// cost it cannot take, no turn now, a deadline), or its file's (its lock held by a
/// stopped process, too many callers on record, a damaged state). Every error leaves the
/// budget as it was: nothing charged, no place kept.
///
/// # Examples
///
/// ```
/// use paceline::budget::BudgetError;
/// use paceline::shared::{SharedBudget, SharedBudgetError};
/// use paceline::Quota;
///
/// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-e-{}", std::process::id()));
/// let budget = SharedBudget::builder().rate("tokens", Quota::per_minute(1_000)).open(&path)?;
/// let err = budget.try_acquire(&[("tokens", 5_000)]).unwrap_err();
/// assert!(matches!(err, SharedBudgetError::Budget(BudgetError::OverBurst { .. })));
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum SharedBudgetError {
    /// The budget's answer, as an in-process budget gives it.
    Budget(BudgetError),
    /// The file's.
    File(SharedError),
}

impl fmt::Display for SharedBudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedBudgetError::Budget(e) => e.fmt(f),
            SharedBudgetError::File(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SharedBudgetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SharedBudgetError::Budget(e) => Some(e),
            SharedBudgetError::File(e) => Some(e),
        }
    }
}

from_variants!(SharedBudgetError {
    Budget(BudgetError),
    File(SharedError),
});

/// A [`SharedTurn::settle`] that could not be done: why, and the turn, unchanged.
///
/// # Examples
///
/// ```
/// # use paceline::{shared::SharedBudget, Quota};
/// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-s-{}", std::process::id()));
/// let budget = SharedBudget::builder().rate("tokens", Quota::per_minute(1_000)).open(&path)?;
/// let turn = budget.try_acquire(&[("tokens", 10)])?;
/// let err = turn.settle(&[("tokns", 8)]).unwrap_err();
/// assert!(err.to_string().contains("tokns"));
/// err.into_turn().settle(&[("tokens", 8)])?;
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SharedSettleError {
    pub(super) error: Box<SharedBudgetError>,
    pub(super) turn: SharedTurn,
}

impl SharedSettleError {
    /// Why.
    pub fn error(&self) -> &SharedBudgetError {
        &self.error
    }

    /// The turn, still open: settle it again, or drop it to end it at its estimate.
    pub fn into_turn(self) -> SharedTurn {
        self.turn
    }
}

impl fmt::Display for SharedSettleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl fmt::Debug for SharedSettleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for SharedSettleError {}
