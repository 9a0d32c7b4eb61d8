//! A check on a shared file (`paceline::shared`) beside an in-process check and the floor,
//! in one run: paired rounds on one thread, allowed and denied; a keyed check of 1000
//! stored keys beside the in-process `KeyedLimiter`'s; then the same checks from 1, 2 and
//! 4 processes at once on one file, beside as many threads on one in-process limiter (what
//! contention between processes costs, against contention between threads).
//!
//! `cargo bench --bench shared`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use paceline::shared::{SharedKeyedLimiter, SharedLimiter};
use paceline::{KeyedLimiter, Limiter, Quota};

mod common;

/// Every check admitted, or (`false`) every check denied.
fn quota(allowed: bool) -> Quota {
    if allowed {
        Quota::per_second(1_000_000_000).with_burst(u32::MAX)
    } else {
        Quota::per_hour(1)
    }
}

fn file(name: &str) -> PathBuf {
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("paceline-bench-{name}-{}", std::process::id()))
}

/// Nanoseconds per check over `n` checks.
fn time(n: u64, check: &dyn Fn() -> bool) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        black_box(check());
    }
    start.elapsed().as_secs_f64() * 1e9 / n as f64
}

fn one_thread(allowed: bool, rounds: usize, n: u64) {
    let path = file(if allowed { "allowed" } else { "denied" });
    let _ = std::fs::remove_file(&path);
    let shared = SharedLimiter::open(&path, quota(allowed)).unwrap();
    let local = Limiter::new(quota(allowed));
    if !allowed {
        shared.check().unwrap();
        local.check().unwrap();
    }
    let clock = quanta::Clock::new();
    let floor = move || common::cas_on_private_line(clock.raw());
    let contenders: [(&str, &dyn Fn() -> bool); 3] = [
        ("floor", &floor),
        ("in-process", &|| local.check().is_ok()),
        ("shared file", &|| shared.check().is_ok()),
    ];
    let medians = medians_of_rounds(rounds, n, &contenders);
    for ((name, _), m) in contenders.iter().zip(&medians) {
        println!(
            "shared {:<7} 1 thread  {name:<12} {m:6.1} ns/check  vs in-process {:.2}x",
            if allowed { "allowed" } else { "denied" },
            m / medians[1],
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// Each contender's median ns per call over `rounds` rounds of `n` calls, the order
/// rotated from round to round so that none always runs first.
fn medians_of_rounds(rounds: usize, n: u64, contenders: &[(&str, &dyn Fn() -> bool)]) -> Vec<f64> {
    let mut ns = vec![Vec::new(); contenders.len()];
    for round in 0..rounds {
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            ns[i].push(time(n, contenders[i].1));
        }
    }
    ns.iter_mut().map(|v| common::spread(v).0).collect()
}

/// `check_key` on 1000 stored keys, in turn: the shared table's beside the in-process
/// keyed limiter's (`String` keys, as a server holds them), paired rounds on one thread.
fn keyed_one_thread(rounds: usize, n: u64) {
    let path = file("keyed");
    let _ = std::fs::remove_file(&path);
    let quota = quota(true);
    let shared = SharedKeyedLimiter::open(&path, quota, 100_000).unwrap();
    let local = KeyedLimiter::<String>::new(quota);
    let keys: Vec<String> = (0..1000).map(|i| format!("203.0.113.{i}")).collect();
    for key in &keys {
        shared.check_key(key).unwrap();
        local.check_key(key).unwrap();
    }
    let next = std::cell::Cell::new(0usize);
    let key = || {
        let i = next.get();
        next.set(if i + 1 == keys.len() { 0 } else { i + 1 });
        &keys[i]
    };
    let contenders: [(&str, &dyn Fn() -> bool); 2] = [
        ("in-process", &|| local.check_key(key()).is_ok()),
        ("shared file", &|| shared.check_key(key()).is_ok()),
    ];
    let medians = medians_of_rounds(rounds, n, &contenders);
    for ((name, _), m) in contenders.iter().zip(&medians) {
        println!(
            "shared keyed   1 thread  {name:<12} {m:6.1} ns/check  vs in-process {:.2}x  (1000 stored keys)",
            m / medians[0],
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// Checks per second from `count` processes on one file for `secs` (children of this
/// binary), and from `count` threads on one in-process limiter.
fn many(count: usize, secs: f64) {
    let path = file("many");
    let _ = std::fs::remove_file(&path);
    SharedLimiter::open(&path, quota(true)).unwrap();
    let children: Vec<_> = (0..count)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .env("PACELINE_BENCH_CHILD", &path)
                .env("PACELINE_BENCH_SECS", secs.to_string())
                .output_spawn()
        })
        .collect();
    let processes: f64 = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<f64>()
                .unwrap()
        })
        .sum();
    let local = std::sync::Arc::new(Limiter::new(quota(true)));
    let threads: f64 = (0..count)
        .map(|_| {
            let local = local.clone();
            std::thread::spawn(move || checks_for(secs, &|| local.check().is_ok()))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .sum();
    println!(
        "shared allowed {count} processes on one file: {:6.1} M checks/s   {count} threads on one \
         in-process limiter: {:6.1} M checks/s   ({:.2}x)",
        processes / 1e6,
        threads / 1e6,
        processes / threads
    );
    let _ = std::fs::remove_file(&path);
}

/// Checks per second on this thread for `secs`.
fn checks_for(secs: f64, check: &dyn Fn() -> bool) -> f64 {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let start = Instant::now();
    while Instant::now() < until {
        for _ in 0..1_000 {
            black_box(check());
        }
        n += 1_000;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

trait OutputSpawn {
    fn output_spawn(&mut self) -> std::process::Child;
}

impl OutputSpawn for Command {
    fn output_spawn(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).spawn().unwrap()
    }
}

fn main() {
    if let Some(path) = std::env::var_os("PACELINE_BENCH_CHILD") {
        let secs: f64 = std::env::var("PACELINE_BENCH_SECS")
            .unwrap()
            .parse()
            .unwrap();
        let shared = SharedLimiter::open(&path, quota(true)).unwrap();
        println!("{}", checks_for(secs, &|| shared.check().is_ok()));
        return;
    }
    let rounds = common::rounds();
    let n = common::size(2_000_000, 2_000);
    one_thread(true, rounds, n);
    one_thread(false, rounds, n);
    keyed_one_thread(rounds, n);
    for count in [1, 2, 4] {
        many(count, common::size(1.0, 0.05));
    }
}
