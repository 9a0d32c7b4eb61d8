//! A budget queue's decisions, made on its state under the tier's exclusion: a caller's
//! arrival, the head of the queue asking again, ending a turn, and clearing out callers
//! whose owner is gone.
//!
//! # Implementation notes
//!
//! **The in-process budget's scheduling, across processes.** Callers wait in one queue
//! in the file, in ticket order (tickets are handed out on arrival). Only the head may be
//! admitted, and only at an instant when every dimension admits it *and* a permit is
//! free: it is then charged in every dimension at once, at that instant (`Ledger::admit`
//! at `now`). So nothing is spent unless everything admits, nobody overtakes the head,
//! and a settle's refund comes back whole whenever no admission has happened since (an
//! admission is never made ahead of its instant, so it never relies on a charge that a
//! settle may yet take back). A plain `try_now` is admitted only when no one waits.
//!
//! **Who looks again when.** A waiter behind the head can only move up when a waiter
//! ahead leaves the queue (admitted, gone, or given up): each departure advances the
//! queue's epoch by one, so a waiter `p` places back needs `p` of them. The head can only
//! be admitted sooner than its rates' instant when a permit returns, a settle refunds, or
//! the rates or holds change: each advances the head's epoch. Both epochs are hints read
//! without the lock (`waiting.rs`).
//!
//! **Cleared out** (`reap`, at most every [`REAP_EVERY`]): a caller whose owner is gone
//! (a process that no longer exists, a client whose lease lapsed: `Ask::alive`; its turn
//! stays charged at its estimate: spent is spent; its permit returns), and a waiter that
//! has not asked for [`ABANDONED`] (a task whose event loop was closed under it, a thread
//! stopped for that long): it loses its place.

use core::time::Duration;

use super::{Caller, State};
use crate::budget::{BudgetError, Ready};

/// A waiter that has not asked again for this long gives its place up (it asks at least
/// every second near the front of the queue, every four seconds far back).
#[cfg_attr(not(feature = "shared"), allow(unreachable_pub))]
pub const ABANDONED: Duration = Duration::from_secs(10);

/// How often a waiter's asks renew its `seen` (far within [`ABANDONED`]).
const SEEN_EVERY: Duration = Duration::from_secs(1);

/// How often callers are checked for processes that are gone.
const REAP_EVERY: Duration = Duration::from_millis(50);

/// What a caller's step comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Admitted: its turn, with its permit.
    Admitted { ticket: u64 },
    /// Waiting with `ahead` waiters before it, and when its turn would come as things
    /// stand (`at`: the head's when its rates admit it; a waiter's behind it if those
    /// ahead went as early as the rates allow; `None`: a permit is short, or never).
    Waiting {
        ticket: u64,
        ahead: usize,
        at: Option<u64>,
    },
}

/// Why a step failed.
#[derive(Debug)]
pub(crate) enum Refusal {
    Budget(BudgetError),
    /// The state records as many callers as it has room for already.
    Full,
}

impl From<BudgetError> for Refusal {
    fn from(error: BudgetError) -> Refusal {
        Refusal::Budget(error)
    }
}

/// What a step may do: the cap, its owner, the instant, the deadline.
pub(crate) struct Ask<'a> {
    pub(crate) cells: &'a [u32],
    pub(crate) cap: Option<u32>,
    pub(crate) now: u64,
    pub(crate) deadline: Option<u64>,
    /// The owner asking (never cleared out by its own step).
    pub(crate) me: u64,
    /// Whether another owner still exists.
    pub(crate) alive: &'a dyn Fn(u64) -> bool,
}

impl State {
    /// A new caller: admitted now if no one waits and everything admits it; otherwise in
    /// the queue. Refused at once, taking no place, when the rates put its turn past its
    /// deadline (every waiter ahead admitted as early as the rates allow).
    pub(crate) fn arrive(&mut self, ask: &Ask<'_>) -> Result<Step, Refusal> {
        self.reap(ask.now, ask.me, ask.alive);
        if let Some(deadline) = ask.deadline {
            let ahead = self.callers.iter().filter(|c| c.turn.is_none());
            let at = self
                .ledger
                .simulate(ahead.map(|c| &*c.cells), ask.cells, ask.now);
            match at {
                Some(at) if at <= deadline.max(ask.now) => {}
                Some(at) => return Err(not_within(at, ask.now).into()),
                None => {
                    return Err(BudgetError::NotWithin {
                        wait: Duration::MAX,
                    }
                    .into())
                }
            }
        }
        if self.callers.len() >= self.room {
            return Err(Refusal::Full);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.callers.push(Caller {
            ticket,
            owner: ask.me,
            turn: None,
            seen: ask.now,
            cells: ask.cells.into(),
        });
        self.ask_again(ticket, ask)
    }

    /// A waiter asks again: admitted if it is the head and everything admits it now,
    /// still waiting, or out at its deadline. A waiter no longer on record (cleared out)
    /// arrives anew, at the back.
    pub(crate) fn ask_again(&mut self, ticket: u64, ask: &Ask<'_>) -> Result<Step, Refusal> {
        let Some(i) = self.callers.iter().position(|c| c.ticket == ticket) else {
            return self.arrive(ask);
        };
        // Shown to be there, at most every `SEEN_EVERY`: an ask that changes nothing else
        // then leaves the state as it was (a tier in Redis writes nothing for it).
        if ask.now.saturating_sub(self.callers[i].seen) >= SEEN_EVERY.as_nanos() as u64 {
            self.callers[i].seen = ask.now;
        }
        let mut ahead = self.waiting_ahead(ticket);
        if ahead > 0 || self.free(ask.cap) == 0 {
            // Someone ahead, or no permit: perhaps held by callers that are gone.
            if self.reap(ask.now, ask.me, ask.alive) {
                ahead = self.waiting_ahead(ticket);
            }
        }
        // Cleared out only if the file was damaged (this process's own record, just
        // seen): then it arrives anew.
        let Some(i) = self.callers.iter().position(|c| c.ticket == ticket) else {
            return self.arrive(ask);
        };
        let at = if ahead > 0 {
            // Where its turn would come if every waiter ahead went as early as the
            // rates allow (no permit short, no settle to come): it looks again then.
            // Only an instant still to come: one already here says only that the rates
            // would let it in, and it is the waiters ahead it waits for (the queue's
            // epoch says when they have gone; asking again at once would only hold the
            // lock against them).
            if self.free(ask.cap) > ahead {
                let before = self
                    .callers
                    .iter()
                    .filter(|c| c.turn.is_none() && c.ticket < ticket);
                self.ledger
                    .simulate(before.map(|c| &*c.cells), ask.cells, ask.now)
                    .filter(|&at| at > ask.now)
            } else {
                None
            }
        } else if self.free(ask.cap) == 0 {
            None
        } else {
            match self.ledger.ready(ask.cells, ask.now) {
                Ready::Now => {
                    let turn = self.ledger.admit(ask.now, ask.cells.into());
                    self.callers[i].turn = Some(turn);
                    return Ok(Step::Admitted { ticket });
                }
                Ready::At(at) => Some(at),
                Ready::Never => None,
            }
        };
        if ask.deadline.is_some_and(|d| ask.now >= d) {
            self.callers.remove(i);
            return Err(BudgetError::TimedOut.into());
        }
        Ok(Step::Waiting { ticket, ahead, at })
    }

    /// A turn now or nothing: no one waits, a permit is free, every dimension admits.
    pub(crate) fn try_now(&mut self, ask: &Ask<'_>) -> Result<Step, Refusal> {
        let blocked =
            |s: &State| s.callers.iter().any(|c| c.turn.is_none()) || s.free(ask.cap) == 0;
        if blocked(self) && (!self.reap(ask.now, ask.me, ask.alive) || blocked(self)) {
            return Err(BudgetError::WouldWait.into());
        }
        if self.ledger.ready(ask.cells, ask.now) != Ready::Now {
            return Err(BudgetError::WouldWait.into());
        }
        if self.callers.len() >= self.room {
            return Err(Refusal::Full);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let turn = self.ledger.admit(ask.now, ask.cells.into());
        self.callers.push(Caller {
            ticket,
            owner: ask.me,
            turn: Some(turn),
            seen: ask.now,
            cells: ask.cells.into(),
        });
        Ok(Step::Admitted { ticket })
    }

    /// Ends caller `ticket`: a waiter leaves; a turn settles (`Some`: each dimension
    /// named costs that many cells) or closes at its estimate. Whether it was on record.
    pub(crate) fn end(
        &mut self,
        ticket: u64,
        charged: &[u32],
        actual: Option<&[Option<u32>]>,
    ) -> bool {
        let Some(i) = self.callers.iter().position(|c| c.ticket == ticket) else {
            return false;
        };
        let caller = self.callers.remove(i);
        if let Some(turn) = caller.turn {
            match actual {
                Some(actual) => self.ledger.settle(turn, charged, actual),
                None => self.ledger.close(turn),
            }
        }
        true
    }

    fn free(&self, cap: Option<u32>) -> usize {
        cap.map_or(usize::MAX, |cap| {
            (cap as usize).saturating_sub(self.in_flight())
        })
    }

    fn waiting_ahead(&self, ticket: u64) -> usize {
        self.callers
            .iter()
            .filter(|c| c.turn.is_none() && c.ticket < ticket)
            .count()
    }

    /// Clears out callers of processes that are gone and waiters that stopped asking
    /// (module docs), at most every [`REAP_EVERY`]; whether any went.
    pub(crate) fn reap(&mut self, now: u64, me: u64, alive: &dyn Fn(u64) -> bool) -> bool {
        if now.saturating_sub(self.last_reap) < REAP_EVERY.as_nanos() as u64 {
            return false;
        }
        self.last_reap = now;
        let abandoned = ABANDONED.as_nanos() as u64;
        let mut known: Vec<(u64, bool)> = Vec::new();
        let mut gone = Vec::new();
        for c in &self.callers {
            let stopped = c.turn.is_none() && now.saturating_sub(c.seen) > abandoned;
            let dead = c.owner != me && {
                match known.iter().find(|(owner, _)| *owner == c.owner) {
                    Some(&(_, lives)) => !lives,
                    None => {
                        let lives = alive(c.owner);
                        known.push((c.owner, lives));
                        !lives
                    }
                }
            };
            if stopped || dead {
                gone.push((c.ticket, c.turn));
            }
        }
        for &(ticket, turn) in &gone {
            self.callers.retain(|c| c.ticket != ticket);
            if let Some(turn) = turn {
                self.ledger.close(turn);
            }
        }
        !gone.is_empty()
    }
}

/// [`BudgetError::NotWithin`] for a turn at `at`, asked at `now`.
fn not_within(at: u64, now: u64) -> BudgetError {
    BudgetError::NotWithin {
        wait: Duration::from_nanos(at.saturating_sub(now)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Ledger;
    use crate::quota::Quota;

    const MS: u64 = 1_000_000;

    /// The owner asking in these tests, and one that is gone.
    const ME: u64 = 7;
    const GONE: u64 = 9;

    fn alive(owner: u64) -> bool {
        owner != GONE
    }

    fn state(per_second: u32, burst: u32) -> State {
        let params = *Quota::per_second(per_second).with_burst(burst).params();
        State::fresh(Ledger::with_capacity(&[params], 16), 64)
    }

    fn ask(cells: &[u32], cap: Option<u32>, now: u64) -> Ask<'_> {
        Ask {
            cells,
            cap,
            now,
            deadline: None,
            me: ME,
            alive: &alive,
        }
    }

    fn admitted(step: Result<Step, Refusal>) -> u64 {
        match step {
            Ok(Step::Admitted { ticket }) => ticket,
            other => panic!("not admitted: {other:?}"),
        }
    }

    fn waiting(step: Result<Step, Refusal>) -> (u64, usize, Option<u64>) {
        match step {
            Ok(Step::Waiting { ticket, ahead, at }) => (ticket, ahead, at),
            other => panic!("not waiting: {other:?}"),
        }
    }

    #[test]
    fn a_heavy_head_is_not_overtaken_and_is_told_its_instant() {
        let mut s = state(10, 2);
        admitted(s.arrive(&ask(&[2], None, 0)));
        let (heavy, ahead, at) = waiting(s.arrive(&ask(&[2], None, 0)));
        assert_eq!((ahead, at), (0, Some(200 * MS)));
        // A light caller behind it waits too, though one cell would fit sooner; it is
        // told when its turn comes behind the heavy one's.
        let (light, ahead, at) = waiting(s.arrive(&ask(&[1], None, 100 * MS)));
        assert_eq!((ahead, at), (1, Some(300 * MS)));
        assert_eq!(waiting(s.ask_again(light, &ask(&[1], None, 150 * MS))).1, 1);
        admitted(s.ask_again(heavy, &ask(&[2], None, 200 * MS)));
        let (_, ahead, at) = waiting(s.ask_again(light, &ask(&[1], None, 200 * MS)));
        assert_eq!((ahead, at), (0, Some(300 * MS)));
        assert_eq!(s.waiting(), 1);
        assert_eq!(s.in_flight(), 2);
    }

    #[test]
    fn the_head_waits_for_a_permit_without_losing_its_place() {
        let mut s = state(1_000, 100);
        let first = admitted(s.arrive(&ask(&[1], Some(1), 0)));
        let (w1, _, at) = waiting(s.arrive(&ask(&[1], Some(1), 0)));
        assert_eq!(at, None, "no permit: no instant");
        let (w2, ahead, _) = waiting(s.arrive(&ask(&[1], Some(1), 0)));
        assert_eq!(ahead, 1);
        assert!(matches!(
            s.try_now(&ask(&[1], Some(1), MS)),
            Err(Refusal::Budget(BudgetError::WouldWait))
        ));
        assert!(s.end(first, &[1], None));
        // The permit is the head's, not the one behind who asks first.
        assert_eq!(waiting(s.ask_again(w2, &ask(&[1], Some(1), 2 * MS))).1, 1);
        admitted(s.ask_again(w1, &ask(&[1], Some(1), 2 * MS)));
        assert_eq!(s.in_flight(), 1);
    }

    #[test]
    fn a_waiter_past_its_deadline_leaves_and_one_too_far_off_never_arrives() {
        let mut s = state(10, 2);
        admitted(s.arrive(&ask(&[1], Some(1), 0)));
        let mut late = ask(&[1], Some(1), 0);
        late.deadline = Some(50 * MS);
        let (w, _, _) = waiting(s.arrive(&late));
        late.now = 50 * MS;
        assert!(matches!(
            s.ask_again(w, &late),
            Err(Refusal::Budget(BudgetError::TimedOut))
        ));
        assert_eq!(s.callers.len(), 1, "the waiter is off the record");
        // Two cells are spent: a third is 100 ms away by the rates, past a 50 ms deadline.
        admitted(s.arrive(&ask(&[1], None, 0)));
        let mut far = ask(&[1], None, 0);
        far.deadline = Some(50 * MS);
        assert!(matches!(
            s.arrive(&far),
            Err(Refusal::Budget(BudgetError::NotWithin { .. }))
        ));
        assert_eq!(s.callers.len(), 2);
    }

    #[test]
    fn a_refund_settled_before_the_next_admission_comes_back_whole() {
        let mut s = state(10, 4);
        let t = admitted(s.arrive(&ask(&[4], None, 0)));
        let (w, _, at) = waiting(s.arrive(&ask(&[2], None, 0)));
        assert_eq!(at, Some(200 * MS));
        // It used 1 of the 4 cells: 3 come back, and the waiter goes at once.
        assert!(s.end(t, &[4], Some(&[Some(1)])));
        admitted(s.ask_again(w, &ask(&[2], None, MS)));
    }

    #[test]
    fn callers_of_a_process_that_is_gone_and_waiters_that_went_silent_are_cleared_out() {
        let gone = GONE;
        let mut s = state(1_000, 100);
        let mut theirs = ask(&[1], Some(2), 0);
        theirs.me = gone;
        admitted(s.arrive(&theirs));
        admitted(s.arrive(&ask(&[1], Some(2), 0)));
        let (silent, _, _) = waiting(s.arrive(&ask(&[1], Some(2), 0)));
        let (mine, ahead, _) = waiting(s.arrive(&ask(&[1], Some(2), 0)));
        assert_eq!(ahead, 1);
        // Silent for `ABANDONED`: the waiter ahead loses its place, and the turn of the
        // process that is gone returns its permit.
        let later = ABANDONED.as_nanos() as u64 + 10 * MS;
        admitted(s.ask_again(mine, &ask(&[1], Some(2), later)));
        assert!(s
            .callers
            .iter()
            .all(|c| c.owner != gone && c.ticket != silent));
        assert_eq!(s.in_flight(), 2, "the second caller's turn and mine");
    }
}
