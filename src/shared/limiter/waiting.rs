//! The shared limiter's waiting: booked, FIFO, cancel-safe async waits, blocking waits,
//! reservations and holds, through the one waiting path (`crate::wait`), with the booking
//! rules of words other processes share (`crate::wait::queue`).

use core::future::Future;
use core::time::Duration;
use std::sync::Arc;

use super::SharedLimiter;
use crate::cell::{Ours, TatWord, ALWAYS_OURS};
use crate::clock::{Clock, HostClock};
use crate::error::{Denied, InsufficientCapacity};
use crate::gcra::Params;
use crate::shared::reservation::{OwnedSharedReservation, SharedReservation};
use crate::wait::{
    self,
    block::block_on,
    future::{Acquire, Target},
    queue::Waiters,
};

impl SharedLimiter {
    /// Holds every cell back for `d` from now ([`Limiter::hold_for`](crate::Limiter::hold_for)):
    /// every process's checks, and this process's booked turns, which move to the end of
    /// the hold together. Turns other processes booked before the hold keep their instants
    /// (their queues are theirs); turns booked after it, anywhere, come after it.
    ///
    /// A hold lives in the file, so it outlives the process that set it: it lasts at most
    /// [`MAX_HOLD`](crate::shared::MAX_HOLD) (a longer `d` holds that long), and an
    /// operator ends one with [`SharedLimiter::reset`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-hold-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(10))?;
    /// limiter.hold_for(Duration::from_secs(2));
    /// assert!(limiter.check().is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hold_for(&self, d: Duration) {
        let now = self.clock.now();
        let d = d.min(crate::shared::MAX_HOLD);
        let until = now.saturating_add(wait::duration_nanos(d));
        let params = self.params();
        if let Some(arm) = self
            .waiters
            .hold(self.cell(), ALWAYS_OURS, &params, now, until)
        {
            self.waiters.schedule(arm);
        }
    }

    /// Waits its booked turn for one cell ([`Limiter::until_ready`](crate::Limiter::until_ready)).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-m-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(1000).with_burst(1))?;
    /// futures::executor::block_on(async {
    ///     limiter.until_ready().await;
    ///     limiter.until_ready().await; // ~1 ms later
    /// });
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_ready(&self) -> impl Future<Output = ()> + Send + '_ {
        wait::ready(self)
    }

    /// Waits its booked turn for `n` cells at once.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the burst; nothing is booked.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-n-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(10))?;
    /// assert!(futures::executor::block_on(limiter.until_n_ready(11)).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_n_ready(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<(), InsufficientCapacity>> + Send + '_ {
        wait::n_ready(self, n)
    }

    /// Waits its booked turn for `n` cells if it comes within `max`; otherwise books
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when the turn is further than `max`;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-o-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_hour(1))?;
    /// limiter.check()?;
    /// let soon = limiter.until_n_ready_within(1, Duration::from_secs(1));
    /// assert!(futures::executor::block_on(soon).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_n_ready_within(
        &self,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + '_ {
        wait::n_ready_within(self, n, max)
    }

    /// [`SharedLimiter::until_ready`] owning the limiter: `'static`, for spawned tasks.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # use std::sync::Arc;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-p-{}", std::process::id()));
    /// let limiter = Arc::new(SharedLimiter::open(&path, Quota::per_second(100))?);
    /// let turn = Arc::clone(&limiter).until_ready_owned();
    /// std::thread::spawn(move || futures::executor::block_on(turn)).join().unwrap();
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_ready_owned(self: Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        wait::ready(self)
    }

    /// [`SharedLimiter::until_n_ready_within`] owning the limiter.
    ///
    /// # Errors
    ///
    /// As [`SharedLimiter::until_n_ready_within`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # use std::{sync::Arc, time::Duration};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-q-{}", std::process::id()));
    /// let limiter = Arc::new(SharedLimiter::open(&path, Quota::per_second(10))?);
    /// let ten = Arc::clone(&limiter).until_n_ready_within_owned(10, Duration::ZERO);
    /// assert!(futures::executor::block_on(ten).is_ok());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_n_ready_within_owned(
        self: Arc<Self>,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + 'static {
        wait::n_ready_within(self, n, max)
    }

    /// Books `n` cells now and says from when they may be used; dropped before then, it
    /// gives them back ([`Limiter::reserve`](crate::Limiter::reserve)).
    ///
    /// # Errors
    ///
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-r-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(10).with_burst(1))?;
    /// limiter.check()?;
    /// let turn = limiter.reserve(1)?;
    /// assert!(turn.ready_in().as_millis() > 50);
    /// turn.cancel(); // given back
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(&self, n: u32) -> Result<SharedReservation<'_>, Denied> {
        SharedReservation::book(Acquire::new(self, n, u64::MAX))
    }

    /// [`SharedLimiter::reserve`], only if the cells can be had within `max`.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when they cannot (nothing booked);
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-s-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_hour(1))?;
    /// assert!(limiter.reserve_within(1, Duration::ZERO).is_ok());
    /// assert!(limiter.reserve_within(1, Duration::ZERO).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_within(&self, n: u32, max: Duration) -> Result<SharedReservation<'_>, Denied> {
        SharedReservation::book(Acquire::new(self, n, wait::duration_nanos(max)))
    }

    /// [`SharedLimiter::reserve_within`] owning the limiter.
    ///
    /// # Errors
    ///
    /// As [`SharedLimiter::reserve_within`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # use std::{sync::Arc, time::Duration};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-t-{}", std::process::id()));
    /// let limiter = Arc::new(SharedLimiter::open(&path, Quota::per_second(100))?);
    /// let turn = Arc::clone(&limiter).reserve_within_owned(1, Duration::MAX)?;
    /// assert!(turn.is_ready());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_within_owned(
        self: Arc<Self>,
        n: u32,
        max: Duration,
    ) -> Result<OwnedSharedReservation, Denied> {
        OwnedSharedReservation::book(Acquire::new(self, n, wait::duration_nanos(max)))
    }

    /// Blocks the calling thread for its booked turn for one cell.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-u-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(1000).with_burst(1))?;
    /// limiter.wait();
    /// limiter.wait();
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(&self) {
        block_on(self.until_ready());
    }

    /// Blocks the calling thread for its booked turn for `n` cells.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-v-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(10))?;
    /// limiter.wait_n(10)?;
    /// assert!(limiter.wait_n(11).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_n(&self, n: u32) -> Result<(), InsufficientCapacity> {
        block_on(self.until_n_ready(n))
    }
}

impl Target for SharedLimiter {
    type Clock = HostClock;

    fn params(&self) -> Params {
        SharedLimiter::params(self)
    }

    fn clock(&self) -> &HostClock {
        &self.clock
    }

    fn waiters(&self) -> Arc<Waiters<HostClock>> {
        Arc::clone(&self.waiters)
    }

    fn with_word<R>(&self, f: impl FnOnce(&TatWord, Ours<'_>) -> R) -> Result<R, u64> {
        Ok(f(self.cell(), ALWAYS_OURS))
    }

    fn with_stored_word<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R> {
        Some(f(self.cell(), self.clock.now()))
    }
}
