//! A shared budget's decisions, made on its state under the file's lock: booking a turn,
//! waiting for a permit, ending a turn, and clearing out callers whose process is gone.
//!
//! # Implementation notes
//!
//! **Permit first, then the rates.** With an in-flight cap, a caller first gets a permit,
//! in ticket order across every process, and is then booked in every dimension at once
//! at the earliest instant all of them admit it (`Ledger::ready`, `Ledger::admit` at that
//! instant): so it sends at its booked instant, and the rates bound what is sent, not
//! only what is booked (a caller booked first and given a permit late would send late,
//! bunched with others). A booked turn holds its permit while it waits for its instant;
//! the turns behind it are booked behind it. Without a cap, a caller is booked at once.
//!
//! **A permit** is free when fewer turns are on record than the cap; a waiter takes one
//! when the free permits outnumber the waiters ahead of it, so waiters are served in
//! ticket order. Nothing else changes whether that holds but a turn ending, a waiter
//! leaving, or one being cleared out: each advances the epoch hint, which a waiter reads
//! without the lock to know whether asking again can help.
//!
//! **Cleared out** (`reap`, at most every [`REAP_EVERY`]): a caller whose process no
//! longer exists (its turn stays charged at its estimate: spent is spent; its permit
//! returns), and a waiter that has not asked for [`ABANDONED`] (a task whose event loop
//! was closed under it, a thread stopped for that long): it loses its place.

use core::time::Duration;

use super::store::{Caller, State};
use crate::budget::{BudgetError, Ready};
use crate::shared::process;

/// A waiter that has not asked for a permit for this long gives its place up (it asks
/// at least every [`MAX_POLL`]).
pub const ABANDONED: Duration = Duration::from_secs(5);

/// The longest a waiter for a permit goes without asking.
pub(super) const MAX_POLL: Duration = Duration::from_millis(100);

/// How often callers are checked for processes that are gone.
const REAP_EVERY: Duration = Duration::from_millis(50);

/// What a caller's step comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Booked: admission `turn` at instant `at` (clock nanoseconds), with its permit.
    Booked { ticket: u64, turn: u64, at: u64 },
    /// Waiting for a permit behind `behind` others that are not yet served.
    Waiting { ticket: u64, behind: usize },
}

/// Why a step failed.
#[derive(Debug)]
pub(super) enum Refusal {
    Budget(BudgetError),
    /// The state records [`super::MAX_WAITING`] callers already.
    Full,
}

impl From<BudgetError> for Refusal {
    fn from(error: BudgetError) -> Refusal {
        Refusal::Budget(error)
    }
}

/// What a step may do: the cap, this process, the instant, the deadline.
pub(super) struct Ask<'a> {
    pub(super) cells: &'a [u32],
    pub(super) cap: Option<u32>,
    pub(super) now: u64,
    pub(super) deadline: Option<u64>,
    pub(super) me: u64,
}

impl Ask<'_> {
    /// Whether a turn at `at` comes too late: after the deadline, and not now (the
    /// deadline was set from a clock read before the lock).
    fn past_deadline(&self, at: u64) -> bool {
        self.deadline.is_some_and(|d| at > d.max(self.now))
    }
}

impl State {
    /// A new caller: booked if it may be now, else on record as a waiter. Refused when
    /// the rates put its turn past its deadline (nothing is recorded).
    pub(super) fn arrive(&mut self, ask: &Ask<'_>) -> Result<Step, Refusal> {
        self.reap(ask.now, ask.me);
        let turn = self.turn_instant(ask)?;
        if ask.past_deadline(turn) {
            return Err(not_within(turn, ask.now).into());
        }
        if self.callers.len() >= super::MAX_WAITING {
            return Err(Refusal::Full);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let waiting = self.callers.iter().filter(|c| c.turn.is_none()).count();
        if self.free(ask.cap) > waiting {
            return self.book(ticket, ask);
        }
        self.callers.push(Caller {
            ticket,
            owner: ask.me,
            turn: None,
            seen: ask.now,
        });
        Ok(Step::Waiting {
            ticket,
            behind: waiting + 1 - self.free(ask.cap),
        })
    }

    /// A waiter asks again: booked if a permit is its now, still waiting, or out at its
    /// deadline. A waiter no longer on record (cleared out) arrives anew.
    pub(super) fn ask_again(&mut self, ticket: u64, ask: &Ask<'_>) -> Result<Step, Refusal> {
        let Some(i) = self.callers.iter().position(|c| c.ticket == ticket) else {
            return self.arrive(ask);
        };
        self.callers[i].seen = ask.now;
        let mut ahead = self.waiting_ahead(ticket);
        if self.free(ask.cap) <= ahead && self.reap(ask.now, ask.me) {
            ahead = self.waiting_ahead(ticket);
        }
        if self.free(ask.cap) > ahead {
            self.callers.retain(|c| c.ticket != ticket);
            return self.book(ticket, ask);
        }
        if ask.deadline.is_some_and(|d| ask.now >= d) {
            self.callers.retain(|c| c.ticket != ticket);
            return Err(BudgetError::TimedOut.into());
        }
        Ok(Step::Waiting {
            ticket,
            behind: ahead + 1 - self.free(ask.cap),
        })
    }

    /// A turn now or nothing: no one waits, a permit is free, every dimension admits.
    pub(super) fn try_now(&mut self, ask: &Ask<'_>) -> Result<Step, Refusal> {
        if self.callers.iter().any(|c| c.turn.is_none()) || self.free(ask.cap) == 0 {
            self.reap(ask.now, ask.me);
            if self.callers.iter().any(|c| c.turn.is_none()) || self.free(ask.cap) == 0 {
                return Err(BudgetError::WouldWait.into());
            }
        }
        if self.ledger.ready(ask.cells, ask.now) != Ready::Now {
            return Err(BudgetError::WouldWait.into());
        }
        if self.callers.len() >= super::MAX_WAITING {
            return Err(Refusal::Full);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.book(ticket, ask)
    }

    /// Books caller `ticket` (holding a permit) at the earliest instant every dimension
    /// admits it; refused, and taken off the record, past its deadline.
    fn book(&mut self, ticket: u64, ask: &Ask<'_>) -> Result<Step, Refusal> {
        let at = self.turn_instant(ask)?;
        if ask.past_deadline(at) {
            return Err(not_within(at, ask.now).into());
        }
        let turn = self.ledger.admit(at, ask.cells.into());
        self.callers.push(Caller {
            ticket,
            owner: ask.me,
            turn: Some(turn),
            seen: at,
        });
        Ok(Step::Booked { ticket, turn, at })
    }

    /// The instant the rates would admit `cells` as they stand.
    fn turn_instant(&self, ask: &Ask<'_>) -> Result<u64, BudgetError> {
        match self.ledger.ready(ask.cells, ask.now) {
            Ready::Now => Ok(ask.now),
            Ready::At(at) => Ok(at),
            Ready::Never => Err(BudgetError::NotWithin {
                wait: Duration::MAX,
            }),
        }
    }

    /// Ends caller `ticket`: a waiter leaves; a turn settles (`Some`: each dimension
    /// named costs that many cells) or closes at its estimate. Whether it was on record.
    pub(super) fn end(
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

    /// Turns on record: each holds a permit.
    pub(super) fn in_flight(&self) -> usize {
        self.callers.iter().filter(|c| c.turn.is_some()).count()
    }

    /// Waiters for a permit, and turns booked for a later instant.
    pub(super) fn waiting(&self, now: u64) -> usize {
        self.callers
            .iter()
            .filter(|c| c.turn.is_none() || c.seen > now)
            .count()
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
    fn reap(&mut self, now: u64, me: u64) -> bool {
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
                        let lives = process::still(c.owner);
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

    fn state(per_second: u32, burst: u32) -> State {
        let params = *Quota::per_second(per_second).with_burst(burst).params();
        State::fresh(Ledger::with_capacity(&[params], 16))
    }

    fn ask(cells: &[u32], cap: Option<u32>, now: u64) -> Ask<'_> {
        Ask {
            cells,
            cap,
            now,
            deadline: None,
            me: process::identity(),
        }
    }

    fn booked(step: Result<Step, Refusal>) -> (u64, u64) {
        match step {
            Ok(Step::Booked { ticket, at, .. }) => (ticket, at),
            other => panic!("not booked: {other:?}"),
        }
    }

    fn waiting(step: Result<Step, Refusal>) -> (u64, usize) {
        match step {
            Ok(Step::Waiting { ticket, behind }) => (ticket, behind),
            other => panic!("not waiting: {other:?}"),
        }
    }

    #[test]
    fn callers_are_booked_one_behind_another_in_every_dimension() {
        let mut s = state(10, 2);
        let (_, a) = booked(s.arrive(&ask(&[2], None, 0)));
        let (_, b) = booked(s.arrive(&ask(&[1], None, 0)));
        let (_, c) = booked(s.arrive(&ask(&[2], None, 0)));
        assert_eq!((a, b, c), (0, 100 * MS, 300 * MS));
        assert_eq!(s.waiting(0), 2);
        assert_eq!(s.in_flight(), 3);
    }

    #[test]
    fn permits_go_in_arrival_order_and_a_returned_one_to_the_first_waiter() {
        let mut s = state(1_000, 100);
        let (first, _) = booked(s.arrive(&ask(&[1], Some(1), 0)));
        let (w1, behind1) = waiting(s.arrive(&ask(&[1], Some(1), 0)));
        let (w2, behind2) = waiting(s.arrive(&ask(&[1], Some(1), 0)));
        assert_eq!((behind1, behind2), (1, 2));
        // Nobody jumps the line: not a later waiter, not a try.
        assert_eq!(waiting(s.ask_again(w2, &ask(&[1], Some(1), MS))).1, 2);
        assert!(matches!(
            s.try_now(&ask(&[1], Some(1), MS)),
            Err(Refusal::Budget(BudgetError::WouldWait))
        ));
        assert!(s.end(first, &[1], None));
        assert_eq!(waiting(s.ask_again(w2, &ask(&[1], Some(1), 2 * MS))).1, 1);
        booked(s.ask_again(w1, &ask(&[1], Some(1), 2 * MS)));
        assert_eq!(s.in_flight(), 1);
    }

    #[test]
    fn a_waiter_past_its_deadline_leaves_and_one_too_far_off_never_arrives() {
        let mut s = state(10, 2);
        booked(s.arrive(&ask(&[1], Some(1), 0)));
        let mut late = ask(&[1], Some(1), 0);
        late.deadline = Some(50 * MS);
        let (w, _) = waiting(s.arrive(&late));
        late.now = 50 * MS;
        assert!(matches!(
            s.ask_again(w, &late),
            Err(Refusal::Budget(BudgetError::TimedOut))
        ));
        assert_eq!(s.callers.len(), 1, "the waiter is off the record");
        // The rates put a third cell 100 ms away: a 50 ms deadline is refused at once.
        booked(s.arrive(&ask(&[1], None, 0)));
        let mut far = ask(&[1], None, 0);
        far.deadline = Some(50 * MS);
        assert!(matches!(
            s.arrive(&far),
            Err(Refusal::Budget(BudgetError::NotWithin { .. }))
        ));
        assert_eq!(s.callers.len(), 2);
    }

    #[test]
    fn a_booking_dropped_before_anyone_booked_behind_it_comes_back_whole() {
        let mut s = state(10, 1);
        booked(s.arrive(&ask(&[1], None, 0)));
        let (t, at) = booked(s.arrive(&ask(&[1], None, 0)));
        assert_eq!(at, 100 * MS);
        assert!(s.end(t, &[1], Some(&[Some(0)])));
        let (_, again) = booked(s.arrive(&ask(&[1], None, 0)));
        assert_eq!(again, 100 * MS, "the refunded cell is booked again");
    }

    #[test]
    fn callers_of_a_process_that_is_gone_and_waiters_that_went_silent_are_cleared_out() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = u64::from(child.id()) << 32;
        child.wait().unwrap();
        let mut s = state(1_000, 100);
        let mut theirs = ask(&[1], Some(2), 0);
        theirs.me = gone;
        booked(s.arrive(&theirs));
        booked(s.arrive(&ask(&[1], Some(2), 0)));
        let (silent, _) = waiting(s.arrive(&ask(&[1], Some(2), 0)));
        let (mine, behind) = waiting(s.arrive(&ask(&[1], Some(2), 0)));
        assert_eq!(behind, 2);
        // Silent for `ABANDONED`: the waiter ahead loses its place, and the turn of the
        // process that is gone returns its permit.
        let later = ABANDONED.as_nanos() as u64 + 10 * MS;
        booked(s.ask_again(mine, &ask(&[1], Some(2), later)));
        assert!(s
            .callers
            .iter()
            .all(|c| c.owner != gone && c.ticket != silent));
        assert_eq!(s.in_flight(), 2, "the second caller's turn and mine");
    }
}
