//! [`RedisBudget`]: a [`Budget`](crate::budget::Budget) for every client of one Redis, the
//! decisions of [`budget::fleet`](crate::budget::fleet) driven over the `redis` crate.
//! The handle and its transactions live here, the turn in `turn.rs`, the errors in
//! `error.rs`.

mod error;
mod turn;

use core::fmt;
use core::time::Duration;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::conn::Conn;
use super::limiter::{within, CONNECT_TIMEOUT};
use super::policy::Failure;
use super::RedisDenied;
use crate::budget::fleet::{
    FleetError, FleetLook, FleetNext, FleetOp, FleetOutcome, FleetRules, FleetWait, RENEW_EVERY,
};
use crate::budget::{BudgetError, BuildError};
use crate::quota::Quota;
use crate::redis_scripts::{BUDGET_READ, BUDGET_WRITE};
use crate::upstream::DimensionSignal;

pub use error::{RedisBudgetError, RedisSettleError};
pub use turn::RedisTurn;

/// How long an end waits between its tries while Redis cannot answer, at first and at
/// most.
const END_RETRY: Duration = Duration::from_millis(200);
const END_RETRY_MAX: Duration = Duration::from_secs(2);

/// Writes refused because another client wrote first, in a row, before a call gives up
/// with [`RedisBudgetError::Contended`].
const MAX_CONFLICTS: u32 = 200;

/// Several rates and an in-flight cap shared by every client of one Redis that names the
/// same budget: the promises of [`Budget`](crate::budget::Budget), across a fleet.
///
/// * **One turn across every dimension, FIFO, never partial.** Callers of every client
///   wait in one queue in Redis, in arrival order; the first is admitted when every
///   dimension admits it and a permit is free, and only then is it charged, in every
///   dimension at once. A caller dropped before its turn has spent nothing.
/// * **In flight.** The cap holds over every client. A permit returns when its turn is
///   settled or dropped (also on a panic or a cancellation), and when its client is gone:
///   a client renews a lease while it holds turns, and one whose lease lapses
///   ([`LEASE`](crate::budget::fleet::LEASE), killed or cut off from Redis) has its turns
///   ended at their estimates.
/// * **Settled after the call** ([`RedisTurn::settle`]): a refund gives back only what no
///   later admission relied on, a charge delays those behind.
///
/// Decisions are made at the Redis server's clock. Each call reads the budget's value and
/// writes it back only where no other client wrote in between (a compare-and-set by
/// script), so every call is two round trips; a waiter reads two counters between its
/// asks. When Redis cannot answer within the timeout (default 250 ms) a call fails with
/// [`RedisBudgetError::Unavailable`], changing nothing: a budget fails closed. A Redis
/// restart loses the budget: it starts whole again, and the turns in flight before end
/// without a trace.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use paceline::redis::RedisBudget;
/// use paceline::Quota;
///
/// // Every worker of the fleet builds the same budget.
/// let budget = RedisBudget::builder()
///     .rate("requests", Quota::per_minute(500))
///     .rate("tokens", Quota::per_minute(200_000))
///     .in_flight(8)
///     .connect("redis://127.0.0.1/", "model-api")
///     .await?;
/// let turn = budget.acquire(&[("tokens", 1_200)]).await?;
/// // ... the call; its response says it used 900 tokens ...
/// turn.settle(&[("tokens", 900)]).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBudget {
    inner: Arc<Inner>,
}

/// What the clones of a [`RedisBudget`] share.
struct Inner {
    conn: Conn,
    rules: FleetRules,
    read: redis::Script,
    write: redis::Script,
    /// The budget's value and its epochs.
    keys: [String; 2],
    name: String,
    /// This client's owner id (`budget::fleet`, "Owners and leases").
    me: u64,
    timeout: Duration,
    /// Callers of this client on record (waiters and turns): it renews its lease while
    /// there are any.
    held: AtomicUsize,
    /// Whether a renewing task runs.
    renewing: AtomicBool,
    /// The driver's clock for waiters' cadence.
    origin: Instant,
    /// This client's transactions, one at a time: they would only overtake each other's
    /// writes (a hundred tasks arriving at once would each read and write up to a
    /// hundred times).
    turns: tokio::sync::Mutex<()>,
    /// Where the transactions that are not urgent queue first, so that an urgent one
    /// (the head's ask, an end) waits behind at most one of them (`transact`).
    queue: tokio::sync::Mutex<()>,
    /// The latest epochs read and when: the waiters of this client share reads made
    /// within [`EPOCHS_FRESH`] of each other.
    epochs: std::sync::Mutex<Option<(Instant, (u64, u64))>>,
}

/// How long an epochs' read serves this client's other waiters: a client with hundreds
/// of waiters reads them about every half millisecond at most, not once per waiter.
const EPOCHS_FRESH: Duration = Duration::from_micros(500);

/// Builds a [`RedisBudget`]: its rates, by name, and its in-flight cap.
///
/// # Examples
///
/// See [`RedisBudget`].
#[derive(Debug)]
pub struct RedisBudgetBuilder {
    rates: Vec<(String, Quota)>,
    in_flight: Option<u32>,
    prefix: String,
    timeout: Duration,
}

impl RedisBudget {
    /// A builder.
    ///
    /// # Examples
    ///
    /// See [`RedisBudget`].
    pub fn builder() -> RedisBudgetBuilder {
        RedisBudgetBuilder {
            rates: Vec::new(),
            in_flight: None,
            prefix: "paceline".into(),
            timeout: Duration::from_millis(250),
        }
    }
}

impl RedisBudgetBuilder {
    /// Adds a dimension: `quota` of `name`.
    ///
    /// # Examples
    ///
    /// See [`RedisBudget`].
    pub fn rate(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.rates.push((name.into(), quota));
        self
    }

    /// Caps the calls in flight over every client (at most
    /// [`MAX_CALLERS`](crate::budget::fleet::MAX_CALLERS)).
    ///
    /// # Examples
    ///
    /// See [`RedisBudget`].
    pub fn in_flight(mut self, cap: u32) -> Self {
        self.in_flight = Some(cap);
        self
    }

    /// The prefix of the budget's Redis keys (default `paceline`): `<prefix>:{<name>}:budget`
    /// and `<prefix>:{<name>}:epochs`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # use paceline::{redis::RedisBudget, Quota};
    /// let budget = RedisBudget::builder()
    ///     .rate("requests", Quota::per_minute(60))
    ///     .prefix("billing")
    ///     .connect("redis://127.0.0.1/", "partner")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one round trip may take before the call fails with
    /// [`RedisBudgetError::Unavailable`] (default 250 ms).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # use paceline::{redis::RedisBudget, Quota};
    /// let budget = RedisBudget::builder()
    ///     .rate("requests", Quota::per_minute(60))
    ///     .timeout(std::time::Duration::from_millis(100))
    ///     .connect("redis://127.0.0.1/", "partner")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Connects to `url` and builds the budget named `name` there. The connection
    /// reconnects in the background after failures.
    ///
    /// # Errors
    ///
    /// [`RedisBudgetError::Build`] for rates no budget takes (see
    /// [`FleetRules::new`](crate::budget::fleet::FleetRules::new)) or an empty name;
    /// [`RedisBudgetError::Connect`] for a bad URL or a server that does not answer as
    /// Redis or does not run scripts.
    ///
    /// # Examples
    ///
    /// See [`RedisBudget`].
    pub async fn connect(self, url: &str, name: &str) -> Result<RedisBudget, RedisBudgetError> {
        let rules = FleetRules::new(self.rates, self.in_flight)?;
        if name.is_empty() || name.len() > super::MAX_KEY_LEN {
            return Err(RedisBudgetError::Build(BuildError::EmptyName));
        }
        let conn = super::conn::node(url)
            .await
            .map_err(RedisBudgetError::Connect)?;
        let mut probe = conn.clone();
        let load = async {
            for script in [BUDGET_READ, BUDGET_WRITE] {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script)
                    .query_async::<redis::Value>(&mut probe)
                    .await?;
            }
            Ok(())
        };
        within(CONNECT_TIMEOUT, load)
            .await
            .map_err(RedisBudgetError::Connect)?;
        let base = format!("{}:{{{name}}}", self.prefix);
        Ok(RedisBudget {
            inner: Arc::new(Inner {
                conn,
                rules,
                read: redis::Script::new(BUDGET_READ),
                write: redis::Script::new(BUDGET_WRITE),
                keys: [format!("{base}:budget"), format!("{base}:epochs")],
                name: name.into(),
                me: crate::budget::fleet::new_owner(),
                timeout: self.timeout,
                held: AtomicUsize::new(0),
                renewing: AtomicBool::new(false),
                origin: Instant::now(),
                epochs: std::sync::Mutex::new(None),
                turns: tokio::sync::Mutex::new(()),
                queue: tokio::sync::Mutex::new(()),
            }),
        })
    }
}

/// An answer read with the value: the value, the server's time and the epochs.
struct Read {
    value: Vec<u8>,
    now: u64,
    epochs: (u64, u64),
    /// This client's clock when the answer came (the server read its time half a round
    /// trip before, at most): a waiter's instants are reckoned from it.
    local: u64,
}

impl Inner {
    /// Nanoseconds on this client's clock.
    fn local(&self) -> u64 {
        crate::wait::duration_nanos(self.origin.elapsed())
    }

    fn failed(e: redis::RedisError) -> RedisBudgetError {
        match Failure::of(e) {
            Failure::Unreachable(e) => RedisBudgetError::Unavailable(e),
            Failure::Answered(RedisDenied::OutOfMemory(e) | RedisDenied::Rejected(e)) => {
                RedisBudgetError::Rejected(e)
            }
            Failure::Answered(other) => RedisBudgetError::Rejected(redis::RedisError::from((
                redis::ErrorKind::Client,
                "refused",
                other.to_string(),
            ))),
        }
    }

    async fn read(&self) -> Result<Read, RedisBudgetError> {
        let mut conn = self.conn.clone();
        let mut script = self.read.key(&self.keys[0]);
        script.key(&self.keys[1]);
        let call = script.invoke_async::<(Vec<u8>, u64, u64, u64, u64)>(&mut conn);
        let (value, secs, micros, head, queue) =
            within(self.timeout, call).await.map_err(Inner::failed)?;
        let now = secs
            .saturating_mul(1_000_000_000)
            .saturating_add(micros.saturating_mul(1_000));
        Ok(Read {
            value,
            now,
            epochs: (head, queue),
            local: self.local(),
        })
    }

    async fn epochs(&self) -> Result<(u64, u64), RedisBudgetError> {
        let fresh = *self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, epochs)) = fresh.filter(|(at, _)| at.elapsed() < EPOCHS_FRESH) {
            return Ok(epochs);
        }
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&self.keys[1]).arg("head").arg("queue");
        let call = cmd.query_async::<(Option<u64>, Option<u64>)>(&mut conn);
        let (head, queue) = within(self.timeout, call).await.map_err(Inner::failed)?;
        let epochs = (head.unwrap_or(0), queue.unwrap_or(0));
        *self.epochs.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), epochs));
        Ok(epochs)
    }

    /// Decides the operation `op` makes at the time read, writing the value where the
    /// decision changes it; again from the read where another client wrote first.
    /// `seen` is told the outcome before its write is sent (a caller dropped while the
    /// write is under way then knows what to give back).
    async fn transact<'a>(
        &self,
        urgent: bool,
        mut op: impl FnMut(u64) -> FleetOp<'a>,
        mut seen: impl FnMut(&FleetOutcome),
    ) -> Result<(FleetOutcome, Read), RedisBudgetError> {
        let _queued = match urgent {
            true => None,
            false => Some(self.queue.lock().await),
        };
        let _turn = self.turns.lock().await;
        for conflict in 0..MAX_CONFLICTS {
            let read = self.read().await?;
            let stored = (!read.value.is_empty()).then_some(&read.value[..]);
            let decision = self.rules.decide(stored, read.now, self.me, op(read.now))?;
            let Some(write) = decision.write else {
                return Ok((decision.outcome, read));
            };
            seen(&decision.outcome);
            let mut conn = self.conn.clone();
            let mut script = self.write.key(&self.keys[0]);
            script
                .key(&self.keys[1])
                .arg(write.expect)
                .arg(&write.value[..])
                .arg(write.ttl_ms)
                .arg(write.head)
                .arg(write.queue);
            let call = script.invoke_async::<u8>(&mut conn);
            if within(self.timeout, call).await.map_err(Inner::failed)? == 1 {
                return Ok((decision.outcome, read));
            }
            if conflict >= 8 {
                // Many clients at once: let the others through.
                tokio::time::sleep(Duration::from_micros(100 * u64::from(conflict % 8 + 1))).await;
            }
        }
        Err(RedisBudgetError::Contended)
    }

    /// Ends caller `ticket` of this client.
    async fn end(
        &self,
        ticket: u64,
        charged: &[u32],
        actual: Option<&[Option<u32>]>,
    ) -> Result<(), RedisBudgetError> {
        let op = |_| FleetOp::End {
            ticket,
            charged,
            actual,
        };
        self.transact(true, op, |_| {}).await.map(drop)
    }

    /// Ends caller `ticket` in the background (a dropped turn or waiter), trying again
    /// until Redis takes it or refuses it: while this client holds other callers its
    /// lease stays renewed, so an end given up would keep a permit for as long as it
    /// runs. Without a runtime to run on, its lease ends it once this client holds
    /// nothing more.
    fn end_later(self: &Arc<Inner>, ticket: u64, charged: Box<[u32]>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.release();
            return;
        };
        let inner = Arc::clone(self);
        runtime.spawn(async move {
            let mut pause = END_RETRY;
            loop {
                match inner.end(ticket, &charged, None).await {
                    Ok(()) | Err(RedisBudgetError::Rejected(_) | RedisBudgetError::Foreign(_)) => {
                        break
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(END_RETRY_MAX);
                    }
                }
            }
            inner.release();
        });
    }

    /// One more caller of this client on record: renew its lease while there are any.
    fn hold(self: &Arc<Inner>) {
        // Relaxed: a count; the renewing task reads it each round.
        self.held.fetch_add(1, Ordering::Relaxed);
        if self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.renewing.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(RENEW_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.held.load(Ordering::Relaxed) == 0 {
                    inner.renewing.store(false, Ordering::Release);
                    // A caller that came meanwhile found it still running: renew for it.
                    if inner.held.load(Ordering::Relaxed) == 0
                        || inner.renewing.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                }
                // A failure is tried again next round; the lease outlasts three.
                let _ = inner.transact(false, |_| FleetOp::Renew, |_| {}).await;
            }
        });
    }

    /// A caller of this client left the record.
    fn release(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

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

impl From<FleetError> for RedisBudgetError {
    fn from(e: FleetError) -> RedisBudgetError {
        RedisBudgetError::Foreign(e)
    }
}

impl From<BudgetError> for RedisBudgetError {
    fn from(e: BudgetError) -> RedisBudgetError {
        RedisBudgetError::Budget(e)
    }
}

impl From<BuildError> for RedisBudgetError {
    fn from(e: BuildError) -> RedisBudgetError {
        RedisBudgetError::Build(e)
    }
}

impl fmt::Debug for RedisBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBudget")
            .field("name", &self.inner.name)
            .field("rules", &self.inner.rules)
            .finish_non_exhaustive()
    }
}
