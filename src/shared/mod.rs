//! One quota across the processes of one host: the limiter's word in a file every
//! process maps (feature `shared`; Linux and macOS).
//!
//! Gunicorn and uvicorn workers, a pre-fork server's children, a `multiprocessing` pool,
//! a command started ten times by a shell loop: each is a process of its own, and a
//! limiter inside each lets the quota through once per process. A [`SharedLimiter`]
//! opened on the same path in every process is one limiter: the same decisions as a
//! [`Limiter`](crate::Limiter), the same waiting, the same promises, and no server to run.
//! [`SharedKeyedLimiter`] does the same per key, in a table of a size fixed when the file
//! is made.
//!
//! ```
//! use paceline::shared::SharedLimiter;
//! use paceline::Quota;
//!
//! # let path = std::env::temp_dir().join(format!("paceline-doc-mod-{}", std::process::id()));
//! // Every worker: "/dev/shm/my-api" on Linux keeps the file in memory.
//! let api = SharedLimiter::open(&path, Quota::per_second(100).with_burst(1))?;
//! api.wait(); // our turn among every process's callers
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Who can use a file
//!
//! **Whoever can write the file can spend the quota, and can break it** (set any quota,
//! hold it for a day, or truncate the file, which the system answers by killing the
//! processes that have it mapped with `SIGBUS`). So paceline opens a file only if this
//! process's effective user owns it (or a user or group named with [`OpenOptions`]) and no
//! one else can write it, never follows a link at the path, makes new files readable and
//! writable by their owner only (`0600`; `0660` for a trusted group), and never modifies
//! a file it did not make: another user's file planted at the path, an empty file, or a
//! file of other content is an error that says whose it is and what to do, and is left as
//! it is. The way to the file is checked too: a directory on it (as written or as
//! resolved) that another user owns or that others can rename entries in (unless sticky),
//! or a link on it that another user owns, is an error, since either could send two
//! processes opening one path to two files. Anyone who can write the directory can still
//! remove the file, or plant one that paceline then refuses (a denial of service, not a
//! takeover): keep files in a directory only trusted users can write, or in `/dev/shm`
//! (sticky: users cannot remove or rename each other's files).
//!
//! **Nothing waits long on another process.** Checks of stored keys and of a direct file
//! are lock-free. Storing a new key takes its bucket's lock, held for a few hundred
//! nanoseconds, and waits for another process's claim at most [`CLAIM_PATIENCE`]; after
//! that the key is refused as by a full table, for a moment. Opening waits for another
//! process only to make anew a file from an earlier boot, at most [`OPEN_PATIENCE`].
//!
//! **Spent is spent, across processes too.** A process killed while its tasks wait leaves
//! their booked turns spent: the other processes wait as if those calls had been made, for
//! as long as the bookings reached ahead (at most the wait the killed callers accepted). A
//! hold lasts at most [`MAX_HOLD`]; an operator ends holds and forgets what was spent with
//! [`SharedLimiter::reset`] or [`SharedKeyedLimiter::reset_key`].
//!
//! # Implementation notes
//!
//! * **Layout** (`layout.rs`): a 512-byte header (magic, layout version, kind, length,
//!   time source, boot id, key capacity and digest seeds, the quota slots), then the
//!   words. Each field is an `AtomicU64` in the mapping.
//! * **Time** (`crate::clock::HostClock`): the time-stamp counter scaled by a factor stored
//!   in the header when the file was made, so every process reads the same nanosecond; or
//!   `CLOCK_MONOTONIC` where the kernel does not trust the counter.
//! * **The word** is a `TatWord` (`crate::cell`) in the mapping, updated by the very code
//!   an in-process limiter runs: a check is a load and one compare-and-swap, lock-free,
//!   and a process killed at any instruction has either changed the word or not.
//! * **The quota** (`quota.rs`): slots with their own sequence words and a word naming the
//!   current one, so a writer killed half-way never stalls a reader.
//! * **Opening** (`file.rs`): checks, then a finished file linked into place; no locks.
//! * **Waiting** is the in-process waiting (`crate::wait`) on the shared word: a booking is
//!   the compare-and-swap, so turns are ordered across processes. A process cancels only
//!   what it booked, and gives cells back only when the word still holds its own last
//!   booking and none of its later waiters booked after another process's admission
//!   (`crate::wait::queue`, "Cancelling is exact").
//! * **Key slots** (`table.rs`, `keyed/`): buckets of slots, digests of the keys
//!   (`digest.rs`), a lock per bucket for storing new keys (`keyed/bucket.rs`).

mod budget;
mod digest;
mod dir;
mod error;
mod file;
mod keyed;
mod layout;
mod limiter;
mod options;
mod process;
mod quota;
mod reservation;
mod table;
mod trust;
mod users;

use core::time::Duration;

pub use budget::{
    SharedAcquire, SharedBudget, SharedBudgetBuilder, SharedBudgetError, SharedSettleError,
    SharedStep, SharedTurn, ABANDONED, LOCK_PATIENCE, MAX_WAITING,
};
pub use error::SharedError;
pub use file::OPEN_PATIENCE;
pub use keyed::bucket::CLAIM_PATIENCE;
pub use keyed::{OwnedSharedKeyReservation, SharedKeyedLimiter};
pub use layout::{MAX_CAPACITY, MAX_DIMENSIONS, MAX_DIMENSION_NAME_LEN, MAX_NAME_LEN};
pub use limiter::SharedLimiter;
pub use options::{OnMismatch, OpenOptions};
pub use reservation::{OwnedSharedReservation, SharedReservation};

/// The longest a hold lasts in a shared file ([`SharedLimiter::hold_for`]): a hold outlives
/// the process that set it, so it is bounded, as quotas are.
pub const MAX_HOLD: Duration = Duration::from_secs(24 * 60 * 60);
