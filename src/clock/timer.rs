//! The process-wide timer thread behind [`DefaultClock::wake_at`](super::DefaultClock).
//!
//! # Implementation notes
//!
//! One ordered map of `(instant, seq) -> waker` and one thread that sleeps until the
//! earliest. Limiters register one entry for their first waiter (not one per waiter), so
//! the map stays as small as the number of limiters with sleepers; a second index by waker
//! lets a dropped limiter take its entries with it ([`forget`]), so nothing of it stays
//! behind until its last instant.
//!
//! **Coalescing.** After a round of wake-ups the thread sleeps at least [`MIN_GAP`] before
//! the next, whatever is due meanwhile. A lone waiter is woken at its instant; a dense
//! stream of them (100 000/s) is woken in batches of everything due, at most every
//! `MIN_GAP`, never early and at most `MIN_GAP` late.
//!
//! **Hostile wakers.** Waking runs code that is not ours (the limiter's wake-up path runs
//! its tasks' wakers). Two things protect the other limiters of the process from it:
//!
//! * every wake runs under `catch_unwind`, so a panicking waker costs its own wake-up and
//!   nothing else: the thread goes on serving the map;
//! * entries are taken one at a time, and the thread records when it entered each wake
//!   (a fresh clock reading per wake, so many quick wakes in one round never add up to a
//!   stall). A watchdog thread looks every [`STALL`] / 2 while the timer is active; if one
//!   wake has run for longer than [`STALL`] (a waker that sleeps or blocks), it hands the
//!   map to a fresh successor thread. The stuck thread exits as soon as its wake returns.
//!   So a sleeping waker delays only itself, and everything else by at most about `STALL`.
//!   The watchdog parks for good after a second without activity, and `schedule` unparks
//!   it when work arrives again.
//! * the threads are bounded: at most [`MAX_THREADS`] `paceline-timer` threads are alive at
//!   once, the serving one included. While that many are stuck in wakes, no successor is
//!   started, and the map waits until one of the stuck wakes returns: wakers that block
//!   for good can, `MAX_THREADS` of them at once, stop the default clock's wake-ups for
//!   the whole process. (Wakers must not block; this only bounds the damage when they do.)
//!
//! **Fork.** A child process gets the map but none of the threads: the fork handlers (see
//! `fork.rs`) hold the lock across the fork, after waiting up to [`STALL`] for the server
//! to finish the wake it is in, and in the child forget the parent's threads and start a
//! server for the entries the child inherited (the limiters' queues in the child count on
//! the wake-ups they already asked for).
//!
//! This module uses `std::sync` directly rather than the `crate::sync` shim: it is a real
//! OS thread parked with `park_timeout`, which loom cannot model, and loom builds leave it
//! out (the default clock's timer is stubbed there; models use `ManualClock`).

use core::task::Waker;
use core::time::Duration;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, Thread};

use super::{fork, Clock, DefaultClock};

/// The shortest time between two rounds of wake-ups (see the module docs).
pub(super) const MIN_GAP: u64 = 1_000_000;

/// How long one wake may run before the map is handed to a successor thread.
pub(crate) const STALL: u64 = 10_000_000;

/// Most `paceline-timer` threads alive at once: the serving one and those stuck in a wake.
pub(crate) const MAX_THREADS: usize = 4;

/// After this long without entries or wakes, the watchdog parks until `schedule` wakes it.
const WATCHDOG_IDLE: u64 = 1_000_000_000;

/// The key of an entry: its instant, then registration order among equal instants.
type Key = (u64, u64);

/// Everything under the timer's lock.
struct State {
    entries: BTreeMap<Key, Waker>,
    /// The keys of each waker's entries, by the waker's data address. An address is unique
    /// while an entry holds a clone of that waker (the clone keeps it alive). Addresses
    /// are not chosen by anyone who could aim at collisions, so the fixed-key hasher does.
    by_waker: HashMap<usize, Vec<Key>, BuildHasherDefault<DefaultHasher>>,
    seq: u64,
    /// The generation of the thread that serves the map; older threads exit.
    generation: u64,
    /// Server threads alive: the serving one and older ones still stuck in a wake.
    alive: usize,
    /// The serving thread, unparked when an earlier entry arrives.
    server: Option<Thread>,
    /// When the serving thread entered its current wake (default clock); 0 when in none.
    busy_since: u64,
    /// The watchdog, and whether it parked for good (then `schedule` unparks it).
    watchdog: Option<Thread>,
    watchdog_parked: bool,
    /// The last time the map had entries or the server was in a wake.
    last_active: u64,
}

impl State {
    const fn new() -> State {
        State {
            entries: BTreeMap::new(),
            by_waker: HashMap::with_hasher(BuildHasherDefault::new()),
            seq: 0,
            generation: 0,
            alive: 0,
            server: None,
            busy_since: 0,
            watchdog: None,
            watchdog_parked: false,
            last_active: 0,
        }
    }

    fn insert(&mut self, at: u64, waker: Waker) -> bool {
        let key = (at, self.seq);
        self.seq = self.seq.wrapping_add(1);
        let earliest = self.entries.first_key_value().is_none_or(|(k, _)| key < *k);
        self.by_waker
            .entry(waker.data() as usize)
            .or_default()
            .push(key);
        self.entries.insert(key, waker);
        earliest
    }

    /// Removes and returns the earliest entry if it is due at `now`.
    fn pop_due(&mut self, now: u64) -> Option<Waker> {
        let entry = self.entries.first_entry().filter(|e| e.key().0 <= now)?;
        let key = *entry.key();
        let waker = entry.remove();
        self.unindex(waker.data() as usize, key);
        Some(waker)
    }

    fn unindex(&mut self, addr: usize, key: Key) {
        if let Some(keys) = self.by_waker.get_mut(&addr) {
            keys.retain(|k| *k != key);
            if keys.is_empty() {
                self.by_waker.remove(&addr);
                self.shrink();
            }
        }
    }

    /// Removes `waker`'s entries and returns them, to be dropped after the lock.
    fn forget(&mut self, waker: &Waker) -> Vec<Waker> {
        let Some(keys) = self.by_waker.remove(&(waker.data() as usize)) else {
            return Vec::new();
        };
        let mut kept = Vec::new();
        let mut removed = Vec::new();
        for key in keys {
            match self.entries.remove(&key) {
                Some(w) if w.will_wake(waker) => removed.push(w),
                // Same address, another vtable: not ours, put it back.
                Some(w) => {
                    self.entries.insert(key, w);
                    kept.push(key);
                }
                None => {}
            }
        }
        if !kept.is_empty() {
            self.by_waker.insert(waker.data() as usize, kept);
        }
        self.shrink();
        removed
    }

    /// Gives memory back once the index is mostly empty, so a burst of limiters that came
    /// and went leaves no large table behind.
    fn shrink(&mut self) {
        if self.by_waker.capacity() > 64 && self.by_waker.len() * 4 < self.by_waker.capacity() {
            self.by_waker.shrink_to(self.by_waker.len() * 2);
        }
    }
}

/// Made at compile time, not on first use: a fork while another thread were making it
/// would leave it half-made in the child for ever (`fork.rs`).
static STATE: Mutex<State> = Mutex::new(State::new());

/// What the timer does around a fork (`fork.rs`).
pub(super) static FORK_HOOKS: fork::Hooks =
    fork::Hooks::new(hold_for_fork, release_after_fork, restart_after_fork);

/// The lock, once the fork handlers that hold it across a fork are registered.
fn lock() -> MutexGuard<'static, State> {
    fork::add(&FORK_HOOKS);
    lock_state()
}

fn lock_state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        // No critical section here runs foreign code, so a poisoned lock (impossible in
        // practice) carries no broken invariant.
        .unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// The lock, held by the forking thread from the fork's prepare handler to its
    /// parent or child handler.
    static HELD: Cell<Option<MutexGuard<'static, State>>> = const { Cell::new(None) };
}

/// Fork's prepare handler: takes the lock once the server is between wakes (or after
/// [`STALL`], if a waker keeps it), and holds it across the fork (module docs).
fn hold_for_fork() {
    if HELD.with(|held| {
        let guard = held.take();
        let holding = guard.is_some();
        held.set(guard);
        holding
    }) {
        // Registered twice (`fork.rs`): the first run holds it already.
        return;
    }
    // The clock is read only while the server is in a wake: a process that never used
    // the timer forks without reading it (or making it).
    let mut give_up = None;
    let guard = loop {
        let guard = lock_state();
        if guard.busy_since == 0 {
            break guard;
        }
        let now = now();
        if now >= *give_up.get_or_insert(now.saturating_add(STALL)) {
            break guard;
        }
        drop(guard);
        thread::sleep(Duration::from_micros(50));
    };
    HELD.with(|held| held.set(Some(guard)));
}

/// Fork's parent handler: lets the lock go.
fn release_after_fork() {
    drop(HELD.with(Cell::take));
}

/// Fork's child handler: the parent's threads did not come along; serve what the child
/// inherited with new ones (module docs).
fn restart_after_fork() {
    let Some(mut state) = HELD.with(Cell::take) else {
        return;
    };
    state.server = None;
    state.watchdog = None;
    state.watchdog_parked = false;
    state.alive = 0;
    state.busy_since = 0;
    if !state.entries.is_empty() {
        start_threads(&mut state);
    }
}

fn now() -> u64 {
    static CLOCK: OnceLock<DefaultClock> = OnceLock::new();
    CLOCK.get_or_init(DefaultClock::default).now()
}

/// Wakes `waker` once the default clock reads at least `at`: at once if it already does.
pub(super) fn wake_at(at: u64, waker: Waker) {
    if at <= now() {
        waker.wake();
        return;
    }
    schedule(at, waker);
}

/// Hands `waker` to the timer thread for `at`, never waking it on the calling thread, even
/// if `at` has passed (then the thread wakes it in its next round).
pub(super) fn schedule(at: u64, waker: Waker) {
    let mut state = lock();
    let earliest = state.insert(at, waker);
    start_threads(&mut state);
    let server = earliest.then(|| state.server.clone()).flatten();
    let watchdog = core::mem::take(&mut state.watchdog_parked)
        .then(|| state.watchdog.clone())
        .flatten();
    drop(state);
    // The server may be sleeping until a later instant: make it look again.
    if let Some(server) = server {
        server.unpark();
    }
    if let Some(watchdog) = watchdog {
        watchdog.unpark();
    }
}

/// Lets go of every entry for `waker` (see `Clock::forget_waker`).
pub(super) fn forget(waker: &Waker) {
    let removed = lock().forget(waker);
    // Dropped after the lock: dropping a waker may run foreign code.
    drop(removed);
}

/// How many entries are pending for `waker`: for tests of `forget`.
#[cfg(test)]
pub(crate) fn pending_for(waker: &Waker) -> usize {
    lock()
        .entries
        .values()
        .filter(|w| w.will_wake(waker))
        .count()
}

/// Starts the server and the watchdog, whichever is not running.
fn start_threads(state: &mut State) {
    if state.server.is_none() {
        spawn_server(state);
    }
    if state.watchdog.is_none() {
        state.watchdog = thread::Builder::new()
            .name("paceline-timer-watchdog".into())
            .spawn(watchdog)
            .ok()
            .map(|h| h.thread().clone());
    }
}

/// Starts a server thread of a new generation; an old one exits after its current wake.
fn spawn_server(state: &mut State) {
    let generation = state.generation.wrapping_add(1);
    if let Ok(handle) = thread::Builder::new()
        .name("paceline-timer".into())
        .spawn(move || serve(generation))
    {
        state.generation = generation;
        state.server = Some(handle.thread().clone());
        state.busy_since = 0;
        state.alive += 1;
    }
}

fn serve(generation: u64) {
    // When the last round of wake-ups ran.
    let mut last_round = 0u64;
    loop {
        let now = now();
        if now < last_round.saturating_add(MIN_GAP) {
            // Too soon after the last round (an earlier entry arrived and unparked us):
            // come back when the gap is over.
            thread::park_timeout(Duration::from_nanos(last_round + MIN_GAP - now));
            continue;
        }
        let mut woke = false;
        let next = loop {
            let waker = {
                let mut state = lock();
                if state.generation != generation {
                    // A successor took over while we were stuck in a wake.
                    state.alive -= 1;
                    return;
                }
                state.busy_since = 0;
                state.last_active = now;
                match state.pop_due(now) {
                    Some(waker) => {
                        // This wake's own start: the watchdog times each wake, not the
                        // round (module docs).
                        state.busy_since = self::now().max(1);
                        waker
                    }
                    None => break state.entries.first_key_value().map(|(k, _)| k.0),
                }
            };
            woke = true;
            // A panicking waker costs its own wake-up only (module docs); the panic hook
            // has already reported it.
            let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
        };
        if woke {
            last_round = now;
        }
        match next {
            Some(at) if at > now => {
                let at = at.max(last_round.saturating_add(MIN_GAP));
                thread::park_timeout(Duration::from_nanos(at - now));
            }
            Some(_) => {}
            None => thread::park(),
        }
    }
}

fn watchdog() {
    loop {
        let now = now();
        let park_for_good = {
            let mut state = lock();
            if state.busy_since != 0
                && now.saturating_sub(state.busy_since) > STALL
                && state.alive < MAX_THREADS
            {
                // The server is stuck in a wake: hand the map to a successor (within the
                // thread bound; past it, the map waits for a stuck wake to return).
                spawn_server(&mut state);
            }
            if state.busy_since != 0 || !state.entries.is_empty() {
                state.last_active = now;
            }
            let idle = now.saturating_sub(state.last_active) > WATCHDOG_IDLE;
            state.watchdog_parked = idle;
            idle
        };
        if park_for_good {
            thread::park();
        } else {
            thread::park_timeout(Duration::from_nanos(STALL / 2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn forget_removes_only_that_wakers_entries() {
        let a = Arc::new(Count(AtomicUsize::new(0)));
        let b = Arc::new(Count(AtomicUsize::new(0)));
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        let far = now() + 3_600_000_000_000;
        schedule(far, wa.clone());
        schedule(far + 1, wa.clone());
        schedule(far, wb.clone());
        assert_eq!((pending_for(&wa), pending_for(&wb)), (2, 1));
        forget(&wa);
        assert_eq!((pending_for(&wa), pending_for(&wb)), (0, 1));
        assert_eq!(
            Arc::strong_count(&a),
            2,
            "the forgotten clones were dropped"
        );
        forget(&wb);
        assert_eq!(pending_for(&wb), 0);
        assert_eq!(Arc::strong_count(&b), 2);
    }
}
