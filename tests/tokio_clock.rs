//! `TokioClock` (cargo feature `tokio`): waiters woken by the runtime's own timer, paced
//! like the default clock's, and never stranded when the runtime cannot serve a wake-up.
//! Every test here runs in real time with generous upper bounds and exact lower ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{assert_paced, SLACK, WAITERS};
use paceline::clock::TokioClock;
use paceline::{Limiter, Quota};

/// Runs the 50 waiters as tokio tasks on `rt` with a `TokioClock` of that runtime; returns
/// how long the last took.
fn paced_on(rt: &tokio::runtime::Runtime) -> Duration {
    rt.block_on(async {
        let clock = TokioClock::current();
        let limiter = Arc::new(Limiter::with_clock(
            Quota::per_second(500).with_burst(1),
            clock,
        ));
        let start = Instant::now();
        common::tokio_waiters(&limiter, WAITERS).await;
        start.elapsed()
    })
}

#[test]
fn realtime_tokio_clock_current_thread() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // A current-thread runtime only runs inside `block_on`: its wake-ups go to paceline's
    // timer thread, so that a thread blocked on the limiter never depends on it.
    assert!(!TokioClock::from_handle(rt.handle().clone()).uses_runtime_timer());
    assert_paced(paced_on(&rt), "TokioClock, current-thread");
}

#[test]
fn realtime_tokio_clock_multi_thread() {
    let rt = common::tokio_runtime();
    assert!(TokioClock::from_handle(rt.handle().clone()).uses_runtime_timer());
    assert_paced(paced_on(&rt), "TokioClock, multi-thread");
}

#[test]
fn realtime_an_idle_current_thread_runtime_does_not_strand_a_blocked_thread() {
    // Nobody is inside this runtime's `block_on`, so it fires no timers of its own.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let limiter = Limiter::with_clock(
        Quota::per_second(100).with_burst(1),
        TokioClock::from_handle(rt.handle().clone()),
    );
    let elapsed = finishes_within_slack(move || {
        for _ in 0..4 {
            limiter.wait();
        }
        drop(rt);
    });
    assert!(elapsed + Duration::from_millis(1) >= Duration::from_millis(30));
}

#[test]
fn realtime_tokio_clock_timeouts_racing_wake_ups_lose_no_cells() {
    let rt = common::tokio_runtime();
    let limiter = rt.block_on(async {
        Arc::new(Limiter::with_clock(
            Quota::per_second(1_000).with_burst(1),
            TokioClock::current(),
        ))
    });
    rt.block_on(common::timeouts_race_wake_ups(limiter, 3));
}

/// Runs `f` on a thread of its own and returns how long it took; fails (rather than
/// hanging the test run) if it has not finished within `SLACK`.
fn finishes_within_slack(f: impl FnOnce() + Send + 'static) -> Duration {
    let (done, finished) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    finished
        .recv_timeout(SLACK)
        .expect("a wake-up was lost: the waiter never finished");
    start.elapsed()
}

/// A limiter whose single cell is spent, on a clock of a runtime that is already gone.
fn spent_on_a_dead_runtime(rt: tokio::runtime::Runtime) -> Limiter<TokioClock> {
    let clock = TokioClock::from_handle(rt.handle().clone());
    drop(rt);
    let limiter = Limiter::with_clock(Quota::per_second(100).with_burst(1), clock);
    limiter.check().unwrap();
    limiter
}

#[test]
fn realtime_a_runtime_that_shut_down_hands_wake_ups_to_pacelines_timer() {
    let limiter = spent_on_a_dead_runtime(tokio::runtime::Runtime::new().unwrap());
    // Blocking wait: the queue asks the clock for a wake-up, the dead runtime drops the
    // task that would have served it, and the fallback must deliver it.
    let elapsed = finishes_within_slack(move || limiter.wait());
    assert!(elapsed + Duration::from_millis(1) >= Duration::from_millis(10));
}

/// Three waits for a 100/s limiter on `clock`, inside `rt`: at least 20 ms.
fn three_waits_on(rt: tokio::runtime::Runtime, clock: TokioClock) {
    let limiter = Limiter::with_clock(Quota::per_second(100).with_burst(1), clock);
    let elapsed = finishes_within_slack(move || {
        rt.block_on(async {
            for _ in 0..3 {
                limiter.until_ready().await;
            }
        })
    });
    assert!(elapsed + Duration::from_millis(1) >= Duration::from_millis(20));
}

#[test]
fn realtime_a_runtime_without_timers_is_detected_and_served_by_pacelines_timer() {
    // No `enable_time`. The clock notices when it is made (tokio's one panic message on
    // stderr is expected, from the probe) and never asks the runtime for a timer.
    let rt = tokio::runtime::Builder::new_multi_thread().build().unwrap();
    let clock = TokioClock::from_handle(rt.handle().clone());
    assert!(!clock.uses_runtime_timer());
    three_waits_on(rt, clock);
}

#[test]
fn realtime_a_timer_wrongly_assumed_still_delivers_its_wake_ups() {
    // The caller vouched for a time driver that is not there: tokio's sleep panics inside
    // the spawned task (a panic message per wake-up on stderr is expected) and the
    // dropped task hands each wake-up to paceline's timer thread.
    let rt = tokio::runtime::Builder::new_multi_thread().build().unwrap();
    let clock = TokioClock::assume_time_driver(rt.handle().clone());
    assert!(clock.uses_runtime_timer());
    three_waits_on(rt, clock);
}
