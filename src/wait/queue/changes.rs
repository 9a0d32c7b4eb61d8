//! Changes to a queue's bookings from outside: a new quota (read again, or spaced again),
//! a hold ("nothing before X"), and an operator's reset of a shared file.

use core::ptr::NonNull;

use super::state::State;
use super::{Arm, Waiters};
use crate::cell::{Ours, TatWord, ALWAYS_OURS};
use crate::clock::Clock;
use crate::gcra::{self, Params};
use crate::wait::list;
use crate::wait::node::{slot, Waiter};

impl<C: Clock> Waiters<C> {
    /// Re-reads the instant of every linked waiter whose instant has not come by `now`
    /// against a new quota's burst window (its booked TAT stays): after
    /// `Limiter::set_quota`. An instant that has come stays where it is: its cells are
    /// spent, and it is due. Returns the wake-up to ask for.
    pub(crate) fn requote(&self, params: &Params, now: u64) -> Arm {
        let mut state = self.lock();
        state.settle(|s| {
            if s.instant_at(0) > now {
                s.window = gcra::ready_window(s.cost, params);
            }
        });
        // The front may now be due earlier or later than the wake-up asked for: ask anew
        // (an outstanding later wake-up only finds nothing due and re-arms).
        state.armed = None;
        Arm(state.arm_front())
    }

    /// Spaces the bookings whose instants have not come by `now` again at `params`, a
    /// quota whose interval is no shorter than the one they were booked at
    /// (`Limiter::set_quota_respaced`): from where the first of them booked, each takes its
    /// cells at the new interval, in order, and its instant is read against the new burst
    /// window; the word moves later by as much as the tail did. Bookings whose instants
    /// have come are spent and stay where they are. Returns the wake-up to ask for.
    pub(crate) fn respace(&self, cell: &TatWord, params: &Params, now: u64) -> Arm {
        let mut state = self.lock();
        // Every instant read in full (a quota change is rare; O(list)).
        state.settle(|_| ());
        let mut node = state.list.front();
        while let Some(n) = node {
            // SAFETY: `n` is linked, so live (list rule 3), and we hold the lock.
            unsafe {
                if slot(n, |s| s.instant_at(0)) > now {
                    break;
                }
                node = list::next(n);
            }
        }
        if let (Some(first), Some(tail)) = (node, state.list.back()) {
            // SAFETY: both are linked, so live (list rule 3); we hold the lock. The list is
            // settled: each slot's `tat` is its TAT.
            let (mut tat, old_tail) = unsafe {
                (
                    slot(first, |s| s.tat.saturating_sub(s.cost)),
                    slot(tail, |s| s.tat),
                )
            };
            while let Some(n) = node {
                // SAFETY: as above; every node from the first waiting one on waits too
                // (instants never decrease along the list).
                unsafe {
                    slot(n, |s| {
                        s.cost = s.cells.saturating_mul(params.interval()).max(s.cost);
                        tat = tat.saturating_add(s.cost);
                        s.tat = tat;
                        s.window = gcra::ready_window(s.cost, params);
                    });
                    node = list::next(n);
                }
            }
            // Each cost only grew, so the tail moved later, and the word with it. A plain
            // admission since the tail booked put the word further still; it moves by as
            // much (a refund compares the word with the tail, and stays exact).
            // The word is this limiter's own (a direct limiter's), never another key's.
            let _ = cell.hold_if(tat.saturating_sub(old_tail), 0, ALWAYS_OURS);
        }
        state.armed = None;
        Arm(state.arm_front())
    }

    /// Holds every cell back until `until` (limiter time), `now` being now: the bookings
    /// whose instants have not come move later together, by as much as puts the first of
    /// them at `until` (so they keep their order and their spacing, and are never released
    /// as one burst), and the word moves with them, or to where one cell fits at `until`
    /// and no earlier when nobody waits. Bookings whose instants have come are spent and
    /// stay where they are. Returns the wake-up to ask for, or `None` when `cell` stopped
    /// being the target's (`ours`) before it could be held (the caller looks it up again;
    /// the waiters moved later meanwhile only wait longer).
    pub(crate) fn hold(
        &self,
        cell: &TatWord,
        ours: Ours<'_>,
        params: &Params,
        now: u64,
        until: u64,
    ) -> Option<Arm> {
        let mut state = self.lock();
        if until <= now {
            return Some(Arm(None));
        }
        // Every instant read in full (a hold is rare; O(list), like a quota change).
        state.settle(|_| ());
        let (mut node, first) = state.first_waiting(now);
        let shift = first.map_or(0, |first| until.saturating_sub(first));
        if shift > 0 {
            while let Some(n) = node {
                // SAFETY: `n` is linked, so live (list rule 3), and we hold the lock; it is
                // the first waiting node or one after it, which waits too.
                unsafe {
                    slot(n, |s| s.tat = s.tat.saturating_add(shift));
                    node = list::next(n);
                }
            }
        }
        // One cell fits at `until`, none before.
        if !cell.hold_if(shift, until.saturating_add(params.room_for_one()), ours) {
            return None;
        }
        state.armed = None;
        Some(Arm(state.arm_front()))
    }

    /// Ends holds and forgets what was spent, `now` being now (an operator's reset of a
    /// shared file): the bookings whose instants have not come move earlier together, by
    /// as much as puts the first of them at `now` (keeping their order and spacing), and the
    /// word goes to where the last of them leaves it, or to a new limiter's when nobody
    /// waits. Bookings whose instants have come are spent and stay where they are. Returns
    /// the wake-up to ask for, or `None` when `cell` stopped being the target's (`ours`).
    #[cfg(all(feature = "shared", unix, not(loom)))]
    pub(crate) fn reset(&self, cell: &TatWord, ours: Ours<'_>, now: u64) -> Option<Arm> {
        let mut state = self.lock();
        // Every instant read in full (a reset is rare; O(list), like a hold).
        state.settle(|_| ());
        let (mut node, first) = state.first_waiting(now);
        let shift = first.map_or(0, |first| first - now);
        let mut last = 0;
        while let Some(n) = node {
            // SAFETY: `n` is linked, so live (list rule 3), and we hold the lock; it is the
            // first waiting node or one after it, which waits too.
            unsafe {
                last = slot(n, |s| {
                    s.tat = s.tat.saturating_sub(shift);
                    s.tat
                });
                node = list::next(n);
            }
        }
        if !cell.set_if(last, ours) {
            return None;
        }
        state.armed = None;
        Some(Arm(state.arm_front()))
    }
}

impl State {
    /// The first linked node whose instant (read in full: settle first) is after `now`,
    /// and that instant; `(None, None)` when every booking's instant has come. Every node
    /// after it waits too (instants never decrease along the list). Under the lock.
    fn first_waiting(&self, now: u64) -> (Option<NonNull<Waiter>>, Option<u64>) {
        let mut node = self.list.front();
        while let Some(n) = node {
            // SAFETY: `n` is linked, so live (list rule 3), and we hold the lock.
            unsafe {
                let instant = slot(n, |s| s.instant_at(0));
                if instant > now {
                    return (node, Some(instant));
                }
                node = list::next(n);
            }
        }
        (None, None)
    }
}
