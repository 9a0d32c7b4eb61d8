//! Making a new file: unnamed, allocated, filled in, its magic last (`super`'s notes).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use super::super::dir::Dir;
use super::super::error::{io_error, SharedError};
use super::super::layout::{self, Kind};
use super::super::trust;
use super::header::boot_id;
use super::{Mapping, New, Opened};
use crate::clock::{HostClock, HostTime};
use crate::sync::Ordering;

/// Makes a new, finished file for `path` in `dir`, not yet at that path.
pub(super) fn make<'a>(
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
    if let Kind::Budget { dims } = new.kind {
        store(layout::CAPACITY_AT, dims);
    }
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
pub(super) struct NewFile<'a> {
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
    pub(super) fn link_at(mut self) -> io::Result<bool> {
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
    pub(super) fn rename_over(mut self) -> io::Result<()> {
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

/// Seeds for a keyed file's key digests: drawn once, when the file is made.
fn seeds() -> [u64; layout::SEEDS] {
    use core::hash::BuildHasher;
    let state = std::hash::RandomState::new();
    core::array::from_fn(|i| state.hash_one(i))
}
