//! A booked turn as a value: learn its instant, act on it, or give it back.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use super::block::block_on;
use super::future::Acquire;
use crate::clock::{Clock, DefaultClock};
use crate::limiter::Limiter;

/// `n` cells booked on a [`Limiter`] now, usable from an instant this value tells.
///
/// Made by [`Limiter::reserve`]. The booking is a place in the same FIFO as the
/// limiter's waiters (plain checks cannot take it). Await the reservation (or call
/// [`Reservation::wait`]) to sleep until its instant, or read
/// [`Reservation::ready_in`] and decide yourself.
///
/// **Dropping it** before its instant gives the cells back (waiters behind it move up,
/// as if it had never been made); dropping it once its instant has come keeps them spent,
/// whether or not it was awaited, since its holder may have acted on it.
///
/// # Examples
///
/// ```
/// use paceline::{clock::ManualClock, Limiter, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = Limiter::with_clock(Quota::per_second(10), clock.clone());
/// limiter.check_n(10).unwrap();
///
/// let turn = limiter.reserve(5).unwrap();
/// assert_eq!(turn.ready_in(), Duration::from_millis(500));
/// // Too late for us: give it back, and nothing is spent.
/// drop(turn);
/// assert_eq!(limiter.peek_n(5).unwrap(), Duration::from_millis(500));
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct Reservation<'a, C: Clock = DefaultClock> {
    /// Boxed: a booked node must not move, and a reservation is a value users move.
    acquire: Pin<Box<Acquire<&'a Limiter<C>>>>,
}

impl<C: Clock> core::fmt::Debug for Reservation<'_, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Reservation")
            .field("ready_in", &self.ready_in())
            .finish_non_exhaustive()
    }
}

impl<'a, C: Clock> Reservation<'a, C> {
    /// Books `acquire` with a first poll (no task to wake yet); `Err` when it was refused.
    pub(crate) fn book(
        acquire: Acquire<&'a Limiter<C>>,
    ) -> Result<Reservation<'a, C>, crate::Denied> {
        let mut acquire = Box::pin(acquire);
        let noop = core::task::Waker::noop();
        match acquire.as_mut().poll(&mut Context::from_waker(noop)) {
            Poll::Ready(Err(denied)) => Err(denied),
            Poll::Ready(Ok(())) | Poll::Pending => Ok(Reservation { acquire }),
        }
    }

    /// How long from now until the reserved cells may be used: zero once they may.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_second(1));
    /// assert!(limiter.reserve(1).unwrap().ready_in().is_zero()); // the burst had room
    /// ```
    pub fn ready_in(&self) -> Duration {
        Duration::from_nanos(self.acquire.as_ref().due_in())
    }

    /// Whether the reserved cells may be used now.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_hour(1));
    /// assert!(limiter.reserve(1).unwrap().is_ready());
    /// assert!(!limiter.reserve(1).unwrap().is_ready());
    /// ```
    pub fn is_ready(&self) -> bool {
        self.ready_in().is_zero()
    }

    /// Blocks the calling thread until the reserved cells may be used. Don't call it
    /// inside an async task: await the reservation instead.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::Limiter::new(paceline::Quota::per_second(1000).with_burst(1));
    /// limiter.check().unwrap();
    /// limiter.reserve(1).unwrap().wait(); // about 1 ms
    /// ```
    pub fn wait(self) {
        block_on(self);
    }
}

impl<C: Clock> Future for Reservation<'_, C> {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // The booking was made by the first poll; what is left can only finish.
        self.acquire.as_mut().poll(cx).map(drop)
    }
}
