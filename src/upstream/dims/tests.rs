//! Reading per-dimension fields: each provider's spelling, and hostile values.

use core::time::Duration;
use std::time::UNIX_EPOCH;

use super::*;

/// 2026-11-26T14:00:00Z.
const NOW: u64 = 1_795_701_600;

fn read(status: u16, headers: &[(&str, &str)]) -> DimensionSignal {
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    DimensionSignal::read(status, headers.iter().map(|(n, v)| (*n, v.as_bytes())), now)
}

/// What is left of `name`, its limit (if any) counted over a minute.
fn left(name: &str, limit: Option<u64>, remaining: u64, reset: Option<Duration>) -> DimensionLeft {
    DimensionLeft {
        name: name.into(),
        limit,
        per: limit.map(|_| Duration::from_secs(60)),
        remaining,
        reset,
    }
}

#[test]
fn the_lowest_rate_wins_and_a_known_window_over_an_unknown_one() {
    let s = read(
        200,
        &[
            // 10/s, then 5/s: the second.
            (
                "ratelimit-policy",
                r#""tokens";q=100;w=10, "tokens";q=300;w=60"#,
            ),
            ("ratelimit", r#""tokens";r=9"#),
            // A quota with no window, then 3000 a minute (50/s): the minute's.
            ("ratelimit-policy", r#""requests";q=5"#),
            ("x-ratelimit-limit-requests", "3000"),
            ("x-ratelimit-remaining-requests", "2999"),
            // A window-less quota alone: its size, no window.
            ("ratelimit-policy", r#""images";q=7"#),
            ("ratelimit", r#""images";r=1"#),
        ],
    );
    let tokens = s.get("tokens").unwrap();
    assert_eq!(
        (tokens.limit, tokens.per),
        (Some(300), Some(Duration::from_secs(60)))
    );
    let requests = s.get("requests").unwrap();
    assert_eq!(
        (requests.limit, requests.per),
        (Some(3000), Some(Duration::from_secs(60)))
    );
    let images = s.get("images").unwrap();
    assert_eq!((images.limit, images.per), (Some(7), None));
}

#[test]
fn openai_style_fields_with_go_durations() {
    let s = read(
        200,
        &[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("X-RateLimit-Limit-Tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "29000"),
            ("x-ratelimit-reset-tokens", "2m0.5s"),
        ],
    );
    assert_eq!(s.retry_after(), None);
    assert_eq!(
        s.left(),
        [
            left("requests", Some(500), 499, Some(Duration::from_millis(120))),
            left(
                "tokens",
                Some(30_000),
                29_000,
                Some(Duration::from_millis(120_500))
            ),
        ]
    );
}

#[test]
fn anthropic_style_fields_with_rfc3339_instants() {
    let s = read(
        429,
        &[
            ("anthropic-ratelimit-input-tokens-limit", "100000"),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-11-26T14:00:07Z",
            ),
            ("anthropic-ratelimit-output-tokens-remaining", "1200"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-11-26T13:59:00Z",
            ),
            ("retry-after", "7"),
        ],
    );
    assert_eq!(s.retry_after(), Some(Duration::from_secs(7)));
    let input = s.get("input-tokens").unwrap();
    assert_eq!(
        input,
        &left(
            "input_tokens",
            Some(100_000),
            0,
            Some(Duration::from_secs(7))
        )
    );
    // A reset in the past is now.
    assert_eq!(s.get("output_tokens").unwrap().reset, Some(Duration::ZERO));
}

#[test]
fn instants_are_read_on_the_upstreams_clock_when_it_is_off() {
    // The upstream's clock is an hour behind ours: its reset is 5 s from *its* now.
    let s = read(
        200,
        &[
            ("date", "Thu, 26 Nov 2026 13:00:00 GMT"),
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "2026-11-26T13:00:05Z"),
        ],
    );
    assert_eq!(s.get("tokens").unwrap().reset, Some(Duration::from_secs(5)));
}

#[test]
fn ietf_fields_with_named_policies() {
    let s = read(
        200,
        &[
            (
                "ratelimit-policy",
                r#""requests";q=500;w=60, "tokens";q=40000;w=60"#,
            ),
            ("ratelimit", r#""tokens";r=100;t=12, "requests";r=7;t=1.5"#),
        ],
    );
    assert_eq!(
        s.left(),
        [
            left("requests", Some(500), 7, Some(Duration::from_millis(1_500))),
            left("tokens", Some(40_000), 100, Some(Duration::from_secs(12))),
        ]
    );
}

#[test]
fn repeated_fields_keep_the_fewest_left_and_the_latest_reset() {
    let s = read(
        200,
        &[
            ("x-ratelimit-remaining-tokens", "50"),
            ("x-ratelimit-remaining-tokens", "10"),
            ("x-ratelimit-reset-tokens", "1s"),
            ("x-ratelimit-reset-tokens", "3s"),
            ("ratelimit", r#""tokens";r=30;t=2"#),
        ],
    );
    assert_eq!(
        s.left(),
        [left("tokens", None, 10, Some(Duration::from_secs(3)))]
    );
}

#[test]
fn hostile_values_are_ignored_or_saturate() {
    let s = read(
        429,
        &[
            ("retry-after", "-5"),
            ("retry-after", "NaN"),
            ("x-ratelimit-remaining-tokens", "-1"),
            ("x-ratelimit-remaining-requests", "1e3"),
            ("x-ratelimit-reset-requests", "9999h"),
            ("x-ratelimit-remaining-images", "0"),
            ("x-ratelimit-reset-images", "-3s"),
            (
                "anthropic-ratelimit-tokens-remaining",
                "99999999999999999999999",
            ),
            ("anthropic-ratelimit-tokens-reset", "3026-11-26T14:00:00Z"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "tomorrow"),
            ("ratelimit", r#""bad name";r=0;t=5, "x";r=-1;t=5, ?1;r=0"#),
            ("x-ratelimit-remaining-a.b", "0"),
        ],
    );
    assert_eq!(s.retry_after(), None);
    // 9999h reads (the budget's `max_hold` caps it); "1e3" and "tomorrow" do not.
    let long = Some(Duration::from_secs(9_999 * 3_600));
    assert_eq!(s.get("requests"), Some(&left("requests", None, 0, long)));
    assert_eq!(s.get("images"), Some(&left("images", None, 0, None)));
    // Saturated, left for the budget's `max_hold` to cap.
    let tokens = s.get("tokens").unwrap();
    assert_eq!(tokens.remaining, u64::MAX);
    assert!(tokens.reset.unwrap() > Duration::from_secs(31_000_000_000));
    assert_eq!(s.left().len(), 3, "{:?}", s.left());
    // A huge Retry-After saturates likewise.
    let s = read(429, &[("retry-after", "999999999999999999999999")]);
    assert_eq!(s.retry_after(), Some(Duration::from_secs(u64::MAX)));
    // Not text: ignored.
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    let raw = [("x-ratelimit-remaining-tokens", &b"\xff0"[..])];
    assert!(DimensionSignal::read(200, raw, now).left().is_empty());
}

#[test]
fn retry_after_counts_on_429_and_503_only() {
    assert_eq!(read(200, &[("retry-after", "5")]).retry_after(), None);
    assert_eq!(
        read(503, &[("retry-after", "5")]).retry_after(),
        Some(Duration::from_secs(5))
    );
}

#[test]
fn the_number_of_dimensions_is_bounded() {
    let names: Vec<String> = (0..100)
        .map(|i| format!("x-ratelimit-remaining-d{i}"))
        .collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    assert_eq!(read(200, &headers).left().len(), MAX_DIMENSIONS);
}

#[test]
fn provider_fields_repeated_and_joined_on_one_line_are_each_read() {
    let s = read(
        200,
        &[
            ("x-ratelimit-remaining-tokens", "400, 0"),
            ("x-ratelimit-reset-tokens", "1s, 6m0s"),
            ("x-ratelimit-limit-tokens", "90000, 30000"),
        ],
    );
    let tokens = s.get("tokens").unwrap();
    assert_eq!(tokens.remaining, 0);
    assert_eq!(tokens.reset, Some(Duration::from_secs(360)));
    assert_eq!(tokens.limit, Some(30_000));
}
