//! GCRA as pure functions on integers: the first of paceline's three layers (arithmetic,
//! cell, adapters; see `lib.rs`).
//!
//! No atomics, no clock, no allocation: the cell (`crate::cell`) feeds these functions the
//! word it loaded and the time it was given, and the property tests and fuzzers hammer them
//! directly.
//!
//! # Implementation notes
//!
//! All times are `u64` nanoseconds on the limiter's clock, which covers 584 years.
//! With emission interval `T` (at least 1 ns) and burst `b`, the tolerance is
//! `tau = b * T` and a request's cost is `n * T`, both *saturating* at `u64::MAX`: a
//! tolerance or a cost past 584 years is indistinguishable from 584 years within any
//! limiter's lifetime, so a quota like one per hour with a burst of `u32::MAX` is accepted
//! and behaves as "the whole burst, then one per hour" for as long as time is representable.
//! A request for `n` cells at time `now` against the theoretical arrival time `tat` is
//! admitted iff
//!
//! ```text
//! max(tat, now) + n*T - now <= tau
//! ```
//!
//! which is evaluated as `backlog <= tau - cost` with `backlog = max(tat, now) - now`, so
//! neither side can overflow. A request whose new TAT `max(tat, now) + cost` would pass
//! `u64::MAX` is denied with a wait of `u64::MAX` ns ("never"): that edge is only reachable
//! by a limiter that has lived for 584 years minus its burst window, and it errs on the side
//! of denying (saturating instead would let every request at `u64::MAX` through).
//! A clock that steps backwards only makes `backlog` larger, so it can delay cells but
//! never admit more than the quota.

/// The integer form of a quota: what the arithmetic needs, nothing more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Params {
    /// Emission interval `T` in nanoseconds; at least 1.
    interval: u64,
    /// Burst `b`; at least 1.
    burst: u32,
    /// Tolerance `tau = b * T` in nanoseconds, saturated at `u64::MAX` (module docs).
    tau: u64,
}

impl Params {
    /// Returns `None` when `interval` or `burst` is zero; `burst * interval` saturates.
    pub(crate) const fn new(interval: u64, burst: u32) -> Option<Params> {
        if interval == 0 || burst == 0 {
            return None;
        }
        Some(Params {
            interval,
            burst,
            tau: interval.saturating_mul(burst as u64),
        })
    }

    /// The parts of a `Params` that `Params::new` made (stored apart and read back
    /// together by `QuotaCell`): `interval` and `burst` at least 1, `tau` their
    /// saturated product.
    #[inline]
    pub(crate) const fn from_parts(interval: u64, burst: u32, tau: u64) -> Params {
        debug_assert!(interval > 0 && burst > 0);
        Params {
            interval,
            burst,
            tau,
        }
    }

    pub(crate) const fn interval(&self) -> u64 {
        self.interval
    }

    pub(crate) const fn burst(&self) -> u32 {
        self.burst
    }

    pub(crate) const fn tau(&self) -> u64 {
        self.tau
    }

    /// How far the TAT may be ahead of now for one more cell to fit: `tau - interval`,
    /// never negative, as the burst is at least 1.
    pub(crate) const fn room_for_one(&self) -> u64 {
        self.tau - self.interval
    }

    /// The cost `n * T` of `n` cells in nanoseconds, or why they can never be admitted.
    #[inline]
    pub(crate) const fn cost(&self, n: u32) -> Result<u64, Unfit> {
        if n > self.burst {
            return Err(Unfit::OverBurst);
        }
        match (n as u64).checked_mul(self.interval) {
            // n <= burst, so the cost is at most the (possibly saturated) tau.
            Some(cost) => Ok(cost),
            // Only where tau saturated: a TAT this far ahead is past the end of time.
            None => Err(Unfit::PastEndOfTime),
        }
    }
}

/// Why a request can never be admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unfit {
    /// More cells than the burst.
    OverBurst,
    /// Its cost alone passes `u64::MAX` ns (584 years): only a saturated burst window lets
    /// such a request within the burst, and no TAT can hold it.
    PastEndOfTime,
}

/// Decides one request of weight `cost` at `now` against `tat`, with tolerance `tolerance`.
///
/// Returns the new TAT on admission, or the wait in nanoseconds (always at least 1) until
/// the same request would be admitted. `tolerance` is `tau` for a plain check; booking a
/// waiter uses `tau + max_wait` (saturating), so "admitted" then means "admitted within
/// `max_wait`". A `cost` above `tolerance` can never be admitted and waits `u64::MAX`
/// (callers rule it out first with [`Params::cost`], which keeps `cost <= tau`).
#[inline]
pub(crate) const fn admit(tat: u64, now: u64, cost: u64, tolerance: u64) -> Result<u64, u64> {
    match tolerance.checked_sub(cost) {
        Some(room) => admit_in_room(tat, now, cost, room),
        None => Err(u64::MAX),
    }
}

/// [`admit`] with the room already worked out: `room = tolerance - cost`, how far the TAT
/// may be ahead of `now` for the request to fit (a one-cell check reads it stored).
#[inline]
pub(crate) const fn admit_in_room(tat: u64, now: u64, cost: u64, room: u64) -> Result<u64, u64> {
    let base = if tat > now { tat } else { now };
    let backlog = base - now;
    if backlog > room {
        return Err(backlog - room);
    }
    match base.checked_add(cost) {
        Some(tat) => Ok(tat),
        // Past the end of representable time: deny for ever rather than saturate (a TAT
        // stuck at u64::MAX would admit every request made at u64::MAX).
        None => Err(u64::MAX),
    }
}

/// How many cells are admissible at `now` without waiting: `floor((tau - backlog) / T)`,
/// and no more than fit before the end of representable time (a TAT past `u64::MAX`,
/// which [`admit`] denies), so `admit` takes exactly this many.
#[inline]
pub(crate) const fn remaining(tat: u64, now: u64, params: &Params) -> u32 {
    let base = if tat > now { tat } else { now };
    let backlog = base - now;
    if backlog >= params.tau {
        return 0;
    }
    let in_window = (params.tau - backlog) / params.interval;
    let before_the_end = (u64::MAX - base) / params.interval;
    let cells = if in_window < before_the_end {
        in_window
    } else {
        before_the_end
    };
    // cells <= (tau - backlog) / T <= tau / T == burst, so the cast cannot truncate.
    cells as u32
}

/// How far before the TAT it left a booking of `cost` may proceed: `max(tau, cost)`. The
/// booking's instant (limiter time) is its TAT minus this, or 0 when that is before the
/// clock's origin.
///
/// At booking `cost <= tau`, so the instant is `tat - tau`. After a quota change to a
/// burst window smaller than the booking (`Limiter::set_quota`), it is `tat - cost`: the
/// booking's cells are then accounted as admitted at that instant, when they fill the TAT
/// from the instant up, so no window ever holds more than its length plus the largest
/// burst window in force while its cells were booked or admitted. (With `tat - tau` the
/// TAT would be only `tau` ahead of a booking that used `cost > tau`, and a later larger
/// quota would admit its burst again on top.)
#[inline]
#[cfg_attr(not(feature = "std"), allow(dead_code))] // waiting's
pub(crate) const fn ready_window(cost: u64, params: &Params) -> u64 {
    if cost > params.tau {
        cost
    } else {
        params.tau
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn p(interval: u64, burst: u32) -> Params {
        Params::new(interval, burst).unwrap()
    }

    #[test]
    fn params_refuse_zero_and_overflow() {
        assert!(Params::new(0, 1).is_none());
        assert!(Params::new(1, 0).is_none());
        assert_eq!(Params::new(u64::MAX, 2).unwrap().tau(), u64::MAX);
        assert_eq!(Params::new(u64::MAX, 1).unwrap().tau(), u64::MAX);
        let huge = Params::new(3_600_000_000_000, u32::MAX).unwrap();
        assert_eq!(huge.tau(), u64::MAX);
        assert_eq!(huge.cost(u32::MAX), Err(Unfit::PastEndOfTime));
        assert_eq!(huge.cost(1), Ok(3_600_000_000_000));
        assert_eq!(
            remaining(0, 0, &huge),
            (u64::MAX / 3_600_000_000_000) as u32
        );
        assert_eq!(p(10, 3).tau(), 30);
    }

    #[test]
    fn cost_refuses_more_than_burst() {
        let q = p(10, 3);
        assert_eq!(q.cost(0), Ok(0));
        assert_eq!(q.cost(3), Ok(30));
        assert_eq!(q.cost(4), Err(Unfit::OverBurst));
        assert_eq!(q.cost(u32::MAX), Err(Unfit::OverBurst));
    }

    #[test]
    fn fresh_state_admits_a_full_burst_then_denies() {
        let q = p(10 * MS, 3);
        let mut tat = 0;
        for _ in 0..3 {
            tat = admit(tat, 0, q.cost(1).unwrap(), q.tau()).unwrap();
        }
        assert_eq!(tat, 30 * MS);
        // The fourth cell is due when tat - tau + T <= now, i.e. after one interval.
        assert_eq!(admit(tat, 0, q.cost(1).unwrap(), q.tau()), Err(10 * MS));
        assert_eq!(admit(tat, 4 * MS, q.cost(1).unwrap(), q.tau()), Err(6 * MS));
        assert_eq!(
            admit(tat, 10 * MS, q.cost(1).unwrap(), q.tau()),
            Ok(40 * MS)
        );
    }

    #[test]
    fn idle_time_resets_the_backlog_but_never_banks_more_than_the_burst() {
        let q = p(5, 2);
        // Long after the last cell, the TAT restarts from now.
        assert_eq!(admit(10, 1_000, q.cost(2).unwrap(), q.tau()), Ok(1_010));
        assert_eq!(remaining(10, 1_000, &q), 2);
    }

    #[test]
    fn heavy_requests_wait_for_their_whole_cost() {
        let q = p(10, 5);
        // Backlog 30 of tau 50: 2 cells fit now, 3 need 10 more ns.
        assert_eq!(remaining(30, 0, &q), 2);
        assert_eq!(admit(30, 0, q.cost(2).unwrap(), q.tau()), Ok(50));
        assert_eq!(admit(30, 0, q.cost(3).unwrap(), q.tau()), Err(10));
        assert_eq!(admit(30, 0, q.cost(5).unwrap(), q.tau()), Err(30));
    }

    #[test]
    fn zero_cells_change_nothing_unless_the_backlog_exceeds_the_tolerance() {
        let q = p(10, 5);
        assert_eq!(admit(30, 0, 0, q.tau()), Ok(30));
        assert_eq!(admit(80, 0, 0, q.tau()), Err(30));
    }

    #[test]
    fn a_clock_stepping_backwards_only_delays() {
        let q = p(10, 1);
        let tat = admit(0, 100, 10, q.tau()).unwrap();
        assert_eq!(tat, 110);
        // Time "goes back" to 50: the backlog looks larger, so the cell is denied.
        assert_eq!(admit(tat, 50, 10, q.tau()), Err(60));
        assert_eq!(remaining(tat, 50, &q), 0);
    }

    #[test]
    fn extended_tolerance_books_within_a_deadline() {
        let q = p(10, 1);
        // tat 100 at now 0: a cell is due at 100; within 95 it is not, within 100 it is.
        assert_eq!(admit(100, 0, 10, q.tau() + 95), Err(5));
        assert_eq!(admit(100, 0, 10, q.tau() + 100), Ok(110));
        assert_eq!(110u64.saturating_sub(ready_window(10, &q)), 100);
        // A booking larger than the (changed) burst window waits for its own cost only.
        assert_eq!(110u64.saturating_sub(ready_window(30, &q)), 80);
        assert_eq!(admit(100, 0, 10, u64::MAX), Ok(110));
    }

    #[test]
    fn arithmetic_denies_past_the_edge_of_time() {
        let q = p(u64::MAX, 1);
        assert_eq!(admit(0, 0, u64::MAX, u64::MAX), Ok(u64::MAX));
        assert_eq!(admit(0, 1, u64::MAX, u64::MAX), Err(u64::MAX));
        assert_eq!(admit(u64::MAX, u64::MAX, u64::MAX, q.tau()), Err(u64::MAX));
        assert_eq!(admit(u64::MAX, u64::MAX, 0, q.tau()), Ok(u64::MAX));
        assert_eq!(admit(u64::MAX, 0, 1, 1), Err(u64::MAX));
        assert_eq!(remaining(u64::MAX, 0, &q), 0);
        assert_eq!(5u64.saturating_sub(ready_window(1, &q)), 0);
    }
}
