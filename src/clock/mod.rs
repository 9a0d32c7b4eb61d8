//! Time sources: the [`Clock`] trait, the default [`DefaultClock`], the faster but coarser
//! [`CoarseClock`], [`ManualClock`] for tests, and (cargo feature `tokio`) `TokioClock`,
//! whose wake-ups come from a tokio runtime's timer.
//!
//! A limiter reads time only through its clock, and asks the clock to wake it when its next
//! waiter is due ([`Clock::wake_at`]). That second method is how an embedding runtime can
//! drive paceline's waiters from its own timer: implement `Clock` over the runtime's time and
//! schedule the given waker there.

#[cfg(all(feature = "std", not(loom)))]
mod coarse;
#[cfg(all(feature = "std", not(loom)))]
mod fork;
#[cfg(all(feature = "std", not(loom)))]
pub(crate) mod gate;
/// Loom models never fork: a lock "inside the gate" is the lock.
#[cfg(loom)]
pub(crate) mod gate {
    pub(crate) type Gated<'a, T> = crate::sync::MutexGuard<'a, T>;

    pub(crate) fn lock<T>(mutex: &crate::sync::Mutex<T>) -> Gated<'_, T> {
        mutex.lock()
    }
}
#[cfg(all(feature = "shared", not(loom)))]
mod host;
#[cfg(feature = "std")]
mod manual;
#[cfg(all(feature = "std", not(loom)))]
mod timer;
#[cfg(all(feature = "tokio", not(loom)))]
mod tokio;

#[cfg(all(feature = "tokio", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use self::tokio::TokioClock;
#[cfg(all(feature = "std", not(loom)))]
pub use coarse::CoarseClock;
/// How many forks lie between this process and the one that first used paceline; the
/// first call registers every clock module's fork hooks (`fork.rs`).
#[cfg(all(feature = "std", not(loom)))]
pub(crate) fn forks() -> u64 {
    fork::generation(&[&timer::FORK_HOOKS, &coarse::FORK_HOOKS, &gate::FORK_HOOKS])
}
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use fork::{runs_here, thread_token};
/// Loom models run in one process that never forks.
#[cfg(loom)]
pub(crate) fn runs_here(_generation: u64, _thread: usize) -> bool {
    true
}
/// Loom models run in one process that never forks.
#[cfg(loom)]
pub(crate) fn thread_token() -> usize {
    0
}
#[cfg(all(feature = "shared", not(loom)))]
pub(crate) use host::{HostClock, HostTime};

/// Loom models run in one process that never forks.
#[cfg(loom)]
pub(crate) fn forks() -> u64 {
    0
}
#[cfg(feature = "std")]
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
/// use paceline::{clock::Clock, Limiter, Quota};
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
    /// Limiters work in these nanoseconds directly: a fresh limiter's state is time 0, so
    /// any reading lets its whole burst through, and the arithmetic covers 584 years from
    /// the origin (an origin such as the machine's boot or the Unix epoch leaves
    /// centuries).
    ///
    /// Should not go backwards; if it does (TSCs of different cores can disagree by a
    /// little), limiters only delay cells, never admit more than the quota.
    fn now(&self) -> u64;

    /// Arranges for `waker` to be woken once [`Clock::now`] has reached `at`.
    ///
    /// Waking early is harmless (paceline re-reads the time and asks again). Waking *on the
    /// calling thread* before [`Clock::now`] has reached `at` breaks this contract: paceline
    /// tolerates it (it notices the re-entrant wake-up, handles it without recursing, and
    /// after a few early wake-ups in a row stops asking until its next booking), but waiters
    /// are then only woken by later polls or `Limiter::wake_due_waiters`. Waking late delays waiters
    /// by as much. A clock that never wakes leaves async waiters to be driven by
    /// `Limiter::wake_due_waiters`.
    ///
    /// `waker` is a paceline-internal waker (one per limiter, or per waiting key); its `wake`
    /// never blocks and never panics, but it may run the wakers of the limiter's waiting
    /// tasks on the calling thread.
    fn wake_at(&self, at: u64, waker: Waker);

    /// Lets go of every wake-up still pending for `waker` (compare with
    /// [`Waker::will_wake`]): paceline calls it when the limiter (or the keyed limiter's queue
    /// for one key) that asked for them is dropped, so that a clock which stores wakers
    /// does not keep memory for a limiter that no longer exists.
    ///
    /// The default does nothing: the wake-up then fires into a dropped limiter, which is
    /// harmless, and its memory is released at that time.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::clock::{Clock, ManualClock};
    /// use std::task::Waker;
    ///
    /// let clock = ManualClock::new();
    /// clock.wake_at(1_000, Waker::noop().clone());
    /// clock.forget_waker(Waker::noop()); // the sleeper is gone
    /// ```
    fn forget_waker(&self, waker: &Waker) {
        let _ = waker;
    }
}

/// The default clock: quanta's TSC-based monotonic time, and one process-wide timer thread
/// that wakes waiters when they are due.
///
/// Reading it costs a few nanoseconds (one `rdtsc` and a scale, both read from the value
/// itself, so a limiter's check looks nothing up elsewhere). Readings count from the
/// machine's time-stamp counter's zero (about its boot), so all `DefaultClock`s agree. The
/// first `DefaultClock` in a process calibrates the counter (a few milliseconds); later
/// ones copy that calibration. The timer thread, named
/// `paceline-timer`, starts the first time a waiter must sleep; it keeps one entry per limiter
/// with waiters (not one per waiter) and sleeps with the OS's precise timeout, so a waiter
/// is woken within tens of microseconds of its instant on an idle machine.
///
/// # Examples
///
/// ```
/// use paceline::clock::{Clock, DefaultClock};
/// let clock = DefaultClock::default();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[cfg(feature = "std")]
#[derive(Clone, Debug)]
pub struct DefaultClock {
    #[cfg(not(loom))]
    clock: quanta::Clock,
}

#[cfg(feature = "std")]
impl Default for DefaultClock {
    fn default() -> DefaultClock {
        DefaultClock {
            #[cfg(not(loom))]
            clock: quanta::Clock::new(),
        }
    }
}

#[cfg(all(feature = "std", not(loom)))]
impl Clock for DefaultClock {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(0, self.clock.raw())
    }

    fn wake_at(&self, at: u64, waker: Waker) {
        timer::wake_at(at, waker);
    }

    fn forget_waker(&self, waker: &Waker) {
        timer::forget(waker);
    }
}

/// Under loom the default clock is a stub that stands at 0 and never wakes anyone (waking
/// on the calling thread would break the [`Clock::wake_at`] contract): models use
/// `ManualClock`.
#[cfg(loom)]
impl Clock for DefaultClock {
    fn now(&self) -> u64 {
        0
    }

    fn wake_at(&self, _at: u64, waker: Waker) {
        drop(waker);
    }
}
