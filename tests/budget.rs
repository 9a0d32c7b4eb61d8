//! Budgets through the public API: one FIFO turn across every dimension, the in-flight
//! cap, cancellation, deadlines, settles and bad input, deterministic on a `ManualClock`;
//! then real threads and executors, with generous bounds.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use paceline::budget::{Acquire, Budget, BudgetError, BuildError, Turn};
use paceline::clock::ManualClock;
use paceline::Quota;

/// A future polled by hand, with a waker that counts its wake-ups.
struct Probe {
    future: Pin<Box<Acquire<ManualClock>>>,
    wakes: Arc<Wakes>,
}

#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Probe {
    fn new(future: Acquire<ManualClock>) -> Probe {
        Probe {
            future: Box::pin(future),
            wakes: Arc::default(),
        }
    }

    fn woken(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }

    fn poll(&mut self) -> Poll<Result<Turn<ManualClock>, BudgetError>> {
        let waker = Waker::from(self.wakes.clone());
        self.future.as_mut().poll(&mut Context::from_waker(&waker))
    }

    fn pending(&mut self) -> bool {
        self.poll().is_pending()
    }

    fn turn(&mut self) -> Turn<ManualClock> {
        match self.poll() {
            Poll::Ready(Ok(turn)) => turn,
            other => panic!("expected a turn, got {:?}", other.map(|r| r.map(drop))),
        }
    }
}

/// requests: 10/s, burst 2; tokens: 100/s, burst 100; `cap` in flight.
fn budget(clock: &ManualClock, cap: u32) -> Budget<ManualClock> {
    Budget::builder()
        .rate("requests", Quota::per_second(10).with_burst(2))
        .rate("tokens", Quota::per_second(100))
        .in_flight(cap)
        .clock(clock.clone())
        .build()
        .unwrap()
}

const MS: Duration = Duration::from_millis(1);

#[test]
fn a_heavy_caller_is_not_overtaken_by_light_ones() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let _spent = budget.try_acquire(&[("tokens", 100)]).unwrap();
    // The heavy caller needs 80 tokens: 800 ms. A light one behind needs 1 (10 ms) but
    // waits its turn.
    let mut heavy = Probe::new(budget.acquire(&[("tokens", 80)]));
    let mut light = Probe::new(budget.acquire(&[("tokens", 1)]));
    assert!(heavy.pending() && light.pending());
    clock.advance(100 * MS);
    assert!(light.pending());
    assert!(
        budget.try_acquire(&[("tokens", 1)]).is_err(),
        "try_acquire jumped the queue"
    );
    clock.advance(700 * MS);
    assert_eq!(heavy.woken(), 1, "the clock woke the head at its instant");
    let _heavy = heavy.turn();
    assert!(light.woken() >= 1, "the new head was woken");
    // Requests 2 per burst, 10/s: one more request needs 100 ms from 0 (long refilled);
    // tokens: 80 + 1 at 800 ms with 100 spent at 0 and 80 refilled: wait 10 ms.
    assert!(light.pending());
    clock.advance(10 * MS);
    let _light = light.turn();
}

#[test]
fn nothing_is_charged_while_one_dimension_holds_a_caller_back() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let _a = budget.try_acquire(&[]).unwrap();
    let _b = budget.try_acquire(&[]).unwrap();
    assert_eq!(budget.remaining("requests").unwrap(), 0);
    let mut waiting = Probe::new(budget.acquire(&[("tokens", 50)]));
    assert!(waiting.pending());
    assert_eq!(
        budget.remaining("tokens").unwrap(),
        98,
        "tokens were charged before requests admitted"
    );
    drop(waiting);
    assert_eq!(budget.remaining("tokens").unwrap(), 98);
    assert_eq!(budget.waiting(), 0);
}

#[test]
fn a_caller_dropped_before_its_turn_spent_nothing_and_the_next_moves_up() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let _spent = budget.try_acquire(&[("tokens", 100)]).unwrap();
    let mut heavy = Probe::new(budget.acquire(&[("tokens", 90)]));
    let mut light = Probe::new(budget.acquire(&[("tokens", 10)]));
    assert!(heavy.pending() && light.pending());
    let before = light.woken();
    drop(heavy);
    assert_eq!(light.woken(), before + 1, "the new head was not woken");
    assert!(light.pending(), "10 tokens need 100 ms");
    clock.advance(100 * MS);
    let _light = light.turn();
    // The heavy caller's 90 tokens were never charged: 10 left after 100 ms - 10.
    assert_eq!(budget.remaining("tokens").unwrap(), 0);
    clock.advance(900 * MS);
    assert_eq!(budget.remaining("tokens").unwrap(), 90);
}

#[test]
fn a_caller_whose_rates_allow_it_waits_for_a_permit_in_its_place() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 1);
    let first = budget.try_acquire(&[]).unwrap();
    let mut second = Probe::new(budget.acquire(&[]));
    assert!(second.pending());
    clock.advance(Duration::from_secs(5));
    assert!(second.pending(), "admitted with no permit free");
    assert_eq!(budget.try_acquire(&[]).unwrap_err(), BudgetError::WouldWait);
    let mut third = Probe::new(budget.acquire(&[]));
    assert!(third.pending());
    drop(first);
    assert!(
        second.woken() >= 1,
        "a returning permit did not wake the head"
    );
    let second_turn = second.turn();
    assert_eq!(budget.in_flight(), 1);
    assert!(third.pending());
    second_turn.settle(&[]).unwrap();
    let _third = third.turn();
}

#[test]
fn a_deadline_further_than_the_turn_by_the_rates_is_refused_at_once() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let _spent = budget.try_acquire(&[("tokens", 100)]).unwrap();
    let mut ahead = Probe::new(budget.acquire(&[("tokens", 50)]));
    assert!(ahead.pending());
    // Behind 50 tokens (500 ms), 20 more are due at 700 ms.
    let mut late = Probe::new(budget.acquire_within(&[("tokens", 20)], 699 * MS));
    assert_eq!(
        late.poll().map(|r| r.map(drop)),
        Poll::Ready(Err(BudgetError::NotWithin { wait: 700 * MS }))
    );
    assert_eq!(budget.waiting(), 1, "a refused deadline took a place");
    assert_eq!(
        budget.wait_time(&[("tokens", 20)]).unwrap(),
        700 * MS,
        "wait_time is the same estimate"
    );
    let mut on_time = Probe::new(budget.acquire_within(&[("tokens", 20)], 700 * MS));
    assert!(on_time.pending());
    clock.advance(500 * MS);
    let _ahead = ahead.turn();
    clock.advance(200 * MS);
    let _on_time = on_time.turn();
}

#[test]
fn a_deadline_that_passes_in_the_queue_gives_the_place_up() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 1);
    let holder = budget.try_acquire(&[]).unwrap();
    // The rates allow it at once; the permit is what is missing.
    let mut impatient = Probe::new(budget.acquire_within(&[], 50 * MS));
    let mut patient = Probe::new(budget.acquire(&[]));
    assert!(impatient.pending() && patient.pending());
    clock.advance(50 * MS);
    assert!(impatient.woken() >= 1, "the deadline's alarm did not ring");
    assert_eq!(
        impatient.poll().map(|r| r.map(drop)),
        Poll::Ready(Err(BudgetError::TimedOut))
    );
    assert_eq!(budget.waiting(), 1);
    drop(holder);
    let _patient = patient.turn();
}

#[test]
fn settle_gives_back_or_charges_the_difference() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let turn = budget.try_acquire(&[("tokens", 60)]).unwrap();
    assert_eq!(budget.remaining("tokens").unwrap(), 40);
    turn.settle(&[("tokens", 20)]).unwrap();
    assert_eq!(budget.remaining("tokens").unwrap(), 80);
    let turn = budget.try_acquire(&[("tokens", 10)]).unwrap();
    turn.settle(&[("tokens", 150)]).unwrap(); // above the burst: the upstream spent it
    assert_eq!(budget.remaining("tokens").unwrap(), 0);
    assert_eq!(budget.wait_time(&[("tokens", 1)]).unwrap(), 710 * MS);
    assert_eq!(budget.in_flight(), 0);
}

#[test]
fn a_settle_naming_no_such_dimension_gives_the_turn_back_unchanged() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let turn = budget.try_acquire(&[("tokens", 60)]).unwrap();
    let err = turn.settle(&[("tokens", 1), ("tokns", 1)]).unwrap_err();
    assert!(matches!(err.error(), BudgetError::UnknownDimension { name, .. } if name == "tokns"));
    assert_eq!(
        (budget.remaining("tokens").unwrap(), budget.in_flight()),
        (40, 1)
    );
    let err = err
        .into_turn()
        .settle(&[("tokens", 1), ("tokens", 2)])
        .unwrap_err();
    assert_eq!(
        err.error(),
        &BudgetError::RepeatedDimension {
            name: "tokens".into()
        }
    );
    assert_eq!(
        (budget.remaining("tokens").unwrap(), budget.in_flight()),
        (40, 1)
    );
    err.into_turn().settle(&[("tokens", 0)]).unwrap();
    assert_eq!(
        (budget.remaining("tokens").unwrap(), budget.in_flight()),
        (100, 0)
    );
}

#[test]
fn bad_costs_are_clear_errors_that_change_nothing() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let cases: [(&[(&str, u32)], &str); 4] = [
        (
            &[("tokenz", 1)],
            "no dimension named \"tokenz\" (it has: requests, tokens)",
        ),
        (
            &[("tokens", 1), ("tokens", 1)],
            "names the dimension \"tokens\" twice",
        ),
        (
            &[("tokens", 101)],
            "a cost of 101 tokens can never be admitted: the burst of tokens is 100",
        ),
        (&[("requests", u32::MAX)], "can never be admitted"),
    ];
    for (costs, message) in cases {
        let now = budget.try_acquire(costs).unwrap_err();
        assert!(now.to_string().contains(message), "{now}");
        let blocking = budget.acquire_blocking(costs).unwrap_err();
        assert_eq!(blocking, now);
        let mut waiting = Probe::new(budget.acquire(costs));
        assert_eq!(
            waiting.poll().map(|r| r.map(drop)),
            Poll::Ready(Err(now.clone()))
        );
        assert!(budget.wait_time(costs).is_err());
        assert_eq!(budget.waiting(), 0);
        assert_eq!(budget.in_flight(), 0);
        assert_eq!(budget.remaining("tokens").unwrap(), 100);
        assert_eq!(budget.remaining("requests").unwrap(), 2);
    }
    assert!(budget.remaining("tokenz").is_err());
    // Zero costs are taken: a permit and a place, nothing else.
    let zero = budget
        .try_acquire(&[("requests", 0), ("tokens", 0)])
        .unwrap();
    assert_eq!(
        (budget.remaining("requests").unwrap(), budget.in_flight()),
        (2, 1)
    );
    drop(zero);
}

#[test]
fn building_a_budget_checks_its_parts() {
    let q = Quota::per_second(1);
    assert_eq!(Budget::builder().build().unwrap_err(), BuildError::Empty);
    assert_eq!(
        Budget::builder().in_flight(0).build().unwrap_err(),
        BuildError::ZeroInFlight
    );
    assert_eq!(
        Budget::builder().rate("", q).build().unwrap_err(),
        BuildError::EmptyName
    );
    assert_eq!(
        Budget::builder()
            .rate("a", q)
            .rate("a", q)
            .build()
            .unwrap_err(),
        BuildError::RepeatedDimension { name: "a".into() }
    );
    // A cap alone is a semaphore with a FIFO queue.
    let cap = Budget::builder().in_flight(1).build().unwrap();
    let err = cap.try_acquire(&[("tokens", 1)]).unwrap_err();
    assert!(
        err.to_string().ends_with("(it has only an in-flight cap)"),
        "{err}"
    );
    let held = cap.try_acquire(&[]).unwrap();
    assert!(cap.try_acquire(&[]).is_err());
    drop(held);
    assert!(cap.try_acquire(&[]).is_ok());
}

#[test]
fn a_turn_ends_anywhere_even_after_the_budget_is_gone() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 1);
    let turn = budget.try_acquire(&[("tokens", 10)]).unwrap();
    let other = budget.clone();
    std::thread::spawn(move || turn.settle(&[("tokens", 5)]).unwrap())
        .join()
        .unwrap();
    assert_eq!(other.in_flight(), 0);
    let turn = other.try_acquire(&[]).unwrap();
    drop(other);
    drop(budget);
    turn.settle(&[("tokens", 3)]).unwrap(); // nobody is left to read it; nothing breaks
}

#[test]
fn a_panic_while_holding_a_turn_returns_its_permit() {
    let budget = Budget::builder().in_flight(1).build().unwrap();
    let inner = budget.clone();
    let panicked = std::thread::spawn(move || {
        let _turn = inner.try_acquire(&[]).unwrap();
        panic!("the call failed");
    })
    .join();
    assert!(panicked.is_err());
    assert_eq!(budget.in_flight(), 0);
    assert!(budget.try_acquire(&[]).is_ok());
}

#[test]
fn a_clock_at_the_end_of_time_refuses_instead_of_wrapping() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    clock.advance(Duration::MAX);
    // Every TAT would pass u64::MAX: nothing fits any more, and nothing panics.
    assert_eq!(budget.try_acquire(&[]).unwrap_err(), BudgetError::WouldWait);
    assert_eq!(budget.wait_time(&[]).unwrap(), Duration::MAX);
    let mut never = Probe::new(budget.acquire_within(&[], Duration::from_secs(1)));
    assert!(matches!(
        never.poll(),
        Poll::Ready(Err(BudgetError::NotWithin { .. }))
    ));
}

#[test]
fn a_polled_then_dropped_waiter_leaves_no_clock_entry_behind() {
    let clock = ManualClock::new();
    let budget = budget(&clock, 10);
    let _spent = budget.try_acquire(&[("tokens", 100)]).unwrap();
    let mut head = Probe::new(budget.acquire(&[("tokens", 50)]));
    for _ in 0..1000 {
        assert!(head.pending());
    }
    let wakes = head.wakes.clone();
    drop(head);
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        0,
        "a dropped waiter's alarm rang"
    );
}

/// Tracks the most turns held at once.
#[derive(Default)]
struct Concurrency {
    now: AtomicU32,
    most: AtomicU32,
}

impl Concurrency {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn realtime_threads_and_tasks_share_one_budget_within_its_cap_and_rate() {
    // 200 requests/s with a burst of 1 and 3 in flight, 80 calls from 4 threads and
    // 40 tokio tasks: the last is admitted no earlier than 79 × 5 ms, and at most 3
    // calls ever run at once. The upper bound is for a loaded 2-core machine.
    let budget = Budget::builder()
        .rate("requests", Quota::per_second(200).with_burst(1))
        .in_flight(3)
        .build()
        .unwrap();
    let running = Arc::new(Concurrency::default());
    let started = Instant::now();
    let go = Arc::new(Barrier::new(5));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (budget, running, go) = (budget.clone(), running.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                for _ in 0..10 {
                    let turn = budget.acquire_blocking(&[]).unwrap();
                    running.enter();
                    std::thread::sleep(Duration::from_millis(2));
                    running.leave();
                    turn.settle(&[]).unwrap();
                }
            })
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    go.wait();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let (budget, running) = (budget.clone(), running.clone());
                tokio::spawn(async move {
                    let turn = budget.acquire(&[]).await.unwrap();
                    running.enter();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    running.leave();
                    drop(turn);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    for thread in threads {
        thread.join().unwrap();
    }
    let elapsed = started.elapsed();
    assert!(running.most.load(Ordering::SeqCst) <= 3);
    assert!(
        elapsed >= Duration::from_millis(79 * 5),
        "{elapsed:?}: faster than the rate"
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert_eq!((budget.in_flight(), budget.waiting()), (0, 0));
}

#[test]
fn realtime_cancelled_tokio_waiters_leave_the_budget_whole() {
    // 300 tasks time out around their turns; afterwards nothing is held or queued, and
    // the budget admits a full burst again once refilled.
    let budget = Budget::builder()
        .rate("requests", Quota::per_second(1_000).with_burst(5))
        .rate("tokens", Quota::per_second(100_000).with_burst(1_000))
        .in_flight(4)
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..300u64)
            .map(|i| {
                let budget = budget.clone();
                tokio::spawn(async move {
                    let wait = Duration::from_micros(i * 700 % 40_000);
                    if let Ok(Ok(turn)) =
                        tokio::time::timeout(wait, budget.acquire(&[("tokens", 100)])).await
                    {
                        tokio::time::sleep(Duration::from_micros(500)).await;
                        turn.settle(&[("tokens", 40)]).unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    assert_eq!((budget.in_flight(), budget.waiting()), (0, 0));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(budget.remaining("requests").unwrap(), 5);
    assert_eq!(budget.remaining("tokens").unwrap(), 1_000);
}
