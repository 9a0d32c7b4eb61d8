//! A booked turn held as a value: the machinery behind every reservation type (the
//! direct limiter's, owned or borrowed, and the keyed limiter's).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;

use super::future::{Acquire, Target};
use crate::Denied;

/// What every reservation is: a first-polled booking, boxed because a booked node must
/// not move and a reservation is a value users move.
pub(crate) struct Turn<T: Target> {
    acquire: Pin<Box<Acquire<T>>>,
}

impl<T: Target> Turn<T> {
    /// Books `acquire` with a first poll (no task to wake yet); `Err` when it was refused.
    pub(crate) fn book(acquire: Acquire<T>) -> Result<Turn<T>, Denied> {
        let mut acquire = Box::pin(acquire);
        let noop = core::task::Waker::noop();
        match acquire.as_mut().poll(&mut Context::from_waker(noop)) {
            Poll::Ready(Err(denied)) => Err(denied),
            Poll::Pending => match acquire.as_ref().room_wait() {
                // A new key at a full key table: nothing is booked, so there is nothing
                // to hold; say when a slot frees (dropping the wait lets go of its timer).
                Some(wait) => Err(crate::NotUntil::no_room(wait).into()),
                None => Ok(Turn { acquire }),
            },
            Poll::Ready(Ok(())) => Ok(Turn { acquire }),
        }
    }

    pub(crate) fn ready_in(&self) -> Duration {
        Duration::from_nanos(self.acquire.as_ref().due_in())
    }

    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // The booking was made by the first poll; what is left can only finish.
        self.acquire.as_mut().poll(cx).map(drop)
    }
}

/// The methods every reservation type has, written once. The type has a `turn: Turn<_>`
/// field; `$example` is a doc line that makes a `turn` for the examples.
macro_rules! reservation_methods {
    ($example:literal) => {
        /// How long from now until the reserved cells may be used: zero once they may.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $example]
        /// assert!(turn.ready_in().is_zero()); // the burst had room
        /// ```
        pub fn ready_in(&self) -> Duration {
            self.turn.ready_in()
        }

        /// Whether the reserved cells may be used now.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $example]
        /// assert!(turn.is_ready());
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
        #[doc = $example]
        /// turn.wait();
        /// ```
        pub fn wait(self) {
            $crate::wait::block::block_on(self);
        }

        /// Gives the cells back if their instant has not come (the same as dropping the
        /// reservation, said out loud); once it has, they stay spent.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $example]
        /// turn.cancel();
        /// ```
        pub fn cancel(self) {
            drop(self);
        }
    };
}

pub(crate) use reservation_methods;
