//! The instruction-count harness shared by the `instructions_*` examples: each runs one
//! workload's operation ITERATIONS times inside `measured`, which
//! `benches/instructions.sh` has callgrind count alone (`--collect-atstart=no
//! --toggle-collect=instructions_FAMILY::harness::measured`): the count divided by ITERATIONS is what one operation
//! costs, the same on every run of the same build.
//!
//! Each family of workloads is a binary of its own (`instructions_direct`,
//! `instructions_keyed`, `instructions_http`, `instructions_proxied`,
//! `instructions_tonic`): how much of a
//! library the compiler inlines into a call site depends on how many other call sites the
//! binary gives the same functions, so a binary holding every workload would price a
//! peer's check by the company it keeps there, not by what it costs in a program that
//! uses it.

use std::hint::black_box;

/// One workload's operation; returns whether it was admitted.
pub type Op = Box<dyn Fn() -> bool>;

/// Runs `op` `iterations` times: the only code callgrind counts.
#[inline(never)]
pub fn measured(op: &dyn Fn() -> bool, iterations: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..iterations {
        admitted += u64::from(op());
    }
    admitted
}

/// The warm-up: the same operation, not counted.
#[inline(never)]
fn warm_up(op: &dyn Fn() -> bool) {
    for _ in 0..20_000 {
        black_box(op());
    }
}

/// 10 000 client keys, visited in turn.
#[allow(dead_code)] // the direct checks' binary has no keys
pub fn next_key() -> impl Fn() -> u64 {
    let next = std::cell::Cell::new(0u64);
    move || {
        let key = next.get();
        next.set((key + 1) % 10_000);
        key
    }
}

/// `BINARY list` prints `workloads`; `BINARY WORKLOAD [ITERATIONS]` runs one of them.
pub fn main(workloads: &[&str], workload: fn(&str) -> Option<Op>) {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_default();
    if name == "list" {
        for workload in workloads {
            println!("{workload}");
        }
        return;
    }
    let iterations: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let Some(op) = workload(&name) else {
        eprintln!("unknown workload {name:?}; `list` names them");
        std::process::exit(2);
    };
    // Warm up outside the count: first-use initialisation (the clock's calibration, the
    // keyed table's growth to hold every key) is not the hot path.
    warm_up(&*op);
    let admitted = measured(&*op, iterations);
    println!("{name}: {admitted} of {iterations} admitted");
}
