//! The key slots of a shared keyed file, and how a key claims one.
//!
//! # Implementation notes
//!
//! A slot is four words: `tag` (the key digest's high half; 0 when empty), `low` (the
//! digest's low half), and the key's two words (its TAT, and the execution-time bound's).
//! A key's digest is 128 bits of SipHash-1-3 under seeds drawn when the file was made, so
//! every process computes the same one, and two keys share a slot only if their 128-bit
//! digests collide (with a million keys, a chance below 10^-26). The tag keeps 62 of its
//! bits: bit 0 is always set (so a key's tag is never 0) and bit 63 is the `CLAIMING` flag.
//!
//! **Checks are lock-free** ([`Slot::spend`]): load the word (`Acquire`), check the slot
//! still holds the key, compare-and-swap; after a failed swap, check the slot again. A
//! denial writes nothing.
//!
//! **Claims take the key's bucket lock** (`keyed/bucket.rs`: a word in the file, taken over
//! from a holder that died): a new key must not end up in two slots, and two claimers that
//! scanned the bucket at different moments could pick different free slots for it, so
//! claimers of a bucket take turns, and each scans it again under the lock. A key lives
//! only in its own bucket, so the bucket's lock covers every slot it may use.
//! A claim takes a slot that is empty or holds a key whose words have both refilled (that key
//! is indistinguishable from a new one, so forgetting it changes no decision):
//!
//! 1. set `CLAIMING` on the tag (the old key's checks now see a foreign tag and stop);
//! 2. move each word by one nanosecond back (a value no check of the old key can have
//!    loaded and still swap from), each by a compare-and-swap from a value at or before
//!    now; if one fails, the old key was admitted meanwhile: clear the flag, the slot stays
//!    its own;
//! 3. write the new key's low half, then its tag (`Release`): the slot is the new key's.
//!
//! A check of the old key that loaded its word before step 2 fails its swap; one that
//! loaded it after sees (through step 2's `Release`) the flag of step 1 and stops. So an
//! admission is never written into a slot that has become another key's.
//!
//! **A claimer killed half-way** leaves `CLAIMING` set. The next claimer of the bucket
//! holds its lock (taken over from the dead one), so the one that set it is gone, and
//! repairs the slot: if a word is still ahead of now,
//! the old key is live (step 2 never finished, so the low half is still the old key's):
//! clear the flag; otherwise move the words as in step 2 (so a check still in flight from
//! before step 1 cannot swap) and empty the slot. Every state a claimer can leave behind
//! is one of these, so nothing hangs and nothing is lost.
//!
//! Orderings: the words' `Acquire` loads and `AcqRel` swaps pair with each other, which
//! orders a claimer's flag (step 1) before its word swaps (step 2) for any check that
//! reads what step 2 wrote; the tag is published `Release` after the low half and read
//! `Acquire` before it.

use crate::gcra;
use crate::sync::{AtomicU64, Ordering};

/// Set on a tag while a claimer rewrites the slot.
pub(crate) const CLAIMING: u64 = 1 << 63;

/// A key's digest as a slot holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// The tag: never 0, never with `CLAIMING`.
    pub(crate) tag: u64,
    pub(crate) low: u64,
}

impl Key {
    /// The key of a 128-bit digest.
    pub(crate) fn from_digest(high: u64, low: u64) -> Key {
        Key {
            tag: (high | 1) & !CLAIMING,
            low,
        }
    }
}

/// The four words of one slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot<'a> {
    pub(crate) tag: &'a AtomicU64,
    pub(crate) low: &'a AtomicU64,
    pub(crate) words: [&'a AtomicU64; 2],
}

/// A check found that the slot no longer holds its key: look again.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Moved;

/// Proof that the caller holds the slot's bucket lock (the only way to claim, sweep or repair).
#[derive(Debug)]
pub(crate) struct Claiming(pub(crate) ());

impl Slot<'_> {
    /// Whether the slot holds `key` (and no claim is rewriting it).
    #[inline]
    pub(crate) fn holds(&self, key: Key) -> bool {
        // Acquire: pairs with a claim's Release of the tag, after its low half.
        self.tag.load(Ordering::Acquire) == key.tag && self.low.load(Ordering::Relaxed) == key.low
    }

    /// Spends `cost` of `key`'s word `lane` at `now` within `room` (as
    /// `TatWord::spend`): `Ok(Ok(tat))` admitted, `Ok(Err(wait))` denied (nothing
    /// written), `Err(Moved)` when the slot is not (or no longer) `key`'s.
    #[inline]
    pub(crate) fn spend(
        &self,
        key: Key,
        lane: usize,
        now: u64,
        cost: u64,
        room: u64,
    ) -> Result<Result<u64, u64>, Moved> {
        let word = self.words[lane];
        // Acquire: see the module docs.
        let mut seen = word.load(Ordering::Acquire);
        loop {
            if !self.holds(key) {
                return Err(Moved);
            }
            let next = match gcra::admit_in_room(seen, now, cost, room) {
                Ok(next) => next,
                Err(wait) => return Ok(Err(wait)),
            };
            // AcqRel on success and Acquire on failure: see the module docs.
            match word.compare_exchange(seen, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Ok(next)),
                Err(now_seen) => seen = now_seen,
            }
        }
    }

    /// Gives back `cost` of `key`'s word `lane` if it still holds `tat`, the TAT an
    /// admission left (nothing admitted or booked since: `TatWord::refund` for a slot).
    /// A slot that no longer holds `key` is left alone. Were it taken for another key
    /// between the check and the exchange, its word would be at or before now (a slot is
    /// taken only once both words refilled), and a TAT lowered there decides nothing
    /// differently.
    #[cfg_attr(loom, allow(dead_code))] // the models leave the keyed limiter out
    pub(crate) fn refund(&self, key: Key, lane: usize, tat: u64, cost: u64) {
        if self.holds(key) {
            // AcqRel on success, Acquire on failure: as `spend`'s exchange (module docs);
            // a failed one means the word moved on, and the cell stays spent.
            let _ = self.words[lane].compare_exchange(
                tat,
                tat.saturating_sub(cost),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// The word `lane`, to read.
    #[inline]
    pub(crate) fn word(&self, lane: usize) -> u64 {
        self.words[lane].load(Ordering::Acquire)
    }

    /// When both words will have refilled: the slot may be claimed for another key from
    /// then on.
    pub(crate) fn free_at(&self) -> u64 {
        self.word(0).max(self.word(1))
    }

    /// Whether a claim could take the slot at `now` (empty, refilled, or left by a dead
    /// claimer); reading only.
    #[cfg_attr(loom, allow(dead_code))] // the models claim through `claim_until`
    pub(crate) fn claimable(&self, now: u64) -> bool {
        // Relaxed: a hint; the claim decides under the lock.
        let tag = self.tag.load(Ordering::Relaxed);
        tag == 0 || tag & CLAIMING != 0 || self.free_at() <= now
    }

    /// Claims the slot for `key` (module docs), repairing it first if a dead claimer left
    /// it half-rewritten. Returns whether the slot is now `key`'s.
    #[cfg_attr(loom, allow(dead_code))] // the models claim through `claim_until`
    pub(crate) fn claim(&self, key: Key, now: u64, lock: &Claiming) -> bool {
        self.claim_until(key, now, lock, u8::MAX)
    }

    /// [`Slot::claim`], stopping after step `stop` as a claimer killed there would (1: the
    /// flag set, 2 and 3: a word moved, 4: the low half written): the loom models kill
    /// claimers this way. Returns whether the slot is now `key`'s.
    pub(crate) fn claim_until(&self, key: Key, now: u64, _lock: &Claiming, stop: u8) -> bool {
        // Acquire: after whoever last wrote the tag.
        let mut tag = self.tag.load(Ordering::Acquire);
        if tag & CLAIMING != 0 {
            tag = self.repair(tag, now);
        }
        if tag == key.tag && self.low.load(Ordering::Relaxed) == key.low {
            return true;
        }
        if tag != 0 && self.free_at() > now {
            return false;
        }
        // Step 1. AcqRel: the flag is ordered before the word swaps below.
        if self
            .tag
            .compare_exchange(tag, tag | CLAIMING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
            || stop == 1
        {
            return false;
        }
        // Steps 2 and 3.
        for (step, word) in (2..).zip(self.words) {
            if !move_word(word, now) {
                // The old key was admitted meanwhile: it keeps the slot.
                self.tag.store(tag, Ordering::Release);
                return false;
            }
            if stop == step {
                return false;
            }
        }
        // Step 4, then the tag.
        self.low.store(key.low, Ordering::Relaxed);
        if stop == 4 {
            return false;
        }
        self.tag.store(key.tag, Ordering::Release);
        true
    }

    /// Empties the slot if it holds a key whose words have both refilled (a key
    /// indistinguishable from a new one), as a claim would take it but leaving it empty;
    /// repairs it first if a dead claimer left it half-rewritten. Returns whether it was
    /// emptied.
    #[cfg_attr(loom, allow(dead_code))] // the models claim through `claim_until`
    pub(crate) fn sweep(&self, now: u64, _lock: &Claiming) -> bool {
        // Acquire: after whoever last wrote the tag.
        let mut tag = self.tag.load(Ordering::Acquire);
        if tag & CLAIMING != 0 {
            tag = self.repair(tag, now);
        }
        if tag == 0 || self.free_at() > now {
            return false;
        }
        // As a claim's step 1 and steps 2 and 3 (module docs).
        if self
            .tag
            .compare_exchange(tag, tag | CLAIMING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        if !self.move_words(now) {
            self.tag.store(tag, Ordering::Release);
            return false;
        }
        self.tag.store(0, Ordering::Release);
        true
    }

    /// Repairs the slot if a dead claimer left it half-rewritten (module docs); returns
    /// whether the repair left it empty.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn repair_if_claiming(&self, now: u64, _lock: &Claiming) -> bool {
        // Acquire: after whoever last wrote the tag.
        let tag = self.tag.load(Ordering::Acquire);
        tag & CLAIMING != 0 && self.repair(tag, now) == 0
    }

    /// Whether the slot is empty (no key, no claim).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        // Relaxed: a hint read under the bucket's lock, which orders it after the last
        // claimer's writes.
        self.tag.load(Ordering::Relaxed) == 0
    }

    /// Repairs a slot a dead claimer left with `CLAIMING` set (module docs); returns the
    /// tag it leaves.
    fn repair(&self, tag: u64, now: u64) -> u64 {
        let repaired = if self.free_at() <= now && self.move_words(now) {
            0
        } else {
            tag & !CLAIMING
        };
        self.tag.store(repaired, Ordering::Release);
        repaired
    }

    /// Moves both words as step 2 of a claim does; false if one is ahead of now or
    /// changed under the swap.
    fn move_words(&self, now: u64) -> bool {
        self.words.iter().all(|word| move_word(word, now))
    }
}

/// Moves `word` one nanosecond back from a value at or before `now` (a claim's steps 2
/// and 3): as refilled as before, and different. False if it is ahead of now or changed
/// under the swap.
fn move_word(word: &AtomicU64, now: u64) -> bool {
    let value = word.load(Ordering::Acquire);
    let moved = if value == 0 { 1 } else { value - 1 };
    value <= now
        && moved <= now
        && word
            .compare_exchange(value, moved, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}
