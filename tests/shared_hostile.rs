//! Shared files in hostile hands, with real processes: another local user (this test
//! binary run again as `nobody` through `setpriv`, when the tests run as root, as CI does),
//! a process holding a lock on the file, and a claimer that stops while it holds a bucket.
//!
//! The other-user tests need root and `setpriv` (util-linux); elsewhere they say so and
//! pass, unless `PACELINE_REQUIRE_OTHER_USER=1` (set by CI) makes that a failure.

#![cfg(target_os = "linux")]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use paceline::shared::{
    OnMismatch, OpenOptions, SharedError, SharedKeyedLimiter, SharedLimiter, CLAIM_PATIENCE,
};
use paceline::Quota;

mod common;
use common::children::{monotonic, spawn, CHILD_ARGS};
use common::dir::Dir as Shm;

const NOBODY: u32 = 65534;

/// Whether this run can act as another user (root, with `setpriv`); if not, says so, and
/// fails when CI asks for these tests.
fn can_switch_user() -> bool {
    // SAFETY: `geteuid` has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && installed("setpriv") {
        return true;
    }
    let why = "needs root and setpriv to run a process as another user";
    assert!(
        std::env::var_os("PACELINE_REQUIRE_OTHER_USER").is_none(),
        "{why}"
    );
    eprintln!("skipped: {why}");
    false
}

/// A sticky directory for a test that acts as another user, or `None` where this run
/// cannot ([`can_switch_user`]).
fn other_user_dir(name: &str) -> Option<Shm> {
    can_switch_user().then(|| Shm::sticky(name))
}

/// Whether `program` is installed (it answers `--version`).
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `command` (a program and its arguments) as `nobody`, with no groups; whether it
/// succeeded.
fn nobody_runs<S: AsRef<std::ffi::OsStr>>(command: &[S]) -> bool {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(command)
        .status()
        .unwrap()
        .success()
}

/// Runs `setfacl` with `args` on `path`; whether it succeeded.
fn setfacl(args: &[&str], path: &Path) -> bool {
    Command::new("setfacl")
        .args(args)
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

/// Asserts that opening a shared file was refused with a message that says `because`.
fn assert_refused<T: std::fmt::Debug>(opened: Result<T, SharedError>, because: &str) {
    let refused = opened.unwrap_err();
    assert!(refused.to_string().contains(because), "{refused}");
}

/// Asserts that opening a limiter at `path` is refused with a message that says `because`,
/// and makes no file there (nor where a link there leads).
fn assert_open_refused(path: &Path, because: &str) {
    assert_refused(SharedLimiter::open(path, Quota::per_second(1)), because);
    assert!(!path.exists(), "a file was made at {}", path.display());
}

/// Makes directory `path` with `mode`.
fn make_dir(path: &Path, mode: u32) {
    fs::create_dir(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// This test binary, copied where `nobody` can run it (the build directory may be under a
/// home `nobody` cannot enter).
fn binary_for_others(shm: &Shm) -> PathBuf {
    let bin = shm.path("test-binary");
    if !bin.exists() {
        fs::copy(std::env::current_exe().unwrap(), &bin).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

/// Runs `role` (the ignored test `child` of this binary) as `nobody`, with `vars`; returns
/// what it printed.
fn as_nobody(shm: &Shm, role: &str, vars: &[(&str, &Path)], groups: &str) -> String {
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"));
    if groups.is_empty() {
        command.arg("--clear-groups");
    } else {
        command.arg(format!("--groups={groups}"));
    }
    command
        .arg(binary_for_others(shm))
        .args(CHILD_ARGS)
        .env("PACELINE_CHILD", role)
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (name, value) in vars {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{role} as nobody failed: {:?}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // The harness may print its "test child ... " before our line, on the same line.
        .filter_map(|line| line.split_once("said: ").map(|(_, said)| said))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A key that refills in a millisecond: every new key of a busy claimer takes a slot.
fn quick() -> Quota {
    Quota::per_second(1000).with_burst(1)
}

/// The roles a child plays (run as `nobody` or as a plain process).
#[test]
#[ignore = "a child role, started by the other tests"]
fn child() {
    let Ok(role) = std::env::var("PACELINE_CHILD") else {
        return;
    };
    let path = std::env::var_os("PACELINE_PATH").map(PathBuf::from);
    let say = |what: &str| println!("said: {what}");
    match role.as_str() {
        "plant-empty" => {
            let path = path.unwrap();
            fs::write(&path, b"").unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        }
        "plant-link" => {
            let target = std::env::var_os("PACELINE_TARGET").unwrap();
            std::os::unix::fs::symlink(target, path.unwrap()).unwrap();
        }
        "make" => {
            SharedLimiter::open(path.unwrap(), Quota::per_second(10)).unwrap();
        }
        "take-over" => {
            // The attack: open the service's file with a huge quota, replacing its own.
            let huge = Quota::per_second(1_000_000_000);
            match SharedLimiter::open_with(path.unwrap(), huge, OnMismatch::Replace) {
                Ok(_) => say("opened"),
                Err(e) => say(&format!("refused: {e}")),
            }
        }
        "truncate" => {
            let opened = fs::OpenOptions::new().write(true).open(path.unwrap());
            match opened.and_then(|f| f.set_len(0)) {
                Ok(()) => say("truncated"),
                Err(e) => say(&format!("refused: {e}")),
            }
        }
        "group-member" => {
            let group = std::env::var("PACELINE_GROUP").unwrap().parse().unwrap();
            let options = OpenOptions::new().trust_group(group);
            let limiter =
                SharedKeyedLimiter::open_with(path.unwrap(), Quota::per_hour(2), 64, options)
                    .unwrap();
            let admitted = (0..3).filter(|_| limiter.check_key("k").is_ok()).count();
            say(&format!("admitted {admitted}"));
        }
        "claim-forever" => {
            // A claimer of new keys, stopped at random points by the parent.
            let limiter = SharedKeyedLimiter::open(path.unwrap(), quick(), 64).unwrap();
            for i in 0u64.. {
                let _ = limiter.check_key(format!("child-{i}"));
                if i % 64 == 63 {
                    limiter.retain_recent();
                }
            }
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn another_users_file_at_the_path_is_refused_and_left_as_it_is() {
    let Some(shm) = other_user_dir("planted") else {
        return;
    };
    // `nobody` plants an empty file anyone can write where the service will look.
    let planted = shm.path("api");
    as_nobody(&shm, "plant-empty", &[("PACELINE_PATH", &planted)], "");
    let refused = SharedLimiter::open(&planted, Quota::per_second(10)).unwrap_err();
    let text = refused.to_string();
    assert!(
        matches!(refused, SharedError::Untrusted { owner: NOBODY, .. }),
        "{text}"
    );
    for part in [
        "uid 65534",
        "mode 0666",
        "anyone on the host can write it",
        "Remove the file",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    let meta = fs::metadata(&planted).unwrap();
    assert_eq!(
        (meta.len(), meta.uid(), meta.mode() & 0o777),
        (0, NOBODY, 0o666)
    );
    // A real paceline file that `nobody` made, private to it: refused too (its owner can
    // set any quota in it), unless the caller trusts that user.
    let theirs = shm.path("theirs");
    as_nobody(&shm, "make", &[("PACELINE_PATH", &theirs)], "");
    assert_refused(
        SharedLimiter::open(&theirs, Quota::per_second(10)),
        "another user owns it",
    );
    let trusted = OpenOptions::new().trust_user(NOBODY);
    assert!(SharedLimiter::open_with(&theirs, Quota::per_second(10), trusted).is_ok());
}

#[test]
fn another_user_can_neither_take_over_nor_truncate_the_services_file() {
    let Some(shm) = other_user_dir("ours") else {
        return;
    };
    let path = shm.path("api");
    let service = SharedLimiter::open(&path, Quota::per_second(10)).unwrap();
    let said = as_nobody(&shm, "take-over", &[("PACELINE_PATH", &path)], "");
    assert!(said.starts_with("refused: "), "{said}");
    assert!(said.contains("Permission denied"), "{said}");
    let said = as_nobody(&shm, "truncate", &[("PACELINE_PATH", &path)], "");
    assert!(said.starts_with("refused: "), "{said}");
    // The service still holds its own quota: 10 at once, then no more.
    assert_eq!(service.quota(), Quota::per_second(10));
    assert_eq!((0..100).filter(|_| service.check().is_ok()).count(), 10);
}

#[test]
fn a_link_another_user_plants_is_never_followed() {
    let Some(shm) = other_user_dir("link") else {
        return;
    };
    let victim = shm.path("victim-dir");
    fs::create_dir(&victim).unwrap();
    let target = victim.join("made-by-the-service");
    let link = shm.path("api");
    as_nobody(
        &shm,
        "plant-link",
        &[("PACELINE_PATH", &link), ("PACELINE_TARGET", &target)],
        "",
    );
    let refused = SharedKeyedLimiter::open(&link, Quota::per_second(10), 64).unwrap_err();
    assert!(matches!(refused, SharedError::Link { .. }), "{refused}");
    assert!(!target.exists(), "the planted link was followed");
}

#[test]
fn users_of_a_trusted_group_share_one_file() {
    let Some(shm) = other_user_dir("group") else {
        return;
    };
    let path = shm.path("per-client");
    // The service (root) makes the file for group `nobody` (65534): mode 0660.
    let options = OpenOptions::new().trust_group(NOBODY);
    let service = SharedKeyedLimiter::open_with(&path, Quota::per_hour(2), 64, options).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!((meta.gid(), meta.mode() & 0o777), (NOBODY, 0o660));
    assert!(service.check_key("k").is_ok());
    // A worker running as `nobody`, in that group, shares the key's quota.
    let said = as_nobody(
        &shm,
        "group-member",
        &[
            ("PACELINE_PATH", &path),
            ("PACELINE_GROUP", Path::new("65534")),
        ],
        "65534",
    );
    assert_eq!(said, "admitted 1");
    assert!(service.check_key("k").is_err());
}

#[test]
fn a_lock_someone_holds_on_the_file_delays_no_one() {
    let shm = Shm::sticky("flock");
    let path = shm.path("keys");
    let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(100), 1024).unwrap();
    // Anyone who can open the file could hold a lock on it: shared, then exclusive.
    for lock in [libc::LOCK_SH, libc::LOCK_EX] {
        let file = fs::File::open(&path).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: an open descriptor; `flock` takes no pointers.
        let locked = unsafe { libc::flock(fd, lock) };
        assert_eq!(locked, 0);
        let started = Instant::now();
        for i in 0..100 {
            assert!(limiter.check_key(format!("new-{lock}-{i}")).is_ok());
        }
        let other = SharedKeyedLimiter::open(&path, Quota::per_second(100), 1024).unwrap();
        assert!(other.check_key(format!("another-{lock}")).is_ok());
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "{took:?} with a lock held");
        drop(file);
    }
}

/// Writes a claim of process `pid`, taken now, into the first bucket's lock word of a
/// keyed file (offset 512: the process id, then the second on `CLOCK_MONOTONIC`): as that
/// process would while it holds the bucket.
fn hold_first_bucket(path: &Path, pid: u32) {
    use std::os::unix::fs::FileExt;
    let seconds = monotonic() / 1_000_000_000;
    let claim = u64::from(pid) << 32 | (seconds & 0xffff_ffff);
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_at(&claim.to_ne_bytes(), 512).unwrap();
}

#[test]
fn a_claimer_that_stops_holding_a_bucket_delays_new_keys_at_most_the_patience_and_one_that_dies_not_at_all(
) {
    let shm = Shm::sticky("stopped");
    let path = shm.path("keys");
    // Made for 64 keys: one bucket, so every new key needs the lock.
    let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(10), 64).unwrap();
    limiter.check_key("stored").unwrap();
    // A live process that holds the bucket and never lets go (stopped, say).
    let mut holder: Child = Command::new("sleep").arg("30").spawn().unwrap();
    hold_first_bucket(&path, holder.id());
    let started = Instant::now();
    let refused = limiter.check_key("new").unwrap_err();
    let took = started.elapsed();
    assert!(refused.is_table_full(), "{refused}");
    assert!(took >= CLAIM_PATIENCE, "{took:?}");
    assert!(took < CLAIM_PATIENCE + Duration::from_secs(1), "{took:?}");
    // Keys already stored never wait for the lock.
    let started = Instant::now();
    for _ in 0..1000 {
        let _ = limiter.check_key("stored");
    }
    assert!(started.elapsed() < Duration::from_millis(500));
    // Once the holder is gone, the next claimer takes the lock over at once.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let started = Instant::now();
    assert!(limiter.check_key("new").is_ok());
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_claimer_stopped_at_random_points_never_blocks_another_processs_new_keys() {
    let shm = Shm::sticky("sigstop");
    let path = shm.path("keys");
    let limiter = SharedKeyedLimiter::open(&path, quick(), 64).unwrap();
    let mut child = spawn(
        "claim-forever",
        &[("PACELINE_PATH", path.to_str().unwrap().to_owned())],
    );
    let pid = child.id() as libc::pid_t;
    std::thread::sleep(Duration::from_millis(200));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut slowest = Duration::ZERO;
    for trial in 0..30 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(seed % 3000));
        // SAFETY: signals to our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        // The child goes on when this check is done, or after a second if the check is
        // still waiting for it then.
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let go_on = std::thread::spawn(move || {
            let _ = wait.recv_timeout(Duration::from_secs(1));
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        });
        let started = Instant::now();
        let _ = limiter.check_key(format!("parent-{trial}"));
        slowest = slowest.max(started.elapsed());
        limiter.retain_recent();
        let _ = done.send(());
        go_on.join().unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        slowest < CLAIM_PATIENCE + Duration::from_millis(500),
        "a new key waited {slowest:?} for a stopped claimer"
    );
}

#[test]
fn a_stored_keys_booking_never_waits_for_a_busy_bucket_or_is_refused_as_full() {
    let shm = Shm::sticky("stored-booking");
    let path = shm.path("keys");
    let limiter =
        std::sync::Arc::new(SharedKeyedLimiter::open(&path, Quota::per_second(10), 64).unwrap());
    limiter.check_key("stored").unwrap(); // stored, 9 cells left
    let mut holder = Command::new("sleep").arg("30").spawn().unwrap();
    hold_first_bucket(&path, holder.id()); // the only bucket's lock, held and never let go
    let started = Instant::now();
    let booked = std::sync::Arc::clone(&limiter).reserve_key_within_owned(
        "stored",
        1,
        Duration::from_secs(5),
    );
    let took = started.elapsed();
    limiter.hold_key_for("stored", Duration::from_millis(1));
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        booked.is_ok(),
        "a stored key with cells left was refused: {:?}",
        booked.err()
    );
    assert!(took < CLAIM_PATIENCE, "{took:?}");
}

#[test]
fn a_reset_moves_this_processs_waiters_up_and_ends_their_hold() {
    let shm = Shm::sticky("reset");
    let limiter =
        std::sync::Arc::new(SharedLimiter::open(shm.path("d"), Quota::per_second(10)).unwrap());
    limiter.hold_for(Duration::from_secs(8));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let limiter = std::sync::Arc::clone(&limiter);
            std::thread::spawn(move || {
                let started = Instant::now();
                limiter.wait();
                started.elapsed()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    limiter.reset();
    for waiter in waiters {
        let waited = waiter.join().unwrap();
        assert!(
            waited < Duration::from_secs(3),
            "waited {waited:?} after a reset"
        );
    }
}

#[test]
fn a_directory_another_user_owns_or_anyone_can_swap_files_in_is_refused() {
    let shm = Shm::sticky("dirs");
    // Anyone can write it and it is not sticky: anyone could replace the file.
    let open_dir = shm.path("open");
    make_dir(&open_dir, 0o777);
    assert_open_refused(&open_dir.join("f"), "others can remove or replace");
    if !can_switch_user() {
        return;
    }
    // A directory of `nobody`'s, reached through a link it planted where the service
    // expected its own directory.
    let theirs = shm.path("theirs");
    let planted = shm.path("app");
    let code = format!(
        "mkdir {0} && ln -s {0} {1}",
        theirs.display(),
        planted.display()
    );
    assert!(nobody_runs(&["sh", "-c", &code]));
    assert_open_refused(&planted.join("f"), "another user owns it");
}

#[test]
fn a_way_to_the_file_that_someone_else_could_change_is_refused() {
    let shm = Shm::sticky("way");
    // The file's own directory is private, but the one above it anyone can write and is
    // not sticky: anyone could move another directory into its place.
    let open_dir = shm.path("open-above");
    make_dir(&open_dir, 0o777);
    let private = open_dir.join("private");
    make_dir(&private, 0o700);
    assert_open_refused(&private.join("f"), "on the way to the file");
    // A directory whose mode says only its owner writes it, and whose access ACL lets
    // another user write it too: the file's own directory, and one above it.
    let acl_dir = shm.path("acl");
    make_dir(&acl_dir, 0o755);
    let inner = acl_dir.join("inner");
    fs::create_dir(&inner).unwrap();
    if setfacl(&["-m", "u:65534:rwx"], &acl_dir) {
        for path in [acl_dir.join("f"), inner.join("f")] {
            assert_open_refused(&path, "ACL");
        }
    } else {
        eprintln!("skipped the ACL case: setfacl failed (no ACLs on this file system?)");
    }
    if !can_switch_user() {
        return;
    }
    // A link `nobody` owns, to a directory of ours: its owner can point it elsewhere
    // between two processes' opens.
    let ours = shm.path("ours");
    fs::create_dir(&ours).unwrap();
    let link = shm.path("their-link");
    assert!(nobody_runs(&[
        "ln".as_ref(),
        "-s".as_ref(),
        ours.as_os_str(),
        link.as_os_str()
    ]));
    assert_open_refused(&link.join("f"), "a link on the way");
}

#[test]
fn a_trusted_group_does_not_trust_a_file_its_non_member_made_in_a_setgid_directory() {
    let Some(shm) = other_user_dir("setgid") else {
        return;
    };
    // A sticky, set-group-id directory of group root (0), which nobody is not in.
    let dir = shm.path("team");
    make_dir(&dir, 0o3777);
    let planted = dir.join("limit");
    as_nobody(&shm, "make", &[("PACELINE_PATH", &planted)], "");
    assert_eq!(
        fs::metadata(&planted).unwrap().gid(),
        0,
        "the directory's group"
    );
    let options = OpenOptions::new().trust_group(0);
    assert_refused(
        SharedLimiter::open_with(&planted, Quota::per_second(10), options),
        "another user owns it",
    );
}

#[test]
fn a_default_acl_gives_no_one_else_a_new_file_and_a_file_with_an_acl_is_refused() {
    let has_setfacl = installed("setfacl");
    if !has_setfacl || !can_switch_user() {
        eprintln!("skipped: needs setfacl, root and setpriv");
        assert!(
            std::env::var_os("PACELINE_REQUIRE_OTHER_USER").is_none() || has_setfacl,
            "needs setfacl (the acl package)"
        );
        return;
    }
    let shm = Shm::sticky("acl");
    let dir = shm.path("team");
    fs::create_dir(&dir).unwrap();
    // The directory gives every new file an entry for nobody, read and write.
    assert!(setfacl(&["-d", "-m", "u:65534:rw"], &dir));
    // SAFETY: `getegid` has no preconditions.
    let group = unsafe { libc::getegid() };
    let path = dir.join("limit");
    let open = || {
        let options = OpenOptions::new().trust_group(group);
        SharedLimiter::open_with(&path, Quota::per_second(10), options)
    };
    open().unwrap();
    let said = as_nobody(&shm, "truncate", &[("PACELINE_PATH", &path)], "");
    assert!(
        said.starts_with("refused: "),
        "nobody could write the new file: {said}"
    );
    // A file someone gave an ACL entry is refused: its mode does not say who can write it.
    assert!(setfacl(&["-m", "u:65534:rw"], &path));
    assert_refused(open(), "access ACL");
}
