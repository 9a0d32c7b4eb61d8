//! Checking a file found at the path: its header, its boot, its file system.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::super::error::{io_error, SharedError};
use super::super::layout::{self, Kind};
use super::Mapping;
use crate::clock::{HostClock, HostTime};
use crate::sync::Ordering;

/// Checks a finished file's header against its length and the kind asked for; returns
/// the file's kind (with its capacity).
pub(super) fn check(header: &Mapping, len: u64, asked: Kind) -> Result<Kind, SharedError> {
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
        3 => {
            let dims = read(layout::CAPACITY_AT);
            if dims > layout::MAX_DIMENSIONS as u64 {
                return Err(SharedError::Corrupt {
                    path: path.to_owned(),
                    field: "dimensions",
                });
            }
            Kind::Budget { dims }
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
        Kind::Budget { .. } => "budget",
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

pub(super) fn read_time(mapping: &Mapping) -> Option<HostTime> {
    let time = match mapping.word(layout::TIME_AT).load(Ordering::Relaxed) {
        1 => HostTime::Counter {
            scale: mapping.word(layout::SCALE_AT).load(Ordering::Relaxed),
        },
        2 => HostTime::Monotonic,
        _ => return None,
    };
    HostClock::can_read(time).then_some(time)
}

pub(super) fn read_boot(mapping: &Mapping) -> [u64; 2] {
    [
        mapping.word(layout::BOOT_AT).load(Ordering::Relaxed),
        mapping.word(layout::BOOT_AT + 8).load(Ordering::Relaxed),
    ]
}

/// This boot's identity: the kernel's boot id on Linux, the boot time elsewhere.
pub(super) fn boot_id() -> [u64; 2] {
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

/// Refuses file systems whose mappings are not one memory for every process.
pub(super) fn check_local(file: &File, path: &Path) -> Result<(), SharedError> {
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
