//! The quota in a shared file: read by every check of every process, changed by any.
//!
//! # Implementation notes
//!
//! In one process a quota change is a sequence lock (`crate::shared_quota`): a writer makes
//! the version odd, writes, makes it even. Across processes that lock has a flaw: a writer
//! killed while the version is odd leaves every reader of every process spinning for ever.
//! So the file keeps [`QUOTA_SLOTS`](super::layout::QUOTA_SLOTS) quota slots, each with its
//! own sequence word, and a *current* word naming the slot in force:
//!
//! * a **reader** loads the current word, then that slot's sequence, fields and sequence
//!   again (a sequence lock read). Writers never write the current slot, so a reader's
//!   retry only ever waits for `current` to settle on a finished slot; and if a reader
//!   still cannot get a stable reading after a bounded number of tries (a file a hostile
//!   writer keeps changing), it decides with the quota it opened the file with: a wrong
//!   decision for that file at worst, never a hang;
//! * a **writer** takes a slot that is not current by a compare-and-swap of its sequence
//!   from even to odd (a slot left odd by a dead writer is skipped), writes the fields,
//!   makes the sequence even, then points the current word at the slot with a new
//!   generation. A writer killed at any point leaves the current slot untouched: at worst
//!   one slot stays odd and is never used again (after eight such deaths `set_quota`
//!   reports [`SharedError::QuotaSlots`]).
//!
//! The slots hold the interval and the burst; a reader derives the rest (`Params::new`),
//! so no combination of values a writer could leave makes a reader divide by zero or
//! overflow: an invalid pair counts as an unstable reading.
//!
//! Orderings are the sequence lock's (`crate::shared_quota` explains them); the current
//! word is read `Acquire` and written `Release`, so a reader that sees a slot named sees
//! its finished fields.

use super::error::SharedError;
use super::file::Mapping;
use super::layout::{self, QUOTA_SLOTS};
use crate::gcra::Params;
use crate::quota::Quota;
use crate::sync::{fence, Ordering};

/// Tries before a reader falls back to the quota it opened the file with.
const READ_TRIES: u32 = 1_000;

/// Reads and writes the quota of one mapped file.
#[derive(Debug)]
pub(super) struct FileQuota {
    /// What a reader decides with if it cannot get a stable reading (module docs).
    fallback: Params,
}

impl FileQuota {
    pub(super) fn new(fallback: Params) -> FileQuota {
        FileQuota { fallback }
    }

    /// Writes `quota` into a new file's slot 0 and makes it current.
    pub(super) fn init(map: &Mapping, quota: Quota) {
        let params = quota.params();
        // Relaxed: the file's magic, stored Release after this, publishes the whole file.
        map.word(layout::quota_field(0, 1))
            .store(params.interval(), Ordering::Relaxed);
        map.word(layout::quota_field(0, 2))
            .store(u64::from(params.burst()), Ordering::Relaxed);
        map.word(layout::quota_field(0, 0))
            .store(2, Ordering::Relaxed);
        map.word(layout::QUOTA_CURRENT_AT)
            .store(0, Ordering::Relaxed);
    }

    /// The quota in force.
    #[inline]
    pub(super) fn load(&self, map: &Mapping) -> Params {
        for _ in 0..READ_TRIES {
            if let Some(params) = try_read(map) {
                return params;
            }
            crate::sync::spin_loop();
        }
        self.fallback
    }

    /// Makes `quota` the one in force for every process.
    pub(super) fn store(map: &Mapping, quota: Quota) -> Result<(), SharedError> {
        let params = quota.params();
        let current = map.word(layout::QUOTA_CURRENT_AT);
        let start = current.load(Ordering::Acquire);
        for step in 1..QUOTA_SLOTS as u64 {
            let slot = (start.wrapping_add(step) % QUOTA_SLOTS as u64) as usize;
            let sequence = map.word(layout::quota_field(slot, 0));
            let even = sequence.load(Ordering::Relaxed);
            if even % 2 == 1 {
                // A writer is in it, or died in it.
                continue;
            }
            // Acquire on success: after the previous writer of this slot.
            if sequence
                .compare_exchange(
                    even,
                    even.wrapping_add(1),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            if current.load(Ordering::Acquire) % QUOTA_SLOTS as u64 == slot as u64 {
                // Another writer made this slot current meanwhile: leave it as it was.
                sequence.store(even, Ordering::Release);
                continue;
            }
            // Release fence: a reader that sees a field below sees the odd sequence too.
            fence(Ordering::Release);
            map.word(layout::quota_field(slot, 1))
                .store(params.interval(), Ordering::Relaxed);
            map.word(layout::quota_field(slot, 2))
                .store(u64::from(params.burst()), Ordering::Relaxed);
            sequence.store(even.wrapping_add(2), Ordering::Release);
            // Point the current word at it, with a generation above every earlier one.
            let mut seen = current.load(Ordering::Relaxed);
            loop {
                let next = ((seen >> 3).wrapping_add(1) << 3) | slot as u64;
                // Release: a reader that loads this sees the slot's fields.
                match current.compare_exchange_weak(
                    seen,
                    next,
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Ok(()),
                    Err(now) => seen = now,
                }
            }
        }
        Err(SharedError::QuotaSlots)
    }
}

/// One reading of the current slot, if it was stable and valid.
#[inline]
fn try_read(map: &Mapping) -> Option<Params> {
    // Acquire: pairs with the writer's Release of the current word.
    let slot =
        (map.word(layout::QUOTA_CURRENT_AT).load(Ordering::Acquire) % QUOTA_SLOTS as u64) as usize;
    let sequence = map.word(layout::quota_field(slot, 0));
    // Acquire: pairs with the writer's Release store of this (even) sequence.
    let before = sequence.load(Ordering::Acquire);
    let interval = map
        .word(layout::quota_field(slot, 1))
        .load(Ordering::Relaxed);
    let burst = map
        .word(layout::quota_field(slot, 2))
        .load(Ordering::Relaxed);
    // Acquire fence: the field loads stay before the second sequence load.
    fence(Ordering::Acquire);
    let after = sequence.load(Ordering::Relaxed);
    if before != after || before % 2 == 1 || before == 0 {
        return None;
    }
    Params::new(interval, u32::try_from(burst).ok()?)
}
