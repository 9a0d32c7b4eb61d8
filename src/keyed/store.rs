//! The keyed limiter's storage: shards of cells, the forgetting policy, the key bound.
//!
//! # Implementation notes
//!
//! Keys live in a fixed number of shards, each a `hashbrown::HashTable<(K, TatWord)>` behind a
//! read-mostly lock: one word of state per key, the same `TatWord` (and so the same
//! compare-and-swap loop) as the direct limiter. The key's hash is computed once, its top
//! bits pick the shard and the whole hash probes the table. A key already present is
//! checked under the shard's *read* lock; only a new key takes the write lock.
//!
//! The lock is a read-mostly lock (`crate::sync::ReadMostly`) with reader slots: each
//! thread takes a slot of its own, so checks on different threads write no common cache
//! line (with one reader count per shard, that line moved between cores on most checks and
//! a second thread added little). A slot holds one reader at a time; a reader that finds
//! every slot taken counts itself in a shared word instead of waiting. There are four
//! slots per core up to 16, and at least one per core up to 32: with more threads than
//! cores (a container's CPU quota under a large thread pool), threads are descheduled
//! holding slots, and with one slot per core the running ones then met taken slots on
//! most checks (16 threads on 2 cores checked keys at a third to half of governor's speed
//! with one slot per core and no shared word, at about its speed with the shared word, at
//! twice its speed with 8 slots as well; BENCHMARKS.md). Writers take
//! every slot, which only inserting a new key needs. Shards therefore exist only to
//! spread the writers: one per two cores. A slot takes a cache line pair (128 bytes), so
//! the slots cost `slots × shards × 128` bytes per limiter (2 KB on 2 cores, 16 KB on 16),
//! a fixed cost next to the keys.
//!
//! **Lossless forgetting.** A key whose TAT is at or before now is indistinguishable from
//! a new key (TAT 0): both admit a full burst and nothing else. Forgetting it therefore
//! changes no decision, as long as time does not go back: a clock may step back (the
//! `Clock` contract allows it), so each shard remembers the latest time up to which it
//! forgot keys, and a key stored there starts with that TAT instead of 0 (the same as
//! new from then on, and before then no freer than the forgotten key), and the time that
//! a stored key's waiters are cancelled and its state reported at is never earlier than
//! it. So a key forgotten at 200 s never gets a second burst from a clock that reads
//! 100 s next, and a waiter of a forgotten key (whose instant had passed) never takes a
//! refund from the word stored after it. A key is *live* while its TAT is ahead of now, that is, while it
//! was admitted within its burst window (its refill time).
//!
//! **Forgetting: sweep instead of growing.** A shard forgets keys only when an insert finds
//! its table without a free slot, the moment the table would otherwise reallocate. It
//! then forgets the replenished keys that were *not admitted since the previous such
//! sweep, nor within the last second* (a TAT at or before both times; every admission
//! leaves the TAT ahead of its own time), and rebuilds the table: twice as large if more
//! than three quarters of it is left, smaller if less than an eighth is, the same size
//! otherwise. A table that is full again less than 100 ms after its last sweep doubles
//! without sweeping: it is too small for the clients that keep coming (clients that come
//! back in a fixed order, as pollers do, would otherwise each be forgotten just before
//! its next visit and re-inserted on it, every visit paying the write lock). So:
//!
//! * a stable population of recurring clients that come back within a second (or within
//!   a sweep interval, if the sweeps are further apart) costs only the read path: with no
//!   new key there is no sweep at all, and while the tables grow to hold the population,
//!   a client seen within the second survives the next sweep, so the keys that keep
//!   coming back count as kept and the table grows to hold them instead of forgetting
//!   them (a sweep of every replenished key would forget every client under its limit
//!   and re-insert it under the write lock on its next visit). Clients whose visits are
//!   further apart than that are forgotten between them and stored again on their next
//!   visit (BENCHMARKS.md, "Clients that come back slowly, and where the keyed table
//!   loses");
//! * keys that stopped coming are forgotten at the first sweep that comes a second after
//!   their last admission and after the next sweep, so memory follows the active
//!   population: the table grows only when more than three quarters of it was admitted
//!   within about a second (plus the burst window), or when new keys fill it within
//!   100 ms (it then holds about twice the keys that arrive in 100 ms), and a rotating
//!   population settles at a fixed size (`tests/keyed.rs` bounds it by 8x the keys
//!   admitted within a burst window plus 1.2 s, where a map that never forgets holds
//!   every key it ever saw);
//! * a sweep costs O(table) and happens only after at least a quarter of the table was
//!   inserted since the last one (or the table doubled): amortised O(1) per new key, with
//!   no background thread; [`KeyedLimiter::retain_recent`] forgets every replenished key
//!   and shrinks every shard on demand.
//!
//! **Bounded under a flood.** With a key bound (`KeyedLimiter::with_max_keys`), each shard
//! holds at most its share of it. A new key arriving at a full shard first sweeps it; if
//! every key there is still limited, the new key is *refused*: the check is denied with the
//! time until the shard's earliest key is replenished (when a slot will free). Keys already
//! present keep working. Sweeps of a full shard are skipped until that time, so a flood of
//! new keys costs O(1) each, under the read lock. Refusing, rather than evicting a limited
//! key, is the only choice that never lets a client escape its limit by flooding the table.
//!
//! A full shard also keeps a Bloom filter of its keys (`Members`: one word per lookup,
//! 8 bits per key, about 1 byte per key of the bound, only while full), consulted before
//! the table: a new key it rules out (about 95 % of them) is refused without probing. The
//! probe is what a flood would cost everyone else: it reads the entries of stored keys
//! whose 7-bit tags happen to match, about one entry line per ten new keys, and those are
//! the lines that the stored keys' admissions write, so on another core every admission
//! would pay for a line the flood had just read (BENCHMARKS.md, regime 5, has the
//! numbers). The filter never rules out a
//! stored key: it is built from every key of the shard when the shard first refuses one,
//! and dropped by any sweep that forgets a key (the only way room is made for an insert).

use core::hash::{BuildHasher, Hash};

use crossbeam_utils::CachePadded;
use hashbrown::{DefaultHashBuilder, HashTable};

use super::members::Members;
use crate::cell::TatWord;
use crate::sync::{AtomicUsize, Ordering, ReadMostly};

/// A key as a caller names it: hashes as the stored key it stands for, tells that key
/// apart, and makes it when it must be stored. Every key names itself; a
/// [`TextKey`](super::TextKey) is also named by its text, with no allocation to find it.
pub(crate) trait KeyRef<K>: Hash {
    /// Whether `key` is the key this names.
    fn is(&self, key: &K) -> bool;
    /// The key to store.
    fn to_key(&self) -> K;
}

impl<K: Hash + Eq + Clone> KeyRef<K> for K {
    #[inline]
    fn is(&self, key: &K) -> bool {
        self == key
    }

    fn to_key(&self) -> K {
        self.clone()
    }
}

/// Every key's cell, in shards.
pub(super) struct Store<K> {
    shards: Box<[CachePadded<ReadMostly<Shard<K>>>]>,
    /// `64 - log2(shards.len())`: the hash's top bits select the shard.
    shift: u32,
    hasher: DefaultHashBuilder,
    /// Stores of one family (a store and its lanes, [`Store::lane`]) share the hasher and
    /// the shard count, so that a key's hash serves each and picks the same shard in each.
    family: u64,
    /// Most keys per shard; `usize::MAX` when unbounded. Relaxed: a setting, read on the
    /// new-key path only; a check that reads the old bound decides as it would have.
    shard_cap: AtomicUsize,
}

impl<K: Hash + Eq + Clone> Store<K> {
    pub(super) fn new() -> Store<K> {
        let (shards, slots) = Store::<K>::layout();
        // Relaxed: a name for the family, unique by the count alone; it publishes nothing.
        static FAMILIES: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
        let family = FAMILIES.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        Store::empty(shards, slots, DefaultHashBuilder::default(), family)
    }

    /// The shard count and reader slots per shard for this machine.
    fn layout() -> (usize, usize) {
        let cores = std::thread::available_parallelism()
            .map_or(4, usize::from)
            .next_power_of_two();
        // Readers do not contend on a shard (its lock has a reader slot per core or
        // more), so shards only spread the writers of new keys (module docs).
        // Four reader slots per core, up to 16, and never fewer than one per core (up to
        // 32): with more threads than cores, some are descheduled holding a slot, and the
        // spare slots keep the running readers off the shared count (module docs).
        let slots = (cores * 4).min(16).max(cores).min(32);
        let shards = (cores / 2).clamp(2, 64);
        (shards, slots)
    }

    fn empty(shards: usize, slots: usize, hasher: DefaultHashBuilder, family: u64) -> Store<K> {
        Store {
            shards: (0..shards)
                .map(|_| CachePadded::new(ReadMostly::new(Shard::new(), slots)))
                .collect(),
            shift: 64 - shards.trailing_zeros(),
            hasher,
            family,
            shard_cap: AtomicUsize::new(usize::MAX),
        }
    }

    /// An empty store of this one's family (see the field) and key bound.
    pub(super) fn lane(&self) -> Store<K> {
        let (_, slots) = Store::<K>::layout();
        let lane = Store::empty(self.shards.len(), slots, self.hasher, self.family);
        lane.shard_cap.store(self.shard_cap(), Ordering::Relaxed);
        lane
    }

    /// Bounds the stored keys to about `max` (rounded up to a multiple of the shard count).
    pub(super) fn set_max_keys(&self, max: usize) {
        let cap = max.div_ceil(self.shards.len()).max(1);
        self.shard_cap.store(cap, Ordering::Relaxed);
    }

    /// Takes `other`'s key bound.
    #[cfg(feature = "tower")]
    pub(super) fn copy_bound(&self, other: &Store<K>) {
        // Relaxed: see the field.
        self.shard_cap
            .store(other.shard_cap.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The per-shard key bound now.
    #[inline]
    fn shard_cap(&self) -> usize {
        // Relaxed: see the field.
        self.shard_cap.load(Ordering::Relaxed)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &ReadMostly<Shard<K>> {
        // `shift` is 63..=58, so the index is below `shards.len()`.
        &self.shards[(hash >> self.shift) as usize]
    }

    /// Runs `f` on `key`'s cell and the time now, storing a fresh cell first if the key is
    /// new. `Err` when the key is new and its shard is full of limited keys: it carries the
    /// wait until a slot frees. Every path that stores a key comes through here, so the
    /// bound holds on all of them.
    ///
    /// The clock is read only once the key's word is found: the read then overlaps the likely
    /// cache miss on the word instead of adding to it.
    pub(super) fn with_word<Q: KeyRef<K> + ?Sized, R>(
        &self,
        key: &Q,
        now: impl Fn() -> u64,
        f: impl FnOnce(&TatWord, u64) -> R,
    ) -> Result<R, u64> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let shard = shard.read();
            // A full shard's filter rules out most new keys without probing the table: the
            // probe would read the entries that the stored keys' admissions write (module
            // docs, "Bounded under a flood").
            let ruled_out = shard.members.as_ref().is_some_and(|m| !m.may_hold(hash));
            if !ruled_out {
                if let Some((_, cell)) = shard.table.find(hash, |(k, _)| key.is(k)) {
                    return Ok(f(cell, now()));
                }
            }
            // A new key. A flood of them at a full shard is refused here, without the write
            // lock.
            if shard.table.len() >= self.shard_cap() {
                let now = now();
                if now < shard.full_until {
                    return Err(shard.full_until - now);
                }
            }
        }
        shard.write(|shard| self.insert_and(shard, hash, key, now(), f))
    }

    /// Runs `f` on `key`'s cell if it is stored; never stores it.
    pub(super) fn with_stored_word<Q: KeyRef<K> + ?Sized, R>(
        &self,
        key: &Q,
        now: impl Fn() -> u64,
        f: impl FnOnce(&TatWord, u64) -> R,
    ) -> Option<R> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash).read();
        let (_, cell) = shard.table.find(hash, |(k, _)| key.is(k))?;
        Some(f(cell, now().max(shard.forgotten_to)))
    }

    /// Runs `f` on `key`'s cell here and on its cell in `other`, and the time now, if the
    /// key is stored in both; never stores it. The key is hashed once where `other` is of
    /// this store's family. Both shards are read-locked at once, in an order that never
    /// deadlocks with callers pairing the stores the other way round
    /// ([`ReadMostly::read_both`]).
    pub(super) fn with_stored_pair<Q: KeyRef<K> + ?Sized, R>(
        &self,
        other: &Store<K>,
        key: &Q,
        now: impl Fn() -> u64,
        f: impl FnOnce(&TatWord, &TatWord, u64) -> R,
    ) -> Option<R> {
        let hash = self.hasher.hash_one(key);
        let other_hash = if other.family == self.family {
            hash
        } else {
            other.hasher.hash_one(key)
        };
        ReadMostly::read_both(self.shard(hash), other.shard(other_hash), |mine, theirs| {
            let (_, word) = mine.table.find(hash, |(k, _)| key.is(k))?;
            let (_, their_word) = theirs.table.find(other_hash, |(k, _)| key.is(k))?;
            Some(f(word, their_word, now()))
        })
    }

    /// For a key that is not stored: the TAT it would be stored with at `now` (its shard's
    /// forgetting time, see "Lossless forgetting"), or, when its shard is full of limited
    /// keys, the wait until a slot frees, exactly as [`Store::with_word`] would answer.
    /// May sweep the shard, as storing the key would; stores nothing.
    pub(super) fn vacancy<Q: KeyRef<K> + ?Sized>(&self, key: &Q, now: u64) -> Result<u64, u64> {
        let shard = self.shard(self.hasher.hash_one(key));
        {
            let shard = shard.read();
            if shard.table.len() < self.shard_cap() {
                return Ok(shard.forgotten_to);
            }
            if now < shard.full_until {
                return Err(shard.full_until - now);
            }
        }
        shard.write(|shard| {
            self.make_room(shard, now)?;
            Ok(shard.forgotten_to)
        })
    }

    /// Under a full shard's write lock: sweeps it unless a sweep already found it full of
    /// keys limited until `full_until`; `Err` with the wait until a slot frees if there is
    /// still no room (and the filter of its keys built, see "Bounded under a flood").
    fn make_room(&self, shard: &mut Shard<K>, now: u64) -> Result<(), u64> {
        if shard.table.len() < self.shard_cap() {
            return Ok(());
        }
        if now >= shard.full_until {
            match shard.sweep(now) {
                Some(earliest) if shard.table.len() >= self.shard_cap() => {
                    shard.full_until = earliest;
                }
                // Room was made.
                _ => shard.full_until = 0,
            }
        }
        if now < shard.full_until {
            if shard.members.is_none() {
                shard.members = Some(Members::of(&shard.table, &self.hasher));
            }
            return Err(shard.full_until - now);
        }
        Ok(())
    }

    /// [`Store::with_word`]'s path for a key that was not found: under the shard's
    /// write lock, stores it unless the shard is full of limited keys, then runs `f`.
    fn insert_and<Q: KeyRef<K> + ?Sized, R>(
        &self,
        shard: &mut Shard<K>,
        hash: u64,
        key: &Q,
        now: u64,
        f: impl FnOnce(&TatWord, u64) -> R,
    ) -> Result<R, u64> {
        if shard.table.find(hash, |(k, _)| key.is(k)).is_none() {
            if shard.table.len() >= self.shard_cap() {
                self.make_room(shard, now)?;
            } else {
                shard.sweep_instead_of_growing(now, &self.hasher);
            }
            // Room was made by a sweep that forgot keys, which dropped the filter; were
            // one left, it would not hold the new key.
            shard.members = None;
            let hasher = &self.hasher;
            shard.table.insert_unique(
                hash,
                (key.to_key(), TatWord::starting_at(shard.forgotten_to)),
                |(k, _)| hasher.hash_one(k),
            );
        }
        match shard.table.find(hash, |(k, _)| key.is(k)) {
            Some((_, cell)) => Ok(f(cell, now)),
            None => unreachable!("the key was just found or inserted under this lock"),
        }
    }

    /// How many keys are stored.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().table.len()).sum()
    }

    /// Whether no key is stored.
    pub(super) fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.read().table.is_empty())
    }

    /// Forgets every replenished key at `now` and shrinks every shard to fit.
    pub(super) fn retain_recent(&self, now: u64) {
        for shard in self.shards.iter() {
            shard.write(|shard| {
                shard.sweep(now);
                shard.rebuild(shard.table.len() * 2, &self.hasher);
                shard.full_until = 0;
            });
        }
    }
}

struct Shard<K> {
    table: HashTable<(K, TatWord)>,
    /// When full and nothing was evictable: the limiter time at which the earliest key
    /// becomes evictable. No sweep is attempted before.
    full_until: u64,
    /// Limiter time of the last sweep that made room to avoid growing.
    last_sweep: u64,
    /// The latest time up to which a sweep forgot keys (each forgotten key's TAT was at
    /// or before it): the TAT a key stored here starts with ("Lossless forgetting").
    forgotten_to: u64,
    /// Which keys the table may hold, from the moment a full shard first refuses a new
    /// key until a sweep forgets one: a new key it rules out is refused without probing
    /// the table. Holds every stored key while present.
    members: Option<Members>,
}

/// Sweeps of one table come at least this far apart (limiter time, ns); a table full
/// again sooner grows instead.
const SWEEP_INTERVAL: u64 = 100_000_000;

/// A sweep to avoid growing keeps every key admitted within this long (limiter time, ns),
/// however long ago the previous sweep was: a client that comes back within it stays
/// stored (module docs, "Forgetting").
const IDLE_HORIZON: u64 = 1_000_000_000;

/// Tables below this many keys grow without sweeping; smaller ones are not worth it.
pub(super) const MIN_SWEEP_LEN: usize = 64;

impl<K: Hash> Shard<K> {
    fn new() -> Shard<K> {
        Shard {
            table: HashTable::new(),
            full_until: 0,
            last_sweep: 0,
            forgotten_to: 0,
            members: None,
        }
    }

    /// Forgets every key whose TAT is at or before `now` (replenished, so forgetting it
    /// changes nothing); returns the earliest TAT left.
    fn sweep(&mut self, now: u64) -> Option<u64> {
        let before = self.table.len();
        let mut earliest = None::<u64>;
        self.table.retain(|(_, cell)| {
            let tat = cell.tat();
            let keep = tat > now;
            if keep {
                earliest = Some(earliest.map_or(tat, |e| e.min(tat)));
            }
            keep
        });
        if self.table.len() < before {
            // Still correct (it holds every key left), but no longer tight: it is made
            // again, from the keys then stored, when the shard next refuses a key.
            self.members = None;
            self.forgotten_to = self.forgotten_to.max(now);
        }
        earliest
    }

    /// Before inserting a key into a table with no free slot (the insert would make it
    /// grow), forgets instead the replenished keys that were not admitted since the last
    /// such sweep nor within [`IDLE_HORIZON`] (module docs, "Forgetting"), unless that
    /// sweep was less than [`SWEEP_INTERVAL`] ago: a table that fills again that fast is
    /// too small for the clients that keep coming (in a fixed order, every one of them
    /// would be forgotten just before its next visit), and it doubles instead. Otherwise
    /// the table is rebuilt at a size chosen here: twice as large if more than three
    /// quarters of it is left, four times what is left if less than an eighth is, the
    /// same size otherwise.
    ///
    /// Rebuilding (rather than leaving hashbrown's tombstones in place) keeps the size
    /// ours to choose: with tombstones the table reports less capacity than it has, and
    /// its next insert may grow it whatever this policy decided.
    fn sweep_instead_of_growing(&mut self, now: u64, hasher: &DefaultHashBuilder) {
        let capacity = self.table.capacity();
        if self.table.len() < capacity || capacity < MIN_SWEEP_LEN {
            return;
        }
        let before = core::mem::replace(&mut self.last_sweep, now);
        if now.saturating_sub(before) < SWEEP_INTERVAL {
            self.rebuild(capacity * 2, hasher);
            return;
        }
        // An admission at `t` leaves a TAT above `t`: a TAT at or before the last sweep
        // means no admission since, and one at or before `now - IDLE_HORIZON` none within
        // the horizon. Both are at most `now`, so such a key is replenished too.
        self.sweep(before.min(now.saturating_sub(IDLE_HORIZON)));
        let kept = self.table.len();
        let target = if kept * 4 > capacity * 3 {
            // Mostly recent: forgetting would free too little to pay for the sweep.
            capacity * 2
        } else if kept * 8 < capacity {
            (kept * 4).max(MIN_SWEEP_LEN)
        } else {
            capacity
        };
        self.rebuild(target, hasher);
    }

    /// Moves every key into a fresh table with room for `capacity` keys.
    ///
    /// Rehashing needs the map's real hasher: with any other hash the keys would no longer
    /// be found, and a limited key would come back as new.
    fn rebuild(&mut self, capacity: usize, hasher: &DefaultHashBuilder) {
        let mut fresh = HashTable::with_capacity(capacity.max(self.table.len()));
        for entry in self.table.drain() {
            fresh.insert_unique(hasher.hash_one(&entry.0), entry, |(k, _)| {
                hasher.hash_one(k)
            });
        }
        self.table = fresh;
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
