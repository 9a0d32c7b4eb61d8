//! [`RedisBudget`]: a [`Budget`](crate::budget::Budget) for every client of one Redis, the
//! decisions of [`budget::fleet`](crate::budget::fleet) driven over the `redis` crate.
//! The handle and its transactions live here, the turn in `turn.rs`, the errors in
//! `error.rs`.

mod builder;
mod error;
mod methods;
mod turn;

use core::fmt;
use core::time::Duration;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::conn::{within, Conn};
use super::policy::Failure;
use super::RedisDenied;
use crate::budget::fleet::{
    FleetError, FleetLook, FleetNext, FleetOp, FleetOutcome, FleetRules, FleetWait, RENEW_EVERY,
};
use crate::budget::{BudgetError, BuildError};
use crate::quota::Quota;
use crate::redis_scripts::{BUDGET_READ, BUDGET_WRITE};
use crate::upstream::DimensionSignal;

pub use builder::RedisBudgetBuilder;
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

from_variants!(RedisBudgetError {
    Foreign(FleetError),
    Budget(BudgetError),
    Build(BuildError),
});

impl fmt::Debug for RedisBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBudget")
            .field("name", &self.inner.name)
            .field("rules", &self.inner.rules)
            .finish_non_exhaustive()
    }
}
