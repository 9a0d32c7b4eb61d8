//! What can go wrong opening or changing a shared file.

use core::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::users::user_name;
use crate::Quota;

/// Why a shared file could not be opened (or its quota changed). Nothing was changed in a
/// file that gave an error.
///
/// # Examples
///
/// ```
/// use paceline::shared::{SharedError, SharedLimiter};
/// use paceline::Quota;
///
/// let path = std::env::temp_dir().join(format!("paceline-doc-err-{}", std::process::id()));
/// let _a = SharedLimiter::open(&path, Quota::per_second(10)).unwrap();
/// match SharedLimiter::open(&path, Quota::per_second(20)) {
///     Err(SharedError::QuotaMismatch { file, asked, .. }) => {
///         assert_eq!((file, asked), (Quota::per_second(10), Quota::per_second(20)));
///     }
///     other => panic!("{other:?}"),
/// }
/// # std::fs::remove_file(&path).unwrap();
/// ```
#[non_exhaustive]
pub enum SharedError {
    /// The operating system refused: no such directory, no permission, no space, or the
    /// file could not be mapped.
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        doing: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// The file is on a network or other file system whose mappings are not one memory
    /// shared by every process (NFS, SMB, FUSE): atomics there would not be atomic.
    NotLocal {
        /// The file.
        path: PathBuf,
        /// The file system's type, as the system reports it.
        filesystem: String,
    },
    /// The path is a symbolic link. paceline opens only the file itself: a link in a
    /// shared directory could point it at any file its user can write.
    Link {
        /// The path.
        path: PathBuf,
    },
    /// The path is not a regular file (a directory, a FIFO, a device, a socket).
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// The file is owned by a user this process does not trust, or others can write it:
    /// whoever can write it can spend or break the quota of every process that uses it.
    /// Nothing was read from or written to it. Remove it, or name its owner or group with
    /// [`OpenOptions::trust_user`](super::OpenOptions::trust_user) /
    /// [`OpenOptions::trust_group`](super::OpenOptions::trust_group) if they are yours.
    Untrusted {
        /// The file.
        path: PathBuf,
        /// Its owner's user id.
        owner: u32,
        /// Its group id.
        group: u32,
        /// Its permission bits.
        mode: u32,
        /// This process's effective user id.
        user: u32,
        /// What is wrong: who else can write it.
        why: &'static str,
    },
    /// The file is not a paceline file. paceline never leaves a half-made file at a path
    /// (a new file is finished before it is linked there), so this one was made by
    /// something else; it is left as it is.
    NotPaceline {
        /// The file.
        path: PathBuf,
        /// What was found: its length and first bytes.
        found: String,
    },
    /// Another process is making the file anew (it was made before the machine last
    /// booted, so its instants are of a clock that has restarted) and did not finish
    /// within [`OPEN_PATIENCE`](super::OPEN_PATIENCE); or the path kept changing while
    /// this process opened it.
    Busy {
        /// The file.
        path: PathBuf,
        /// The process making it anew (0 if the path kept changing).
        pid: u64,
    },
    /// The file holds a limit of another name than the one asked for
    /// ([`OpenOptions::name`](super::OpenOptions::name)): one file holds one limit.
    NameMismatch {
        /// The file.
        path: PathBuf,
        /// The name in the file.
        file: String,
        /// The name asked for.
        asked: String,
    },
    /// A name longer than [`MAX_NAME_LEN`](super::MAX_NAME_LEN) bytes.
    NameTooLong {
        /// The name asked for.
        name: String,
    },
    /// A paceline file of another layout version.
    Version {
        /// The file.
        path: PathBuf,
        /// The file's version.
        found: u32,
        /// This code's version.
        expected: u32,
    },
    /// A direct file opened as keyed, or the other way round.
    Kind {
        /// The file.
        path: PathBuf,
        /// What the file holds.
        found: &'static str,
        /// What was asked for.
        expected: &'static str,
    },
    /// The file's length is not what its header says it holds (shorter: cut off; longer:
    /// something else wrote to it).
    Length {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        found: u64,
        /// The length its header implies.
        expected: u64,
    },
    /// The file's header is damaged: a field out of range.
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which field.
        field: &'static str,
    },
    /// The file enforces another quota than the caller asked for. Open it with
    /// [`OnMismatch::Adopt`](super::OnMismatch::Adopt) to use the file's, or
    /// [`OnMismatch::Replace`](super::OnMismatch::Replace) to set the caller's for every
    /// process.
    QuotaMismatch {
        /// The file.
        path: PathBuf,
        /// The quota in the file.
        file: Quota,
        /// The quota asked for.
        asked: Quota,
    },
    /// A keyed file made for another number of keys than asked for (its slots are the
    /// file's size, fixed when it was made). [`OnMismatch::Adopt`](super::OnMismatch::Adopt)
    /// takes the file's.
    CapacityMismatch {
        /// The file.
        path: PathBuf,
        /// The keys it was made for.
        file: u64,
        /// The keys asked for.
        asked: u64,
    },
    /// A capacity of 0 keys, or above [`MAX_CAPACITY`](super::MAX_CAPACITY).
    Capacity {
        /// What was asked for.
        asked: u64,
    },
    /// The file's time source cannot be read by this process (a file made on another
    /// kind of machine).
    Clock {
        /// The file.
        path: PathBuf,
    },
    /// Every spare quota slot of the file is held by a change that never finished (its
    /// process died while writing, eight times over). Make the file anew.
    QuotaSlots,
    /// A shared budget's lock was held by another process, still running, for longer than
    /// [`LOCK_PATIENCE`](super::LOCK_PATIENCE) (it is stopped, or stuck): nothing was done.
    Locked {
        /// The file.
        path: PathBuf,
        /// The process holding the lock.
        pid: u64,
    },
    /// The file holds another budget (other rates, names or in-flight cap) than the one
    /// asked for. [`OnMismatch::Adopt`](super::OnMismatch::Adopt) takes the file's.
    BudgetMismatch {
        /// The file.
        path: PathBuf,
        /// The budget in the file.
        file: String,
        /// The budget asked for.
        asked: String,
    },
    /// A shared budget that cannot be: why.
    BadBudget {
        /// What is wrong with it.
        reason: String,
    },
    /// A shared budget's file records [`MAX_WAITING`](super::MAX_WAITING) callers already
    /// (turns in flight and waiters, over every process): nothing was done.
    TooManyCallers {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedError::Io {
                path,
                doing,
                source,
            } => write!(f, "{}: cannot {doing}: {source}", path.display()),
            SharedError::NotLocal { path, filesystem } => write!(
                f,
                "{}: a {filesystem} file system is not memory every process of the host shares; \
                 use a local one such as /dev/shm",
                path.display()
            ),
            SharedError::Link { path } => write!(
                f,
                "{}: is a symbolic link; paceline opens only the file itself (a link in a \
                 shared directory could point it at any file): give the file's own path",
                path.display()
            ),
            SharedError::NotAFile { path, found } => {
                write!(f, "{}: is {found}, not a file", path.display())
            }
            SharedError::Untrusted {
                path,
                owner,
                group,
                mode,
                user,
                why,
            } => write!(
                f,
                "{}: not opened: owned by {} (group {group}), mode {mode:04o}: {why}. \
                 Whoever can write the file (or its directory) can spend or break the quota \
                 of every process using it, so paceline opens only files of its own user \
                 ({}) that no one else can write, in a directory no one else can swap them \
                 in. {}",
                path.display(),
                User(*owner),
                User(*user),
                fix(
                    why,
                    *owner,
                    *group,
                    "OpenOptions::trust_user(",
                    "OpenOptions::trust_group(",
                    ")"
                ),
            ),
            SharedError::NotPaceline { path, found } => write!(
                f,
                "{}: not a paceline file ({found}); paceline never leaves a half-made file \
                 at a path, so this one is something else's and is left as it is: remove \
                 it or choose another path",
                path.display()
            ),
            SharedError::Busy { path, pid: 0 } => write!(
                f,
                "{}: the path kept changing while it was opened (another process removing \
                 or replacing it)",
                path.display()
            ),
            SharedError::Busy { path, pid } => write!(
                f,
                "{}: process {pid} is making the file anew (it was made before the machine \
                 last booted) and did not finish within {:?}",
                path.display(),
                super::OPEN_PATIENCE
            ),
            SharedError::NameMismatch { path, file, asked } => write!(
                f,
                "{}: holds the limit {file:?}, not {asked:?}: one file holds one limit, so \
                 give each limit a path of its own",
                path.display()
            ),
            SharedError::NameTooLong { name } => write!(
                f,
                "a shared file's name is at most {} bytes, not {} ({name:?})",
                super::MAX_NAME_LEN,
                name.len()
            ),
            SharedError::Version {
                path,
                found,
                expected,
            } => write!(
                f,
                "{}: paceline file layout {found}, this code reads layout {expected}",
                path.display()
            ),
            SharedError::Kind {
                path,
                found,
                expected,
            } => write!(
                f,
                "{}: holds a {found} limiter, opened as a {expected} one",
                path.display()
            ),
            SharedError::Length {
                path,
                found,
                expected,
            } => write!(
                f,
                "{}: {found} bytes long, where a paceline file of its kind is {expected} (a \
                 file cut short, or grown by something else)",
                path.display()
            ),
            SharedError::Locked { path, pid } => write!(
                f,
                "{}: process {pid} has held the budget's lock for {:?} (it is stopped or \
                 stuck); nothing was done",
                path.display(),
                super::LOCK_PATIENCE
            ),
            SharedError::BudgetMismatch { path, file, asked } => write!(
                f,
                "{}: the file holds the budget {file}, not the {asked} asked for (open it \
                 with OnMismatch::Adopt to use the file's)",
                path.display()
            ),
            SharedError::BadBudget { reason } => {
                write!(f, "this shared budget cannot be: {reason}")
            }
            SharedError::TooManyCallers { path } => write!(
                f,
                "{}: the budget records {} callers already (turns in flight and waiters); \
                 nothing was done",
                path.display(),
                super::MAX_WAITING
            ),
            SharedError::Corrupt { path, field } => {
                write!(f, "{}: damaged header ({field})", path.display())
            }
            SharedError::QuotaMismatch { path, file, asked } => write!(
                f,
                "{}: the file enforces {}, not the {} asked for (open it with \
                 OnMismatch::Adopt to use the file's, or OnMismatch::Replace to set yours)",
                path.display(),
                Describe(*file),
                Describe(*asked)
            ),
            SharedError::CapacityMismatch { path, file, asked } => write!(
                f,
                "{}: the file was made for {file} keys, not the {asked} asked for (open it \
                 with OnMismatch::Adopt to use the file's)",
                path.display()
            ),
            SharedError::Capacity { asked } => write!(
                f,
                "a shared keyed limiter holds 1 to {} keys, not {asked}",
                super::MAX_CAPACITY
            ),
            SharedError::Clock { path } => write!(
                f,
                "{}: made on a machine whose time source this process cannot read",
                path.display()
            ),
            SharedError::QuotaSlots => f.write_str(
                "every spare quota slot is held by a change whose process died; make the file anew",
            ),
        }
    }
}

/// What to do about an untrusted file or directory, for each reason `trust.rs` gives, with
/// the trust options as the caller's language writes them (`user(` ... `)`).
fn fix(why: &str, owner: u32, group: u32, user_opt: &str, group_opt: &str, close: &str) -> String {
    if why.starts_with("anyone on the host") {
        "Remove the file (or choose another path); if it is yours, make it writable by its \
         owner only (chmod o-w): trusting a user or group does not open a file anyone can \
         write"
            .to_owned()
    } else if why.starts_with("its group can write") {
        format!(
            "Remove the file, or make it writable by its owner only (chmod g-w), or, if group \
             {group} is yours, open it with {group_opt}{group}{close}"
        )
    } else if why.starts_with("another user owns") {
        format!(
            "Remove the file (or choose another path), or, if uid {owner} is yours, open it with \
             {user_opt}{owner}{close}"
        )
    } else if why.starts_with("an access ACL") {
        "Remove the file, or its ACL (setfacl -b) if it is yours".to_owned()
    } else if why.contains("another user owns it") {
        format!(
            "Choose a directory of your own (or /dev/shm), or, if uid {owner} is yours, open it \
             with {user_opt}{owner}{close}"
        )
    } else {
        "Choose a directory only trusted users can write, or a sticky one such as /dev/shm"
            .to_owned()
    }
}

/// A user id, with its name where the system has one: "uid 65534 (nobody)".
struct User(u32);

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {}", self.0)?;
        match user_name(self.0) {
            Some(name) => write!(f, " ({name})"),
            None => Ok(()),
        }
    }
}

/// A quota in words: "1 cell every 10ms, bursts of 5".
struct Describe(Quota);

impl fmt::Display for Describe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "1 cell every {:?}, bursts of {}",
            self.0.emission_interval(),
            self.0.burst()
        )
    }
}

// The same text as `Display`: what a `main` that returns the error prints.
debug_as_display!(SharedError);

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SharedError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// [`SharedError::Io`]: `doing` on `path` failed with `source`.
pub(crate) fn io_error(path: &Path, doing: &'static str, source: io::Error) -> SharedError {
    SharedError::Io {
        path: path.to_owned(),
        doing,
        source,
    }
}
