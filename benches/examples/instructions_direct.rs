//! Instruction counts of the direct limiter's checks beside governor's, and the floor
//! (see `benches/instructions/harness.rs`).

use std::hint::black_box;
use std::num::NonZeroU32;

#[path = "../instructions/harness.rs"]
mod harness;
use harness::Op;

fn workload(name: &str) -> Option<Op> {
    let max = NonZeroU32::MAX;
    let op: Op = match name {
        "check_allowed/paceline" => {
            let l =
                paceline::Limiter::new(paceline::Quota::per_second(u32::MAX).with_burst(u32::MAX));
            Box::new(move || l.check().is_ok())
        }
        "check_allowed/governor" => {
            let l =
                governor::RateLimiter::direct(governor::Quota::per_second(max).allow_burst(max));
            Box::new(move || l.check().is_ok())
        }
        "check_denied/paceline" => {
            let l = paceline::Limiter::new(paceline::Quota::per_hour(1));
            l.check().unwrap();
            Box::new(move || l.check().is_ok())
        }
        "check_denied/governor" => {
            let l = governor::RateLimiter::direct(governor::Quota::per_hour(NonZeroU32::MIN));
            l.check().unwrap();
            Box::new(move || l.check().is_ok())
        }
        "check_n_allowed/paceline" => {
            let l =
                paceline::Limiter::new(paceline::Quota::per_second(u32::MAX).with_burst(u32::MAX));
            Box::new(move || l.check_n(3).is_ok())
        }
        "check_n_allowed/governor" => {
            let l =
                governor::RateLimiter::direct(governor::Quota::per_second(max).allow_burst(max));
            let three = NonZeroU32::new(3).unwrap();
            Box::new(move || matches!(l.check_n(three), Ok(Ok(()))))
        }
        // The floor: one clock read (quanta, which both limiters use) and one
        // compare-and-swap on a word of its own; what any exact clock-driven check pays.
        "floor/clock_and_cas" => {
            let clock = quanta::Clock::new();
            let start = clock.raw();
            let word = std::sync::atomic::AtomicU64::new(0);
            Box::new(move || {
                let now = clock.delta_as_nanos(start, clock.raw());
                let seen = word.load(std::sync::atomic::Ordering::Relaxed);
                word.compare_exchange(
                    seen,
                    now.max(seen) + 1,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
            })
        }
        "floor/default_clock" => {
            use paceline::clock::Clock;
            let clock = paceline::clock::DefaultClock::default();
            Box::new(move || black_box(clock.now()) > 0)
        }
        "remaining/paceline" => {
            let l = paceline::Limiter::new(paceline::Quota::per_second(100));
            Box::new(move || black_box(l.remaining()) > 0)
        }
        _ => return None,
    };
    Some(op)
}

fn main() {
    harness::main(
        &[
            "check_allowed/paceline",
            "check_allowed/governor",
            "check_denied/paceline",
            "check_denied/governor",
            "check_n_allowed/paceline",
            "check_n_allowed/governor",
            "remaining/paceline",
            "floor/clock_and_cas",
            "floor/default_clock",
        ],
        workload,
    );
}
