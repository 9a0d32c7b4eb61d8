//! A clock whose wake-ups come from a tokio runtime's own timer (cargo feature `tokio`).

use core::task::Waker;
use core::time::Duration;

use super::{timer, Clock, DefaultClock};

/// [`DefaultClock`]'s time, with waiters woken by a tokio runtime's timer instead of
/// paceline's `paceline-timer` thread.
///
/// With the default clock, every round of wake-ups is two thread switches: the timer
/// thread wakes, then it wakes a runtime worker. With this clock the worker that sleeps
/// in the runtime's driver wakes itself and runs the waiters' tasks, so a busy
/// limiter costs less CPU (20 000 waiters at 100 000/s: about a fifth less; BENCHMARKS.md
/// has the numbers). The price is tokio's millisecond timer: waiters are woken
/// later after their instant (measured: 0.66 ms on average, 2.1 ms at most, against the
/// default clock's 0.37 ms and 0.68 ms), never before it.
///
/// Readings are the default clock's, so limiters on either clock agree on time.
///
/// Which runtimes it serves, and what happens elsewhere, so that waiters never hang:
///
/// * a **multi-thread** runtime with its time driver (`enable_time` or `enable_all`): its
///   workers drive the timer whenever the runtime is alive, so wake-ups go to tokio;
/// * a **current-thread** runtime runs (and fires its timers) only while some thread is
///   inside its `block_on`; a thread blocked in `Limiter::wait` must not depend on that,
///   so on such a runtime every wake-up goes to paceline's timer thread (exactly as with
///   [`DefaultClock`]);
/// * a runtime **without a time driver** is detected when the clock is made (where panics
///   unwind: tokio offers no query, so the clock tries a timer once and catches tokio's
///   panic, whose message the panic hook prints); its wake-ups go to paceline's timer thread
///   too. Under `panic = "abort"` the clock cannot look without risking the process, so
///   it uses paceline's timer thread unless told otherwise by
///   [`TokioClock::assume_time_driver`];
/// * a runtime that **shuts down** with wake-ups in flight hands them to paceline's timer
///   thread as its tasks are dropped.
///
/// # Examples
///
/// ```
/// use paceline::{clock::TokioClock, Limiter, Quota};
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() {
///     let limiter = Limiter::with_clock(Quota::per_second(1000), TokioClock::current());
///     for _ in 0..3 {
///         limiter.until_ready().await;
///     }
/// }
/// ```
#[derive(Clone, Debug)]
pub struct TokioClock {
    /// The runtime whose timer serves wake-ups; `None` when it cannot be relied on (see
    /// the type's docs), and paceline's timer thread serves them.
    handle: Option<tokio::runtime::Handle>,
    /// Where the time comes from.
    time: DefaultClock,
}

impl TokioClock {
    /// The clock of the runtime this is called from.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as `tokio::runtime::Handle::current` does); use
    /// [`TokioClock::from_handle`] there.
    pub fn current() -> TokioClock {
        TokioClock::from_handle(tokio::runtime::Handle::current())
    }

    /// The clock of the runtime behind `handle`.
    ///
    /// # Examples
    ///
    /// ```
    /// let runtime = tokio::runtime::Runtime::new().unwrap();
    /// let clock = paceline::clock::TokioClock::from_handle(runtime.handle().clone());
    /// let limiter = paceline::Limiter::with_clock(paceline::Quota::per_second(10), clock);
    /// assert!(limiter.check().is_ok());
    /// ```
    pub fn from_handle(handle: tokio::runtime::Handle) -> TokioClock {
        let served = handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && has_time_driver(&handle);
        TokioClock {
            handle: served.then_some(handle),
            time: DefaultClock::default(),
        }
    }

    /// The clock of the multi-thread runtime behind `handle`, which the caller vouches has
    /// its time driver (`enable_time` or `enable_all`): wake-ups go to its timer without a
    /// check. Meant for `panic = "abort"` builds, where [`TokioClock::from_handle`] cannot
    /// check. A current-thread runtime still gets paceline's timer thread.
    ///
    /// If the runtime has no time driver after all, the first wake-up panics inside the
    /// runtime (aborting the process under `panic = "abort"`), and with unwinding, every
    /// wake-up prints that panic before paceline's timer thread takes it over.
    ///
    /// # Examples
    ///
    /// ```
    /// let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    /// let clock = paceline::clock::TokioClock::assume_time_driver(runtime.handle().clone());
    /// assert!(clock.uses_runtime_timer());
    /// ```
    pub fn assume_time_driver(handle: tokio::runtime::Handle) -> TokioClock {
        let served = handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
        TokioClock {
            handle: served.then_some(handle),
            time: DefaultClock::default(),
        }
    }

    /// Whether wake-ups go to the runtime's timer (`true`) or to paceline's timer thread
    /// (`false`: a current-thread runtime, or one without a time driver).
    ///
    /// # Examples
    ///
    /// ```
    /// let multi = tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap();
    /// # #[cfg(panic = "unwind")]
    /// assert!(paceline::clock::TokioClock::from_handle(multi.handle().clone()).uses_runtime_timer());
    /// let no_time = tokio::runtime::Builder::new_multi_thread().build().unwrap();
    /// assert!(!paceline::clock::TokioClock::from_handle(no_time.handle().clone()).uses_runtime_timer());
    /// ```
    ///
    /// Under `panic = "abort"` a clock from [`TokioClock::from_handle`] says `false` here:
    /// see the type's docs.
    pub fn uses_runtime_timer(&self) -> bool {
        self.handle.is_some()
    }
}

/// Whether the runtime behind `handle` has a time driver, found without a panic that
/// could abort the process.
///
/// tokio has no query for this: making a timer on a runtime without one panics. Where
/// panics unwind, we make one under `catch_unwind` (once per clock; the panic hook prints
/// tokio's own advice to call `enable_time`). Where they abort, we cannot look, and answer
/// "no": paceline's timer thread then serves the wake-ups, unless the caller vouched for the
/// driver with [`TokioClock::assume_time_driver`].
fn has_time_driver(handle: &tokio::runtime::Handle) -> bool {
    #[cfg(panic = "unwind")]
    {
        let _entered = handle.enter();
        std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
    }
    #[cfg(not(panic = "unwind"))]
    {
        let _ = handle;
        false
    }
}

/// A wake-up in flight in the runtime. Dropped before it fired (the runtime shut down, or
/// a timer that was assumed to exist panicked), it hands the waker to paceline's timer
/// thread, so the wake-up is never lost.
struct Pending {
    at: u64,
    waker: Option<Waker>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(waker) = self.waker.take() {
            timer::wake_at(self.at, waker);
        }
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> u64 {
        self.time.now()
    }

    fn wake_at(&self, at: u64, waker: Waker) {
        let Some(handle) = &self.handle else {
            timer::wake_at(at, waker);
            return;
        };
        let now = self.now();
        if at <= now {
            waker.wake();
            return;
        }
        // tokio rounds a deadline up to its next millisecond tick, so this never fires
        // before `at` by tokio's clock. Should the two clocks disagree by a hair, a wake-up
        // that comes early by ours only makes the queue look again and re-arm.
        let deadline = tokio::time::Instant::now() + Duration::from_nanos(at - now);
        let mut pending = Pending {
            at,
            waker: Some(waker),
        };
        handle.spawn(async move {
            tokio::time::sleep_until(deadline).await;
            if let Some(waker) = pending.waker.take() {
                waker.wake();
            }
        });
    }
}
