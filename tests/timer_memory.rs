//! A dropped limiter takes its pending wake-ups out of the process-wide timer: nothing of
//! it stays behind until its last waiter's instant. Measured with a counting allocator,
//! so this file holds a single test (a second one would allocate concurrently).

use std::future::Future;

use std::task::{Context, Waker};

use paceline::{KeyedLimiter, Limiter, Quota};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

/// Polls `future` once (it books a place and arms the timer), then drops it.
fn book_and_cancel(future: impl Future) {
    let mut future = Box::pin(future);
    let _ = future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()));
}

const LIMITERS: usize = 20_000;
/// Well below one byte per limiter: before the fix each left ~156 B for an hour.
const ALLOWED: isize = 64 * 1024;

#[test]
fn dropped_limiters_leave_nothing_in_the_timer() {
    // Warm up: start the timer thread and its watchdog, fill lazy statics.
    let warm = Limiter::new(Quota::per_hour(1));
    warm.check().unwrap();
    book_and_cancel(warm.until_ready());
    drop(warm);

    let before = live();
    for _ in 0..LIMITERS {
        let limiter = Limiter::new(Quota::per_hour(1));
        limiter.check().unwrap();
        book_and_cancel(limiter.until_ready());
    }
    let grown = live() - before;
    assert!(
        grown < ALLOWED,
        "{LIMITERS} dropped limiters still hold {grown} bytes"
    );

    // Keyed: one queue per waiting key, each with its timer entry.
    let before = live();
    let keyed = KeyedLimiter::new(Quota::per_hour(1));
    for key in 0..LIMITERS as u32 {
        keyed.check_key(&key).unwrap();
        book_and_cancel(keyed.until_key_ready(&key));
    }
    drop(keyed);
    let grown = live() - before;
    assert!(
        grown < ALLOWED,
        "a dropped keyed limiter's {LIMITERS} waiting keys still hold {grown} bytes"
    );
}
