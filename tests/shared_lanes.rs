//! Taking a caller's cells from a shared file's booking and execution lanes in one step
//! (`check_n_with`, `check_key_n_with`) decides as the three steps it stands for: a look
//! at the execution lane, then the booking lane's check, then the execution lane's.

#![cfg(unix)]

use std::time::Duration;

use paceline::shared::{SharedKeyedLimiter, SharedLimiter};
use paceline::{Denied, Quota};
use proptest::prelude::*;

mod common;
use common::dir::Dir;

/// What a check came to, as a caller tells it apart.
fn outcome(checked: Result<(), Denied>) -> &'static str {
    match checked {
        Ok(()) => "admitted",
        Err(Denied::InsufficientCapacity(_)) => "over the burst",
        Err(Denied::NotUntil(e)) if e.is_table_full() => "table full",
        Err(Denied::NotUntil(_)) => "not yet",
    }
}

/// The three steps, on lanes of another file.
fn stepwise(booked: &SharedLimiter, exec: &SharedLimiter, n: u32) -> Result<(), Denied> {
    common::stepwise!(booked, exec, peek_n, check_n, n)
}

fn stepwise_key(
    booked: &SharedKeyedLimiter,
    exec: &SharedKeyedLimiter,
    key: &str,
    n: u32,
) -> Result<(), Denied> {
    common::stepwise!(booked, exec, peek_key_n, check_key_n, key, n)
}

/// A step of a run: a caller taking both lanes at once, or a late turn's work taking the
/// execution lane alone (which leaves it with less room than the booking lane).
#[derive(Debug, Clone)]
enum Step {
    Both { key: u8, n: u32 },
    LateRun { key: u8, n: u32 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0..3u8, 0..7u32).prop_map(|(key, n)| Step::Both { key, n }),
            1 => (0..3u8, 1..4u32).prop_map(|(key, n)| Step::LateRun { key, n }),
        ],
        1..40,
    )
}

// An hour per cell: the run takes far less than a cell's refill, so the two files see the
// same decisions however the steps are timed.
fn quota() -> Quota {
    Quota::per_hour(1_000).with_burst(5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn one_step_decides_as_the_three_it_stands_for(steps in steps()) {
        let dir = Dir::new("lanes");
        let fused = SharedLimiter::open(dir.path("fused"), quota()).unwrap();
        let fused_exec = fused.execution_lane();
        let model = SharedLimiter::open(dir.path("model"), quota()).unwrap();
        let model_exec = model.execution_lane();
        for step in &steps {
            match *step {
                Step::Both { n, .. } => prop_assert_eq!(
                    outcome(fused.check_n_with(&fused_exec, n)),
                    outcome(stepwise(&model, &model_exec, n)),
                    "{:?}", step
                ),
                Step::LateRun { n, .. } => prop_assert_eq!(
                    outcome(fused_exec.check_n(n)),
                    outcome(model_exec.check_n(n))
                ),
            }
            prop_assert_eq!(fused.remaining(), model.remaining());
            prop_assert_eq!(fused_exec.remaining(), model_exec.remaining());
        }
    }

    #[test]
    fn one_step_decides_as_the_three_it_stands_for_each_key(steps in steps()) {
        let dir = Dir::new("keyed-lanes");
        let fused = SharedKeyedLimiter::open(dir.path("fused"), quota(), 64).unwrap();
        let fused_exec = fused.execution_lane();
        let model = SharedKeyedLimiter::open(dir.path("model"), quota(), 64).unwrap();
        let model_exec = model.execution_lane();
        for step in &steps {
            match *step {
                Step::Both { key, n } => {
                    let key = format!("client-{key}");
                    let stored = fused.check_key_n_with_if_stored(&key, &fused_exec, n);
                    let fused_outcome = match stored {
                        Some(checked) => outcome(checked),
                        None => outcome(fused.check_key_n_with(&key, &fused_exec, n)),
                    };
                    prop_assert_eq!(
                        fused_outcome,
                        outcome(stepwise_key(&model, &model_exec, &key, n)),
                        "{:?}", step
                    );
                }
                Step::LateRun { key, n } => {
                    let key = format!("client-{key}");
                    prop_assert_eq!(
                        outcome(fused_exec.check_key_n(&key, n)),
                        outcome(model_exec.check_key_n(&key, n))
                    );
                }
            }
            for key in 0..3 {
                let key = format!("client-{key}");
                prop_assert_eq!(fused.remaining_key(&key), model.remaining_key(&key));
                prop_assert_eq!(fused_exec.remaining_key(&key), model_exec.remaining_key(&key));
            }
        }
    }
}

#[test]
fn lanes_of_two_files_are_taken_in_three_steps() {
    let dir = Dir::new("two-files");
    let a = SharedLimiter::open(dir.path("a"), Quota::per_hour(2)).unwrap();
    let b = SharedLimiter::open(dir.path("b"), Quota::per_hour(1)).unwrap();
    assert!(a.check_n_with(&b, 1).is_ok());
    // `b` has no room: nothing is spent in `a`.
    assert!(a.check_n_with(&b, 1).is_err());
    assert_eq!((a.remaining(), b.remaining()), (1, 0));
    let ka = SharedKeyedLimiter::open(dir.path("ka"), Quota::per_hour(2), 16).unwrap();
    let kb = SharedKeyedLimiter::open(dir.path("kb"), Quota::per_hour(1), 16).unwrap();
    assert!(ka.check_key_n_with_if_stored("k", &kb, 1).is_none());
    assert!(ka.check_key_n_with("k", &kb, 1).is_ok());
    assert!(ka.check_key_n_with_if_stored("k", &kb, 1).unwrap().is_err());
    assert_eq!((ka.remaining_key("k"), kb.remaining_key("k")), (1, 0));
}

#[test]
fn a_new_key_at_a_full_table_is_told_so_and_spends_nothing() {
    let dir = Dir::new("full-lanes");
    let booked = SharedKeyedLimiter::open(
        dir.path("t"),
        Quota::try_new(1, Duration::from_secs(3600)).unwrap(),
        16,
    )
    .unwrap();
    let exec = booked.execution_lane();
    let mut stored = 0;
    let refused = loop {
        match booked.check_key_n_with(format!("key-{stored}"), &exec, 1) {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(refused, Denied::NotUntil(ref e) if e.is_table_full()),
        "{refused:?}"
    );
    assert_eq!(booked.len(), stored);
    assert_eq!(booked.remaining_key("key-0"), 0);
    assert_eq!(exec.remaining_key("key-0"), 0);
}

#[test]
fn racing_threads_never_get_more_than_either_lane_allows() {
    // Four threads take both lanes in one step while two more spend the execution lane
    // alone (late runs): whatever the interleaving, no lane admits past its burst, and
    // every one-step admission was admitted by both.
    let dir = Dir::new("race-lanes");
    let quota = Quota::per_hour(1).with_burst(200);
    let booked = std::sync::Arc::new(SharedLimiter::open(dir.path("f"), quota).unwrap());
    let keyed = std::sync::Arc::new(SharedKeyedLimiter::open(dir.path("k"), quota, 16).unwrap());
    let both = std::sync::atomic::AtomicU32::new(0);
    let late = std::sync::atomic::AtomicU32::new(0);
    let keyed_both = std::sync::atomic::AtomicU32::new(0);
    let keyed_late = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for i in 0..6 {
            let (booked, keyed) = (&booked, &keyed);
            let (both, late, keyed_both, keyed_late) = (&both, &late, &keyed_both, &keyed_late);
            s.spawn(move || {
                let exec = booked.execution_lane();
                let keyed_exec = keyed.execution_lane();
                for _ in 0..300 {
                    let count = |c: &std::sync::atomic::AtomicU32| {
                        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    };
                    if i < 4 {
                        if booked.check_n_with(&exec, 1).is_ok() {
                            count(both);
                        }
                        if keyed.check_key_n_with("k", &keyed_exec, 1).is_ok() {
                            count(keyed_both);
                        }
                    } else {
                        if exec.check().is_ok() {
                            count(late);
                        }
                        if keyed_exec.check_key("k").is_ok() {
                            count(keyed_late);
                        }
                    }
                }
            });
        }
    });
    let get = |c: &std::sync::atomic::AtomicU32| c.load(std::sync::atomic::Ordering::Relaxed);
    // The execution lane admitted each one-step admission and each late run once.
    assert!(
        get(&both) + get(&late) <= 200,
        "{} + {}",
        get(&both),
        get(&late)
    );
    assert!(get(&keyed_both) + get(&keyed_late) <= 200);
    // The booking lane admitted at least the one-step admissions (a few more where a
    // late run took the execution lane's room between the look and the take).
    assert!(200 - booked.remaining() >= get(&both));
    assert_eq!(
        booked.execution_lane().remaining(),
        200 - get(&both) - get(&late)
    );
    assert_eq!(
        keyed.execution_lane().remaining_key("k"),
        200 - get(&keyed_both) - get(&keyed_late)
    );
}
