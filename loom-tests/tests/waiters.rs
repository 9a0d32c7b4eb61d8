//! The waiter list under loom: booking, cancelling and firing racing each other.
//! Checked: no lost wake-up, no double wake, exact refunds, every node unlinked.

#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use paceline::clock::ManualClock;
use paceline::{Limiter, Quota};

const T: Duration = Duration::from_millis(100);

type Boxed = Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Count {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn poll(future: &mut Boxed, wakes: &Arc<Count>) -> bool {
    let waker = Waker::from(wakes.clone());
    matches!(
        future.as_mut().poll(&mut Context::from_waker(&waker)),
        Poll::Ready(())
    )
}

/// One cell per 100 ms, burst 1, already spent; plus a `'static` waiting future on it.
fn setup() -> (ManualClock, Arc<Limiter<ManualClock>>) {
    let clock = ManualClock::new();
    let limiter = Arc::new(Limiter::with_clock(
        Quota::try_new(1, T).unwrap().with_burst(1),
        clock.clone(),
    ));
    limiter.check().unwrap();
    (clock, limiter)
}

fn waiter(limiter: &Arc<Limiter<ManualClock>>) -> Boxed {
    let limiter = limiter.clone();
    Box::pin(async move { limiter.until_ready().await })
}

/// A waiter and the count of its wake-ups.
fn counted_waiter(limiter: &Arc<Limiter<ManualClock>>) -> (Boxed, Arc<Count>) {
    (waiter(limiter), Arc::new(Count::default()))
}

#[test]
fn booking_races_firing_without_losing_the_wake_up() {
    loom::model(|| {
        let (clock, limiter) = setup();
        let (mut future, wakes) = counted_waiter(&limiter);
        let booker = {
            let wakes = wakes.clone();
            thread::spawn(move || {
                let ready = poll(&mut future, &wakes);
                (future, ready)
            })
        };
        clock.advance(T);
        let (mut future, ready_at_first_poll) = booker.join().unwrap();
        if !ready_at_first_poll {
            // It booked and parked: the advance (which happened before the join) must have
            // woken it, exactly once.
            assert_eq!(wakes.get(), 1, "lost or doubled wake-up");
            assert!(poll(&mut future, &wakes));
        }
        // Either way exactly one cell was spent at 100 ms: the next is due at 200 ms.
        assert_eq!(limiter.check().unwrap_err().wait_time(), T);
        assert_eq!(limiter.next_waiter_due_in(), None, "every node unlinked");
    });
}

#[test]
fn cancelling_races_firing_with_exact_refunds() {
    loom::model(|| {
        let (clock, limiter) = setup();
        let (mut a, mut b) = (waiter(&limiter), waiter(&limiter));
        let (wa, wb) = (Arc::new(Count::default()), Arc::new(Count::default()));
        assert!(!poll(&mut a, &wa));
        assert!(!poll(&mut b, &wb)); // a due at 100 ms, b at 200 ms
        let canceller = thread::spawn(move || drop(a));
        let firer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(T))
        };
        canceller.join().unwrap();
        firer.join().unwrap();
        let wait = limiter.check().unwrap_err().wait_time();
        if wb.get() == 1 {
            // a was cancelled before its instant: refunded, and b moved up to 100 ms.
            assert_eq!(wait, T);
            assert!(poll(&mut b, &wb));
        } else {
            // a's instant came first (fired, or due when dropped): its cell is spent and
            // b stays at 200 ms.
            assert_eq!(wb.get(), 0);
            assert_eq!(wait, 2 * T);
            assert!(!poll(&mut b, &wb));
            clock.advance(T);
            assert_eq!(wb.get(), 1, "b woken exactly once at its instant");
            assert!(poll(&mut b, &wb));
        }
        assert_eq!(limiter.next_waiter_due_in(), None, "every node unlinked");
    });
}

#[test]
fn two_bookers_and_a_firer() {
    loom::model(|| {
        let (clock, limiter) = setup();
        let spawn_booker = |limiter: &Arc<Limiter<ManualClock>>| {
            let mut future = waiter(limiter);
            let wakes = Arc::new(Count::default());
            let w = wakes.clone();
            (
                thread::spawn(move || {
                    let ready = poll(&mut future, &w);
                    (future, ready)
                }),
                wakes,
            )
        };
        let (h1, w1) = spawn_booker(&limiter);
        let (h2, w2) = spawn_booker(&limiter);
        clock.advance(T);
        let (mut f1, r1) = h1.join().unwrap();
        let (mut f2, r2) = h2.join().unwrap();
        // One of them got the 100 ms place, the other 200 ms: at 100 ms exactly one is
        // done or woken.
        let done_or_woken = |r: bool, w: &Count| r || w.get() == 1;
        assert!(done_or_woken(r1, &w1) ^ done_or_woken(r2, &w2));
        assert!(w1.get() <= 1 && w2.get() <= 1, "double wake");
        clock.advance(T);
        assert!(r1 || poll(&mut f1, &w1));
        assert!(r2 || poll(&mut f2, &w2));
        assert_eq!(limiter.next_waiter_due_in(), None);
        assert_eq!(limiter.check().unwrap_err().wait_time(), T);
    });
}

#[test]
fn a_poll_racing_the_fire_completes_at_most_once_and_frees_the_node_after_it() {
    loom::model(|| {
        let (clock, limiter) = setup();
        let (mut future, wakes) = counted_waiter(&limiter);
        assert!(!poll(&mut future, &wakes)); // booked for 100 ms
        let firer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(T))
        };
        // This poll races the fire: it may see the node fired without the lock (and then
        // free it at once, while the firer may still be finishing its round) or not yet.
        let ready = poll(&mut future, &wakes);
        drop(future);
        firer.join().unwrap();
        assert!(wakes.get() <= 1, "double wake");
        // Done or dropped, the cell at 100 ms was spent either way (its instant came).
        assert_eq!(limiter.next_waiter_due_in(), None, "every node unlinked");
        if ready {
            assert_eq!(limiter.check().unwrap_err().wait_time(), T);
        }
    });
}

/// A clock moved by hand that never wakes anyone: a booked waiter stays linked past its
/// instant until someone polls it, the widest window for a cancel to race a check.
#[derive(Clone, Default)]
struct SilentClock(Arc<loom::sync::atomic::AtomicU64>);

impl paceline::clock::Clock for SilentClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn wake_at(&self, _at: u64, _waker: Waker) {}
}

#[test]
fn a_cancel_racing_a_check_across_the_instant_never_exceeds_the_burst() {
    loom::model(|| {
        // Burst 2 at one cell per 100 ms, spent at 0; a waiter books 2 more (instant
        // 200 ms). One thread moves time to 300 ms and checks; another drops the waiter.
        let clock = SilentClock::default();
        let limiter = Arc::new(Limiter::with_clock(
            Quota::try_new(1, T).unwrap().with_burst(2),
            clock.clone(),
        ));
        limiter.check_n(2).unwrap();
        let mut booked: Pin<
            Box<dyn Future<Output = Result<(), paceline::InsufficientCapacity>> + Send>,
        > = {
            let limiter = limiter.clone();
            Box::pin(async move { limiter.until_n_ready(2).await })
        };
        let waker = Waker::from(Arc::new(Count::default()));
        assert!(booked
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        let checker = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                clock.0.store(300_000_000, Ordering::SeqCst);
                limiter.check().is_ok()
            })
        };
        let canceller = thread::spawn(move || drop(booked));
        let checked = checker.join().unwrap();
        canceller.join().unwrap();
        // At 300 ms: the check's cell plus whatever is still admissible fit the burst,
        // whether the refund came first (1 + 1), or the check did (1 + 0, no refund).
        let admissible = u32::from(checked) + limiter.remaining();
        assert!(
            admissible <= 2,
            "{admissible} cells admissible at once, burst 2"
        );
        assert!(checked, "the check at 300 ms fits either way");
        assert_eq!(limiter.next_waiter_due_in(), None, "every node unlinked");
    });
}
