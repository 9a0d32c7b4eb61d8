//! A shared file's key slots under loom: a key's check racing a claim of its slot by
//! another key or a sweep that empties it, and claimers killed after each step of a claim. Checked: an admission is
//! never written into a slot that has become another key's (it would be lost to its key,
//! which would then start afresh: an over-admission), and no state a dead claimer leaves
//! stops the slot from being used again.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use paceline::__loom::KeySlot;

/// Tags as a key's digest makes them: odd, below 2^63.
const OLD: (u64, u64) = (3, 30);
const NEW: (u64, u64) = (5, 50);
const NOW: u64 = 1_000;
const COST: u64 = 10;
/// Room for one cell: the key's words are refilled (at or before now).
const ROOM: u64 = 100;

/// The old key's slot, refilled at `NOW`: claimable by another key.
fn refilled() -> Arc<KeySlot> {
    Arc::new(KeySlot::new(OLD.0, OLD.1, [NOW - 50, 0]))
}

/// The old key's check of `COST` at `NOW`, on a thread of its own.
fn old_key_checks(slot: &Arc<KeySlot>) -> thread::JoinHandle<Option<Result<u64, u64>>> {
    let slot = slot.clone();
    thread::spawn(move || slot.spend(OLD, 0, NOW, COST, ROOM))
}

#[test]
fn a_check_racing_a_claim_of_its_refilled_slot_is_never_lost() {
    loom::model(|| {
        let slot = refilled();
        let checker = old_key_checks(&slot);
        let claimed = slot.claim(NEW, NOW, u8::MAX);
        let checked = checker.join().unwrap();
        match checked {
            Some(Ok(tat)) => {
                // Admitted: the slot is still the old key's, holding the admission.
                assert!(
                    !claimed,
                    "admission written into a slot another key claimed"
                );
                assert!(slot.holds(OLD));
                assert_eq!(slot.word(0), tat);
            }
            Some(Err(_)) => unreachable!("the refilled key has room"),
            // It saw the slot change: its caller looks again (and finds no slot).
            None => assert!(claimed && slot.holds(NEW)),
        }
        assert_eq!(slot.tag() >> 63, 0, "left claiming");
    });
}

#[test]
fn a_claimer_killed_after_any_step_leaves_a_slot_the_next_claimer_repairs() {
    for stop in 1..=4 {
        loom::model(move || {
            let slot = refilled();
            // The old key's check races the claimer that dies.
            let checker = old_key_checks(&slot);
            assert!(!slot.claim(NEW, NOW, stop), "a killed claimer claimed");
            let checked = checker.join().unwrap();
            // The next claimer (the lock passes to it once the dead one's is released)
            // repairs the slot and claims it if the old key is refilled.
            let claimed = slot.claim(NEW, NOW, u8::MAX);
            assert_eq!(
                slot.tag() >> 63,
                0,
                "still claiming after a repair (stop {stop})"
            );
            if let Some(Ok(tat)) = checked {
                // The check landed before the claim's word swap: the old key is live and
                // keeps its slot and its admission.
                assert!(
                    !claimed && slot.holds(OLD),
                    "stop {stop}: lost an admission"
                );
                assert_eq!(slot.word(0), tat);
            } else {
                assert!(
                    claimed && slot.holds(NEW),
                    "stop {stop}: the slot was not reused"
                );
            }
        });
    }
}

#[test]
fn a_check_in_flight_across_a_repair_is_never_lost() {
    // The old key's check reads the tag before a claimer sets its flag and dies; the next
    // claimer repairs the slot while the check is still in flight.
    loom::model(|| {
        let slot = refilled();
        let checker = old_key_checks(&slot);
        assert!(!slot.claim(NEW, NOW, 1));
        let claimed = slot.claim(NEW, NOW, u8::MAX);
        let checked = checker.join().unwrap();
        if claimed {
            assert!(checked.is_none(), "an admission written into a reused slot");
        } else {
            assert!(slot.holds(OLD) && matches!(checked, Some(Ok(_))));
        }
        assert_eq!(slot.tag() >> 63, 0);
    });
}

#[test]
fn a_check_racing_a_sweep_of_its_refilled_slot_is_never_lost() {
    loom::model(|| {
        let slot = refilled();
        let checker = old_key_checks(&slot);
        let swept = slot.sweep(NOW);
        match checker.join().unwrap() {
            Some(Ok(tat)) => {
                // Admitted: the key keeps its slot and its admission.
                assert!(!swept, "an admission lost to a sweep");
                assert!(slot.holds(OLD));
                assert_eq!(slot.word(0), tat);
            }
            Some(Err(_)) => unreachable!("the refilled key has room"),
            None => assert!(swept && slot.tag() == 0),
        }
        assert_eq!(slot.tag() >> 63, 0, "left claiming");
    });
}
