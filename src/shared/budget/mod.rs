//! [`SharedBudget`]: a [`Budget`](crate::budget::Budget) for every process that opens the
//! same file. Opening and the public methods live here; the decisions in `admit.rs`, the
//! file's lock and state in `store.rs`, waiting in `waiting.rs`, turns in `turn.rs`.

mod admit;
mod error;
mod store;
mod turn;
mod waiting;

use core::fmt;
use core::time::Duration;
use std::path::Path;
use std::sync::Arc;

use super::error::SharedError;
use super::file::{self, Mapping, Want};
use super::layout::{self, Kind};
use super::options::{OnMismatch, OpenOptions};
use super::process;
use crate::budget::{cells_for, index_of, settled_for, BudgetError, Ledger};
use crate::clock::{gate, Clock, HostClock};
use crate::gcra::Params;
use crate::quota::Quota;
use crate::sync::{Mutex, Ordering};
use admit::{Ask, Refusal, Step};
use store::{Region, State};

pub use admit::ABANDONED;
pub use error::{SharedBudgetError, SharedSettleError};
pub use store::{LOCK_PATIENCE, MAX_WAITING};
pub use turn::SharedTurn;
pub use waiting::SharedAcquire;

/// Several rates and an in-flight cap shared by every process that opens one file: the
/// promises of [`Budget`](crate::budget::Budget), across processes.
///
/// * **One turn across every dimension, FIFO, never partial.** A caller is booked in
///   every dimension at once, at the earliest instant all of them admit it, behind every
///   caller of every process booked before it; nothing is charged anywhere before that.
///   A caller dropped before its instant gives back what it booked, as far as no caller
///   booked after it relied on it.
/// * **In flight.** The cap holds over every process at every instant. With a cap, a
///   caller first takes a permit, in arrival order over every process, and is booked
///   when it has one (so a turn runs at its booked instant); the permit returns when the
///   turn is settled or dropped, also on a panic or a cancellation, and when its process
///   is gone (killed, or exited without ending it).
/// * **Settled after the call**, as in one process ([`SharedTurn::settle`]): a refund
///   gives back only what no later admission relied on, a charge delays those behind.
///
/// Clones share one opened file. Every call takes the file's lock for microseconds (a
/// budget guards API calls, not a nanosecond hot path); a process killed inside it is
/// taken over at once, one stopped inside it makes the others' calls fail after
/// [`LOCK_PATIENCE`] with [`SharedError::Locked`], changing nothing.
///
/// # Examples
///
/// ```
/// use paceline::shared::SharedBudget;
/// use paceline::Quota;
///
/// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-{}", std::process::id()));
/// // Every worker process opens the same file ("/dev/shm/model-api" on Linux).
/// let budget = SharedBudget::builder()
///     .rate("requests", Quota::per_minute(500))
///     .rate("tokens", Quota::per_minute(200_000))
///     .in_flight(8)
///     .open(&path)?;
/// let turn = budget.acquire_blocking(&[("tokens", 1_200)])?;
/// // ... the call; its response says it used 900 tokens ...
/// turn.settle(&[("tokens", 900)])?;
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SharedBudget {
    inner: Arc<Inner>,
}

/// What the handles of one opened budget file share.
pub(crate) struct Inner {
    map: Mapping,
    dims: usize,
    names: Box<[String]>,
    quotas: Box<[Quota]>,
    cap: Option<u32>,
    clock: HostClock,
    /// Threads of this process take the file's lock one at a time (`store.rs`).
    local: Mutex<()>,
}

/// Builds a [`SharedBudget`]: its rates, by name, its in-flight cap, how to open its file.
///
/// # Examples
///
/// See [`SharedBudget`].
#[derive(Clone, Debug, Default)]
pub struct SharedBudgetBuilder {
    rates: Vec<(String, Quota)>,
    in_flight: Option<u32>,
    options: OpenOptions,
}

impl SharedBudget {
    /// A builder.
    ///
    /// # Examples
    ///
    /// See [`SharedBudget`].
    pub fn builder() -> SharedBudgetBuilder {
        SharedBudgetBuilder::default()
    }
}

impl SharedBudgetBuilder {
    /// Adds a dimension: `quota` of `name` (at most
    /// [`MAX_DIMENSION_NAME_LEN`](super::MAX_DIMENSION_NAME_LEN) bytes; at most
    /// [`MAX_DIMENSIONS`](super::MAX_DIMENSIONS) of them).
    ///
    /// # Examples
    ///
    /// See [`SharedBudget`].
    pub fn rate(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.rates.push((name.into(), quota));
        self
    }

    /// Caps the calls in flight over every process (at most [`MAX_WAITING`]).
    ///
    /// # Examples
    ///
    /// See [`SharedBudget`].
    pub fn in_flight(mut self, cap: u32) -> Self {
        self.in_flight = Some(cap);
        self
    }

    /// How to open the file: whom to trust, the budget's name, and what to do when the
    /// file holds another budget ([`OnMismatch::Adopt`] takes the file's;
    /// [`OnMismatch::Replace`] is refused: a budget's turns on record were booked under
    /// its rates).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::{OnMismatch, SharedBudget};
    /// use paceline::Quota;
    ///
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-o-{}", std::process::id()));
    /// let first = SharedBudget::builder().rate("requests", Quota::per_second(5)).open(&path)?;
    /// let follower = SharedBudget::builder()
    ///     .rate("requests", Quota::per_second(9))
    ///     .options(OnMismatch::Adopt)
    ///     .open(&path)?;
    /// assert_eq!(follower.quota("requests")?, Quota::per_second(5));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn options(mut self, options: impl Into<OpenOptions>) -> Self {
        self.options = options.into();
        self
    }

    /// Opens the budget at `path`, making the file if there is none (see
    /// [`crate::shared`], "Who can use a file").
    ///
    /// # Errors
    ///
    /// [`SharedError::BadBudget`] for a budget that cannot be (no rate and no cap, a cap
    /// of 0, a name empty, too long or given twice, too many rates);
    /// [`SharedError::BudgetMismatch`] when the file holds another budget; and the
    /// errors of opening any shared file.
    ///
    /// # Examples
    ///
    /// See [`SharedBudget`].
    pub fn open(self, path: impl AsRef<Path>) -> Result<SharedBudget, SharedError> {
        let asked = Config::checked(self.rates, self.in_flight)?;
        let on_mismatch = self.options.on_mismatch;
        let dims = asked.names.len();
        let init_config = asked.clone();
        let want = Want {
            kind: Kind::Budget { dims: dims as u64 },
            settle: Box::new(move |_: &Mapping, found: Kind| Ok(found)),
            init: Box::new(move |map: &Mapping| init_config.init(map)),
        };
        // The file's own kind comes back: its dimensions, whatever was asked.
        let opened = file::open(path.as_ref(), want, &self.options)?;
        let Kind::Budget { dims } = opened.kind else {
            unreachable!("a budget file was asked for")
        };
        let map = opened.mapping;
        let found = Config::read(&map, dims as usize).ok_or_else(|| SharedError::Corrupt {
            path: map.path().to_owned(),
            field: "budget rates",
        })?;
        let config = if found == asked {
            asked
        } else {
            match on_mismatch {
                OnMismatch::Adopt => found,
                OnMismatch::Refuse => {
                    return Err(SharedError::BudgetMismatch {
                        path: map.path().to_owned(),
                        file: found.to_string(),
                        asked: asked.to_string(),
                    })
                }
                OnMismatch::Replace => {
                    return Err(SharedError::BadBudget {
                        reason: format!(
                            "{} holds the budget {found}; a budget's rates are not replaced \
                             in place (its turns on record were booked under them): open it \
                             with OnMismatch::Adopt, or remove the file while no process \
                             uses it",
                            map.path().display()
                        ),
                    })
                }
            }
        };
        // Reading the fork generation registers the fork handlers early
        // (`clock/fork.rs`), the gate's among them.
        crate::clock::forks();
        Ok(SharedBudget {
            inner: Arc::new(Inner {
                dims: config.names.len(),
                names: config.names,
                quotas: config.quotas,
                cap: config.cap,
                clock: HostClock::new(opened.time),
                map,
                local: Mutex::new(()),
            }),
        })
    }
}

/// A budget's rates and cap, as asked for or as a file holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Config {
    names: Box<[String]>,
    quotas: Box<[Quota]>,
    cap: Option<u32>,
}

impl Config {
    /// The budget asked for, or why it cannot be.
    fn checked(rates: Vec<(String, Quota)>, cap: Option<u32>) -> Result<Config, SharedError> {
        let bad = |reason: String| Err(SharedError::BadBudget { reason });
        if rates.is_empty() && cap.is_none() {
            return bad("a budget needs at least one rate or an in-flight cap".into());
        }
        if cap == Some(0) {
            return bad("an in-flight cap of 0 would never let a call run".into());
        }
        if cap.is_some_and(|c| c as usize > MAX_WAITING) {
            return bad(format!("an in-flight cap above {MAX_WAITING}"));
        }
        if rates.len() > layout::MAX_DIMENSIONS {
            return bad(format!(
                "{} rates; a shared budget has at most {}",
                rates.len(),
                layout::MAX_DIMENSIONS
            ));
        }
        for (i, (name, _)) in rates.iter().enumerate() {
            if name.is_empty() {
                return bad("a rate needs a non-empty name".into());
            }
            if name.len() > layout::MAX_DIMENSION_NAME_LEN {
                return bad(format!(
                    "the rate name {name:?} is longer than {} bytes",
                    layout::MAX_DIMENSION_NAME_LEN
                ));
            }
            if rates[..i].iter().any(|(n, _)| n == name) {
                return bad(format!("two rates are named {name:?}"));
            }
        }
        let (names, quotas): (Vec<_>, Vec<_>) = rates.into_iter().unzip();
        Ok(Config {
            names: names.into(),
            quotas: quotas.into(),
            cap,
        })
    }

    /// Writes the rates, the cap and a fresh state into a new file.
    fn init(&self, map: &Mapping) {
        // Relaxed: the magic's Release store publishes the new file (`file/make.rs`).
        let store = |at, value| map.word(at).store(value, Ordering::Relaxed);
        store(layout::BUDGET_CAP_AT, self.cap.map_or(0, u64::from));
        for (d, (name, quota)) in self.names.iter().zip(self.quotas.iter()).enumerate() {
            let mut bytes = [0u8; layout::MAX_DIMENSION_NAME_LEN];
            bytes[..name.len()].copy_from_slice(name.as_bytes());
            store(layout::budget_rate(d, 0), name.len() as u64);
            for (i, chunk) in bytes.chunks_exact(8).enumerate() {
                store(
                    layout::budget_rate(d, 1 + i),
                    u64::from_ne_bytes(chunk.try_into().expect("8 bytes")),
                );
            }
            store(layout::budget_rate(d, 5), quota.params().interval());
            store(layout::budget_rate(d, 6), u64::from(quota.params().burst()));
        }
        let params: Vec<Params> = self.quotas.iter().map(|q| *q.params()).collect();
        let region = Region {
            map,
            dims: self.names.len(),
        };
        region.init(&State::fresh(Ledger::with_capacity(
            &params,
            layout::BUDGET_LOG,
        )));
    }

    /// The rates and cap a file holds, or `None` where they are damaged.
    fn read(map: &Mapping, dims: usize) -> Option<Config> {
        let load = |at| map.word(at).load(Ordering::Relaxed);
        let cap = match load(layout::BUDGET_CAP_AT) {
            0 => None,
            c => Some(
                u32::try_from(c)
                    .ok()
                    .filter(|&c| c as usize <= MAX_WAITING)?,
            ),
        };
        let mut names = Vec::with_capacity(dims);
        let mut quotas = Vec::with_capacity(dims);
        for d in 0..dims {
            let len = usize::try_from(load(layout::budget_rate(d, 0)))
                .ok()
                .filter(|l| (1..=layout::MAX_DIMENSION_NAME_LEN).contains(l))?;
            let bytes: Vec<u8> = (1..5)
                .flat_map(|i| load(layout::budget_rate(d, i)).to_ne_bytes())
                .take(len)
                .collect();
            names.push(String::from_utf8(bytes).ok()?);
            let burst = u32::try_from(load(layout::budget_rate(d, 6))).ok()?;
            let params = Params::new(load(layout::budget_rate(d, 5)), burst)?;
            quotas.push(Quota::from_params(params));
        }
        Some(Config {
            names: names.into(),
            quotas: quotas.into(),
            cap,
        })
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rates: Vec<String> = self
            .names
            .iter()
            .zip(self.quotas.iter())
            .map(|(n, q)| {
                format!(
                    "{n}: 1 every {:?}, bursts of {}",
                    q.emission_interval(),
                    q.burst()
                )
            })
            .collect();
        write!(f, "[{}]", rates.join("; "))?;
        match self.cap {
            Some(cap) => write!(f, " with {cap} in flight"),
            None => f.write_str(" with no in-flight cap"),
        }
    }
}

impl Inner {
    fn region(&self) -> Region<'_> {
        Region {
            map: &self.map,
            dims: self.dims,
        }
    }

    /// Runs `f` on the state under this process's mutex and the file's lock, writing it
    /// back; advances the epoch when a caller left the record.
    fn with<R>(&self, f: impl FnOnce(&mut State, u64) -> R) -> Result<R, SharedError> {
        let _local = gate::lock(&self.local);
        let region = self.region();
        let mut left = false;
        let out = region.with(self.map.path(), |state| {
            let mut before: Vec<u64> = state.callers.iter().map(|c| c.ticket).collect();
            let now = self.clock.now();
            let out = f(state, now);
            before.sort_unstable();
            let mut after: Vec<u64> = state.callers.iter().map(|c| c.ticket).collect();
            after.sort_unstable();
            left = before.iter().any(|t| after.binary_search(t).is_err());
            (out, true)
        })?;
        if left {
            region.bump_epoch();
        }
        Ok(out)
    }

    fn cells(&self, costs: &[(&str, u32)]) -> Result<Box<[u32]>, BudgetError> {
        cells_for(&self.names, &self.quotas, costs)
    }

    /// A step for a caller asking `cells` with `deadline`, made by `f`.
    fn step(
        &self,
        cells: &[u32],
        deadline: Option<u64>,
        f: impl FnOnce(&mut State, &Ask<'_>) -> Result<Step, Refusal>,
    ) -> Result<Step, SharedBudgetError> {
        let me = process::identity();
        let cap = self.cap;
        let outcome = self.with(|state, now| {
            let ask = Ask {
                cells,
                cap,
                now,
                deadline,
                me,
            };
            f(state, &ask)
        })?;
        outcome.map_err(|refusal| match refusal {
            Refusal::Budget(e) => SharedBudgetError::Budget(e),
            Refusal::Full => SharedBudgetError::File(SharedError::TooManyCallers {
                path: self.map.path().to_owned(),
            }),
        })
    }

    /// Ends caller `ticket` of this process (module docs of `admit.rs`).
    fn end(
        &self,
        ticket: u64,
        charged: &[u32],
        actual: Option<&[Option<u32>]>,
    ) -> Result<(), SharedError> {
        self.with(|state, _| {
            state.end(ticket, charged, actual);
        })
    }
}

impl SharedBudget {
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
        let cells = self.inner.cells(costs)?;
        match self
            .inner
            .step(&cells, None, |state, ask| state.try_now(ask))?
        {
            Step::Booked { ticket, .. } => {
                Ok(SharedTurn::new(Arc::clone(&self.inner), ticket, cells))
            }
            Step::Waiting { .. } => unreachable!("try_now never waits"),
        }
    }

    /// A turn costing `costs` (`(dimension, cells)`; a dimension not named costs 1), in
    /// arrival order over every process: a permit first (with a cap), then the earliest
    /// instant every dimension admits it. Dropping the future before then gives its place
    /// and its booking back.
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
        SharedAcquire::new(Arc::clone(&self.inner), self.inner.cells(costs), None)
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
        let max = crate::wait::duration_nanos(max);
        SharedAcquire::new(Arc::clone(&self.inner), self.inner.cells(costs), Some(max))
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
        let d = index_of(&self.inner.names, dimension)?;
        let left = self
            .inner
            .with(|state, now| state.ledger.remaining(d, now))?;
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
        self.inner.with(|state, _| state.in_flight() as u32)
    }

    /// Callers over every process waiting for a permit or for their booked instant.
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
        self.inner.with(|state, now| state.waiting(now))
    }

    /// Dimension `dimension`'s quota.
    ///
    /// # Errors
    ///
    /// An unknown dimension.
    ///
    /// # Examples
    ///
    /// See [`SharedBudgetBuilder::options`].
    pub fn quota(&self, dimension: &str) -> Result<Quota, BudgetError> {
        index_of(&self.inner.names, dimension).map(|d| self.inner.quotas[d])
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
        self.inner
            .names
            .iter()
            .zip(self.inner.quotas.iter())
            .map(|(n, q)| (n.as_str(), *q))
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
        self.inner.cap
    }
}

impl fmt::Debug for SharedBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBudget")
            .field("path", &self.inner.map.path())
            .field("dimensions", &self.dimensions().collect::<Vec<_>>())
            .field("in_flight", &self.inner.cap)
            .finish_non_exhaustive()
    }
}

/// Settled cells for `costs`, for [`SharedTurn::settle`].
fn settled(inner: &Inner, costs: &[(&str, u32)]) -> Result<Box<[Option<u32>]>, BudgetError> {
    settled_for(&inner.names, costs)
}
