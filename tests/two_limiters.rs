//! `Limiter::check_n_with` and `KeyedLimiter::check_key_n_with`: a caller's cells from a
//! booking limiter and an execution limiter in one step decides as the three steps it
//! stands for (a look at the other, this one's check, the other's check), on one clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::clock::ManualClock;
use paceline::{Denied, KeyedLimiter, Limiter, Quota, TextKey};
use proptest::prelude::*;

mod common;

fn outcome(checked: Result<(), Denied>) -> &'static str {
    match checked {
        Ok(()) => "admitted",
        Err(Denied::InsufficientCapacity(_)) => "over the burst",
        Err(Denied::NotUntil(_)) => "not yet",
    }
}

fn stepwise(
    booked: &Limiter<ManualClock>,
    exec: &Limiter<ManualClock>,
    n: u32,
) -> Result<(), Denied> {
    common::stepwise!(booked, exec, peek_n, check_n, n)
}

#[derive(Debug, Clone)]
enum Step {
    Both(u32),
    LateRun(u32),
    Advance(u64),
}

proptest! {
    #[test]
    fn one_step_decides_as_the_three_it_stands_for(
        steps in prop::collection::vec(prop_oneof![
            4 => (0..7u32).prop_map(Step::Both),
            1 => (1..4u32).prop_map(Step::LateRun),
            1 => (0..300u64).prop_map(Step::Advance),
        ], 1..60),
        exec_burst in 3..7u32,
    ) {
        let clock = ManualClock::new();
        let quota = |burst| Quota::try_new(1, Duration::from_millis(100)).unwrap().with_burst(burst);
        let make = |burst| Limiter::with_clock(quota(burst), clock.clone());
        let (fused, fused_exec) = (make(5), make(exec_burst));
        let (model, model_exec) = (make(5), make(exec_burst));
        for step in &steps {
            match *step {
                Step::Both(n) => prop_assert_eq!(
                    outcome(fused.check_n_with(&fused_exec, n)),
                    outcome(stepwise(&model, &model_exec, n)),
                    "{:?}", step
                ),
                Step::LateRun(n) => prop_assert_eq!(
                    outcome(fused_exec.check_n(n)),
                    outcome(model_exec.check_n(n))
                ),
                Step::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            }
            prop_assert_eq!(fused.remaining(), model.remaining());
            prop_assert_eq!(fused_exec.remaining(), model_exec.remaining());
        }
    }
}

/// The three steps for a key, on keyed limiters.
fn stepwise_key(
    booked: &KeyedLimiter<TextKey, ManualClock>,
    exec: &KeyedLimiter<TextKey, ManualClock>,
    key: &TextKey,
    n: u32,
) -> Result<(), Denied> {
    common::stepwise!(booked, exec, peek_key_n, check_key_n, key, n)
}

#[derive(Debug, Clone)]
enum KeyStep {
    Both(u8, u32),
    LateRun(u8, u32),
    Advance(u64),
}

proptest! {
    #[test]
    fn one_step_decides_as_the_three_it_stands_for_each_key(
        steps in prop::collection::vec(prop_oneof![
            4 => (0..4u8, 0..7u32).prop_map(|(k, n)| KeyStep::Both(k, n)),
            1 => (0..4u8, 1..4u32).prop_map(|(k, n)| KeyStep::LateRun(k, n)),
            1 => (0..300u64).prop_map(KeyStep::Advance),
        ], 1..60),
        exec_burst in 3..7u32,
        lane in any::<bool>(),
    ) {
        let clock = ManualClock::new();
        let quota = |burst| Quota::try_new(1, Duration::from_millis(100)).unwrap().with_burst(burst);
        let make = |burst| KeyedLimiter::<TextKey, _>::with_clock(quota(burst), clock.clone());
        // The execution limiter a lane of the booking one (one hash for both) or a
        // limiter of its own (a hash each).
        let fused = make(5);
        let fused_exec = if lane {
            let exec = fused.execution_lane();
            exec.set_quota(quota(exec_burst));
            exec
        } else {
            make(exec_burst)
        };
        let (model, model_exec) = (make(5), make(exec_burst));
        for step in &steps {
            match *step {
                KeyStep::Both(k, n) => {
                    let text = format!("client-{k}");
                    prop_assert_eq!(
                        outcome(fused.check_text_n_with(&text, &fused_exec, n)),
                        outcome(stepwise_key(&model, &model_exec, &TextKey::new(&text), n)),
                        "{:?}", step
                    );
                }
                KeyStep::LateRun(k, n) => {
                    let key = TextKey::new(&format!("client-{k}"));
                    prop_assert_eq!(
                        outcome(fused_exec.check_key_n(&key, n)),
                        outcome(model_exec.check_key_n(&key, n))
                    );
                }
                KeyStep::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            }
            for k in 0..4u8 {
                let key = TextKey::new(&format!("client-{k}"));
                prop_assert_eq!(fused.remaining_key(&key), model.remaining_key(&key));
                prop_assert_eq!(fused_exec.remaining_key(&key), model_exec.remaining_key(&key));
            }
        }
    }
}

#[test]
fn a_new_key_the_other_table_has_no_room_for_spends_nothing_and_says_so() {
    let clock = ManualClock::new();
    let booked = KeyedLimiter::<u32, _>::with_clock(Quota::per_hour(1), clock.clone());
    let running = booked.execution_lane();
    running.set_max_keys(1);
    // Fill the execution limiter's table until it refuses a new key as full.
    let full = (0u32..)
        .find(|k| running.check_key(k).is_err_and(|e| e.is_table_full()))
        .unwrap();
    let refused = booked.check_key_n_with(&full, &running, 1).unwrap_err();
    assert!(matches!(refused, Denied::NotUntil(e) if e.is_table_full()));
    assert_eq!(
        booked.remaining_key(&full),
        1,
        "nothing spent where the other had no room"
    );
}

#[test]
fn a_limiter_paired_with_itself_takes_twice_the_cells_or_none() {
    let limiter = KeyedLimiter::<u32>::new(Quota::per_hour(8));
    assert!(limiter.check_key_n_with(&1, &limiter, 1).is_ok()); // a new key
    assert!(limiter.check_key_n_with(&1, &limiter, 1).is_ok()); // stored
    assert_eq!(limiter.remaining_key(&1), 4);
    // 5 fit once but not twice: refused, and nothing spent (it spent 5 and then refused).
    assert!(limiter.check_key_n_with(&1, &limiter, 5).is_err());
    assert_eq!(limiter.remaining_key(&1), 4);
    assert!(limiter.check_key_n_with(&1, &limiter, 2).is_ok());
    assert_eq!(limiter.remaining_key(&1), 0);
    assert!(matches!(
        limiter.check_key_n_with(&2, &limiter, 5),
        Err(Denied::InsufficientCapacity(_))
    ));
    assert_eq!(limiter.remaining_key(&2), 8);
    // 2n past u32::MAX is over any burst (saturated, it was u32::MAX cells, admitted).
    let huge = KeyedLimiter::<u32, _>::with_clock(
        Quota::per_second(u32::MAX).with_burst(u32::MAX),
        ManualClock::new(),
    );
    for n in [1 << 31, u32::MAX] {
        assert!(matches!(
            huge.check_key_n_with(&1, &huge, n),
            Err(Denied::InsufficientCapacity(_))
        ));
    }
    assert_eq!(huge.remaining_key(&1), u32::MAX);
}

/// A clock that steps back when told (the `Clock` contract allows it).
#[derive(Clone, Default)]
struct StepClock(Arc<std::sync::atomic::AtomicU64>);

impl StepClock {
    fn set(&self, secs: u64) {
        self.0
            .store(secs * 1_000_000_000, std::sync::atomic::Ordering::SeqCst);
    }
}

impl paceline::clock::Clock for StepClock {
    fn now(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn wake_at(&self, _at: u64, waker: std::task::Waker) {
        waker.wake()
    }
}

/// A clock that, once told to, steps back a nanosecond after every reading.
#[derive(Clone, Default)]
struct BackClock(Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicBool)>);

impl paceline::clock::Clock for BackClock {
    fn now(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        if self.0 .1.load(SeqCst) {
            self.0 .0.fetch_sub(1, SeqCst)
        } else {
            self.0 .0.load(SeqCst)
        }
    }

    fn wake_at(&self, _at: u64, waker: std::task::Waker) {
        waker.wake()
    }
}

/// A key new to this limiter takes the three steps; read at one time, they agree (at a
/// reading each, a clock stepping back made the look find room at the other's TAT that
/// its take, two readings earlier, refused, with this limiter's cell spent).
#[test]
fn the_three_steps_read_the_clock_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let clock = BackClock::default();
    let booked = KeyedLimiter::<u32, _>::with_clock(Quota::per_second(1), clock.clone());
    let running = booked.execution_lane();
    running.check_key(&1).unwrap(); // its TAT: 1 s
    clock.0 .0.store(1_000_000_000, SeqCst); // exactly replenished there
    clock.0 .1.store(true, SeqCst);
    let checked = booked.check_key_n_with(&1, &running, 1);
    clock.0 .1.store(false, SeqCst);
    clock.0 .0.store(1_000_000_000, SeqCst);
    let spent = 1 - booked.remaining_key(&1);
    assert!(
        checked.is_ok() || spent == 0,
        "refused, yet spent here: {checked:?}"
    );
}

/// The key stored in the execution limiter only, whose shard forgot keys at 10 s; the
/// clock then reads 9 s. The look must be at the time the take reads: at the shard's
/// forgetting time it found room that the take refused, with this limiter's cell spent.
#[test]
fn a_clock_that_stepped_back_behind_a_sweep_spends_nothing_on_a_refusal() {
    let clock = StepClock::default();
    let quota = Quota::per_second(1).with_burst(2);
    let booked = KeyedLimiter::<u32, _>::with_clock(quota, clock.clone());
    let running = booked.execution_lane();
    clock.set(5);
    for old in 100..120 {
        running.check_key(&old).unwrap(); // replenished, and forgotten, by 10 s
    }
    clock.set(9);
    running.check_key_n(&1, 2).unwrap(); // spent until 11 s
    clock.set(10);
    running.retain_recent(); // forgets the old keys: every shard forgot up to 10 s
    clock.set(9);
    assert!(booked.check_key_n_with(&1, &running, 1).is_err());
    assert_eq!(
        booked.remaining_key(&1),
        2,
        "refused by the other, yet spent here"
    );
}

/// Two limiters paired both ways round by threads that also store new keys (each store
/// takes a shard's write lock): the pairs' read locks are taken in one order, so no two
/// threads wait on each other for ever (taken in each call's own order, this hung within
/// a second).
#[test]
fn limiters_paired_both_ways_round_while_keys_are_stored_never_deadlock() {
    let a = Arc::new(KeyedLimiter::<u32>::new(Quota::per_second(1_000_000)));
    let b = Arc::new(a.execution_lane());
    let c = Arc::new(KeyedLimiter::<u32>::new(Quota::per_second(1_000_000)));
    let deadline = Instant::now() + Duration::from_secs(2);
    let (done, finished) = std::sync::mpsc::channel();
    for t in 0..8u32 {
        let (a, b, c, done) = (Arc::clone(&a), Arc::clone(&b), Arc::clone(&c), done.clone());
        std::thread::spawn(move || {
            let mut i = 0u32;
            while Instant::now() < deadline {
                // Every other key new (the write locks), the others stored (both reads).
                let key = if i.is_multiple_of(2) {
                    1_000 + t * 1_000_000 + i
                } else {
                    i % 4
                };
                let (one, other) = match t % 4 {
                    0 => (&a, &b),
                    1 => (&b, &a),
                    2 => (&a, &c),
                    _ => (&c, &a),
                };
                let _ = one.check_key_n_with(&key, other, 1);
                i += 1;
            }
            done.send(i).unwrap();
        });
    }
    for _ in 0..8 {
        let checks = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("threads pairing two limiters deadlocked");
        assert!(checks > 0);
    }
}
