//! 20 000 async waiters at 100 000/s (ideal: 200 ms): wall time and process CPU time for
//! paceline (default clock and `TokioClock`), leaky-bucket and governor on the same job, in
//! one run, first round by round (paired) and then under criterion; then the wake-up lateness
//! of paceline's timer next to futures-intrusive's (the evaluation in the README).
//!
//! `cargo bench --bench waiters`

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};

mod common;

/// 20 000 waiters in a benchmark run; 2 000 in a test run (`common::quick`).
fn waiters() -> u32 {
    common::size(20_000, 2_000)
}
const RATE: u32 = 100_000;

fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant libc knows.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

type Waiter = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

fn contender(name: &str, rt: &tokio::runtime::Runtime) -> Waiter {
    let quota = paceline::Quota::per_second(RATE).with_burst(1);
    match name {
        "paceline" => {
            let l = Arc::new(paceline::Limiter::new(quota));
            Arc::new(move || {
                let l = l.clone();
                Box::pin(async move { l.until_ready().await })
            })
        }
        "paceline+tokio" => {
            let clock = paceline::clock::TokioClock::from_handle(rt.handle().clone());
            let l = Arc::new(paceline::Limiter::with_clock(quota, clock));
            Arc::new(move || {
                let l = l.clone();
                Box::pin(async move { l.until_ready().await })
            })
        }
        "leaky-bucket" => {
            // leaky-bucket refills at most once per millisecond (its interval must be at
            // least 1 ms), so 100 000/s is 100 tokens per millisecond, burst 100.
            let l = Arc::new(
                leaky_bucket::RateLimiter::builder()
                    .max(100)
                    .initial(1)
                    .refill(100)
                    .interval(Duration::from_millis(1))
                    .build(),
            );
            Arc::new(move || {
                let l = l.clone();
                Box::pin(async move { l.acquire_one().await })
            })
        }
        "governor" => {
            let q = governor::Quota::per_second(NonZeroU32::new(RATE).unwrap())
                .allow_burst(NonZeroU32::MIN);
            let l = Arc::new(governor::RateLimiter::direct(q));
            Arc::new(move || {
                let l = l.clone();
                Box::pin(async move { l.until_ready().await })
            })
        }
        _ => unreachable!(),
    }
}

/// How long one run may take before it counts as failed: 50 times leaky-bucket's usual
/// wall time, so only a contender that stopped waking its waiters reaches it.
const RUN_LIMIT: Duration = Duration::from_secs(20);

/// One run: spawn all waiters, wait for the last; returns (wall, process CPU), or why the
/// run failed (a waiter panicked, or not all were done within [`RUN_LIMIT`]).
fn run_once(rt: &tokio::runtime::Runtime, waiter: &Waiter) -> Result<(Duration, Duration), String> {
    let (cpu0, start) = (cpu_time(), Instant::now());
    rt.block_on(async {
        let tasks: Vec<_> = (0..waiters()).map(|_| tokio::spawn(waiter())).collect();
        let all = async {
            for t in tasks {
                t.await.map_err(|e| format!("a waiter failed: {e}"))?;
            }
            Ok(())
        };
        tokio::time::timeout(RUN_LIMIT, all)
            .await
            .unwrap_or_else(|_| Err(format!("waiters still waiting after {RUN_LIMIT:?}")))
    })?;
    Ok((start.elapsed(), cpu_time() - cpu0))
}

/// The contenders this run measures. leaky-bucket 1.1.2's waiting is left out of a test
/// run: on a multi-thread runtime it now and then wakes a task that already finished
/// (tokio's `ref_count() > 0` assertion fails in `leaky_bucket::drain_wait_queue`, or the
/// run never ends), about once in a hundred test runs on a loaded 2-core machine, and a
/// test run must not depend on that. A benchmark run measures it, and reports a failed run.
fn contenders() -> Vec<&'static str> {
    let all = ["paceline", "paceline+tokio", "leaky-bucket", "governor"];
    all.into_iter()
        .filter(|who| !(common::quick() && *who == "leaky-bucket"))
        .collect()
}

/// `run_once` for a contender, which panics when one of paceline's runs fails and reports
/// a peer's failure, which then leaves that run out.
fn measured(rt: &tokio::runtime::Runtime, who: &str) -> Option<(Duration, Duration)> {
    match run_once(rt, &contender(who, rt)) {
        Ok(run) => Some(run),
        Err(why) if !who.starts_with("paceline") => {
            eprintln!("  {who}: run failed, left out: {why}");
            None
        }
        Err(why) => panic!("{who}: {why}"),
    }
}

/// Runs paceline (both clocks) and leaky-bucket in turn, round after round, and prints the
/// distribution of each one's per-round CPU time over leaky-bucket's. On a shared VM the
/// machine's speed drifts between criterion's back-to-back groups; within a round the
/// contenders ran a fraction of a second apart. `PACELINE_BENCH_ROUNDS` sets the rounds. A
/// round where leaky-bucket failed is left out; in a test run, which leaves leaky-bucket
/// out (see [`contenders`]), only the wall times are printed.
fn paired(rt: &tokio::runtime::Runtime) {
    let rounds = common::rounds();
    let who: Vec<_> = contenders()
        .into_iter()
        .filter(|w| *w != "governor")
        .collect();
    let base = who.iter().position(|w| *w == "leaky-bucket");
    let mut cpu_ratios = vec![Vec::new(); 2];
    let mut walls = vec![Vec::new(); who.len()];
    for _ in 0..rounds {
        let runs: Vec<_> = who.iter().map(|name| measured(rt, name)).collect();
        let Some(runs) = runs.into_iter().collect::<Option<Vec<_>>>() else {
            continue;
        };
        if let Some(base) = base {
            for (i, ratios) in cpu_ratios.iter_mut().enumerate() {
                ratios.push(runs[i].1.as_secs_f64() / runs[base].1.as_secs_f64());
            }
        }
        for (i, wall) in walls.iter_mut().enumerate() {
            wall.push(runs[i].0.as_secs_f64() * 1e3);
        }
    }
    let kept = walls[0].len();
    if base.is_some() && kept > 0 {
        eprintln!(
            "\npaired rounds ({kept} of {rounds}), CPU time over leaky-bucket's in the same round:"
        );
        for (name, ratios) in who.iter().zip(&mut cpu_ratios) {
            let (med, min, max) = common::spread(ratios);
            let below = ratios.iter().filter(|r| **r <= 1.0).count();
            eprintln!(
                "  {name:<13} median {med:.2}x (min {min:.2}x, max {max:.2}x), at or below in \
                 {below} of {kept}"
            );
        }
    } else {
        eprintln!("\npaired rounds ({kept} of {rounds}):");
    }
    for (name, wall) in who.iter().zip(&mut walls) {
        if wall.is_empty() {
            continue;
        }
        let (med, min, max) = common::spread(wall);
        eprintln!("  {name:<13} wall median {med:.1} ms (min {min:.1}, max {max:.1})");
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    paired(&rt);
    let mut group = c.benchmark_group("waiters/20k-at-100k-per-s");
    let mut summary = Vec::new();
    for who in contenders() {
        let (mut wall, mut cpu, mut runs, mut failed) = (Duration::ZERO, Duration::ZERO, 0u32, 0);
        group.bench_function(BenchmarkId::from_parameter(who), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // A failed run counts for criterion as the limit it ran into.
                    let Some((w, c)) = measured(&rt, who) else {
                        failed += 1;
                        total += RUN_LIMIT;
                        continue;
                    };
                    total += w;
                    wall += w;
                    cpu += c;
                    runs += 1;
                }
                total
            })
        });
        if failed > 0 {
            eprintln!("  {who}: {failed} failed run(s) left out of the summary");
        }
        // A criterion filter that leaves this contender out runs it zero times.
        if runs > 0 {
            summary.push((who, wall / runs, cpu / runs));
        }
    }
    group.finish();
    let ideal = Duration::from_secs(1) * (waiters() - 1) / RATE;
    eprintln!("\n20k waiters at 100k/s, ideal wall {ideal:?} (mean over all runs):");
    // Against paceline's default clock, when a criterion filter left it in.
    let paceline_cpu = summary.iter().find(|s| s.0 == "paceline").map(|s| s.2);
    for (who, wall, cpu) in &summary {
        let against = paceline_cpu.map_or(String::new(), |p| {
            format!(
                "   CPU vs paceline {:.2}x",
                cpu.as_secs_f64() / p.as_secs_f64()
            )
        });
        eprintln!(
            "  {who:<13} wall {:>8.1} ms ({:+.1} % vs ideal)   CPU {:>8.1} ms{against}",
            wall.as_secs_f64() * 1e3,
            (wall.as_secs_f64() / ideal.as_secs_f64() - 1.0) * 100.0,
            cpu.as_secs_f64() * 1e3,
        );
    }
    timer_lateness();
}

/// How late waiters wake, 200 of them due 100 us apart: paceline's queue and timer versus a
/// futures-intrusive timer (millisecond clock) driven by its own thread.
fn timer_lateness() {
    const N: u32 = 200;
    const GAP: Duration = Duration::from_micros(100);
    // Lateness in microseconds, negative when a waiter finished before its instant.
    let report = |who: &str, mut late: Vec<f64>| {
        late.sort_by(f64::total_cmp);
        let mean = late.iter().sum::<f64>() / late.len() as f64;
        let early = late.iter().filter(|l| **l < 0.0).count();
        eprintln!(
            "  {who:<18} lateness: mean {mean:>7.1} us, p50 {:>7.1} us, max {:>7.1} us, \
             early: {early} of {} (worst {:.1} us early)",
            late[late.len() / 2],
            late[late.len() - 1],
            late.len(),
            (-late[0]).max(0.0),
        );
    };
    fn signed(finished: Duration, due: Duration) -> f64 {
        finished.as_secs_f64() * 1e6 - due.as_secs_f64() * 1e6
    }
    eprintln!("\nwake-up lateness, {N} waiters due {GAP:?} apart:");

    // paceline: 10 000/s, burst 1; waiter i is due at i * 100 us after the first booking.
    async fn paceline_lateness<C: paceline::clock::Clock>(clock: C) -> Vec<f64> {
        let limiter =
            paceline::Limiter::with_clock(paceline::Quota::per_second(10_000).with_burst(1), clock);
        let start = Instant::now();
        let waits = (0..N).map(|i| {
            let limiter = &limiter;
            async move {
                limiter.until_ready().await;
                signed(start.elapsed(), GAP * i)
            }
        });
        futures::future::join_all(waits).await
    }
    let default_clock = paceline::clock::DefaultClock::default();
    report(
        "paceline",
        futures::executor::block_on(paceline_lateness(default_clock)),
    );

    // paceline with `TokioClock`: the same waiters, woken by tokio's millisecond timer (a
    // multi-thread runtime: on a current-thread one, the clock uses paceline's timer).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap();
    let clock = paceline::clock::TokioClock::from_handle(rt.handle().clone());
    report("paceline+tokio", rt.block_on(paceline_lateness(clock)));

    // futures-intrusive: its timer service with its std (millisecond) clock.
    use futures_intrusive::timer::{StdClock, Timer, TimerService};
    static CLOCK: std::sync::OnceLock<StdClock> = std::sync::OnceLock::new();
    let clock: &'static StdClock = CLOCK.get_or_init(StdClock::new);
    let service = Arc::new(TimerService::new(clock));
    // The driver runs until the last delay has fired, however late the waiters register
    // on a loaded machine: a driver that stopped at a fixed instant could leave them
    // waiting forever.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let driver = {
        let (service, done) = (service.clone(), done.clone());
        std::thread::spawn(move || {
            // Relaxed: the flag only ends the loop; nothing is read through it.
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                service.check_expirations();
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    };
    let late = futures::executor::block_on(async {
        let start = Instant::now();
        let waits: Vec<_> = (0..N)
            .map(|i| {
                let service = &service;
                async move {
                    service.delay(GAP * i).await;
                    signed(start.elapsed(), GAP * i)
                }
            })
            .collect();
        futures::future::join_all(waits).await
    });
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    driver.join().unwrap();
    report("futures-intrusive", late);
}

common::bench_main!(common::criterion()
    .warm_up_time(Duration::from_millis(100))
    .measurement_time(Duration::from_secs(3))
    .sample_size(10));
