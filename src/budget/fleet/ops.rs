//! What a fleet budget is asked, what it answers, and the write an answer needs.

use core::fmt;
use core::time::Duration;

use crate::budget::BudgetError;
use crate::upstream::DimensionSignal;

/// An operation on a fleet budget, decided by [`FleetRules::decide`](super::FleetRules::decide).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum FleetOp<'a> {
    /// A new caller: admitted now if no one waits and everything admits it, else in the
    /// queue (refused at once when its turn is past `deadline` by the rates).
    Arrive {
        /// Its cells ([`FleetRules::cells`](super::FleetRules::cells)).
        cells: &'a [u32],
        /// The latest instant it accepts, in server nanoseconds.
        deadline: Option<u64>,
    },
    /// A waiter asks again (one no longer on record arrives anew, at the back).
    AskAgain {
        /// Its ticket.
        ticket: u64,
        /// Its cells.
        cells: &'a [u32],
        /// Its deadline.
        deadline: Option<u64>,
    },
    /// A turn now, or [`BudgetError::WouldWait`]: taken only when no one waits.
    TryNow {
        /// Its cells.
        cells: &'a [u32],
    },
    /// Ends caller `ticket`: a waiter leaves; a turn settles or closes.
    End {
        /// Its ticket.
        ticket: u64,
        /// The cells it was charged.
        charged: &'a [u32],
        /// `Some`: settled, each dimension named costing that many cells
        /// ([`FleetRules::settled`](super::FleetRules::settled)); `None`: closed at its estimate.
        actual: Option<&'a [Option<u32>]>,
    },
    /// Renews the owner's lease.
    Renew,
    /// Reads the budget: turns in flight, waiters, each dimension's remaining cells.
    Look,
    /// How long a turn of `cells` would wait for its instant now, by the rates.
    WaitTime {
        /// Its cells.
        cells: &'a [u32],
    },
    /// Steers the budget by an upstream's word, as
    /// [`Budget::follow`](crate::budget::Budget::follow).
    Follow {
        /// What the response said.
        signal: &'a DimensionSignal,
        /// The longest hold taken from it.
        max_hold: Duration,
    },
    /// Holds every turn for `duration` from now.
    Hold {
        /// How long.
        duration: Duration,
    },
}

/// What an operation came to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetOutcome {
    /// Admitted: a turn, with its permit.
    Admitted {
        /// Its ticket, to end it with.
        ticket: u64,
    },
    /// In the queue.
    Waiting {
        /// Its ticket, to ask again with.
        ticket: u64,
        /// Waiters ahead of it.
        ahead: usize,
        /// When its turn would come as things stand (server nanoseconds; `None`: a
        /// permit is short, or never).
        at: Option<u64>,
    },
    /// Refused; nothing was booked.
    Refused(BudgetError),
    /// The budget records [`MAX_CALLERS`](super::MAX_CALLERS) callers already; nothing was booked.
    Full,
    /// An end: whether the caller was on record.
    Ended(bool),
    /// A lease renewed.
    Renewed,
    /// A read.
    Looked {
        /// Turns in flight over every client.
        in_flight: u32,
        /// Waiters over every client.
        waiting: usize,
        /// Each dimension's cells a turn could take now, in the order of
        /// [`FleetRules::dimensions`](super::FleetRules::dimensions).
        remaining: Box<[u32]>,
    },
    /// How long a turn would wait by the rates (`Duration::MAX`: never).
    WaitTime(Duration),
    /// How many of the budget's dimensions the response reported.
    Followed(usize),
    /// The hold is in force.
    Held,
}

/// A decision: its outcome, and the value to write for it to hold.
#[derive(Clone, Debug)]
pub struct FleetDecision {
    /// What the operation came to, once `write` (if any) is written.
    pub outcome: FleetOutcome,
    /// The write the outcome needs (`None`: the value stays as it is).
    pub write: Option<FleetWrite>,
}

/// A write for [`BUDGET_WRITE`](crate::redis_scripts::BUDGET_WRITE): its `ARGV` are
/// `expect`, `value`, `ttl_ms`, `head` and `queue`, in that order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetWrite {
    /// The generation the value must still have (0: no value yet).
    pub expect: u64,
    /// The new value.
    pub value: Vec<u8>,
    /// Its time to live, in milliseconds.
    pub ttl_ms: u64,
    /// How far the head's epoch moves (permits returned, settles, steering).
    pub head: u64,
    /// How far the queue's epoch moves (waiters that left the queue).
    pub queue: u64,
}

/// Why a stored value cannot be decided on. Nothing is written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetError {
    /// The value is not a fleet budget's (another application's, or damaged).
    Corrupt,
    /// The value is a fleet budget's under other rules (other rates or another cap).
    Mismatch,
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetError::Corrupt => f.write_str("the value at the budget's key is not a budget's"),
            FleetError::Mismatch => f.write_str(
                "the budget's key holds a budget with other rates or another in-flight cap",
            ),
        }
    }
}

impl core::error::Error for FleetError {}
