//! What can go wrong with a budget: building one, asking it for a turn, settling a turn.

use core::fmt;
use core::time::Duration;

use super::Turn;
use crate::clock::Clock;

/// Why a [`Budget`](super::Budget) could not be built.
///
/// # Examples
///
/// ```
/// use paceline::budget::{Budget, BuildError};
/// use paceline::Quota;
///
/// let twice = Budget::builder()
///     .rate("tokens", Quota::per_minute(1_000))
///     .rate("tokens", Quota::per_minute(2_000))
///     .build();
/// assert!(matches!(twice, Err(BuildError::RepeatedDimension { .. })));
/// assert!(matches!(Budget::builder().build(), Err(BuildError::Empty)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// Neither a rate nor an in-flight cap: such a budget would limit nothing.
    Empty,
    /// Two rates with one name.
    RepeatedDimension {
        /// The name.
        name: String,
    },
    /// A rate with an empty name (no caller could name it).
    EmptyName,
    /// `in_flight(0)`: no call could ever run.
    ZeroInFlight,
    /// An in-flight cap above the most callers the budget's store records at once.
    CapTooHigh {
        /// The highest cap it takes.
        most: usize,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Empty => {
                f.write_str("a budget needs at least one rate or an in-flight cap")
            }
            BuildError::RepeatedDimension { name } => {
                write!(f, "the budget has two rates named {name:?}")
            }
            BuildError::EmptyName => f.write_str("a budget's rate needs a non-empty name"),
            BuildError::ZeroInFlight => {
                f.write_str("an in-flight cap of 0 would never let a call run")
            }
            BuildError::CapTooHigh { most } => {
                write!(
                    f,
                    "an in-flight cap above {most}, the most callers this budget records"
                )
            }
        }
    }
}

impl core::error::Error for BuildError {}

/// Why a budget gave no turn. Every error leaves the budget as it was: nothing is charged,
/// no place is kept in the queue.
///
/// # Examples
///
/// ```
/// use paceline::budget::{Budget, BudgetError};
/// use paceline::Quota;
///
/// let budget = Budget::builder().rate("tokens", Quota::per_minute(1_000)).build()?;
/// let err = budget.try_acquire(&[("tokns", 10)]).unwrap_err();
/// assert!(matches!(err, BudgetError::UnknownDimension { .. }));
/// assert_eq!(
///     err.to_string(),
///     "this budget has no dimension named \"tokns\" (it has: tokens)"
/// );
/// # Ok::<(), paceline::budget::BuildError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetError {
    /// A cost names a dimension the budget does not have.
    UnknownDimension {
        /// The name given.
        name: String,
        /// The budget's dimensions.
        known: Vec<String>,
    },
    /// A cost names one dimension twice.
    RepeatedDimension {
        /// The name.
        name: String,
    },
    /// A cost above the dimension's burst: it can never be admitted. (Also a cost whose
    /// time alone passes 584 years, possible only where the burst window saturated.)
    OverBurst {
        /// The dimension.
        dimension: String,
        /// The cost asked for.
        cost: u32,
        /// The dimension's burst.
        burst: u32,
    },
    /// `try_acquire`: the turn cannot be had right now (someone waits ahead, a dimension
    /// has not refilled, or every in-flight permit is taken).
    WouldWait,
    /// A deadline form: as things stand, the turn is further away than the deadline
    /// (`wait`: the estimate; `Duration::MAX` for never). Refused at once.
    NotWithin {
        /// How far away the turn is, by the rates alone: every caller ahead admitted in
        /// its turn as early as the rates allow (permits and settles to come are not
        /// counted).
        wait: Duration,
    },
    /// A deadline form: the deadline came while the caller waited; it left the queue.
    TimedOut,
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetError::UnknownDimension { name, known } if known.is_empty() => write!(
                f,
                "this budget has no dimension named {name:?} (it has only an in-flight cap)"
            ),
            BudgetError::UnknownDimension { name, known } => write!(
                f,
                "this budget has no dimension named {name:?} (it has: {})",
                known.join(", ")
            ),
            BudgetError::RepeatedDimension { name } => {
                write!(f, "the cost names the dimension {name:?} twice")
            }
            BudgetError::OverBurst {
                dimension,
                cost,
                burst,
            } => write!(
                f,
                "a cost of {cost} {dimension} can never be admitted: the burst of {dimension} \
                 is {burst}"
            ),
            BudgetError::WouldWait => f.write_str("the budget cannot admit this turn right now"),
            BudgetError::NotWithin { wait } => write!(
                f,
                "the turn is {:.6} s away, longer than the deadline; nothing was booked",
                wait.as_secs_f64()
            ),
            BudgetError::TimedOut => {
                f.write_str("the deadline came before the turn; the place was given up")
            }
        }
    }
}

impl core::error::Error for BudgetError {}

/// A settle that named a dimension the budget does not have (or one twice): the
/// [`Turn`] comes back unchanged, to settle again or drop.
///
/// # Examples
///
/// ```
/// use paceline::budget::Budget;
/// use paceline::Quota;
///
/// let budget = Budget::builder().rate("tokens", Quota::per_minute(1_000)).build()?;
/// let turn = budget.try_acquire(&[("tokens", 100)]).unwrap();
/// let err = turn.settle(&[("tokns", 80)]).unwrap_err();
/// let turn = err.into_turn(); // nothing changed
/// turn.settle(&[("tokens", 80)]).unwrap();
/// # Ok::<(), paceline::budget::BuildError>(())
/// ```
pub struct SettleError<C: Clock> {
    pub(super) error: BudgetError,
    pub(super) turn: Turn<C>,
}

impl<C: Clock> SettleError<C> {
    /// What was wrong.
    ///
    /// # Examples
    ///
    /// See [`SettleError`].
    pub fn error(&self) -> &BudgetError {
        &self.error
    }

    /// The turn, unsettled.
    ///
    /// # Examples
    ///
    /// See [`SettleError`].
    pub fn into_turn(self) -> Turn<C> {
        self.turn
    }
}

impl<C: Clock> fmt::Debug for SettleError<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> fmt::Display for SettleError<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot settle: {}", self.error)
    }
}

// The message includes the cause's, so the cause is not also a `source` (an error chain
// prints it once).
impl<C: Clock> core::error::Error for SettleError<C> {}
