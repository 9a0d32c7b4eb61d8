//! The shared limiter's waiting: booked, FIFO, cancel-safe async waits, blocking waits,
//! reservations (`crate::wait::methods`, shared with the direct limiter) and holds, with
//! the booking rules of words other processes share (`crate::wait::queue`).

use core::time::Duration;
use std::sync::Arc;

use super::SharedLimiter;
use crate::cell::{Ours, TatWord, ALWAYS_OURS};
use crate::clock::{Clock, HostClock};
use crate::gcra::Params;
use crate::shared::reservation::{OwnedSharedReservation, SharedReservation};
use crate::wait::{self, future::Target, queue::Waiters};

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

    crate::wait::methods::waiting_methods! {
        setup: "# use paceline::{shared::SharedLimiter, Denied, Quota};\n# use std::{sync::Arc, time::Duration};\n# let path = std::env::temp_dir().join(format!(\"paceline-doc-wait-{}\", std::process::id()));",
        open: "SharedLimiter::open(&path, ",
        close: ")?",
        end: "# std::fs::remove_file(&path)?;\n# Ok::<(), Box<dyn std::error::Error>>(())",
        reservation: SharedReservation<'_>,
        owned_reservation: OwnedSharedReservation,
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
