//! A fleet budget's public methods: asking for turns, reading its state, following an
//! upstream; and a caller on its way to a turn.

use super::*;

impl RedisBudget {
    /// A turn now, or [`BudgetError::WouldWait`]: admitted only when no one waits, a
    /// permit is free and every dimension admits it.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(budget: paceline::redis::RedisBudget) {
    /// if let Ok(turn) = budget.try_acquire(&[("tokens", 500)]).await {
    ///     // call
    /// #   drop(turn);
    /// }
    /// # }
    /// ```
    pub async fn try_acquire(&self, costs: &[(&str, u32)]) -> Result<RedisTurn, RedisBudgetError> {
        let inner = &self.inner;
        let cells = inner.rules.cells(costs)?;
        inner.hold();
        let mut guard = Leaving::new(inner, &cells);
        let (outcome, _) = inner
            .transact(
                false,
                |_| FleetOp::TryNow { cells: &cells },
                |o| guard.saw(o),
            )
            .await?;
        guard.outcome(outcome, cells)
    }

    /// A turn costing `costs` (`(dimension, cells)`; a dimension not named costs 1), in
    /// arrival order over every client: admitted when it is the first in the queue, every
    /// dimension admits it and a permit is free. Dropping the future before then gives
    /// its place up; it has spent nothing.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError`].
    ///
    /// # Examples
    ///
    /// See [`RedisBudget`].
    pub async fn acquire(&self, costs: &[(&str, u32)]) -> Result<RedisTurn, RedisBudgetError> {
        self.wait(costs, None).await
    }

    /// [`RedisBudget::acquire`] with a deadline: refused at once when the rates as they
    /// stand put the turn further away than `max`; otherwise waits at most `max` and gives
    /// its place up when it passes.
    ///
    /// # Errors
    ///
    /// [`BudgetError::NotWithin`], [`BudgetError::TimedOut`], and the others of
    /// [`RedisBudgetError`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(budget: paceline::redis::RedisBudget) {
    /// use std::time::Duration;
    /// match budget.acquire_within(&[("tokens", 500)], Duration::from_secs(2)).await {
    ///     Ok(turn) => drop(turn), // call, then settle
    ///     Err(e) => eprintln!("not within 2 s: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn acquire_within(
        &self,
        costs: &[(&str, u32)],
        max: Duration,
    ) -> Result<RedisTurn, RedisBudgetError> {
        self.wait(costs, Some(max)).await
    }

    async fn wait(
        &self,
        costs: &[(&str, u32)],
        max: Option<Duration>,
    ) -> Result<RedisTurn, RedisBudgetError> {
        let inner = &self.inner;
        let cells = inner.rules.cells(costs)?;
        inner.hold();
        let mut guard = Leaving::new(inner, &cells);
        let mut wait = FleetWait::new(max);
        loop {
            let urgent = wait.urgent();
            let step = inner
                .transact(urgent, |now| wait.op(&cells, now), |o| guard.saw(o))
                .await;
            let (outcome, read) = match step {
                // Overtaken again and again by other clients' writes: its place (if it
                // has one) is kept; it asks again.
                Err(RedisBudgetError::Contended) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                step => step?,
            };
            guard.saw(&outcome);
            match wait.answer(outcome, read.epochs, read.now, read.local) {
                FleetNext::Admitted { ticket } => {
                    return guard.outcome(FleetOutcome::Admitted { ticket }, cells);
                }
                FleetNext::Failed(outcome) => return guard.outcome(outcome, cells),
                FleetNext::Waiting => {}
            }
            let mut look = wait.look(None, inner.local());
            while let FleetLook::Sleep(d) = look {
                tokio::time::sleep(d).await;
                let epochs = inner.epochs().await?;
                look = wait.look(Some(epochs), inner.local());
            }
        }
    }

    /// Cells of `dimension` a turn could take now by the rates, spending nothing.
    ///
    /// # Errors
    ///
    /// An unknown dimension, and [`RedisBudgetError`]'s others.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(budget: paceline::redis::RedisBudget) -> Result<(), paceline::redis::RedisBudgetError> {
    /// println!("{} tokens now", budget.remaining("tokens").await?);
    /// # Ok(()) }
    /// ```
    pub async fn remaining(&self, dimension: &str) -> Result<u32, RedisBudgetError> {
        let d = self.inner.rules.index(dimension)?;
        match self.look().await? {
            FleetOutcome::Looked { remaining, .. } => Ok(remaining[d]),
            _ => unreachable!("a look is answered by a read"),
        }
    }

    /// Turns in flight over every client.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(budget: paceline::redis::RedisBudget) -> Result<(), paceline::redis::RedisBudgetError> {
    /// println!("{} calls in flight", budget.in_flight().await?);
    /// # Ok(()) }
    /// ```
    pub async fn in_flight(&self) -> Result<u32, RedisBudgetError> {
        match self.look().await? {
            FleetOutcome::Looked { in_flight, .. } => Ok(in_flight),
            _ => unreachable!("a look is answered by a read"),
        }
    }

    /// Callers waiting in the queue over every client.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(budget: paceline::redis::RedisBudget) -> Result<(), paceline::redis::RedisBudgetError> {
    /// println!("{} waiting", budget.waiting().await?);
    /// # Ok(()) }
    /// ```
    pub async fn waiting(&self) -> Result<usize, RedisBudgetError> {
        match self.look().await? {
            FleetOutcome::Looked { waiting, .. } => Ok(waiting),
            _ => unreachable!("a look is answered by a read"),
        }
    }

    async fn look(&self) -> Result<FleetOutcome, RedisBudgetError> {
        Ok(self
            .inner
            .transact(false, |_| FleetOp::Look, |_| {})
            .await?
            .0)
    }

    /// Steers the budget by what a response said, for every client: as
    /// [`Budget::follow`](crate::budget::Budget::follow). Returns how many of the
    /// budget's dimensions the response reported.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(budget: paceline::redis::RedisBudget) -> Result<(), paceline::redis::RedisBudgetError> {
    /// use paceline::upstream::DimensionSignal;
    /// use std::time::{Duration, SystemTime};
    /// let headers = [("x-ratelimit-remaining-tokens", &b"0"[..]), ("x-ratelimit-reset-tokens", &b"20s"[..])];
    /// let signal = DimensionSignal::read(200, headers, SystemTime::now());
    /// budget.follow(&signal, Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn follow(
        &self,
        signal: &DimensionSignal,
        max_hold: Duration,
    ) -> Result<usize, RedisBudgetError> {
        let op = |_| FleetOp::Follow { signal, max_hold };
        match self.inner.transact(true, op, |_| {}).await?.0 {
            FleetOutcome::Followed(n) => Ok(n),
            _ => unreachable!("a follow is answered by a count"),
        }
    }

    /// Holds every turn for `duration` from now, for every client.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(budget: paceline::redis::RedisBudget) -> Result<(), paceline::redis::RedisBudgetError> {
    /// budget.hold_for(std::time::Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn hold_for(&self, duration: Duration) -> Result<(), RedisBudgetError> {
        let op = |_| FleetOp::Hold { duration };
        self.inner.transact(true, op, |_| {}).await.map(drop)
    }

    /// The dimensions, sorted by name, with their quotas.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(budget: paceline::redis::RedisBudget) {
    /// for (name, quota) in budget.dimensions() {
    ///     println!("{name}: {quota:?}");
    /// }
    /// # }
    /// ```
    pub fn dimensions(&self) -> impl Iterator<Item = (&str, Quota)> + '_ {
        self.inner.rules.dimensions()
    }

    /// The in-flight cap, if any.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(budget: paceline::redis::RedisBudget) {
    /// assert_eq!(budget.in_flight_limit(), Some(8));
    /// # }
    /// ```
    pub fn in_flight_limit(&self) -> Option<u32> {
        self.inner.rules.cap()
    }
}

/// A caller on its way to a turn: dropped before it is handed over (a cancelled task, a
/// failure), it leaves the queue or ends the admission it was given, in the background.
struct Leaving<'a> {
    inner: &'a Arc<Inner>,
    cells: Box<[u32]>,
    /// The ticket it may be on record with.
    ticket: Option<u64>,
    /// Whether a turn took it over (and its place among the callers held).
    handed: bool,
}

impl<'a> Leaving<'a> {
    fn new(inner: &'a Arc<Inner>, cells: &[u32]) -> Leaving<'a> {
        Leaving {
            inner,
            cells: cells.into(),
            ticket: None,
            handed: false,
        }
    }

    fn saw(&mut self, outcome: &FleetOutcome) {
        if let FleetOutcome::Admitted { ticket } | FleetOutcome::Waiting { ticket, .. } = outcome {
            self.ticket = Some(*ticket);
        }
    }

    /// The turn, or the refusal the outcome is.
    fn outcome(
        mut self,
        outcome: FleetOutcome,
        cells: Box<[u32]>,
    ) -> Result<RedisTurn, RedisBudgetError> {
        let error = match outcome {
            FleetOutcome::Admitted { ticket } => {
                self.handed = true;
                return Ok(RedisTurn::new(Arc::clone(self.inner), ticket, cells));
            }
            FleetOutcome::Refused(e) => RedisBudgetError::Budget(e),
            FleetOutcome::Full => RedisBudgetError::Full,
            other => unreachable!("a turn is admitted, waits or is refused: {other:?}"),
        };
        // Refused: off the record already.
        self.ticket = None;
        Err(error)
    }
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        match self.ticket {
            _ if self.handed => {}
            Some(ticket) => self
                .inner
                .end_later(ticket, core::mem::take(&mut self.cells)),
            None => self.inner.release(),
        }
    }
}
