//! What a budget costs, uncontended: a turn taken and settled (two rates and a cap, one
//! lock, a log entry), beside a single `Limiter`'s check and its waiting path answered at
//! once, and the same turn on a budget shared by processes (a file), in one run. A budget
//! guards API calls, which take milliseconds; this says how
//! far from a nanosecond hot path it is.
//!
//! `cargo bench -p paceline-benches --bench budget`

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::Criterion;
use paceline::budget::Budget;
use paceline::{Limiter, Quota};

/// Quotas so generous that nothing ever waits.
fn generous() -> Quota {
    Quota::per_second(1_000_000_000).with_burst(u32::MAX)
}

/// Polls `future` once; it must be ready.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the benchmark's quota made a caller wait"),
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("budget_uncontended");

    let limiter = Limiter::new(generous());
    group.bench_function("limiter_check", |b| {
        b.iter(|| black_box(limiter.check()).is_ok())
    });
    group.bench_function("limiter_until_n_ready", |b| {
        b.iter(|| black_box(now(limiter.until_n_ready(1))).is_ok())
    });

    let one = Budget::builder()
        .rate("requests", generous())
        .build()
        .unwrap();
    group.bench_function("budget_1_rate_try_acquire_drop", |b| {
        b.iter(|| drop(black_box(one.try_acquire(&[]))))
    });

    let budget = Budget::builder()
        .rate("requests", generous())
        .rate("tokens", generous())
        .in_flight(64)
        .build()
        .unwrap();
    group.bench_function("budget_2_rates_cap_try_acquire_settle", |b| {
        b.iter(|| {
            let turn = budget.try_acquire(&[("tokens", 300)]).unwrap();
            turn.settle(&[("tokens", 230)]).unwrap();
        })
    });
    group.bench_function("budget_2_rates_cap_acquire_settle", |b| {
        b.iter(|| {
            let turn = now(budget.acquire(&[("tokens", 300)])).unwrap();
            turn.settle(&[("tokens", 230)]).unwrap();
        })
    });

    // The same turn in a shared file (every process's budget): two locks (this
    // process's, the file's word) and the state read and written per call.
    let path = std::env::temp_dir().join(format!("paceline-bench-budget-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let shared = paceline::shared::SharedBudget::builder()
        .rate("requests", generous())
        .rate("tokens", generous())
        .in_flight(64)
        .open(&path)
        .unwrap();
    group.bench_function("shared_budget_2_rates_cap_try_acquire_settle", |b| {
        b.iter(|| {
            let turn = shared.try_acquire(&[("tokens", 300)]).unwrap();
            turn.settle(&[("tokens", 230)]).unwrap();
        })
    });
    group.finish();
    let _ = std::fs::remove_file(&path);
    c.final_summary();
}
