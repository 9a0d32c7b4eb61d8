//! A bucket's claim lock: one word in the file, taken by compare-and-swap, so that storing
//! a key never waits on another process for more than [`CLAIM_PATIENCE`].
//!
//! # Implementation notes
//!
//! The word holds the id of the process that holds the lock (high half) and the second it
//! took it (low half, `CLOCK_MONOTONIC`); 0 when free. A claim takes it from 0, does its
//! few hundred nanoseconds of work on the bucket's slots, and stores 0 back (`Release`,
//! pairing with the next taker's `Acquire`, so each claimer sees the slots as the last one
//! left them).
//!
//! **A holder that died** (killed at any instruction) leaves its claim in the word. A
//! claimer that has waited its spins asks the system whether that process still exists
//! (`kill(pid, 0)`); if not, it takes the lock over by a compare-and-swap from the dead
//! claim, and repairs what the dead claimer left half-done (`table.rs`: every state a
//! claimer can leave behind is repairable). A dead process can never come back and write,
//! so taking its lock is safe. A claim older than [`STALE`] is taken over too, whatever
//! its process id says: the id may have been given to another process since its holder
//! died, and a live holder never keeps the lock for more than a moment.
//!
//! **A holder that lives but does not let go** (stopped by `SIGSTOP`, or descheduled on a
//! loaded machine) is never taken over: it could resume in the middle of its claim. A
//! claimer waits for it at most [`CLAIM_PATIENCE`] (spinning briefly, then yielding and
//! sleeping), and then gives up: the new key is refused as a full table would refuse it
//! ([`crate::NotUntil::table_full`]), for a moment. Keys already stored never take the
//! lock: their checks are lock-free, whatever a claimer does.
//!
//! The lock is the file's, not a `flock`: only processes that can write the file can take
//! it, and the file's permissions limit those to its owner (and a group the caller named).
//!
//! Processes that share a file must see each other's process ids (one PID namespace, as
//! the workers of one server do): a claimer in another namespace could take the lock of a
//! live holder it cannot see, if that holder had stopped in the middle of a claim.

use core::time::Duration;
use std::time::Instant;

use crate::shared::process::{alive, me, seconds};
use crate::sync::{AtomicU64, Ordering};

/// The longest a claim waits for another process's claim of the same bucket.
pub const CLAIM_PATIENCE: Duration = Duration::from_millis(10);

/// How old a claim may be before it is taken over whatever its process id says.
const STALE: Duration = Duration::from_secs(10);

/// This process's claim, now.
fn claim() -> u64 {
    me() << 32 | u64::from(seconds().max(1))
}

/// Whether a claim may be taken over: it is older than [`STALE`], or another process's
/// that is gone. (This process's own threads hold the lock for a moment only.)
fn stale(claim: u64) -> bool {
    let (pid, second) = (claim >> 32, claim as u32);
    seconds().wrapping_sub(second) > STALE.as_secs() as u32 || pid != me() && !alive(pid)
}

/// Compare-and-swap attempts before a waiting claimer starts yielding.
const SPINS: u32 = 64;

/// A bucket's lock word (module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BucketLock<'a>(pub(crate) &'a AtomicU64);

/// A held bucket lock; released when dropped.
#[derive(Debug)]
pub(crate) struct Held<'a> {
    word: &'a AtomicU64,
    /// Whether it was taken over from a dead holder (whose half-done claim may need repair).
    pub(crate) inherited: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Release: the next taker sees what this holder wrote in the bucket.
        self.word.store(0, Ordering::Release);
    }
}

impl<'a> BucketLock<'a> {
    /// Takes the lock, waiting for another holder at most `patience`; `None` if it did not
    /// let go in that time.
    pub(crate) fn take(self, patience: Duration) -> Option<Held<'a>> {
        let mine = claim();
        let mut tries = 0u32;
        let mut started: Option<Instant> = None;
        loop {
            // Acquire: after everything the last holder wrote in the bucket.
            let holder =
                match self
                    .0
                    .compare_exchange(0, mine, Ordering::Acquire, Ordering::Relaxed)
                {
                    Ok(_) => {
                        return Some(Held {
                            word: self.0,
                            inherited: false,
                        })
                    }
                    Err(holder) => holder,
                };
            tries += 1;
            if tries <= SPINS {
                crate::sync::spin_loop();
                continue;
            }
            if stale(holder) {
                // Acquire: as above. A failure means the word changed: look again.
                if self
                    .0
                    .compare_exchange(holder, mine, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return Some(Held {
                        word: self.0,
                        inherited: true,
                    });
                }
                continue;
            }
            let since = *started.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            if waited >= patience {
                return None;
            }
            if tries < 2 * SPINS {
                std::thread::yield_now();
            } else {
                std::thread::sleep((patience - waited).min(Duration::from_micros(50)));
            }
        }
    }

    /// Takes the lock only if it is free now (or its holder is dead).
    pub(crate) fn try_take(self) -> Option<Held<'a>> {
        self.take(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_holders_lock_is_taken_over_and_a_live_ones_is_waited_for_then_left() {
        let word = AtomicU64::new(0);
        let held = BucketLock(&word).take(CLAIM_PATIENCE).unwrap();
        assert!(!held.inherited);
        // Held by this (live) process: another claimer waits its patience, then gives up.
        let started = Instant::now();
        assert!(BucketLock(&word).take(Duration::from_millis(5)).is_none());
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(5), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        drop(held);
        assert_eq!(word.load(Ordering::SeqCst), 0);
        // A process that exited: its lock is taken over at once.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = u64::from(child.id());
        child.wait().unwrap();
        word.store(dead << 32 | u64::from(seconds()), Ordering::SeqCst);
        let taken = BucketLock(&word).try_take().unwrap();
        assert!(taken.inherited);
        assert_eq!(word.load(Ordering::SeqCst) >> 32, me());
        drop(taken);
        // A damaged word (no process has such an id) is free too.
        word.store(u64::MAX, Ordering::SeqCst);
        assert!(BucketLock(&word).try_take().unwrap().inherited);
        // A live process's claim older than `STALE` (its id reused since, say) too.
        let old = seconds().wrapping_sub(STALE.as_secs() as u32 + 1);
        word.store(1 << 32 | u64::from(old), Ordering::SeqCst);
        assert!(BucketLock(&word).try_take().unwrap().inherited);
        // A fresh claim of a live process is waited for, then left.
        word.store(1 << 32 | u64::from(seconds()), Ordering::SeqCst);
        assert!(BucketLock(&word).try_take().is_none());
    }
}
