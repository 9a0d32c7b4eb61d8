//! The keyed limiter: one GCRA cell per key, bounded memory, the same cell code.
//!
//! # Implementation notes
//!
//! Keys and their cells live in `store` (shards, the read-mostly lock, the forgetting
//! policy and the key bound; its docs hold those notes). This file is the public API: it
//! turns a key into params and a cell, and hands both to the same arithmetic, cell and
//! waiting path as the direct limiter.
//!
//! **Per-key quotas** come from a function of the key ([`KeyedLimiter::with_quota_for`]),
//! so overrides cost no memory per key and no second map.
//!
//! **Waiting** uses the same booked FIFO queue as the direct limiter, one queue per key
//! that has waiters, kept in a small side table; queues nobody waits on or holds are
//! dropped when the table has doubled since its last clean-up, and by `retain_recent`.
//! Waiting stores a key like a check does, within the bound: a new key at a full shard
//! books nothing and waits (through the clock) until a slot frees, then tries again (a
//! reservation is refused instead, with the time until a slot frees).

use core::hash::Hash;
use std::collections::HashMap;
use std::sync::Arc;

use crate::cell::TatWord;
use crate::clock::{Clock, DefaultClock};
use core::time::Duration;

use crate::error::{self, Denied, InsufficientCapacity, NotUntil};
use crate::gcra::{self, Params};
use crate::quota::Quota;
use crate::quota_cell::QuotaCell;
use crate::snapshot::Snapshot;
use crate::sync::Mutex;
use crate::wait::queue::Waiters;
use store::{KeyRef, Store};

mod admission;
mod members;
mod paired;
mod store;
mod text_key;
mod waiting;

pub use admission::KeyAdmission;
#[cfg(feature = "tower")]
pub(crate) use text_key::digest;
pub use text_key::TextKey;
pub use waiting::{KeyReservation, OwnedKeyReservation};

type QuotaFor<K> = Box<dyn Fn(&K) -> Option<Quota> + Send + Sync>;

/// Rate limits per key: every key behaves exactly like its own [`Limiter`](crate::Limiter).
///
/// # Examples
///
/// ```
/// use paceline::{KeyedLimiter, Quota};
///
/// let per_ip = KeyedLimiter::new(Quota::per_second(2)).with_max_keys(100_000);
/// assert!(per_ip.check_key(&"10.0.0.1").is_ok());
/// assert!(per_ip.check_key(&"10.0.0.1").is_ok());
/// assert!(per_ip.check_key(&"10.0.0.1").is_err());
/// assert!(per_ip.check_key(&"10.0.0.2").is_ok()); // its own budget
/// assert_eq!(per_ip.len(), 2);
/// ```
pub struct KeyedLimiter<K: Hash + Eq + Clone, C: Clock = DefaultClock> {
    store: Store<K>,
    /// The default quota (keys without one of their own), changeable by `set_quota`.
    quota: QuotaCell,
    quota_for: Option<QuotaFor<K>>,
    clock: C,
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

impl<K: Hash + Eq + Clone, C: Clock> core::fmt::Debug for KeyedLimiter<K, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("quota", &Quota::from_params(self.quota.load()))
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
    /// let limiter = paceline::KeyedLimiter::<u64>::new(paceline::Quota::per_minute(10));
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
    /// use paceline::{clock::ManualClock, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::with_clock(Quota::per_second(1), ManualClock::new());
    /// assert!(limiter.check_key(&1u32).is_ok());
    /// assert!(limiter.check_key(&1u32).is_err());
    /// ```
    pub fn with_clock(quota: Quota, clock: C) -> KeyedLimiter<K, C> {
        // The fork handlers' first registration may wait out a fork in progress: here,
        // holding no lock, rather than in the first waiter's queue, made under the map's
        // lock (`clock/fork.rs`).
        crate::clock::forks();
        KeyedLimiter {
            store: Store::new(),
            quota: QuotaCell::new(quota),
            quota_for: None,
            clock,
            waiters: Mutex::new(Queues {
                map: HashMap::new(),
                cleaned_len: 0,
            }),
        }
    }

    /// Bounds the number of stored keys to about `max` (rounded up to a multiple of the
    /// shard count, at most a few hundred more). See the module docs for what happens at the
    /// bound: fully replenished keys are forgotten first; if none is, new keys are refused
    /// (denied with the time until a slot frees) rather than evicting a limited key. While
    /// full, the table also keeps a filter of its keys (about one byte per key of the
    /// bound), so that a flood of new keys is refused without slowing the stored ones.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::with_clock(Quota::per_hour(1), ManualClock::new())
    ///     .with_max_keys(1_000);
    /// let admitted = (0..100_000u32).filter(|k| limiter.check_key(k).is_ok()).count();
    /// assert!(admitted >= 1_000 && admitted <= 1_000 + 256);
    /// assert!(limiter.len() <= 1_000 + 256);
    /// ```
    pub fn with_max_keys(self, max: usize) -> KeyedLimiter<K, C> {
        self.set_max_keys(max);
        self
    }

    /// Changes the key bound of [`KeyedLimiter::with_max_keys`] while the limiter runs
    /// (through any handle: every clone of an `Arc` sees it). A smaller bound takes effect
    /// as keys are forgotten; nothing stored is evicted for it.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = std::sync::Arc::new(paceline::KeyedLimiter::<u32>::new(paceline::Quota::per_second(1)));
    /// limiter.set_max_keys(10_000);
    /// ```
    pub fn set_max_keys(&self, max: usize) {
        self.store.set_max_keys(max);
    }

    /// Gives some keys a quota of their own: `quota_for(key)` returns `Some(quota)` for
    /// those, `None` for the default. Called on every check of a key, so keep it cheap.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
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

    /// A limiter of the same quota, clock and key bound, empty, with `quota_for` (for the
    /// HTTP layer's `Limit::quota_for` on a limit already shared).
    #[cfg(feature = "tower")]
    pub(crate) fn remade_with_quota_for(
        &self,
        quota_for: impl Fn(&K) -> Option<Quota> + Send + Sync + 'static,
    ) -> KeyedLimiter<K, C> {
        let remade = KeyedLimiter::with_clock(self.quota(), self.clock.clone());
        remade.store.copy_bound(&self.store);
        remade.with_quota_for(quota_for)
    }

    #[inline]
    fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The limiter's time now (ns): the HTTP layer's metrics schedule their key-count
    /// reads by it.
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn clock_now(&self) -> u64 {
        self.now()
    }

    #[inline]
    fn params_for(&self, key: &K) -> Params {
        match &self.quota_for {
            Some(quota_for) => quota_for(key).map_or_else(|| self.quota.load(), |q| *q.params()),
            None => self.quota.load(),
        }
    }

    /// Runs `f` on `key`'s cell (stored first if new) and the time now; `Err` carries the
    /// wait until the key bound leaves room for it. The clock is read once the cell is
    /// found, so the read overlaps the likely cache miss on it.
    #[inline]
    fn with_word<Q: KeyRef<K> + ?Sized, R>(
        &self,
        key: &Q,
        f: impl FnOnce(&TatWord, u64) -> R,
    ) -> Result<R, u64> {
        self.store.with_word(key, || self.now(), f)
    }

    /// Runs `f` on `key`'s cell and the time now if the key is stored.
    fn with_stored_word<Q: KeyRef<K> + ?Sized, R>(
        &self,
        key: &Q,
        f: impl FnOnce(&TatWord, u64) -> R,
    ) -> Option<R> {
        self.store.with_stored_word(key, || self.now(), f)
    }

    /// Admits one cell for `key` now, or says how long until one would be admitted.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait. A new key refused by a full table (see
    /// [`KeyedLimiter::with_max_keys`]) also gets `NotUntil`, with the time until a slot
    /// frees, and [`NotUntil::is_table_full`] says so.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::KeyedLimiter::new(paceline::Quota::per_hour(1));
    /// assert!(limiter.check_key(&"alice").is_ok());
    /// assert!(limiter.check_key(&"alice").unwrap_err().wait_time().as_secs() > 3500);
    /// ```
    #[inline]
    pub fn check_key(&self, key: &K) -> Result<(), NotUntil> {
        self.acquire_one(key).map(drop)
    }

    /// [`check_key`](Self::check_key) answering a refusal with the key's state just then
    /// (what a 429's fields tell), worked out from the refusal with no second look-up.
    #[cfg(feature = "tower")]
    pub(crate) fn check_key_or_state(&self, key: &K) -> Result<(), crate::snapshot::OneRefused> {
        use crate::snapshot::OneRefused;
        // The whole quota, read once: a refusal describes it (one load more than a check).
        let params = self.params_for(key);
        let (cost, room) = (params.interval(), params.room_for_one());
        match self.with_word(key, |word, now| word.spend(now, cost, room)) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(wait)) => Err(OneRefused::spent(params, wait)),
            Err(wait) => Err(OneRefused::no_slot(params, wait)),
        }
    }

    /// One cell for `key`: the TAT its admission left and its cost, or the refusal (the
    /// key's wait, or the key bound's).
    #[inline]
    fn acquire_one(&self, key: &K) -> Result<(u64, u64), NotUntil> {
        let (cost, room) = self.one_cell(key);
        match self.with_word(key, |word, now| word.spend(now, cost, room)) {
            Ok(Ok(tat)) => Ok((tat, cost)),
            Ok(Err(wait)) => Err(NotUntil::from_nanos(wait)),
            Err(wait) => Err(NotUntil::no_room(wait)),
        }
    }

    /// What one cell for `key` costs, and how far its TAT may be ahead of now for the cell
    /// to fit (`tau - interval`, the room the shared quota stores).
    #[inline]
    fn one_cell(&self, key: &K) -> (u64, u64) {
        match &self.quota_for {
            None => self.quota.load_one_cell(),
            Some(_) => {
                let params = self.params_for(key);
                (params.interval(), params.room_for_one())
            }
        }
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
    /// use paceline::{Denied, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(5));
    /// assert!(limiter.check_key_n(&7, 5).is_ok());
    /// assert!(matches!(limiter.check_key_n(&7, 6), Err(Denied::InsufficientCapacity(_))));
    /// ```
    pub fn check_key_n(&self, key: &K, n: u32) -> Result<(), Denied> {
        self.check_n_by(key, self.params_for(key), n)
    }

    /// [`KeyedLimiter::check_key_n`] for the key `key` names, under `params`.
    fn check_n_by<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        params: Params,
        n: u32,
    ) -> Result<(), Denied> {
        self.check_n_by_at(key, params, n, || self.now())
    }

    /// [`KeyedLimiter::check_n_by`] at the time `now` reads.
    fn check_n_by_at<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        params: Params,
        n: u32,
        now: impl Fn() -> u64,
    ) -> Result<(), Denied> {
        let cost = error::cost(&params, n)?;
        if cost == 0 {
            return Ok(());
        }
        let checked = self
            .store
            .with_word(key, now, |cell, now| cell.acquire(now, cost, params.tau()));
        match checked {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(wait)) => Err(NotUntil::from_nanos(wait).into()),
            Err(wait) => Err(NotUntil::no_room(wait).into()),
        }
    }

    /// How many cells `check_key_n` would admit for `key` right now; spends nothing and
    /// stores nothing. An unknown key has its whole burst, unless the key bound would
    /// refuse to store it now (then 0, as its check would be refused).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_hour(10));
    /// limiter.check_key_n(&"alice", 4).unwrap();
    /// assert_eq!(limiter.remaining_key(&"alice"), 6);
    /// assert_eq!(limiter.remaining_key(&"bob"), 10);
    /// assert_eq!(limiter.len(), 1);
    /// ```
    pub fn remaining_key(&self, key: &K) -> u32 {
        let params = self.params_for(key);
        self.with_stored_word(key, |cell, now| gcra::remaining(cell.tat(), now, &params))
            .unwrap_or_else(|| {
                let now = self.now();
                self.store
                    .vacancy(key, now)
                    .map_or(0, |tat| gcra::remaining(tat, now, &params))
            })
    }

    /// `key`'s state now, from one reading (see [`Snapshot`]); stores nothing. An unknown
    /// key has its whole burst, unless the key bound would refuse to store it now (then
    /// nothing, until the wait its check would be told).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_minute(60));
    /// limiter.check_key_n(&"alice", 60).unwrap();
    /// let state = limiter.snapshot_key(&"alice");
    /// assert_eq!((state.burst(), state.remaining()), (60, 0));
    /// assert!(state.until_next().as_millis() > 900);
    /// assert_eq!(limiter.snapshot_key(&"bob").remaining(), 60);
    /// ```
    pub fn snapshot_key(&self, key: &K) -> Snapshot {
        let params = self.params_for(key);
        self.with_stored_word(key, |cell, now| Snapshot::of(params, cell.tat(), now))
            .unwrap_or_else(|| {
                let now = self.now();
                match self.store.vacancy(key, now) {
                    Ok(tat) => Snapshot::of(params, tat, now),
                    Err(wait) => Snapshot::refused(params, wait),
                }
            })
    }

    /// Whether `key` is stored, or the key bound leaves room to store it now; stores
    /// nothing. False exactly when a check of `key` now would be refused as by a full table
    /// ([`NotUntil::is_table_full`]), whatever its quota.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_hour(1)).with_max_keys(1);
    /// // New keys until the bound (about 1, per shard) refuses one as full.
    /// let full = (0u32..)
    ///     .find(|k| limiter.check_key(k).is_err_and(|e| e.is_table_full()))
    ///     .unwrap();
    /// assert!(limiter.has_room_for(&0) && !limiter.has_room_for(&full));
    /// ```
    pub fn has_room_for(&self, key: &K) -> bool {
        self.with_stored_word(key, |_, _| ()).is_some()
            || self.store.vacancy(key, self.now()).is_ok()
    }

    /// How long from now until `n` cells would be admitted for `key` (zero if they would
    /// be now); books, spends and stores nothing (the keyed twin of
    /// [`Limiter::peek_n`](crate::Limiter::peek_n)). For a new key at a full key table,
    /// the time until a slot frees.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::with_clock(Quota::per_second(10), ManualClock::new());
    /// limiter.check_key_n(&"a", 10).unwrap();
    /// assert_eq!(limiter.peek_key_n(&"a", 3).unwrap(), Duration::from_millis(300));
    /// assert_eq!(limiter.peek_key_n(&"b", 3).unwrap(), Duration::ZERO);
    /// ```
    pub fn peek_key_n(&self, key: &K, n: u32) -> Result<Duration, InsufficientCapacity> {
        self.peek_n_by(key, self.params_for(key), n)
    }

    /// [`KeyedLimiter::peek_key_n`] for the key `key` names, under `params`.
    fn peek_n_by<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        params: Params,
        n: u32,
    ) -> Result<Duration, InsufficientCapacity> {
        let cost = match error::cost(&params, n) {
            Ok(cost) => cost,
            Err(Denied::InsufficientCapacity(e)) => return Err(e),
            Err(Denied::NotUntil(e)) => return Ok(e.wait_time()),
        };
        let wait = |tat, now| gcra::admit(tat, now, cost, params.tau()).map_or_else(|w| w, |_| 0);
        let nanos = self
            .with_stored_word(key, |cell, now| wait(cell.tat(), now))
            .unwrap_or_else(|| {
                let now = self.now();
                self.store
                    .vacancy(key, now)
                    .map_or_else(|room| room, |tat| wait(tat, now))
            });
        Ok(Duration::from_nanos(nanos))
    }

    /// The default quota: every key's without one of its own
    /// ([`KeyedLimiter::with_quota_for`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u32>::new(Quota::per_second(4));
    /// assert_eq!(limiter.quota(), Quota::per_second(4));
    /// ```
    pub fn quota(&self) -> Quota {
        Quota::from_params(self.quota.load())
    }

    /// Changes the default quota (the one of keys without a quota of their own) while the
    /// limiter runs, with the same meaning as [`Limiter::set_quota`](crate::Limiter::set_quota):
    /// every key's spent backlog carries over, its booked waiters keep their order.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::with_clock(Quota::per_second(1), ManualClock::new());
    /// limiter.check_key(&7).unwrap();
    /// assert!(limiter.check_key(&7).is_err());
    /// limiter.set_quota(Quota::per_second(1).with_burst(3));
    /// assert!(limiter.check_key_n(&7, 2).is_ok());
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.quota.store(quota);
        let queues: Vec<_> = {
            let queues = crate::clock::gate::lock(&self.waiters);
            queues
                .map
                .iter()
                .filter(|(key, _)| self.quota_for.as_ref().is_none_or(|f| f(key).is_none()))
                .map(|(_, queue)| Arc::clone(queue))
                .collect()
        };
        let now = self.now();
        for queue in queues {
            let arm = queue.requote(quota.params(), now);
            queue.schedule(arm);
        }
    }

    /// How many keys are stored now.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::KeyedLimiter::new(paceline::Quota::per_second(1));
    /// limiter.check_key(&1).unwrap();
    /// limiter.check_key(&2).unwrap();
    /// assert_eq!(limiter.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no key is stored.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(paceline::KeyedLimiter::<u8>::new(paceline::Quota::per_second(1)).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Forgets every key that is indistinguishable from a new one (fully replenished), and
    /// the queues of keys nobody waits on. Changes no decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, KeyedLimiter, Quota};
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
        self.store.retain_recent(self.now());
        crate::clock::gate::lock(&self.waiters).clean();
    }
}
