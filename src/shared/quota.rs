//! The quota in a shared file: read by every check of every process, changed by any.
//!
//! # Implementation notes
//!
//! In one process a quota change is a sequence lock (`crate::quota_cell`): a writer makes
//! the version odd, writes, makes it even. Across processes that lock has a flaw: a writer
//! killed while the version is odd leaves every reader of every process spinning for ever.
//! So the file keeps [`QUOTA_SLOTS`] quota slots, each with its own sequence word, and a
//! *current* word naming the slot in force:
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
//! A slot holds the interval, the burst and the room a one-cell check leaves (`tau -
//! interval`, stored so that a check neither multiplies nor subtracts, as in one process).
//! A one-cell check reads only the interval (at least 1) and the room, so any values give
//! it sound arithmetic; a reading of the whole quota also checks that the three agree (an
//! interval and a burst of at least 1, the burst within a `u32`, the room the two make),
//! and treats a slot where they do not as unstable. Values a hostile writer stores give
//! wrong decisions for that file, never an overflow or a panic.
//!
//! Orderings are the sequence lock's (`crate::quota_cell` explains them); the current
//! word is read `Acquire` and written `Release`, so a reader that sees a slot named sees
//! its finished fields.

use core::ptr::NonNull;

use super::error::SharedError;
use super::file::Mapping;
use super::layout::{self, QUOTA_SLOTS};
use crate::gcra::Params;
use crate::quota::Quota;
use crate::sync::{fence, AtomicU64, Ordering};

/// Tries before a reader falls back to the quota it opened the file with.
const READ_TRIES: u32 = 1_000;

/// The quota words of a file, as they lie from `layout::QUOTA_CURRENT_AT` on.
#[repr(C)]
pub(super) struct Area {
    current: AtomicU64,
    _unused: [AtomicU64; 3],
    slots: [SlotWords; QUOTA_SLOTS],
}

#[repr(C)]
struct SlotWords {
    /// Even: stable; odd: being written (or its writer died); 0: never written.
    sequence: AtomicU64,
    interval: AtomicU64,
    burst: AtomicU64,
    room: AtomicU64,
}

const _: () = {
    assert!(layout::QUOTA_SLOTS_AT - layout::QUOTA_CURRENT_AT == 32);
    assert!(core::mem::size_of::<SlotWords>() == layout::QUOTA_SLOT_LEN);
    assert!(layout::QUOTA_CURRENT_AT + core::mem::size_of::<Area>() <= layout::HEADER_LEN);
};

impl Area {
    /// The quota area of `map`.
    pub(super) fn of(map: &Mapping) -> &Area {
        let first = map.word(layout::QUOTA_CURRENT_AT);
        // The last word of the area is inside the mapping (`word` checks it).
        let _ = map.word(layout::QUOTA_SLOTS_AT + QUOTA_SLOTS * layout::QUOTA_SLOT_LEN - 8);
        // SAFETY: `Area` is `repr(C)` of `AtomicU64`s, so it has their alignment and no
        // padding; its first and last words lie inside the mapping (checked above), so all
        // of it does, for as long as `map` (the borrow) lives.
        unsafe { &*core::ptr::from_ref(first).cast::<Area>() }
    }

    /// Writes `quota` into a new file's slot 0 and makes it current.
    pub(super) fn init(&self, quota: Quota) {
        let slot = &self.slots[0];
        // Relaxed: the file's magic, stored Release after this, publishes the whole file.
        slot.write(quota.params());
        slot.sequence.store(2, Ordering::Relaxed);
        self.current.store(0, Ordering::Relaxed);
    }

    /// One reading of the current slot's interval and room, if it was stable and sound.
    #[inline]
    fn try_one_cell(&self) -> Option<(u64, u64)> {
        let slot = self.current_slot();
        let (before, fields) = slot.read(|| (slot.interval(), slot.room()));
        let (interval, room) = fields;
        (before.is_some() && interval != 0).then_some((interval, room))
    }

    /// One reading of the current slot's whole quota, if it was stable and sound.
    fn try_params(&self) -> Option<Params> {
        let slot = self.current_slot();
        let (before, (interval, burst, room)) =
            slot.read(|| (slot.interval(), slot.burst(), slot.room()));
        before?;
        // The room must be the one the interval and burst make (a hostile writer may
        // store any three words): a check of n cells subtracts its cost from tau.
        let params = Params::new(interval, u32::try_from(burst).ok()?)?;
        (params.room_for_one() == room).then_some(params)
    }

    #[inline]
    fn current_slot(&self) -> &SlotWords {
        // Acquire: pairs with the writer's Release of the current word.
        &self.slots[(self.current.load(Ordering::Acquire) % QUOTA_SLOTS as u64) as usize]
    }
}

impl SlotWords {
    /// The sequence lock's read: `fields` between two sequence loads. `Some` sequence if
    /// they were equal, even and not 0 (the fields are one writer's).
    #[inline(always)]
    fn read<T>(&self, fields: impl Fn() -> T) -> (Option<u64>, T) {
        // Acquire: pairs with the writer's Release store of this (even) sequence.
        let before = self.sequence.load(Ordering::Acquire);
        let read = fields();
        // Acquire fence: the field loads stay before the second sequence load.
        fence(Ordering::Acquire);
        let after = self.sequence.load(Ordering::Relaxed);
        let stable = before == after && before & 1 == 0 && before != 0;
        (stable.then_some(before), read)
    }

    // The fields, Relaxed: ordered by the sequence loads around them.
    #[inline(always)]
    fn interval(&self) -> u64 {
        self.interval.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn burst(&self) -> u64 {
        self.burst.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn room(&self) -> u64 {
        self.room.load(Ordering::Relaxed)
    }

    /// Stores the fields (the caller holds the slot: its sequence is odd, or the file is
    /// not published yet).
    fn write(&self, params: &Params) {
        self.interval.store(params.interval(), Ordering::Relaxed);
        self.burst
            .store(u64::from(params.burst()), Ordering::Relaxed);
        self.room.store(params.room_for_one(), Ordering::Relaxed);
    }
}

/// The quota in force in `area`, if a stable reading came within the bounded tries.
pub(super) fn read(area: &Area) -> Option<Params> {
    for _ in 0..READ_TRIES {
        if let Some(params) = area.try_params() {
            return Some(params);
        }
        crate::sync::spin_loop();
    }
    None
}

/// Reads and writes the quota of one mapped file.
pub(super) struct FileQuota {
    /// The file's quota area: valid while the mapping lives (its owner keeps both).
    area: NonNull<Area>,
    /// What a reader decides with if it cannot get a stable reading (module docs).
    fallback: Params,
}

// SAFETY: `area` points into a mapping of shared memory that every process and thread
// reaches only through atomics; `FileQuota` itself holds no thread-bound state.
unsafe impl Send for FileQuota {}
// SAFETY: as for `Send`.
unsafe impl Sync for FileQuota {}

impl core::fmt::Debug for FileQuota {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FileQuota").finish_non_exhaustive()
    }
}

impl FileQuota {
    /// The quota of `map`'s file, falling back to `fallback` (module docs).
    ///
    /// # Safety
    ///
    /// `map` outlives the returned value (and is not unmapped before it is dropped).
    pub(super) unsafe fn new(map: &Mapping, fallback: Params) -> FileQuota {
        FileQuota {
            area: NonNull::from(Area::of(map)),
            fallback,
        }
    }

    fn area(&self) -> &Area {
        // SAFETY: the mapping outlives `self` (the contract of `new`).
        unsafe { self.area.as_ref() }
    }

    /// The interval and the room of a one-cell check, in force now.
    #[inline]
    pub(super) fn one_cell(&self) -> (u64, u64) {
        match self.area().try_one_cell() {
            Some(read) => read,
            None => self.one_cell_slowly(),
        }
    }

    #[cold]
    fn one_cell_slowly(&self) -> (u64, u64) {
        for _ in 0..READ_TRIES {
            if let Some(read) = self.area().try_one_cell() {
                return read;
            }
            crate::sync::spin_loop();
        }
        (self.fallback.interval(), self.fallback.room_for_one())
    }

    /// The quota in force.
    pub(super) fn load(&self) -> Params {
        read(self.area()).unwrap_or(self.fallback)
    }

    /// Makes `quota` the one in force for every process.
    pub(super) fn store(area: &Area, quota: Quota) -> Result<(), SharedError> {
        let start = area.current.load(Ordering::Acquire);
        for step in 1..QUOTA_SLOTS as u64 {
            let index = (start.wrapping_add(step) % QUOTA_SLOTS as u64) as usize;
            let slot = &area.slots[index];
            let even = slot.sequence.load(Ordering::Relaxed);
            if even & 1 == 1 {
                // A writer is in it, or died in it.
                continue;
            }
            // Acquire on success: after the previous writer of this slot.
            if slot
                .sequence
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
            if area.current.load(Ordering::Acquire) % QUOTA_SLOTS as u64 == index as u64 {
                // Another writer made this slot current meanwhile: leave it as it was.
                slot.sequence.store(even, Ordering::Release);
                continue;
            }
            // Release fence: a reader that sees a field below sees the odd sequence too.
            fence(Ordering::Release);
            slot.write(quota.params());
            slot.sequence.store(even.wrapping_add(2), Ordering::Release);
            // Point the current word at it, with a generation above every earlier one.
            let mut seen = area.current.load(Ordering::Relaxed);
            loop {
                let next = ((seen >> 3).wrapping_add(1) << 3) | index as u64;
                // Release: a reader that loads this sees the slot's fields.
                match area.current.compare_exchange_weak(
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

    /// [`FileQuota::store`] on this file.
    pub(super) fn set(&self, quota: Quota) -> Result<(), SharedError> {
        FileQuota::store(self.area(), quota)
    }
}
