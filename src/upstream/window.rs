//! Recognising an upstream that counts in fixed windows, from the remaining counts it
//! reports, so that a client that spent a window waits for that window's end, not for
//! a whole rounded-up second.
//!
//! # Implementation notes
//!
//! A fixed window shows itself as a *jump*: between two responses to requests sent at the
//! client's pace, the remaining count rises by at least half of the largest count seen
//! (and by at least 2). A token bucket refills about one request per interval at such a
//! pace, never half its burst at once; after a pause (a hold, an idle client) a bucket
//! refills too, so responses further apart than two pace intervals say nothing.
//!
//! The window's length comes from the announced policy's window, or else from the
//! rounded reset the jump's response carries (a fresh window's `t` is its whole length,
//! in whole seconds). A boundary is known only by an upper bound: it passed before the
//! server handled the request that saw the fresh window, so before its response came
//! back. The model is trusted (*confirmed*) once a second jump lands a whole number of
//! windows after the first, within a tenth of a window or two pace intervals, whichever
//! is more (at most a third of a window): the first response after a boundary comes up
//! to an interval late, a fifth of a window at five requests a window. The boundary kept is the tighter
//! of the two bounds, so the predicted ends are never before the real ones, and a
//! client that waits for them is never early. An inconsistent jump starts the model over.

use core::time::Duration;

use super::signal::Reset;

/// The fixed-window model (module docs). Times are nanoseconds on the follower's clock.
#[derive(Debug, Default)]
pub(super) struct Window {
    /// The window's length.
    period: Option<u64>,
    /// An upper bound on one boundary.
    boundary: Option<u64>,
    confirmed: bool,
    /// The largest remaining count seen, plus one.
    capacity: u64,
    /// The previous response's remaining count and arrival.
    last: Option<(u64, u64)>,
}

impl Window {
    /// A response at `now` saying `remaining` is left, with `reset`; `window` is the
    /// announced policy's window, `interval` the client's pace.
    pub(super) fn observe(
        &mut self,
        now: u64,
        remaining: u64,
        reset: Option<Reset>,
        window: Option<Duration>,
        interval: u64,
    ) {
        self.capacity = self.capacity.max(remaining.saturating_add(1));
        if let Some((before, at)) = self.last {
            let jump = remaining.saturating_sub(before);
            let paced = now.saturating_sub(at) <= interval.saturating_mul(2);
            if paced && jump >= 2 && jump >= self.capacity / 2 {
                let length = window
                    .or(reset.map(|r| r.at_most()))
                    .map(nanos)
                    .filter(|l| *l > 0);
                self.boundary_passed(now, length, interval);
            }
        }
        self.last = Some((remaining, now));
    }

    fn boundary_passed(&mut self, now: u64, length: Option<u64>, interval: u64) {
        if let (Some(b), Some(p)) = (self.boundary, self.period) {
            if now >= b {
                let k = (now - b).saturating_add(p / 2) / p;
                let predicted = b.saturating_add(k.saturating_mul(p));
                // A jump is seen by the first response after a boundary: up to a pace
                // interval late (two, with the round trip), however few a window holds.
                let slack = (p / 10).max(interval.saturating_mul(2)).min(p / 3);
                if k >= 1 && now.abs_diff(predicted) <= slack {
                    self.confirmed = true;
                    self.boundary = Some(now.min(predicted));
                    return;
                }
            }
        }
        self.boundary = Some(now);
        self.period = length.or(self.period);
        self.confirmed = false;
    }

    /// The next window's start after `now`, once the model is confirmed.
    pub(super) fn next_boundary(&self, now: u64) -> Option<u64> {
        if !self.confirmed {
            return None;
        }
        let (b, p) = (self.boundary?, self.period?);
        let passed = now.saturating_sub(b) / p;
        Some(b.saturating_add(passed.saturating_add(1).saturating_mul(p)))
    }

    /// Requests per second the windows allow, once the model is confirmed.
    pub(super) fn rate(&self) -> Option<f64> {
        let p = self.period.filter(|_| self.confirmed)?;
        Some(self.capacity as f64 / (p as f64 / 1e9))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn second() -> Option<Reset> {
        Some(Reset::Rounded(Duration::from_secs(1)))
    }

    /// 50 per 1 s window, boundaries at whole seconds plus `phase`, a client at 40/s.
    fn windows(phase: u64, until: u64) -> Window {
        let mut w = Window::default();
        let mut t = 0;
        let mut count = 0;
        let mut current = u64::MAX;
        while t < until {
            let window = t.saturating_sub(phase) / S;
            if window != current {
                (current, count) = (window, 0);
            }
            count += 1;
            w.observe(t + MS, 50u64.saturating_sub(count), second(), None, 25 * MS);
            t += 25 * MS;
        }
        w
    }

    #[test]
    fn two_jumps_a_window_apart_confirm_it_and_the_ends_are_never_early() {
        let w = windows(300 * MS, 1_200 * MS);
        assert_eq!(w.next_boundary(1_200 * MS), None, "one jump is not enough");
        let w = windows(300 * MS, 2_400 * MS);
        let next = w.next_boundary(2_400 * MS).unwrap();
        assert!((3_300 * MS..=3_330 * MS).contains(&next), "{next}");
        assert_eq!(w.rate(), Some(50.0));
    }

    #[test]
    fn a_few_requests_a_window_are_recognised_too() {
        // 5 per 1 s window, boundaries at whole seconds plus 300 ms, a client at 4.75/s:
        // the first response after a boundary comes up to a fifth of a window late.
        for phase in [0, 100 * MS, 300 * MS, 700 * MS] {
            let mut w = Window::default();
            let (mut current, mut count) = (u64::MAX, 0);
            let interval = 210 * MS;
            let mut t = 0;
            while t < 6 * S {
                let window = (t + S - phase) / S;
                if window != current {
                    (current, count) = (window, 0);
                }
                count += 1;
                w.observe(t + MS, 5u64.saturating_sub(count), second(), None, interval);
                t += interval;
            }
            let next = w.next_boundary(6 * S);
            assert!(next.is_some(), "phase {phase}: not recognised");
            // Never before the real end.
            assert!(next.unwrap() % S >= phase % S, "{next:?} {phase}");
        }
    }

    #[test]
    fn a_token_bucket_is_not_a_window() {
        // Bursts of 10 at 50/s, a client at 40/s: the count climbs one at a time.
        let mut w = Window::default();
        let (mut tat, interval) = (0u64, 20 * MS);
        for i in 0..200u64 {
            let now = i * 25 * MS;
            tat = tat.max(now) + interval;
            let remaining = (now + 10 * interval).saturating_sub(tat) / interval;
            w.observe(now, remaining, second(), None, 25 * MS);
        }
        assert_eq!(w.rate(), None);
        // After a pause the bucket is whole again: no window either.
        w.observe(20 * S, 9, second(), None, 25 * MS);
        w.observe(40 * S, 9, second(), None, 25 * MS);
        assert_eq!(w.rate(), None);
    }
}
