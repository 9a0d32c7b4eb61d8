//! What can go wrong opening or changing a shared file.

use core::fmt;
use std::path::PathBuf;

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
#[derive(Debug)]
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
    /// The file is not a paceline file (its first bytes are something else).
    NotPaceline {
        /// The file.
        path: PathBuf,
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
    /// A keyed file with another number of key slots than asked for (the slots are the
    /// file's size, fixed when it was made). [`OnMismatch::Adopt`](super::OnMismatch::Adopt)
    /// takes the file's.
    CapacityMismatch {
        /// The file.
        path: PathBuf,
        /// Its key slots.
        file: u64,
        /// The key slots asked for.
        asked: u64,
    },
    /// A key capacity of 0, or above [`MAX_CAPACITY`](super::MAX_CAPACITY).
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
            SharedError::NotPaceline { path } => {
                write!(f, "{}: not a paceline file", path.display())
            }
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
                "{}: {found} bytes long where its header says {expected}",
                path.display()
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
                "{}: the file has {file} key slots, not the {asked} asked for",
                path.display()
            ),
            SharedError::Capacity { asked } => write!(
                f,
                "a shared keyed limiter needs 1 to {} key slots, not {asked}",
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

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SharedError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
