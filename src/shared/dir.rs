//! A shared file's directory, opened once: every later step (opening the file, making a
//! new one, linking it into place, renaming over an old one) is relative to that open
//! directory, so nothing can swap the directory (or a link on the way to it) between the
//! checks and the steps.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// An open directory and one name in it: the shared file's.
#[derive(Debug)]
pub(crate) struct Dir {
    dir: File,
    /// The directory's path, for messages.
    path: PathBuf,
    /// The file's name in it.
    name: CString,
}

/// `r` as an `io::Result`: `Err` with the system's error when negative.
fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Dir {
    /// Opens the directory of `path` (an absolute path with a file name).
    pub(crate) fn of(path: &Path) -> io::Result<Dir> {
        let parent = path.parent().unwrap_or(Path::new("/"));
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
        let c = CString::new(parent.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        Ok(Dir {
            // SAFETY: `fd` was just opened and is owned by nothing else.
            dir: unsafe { File::from_raw_fd(fd) },
            path: parent.to_owned(),
            name,
        })
    }

    /// The directory's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The directory, open (for its owner and mode).
    pub(crate) fn file(&self) -> &File {
        &self.dir
    }

    fn fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }

    /// `name` (the file's by default) opened with `flags` (and `mode` when made).
    fn open_at(&self, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
        // SAFETY: an open directory and a NUL-terminated name; the descriptor returned is
        // owned below.
        let fd = check(unsafe {
            libc::openat(
                self.fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// The file, for reading and writing: never through a link at the name, never
    /// blocking on a FIFO planted there.
    pub(crate) fn open_file(&self) -> io::Result<File> {
        self.open_at(
            &self.name,
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )
    }

    /// A new, unnamed file in the directory (`O_TMPFILE`), private to its owner; `None`
    /// where the file system has no unnamed files.
    #[cfg(target_os = "linux")]
    pub(crate) fn unnamed(&self) -> io::Result<Option<File>> {
        match self.open_at(c".", libc::O_TMPFILE | libc::O_RDWR, 0o600) {
            Ok(file) => Ok(Some(file)),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// A new file under a private temporary `name` (failing if it exists).
    pub(crate) fn temporary(&self, name: &CStr) -> io::Result<File> {
        self.open_at(
            name,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )
    }

    /// Gives the unnamed `file` the name `to` (failing if it exists).
    pub(crate) fn link_unnamed(&self, file: &File, to: &CStr) -> io::Result<()> {
        let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(io::Error::other)?;
        // SAFETY: NUL-terminated names, an open directory; `AT_FDCWD` for the absolute
        // `/proc` path.
        check(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                self.fd(),
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })
        .map(drop)
    }

    /// Links `from` (a name in the directory) as `to` (failing if it exists).
    pub(crate) fn link(&self, from: &CStr, to: &CStr) -> io::Result<()> {
        // SAFETY: NUL-terminated names in an open directory.
        check(unsafe { libc::linkat(self.fd(), from.as_ptr(), self.fd(), to.as_ptr(), 0) })
            .map(drop)
    }

    /// Renames `from` over `to`, replacing whatever `to` is.
    pub(crate) fn rename(&self, from: &CStr, to: &CStr) -> io::Result<()> {
        // SAFETY: NUL-terminated names in an open directory.
        check(unsafe { libc::renameat(self.fd(), from.as_ptr(), self.fd(), to.as_ptr()) }).map(drop)
    }

    /// Removes `name` (a file).
    pub(crate) fn unlink(&self, name: &CStr) -> io::Result<()> {
        // SAFETY: a NUL-terminated name in an open directory.
        check(unsafe { libc::unlinkat(self.fd(), name.as_ptr(), 0) }).map(drop)
    }

    /// The file's name in the directory.
    pub(crate) fn name(&self) -> &CStr {
        &self.name
    }

    /// The device and inode at `name`, not following a link; `None` if nothing is there.
    pub(crate) fn identity(&self, name: &CStr) -> Option<(u64, u64)> {
        // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
        let mut stat: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: a NUL-terminated name in an open directory, and a writable `stat`.
        let r = unsafe {
            libc::fstatat(
                self.fd(),
                name.as_ptr(),
                &mut stat,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        #[allow(clippy::unnecessary_cast)] // the fields' types differ between C libraries
        (r == 0).then_some((stat.st_dev as u64, stat.st_ino as u64))
    }
}
