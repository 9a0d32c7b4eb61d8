//! Making, checking and mapping a shared file.
//!
//! # Implementation notes
//!
//! **Opening is serialised by `flock`**, held only while a process creates or checks the
//! file: the kernel lets it go when its holder dies, so a process killed while making the
//! file leaves nothing held. The magic is written last (`Release`), after every other
//! field: a file without it was never finished, and the next opener makes it anew.
//!
//! **A file from an earlier boot** holds instants of a clock that has since restarted
//! (the counter and `CLOCK_MONOTONIC` both count from boot): its words would hold every
//! cell back for as long as the machine had run. Its header records the boot it was made
//! in; an opener in another boot makes it anew under the lock, before any process of this
//! boot can use it.
//!
//! **Nothing read from the file after opening decides a memory access.** The header's
//! length and key capacity are checked against the file's real length once, and the
//! mapping's own copy of them is used from then on; the words and slots are read as
//! atomics. A writer that fills the file with random bytes afterwards can make decisions
//! wrong for that file, never an access out of bounds. (Truncating a mapped file is
//! another matter: the system then kills a process touching the lost pages with
//! `SIGBUS`. Only whoever can write the file can do that; see the module docs on who can.)

use core::ptr::NonNull;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::error::SharedError;
use super::layout::{self, Kind};
use crate::clock::{HostClock, HostTime};
use crate::sync::{AtomicU64, Ordering};

/// A shared file, mapped. The memory is only ever reached through [`Mapping::word`].
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    path: PathBuf,
}

// SAFETY: the mapping is plain memory shared with other processes, reached only through
// `&AtomicU64`s (`word`), which are `Send` and `Sync`; nothing in it is tied to a thread.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: every access is an atomic one.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// The atomic at byte `offset`.
    ///
    /// # Panics
    ///
    /// If `offset` is not 8-aligned or past the end: offsets come from the layout and the
    /// geometry checked at open, so that would be a bug here, not a bad file.
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "paceline: shared word at {offset} outside a {}-byte mapping",
            self.len
        );
        // SAFETY: the range is inside the live mapping (checked above, and it lives as long
        // as `self`), page-aligned plus a multiple of 8, so aligned for a `u64`; an
        // `AtomicU64` has the layout of a `u64`, and every access to the mapping, in this
        // process and the others, is atomic.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn map(file: &File, len: usize, path: &Path) -> Result<Mapping, SharedError> {
        // SAFETY: a fresh shared read-write mapping of `len` bytes of an open file; no
        // address hint, so it overlaps nothing of ours. The result is checked below.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io_error(path, "map the file", io::Error::last_os_error()));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| {
            io_error(
                path,
                "map the file",
                io::Error::other("mapped at address 0"),
            )
        })?;
        Ok(Mapping {
            ptr,
            len,
            path: path.to_owned(),
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are exactly what `mmap` returned and took; no reference
        // into the mapping outlives `self` (every `&AtomicU64` borrows it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Settles a finished file's quota (and capacity) with the opener's; see [`Want`].
pub(crate) type Settle = Box<dyn FnOnce(&Mapping, Kind) -> Result<Kind, SharedError>>;

/// What an opener asks for.
pub(crate) struct Want {
    pub(crate) kind: Kind,
    /// Called under the lock on a file of the right kind and geometry: may adopt, check or
    /// replace the quota (and, for a keyed file, the capacity), or refuse.
    pub(crate) settle: Settle,
    /// Writes the quota into a new file.
    pub(crate) init: Box<dyn FnOnce(&Mapping)>,
}

/// An opened file: its mapping, its geometry, its time source, and the file itself (kept
/// for the key claims' lock).
pub(crate) struct Opened {
    pub(crate) mapping: Mapping,
    pub(crate) kind: Kind,
    pub(crate) time: HostTime,
    pub(crate) file: File,
}

/// Opens `path`, making it if it does not exist (or was never finished, or was made in an
/// earlier boot), and checks it is a paceline file of the kind and geometry asked for.
pub(crate) fn open(path: &Path, want: Want) -> Result<Opened, SharedError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        // Readable and writable by the owner only: whoever can write it can spend it.
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io_error(path, "open or create the file", e))?;
    check_local(&file, path)?;
    let (mapping, kind, time) = {
        let _lock = Flock::exclusive(&file, path)?;
        open_locked(&file, path, want)?
    };
    Ok(Opened {
        mapping,
        kind,
        time,
        file,
    })
}

/// [`open`]'s work, under the lock.
fn open_locked(
    file: &File,
    path: &Path,
    want: Want,
) -> Result<(Mapping, Kind, HostTime), SharedError> {
    let len = file
        .metadata()
        .map_err(|e| io_error(path, "read the file's length", e))?
        .len();
    let header = if len >= layout::HEADER_LEN as u64 {
        Some(Mapping::map(file, layout::HEADER_LEN, path)?)
    } else {
        None
    };
    let finished = header
        .as_ref()
        .is_some_and(|h| h.word(layout::MAGIC_AT).load(Ordering::Acquire) != 0);
    let stale = header.as_ref().is_some_and(|h| {
        h.word(layout::MAGIC_AT).load(Ordering::Acquire) == layout::MAGIC
            && read_boot(h) != boot_id()
    });
    drop(header);
    // A file never finished is one whose maker died after sizing it: it has exactly the
    // length asked for. Any other unfinished file is not ours to overwrite.
    if len == 0 || (!finished && len == want.kind.file_len()) || stale {
        return create(file, path, want);
    }
    if !finished {
        return Err(SharedError::NotPaceline {
            path: path.to_owned(),
        });
    }
    if len < layout::HEADER_LEN as u64 {
        return Err(SharedError::Length {
            path: path.to_owned(),
            found: len,
            expected: want.kind.file_len(),
        });
    }
    let whole = usize::try_from(len).map_err(|_| SharedError::Length {
        path: path.to_owned(),
        found: len,
        expected: want.kind.file_len(),
    })?;
    let mapping = Mapping::map(file, whole, path)?;
    let kind = check(&mapping, len, want.kind)?;
    let time = read_time(&mapping).ok_or_else(|| SharedError::Clock {
        path: path.to_owned(),
    })?;
    let kind = (want.settle)(&mapping, kind)?;
    Ok((mapping, kind, time))
}

/// Makes the file anew (under the lock): its length, every field, the magic last.
fn create(file: &File, path: &Path, want: Want) -> Result<(Mapping, Kind, HostTime), SharedError> {
    let len = want.kind.file_len();
    // Zeroes every byte (a stale file's too): length 0, then the new length.
    file.set_len(0)
        .and_then(|()| file.set_len(len))
        .map_err(|e| io_error(path, "size the file", e))?;
    let whole = usize::try_from(len).map_err(|_| SharedError::Capacity { asked: len })?;
    let mapping = Mapping::map(file, whole, path)?;
    let time = HostClock::choose();
    // Relaxed: the magic's Release store below publishes every field.
    let store = |at, value| mapping.word(at).store(value, Ordering::Relaxed);
    store(layout::VERSION_AT, layout::version_field(want.kind));
    store(layout::LEN_AT, len);
    match time {
        HostTime::Counter { scale } => {
            store(layout::TIME_AT, 1);
            store(layout::SCALE_AT, scale);
        }
        HostTime::Monotonic => store(layout::TIME_AT, 2),
    }
    let [boot0, boot1] = boot_id();
    store(layout::BOOT_AT, boot0);
    store(layout::BOOT_AT + 8, boot1);
    if let Kind::Keyed { capacity } = want.kind {
        store(layout::CAPACITY_AT, capacity);
        let [s0, s1] = seeds();
        store(layout::SEEDS_AT, s0);
        store(layout::SEEDS_AT + 8, s1);
    }
    (want.init)(&mapping);
    // Release: an opener that reads the magic sees every field above.
    mapping
        .word(layout::MAGIC_AT)
        .store(layout::MAGIC, Ordering::Release);
    Ok((mapping, want.kind, time))
}

/// Checks a finished file's header against its length and the kind asked for; returns
/// the file's kind (with its capacity).
fn check(mapping: &Mapping, len: u64, asked: Kind) -> Result<Kind, SharedError> {
    let path = mapping.path();
    let read = |at| mapping.word(at).load(Ordering::Relaxed);
    if read(layout::MAGIC_AT) != layout::MAGIC {
        return Err(SharedError::NotPaceline {
            path: path.to_owned(),
        });
    }
    let field = read(layout::VERSION_AT);
    let (version, code) = ((field >> 32) as u32, field as u32);
    if version != layout::VERSION {
        return Err(SharedError::Version {
            path: path.to_owned(),
            found: version,
            expected: layout::VERSION,
        });
    }
    let kind = match code {
        1 => Kind::Direct,
        2 => {
            let capacity = read(layout::CAPACITY_AT);
            if capacity == 0 || capacity > layout::MAX_CAPACITY {
                return Err(SharedError::Corrupt {
                    path: path.to_owned(),
                    field: "key capacity",
                });
            }
            Kind::Keyed { capacity }
        }
        _ => {
            return Err(SharedError::Corrupt {
                path: path.to_owned(),
                field: "kind",
            })
        }
    };
    let name = |kind: Kind| match kind {
        Kind::Direct => "direct",
        Kind::Keyed { .. } => "keyed",
    };
    if kind.code() != asked.code() {
        return Err(SharedError::Kind {
            path: path.to_owned(),
            found: name(kind),
            expected: name(asked),
        });
    }
    let expected = kind.file_len();
    if read(layout::LEN_AT) != expected || len != expected {
        return Err(SharedError::Length {
            path: path.to_owned(),
            found: len,
            expected,
        });
    }
    Ok(kind)
}

fn read_time(mapping: &Mapping) -> Option<HostTime> {
    let time = match mapping.word(layout::TIME_AT).load(Ordering::Relaxed) {
        1 => HostTime::Counter {
            scale: mapping.word(layout::SCALE_AT).load(Ordering::Relaxed),
        },
        2 => HostTime::Monotonic,
        _ => return None,
    };
    HostClock::can_read(time).then_some(time)
}

fn read_boot(mapping: &Mapping) -> [u64; 2] {
    [
        mapping.word(layout::BOOT_AT).load(Ordering::Relaxed),
        mapping.word(layout::BOOT_AT + 8).load(Ordering::Relaxed),
    ]
}

/// This boot's identity: the kernel's boot id on Linux, the boot time elsewhere.
fn boot_id() -> [u64; 2] {
    #[cfg(target_os = "linux")]
    {
        if let Ok(id) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            let hex: String = id.chars().filter(char::is_ascii_hexdigit).collect();
            if let Ok(id) = u128::from_str_radix(&hex, 16) {
                return [(id >> 64) as u64, id as u64];
            }
        }
        [0, 0]
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut boot = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let mut size = core::mem::size_of::<libc::timeval>();
        let mut mib = [libc::CTL_KERN, libc::KERN_BOOTTIME];
        // SAFETY: `mib` names a read-only `timeval`; `boot` and `size` are valid for it.
        let ok = unsafe {
            libc::sysctl(
                mib.as_mut_ptr(),
                2,
                (&raw mut boot).cast(),
                &mut size,
                core::ptr::null_mut(),
                0,
            )
        } == 0;
        if ok {
            [boot.tv_sec as u64, boot.tv_usec as u64]
        } else {
            [0, 0]
        }
    }
}

/// Seeds for a keyed file's key digests: drawn once, when the file is made.
fn seeds() -> [u64; 2] {
    use core::hash::BuildHasher;
    let state = std::hash::RandomState::new();
    [state.hash_one(1u8), state.hash_one(2u8)]
}

/// Refuses file systems whose mappings are not one memory for every process.
fn check_local(file: &File, path: &Path) -> Result<(), SharedError> {
    // SAFETY: an all-zero `statfs` is a valid value of that plain C struct.
    let mut stat: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: `file` is an open descriptor and `stat` a valid, writable `statfs`.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return Err(io_error(
            path,
            "read the file system's type",
            io::Error::last_os_error(),
        ));
    }
    match remote_filesystem(&stat) {
        Some(filesystem) => Err(SharedError::NotLocal {
            path: path.to_owned(),
            filesystem,
        }),
        None => Ok(()),
    }
}

#[cfg(target_os = "linux")]
fn remote_filesystem(stat: &libc::statfs) -> Option<String> {
    // The magic numbers of linux/magic.h for file systems whose pages are not shared
    // between the machine's processes through one page cache, or not coherently.
    const REMOTE: [(i64, &str); 7] = [
        (0x6969, "NFS"),
        (0x517B, "SMB"),
        (0xFE53_4D42, "SMB2"),
        (0xFF53_4D42, "CIFS"),
        (0x6573_5546, "FUSE"),
        (0x0102_1997, "9P"),
        (0x7366_746E, "NTFS over FUSE"),
    ];
    #[allow(clippy::unnecessary_cast)] // the field's type differs between C libraries
    let kind = stat.f_type as i64;
    REMOTE
        .iter()
        .find(|(magic, _)| *magic == kind)
        .map(|(_, name)| (*name).to_owned())
}

#[cfg(not(target_os = "linux"))]
fn remote_filesystem(stat: &libc::statfs) -> Option<String> {
    let name: String = stat
        .f_fstypename
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    ["nfs", "smbfs", "afpfs", "webdav", "osxfuse", "macfuse"]
        .contains(&name.as_str())
        .then_some(name)
}

/// An exclusive `flock` on a file, released when dropped (or when the process dies).
pub(crate) struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    pub(crate) fn exclusive(file: &'a File, path: &Path) -> Result<Flock<'a>, SharedError> {
        loop {
            // SAFETY: `file` is an open descriptor; `flock` takes no pointers.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Flock(file));
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(io_error(path, "lock the file", error));
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: as in `exclusive`; unlocking a lock we hold cannot fail in a way that
        // leaves it held.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

pub(crate) fn io_error(path: &Path, doing: &'static str, source: io::Error) -> SharedError {
    SharedError::Io {
        path: path.to_owned(),
        doing,
        source,
    }
}
