//! A text key found by its text (`check_text_n`, `peek_text_n`) is the very key
//! `TextKey::new` makes: the two paths share one state per key, short or digested, and
//! decide as a per-key `Limiter` would.

use std::collections::HashMap;
use std::time::Duration;

use paceline::clock::ManualClock;
use paceline::{KeyedLimiter, Limiter, Quota, TextKey};
use proptest::prelude::*;

fn quota() -> Quota {
    Quota::try_new(1, Duration::from_millis(100))
        .unwrap()
        .with_burst(3)
}

/// Short keys, one at the stored-as-is bound, and long ones that are digested.
fn text(i: u8) -> String {
    match i % 4 {
        0 => format!("k{i}"),
        1 => "t".repeat(TextKey::MAX_LEN - 1) + &i.to_string(),
        _ => "long".repeat(40) + &i.to_string(),
    }
}

#[derive(Debug, Clone)]
enum Op {
    ByText(u8, u32),
    ByKey(u8, u32),
    PeekText(u8, u32),
    Advance(u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => (0..8u8, 0..5u32).prop_map(|(k, n)| Op::ByText(k, n)),
            3 => (0..8u8, 0..5u32).prop_map(|(k, n)| Op::ByKey(k, n)),
            1 => (0..8u8, 0..5u32).prop_map(|(k, n)| Op::PeekText(k, n)),
            1 => (0..250u64).prop_map(Op::Advance),
        ],
        1..120,
    )
}

proptest! {
    #[test]
    fn by_text_and_by_key_are_one_key_decided_as_a_limiter_of_its_own(ops in ops()) {
        let clock = ManualClock::new();
        let keyed = KeyedLimiter::<TextKey, _>::with_clock(quota(), clock.clone());
        let mut model: HashMap<u8, Limiter<ManualClock>> = HashMap::new();
        for op in ops {
            match op {
                Op::ByText(i, n) | Op::ByKey(i, n) => {
                    let one = model
                        .entry(i % 8)
                        .or_insert_with(|| Limiter::with_clock(quota(), clock.clone()));
                    let got = match op {
                        Op::ByText(..) => keyed.check_text_n(&text(i), n),
                        _ => keyed.check_key_n(&TextKey::new(&text(i)), n),
                    };
                    prop_assert_eq!(got.is_ok(), one.check_n(n).is_ok(), "{:?}", op);
                }
                Op::PeekText(i, n) => {
                    let want = model
                        .entry(i % 8)
                        .or_insert_with(|| Limiter::with_clock(quota(), clock.clone()))
                        .peek_n(n);
                    prop_assert_eq!(keyed.peek_text_n(&text(i), n).ok(), want.ok());
                }
                Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            }
        }
        // One stored state per key, whichever path stored it.
        prop_assert!(keyed.len() <= model.len());
    }
}

#[test]
fn a_key_stored_by_its_text_is_found_by_the_key_and_the_other_way() {
    let keyed = KeyedLimiter::<TextKey>::new(Quota::per_hour(1));
    for i in 0..4 {
        let (a, b) = (text(i), text(i + 100));
        assert!(keyed.check_text_n(&a, 1).is_ok());
        assert!(keyed.check_key(&TextKey::new(&a)).is_err(), "{a}");
        assert!(keyed.check_key(&TextKey::new(&b)).is_ok());
        assert!(keyed.check_text_n(&b, 1).is_err(), "{b}");
    }
    assert_eq!(keyed.len(), 8);
}
