//! Budgets: several rates (requests, tokens, ...) and a cap on calls in flight, admitting
//! a caller together in one FIFO turn, with the cost corrected after the call.
//!
//! A model API limits requests per minute *and* tokens per minute *and* concurrent
//! calls, and a call's token count is known only from its response. A [`Budget`] books
//! an estimate in one turn across every dimension; [`Turn::settle`] replaces it with the
//! real cost once the response says it (the difference given back, or charged).
//!
//! ```
//! use paceline::budget::Budget;
//! use paceline::Quota;
//!
//! # futures::executor::block_on(async {
//! let budget = Budget::builder()
//!     .rate("requests", Quota::per_minute(500))
//!     .rate("tokens", Quota::per_minute(200_000))
//!     .in_flight(8)
//!     .build()?;
//!
//! // One request and an estimated 1 200 tokens, in one turn (a dimension not named costs 1).
//! let turn = budget.acquire(&[("tokens", 1_200)]).await?;
//! // ... the call; its response says it used 900 tokens ...
//! turn.settle(&[("tokens", 900)]).expect("a dimension of this budget");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # The promises
//!
//! * **One turn, FIFO, never partial.** A caller is admitted when every dimension admits
//!   it and an in-flight permit is free; nothing is charged in any dimension before that,
//!   and then everything is, at that instant. Callers are admitted in arrival order: a
//!   heavy one is never overtaken by light ones. A caller dropped (cancelled) before its
//!   turn has spent nothing, and the one behind it moves up.
//! * **In flight.** The cap holds at every instant; a permit is taken at admission and
//!   returns when the turn is settled or dropped (a panic or a cancellation drops it). A
//!   caller whose rates allow it but who finds no permit keeps its place.
//! * **Settled after the call.** A refund gives back only what no later admission relied
//!   on, a charge delays those behind; over any window of length `w`, each dimension's
//!   settled cost is at most `b + w/T + U`, where `U` is the total under-estimate of the
//!   turns unsettled at one time (at most `in_flight` × the largest single
//!   under-estimate); with no under-estimates, exactly GCRA's `b + w/T`.
//!   See `docs/BUDGETS.md` for the proof.
//!
//! # Implementation notes
//!
//! One mutex guards everything (`state.rs`: the ledger, the permits, the queue of
//! waiters): a budget guards API calls, which take milliseconds, not a nanosecond hot
//! path, and one lock makes "all dimensions or none" trivially atomic. An uncontended
//! `try_acquire` and settle cost about what a few `Limiter` checks do (BENCHMARKS.md).
//! Only the head of the queue is ever woken, and it admits itself in its own poll (so a
//! turn is admitted when its task actually runs, not while its executor is stalled). The
//! arithmetic (`ledger.rs`) is pure: admissions, settles by exact replay, the bounded log.
//! No atomics outside the mutex, so there is nothing for loom to model here; the lock's
//! critical sections never wake or drop a waker.

mod error;
#[cfg(feature = "redis-scripts")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-scripts")))]
pub mod fleet;
mod follow;
mod future;
mod ledger;
mod methods;
#[cfg(any(feature = "shared", feature = "redis-scripts"))]
pub(crate) mod queue;
mod state;
mod turn;

use core::fmt;
use std::sync::Arc;

use crate::clock::gate::{self, Gated};
use crate::clock::{Clock, DefaultClock};
use crate::gcra::{Params, Unfit};
use crate::quota::Quota;
use crate::sync::Mutex;
#[cfg(any(feature = "shared", feature = "redis-scripts"))]
pub(crate) use follow::steer;
#[cfg(not(any(feature = "shared", feature = "redis-scripts")))]
use ledger::Ledger;
#[cfg(any(feature = "shared", feature = "redis-scripts"))]
pub(crate) use ledger::{codec::words as ledger_words, Ledger, Ready};
use methods::wake;
use state::State;

pub use error::{BudgetError, BuildError, SettleError};
pub use future::Acquire;
pub use ledger::LOG_CAPACITY;
pub use turn::Turn;

/// A budget builder's `rate` and `in_flight`, each with that builder's documentation:
/// every builder (in-process, shared, Redis) gathers its dimensions in a `rates` field
/// and its cap in an `in_flight` field, alike.
macro_rules! rate_and_in_flight {
    ($(#[$rate_doc:meta])* fn rate; $(#[$cap_doc:meta])* fn in_flight;) => {
        $(#[$rate_doc])*
        pub fn rate(mut self, name: impl Into<String>, quota: $crate::Quota) -> Self {
            self.rates.push((name.into(), quota));
            self
        }

        $(#[$cap_doc])*
        pub fn in_flight(mut self, cap: u32) -> Self {
            self.in_flight = Some(cap);
            self
        }
    };
}
#[cfg(any(feature = "shared", feature = "redis"))]
pub(crate) use rate_and_in_flight;

/// Several rates and an in-flight cap that admit a caller together, in one FIFO turn.
///
/// Built by [`Budget::builder`]. Clones share one budget (one queue, one state), so a
/// budget can be handed to tasks and threads by value; waiting futures own a clone and
/// are `'static`.
///
/// Costs are given as `&[(dimension, cells)]`; a dimension not named costs 1, so
/// `&[("tokens", 1_200)]` is one request and 1 200 tokens.
///
/// # Examples
///
/// ```
/// use paceline::budget::Budget;
/// use paceline::clock::ManualClock;
/// use paceline::Quota;
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let budget = Budget::builder()
///     .rate("requests", Quota::per_second(10))
///     .rate("tokens", Quota::per_second(1_000))
///     .in_flight(2)
///     .clock(clock.clone())
///     .build()?;
/// let a = budget.try_acquire(&[("tokens", 600)]).unwrap();
/// // Tokens are short now: 400 left.
/// assert!(budget.try_acquire(&[("tokens", 500)]).is_err());
/// a.settle(&[("tokens", 300)]).unwrap(); // it used 300: 300 come back
/// let b = budget.try_acquire(&[("tokens", 500)]).unwrap();
/// let c = budget.try_acquire(&[("tokens", 100)]).unwrap();
/// // Two calls in flight: a third waits for one to end, whatever the rates say.
/// assert!(budget.try_acquire(&[("tokens", 1)]).is_err());
/// drop(b);
/// assert!(budget.try_acquire(&[("tokens", 1)]).is_ok());
/// # drop(c);
/// # Ok::<(), paceline::budget::BuildError>(())
/// ```
pub struct Budget<C: Clock = DefaultClock> {
    shared: Arc<Shared<C>>,
}

/// What every clone of a budget, its futures and its turns share.
pub(crate) struct Shared<C: Clock> {
    names: Box<[String]>,
    quotas: Box<[Quota]>,
    in_flight: Option<u32>,
    clock: C,
    state: Mutex<State>,
}

impl<C: Clock> Shared<C> {
    /// The state's lock; in a process forked since the state was last touched, the queue,
    /// the permits and the log are forgotten first (`State::forget_before_fork`).
    fn lock(&self) -> Gated<'_, State> {
        // Read before the lock: its first read in a process may wait out a fork in
        // progress (`clock/fork.rs`), which must not happen holding the lock.
        let generation = crate::clock::forks();
        loop {
            // Inside the gate: no fork copies the lock held (`clock/gate.rs`).
            let mut state = gate::lock(&self.state);
            if state.generation == generation {
                return state;
            }
            let stale = state.forget_before_fork(generation);
            drop(state);
            // Neither woken nor dropped: a waker of a thread that did not come along may
            // reach into its executor, whose locks that thread may have held at the fork.
            // Leaked instead (as many as there were waiters at the fork).
            core::mem::forget(stale);
        }
    }

    fn index(&self, name: &str) -> Result<usize, BudgetError> {
        index_of(&self.names, name)
    }

    /// Each dimension's cells for `costs` (1 where not named), or why they cannot be.
    fn cells(&self, costs: &[(&str, u32)]) -> Result<Box<[u32]>, BudgetError> {
        cells_for(&self.names, &self.quotas, costs)
    }

    /// Each dimension's settled cells (`None` where not named), or why not.
    fn settled(&self, costs: &[(&str, u32)]) -> Result<Box<[Option<u32>]>, BudgetError> {
        settled_for(&self.names, costs)
    }
}

/// The index of dimension `name` among `names`.
pub(crate) fn index_of(names: &[String], name: &str) -> Result<usize, BudgetError> {
    names
        .iter()
        .position(|n| n == name)
        .ok_or_else(|| BudgetError::UnknownDimension {
            name: name.to_owned(),
            known: names.to_vec(),
        })
}

/// Each dimension's cells for `costs` (1 where not named), or why they cannot be.
pub(crate) fn cells_for(
    names: &[String],
    quotas: &[Quota],
    costs: &[(&str, u32)],
) -> Result<Box<[u32]>, BudgetError> {
    let mut cells = vec![1; names.len()];
    let mut named = vec![false; names.len()];
    for &(name, cost) in costs {
        let d = index_of(names, name)?;
        if core::mem::replace(&mut named[d], true) {
            return Err(BudgetError::RepeatedDimension { name: name.into() });
        }
        let params = quotas[d].params();
        if let Err(Unfit::OverBurst | Unfit::PastEndOfTime) = params.cost(cost) {
            return Err(BudgetError::OverBurst {
                dimension: name.into(),
                cost,
                burst: params.burst(),
            });
        }
        cells[d] = cost;
    }
    Ok(cells.into())
}

/// Each dimension's settled cells (`None` where not named), or why not.
pub(crate) fn settled_for(
    names: &[String],
    costs: &[(&str, u32)],
) -> Result<Box<[Option<u32>]>, BudgetError> {
    let mut actual = vec![None; names.len()];
    for &(name, cost) in costs {
        let d = index_of(names, name)?;
        if actual[d].replace(cost).is_some() {
            return Err(BudgetError::RepeatedDimension { name: name.into() });
        }
    }
    Ok(actual.into())
}

/// How a [`BudgetBuilder`] will get its clock.
enum ClockChoice<C> {
    Given(C),
    Default(fn() -> C),
}

/// Builds a [`Budget`]: its rates, by name, and its in-flight cap.
///
/// # Examples
///
/// ```
/// use paceline::budget::Budget;
/// use paceline::Quota;
///
/// let budget = Budget::builder()
///     .rate("requests", Quota::per_minute(500))
///     .rate("input-tokens", Quota::per_minute(100_000))
///     .rate("output-tokens", Quota::per_minute(20_000))
///     .in_flight(16)
///     .build()?;
/// assert_eq!(budget.dimensions().count(), 3);
/// # Ok::<(), paceline::budget::BuildError>(())
/// ```
pub struct BudgetBuilder<C: Clock = DefaultClock> {
    rates: Vec<(String, Quota)>,
    in_flight: Option<u32>,
    clock: ClockChoice<C>,
}

impl<C: Clock> fmt::Debug for BudgetBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetBuilder")
            .field("rates", &self.rates)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Budget {
    /// A builder for a budget on the default clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::Quota;
    /// let budget = Budget::builder().rate("requests", Quota::per_second(5)).build()?;
    /// assert_eq!(budget.remaining("requests")?, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder() -> BudgetBuilder {
        BudgetBuilder {
            rates: Vec::new(),
            in_flight: None,
            clock: ClockChoice::Default(DefaultClock::default),
        }
    }
}

impl<C: Clock> BudgetBuilder<C> {
    rate_and_in_flight! {
        /// Adds a dimension: `quota` of `name` (its burst is how many may go at once).
        ///
        /// # Examples
        ///
        /// See [`BudgetBuilder`].
        fn rate;

        /// Caps the calls in flight: turns admitted and not yet settled or dropped. `0` is an
        /// error at [`BudgetBuilder::build`].
        ///
        /// # Examples
        ///
        /// See [`BudgetBuilder`].
        fn in_flight;
    }

    /// Uses `clock` (a [`ManualClock`](crate::clock::ManualClock) in tests, a runtime's
    /// own clock).
    ///
    /// # Examples
    ///
    /// See [`Budget`].
    pub fn clock<D: Clock>(self, clock: D) -> BudgetBuilder<D> {
        BudgetBuilder {
            rates: self.rates,
            in_flight: self.in_flight,
            clock: ClockChoice::Given(clock),
        }
    }

    /// The budget, or why it cannot be.
    ///
    /// # Errors
    ///
    /// [`BuildError`]: no rate and no cap, two rates of one name, an empty name, a cap of 0.
    ///
    /// # Examples
    ///
    /// See [`BudgetBuilder`].
    pub fn build(self) -> Result<Budget<C>, BuildError> {
        if self.rates.is_empty() && self.in_flight.is_none() {
            return Err(BuildError::Empty);
        }
        if self.in_flight == Some(0) {
            return Err(BuildError::ZeroInFlight);
        }
        for (i, (name, _)) in self.rates.iter().enumerate() {
            if name.is_empty() {
                return Err(BuildError::EmptyName);
            }
            if self.rates[..i].iter().any(|(n, _)| n == name) {
                return Err(BuildError::RepeatedDimension { name: name.clone() });
            }
        }
        let params: Vec<Params> = self.rates.iter().map(|(_, q)| *q.params()).collect();
        let (names, quotas) = self.rates.into_iter().unzip::<_, _, Vec<_>, Vec<_>>();
        let clock = match self.clock {
            ClockChoice::Given(clock) => clock,
            ClockChoice::Default(make) => make(),
        };
        // Reading the fork generation also registers the fork handlers early
        // (`clock/fork.rs`), the gate's among them.
        let generation = crate::clock::forks();
        Ok(Budget {
            shared: Arc::new(Shared {
                names: names.into(),
                quotas: quotas.into(),
                in_flight: self.in_flight,
                clock,
                state: Mutex::new(State::new(Ledger::new(&params), self.in_flight, generation)),
            }),
        })
    }
}

impl<C: Clock> Clone for Budget<C> {
    fn clone(&self) -> Self {
        Budget {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock> fmt::Debug for Budget<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("dimensions", &self.dimensions().collect::<Vec<_>>())
            .field("in_flight", &self.shared.in_flight)
            .finish_non_exhaustive()
    }
}
