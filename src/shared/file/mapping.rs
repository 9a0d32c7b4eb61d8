//! The mapping of a shared file: its words, reached only as atomics.

use core::ptr::NonNull;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::super::error::{io_error, SharedError};
use super::super::layout;
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

    /// The file's path, absolute (as it was when the file was opened).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn map(file: &File, len: usize, path: &Path) -> Result<Mapping, SharedError> {
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
