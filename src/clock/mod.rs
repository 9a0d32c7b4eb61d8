//! Time sources: the [`Clock`] trait, the default [`DefaultClock`], the faster but coarser
//! [`CoarseClock`], [`ManualClock`] for tests, and (cargo feature `tokio`) `TokioClock`,
//! whose wake-ups come from a tokio runtime's timer.
//!
//! A limiter reads time only through its clock, and asks the clock to wake it when its next
//! waiter is due ([`Clock::wake_at`]). That second method is how an embedding runtime can
//! drive pacer's waiters from its own timer: implement `Clock` over the runtime's time and
//! schedule the given waker there.

#[cfg(not(loom))]
mod coarse;
mod manual;
#[cfg(not(loom))]
mod timer;
#[cfg(all(feature = "tokio", not(loom)))]
mod tokio;

#[cfg(all(feature = "tokio", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use self::tokio::TokioClock;
#[cfg(not(loom))]
pub use coarse::CoarseClock;
pub use manual::ManualClock;

use core::task::Waker;

/// A source of monotonic time in nanoseconds, and a way to be woken at a given time.
///
/// # Examples
///
/// A clock for a runtime that drives its own timers (here a trivial stand-in that reads a
/// counter and never sleeps):
///
/// ```
/// use pacer::{clock::Clock, Limiter, Quota};
/// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
/// use std::task::Waker;
///
/// #[derive(Clone, Default)]
/// struct Ticks(Arc<AtomicU64>);
///
/// impl Clock for Ticks {
///     fn now(&self) -> u64 {
///         self.0.load(Ordering::Relaxed)
///     }
///     fn wake_at(&self, _at: u64, _waker: Waker) {
///         // A real runtime would put the waker in its timer wheel.
///     }
/// }
///
/// let limiter = Limiter::with_clock(Quota::per_second(1), Ticks::default());
/// assert!(limiter.check().is_ok());
/// assert!(limiter.check().is_err());
/// ```
pub trait Clock: Clone + Send + Sync + 'static {
    /// Nanoseconds since an origin of the clock's choosing.
    ///
    /// Should not go backwards; if it does (TSCs of different cores can disagree by a
    /// little), limiters only delay cells, never admit more than the quota.
    fn now(&self) -> u64;

    /// Arranges for `waker` to be woken once [`Clock::now`] has reached `at`.
    ///
    /// Waking early is harmless (pacer re-reads the time and asks again), but must not happen
    /// *on the calling thread* unless [`Clock::now`] has reached `at`: pacer calls this from
    /// inside its own wake-up path, so a synchronous early wake would recurse. Waking late
    /// delays waiters by as much. A clock that never wakes leaves async waiters to be driven
    /// by `Limiter::fire_due`.
    fn wake_at(&self, at: u64, waker: Waker);
}

/// The default clock: quanta's TSC-based monotonic time, and one process-wide timer thread
/// that wakes waiters when they are due.
///
/// Reading it costs a few nanoseconds (one `rdtsc` and a scale). All `DefaultClock`s share
/// one origin, fixed the first time any of them is read. The timer thread, named
/// `pacer-timer`, starts the first time a waiter must sleep; it keeps one entry per limiter
/// with waiters (not one per waiter) and sleeps with the OS's precise timeout, so a waiter
/// is woken within tens of microseconds of its instant on an idle machine.
///
/// # Examples
///
/// ```
/// use pacer::clock::{Clock, DefaultClock};
/// let clock = DefaultClock::default();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClock {
    _private: (),
}

#[cfg(not(loom))]
struct Origin {
    clock: quanta::Clock,
    raw: u64,
}

#[cfg(not(loom))]
static ORIGIN: std::sync::OnceLock<Origin> = std::sync::OnceLock::new();

#[cfg(not(loom))]
impl Clock for DefaultClock {
    #[inline]
    fn now(&self) -> u64 {
        let origin = ORIGIN.get_or_init(|| {
            let clock = quanta::Clock::new();
            let raw = clock.raw();
            Origin { clock, raw }
        });
        // `delta_as_nanos` returns 0 for a reading before the origin (a TSC that stepped
        // back across cores) rather than wrapping.
        origin.clock.delta_as_nanos(origin.raw, origin.clock.raw())
    }

    fn wake_at(&self, at: u64, waker: Waker) {
        timer::wake_at(at, waker);
    }
}

/// Under loom the default clock is a stub: models use `ManualClock`.
#[cfg(loom)]
impl Clock for DefaultClock {
    fn now(&self) -> u64 {
        0
    }

    fn wake_at(&self, _at: u64, waker: Waker) {
        waker.wake();
    }
}
