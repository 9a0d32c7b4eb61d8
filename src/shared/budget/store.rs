//! A shared budget's state in its file: the lock, the two copies of the state, and the
//! state itself (the callers on record and the ledger), as words.
//!
//! # Implementation notes
//!
//! **The lock** is one word holding the identity of the process in the critical section
//! (`process::identity`: its id and its start time), taken by a compare-and-swap from 0.
//! Threads of one process first queue on a mutex of their own, so the word is contended
//! only across processes. A holder that no longer exists (killed at any instruction) is
//! taken over by the next process that finds it gone; a holder that still runs is never
//! taken over: past [`LOCK_PATIENCE`] the caller gets [`SharedError::Locked`] and nothing
//! is done. Critical sections read, decide and write a few hundred words: microseconds.
//!
//! **Two copies, one current.** A critical section reads the current copy (the
//! generation word's low bit), writes the whole new state into the other one, and only
//! then advances the generation. A process killed while writing leaves the current copy
//! whole; the next holder reads it and overwrites the half-written one.
//!
//! **Orderings.** The lock's compare-and-swap is `Acquire` and its release `Release`: a
//! holder sees everything the previous holder wrote, also when it took the word over from
//! a dead holder (its compare-and-swap read a value written by a read-modify-write in the
//! release sequence of the last release). The generation is stored `Release` and loaded
//! `Acquire` for the same reason within a section taken over mid-write. The state's words
//! are `Relaxed`: only ever touched under the lock.

use core::time::Duration;
use std::path::Path;
use std::time::Instant;

use super::super::error::SharedError;
use super::super::file::Mapping;
use super::super::layout;
use super::super::process;
use crate::budget::queue::{Caller, State};
use crate::budget::Ledger;
use crate::sync::{AtomicU64, Ordering};

/// The longest a shared budget's caller waits for another process to leave the budget's
/// critical section (which takes microseconds): past it the call is
/// [`SharedError::Locked`]. A process that died in the section is taken over at once.
pub const LOCK_PATIENCE: Duration = Duration::from_secs(1);

/// The most callers a shared budget records at once, over every process: turns in flight
/// (admitted, not yet ended) and callers waiting in the queue.
pub const MAX_WAITING: usize = layout::BUDGET_TURNS;

/// How often a waiter for the lock asks whether its holder still exists.
const CHECK_HOLDER: Duration = Duration::from_millis(1);

/// `Caller::turn` of a caller still waiting for a permit.
const NO_TURN: u64 = u64::MAX;

const COUNTS: usize = 4;

impl State {
    /// The words of one copy that this state fills (module docs of `layout`).
    fn encode(&self) -> Vec<u64> {
        let mut words = Vec::with_capacity(COUNTS + self.callers.len() * 4 + 64);
        words.extend([
            self.callers.len() as u64,
            self.next_ticket,
            self.last_reap,
            0,
        ]);
        for c in &self.callers {
            words.extend([c.ticket, c.owner, c.turn.unwrap_or(NO_TURN), c.seen]);
            words.extend(c.cells.iter().map(|&n| u64::from(n)));
        }
        words
    }

    fn ledger_at(dims: usize) -> usize {
        COUNTS + layout::BUDGET_TURNS * layout::budget_caller_words(dims)
    }
}

/// A budget's region of its file.
#[derive(Debug)]
pub(super) struct Region<'a> {
    pub(super) map: &'a Mapping,
    pub(super) dims: usize,
}

impl Region<'_> {
    fn word(&self, at: usize) -> &AtomicU64 {
        self.map.word(at)
    }

    /// Writes `state` into copy `copy`.
    fn write_copy(&self, copy: usize, state: &State) {
        let at = layout::budget_state(self.dims, copy);
        let head = state.encode();
        for (i, w) in head.iter().enumerate() {
            // Relaxed: under the lock (module docs).
            self.word(at + 8 * i).store(*w, Ordering::Relaxed);
        }
        let mut ledger = Vec::new();
        state.ledger.encode(&mut ledger);
        let ledger_at = at + 8 * State::ledger_at(self.dims);
        for (i, w) in ledger.iter().enumerate() {
            self.word(ledger_at + 8 * i).store(*w, Ordering::Relaxed);
        }
    }

    /// Writes the first state of a new file (not yet linked at its path).
    pub(super) fn init(&self, state: &State) {
        self.write_copy(0, state);
        self.word(layout::BUDGET_GENERATION_AT)
            .store(0, Ordering::Release);
    }

    /// The current state, or `None` where the copy is damaged.
    fn read(&self) -> Option<(u64, State)> {
        // Acquire: pairs with the Release of `write` (module docs).
        let generation = self
            .word(layout::BUDGET_GENERATION_AT)
            .load(Ordering::Acquire);
        let at = layout::budget_state(self.dims, (generation & 1) as usize);
        let read = |i: usize| self.word(at + 8 * i).load(Ordering::Relaxed);
        let n = usize::try_from(read(0))
            .ok()
            .filter(|&n| n <= layout::BUDGET_TURNS)?;
        let record = layout::budget_caller_words(self.dims);
        let callers = (0..n)
            .map(|i| {
                let w = |f| read(COUNTS + record * i + f);
                Some(Caller {
                    ticket: w(0),
                    owner: w(1),
                    turn: Some(w(2)).filter(|&t| t != NO_TURN),
                    seen: w(3),
                    cells: (0..self.dims)
                        .map(|d| u32::try_from(w(4 + d)).ok())
                        .collect::<Option<_>>()?,
                })
            })
            .collect::<Option<_>>()?;
        let ledger_at = State::ledger_at(self.dims);
        let head_len = crate::budget::ledger_words(self.dims, 0);
        let mut words: Vec<u64> = (0..head_len).map(|i| read(ledger_at + i)).collect();
        let entries = usize::try_from(words[0])
            .ok()
            .filter(|&n| n <= layout::BUDGET_LOG)?;
        let len = crate::budget::ledger_words(self.dims, entries);
        words.extend((head_len..len).map(|i| read(ledger_at + i)));
        let ledger = Ledger::decode(&words, self.dims, layout::BUDGET_LOG)?;
        Some((
            generation,
            State {
                ledger,
                callers,
                next_ticket: read(1),
                last_reap: read(2),
                room: MAX_WAITING,
            },
        ))
    }

    /// Writes `state` as the new current state after `generation`.
    fn write(&self, generation: u64, state: &State) {
        self.write_copy(((generation + 1) & 1) as usize, state);
        // Release: a reader of the new generation sees the copy written above.
        self.word(layout::BUDGET_GENERATION_AT)
            .store(generation.wrapping_add(1), Ordering::Release);
    }

    /// Advances the hints (`admit.rs`): the head's by `head`, the queue's by `queue`.
    pub(super) fn bump(&self, head: u64, queue: u64) {
        // Relaxed: hints; a waiter reads the state itself under the lock.
        if head > 0 {
            self.word(layout::BUDGET_EPOCH_AT)
                .fetch_add(head, Ordering::Relaxed);
        }
        if queue > 0 {
            self.word(layout::BUDGET_QUEUE_AT)
                .fetch_add(queue, Ordering::Relaxed);
        }
    }

    /// The hints: the head's epoch and the queue's.
    pub(super) fn epochs(&self) -> (u64, u64) {
        (
            self.word(layout::BUDGET_EPOCH_AT).load(Ordering::Relaxed),
            self.word(layout::BUDGET_QUEUE_AT).load(Ordering::Relaxed),
        )
    }

    /// Runs `f` on the state under the file's lock and writes the state back when `f`
    /// says it changed it (the caller holds this process's mutex).
    pub(super) fn with<R>(
        &self,
        path: &Path,
        f: impl FnOnce(&mut State) -> (R, bool),
    ) -> Result<R, SharedError> {
        let _held = self.lock(path)?;
        let (generation, mut state) = self.read().ok_or_else(|| SharedError::Corrupt {
            path: path.to_owned(),
            field: "budget state",
        })?;
        let (out, changed) = f(&mut state);
        if changed {
            self.write(generation, &state);
        }
        Ok(out)
    }

    /// Takes the file's lock (module docs).
    fn lock(&self, path: &Path) -> Result<Held<'_>, SharedError> {
        let word = self.word(layout::BUDGET_LOCK_AT);
        let me = process::identity();
        let started = Instant::now();
        let mut checked = started;
        let mut spins = 0u32;
        loop {
            // Acquire: pairs with the Release of the last holder's unlock (module docs).
            let holder = match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(Held { word, me }),
                Err(holder) => holder,
            };
            if checked.elapsed() >= CHECK_HOLDER {
                checked = Instant::now();
                // Acquire: as above, through the dead holder's own compare-and-swap.
                if holder != me
                    && !process::still(holder)
                    && word
                        .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return Ok(Held { word, me });
                }
                if started.elapsed() >= LOCK_PATIENCE {
                    return Err(SharedError::Locked {
                        path: path.to_owned(),
                        pid: holder >> 32,
                    });
                }
            }
            spins += 1;
            if spins < 64 {
                core::hint::spin_loop();
            } else if spins < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

/// The file's lock, held: released when dropped.
struct Held<'a> {
    word: &'a AtomicU64,
    me: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Release: the next holder sees this section's writes. A compare-and-swap, not a
        // store: a word that is no longer ours (a damaged file) is left alone.
        let _ = self
            .word
            .compare_exchange(self.me, 0, Ordering::Release, Ordering::Relaxed);
    }
}
