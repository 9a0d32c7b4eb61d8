//! `TokioClock` on a runtime without a time driver, in a `panic = "abort"` build: the
//! clock must notice without a panic (which would abort), and waiters must still finish.
//!
//! CI runs it as `cargo run --profile abort --features tokio --example tokio_abort_safety`.
//! It also runs (and must pass) in ordinary builds.

use std::time::Instant;

use paceline::clock::TokioClock;
use paceline::{Limiter, Quota};

fn main() {
    // No `enable_time`: tokio would panic on the first timer.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("a tokio runtime");
    let clock = TokioClock::from_handle(runtime.handle().clone());
    println!(
        "panic strategy: {}; wake-ups from the runtime's timer: {}",
        if cfg!(panic = "abort") {
            "abort"
        } else {
            "unwind"
        },
        clock.uses_runtime_timer()
    );
    assert!(!clock.uses_runtime_timer());
    let limiter = Limiter::with_clock(Quota::per_second(100).with_burst(1), clock);
    let start = Instant::now();
    runtime.block_on(async {
        for _ in 0..5 {
            limiter.until_ready().await;
        }
    });
    for _ in 0..5 {
        limiter.wait();
    }
    let elapsed = start.elapsed();
    println!("10 waits at 100/s took {elapsed:?} (ideal 90 ms)");
    assert!(elapsed.as_millis() >= 89);
}
