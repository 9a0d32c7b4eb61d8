//! A booked turn as a value: learn its instant, act on it, or give it back.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use crate::clock::{Clock, DefaultClock};
use crate::limiter::Limiter;
use crate::wait::future::Acquire;
use crate::wait::turn::{reservation_methods, Turn};
use crate::Denied;

/// `n` cells booked on a [`Limiter`] now, usable from an instant this value tells.
///
/// Made by [`Limiter::reserve`] (and, owning its limiter, by [`Limiter::reserve_owned`]
/// as an [`OwnedReservation`]). The booking is a place in the same FIFO as the limiter's
/// waiters (plain checks cannot take it). Await the reservation (or call
/// [`Reservation::wait`]) to sleep until its instant, or read [`Reservation::ready_in`]
/// and decide yourself.
///
/// **Dropping it** (or [`Reservation::cancel`]) before its instant gives the cells back
/// (waiters behind it move up, as if it had never been made); once its instant has come
/// they stay spent, whether or not it was awaited, since its holder may have acted on it.
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
/// turn.cancel();
/// assert_eq!(limiter.peek_n(5).unwrap(), Duration::from_millis(500));
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct Reservation<'a, C: Clock = DefaultClock> {
    turn: Turn<&'a Limiter<C>>,
}

/// A [`Reservation`] that owns its limiter (through an `Arc`): `'static`, so it can live
/// in a struct, a spawned task or another language's object. Made by
/// [`Limiter::reserve_owned`]; the same promises.
///
/// # Examples
///
/// ```
/// use paceline::{Limiter, Quota};
/// use std::sync::Arc;
///
/// let limiter = Arc::new(Limiter::new(Quota::per_second(100).with_burst(1)));
/// let turn = Arc::clone(&limiter).reserve_owned(1).unwrap();
/// std::thread::spawn(move || turn.wait()).join().unwrap();
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct OwnedReservation<C: Clock = DefaultClock> {
    turn: Turn<Arc<Limiter<C>>>,
}

impl<'a, C: Clock> Reservation<'a, C> {
    pub(crate) fn book(acquire: Acquire<&'a Limiter<C>>) -> Result<Reservation<'a, C>, Denied> {
        Turn::book(acquire).map(|turn| Reservation { turn })
    }

    reservation_methods!(
        "let limiter = paceline::Limiter::new(paceline::Quota::per_second(1000));\nlet turn = limiter.reserve(1).unwrap();"
    );
}

impl<C: Clock> OwnedReservation<C> {
    pub(crate) fn book(acquire: Acquire<Arc<Limiter<C>>>) -> Result<OwnedReservation<C>, Denied> {
        Turn::book(acquire).map(|turn| OwnedReservation { turn })
    }

    reservation_methods!(
        "let limiter = std::sync::Arc::new(paceline::Limiter::new(paceline::Quota::per_second(1000)));\nlet turn = limiter.reserve_owned(1).unwrap();"
    );
}

impl<C: Clock> core::fmt::Debug for Reservation<'_, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Reservation")
            .field("ready_in", &self.ready_in())
            .finish_non_exhaustive()
    }
}

impl<C: Clock> core::fmt::Debug for OwnedReservation<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OwnedReservation")
            .field("ready_in", &self.ready_in())
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Future for Reservation<'_, C> {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.turn.poll(cx)
    }
}

impl<C: Clock> Future for OwnedReservation<C> {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.turn.poll(cx)
    }
}
