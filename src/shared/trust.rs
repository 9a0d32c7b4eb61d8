//! Whom a shared file (and its directory) is trusted from: this process's effective user,
//! root, and the user or group the caller names ([`OpenOptions`]); nobody else may be able
//! to write either.
//!
//! # Implementation notes
//!
//! * **The file** must be a regular file owned by a trusted user, writable by no one but
//!   its owner and, with [`OpenOptions::trust_group`], that group. A file of the trusted
//!   group is trusted whoever owns it only if that owner belongs to the group: a file
//!   another user made in a set-group-id directory takes the directory's group without
//!   its maker being a member. A file with an access ACL that grants anything beyond its
//!   owner (a directory's default ACL gives new files named entries) is refused: its mode
//!   bits do not say who can write it. paceline's own new files have no ACL entries.
//! * **The directory** must be owned by a trusted user (or root), and if others (or an
//!   untrusted group) can write it, be sticky (`/tmp`, `/dev/shm`): otherwise whoever can
//!   write it can remove the file and put another in its place, or is the directory's
//!   owner (a link planted on the way to the directory leads here too).
//! * **A directory's access ACL** whose mask grants write (its group bits) is taken to let
//!   others write it: its named entries, not its mode, say who can.
//! * **The way there**: every directory above it, both as the path is written and as it
//!   resolves, by the same rule (whoever can rename an entry of one can move another
//!   directory into its place, so that processes opening the same path reach different
//!   files), and every link on the way as written must be owned by a trusted user (its
//!   owner can point it elsewhere at any time).

use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use super::error::{io_error, SharedError};
use super::options::OpenOptions;
use super::users::member;

/// This process's effective user id.
fn me() -> u32 {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `uid` is trusted as an owner: this process's user, root, or the named one.
fn trusted_user(uid: u32, options: &OpenOptions) -> bool {
    uid == me() || uid == 0 || options.trust_user == Some(uid)
}

/// Refuses what is not a regular file, or a file that someone the caller does not trust
/// owns or can write (module docs).
pub(super) fn check_file(
    file: Option<&File>,
    meta: &Metadata,
    path: &Path,
    options: &OpenOptions,
) -> Result<(), SharedError> {
    let kind = meta.file_type();
    if !kind.is_file() {
        let found = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return Err(SharedError::NotAFile {
            path: path.to_owned(),
            found,
        });
    }
    let (owner, group, mode) = (meta.uid(), meta.gid(), meta.mode() & 0o7777);
    let group_trusted = options.trust_group == Some(group);
    let why = if mode & 0o002 != 0 {
        Some("anyone on the host can write it")
    } else if mode & 0o020 != 0 && !group_trusted {
        Some("its group can write it, and that group is not trusted")
    } else if !(trusted_user(owner, options) || group_trusted && member(owner, group)) {
        Some("another user owns it")
    } else if file.is_some_and(|f| grants_others(f, mode)) {
        Some("an access ACL lets users other than its owner at it")
    } else {
        None
    };
    untrusted(meta, path, why)
}

/// Refuses a directory that someone the caller does not trust owns or can swap files in
/// (module docs).
pub(super) fn check_dir(dir: &File, path: &Path, options: &OpenOptions) -> Result<(), SharedError> {
    let meta = dir
        .metadata()
        .map_err(|e| io_error(path, "read the directory's owner", e))?;
    let acl = grants_others(dir, meta.mode());
    let why = swappable(&meta, acl, options).map(|why| match why {
        Swap::Owner => "it is the file's directory, and another user owns it",
        Swap::Others => "it is the file's directory, and others can remove or replace files in it",
        Swap::Acl => "it is the file's directory, and an access ACL lets other users write it",
    });
    untrusted(&meta, path, why)
}

/// Refuses a way to the file's directory that someone the caller does not trust could
/// change (module docs): a directory on it (as the path is written, and as it resolves)
/// that such a user owns or can rename entries in, or a link on it that such a user owns.
pub(super) fn check_way(file: &Path, options: &OpenOptions) -> Result<(), SharedError> {
    let Some(dir) = file.parent() else {
        return Ok(());
    };
    let resolved =
        std::fs::canonicalize(dir).map_err(|e| io_error(dir, "resolve the file's directory", e))?;
    for way in [dir, resolved.as_path()] {
        // Every directory above the file's own (which `check_dir` checks).
        for above in way.ancestors().skip(1) {
            check_step(above, options)?;
        }
        // Every link on the way, as written.
        let mut prefix = std::path::PathBuf::new();
        for part in way.components() {
            prefix.push(part);
            let meta = std::fs::symlink_metadata(&prefix)
                .map_err(|e| io_error(&prefix, "read a directory on the way", e))?;
            if meta.file_type().is_symlink() && !trusted_user(meta.uid(), options) {
                return untrusted(
                    &meta,
                    &prefix,
                    Some("it is a link on the way to the file, and another user owns it"),
                );
            }
        }
    }
    Ok(())
}

/// Refuses `dir`, a directory above the file's, if someone untrusted could swap it.
fn check_step(dir: &Path, options: &OpenOptions) -> Result<(), SharedError> {
    let opened = File::open(dir).map_err(|e| io_error(dir, "open a directory on the way", e))?;
    let meta = opened
        .metadata()
        .map_err(|e| io_error(dir, "read a directory on the way", e))?;
    let acl = grants_others(&opened, meta.mode());
    let why = swappable(&meta, acl, options).map(|why| match why {
        Swap::Owner => "it is a directory on the way to the file, and another user owns it",
        Swap::Others => {
            "it is a directory on the way to the file, and others can rename or replace \
             what is in it"
        }
        Swap::Acl => {
            "it is a directory on the way to the file, and an access ACL lets other users \
             write it"
        }
    });
    untrusted(&meta, dir, why)
}

/// Who could swap what a directory holds.
enum Swap {
    /// An untrusted user owns it.
    Owner,
    /// Others (or an untrusted group) can write it, and it is not sticky.
    Others,
    /// An access ACL names users or groups who may write it (its mode bits do not say
    /// who), and it is not sticky.
    Acl,
}

/// Who could swap what a directory holds: its owner, its mode, and whether an access ACL
/// gives write to users or groups its mode does not name (`acl`).
fn swappable(meta: &Metadata, acl: bool, options: &OpenOptions) -> Option<Swap> {
    let (owner, group, mode) = (meta.uid(), meta.gid(), meta.mode() & 0o7777);
    let sticky = mode & 0o1000 != 0;
    let group_trusted = options.trust_group == Some(group) || group == 0;
    if !trusted_user(owner, options) {
        Some(Swap::Owner)
    } else if !sticky && (mode & 0o002 != 0 || mode & 0o020 != 0 && !group_trusted) {
        Some(Swap::Others)
    } else if !sticky && acl && mode & 0o020 != 0 {
        // With an ACL, the group bits are its mask: write there may be anyone's it names.
        Some(Swap::Acl)
    } else {
        None
    }
}

/// `Ok` without a reason, else [`SharedError::Untrusted`] for `path` and its owner.
fn untrusted(meta: &Metadata, path: &Path, why: Option<&'static str>) -> Result<(), SharedError> {
    let (owner, group, mode) = (meta.uid(), meta.gid(), meta.mode() & 0o7777);
    match why {
        None => Ok(()),
        Some(why) => Err(SharedError::Untrusted {
            path: path.to_owned(),
            owner,
            group,
            mode,
            user: me(),
            why,
        }),
    }
}

/// The name of the extended attribute that holds a file's access ACL (Linux).
#[cfg(target_os = "linux")]
const ACL: &core::ffi::CStr = c"system.posix_acl_access";

/// Whether `file` has an access ACL while its group bits (the ACL's mask) grant anything:
/// its named entries may then let other users write it.
fn grants_others(file: &File, mode: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        if mode & 0o070 == 0 {
            return false;
        }
        // SAFETY: an open descriptor, a NUL-terminated name, and no buffer (size 0): the
        // call only reports the attribute's size.
        let size =
            unsafe { libc::fgetxattr(file.as_raw_fd(), ACL.as_ptr(), core::ptr::null_mut(), 0) };
        size > 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, mode);
        false
    }
}

/// Removes an access ACL a new file inherited from its directory's default ACL, so that
/// its mode bits alone say who can use it.
pub(super) fn strip_acl(file: &File) {
    #[cfg(target_os = "linux")]
    // SAFETY: an open descriptor and a NUL-terminated name. A file without one (or a file
    // system without ACLs) answers an error, which changes nothing.
    unsafe {
        libc::fremovexattr(file.as_raw_fd(), ACL.as_ptr());
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}
