//! A budget whose state is one value in Redis, decided by its clients: the decisions and
//! the waiters' cadence without a Redis client (cargo feature `redis-scripts`), so that
//! every client of one budget makes the same decisions. paceline's
//! [`redis::RedisBudget`](crate::redis) drives them over the `redis` crate; paceline's
//! Python package, over redis-py.
//!
//! A driver reads the value, the server's time and the two epochs with
//! [`BUDGET_READ`](crate::redis_scripts::BUDGET_READ), asks [`FleetRules::decide`] what
//! an operation comes to at that time, and, when the decision changes the value, writes
//! it with [`BUDGET_WRITE`](crate::redis_scripts::BUDGET_WRITE), which refuses (answers
//! 0) if another client wrote first: the driver then reads again and decides again. A
//! waiter between its asks follows [`FleetWait`].
//!
//! ```
//! use paceline::budget::fleet::{FleetOp, FleetOutcome, FleetRules};
//! use paceline::Quota;
//!
//! let rules = FleetRules::new(
//!     [("requests", Quota::per_minute(500)), ("tokens", Quota::per_minute(200_000))],
//!     Some(8),
//! )?;
//! let me = paceline::budget::fleet::new_owner();
//! let cells = rules.cells(&[("tokens", 1_200)])?;
//! // No value at the key yet: a fresh budget, at the server's time (ns since 1970).
//! let now = 1_800_000_000_000_000_000;
//! let decision = rules.decide(None, now, me, FleetOp::Arrive { cells: &cells, deadline: None })?;
//! assert!(matches!(decision.outcome, FleetOutcome::Admitted { .. }));
//! let write = decision.write.expect("an admission changes the value");
//! assert_eq!(write.expect, 0); // written only where no value is yet
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Implementation notes
//!
//! **The same queue as a shared file's** (`budget/queue`): one FIFO of callers over
//! every client, whose head is admitted when every dimension and the in-flight cap admit
//! it, and only then charged, in every dimension at once; settles replay the ledger's log
//! exactly. Instants are the Redis server's `TIME` in nanoseconds: one clock for the
//! fleet.
//!
//! **Owners and leases.** Each client is an owner with a random id. A decision made by
//! an owner renews its lease (to [`LEASE`] from now, when less than two thirds of it is
//! left); a client holding turns renews it every [`RENEW_EVERY`] ([`FleetOp::Renew`]).
//! An owner whose lease has lapsed is gone: its waiters lose their places and its turns
//! return their permits, keeping their estimates charged (spent is spent). So a client
//! killed with turns in flight holds their permits at most [`LEASE`]; one cut off from
//! Redis for longer loses them while its calls may still run (the cap then holds over
//! the clients that can reach Redis).
//!
//! **Rules.** The rates are kept sorted by name, so clients that list the same rates in
//! another order share one budget. A value written under other rules (other rates, another
//! cap) is refused with [`FleetError::Mismatch`], never overwritten; so is a value this
//! format does not describe ([`FleetError::Corrupt`]).
//!
//! **A budget lost** (a Redis restart, a `FLUSHALL`, the keys deleted) is made again
//! whole at the next call. Turns of the lost budget still running are not counted by the
//! new one (for as long as they run, up to the cap more may be in flight), and their ends
//! end nothing in it: its tickets start at a random number.
//!
//! **Expiry.** The value expires once every dimension is whole again and a lease has run
//! out with no owner renewing it: an idle budget leaves nothing behind, and a budget
//! reborn then starts whole, as the expired one would have been.

mod codec;
mod ops;
mod wait;

use core::fmt;
use core::time::Duration;

use super::queue::{Ask, Refusal, State, Step};
use super::{cells_for, index_of, settled_for, steer, BudgetError, BuildError, Ledger, Ready};
use crate::quota::Quota;
use codec::Stored;

pub use ops::{FleetDecision, FleetError, FleetOp, FleetOutcome, FleetWrite};
pub use wait::{FleetLook, FleetNext, FleetWait};

/// How long an owner's lease runs from its last renewal (module docs).
///
/// # Examples
///
/// ```
/// use paceline::budget::fleet::{LEASE, RENEW_EVERY};
/// assert!(RENEW_EVERY * 3 < LEASE);
/// ```
pub const LEASE: Duration = Duration::from_secs(10);

/// How often a client holding turns renews its lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(2);

/// The most callers (turns in flight and waiters) one fleet budget records at once.
pub const MAX_CALLERS: usize = 1024;

/// The most entries of a fleet budget's settle log (see
/// [`LOG_CAPACITY`](crate::budget::LOG_CAPACITY)).
pub const FLEET_LOG: usize = 512;

/// The rates and the in-flight cap every client of one fleet budget builds the same, and
/// the decisions made with them.
#[derive(Clone)]
pub struct FleetRules {
    names: Box<[String]>,
    quotas: Box<[Quota]>,
    cap: Option<u32>,
    fingerprint: u64,
}

/// A random owner id for a client (module docs): never 0.
///
/// # Examples
///
/// ```
/// assert_ne!(paceline::budget::fleet::new_owner(), 0);
/// ```
pub fn new_owner() -> u64 {
    use core::hash::BuildHasher;
    let id = std::hash::RandomState::new().hash_one(std::time::Instant::now());
    id.max(1)
}

/// FNV-1a over `bytes`, continuing from `hash`: a fingerprint every client computes the
/// same (no per-process seed).
fn fnv(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl FleetRules {
    /// The rules for `rates` (`(name, quota)`) and an optional in-flight cap (at most
    /// [`MAX_CALLERS`]).
    ///
    /// # Errors
    ///
    /// As [`BudgetBuilder::build`](crate::budget::BudgetBuilder::build); a cap above
    /// [`MAX_CALLERS`] is [`BuildError::CapTooHigh`].
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub fn new<N: Into<String>>(
        rates: impl IntoIterator<Item = (N, Quota)>,
        cap: Option<u32>,
    ) -> Result<FleetRules, BuildError> {
        let mut rates: Vec<(String, Quota)> =
            rates.into_iter().map(|(n, q)| (n.into(), q)).collect();
        if rates.is_empty() && cap.is_none() {
            return Err(BuildError::Empty);
        }
        if cap == Some(0) {
            return Err(BuildError::ZeroInFlight);
        }
        if cap.is_some_and(|c| c as usize > MAX_CALLERS) {
            return Err(BuildError::CapTooHigh { most: MAX_CALLERS });
        }
        if rates.iter().any(|(n, _)| n.is_empty()) {
            return Err(BuildError::EmptyName);
        }
        rates.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = rates.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(BuildError::RepeatedDimension {
                name: w[0].0.clone(),
            });
        }
        let mut fingerprint = fnv(
            0xcbf2_9ce4_8422_2325,
            &u64::from(cap.unwrap_or(0)).to_le_bytes(),
        );
        for (name, quota) in &rates {
            let p = quota.params();
            fingerprint = fnv(fingerprint, &(name.len() as u64).to_le_bytes());
            fingerprint = fnv(fingerprint, name.as_bytes());
            fingerprint = fnv(fingerprint, &p.interval().to_le_bytes());
            fingerprint = fnv(fingerprint, &p.tau().to_le_bytes());
        }
        let (names, quotas): (Vec<_>, Vec<_>) = rates.into_iter().unzip();
        Ok(FleetRules {
            names: names.into(),
            quotas: quotas.into(),
            cap,
            fingerprint,
        })
    }

    /// Each dimension's cells for `costs` (`(dimension, cells)`; 1 where not named).
    ///
    /// # Errors
    ///
    /// An unknown dimension, one named twice, a cost over its burst.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub fn cells(&self, costs: &[(&str, u32)]) -> Result<Box<[u32]>, BudgetError> {
        cells_for(&self.names, &self.quotas, costs)
    }

    /// Each dimension's settled cells for `costs` (`None` where not named).
    ///
    /// # Errors
    ///
    /// An unknown dimension, one named twice.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{budget::fleet::FleetRules, Quota};
    /// let rules = FleetRules::new([("tokens", Quota::per_minute(1_000))], None)?;
    /// assert_eq!(&*rules.settled(&[("tokens", 80)])?, &[Some(80)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settled(&self, costs: &[(&str, u32)]) -> Result<Box<[Option<u32>]>, BudgetError> {
        settled_for(&self.names, costs)
    }

    /// The dimensions, sorted by name, with their quotas.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{budget::fleet::FleetRules, Quota};
    /// let rules = FleetRules::new(
    ///     [("tokens", Quota::per_minute(1_000)), ("requests", Quota::per_minute(10))],
    ///     None,
    /// )?;
    /// let names: Vec<_> = rules.dimensions().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["requests", "tokens"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dimensions(&self) -> impl Iterator<Item = (&str, Quota)> + '_ {
        self.names
            .iter()
            .zip(self.quotas.iter())
            .map(|(n, q)| (n.as_str(), *q))
    }

    /// Dimension `name`'s index in [`FleetRules::dimensions`].
    ///
    /// # Errors
    ///
    /// [`BudgetError::UnknownDimension`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{budget::fleet::FleetRules, Quota};
    /// let rules = FleetRules::new([("tokens", Quota::per_minute(1_000))], None)?;
    /// assert_eq!(rules.index("tokens")?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn index(&self, name: &str) -> Result<usize, BudgetError> {
        index_of(&self.names, name)
    }

    /// The in-flight cap.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{budget::fleet::FleetRules, Quota};
    /// assert_eq!(FleetRules::new(Vec::<(String, Quota)>::new(), Some(4))?.cap(), Some(4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cap(&self) -> Option<u32> {
        self.cap
    }

    /// A fresh state: every dimension whole, no one on record. Its tickets start at a
    /// random number: a budget lost and made again (a Redis restart, a `FLUSHALL`) never
    /// gives a caller a ticket that a turn of the lost one still holds, whose end would
    /// then end the new caller's turn.
    fn fresh(&self) -> Stored {
        let params: Vec<_> = self.quotas.iter().map(|q| *q.params()).collect();
        let mut state = State::fresh(Ledger::with_capacity(&params, FLEET_LOG), MAX_CALLERS);
        state.next_ticket = new_owner() >> 2;
        Stored {
            fingerprint: self.fingerprint,
            state,
            leases: Vec::new(),
        }
    }

    /// What `op` by owner `me` comes to at server time `now` (nanoseconds since 1970) on
    /// the value `stored` (`None`: no value at the key), and the write it needs.
    ///
    /// # Errors
    ///
    /// [`FleetError`]: a value that is not this budget's. Nothing is to be written.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub fn decide(
        &self,
        stored: Option<&[u8]>,
        now: u64,
        me: u64,
        op: FleetOp<'_>,
    ) -> Result<FleetDecision, FleetError> {
        let dims = self.names.len();
        let (generation, mut s) = match stored {
            None => (0, self.fresh()),
            Some(value) => {
                let (generation, s) = codec::decode(value, dims, MAX_CALLERS, FLEET_LOG)
                    .ok_or(FleetError::Corrupt)?;
                if s.fingerprint != self.fingerprint {
                    return Err(FleetError::Mismatch);
                }
                (generation, s)
            }
        };
        let before = s.state.roll();
        let body_before = codec::encode(0, &s);
        let leases = s.leases.clone();
        let alive = move |owner: u64| {
            owner == me || leases.iter().any(|&(o, until)| o == owner && until > now)
        };
        let (outcome, steered) = self.apply(&mut s.state, now, me, &alive, op);
        // Leases: the owner's renewed when a third of it has passed (or it holds nothing
        // yet), the others' kept while they have callers and have not lapsed; in place,
        // so that a decision that changes nothing writes nothing.
        let lease = LEASE.as_nanos() as u64;
        let holds = |s: &State, o: u64| s.callers.iter().any(|c| c.owner == o);
        let mine = holds(&s.state, me);
        let state = &s.state;
        s.leases
            .retain(|&(o, until)| holds(state, o) && (o == me || until > now));
        match s.leases.iter_mut().find(|(o, _)| *o == me) {
            Some((_, until)) if until.saturating_sub(now) <= lease * 2 / 3 => {
                *until = now.saturating_add(lease);
            }
            Some(_) => {}
            None if mine => s.leases.push((me, now.saturating_add(lease))),
            None => {}
        }
        let body_after = codec::encode(0, &s);
        let write = (body_after != body_before).then(|| {
            let (head, queue) = s.state.departures(&before);
            FleetWrite {
                expect: generation,
                value: codec::encode(generation.wrapping_add(1).max(1), &s),
                ttl_ms: ttl_ms(&s, now),
                head: head + u64::from(steered),
                queue,
            }
        });
        Ok(FleetDecision { outcome, write })
    }

    /// `op` on `state` (the queue's decisions, `budget/queue`); whether it steered the
    /// rates or holds (which moves the head's epoch).
    fn apply(
        &self,
        state: &mut State,
        now: u64,
        me: u64,
        alive: &dyn Fn(u64) -> bool,
        op: FleetOp<'_>,
    ) -> (FleetOutcome, bool) {
        let ask = |cells, deadline| Ask {
            cells,
            cap: self.cap,
            now,
            deadline,
            me,
            alive,
        };
        let step = |r: Result<Step, Refusal>| match r {
            Ok(Step::Admitted { ticket }) => FleetOutcome::Admitted { ticket },
            Ok(Step::Waiting { ticket, ahead, at }) => FleetOutcome::Waiting { ticket, ahead, at },
            Err(Refusal::Budget(e)) => FleetOutcome::Refused(e),
            Err(Refusal::Full) => FleetOutcome::Full,
        };
        let outcome = match op {
            FleetOp::Arrive { cells, deadline } => step(state.arrive(&ask(cells, deadline))),
            FleetOp::AskAgain {
                ticket,
                cells,
                deadline,
            } => step(state.ask_again(ticket, &ask(cells, deadline))),
            FleetOp::TryNow { cells } => step(state.try_now(&ask(cells, None))),
            FleetOp::End {
                ticket,
                charged,
                actual,
            } => {
                // Only its own: a ticket whose arrival was never written may be another
                // owner's caller now.
                let mine = state
                    .callers
                    .iter()
                    .any(|c| c.ticket == ticket && c.owner == me);
                FleetOutcome::Ended(mine && state.end(ticket, charged, actual))
            }
            FleetOp::Renew => FleetOutcome::Renewed,
            FleetOp::Look => {
                state.reap(now, me, alive);
                FleetOutcome::Looked {
                    in_flight: state.in_flight() as u32,
                    waiting: state.waiting(),
                    remaining: (0..self.names.len())
                        .map(|d| u32::try_from(state.ledger.remaining(d, now)).unwrap_or(u32::MAX))
                        .collect(),
                }
            }
            FleetOp::WaitTime { cells } => {
                FleetOutcome::WaitTime(match state.ledger.ready(cells, now) {
                    Ready::Now => Duration::ZERO,
                    Ready::At(at) => Duration::from_nanos(at - now),
                    Ready::Never => Duration::MAX,
                })
            }
            FleetOp::Follow { signal, max_hold } => {
                let rules = (&self.names[..], &self.quotas[..]);
                let reported = steer(&mut state.ledger, rules, signal, max_hold, now).0;
                return (FleetOutcome::Followed(reported), true);
            }
            FleetOp::Hold { duration } => {
                let d = crate::wait::duration_nanos(duration);
                state.ledger.hold(now.saturating_add(d));
                return (FleetOutcome::Held, true);
            }
        };
        (outcome, false)
    }
}

/// The value's time to live: until every dimension is whole again and the hold has
/// passed, plus a lease (so that no owner's record outlives it), in whole milliseconds.
fn ttl_ms(s: &Stored, now: u64) -> u64 {
    let whole = s.state.ledger.whole_at().saturating_sub(now);
    let lasts = whole.saturating_add(LEASE.as_nanos() as u64);
    lasts.div_ceil(1_000_000).max(1)
}

impl fmt::Debug for FleetRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetRules")
            .field("dimensions", &self.dimensions().collect::<Vec<_>>())
            .field("in_flight", &self.cap)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
