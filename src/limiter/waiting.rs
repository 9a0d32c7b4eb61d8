//! The direct limiter's waiting: booked, FIFO, cancel-safe async waits, blocking waits,
//! reservations, and their owned forms; all through the one waiting path (`crate::wait`).

use core::future::Future;
use core::time::Duration;
use std::sync::Arc;

use super::Limiter;
use crate::cell::{Ours, TatWord, ALWAYS_OURS};
use crate::clock::Clock;
use crate::error::{Denied, InsufficientCapacity, NotUntil};
use crate::gcra::Params;
use crate::quota::Quota;
use crate::reservation::{OwnedReservation, Reservation};
use crate::wait::{
    self,
    block::block_on,
    future::{Acquire, Target},
    queue::Waiters,
};

impl<C: Clock> Limiter<C> {
    /// Books `n` cells now and says from when they may be used, as a value that gives them
    /// back if dropped before then (see [`Reservation`]). Like Go's `Limiter.Reserve`:
    /// the booking takes its place in the same FIFO as waiters, so nobody overtakes it.
    ///
    /// # Errors
    ///
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst (nothing booked);
    /// [`Denied::NotUntil`] only when the booking would pass the end of representable time
    /// (584 years).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::time::Duration;
    ///
    /// let limiter = Limiter::new(Quota::per_second(100).with_burst(1));
    /// limiter.check().unwrap();
    /// let turn = limiter.reserve(1).unwrap();
    /// if turn.ready_in() > Duration::from_millis(50) {
    ///     drop(turn); // not worth waiting: the cell goes back
    /// } else {
    ///     turn.wait(); // or `turn.await` in async code
    /// }
    /// ```
    pub fn reserve(&self, n: u32) -> Result<Reservation<'_, C>, Denied> {
        Reservation::book(Acquire::new(self, n, u64::MAX))
    }

    /// [`Limiter::reserve`], but only if the cells can be had within `max`; otherwise
    /// books nothing.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] with the wait when it is longer than `max` (nothing booked);
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::time::Duration;
    /// let limiter = Limiter::new(Quota::per_minute(1));
    /// assert!(limiter.reserve_within(1, Duration::ZERO).is_ok());
    /// assert!(limiter.reserve_within(1, Duration::from_secs(1)).is_err()); // a minute away
    /// ```
    pub fn reserve_within(&self, n: u32, max: Duration) -> Result<Reservation<'_, C>, Denied> {
        Reservation::book(Acquire::new(self, n, wait::duration_nanos(max)))
    }

    /// [`Limiter::reserve_within`], owning the limiter (see [`Limiter::reserve_owned`]).
    ///
    /// # Errors
    ///
    /// As [`Limiter::reserve_within`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::{sync::Arc, time::Duration};
    /// let limiter = Arc::new(Limiter::new(Quota::per_minute(1)));
    /// assert!(Arc::clone(&limiter).reserve_within_owned(1, Duration::ZERO).is_ok());
    /// assert!(Arc::clone(&limiter).reserve_within_owned(1, Duration::ZERO).is_err());
    /// ```
    pub fn reserve_within_owned(
        self: Arc<Self>,
        n: u32,
        max: Duration,
    ) -> Result<OwnedReservation<C>, Denied> {
        OwnedReservation::book(Acquire::new(self, n, wait::duration_nanos(max)))
    }

    /// [`Limiter::reserve`] on a shared limiter, returning a reservation that owns it (an
    /// `Arc` clone): `'static`, to keep in a struct, a spawned task or a foreign object.
    ///
    /// # Errors
    ///
    /// As [`Limiter::reserve`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(Limiter::new(Quota::per_second(100).with_burst(1)));
    /// let turn = Arc::clone(&limiter).reserve_owned(1).unwrap();
    /// assert!(turn.is_ready());
    /// ```
    pub fn reserve_owned(self: Arc<Self>, n: u32) -> Result<OwnedReservation<C>, Denied> {
        OwnedReservation::book(Acquire::new(self, n, u64::MAX))
    }

    /// [`Limiter::until_ready`] on a shared limiter: the future owns it (an `Arc`
    /// clone), so it is `'static` (a spawned task, a struct, a foreign object).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(Limiter::new(Quota::per_second(1000).with_burst(1)));
    /// let turn = Arc::clone(&limiter).until_ready_owned();
    /// std::thread::spawn(move || futures::executor::block_on(turn)).join().unwrap();
    /// ```
    pub fn until_ready_owned(self: Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        wait::ready(self)
    }

    /// [`Limiter::until_n_ready`], owning the limiter (see [`Limiter::until_ready_owned`]).
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the burst; nothing is booked.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(Limiter::new(Quota::per_second(10)));
    /// let ten = Arc::clone(&limiter).until_n_ready_owned(10);
    /// assert!(futures::executor::block_on(ten).is_ok());
    /// ```
    pub fn until_n_ready_owned(
        self: Arc<Self>,
        n: u32,
    ) -> impl Future<Output = Result<(), InsufficientCapacity>> + Send + 'static {
        wait::n_ready(self, n)
    }

    /// [`Limiter::until_n_ready_within`], owning the limiter (see
    /// [`Limiter::until_ready_owned`]).
    ///
    /// # Errors
    ///
    /// As [`Limiter::until_n_ready_within`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::{sync::Arc, time::Duration};
    ///
    /// let limiter = Arc::new(Limiter::new(Quota::per_hour(1)));
    /// let first = Arc::clone(&limiter).until_n_ready_within_owned(1, Duration::ZERO);
    /// assert!(futures::executor::block_on(first).is_ok());
    /// let second = Arc::clone(&limiter).until_n_ready_within_owned(1, Duration::from_secs(1));
    /// assert!(futures::executor::block_on(second).is_err());
    /// ```
    pub fn until_n_ready_within_owned(
        self: Arc<Self>,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + 'static {
        wait::n_ready_within(self, n, max)
    }

    /// Waits its turn for one cell.
    ///
    /// The first poll books the cell (plain `check()` callers cannot take it after that);
    /// the future finishes at the booked instant, in booking order. Dropping it before then
    /// gives the cell back. A future never polled books nothing. Works on any executor.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(1000).with_burst(1));
    /// futures::executor::block_on(async {
    ///     for _ in 0..3 {
    ///         limiter.until_ready().await; // ~1 ms apart
    ///     }
    /// });
    /// ```
    pub fn until_ready(&self) -> impl Future<Output = ()> + Send + '_ {
        wait::ready(self)
    }

    /// Waits its turn for `n` cells at once (booked like [`Limiter::until_ready`]).
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the burst; nothing is booked.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(100));
    /// futures::executor::block_on(async {
    ///     limiter.until_n_ready(100).await.unwrap();
    ///     assert!(limiter.until_n_ready(101).await.is_err());
    /// });
    /// ```
    pub fn until_n_ready(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<(), InsufficientCapacity>> + Send + '_ {
        wait::n_ready(self, n)
    }

    /// Waits for one cell, but only if it can be had within `max`; otherwise books nothing
    /// and says when it could be had.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait (longer than `max`) measured from the first poll.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::time::Duration;
    /// let limiter = Limiter::new(Quota::per_minute(1));
    /// futures::executor::block_on(async {
    ///     limiter.until_ready_within(Duration::ZERO).await.unwrap();
    ///     let err = limiter.until_ready_within(Duration::from_secs(1)).await.unwrap_err();
    ///     assert!(err.wait_time() > Duration::from_secs(58));
    /// });
    /// ```
    pub fn until_ready_within(
        &self,
        max: Duration,
    ) -> impl Future<Output = Result<(), NotUntil>> + Send + '_ {
        wait::ready_within(self, max)
    }

    /// Waits for `n` cells within `max`, or books nothing (see [`Limiter::until_ready_within`]).
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when the cells cannot be had within `max`;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Denied, Limiter, Quota};
    /// use std::time::Duration;
    /// let limiter = Limiter::new(Quota::per_second(4));
    /// futures::executor::block_on(async {
    ///     // The burst is spent; 2 more cells need 500 ms, more than the 100 ms we allow.
    ///     limiter.until_n_ready_within(4, Duration::ZERO).await.unwrap();
    ///     let late = limiter.until_n_ready_within(2, Duration::from_millis(100)).await;
    ///     assert!(matches!(late, Err(Denied::NotUntil(_))));
    /// });
    /// ```
    pub fn until_n_ready_within(
        &self,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + '_ {
        wait::n_ready_within(self, n, max)
    }

    /// Blocks the calling thread until one cell is admitted, in the same booked FIFO as the
    /// async waiters. Don't call it inside an async task: use [`Limiter::until_ready`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(1000).with_burst(1));
    /// let start = std::time::Instant::now();
    /// for _ in 0..5 {
    ///     limiter.wait();
    /// }
    /// assert!(start.elapsed().as_millis() >= 4);
    /// ```
    pub fn wait(&self) {
        block_on(self.until_ready());
    }

    /// Blocks the calling thread until `n` cells are admitted at once.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(10));
    /// limiter.wait_n(10).unwrap();
    /// assert!(limiter.wait_n(11).is_err());
    /// ```
    pub fn wait_n(&self, n: u32) -> Result<(), InsufficientCapacity> {
        block_on(self.until_n_ready(n))
    }

    /// Blocks for one cell only if it can be had within `max`; otherwise books nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] when the cell cannot be had within `max`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// use std::time::Duration;
    /// let limiter = Limiter::new(Quota::per_hour(1));
    /// limiter.wait_within(Duration::ZERO).unwrap();
    /// assert!(limiter.wait_within(Duration::from_millis(1)).is_err());
    /// ```
    pub fn wait_within(&self, max: Duration) -> Result<(), NotUntil> {
        block_on(self.until_ready_within(max))
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
