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

use core::ptr::NonNull;
use core::time::Duration;
use std::ffi::CString;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};
use std::time::Instant;

use super::dir::Dir;
use super::error::SharedError;
use super::layout::{self, Kind};
use super::options::OpenOptions;
use super::{process, trust};
use crate::clock::{HostClock, HostTime};
use crate::sync::{AtomicU64, Ordering};

/// The longest an opener waits for another process making a file anew.
pub const OPEN_PATIENCE: Duration = Duration::from_secs(1);

/// Opens of a path that found it changed under them (removed, or replaced) before one
/// stuck; past this the path is [`SharedError::Busy`].
const OPEN_ATTEMPTS: u32 = 64;

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

    /// The file's path, absolute (as it was when the file was opened).
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

    /// The name the file holds (at most [`layout::MAX_NAME_LEN`] bytes).
    pub(crate) fn name(&self) -> String {
        let len = (self.word(layout::NAME_LEN_AT).load(Ordering::Relaxed) as usize)
            .min(layout::MAX_NAME_LEN);
        let bytes: Vec<u8> = (0..layout::MAX_NAME_LEN / 8)
            .flat_map(|i| {
                self.word(layout::NAME_AT + 8 * i)
                    .load(Ordering::Relaxed)
                    .to_ne_bytes()
            })
            .take(len)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
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

/// Makes a new, finished file for `path` in `dir`, not yet at that path.
fn make<'a>(
    dir: &'a Dir,
    path: &Path,
    new: &New<'_>,
) -> Result<(NewFile<'a>, Opened), SharedError> {
    let made =
        NewFile::in_dir(dir).map_err(|e| io_error(path, "make the file in its directory", e))?;
    let file = &made.file;
    let (mode, group) = match new.options.trust_group {
        Some(gid) => (0o660, Some(gid)),
        None => (0o600, None),
    };
    if let Some(gid) = group {
        // SAFETY: `file` is an open descriptor; -1 keeps the owner.
        if unsafe { libc::fchown(file.as_raw_fd(), u32::MAX, gid) } != 0 {
            return Err(io_error(
                path,
                "give the new file to the trusted group",
                io::Error::last_os_error(),
            ));
        }
    }
    // No ACL entries a default ACL of the directory gave it, and exactly this mode,
    // whatever the process's umask.
    trust::strip_acl(file);
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_error(path, "set the new file's permissions", e))?;
    let len = new.kind.file_len();
    // Every page allocated now: a file system that runs out of room later would kill the
    // process that first touched a page it could not give (`SIGBUS`), where this is an
    // error. A new file no one else has: sizing it from 0 takes no page from any mapping.
    allocate(file, len).map_err(|e| io_error(path, "allocate the new file's space", e))?;
    let whole = usize::try_from(len).map_err(|_| SharedError::Capacity { asked: len })?;
    let mapping = Mapping::map(file, whole, path)?;
    let time = HostClock::choose();
    // Relaxed: the magic's Release store below publishes every field.
    let store = |at, value| mapping.word(at).store(value, Ordering::Relaxed);
    store(layout::VERSION_AT, layout::version_field(new.kind));
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
    if let Kind::Keyed { capacity } = new.kind {
        store(layout::CAPACITY_AT, capacity);
        store(layout::BUCKETS_AT, layout::buckets(capacity));
        for (i, seed) in seeds().into_iter().enumerate() {
            store(layout::SEEDS_AT + 8 * i, seed);
        }
    }
    if let Some(name) = &new.options.name {
        let mut bytes = [0u8; layout::MAX_NAME_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        store(layout::NAME_LEN_AT, name.len() as u64);
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let word = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
            store(layout::NAME_AT + 8 * i, word);
        }
    }
    (new.init)(&mapping);
    // Release: an opener that reads the magic sees every field above.
    mapping
        .word(layout::MAGIC_AT)
        .store(layout::MAGIC, Ordering::Release);
    let meta = file
        .metadata()
        .map_err(|e| io_error(path, "read the new file's identity", e))?;
    Ok((
        made,
        Opened {
            mapping,
            kind: new.kind,
            time,
            identity: (meta.dev(), meta.ino()),
        },
    ))
}

/// Sizes a new file to `len` bytes with every page allocated (zeroed).
fn allocate(file: &File, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
        // SAFETY: an open descriptor; `posix_fallocate` takes no pointers.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
            0 => return Ok(()),
            // A file system that cannot allocate ahead: sized below, and written through.
            libc::EOPNOTSUPP | libc::EINVAL => {}
            error => return Err(io::Error::from_raw_os_error(error)),
        }
    }
    file.set_len(len)?;
    // Writing every page makes the file system find room for it now.
    let zeros = vec![0u8; 1 << 16];
    let mut at = 0;
    while at < len {
        let chunk = (len - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..chunk], at)?;
        at += chunk as u64;
    }
    Ok(())
}

/// A new file in the shared file's directory, with no name yet (`O_TMPFILE`) or under a
/// private temporary one, which is removed when dropped.
struct NewFile<'a> {
    file: File,
    /// The temporary name, while it has one.
    named: Option<CString>,
    dir: &'a Dir,
}

impl<'a> NewFile<'a> {
    fn in_dir(dir: &'a Dir) -> io::Result<NewFile<'a>> {
        #[cfg(target_os = "linux")]
        if let Some(file) = dir.unnamed()? {
            return Ok(NewFile {
                file,
                named: None,
                dir,
            });
        }
        let name = temporary_name(dir);
        let file = dir.temporary(&name)?;
        Ok(NewFile {
            file,
            named: Some(name),
            dir,
        })
    }

    /// Links the file at the shared file's name; `false` if something is there already.
    fn link_at(mut self) -> io::Result<bool> {
        let dir = self.dir;
        let linked = match self.named.take() {
            Some(name) => {
                let linked = dir.link(&name, dir.name());
                let _ = dir.unlink(&name);
                linked
            }
            None => dir.link_unnamed(&self.file, dir.name()),
        };
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Puts the file at the shared file's name in place of whatever is there.
    fn rename_over(mut self) -> io::Result<()> {
        let dir = self.dir;
        let name = match self.named.take() {
            Some(name) => name,
            None => {
                let name = temporary_name(dir);
                dir.link_unnamed(&self.file, &name)?;
                name
            }
        };
        let renamed = dir.rename(&name, dir.name());
        if renamed.is_err() {
            let _ = dir.unlink(&name);
        }
        renamed
    }
}

impl Drop for NewFile<'_> {
    fn drop(&mut self) {
        if let Some(name) = &self.named {
            let _ = self.dir.unlink(name);
        }
    }
}

/// A name in the directory no other opener picks: hidden, after the file it is made for,
/// with this process's id and a count.
fn temporary_name(dir: &Dir) -> CString {
    static COUNT: StdAtomicU64 = StdAtomicU64::new(0);
    // Relaxed: a counter that only has to differ between calls.
    let n = COUNT.fetch_add(1, StdOrdering::Relaxed);
    let mut name = b".".to_vec();
    name.extend_from_slice(dir.name().to_bytes());
    name.extend_from_slice(format!(".{}-{n}.paceline-new", std::process::id()).as_bytes());
    CString::new(name).expect("a file name holds no NUL byte")
}

/// Checks a finished file's header against its length and the kind asked for; returns
/// the file's kind (with its capacity).
fn check(header: &Mapping, len: u64, asked: Kind) -> Result<Kind, SharedError> {
    let path = header.path();
    let read = |at| header.word(at).load(Ordering::Relaxed);
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
            if capacity == 0
                || capacity > layout::MAX_CAPACITY
                || read(layout::BUCKETS_AT) != layout::buckets(capacity)
            {
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
fn seeds() -> [u64; layout::SEEDS] {
    use core::hash::BuildHasher;
    let state = std::hash::RandomState::new();
    core::array::from_fn(|i| state.hash_one(i))
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

/// Whether `path` (not following a link) is still the file of `identity`: false once the
/// file was removed or replaced at its path.
pub(crate) fn is_at(path: &Path, identity: (u64, u64)) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == identity)
}

pub(crate) fn io_error(path: &Path, doing: &'static str, source: io::Error) -> SharedError {
    SharedError::Io {
        path: path.to_owned(),
        doing,
        source,
    }
}
