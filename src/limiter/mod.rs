//! The direct limiter: one quota, one cell, shared by threads and tasks.

use core::time::Duration;

use crossbeam_utils::CachePadded;

use crate::cell::TatWord;
use crate::clock::Clock;
use crate::error::{self, Denied, InsufficientCapacity, NotUntil};
use crate::gcra;
use crate::quota::Quota;
use crate::quota_cell::QuotaCell;
use crate::snapshot::Snapshot;

// Waiting (`waiting.rs`), blocking and the default clock need `std`.
#[cfg(feature = "std")]
use {crate::clock::DefaultClock, crate::wait::queue::Waiters, std::sync::Arc};

#[cfg(feature = "std")]
mod waiting;

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
    /// The same clock as `waiters` holds: kept here too so that `check()` reads it
    /// without following the `Arc`.
    clock: C,
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
        Limiter {
            cell: CachePadded::new(TatWord::new()),
            quota: QuotaCell::new(quota),
            #[cfg(feature = "std")]
            waiters: Waiters::new(clock.clone()),
            clock,
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
        self.clock.now()
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
        // The clock first: then only `self` lives across its call.
        let now = self.now();
        let (interval, room) = self.quota.load_one_cell();
        match self.cell.spend(now, interval, room) {
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
        if n == 0 {
            return Ok(());
        }
        // The clock first: then only `self` lives across its call.
        let now = self.now();
        let params = self.quota.load();
        let cost = error::cost(&params, n)?;
        // 1 <= n <= burst, so 0 < cost <= tau: the room does not underflow.
        match self.cell.spend(now, cost, params.tau() - cost) {
            Ok(_) => Ok(()),
            Err(wait) => Err(NotUntil::from_nanos(wait).into()),
        }
    }

    /// Admits `n` cells in this limiter and in `other` together, or none: what a caller
    /// whose work runs at once takes from a booking limiter and the limiter that bounds
    /// when work runs. `other` is looked at first, so that neither is spent unless both
    /// have room now; a caller racing on `other` may take its room between the look and
    /// the take, and then this limiter's cells stay spent (the strict side: never more
    /// through) and the answer is `other`'s refusal. Each limiter's own quota decides for
    /// it; the clock is read once, this limiter's, so give it limiters that read one
    /// clock (the default clock, or clones of one [`ManualClock`](crate::clock::ManualClock)).
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] with the wait of the limiter that had no room;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds either burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Limiter, Quota};
    /// let booked = Limiter::new(Quota::per_second(10));
    /// let running = Limiter::new(Quota::per_second(10));
    /// running.check_n(10).unwrap(); // late work spent the execution bound
    /// assert!(booked.check_n_with(&running, 1).is_err());
    /// assert_eq!(booked.remaining(), 10); // nothing spent where the other had no room
    /// ```
    pub fn check_n_with(&self, other: &Limiter<C>, n: u32) -> Result<(), Denied> {
        if n == 0 {
            return Ok(());
        }
        let now = self.now();
        let (mine, theirs) = (self.quota.load(), other.quota.load());
        // In the order of the steps this stands for, errors included: `other`'s look
        // first. Each cost is within its burst, so its room does not underflow.
        let other_cost = error::cost(&theirs, n)?;
        let other_room = theirs.tau() - other_cost;
        let refused = |wait| Denied::from(NotUntil::from_nanos(wait));
        // The look reads `other`'s TAT relaxed (`TatWord::tat`): a hint that spares this
        // limiter a take the other would refuse; the takes' compare-and-swaps decide.
        gcra::admit_in_room(other.cell.tat(), now, other_cost, other_room).map_err(refused)?;
        let cost = error::cost(&mine, n)?;
        self.cell
            .spend(now, cost, mine.tau() - cost)
            .map_err(refused)?;
        other
            .cell
            .spend(now, other_cost, other_room)
            .map(drop)
            .map_err(refused)
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
}
