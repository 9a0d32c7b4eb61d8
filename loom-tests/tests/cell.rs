//! The atomic cell under every interleaving loom can find: concurrent admissions at a fixed
//! time are linearizable, i.e. equal to *some* sequential run of the same requests.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use paceline::__loom::{admit, TatWord};

const T: u64 = 10;

/// Every outcome a sequential run of the per-thread request lists could give, as
/// (admitted flags per thread, final TAT).
fn sequential_outcomes(threads: &[Vec<u64>], now: u64, tau: u64) -> Vec<(Vec<Vec<bool>>, u64)> {
    fn go(
        threads: &[Vec<u64>],
        next: &mut Vec<usize>,
        flags: &mut Vec<Vec<bool>>,
        tat: u64,
        now: u64,
        tau: u64,
        out: &mut Vec<(Vec<Vec<bool>>, u64)>,
    ) {
        let mut progressed = false;
        for t in 0..threads.len() {
            if next[t] < threads[t].len() {
                progressed = true;
                let cost = threads[t][next[t]];
                let (ok, tat2) = match admit(tat, now, cost, tau) {
                    Ok(new) => (true, new),
                    Err(_) => (false, tat),
                };
                next[t] += 1;
                flags[t].push(ok);
                go(threads, next, flags, tat2, now, tau, out);
                flags[t].pop();
                next[t] -= 1;
            }
        }
        if !progressed {
            out.push((flags.clone(), tat));
        }
    }
    let mut out = Vec::new();
    go(
        threads,
        &mut vec![0; threads.len()],
        &mut vec![Vec::new(); threads.len()],
        0,
        now,
        tau,
        &mut out,
    );
    out
}

fn check_linearizable(requests: Vec<Vec<u64>>, burst: u64) {
    let tau = burst * T;
    let allowed = sequential_outcomes(&requests, 0, tau);
    loom::model(move || {
        let cell = Arc::new(TatWord::new());
        let handles: Vec<_> = requests
            .iter()
            .cloned()
            .map(|costs| {
                let cell = cell.clone();
                thread::spawn(move || {
                    costs
                        .into_iter()
                        .map(|cost| cell.acquire(0, cost, tau).is_ok())
                        .collect::<Vec<bool>>()
                })
            })
            .collect();
        let flags: Vec<Vec<bool>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let outcome = (flags, cell.tat());
        assert!(
            allowed.contains(&outcome),
            "not equal to any sequential run: {outcome:?}"
        );
        // And in particular never more than the burst.
        let admitted: u64 = outcome
            .0
            .iter()
            .zip(&requests)
            .flat_map(|(f, r)| f.iter().zip(r).filter(|(ok, _)| **ok).map(|(_, c)| c / T))
            .sum();
        assert!(admitted <= burst);
    });
}

#[test]
fn two_threads_single_cells_admit_exactly_the_burst() {
    check_linearizable(vec![vec![T, T], vec![T, T]], 3);
}

#[test]
fn three_threads_single_cells() {
    check_linearizable(vec![vec![T], vec![T], vec![T]], 2);
}

#[test]
fn two_threads_mixed_weights() {
    check_linearizable(vec![vec![2 * T, T], vec![T, 3 * T]], 4);
}
