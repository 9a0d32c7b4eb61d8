//! Eight worker processes share one quota of 100 calls per second through a file, as
//! gunicorn workers or a pre-fork server's children would: each prints its share, and the
//! parent the rate they achieved together.
//!
//! ```sh
//! cargo run --release --example shared_workers
//! ```

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use paceline::shared::SharedLimiter;
use paceline::Quota;

const WORKERS: usize = 8;
const SECONDS: u64 = 3;

fn quota() -> Quota {
    // 100 per second, 10 at once.
    Quota::per_second(100).with_burst(10)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    if let (Some(flag), Some(path)) = (args.next(), args.next()) {
        if flag == "--worker" {
            return worker(&path);
        }
    }
    // /dev/shm keeps the file in memory on Linux; any local file system works.
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("paceline-example-{}", std::process::id()));
    SharedLimiter::open(&path, quota())?;
    println!(
        "{WORKERS} processes, one quota of 100/s (bursts of 10), {SECONDS} s, file {}",
        path.display()
    );
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(std::env::current_exe()?)
                .args(["--worker", &path.display().to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut shares = Vec::new();
    for worker in workers {
        let out = worker.wait_with_output()?;
        shares.push(String::from_utf8_lossy(&out.stdout).trim().parse::<u64>()?);
    }
    let total: u64 = shares.iter().sum();
    for (i, calls) in shares.iter().enumerate() {
        let share = 100.0 * *calls as f64 / total.max(1) as f64;
        println!("worker {i}: {calls:>4} calls ({share:4.1} % of the total)");
    }
    let elapsed = started.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    println!("together: {total} calls in {elapsed:.2} s");
    println!(
        "achieved rate after the burst: {:.1}/s   (configured: 100/s; one process alone would get the same)",
        (total - 10) as f64 / SECONDS as f64
    );
    Ok(())
}

/// A worker: calls the "API" as fast as the shared quota lets it, for `SECONDS`, half of
/// its threads waiting their booked turn and half checking.
fn worker(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let limiter = std::sync::Arc::new(SharedLimiter::open(path, quota())?);
    let until = Instant::now() + Duration::from_secs(SECONDS);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                let mut calls = 0u64;
                loop {
                    if t % 2 == 0 {
                        // A booked turn: first come, first served across the processes.
                        let Ok(turn) = limiter.reserve(1) else { break };
                        if Instant::now() + turn.ready_in() > until {
                            break; // dropped before its instant: the cell goes back
                        }
                        turn.wait();
                        calls += 1;
                    } else if Instant::now() >= until {
                        break;
                    } else if limiter.check().is_ok() {
                        calls += 1;
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                calls
            })
        })
        .collect();
    let calls: u64 = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    println!("{calls}");
    Ok(())
}
