//! The direct limiter's waiting: booked, FIFO, cancel-safe async waits, blocking waits,
//! reservations, and their owned forms (`crate::wait::methods`, shared with the shared
//! limiter), holds, respacing, and the hooks an embedding runtime drives waiters with.

use core::time::Duration;
use std::sync::Arc;

use super::Limiter;
use crate::cell::{Ours, TatWord, ALWAYS_OURS};
use crate::clock::Clock;
use crate::gcra::Params;
use crate::quota::Quota;
use crate::reservation::{OwnedReservation, Reservation};
use crate::wait::{self, future::Target, queue::Waiters};

impl<C: Clock> Limiter<C> {
    crate::wait::methods::waiting_methods! {
        setup: "# use paceline::{Denied, Limiter, Quota};\n# use std::{sync::Arc, time::Duration};",
        open: "Limiter::new(",
        close: ")",
        end: "# Ok::<(), Box<dyn std::error::Error>>(())",
        reservation: Reservation<'_, C>,
        owned_reservation: OwnedReservation<C>,
    }

    /// Holds every cell back for `d` from now: what an upstream's `Retry-After` asks.
    ///
    /// Nothing is admitted before then, booked turns included: the turns that have not come
    /// move later together, the first to the end of the hold, keeping their order and
    /// their spacing; plain checks are refused until one cell fits at the end of the hold,
    /// and the pace then resumes at the quota (the waiting crowd is never released as one
    /// burst). Turns that have come are spent and stay so. A hold shorter than the time
    /// already booked ahead changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, Limiter, Quota};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Quota::per_second(10), clock.clone());
    /// limiter.hold_for(Duration::from_secs(2)); // "Retry-After: 2"
    /// assert!(limiter.check().is_err());
    /// clock.advance(Duration::from_secs(2));
    /// assert!(limiter.check().is_ok());
    /// assert!(limiter.check().is_err()); // spaced from there, not a burst of 10
    /// ```
    pub fn hold_for(&self, d: Duration) {
        let now = self.now();
        let until = now.saturating_add(wait::duration_nanos(d));
        let params = self.quota.load();
        if let Some(arm) = self
            .waiters
            .hold(&self.cell, ALWAYS_OURS, &params, now, until)
        {
            self.waiters.schedule(arm);
        }
    }

    /// [`Limiter::set_quota`], and the turns already booked whose instants have not
    /// come are spaced again at the new quota when it is slower: in their order, from
    /// where the first of them booked, each at the new interval (its instant read against
    /// the new burst window). Following a lower quota an upstream announced, 600 tasks
    /// that booked their turns at the old rate then leave at the new one, not at the old
    /// spacing. A quota no slower than the one in force is set as by `set_quota` (booked
    /// turns keep their places). Turns whose instants have come are spent and stay.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, Limiter, Quota};
    /// use std::{future::Future, pin::pin, task::{Context, Waker}, time::Duration};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    /// limiter.check().unwrap();
    /// let mut cx = Context::from_waker(Waker::noop());
    /// let (mut a, mut b) = (pin!(limiter.until_ready()), pin!(limiter.until_ready()));
    /// let _ = (a.as_mut().poll(&mut cx), b.as_mut().poll(&mut cx)); // due at 100 and 200 ms
    /// limiter.set_quota_respaced(Quota::per_second(2).with_burst(1));
    /// clock.advance(Duration::from_millis(100));
    /// assert!(a.as_mut().poll(&mut cx).is_ready()); // where it booked from
    /// clock.advance(Duration::from_millis(400));
    /// assert!(b.as_mut().poll(&mut cx).is_pending()); // 500 ms after it, not 100
    /// clock.advance(Duration::from_millis(100));
    /// assert!(b.as_mut().poll(&mut cx).is_ready());
    /// ```
    pub fn set_quota_respaced(&self, quota: Quota) {
        let slower = quota.params().interval() > self.quota.load().interval();
        if !slower {
            return self.set_quota(quota);
        }
        self.quota.store(quota);
        let arm = self.waiters.respace(&self.cell, quota.params(), self.now());
        self.waiters.schedule(arm);
    }

    /// How long until the next waiter is due, by this limiter's clock (zero if it is due
    /// already); `None` when no one waits.
    ///
    /// With [`Limiter::wake_due_waiters`] this lets a runtime that embeds paceline drive
    /// waiters from its own timer instead of (or besides) [`Clock::wake_at`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, Limiter, Quota};
    /// use std::{future::Future, pin::pin, task::{Context, Waker}, time::Duration};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    /// limiter.check().unwrap();
    /// assert_eq!(limiter.next_waiter_due_in(), None);
    ///
    /// let mut wait = pin!(limiter.until_ready());
    /// let _ = wait.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    /// assert_eq!(limiter.next_waiter_due_in(), Some(Duration::from_millis(100)));
    /// clock.advance(Duration::from_millis(30));
    /// assert_eq!(limiter.next_waiter_due_in(), Some(Duration::from_millis(70)));
    /// ```
    pub fn next_waiter_due_in(&self) -> Option<Duration> {
        let due = self.waiters.next_deadline()?;
        Some(Duration::from_nanos(due.saturating_sub(self.now())))
    }

    /// Wakes, in booking order, every waiter whose instant has come.
    ///
    /// The clock's timer does this on its own; an embedding runtime may call it too.
    ///
    /// # Panics
    ///
    /// If a waiting task's waker panics; the panic is resumed after every due waiter was
    /// woken and the limiter's timer was re-armed.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_second(1));
    /// limiter.wake_due_waiters(); // nothing waits: a no-op
    /// ```
    pub fn wake_due_waiters(&self) {
        self.waiters.fire_due();
    }
}

impl<C: Clock> Target for Limiter<C> {
    type Clock = C;

    fn params(&self) -> Params {
        self.quota.load()
    }

    fn clock(&self) -> &C {
        &self.clock
    }

    fn waiters(&self) -> Arc<Waiters<C>> {
        Arc::clone(&self.waiters)
    }

    fn with_word<R>(&self, f: impl FnOnce(&TatWord, Ours<'_>) -> R) -> Result<R, u64> {
        Ok(f(&self.cell, ALWAYS_OURS))
    }

    fn with_stored_word<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R> {
        Some(f(&self.cell, self.now()))
    }
}
