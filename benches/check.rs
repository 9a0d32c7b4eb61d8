//! `check()` on the hot path: paceline, its peers and the hardware floor, in one run.
//!
//! * floor: one clock read (quanta, the clock governor also uses) and one compare-and-swap
//!   on a private cache line: what any exact, clock-driven limiter must pay at least;
//! * allowed: a quota so generous every check is admitted (each one writes the word);
//! * denied: a spent quota (a limiter whose deny path writes would show it here);
//! * on 1 thread and on 2 threads sharing one limiter (`PACELINE_BENCH_THREADS` sets the
//!   counts, e.g. "1,2,4,8,16" on a bigger machine).
//!
//! `cargo bench --bench check`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};

mod common;

type Check = Arc<dyn Fn() -> bool + Send + Sync>;

fn contenders(allowed: bool) -> Vec<(&'static str, Check)> {
    let mut v: Vec<(&'static str, Check)> = Vec::new();

    // The floor: a clock read and a CAS on a line no other thread touches.
    v.push((
        "floor",
        Arc::new(|| {
            thread_local! {
                static CLOCK: quanta::Clock = quanta::Clock::new();
            }
            common::cas_on_private_line(CLOCK.with(|c| c.raw()))
        }),
    ));

    let paceline = if allowed {
        paceline::Limiter::new(paceline::Quota::per_second(1_000_000_000).with_burst(u32::MAX))
    } else {
        let l = paceline::Limiter::new(paceline::Quota::per_hour(1));
        l.check().unwrap();
        l
    };
    v.push(("paceline", Arc::new(move || paceline.check().is_ok())));

    // paceline on its coarse clock: the same cell, no TSC read per check.
    let coarse = paceline::clock::CoarseClock::with_resolution(Duration::from_millis(1));
    let paceline_coarse = if allowed {
        paceline::Limiter::with_clock(
            paceline::Quota::per_second(1_000_000_000).with_burst(u32::MAX),
            coarse,
        )
    } else {
        let l = paceline::Limiter::with_clock(paceline::Quota::per_hour(1), coarse);
        l.check().unwrap();
        l
    };
    v.push((
        "paceline-coarse",
        Arc::new(move || paceline_coarse.check().is_ok()),
    ));

    let governor = {
        use governor::{Quota, RateLimiter};
        let max = NonZeroU32::MAX;
        if allowed {
            RateLimiter::direct(Quota::per_second(max).allow_burst(max))
        } else {
            let l = RateLimiter::direct(Quota::per_hour(NonZeroU32::MIN));
            l.check().unwrap();
            l
        }
    };
    v.push(("governor", Arc::new(move || governor.check().is_ok())));

    let ratelimit = if allowed {
        ratelimit::Ratelimiter::builder(1_000_000)
            .period(Duration::from_micros(1))
            .max_tokens(u64::MAX / 2)
            .initial_available(u64::MAX / 2)
            .build()
            .unwrap()
    } else {
        ratelimit::Ratelimiter::builder(1)
            .period(Duration::from_secs(3600))
            .max_tokens(1)
            .initial_available(0)
            .build()
            .unwrap()
    };
    v.push(("ratelimit", Arc::new(move || ratelimit.try_wait().is_ok())));

    let leaky = if allowed {
        leaky_bucket::RateLimiter::builder()
            .max(usize::MAX / 2)
            .initial(usize::MAX / 2)
            .refill(1_000_000)
            .interval(Duration::from_millis(1))
            .build()
    } else {
        leaky_bucket::RateLimiter::builder()
            .max(1)
            .initial(0)
            .refill(1)
            .interval(Duration::from_secs(3600))
            .build()
    };
    v.push(("leaky-bucket", Arc::new(move || leaky.try_acquire(1))));
    v
}

fn bench(c: &mut Criterion) {
    for (name, allowed) in [("allowed", true), ("denied", false)] {
        for threads in common::thread_counts() {
            let mut group = c.benchmark_group(format!("check/{name}/{threads}-thread"));
            for (who, check) in contenders(allowed) {
                group.bench_function(BenchmarkId::from_parameter(who), |b| {
                    b.iter_custom(|iters| {
                        let check = check.clone();
                        common::per_op_across_threads(threads, move |_| {
                            for _ in 0..iters {
                                black_box(check());
                            }
                        })
                    })
                });
            }
            group.finish();
        }
    }
}

common::bench_main!(common::criterion()
    .warm_up_time(Duration::from_millis(500))
    .measurement_time(Duration::from_secs(2))
    .sample_size(30));
