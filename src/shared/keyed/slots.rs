//! Where a key lives in the file: its bucket, its slot, claiming a slot for a new key
//! under the bucket's lock, and how long until a full bucket has room.

use super::bucket::{BucketLock, Held, CLAIM_PATIENCE};
use super::SharedKeyedLimiter;
use crate::gcra::Params;
use crate::shared::layout::{self, BUCKET_SLOTS};
use crate::shared::table::{Claiming, Key, Moved, Slot};
use crate::sync::Ordering;

impl SharedKeyedLimiter {
    #[inline]
    pub(super) fn params(&self) -> Params {
        self.shared.quota.load()
    }

    #[inline]
    pub(super) fn key(&self, key: &[u8]) -> Key {
        let (high, low) = self.digester.digest(key);
        Key::from_digest(high, low)
    }

    pub(super) fn slot(&self, index: u64) -> Slot<'_> {
        let map = &self.shared.map;
        let field = |f| map.word(layout::key_field(self.capacity, index, f));
        Slot {
            tag: field(0),
            low: field(1),
            words: [field(2), field(3)],
        }
    }

    /// `key`'s bucket: from the tag's top bits (bit 63 of a tag is the claiming flag,
    /// always clear in a key, so the tag is shifted past it).
    #[inline]
    pub(super) fn bucket(&self, key: Key) -> u64 {
        ((u128::from(key.tag << 1) * u128::from(self.buckets)) >> 64) as u64
    }

    /// `key`'s bucket's lock.
    pub(super) fn lock(&self, key: Key) -> BucketLock<'_> {
        BucketLock(self.shared.map.word(layout::bucket_lock(self.bucket(key))))
    }

    /// `key`'s slot `i` places from its home slot (wrapping within its bucket).
    #[inline]
    pub(super) fn nth(&self, key: Key, i: u64) -> Slot<'_> {
        let first = self.bucket(key) * BUCKET_SLOTS;
        self.slot(first + (key.low.wrapping_add(i) & (BUCKET_SLOTS - 1)))
    }

    /// The slots of `key`'s bucket, from its home slot on.
    pub(super) fn slots(&self, key: Key) -> impl Iterator<Item = Slot<'_>> + '_ {
        (0..BUCKET_SLOTS).map(move |i| self.nth(key, i))
    }

    /// `key`'s bucket's reach word (`layout.rs`): a key sits fewer than that many places
    /// from its home slot.
    pub(super) fn reach(&self, key: Key) -> &crate::sync::AtomicU64 {
        self.shared.map.word(layout::bucket_reach(self.bucket(key)))
    }

    /// `key`'s slot, if it is stored. The first few places from its home (where nearly
    /// every key sits) are looked at without reading the bucket's reach; the rest up to
    /// the reach. Lock-free, so it may miss a key stored this instant (a claim publishes
    /// the reach before the key): a check that misses it goes on to the claim, which finds
    /// it under the lock.
    #[inline]
    pub(super) fn find(&self, key: Key) -> Option<Slot<'_>> {
        const NEAR: u64 = 4;
        for i in 0..NEAR {
            let slot = self.nth(key, i);
            if slot.holds(key) {
                return Some(slot);
            }
        }
        // Acquire: pairs with the claimer's Release of the reach, before its key's tag.
        let reach = self.reach(key).load(Ordering::Acquire).min(BUCKET_SLOTS);
        (NEAR..reach)
            .map(|i| self.nth(key, i))
            .find(|slot| slot.holds(key))
    }

    /// Whether a new `key` could be stored now (reading only).
    pub(super) fn has_room(&self, key: Key, now: u64) -> bool {
        self.slots(key).any(|slot| slot.claimable(now))
    }

    /// Runs `f` on `key`'s slot, claiming one if the key is not stored; `Err` with the time
    /// until a slot frees when every slot of its bucket holds a limited key (or another
    /// process held the bucket's lock for longer than [`CLAIM_PATIENCE`]).
    #[inline]
    pub(super) fn with_slot<R>(
        &self,
        key: Key,
        now: u64,
        mut f: impl FnMut(Slot<'_>) -> Result<R, Moved>,
    ) -> Result<R, u64> {
        loop {
            if let Some(slot) = self.find(key) {
                match f(slot) {
                    Ok(r) => return Ok(r),
                    Err(Moved) => continue,
                }
            }
            // Not stored. A bucket with no slot to take refuses without the lock (once a
            // look at every slot has not found the key either).
            if !self.has_room(key, now) {
                match self.slots(key).find(|slot| slot.holds(key)) {
                    Some(slot) => match f(slot) {
                        Ok(r) => return Ok(r),
                        Err(Moved) => continue,
                    },
                    None => return Err(self.room_wait(key, now)),
                }
            }
            // Claimed and first used under the lock: another claimer of the bucket would
            // sweep a new key's refilled words.
            let used = self.with_bucket_lock(key, now, |token| {
                self.claim_locked(key, now, token).map(&mut f)
            })?;
            if let Ok(r) = used {
                return Ok(r);
            }
        }
    }

    /// Claims a slot for `key` with its bucket's lock held (or finds it already stored):
    /// the first from its home on that is empty or holds a key that has refilled.
    pub(super) fn claim_locked(
        &self,
        key: Key,
        now: u64,
        token: &Claiming,
    ) -> Result<Slot<'_>, u64> {
        if let Some(slot) = self.find(key) {
            return Ok(slot);
        }
        let reach = self.reach(key);
        for (i, slot) in self.slots(key).enumerate() {
            if !slot.claimable(now) {
                continue;
            }
            // The reach first, then the key (`find`). Release: pairs with `find`'s Acquire.
            // (The reach only grows under the lock; `retain_recent` recounts it there.)
            if reach.load(Ordering::Relaxed) <= i as u64 {
                reach.store(i as u64 + 1, Ordering::Release);
            }
            let empty = slot.is_empty();
            if slot.claim(key, now, token) {
                if empty {
                    // Relaxed: a count for `len`, read alone.
                    self.stored().fetch_add(1, Ordering::Relaxed);
                }
                return Ok(slot);
            }
        }
        Err(self.room_wait(key, now))
    }

    /// The count of stored keys (`len`).
    pub(super) fn stored(&self) -> &crate::sync::AtomicU64 {
        self.shared.map.word(layout::STORED_AT)
    }

    /// Takes `n` off the count of stored keys (never below 0).
    pub(super) fn unstore(&self, n: u64) {
        // Relaxed: as in `claim_locked`.
        let _ = self
            .stored()
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |stored| {
                Some(stored.saturating_sub(n))
            });
    }

    /// Runs `f` holding `key`'s bucket lock (`bucket.rs`), repairing the bucket first when
    /// the lock was taken over from a dead claimer. `Err` with a short wait when another
    /// process held it past [`CLAIM_PATIENCE`].
    pub(super) fn with_bucket_lock<R>(
        &self,
        key: Key,
        now: u64,
        f: impl FnOnce(&Claiming) -> Result<R, u64>,
    ) -> Result<R, u64> {
        let Some(held) = self.lock(key).take(CLAIM_PATIENCE) else {
            return Err(patience_nanos());
        };
        let token = Claiming(());
        if held.inherited {
            self.repair(key, now, &held, &token);
        }
        f(&token)
    }

    /// Repairs what a dead claimer of `key`'s bucket left half-done: each slot it was
    /// rewriting (`table.rs`; a slot left empty by the repair is no longer counted).
    pub(super) fn repair(&self, key: Key, now: u64, _held: &Held<'_>, token: &Claiming) {
        let emptied = self
            .slots(key)
            .filter(|slot| slot.repair_if_claiming(now, token))
            .count() as u64;
        self.unstore(emptied);
    }

    /// Nanoseconds until a slot `key` may use frees (at least 1).
    pub(super) fn room_wait(&self, key: Key, now: u64) -> u64 {
        self.slots(key)
            .map(|slot| slot.free_at().saturating_sub(now))
            .min()
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// [`CLAIM_PATIENCE`] in nanoseconds: the wait a claim refused for a busy bucket reports.
pub(super) fn patience_nanos() -> u64 {
    CLAIM_PATIENCE.as_nanos() as u64
}
