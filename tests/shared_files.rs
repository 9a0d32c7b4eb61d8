//! Shared files, in one process: two openers are one limiter, bad files are errors that
//! change nothing, and a file full of random bytes gives wrong decisions at worst, never
//! a panic or a hang. (Real processes: `tests/shared_processes.rs`.)

#![cfg(unix)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use paceline::shared::{OnMismatch, SharedError, SharedKeyedLimiter, SharedLimiter};
use paceline::Quota;

/// A fresh path in a directory of this test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir =
            std::env::temp_dir().join(format!("paceline-files-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

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
                expected: 1,
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
    // Paths that are no file to map: a directory, a file's child, a device.
    let message = |result: Result<SharedLimiter, SharedError>| match result {
        Err(e @ SharedError::Io { .. }) => e.to_string(),
        other => panic!("{other:?}"),
    };
    let text = message(SharedLimiter::open(&dir.0, Quota::per_second(1)));
    assert!(text.contains("cannot open or create the file"), "{text}");
    message(SharedLimiter::open(
        good.join("child"),
        Quota::per_second(1),
    ));
    let text = message(SharedLimiter::open("/dev/null", Quota::per_second(1)));
    assert!(text.starts_with("/dev/null: cannot"), "{text}");
    assert_eq!(bytes(&good), original);
}

#[test]
fn a_file_never_finished_or_from_another_boot_is_made_anew() {
    let dir = Dir::new("anew");
    let path = dir.path("f");
    {
        let limiter = SharedLimiter::open(&path, Quota::per_hour(1)).unwrap();
        limiter.check().unwrap();
    }
    // The maker died before writing the magic (the last thing it writes).
    let mut content = bytes(&path);
    content[..8].fill(0);
    fs::write(&path, &content).unwrap();
    let limiter = SharedLimiter::open(&path, Quota::per_hour(1)).unwrap();
    assert_eq!(limiter.remaining(), 1, "made anew: a fresh word");
    limiter.check().unwrap();
    drop(limiter);
    // Made in an earlier boot: its instants belong to a clock that has restarted.
    let mut content = bytes(&path);
    content[40] ^= 0xff;
    fs::write(&path, &content).unwrap();
    let limiter = SharedLimiter::open(&path, Quota::per_hour(1)).unwrap();
    assert_eq!(limiter.remaining(), 1, "made anew: a fresh word");
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
fn the_key_table_refuses_new_keys_when_full_and_reuses_refilled_slots() {
    let dir = Dir::new("table");
    let path = dir.path("t");
    // 16 slots, one cell per 200 ms each.
    let limiter = SharedKeyedLimiter::open(
        &path,
        Quota::try_new(1, Duration::from_millis(200)).unwrap(),
        16,
    )
    .unwrap();
    let admitted: Vec<String> = (0..64)
        .map(|i| format!("key-{i}"))
        .filter(|key| limiter.check_key(key).is_ok())
        .collect();
    assert_eq!(admitted.len(), 16, "every slot holds a limited key");
    assert_eq!(limiter.len(), 16);
    // A new key is refused with the time until a slot frees; stored keys still work.
    let refused = limiter.check_key("late").unwrap_err().wait_time();
    assert!(refused > Duration::from_millis(100) && refused <= Duration::from_millis(200));
    assert_eq!(limiter.remaining_key("late"), 0);
    assert!(
        limiter.check_key(&admitted[0]).is_err(),
        "still limited, not evicted"
    );
    // Once they refilled, their slots go to new keys, and the old keys start afresh.
    std::thread::sleep(Duration::from_millis(250));
    assert!(limiter.check_key("late").is_ok());
    assert!(limiter.check_key("late").is_err());
    assert!(limiter.check_key(&admitted[0]).is_ok());
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
