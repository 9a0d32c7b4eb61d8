//! `check_key` over 100 000 live keys, pacer vs governor's keyed limiter, plus the memory
//! each stores per key (measured with a counting allocator), in one run.
//!
//! `cargo bench --bench keyed`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

mod common;

const KEYS: u64 = 100_000;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to `System`, only counting the bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract is `System::realloc`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

type CheckKey = Arc<dyn Fn(&u64) -> bool + Send + Sync>;

/// Builds each contender with all keys present; returns them with their bytes per key.
///
/// The quota (1 per second, burst 1000) keeps every key limited for the whole run, so
/// both maps hold all 100 000 keys (pacer forgets replenished keys on its own; with a
/// faster quota it would be measuring a nearly empty map).
fn contenders() -> Vec<(&'static str, CheckKey, f64)> {
    let measure = |build: &dyn Fn() -> CheckKey| {
        let before = LIVE.load(Ordering::Relaxed);
        let check = build();
        for k in 0..KEYS {
            check(&k);
        }
        let bytes = LIVE.load(Ordering::Relaxed) - before;
        (check, bytes as f64 / KEYS as f64)
    };
    let (pacer, pacer_mem) = measure(&|| {
        let l = pacer::KeyedLimiter::<u64>::new(pacer::Quota::per_second(1).with_burst(1_000));
        Arc::new(move |k: &u64| l.check_key(k).is_ok())
    });
    let (governor, governor_mem) = measure(&|| {
        let q = governor::Quota::per_second(NonZeroU32::MIN)
            .allow_burst(NonZeroU32::new(1_000).unwrap());
        let l = governor::RateLimiter::<u64, _, _>::keyed(q);
        Arc::new(move |k: &u64| l.check_key(k).is_ok())
    });
    eprintln!(
        "memory per key ({KEYS} keys): pacer {pacer_mem:.3} B, governor {governor_mem:.3} B \
         (ratio {:.4})",
        pacer_mem / governor_mem
    );
    vec![
        ("pacer", pacer, pacer_mem),
        ("governor", governor, governor_mem),
    ]
}

/// `iters` checks per thread of pseudo-random keys, a different sequence on each thread.
fn run(check: &CheckKey, threads: usize, iters: u64) -> Duration {
    let check = check.clone();
    common::per_op_across_threads(threads, move |t| {
        let mut x = 0x2545_f491_4f6c_dd1d ^ (0x9e37_79b9 * t as u64);
        for _ in 0..iters {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            black_box(check(&(x % KEYS)));
        }
    })
}

fn bench(c: &mut Criterion) {
    let contenders = contenders();
    paired(&contenders);
    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("check_key/100k-keys/{threads}-thread"));
        for (who, check, _) in &contenders {
            group.bench_function(BenchmarkId::from_parameter(who), |b| {
                b.iter_custom(|iters| run(check, threads, iters))
            });
        }
        group.finish();
    }
}

/// Alternates the contenders round by round and prints the distribution of the per-round
/// throughput ratio (governor's time / pacer's). On a shared VM the machine's speed drifts
/// between criterion's back-to-back measurements; a ratio taken within one round, where
/// both ran seconds apart, is the fairer comparison. `PACER_BENCH_ROUNDS` sets the rounds.
fn paired(contenders: &[(&'static str, CheckKey, f64)]) {
    const CHECKS: u64 = 2_000_000;
    let rounds = common::rounds();
    let [(_, pacer, _), (_, governor, _)] = contenders else {
        unreachable!("pacer and governor")
    };
    for threads in [1, 2] {
        let mut ratios: Vec<f64> = (0..rounds)
            .map(|_| {
                let p = run(pacer, threads, CHECKS / threads as u64);
                let g = run(governor, threads, CHECKS / threads as u64);
                g.as_secs_f64() / p.as_secs_f64()
            })
            .collect();
        let (median, min, max) = common::spread(&mut ratios);
        eprintln!(
            "paired rounds, {threads} thread(s): pacer/governor throughput median \
             {median:.2}x, min {min:.2}x, max {max:.2}x over {rounds} rounds of {CHECKS} \
             checks each",
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4))
        .sample_size(40);
    targets = bench
}
criterion_main!(benches);
