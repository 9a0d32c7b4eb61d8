//! Learning an upstream's rate from the refusals it sends: additive increase,
//! multiplicative decrease (AIMD), as pure arithmetic on a time the caller passes.
//!
//! # Implementation notes
//!
//! The learned rate is a ceiling on the pace, beside the configured quota and any
//! announced one. A *congestion event* (a refusal, or a response whose remaining count
//! fell to zero; the follower decides which responses count) cuts it:
//!
//! * to [`FIRST_DECREASE`] (0.475) times the pace when nothing else is known of the
//!   upstream's rate (no announced policy, no earlier cut): the client may be far too
//!   fast, and halving finds the right range in one step for a client configured at up
//!   to twice its upstream; less the 5 % an announced pace leaves for jitter
//!   ([`PACE_SHARE`](super::PACE_SHARE)), so that a client at exactly twice its upstream
//!   lands just below the upstream's rate rather than on it, where the jitter of every
//!   window (or burst) sends one request too many and draws a second refusal;
//! * to [`DECREASE`] (0.9) times the pace otherwise.
//!
//! For a [`GRACE`] of one second after a halving, events cut nothing: the client's
//! too-fast start emptied the upstream's bucket (or spent its window), and until that
//! refills, requests at the halved pace that arrive a little bunched are refused
//! whatever the pace (a client at twice its upstream cut itself to a third of it in
//! the first second, one bunched arrival after another). The refusals still hold as
//! they say.
//!
//! (The rate a client got through is no bound to cut to: it is the client's own sending
//! rate as much as the upstream's, and a client with few tasks, or slow responses, sends
//! below its pace; cutting to it would spiral down.)
//!
//! After a cut the rate grows back, until it reaches the ceilings above it and is
//! forgotten (the client then runs at those again):
//!
//! * when nothing says what the upstream's rate is, by [`INCREASE`] (0.5 %) of the rate
//!   after the cut, per second: about 20 s to win back a 10 % cut, so that an upstream
//!   that answers refusals with whole-second holds sees about one refusal per 20 s near
//!   its limit (each costs up to a second of its rate);
//! * when an announced pace (or a recognised window) says it, a cut is won back over
//!   [`REGROW_REQUESTS`] (100) requests at the learned rate: 2 s at 50/s, 20 s at 5/s.
//!   Below a known rate a refusal says that requests arrived bunched (the pace leaves 5 %
//!   for that), not that the rate is wrong, and its hold is short (two intervals for a
//!   rounded `Retry-After`, the rest of a spent window); should refusals go on, they
//!   come at most about once per hundred requests.

/// The first cut, when nothing else is known of the upstream's rate.
pub(super) const FIRST_DECREASE: f64 = 0.5 * super::PACE_SHARE;
/// Every later cut.
pub(super) const DECREASE: f64 = 0.9;
/// The growth after a cut, per second, as a share of the rate after the cut, when
/// nothing says what the upstream's rate is.
pub(super) const INCREASE: f64 = 0.005;
/// When the upstream's rate is known: the requests over which a cut by a tenth is won
/// back.
pub(super) const REGROW_REQUESTS: f64 = 100.0;
/// What a later cut takes away.
const DECREASE_SHARE: f64 = 1.0 - DECREASE;
/// After a first cut that halved the pace: how long its upstream's refusals are put down
/// to the bucket (or window) that the too-fast start emptied, not to the new pace.
pub(super) const GRACE: u64 = 1_000_000_000;

const NANOS: f64 = 1e9;

/// The learned rate (module docs). Times are nanoseconds on the follower's clock.
#[derive(Debug, Default)]
pub(super) struct Learned {
    /// Requests per second at `since`; `None` when nothing is learned (or it was
    /// forgotten).
    rate: Option<f64>,
    since: u64,
    /// Growth, requests per second per second.
    slope: f64,
    /// Cuts so far.
    cuts: u64,
    /// Until when congestion events are not cuts (a halving's [`GRACE`]).
    grace_until: u64,
}

impl Learned {
    /// The learned rate at `now`, if any.
    pub(super) fn rate_at(&self, now: u64) -> Option<f64> {
        let rate = self.rate?;
        let elapsed = now.saturating_sub(self.since) as f64 / NANOS;
        Some(rate + self.slope * elapsed)
    }

    /// A congestion event at `now`, the pace being `pace` requests per second;
    /// `rate_known` when an announced policy (or an observed window) says what the
    /// upstream's rate is. Within a halving's [`GRACE`], nothing.
    pub(super) fn cut(&mut self, now: u64, pace: f64, rate_known: bool) {
        if now < self.grace_until {
            return;
        }
        let halving = self.cuts == 0 && !rate_known;
        let factor = if halving { FIRST_DECREASE } else { DECREASE };
        if halving {
            self.grace_until = now.saturating_add(GRACE);
        }
        let rate = factor * pace;
        self.rate = Some(rate);
        self.since = now;
        self.slope = if rate_known {
            // A tenth of the rate back over `REGROW_REQUESTS` requests at it.
            DECREASE_SHARE * rate * rate / REGROW_REQUESTS
        } else {
            INCREASE * rate
        };
        self.cuts = self.cuts.saturating_add(1);
    }

    /// Whether a rate is learned (a cut not yet won back).
    pub(super) fn is_set(&self) -> bool {
        self.rate.is_some()
    }

    /// Forgets the learned rate (the upstream announced a higher pace: what was learned
    /// below the old one says nothing of the new).
    pub(super) fn forget(&mut self) {
        self.rate = None;
    }

    /// Forgets the learned rate once it has grown to `ceiling`.
    pub(super) fn settle(&mut self, now: u64, ceiling: f64) {
        if self.rate_at(now).is_some_and(|rate| rate >= ceiling) {
            self.rate = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn halves_first_below_the_edge_then_cuts_by_a_tenth_and_grows_back() {
        let mut learned = Learned::default();
        assert_eq!(learned.rate_at(0), None);
        // A client at twice its upstream lands below the upstream's rate, not on it.
        learned.cut(S, 100.0, false);
        assert!((learned.rate_at(S).unwrap() - 47.5).abs() < 1e-9);
        // 0.5 % of the rate after the cut (47.5) per second.
        assert!((learned.rate_at(11 * S).unwrap() - 49.875).abs() < 1e-9);
        learned.cut(11 * S, 55.0, false);
        assert!((learned.rate_at(11 * S).unwrap() - 49.5).abs() < 1e-9);
        assert!((learned.rate_at(21 * S).unwrap() - 49.5 * 1.05).abs() < 1e-9);
        learned.settle(11 * S, 100.0);
        assert!(learned.rate_at(11 * S).is_some());
        learned.settle(200 * S, 60.0);
        assert_eq!(learned.rate_at(200 * S), None);
    }

    #[test]
    fn a_halving_is_followed_by_a_second_of_grace() {
        let mut learned = Learned::default();
        learned.cut(S, 100.0, false);
        learned.cut(S + S / 2, 47.5, false);
        // Not cut, only grown.
        assert!(learned.rate_at(S + S / 2).unwrap() > 47.5);
        learned.cut(2 * S, 47.5, false);
        assert!((learned.rate_at(2 * S).unwrap() - 42.75).abs() < 1e-9);
        // Cuts by a tenth have no grace.
        learned.cut(2 * S, 42.75, false);
        assert!((learned.rate_at(2 * S).unwrap() - 38.475).abs() < 1e-9);
    }

    #[test]
    fn a_known_rate_is_cut_by_a_tenth_even_the_first_time_and_won_back_in_100_requests() {
        let mut learned = Learned::default();
        learned.cut(0, 47.5, true);
        assert!((learned.rate_at(0).unwrap() - 42.75).abs() < 1e-9);
        // 100 requests at 42.75/s: 2.339 s for a tenth of it back.
        let hundred = (100.0 / 42.75 * S as f64) as u64;
        assert!((learned.rate_at(hundred).unwrap() - 42.75 * 1.1).abs() < 1e-6);
        // At 5/s, the same tenth takes 20 s.
        learned.cut(0, 5.0 / 0.9, true);
        assert!((learned.rate_at(20 * S).unwrap() - 5.5).abs() < 1e-6);
    }
}
