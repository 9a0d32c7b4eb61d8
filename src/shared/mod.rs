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
//! **Who can spend the quota:** whoever can write the file. New files are made readable
//! and writable by their owner only; give other users access with the file's permissions.
//! A process that can write the file can also damage it; a damaged file gives wrong
//! decisions for itself, never a crash or a hang in the processes that use it (except
//! that truncating a file another process has mapped makes the system kill that process
//! with `SIGBUS`, which no mapping can prevent).
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
//! * **Opening** (`file.rs`): under `flock`, released by the kernel when its holder dies;
//!   files never finished, or made in an earlier boot, are made anew.
//! * **Waiting** is the in-process waiting (`crate::wait`) on the shared word: a booking is
//!   the compare-and-swap, so turns are ordered across processes. A process cancels only
//!   what it booked, and gives cells back only when the word still holds its own last
//!   booking and none of its later waiters booked after another process's admission
//!   (`crate::wait::queue`, "Cancelling is exact").
//! * **Key slots** (`table.rs`): see there.

mod error;
mod file;
mod keyed;
mod layout;
mod limiter;
mod quota;
mod reservation;
mod table;

pub use error::SharedError;
pub use keyed::{OwnedSharedKeyReservation, SharedKeyedLimiter};
pub use layout::MAX_CAPACITY;
pub use limiter::SharedLimiter;
pub use reservation::{OwnedSharedReservation, SharedReservation};

/// What opening a shared file does when the file already holds another quota (or, for
/// a keyed file, another number of key slots) than the caller's.
///
/// # Examples
///
/// ```
/// use paceline::shared::OnMismatch;
/// assert_ne!(OnMismatch::Refuse, OnMismatch::Adopt);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnMismatch {
    /// An error that names both ([`SharedError::QuotaMismatch`]): two programs that
    /// disagree about a quota are usually a mistake.
    #[default]
    Refuse,
    /// Use the file's: this process follows whatever the others set.
    Adopt,
    /// Set the caller's, for every process that has the file open (a deploy that changes
    /// the quota). Key slots cannot be replaced: a keyed file keeps its size.
    Replace,
}
