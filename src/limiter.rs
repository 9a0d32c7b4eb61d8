//! The direct limiter: one quota, one cell, shared by threads and tasks.

use core::future::Future;
use core::time::Duration;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::cell::Cell;
use crate::clock::{Clock, DefaultClock, Timeline};
use crate::error::{self, Denied, InsufficientCapacity, NotUntil};
use crate::gcra::{self, Params};
use crate::quota::Quota;
use crate::wait;
use crate::wait::block::block_on;
use crate::wait::future::Target;
use crate::wait::queue::Waiters;

/// A rate limiter for one quota, shared by reference (or `Arc`) among threads and tasks.
///
/// Its whole decision state is one atomic word on a cache line of its own; `check()` is a
/// clock read, a load and (when admitted) one compare-and-swap.
///
/// # Examples
///
/// ```
/// use pacer::{Limiter, Quota};
/// use std::sync::Arc;
///
/// let limiter = Arc::new(Limiter::new(Quota::per_second(50).with_burst(5)));
/// let handles: Vec<_> = (0..4)
///     .map(|_| {
///         let limiter = Arc::clone(&limiter);
///         std::thread::spawn(move || (0..10).filter(|_| limiter.check().is_ok()).count())
///     })
///     .collect();
/// let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
/// assert!(admitted >= 5); // the burst, plus whatever the rate refilled meanwhile
/// ```
pub struct Limiter<C: Clock = DefaultClock> {
    cell: CachePadded<Cell>,
    params: Params,
    /// The same timeline as `waiters` holds: kept here too so that `check()` reads it
    /// without following the `Arc`.
    time: Timeline<C>,
    waiters: Arc<Waiters<C>>,
}

impl<C: Clock> core::fmt::Debug for Limiter<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Limiter")
            .field("quota", &self.quota())
            .field("tat", &self.cell.tat())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter on the default clock.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = pacer::Limiter::new(pacer::Quota::per_second(2));
    /// assert!(limiter.check().is_ok());
    /// assert!(limiter.check().is_ok());
    /// assert!(limiter.check().is_err());
    /// ```
    pub fn new(quota: Quota) -> Limiter {
        Limiter::with_clock(quota, DefaultClock::default())
    }
}

impl<C: Clock> Limiter<C> {
    /// A limiter on the given clock (for example a [`ManualClock`](crate::clock::ManualClock)).
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{clock::ManualClock, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Quota::per_minute(1), ManualClock::new());
    /// assert_eq!(limiter.remaining(), 1);
    /// ```
    pub fn with_clock(quota: Quota, clock: C) -> Limiter<C> {
        let time = Timeline::starting_now(clock);
        Limiter {
            cell: CachePadded::new(Cell::new()),
            params: *quota.params(),
            waiters: Waiters::new(time.clone()),
            time,
        }
    }

    /// The quota this limiter enforces.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{Limiter, Quota};
    /// assert_eq!(Limiter::new(Quota::per_second(3)).quota(), Quota::per_second(3));
    /// ```
    pub fn quota(&self) -> Quota {
        Quota::from_params(self.params)
    }

    #[inline]
    fn now(&self) -> u64 {
        self.time.now()
    }

    /// Admits one cell now, or says how long until one would be admitted.
    ///
    /// A denial writes nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait, measured from this check.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(1));
    /// assert!(limiter.check().is_ok());
    /// let wait = limiter.check().unwrap_err().wait_time();
    /// assert!(wait.as_millis() > 900 && wait.as_millis() <= 1000);
    /// ```
    #[inline]
    pub fn check(&self) -> Result<(), NotUntil> {
        let now = self.now();
        match self
            .cell
            .acquire(now, self.params.interval(), self.params.tau())
        {
            Ok(_) => Ok(()),
            Err(wait) => Err(NotUntil::from_nanos(wait)),
        }
    }

    /// Admits `n` cells at once, or none.
    ///
    /// `n = 0` asks for nothing and is always admitted without changing anything.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when the cells fit the burst but not now;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst (never admissible).
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{Denied, Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(10));
    /// assert!(limiter.check_n(7).is_ok());
    /// assert!(matches!(limiter.check_n(7), Err(Denied::NotUntil(_))));
    /// assert!(matches!(limiter.check_n(11), Err(Denied::InsufficientCapacity(_))));
    /// ```
    #[inline]
    pub fn check_n(&self, n: u32) -> Result<(), Denied> {
        let cost = error::cost(&self.params, n)?;
        if cost == 0 {
            return Ok(());
        }
        let now = self.now();
        match self.cell.acquire(now, cost, self.params.tau()) {
            Ok(_) => Ok(()),
            Err(wait) => Err(NotUntil::from_nanos(wait).into()),
        }
    }

    /// How many cells `check_n` would admit right now; spends nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_hour(10));
    /// limiter.check_n(4).unwrap();
    /// assert_eq!(limiter.remaining(), 6);
    /// ```
    pub fn remaining(&self) -> u32 {
        gcra::remaining(self.cell.tat(), self.now(), &self.params)
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
    /// use pacer::{Limiter, Quota};
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
    /// use pacer::{Limiter, Quota};
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
    /// use pacer::{Limiter, Quota};
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
    /// use pacer::{Denied, Limiter, Quota};
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
    /// use pacer::{Limiter, Quota};
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
    /// use pacer::{Limiter, Quota};
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
    /// use pacer::{Limiter, Quota};
    /// use std::time::Duration;
    /// let limiter = Limiter::new(Quota::per_hour(1));
    /// limiter.wait_within(Duration::ZERO).unwrap();
    /// assert!(limiter.wait_within(Duration::from_millis(1)).is_err());
    /// ```
    pub fn wait_within(&self, max: Duration) -> Result<(), NotUntil> {
        block_on(self.until_ready_within(max))
    }

    /// How long until the next waiter is due, by this limiter's clock (zero if it is due
    /// already); `None` when no one waits.
    ///
    /// With [`Limiter::wake_due_waiters`] this lets a runtime that embeds pacer drive
    /// waiters from its own timer instead of (or besides) [`Clock::wake_at`].
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{clock::ManualClock, Limiter, Quota};
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
    /// let limiter = pacer::Limiter::new(pacer::Quota::per_second(1));
    /// limiter.wake_due_waiters(); // nothing waits: a no-op
    /// ```
    pub fn wake_due_waiters(&self) {
        self.waiters.fire_due();
    }
}

impl<C: Clock> Target for &Limiter<C> {
    type Clock = C;

    fn params(&self) -> Params {
        self.params
    }

    fn time(&self) -> &Timeline<C> {
        &self.time
    }

    fn waiters(&self) -> Arc<Waiters<C>> {
        Arc::clone(&self.waiters)
    }

    fn with_cell<R>(&self, f: impl FnOnce(&Cell) -> R) -> Result<R, u64> {
        Ok(f(&self.cell))
    }

    fn with_stored_cell<R>(&self, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        Some(f(&self.cell))
    }
}
