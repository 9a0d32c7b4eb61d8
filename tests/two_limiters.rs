//! `Limiter::check_n_with`: a caller's cells from a booking limiter and an execution
//! limiter in one step decides as the three steps it stands for (a look at the other,
//! this one's check, the other's check), on one clock.

use std::time::Duration;

use paceline::clock::ManualClock;
use paceline::{Denied, Limiter, Quota};
use proptest::prelude::*;

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
    if !exec.peek_n(n)?.is_zero() {
        return Err(exec.check_n(n).unwrap_err());
    }
    booked.check_n(n)?;
    exec.check_n(n)
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
