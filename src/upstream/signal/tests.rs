use super::*;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn read(status: u16, headers: &[(&str, &str)], now: SystemTime) -> Signal {
    Signal::read(status, headers.iter().map(|(n, v)| (*n, v.as_bytes())), now)
}

#[test]
fn retry_after_as_seconds_a_fraction_or_a_date() {
    let now = at(784_111_777);
    let ra = |v: &str| read(429, &[("Retry-After", v)], now).retry_after;
    assert_eq!(ra("120"), Some(Duration::from_secs(120)));
    assert_eq!(ra("1.5"), Some(Duration::from_millis(1500)));
    assert_eq!(
        ra("9999999999999999"),
        Some(Duration::from_secs(9_999_999_999_999_999))
    );
    assert_eq!(
        ra("99999999999999999999999"),
        Some(Duration::from_secs(u64::MAX))
    );
    assert_eq!(
        ra("Sun, 06 Nov 1994 08:50:37 GMT"),
        Some(Duration::from_secs(60))
    );
    assert_eq!(ra("Sun, 06 Nov 1994 08:40:37 GMT"), Some(Duration::ZERO));
    assert_eq!(ra("60, soon"), Some(Duration::from_secs(60)));
    // Joined by an intermediary with a date, whose own comma is not a separator.
    let in_60 = "Sun, 06 Nov 1994 08:50:37 GMT";
    let in_120 = "Sun, 06 Nov 1994 08:51:37 GMT";
    assert_eq!(ra(&format!("{in_60}, 5")), Some(Duration::from_secs(60)));
    assert_eq!(ra(&format!("5, {in_60}")), Some(Duration::from_secs(60)));
    assert_eq!(
        ra(&format!("{in_60}, {in_120}")),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        ra("Sunday, 06-Nov-94 08:51:37 GMT, 5"),
        Some(Duration::from_secs(120))
    );
    for bad in ["-5", "1e9", "soon", "", "Mon, 31 Feb 2099 00:00:00 GMT"] {
        assert_eq!(ra(bad), None, "{bad}");
    }
    // Only on a refusal.
    assert_eq!(read(200, &[("retry-after", "5")], now).retry_after, None);
    // Two fields: the longest readable one.
    let two = read(429, &[("retry-after", "60"), ("retry-after", "soon")], now);
    assert_eq!(two.retry_after, Some(Duration::from_secs(60)));
}

#[test]
fn absolute_times_are_read_on_the_upstreams_clock_when_it_is_off() {
    let local = at(1_700_000_000);
    let date = |secs: u64| http_date_text(secs);
    for skew in [-300i64, 300] {
        let server = 1_700_000_000u64.saturating_add_signed(skew);
        let s = read(
            429,
            &[("date", &date(server)), ("retry-after", &date(server + 2))],
            local,
        );
        assert_eq!(s.retry_after, Some(Duration::from_secs(2)), "{skew}");
    }
    // A clock within two seconds: the local one, which has the fraction.
    let local = UNIX_EPOCH + Duration::from_millis(1_700_000_000_400);
    let s = read(
        200,
        &[
            ("date", &date(1_700_000_000)),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1700000001"),
        ],
        local,
    );
    assert_eq!(
        s.left[0].reset,
        Some(Reset::Exact(Duration::from_millis(600)))
    );
}

/// An IMF-fixdate, for the tests (2023-11-14 is a Tuesday).
fn http_date_text(unix: u64) -> String {
    let secs = unix - 1_699_920_000; // 2023-11-14 00:00:00 UTC
    let (day, rest) = (secs / 86_400, secs % 86_400);
    const DAYS: [&str; 7] = ["Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Mon"];
    format!(
        "{}, {} Nov 2023 {:02}:{:02}:{:02} GMT",
        DAYS[day as usize % 7],
        14 + day,
        rest / 3_600,
        rest / 60 % 60,
        rest % 60
    )
}

#[test]
fn the_ietf_fields_and_their_earlier_drafts() {
    let now = at(1_700_000_000);
    let s = read(
        200,
        &[
            (
                "RateLimit-Policy",
                r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
            ),
            ("RateLimit", r#""burst";r=0;t=7"#),
        ],
        now,
    );
    assert_eq!(s.policies.len(), 2);
    assert_eq!(s.pace().unwrap().quota, 100);
    assert_eq!(
        s.left,
        [Left {
            remaining: 0,
            reset: Some(Reset::Rounded(Duration::from_secs(7)))
        }]
    );
    assert_eq!(
        read(200, &[("ratelimit-policy", "50;w=1")], now).pace(),
        Some(Policy {
            quota: 50,
            window: Duration::from_secs(1)
        })
    );
    assert_eq!(
        read(200, &[("ratelimit-limit", "10, 10;w=1, 1000;w=3600")], now)
            .policies
            .len(),
        2
    );
    // Unknown parameters are skipped; broken members are left out.
    let s = read(
        200,
        &[(
            "ratelimit-policy",
            r#""x";q=-1;w=1, "y";q=0;w=1, "z";q=5;w=1;pk=:cHsxMjM0NQ==:;qu="request""#,
        )],
        now,
    );
    assert_eq!(s.policies.len(), 1);
    // Draft-07's dictionary.
    let s = read(200, &[("ratelimit", "limit=10, remaining=0, reset=2")], now);
    assert_eq!(
        s.left,
        [Left {
            remaining: 0,
            reset: Some(Reset::Rounded(Duration::from_secs(2)))
        }]
    );
}

#[test]
fn x_ratelimit_reset_as_seconds_or_a_unix_time_in_seconds_or_milliseconds() {
    let now = at(1_700_000_000);
    let reset = |remaining: &str, reset: &str| {
        read(
            200,
            &[
                ("X-RateLimit-Remaining", remaining),
                ("X-RateLimit-Reset", reset),
            ],
            now,
        )
        .left
    };
    let one = |remaining, reset| {
        vec![Left {
            remaining,
            reset: Some(reset),
        }]
    };
    let (secs, millis) = (Duration::from_secs, Duration::from_millis);
    for (remaining, field, want) in [
        ("0", "30", one(0, Reset::Rounded(secs(30)))),
        ("0", "1700000045", one(0, Reset::Exact(secs(45)))),
        ("0", "1700000002500", one(0, Reset::Exact(millis(2500)))),
        ("1", "1.25", one(1, Reset::Exact(millis(1250)))),
        (
            "0",
            "-3",
            vec![Left {
                remaining: 0,
                reset: None,
            }],
        ),
    ] {
        assert_eq!(reset(remaining, field), want, "X-RateLimit-Reset: {field}");
    }
}

#[test]
fn values_that_are_not_text_are_ignored() {
    let s = Signal::read(429, [("retry-after", &[0xff, 0xfe][..])], SystemTime::now());
    assert_eq!(s.retry_after, None);
    let s = Signal::read(
        429,
        [("retry-after", "5\u{e9}".as_bytes())],
        SystemTime::now(),
    );
    assert_eq!(s.retry_after, None);
}

#[test]
fn counts_repeated_on_one_line_joined_are_read_as_repeated_lines() {
    // An intermediary may join repeated lines into one, comma-separated: the fewest
    // left and the latest reset, as for separate lines.
    let now = at(1_000);
    let joined = read(
        200,
        &[
            ("x-ratelimit-remaining", "4, 0"),
            ("x-ratelimit-reset", "5, 2"),
        ],
        now,
    );
    let lines = read(
        200,
        &[
            ("x-ratelimit-remaining", "4"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "5"),
            ("x-ratelimit-reset", "2"),
        ],
        now,
    );
    assert_eq!(joined.left(), lines.left());
    assert_eq!(joined.left()[0].remaining, 0);
    assert_eq!(
        joined.left()[0].reset.map(|r| r.at_most()),
        Some(Duration::from_secs(5))
    );
    // A member that cannot be read is skipped, the others still count.
    let partial = read(200, &[("ratelimit-remaining", "soon, 3")], now);
    assert_eq!(partial.left()[0].remaining, 3);
}
