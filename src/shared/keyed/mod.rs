//! [`SharedKeyedLimiter`]: a quota per key for every process that opens the same file.
//!
//! # Implementation notes
//!
//! A key's digest (`digest.rs`) picks its bucket (by its high half) and its home slot in
//! the bucket (by the low bits of its other half). A key lives in its bucket only, in the
//! first slot from its home on (wrapping within the bucket) that was free when it was
//! stored, so a check finds a stored key in a slot or two: it scans from the home slot,
//! lock-free. A key not found is stored under its bucket's lock (`bucket.rs`), which the
//! claimer takes, repairs if it inherited it from a dead claimer, and scans again; the key
//! takes the first slot from its home on that is empty or holds a key that has refilled (a
//! key indistinguishable from a new one). A bucket whose every slot holds a limited key
//! refuses the new key ([`NotUntil::is_table_full`]) with the time until one frees. A
//! header word counts the slots that hold a key (what `len` reads).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

mod admission;
pub(crate) mod bucket;
mod paired;
mod slots;
mod waiting;

pub use waiting::OwnedSharedKeyReservation;

use super::digest::Digester;
use super::error::SharedError;
use super::layout::{self, Kind, BUCKET_SLOTS};
use super::limiter::Shared;
use super::options::{OnMismatch, OpenOptions};
use super::table::{Claiming, Key, Moved};
use crate::clock::{Clock, HostClock};
use crate::error::{self, Denied, NotUntil};
use crate::quota::Quota;
use crate::sync::{Mutex, Ordering};
use crate::wait::queue::Waiters;
use bucket::BucketLock;

/// Why one cell was not admitted: the key's cell is spent (the wait until it refills
/// enough), or no slot could take the new key (the wait until one frees).
enum Refusal {
    Spent(u64),
    NoSlot(u64),
}

impl From<Refusal> for NotUntil {
    fn from(refusal: Refusal) -> NotUntil {
        match refusal {
            Refusal::Spent(wait) => NotUntil::from_nanos(wait),
            Refusal::NoSlot(wait) => NotUntil::no_room(wait),
        }
    }
}

/// Rate limits per key for every process that opens the same file: each key behaves as
/// its own [`SharedLimiter`](super::SharedLimiter), in a table made for `capacity` keys
/// when the file is made (64 bytes per key of capacity; see [`SharedKeyedLimiter::open`]).
///
/// Keys are bytes (`&str`, `String`, `&[u8]`, ...), so a Python process and a Rust one
/// find the same key in the same slot. A key whose quota has refilled is
/// indistinguishable from a new one, and its slot goes to the next new key that needs it.
/// The table stores at least `capacity` keys still limited before it refuses a new one;
/// a new key it has no room for is refused with [`NotUntil::is_table_full`] and the time
/// until room is expected, never by evicting a limited key, and never reported as a spent
/// quota. Checks of stored keys are lock-free; storing a new key takes its bucket's lock
/// for a moment, waiting for another process at most
/// [`CLAIM_PATIENCE`](super::CLAIM_PATIENCE).
///
/// # Examples
///
/// ```
/// use paceline::shared::SharedKeyedLimiter;
/// use paceline::Quota;
///
/// # let path = std::env::temp_dir().join(format!("paceline-doc-k1-{}", std::process::id()));
/// // Every worker: 10 per second per client, 100 000 clients at least.
/// let per_client = SharedKeyedLimiter::open(&path, Quota::per_second(10), 100_000)?;
/// assert!(per_client.check_key("203.0.113.7").is_ok());
/// assert_eq!(per_client.remaining_key("203.0.113.7"), 9);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SharedKeyedLimiter {
    shared: Arc<Shared>,
    /// The keys the file was made for.
    capacity: u64,
    /// Its buckets (checked against its length at open).
    buckets: u64,
    digester: Digester,
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

impl SharedKeyedLimiter {
    /// Opens the keyed limiter at `path`, made for `capacity` keys, making the file if it
    /// does not exist (readable and writable by its owner only; an existing file is
    /// opened only if this process's user owns it and no one else can write it).
    ///
    /// The table stores at least `capacity` keys that are still limited (keys whose quota
    /// has refilled make room for new ones); its file takes 64 bytes per key of capacity
    /// (two 32-byte slots, so that each bucket stays at most half full), plus a header of
    /// 512 bytes and 8 bytes per 64 keys.
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

    /// [`SharedKeyedLimiter::open`] with [`OpenOptions`] (or just an [`OnMismatch`]):
    /// [`OnMismatch::Adopt`] takes the file's quota and capacity; `Replace` sets the
    /// caller's quota, and the capacity must match.
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
        options: impl Into<OpenOptions>,
    ) -> Result<SharedKeyedLimiter, SharedError> {
        if capacity == 0 || capacity > layout::MAX_CAPACITY {
            return Err(SharedError::Capacity { asked: capacity });
        }
        let options = options.into();
        let shared = Shared::open(path.as_ref(), Kind::Keyed { capacity }, quota, &options)?;
        let capacity = shared.capacity();
        let read = |at| shared.map.word(at).load(Ordering::Relaxed);
        let digester = Digester::new(core::array::from_fn(|i| read(layout::SEEDS_AT + 8 * i)));
        Ok(SharedKeyedLimiter {
            clock: shared.clock.clone(),
            buckets: layout::buckets(capacity),
            shared: Arc::new(shared),
            capacity,
            digester,
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
            capacity: self.capacity,
            buckets: self.buckets,
            digester: self.digester,
            lane: 1,
            clock: self.clock.clone(),
            waiters: Mutex::new(HashMap::new()),
        }
    }

    /// The keys the file was made for (fixed when it was made): the table stores at least
    /// that many keys still limited.
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

    /// Whether the file's path still leads to the file this process has open
    /// ([`SharedLimiter::is_current`](super::SharedLimiter::is_current)).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kcur-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(10), 64)?;
    /// assert!(limiter.is_current());
    /// std::fs::remove_file(&path)?;
    /// assert!(!limiter.is_current());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_current(&self) -> bool {
        self.shared.is_current()
    }

    /// The file's path, absolute (as it was when this process opened the file).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kp-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(1), 64)?;
    /// assert_eq!(limiter.path(), std::path::absolute(&path)?);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn path(&self) -> &Path {
        self.shared.map.path()
    }

    /// The name of the limit the file holds ([`OpenOptions::name`]; empty if it has none).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::{OpenOptions, SharedKeyedLimiter}, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kn-{}", std::process::id()));
    /// let options = OpenOptions::new().name("per-ip");
    /// let limiter = SharedKeyedLimiter::open_with(&path, Quota::per_second(1), 64, options)?;
    /// assert_eq!(limiter.name(), "per-ip");
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> String {
        self.shared.map.name()
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
        let queues: Vec<_> = crate::clock::gate::lock(&self.waiters)
            .values()
            .cloned()
            .collect();
        for queue in queues {
            let arm = queue.requote(quota.params(), now);
            queue.schedule(arm);
        }
        Ok(())
    }

    /// Forgets what `key` spent and any hold on it, for every process (as
    /// [`SharedLimiter::reset`](super::SharedLimiter::reset) for one key): an operator's
    /// action, the one exception to "spent is spent".
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kreset-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(1), 64)?;
    /// limiter.check_key("a")?;
    /// limiter.reset_key("a");
    /// assert!(limiter.check_key("a").is_ok());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset_key(&self, key: impl AsRef<[u8]>) {
        let key = self.key(key.as_ref());
        // A key that is not stored has nothing spent to forget (and nobody waiting here).
        while let Some(slot) = self.find(key) {
            let waiters = self.waiters_of(key);
            let word = crate::cell::TatWord::in_place(slot.words[self.lane]);
            match waiters.reset(word, &|| slot.holds(key), self.clock.now()) {
                Some(arm) => return waiters.schedule(arm),
                // The slot became another key's meanwhile: look again.
                None => continue,
            }
        }
    }

    /// Admits one cell of `key` now, or says how long until one would be.
    /// [`KeyedLimiter::check_key`](crate::KeyedLimiter::check_key) across processes.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait; for a new key the table has no room for,
    /// [`NotUntil::is_table_full`] says so and the wait is until room is expected.
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
    #[inline]
    pub fn check_key(&self, key: impl AsRef<[u8]>) -> Result<(), NotUntil> {
        self.spend_one(self.key(key.as_ref()))
            .map(drop)
            .map_err(NotUntil::from)
    }

    /// Admits `n` cells of `key` at once, or none.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when they fit the burst but not now (or the table has no room
    /// for a new key: [`NotUntil::is_table_full`]); [`Denied::InsufficientCapacity`] when
    /// `n` exceeds the burst.
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
        let room = params.tau().saturating_sub(cost);
        match self.with_slot(key, now, |slot| slot.spend(key, self.lane, now, cost, room)) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(wait)) => Err(NotUntil::from_nanos(wait).into()),
            Err(wait) => Err(NotUntil::no_room(wait).into()),
        }
    }

    /// [`SharedKeyedLimiter::check_key_n`] for a key already stored; `None` (nothing
    /// checked) for one that is not. A stored key's check never waits on another process,
    /// while storing a new one may, for at most [`CLAIM_PATIENCE`](super::CLAIM_PATIENCE): for a caller that must
    /// let go of a lock of its own around that (an interpreter's, say).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kifs-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(10), 64)?;
    /// assert!(limiter.check_key_n_if_stored("a", 1).is_none());
    /// limiter.check_key_n("a", 1)?; // stores it
    /// assert!(matches!(limiter.check_key_n_if_stored("a", 1), Some(Ok(()))));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key_n_if_stored(
        &self,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Option<Result<(), Denied>> {
        let params = self.params();
        let cost = match error::cost(&params, n) {
            Ok(0) => return Some(Ok(())),
            Ok(cost) => cost,
            Err(denied) => return Some(Err(denied)),
        };
        let key = self.key(key.as_ref());
        let now = self.clock.now();
        let room = params.tau().saturating_sub(cost);
        loop {
            let slot = self.find(key)?;
            match slot.spend(key, self.lane, now, cost, room) {
                Ok(Ok(_)) => return Some(Ok(())),
                Ok(Err(wait)) => return Some(Err(NotUntil::from_nanos(wait).into())),
                Err(Moved) => continue,
            }
        }
    }

    /// One cell of `key`: the TAT its admission left and its cost, or why not.
    #[inline]
    fn spend_one(&self, key: Key) -> Result<(u64, u64), Refusal> {
        let (cost, room) = self.shared.quota.one_cell();
        let now = self.clock.now();
        match self.with_slot(key, now, |slot| slot.spend(key, self.lane, now, cost, room)) {
            Ok(Ok(tat)) => Ok((tat, cost)),
            Ok(Err(wait)) => Err(Refusal::Spent(wait)),
            Err(wait) => Err(Refusal::NoSlot(wait)),
        }
    }

    /// How many keys are stored, in every process: keys still limited, and keys that have
    /// refilled whose slots no new key has taken yet ([`SharedKeyedLimiter::retain_recent`]
    /// forgets those), as the in-process [`KeyedLimiter::len`](crate::KeyedLimiter::len)
    /// counts. One read of a count the claims keep (constant time, for a metrics gauge on
    /// the request path); a process killed in the middle of storing a key can leave it off
    /// by one.
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
        // Relaxed: a count read alone.
        let stored = self
            .shared
            .map
            .word(layout::STORED_AT)
            .load(Ordering::Relaxed);
        usize::try_from(stored.min(self.buckets * BUCKET_SLOTS)).unwrap_or(usize::MAX)
    }

    /// Whether no key is stored.
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

    /// Forgets every stored key that has refilled (indistinguishable from a new one), in
    /// every bucket: [`KeyedLimiter::retain_recent`](crate::KeyedLimiter::retain_recent)
    /// for the file. It visits the whole table (call it off the request path; checks never
    /// need it: a new key's claim sweeps its own bucket), and skips a bucket whose lock
    /// another process holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kr-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(1000), 64)?;
    /// limiter.check_key("a")?;
    /// std::thread::sleep(Duration::from_millis(5));
    /// limiter.retain_recent();
    /// assert_eq!(limiter.len(), 0);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retain_recent(&self) {
        let token = Claiming(());
        for bucket in 0..self.buckets {
            let word = self.shared.map.word(layout::bucket_lock(bucket));
            let Some(_held) = BucketLock(word).try_take() else {
                continue;
            };
            let now = self.clock.now();
            let slot = |i| self.slot(bucket * BUCKET_SLOTS + i);
            let swept = (0..BUCKET_SLOTS)
                .filter(|&i| slot(i).sweep(now, &token))
                .count() as u64;
            self.unstore(swept);
            // The keys left may sit nearer their homes than the reach says: recount it
            // (no claim runs meanwhile: the lock is held). A key's home is its low half's
            // low bits.
            let home = |i: u64| slot(i).low.load(Ordering::Relaxed) & (BUCKET_SLOTS - 1);
            let reach = (0..BUCKET_SLOTS)
                .filter(|&i| !slot(i).is_empty())
                .map(|i| (i.wrapping_sub(home(i)) & (BUCKET_SLOTS - 1)) + 1)
                .max()
                .unwrap_or(0);
            // Release: as in `claim_locked`.
            self.shared
                .map
                .word(layout::bucket_reach(bucket))
                .store(reach, Ordering::Release);
        }
    }
}
