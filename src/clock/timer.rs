//! The process-wide timer thread behind [`DefaultClock::wake_at`](super::DefaultClock).
//!
//! One heap of `(instant, waker)` entries and one thread that sleeps until the earliest.
//! Limiters register one entry for their first waiter (not one per waiter), so the heap
//! stays as small as the number of limiters with sleepers.
//!
//! **Coalescing.** After a round of wake-ups the thread sleeps at least [`MIN_GAP`] before
//! the next, whatever is due meanwhile. A lone waiter is woken at its instant; a dense
//! stream of them (100 000/s) is woken in batches of everything due, at most every
//! `MIN_GAP`, never early and at most `MIN_GAP` late. That trades ≤ 0.5 ms of lateness
//! (the promise is "within about a millisecond") for a thread and a runtime that wake
//! thousands of times less often under load.
//!
//! This module uses `std::sync` directly rather than the `crate::sync` shim: it is a real
//! OS thread parked with `park_timeout`, which loom cannot model, and loom builds leave it
//! out (the default clock's timer is stubbed there; models use `ManualClock`).

use core::cmp::Ordering;
use core::task::Waker;
use core::time::Duration;
use std::collections::BinaryHeap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::{self, Thread};

use super::{Clock, DefaultClock};
use crate::wake_list::WakeList;

struct Entry {
    at: u64,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest entry first; `seq`
    /// keeps entries with equal instants in registration order.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct Heap {
    entries: BinaryHeap<Entry>,
    seq: u64,
}

struct Timer {
    heap: Mutex<Heap>,
    thread: Thread,
}

static TIMER: OnceLock<Timer> = OnceLock::new();

fn timer() -> &'static Timer {
    TIMER.get_or_init(|| {
        let handle = thread::Builder::new()
            .name("pacer-timer".into())
            .spawn(run)
            .expect("pacer: cannot spawn the timer thread");
        Timer {
            heap: Mutex::new(Heap::default()),
            thread: handle.thread().clone(),
        }
    })
}

/// Wakes `waker` once the default clock reads at least `at`: at once if it already does.
pub(super) fn wake_at(at: u64, waker: Waker) {
    if at <= DefaultClock::default().now() {
        waker.wake();
        return;
    }
    schedule(at, waker);
}

/// Hands `waker` to the timer thread for `at`, never waking it on the calling thread, even
/// if `at` has passed (then the thread wakes it in its next round).
pub(super) fn schedule(at: u64, waker: Waker) {
    let timer = timer();
    let earliest = {
        let mut heap = timer.heap.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = heap.seq;
        heap.seq = seq.wrapping_add(1);
        let earliest = heap.entries.peek().is_none_or(|e| at < e.at);
        heap.entries.push(Entry { at, seq, waker });
        earliest
    };
    if earliest {
        // The thread may be sleeping until a later instant: make it look again.
        timer.thread.unpark();
    }
}

/// The shortest time between two rounds of wake-ups (see the module docs).
pub(super) const MIN_GAP: u64 = 500_000;

fn run() {
    // The spawning thread is still inside `get_or_init`; this blocks until it finishes.
    let timer = timer();
    let clock = DefaultClock::default();
    let mut due = WakeList::new();
    // When the last round of wake-ups ran.
    let mut last_round = 0u64;
    loop {
        let now = clock.now();
        if now < last_round.saturating_add(MIN_GAP) {
            // Too soon after the last round (an earlier entry arrived and unparked us):
            // come back when the gap is over.
            thread::park_timeout(Duration::from_nanos(last_round + MIN_GAP - now));
            continue;
        }
        let next = {
            let mut heap = timer.heap.lock().unwrap_or_else(PoisonError::into_inner);
            while !due.is_full() && heap.entries.peek().is_some_and(|e| e.at <= now) {
                if let Some(entry) = heap.entries.pop() {
                    due.push(entry.waker);
                }
            }
            heap.entries.peek().map(|e| e.at)
        };
        let more = due.is_full();
        let woke = due.len() > 0;
        due.wake_all();
        if more {
            continue;
        }
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
