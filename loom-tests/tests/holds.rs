//! A hold (an upstream's `Retry-After`) under loom, racing a plain check and a booking:
//! whatever the interleaving, nothing is admitted in the hold, a turn booked before or
//! during it comes at its end or later, and turns keep their spacing.

#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use loom::thread;
use paceline::clock::ManualClock;
use paceline::{Limiter, Quota};

const T: Duration = Duration::from_millis(100);
const HOLD: Duration = Duration::from_secs(1);

fn limiter(burst: u32) -> (ManualClock, Arc<Limiter<ManualClock>>) {
    let clock = ManualClock::new();
    let limiter = Arc::new(Limiter::with_clock(
        Quota::try_new(1, T).unwrap().with_burst(burst),
        clock.clone(),
    ));
    (clock, limiter)
}

#[test]
fn a_check_racing_a_hold_is_admitted_before_it_or_not_at_all() {
    loom::model(|| {
        let (_clock, limiter) = limiter(2);
        let checker = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.check().is_ok())
        };
        limiter.hold_for(HOLD);
        // Admitted before the hold, or refused: one cell of the burst of 2 is left then.
        let _admitted = checker.join().unwrap();
        // After the hold, nothing before its end, however the check fell, and one cell
        // (not the burst) at its end.
        assert!(limiter.check().is_err());
        assert_eq!(limiter.remaining(), 0);
        assert_eq!(limiter.peek_n(1).unwrap(), HOLD);
        assert_eq!(limiter.peek_n(2).unwrap(), HOLD + T);
    });
}

#[test]
fn a_turn_booked_racing_a_hold_comes_at_its_end_or_later() {
    loom::model(|| {
        let (_clock, limiter) = limiter(1);
        limiter.check().unwrap();
        let booker = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let mut turn: Pin<Box<dyn Future<Output = ()> + Send>> = {
                    let limiter = limiter.clone();
                    Box::pin(async move { limiter.until_ready().await })
                };
                let pending = turn
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending();
                assert!(pending, "the burst is spent: it books");
                turn
            })
        };
        limiter.hold_for(HOLD);
        let turn = booker.join().unwrap();
        // Booked before the hold (moved to its end) or after it (behind it): either way
        // not before the end, and a plain check waits behind it by one interval.
        let due = limiter.next_waiter_due_in().unwrap();
        assert!(due >= HOLD, "{due:?}");
        assert!(limiter.peek_n(1).unwrap() >= due + T);
        drop(turn);
    });
}
