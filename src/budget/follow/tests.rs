//! Following per-dimension signals on a manual clock: floors, holds, the `max_hold` cap.

use core::time::Duration;
use std::time::SystemTime;

use crate::budget::Budget;
use crate::clock::ManualClock;
use crate::upstream::DimensionSignal;
use crate::Quota;

fn budget(clock: &ManualClock) -> Budget<ManualClock> {
    Budget::builder()
        .rate("requests", Quota::per_second(10))
        .rate("input-tokens", Quota::per_second(1_000))
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn signal(status: u16, headers: &[(&str, &str)]) -> DimensionSignal {
    let headers = headers.iter().map(|(n, v)| (*n, v.as_bytes()));
    DimensionSignal::read(status, headers, SystemTime::now())
}

const MAX_HOLD: Duration = Duration::from_secs(3);

/// Whether `b` admits a turn of one token now (the turn ends at once).
fn one_token(b: &Budget<ManualClock>) -> bool {
    b.try_acquire(&[("input-tokens", 1)]).is_ok()
}

/// Steers `b` by a response of `status` with `headers`, waiting at most [`MAX_HOLD`]; how
/// many dimensions it reported.
fn follow(b: &Budget<ManualClock>, status: u16, headers: &[(&str, &str)]) -> usize {
    b.follow(&signal(status, headers), MAX_HOLD)
}

#[test]
fn remaining_aligns_the_bucket_down_never_up() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    assert_eq!(
        follow(
            &b,
            200,
            &[("anthropic-ratelimit-input-tokens-remaining", "250")]
        ),
        1
    );
    assert_eq!(b.remaining("input-tokens").unwrap(), 250);
    assert_eq!(b.remaining("requests").unwrap(), 10);
    // More left upstream than here: nothing given.
    follow(&b, 200, &[("x-ratelimit-remaining-input_tokens", "900")]);
    assert_eq!(b.remaining("input-tokens").unwrap(), 250);
}

#[test]
fn none_left_admits_nothing_before_the_reset_then_paces() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    follow(
        &b,
        200,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1.5s"),
        ],
    );
    clock.advance(Duration::from_millis(1_499));
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(1));
    let turn = b.try_acquire(&[("input-tokens", 1)]).unwrap();
    // Then the dimension's own pace, from empty: the next request 100 ms later.
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(100));
    assert!(b.try_acquire(&[("input-tokens", 1)]).is_ok());
    drop(turn);
}

#[test]
fn hostile_resets_and_retry_after_never_park_past_max_hold() {
    for headers in [
        &[("retry-after", "999999999")][..],
        &[("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")][..],
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "9999h"),
        ][..],
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "99999999999999999999999h"),
        ][..],
        &[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "9999-12-31T23:59:59Z"),
        ][..],
        &[("ratelimit", r#""requests";r=0;t=99999999999999999999"#)][..],
    ] {
        let clock = ManualClock::new();
        let b = budget(&clock);
        b.follow(&signal(429, headers), MAX_HOLD);
        let wait = b.wait_time(&[("input-tokens", 1)]).unwrap();
        assert!(wait <= MAX_HOLD, "{headers:?}: {wait:?}");
        assert!(
            wait >= MAX_HOLD - Duration::from_millis(1),
            "{headers:?}: {wait:?}"
        );
        clock.advance(MAX_HOLD);
        assert!(b.try_acquire(&[("input-tokens", 1)]).is_ok(), "{headers:?}");
    }
}

#[test]
fn junk_and_unknown_dimensions_change_nothing() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    assert_eq!(
        follow(
            &b,
            429,
            &[
                ("retry-after", "-1"),
                ("x-ratelimit-reset-requests", "NaN"),
                ("x-ratelimit-remaining-images", "0"),
                ("x-ratelimit-reset-images", "1h"),
                ("x-ratelimit-remaining-requests", "-3"),
            ]
        ),
        0
    );
    assert_eq!(b.remaining("requests").unwrap(), 10);
    assert_eq!(b.wait_time(&[]).unwrap(), Duration::ZERO);
}

#[test]
fn a_floor_outlives_the_settle_of_a_turn_booked_before_it() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    let turn = b.try_acquire(&[("input-tokens", 800)]).unwrap();
    follow(&b, 200, &[("x-ratelimit-remaining-input-tokens", "100")]);
    // Settled at 10: the refund cannot undo what the upstream said is spent.
    turn.settle(&[("input-tokens", 10)]).unwrap();
    assert_eq!(b.remaining("input-tokens").unwrap(), 100);
}

#[test]
fn max_hold_zero_ignores_every_wait() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    let s = signal(
        429,
        &[
            ("retry-after", "60"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1m"),
        ],
    );
    b.follow(&s, Duration::ZERO);
    assert!(b.try_acquire(&[]).is_ok());
}

/// Field names a provider may send, for the property below.
const NAMES: [&str; 8] = [
    "retry-after",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "ratelimit",
    "ratelimit-policy",
    "date",
];

/// Values near the forms these fields take, and anything else.
fn value() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        "[0-9]{1,30}",
        "-?[0-9]{0,25}(\\.[0-9]{0,12})?(h|m|s|ms|us|ns|x)?([0-9]{1,20}(h|m|s))?",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|[+-][0-9]{2}:[0-9]{2})",
        "\"(requests|input-tokens|x)\";r=-?[0-9]{1,25};t=[0-9]{1,25}(\\.[0-9]{1,3})?",
        "[A-Za-z]{3}, [0-9]{2} [A-Za-z]{3} [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT",
        any::<String>(),
    ]
}

proptest::proptest! {
    /// Whatever the fields say, reading them never panics and no one-cell turn waits
    /// longer than `max_hold` for them.
    #[test]
    fn no_fields_park_a_turn_past_max_hold(
        fields in proptest::collection::vec((0usize..NAMES.len(), value()), 0..12),
        status in proptest::prop_oneof![proptest::strategy::Just(200u16), proptest::strategy::Just(429u16), 100u16..600],
        max_ms in 0u64..10_000,
    ) {
        let clock = ManualClock::new();
        let b = budget(&clock);
        let max_hold = Duration::from_millis(max_ms);
        let headers: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (NAMES[*n], v.as_str())).collect();
        b.follow(&signal(status, &headers), max_hold);
        let wait = b.wait_time(&[("input-tokens", 1)]).unwrap();
        proptest::prop_assert!(wait <= max_hold, "{:?}: {:?}", headers, wait);
    }
}

#[test]
fn an_announced_limit_below_the_configured_rate_paces_the_dimension_at_it() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    // 120 requests a minute announced (2/s) where 10/s are configured.
    follow(
        &b,
        200,
        &[
            ("x-ratelimit-limit-requests", "120"),
            ("x-ratelimit-remaining-requests", "119"),
        ],
    );
    // The configured burst of 10 stays; then one request per 500 ms, not per 100 ms.
    for _ in 0..10 {
        assert!(one_token(&b), "refused");
    }
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(499));
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(1));
    assert!(one_token(&b), "refused");
    // Announced at the configured rate or above: the configured pace again.
    follow(
        &b,
        200,
        &[
            ("ratelimit-policy", "\"requests\";q=600;w=60"),
            ("ratelimit", "\"requests\";r=500;t=1"),
        ],
    );
    // The backlog the slow pace left (its bucket empty) is the same count of cells at
    // the configured pace: the next request 100 ms later, then 100 ms apart.
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(100));
    assert!(one_token(&b), "refused");
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(100));
    assert!(one_token(&b), "refused");
}

#[test]
fn a_slower_announced_rate_frees_no_cell() {
    // The burst of 10 spent at 10/s; then 2/s is announced: still nothing left, and the
    // next cell comes at the new pace.
    let clock = ManualClock::new();
    let b = budget(&clock);
    for _ in 0..10 {
        assert!(one_token(&b), "refused");
    }
    follow(
        &b,
        200,
        &[
            ("x-ratelimit-limit-requests", "120"),
            ("x-ratelimit-remaining-requests", "50"),
        ],
    );
    assert_eq!(b.remaining("requests").unwrap(), 0);
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(499));
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(1));
    assert!(one_token(&b), "refused");
}

#[test]
fn an_absurd_announced_limit_paces_no_slower_than_max_hold() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    follow(
        &b,
        200,
        &[
            ("ratelimit-policy", "\"requests\";q=1;w=1000000000"),
            ("ratelimit", "\"requests\";r=0;t=1000000000"),
        ],
    );
    // Nothing left: one request after the capped reset, the next one `max_hold` later.
    clock.advance(MAX_HOLD);
    assert!(one_token(&b), "refused");
    clock.advance(MAX_HOLD);
    assert!(one_token(&b), "refused");
    // A cost up to the configured burst is still admissible, in time.
    clock.advance(MAX_HOLD * 10);
    drop(b.try_acquire(&[("input-tokens", 1_000)]).unwrap());
}

#[test]
fn what_is_left_counts_at_the_announced_pace() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    follow(
        &b,
        200,
        &[
            ("x-ratelimit-limit-requests", "120"),
            ("x-ratelimit-remaining-requests", "3"),
        ],
    );
    assert_eq!(b.remaining("requests").unwrap(), 3);
    for _ in 0..3 {
        assert!(one_token(&b), "refused");
    }
    assert!(!one_token(&b), "admitted");
}

#[test]
fn a_faster_announced_rate_wakes_the_head_whose_instant_came_earlier() {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let clock = ManualClock::new();
    let b = budget(&clock);
    let slow = signal(
        200,
        &[
            ("x-ratelimit-limit-requests", "6"),
            ("x-ratelimit-remaining-requests", "0"),
        ],
    );
    b.follow(&slow, MAX_HOLD);
    // A waiter for the next request, 3 s away at 6 a minute (the cap).
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut acquire = Box::pin(b.acquire(&[("input-tokens", 1)]));
    assert!(acquire
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    let fast = signal(
        200,
        &[
            ("x-ratelimit-limit-requests", "600"),
            ("x-ratelimit-remaining-requests", "1"),
        ],
    );
    b.follow(&fast, MAX_HOLD);
    assert!(flag.0.load(Ordering::SeqCst), "the head was not woken");
}

#[test]
fn none_left_and_no_reset_admits_the_next_cell_one_interval_on() {
    let clock = ManualClock::new();
    let b = budget(&clock);
    b.follow(
        &signal(200, &[("x-ratelimit-remaining-requests", "0")]),
        MAX_HOLD,
    );
    assert!(!one_token(&b), "admitted");
    clock.advance(Duration::from_millis(100));
    assert!(one_token(&b), "refused");
}
