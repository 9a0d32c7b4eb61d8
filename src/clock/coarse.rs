//! A clock that trades precision for speed: one relaxed load per reading.

use core::task::Waker;
use core::time::Duration;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crossbeam_utils::CachePadded;

use super::{fork, timer, Clock, DefaultClock};

/// A clock read from a shared word that an upkeep thread refreshes from [`DefaultClock`]
/// every `resolution`.
///
/// Reading it is one relaxed load, so `check()` skips the TSC read that dominates its
/// cost. The trade-off: readings lag real time by up to one `resolution` (more if the
/// upkeep thread is descheduled). A lagging clock only makes the limiter *stricter*: cells
/// are admitted up to one resolution late, never early, and waits are overestimated by as
/// much. Use it when the resolution is small against the quota's emission interval (e.g. a
/// 1 ms resolution for 100 requests per second). Async waiters are woken up to about one
/// resolution after their instant.
///
/// Each `CoarseClock::with_resolution` starts one thread (`paceline-coarse-clock`); clones
/// share it, and it exits once every clone is dropped. A process that forks gets a new
/// upkeep thread in the child for every coarse clock alive at the fork (threads do not
/// survive `fork`; see `fork.rs`). This module uses `std` atomics
/// directly: it is a real OS thread that loom cannot model, and loom builds leave it out.
///
/// # Examples
///
/// ```
/// use paceline::{clock::CoarseClock, Limiter, Quota};
/// use std::time::Duration;
///
/// let clock = CoarseClock::with_resolution(Duration::from_millis(1));
/// let limiter = Limiter::with_clock(Quota::per_second(100), clock);
/// assert!(limiter.check().is_ok());
/// ```
#[derive(Clone, Debug)]
pub struct CoarseClock {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The latest default-clock reading.
    now: CachePadded<AtomicU64>,
    /// The refresh period in nanoseconds.
    resolution: u64,
}

impl CoarseClock {
    /// The finest resolution accepted; finer ones are raised to it.
    pub const MIN_RESOLUTION: Duration = Duration::from_micros(10);
    /// The coarsest resolution accepted; coarser ones are lowered to it.
    pub const MAX_RESOLUTION: Duration = Duration::from_secs(1);

    /// A coarse clock refreshed every `resolution`, clamped to
    /// [`MIN_RESOLUTION`](Self::MIN_RESOLUTION)..=[`MAX_RESOLUTION`](Self::MAX_RESOLUTION).
    ///
    /// # Panics
    ///
    /// If the upkeep thread cannot be spawned.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::clock::{Clock, CoarseClock};
    /// use std::time::Duration;
    /// let clock = CoarseClock::with_resolution(Duration::ZERO); // raised to 10 us
    /// assert_eq!(clock.resolution(), Duration::from_micros(10));
    /// ```
    pub fn with_resolution(resolution: Duration) -> CoarseClock {
        let resolution = resolution.clamp(Self::MIN_RESOLUTION, Self::MAX_RESOLUTION);
        let shared = Arc::new(Shared {
            now: CachePadded::new(AtomicU64::new(DefaultClock::default().now())),
            resolution: resolution.as_nanos() as u64,
        });
        fork::add(&FORK_HOOKS);
        let mut live = live();
        live.retain(|clock| clock.strong_count() > 0);
        live.push(Arc::downgrade(&shared));
        start_upkeep(&shared).expect("paceline: cannot spawn the coarse clock's upkeep thread");
        CoarseClock { shared }
    }

    /// How often the reading is refreshed.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::clock::CoarseClock; use std::time::Duration;
    /// let clock = CoarseClock::with_resolution(Duration::from_millis(2));
    /// assert_eq!(clock.resolution(), Duration::from_millis(2));
    /// ```
    pub fn resolution(&self) -> Duration {
        Duration::from_nanos(self.shared.resolution)
    }
}

/// Every coarse clock alive (and some dropped ones, pruned by the next constructor), so
/// that a forked child can start their upkeep threads again.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<Weak<Shared>>> {
    // Nothing under this lock panics half-way, so poisoning carries no broken invariant.
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

std::thread_local! {
    /// `LIVE`'s lock, held by the forking thread across the fork.
    static HELD: core::cell::Cell<Option<MutexGuard<'static, Vec<Weak<Shared>>>>> =
        const { core::cell::Cell::new(None) };
}

/// What the coarse clocks do around a fork (`fork.rs`).
pub(super) static FORK_HOOKS: fork::Hooks =
    fork::Hooks::new(hold_for_fork, release_after_fork, restart_after_fork);

/// Fork's prepare handler: no constructor is half-way through the list at the fork.
fn hold_for_fork() {
    HELD.with(|held| {
        let guard = held.take();
        // Registered twice (`fork.rs`): the first run holds it already.
        let guard = guard.unwrap_or_else(live);
        held.set(Some(guard));
    });
}

/// Fork's parent handler.
fn release_after_fork() {
    drop(HELD.with(core::cell::Cell::take));
}

/// Fork's child handler: each clock alive gets a fresh reading and a new upkeep thread.
fn restart_after_fork() {
    let Some(live) = HELD.with(core::cell::Cell::take) else {
        return;
    };
    let now = DefaultClock::default().now();
    for shared in live.iter().filter_map(Weak::upgrade) {
        // Relaxed: see `upkeep`.
        shared.now.store(now, Ordering::Relaxed);
        // A thread that cannot be spawned here leaves that clock stopped in the child, as
        // it was before the handlers existed; nothing else to do inside `fork`.
        let _ = start_upkeep(&shared);
    }
}

/// Starts the thread that refreshes `shared`; it exits once every clone is dropped.
fn start_upkeep(shared: &Arc<Shared>) -> std::io::Result<()> {
    let weak = Arc::downgrade(shared);
    let resolution = Duration::from_nanos(shared.resolution);
    std::thread::Builder::new()
        .name("paceline-coarse-clock".into())
        .spawn(move || upkeep(weak, resolution))
        .map(drop)
}

fn upkeep(shared: Weak<Shared>, resolution: Duration) {
    let clock = DefaultClock::default();
    loop {
        std::thread::sleep(resolution);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // Relaxed: one word that publishes nothing else; readers only need some recent
        // value, and the store is visible to them promptly in practice.
        shared.now.store(clock.now(), Ordering::Relaxed);
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: see `upkeep`.
        self.shared.now.load(Ordering::Relaxed)
    }

    fn wake_at(&self, at: u64, waker: Waker) {
        // Wake on this thread only when *our* reading has reached `at`: the queue judges
        // "due" by our reading, so waking it earlier would find nothing due and re-arm,
        // over and over. Otherwise the default clock's timer thread wakes it a resolution
        // after `at` (when our lagging reading should have caught up); if the upkeep thread
        // is late, the queue re-arms and the timer's gap between rounds spaces the retries.
        if at <= self.now() {
            waker.wake();
        } else {
            timer::schedule(at.saturating_add(self.shared.resolution), waker);
        }
    }
}
