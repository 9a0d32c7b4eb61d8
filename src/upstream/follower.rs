//! [`Follower`]: one upstream's limiter, steered by what the upstream says.
//!
//! # Implementation notes
//!
//! The follower owns the limiter every request to its upstream waits on. Its quota is
//! the lowest of three ceilings, never more than the caller's:
//!
//! * the **configured** quota: the caller's (a quota the caller sets on the limiter
//!   itself is taken as the new configured one, never overridden);
//! * the **announced** pace: the tightest [`Signal::pace`] policy, at [`PACE_SHARE`]
//!   (95 %) of its rate, so that requests that arrive a little bunched (timer and network
//!   jitter) still fit an upstream that allows no burst; kept until another is announced
//!   (or [`FollowerConfig::revert_after`] of silence), and followed up as well as down, to
//!   the configured quota (or above it, with [`FollowerConfig::above_configured`]). A
//!   fixed window the follower recognised (`window.rs`) stands for an announced pace
//!   when none is announced;
//! * the **learned** rate (`learn.rs`): AIMD on congestion events.
//!
//! Below the configured quota the pace has a burst of one: an upstream's quota of `q`
//! per window is followed by spacing requests evenly, which never puts more than `q` in
//! any window, whether the upstream counts in a token bucket or fixed windows.
//!
//! **Congestion events.** A `429` is one, unless an announced pace lowered by the same
//! response explains it; so is a success whose remaining count fell to zero from above
//! (an upstream that says "that was the last one" before it refuses: the fall, not the
//! zero, since at the upstream's exact rate the count stays at zero), unless a learned
//! rate is still below the ceilings (a count flickering between one and zero at the edge
//! of a bucket loses nothing: after the first cut, only refusals cut). Only the first
//! refusal of a run counts, and only for a request sent after the pace last went down
//! (the others were sent too fast before the client knew: one cut per round trip, as TCP
//! does).
//!
//! **Holds.** `Retry-After` holds (a `429` or `503`). A reset with nothing left holds
//! when it says something a pace cannot: an exact time, or two seconds or more; a
//! rounded `t=1` or `t=0` (anything up to a second) is a pace signal instead, except on
//! a recognised fixed window, where it holds until the window's end. Consecutive bare
//! `429`s (nothing said about when) back off: the second holds two pace intervals, each
//! later one twice the one before, never past a reset named for what is spent. Every
//! hold is capped at [`FollowerConfig::max_hold`], and so is the spacing of any pace the
//! upstream imposes: nothing it says makes a caller wait longer than that.
//!
//! **Lowering the pace re-spaces booked turns** ([`Limiter::set_quota_respaced`]): 600
//! tasks that booked their turns at the configured rate leave at the new one.

use core::time::Duration;
use std::sync::{Arc, Mutex};

use super::config::FollowerConfig;
use super::learn::Learned;
use super::sent::Sent;
use super::signal::{Reset, Signal};
use super::window::Window;
use crate::clock::{Clock, DefaultClock};
use crate::{Limiter, NotUntil, Quota};
use pace::nanos_per;

/// The share of an announced pace the follower runs at (module docs): requests that
/// reach the upstream a little bunched (timer and network jitter) still fit one that
/// allows no burst; about 1 ms of slack per request at 50/s.
///
/// # Examples
///
/// ```
/// assert_eq!(paceline::upstream::PACE_SHARE, 0.95);
/// ```
pub const PACE_SHARE: f64 = 0.95;

/// A pace interval below which a one-second `Retry-After` on a first refusal is read as a
/// wait rounded up to whole seconds (`Follower::apply`).
const ROUNDED_EDGE_INTERVAL: u64 = 500_000_000;

/// One upstream's limiter, steered by what the upstream says (see the module docs of
/// [`crate::upstream`] for the model): every request waits its turn on
/// [`Follower::limiter`] ([`Follower::until_ready`]), and every response goes to
/// [`Follower::apply`].
///
/// (One name per concept: a follower is the thing that follows one upstream, here and in
/// the Python package; it is configured by a [`FollowerConfig`], and a table of them, one
/// per upstream host, is [`Followers`](super::Followers).)
///
/// # Examples
///
/// ```
/// use paceline::upstream::{Follower, FollowerConfig, Signal};
/// use paceline::{clock::ManualClock, Quota};
/// use std::time::{Duration, SystemTime};
///
/// let clock = ManualClock::new();
/// let follower = Follower::with_clock(Quota::per_second(100), FollowerConfig::default(), clock.clone());
/// let sent = follower.sent();
/// // Too many requests, come back in 2 s; the quota is 50 per second.
/// let headers = [("retry-after", &b"2"[..]), ("ratelimit-policy", &b"\"api\";q=50;w=1"[..])];
/// follower.apply(&Signal::read(429, headers, SystemTime::now()), sent);
/// assert!(follower.limiter().check().is_err());
/// clock.advance(Duration::from_secs(2));
/// assert!(follower.limiter().check().is_ok());
/// // 95 % of the announced 50 per second, one at a time.
/// assert_eq!(follower.limiter().quota().burst(), 1);
/// ```
#[derive(Debug)]
pub struct Follower<C: Clock = DefaultClock> {
    config: FollowerConfig,
    limiter: Arc<Limiter<C>>,
    run: Option<Arc<Limiter<C>>>,
    clock: C,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    configured: Quota,
    /// The quota the follower last set on its limiter.
    set: Quota,
    /// The announced pace (requests per second) and when it was last announced.
    announced: Option<(f64, u64)>,
    learned: Learned,
    window: Window,
    /// The fewest remaining of the previous response that said.
    last_remaining: Option<u64>,
    /// Consecutive refusals.
    streak: u32,
    /// When the pace last went down.
    lowered_at: u64,
    /// Until when the upstream last said that what it allows is spent (0: never said),
    /// on any answer: a refusal that repeats nothing is still bound by it.
    spent_until: u64,
}

impl Follower {
    /// Follows an upstream for a client configured with `configured`, on the default clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Follower, FollowerConfig};
    /// let follower = Follower::new(paceline::Quota::per_second(10), FollowerConfig::default());
    /// assert_eq!(follower.limiter().quota(), paceline::Quota::per_second(10));
    /// ```
    pub fn new(configured: Quota, config: FollowerConfig) -> Follower {
        Follower::with_clock(configured, config, DefaultClock::default())
    }
}

impl<C: Clock> Follower<C> {
    /// [`Follower::new`] on `clock`.
    ///
    /// # Examples
    ///
    /// See [`Follower`].
    pub fn with_clock(configured: Quota, config: FollowerConfig, clock: C) -> Follower<C> {
        let make = || Arc::new(Limiter::with_clock(configured, clock.clone()));
        Follower {
            config,
            limiter: make(),
            run: config.execution_bound.then(make),
            state: Mutex::new(State {
                configured,
                set: configured,
                announced: None,
                learned: Learned::default(),
                window: Window::default(),
                last_remaining: None,
                streak: 0,
                lowered_at: 0,
                spent_until: 0,
            }),
            clock,
        }
    }

    /// The limiter every request to this upstream waits on: its quota is the pace the
    /// follower keeps (module docs). Setting a quota on it makes that the configured one.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Follower;
    /// use paceline::Quota;
    /// let follower = Follower::new(Quota::per_second(10), Default::default());
    /// follower.limiter().set_quota(Quota::per_second(2)); // the caller's own retune
    /// assert_eq!(follower.limiter().quota(), Quota::per_second(2));
    /// ```
    pub fn limiter(&self) -> &Arc<Limiter<C>> {
        &self.limiter
    }

    /// The second limiter of [`FollowerConfig::execution_bound`], if on: each request
    /// takes its cell again there when it is about to be sent.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Follower, FollowerConfig};
    /// let follower = Follower::new(paceline::Quota::per_second(10), FollowerConfig::default());
    /// assert!(follower.execution_limiter().is_some());
    /// let off = FollowerConfig::default().execution_bound(false);
    /// assert!(Follower::new(paceline::Quota::per_second(10), off).execution_limiter().is_none());
    /// ```
    pub fn execution_limiter(&self) -> Option<&Arc<Limiter<C>>> {
        self.run.as_ref()
    }

    /// The configured quota (the caller's: see [`Follower::limiter`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let follower = paceline::upstream::Follower::new(paceline::Quota::per_second(10), Default::default());
    /// assert_eq!(follower.configured(), paceline::Quota::per_second(10));
    /// ```
    pub fn configured(&self) -> Quota {
        self.lock().configured
    }

    /// Sets the configured quota (a caller whose own limiter is elsewhere says it
    /// changed); the pace follows at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::Quota;
    /// let follower = paceline::upstream::Follower::new(Quota::per_second(10), Default::default());
    /// follower.set_configured(Quota::per_second(4));
    /// assert_eq!(follower.limiter().quota(), Quota::per_second(4));
    /// ```
    pub fn set_configured(&self, quota: Quota) {
        let now = self.clock.now();
        let mut state = self.lock();
        if state.configured != quota {
            state.configured = quota;
            self.steer(&mut state, now, f64::INFINITY);
        }
    }

    /// The pace the upstream announced (requests per second, before [`PACE_SHARE`]), if
    /// one is in force.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Follower, Signal};
    /// let follower = Follower::new(paceline::Quota::per_second(100), Default::default());
    /// let headers = [("ratelimit-policy", &b"\"a\";q=50;w=1"[..])];
    /// follower.apply(&Signal::read(200, headers, std::time::SystemTime::now()), follower.sent());
    /// assert_eq!(follower.announced(), Some(50.0));
    /// ```
    pub fn announced(&self) -> Option<f64> {
        self.lock().announced.map(|(rate, _)| rate)
    }

    /// The instant a request leaves, to pass to [`Follower::apply`] with its response.
    ///
    /// # Examples
    ///
    /// See [`Follower`].
    pub fn sent(&self) -> Sent {
        Sent::from_nanos(self.clock.now())
    }

    /// Waits this request's turn: on [`Follower::limiter`], then (with the execution
    /// bound) on [`Follower::execution_limiter`].
    ///
    /// # Examples
    ///
    /// ```
    /// let follower = paceline::upstream::Follower::new(paceline::Quota::per_second(10), Default::default());
    /// futures::executor::block_on(follower.until_ready());
    /// ```
    pub async fn until_ready(&self) {
        self.limiter.until_ready().await;
        if let Some(run) = &self.run {
            self.realign(run);
            run.until_ready().await;
        }
    }

    /// A request about to take its turn on the execution limiter `run`: when that turn
    /// is not now (the request resumed late, after a stall, and waits again), holds the
    /// booking limiter until the execution limiter admits again, so that the turns
    /// booked from now on come when their requests can be sent. Otherwise every later
    /// request would wait twice for as long as the load lasts, and the next stall would
    /// find them all waiting on the execution limiter, with nothing left to space them
    /// when they resume together.
    ///
    /// Only a lag of a whole interval or more counts: a request a moment late (timer
    /// jitter) waits that moment on the execution limiter, and holding the booking
    /// limiter for it would push every later turn back by each such moment, for good.
    fn realign(&self, run: &Limiter<C>) {
        let behind = run.peek();
        let interval = run.quota().emission_interval();
        if behind >= interval {
            self.limiter.hold_for(behind.saturating_add(interval));
        }
    }

    /// [`Follower::until_ready`] within `max`: books nothing if the turn is further
    /// away than that, and gives the turn back if a hold moves it past `max` while it
    /// waits.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait, when the turn is not within `max`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::Follower;
    /// use std::time::Duration;
    /// let follower = Follower::new(paceline::Quota::per_minute(1), Default::default());
    /// futures::executor::block_on(async {
    ///     follower.until_ready_within(Duration::ZERO).await.unwrap();
    ///     assert!(follower.until_ready_within(Duration::from_secs(1)).await.is_err());
    /// });
    /// ```
    pub async fn until_ready_within(&self, max: Duration) -> Result<(), NotUntil> {
        let deadline = self
            .clock
            .now()
            .saturating_add(crate::wait::duration_nanos(max));
        for limiter in core::iter::once(&self.limiter).chain(self.run.as_ref()) {
            if !Arc::ptr_eq(limiter, &self.limiter) {
                self.realign(limiter);
            }
            let left = Duration::from_nanos(deadline.saturating_sub(self.clock.now()));
            let turn = limiter.until_ready_within(left);
            match crate::wait::deadline::within(&self.clock, deadline, turn).await {
                Some(outcome) => outcome?,
                // A hold moved the turn past the deadline while it waited: given back.
                None => {
                    let wait = crate::wait::duration_nanos(limiter.peek()).max(1);
                    return Err(NotUntil::from_nanos(wait));
                }
            }
        }
        Ok(())
    }

    /// Whether the follower may be forgotten without changing anything: nobody waits on
    /// it, nothing is held, and its limiters are whole again.
    ///
    /// # Examples
    ///
    /// ```
    /// let follower = paceline::upstream::Follower::new(paceline::Quota::per_second(10), Default::default());
    /// assert!(follower.is_idle());
    /// ```
    pub fn is_idle(&self) -> bool {
        let idle = |l: &Arc<Limiter<C>>| {
            l.next_waiter_due_in().is_none() && l.snapshot().until_full().is_zero()
        };
        idle(&self.limiter) && self.run.as_ref().is_none_or(idle)
    }

    /// Steers the limiter by a response to a request sent at `sent`: holds it if asked,
    /// follows an announced pace, learns from refusals (module docs). Returns the hold
    /// applied, if any.
    ///
    /// # Examples
    ///
    /// See [`Follower`].
    pub fn apply(&self, signal: &Signal, sent: Sent) -> Option<Duration> {
        let now = self.clock.now();
        let mut state = self.lock();
        // The caller's own quota change, made on the limiter: the new configured quota.
        let current = self.limiter.quota();
        if current != state.set {
            state.configured = current;
            state.set = current;
        }
        let before = self.pace(&state, now);
        let interval = nanos_per(before);
        let cap = crate::wait::duration_nanos(self.config.max_hold);
        // Announced pace.
        let pace_policy = signal.pace();
        let ceiling = self.ceiling(&state);
        if let Some(policy) = pace_policy {
            let rate = policy.rate();
            if state.announced.is_some_and(|(old, _)| rate > old) {
                // What was learned below the old announcement says nothing of the new.
                state.learned.forget();
            }
            state.announced = Some((rate, now));
        } else if let (Some(after), Some((_, at))) = (self.config.revert_after, state.announced) {
            if now.saturating_sub(at) >= crate::wait::duration_nanos(after) {
                state.announced = None;
            }
        }
        // A refusal that comes with a lower ceiling is explained by it: the request was
        // sent before the client knew.
        let explained = self.ceiling(&state) < ceiling;
        // What is left.
        let mut hold = 0u64;
        let mut event = false;
        let mut reset_hold = false;
        let fewest = signal.left().iter().min_by_key(|l| l.remaining).copied();
        if let Some(left) = fewest {
            state.window.observe(
                now,
                left.remaining,
                left.reset,
                pace_policy.map(|p| p.window),
                interval,
            );
        }
        // The earliest reset named for what is spent, on this answer.
        let mut spent: Option<u64> = None;
        for left in signal.left().iter().filter(|l| l.remaining == 0) {
            let named = left
                .reset
                .map(|r| now.saturating_add(crate::wait::duration_nanos(r.at_most())));
            if let Some(end) = named {
                spent = Some(spent.map_or(end, |s| s.min(end)));
            }
            match left.reset {
                Some(Reset::Exact(d)) => {
                    hold = hold.max(crate::wait::duration_nanos(d));
                    reset_hold = true;
                }
                Some(Reset::Rounded(d)) if d >= Duration::from_secs(2) => {
                    hold = hold.max(crate::wait::duration_nanos(d));
                    reset_hold = true;
                }
                _ => {
                    let bound = named.unwrap_or(u64::MAX);
                    if let Some(end) = state.window.next_boundary(now) {
                        hold = hold.max(end.min(bound).saturating_sub(now));
                        reset_hold = true;
                    } else if signal.status() < 400
                        && state.last_remaining.is_some_and(|r| r > 0)
                        && sent.nanos() >= state.lowered_at
                        && !state.learned.is_set()
                    {
                        // A success that spent the last cell warns once; while that cut
                        // is not won back, only refusals (a loss) cut again.
                        event = true;
                    }
                }
            }
        }
        if let Some(left) = fewest {
            state.last_remaining = Some(left.remaining);
        }
        // Kept from any answer, success or refusal, for the bare refusals that follow.
        if let Some(end) = spent {
            state.spent_until = end;
        }
        // Refusals.
        let status = signal.status();
        if let Some(d) = signal.retry_after() {
            // The first refusal of a run, with a `Retry-After` of one whole second while
            // an announced pace spaces requests by well under that: most likely a request
            // a moment early at the edge of the pace, its wait rounded up to the whole
            // seconds the field allows. Two intervals, not the second; if the second was
            // meant, the next request is refused at once and that one holds.
            // The interval of the pace this answer leaves: its own announcement counts.
            let after = nanos_per(self.pace(&state, now));
            let rounded_edge = status == 429
                && state.streak == 0
                && d <= Duration::from_secs(1)
                && d.subsec_nanos() == 0
                && state.announced.is_some()
                && after < ROUNDED_EDGE_INTERVAL;
            let d = if rounded_edge {
                after.saturating_mul(2)
            } else {
                crate::wait::duration_nanos(d)
            };
            hold = hold.max(d);
        }
        if status == 429 {
            state.streak = state.streak.saturating_add(1);
            if state.streak == 1 && sent.nanos() >= state.lowered_at && !explained {
                event = true;
            }
            if signal.retry_after().is_none() && !reset_hold && state.streak >= 2 {
                // A bare refusal again: back off, doubling, but never past a reset the
                // upstream named for what is spent (a rounded `t=1` is still a bound).
                let doubling = 1u64 << (state.streak - 1).min(62);
                let named = if state.spent_until > now {
                    state.spent_until - now
                } else {
                    u64::MAX
                };
                hold = hold.max(interval.saturating_mul(doubling).min(named));
            }
        } else if status < 400 {
            state.streak = 0;
        }
        if event {
            let known = state.announced.is_some() || state.window.rate().is_some();
            state.learned.cut(now, before, known);
        }
        // The pace first: a hold leaves room for one cell of the quota in force.
        self.steer(&mut state, now, before);
        let hold = hold.min(cap);
        (hold > 0).then(|| {
            let d = Duration::from_nanos(hold);
            self.limiter.hold_for(d);
            if let Some(run) = &self.run {
                run.hold_for(d);
            }
            d
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

mod pace;

#[cfg(test)]
mod tests;
