//! [`SharedKeyedLimiter`]: a quota per key for every process that opens the same file.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use siphasher::sip128::SipHasher13;

mod admission;
mod waiting;

pub use waiting::OwnedSharedKeyReservation;

use super::error::SharedError;
use super::file::{self, Flock};
use super::layout::{self, Kind};
use super::limiter::Shared;
use super::table::{Claiming, Key, Moved, Slot};
use super::OnMismatch;
use crate::clock::{Clock, HostClock};
use crate::error::{self, Denied, NotUntil};
use crate::gcra::Params;
use crate::quota::Quota;
use crate::sync::{Mutex, Ordering};
use crate::wait::queue::Waiters;

/// Why one cell was not admitted: the key's cell is spent (the wait until it refills
/// enough), or no slot could take the new key (the wait until one frees).
enum Refusal {
    Spent(u64),
    NoSlot(u64),
}

impl From<Refusal> for u64 {
    fn from(refusal: Refusal) -> u64 {
        match refusal {
            Refusal::Spent(wait) | Refusal::NoSlot(wait) => wait,
        }
    }
}

/// How many slots a key may sit in, from its home slot on.
const WINDOW: u64 = 16;

/// Rate limits per key for every process that opens the same file: each key behaves as
/// its own [`SharedLimiter`](super::SharedLimiter), in a table of `capacity` key slots
/// fixed when the file is made (32 bytes each).
///
/// Keys are bytes (`&str`, `String`, `&[u8]`, ...), so a Python process and a Rust one
/// find the same key in the same slot. A key whose quota has refilled is
/// indistinguishable from a new one, and its slot is taken by the next new key that
/// needs it; a new key that finds every slot it may use held by keys still limited is
/// refused (denied with the time until one frees), never by evicting a limited key,
/// exactly as an in-process [`KeyedLimiter`](crate::KeyedLimiter) at its bound. Checks of
/// stored keys are lock-free; storing a new key takes the file's claim lock for a moment
/// (a `flock` the system lets go of when its holder dies).
///
/// # Examples
///
/// ```
/// use paceline::shared::SharedKeyedLimiter;
/// use paceline::Quota;
///
/// # let path = std::env::temp_dir().join(format!("paceline-doc-k1-{}", std::process::id()));
/// // Every worker: 10 per second per client, 100 000 clients at most.
/// let per_client = SharedKeyedLimiter::open(&path, Quota::per_second(10), 100_000)?;
/// assert!(per_client.check_key("203.0.113.7").is_ok());
/// assert_eq!(per_client.remaining_key("203.0.113.7"), 9);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SharedKeyedLimiter {
    shared: Arc<Shared>,
    claims: Arc<Mutex<ClaimLock>>,
    capacity: u64,
    hasher: SipHasher13,
    /// Which of a slot's two words this limiter uses (see `execution_lane`).
    lane: usize,
    clock: HostClock,
    /// This process's waiters, per key.
    waiters: Mutex<HashMap<Key, Arc<Waiters<HostClock>>>>,
}

impl core::fmt::Debug for SharedKeyedLimiter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedKeyedLimiter")
            .field("path", &self.shared.map.path())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// The claim lock's file: its own open file description, so that its `flock` excludes
/// every other opener, in this process or another. A forked child shares its parent's
/// description, so it opens the file again.
#[derive(Debug)]
struct ClaimLock {
    file: File,
    /// The fork generation `file` was opened in.
    generation: u64,
}

impl SharedKeyedLimiter {
    /// Opens the keyed limiter at `path` with `capacity` key slots, making the file if it
    /// does not exist (readable and writable by its owner only).
    ///
    /// # Errors
    ///
    /// [`SharedError::Capacity`] for a capacity of 0 or above
    /// [`MAX_CAPACITY`](super::MAX_CAPACITY); [`SharedError::QuotaMismatch`] or
    /// [`SharedError::CapacityMismatch`] when the file holds others (see
    /// [`SharedKeyedLimiter::open_with`]); otherwise a [`SharedError`] saying what is wrong
    /// with the path or the file.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k2-{}", std::process::id()));
    /// let a = SharedKeyedLimiter::open(&path, Quota::per_second(1), 1024)?;
    /// let b = SharedKeyedLimiter::open(&path, Quota::per_second(1), 1024)?; // another process
    /// assert!(a.check_key("k").is_ok());
    /// assert!(b.check_key("k").is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(
        path: impl AsRef<Path>,
        quota: Quota,
        capacity: u64,
    ) -> Result<SharedKeyedLimiter, SharedError> {
        SharedKeyedLimiter::open_with(path, quota, capacity, OnMismatch::Refuse)
    }

    /// [`SharedKeyedLimiter::open`], saying what to do when the file holds another quota
    /// or capacity ([`OnMismatch::Adopt`] takes both of the file's; `Replace` sets the
    /// caller's quota, and the capacity must match).
    ///
    /// # Errors
    ///
    /// As [`SharedKeyedLimiter::open`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::{OnMismatch, SharedKeyedLimiter}, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k3-{}", std::process::id()));
    /// let made = SharedKeyedLimiter::open(&path, Quota::per_second(5), 64)?;
    /// let other = SharedKeyedLimiter::open_with(&path, Quota::per_second(1), 10, OnMismatch::Adopt)?;
    /// assert_eq!((other.quota(), other.capacity()), (Quota::per_second(5), 64));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_with(
        path: impl AsRef<Path>,
        quota: Quota,
        capacity: u64,
        on_mismatch: OnMismatch,
    ) -> Result<SharedKeyedLimiter, SharedError> {
        if capacity == 0 || capacity > layout::MAX_CAPACITY {
            return Err(SharedError::Capacity { asked: capacity });
        }
        let path = path.as_ref();
        let shared = Shared::open(path, Kind::Keyed { capacity }, quota, on_mismatch)?;
        let capacity = shared.capacity();
        let read = |at| shared.map.word(at).load(Ordering::Relaxed);
        let hasher = SipHasher13::new_with_keys(read(layout::SEEDS_AT), read(layout::SEEDS_AT + 8));
        let file = shared
            .file
            .try_clone()
            .map_err(|e| file::io_error(path, "keep the file open", e))?;
        // `try_clone` shares the description with `shared.file`, which nothing else
        // locks; each opener's `flock` description is its own `open`'s.
        let claims = ClaimLock {
            file,
            generation: crate::clock::forks(),
        };
        Ok(SharedKeyedLimiter {
            clock: shared.clock.clone(),
            shared: Arc::new(shared),
            claims: Arc::new(Mutex::new(claims)),
            capacity,
            hasher,
            lane: 0,
            waiters: Mutex::new(HashMap::new()),
        })
    }

    /// The same keys' second words: a second limiter per key, of the same quota, for the
    /// bound when the work runs (as [`SharedLimiter::execution_lane`](super::SharedLimiter::execution_lane)).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k4-{}", std::process::id()));
    /// let booked = SharedKeyedLimiter::open(&path, Quota::per_second(1), 64)?;
    /// let running = booked.execution_lane();
    /// assert!(booked.check_key("k").is_ok() && running.check_key("k").is_ok());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execution_lane(&self) -> SharedKeyedLimiter {
        SharedKeyedLimiter {
            shared: Arc::clone(&self.shared),
            claims: Arc::clone(&self.claims),
            capacity: self.capacity,
            hasher: self.hasher,
            lane: 1,
            clock: self.clock.clone(),
            waiters: Mutex::new(HashMap::new()),
        }
    }

    /// The number of key slots (fixed when the file was made).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k5-{}", std::process::id()));
    /// assert_eq!(SharedKeyedLimiter::open(&path, Quota::per_second(1), 64)?.capacity(), 64);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The quota every key has, as every process sees it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k6-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_minute(3), 64)?;
    /// assert_eq!(limiter.quota(), Quota::per_minute(3));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quota(&self) -> Quota {
        Quota::from_params(self.params())
    }

    /// Changes every key's quota for every process, keeping what each key spent.
    ///
    /// # Errors
    ///
    /// [`SharedError::QuotaSlots`] in a file where eight changes died half-way.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k7-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(1), 64)?;
    /// limiter.set_quota(Quota::per_second(2))?;
    /// assert_eq!(limiter.quota(), Quota::per_second(2));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quota(&self, quota: Quota) -> Result<(), SharedError> {
        self.shared.quota.set(quota)?;
        let now = self.clock.now();
        let queues: Vec<_> = self.waiters.lock().values().cloned().collect();
        for queue in queues {
            let arm = queue.requote(quota.params(), now);
            queue.schedule(arm);
        }
        Ok(())
    }

    #[inline]
    fn params(&self) -> Params {
        self.shared.quota.load()
    }

    fn key(&self, key: &[u8]) -> Key {
        let digest = self.hasher.hash(key);
        Key::from_digest(digest.h1, digest.h2)
    }

    fn slot(&self, index: u64) -> Slot<'_> {
        let map = &self.shared.map;
        Slot {
            tag: map.word(layout::key_field(index, 0)),
            low: map.word(layout::key_field(index, 1)),
            words: [
                map.word(layout::key_field(index, 2)),
                map.word(layout::key_field(index, 3)),
            ],
        }
    }

    /// The slots `key` may sit in, from its home slot on.
    fn window(&self, key: Key) -> impl Iterator<Item = Slot<'_>> + '_ {
        let home = ((u128::from(key.low) * u128::from(self.capacity)) >> 64) as u64;
        (0..WINDOW.min(self.capacity)).map(move |i| self.slot((home + i) % self.capacity))
    }

    fn find(&self, key: Key) -> Option<Slot<'_>> {
        self.window(key).find(|slot| slot.holds(key))
    }

    /// Runs `f` on `key`'s slot, claiming one if the key is not stored; `Err` with the time
    /// until a slot frees when every slot it may use holds a limited key.
    fn with_slot<R>(
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
            // Not stored. A table with no slot to take refuses without the lock.
            if !self.window(key).any(|slot| slot.claimable(now)) {
                return Err(self.room_wait(key, now));
            }
            let slot = self.claim(key, now)?;
            if let Ok(r) = f(slot) {
                return Ok(r);
            }
        }
    }

    /// Claims a slot for `key` under the claim lock (or finds it already claimed).
    fn claim(&self, key: Key, now: u64) -> Result<Slot<'_>, u64> {
        self.with_claim_lock(key, now, |token| self.claim_locked(key, now, token))
    }

    /// [`SharedKeyedLimiter::claim`] with the lock held.
    fn claim_locked(&self, key: Key, now: u64, token: &Claiming) -> Result<Slot<'_>, u64> {
        if let Some(slot) = self.find(key) {
            return Ok(slot);
        }
        self.window(key)
            .find(|slot| slot.claim(key, now, token))
            .ok_or_else(|| self.room_wait(key, now))
    }

    /// Runs `f` holding the file's claim lock: this process's mutex, then the `flock`
    /// (reopening the file first in a forked child, whose description is its parent's).
    /// If the system refuses the lock, `Err` with the wait a full table would give.
    fn with_claim_lock<R>(
        &self,
        key: Key,
        now: u64,
        f: impl FnOnce(&Claiming) -> Result<R, u64>,
    ) -> Result<R, u64> {
        let mut claims = self.claims.lock();
        if claims.generation != crate::clock::forks() {
            if let Ok(file) = File::options()
                .read(true)
                .write(true)
                .open(self.shared.map.path())
            {
                claims.file = file;
            }
            claims.generation = crate::clock::forks();
        }
        let Ok(_flock) = Flock::exclusive(&claims.file, self.shared.map.path()) else {
            return Err(self.room_wait(key, now));
        };
        f(&Claiming(()))
    }

    /// Nanoseconds until a slot `key` may use frees (at least 1).
    fn room_wait(&self, key: Key, now: u64) -> u64 {
        self.window(key)
            .map(|slot| slot.free_at().saturating_sub(now))
            .min()
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Admits one cell of `key` now, or says how long until one would be.
    /// [`KeyedLimiter::check_key`](crate::KeyedLimiter::check_key) across processes.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait (for a new key at a full table: until a slot frees).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k8-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(1), 64)?;
    /// assert!(limiter.check_key("a").is_ok());
    /// assert!(limiter.check_key("a").is_err());
    /// assert!(limiter.check_key(b"b").is_ok()); // its own budget
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key(&self, key: impl AsRef<[u8]>) -> Result<(), NotUntil> {
        self.check_key_n(key, 1).map_err(|denied| match denied {
            Denied::NotUntil(e) => e,
            Denied::InsufficientCapacity(_) => unreachable!("one cell fits every burst"),
        })
    }

    /// Admits `n` cells of `key` at once, or none.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when they fit the burst but not now (or no slot is free);
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k9-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(10), 64)?;
    /// assert!(limiter.check_key_n("a", 10).is_ok());
    /// assert!(limiter.check_key_n("a", 11).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key_n(&self, key: impl AsRef<[u8]>, n: u32) -> Result<(), Denied> {
        let params = self.params();
        let cost = error::cost(&params, n)?;
        if cost == 0 {
            return Ok(());
        }
        let key = self.key(key.as_ref());
        let now = self.clock.now();
        let room = params.tau() - cost;
        match self.with_slot(key, now, |slot| slot.spend(key, self.lane, now, cost, room)) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(wait)) | Err(wait) => Err(NotUntil::from_nanos(wait).into()),
        }
    }

    /// One cell of `key`: the TAT its admission left and its cost, or why not.
    fn spend_one(&self, key: Key) -> Result<(u64, u64), Refusal> {
        let params = self.params();
        let cost = params.interval();
        let room = params.room_for_one();
        let now = self.clock.now();
        match self.with_slot(key, now, |slot| slot.spend(key, self.lane, now, cost, room)) {
            Ok(Ok(tat)) => Ok((tat, cost)),
            Ok(Err(wait)) => Err(Refusal::Spent(wait)),
            Err(wait) => Err(Refusal::NoSlot(wait)),
        }
    }

    /// How many keys are stored and not yet refilled (indistinguishable from new), in
    /// every process; counts the whole table.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kc-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(1), 64)?;
    /// limiter.check_key("a")?;
    /// limiter.check_key("b")?;
    /// assert_eq!(limiter.len(), 2);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        let now = self.clock.now();
        (0..self.capacity)
            .map(|i| self.slot(i))
            .filter(|slot| !slot.claimable(now))
            .count()
    }

    /// Whether no key is stored and limited.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kd-{}", std::process::id()));
    /// assert!(SharedKeyedLimiter::open(&path, Quota::per_hour(1), 64)?.is_empty());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
