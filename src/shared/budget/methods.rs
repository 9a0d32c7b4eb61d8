//! A shared budget's public methods: asking for turns, reading its state, following an
//! upstream.

use core::time::Duration;

use super::{SharedAcquire, SharedBudget, SharedBudgetError, SharedTurn};
use crate::budget::queue::Step;
use crate::budget::{index_of, steer, BudgetError, Ready};
use crate::quota::Quota;
use crate::shared::error::SharedError;
use crate::upstream::DimensionSignal;

impl SharedBudget {
    /// A wait for `costs` on the file the path leads to now (the error of opening it
    /// again, if it was removed and cannot be, comes as the wait's answer).
    fn waiting_for(&self, costs: &[(&str, u32)], max: Option<u64>) -> SharedAcquire {
        match self.current() {
            Ok(inner) => {
                let cells = inner.cells(costs);
                SharedAcquire::new(inner, cells.map_err(SharedBudgetError::Budget), max)
            }
            Err(e) => SharedAcquire::new(self.open_now(), Err(SharedBudgetError::File(e)), max),
        }
    }

    /// A turn now, or [`BudgetError::WouldWait`]; never waits: admitted only when no one
    /// waits for a permit in any process, a permit is free and every dimension admits it.
    ///
    /// # Errors
    ///
    /// [`BudgetError::WouldWait`], the cost errors of [`SharedBudget::acquire`], and the
    /// file's ([`SharedError::Locked`], [`SharedError::TooManyCallers`], a damaged state).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::SharedBudget;
    /// use paceline::Quota;
    ///
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-t-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("requests", Quota::per_minute(1)).open(&path)?;
    /// let turn = budget.try_acquire(&[])?;
    /// assert!(budget.try_acquire(&[]).is_err()); // a minute away
    /// # drop(turn);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire(&self, costs: &[(&str, u32)]) -> Result<SharedTurn, SharedBudgetError> {
        let inner = self.current()?;
        let cells = inner.cells(costs)?;
        match inner.step(&cells, None, |state, ask| state.try_now(ask))? {
            Step::Admitted { ticket } => Ok(SharedTurn::new(inner, ticket, cells)),
            Step::Waiting { .. } => unreachable!("try_now never waits"),
        }
    }

    /// A turn costing `costs` (`(dimension, cells)`; a dimension not named costs 1), in
    /// arrival order over every process: admitted when it is the first in the queue, every
    /// dimension admits it and a permit is free. Dropping the future before then gives
    /// its place up; it has spent nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::SharedBudget;
    /// use paceline::Quota;
    ///
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-a-{}", std::process::id()));
    /// let budget = SharedBudget::builder()
    ///     .rate("tokens", Quota::per_minute(100_000))
    ///     .in_flight(4)
    ///     .open(&path)?;
    /// # futures::executor::block_on(async {
    /// let turn = budget.acquire(&[("tokens", 2_000)]).await?;
    /// turn.settle(&[("tokens", 1_500)])?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&self, costs: &[(&str, u32)]) -> SharedAcquire {
        self.waiting_for(costs, None)
    }

    /// [`SharedBudget::acquire`] with a deadline: refused at once when the rates as they
    /// stand put the turn further away than `max`; otherwise waits at most `max` (for a
    /// permit and for its instant) and gives its place up when it passes.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::BudgetError;
    /// use paceline::shared::{SharedBudget, SharedBudgetError};
    /// use paceline::Quota;
    /// use std::time::Duration;
    ///
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-w-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("requests", Quota::per_minute(1)).open(&path)?;
    /// let turn = budget.acquire_blocking_within(&[], Duration::ZERO)?;
    /// let late = budget.acquire_blocking_within(&[], Duration::from_secs(1));
    /// assert!(matches!(late, Err(SharedBudgetError::Budget(BudgetError::NotWithin { .. }))));
    /// # drop(turn);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_within(&self, costs: &[(&str, u32)], max: Duration) -> SharedAcquire {
        self.waiting_for(costs, Some(crate::wait::duration_nanos(max)))
    }

    /// [`SharedBudget::acquire`], blocking this thread.
    ///
    /// # Errors
    ///
    /// The cost errors of [`BudgetError`], and the file's.
    ///
    /// # Examples
    ///
    /// See [`SharedBudget`].
    pub fn acquire_blocking(&self, costs: &[(&str, u32)]) -> Result<SharedTurn, SharedBudgetError> {
        crate::wait::block::block_on(self.acquire(costs))
    }

    /// [`SharedBudget::acquire_within`], blocking this thread.
    ///
    /// # Errors
    ///
    /// As [`SharedBudget::acquire_within`].
    ///
    /// # Examples
    ///
    /// See [`SharedBudget::acquire_within`].
    pub fn acquire_blocking_within(
        &self,
        costs: &[(&str, u32)],
        max: Duration,
    ) -> Result<SharedTurn, SharedBudgetError> {
        crate::wait::block::block_on(self.acquire_within(costs, max))
    }

    /// Cells of `dimension` a turn could take now by the rates, spending nothing.
    ///
    /// # Errors
    ///
    /// An unknown dimension, or the file's.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedBudget, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-r-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("tokens", Quota::per_minute(6_000)).open(&path)?;
    /// let turn = budget.try_acquire(&[("tokens", 1_000)])?;
    /// assert!(budget.remaining("tokens")? <= 5_000);
    /// # drop(turn);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remaining(&self, dimension: &str) -> Result<u32, SharedBudgetError> {
        let d = index_of(&self.handle.config.names, dimension)?;
        let left = self
            .current()?
            .with(false, |state, now| state.ledger.remaining(d, now))?;
        Ok(u32::try_from(left).unwrap_or(u32::MAX))
    }

    /// Turns in flight over every process (each holds a permit until it ends).
    ///
    /// # Errors
    ///
    /// The file's.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedBudget, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-f-{}", std::process::id()));
    /// let budget = SharedBudget::builder().in_flight(2).open(&path)?;
    /// let turn = budget.try_acquire(&[])?;
    /// assert_eq!(budget.in_flight()?, 1);
    /// drop(turn);
    /// assert_eq!(budget.in_flight()?, 0);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight(&self) -> Result<u32, SharedError> {
        let me = crate::shared::process::identity();
        self.current()?.with(false, |state, now| {
            state.reap(now, me, &crate::shared::process::still);
            state.in_flight() as u32
        })
    }

    /// Callers waiting in the queue, over every process.
    ///
    /// # Errors
    ///
    /// The file's.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedBudget, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-q-{}", std::process::id()));
    /// let budget = SharedBudget::builder().in_flight(1).open(&path)?;
    /// assert_eq!(budget.waiting()?, 0);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn waiting(&self) -> Result<usize, SharedError> {
        let me = crate::shared::process::identity();
        self.current()?.with(false, |state, now| {
            state.reap(now, me, &crate::shared::process::still);
            state.waiting()
        })
    }

    /// Dimension `dimension`'s quota.
    ///
    /// # Errors
    ///
    /// An unknown dimension.
    ///
    /// # Examples
    ///
    /// See [`SharedBudgetBuilder::options`](super::SharedBudgetBuilder::options).
    pub fn quota(&self, dimension: &str) -> Result<Quota, BudgetError> {
        index_of(&self.handle.config.names, dimension).map(|d| self.handle.config.quotas[d])
    }

    /// The dimensions, in the order they were given, with their quotas.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedBudget, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-d-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("requests", Quota::per_second(1)).open(&path)?;
    /// assert_eq!(budget.dimensions().map(|(n, _)| n).collect::<Vec<_>>(), ["requests"]);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dimensions(&self) -> impl Iterator<Item = (&str, Quota)> + '_ {
        let config = &self.handle.config;
        config
            .names
            .iter()
            .zip(config.quotas.iter())
            .map(|(n, q)| (n.as_str(), *q))
    }

    /// How long a turn costing `costs` would wait for its instant if asked for now, by the
    /// rates as they stand (permits not counted; `Duration::MAX`: never). Spends nothing.
    ///
    /// # Errors
    ///
    /// The cost errors of [`BudgetError`], and the file's.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedBudget, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-wt-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("tokens", Quota::per_second(100)).open(&path)?;
    /// let turn = budget.try_acquire(&[("tokens", 100)])?;
    /// assert!(budget.wait_time(&[("tokens", 50)])? > Duration::from_millis(400));
    /// # drop(turn);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_time(&self, costs: &[(&str, u32)]) -> Result<Duration, SharedBudgetError> {
        let inner = self.current()?;
        let cells = inner.cells(costs)?;
        let wait = inner.with(false, |state, now| match state.ledger.ready(&cells, now) {
            Ready::Now => Duration::ZERO,
            Ready::At(at) => Duration::from_nanos(at - now),
            Ready::Never => Duration::MAX,
        })?;
        Ok(wait)
    }

    /// Steers the budget by what a response said, for every process: as
    /// [`Budget::follow`](crate::budget::Budget::follow). Returns how many of the
    /// budget's dimensions the response reported.
    ///
    /// # Errors
    ///
    /// The file's.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::SharedBudget;
    /// use paceline::upstream::DimensionSignal;
    /// use paceline::Quota;
    /// use std::time::{Duration, SystemTime};
    ///
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-fo-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("tokens", Quota::per_minute(60_000)).open(&path)?;
    /// let headers = [
    ///     ("x-ratelimit-remaining-tokens", &b"0"[..]),
    ///     ("x-ratelimit-reset-tokens", &b"20s"[..]),
    /// ];
    /// let signal = DimensionSignal::read(200, headers, SystemTime::now());
    /// assert_eq!(budget.follow(&signal, Duration::from_secs(60))?, 1);
    /// assert!(budget.try_acquire(&[("tokens", 1)]).is_err()); // nothing for 20 s
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn follow(
        &self,
        signal: &DimensionSignal,
        max_hold: Duration,
    ) -> Result<usize, SharedError> {
        let (names, quotas) = (&self.handle.config.names, &self.handle.config.quotas);
        self.current()?.with(true, |state, now| {
            steer(&mut state.ledger, (names, quotas), signal, max_hold, now).0
        })
    }

    /// Holds every turn for `duration` from now (for every process; a longer
    /// hold already in force stays).
    ///
    /// # Errors
    ///
    /// The file's.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedBudget, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-h-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("requests", Quota::per_second(10)).open(&path)?;
    /// budget.hold_for(Duration::from_secs(60))?;
    /// assert!(budget.try_acquire(&[]).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hold_for(&self, duration: Duration) -> Result<(), SharedError> {
        let d = crate::wait::duration_nanos(duration);
        self.current()?
            .with(true, |state, now| state.ledger.hold(now.saturating_add(d)))
    }

    /// The in-flight cap, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedBudget, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-l-{}", std::process::id()));
    /// let budget = SharedBudget::builder().in_flight(3).open(&path)?;
    /// assert_eq!(budget.in_flight_limit(), Some(3));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight_limit(&self) -> Option<u32> {
        self.handle.config.cap
    }
}
