//! A budget's queue kept as plain data, for the tiers whose state lives outside the
//! process (a file every process of a host maps, a value in Redis): the callers on
//! record (turns in flight and waiters) beside the ledger, and the decisions made on
//! them (`admit.rs`). Each tier reads the state, decides with the time it reads, and
//! writes it back whole under its own exclusion (the file's lock; a compare-and-set in
//! Redis).

mod admit;

use super::Ledger;

#[cfg(feature = "shared")]
pub use admit::ABANDONED;
pub(crate) use admit::{Ask, Refusal, Step};

/// One caller on record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    /// Its place: tickets are handed out in arrival order.
    pub(crate) ticket: u64,
    /// The process (or client) it belongs to: the tier's word for an owner whose
    /// callers are cleared out once it is gone (`Ask::alive`).
    pub(crate) owner: u64,
    /// Its admission's id in the ledger; `None` while it waits in the queue.
    pub(crate) turn: Option<u64>,
    /// A waiter: the last instant it asked (a waiter that stops asking gives its place
    /// up). A turn: its admission.
    pub(crate) seen: u64,
    /// Its cells per dimension (for the estimates of those behind it).
    pub(crate) cells: Box<[u32]>,
}

/// Everything a budget outside the process keeps, as read under its exclusion.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) ledger: Ledger,
    pub(crate) callers: Vec<Caller>,
    pub(crate) next_ticket: u64,
    /// When callers were last checked for owners that no longer exist.
    pub(crate) last_reap: u64,
    /// The most callers on record at once (the tier's room for them); not stored.
    pub(crate) room: usize,
}

impl State {
    /// A fresh state: no callers, every dimension whole.
    pub(crate) fn fresh(ledger: Ledger, room: usize) -> State {
        State {
            ledger,
            callers: Vec::new(),
            next_ticket: 1,
            last_reap: 0,
            room,
        }
    }

    /// Turns on record: each holds a permit.
    pub(crate) fn in_flight(&self) -> usize {
        self.callers.iter().filter(|c| c.turn.is_some()).count()
    }

    /// Callers in the queue.
    pub(crate) fn waiting(&self) -> usize {
        self.callers.iter().filter(|c| c.turn.is_none()).count()
    }

    /// What a change from `before` (the callers' tickets and whether each held a turn)
    /// did to the queue: `(turns ended, waiters that left the queue)`, the amounts a
    /// tier advances its two epochs by (`admit.rs`, "Who looks again when").
    pub(crate) fn departures(&self, before: &[(u64, bool)]) -> (u64, u64) {
        let mut left = (0, 0);
        for &(ticket, was_turn) in before {
            match self.callers.iter().find(|c| c.ticket == ticket) {
                // Ended: a permit returned, a settle may have refunded.
                None if was_turn => left.0 += 1,
                // Left the queue, gone or admitted.
                None => left.1 += 1,
                Some(c) if !was_turn && c.turn.is_some() => left.1 += 1,
                Some(_) => {}
            }
        }
        left
    }

    /// The callers' tickets and whether each holds a turn, for [`State::departures`].
    pub(crate) fn roll(&self) -> Vec<(u64, bool)> {
        self.callers
            .iter()
            .map(|c| (c.ticket, c.turn.is_some()))
            .collect()
    }
}
