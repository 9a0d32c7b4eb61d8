//! The full shards' Bloom filters against their tables.

use super::*;
use proptest::prelude::*;

/// Whether every shard's filter, where there is one, holds every key its table does.
fn filters_hold_their_keys(store: &Store<u32>) -> bool {
    store.shards.iter().all(|shard| {
        let shard = shard.read();
        shard.members.as_ref().is_none_or(|members| {
            shard
                .table
                .iter()
                .all(|(key, _)| members.may_hold(store.hasher.hash_one(key)))
        })
    })
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Stored(u16),
    New,
    Retain,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Through refusals, sweeps that make room, inserts and `retain_recent`, a full
    /// shard's filter never rules out a key its table holds (which would refuse a
    /// stored key as new).
    #[test]
    fn a_filter_never_rules_out_a_stored_key(ops in prop::collection::vec(
        prop_oneof![
            1 => (0u64..3_000).prop_map(Op::Advance),
            4 => (0u16..200).prop_map(Op::Stored),
            4 => Just(Op::New),
            1 => Just(Op::Retain),
        ],
        1..2_000,
    )) {
        // Keys stay live for 10-20 µs (a few dozen operations), long enough for the
        // shards to fill and refuse, short enough for sweeps to make room again.
        let store = Store::<u32>::new();
        store.set_max_keys(16);
        let (cost, tolerance) = (10_000, 20_000);
        let mut now = 1u64;
        let mut next_new = 1_000_000u32;
        for op in ops {
            let key = match op {
                Op::Advance(d) => {
                    now += d;
                    continue;
                }
                Op::Retain => {
                    store.retain_recent(now);
                    continue;
                }
                Op::Stored(k) => u32::from(k),
                Op::New => {
                    next_new += 1;
                    next_new
                }
            };
            let _ = store.with_word(&key, || now, |cell, now| cell.acquire(now, cost, tolerance));
            prop_assert!(filters_hold_their_keys(&store));
        }
    }
}

#[test]
fn a_full_shard_builds_its_filter_and_refuses_through_it() {
    let store = Store::<u32>::new();
    store.set_max_keys(64);
    let admit = |cell: &TatWord, now| cell.acquire(now, 1_000, 1_000);
    let refused = (0..10_000u32)
        .filter(|key| store.with_word(key, || 1, admit).is_err())
        .count();
    assert!(refused >= 10_000 - 64, "{refused} refused");
    assert!(store.shards.iter().all(|s| s.read().members.is_some()));
    assert!(filters_hold_their_keys(&store));
    // Once the stored keys are replenished, a new key makes room and gets in; the
    // sweep that forgot keys dropped the filter.
    assert!(store.with_word(&20_000, || 5_000, admit).is_ok());
    assert!(filters_hold_their_keys(&store));
    assert!(store.shards.iter().any(|s| s.read().members.is_none()));
}

#[test]
fn a_filter_rules_out_most_keys_it_does_not_hold() {
    let hasher = DefaultHashBuilder::default();
    let mut table = HashTable::new();
    for key in 0..10_000u32 {
        table.insert_unique(hasher.hash_one(key), (key, TatWord::new()), |(k, _)| {
            hasher.hash_one(k)
        });
    }
    let members = Members::of(&table, &hasher);
    assert!((0..10_000u32).all(|key| members.may_hold(hasher.hash_one(key))));
    let passed = (10_000..110_000u32)
        .filter(|key| members.may_hold(hasher.hash_one(key)))
        .count();
    // About 5 % expected; a broken mix (every bit set, or one word) lets most through.
    assert!(
        passed < 15_000,
        "{passed} of 100 000 keys not held passed the filter"
    );
}
