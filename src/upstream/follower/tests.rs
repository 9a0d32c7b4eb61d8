use super::*;
use crate::clock::ManualClock;
use std::time::{SystemTime, UNIX_EPOCH};

const MS: Duration = Duration::from_millis(1);

fn follower(config: FollowerConfig) -> (Follower<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(10));
    let configured = Quota::per_second(100).with_burst(1);
    (
        Follower::with_clock(configured, config, clock.clone()),
        clock,
    )
}

/// A response of `status` saying `left` remain until a reset a second from now.
fn left_for_a_second(f: &Follower<ManualClock>, status: u16, left: &str) -> Option<Duration> {
    let fields = [("x-ratelimit-remaining", left), ("x-ratelimit-reset", "1")];
    respond(f, status, &fields)
}

/// A success announcing `text` as its `RateLimit-Policy`.
fn announce(f: &Follower<ManualClock>, text: &str) -> Option<Duration> {
    respond(f, 200, &[("ratelimit-policy", text)])
}

fn respond(f: &Follower<ManualClock>, status: u16, headers: &[(&str, &str)]) -> Option<Duration> {
    let signal = Signal::read(
        status,
        headers.iter().map(|(n, v)| (*n, v.as_bytes())),
        SystemTime::now(),
    );
    f.apply(&signal, f.sent())
}

/// The pace in requests per second.
fn pace(f: &Follower<ManualClock>) -> f64 {
    1.0 / f.limiter().quota().emission_interval().as_secs_f64()
}

fn policy(q: u64, w: &str) -> String {
    format!("\"p\";q={q};w={w}")
}

#[test]
fn an_announced_pace_is_followed_at_95_percent_down_and_back_up() {
    let (f, _) = follower(FollowerConfig::default());
    respond(&f, 200, &[("ratelimit-policy", &policy(20, "1"))]);
    assert!((pace(&f) - 19.0).abs() < 0.01, "{}", pace(&f));
    // A higher one: back up, to the configured quota and no further.
    respond(&f, 200, &[("ratelimit-policy", &policy(200, "1"))]);
    assert_eq!(f.limiter().quota(), Quota::per_second(100).with_burst(1));
}

#[test]
fn above_configured_follows_a_higher_announced_pace() {
    let (f, _) = follower(FollowerConfig::default().above_configured(true));
    respond(&f, 200, &[("ratelimit-policy", &policy(200, "1"))]);
    assert!((pace(&f) - 190.0).abs() < 0.01, "{}", pace(&f));
    // Without it, the configured quota is the ceiling.
    let (f, _) = follower(FollowerConfig::default());
    respond(&f, 200, &[("ratelimit-policy", &policy(200, "1"))]);
    assert!((pace(&f) - 100.0).abs() < 0.01);
}

#[test]
fn revert_after_forgets_an_announced_pace_after_silence_and_not_before() {
    let (f, clock) = follower(FollowerConfig::default().revert_after(Duration::from_secs(30)));
    respond(&f, 200, &[("ratelimit-policy", &policy(20, "1"))]);
    clock.advance(Duration::from_secs(29));
    respond(&f, 200, &[]);
    assert!((pace(&f) - 19.0).abs() < 0.01);
    clock.advance(Duration::from_secs(1));
    respond(&f, 200, &[]);
    assert!((pace(&f) - 100.0).abs() < 0.01);
    // Without revert_after, silence keeps it.
    let (f, clock) = follower(FollowerConfig::default());
    respond(&f, 200, &[("ratelimit-policy", &policy(20, "1"))]);
    clock.advance(Duration::from_secs(3_600));
    respond(&f, 200, &[]);
    assert!((pace(&f) - 19.0).abs() < 0.01);
}

#[test]
fn an_announced_window_never_spaces_requests_past_max_hold() {
    let config = FollowerConfig::default().max_hold(Duration::from_secs(2));
    let (f, _) = follower(config);
    respond(&f, 200, &[("ratelimit-policy", &policy(1, "60"))]);
    assert_eq!(
        f.limiter().quota().emission_interval(),
        Duration::from_secs(2)
    );
    // A window past a minute is a budget, not a pace: held only once it is spent.
    let (f, _) = follower(config);
    respond(&f, 200, &[("ratelimit-policy", &policy(1, "1000000000"))]);
    assert!((pace(&f) - 100.0).abs() < 0.01);
    let hold = respond(
        &f,
        200,
        &[
            ("ratelimit-policy", &policy(1, "1000000000")),
            ("ratelimit", "\"p\";r=0;t=999999999"),
        ],
    );
    assert_eq!(hold, Some(Duration::from_secs(2)));
    // max_hold zero: nothing the upstream says slows the client.
    let (f, _) = follower(FollowerConfig::default().max_hold(Duration::ZERO));
    assert_eq!(
        respond(
            &f,
            429,
            &[
                ("retry-after", "60"),
                ("ratelimit-policy", &policy(1, "60"))
            ]
        ),
        None
    );
    assert!((pace(&f) - 100.0).abs() < 0.01);
}

#[test]
fn the_callers_own_quota_is_never_overridden() {
    let (f, _) = follower(FollowerConfig::default());
    respond(&f, 200, &[("ratelimit-policy", &policy(50, "1"))]);
    f.limiter().set_quota(Quota::per_second(10).with_burst(1));
    respond(&f, 200, &[("ratelimit-policy", &policy(50, "1"))]);
    assert_eq!(f.configured(), Quota::per_second(10).with_burst(1));
    assert!((pace(&f) - 10.0).abs() < 0.01);
    f.set_configured(Quota::per_second(30).with_burst(1));
    assert!((pace(&f) - 30.0).abs() < 0.01);
}

#[test]
fn refusals_alone_halve_the_pace_then_cut_it_by_a_tenth_and_it_grows_back() {
    let (f, clock) = follower(FollowerConfig::default());
    // A refusal explained by nothing: halved, less the jitter share (just below the
    // upstream's rate for a client at twice it).
    respond(&f, 429, &[]);
    assert!((pace(&f) - 47.5).abs() < 0.01, "{}", pace(&f));
    // A request sent before the cut says nothing more.
    let early = f.sent();
    clock.advance(MS);
    f.apply(
        &Signal::read(200, [("a", &b""[..])], SystemTime::now()),
        early,
    );
    clock.advance(MS);
    let before = f.sent();
    respond(&f, 200, &[]);
    clock.advance(MS);
    // Within a second of the halving: the refusal holds, and cuts nothing.
    f.apply(
        &Signal::read(429, [("a", &b""[..])], SystemTime::now()),
        before,
    );
    assert!((pace(&f) - 47.5).abs() < 0.1, "{}", pace(&f));
    clock.advance(Duration::from_secs(1));
    let after = f.sent();
    respond(&f, 200, &[]);
    f.apply(
        &Signal::read(429, [("a", &b""[..])], SystemTime::now()),
        after,
    );
    // Sent after the cut and its grace: cut by a tenth (of the pace then, which grew a
    // little: 47.74).
    assert!((pace(&f) - 42.96).abs() < 0.05, "{}", pace(&f));
    // 0.5 % of the rate after the cut per second: 10 s for 2.15 more.
    clock.advance(Duration::from_secs(10));
    respond(&f, 200, &[]);
    assert!((pace(&f) - 45.11).abs() < 0.05, "{}", pace(&f));
}

#[test]
fn consecutive_bare_refusals_back_off_doubling() {
    let (f, _) = follower(FollowerConfig::default());
    assert_eq!(respond(&f, 429, &[]), None);
    let interval = f.limiter().quota().emission_interval();
    assert_eq!(respond(&f, 429, &[]), Some(interval * 2));
    assert_eq!(respond(&f, 429, &[]), Some(interval * 4));
    respond(&f, 200, &[]);
    assert_eq!(respond(&f, 429, &[]), None);
}

#[test]
fn refusals_in_a_row_never_back_off_past_the_reset_the_upstream_named() {
    let (f, clock) = follower(FollowerConfig::default());
    for _ in 0..12 {
        let hold = left_for_a_second(&f, 429, "0");
        assert!(hold.is_none_or(|h| h <= Duration::from_secs(1)), "{hold:?}");
        clock.advance(hold.unwrap_or_default());
    }
}

#[test]
fn refusals_that_repeat_nothing_back_off_no_further_than_a_reset_named_before() {
    // A success says what is allowed is spent until 1 s from now; the refusals that
    // follow carry no fields (as upstreams that send them on successes only).
    let (f, clock) = follower(FollowerConfig::default());
    left_for_a_second(&f, 200, "0");
    let start = Duration::from_nanos(crate::clock::Clock::now(&clock));
    for _ in 0..12 {
        let hold = respond(&f, 429, &[]).unwrap_or_default();
        let now = Duration::from_nanos(crate::clock::Clock::now(&clock));
        assert!(now + hold <= start + Duration::from_secs(1), "{hold:?}");
        clock.advance(hold.min(Duration::from_millis(50)));
    }
}

#[test]
fn a_count_flickering_to_zero_cuts_once_and_only_refusals_cut_again() {
    // Pacing at the edge of a bucket, the count flickers 1 -> 0 on successes: the first
    // fall says the client is at the limit; the next ones lose nothing and cut nothing.
    let (f, clock) = follower(FollowerConfig::default());
    let headers = |left: &str| {
        [
            ("x-ratelimit-limit", "50"),
            ("x-ratelimit-remaining", left),
            ("x-ratelimit-reset", "1"),
        ]
        .map(|(n, v)| (n, v.to_owned()))
    };
    let answer = |left: &str| {
        let h = headers(left);
        let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
        respond(&f, 200, &h)
    };
    answer("5");
    clock.advance(Duration::from_millis(50));
    answer("1");
    answer("0");
    let cut = pace(&f);
    assert!((cut - 47.5).abs() < 0.01, "{cut}");
    for _ in 0..10 {
        clock.advance(Duration::from_millis(50));
        answer("1");
        answer("0");
    }
    assert!(pace(&f) >= cut, "{cut} then {}", pace(&f));
    // A refusal still cuts (once the first cut's grace is over).
    clock.advance(Duration::from_secs(1));
    respond(&f, 429, &[]);
    assert!(pace(&f) < cut * 0.95, "{cut} then {}", pace(&f));
}

#[test]
fn a_count_that_falls_to_zero_is_a_cut_and_one_that_stays_there_is_not() {
    let (f, _) = follower(FollowerConfig::default());
    left_for_a_second(&f, 200, "3");
    assert_eq!(left_for_a_second(&f, 200, "0"), None);
    assert!((pace(&f) - 47.5).abs() < 0.01, "{}", pace(&f));
    left_for_a_second(&f, 200, "0");
    assert!((pace(&f) - 47.5).abs() < 0.01, "{}", pace(&f));
    // A reset two seconds or more away with nothing left: a hold.
    let hold = respond(
        &f,
        200,
        &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "5")],
    );
    assert_eq!(hold, Some(Duration::from_secs(5)));
}

#[test]
fn a_fixed_window_is_recognised_and_a_spent_one_holds_until_its_end() {
    let (f, clock) = follower(FollowerConfig::default());
    // 10 per 1 s window from t = 10.0 s; a client at 100/s.
    let mut remaining = 10u64;
    let mut window_end = Duration::from_secs(11);
    let mut holds = Vec::new();
    for _ in 0..400 {
        let now = Duration::from_nanos(crate::clock::Clock::now(&clock));
        while now >= window_end {
            window_end += Duration::from_secs(1);
            remaining = 10;
        }
        let (status, left) = if remaining > 0 {
            remaining -= 1;
            (200, remaining)
        } else {
            (429, 0)
        };
        let reset = (window_end - now).as_secs_f64().ceil().max(1.0) as u64;
        let hold = respond(
            &f,
            status,
            &[
                ("x-ratelimit-remaining", &left.to_string()),
                ("x-ratelimit-reset", &reset.to_string()),
            ],
        );
        if let Some(hold) = hold {
            holds.push((now, hold));
            clock.advance(hold);
        }
        // The client keeps to the follower's pace.
        clock.advance(f.limiter().quota().emission_interval());
    }
    // Once recognised, a spent window holds until its end, never past it by much.
    let (at, hold) = *holds.last().unwrap();
    let end = Duration::from_secs((at + hold).as_secs_f64().round() as u64);
    assert!(
        at + hold >= end - Duration::from_millis(15),
        "{at:?} + {hold:?}"
    );
    assert!(hold < Duration::from_secs(1), "{hold:?}");
}

#[test]
fn hostile_values_are_capped_or_ignored() {
    let config = FollowerConfig::default().max_hold(Duration::from_secs(3));
    let far = (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 10u128.pow(15))
    .to_string();
    for headers in [
        vec![("retry-after", "99999999999999999999999999")],
        vec![("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")],
        vec![
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", far.as_str()),
        ],
        vec![("ratelimit", "\"a\";r=0;t=18446744073709551615")],
    ] {
        let (f, _) = follower(config);
        let hold = respond(&f, 429, &headers);
        assert_eq!(hold, Some(Duration::from_secs(3)), "{headers:?}");
    }
    // Absurd policies: a rate past the configured one is capped; a policy repeated a
    // thousand times costs what 32 do.
    let (f, _) = follower(config);
    announce(&f, "\"a\";q=18446744073709551615;w=0.000000001");
    assert!((pace(&f) - 100.0).abs() < 0.01);
    let many = "\"a\";q=1;w=1,".repeat(1_000);
    announce(&f, &many);
    assert_eq!(f.announced(), Some(1.0));
    // Zero and negative values are ignored.
    let (f, _) = follower(config);
    announce(&f, "\"a\";q=0;w=1, \"b\";q=5;w=0, \"c\";q=-5;w=1");
    assert_eq!(f.announced(), None);
}

#[test]
fn a_first_refusal_of_one_rounded_second_at_a_fast_announced_pace_holds_two_intervals() {
    // paceline's own server at 50/s, burst 1: a request a millisecond early is refused
    // with "Retry-After: 1" (a 20 ms wait rounded up to whole seconds). Holding the
    // second would cost a second of the rate per refusal.
    let (f, clock) = follower(FollowerConfig::default());
    let fields = [
        ("ratelimit-policy", "\"api\";q=50;w=1"),
        ("ratelimit", "\"api\";r=0;t=1"),
        ("retry-after", "1"),
    ];
    announce(&f, "\"api\";q=50;w=1");
    let interval = Duration::from_secs_f64(1.0 / pace(&f));
    let hold = respond(&f, 429, &fields).unwrap();
    assert!(hold <= 2 * interval + MS, "{hold:?}");
    // Refused again at once: the second was meant; it holds.
    clock.advance(hold);
    assert_eq!(respond(&f, 429, &fields), Some(Duration::from_secs(1)));
    // A success ends the run; a longer Retry-After, or one without an announced pace,
    // holds as it says.
    announce(&f, "\"api\";q=50;w=1");
    assert_eq!(
        respond(
            &f,
            429,
            &[
                ("ratelimit-policy", "\"api\";q=50;w=1"),
                ("retry-after", "2")
            ]
        ),
        Some(Duration::from_secs(2))
    );
    let (bare, _) = follower(FollowerConfig::default());
    assert_eq!(
        respond(&bare, 429, &[("retry-after", "1")]),
        Some(Duration::from_secs(1))
    );
}

#[test]
fn a_first_refusal_that_announces_its_pace_holds_two_of_its_intervals_or_the_second() {
    // The first answer the client sees is the refusal, and it announces the pace: the
    // two intervals are the announced pace's, not the configured one's (100/s here).
    let (f, _) = follower(FollowerConfig::default());
    let hold = respond(
        &f,
        429,
        &[("ratelimit-policy", &policy(10, "1")), ("retry-after", "1")],
    )
    .unwrap();
    let interval = Duration::from_secs_f64(1.0 / 9.5);
    assert!(
        hold >= 2 * interval - MS && hold <= 2 * interval + MS,
        "{hold:?}"
    );
    // An announced pace slower than two a second: the second was meant.
    let (f, _) = follower(FollowerConfig::default());
    let hold = respond(
        &f,
        429,
        &[("ratelimit-policy", &policy(1, "1")), ("retry-after", "1")],
    );
    assert_eq!(hold, Some(Duration::from_secs(1)));
}

#[test]
fn a_late_request_holds_the_booking_limiter_until_the_execution_limiter_admits() {
    // Requests that resumed late booked the execution limiter 50 ms ahead: the next
    // one to find it busy holds the booking limiter until it admits again, so that
    // later turns are booked where their requests can be sent.
    let (f, _clock) = follower(FollowerConfig::default());
    let run = Arc::clone(f.execution_limiter().unwrap());
    run.hold_for(Duration::from_millis(50));
    let outcome = futures::executor::block_on(f.until_ready_within(Duration::ZERO));
    assert!(outcome.is_err(), "the execution turn is 50 ms away");
    assert!(
        f.limiter().peek() >= Duration::from_millis(60),
        "{:?}",
        f.limiter().peek()
    );
    // On time, nothing is held.
    let (f, _clock) = follower(FollowerConfig::default());
    futures::executor::block_on(f.until_ready_within(Duration::ZERO)).unwrap();
    assert!(f.limiter().peek() <= Duration::from_millis(10));
    // A moment late (less than an interval: timer jitter), nothing is held either: the
    // booking limiter's later turns would otherwise drift back by every such moment.
    let (f, _clock) = follower(FollowerConfig::default());
    let run = Arc::clone(f.execution_limiter().unwrap());
    run.hold_for(Duration::from_millis(5));
    let _ = futures::executor::block_on(f.until_ready_within(Duration::ZERO));
    assert!(
        f.limiter().peek() <= Duration::from_millis(10),
        "{:?}",
        f.limiter().peek()
    );
}
