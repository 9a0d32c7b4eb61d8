//! A caller's admitted turn: its permit and its charge, until it settles or is dropped.

use core::fmt;
use std::sync::Arc;

use super::{wake, SettleError, Shared};
use crate::clock::{Clock, DefaultClock};

/// An admitted turn: an in-flight permit and a charge in every dimension, held until the
/// call is over.
///
/// [`Turn::settle`] ends it with the real cost; dropping it ends it keeping the estimate
/// (also on a panic or a cancellation). Either way the permit returns at once. A turn is
/// `Send` and `Sync`: it may end on another thread, and after every handle to its budget
/// is gone (it keeps the budget's state alive).
///
/// # Examples
///
/// ```
/// use paceline::budget::Budget;
/// use paceline::clock::ManualClock;
/// use paceline::Quota;
///
/// let budget = Budget::builder()
///     .rate("tokens", Quota::per_minute(10_000))
///     .in_flight(1)
///     .clock(ManualClock::new())
///     .build()?;
/// let turn = budget.try_acquire(&[("tokens", 2_000)]).unwrap();
/// assert_eq!(turn.cost("tokens"), Some(2_000));
/// assert_eq!(budget.in_flight(), 1);
/// turn.settle(&[("tokens", 1_500)]).unwrap(); // 500 tokens come back
/// assert_eq!(budget.in_flight(), 0);
/// assert_eq!(budget.remaining("tokens")?, 8_500);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a turn ends it at once: its permit returns, its estimate stays charged"]
pub struct Turn<C: Clock = DefaultClock> {
    shared: Arc<Shared<C>>,
    /// The admission's id in the ledger.
    id: u64,
    /// Cells charged per dimension at admission.
    cells: Box<[u32]>,
    /// The fork generation its permit was taken in.
    generation: u64,
    /// Whether it has ended (settled); `Drop` then does nothing.
    ended: bool,
}

impl<C: Clock> Turn<C> {
    pub(super) fn new(shared: Arc<Shared<C>>, id: u64, cells: Box<[u32]>, generation: u64) -> Self {
        Turn {
            shared,
            id,
            cells,
            generation,
            ended: false,
        }
    }

    /// Ends the turn with its real cost: each dimension named costs that many cells
    /// instead of what was charged at admission (the others keep their charge), and the
    /// permit returns.
    ///
    /// Less than charged gives the difference back, as far as no later admission relied
    /// on it: where a dimension was idle between this admission and a later one, the idle
    /// time already absorbed it. More than charged is charged: the callers behind wait
    /// longer. Any count is taken (the upstream has spent it), above the burst too.
    ///
    /// The exact correction covers admissions still in the budget's log
    /// ([`LOG_CAPACITY`](super::LOG_CAPACITY) since the oldest turn not yet ended);
    /// a turn that outlives so many admissions keeps its estimate (a refund is lost, a
    /// charge still applies).
    ///
    /// # Errors
    ///
    /// A dimension the budget does not have, or one named twice: the [`SettleError`]
    /// gives the turn back unchanged.
    ///
    /// # Examples
    ///
    /// See [`Turn`].
    pub fn settle(mut self, actual: &[(&str, u32)]) -> Result<(), SettleError<C>> {
        match self.shared.settled(actual) {
            Ok(actual) => {
                self.end(Some(&actual));
                Ok(())
            }
            Err(error) => Err(SettleError { error, turn: self }),
        }
    }

    /// The cells charged to `dimension` at admission (`None`: no such dimension).
    ///
    /// # Examples
    ///
    /// See [`Turn`].
    pub fn cost(&self, dimension: &str) -> Option<u32> {
        let d = self.shared.index(dimension).ok()?;
        self.cells.get(d).copied()
    }

    /// Settles (`Some`) or closes at the estimate (`None`), and returns the permit.
    fn end(&mut self, actual: Option<&[Option<u32>]>) {
        if core::mem::replace(&mut self.ended, true) {
            return;
        }
        let head = {
            let mut state = self.shared.lock();
            match actual {
                Some(actual) => state.ledger.settle(self.id, &self.cells, actual),
                None => state.ledger.close(self.id),
            }
            state.release(self.generation)
        };
        wake(head);
    }
}

impl<C: Clock> Drop for Turn<C> {
    fn drop(&mut self) {
        self.end(None);
    }
}

impl<C: Clock> fmt::Debug for Turn<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let costs: Vec<_> = self.shared.names.iter().zip(self.cells.iter()).collect();
        f.debug_struct("Turn")
            .field("costs", &costs)
            .finish_non_exhaustive()
    }
}
