//! Throttle 300 simulated calls to a third-party API at 100 per second, bursts of 10,
//! however long each call takes. Prints live progress and, at the end, the achieved rate
//! next to the configured one.
//!
//! ```text
//! cargo run --release --example throttle
//! ```

use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paceline::{Limiter, Quota};

const CALLS: u32 = 300;
const RATE: u32 = 100;
const BURST: u32 = 10;

#[tokio::main]
async fn main() {
    let quota = Quota::per_second(RATE).with_burst(BURST);
    let limiter = Arc::new(Limiter::new(quota));
    let started = Arc::new(Mutex::new(Vec::with_capacity(CALLS as usize)));
    let finished = Arc::new(AtomicU32::new(0));
    let t0 = Instant::now();
    println!("{CALLS} calls, quota {RATE}/s with a burst of {BURST}; each call takes 5-80 ms");

    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let (limiter, started, finished) = (limiter.clone(), started.clone(), finished.clone());
            tokio::spawn(async move {
                limiter.until_ready().await; // our booked turn, in order
                started.lock().unwrap().push(t0.elapsed());
                // The "API call": its duration does not affect the rate.
                let took = 5 + (i * 37) % 76;
                tokio::time::sleep(Duration::from_millis(u64::from(took))).await;
                finished.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();

    let progress = tokio::spawn({
        let started = started.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let n = started.lock().unwrap().len();
                let secs = t0.elapsed().as_secs_f64();
                let bar = "#".repeat(n * 40 / CALLS as usize);
                print!(
                    "\r[{bar:<40}] {n:>3}/{CALLS} started  {secs:5.2} s  {:6.1}/s",
                    n as f64 / secs
                );
                let _ = std::io::stdout().flush();
                if n as u32 == CALLS {
                    break;
                }
            }
        }
    });
    for call in calls {
        call.await.unwrap();
    }
    progress.await.unwrap();
    println!();

    let mut starts = started.lock().unwrap().clone();
    starts.sort();
    let first_after_burst = starts[BURST as usize];
    let last = *starts.last().unwrap();
    let sustained = f64::from(CALLS - BURST - 1) / (last - first_after_burst).as_secs_f64();
    let overall = f64::from(CALLS) / last.as_secs_f64();
    println!(
        "{} calls finished; the first {BURST} started at once (the burst), the last at {:.3} s",
        finished.load(Ordering::Relaxed),
        last.as_secs_f64()
    );
    println!("achieved rate after the burst: {sustained:.1}/s   (configured: {RATE}/s)");
    println!(
        "overall, burst included:       {overall:.1}/s   (ideal: {:.1}/s)",
        f64::from(CALLS) / (f64::from(CALLS - BURST) / f64::from(RATE))
    );
}
