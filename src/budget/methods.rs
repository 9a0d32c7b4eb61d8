//! A budget's public methods: asking for a turn (waiting, blocking, or not at all) and
//! reading its state.

use core::task::Waker;
use core::time::Duration;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::state::Decision;
use super::{Acquire, Budget, BudgetError, Turn};
use crate::clock::Clock;
use crate::quota::Quota;
use crate::wait::{block::block_on, duration_nanos};

/// Wakes another caller's task, with no lock held. A waker that panics costs only its own
/// wake-up: the panic is not carried into the code that happened to wake it (a settle,
/// a drop).
pub(super) fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
    }
}

impl<C: Clock> Budget<C> {
    /// Waits for a turn costing `costs` (`&[(dimension, cells)]`; a dimension not named
    /// costs 1): admitted in arrival order once every dimension admits it and an
    /// in-flight permit is free.
    ///
    /// The future answers an error at once, having taken no place, for a dimension the
    /// budget does not have, one named twice, or a cost above its burst
    /// ([`BudgetError`]). Dropped before its turn, it has spent nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::Quota;
    ///
    /// # futures::executor::block_on(async {
    /// let budget = Budget::builder()
    ///     .rate("requests", Quota::per_minute(500))
    ///     .rate("tokens", Quota::per_minute(200_000))
    ///     .build()?;
    /// let turn = budget.acquire(&[("tokens", 1_200)]).await?;
    /// turn.settle(&[("tokens", 950)]).unwrap();
    /// assert!(budget.acquire(&[("tokens", 300_000)]).await.is_err()); // over the burst
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn acquire(&self, costs: &[(&str, u32)]) -> Acquire<C> {
        Acquire::new(Arc::clone(&self.shared), self.shared.cells(costs), None)
    }

    /// [`Budget::acquire`] with a deadline: refused at once, taking no place, when the turn
    /// is further away than `max` by the rates as they stand (every caller ahead admitted
    /// as early as the rates allow; permits and settles to come not counted); otherwise
    /// waits at most `max` and leaves the queue when it passes.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::{Budget, BudgetError};
    /// use paceline::Quota;
    /// use std::time::Duration;
    ///
    /// # futures::executor::block_on(async {
    /// let budget = Budget::builder().rate("requests", Quota::per_minute(1)).build()?;
    /// let turn = budget.acquire_within(&[], Duration::ZERO).await?;
    /// let late = budget.acquire_within(&[], Duration::from_secs(1)).await;
    /// assert!(matches!(late, Err(BudgetError::NotWithin { .. }))); // a minute away
    /// # drop(turn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn acquire_within(&self, costs: &[(&str, u32)], max: Duration) -> Acquire<C> {
        Acquire::new(
            Arc::clone(&self.shared),
            self.shared.cells(costs),
            Some(duration_nanos(max)),
        )
    }

    /// A turn now, or [`BudgetError::WouldWait`]; never waits. Admitted only when no one
    /// waits ahead, every dimension admits it and a permit is free.
    ///
    /// # Errors
    ///
    /// [`BudgetError::WouldWait`], or the errors of [`Budget::acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::{Budget, BudgetError};
    /// use paceline::Quota;
    ///
    /// let budget = Budget::builder().rate("requests", Quota::per_minute(1)).build()?;
    /// let turn = budget.try_acquire(&[]).unwrap();
    /// assert_eq!(budget.try_acquire(&[]).unwrap_err(), BudgetError::WouldWait);
    /// # drop(turn);
    /// # Ok::<(), paceline::budget::BuildError>(())
    /// ```
    pub fn try_acquire(&self, costs: &[(&str, u32)]) -> Result<Turn<C>, BudgetError> {
        let cells = self.shared.cells(costs)?;
        let now = self.shared.clock.now();
        let (id, generation) = {
            let mut state = self.shared.lock();
            if state.queued() > 0 || state.decide(&cells, now) != Decision::Admit {
                return Err(BudgetError::WouldWait);
            }
            (state.admit(cells.clone(), now), state.generation)
        };
        Ok(Turn::new(Arc::clone(&self.shared), id, cells, generation))
    }

    /// [`Budget::acquire`], blocking this thread: threads and tasks share one queue.
    ///
    /// # Errors
    ///
    /// As [`Budget::acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::Quota;
    ///
    /// let budget = Budget::builder().rate("requests", Quota::per_second(100)).in_flight(2).build()?;
    /// let workers: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let budget = budget.clone();
    ///         std::thread::spawn(move || budget.acquire_blocking(&[]).map(drop))
    ///     })
    ///     .collect();
    /// for w in workers {
    ///     w.join().unwrap()?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking(&self, costs: &[(&str, u32)]) -> Result<Turn<C>, BudgetError> {
        block_on(self.acquire(costs))
    }

    /// [`Budget::acquire_within`], blocking this thread.
    ///
    /// # Errors
    ///
    /// As [`Budget::acquire_within`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::Quota;
    /// use std::time::Duration;
    ///
    /// let budget = Budget::builder().rate("requests", Quota::per_hour(1)).build()?;
    /// let turn = budget.acquire_blocking_within(&[], Duration::ZERO)?;
    /// assert!(budget.acquire_blocking_within(&[], Duration::from_millis(10)).is_err());
    /// # drop(turn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_within(
        &self,
        costs: &[(&str, u32)],
        max: Duration,
    ) -> Result<Turn<C>, BudgetError> {
        block_on(self.acquire_within(costs, max))
    }

    /// How long a turn costing `costs` would wait if asked for now, by the rates as they
    /// stand (as [`Budget::acquire_within`] estimates it); `Duration::MAX`: never.
    /// Spends nothing.
    ///
    /// # Errors
    ///
    /// As [`Budget::acquire`], for the costs.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::clock::ManualClock;
    /// use paceline::Quota;
    /// use std::time::Duration;
    ///
    /// let budget = Budget::builder()
    ///     .rate("tokens", Quota::per_second(100))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// let turn = budget.try_acquire(&[("tokens", 100)]).unwrap();
    /// assert_eq!(budget.wait_time(&[("tokens", 50)])?, Duration::from_millis(500));
    /// # drop(turn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_time(&self, costs: &[(&str, u32)]) -> Result<Duration, BudgetError> {
        let cells = self.shared.cells(costs)?;
        let now = self.shared.clock.now();
        let at = self.shared.lock().estimate(&cells, now);
        Ok(at.map_or(Duration::MAX, |at| Duration::from_nanos(at - now)))
    }

    /// The cells of `dimension` its rate would admit right now (the queue and the
    /// permits not counted); spends nothing.
    ///
    /// # Errors
    ///
    /// [`BudgetError::UnknownDimension`].
    ///
    /// # Examples
    ///
    /// See [`Turn`].
    pub fn remaining(&self, dimension: &str) -> Result<u32, BudgetError> {
        let d = self.shared.index(dimension)?;
        let now = self.shared.clock.now();
        let cells = self.shared.lock().ledger.remaining(d, now);
        Ok(u32::try_from(cells).unwrap_or(u32::MAX))
    }

    /// The quota of `dimension`.
    ///
    /// # Errors
    ///
    /// [`BudgetError::UnknownDimension`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::Quota;
    /// let budget = Budget::builder().rate("tokens", Quota::per_minute(6_000)).build()?;
    /// assert_eq!(budget.quota("tokens")?, Quota::per_minute(6_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quota(&self, dimension: &str) -> Result<Quota, BudgetError> {
        Ok(self.shared.quotas[self.shared.index(dimension)?])
    }

    /// The dimensions and their quotas, in the order they were added.
    ///
    /// # Examples
    ///
    /// See [`BudgetBuilder`](super::BudgetBuilder).
    pub fn dimensions(&self) -> impl Iterator<Item = (&str, Quota)> + '_ {
        self.shared
            .names
            .iter()
            .map(String::as_str)
            .zip(self.shared.quotas.iter().copied())
    }

    /// Turns admitted and not yet ended.
    ///
    /// # Examples
    ///
    /// See [`Turn`].
    pub fn in_flight(&self) -> u32 {
        self.shared.lock().in_use()
    }

    /// The in-flight cap, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// assert_eq!(Budget::builder().in_flight(4).build()?.in_flight_limit(), Some(4));
    /// # Ok::<(), paceline::budget::BuildError>(())
    /// ```
    pub fn in_flight_limit(&self) -> Option<u32> {
        self.shared.in_flight
    }

    /// Callers waiting in the queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// assert_eq!(Budget::builder().in_flight(1).build()?.waiting(), 0);
    /// # Ok::<(), paceline::budget::BuildError>(())
    /// ```
    pub fn waiting(&self) -> usize {
        self.shared.lock().queued()
    }
}
