//! `check_key`, paceline vs governor's keyed limiter, in the traffic servers see, with the
//! memory each stores (measured with a counting allocator), in one run:
//!
//! 1. `under-limit`: 100 000 recurring clients at 1000/s, burst 1, each refilled between
//!    its visits (the normal state of a server);
//!    `pollers`: 100 000 clients visiting in one fixed order, round after round, at
//!    1 000 000/s, burst 1 (each refilled long before its next visit);
//! 2. `limited`: 100 000 clients at 1/s, burst 1000, every one of them limited;
//! 3. `zipf`: Zipf-distributed popularity over 1 000 000 clients (s = 1: a few hot keys,
//!    a long tail) at 100/s, burst 10;
//! 4. `rotating`: 50 000 active clients at 1000/s, burst 1, the population sliding by
//!    `PACELINE_BENCH_NEW_KEYS_PER_SEC` (default 200 000) never-seen keys per second;
//! 5. `flood`: one thread floods never-seen keys while another checks 100 000 known
//!    ones, first at 1/s, burst 1000 (each check admitted, so each writes its key's
//!    entry), then at 1/hour (each check denied, reading only); none is ever replenished,
//!    so none can be forgotten to make room. paceline has `with_max_keys(100_000)`, governor
//!    has no bound.
//!
//! Regimes 1–3 also run a floor (a map no thread changes, a clock read, the decision and
//! its compare-and-swap: [`floor`]).
//!
//! Regimes 1–4 alternate the two limiters round by round (`PACELINE_BENCH_ROUNDS`, 2 M
//! checks per round) and print the per-round throughput ratio's median and spread, and
//! each limiter's median time per check (of the whole group of threads), on 1 and 2
//! threads (`PACELINE_BENCH_THREADS` sets the counts); criterion then measures them
//! once more. `cargo bench --bench keyed`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};

mod common;

#[path = "../tests/common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

/// A keyed limiter under test: its check, and how many keys it stores.
#[derive(Clone)]
struct Contender {
    check: Arc<dyn Fn(&u64) -> bool + Send + Sync>,
    len: Arc<dyn Fn() -> usize + Send + Sync>,
}

fn paceline(quota: paceline::Quota, max_keys: Option<usize>) -> Contender {
    let mut limiter = paceline::KeyedLimiter::<u64>::new(quota);
    if let Some(max) = max_keys {
        limiter = limiter.with_max_keys(max);
    }
    let limiter = Arc::new(limiter);
    let l = limiter.clone();
    Contender {
        check: Arc::new(move |k| l.check_key(k).is_ok()),
        len: Arc::new(move || limiter.len()),
    }
}

fn governor(per_second: u32, burst: u32) -> Contender {
    governor_with(
        governor::Quota::per_second(NonZeroU32::new(per_second).unwrap())
            .allow_burst(NonZeroU32::new(burst).unwrap()),
    )
}

fn governor_with(quota: governor::Quota) -> Contender {
    let limiter = Arc::new(governor::RateLimiter::<u64, _, _>::keyed(quota));
    let l = limiter.clone();
    Contender {
        check: Arc::new(move |k| l.check_key(k).is_ok()),
        len: Arc::new(move || limiter.len()),
    }
}

/// The floor: what any keyed limiter pays at least for a check of a stored key. A hash
/// and a probe of a map that no thread changes (foldhash over hashbrown, the fastest
/// common pair), a clock read (quanta, as both limiters), the GCRA decision and, when
/// admitted, one compare-and-swap on the key's word. It takes no lock and never stores
/// a key, so it exists only where every key is known before the run (not for a rotating
/// population); no limiter that stores keys as they come can be this cheap.
fn floor(keys: Keys, (per_second, burst): (u32, u32)) -> Option<Contender> {
    let mut known: Vec<u64> = match keys {
        Keys::Uniform(n) | Keys::InOrder(n) => (0..n).collect(),
        Keys::Zipf => zipf_sample().to_vec(),
        Keys::Rotating { .. } => return None,
    };
    // Each key once: a map sized for the sample's repeats would be several times larger
    // than the limiters' tables, and slower for it.
    known.sort_unstable();
    known.dedup();
    let map: hashbrown::HashMap<u64, AtomicU64> =
        known.into_iter().map(|k| (k, AtomicU64::new(0))).collect();
    let len = map.len();
    let interval = 1_000_000_000 / u64::from(per_second);
    let room = u64::from(burst - 1) * interval;
    let clock = quanta::Clock::new();
    Some(Contender {
        check: Arc::new(move |k| {
            let Some(word) = map.get(k) else {
                return false;
            };
            let now = clock.delta_as_nanos(0, clock.raw());
            let tat = word.load(Ordering::Relaxed);
            let base = tat.max(now);
            base - now <= room
                && word
                    .compare_exchange(tat, base + interval, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
        }),
        len: Arc::new(move || len),
    })
}

/// Which key the `i`-th check of a thread asks for.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// Uniform over `0..n`.
    Uniform(u64),
    /// `0..n` in the same order round after round (pollers), each thread from its own
    /// starting point.
    InOrder(u64),
    /// Zipf (s = 1) over a million keys, from a precomputed sample.
    Zipf,
    /// Uniform over a window of `active` keys that slides by `per_sec` keys per second.
    Rotating { active: u64, per_sec: u64 },
}

const ZIPF_KEYS: f64 = 1_000_000.0;

/// 2^20 Zipf(1) samples: rank = N^u - 1 for uniform u (the continuous inverse of a CDF
/// proportional to ln k), scrambled so that hot keys do not sit side by side.
fn zipf_sample() -> &'static [u64] {
    static SAMPLE: OnceLock<Vec<u64>> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let mut x = 0x853c_49e6_748f_ea9bu64;
        (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                let rank = (ZIPF_KEYS.powf(u) - 1.0) as u64;
                rank.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            })
            .collect()
    })
}

/// The origin of the rotating window, shared by every run so it keeps sliding.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// `x` (uniform over `u64`) mapped uniformly onto `0..n` with a multiply and a shift: a
/// 64-bit division (`x % n`) would add its own latency to every check measured.
fn below(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

/// `iters` checks per thread, a different sequence on each thread.
///
/// Making a key costs a few instructions and no cache miss, so that the time measured is
/// the limiters'. (Zipf keys were once read from random places in the 8 MB sample: a cache
/// and TLB miss per check of the harness's own, about half of each check's measured time,
/// which pulled every ratio towards 1.)
fn run(who: &Contender, keys: Keys, threads: usize, iters: u64) -> Duration {
    let check = who.check.clone();
    common::per_op_across_threads(threads, move |t| {
        let mut x = 0x2545_f491_4f6c_dd1d ^ (0x9e37_79b9 * (t as u64 + 1));
        let zipf = zipf_sample();
        // The sample's draws are independent, so reading it in order from a point of each
        // run's own is as random as reading it at random places.
        let zipf_start = (x >> 40) as usize;
        let mut cursor = t as u64 * 7_919;
        let mut base = 0u64;
        for i in 0..iters {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = match keys {
                Keys::Uniform(n) => below(x, n),
                Keys::InOrder(n) => {
                    if cursor >= n {
                        cursor %= n;
                    }
                    cursor += 1;
                    cursor - 1
                }
                Keys::Zipf => zipf[(zipf_start + i as usize) & (zipf.len() - 1)],
                Keys::Rotating { active, per_sec } => {
                    if i % 256 == 0 {
                        base = (epoch().elapsed().as_secs_f64() * per_sec as f64) as u64;
                    }
                    base + below(x, active)
                }
            };
            black_box(check(&key));
        }
    })
}

/// One regime: its name, key pattern, and the quota (per second, burst) every contender
/// gets.
struct Regime {
    name: &'static str,
    keys: Keys,
    quota: (u32, u32),
}

fn new_keys_per_sec() -> u64 {
    std::env::var("PACELINE_BENCH_NEW_KEYS_PER_SEC")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

fn regimes() -> Vec<Regime> {
    let keys = common::size(100_000, 10_000);
    vec![
        Regime {
            name: "under-limit",
            keys: Keys::Uniform(keys),
            quota: (1_000, 1),
        },
        Regime {
            name: "pollers",
            keys: Keys::InOrder(keys),
            // Refilled a thousand times faster than a round of visits comes back, as a
            // client polling every few seconds under a per-second quota is.
            quota: (1_000_000, 1),
        },
        Regime {
            name: "limited",
            keys: Keys::Uniform(keys),
            quota: (1, 1_000),
        },
        Regime {
            name: "zipf",
            keys: Keys::Zipf,
            quota: (100, 10),
        },
        Regime {
            name: "rotating",
            keys: Keys::Rotating {
                active: keys / 2,
                per_sec: new_keys_per_sec(),
            },
            quota: (1_000, 1),
        },
    ]
}

/// Builds a contender, warms it with `warm` checks, and returns it with its memory per
/// stored key and its stored keys.
fn warmed(build: impl FnOnce() -> Contender, keys: Keys, warm: u64) -> (Contender, f64, usize) {
    let before = live();
    let who = build();
    run(&who, keys, 1, warm);
    let stored = (who.len)();
    let bytes = (live() - before) as f64 / stored.max(1) as f64;
    (who, bytes, stored)
}

fn bench(c: &mut Criterion) {
    // Made before any memory is measured: every run takes it, whatever its keys.
    zipf_sample();
    epoch();
    let checks: u64 = common::size(2_000_000, 20_000);
    let rounds = common::rounds();
    let mut built = Vec::new();
    // `PACELINE_BENCH_REGIMES` picks some, e.g. "rotating,flood".
    let picked = std::env::var("PACELINE_BENCH_REGIMES").unwrap_or_default();
    let picked = |name: &str| picked.is_empty() || picked.split(',').any(|p| p.trim() == name);
    for regime in regimes() {
        if !picked(regime.name) {
            continue;
        }
        let warm = checks * 2;
        let (per_second, burst) = regime.quota;
        let quota = paceline::Quota::per_second(per_second).with_burst(burst);
        let (p, p_mem, p_len) = warmed(|| paceline(quota, None), regime.keys, warm);
        let (g, g_mem, g_len) = warmed(|| governor(per_second, burst), regime.keys, warm);
        let lower = floor(regime.keys, regime.quota);
        eprintln!(
            "\n{}: memory per stored key paceline {p_mem:.1} B ({p_len} keys), governor \
             {g_mem:.1} B ({g_len} keys); total paceline/governor {:.2}",
            regime.name,
            (p_mem * p_len as f64) / (g_mem * g_len as f64)
        );
        for threads in common::thread_counts() {
            let (mut ratios, mut p_ns, mut g_ns, mut f_ns) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                let per_thread = checks / threads as u64;
                // Per check of the group (`run` returns the wall time over `threads`).
                let ns = |t: Duration| t.as_secs_f64() * 1e9 / per_thread as f64;
                let tp = run(&p, regime.keys, threads, per_thread);
                let tg = run(&g, regime.keys, threads, per_thread);
                ratios.push(tg.as_secs_f64() / tp.as_secs_f64());
                p_ns.push(ns(tp));
                g_ns.push(ns(tg));
                if let Some(f) = &lower {
                    f_ns.push(ns(run(f, regime.keys, threads, per_thread)));
                }
            }
            let (median, min, max) = common::spread(&mut ratios);
            let (p_ns, g_ns) = (common::spread(&mut p_ns).0, common::spread(&mut g_ns).0);
            let beside_floor = match f_ns.is_empty() {
                true => String::new(),
                false => {
                    let f_ns = common::spread(&mut f_ns).0;
                    format!(
                        ", floor {f_ns:.1} (paceline over the floor {:.2}x)",
                        p_ns / f_ns
                    )
                }
            };
            eprintln!(
                "{}: paired rounds, {threads} thread(s): paceline/governor throughput median \
                 {median:.2}x (min {min:.2}x, max {max:.2}x) over {rounds} rounds of \
                 {checks} checks; median ns per check paceline {p_ns:.1}, governor \
                 {g_ns:.1}{beside_floor}",
                regime.name
            );
        }
        eprintln!(
            "{}: after the rounds, stored keys paceline {}, governor {}",
            regime.name,
            (p.len)(),
            (g.len)()
        );
        built.push((regime.name, regime.keys, p, g));
    }
    if picked("flood") {
        flood();
    }
    for (name, keys, p, g) in &built {
        for threads in common::thread_counts() {
            let mut group = c.benchmark_group(format!("check_key/{name}/{threads}-thread"));
            for (who, contender) in [("paceline", p), ("governor", g)] {
                group.bench_function(BenchmarkId::from_parameter(who), |b| {
                    b.iter_custom(|iters| run(contender, *keys, threads, iters))
                });
            }
            group.finish();
        }
    }
}

/// Regime 5: a flood of never-seen keys on one thread while another checks known keys.
/// Reports known-key throughput with and without the flood, and memory before and after.
fn flood() {
    let known: u64 = common::size(100_000, 10_000);
    let checks: u64 = common::size(4_000_000, 20_000);
    let flood_for = Duration::from_millis(common::size(2_000, 50));
    eprintln!(
        "\nflood: a thread inserting never-seen keys for {flood_for:?} while another checks \
         {known} known keys"
    );
    // Known keys admitted on every check (each writes its entry), then known keys limited
    // (their checks only read); either way none is replenished, so none can be forgotten
    // to make room.
    let contenders = [
        (
            "paceline, known keys admitted",
            paceline(
                paceline::Quota::per_second(1).with_burst(1_000),
                Some(known as usize),
            ),
        ),
        ("governor, known keys admitted", governor(1, 1_000)),
        (
            "paceline, known keys limited",
            paceline(paceline::Quota::per_hour(1), Some(known as usize)),
        ),
        (
            "governor, known keys limited",
            governor_with(governor::Quota::per_hour(NonZeroU32::MIN)),
        ),
    ];
    for (who, contender) in contenders {
        let before = live();
        run(&contender, Keys::Uniform(known), 1, known * 3);
        let stored_before = (contender.len)();
        let mem_before = live() - before;
        let quiet = run(&contender, Keys::Uniform(known), 1, checks);
        let stop = Arc::new(AtomicBool::new(false));
        let flooded = Arc::new(AtomicU64::new(0));
        let flooder = {
            let (stop, flooded, check) = (stop.clone(), flooded.clone(), contender.check.clone());
            std::thread::spawn(move || {
                let mut key = 1u64 << 40;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1_024 {
                        black_box(check(&key));
                        key += 1;
                    }
                    flooded.fetch_add(1_024, Ordering::Relaxed);
                }
            })
        };
        let start = Instant::now();
        let mut during = Duration::ZERO;
        let mut rounds = 0u32;
        while start.elapsed() < flood_for {
            during += run(&contender, Keys::Uniform(known), 1, checks / 10);
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        flooder.join().unwrap();
        let during = during / rounds.max(1) * 10;
        let mem_after = live() - before;
        eprintln!(
            "flood: {who:<29} known-key checks {:.1} M/s quiet, {:.1} M/s during the flood \
             ({:.2}x); {} new keys offered; stored keys {stored_before} -> {}; memory \
             {:.1} MB -> {:.1} MB",
            checks as f64 / quiet.as_secs_f64() / 1e6,
            checks as f64 / during.as_secs_f64() / 1e6,
            quiet.as_secs_f64() / during.as_secs_f64(),
            flooded.load(Ordering::Relaxed),
            (contender.len)(),
            mem_before as f64 / 1e6,
            mem_after as f64 / 1e6,
        );
    }
}

common::bench_main!(common::criterion());
