//! A booked turn on a [`SharedLimiter`] as a value: the same promises as
//! [`Reservation`](crate::Reservation), across processes.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use super::limiter::SharedLimiter;
use crate::wait::future::Acquire;
use crate::wait::turn::{reservation_methods, Turn};
use crate::Denied;

/// `n` cells booked on a [`SharedLimiter`], usable from an instant it tells: made by
/// [`SharedLimiter::reserve`]. Dropped (or [`cancel`](SharedReservation::cancel)led)
/// before its instant, it gives the cells back when nothing was booked or admitted after
/// it in any process; once its instant has come they stay spent.
///
/// # Examples
///
/// ```
/// # use paceline::{shared::SharedLimiter, Quota};
/// # let path = std::env::temp_dir().join(format!("paceline-doc-w-{}", std::process::id()));
/// let limiter = SharedLimiter::open(&path, Quota::per_second(100))?;
/// let turn = limiter.reserve(1)?;
/// turn.wait();
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct SharedReservation<'a> {
    turn: Turn<&'a SharedLimiter>,
}

/// A [`SharedReservation`] that owns its limiter (an `Arc`): made by
/// [`SharedLimiter::reserve_within_owned`]; the same promises.
///
/// # Examples
///
/// ```
/// # use paceline::{shared::SharedLimiter, Quota};
/// # use std::{sync::Arc, time::Duration};
/// # let path = std::env::temp_dir().join(format!("paceline-doc-x-{}", std::process::id()));
/// let limiter = Arc::new(SharedLimiter::open(&path, Quota::per_second(100))?);
/// let turn = Arc::clone(&limiter).reserve_within_owned(1, Duration::MAX)?;
/// std::thread::spawn(move || turn.wait()).join().unwrap();
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct OwnedSharedReservation {
    turn: Turn<Arc<SharedLimiter>>,
}

impl<'a> SharedReservation<'a> {
    pub(super) fn book(
        acquire: Acquire<&'a SharedLimiter>,
    ) -> Result<SharedReservation<'a>, Denied> {
        Turn::book(acquire).map(|turn| SharedReservation { turn })
    }

    reservation_methods!(
        "let path = std::env::temp_dir().join(format!(\"paceline-doc-y-{}\", std::process::id()));\nlet limiter = paceline::shared::SharedLimiter::open(&path, paceline::Quota::per_second(1000)).unwrap();\nlet turn = limiter.reserve(1).unwrap();"
    );
}

impl OwnedSharedReservation {
    pub(super) fn book(
        acquire: Acquire<Arc<SharedLimiter>>,
    ) -> Result<OwnedSharedReservation, Denied> {
        Turn::book(acquire).map(|turn| OwnedSharedReservation { turn })
    }

    reservation_methods!(
        "let path = std::env::temp_dir().join(format!(\"paceline-doc-z-{}\", std::process::id()));\nlet limiter = std::sync::Arc::new(paceline::shared::SharedLimiter::open(&path, paceline::Quota::per_second(1000)).unwrap());\nlet turn = limiter.reserve_within_owned(1, std::time::Duration::MAX).unwrap();"
    );
}

impl core::fmt::Debug for SharedReservation<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedReservation")
            .field("ready_in", &self.ready_in())
            .finish_non_exhaustive()
    }
}

impl core::fmt::Debug for OwnedSharedReservation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OwnedSharedReservation")
            .field("ready_in", &self.ready_in())
            .finish_non_exhaustive()
    }
}

impl Future for SharedReservation<'_> {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.turn.poll(cx)
    }
}

impl Future for OwnedSharedReservation {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.turn.poll(cx)
    }
}
