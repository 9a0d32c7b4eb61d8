//! The list under a queue's lock: linking, the due prefix, and the lags that move
//! waiters up in O(1) (`queue`'s module docs, "Moving up, in O(1)").

use core::ptr::NonNull;
use core::task::Waker;

use super::super::list::{self, LinkedList};
use super::super::node::{slot, Slot, Waiter};

/// The state under the queue lock.
#[derive(Debug)]
pub(super) struct State {
    pub(super) list: LinkedList<Waiter>,
    /// The sum of every linked node's `lag` (wrapping): the lag ahead of the tail.
    pub(super) lag: u64,
    /// Bookings linked so far (wrapping; a node keeps its number in `Slot::seq`).
    pub(super) seq: u64,
    /// The number of the latest booking that did not follow its tail directly (something
    /// was admitted between them): no waiter booked before it may give cells back.
    pub(super) gap_before: u64,
    /// Whether every linked node's `lag` and `base` are zero, so a node's slot alone says
    /// its instant (`queue`'s module docs, "Moving up, in O(1)").
    pub(super) settled: bool,
    /// The earliest instant for which a wake-up is outstanding with the clock.
    pub(super) armed: Option<u64>,
    /// The process's fork generation when `armed` was recorded: a record made before a
    /// fork may never have reached the clock (`clock/fork.rs`), so it counts as none.
    pub(super) armed_in: u64,
    /// Whether the clock was ever asked to wake this queue: only then is there anything for
    /// it to forget when the queue is dropped.
    pub(super) asked_clock: bool,
    /// The process's fork generation the list belongs to (`queue`'s module docs, "Fork").
    pub(super) generation: u64,
    /// Bumped each time a fork makes the queue forget its list; every node records the
    /// epoch it was linked in.
    pub(super) epoch: u64,
}

impl State {
    /// Whether the clock must be asked to wake the queue at `instant`; records it if so.
    pub(super) fn arm(&mut self, instant: u64) -> bool {
        let generation = crate::clock::forks();
        if self.armed.is_some_and(|armed| armed <= instant) && self.armed_in == generation {
            return false;
        }
        self.armed = Some(instant);
        self.armed_in = generation;
        self.asked_clock = true;
        true
    }

    pub(super) fn arm_front(&mut self) -> Option<u64> {
        let instant = self.front_instant()?;
        self.arm(instant).then_some(instant)
    }

    /// The front waiter's instant: its own lag is all the lag ahead of it.
    pub(super) fn front_instant(&self) -> Option<u64> {
        let front = self.list.front()?;
        // SAFETY: a linked node is live (list rule 3) and we hold the lock.
        Some(unsafe { slot(front, |s| s.instant_at(s.lag)) })
    }

    /// Links `node`, booked at `tat` with `cost` and `window`, at the back.
    ///
    /// # Safety
    ///
    /// `node` is live, pinned and in no list; the caller holds the lock.
    pub(super) unsafe fn push_back(&mut self, node: NonNull<Waiter>, booked: Slot) {
        let ahead = self.lag;
        // Whether this booking follows the tail's directly: nothing was admitted in
        // between (`queue`'s module docs, "Cancelling is exact").
        let follows = self.list.back().is_some_and(|tail| {
            // SAFETY: the tail is linked, so live (list rule 3); we hold the lock.
            let tail_tat = unsafe { slot(tail, |s| s.tat_at(ahead)) };
            booked.tat.checked_sub(booked.cost) == Some(tail_tat)
        });
        self.seq = self.seq.wrapping_add(1);
        if !follows {
            self.gap_before = self.seq;
        }
        let seq = self.seq;
        // SAFETY: live (caller's contract); we hold the lock.
        unsafe {
            slot(node, |s| {
                *s = Slot {
                    base: ahead,
                    lag: 0,
                    seq,
                    ..booked
                }
            });
            self.list.push_back(node);
        }
    }

    /// Unlinks the front waiter if its instant has come by `now`, writing its lag into its
    /// slot (a fired node is read alone) and handing the lag on to the next; returns it
    /// with its waker.
    pub(super) fn pop_due(&mut self, now: u64) -> Option<(NonNull<Waiter>, Option<Waker>)> {
        let front = self.list.front()?;
        // SAFETY: a linked node is live (list rule 3) and we hold the lock.
        let (lag, waker) = unsafe {
            slot(front, |s| {
                if s.instant_at(s.lag) > now {
                    return None;
                }
                let lag = s.lag;
                s.tat = s.tat_at(lag);
                s.base = 0;
                s.lag = 0;
                Some((lag, s.waker.take()))
            })
        }?;
        self.list.pop_front();
        self.hand_on(lag, 0);
        Some((front, waker))
    }

    /// After a node left the list: its `lag` (plus `given`, nanoseconds it gave back)
    /// moves to the node that was behind it, now at the same place. With nobody
    /// behind, the lag leaves the list.
    pub(super) fn hand_on(&mut self, lag: u64, given: u64) {
        self.hand_on_to(self.list.front(), lag, given);
    }

    pub(super) fn hand_on_to(&mut self, behind: Option<NonNull<Waiter>>, lag: u64, given: u64) {
        match behind {
            Some(next) => {
                // SAFETY: `next` is linked, so live (list rule 3); we hold the lock.
                unsafe {
                    slot(next, |s| {
                        s.lag = s.lag.wrapping_add(lag).wrapping_add(given)
                    })
                };
                self.lag = self.lag.wrapping_add(given);
                if given != 0 {
                    self.settled = false;
                }
            }
            None => self.lag = self.lag.wrapping_sub(lag),
        }
        if self.list.is_empty() {
            self.lag = 0;
            self.settled = true;
        }
    }

    /// Whether linked `node`'s instant has come by `now`. Instants never decrease along
    /// the list, so the walk stops at the first one that has not come: it reads only the
    /// due waiters ahead (which the timer is about to fire), never the whole list.
    ///
    /// # Safety
    ///
    /// `node` is linked in this list; the caller holds the lock.
    pub(super) unsafe fn is_due(&self, node: NonNull<Waiter>, now: u64) -> bool {
        let mut ahead = 0u64;
        let mut at = self.list.front();
        while let Some(n) = at {
            // SAFETY: linked, so live (list rule 3); we hold the lock.
            let instant = unsafe {
                slot(n, |s| {
                    ahead = ahead.wrapping_add(s.lag);
                    s.instant_at(ahead)
                })
            };
            if n == node || instant > now {
                return instant <= now;
            }
            // SAFETY: as above.
            at = unsafe { list::next(n) };
        }
        unreachable!("a linked waiter is in its list")
    }

    /// Writes every node's lag into its slot (`queue`'s module docs, "Moving up, in
    /// O(1)"), calling `f` on each slot once it is up to date.
    pub(super) fn settle(&mut self, mut f: impl FnMut(&mut Slot)) {
        let mut ahead = 0u64;
        let mut at = self.list.front();
        while let Some(n) = at {
            // SAFETY: linked, so live (list rule 3); we hold the lock.
            unsafe {
                slot(n, |s| {
                    ahead = ahead.wrapping_add(s.lag);
                    s.tat = s.tat_at(ahead);
                    s.base = 0;
                    s.lag = 0;
                    f(s);
                });
                at = list::next(n);
            }
        }
        self.lag = 0;
        self.settled = true;
    }
}
