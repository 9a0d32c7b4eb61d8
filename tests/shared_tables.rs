//! A shared key table, in one process: it refuses a new key only when full and says so,
//! stores as many keys as it was made for, and a hostile quota slot gives wrong decisions
//! at worst, never a panic. (The file itself: `tests/shared_files.rs`.)

#![cfg(unix)]

use std::fs;
use std::time::Duration;

use paceline::shared::{SharedKeyedLimiter, SharedLimiter};
use paceline::Quota;

mod common;
use common::dir::Dir;

#[test]
fn the_key_table_refuses_new_keys_only_when_full_and_says_so_then_reuses_refilled_slots() {
    let dir = Dir::new("table");
    let path = dir.path("t");
    // Made for 16 keys: one bucket of 128 slots; one cell per 200 ms each.
    let limiter = SharedKeyedLimiter::open(
        &path,
        Quota::try_new(1, Duration::from_millis(200)).unwrap(),
        16,
    )
    .unwrap();
    let mut admitted = Vec::new();
    let refused = loop {
        let key = format!("key-{}", admitted.len());
        match limiter.check_key(&key) {
            Ok(()) => admitted.push(key),
            Err(e) => break e,
        }
    };
    assert_eq!(admitted.len(), 128, "every slot holds a limited key");
    assert_eq!(limiter.len(), 128);
    // The new key is refused as a full table refuses, with the time until a slot frees:
    // never as a spent quota.
    assert!(refused.is_table_full(), "{refused}");
    assert!(refused.to_string().contains("no room"), "{refused}");
    let wait = refused.wait_time();
    assert!(wait > Duration::from_millis(100) && wait <= Duration::from_millis(200));
    assert_eq!(limiter.remaining_key("late"), 0);
    let spent = limiter.check_key(&admitted[0]).unwrap_err();
    assert!(!spent.is_table_full(), "still limited, not evicted");
    // Once they refilled, their slots go to new keys, and the old keys start afresh.
    std::thread::sleep(Duration::from_millis(250));
    assert!(limiter.check_key("late").is_ok());
    assert!(!limiter.check_key("late").unwrap_err().is_table_full());
    assert!(limiter.check_key(&admitted[0]).is_ok());
    // Refilled keys stay counted until their slots are reused or forgotten.
    std::thread::sleep(Duration::from_millis(250));
    limiter.retain_recent();
    assert_eq!(limiter.len(), 0);
}

/// Offers `capacity` distinct keys, each limited for an hour, to a table made for that
/// many, then more until one is refused: every one of the first `capacity` is stored.
fn fill(capacity: u64) {
    let dir = Dir::new(&format!("fill-{capacity}"));
    let limiter = SharedKeyedLimiter::open(dir.path("t"), Quota::per_hour(1), capacity).unwrap();
    let mut stored = 0u64;
    loop {
        let key = format!("203.0.{}.{}", stored >> 8, stored & 255);
        match limiter.check_key(&key) {
            Ok(()) => stored += 1,
            Err(e) => {
                assert!(e.is_table_full(), "{e}");
                break;
            }
        }
    }
    assert!(
        stored >= capacity,
        "a table made for {capacity} keys refused a new one after {stored}"
    );
    assert_eq!(limiter.len() as u64, stored);
}

#[test]
fn a_table_made_for_65536_keys_stores_them_all() {
    fill(65_536);
}

#[test]
fn a_table_made_for_a_million_keys_stores_them_all() {
    fill(1_000_000);
}

#[test]
fn a_hostile_quota_slot_gives_wrong_decisions_at_worst_never_a_panic() {
    use std::os::unix::fs::FileExt;
    let dir = Dir::new("slot");
    let quota = Quota::per_second(1000); // burst 1000, 1 ms apart
    let (direct, keyed) = (dir.path("d"), dir.path("k"));
    let one = SharedLimiter::open(&direct, quota).unwrap();
    let per_key = SharedKeyedLimiter::open(&keyed, quota, 64).unwrap();
    for path in [&direct, &keyed] {
        // The current quota slot (slot 0 of a new file) gets room 0: inconsistent with
        // its burst of 1000, so a check of 5 cells would subtract past zero.
        let file = fs::OpenOptions::new().write(true).open(path).unwrap();
        file.write_at(&0u64.to_ne_bytes(), 128 + 24).unwrap();
    }
    // Debug builds panic on an overflow: these must not.
    let _ = one.check_n(5);
    let _ = one.check();
    let _ = one.peek_n(5);
    let _ = one.quota();
    let _ = per_key.check_key_n("k", 5);
    let _ = per_key.check_key("k");
    let _ = per_key.peek_key_n("k", 5);
    let _ = per_key.snapshot_key("k");
}
