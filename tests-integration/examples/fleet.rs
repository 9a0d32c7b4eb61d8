//! Several workers, each with its own Redis connection (as separate machines would
//! have), sharing one quota of 50 calls per second through Redis. Each waits its booked
//! turn in Redis (`until_key_ready`): together they achieve the quota, not the quota
//! times the workers, and each gets its fair share.
//!
//! ```sh
//! redis-server --port 6379 --bind 127.0.0.1 --save '' &   # from Debian's redis-server
//! cargo run -p paceline-tests-integration --example fleet
//! ```
//!
//! `PACELINE_REDIS_URL` picks another server (default `redis://127.0.0.1:6379/`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::redis::RedisLimiter;
use paceline::Quota;

const WORKERS: usize = 4;
const RATE: u32 = 50;
const RUN: Duration = Duration::from_secs(4);

#[tokio::main]
async fn main() {
    let url =
        std::env::var("PACELINE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    // A key of its own for this run, so an earlier run's state does not count.
    let key = format!("fleet-demo-{}", std::process::id());
    println!("{WORKERS} workers sharing {RATE}/s (burst 1) through {url}, for {RUN:?}");
    let start = Instant::now();
    let mut handles = Vec::new();
    for worker in 0..WORKERS {
        let limiter = RedisLimiter::connect(&url, Quota::per_second(RATE).with_burst(1))
            .await
            .unwrap_or_else(|e| panic!("worker {worker}: {e}"));
        let (limiter, key) = (Arc::new(limiter), key.clone());
        handles.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            loop {
                // Our booked place in the fleet's one queue for this key.
                limiter
                    .until_key_ready(&key)
                    .await
                    .unwrap_or_else(|e| panic!("worker {worker}: {e}"));
                let at = start.elapsed();
                if at >= RUN {
                    break;
                }
                calls.push(at); // the rate-limited call would go here
            }
            calls
        }));
    }
    let mut all = Vec::new();
    for (worker, handle) in handles.into_iter().enumerate() {
        let calls = handle.await.expect("a worker");
        println!(
            "worker {worker}: {} calls, {:.1}/s",
            calls.len(),
            calls.len() as f64 / RUN.as_secs_f64()
        );
        all.extend(calls);
    }
    all.sort();
    // The rate the fleet achieved after its first call, as a client of the API sees it.
    let (first, last) = (all[0], all[all.len() - 1]);
    let achieved = (all.len() - 1) as f64 / (last - first).as_secs_f64();
    println!(
        "fleet: {} calls, {achieved:.1}/s achieved (configured: {RATE}/s)",
        all.len()
    );
}
