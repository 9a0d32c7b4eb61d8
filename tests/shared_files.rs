//! Shared files, in one process: two openers are one limiter, bad files are errors that
//! change nothing, and a file full of random bytes gives wrong decisions at worst, never
//! a panic or a hang. (Real processes: `tests/shared_processes.rs`.)

#![cfg(unix)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use paceline::shared::{OnMismatch, OpenOptions, SharedError, SharedKeyedLimiter, SharedLimiter};
use paceline::Quota;

mod common;
use common::dir::Dir;

/// The file's bytes, to show an error left it as it was.
fn bytes(path: &PathBuf) -> Vec<u8> {
    fs::read(path).unwrap()
}

#[test]
fn two_openers_of_one_path_are_one_limiter_and_a_new_file_is_private() {
    let dir = Dir::new("two");
    let path = dir.path("api");
    let a = SharedLimiter::open(&path, Quota::per_hour(5)).unwrap();
    let b = SharedLimiter::open(&path, Quota::per_hour(5)).unwrap();
    assert!(a.check_n(3).is_ok());
    assert_eq!(b.remaining(), 2);
    assert!(b.check_n(3).is_err());
    assert!(b.check_n(2).is_ok());
    assert!(a.check().is_err());
    // The execution-time lane is a second limiter of the same quota.
    assert_eq!(a.execution_lane().remaining(), 5);
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o077, 0, "readable or writable by others: {mode:o}");
}

#[test]
fn quota_changes_are_seen_by_every_opener_and_mismatches_are_named() {
    let dir = Dir::new("quota");
    let path = dir.path("q");
    let a = SharedLimiter::open(&path, Quota::per_second(10)).unwrap();
    let before = bytes(&path);
    match SharedLimiter::open(&path, Quota::per_second(20).with_burst(3)) {
        Err(e @ SharedError::QuotaMismatch { .. }) => {
            let text = e.to_string();
            assert!(text.contains("1 cell every 100ms, bursts of 10"), "{text}");
            assert!(text.contains("1 cell every 50ms, bursts of 3"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(bytes(&path), before, "a refused open changes nothing");
    let adopted =
        SharedLimiter::open_with(&path, Quota::per_second(20), OnMismatch::Adopt).unwrap();
    assert_eq!(adopted.quota(), Quota::per_second(10));
    SharedLimiter::open_with(&path, Quota::per_second(20), OnMismatch::Replace).unwrap();
    assert_eq!(a.quota(), Quota::per_second(20));
    a.set_quota(Quota::per_minute(1)).unwrap();
    assert_eq!(adopted.quota(), Quota::per_minute(1));
    // Many changes reuse the slots.
    for n in 1..100 {
        a.set_quota(Quota::per_second(n)).unwrap();
        assert_eq!(adopted.quota(), Quota::per_second(n));
    }
}

#[test]
fn keyed_files_keep_their_capacity_and_their_kind() {
    let dir = Dir::new("kind");
    let (keyed, direct) = (dir.path("keyed"), dir.path("direct"));
    let k = SharedKeyedLimiter::open(&keyed, Quota::per_hour(1), 64).unwrap();
    SharedLimiter::open(&direct, Quota::per_hour(1)).unwrap();
    assert!(matches!(
        SharedKeyedLimiter::open(&keyed, Quota::per_hour(1), 128),
        Err(SharedError::CapacityMismatch {
            file: 64,
            asked: 128,
            ..
        })
    ));
    let adopted =
        SharedKeyedLimiter::open_with(&keyed, Quota::per_hour(1), 128, OnMismatch::Adopt).unwrap();
    assert_eq!(adopted.capacity(), 64);
    assert!(matches!(
        SharedLimiter::open(&keyed, Quota::per_hour(1)),
        Err(SharedError::Kind {
            found: "keyed",
            expected: "direct",
            ..
        })
    ));
    assert!(matches!(
        SharedKeyedLimiter::open(&direct, Quota::per_hour(1), 64),
        Err(SharedError::Kind {
            found: "direct",
            expected: "keyed",
            ..
        })
    ));
    for capacity in [0, paceline::shared::MAX_CAPACITY + 1] {
        assert!(matches!(
            SharedKeyedLimiter::open(dir.path("cap"), Quota::per_hour(1), capacity),
            Err(SharedError::Capacity { .. })
        ));
    }
    assert!(k.check_key("a").is_ok() && adopted.check_key("a").is_err());
}

#[test]
fn bad_files_are_errors_that_change_nothing() {
    let dir = Dir::new("bad");
    let good = dir.path("good");
    SharedLimiter::open(&good, Quota::per_second(1)).unwrap();
    let original = bytes(&good);
    let expect = |name: &str, content: Vec<u8>, check: &dyn Fn(&SharedError) -> bool| {
        let path = dir.path(name);
        fs::write(&path, &content).unwrap();
        match SharedLimiter::open(&path, Quota::per_second(1)) {
            Err(e) => assert!(check(&e), "{name}: {e:?}"),
            Ok(_) => panic!("{name}: opened"),
        }
        assert_eq!(
            fs::read(&path).unwrap(),
            content,
            "{name}: the file was changed"
        );
    };
    // Someone else's file.
    expect("text", b"#!/bin/sh\necho hello\n".repeat(40), &|e| {
        matches!(e, SharedError::NotPaceline { .. })
    });
    let mut other_version = original.clone();
    other_version[12..16].copy_from_slice(&7u32.to_ne_bytes());
    expect("version", other_version, &|e| {
        matches!(
            e,
            SharedError::Version {
                found: 7,
                expected: 2,
                ..
            }
        )
    });
    let mut truncated = original.clone();
    truncated.truncate(original.len() - 8);
    expect("truncated", truncated, &|e| {
        matches!(e, SharedError::Length { .. })
    });
    let mut oversized = original.clone();
    oversized.extend_from_slice(&[0; 4096]);
    expect("oversized", oversized, &|e| {
        matches!(e, SharedError::Length { .. })
    });
    let mut bad_kind = original.clone();
    bad_kind[8..12].copy_from_slice(&9u32.to_ne_bytes());
    expect("kind", bad_kind, &|e| {
        matches!(e, SharedError::Corrupt { field: "kind", .. })
    });
    let mut short = original.clone();
    short.truncate(100);
    expect("short", short, &|e| {
        matches!(
            e,
            SharedError::NotPaceline { .. } | SharedError::Length { .. }
        )
    });
    // A file paceline did not finish making is someone else's: never made anew (whatever
    // its length), and the error says what was found.
    for len in [original.len(), 640, 4096, 2 << 20] {
        let name = format!("zeros-{len}");
        expect(&name, vec![0; len], &|e| {
            let text = e.to_string();
            matches!(e, SharedError::NotPaceline { .. })
                && text.contains(&format!("{len} bytes, beginning 00 00"))
        });
    }
    let mut unfinished = original.clone();
    unfinished[..8].fill(0);
    expect("unfinished", unfinished, &|e| {
        matches!(e, SharedError::NotPaceline { .. })
    });
    expect(
        "empty",
        Vec::new(),
        &|e| matches!(e, SharedError::NotPaceline { found, .. } if found == "an empty file"),
    );
    // Paths that are no file to map: a directory, a device, a file's child.
    let not_a_file = |path: &std::path::Path, what: &str| match SharedLimiter::open(
        path,
        Quota::per_second(1),
    ) {
        Err(e @ SharedError::NotAFile { .. }) => {
            assert!(e.to_string().contains(what), "{e}");
        }
        other => panic!("{}: {other:?}", path.display()),
    };
    not_a_file(&dir.0, "is a directory");
    not_a_file(std::path::Path::new("/dev/null"), "is a device");
    match SharedLimiter::open(good.join("child"), Quota::per_second(1)) {
        Err(e @ SharedError::Io { .. }) => assert!(e.to_string().contains("cannot")),
        other => panic!("{other:?}"),
    }
    assert_eq!(bytes(&good), original);
}

#[test]
fn links_fifos_and_files_others_can_write_are_refused_and_left_alone() {
    use std::os::unix::fs::symlink;
    let dir = Dir::new("hostile");
    // A dangling link: never followed, so its target is never made.
    let target = dir.path("target");
    let link = dir.path("link");
    symlink(&target, &link).unwrap();
    let refused = SharedLimiter::open(&link, Quota::per_second(1)).unwrap_err();
    assert!(matches!(refused, SharedError::Link { .. }), "{refused}");
    assert!(refused.to_string().contains("symbolic link"), "{refused}");
    assert!(!target.exists(), "the link was followed");
    // A link to a good file is refused too.
    SharedLimiter::open(&target, Quota::per_second(1)).unwrap();
    let before = bytes(&target);
    assert!(matches!(
        SharedKeyedLimiter::open(&link, Quota::per_second(1), 64),
        Err(SharedError::Link { .. })
    ));
    assert_eq!(bytes(&target), before);
    // A FIFO planted at the path neither hangs the opener nor is taken.
    let fifo = dir.path("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let started = Instant::now();
    assert!(matches!(
        SharedLimiter::open(&fifo, Quota::per_second(1)),
        Err(SharedError::NotAFile {
            found: "a FIFO",
            ..
        })
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
    // Files of our own user that others (or the group) can write: whoever can write them
    // can spend or break the quota, so they are refused, and left as they are.
    for (mode, why, fix) in [
        (0o666, "anyone on the host can write it", "chmod o-w"),
        (0o602, "anyone on the host can write it", "chmod o-w"),
        (0o620, "its group can write it", "trust_group"),
    ] {
        let path = dir.path(&format!("mode-{mode:o}"));
        SharedLimiter::open(&path, Quota::per_second(1)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        let before = bytes(&path);
        match SharedLimiter::open(&path, Quota::per_second(1)) {
            Err(e @ SharedError::Untrusted { .. }) => {
                let text = e.to_string();
                assert!(text.contains(why), "{text}");
                assert!(text.contains(&format!("mode {mode:04o}")), "{text}");
                assert!(text.contains(fix), "{text}");
            }
            other => panic!("{mode:o}: {other:?}"),
        }
        assert_eq!(bytes(&path), before);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            mode
        );
    }
    // Trusting the file's group opens a group-writable one (never a world-writable one).
    let path = dir.path("mode-620");
    let group = std::os::unix::fs::MetadataExt::gid(&fs::metadata(&path).unwrap());
    let options = OpenOptions::new().trust_group(group);
    assert!(SharedLimiter::open_with(&path, Quota::per_second(1), options.clone()).is_ok());
    assert!(SharedLimiter::open_with(dir.path("mode-666"), Quota::per_second(1), options).is_err());
}

#[test]
fn a_file_made_for_a_trusted_group_is_that_groups_and_writable_by_it() {
    use std::os::unix::fs::MetadataExt;
    let dir = Dir::new("group");
    let path = dir.path("g");
    // SAFETY: `getegid` has no preconditions.
    let group = unsafe { libc::getegid() };
    let options = OpenOptions::new().trust_group(group);
    SharedKeyedLimiter::open_with(&path, Quota::per_second(1), 64, options.clone()).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!((meta.gid(), meta.mode() & 0o777), (group, 0o660));
    // Without trusting the group, a group-writable file is refused.
    assert!(matches!(
        SharedKeyedLimiter::open(&path, Quota::per_second(1), 64),
        Err(SharedError::Untrusted { .. })
    ));
    SharedKeyedLimiter::open_with(&path, Quota::per_second(1), 64, options).unwrap();
}

#[test]
fn a_file_holds_one_named_limit() {
    let dir = Dir::new("names");
    let path = dir.path("n");
    let quota = Quota::per_minute(2);
    let named = |name: &str| OpenOptions::new().name(name);
    let per_ip = SharedKeyedLimiter::open_with(&path, quota, 64, named("per-ip")).unwrap();
    assert_eq!(per_ip.name(), "per-ip");
    let before = bytes(&path);
    match SharedKeyedLimiter::open_with(&path, quota, 64, named("login")) {
        Err(e @ SharedError::NameMismatch { .. }) => {
            assert!(e.to_string().contains("\"per-ip\""), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Not even a replace of the quota reaches another limit's file.
    let replace = named("login").on_mismatch(OnMismatch::Replace);
    assert!(SharedKeyedLimiter::open_with(&path, Quota::per_hour(99), 64, replace).is_err());
    assert_eq!(bytes(&path), before);
    // An opener that names none accepts the file's.
    assert_eq!(
        SharedKeyedLimiter::open(&path, quota, 64).unwrap().name(),
        "per-ip"
    );
    let long = "x".repeat(paceline::shared::MAX_NAME_LEN + 1);
    assert!(matches!(
        SharedKeyedLimiter::open_with(dir.path("long"), quota, 64, named(&long)),
        Err(SharedError::NameTooLong { .. })
    ));
    assert!(!dir.path("long").exists());
}

#[test]
fn a_file_from_an_earlier_boot_is_made_anew_as_a_new_file_never_shrunk_in_place() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = Dir::new("anew");
    let path = dir.path("f");
    let old = SharedLimiter::open(&path, Quota::per_hour(2)).unwrap();
    old.check().unwrap();
    let old_inode = fs::metadata(&path).unwrap().ino();
    let len = fs::metadata(&path).unwrap().len();
    // Made in an earlier boot: its instants belong to a clock that has restarted. The
    // boot id is changed in place (no truncation: `old` has the file mapped).
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_at(&[0xa5; 8], 40).unwrap();
    let keep = fs::File::open(&path).unwrap();
    let fresh = SharedLimiter::open(&path, Quota::per_hour(2)).unwrap();
    assert_eq!(fresh.remaining(), 2, "made anew: a fresh word");
    // A new file at the path; the old one is untouched and still works for whoever has
    // it mapped (a truncation in place would kill them with SIGBUS).
    assert_ne!(fs::metadata(&path).unwrap().ino(), old_inode);
    assert_eq!(keep.metadata().unwrap().len(), len);
    assert_eq!(old.remaining(), 1);
    old.check().unwrap();
    assert!(old.check().is_err());
    assert_eq!(fresh.remaining(), 2);
    // Opening the new one again finds it as it is.
    fresh.check().unwrap();
    assert_eq!(
        SharedLimiter::open(&path, Quota::per_hour(2))
            .unwrap()
            .remaining(),
        1
    );
    let leftovers: Vec<_> = fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "temporary files left: {leftovers:?}");
}

#[test]
fn a_relative_path_is_kept_absolute() {
    let dir = Dir::new("relative");
    let limiter = {
        let here = std::env::current_dir().unwrap();
        std::env::set_current_dir(&dir.0).unwrap();
        let opened = SharedLimiter::open("relative-file", Quota::per_second(1));
        std::env::set_current_dir(here).unwrap();
        opened.unwrap()
    };
    assert_eq!(limiter.path(), dir.path("relative-file"));
    assert!(limiter.path().is_absolute());
}

#[test]
fn a_file_overwritten_with_random_bytes_never_panics_or_hangs() {
    let dir = Dir::new("random");
    let direct = dir.path("direct");
    let keyed = dir.path("keyed");
    let limiter = SharedLimiter::open(&direct, Quota::per_second(100)).unwrap();
    let per_key = SharedKeyedLimiter::open(&keyed, Quota::per_second(100), 256).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..50 {
        // A hostile writer rewrites everything after the header's first 16 bytes while
        // the files are mapped (the length stays, so no page goes away).
        for path in [&direct, &keyed] {
            let mut content = bytes(path);
            for byte in content.iter_mut().skip(16) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = if round % 3 == 0 { 0xff } else { x as u8 };
            }
            fs::write(path, &content).unwrap();
        }
        let started = Instant::now();
        let _ = limiter.check();
        let _ = limiter.check_n(7);
        let _ = limiter.remaining();
        let _ = limiter.snapshot();
        let _ = limiter.peek_n(3);
        let _ = limiter.quota();
        let _ = limiter.reserve_within(1, Duration::from_millis(1));
        let _ = limiter.set_quota(Quota::per_second(50));
        for key in ["a", "b", "c", "d"] {
            let _ = per_key.check_key(key);
            let _ = per_key.check_key_n(key, 5);
            let _ = per_key.remaining_key(key);
            let _ = per_key.peek_key_n(key, 2);
        }
        let _ = per_key.len();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "round {round} hung"
        );
    }
}

#[test]
fn holds_are_bounded_and_a_reset_ends_them() {
    let dir = Dir::new("holds");
    let one = SharedLimiter::open(dir.path("d"), Quota::per_second(10)).unwrap();
    one.hold_for(Duration::from_secs(1_000_000_000_000));
    let wait = one.check().unwrap_err().wait_time();
    assert!(wait <= paceline::shared::MAX_HOLD, "{wait:?}");
    assert!(
        wait > paceline::shared::MAX_HOLD - Duration::from_secs(60),
        "{wait:?}"
    );
    // An opener asking for another quota (replacing it) does not end it; a reset does.
    let replaced =
        SharedLimiter::open_with(dir.path("d"), Quota::per_second(20), OnMismatch::Replace)
            .unwrap();
    assert!(replaced.check().is_err());
    replaced.reset();
    assert_eq!(one.remaining(), 20);
    let per_key = SharedKeyedLimiter::open(dir.path("k"), Quota::per_second(10), 64).unwrap();
    per_key.hold_key_for("api", Duration::MAX);
    assert!(per_key.check_key("api").unwrap_err().wait_time() <= paceline::shared::MAX_HOLD);
    per_key.reset_key("api");
    assert!(per_key.check_key("api").is_ok());
}

#[test]
fn a_cancelled_turn_never_moves_another_processs_turn_together_with_ours() {
    let dir = Dir::new("refund");
    let path = dir.path("q");
    let quota = Quota::per_second(1).with_burst(1);
    // Two openers: two processes' queues on one word.
    let (ours, theirs) = (
        SharedLimiter::open(&path, quota).unwrap(),
        SharedLimiter::open(&path, quota).unwrap(),
    );
    ours.check().unwrap();
    let x = ours.reserve(1).unwrap(); // 1 s
    let other = theirs.reserve(1).unwrap(); // 2 s
    let y = ours.reserve(1).unwrap(); // 3 s
    let secs = |d: Duration| d.as_secs_f64();
    assert!((secs(y.ready_in()) - 3.0).abs() < 0.1, "{:?}", y.ready_in());
    // Giving `x` back would move `y` up to 2 s, onto the other process's turn.
    drop(x);
    assert!(
        y.ready_in() >= other.ready_in() + Duration::from_millis(900),
        "ours at {:?}, theirs at {:?}",
        y.ready_in(),
        other.ready_in()
    );
    // With nothing of another process's after it, a turn does go back.
    drop(y);
    assert!(ours.reserve(1).unwrap().ready_in() < Duration::from_millis(3_100));
}

#[test]
fn a_refund_gives_back_only_the_last_admission_and_every_opener_sees_it() {
    let dir = Dir::new("refund");
    let path = dir.path("keys");
    let quota = Quota::per_hour(3);
    let one = SharedKeyedLimiter::open(&path, quota, 64).unwrap();
    let two = SharedKeyedLimiter::open(&path, quota, 64).unwrap();
    let a = one.check_key_refundable("k").unwrap();
    let b = two.check_key_refundable("k").unwrap();
    // `a` is not the word's last admission: it stays spent.
    one.refund_key("k", a);
    assert_eq!(two.remaining_key("k"), 1);
    // `b` is, so it comes back, for both openers.
    two.refund_key("k", b);
    assert_eq!(one.remaining_key("k"), 2);
    // A refund for another key, or one already made, changes nothing.
    let c = one.check_key_refundable("k").unwrap();
    one.refund_key("other", c);
    assert_eq!(one.remaining_key("k"), 1);
    one.refund_key("k", c);
    one.refund_key("k", c);
    assert_eq!(one.remaining_key("k"), 2);
    // A refused key has nothing to give back, and says how long.
    one.check_key_n("k", 2).unwrap();
    let refused = two.check_key_refundable("k").unwrap_err();
    assert!(refused.wait_time() > Duration::from_secs(1_000));
}

#[test]
fn a_snapshot_reads_the_key_as_the_in_process_limiter_would() {
    let dir = Dir::new("snapshot");
    let path = dir.path("keys");
    let quota = Quota::per_second(10).with_burst(4);
    let shared = SharedKeyedLimiter::open(&path, quota, 64).unwrap();
    let fresh = shared.snapshot_key("new");
    assert_eq!((fresh.remaining(), fresh.burst()), (4, 4));
    assert!(fresh.until_full().is_zero() && fresh.until_next().is_zero());
    shared.check_key_n("k", 4).unwrap();
    let spent = shared.snapshot_key("k");
    assert_eq!(spent.remaining(), 0);
    // The next cell at most 100 ms away and the whole burst three cells after it, from
    // one reading (however long since the check).
    assert!(!spent.until_next().is_zero());
    assert!(spent.until_next() <= Duration::from_millis(100));
    assert_eq!(
        spent.until_full() - spent.until_next(),
        Duration::from_millis(300)
    );
    assert_eq!(spent.quota(), quota);
}
