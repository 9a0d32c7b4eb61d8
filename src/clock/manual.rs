//! A clock that moves only when told to: for deterministic tests.

use core::task::Waker;
use core::time::Duration;
use std::sync::Arc;

use super::Clock;
use crate::sync::{AtomicU64, Mutex, Ordering, WakeList};

/// A clock that stands still until [`ManualClock::advance`] moves it; clones share one time.
///
/// Advancing wakes every waiter whose instant has come, so async tests need no sleeps.
///
/// # Examples
///
/// ```
/// use paceline::{clock::ManualClock, Limiter, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = Limiter::with_clock(Quota::per_second(1), clock.clone());
/// assert!(limiter.check().is_ok());
/// assert!(limiter.check().is_err());
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.check().is_ok());
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Nanoseconds since the clock was made.
    now: AtomicU64,
    /// Sleepers: `(instant, waker)`. Only touched under this lock.
    sleepers: Mutex<Vec<(u64, Waker)>>,
}

impl ManualClock {
    /// A clock at time zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::clock::{Clock, ManualClock};
    /// assert_eq!(ManualClock::new().now(), 0);
    /// ```
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves time forward by `by` (saturating at `u64::MAX` nanoseconds) and wakes every
    /// sleeper whose instant has come, in instant order, on the calling thread.
    ///
    /// # Panics
    ///
    /// If a woken waker panics: the panic is resumed here once every other due sleeper
    /// has been woken.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::clock::{Clock, ManualClock};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// clock.advance(Duration::from_millis(3));
    /// assert_eq!(clock.now(), 3_000_000);
    /// clock.advance(Duration::MAX);
    /// assert_eq!(clock.now(), u64::MAX);
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: the sleepers' lock below orders this store against `wake_at` (which
        // reads the time under that lock), and the time guards no other data.
        let _ = self
            .inner
            .now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
        self.wake_due();
    }

    fn wake_due(&self) {
        let mut due = WakeList::new();
        let mut panicked = Ok(());
        loop {
            {
                let mut sleepers = self.inner.sleepers.lock();
                let now = self.now();
                // Earliest first, so waiters of different limiters wake in instant order.
                sleepers.sort_by_key(|(at, _)| core::cmp::Reverse(*at));
                while !due.is_full() && sleepers.last().is_some_and(|(at, _)| *at <= now) {
                    if let Some((_, waker)) = sleepers.pop() {
                        due.push(waker);
                    }
                }
            }
            let more = due.is_full();
            panicked = panicked.and(due.wake_all());
            if !more {
                break;
            }
        }
        // Every due sleeper was woken; now report a waker's panic to the caller.
        if let Err(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        // Relaxed: see `advance`.
        self.inner.now.load(Ordering::Relaxed)
    }

    fn wake_at(&self, at: u64, waker: Waker) {
        {
            let mut sleepers = self.inner.sleepers.lock();
            // Read under the lock: an `advance` that moved past `at` either finished its
            // store before we locked (we see it and wake now) or will drain us after.
            if at > self.now() {
                sleepers.push((at, waker));
                return;
            }
        }
        waker.wake();
    }

    fn forget_waker(&self, waker: &Waker) {
        let mut forgotten = Vec::new();
        {
            let mut sleepers = self.inner.sleepers.lock();
            let mut i = 0;
            while i < sleepers.len() {
                if sleepers[i].1.will_wake(waker) {
                    // Order does not matter: `wake_due` sorts before it wakes.
                    forgotten.push(sleepers.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        // Dropped after the lock: dropping a waker may run foreign code.
        drop(forgotten);
    }
}
