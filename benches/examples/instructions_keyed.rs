//! Instruction counts of the keyed check beside governor's, over 10 000 keys (see
//! `benches/instructions/harness.rs`).

use std::num::NonZeroU32;

use harness::next_key;

#[path = "../instructions/harness.rs"]
mod harness;
use harness::Op;

fn workload(name: &str) -> Option<Op> {
    let max = NonZeroU32::MAX;
    let op: Op = match name {
        "check_key_under_limit/paceline" => {
            let l = paceline::KeyedLimiter::new(
                paceline::Quota::per_second(u32::MAX).with_burst(u32::MAX),
            );
            let key = next_key();
            Box::new(move || l.check_key(&key()).is_ok())
        }
        "check_key_under_limit/governor" => {
            let l = governor::RateLimiter::keyed(governor::Quota::per_second(max).allow_burst(max));
            let key = next_key();
            Box::new(move || l.check_key(&key()).is_ok())
        }
        "check_key_limited/paceline" => {
            let l = paceline::KeyedLimiter::new(paceline::Quota::per_hour(1));
            let key = next_key();
            for _ in 0..10_000 {
                let _ = l.check_key(&key());
            }
            Box::new(move || l.check_key(&key()).is_ok())
        }
        "check_key_limited/governor" => {
            let l = governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::MIN));
            let key = next_key();
            for _ in 0..10_000 {
                let _ = l.check_key(&key());
            }
            Box::new(move || l.check_key(&key()).is_ok())
        }
        _ => return None,
    };
    Some(op)
}

fn main() {
    harness::main(
        &[
            "check_key_under_limit/paceline",
            "check_key_under_limit/governor",
            "check_key_limited/paceline",
            "check_key_limited/governor",
        ],
        workload,
    );
}
