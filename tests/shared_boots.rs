//! Shared files from an earlier boot, and a file system out of room: a file made in
//! another boot is made anew only for the same limit and only when its maker is gone, and
//! a file that cannot be given its length is an error at opening, never a SIGBUS later.

#![cfg(target_os = "linux")]

use std::fs;
use std::path::Path;

use std::process::Command;

use paceline::shared::{OpenOptions, SharedError, SharedKeyedLimiter, SharedLimiter};
use paceline::Quota;

mod common;
use common::dir::Dir;

/// Writes `value` at byte `at` of the file at `path`, in place.
fn write_word(path: &Path, at: u64, value: u64) {
    use std::os::unix::fs::FileExt;
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_at(&value.to_ne_bytes(), at).unwrap();
}

/// Whole seconds on `CLOCK_MONOTONIC`, as the file's claims record them.
fn seconds() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable `timespec`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 & 0xffff_ffff
}

#[test]
fn an_earlier_boots_file_of_another_limit_is_not_made_anew_under_a_new_name() {
    let shm = Dir::sticky("stale-name");
    let path = shm.path("limit");
    let quota = Quota::per_minute(5);
    SharedKeyedLimiter::open_with(&path, quota, 64, OpenOptions::new().name("login")).unwrap();
    write_word(&path, 40, 0x1234); // the boot id: made in another boot
    let before = fs::read(&path).unwrap();
    let other = SharedKeyedLimiter::open_with(&path, quota, 64, OpenOptions::new().name("per-ip"));
    assert!(
        matches!(other, Err(SharedError::NameMismatch { .. })),
        "{other:?}"
    );
    assert_eq!(fs::read(&path).unwrap(), before);
    let login = SharedKeyedLimiter::open_with(&path, quota, 64, OpenOptions::new().name("login"));
    assert_eq!(login.unwrap().name(), "login");
}

#[test]
fn an_earlier_boots_file_claimed_long_ago_by_a_live_process_id_is_made_anew() {
    let shm = Dir::sticky("stale-remaker");
    let path = shm.path("direct");
    SharedLimiter::open(&path, Quota::per_second(10)).unwrap();
    write_word(&path, 40, 0x1234); // made in another boot
                                   // Claimed for remaking by a process id that is alive (this one; a container's pid 1
                                   // killed while remaking, restarted), a minute ago.
    let claim = u64::from(std::process::id()) << 32 | seconds().saturating_sub(60).max(1);
    write_word(&path, 80, claim);
    let reopened = SharedLimiter::open(&path, Quota::per_second(10));
    assert!(reopened.is_ok(), "{:?}", reopened.err());
}

#[test]
fn a_file_system_out_of_room_is_an_error_at_opening_never_a_sigbus_later() {
    // A 1 MiB tmpfs of our own (root only; elsewhere there is nothing to mount).
    // SAFETY: `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let shm = Dir::sticky("small");
    let mount = shm.path("tmpfs");
    fs::create_dir(&mount).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mount)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: this machine does not let the tests mount a tmpfs");
        return;
    }
    // A table of 65 536 keys takes 4 MiB: refused when made, not killed when filled.
    let opened = SharedKeyedLimiter::open(mount.join("keys"), Quota::per_hour(1), 65_536);
    let full_file = fs::metadata(mount.join("keys")).is_ok();
    let _ = Command::new("umount").arg(&mount).status();
    match opened {
        Err(e @ SharedError::Io { .. }) => {
            assert!(e.to_string().contains("allocate"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!full_file, "a half-made file was left at the path");
}
