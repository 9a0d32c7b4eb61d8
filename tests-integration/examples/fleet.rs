//! Several workers, each with its own Redis connection (as separate machines would
//! have), sharing one quota of 50 calls per second through Redis. Each prints what it
//! achieved; together they achieve the quota, not the quota times the workers.
//!
//! ```sh
//! redis-server --port 6379 --save '' &      # from Debian's redis-server package
//! cargo run --example fleet --features redis
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
            let mut calls = 0u32;
            while start.elapsed() < RUN {
                match limiter.check_key(&key).await {
                    Ok(()) => calls += 1, // the rate-limited call would go here
                    Err(paceline::redis::RedisDenied::NotUntil(wait)) => {
                        tokio::time::sleep(wait.wait_time()).await
                    }
                    Err(e) => panic!("worker {worker}: {e}"),
                }
            }
            calls
        }));
    }
    let mut total = 0;
    for (worker, handle) in handles.into_iter().enumerate() {
        let calls = handle.await.expect("a worker");
        total += calls;
        println!(
            "worker {worker}: {calls} calls, {:.1}/s",
            f64::from(calls) / RUN.as_secs_f64()
        );
    }
    println!(
        "fleet: {total} calls, {:.1}/s achieved (configured: {RATE}/s, ideal for the run: {})",
        f64::from(total) / RUN.as_secs_f64(),
        1 + RATE * RUN.as_secs() as u32
    );
}
