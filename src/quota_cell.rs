//! The quota a limiter enforces (a `QuotaCell`), changeable at runtime without a lock
//! on the check path.
//!
//! # Implementation notes
//!
//! A quota is stored as three integers (the interval, the burst, and the room a one-cell
//! check leaves, `tau - interval`, derived once so that checks neither multiply nor
//! subtract), too wide for one atomic word, and a check must never combine the interval
//! of one quota with the room of another. So they sit behind a sequence lock: a writer
//! makes the version odd, stores the fields, and makes it even again; a reader loads the
//! version, the fields it needs and the version again, and retries if the version moved
//! or was odd. Readers write nothing, so checks on many cores share the line. A writer
//! takes the odd version by a compare-and-swap from an even one, which also serialises
//! writers (changes are rare; no mutex, so this works without `std`). A reader only spins
//! while a change is half-written, a few instructions long.
//!
//! Orderings: the fields are atomics (a racing read is never undefined behaviour), read
//! `Relaxed`; the first version load is `Acquire`, pairing with the writer's `Release`
//! store of the even version, so a reader that sees a version sees the fields stored
//! before it; an `Acquire` fence before the second version load keeps the field loads
//! before it, pairing with the writer's `Release` fence after making the version odd, so
//! a reader that read any field of a newer write sees the version move. (The standard
//! seqlock with atomics, as in crossbeam's `AtomicCell` fallback.)
//!
//! What a change means for the limiter is documented on `Limiter::set_quota`.

use crate::gcra::Params;
use crate::quota::Quota;
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// A [`Params`] that can be replaced while checks read it.
#[derive(Debug)]
pub(crate) struct QuotaCell {
    /// Even: stable; odd: a change is being written.
    version: AtomicU64,
    interval: AtomicU64,
    burst: AtomicU32,
    /// `tau - interval` (with `tau = burst * interval`, saturated): how far the TAT may be
    /// ahead of now for one more cell to fit. Stored so that a check reads it instead of
    /// multiplying and subtracting; `tau` is `room + interval` exactly.
    room: AtomicU64,
}

impl QuotaCell {
    pub(crate) fn new(quota: Quota) -> QuotaCell {
        let params = quota.params();
        QuotaCell {
            version: AtomicU64::new(0),
            interval: AtomicU64::new(params.interval()),
            burst: AtomicU32::new(params.burst()),
            room: AtomicU64::new(params.room_for_one()),
        }
    }

    /// The current quota's integers, read consistently.
    #[inline]
    pub(crate) fn load(&self) -> Params {
        let (interval, burst, room) = self.read(|| {
            (
                self.interval.load(Ordering::Relaxed),
                self.burst.load(Ordering::Relaxed),
                self.room.load(Ordering::Relaxed),
            )
        });
        // The three fields `store` wrote from one `Params`; `room + interval` is its `tau`,
        // which `room` was computed from, so the sum cannot overflow.
        Params::from_parts(interval, burst, room + interval)
    }

    /// The interval (a cell's cost, at least 1) and the room a one-cell check may find the
    /// TAT ahead of now, read consistently: all a one-cell check needs.
    #[inline]
    pub(crate) fn load_one_cell(&self) -> (u64, u64) {
        self.read(|| {
            (
                self.interval.load(Ordering::Relaxed),
                self.room.load(Ordering::Relaxed),
            )
        })
    }

    /// The reader's side of the seqlock: `fields` (`Relaxed` loads of the fields) between
    /// two loads of the version, again until no write came between them.
    #[inline(always)]
    fn read<T>(&self, fields: impl Fn() -> T) -> T {
        loop {
            // Acquire: pairs with the writer's Release store of this (even) version.
            let before = self.version.load(Ordering::Acquire);
            // Relaxed loads, ordered by the version loads around them (module docs).
            let read = fields();
            // Acquire fence: the field loads above stay before the version load below.
            fence(Ordering::Acquire);
            let after = self.version.load(Ordering::Relaxed);
            if stable(before, after) {
                return read;
            }
            crate::sync::spin_loop();
        }
    }

    /// Replaces the quota; later `load`s see the new one.
    pub(crate) fn store(&self, quota: Quota) {
        let params = quota.params();
        // Take the odd version from an even one: the writers' lock. Acquire on success:
        // pairs with the previous writer's Release of this even version, so its field
        // stores come before ours. A failed attempt only retries (Relaxed).
        let mut version = self.version.load(Ordering::Relaxed);
        loop {
            if version.is_multiple_of(2) {
                match self.version.compare_exchange_weak(
                    version,
                    version.wrapping_add(1),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(seen) => version = seen,
                }
            } else {
                crate::sync::spin_loop();
                version = self.version.load(Ordering::Relaxed);
            }
        }
        // Release fence: a reader that sees any field stored below also sees the odd
        // version (or a later one) on its second load.
        fence(Ordering::Release);
        self.interval.store(params.interval(), Ordering::Relaxed);
        self.burst.store(params.burst(), Ordering::Relaxed);
        self.room.store(params.room_for_one(), Ordering::Relaxed);
        // Release: a reader that loads this even version sees both fields.
        self.version
            .store(version.wrapping_add(2), Ordering::Release);
    }
}

/// Whether a reader's two version loads bracket no write: equal and even. Written as one
/// comparison: the second load is never older than the first (the loads of one location
/// are ordered), so an odd first reading, with its low bit cleared, is below the second
/// and never equal to it. (The version would wrap only after 2^63 quota changes.)
#[inline]
fn stable(before: u64, after: u64) -> bool {
    before & !1 == after
}
