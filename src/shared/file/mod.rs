//! Making, checking and mapping a shared file.
//!
//! # Implementation notes
//!
//! **A shared directory is hostile ground** (`/dev/shm` and `/tmp` are writable by every
//! user of the host). So an opener:
//!
//! * opens the path with `O_NOFOLLOW` (a link is an error, never followed) and
//!   `O_NONBLOCK` (a FIFO planted there cannot hang it), and checks what it opened: a
//!   regular file, on a local file system, owned by this process's effective user (or a
//!   user or group the caller trusts, [`OpenOptions`]) and writable by no one else;
//! * never modifies a file it did not finish making: a new file is made unnamed
//!   (`O_TMPFILE`, or under a private temporary name where the system has none), sized,
//!   filled in, its magic written last, and only then linked at the path, where the link
//!   fails if anything is there already (the opener then opens that instead). So the path
//!   never holds a half-made paceline file, and a file without the magic is someone
//!   else's: an error that says what was found, and the file is left as it is;
//! * never shrinks, truncates or zeroes a file: another process may have it mapped, and
//!   the system kills a process that touches a mapped page a truncation took away.
//!
//! **No opener waits on another** except in one case, for at most [`OPEN_PATIENCE`]: a
//! file made in an earlier boot holds instants of a clock that has since restarted (the
//! counter and `CLOCK_MONOTONIC` both count from boot), so its words would hold every cell
//! back for as long as the machine had run. Such a file is made anew, as a new file renamed
//! over the old one (never rewritten in place), by one opener: the one that sets the old
//! file's remaker word to its process id by a compare-and-swap (taking it over from a
//! process that no longer exists). The others wait until the path holds the new file.
//! No process of the current boot can be using the old one: each that opened it made it
//! anew, or waited for the one that did.
//!
//! **Nothing read from the file after opening decides a memory access.** The header's
//! length and key capacity are checked against the file's real length once, and the
//! mapping's own copy of them is used from then on; the words and slots are read as
//! atomics. A writer that fills the file with random bytes afterwards can make decisions
//! wrong for that file, never an access out of bounds. (Truncating a mapped file is
//! another matter: the system then kills a process touching the lost pages with
//! `SIGBUS`. Only whoever can write the file can do that, which the checks above limit to
//! the users the caller trusts.)

use core::time::Duration;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Instant;

mod header;
mod make;
mod mapping;

pub(crate) use mapping::Mapping;

use super::dir::Dir;
use super::error::{io_error, SharedError};
use super::layout::{self, Kind};
use super::options::OpenOptions;
use super::{process, trust};
use crate::clock::HostTime;
use crate::sync::Ordering;
use header::{boot_id, check, check_local, read_boot, read_time};
use make::make;

/// The longest an opener waits for another process making a file anew.
pub const OPEN_PATIENCE: Duration = Duration::from_secs(1);

/// Opens of a path that found it changed under them (removed, or replaced) before one
/// stuck; past this the path is [`SharedError::Busy`].
const OPEN_ATTEMPTS: u32 = 64;

/// Settles a finished file's quota (and capacity) with the opener's; see [`Want`].
pub(crate) type Settle = Box<dyn FnOnce(&Mapping, Kind) -> Result<Kind, SharedError>>;

/// What an opener asks for.
pub(crate) struct Want {
    pub(crate) kind: Kind,
    /// Called on a file of the right kind and geometry: may adopt, check or replace the
    /// quota (and, for a keyed file, the capacity), or refuse.
    pub(crate) settle: Settle,
    /// Writes the quota into a new file (not yet linked at its path).
    pub(crate) init: Box<dyn Fn(&Mapping)>,
}

/// An opened file: its mapping, its geometry, its time source and its identity (device and
/// inode).
pub(crate) struct Opened {
    pub(crate) mapping: Mapping,
    pub(crate) kind: Kind,
    pub(crate) time: HostTime,
    pub(crate) identity: (u64, u64),
}

/// Opens `path`, making it if it does not exist (or made in an earlier boot), and checks
/// it is a paceline file of the kind and geometry asked for, that the caller trusts, in a
/// directory the caller trusts.
pub(crate) fn open(path: &Path, want: Want, options: &OpenOptions) -> Result<Opened, SharedError> {
    if let Some(name) = &options.name {
        if name.len() > layout::MAX_NAME_LEN {
            return Err(SharedError::NameTooLong { name: name.clone() });
        }
    }
    let path = std::path::absolute(path).map_err(|e| io_error(path, "resolve the path", e))?;
    let path = path.as_path();
    let dir = Dir::of(path).map_err(|e| io_error(path, "open the file's directory", e))?;
    trust::check_dir(dir.file(), dir.path(), options)?;
    trust::check_way(path, options)?;
    let Want { kind, settle, init } = want;
    let new = New {
        kind,
        init: &*init,
        options,
    };
    let mut settle = Some(settle);
    for _ in 0..OPEN_ATTEMPTS {
        let Some(file) = open_existing(&dir, path, options)? else {
            match create(&dir, path, &new)? {
                Some(opened) => return Ok(opened),
                // Another opener linked its file first: open that.
                None => continue,
            }
        };
        let meta = file
            .metadata()
            .map_err(|e| io_error(path, "read the file's owner and length", e))?;
        trust::check_file(Some(&file), &meta, path, options)?;
        check_local(&file, path)?;
        match inspect(&file, &meta, path, kind, options)? {
            Inspected::Made {
                mapping,
                kind,
                time,
            } => {
                let settle = settle.take().expect("settled once, then returned");
                let kind = settle(&mapping, kind)?;
                return Ok(Opened {
                    mapping,
                    kind,
                    time,
                    identity: (meta.dev(), meta.ino()),
                });
            }
            Inspected::EarlierBoot => remake(&dir, &file, path, &new)?,
        }
    }
    Err(SharedError::Busy {
        path: path.to_owned(),
        pid: 0,
    })
}

/// The file, opened for reading and writing without following a link; `None` if there is
/// none.
fn open_existing(
    dir: &Dir,
    path: &Path,
    options: &OpenOptions,
) -> Result<Option<File>, SharedError> {
    match dir.open_file() {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(SharedError::Link {
            path: path.to_owned(),
        }),
        Err(e) => {
            // Not ours to open: say whose it is, as for a file we could open.
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if meta.file_type().is_symlink() {
                    return Err(SharedError::Link {
                        path: path.to_owned(),
                    });
                }
                trust::check_file(None, &meta, path, options)?;
            }
            Err(io_error(path, "open the file", e))
        }
    }
}

/// What an existing file turned out to be.
enum Inspected {
    /// A paceline file of the kind asked for, made in this boot, mapped whole.
    Made {
        mapping: Mapping,
        kind: Kind,
        time: HostTime,
    },
    /// A paceline file of this layout (and of the name asked for) made in an earlier boot.
    EarlierBoot,
}

/// Reads an existing file's header and checks it against its length and what is asked.
fn inspect(
    file: &File,
    meta: &Metadata,
    path: &Path,
    asked: Kind,
    options: &OpenOptions,
) -> Result<Inspected, SharedError> {
    let len = meta.len();
    let mut start = [0u8; 16];
    let read = file.read_at(&mut start, 0).unwrap_or(0);
    if read < 8 || u64::from_ne_bytes(start[..8].try_into().expect("8 bytes")) != layout::MAGIC {
        let found = if len == 0 {
            "an empty file".to_owned()
        } else {
            let shown: Vec<String> = start[..read].iter().map(|b| format!("{b:02x}")).collect();
            format!("{len} bytes, beginning {}", shown.join(" "))
        };
        return Err(SharedError::NotPaceline {
            path: path.to_owned(),
            found,
        });
    }
    if len < layout::HEADER_LEN as u64 {
        return Err(SharedError::Length {
            path: path.to_owned(),
            found: len,
            expected: asked.file_len(),
        });
    }
    let header = Mapping::map(file, layout::HEADER_LEN, path)?;
    let kind = check(&header, len, asked)?;
    // The name first: a file of another limit is never made anew, whatever its boot.
    if let Some(asked) = &options.name {
        let found = header.name();
        if found != *asked {
            return Err(SharedError::NameMismatch {
                path: path.to_owned(),
                file: found,
                asked: asked.clone(),
            });
        }
    }
    if read_boot(&header) != boot_id() {
        return Ok(Inspected::EarlierBoot);
    }
    let time = read_time(&header).ok_or_else(|| SharedError::Clock {
        path: path.to_owned(),
    })?;
    drop(header);
    let whole = usize::try_from(len).map_err(|_| SharedError::Length {
        path: path.to_owned(),
        found: len,
        expected: kind.file_len(),
    })?;
    let mapping = Mapping::map(file, whole, path)?;
    Ok(Inspected::Made {
        mapping,
        kind,
        time,
    })
}

/// What a new file is made with.
struct New<'a> {
    kind: Kind,
    init: &'a dyn Fn(&Mapping),
    options: &'a OpenOptions,
}

/// Makes a new file and links it at the path; `None` if something got there first.
fn create(dir: &Dir, path: &Path, new: &New<'_>) -> Result<Option<Opened>, SharedError> {
    let (made, opened) = make(dir, path, new)?;
    if made
        .link_at()
        .map_err(|e| io_error(path, "link the new file into place", e))?
    {
        Ok(Some(opened))
    } else {
        Ok(None)
    }
}

/// A claim on a file from an earlier boot (its remaker word): this process's id in the
/// high half, the claim's second on `CLOCK_MONOTONIC` in the low half (0: no claim).
fn remaker_claim() -> u64 {
    process::me() << 32 | u64::from(process::seconds().max(1))
}

/// Whether a remaker claim may be taken over: nobody's, its process gone, or older than
/// [`STALE_CLAIM`] (a remake takes milliseconds; an id that old may be a reused one).
fn stale(claim: u64) -> bool {
    let (pid, second) = (claim >> 32, claim as u32);
    claim == 0
        || process::seconds().wrapping_sub(second) > STALE_CLAIM.as_secs() as u32
        || pid != process::me() && !process::alive(pid)
}

/// How old a remaker's claim may be before another opener takes it over.
const STALE_CLAIM: Duration = Duration::from_secs(10);

/// Makes a file anew over one from an earlier boot (module docs): as the one opener that
/// claims it, or by waiting for that one. Returns once the path no longer holds `old`.
fn remake(dir: &Dir, old: &File, path: &Path, new: &New<'_>) -> Result<(), SharedError> {
    let header = Mapping::map(old, layout::HEADER_LEN, path)?;
    let remaker = header.word(layout::REMAKER_AT);
    let ours = old.metadata().ok().map(|m| (m.dev(), m.ino()));
    let still_old = || ours.is_some() && dir.identity(dir.name()) == ours;
    let started = Instant::now();
    loop {
        if !still_old() {
            return Ok(());
        }
        // Acquire: pairs with a claimer's release of the word when it gave up.
        let holder = remaker.load(Ordering::Acquire);
        // AcqRel: the claim is ordered with the holder's, whichever wins.
        if stale(holder)
            && remaker
                .compare_exchange(holder, remaker_claim(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let made = make(dir, path, new).and_then(|(made, _)| {
                if still_old() {
                    made.rename_over()
                        .map_err(|e| io_error(path, "replace the file", e))
                } else {
                    Ok(())
                }
            });
            if made.is_err() {
                // Release: another opener may try.
                remaker.store(0, Ordering::Release);
            }
            return made;
        }
        if started.elapsed() >= OPEN_PATIENCE {
            return Err(SharedError::Busy {
                path: path.to_owned(),
                pid: holder >> 32,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `path` (not following a link) is still the file of `identity`: false once the
/// file was removed or replaced at its path.
pub(crate) fn is_at(path: &Path, identity: (u64, u64)) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == identity)
}
