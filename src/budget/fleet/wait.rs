//! When a fleet budget's waiter asks again: the cadence of a shared file's waiters
//! (`shared/budget/waiting.rs`), with the epochs read from Redis.
//!
//! # Implementation notes
//!
//! Asking again reads and may write the whole value, so a waiter asks only when it may
//! help, reading the two epochs (one small read) in between:
//!
//! * at the instant its turn would come as things stand (the head's rates' instant;
//!   behind it, the instant if those ahead went as early as the rates allow);
//! * behind the head, `p` places back: once the queue's epoch has moved `p`, reading it
//!   every [`BASE`] by the next in line and every `d` × [`BASE`] further back, `d` the
//!   departures still to come before its own turn (at least every [`MAX_CHECK`]);
//! * the head and the first [`HEAD_WATCHERS`] behind it: whenever the head's epoch moves
//!   (a permit returned, a settle, the rates steered);
//! * anyone: at its deadline, and every [`REFRESH`] (up to four, far back) to show it is
//!   still there (a waiter silent for ten seconds loses its place); the head and the
//!   waiter behind it every [`ASK_FRONT`], since what holds them up may belong to a
//!   client whose lease has lapsed.
//!
//! Instants of the budget are the server's; the cadence runs on the driver's own
//! monotonic clock (`local`, nanoseconds from any origin), each server instant taken as
//! the same distance from the moment its answer was read.

use core::time::Duration;

use super::{FleetOp, FleetOutcome};

/// How often the head and the next in line read the epochs: a Redis round trip is tens of
/// microseconds on a LAN, so a millisecond keeps the head's place filled without loading
/// the server.
const BASE: u64 = 1_000_000;

/// How often a waiter near the front shows it is still there (one further back, every
/// two; one more than a hundred places back, every four).
const REFRESH: Duration = Duration::from_secs(1);

/// The waiters nearest the front watch the head's epoch too.
const HEAD_WATCHERS: usize = 4;

/// The longest a waiter goes without reading the epochs.
const MAX_CHECK: Duration = Duration::from_secs(1);

/// How often the head and the waiter behind it ask whatever the epochs say.
const ASK_FRONT: Duration = Duration::from_millis(50);

/// One waiter's way to its turn over a fleet budget (module docs): what to ask, and when
/// to ask again. Sans I/O: the driver reads and writes Redis and sleeps.
///
/// # Examples
///
/// ```
/// use paceline::budget::fleet::{FleetLook, FleetNext, FleetOp, FleetRules, FleetWait};
/// use paceline::Quota;
///
/// let rules = FleetRules::new([("requests", Quota::per_second(10))], None)?;
/// let cells = rules.cells(&[])?;
/// let me = paceline::budget::fleet::new_owner();
/// let mut wait = FleetWait::new(None);
/// let now = 1_800_000_000_000_000_000; // the server's time, read with the value
/// let decision = rules.decide(None, now, me, wait.op(&cells, now))?;
/// // (the driver writes `decision.write` here)
/// let next = wait.answer(decision.outcome, (0, 0), now, 0);
/// assert!(matches!(next, FleetNext::Admitted { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct FleetWait {
    max: Option<u64>,
    /// The deadline in server time, set at the first ask.
    deadline: Option<u64>,
    /// The ticket, once on record.
    ticket: Option<u64>,
    /// Waiters ahead of it at its last answer.
    ahead: Option<usize>,
    plan: Option<Plan>,
}

/// What the waiter knows since it last asked (local instants).
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Ask again once the queue's epoch reaches this (a waiter behind the head).
    queue: Option<u64>,
    /// Ask again once the head's epoch moves from this.
    head: Option<u64>,
    /// Ask again at this instant (its turn's, as things stand).
    at: Option<u64>,
    deadline: Option<u64>,
    /// Read the epochs next at this instant, and then every `every`.
    check: u64,
    every: u64,
    /// Ask again at this instant whatever the epochs say.
    refresh: u64,
}

/// What an answer leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetNext {
    /// The turn: its ticket.
    Admitted {
        /// To end it with.
        ticket: u64,
    },
    /// No turn: the outcome says why ([`FleetOutcome::Refused`], [`FleetOutcome::Full`]).
    Failed(FleetOutcome),
    /// In the queue: [`FleetWait::look`] says when to ask again.
    Waiting,
}

/// When to ask again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetLook {
    /// Now.
    Ask,
    /// Read the epochs again after this long, and look again.
    Sleep(Duration),
}

impl FleetWait {
    /// A wait that accepts at most `max` (`None`: any wait).
    ///
    /// # Examples
    ///
    /// See [`FleetWait`].
    pub fn new(max: Option<Duration>) -> FleetWait {
        FleetWait {
            max: max.map(crate::wait::duration_nanos),
            deadline: None,
            ticket: None,
            ahead: None,
            plan: None,
        }
    }

    /// Whether its next ask is urgent: it was the head or the next in line at its last
    /// answer, so the queue waits for it. A driver that makes its client's asks one at a
    /// time lets these go first (arrivals and refreshes of waiters further back can
    /// wait).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::fleet::{FleetOutcome, FleetWait};
    /// let mut wait = FleetWait::new(None);
    /// assert!(!wait.urgent()); // an arrival
    /// wait.answer(FleetOutcome::Waiting { ticket: 3, ahead: 1, at: None }, (0, 0), 0, 0);
    /// assert!(wait.urgent());
    /// ```
    pub fn urgent(&self) -> bool {
        self.ahead.is_some_and(|a| a <= 1)
    }

    /// The operation to decide at server time `now`: arriving, or asking again.
    ///
    /// # Examples
    ///
    /// See [`FleetWait`].
    pub fn op<'a>(&mut self, cells: &'a [u32], now: u64) -> FleetOp<'a> {
        let deadline = *self
            .deadline
            .get_or_insert_with(|| self.max.map_or(u64::MAX, |m| now.saturating_add(m)));
        let deadline = (deadline != u64::MAX).then_some(deadline);
        match self.ticket {
            None => FleetOp::Arrive { cells, deadline },
            Some(ticket) => FleetOp::AskAgain {
                ticket,
                cells,
                deadline,
            },
        }
    }

    /// The caller's ticket while it is on record (to leave the queue with, or to end an
    /// admission never handed over).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(paceline::budget::fleet::FleetWait::new(None).ticket(), None);
    /// ```
    pub fn ticket(&self) -> Option<u64> {
        self.ticket
    }

    /// Takes the outcome of [`FleetWait::op`]'s decision, written (if it needed a write),
    /// with the epochs read beside the value, the server time `now` it was decided at and
    /// the driver's clock `local` when it was read.
    ///
    /// # Examples
    ///
    /// See [`FleetWait`].
    pub fn answer(
        &mut self,
        outcome: FleetOutcome,
        (head, queue): (u64, u64),
        now: u64,
        local: u64,
    ) -> FleetNext {
        let (ticket, ahead, at) = match outcome {
            FleetOutcome::Admitted { ticket } => {
                self.ticket = None;
                return FleetNext::Admitted { ticket };
            }
            FleetOutcome::Waiting { ticket, ahead, at } => (ticket, ahead, at),
            other => {
                self.ticket = None;
                return FleetNext::Failed(other);
            }
        };
        self.ticket = Some(ticket);
        self.ahead = Some(ahead);
        let to_local = |t: u64| local.saturating_add(t.saturating_sub(now));
        let every = match ahead {
            0 | 1 => BASE,
            _ => (ahead as u64)
                .saturating_mul(BASE)
                .min(MAX_CHECK.as_nanos() as u64),
        };
        let refresh = match ahead {
            0 | 1 => ASK_FRONT,
            2..=10 => REFRESH,
            11..=100 => 2 * REFRESH,
            _ => 4 * REFRESH,
        };
        self.plan = Some(Plan {
            queue: (ahead > 0).then(|| queue.wrapping_add(ahead as u64)),
            head: (ahead <= HEAD_WATCHERS).then_some(head),
            at: at.map(to_local),
            deadline: self.deadline.map(to_local),
            check: local.saturating_add(every),
            every,
            refresh: local.saturating_add(refresh.as_nanos() as u64),
        });
        FleetNext::Waiting
    }

    /// With the epochs just read (`None`: none read since the answer) at the driver's
    /// clock `local`: ask again now, or read them again after a while.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::fleet::{FleetLook, FleetOutcome, FleetWait};
    /// let mut wait = FleetWait::new(None);
    /// let waiting = FleetOutcome::Waiting { ticket: 2, ahead: 0, at: Some(5_000_000) };
    /// wait.answer(waiting, (0, 0), 0, 0);
    /// assert!(matches!(wait.look(None, 0), FleetLook::Sleep(_)));
    /// assert_eq!(wait.look(Some((0, 0)), 5_000_000), FleetLook::Ask); // its instant
    /// ```
    pub fn look(&mut self, epochs: Option<(u64, u64)>, local: u64) -> FleetLook {
        let Some(mut p) = self.plan else {
            return FleetLook::Ask;
        };
        let moved = epochs.is_some_and(|(head, queue)| {
            // Wrapping: a difference below half the range is forward.
            p.queue
                .is_some_and(|q| queue.wrapping_sub(q) < u64::MAX / 2)
                || p.head.is_some_and(|h| head != h)
        });
        let due = [p.at, p.deadline, Some(p.refresh)]
            .into_iter()
            .flatten()
            .any(|t| local >= t);
        if moved || due {
            self.plan = None;
            return FleetLook::Ask;
        }
        if let Some((_, queue)) = epochs {
            if local >= p.check {
                // As often as places may still go by before its own.
                if let Some(target) = p.queue {
                    let left = target.wrapping_sub(queue).max(1);
                    p.every = left.saturating_mul(BASE).min(MAX_CHECK.as_nanos() as u64);
                }
                p.check = local.saturating_add(p.every);
            }
        }
        self.plan = Some(p);
        let next = [p.at, p.deadline, Some(p.refresh), Some(p.check)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(p.check);
        FleetLook::Sleep(Duration::from_nanos(next.saturating_sub(local)))
    }
}
