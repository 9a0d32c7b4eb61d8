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

const NOBODY: u32 = 65534;

/// A directory like `/dev/shm`: anyone may create files in it, no one may remove another's
/// (mode 1777). Removed when dropped.
struct Shm(PathBuf);

impl Shm {
    fn new(name: &str) -> Shm {
        let dir =
            std::env::temp_dir().join(format!("paceline-hostile-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
        Shm(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Whether this run can act as another user (root, with `setpriv`); if not, says so, and
/// fails when CI asks for these tests.
fn can_switch_user() -> bool {
    // SAFETY: `geteuid` has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if root && setpriv {
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
        .args([
            "child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
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
    if !can_switch_user() {
        return;
    }
    let shm = Shm::new("planted");
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
    let refused = SharedLimiter::open(&theirs, Quota::per_second(10)).unwrap_err();
    assert!(
        refused.to_string().contains("another user owns it"),
        "{refused}"
    );
    let trusted = OpenOptions::new().trust_user(NOBODY);
    assert!(SharedLimiter::open_with(&theirs, Quota::per_second(10), trusted).is_ok());
}

#[test]
fn another_user_can_neither_take_over_nor_truncate_the_services_file() {
    if !can_switch_user() {
        return;
    }
    let shm = Shm::new("ours");
    let path = shm.path("api");
    let service = SharedLimiter::open(&path, Quota::per_second(10)).unwrap();
    let said = as_nobody(&shm, "take-over", &[("PACELINE_PATH", &path)], "");
    assert!(said.starts_with("refused: "), "{said}");
    assert!(said.contains("another user owns it"), "{said}");
    let said = as_nobody(&shm, "truncate", &[("PACELINE_PATH", &path)], "");
    assert!(said.starts_with("refused: "), "{said}");
    // The service still holds its own quota: 10 at once, then no more.
    assert_eq!(service.quota(), Quota::per_second(10));
    assert_eq!((0..100).filter(|_| service.check().is_ok()).count(), 10);
}

#[test]
fn a_link_another_user_plants_is_never_followed() {
    if !can_switch_user() {
        return;
    }
    let shm = Shm::new("link");
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
    if !can_switch_user() {
        return;
    }
    let shm = Shm::new("group");
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
    let shm = Shm::new("flock");
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

/// Writes `value` into the first bucket's lock word of a keyed file (offset 512): as a
/// claimer with that process id would, while it holds the bucket.
fn hold_first_bucket(path: &Path, value: u64) {
    use std::os::unix::fs::FileExt;
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_at(&value.to_ne_bytes(), 512).unwrap();
}

#[test]
fn a_claimer_that_stops_holding_a_bucket_delays_new_keys_at_most_the_patience_and_one_that_dies_not_at_all(
) {
    let shm = Shm::new("stopped");
    let path = shm.path("keys");
    // Made for 64 keys: one bucket, so every new key needs the lock.
    let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(10), 64).unwrap();
    limiter.check_key("stored").unwrap();
    // A live process that holds the bucket and never lets go (stopped, say).
    let mut holder: Child = Command::new("sleep").arg("30").spawn().unwrap();
    hold_first_bucket(&path, u64::from(holder.id()));
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
    let shm = Shm::new("sigstop");
    let path = shm.path("keys");
    let limiter = SharedKeyedLimiter::open(&path, quick(), 64).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("PACELINE_CHILD", "claim-forever")
        .env("PACELINE_PATH", &path)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
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
