//! What a budget keeps under its one lock: the ledger, the in-flight permits and the
//! queue of waiters. Plain data and decisions; the caller reads the clock, and wakes and
//! drops wakers only after unlocking.
//!
//! # Implementation notes
//!
//! Head-of-line FIFO: the waiters are kept by ticket (taken in arrival order) and only the
//! first may be admitted. It is admitted, in its own poll, at an instant when every
//! dimension conforms *and* a permit is free, so nothing is spent unless everything
//! admits, and nobody overtakes it: a light caller behind a heavy one waits (that is the
//! fairness promise; the price is that the head's wait is everyone's). A plain
//! `try_acquire` is admitted only when no one waits. The head is woken by the event that
//! may let it in: its clock alarm for the rates, a permit's return, a settle (its
//! instant may have moved), or the waiter ahead leaving. No one else is woken: a change
//! costs one wake-up, whatever the queue's length.

use core::task::Waker;
use std::collections::BTreeMap;

use super::ledger::{Ledger, Ready};

/// A waiter in the queue.
#[derive(Debug)]
struct Waiter {
    /// Its task's waker (the latest poll's).
    waker: Waker,
    /// Its cells per dimension, for the estimates of those behind it.
    cells: Box<[u32]>,
}

/// The budget's state (module docs). Only touched under the budget's lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) ledger: Ledger,
    /// Permits taken by turns admitted in this process since the last fork.
    in_use: u32,
    /// The cap on `in_use`, if any.
    cap: Option<u32>,
    waiters: BTreeMap<u64, Waiter>,
    next_ticket: u64,
    /// The fork generation the queue and the permits belong to.
    pub(crate) generation: u64,
}

/// What the head may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Be admitted now (`admit`).
    Admit,
    /// Wait for a permit (a returning turn wakes it).
    Permit,
    /// Wait until this instant, as the rates stand.
    At(u64),
    /// Wait for ever, unless a settle gives room (a TAT near the end of time).
    Never,
}

impl State {
    pub(crate) fn new(ledger: Ledger, cap: Option<u32>, generation: u64) -> State {
        State {
            ledger,
            in_use: 0,
            cap,
            waiters: BTreeMap::new(),
            next_ticket: 0,
            generation,
        }
    }

    /// Whether a turn of `cells` could be admitted at `now`, not counting the queue.
    pub(crate) fn decide(&self, cells: &[u32], now: u64) -> Decision {
        if self.cap.is_some_and(|cap| self.in_use >= cap) {
            return Decision::Permit;
        }
        match self.ledger.ready(cells, now) {
            Ready::Now => Decision::Admit,
            Ready::At(at) => Decision::At(at),
            Ready::Never => Decision::Never,
        }
    }

    /// Admits a turn the caller decided on (`decide` said `Admit` at `now`): charges it
    /// and takes a permit. Returns the admission's id.
    pub(crate) fn admit(&mut self, cells: Box<[u32]>, now: u64) -> u64 {
        self.in_use += 1;
        self.ledger.admit(now, cells)
    }

    /// Returns a permit taken in fork generation `generation` (one from before a fork
    /// is not this process's to return). Returns the head's waker to wake.
    pub(crate) fn release(&mut self, generation: u64) -> Option<Waker> {
        if generation == self.generation {
            self.in_use = self.in_use.saturating_sub(1);
        }
        self.head_waker()
    }

    pub(crate) fn in_use(&self) -> u32 {
        self.in_use
    }

    pub(crate) fn queued(&self) -> usize {
        self.waiters.len()
    }

    /// Joins the queue at its end; returns the ticket.
    pub(crate) fn enqueue(&mut self, cells: Box<[u32]>, waker: Waker) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiters.insert(ticket, Waiter { waker, cells });
        ticket
    }

    /// Whether `ticket` is still queued (a fork's child forgets the queue).
    pub(crate) fn is_queued(&self, ticket: u64) -> bool {
        self.waiters.contains_key(&ticket)
    }

    pub(crate) fn is_head(&self, ticket: u64) -> bool {
        self.waiters.keys().next() == Some(&ticket)
    }

    /// Records the waker of `ticket`'s latest poll; returns the one it replaced, to drop
    /// after unlocking.
    pub(crate) fn set_waker(&mut self, ticket: u64, waker: &Waker) -> Option<Waker> {
        let waiter = self.waiters.get_mut(&ticket)?;
        if waiter.waker.will_wake(waker) {
            return None;
        }
        Some(core::mem::replace(&mut waiter.waker, waker.clone()))
    }

    /// Takes `ticket` out of the queue. Returns its waker (to drop after unlocking) and,
    /// if it was the head, the new head's waker (to wake).
    pub(crate) fn leave(&mut self, ticket: u64) -> (Option<Waker>, Option<Waker>) {
        let was_head = self.is_head(ticket);
        let gone = self.waiters.remove(&ticket).map(|w| w.waker);
        let next = if was_head { self.head_waker() } else { None };
        (gone, next)
    }

    /// The head's waker, to wake after a change that may let it in.
    pub(crate) fn head_waker(&self) -> Option<Waker> {
        self.waiters.values().next().map(|w| w.waker.clone())
    }

    /// When a turn of `cells` joining the queue now would be admitted, by the rates
    /// alone (`Ledger::simulate`); `None`: never.
    pub(crate) fn estimate(&self, cells: &[u32], now: u64) -> Option<u64> {
        self.ledger
            .simulate(self.waiters.values().map(|w| &*w.cells), cells, now)
    }

    /// A fork's child: the queue's waiters and the permits' holders were the parent's
    /// threads (the forking thread's own waiters queue again when polled; its turns'
    /// permits are no longer counted), and the log's open turns will never settle.
    /// Returns the forgotten wakers, for the caller to leak (`Shared::lock`).
    pub(crate) fn forget_before_fork(&mut self, generation: u64) -> BTreeMap<u64, Waker> {
        self.generation = generation;
        self.in_use = 0;
        self.ledger.forget_log();
        core::mem::take(&mut self.waiters)
            .into_iter()
            .map(|(ticket, w)| (ticket, w.waker))
            .collect()
    }
}
