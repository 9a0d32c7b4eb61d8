//! The direct limiter: one quota, one cell, shared by threads and tasks.

use core::time::Duration;

use crossbeam_utils::CachePadded;

use crate::cell::TatWord;
use crate::clock::{Clock, Timeline};
use crate::error::{self, Denied, InsufficientCapacity, NotUntil};
use crate::gcra;
use crate::quota::Quota;
use crate::quota_cell::QuotaCell;
use crate::snapshot::Snapshot;

// Waiting, blocking and the default clock need `std`.
#[cfg(feature = "std")]
use {
    crate::clock::DefaultClock,
    crate::gcra::Params,
    crate::reservation::{OwnedReservation, Reservation},
    crate::wait::{
        self,
        block::block_on,
        future::{Acquire, Target},
        queue::Waiters,
    },
    core::future::Future,
    std::sync::Arc,
};

/// A rate limiter for one quota, shared by reference (or `Arc`) among threads and tasks.
///
/// Its whole decision state is one atomic word on a cache line of its own; `check()` is a
/// clock read, a load and (when admitted) one compare-and-swap.
///
/// # Examples
///
/// ```
/// use paceline::{Limiter, Quota};
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
pub struct Limiter<
    #[cfg(feature = "std")] C: Clock = DefaultClock,
    #[cfg(not(feature = "std"))] C: Clock,
> {
    cell: CachePadded<TatWord>,
    /// The quota, changeable by `set_quota`; read once per decision.
    quota: QuotaCell,
    /// The same timeline as `waiters` holds: kept here too so that `check()` reads it
    /// without following the `Arc`.
    time: Timeline<C>,
    #[cfg(feature = "std")]
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

#[cfg(feature = "std")]
impl Limiter {
    /// A limiter on the default clock.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_second(2));
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
    /// use paceline::{clock::ManualClock, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Quota::per_minute(1), ManualClock::new());
    /// assert_eq!(limiter.remaining(), 1);
    /// ```
    pub fn with_clock(quota: Quota, clock: C) -> Limiter<C> {
        let time = Timeline::starting_now(clock);
        Limiter {
            cell: CachePadded::new(TatWord::new()),
            quota: QuotaCell::new(quota),
            #[cfg(feature = "std")]
            waiters: Waiters::new(time.clone()),
            time,
        }
    }

    /// The quota this limiter enforces.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// assert_eq!(Limiter::new(Quota::per_second(3)).quota(), Quota::per_second(3));
    /// ```
    pub fn quota(&self) -> Quota {
        Quota::from_params(self.quota.load())
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
    /// use paceline::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(1));
    /// assert!(limiter.check().is_ok());
    /// let wait = limiter.check().unwrap_err().wait_time();
    /// assert!(wait.as_millis() > 900 && wait.as_millis() <= 1000);
    /// ```
    #[inline]
    pub fn check(&self) -> Result<(), NotUntil> {
        let params = self.quota.load();
        let now = self.now();
        match self.cell.acquire(now, params.interval(), params.tau()) {
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
    /// use paceline::{Denied, Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(10));
    /// assert!(limiter.check_n(7).is_ok());
    /// assert!(matches!(limiter.check_n(7), Err(Denied::NotUntil(_))));
    /// assert!(matches!(limiter.check_n(11), Err(Denied::InsufficientCapacity(_))));
    /// ```
    #[inline]
    pub fn check_n(&self, n: u32) -> Result<(), Denied> {
        let params = self.quota.load();
        let cost = error::cost(&params, n)?;
        if cost == 0 {
            return Ok(());
        }
        let now = self.now();
        match self.cell.acquire(now, cost, params.tau()) {
            Ok(_) => Ok(()),
            Err(wait) => Err(NotUntil::from_nanos(wait).into()),
        }
    }

    /// How many cells `check_n` would admit right now; spends nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_hour(10));
    /// limiter.check_n(4).unwrap();
    /// assert_eq!(limiter.remaining(), 6);
    /// ```
    pub fn remaining(&self) -> u32 {
        let params = self.quota.load();
        gcra::remaining(self.cell.tat(), self.now(), &params)
    }

    /// The limiter's state now, from one reading: burst, what `remaining()` gives, and
    /// how long until the next cell and until the whole burst is back (see [`Snapshot`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// let limiter = Limiter::new(Quota::per_second(100).with_burst(10));
    /// limiter.check_n(4).unwrap();
    /// let state = limiter.snapshot();
    /// assert_eq!((state.burst(), state.remaining()), (10, 6));
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let params = self.quota.load();
        let now = self.now();
        Snapshot::of(params, self.cell.tat(), now)
    }

    /// How long from now until one cell would be admitted (zero if it would be now);
    /// books and spends nothing: [`Limiter::peek_n`] for one cell.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, Limiter, Quota};
    /// use std::time::Duration;
    /// let limiter = Limiter::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
    /// assert_eq!(limiter.peek(), Duration::ZERO);
    /// limiter.check().unwrap();
    /// assert_eq!(limiter.peek(), Duration::from_millis(100));
    /// ```
    pub fn peek(&self) -> Duration {
        // One cell always fits a burst of at least one.
        self.peek_n(1).unwrap_or(Duration::MAX)
    }

    /// How long from now until `n` cells would be admitted (zero if they would be now);
    /// books and spends nothing. Someone else may take the room first: to hold it, use
    /// [`Limiter::reserve`].
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, Limiter, Quota};
    /// use std::time::Duration;
    /// let limiter = Limiter::with_clock(Quota::per_second(10), ManualClock::new());
    /// limiter.check_n(10).unwrap();
    /// assert_eq!(limiter.peek_n(3).unwrap(), Duration::from_millis(300));
    /// assert_eq!(limiter.peek_n(3).unwrap(), Duration::from_millis(300)); // nothing spent
    /// assert!(limiter.peek_n(11).is_err());
    /// ```
    pub fn peek_n(&self, n: u32) -> Result<Duration, InsufficientCapacity> {
        let params = self.quota.load();
        let cost = match error::cost(&params, n) {
            Ok(cost) => cost,
            Err(Denied::InsufficientCapacity(e)) => return Err(e),
            Err(Denied::NotUntil(e)) => return Ok(e.wait_time()),
        };
        let now = self.now();
        Ok(
            match gcra::admit(self.cell.tat(), now, cost, params.tau()) {
                Ok(_) => Duration::ZERO,
                Err(wait) => Duration::from_nanos(wait),
            },
        )
    }

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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
    pub fn until_n_ready_within_owned(
        self: Arc<Self>,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + 'static {
        wait::n_ready_within(self, n, max)
    }

    /// Changes the quota while the limiter runs, from any thread, without resetting it.
    ///
    /// What carries over, precisely: the limiter's state is its theoretical arrival time,
    /// and it keeps its meaning in time. The backlog already spent (how far that time is
    /// ahead of now) stays spent and is judged against the new burst window from the next
    /// decision on, while the new interval spaces the cells admitted after the change.
    /// So a limiter whose backlog is 3 s, changed to a quota whose burst window is 2 s,
    /// admits nothing for 1 s; one changed to a larger burst admits the difference at once.
    ///
    /// * Checks take no lock and may run concurrently: each decision reads one quota, old
    ///   or new, and is judged against exactly the state it replaces, so no decision ever
    ///   mixes the two. In any window of length `w`, the admitted cells, each weighed by
    ///   the interval of the quota that admitted it, add up to at most `w` plus the
    ///   largest burst window of the quotas in force while they were booked or admitted.
    /// * Booked waiters keep their order and their bookings; the instants that have not
    ///   come yet are re-read against the new burst window (a larger one brings them
    ///   forward, a smaller one pushes them back, but a waiter whose request is larger than
    ///   the new window only as far as its booked TAT minus its own cost), so plain checks
    ///   still cannot overtake them. An instant that has come never moves: those cells are
    ///   spent. Waiters that book later are spaced by the new interval. A waiter dropped
    ///   before its instant gives back exactly what it booked.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Quota::per_second(2), ManualClock::new());
    /// limiter.check_n(2).unwrap();
    /// assert!(limiter.check().is_err());
    /// limiter.set_quota(Quota::per_second(2).with_burst(5)); // 3 more at once
    /// assert!(limiter.check_n(3).is_ok());
    /// assert_eq!(limiter.quota(), Quota::per_second(2).with_burst(5));
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.quota.store(quota);
        #[cfg(feature = "std")]
        {
            let arm = self.waiters.requote(quota.params(), self.now());
            self.waiters.schedule(arm);
        }
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
    pub fn wait_within(&self, max: Duration) -> Result<(), NotUntil> {
        block_on(self.until_ready_within(max))
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
    #[cfg(feature = "std")]
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
    #[cfg(feature = "std")]
    pub fn wake_due_waiters(&self) {
        self.waiters.fire_due();
    }
}

#[cfg(feature = "std")]
impl<C: Clock> Target for Limiter<C> {
    type Clock = C;

    fn params(&self) -> Params {
        self.quota.load()
    }

    fn time(&self) -> &Timeline<C> {
        &self.time
    }

    fn waiters(&self) -> Arc<Waiters<C>> {
        Arc::clone(&self.waiters)
    }

    fn with_cell<R>(&self, f: impl FnOnce(&TatWord) -> R) -> Result<R, u64> {
        Ok(f(&self.cell))
    }

    fn with_stored_cell<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R> {
        Some(f(&self.cell, self.now()))
    }
}
