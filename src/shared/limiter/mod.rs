//! [`SharedLimiter`]: one quota for every process that opens the same file. Opening, the
//! checks and the quota live here; its waits, reservations and holds in `waiting.rs`, as
//! the in-process limiter's do.

use core::ptr::NonNull;
use core::time::Duration;
use std::path::Path;
use std::sync::Arc;

use super::error::SharedError;
use super::file::{self, Mapping, Want};
use super::layout::{self, Kind};
use super::options::{OnMismatch, OpenOptions};
use super::quota::{self, Area, FileQuota};
use crate::cell::{TatWord, ALWAYS_OURS};
use crate::clock::{Clock, HostClock};
use crate::error::{self, Denied, InsufficientCapacity, NotUntil};
use crate::gcra::{self, Params};
use crate::quota::Quota;
use crate::snapshot::Snapshot;
use crate::sync::AtomicU64;
use crate::wait::queue::Waiters;

mod waiting;

/// What the limiters of one opened file share: the mapping and its quota.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) map: Mapping,
    pub(super) quota: FileQuota,
    pub(super) clock: HostClock,
    /// What the file holds, as checked against its length when it was opened (never read
    /// from the header again: see `file.rs`).
    pub(super) kind: Kind,
    /// The file's device and inode when it was opened.
    pub(super) identity: (u64, u64),
}

impl Shared {
    /// Opens `path` as `kind` with `quota` (see [`OpenOptions`]).
    pub(super) fn open(
        path: &Path,
        kind: Kind,
        quota: Quota,
        options: &OpenOptions,
    ) -> Result<Shared, SharedError> {
        let on_mismatch = options.on_mismatch;
        let settle = move |map: &Mapping, found: Kind| -> Result<Kind, SharedError> {
            let in_file = quota::read(Area::of(map)).ok_or_else(|| SharedError::Corrupt {
                path: map.path().to_owned(),
                field: "quota",
            })?;
            let in_file = Quota::from_params(in_file);
            let kind = match (found, kind) {
                (Kind::Keyed { capacity: file }, Kind::Keyed { capacity: asked })
                    if file != asked && on_mismatch != OnMismatch::Adopt =>
                {
                    return Err(SharedError::CapacityMismatch {
                        path: map.path().to_owned(),
                        file,
                        asked,
                    })
                }
                _ => found,
            };
            if in_file != quota {
                match on_mismatch {
                    OnMismatch::Refuse => {
                        return Err(SharedError::QuotaMismatch {
                            path: map.path().to_owned(),
                            file: in_file,
                            asked: quota,
                        })
                    }
                    OnMismatch::Adopt => {}
                    OnMismatch::Replace => FileQuota::store(Area::of(map), quota)?,
                }
            }
            Ok(kind)
        };
        let opened = file::open(
            path,
            Want {
                kind,
                settle: Box::new(settle),
                init: Box::new(move |map| Area::of(map).init(quota)),
            },
            options,
        )?;
        // Decisions fall back to the quota in force at opening if a hostile writer keeps
        // the file's quota from ever reading stable (`quota.rs`).
        let map = opened.mapping;
        let fallback = quota::read(Area::of(&map)).unwrap_or(*quota.params());
        // SAFETY: `Shared` owns `map` beside the `FileQuota` and uses the quota only through
        // `&Shared`, while `map` is alive; moving `map` into it below does not move the
        // mapped memory the quota points into, and dropping a `FileQuota` touches nothing.
        let quota = unsafe { FileQuota::new(&map, fallback) };
        Ok(Shared {
            quota,
            clock: HostClock::new(opened.time),
            map,
            kind: opened.kind,
            identity: opened.identity,
        })
    }

    /// Whether the file's path still leads to the file this process mapped.
    pub(super) fn is_current(&self) -> bool {
        file::is_at(self.map.path(), self.identity)
    }

    /// A keyed file's key slots (0 for a direct file).
    pub(super) fn capacity(&self) -> u64 {
        match self.kind {
            Kind::Keyed { capacity } => capacity,
            Kind::Direct | Kind::Budget { .. } => 0,
        }
    }
}

/// A rate limiter whose state is a word in a file that every process of the host maps:
/// one quota for all of them, with the same decisions, waiting and promises as a
/// [`Limiter`](crate::Limiter).
///
/// Open the same path with the same quota in every process (gunicorn or uvicorn workers,
/// a pre-fork server's children, a command started ten times): together they admit no
/// more than the quota. A check is a clock read, a load and (when admitted) one
/// compare-and-swap on the shared word, as in one process; there is no lock, so a process
/// killed at any instruction leaves nothing to recover.
///
/// Waiting is booked in the shared word, so turns are first come, first served across
/// processes; each process's timer wakes its own waiters. A wait dropped before its turn
/// gives its cells back when nothing was booked or admitted after it, in any process
/// (otherwise they stay spent, which never lets more through).
///
/// # Examples
///
/// ```
/// use paceline::shared::SharedLimiter;
/// use paceline::Quota;
///
/// # let path = std::env::temp_dir().join(format!("paceline-doc-a-{}", std::process::id()));
/// // In every worker process: the same path, the same quota.
/// let limiter = SharedLimiter::open(&path, Quota::per_second(100).with_burst(5))?;
/// assert!(limiter.check().is_ok());
/// limiter.wait(); // a booked turn, first come first served across the processes
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SharedLimiter {
    shared: Arc<Shared>,
    /// The word in `shared.map`: valid while `shared` lives.
    word: NonNull<AtomicU64>,
    clock: HostClock,
    waiters: Arc<Waiters<HostClock>>,
}

// SAFETY: `word` points into the mapping that `shared` keeps alive, and is only used as an
// `&AtomicU64` (which is `Send` and `Sync`); every other field is `Send` and `Sync`.
unsafe impl Send for SharedLimiter {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedLimiter {}

impl core::fmt::Debug for SharedLimiter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedLimiter")
            .field("path", &self.shared.map.path())
            .field("quota", &self.quota())
            .finish_non_exhaustive()
    }
}

impl SharedLimiter {
    /// Opens the limiter at `path` (any file on a local file system; `/dev/shm/...` on
    /// Linux keeps it in memory), making the file if it does not exist. New files are
    /// readable and writable by their owner only; an existing file is opened only if this
    /// process's user owns it and no one else can write it (see [`OpenOptions`] to trust a
    /// group or another user).
    ///
    /// # Errors
    ///
    /// [`SharedError::QuotaMismatch`] if the file enforces another quota (see
    /// [`SharedLimiter::open_with`]); [`SharedError::Untrusted`] for a file someone else
    /// owns or can write; otherwise a [`SharedError`] saying what is wrong with the path or
    /// the file. A file with an error is left as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-b-{}", std::process::id()));
    /// let a = SharedLimiter::open(&path, Quota::per_second(2))?;
    /// let b = SharedLimiter::open(&path, Quota::per_second(2))?; // another process, say
    /// assert!(a.check().is_ok() && b.check().is_ok());
    /// assert!(a.check().is_err() && b.check().is_err()); // one quota between them
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: impl AsRef<Path>, quota: Quota) -> Result<SharedLimiter, SharedError> {
        SharedLimiter::open_with(path, quota, OnMismatch::Refuse)
    }

    /// [`SharedLimiter::open`] with [`OpenOptions`] (or just an [`OnMismatch`]): what to
    /// do when the file holds another quota, whom to trust, the limit's name.
    ///
    /// # Errors
    ///
    /// As [`SharedLimiter::open`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::{OnMismatch, SharedLimiter}, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-c-{}", std::process::id()));
    /// let first = SharedLimiter::open(&path, Quota::per_second(10))?;
    /// let adopted = SharedLimiter::open_with(&path, Quota::per_second(99), OnMismatch::Adopt)?;
    /// assert_eq!(adopted.quota(), Quota::per_second(10));
    /// let replaced = SharedLimiter::open_with(&path, Quota::per_second(20), OnMismatch::Replace)?;
    /// assert_eq!(first.quota(), Quota::per_second(20)); // every process sees it
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_with(
        path: impl AsRef<Path>,
        quota: Quota,
        options: impl Into<OpenOptions>,
    ) -> Result<SharedLimiter, SharedError> {
        let options = options.into();
        let shared = Shared::open(path.as_ref(), Kind::Direct, quota, &options)?;
        Ok(SharedLimiter::on(Arc::new(shared), layout::direct_word(0)))
    }

    fn on(shared: Arc<Shared>, lane: usize) -> SharedLimiter {
        let word = NonNull::from(shared.map.word(lane));
        let clock = shared.clock.clone();
        SharedLimiter {
            waiters: Waiters::new(clock.clone()),
            clock,
            word,
            shared,
        }
    }

    /// The file's second limiter, of the same quota: for the bound when the work runs
    /// (see the crate's README), across the processes. Each process that needs it asks
    /// for it; they all get the same word.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-d-{}", std::process::id()));
    /// let booked = SharedLimiter::open(&path, Quota::per_second(1))?;
    /// let running = booked.execution_lane();
    /// assert!(booked.check().is_ok() && running.check().is_ok()); // two words
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execution_lane(&self) -> SharedLimiter {
        SharedLimiter::on(Arc::clone(&self.shared), layout::direct_word(1))
    }

    /// Whether the file's path still leads to the file this process has open: false once it
    /// was removed or replaced there (by an operator, or a cleaner of `/tmp`). Processes
    /// that open the path afterwards make or open another file, and no longer share a
    /// quota with this one: a server can check this now and then and open the path anew.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-cur-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(10))?;
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
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-e-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(1))?;
    /// assert_eq!(limiter.path(), std::path::absolute(&path)?);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn path(&self) -> &Path {
        self.shared.map.path()
    }

    fn cell(&self) -> &TatWord {
        // SAFETY: `word` points into the mapping, which `self.shared` keeps alive for as
        // long as `self`.
        TatWord::in_place(unsafe { self.word.as_ref() })
    }

    #[inline]
    fn params(&self) -> Params {
        self.shared.quota.load()
    }

    /// The quota in force, as every process sees it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-f-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(3))?;
    /// assert_eq!(limiter.quota(), Quota::per_second(3));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quota(&self) -> Quota {
        Quota::from_params(self.params())
    }

    /// Admits one cell now, or says how long until one would be; a denial writes nothing.
    /// [`Limiter::check`](crate::Limiter::check) across processes.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with the wait, measured from this check.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-g-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(1))?;
    /// assert!(limiter.check().is_ok());
    /// assert!(limiter.check().unwrap_err().wait_time().as_millis() > 900);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check(&self) -> Result<(), NotUntil> {
        let now = self.clock.now();
        let (interval, room) = self.shared.quota.one_cell();
        match self.cell().spend(now, interval, room) {
            Ok(_) => Ok(()),
            Err(wait) => Err(NotUntil::from_nanos(wait)),
        }
    }

    /// Admits `n` cells at once, or none. [`Limiter::check_n`](crate::Limiter::check_n)
    /// across processes.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when they fit the burst but not now;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-h-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(10))?;
    /// assert!(limiter.check_n(7).is_ok());
    /// assert!(limiter.check_n(7).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n(&self, n: u32) -> Result<(), Denied> {
        if n == 0 {
            return Ok(());
        }
        let now = self.clock.now();
        let params = self.params();
        let cost = error::cost(&params, n)?;
        match self
            .cell()
            .spend(now, cost, params.tau().saturating_sub(cost))
        {
            Ok(_) => Ok(()),
            Err(wait) => Err(NotUntil::from_nanos(wait).into()),
        }
    }

    /// Admits `n` cells in this lane and in `other` together, or none: what a caller whose
    /// work runs at once takes from the booking lane and the execution lane
    /// ([`SharedLimiter::execution_lane`]). `other` is looked at first, so that neither is
    /// spent unless both have room now; another process may take `other`'s room between
    /// the look and the take, and then this lane's cells stay spent (the strict side:
    /// never more through) and the answer is `other`'s refusal. For two lanes of one file,
    /// one clock reading and one quota reading serve both; otherwise it is
    /// `other.peek_n`, `self.check_n` and `other.check_n`, in that order.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] with the wait of the lane that had no room;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-cnw-{}", std::process::id()));
    /// let booked = SharedLimiter::open(&path, Quota::per_second(10))?;
    /// let running = booked.execution_lane();
    /// running.check_n(10)?; // the work of late turns spent the execution lane
    /// assert!(booked.check_n_with(&running, 1).is_err());
    /// assert_eq!(booked.remaining(), 10); // nothing spent where the other had no room
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n_with(&self, other: &SharedLimiter, n: u32) -> Result<(), Denied> {
        if !Arc::ptr_eq(&self.shared, &other.shared) {
            let wait = other.peek_n(n)?;
            if !wait.is_zero() {
                return Err(NotUntil::from_nanos(crate::wait::duration_nanos(wait)).into());
            }
            self.check_n(n)?;
            return other.check_n(n);
        }
        if n == 0 {
            return Ok(());
        }
        let now = self.clock.now();
        let params = self.params();
        let cost = error::cost(&params, n)?;
        let room = params.tau().saturating_sub(cost);
        // The look reads `other`'s TAT relaxed (`TatWord::tat`): a hint that spares this
        // lane a take the other would refuse; the takes' compare-and-swaps decide.
        let look = gcra::admit_in_room(other.cell().tat(), now, cost, room);
        let taken = look.and_then(|_| self.cell().spend(now, cost, room));
        match taken.and_then(|_| other.cell().spend(now, cost, room)) {
            Ok(_) => Ok(()),
            Err(wait) => Err(NotUntil::from_nanos(wait).into()),
        }
    }

    /// How many cells `check_n` would admit right now; spends nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-i-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_hour(10))?;
    /// limiter.check_n(4)?;
    /// assert_eq!(limiter.remaining(), 6);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remaining(&self) -> u32 {
        let params = self.params();
        gcra::remaining(self.cell().tat(), self.clock.now(), &params)
    }

    /// The limiter's state now, from one reading (see [`Snapshot`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-j-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_hour(10))?;
    /// assert_eq!(limiter.snapshot().remaining(), 10);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let params = self.params();
        Snapshot::of(params, self.cell().tat(), self.clock.now())
    }

    /// How long from now until `n` cells would be admitted (zero: now); books nothing.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-k-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_hour(1))?;
    /// assert!(limiter.peek_n(1)?.is_zero());
    /// limiter.check()?;
    /// assert!(limiter.peek_n(1)?.as_secs() > 3500);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_n(&self, n: u32) -> Result<Duration, InsufficientCapacity> {
        let params = self.params();
        let cost = match error::cost(&params, n) {
            Ok(cost) => cost,
            Err(Denied::InsufficientCapacity(e)) => return Err(e),
            Err(Denied::NotUntil(e)) => return Ok(e.wait_time()),
        };
        Ok(
            match gcra::admit(self.cell().tat(), self.clock.now(), cost, params.tau()) {
                Ok(_) => Duration::ZERO,
                Err(wait) => Duration::from_nanos(wait),
            },
        )
    }

    /// Forgets what was spent and any hold, for every process: the state of a new
    /// limiter, its whole burst admissible at once. An operator's action (an upstream's
    /// hold that should end, a test between runs), and the one exception to "spent is
    /// spent". This process's waiting turns move earlier together, the first to now,
    /// keeping their order and spacing, and come before anything booked after the reset;
    /// another process's waiting turns keep their instants (its queue is its own), so up to
    /// that many more cells than the quota may pass in the window after a reset.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-reset-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(10))?;
    /// limiter.hold_for(Duration::from_secs(3600));
    /// assert!(limiter.check().is_err());
    /// limiter.reset();
    /// assert_eq!(limiter.remaining(), 10);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self) {
        let now = self.clock.now();
        if let Some(arm) = self.waiters.reset(self.cell(), ALWAYS_OURS, now) {
            self.waiters.schedule(arm);
        }
    }

    /// Changes the quota for every process that has the file open, keeping what was spent
    /// ([`Limiter::set_quota`](crate::Limiter::set_quota)); this process's waiters are
    /// re-read against it at once, other processes' at their next wake-up.
    ///
    /// # Errors
    ///
    /// [`SharedError::QuotaSlots`] in a file where eight changes died half-way.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-l-{}", std::process::id()));
    /// let limiter = SharedLimiter::open(&path, Quota::per_second(1))?;
    /// limiter.set_quota(Quota::per_second(50))?;
    /// assert_eq!(limiter.quota(), Quota::per_second(50));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quota(&self, quota: Quota) -> Result<(), SharedError> {
        self.shared.quota.set(quota)?;
        let arm = self.waiters.requote(quota.params(), self.clock.now());
        self.waiters.schedule(arm);
        Ok(())
    }
}
