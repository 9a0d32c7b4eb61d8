//! What the benches share: running one workload on several threads at once, and the
//! paired rounds' count and summary.

#![allow(dead_code)] // each bench uses a different part

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Runs `work(thread_index)` on each of `threads` threads at once (on this thread when
/// `threads` is 1) and returns the wall time divided by `threads`: the time per operation
/// of the whole group when each `work` does the same number of operations. Lower is
/// better, and a ratio between two contenders is a throughput ratio.
pub(crate) fn per_op_across_threads<W>(threads: usize, work: W) -> Duration
where
    W: Fn(usize) + Send + Sync + 'static,
{
    if threads == 1 {
        let start = Instant::now();
        work(0);
        return start.elapsed();
    }
    let work = Arc::new(work);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (work, barrier) = (work.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                work(t);
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed() / threads as u32
}

/// The floor's compare-and-swap: moves this thread's own word (on a line no other thread
/// touches) to `now + 1`, as an admission would, from the value it loads.
pub(crate) fn cas_on_private_line(now: u64) -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    thread_local! {
        static CELL: crossbeam_utils::CachePadded<AtomicU64> =
            const { crossbeam_utils::CachePadded::new(AtomicU64::new(0)) };
    }
    CELL.with(|cell| {
        let cur = cell.load(Ordering::Relaxed);
        cell.compare_exchange(cur, cur.max(now) + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    })
}

/// Whether this is a test run (`cargo test --all-targets`), not `cargo bench` (which
/// passes `--bench`): then a bench only proves it runs, with one tiny round, and leaves
/// the time to the checks.
pub(crate) fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// `full` in a benchmark run, `tiny` in a test run (see [`quick`]).
pub(crate) fn size<T>(full: T, tiny: T) -> T {
    if quick() {
        tiny
    } else {
        full
    }
}

/// How many paired rounds to run: `PACELINE_BENCH_ROUNDS`, 15 by default; 1 in a test run.
pub(crate) fn rounds() -> usize {
    if quick() {
        return 1;
    }
    std::env::var("PACELINE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(15)
}

/// The thread counts to run: `PACELINE_BENCH_THREADS` ("1,2,4,8,16" on a many-core
/// machine), 1 and 2 by default.
pub(crate) fn thread_counts() -> Vec<usize> {
    std::env::var("PACELINE_BENCH_THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 2])
}

/// Sorts `values` and returns their median, minimum and maximum.
pub(crate) fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// The criterion settings every bench starts from: short runs, since the paired rounds
/// each bench prints before criterion carry the ratios.
pub(crate) fn criterion() -> criterion::Criterion {
    criterion::Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

/// The bench's `main`: its function `bench` under criterion with `config`.
#[allow(unused_macros)] // http_e2e has a main of its own
macro_rules! bench_main {
    ($config:expr) => {
        criterion::criterion_group! {
            name = benches;
            config = $config;
            targets = bench
        }
        criterion::criterion_main!(benches);
    };
}
#[allow(unused_imports)]
pub(crate) use bench_main;
