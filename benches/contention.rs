//! The check on a shared limiter from many threads at once: what a failed
//! compare-and-swap should do, decided by measurement.
//!
//! Each contender is a complete one-cell check (a clock read, the GCRA decision, one
//! compare-and-swap loop), run by `PACELINE_BENCH_THREADS` threads (default "1,2";
//! "1,2,4,8,16" on a many-core machine) against one limiter, in paired rounds:
//!
//! * `paceline` and `governor`: the libraries as users call them;
//! * `floor`: a clock read and a compare-and-swap on a line no other thread touches (no
//!   sharing: what each thread pays at least, alone);
//! * `shared-cas`: a clock read and a compare-and-swap loop on one shared word, with no
//!   limiter logic and no backoff (the plain shared floor);
//! * `lab-*`: paceline's own decision (`admit_in_room`, the same clock) with another
//!   policy after a failed compare-and-swap: `none` (retry at once), `hints-N` (doubling
//!   spin-hint counts up to N), `tsc-A-B` (spinning for a time-stamp-counter span that
//!   doubles from A to B ticks, then retrying from the value the failure returned;
//!   `-reload` loads the word afresh instead, `-at-once` retries a failure at once before
//!   sitting out again, `-esc-N` stops sitting out after N spans: paceline's own policy is
//!   `tsc-256-16384-esc-12`), and `xadd` (a `fetch_add` when the TAT is already ahead of
//!   the clock, with an exact give-back on overshoot).
//!
//! Regimes: `allowed` (a quota so generous that the TAT stays behind the clock and every
//! check is admitted: each admission writes `now + T`), `draining` (a huge burst being
//! spent: the TAT runs ahead of the clock and every check is admitted) and `denied` (a
//! spent quota: every check only reads).
//!
//! Each round runs every contender once, in an order that rotates between rounds, and the
//! medians are printed with the throughput ratio to governor and to the floors.
//! `PACELINE_BENCH_LATENCY=1` adds each check's own duration (p50, p99, p99.9, max) on
//! every thread count above one; `PACELINE_BENCH_REGIMES=allowed` picks regimes.
//! `PACELINE_BENCH_THREADS=1,2,4,8,16 cargo bench --bench contention`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use paceline::clock::{Clock, DefaultClock};

mod common;

type Check = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Regime {
    Allowed,
    Draining,
    Denied,
}

/// What a lab cell does after a failed compare-and-swap.
#[derive(Clone, Copy)]
enum Policy {
    /// Retries at once.
    None,
    /// Spins `1, 2, 4, ..` hints up to `max` per failure.
    Hints(u32),
    /// Spins until the time-stamp counter has moved `from, 2 from, ..` up to `to` ticks,
    /// then retries as `then` says.
    Tsc { from: u64, to: u64, then: Then },
    /// `fetch_add` when the TAT is ahead of the clock; a CAS loop (no backoff) otherwise.
    Xadd,
}

#[cfg(target_arch = "x86_64")]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// What a lab cell retries with after sitting out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The value the last failure returned (now likely stale).
    Stale,
    /// A fresh load of the word.
    Reload,
    /// The stale value, and if that fails, the value that failure returned, at once (the
    /// failed compare-and-swap brought the line to this core) before sitting out again.
    AtOnce,
    /// As `Stale` for this many sit-outs; from then on, retries at once until it wins (a
    /// starving thread stops being polite).
    Escalate(u32),
}

/// paceline's one-cell decision (`gcra::admit_in_room`), copied: `Ok(new TAT)` or `Err`.
#[inline(always)]
fn admit_in_room(tat: u64, now: u64, cost: u64, room: u64) -> Result<u64, ()> {
    let base = tat.max(now);
    if base - now > room {
        return Err(());
    }
    base.checked_add(cost).ok_or(())
}

struct Lab {
    tat: CachePadded<AtomicU64>,
    clock: DefaultClock,
    interval: u64,
    room: u64,
    policy: Policy,
}

impl Lab {
    fn new(interval: u64, burst: u64, policy: Policy) -> Lab {
        Lab {
            tat: CachePadded::new(AtomicU64::new(0)),
            clock: DefaultClock::default(),
            interval,
            room: interval.saturating_mul(burst) - interval,
            policy,
        }
    }

    #[inline(always)]
    fn check(&self) -> bool {
        let now = self.clock.now();
        let (cost, room) = (self.interval, self.room);
        let current = self.tat.load(Ordering::Relaxed);
        let Ok(next) = admit_in_room(current, now, cost, room) else {
            return false;
        };
        if let Policy::Xadd = self.policy {
            if current >= now {
                let prev = self.tat.fetch_add(cost, Ordering::Relaxed);
                if prev >= now && prev - now <= room {
                    return true;
                }
                if prev >= now {
                    // Overshoot: give the cell back (the sum of what was added stays exact).
                    self.tat.fetch_sub(cost, Ordering::Relaxed);
                    return false;
                }
                // The TAT fell behind the clock meanwhile: charge the difference too.
                self.tat.fetch_max(now + cost, Ordering::Relaxed);
                return true;
            }
        }
        match self
            .tat
            .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => true,
            Err(observed) => self.contended(observed, now),
        }
    }

    #[cold]
    #[inline(never)]
    fn contended(&self, mut current: u64, now: u64) -> bool {
        let mut step = 0u32;
        // With `AtOnce`, the failure that brought us here is retried at once too.
        let mut sit_out = !matches!(
            self.policy,
            Policy::Tsc {
                then: Then::AtOnce,
                ..
            }
        );
        let mut starving = false;
        loop {
            if sit_out && !starving {
                match self.policy {
                    Policy::None | Policy::Xadd => {}
                    Policy::Hints(max) => {
                        for _ in 0..(1u32 << step.min(16)).min(max) {
                            core::hint::spin_loop();
                        }
                    }
                    Policy::Tsc { from, to, then } => {
                        let span = (from << step.min(16)).min(to);
                        let start = ticks();
                        while ticks().wrapping_sub(start) < span {
                            core::hint::spin_loop();
                        }
                        match then {
                            Then::Reload => current = self.tat.load(Ordering::Relaxed),
                            Then::Escalate(after) if step + 1 >= after => starving = true,
                            _ => {}
                        }
                    }
                }
                step += 1;
                sit_out = !matches!(
                    self.policy,
                    Policy::Tsc {
                        then: Then::AtOnce,
                        ..
                    }
                );
            } else {
                sit_out = true;
            }
            let Ok(next) = admit_in_room(current, now, self.interval, self.room) else {
                return false;
            };
            match self.tat.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(observed) => current = observed,
            }
        }
    }
}

/// (interval in ns, burst) for a regime.
fn lab_quota(regime: Regime) -> (u64, u64) {
    match regime {
        Regime::Allowed => (1, u64::from(u32::MAX)),
        Regime::Draining => (1_000_000, u64::from(u32::MAX)),
        Regime::Denied => (3_600_000_000_000, 1),
    }
}

const fn tsc(from: u64, to: u64, then: Then) -> Policy {
    Policy::Tsc { from, to, then }
}

fn lab(regime: Regime, policy: Policy) -> Check {
    let (interval, burst) = lab_quota(regime);
    let l = Lab::new(interval, burst, policy);
    if regime == Regime::Denied {
        l.check();
    }
    Arc::new(move || l.check())
}

fn contenders(regime: Regime) -> Vec<(&'static str, Check)> {
    let mut v: Vec<(&'static str, Check)> = Vec::new();
    v.push((
        "floor",
        Arc::new(|| {
            thread_local! {
                static CLOCK: DefaultClock = DefaultClock::default();
            }
            common::cas_on_private_line(CLOCK.with(|c| c.now()))
        }),
    ));
    let shared = Arc::new((CachePadded::new(AtomicU64::new(0)), DefaultClock::default()));
    v.push((
        "shared-cas",
        Arc::new(move || {
            let now = shared.1.now();
            let mut cur = shared.0.load(Ordering::Relaxed);
            loop {
                match shared.0.compare_exchange_weak(
                    cur,
                    cur.max(now) + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return true,
                    Err(seen) => cur = seen,
                }
            }
        }),
    ));

    let quota = match regime {
        Regime::Allowed => paceline::Quota::per_second(1_000_000_000).with_burst(u32::MAX),
        Regime::Draining => paceline::Quota::per_second(1_000).with_burst(u32::MAX),
        Regime::Denied => paceline::Quota::per_hour(1),
    };
    let p = paceline::Limiter::new(quota);
    if regime == Regime::Denied {
        p.check().unwrap();
    }
    v.push(("paceline", Arc::new(move || p.check().is_ok())));

    let g = {
        use governor::{Quota, RateLimiter};
        let max = NonZeroU32::MAX;
        let quota = match regime {
            Regime::Allowed => Quota::per_second(max).allow_burst(max),
            Regime::Draining => Quota::per_second(NonZeroU32::new(1_000).unwrap()).allow_burst(max),
            Regime::Denied => Quota::per_hour(NonZeroU32::MIN),
        };
        let l = RateLimiter::direct(quota);
        if regime == Regime::Denied {
            l.check().unwrap();
        }
        l
    };
    v.push(("governor", Arc::new(move || g.check().is_ok())));

    if regime != Regime::Denied {
        for (name, policy) in [
            ("lab-none", Policy::None),
            ("lab-hints-64", Policy::Hints(64)),
            ("lab-tsc-256-8192", tsc(256, 8192, Then::Stale)),
            ("lab-tsc-256-16384", tsc(256, 16384, Then::Stale)),
            ("lab-tsc-256-16384-reload", tsc(256, 16384, Then::Reload)),
            ("lab-tsc-256-16384-at-once", tsc(256, 16384, Then::AtOnce)),
            (
                "lab-tsc-256-16384-esc-12",
                tsc(256, 16384, Then::Escalate(12)),
            ),
            (
                "lab-tsc-256-16384-esc-24",
                tsc(256, 16384, Then::Escalate(24)),
            ),
            ("lab-xadd", Policy::Xadd),
        ] {
            v.push((name, lab(regime, policy)));
        }
    }
    v
}

fn regime_name(regime: Regime) -> &'static str {
    match regime {
        Regime::Allowed => "allowed",
        Regime::Draining => "draining",
        Regime::Denied => "denied",
    }
}

fn main() {
    let rounds = common::rounds();
    // Checks per round across all threads.
    let checks: u64 = common::size(2_000_000, 2_000);
    // `PACELINE_BENCH_REGIMES` picks some, e.g. "allowed,denied".
    let picked = std::env::var("PACELINE_BENCH_REGIMES").unwrap_or_default();
    // `PACELINE_BENCH_LATENCY=1` adds each check's own time, from the time-stamp counter.
    let latency = std::env::var_os("PACELINE_BENCH_LATENCY").is_some();
    for regime in [Regime::Allowed, Regime::Draining, Regime::Denied] {
        let name = regime_name(regime);
        if !picked.is_empty() && !picked.split(',').any(|p| p.trim() == name) {
            continue;
        }
        for threads in common::thread_counts() {
            let names: Vec<&str> = contenders(regime).iter().map(|(n, _)| *n).collect();
            let mut ns: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
            for round in 0..rounds {
                // Fresh limiters every round, so a draining burst never runs out.
                let cs = contenders(regime);
                for k in 0..cs.len() {
                    let i = (k + round) % cs.len();
                    let check = cs[i].1.clone();
                    let per_thread = checks / threads as u64;
                    let t = common::per_op_across_threads(threads, move |_| {
                        for _ in 0..per_thread {
                            black_box(check());
                        }
                    });
                    ns[i].push(t.as_secs_f64() * 1e9 / per_thread as f64);
                }
            }
            if latency && threads > 1 {
                latencies(regime, threads, checks);
            }
            let medians: Vec<f64> = ns.iter_mut().map(|v| common::spread(v).0).collect();
            let at = |name: &str| medians[names.iter().position(|n| *n == name).unwrap()];
            let (governor, floor, shared) = (at("governor"), at("floor"), at("shared-cas"));
            for (who, m) in names.iter().zip(&medians) {
                println!(
                    "contention {:<8} {threads:>2} threads {who:<26} {m:7.1} ns/op  \
                     vs governor {:.2}x  vs floor {:.2}x  vs shared-cas {:.2}x",
                    name,
                    governor / m,
                    floor / m,
                    shared / m,
                );
            }
        }
    }
}

/// A histogram of check durations in ticks: four buckets per power of two.
struct Histogram {
    counts: Vec<u64>,
    max: u64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: vec![0; 4 * 64],
            max: 0,
        }
    }

    fn bucket(ticks: u64) -> usize {
        if ticks < 4 {
            return ticks as usize;
        }
        let octave = 63 - ticks.leading_zeros() as usize;
        4 * (octave - 1) + ((ticks >> (octave - 2)) & 3) as usize
    }

    /// The upper bound of a bucket, in ticks.
    fn upper(bucket: usize) -> u64 {
        if bucket < 4 {
            return bucket as u64 + 1;
        }
        let octave = bucket / 4 + 1;
        (4 + (bucket % 4) as u64 + 1) << (octave - 2)
    }

    fn record(&mut self, ticks: u64) {
        self.counts[Self::bucket(ticks)] += 1;
        self.max = self.max.max(ticks);
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    fn quantile(&self, q: f64) -> u64 {
        let total: u64 = self.counts.iter().sum();
        let want = (total as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::upper(b);
            }
        }
        self.max
    }
}

/// Ticks of the time-stamp counter per nanosecond, measured over 50 ms.
fn ticks_per_ns() -> f64 {
    static RATE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *RATE.get_or_init(|| {
        let (t0, i0) = (ticks(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(50));
        (ticks() - t0) as f64 / i0.elapsed().as_nanos() as f64
    })
}

/// Each check's own duration on `threads` threads, per contender: p50, p99, p99.9, max.
fn latencies(regime: Regime, threads: usize, checks: u64) {
    let rate = ticks_per_ns();
    for (who, check) in contenders(regime) {
        let merged = Arc::new(std::sync::Mutex::new(Histogram::new()));
        let per_thread = checks / threads as u64;
        let sink = merged.clone();
        common::per_op_across_threads(threads, move |_| {
            let mut h = Histogram::new();
            for _ in 0..per_thread {
                let start = ticks();
                black_box(check());
                h.record(ticks().wrapping_sub(start));
            }
            sink.lock().unwrap().merge(&h);
        });
        let h = merged.lock().unwrap();
        let ns = |t: u64| t as f64 / rate;
        println!(
            "latency    {:<8} {threads:>2} threads {who:<26} p50 {:>7.0} ns  p99 {:>7.0} ns  \
             p99.9 {:>8.0} ns  max {:>9.0} ns",
            regime_name(regime),
            ns(h.quantile(0.5)),
            ns(h.quantile(0.99)),
            ns(h.quantile(0.999)),
            ns(h.max),
        );
    }
}
