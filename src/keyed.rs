//! The keyed limiter: one GCRA cell per key, bounded memory, the same cell code.
//!
//! # Implementation notes
//!
//! Keys live in a fixed number of shards, each a `hashbrown::HashTable<(K, Cell)>` behind a
//! read-mostly lock: one word of state per key, the same `Cell` (and so the same
//! compare-and-swap loop) as the direct limiter. The key's hash is computed once, its top
//! bits pick the shard and the whole hash probes the table. A key already present is
//! checked under the shard's *read* lock; only a new key takes the write lock.
//!
//! The lock is a read-mostly lock (`crate::sync::ReadMostly`) with a reader slot per core:
//! each thread read-locks a slot of its own, so checks on different threads write no
//! common cache line (with one reader count per shard, that line moved between cores on
//! most checks and a second thread added little). Writers lock every slot, which only
//! inserting a new key needs. Shards therefore exist only to spread the writers: one per
//! two cores, so that slots and shards together cost no more than a dashmap's shards.
//!
//! **Lossless forgetting.** A key whose TAT is at or before now is indistinguishable from
//! a new key (TAT 0): both admit a full burst and nothing else. Forgetting it therefore
//! changes no decision. A key is *live* while its TAT is ahead of now, that is, while it
//! was admitted within its burst window (its refill time).
//!
//! **Forgetting: sweep instead of growing.** A shard forgets keys only when an insert finds
//! its table without a free slot, the moment the table would otherwise reallocate. It
//! then forgets the replenished keys that were *not admitted since the previous such
//! sweep* (a TAT at or before that sweep's time; every admission leaves the TAT ahead of
//! its own time), and rebuilds the table: twice as large if more than three quarters of it
//! is left, smaller if less than an eighth is, the same size otherwise. So:
//!
//! * a stable population of recurring clients costs only the read path: with no new key
//!   there is no sweep at all, and while the tables grow to hold the population, a client
//!   seen since the last sweep survives the next one, so the keys that keep coming back
//!   count as kept and the table grows to hold them instead of forgetting them (the
//!   earlier policy, a sweep of every replenished key whenever a shard had doubled, forgot
//!   every client that was under its limit and re-inserted it under the write lock on its
//!   next visit: 0.49x governor's throughput in that regime);
//! * keys that stopped coming are forgotten at the second sweep after their last
//!   admission, so memory follows the active population: the table grows only when more
//!   than three quarters of it was admitted within about one sweep interval (plus the
//!   burst window), and a rotating population settles at a fixed size (measured in
//!   `tests/keyed.rs`: at most about 5x the keys live at once, where a map that never
//!   forgets holds every key it ever saw, 70x there);
//! * a sweep costs O(table) and happens only after at least a quarter of the table was
//!   inserted since the last one (or the table doubled): amortised O(1) per new key, with
//!   no background thread; [`KeyedLimiter::retain_recent`] forgets every replenished key
//!   and shrinks every shard on demand.
//!
//! **Bounded under a flood.** With [`KeyedLimiter::with_max_keys`], each shard holds at
//! most its share of the bound. A new key arriving at a full shard first sweeps it; if every
//! key there is still limited, the new key is *refused*: the check is denied with the time
//! until the shard's earliest key is replenished (when a slot will free). Keys already
//! present keep working. Sweeps of a full shard are skipped until that time, so a flood of
//! new keys costs O(1) each. Refusing, rather than evicting a limited key, is the only
//! choice that never lets a client escape its limit by flooding the table.
//!
//! **Per-key quotas** come from a function of the key ([`KeyedLimiter::with_quota_for`]),
//! so overrides cost no memory per key and no second map.
//!
//! **Waiting** uses the same booked FIFO queue as the direct limiter, one queue per key
//! that has waiters, kept in a small side table and dropped once empty. Waiting stores a
//! key like a check does, within the bound: a new key at a full shard books nothing and
//! waits (through the clock) until a slot frees, then tries again.

use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;
use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use hashbrown::{DefaultHashBuilder, HashTable};

use crate::cell::Cell;
use crate::clock::{Clock, DefaultClock, Timeline};
use crate::error::{self, Denied, InsufficientCapacity, NotUntil};
use crate::gcra::{self, Params};
use crate::quota::Quota;
use crate::sync::{Mutex, ReadMostly};
use crate::wait::future::Target;
use crate::wait::queue::Waiters;
use crate::wait::{self, block::block_on};

type QuotaFor<K> = Box<dyn Fn(&K) -> Option<Quota> + Send + Sync>;

/// Rate limits per key: every key behaves exactly like its own [`Limiter`](crate::Limiter).
///
/// # Examples
///
/// ```
/// use pacer::{KeyedLimiter, Quota};
///
/// let per_ip = KeyedLimiter::new(Quota::per_second(2)).with_max_keys(100_000);
/// assert!(per_ip.check_key(&"10.0.0.1").is_ok());
/// assert!(per_ip.check_key(&"10.0.0.1").is_ok());
/// assert!(per_ip.check_key(&"10.0.0.1").is_err());
/// assert!(per_ip.check_key(&"10.0.0.2").is_ok()); // its own budget
/// assert_eq!(per_ip.len(), 2);
/// ```
pub struct KeyedLimiter<K: Hash + Eq + Clone, C: Clock = DefaultClock> {
    shards: Box<[CachePadded<ReadMostly<Shard<K>>>]>,
    /// `64 - log2(shards.len())`: the hash's top bits select the shard.
    shift: u32,
    hasher: DefaultHashBuilder,
    params: Params,
    quota_for: Option<QuotaFor<K>>,
    /// Most keys per shard; `usize::MAX` when unbounded.
    shard_cap: usize,
    time: Timeline<C>,
    /// Queues of the keys that have waiters. Locked only on the waiting path.
    waiters: Mutex<Queues<K, C>>,
}

/// The side table of per-key waiter queues.
struct Queues<K, C: Clock> {
    map: HashMap<K, Arc<Waiters<C>>>,
    /// The map's length after its last clean-up; it is cleaned again once doubled.
    cleaned_len: usize,
}

impl<K: Hash + Eq, C: Clock> Queues<K, C> {
    /// Drops the queues that nobody waits on and no future holds.
    fn clean(&mut self) {
        self.map
            .retain(|_, queue| Arc::strong_count(queue) > 1 || !queue.is_empty());
        self.cleaned_len = self.map.len();
    }
}

struct Shard<K> {
    table: HashTable<(K, Cell)>,
    /// When full and nothing was evictable: the limiter time at which the earliest key
    /// becomes evictable. No sweep is attempted before.
    full_until: u64,
    /// Limiter time of the last sweep that made room to avoid growing.
    last_sweep: u64,
}

/// Tables below this many keys grow without sweeping; smaller ones are not worth it.
const MIN_SWEEP_LEN: usize = 64;

impl<K: Hash> Shard<K> {
    fn new() -> Shard<K> {
        Shard {
            table: HashTable::new(),
            full_until: 0,
            last_sweep: 0,
        }
    }

    /// Forgets every key whose TAT is at or before `now` (replenished, so forgetting it
    /// changes nothing); returns the earliest TAT left.
    fn sweep(&mut self, now: u64) -> Option<u64> {
        let mut earliest = None::<u64>;
        self.table.retain(|(_, cell)| {
            let tat = cell.tat();
            let keep = tat > now;
            if keep {
                earliest = Some(earliest.map_or(tat, |e| e.min(tat)));
            }
            keep
        });
        earliest
    }

    /// Before inserting a key into a table with no free slot (the insert would make it
    /// grow), forgets instead the replenished keys that were not admitted since the last
    /// such sweep (module docs, "Forgetting"). The table is then rebuilt at a size chosen
    /// here: twice as large if more than three quarters of it is left, four times what is
    /// left if less than an eighth is, the same size otherwise.
    ///
    /// Rebuilding (rather than leaving hashbrown's tombstones in place) keeps the size
    /// ours to choose: with tombstones the table reports less capacity than it has, and
    /// its next insert may grow it whatever this policy decided.
    fn sweep_instead_of_growing(&mut self, now: u64, hasher: &DefaultHashBuilder) {
        let capacity = self.table.capacity();
        if self.table.len() < capacity || capacity < MIN_SWEEP_LEN {
            return;
        }
        // An admission at `t` leaves a TAT above `t`: a TAT at or before the last sweep
        // means no admission since. `last_sweep <= now`, so such a key is replenished too.
        self.sweep(self.last_sweep);
        self.last_sweep = now;
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

impl<K: Hash + Eq + Clone, C: Clock> core::fmt::Debug for KeyedLimiter<K, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("quota", &Quota::from_params(self.params))
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone> KeyedLimiter<K> {
    /// A keyed limiter on the default clock, unbounded until [`KeyedLimiter::with_max_keys`].
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = pacer::KeyedLimiter::<u64>::new(pacer::Quota::per_minute(10));
    /// assert!(limiter.is_empty());
    /// ```
    pub fn new(quota: Quota) -> KeyedLimiter<K> {
        KeyedLimiter::with_clock(quota, DefaultClock::default())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> KeyedLimiter<K, C> {
    /// A keyed limiter on the given clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{clock::ManualClock, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::with_clock(Quota::per_second(1), ManualClock::new());
    /// assert!(limiter.check_key(&1u32).is_ok());
    /// assert!(limiter.check_key(&1u32).is_err());
    /// ```
    pub fn with_clock(quota: Quota, clock: C) -> KeyedLimiter<K, C> {
        let cores = std::thread::available_parallelism()
            .map_or(4, usize::from)
            .next_power_of_two();
        // Readers do not contend on a shard (its lock has a reader slot per core, up to 8),
        // so shards only spread the writers of new keys. Slots times shards is at most four
        // per core: never more lock memory than a dashmap's four shards per core.
        let slots = cores.min(8);
        let shards = (cores / 2).clamp(2, 64);
        KeyedLimiter {
            shards: (0..shards)
                .map(|_| CachePadded::new(ReadMostly::new(Shard::new(), slots)))
                .collect(),
            shift: 64 - shards.trailing_zeros(),
            hasher: DefaultHashBuilder::default(),
            params: *quota.params(),
            quota_for: None,
            shard_cap: usize::MAX,
            time: Timeline::starting_now(clock),
            waiters: Mutex::new(Queues {
                map: HashMap::new(),
                cleaned_len: 0,
            }),
        }
    }

    /// Bounds the number of stored keys to about `max` (rounded up to a multiple of the
    /// shard count, at most a few hundred more). See the module docs for what happens at the
    /// bound: fully replenished keys are forgotten first; if none is, new keys are refused
    /// (denied with the time until a slot frees) rather than evicting a limited key.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{clock::ManualClock, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::with_clock(Quota::per_hour(1), ManualClock::new())
    ///     .with_max_keys(1_000);
    /// let admitted = (0..100_000u32).filter(|k| limiter.check_key(k).is_ok()).count();
    /// assert!(admitted >= 1_000 && admitted <= 1_000 + 256);
    /// assert!(limiter.len() <= 1_000 + 256);
    /// ```
    pub fn with_max_keys(mut self, max: usize) -> KeyedLimiter<K, C> {
        self.shard_cap = max.div_ceil(self.shards.len()).max(1);
        self
    }

    /// Gives some keys a quota of their own: `quota_for(key)` returns `Some(quota)` for
    /// those, `None` for the default. Called on every check of a key, so keep it cheap.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(1))
    ///     .with_quota_for(|user: &&str| (*user == "premium").then(|| Quota::per_second(100)));
    /// assert!(limiter.check_key_n(&"premium", 50).is_ok());
    /// assert!(limiter.check_key_n(&"free", 2).is_err());
    /// ```
    pub fn with_quota_for(
        mut self,
        quota_for: impl Fn(&K) -> Option<Quota> + Send + Sync + 'static,
    ) -> KeyedLimiter<K, C> {
        self.quota_for = Some(Box::new(quota_for));
        self
    }

    #[inline]
    fn now(&self) -> u64 {
        self.time.now()
    }

    #[inline]
    fn params_for(&self, key: &K) -> Params {
        match &self.quota_for {
            Some(quota_for) => quota_for(key).map_or(self.params, |q| *q.params()),
            None => self.params,
        }
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
    /// The clock is read only once the cell is found: the read then overlaps the likely
    /// cache miss on the cell instead of adding to it.
    fn with_cell<R>(&self, key: &K, f: impl FnOnce(&Cell, u64) -> R) -> Result<R, u64> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let shard = shard.read();
            if let Some((_, cell)) = shard.table.find(hash, |(k, _)| k == key) {
                return Ok(f(cell, self.now()));
            }
            // A flood of new keys at a full shard is refused here, without the write lock.
            if shard.table.len() >= self.shard_cap {
                let now = self.now();
                if now < shard.full_until {
                    return Err(shard.full_until - now);
                }
            }
        }
        shard.write(|shard| self.insert_and(shard, hash, key, f))
    }

    /// Runs `f` on `key`'s cell if it is stored; never stores it.
    fn with_stored_cell<R>(&self, key: &K, f: impl FnOnce(&Cell, u64) -> R) -> Option<R> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash).read();
        let (_, cell) = shard.table.find(hash, |(k, _)| k == key)?;
        Some(f(cell, self.now()))
    }

    /// [`KeyedLimiter::with_cell`]'s path for a key that was not found: under the shard's
    /// write lock, stores it unless the shard is full of limited keys, then runs `f`.
    fn insert_and<R>(
        &self,
        shard: &mut Shard<K>,
        hash: u64,
        key: &K,
        f: impl FnOnce(&Cell, u64) -> R,
    ) -> Result<R, u64> {
        let now = self.now();
        if shard.table.find(hash, |(k, _)| k == key).is_none() {
            let len = shard.table.len();
            if len >= self.shard_cap {
                if now < shard.full_until {
                    return Err(shard.full_until - now);
                }
                if let Some(earliest) = shard.sweep(now) {
                    if shard.table.len() >= self.shard_cap {
                        shard.full_until = earliest;
                        return Err(earliest - now);
                    }
                }
            } else {
                shard.sweep_instead_of_growing(now, &self.hasher);
            }
            let hasher = &self.hasher;
            shard
                .table
                .insert_unique(hash, (key.clone(), Cell::new()), |(k, _)| {
                    hasher.hash_one(k)
                });
        }
        match shard.table.find(hash, |(k, _)| k == key) {
            Some((_, cell)) => Ok(f(cell, now)),
            None => unreachable!("the key was just found or inserted under this lock"),
        }
    }

    /// Admits one cell for `key` now, or says how long until one would be admitted.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait. A new key refused by a full table (see
    /// [`KeyedLimiter::with_max_keys`]) also gets `NotUntil`: the time until a slot frees.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = pacer::KeyedLimiter::new(pacer::Quota::per_hour(1));
    /// assert!(limiter.check_key(&"alice").is_ok());
    /// assert!(limiter.check_key(&"alice").unwrap_err().wait_time().as_secs() > 3500);
    /// ```
    #[inline]
    pub fn check_key(&self, key: &K) -> Result<(), NotUntil> {
        let params = self.params_for(key);
        self.with_cell(key, |cell, now| {
            cell.acquire(now, params.interval(), params.tau())
        })
        .and_then(|admitted| admitted.map(drop))
        .map_err(NotUntil::from_nanos)
    }

    /// Admits `n` cells for `key` at once, or none.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when they fit the key's burst but not now (or the table is full);
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{Denied, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(5));
    /// assert!(limiter.check_key_n(&7, 5).is_ok());
    /// assert!(matches!(limiter.check_key_n(&7, 6), Err(Denied::InsufficientCapacity(_))));
    /// ```
    pub fn check_key_n(&self, key: &K, n: u32) -> Result<(), Denied> {
        let params = self.params_for(key);
        let cost = error::cost(&params, n)?;
        if cost == 0 {
            return Ok(());
        }
        self.with_cell(key, |cell, now| cell.acquire(now, cost, params.tau()))
            .and_then(|admitted| admitted.map(drop))
            .map_err(|wait| NotUntil::from_nanos(wait).into())
    }

    /// How many cells `check_key_n` would admit for `key` right now; spends nothing and
    /// stores nothing (an unknown key has its whole burst).
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_hour(10));
    /// limiter.check_key_n(&"alice", 4).unwrap();
    /// assert_eq!(limiter.remaining_key(&"alice"), 6);
    /// assert_eq!(limiter.remaining_key(&"bob"), 10);
    /// assert_eq!(limiter.len(), 1);
    /// ```
    pub fn remaining_key(&self, key: &K) -> u32 {
        let params = self.params_for(key);
        self.with_stored_cell(key, |cell, now| gcra::remaining(cell.tat(), now, &params))
            .unwrap_or(params.burst())
    }

    /// Waits `key`'s booked turn for one cell (the same FIFO promises as
    /// [`Limiter::until_ready`](crate::Limiter::until_ready)).
    ///
    /// The key bound of [`KeyedLimiter::with_max_keys`] holds here too: a new key that
    /// finds its shard full of limited keys books nothing and waits until a slot frees,
    /// then tries again.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(1000).with_burst(1));
    /// futures::executor::block_on(async {
    ///     limiter.until_key_ready(&"job").await;
    ///     limiter.until_key_ready(&"job").await; // about 1 ms later
    /// });
    /// ```
    pub fn until_key_ready(&self, key: &K) -> impl Future<Output = ()> + Send + '_
    where
        K: Send + Sync,
    {
        wait::ready(self.target(key))
    }

    /// Waits `key`'s booked turn for `n` cells at once.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(10));
    /// futures::executor::block_on(async {
    ///     assert!(limiter.until_key_n_ready(&1, 10).await.is_ok());
    ///     assert!(limiter.until_key_n_ready(&1, 11).await.is_err());
    /// });
    /// ```
    pub fn until_key_n_ready(
        &self,
        key: &K,
        n: u32,
    ) -> impl Future<Output = Result<(), InsufficientCapacity>> + Send + '_
    where
        K: Send + Sync,
    {
        wait::n_ready(self.target(key), n)
    }

    /// Waits for one cell for `key` only if it can be had within `max`; otherwise books
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] when the cell cannot be had within `max` (or, for a new key at the key
    /// bound, when no slot frees within `max`).
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::new(Quota::per_hour(1));
    /// futures::executor::block_on(async {
    ///     assert!(limiter.until_key_ready_within(&1, Duration::ZERO).await.is_ok());
    ///     assert!(limiter.until_key_ready_within(&1, Duration::from_secs(1)).await.is_err());
    /// });
    /// ```
    pub fn until_key_ready_within(
        &self,
        key: &K,
        max: Duration,
    ) -> impl Future<Output = Result<(), NotUntil>> + Send + '_
    where
        K: Send + Sync,
    {
        wait::ready_within(self.target(key), max)
    }

    /// Waits for `n` cells for `key` within `max`, or books nothing.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when the cells cannot be had within `max`;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{Denied, KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::new(Quota::per_second(4));
    /// futures::executor::block_on(async {
    ///     limiter.until_key_n_ready_within(&"a", 4, Duration::ZERO).await.unwrap();
    ///     let late = limiter.until_key_n_ready_within(&"a", 2, Duration::from_millis(100)).await;
    ///     assert!(matches!(late, Err(Denied::NotUntil(_))));
    /// });
    /// ```
    pub fn until_key_n_ready_within(
        &self,
        key: &K,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + '_
    where
        K: Send + Sync,
    {
        wait::n_ready_within(self.target(key), n, max)
    }

    /// Blocks the calling thread until one cell is admitted for `key`, in the same booked
    /// FIFO as the key's async waiters. Don't call it inside an async task.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(1000).with_burst(1));
    /// let start = std::time::Instant::now();
    /// for _ in 0..3 {
    ///     limiter.wait_key(&"job");
    /// }
    /// assert!(start.elapsed().as_millis() >= 2);
    /// ```
    pub fn wait_key(&self, key: &K)
    where
        K: Send + Sync,
    {
        block_on(self.until_key_ready(key));
    }

    /// Blocks the calling thread until `n` cells are admitted for `key` at once.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(10));
    /// limiter.wait_key_n(&1, 10).unwrap();
    /// assert!(limiter.wait_key_n(&1, 11).is_err());
    /// ```
    pub fn wait_key_n(&self, key: &K, n: u32) -> Result<(), InsufficientCapacity>
    where
        K: Send + Sync,
    {
        block_on(self.until_key_n_ready(key, n))
    }

    fn target(&self, key: &K) -> KeyTarget<'_, K, C> {
        KeyTarget {
            limiter: self,
            key: key.clone(),
        }
    }

    /// How many keys are stored now.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = pacer::KeyedLimiter::new(pacer::Quota::per_second(1));
    /// limiter.check_key(&1).unwrap();
    /// limiter.check_key(&2).unwrap();
    /// assert_eq!(limiter.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().table.len()).sum()
    }

    /// Whether no key is stored.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(pacer::KeyedLimiter::<u8>::new(pacer::Quota::per_second(1)).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.read().table.is_empty())
    }

    /// Forgets every key that is indistinguishable from a new one (fully replenished), and
    /// the queues of keys nobody waits on. Changes no decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{clock::ManualClock, KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let limiter = KeyedLimiter::with_clock(Quota::per_second(1), clock.clone());
    /// limiter.check_key(&"a").unwrap();
    /// limiter.retain_recent();
    /// assert_eq!(limiter.len(), 1); // still limited
    /// clock.advance(Duration::from_secs(1));
    /// limiter.retain_recent();
    /// assert!(limiter.is_empty());
    /// ```
    pub fn retain_recent(&self) {
        let now = self.now();
        for shard in self.shards.iter() {
            shard.write(|shard| {
                shard.sweep(now);
                shard.rebuild(shard.table.len() * 2, &self.hasher);
                shard.full_until = 0;
            });
        }
        self.waiters.lock().clean();
    }
}

/// A waiting future's view of one key.
struct KeyTarget<'a, K: Hash + Eq + Clone, C: Clock> {
    limiter: &'a KeyedLimiter<K, C>,
    key: K,
}

impl<K: Hash + Eq + Clone, C: Clock> Target for KeyTarget<'_, K, C> {
    type Clock = C;

    fn params(&self) -> Params {
        self.limiter.params_for(&self.key)
    }

    fn time(&self) -> &Timeline<C> {
        &self.limiter.time
    }

    fn waiters(&self) -> Arc<Waiters<C>> {
        let limiter = self.limiter;
        let mut queues = limiter.waiters.lock();
        if queues.map.len() >= MIN_SWEEP_LEN && queues.map.len() >= 2 * queues.cleaned_len {
            queues.clean();
        }
        Arc::clone(
            queues
                .map
                .entry(self.key.clone())
                .or_insert_with(|| Waiters::new(limiter.time.clone())),
        )
    }

    fn with_cell<R>(&self, f: impl FnOnce(&Cell) -> R) -> Result<R, u64> {
        self.limiter.with_cell(&self.key, |cell, _| f(cell))
    }

    fn with_stored_cell<R>(&self, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        self.limiter.with_stored_cell(&self.key, |cell, _| f(cell))
    }
}
