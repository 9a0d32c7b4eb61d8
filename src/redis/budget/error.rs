//! What can go wrong with a fleet budget.

use core::fmt;

use super::RedisTurn;
use crate::budget::fleet::{FleetError, MAX_CALLERS};
use crate::budget::{BudgetError, BuildError};

/// Why a [`RedisBudget`](super::RedisBudget) gave no turn, or could not be built. Every
/// error of a call leaves the budget as it was: nothing charged, no place kept.
///
/// # Examples
///
/// ```no_run
/// # async fn run(budget: paceline::redis::RedisBudget) {
/// use paceline::budget::BudgetError;
/// use paceline::redis::RedisBudgetError;
/// match budget.try_acquire(&[("tokens", 100)]).await {
///     Ok(turn) => drop(turn), // call, then settle
///     Err(RedisBudgetError::Budget(BudgetError::WouldWait)) => { /* not now */ }
///     Err(RedisBudgetError::Unavailable(e)) => eprintln!("Redis is down: {e}"),
///     Err(other) => eprintln!("{other}"),
/// }
/// # }
/// ```
#[non_exhaustive]
pub enum RedisBudgetError {
    /// The budget's own answer: a cost it cannot take, a turn not within a deadline,
    /// not now ([`BudgetError::WouldWait`]).
    Budget(BudgetError),
    /// The rates cannot make a budget.
    Build(BuildError),
    /// The budget records [`MAX_CALLERS`] callers already (turns and waiters).
    Full,
    /// Redis did not answer within the timeout, or cannot serve (unreachable, loading, a
    /// read-only replica, busy with a script): nothing passes.
    Unavailable(redis::RedisError),
    /// Redis answered with an error: a value of another type at the budget's key, a full
    /// server (`OOM`), scripts refused.
    Rejected(redis::RedisError),
    /// The budget's key holds another application's value, or a budget of other rates:
    /// it is never overwritten.
    Foreign(FleetError),
    /// Connecting failed: a bad URL, a server that is not Redis or does not run scripts.
    Connect(redis::RedisError),
    /// The budget's name is empty, longer than [`MAX_KEY_LEN`](crate::redis::MAX_KEY_LEN)
    /// bytes, or holds a `}` (the name is its keys' hash tag).
    BadName,
    /// So many clients wrote the budget at once that this call's writes kept being
    /// overtaken; nothing was done.
    Contended,
}

impl fmt::Display for RedisBudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisBudgetError::Budget(e) => e.fmt(f),
            RedisBudgetError::Build(e) => e.fmt(f),
            RedisBudgetError::Full => write!(
                f,
                "the budget records {MAX_CALLERS} callers already (turns in flight and waiters)"
            ),
            RedisBudgetError::Unavailable(e) => write!(f, "Redis unreachable or too slow: {e}"),
            RedisBudgetError::Rejected(e) => write!(f, "Redis refused the budget's call: {e}"),
            RedisBudgetError::Foreign(e) => e.fmt(f),
            RedisBudgetError::Connect(e) => write!(f, "cannot use Redis: {e}"),
            RedisBudgetError::BadName => write!(
                f,
                "a budget's name is 1 to {} bytes without '}}'",
                crate::redis::MAX_KEY_LEN
            ),
            RedisBudgetError::Contended => f.write_str(
                "other clients kept writing the budget first; nothing was done (try again)",
            ),
        }
    }
}

impl core::error::Error for RedisBudgetError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            RedisBudgetError::Unavailable(e)
            | RedisBudgetError::Rejected(e)
            | RedisBudgetError::Connect(e) => Some(e),
            RedisBudgetError::Budget(e) => Some(e),
            RedisBudgetError::Build(e) => Some(e),
            RedisBudgetError::Foreign(e) => Some(e),
            RedisBudgetError::Full | RedisBudgetError::Contended | RedisBudgetError::BadName => {
                None
            }
        }
    }
}

/// A settle that failed: the [`RedisTurn`] comes back unchanged, to settle again or drop.
///
/// # Examples
///
/// ```no_run
/// # async fn run(budget: paceline::redis::RedisBudget) -> Result<(), Box<dyn std::error::Error>> {
/// let turn = budget.acquire(&[("tokens", 100)]).await?;
/// let turn = match turn.settle(&[("tokns", 80)]).await {
///     Ok(()) => return Ok(()),
///     Err(e) => e.into_turn(), // a typo: nothing changed
/// };
/// turn.settle(&[("tokens", 80)]).await?;
/// # Ok(()) }
/// ```
pub struct RedisSettleError {
    error: Box<RedisBudgetError>,
    turn: RedisTurn,
}

impl RedisSettleError {
    pub(super) fn new(error: RedisBudgetError, turn: RedisTurn) -> RedisSettleError {
        RedisSettleError {
            error: Box::new(error),
            turn,
        }
    }

    /// Why.
    ///
    /// # Examples
    ///
    /// See [`RedisSettleError`].
    pub fn error(&self) -> &RedisBudgetError {
        &self.error
    }

    /// The turn, unchanged.
    ///
    /// # Examples
    ///
    /// See [`RedisSettleError`].
    pub fn into_turn(self) -> RedisTurn {
        self.turn
    }
}

impl fmt::Display for RedisSettleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the turn was not settled: {}", self.error)
    }
}

impl core::error::Error for RedisSettleError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        Some(&*self.error)
    }
}

debug_as_display!(RedisBudgetError, RedisSettleError);
