//! Many threads on one limiter, with time frozen: exactly the burst gets through.

use std::sync::{Arc, Barrier};
use std::thread;

use paceline::clock::ManualClock;
use paceline::{Limiter, Quota};

fn hammer(
    threads: usize,
    burst: u32,
    work: impl Fn(&Limiter<ManualClock>) -> u64 + Send + Sync + 'static,
) -> (u64, Arc<Limiter<ManualClock>>) {
    let limiter = Arc::new(Limiter::with_clock(
        Quota::per_second(1000).with_burst(burst),
        ManualClock::new(),
    ));
    let work = Arc::new(work);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, work, barrier) = (limiter.clone(), work.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                work(&limiter)
            })
        })
        .collect();
    let total = handles.into_iter().map(|h| h.join().unwrap()).sum();
    (total, limiter)
}

#[test]
fn frozen_clock_admits_exactly_the_burst_across_2_4_and_8_threads() {
    for threads in [2, 4, 8] {
        let (admitted, limiter) = hammer(threads, 500, |l| {
            (0..5_000).filter(|_| l.check().is_ok()).count() as u64
        });
        assert_eq!(admitted, 500, "{threads} threads");
        assert_eq!(limiter.remaining(), 0);
    }
}

#[test]
fn mixed_weights_never_exceed_the_burst() {
    for threads in [2, 4, 8] {
        let (admitted, limiter) = hammer(threads, 1_000, |l| {
            let mut cells = 0;
            for i in 0..5_000u32 {
                let n = 1 + i % 7;
                if l.check_n(n).is_ok() {
                    cells += u64::from(n);
                }
            }
            cells
        });
        assert!(admitted <= 1_000, "{threads} threads admitted {admitted}");
        // Whatever is left is too little for the smallest request they kept making.
        assert_eq!(u64::from(limiter.remaining()), 1_000 - admitted);
        assert!(
            limiter.remaining() < 1,
            "single cells were asked for until the end"
        );
    }
}

#[test]
fn limiters_errors_and_futures_are_send_and_sync_where_promised() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let limiter = Limiter::new(Quota::per_second(1));
    let keyed = paceline::KeyedLimiter::<String>::new(Quota::per_second(1));
    send_sync(&limiter);
    send_sync(&keyed);
    send_sync(&Limiter::with_clock(
        Quota::per_second(1),
        ManualClock::new(),
    ));
    send(&limiter.until_ready());
    send(&limiter.until_n_ready(1));
    send(&limiter.until_ready_within(std::time::Duration::ZERO));
    send(&keyed.until_key_ready(&"k".to_string()));
}
