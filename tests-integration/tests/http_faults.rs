//! The HTTP layer under hostile input and at its edges, behind a real axum server on
//! 127.0.0.1 with a real hyper client: a full key table in wait mode, several
//! limits refusing at once, a keyless bucket no client can name, quotas at the end of
//! time, limit names that need escaping. Each test failed on the code before its fix.

use std::time::{Duration, Instant};

use http::StatusCode;
use paceline::clock::ManualClock;
use paceline::http::{ClientKey, KeySource, Limit, MissingKey, RateLimitLayer, TableFull};
use paceline::Quota;

#[path = "support/http_server.rs"]
mod http_server;
use http_server::{api_key, get_plain, per_ip, send, serve, serve_router};

fn with_key(key: String) -> impl FnOnce(http::request::Builder) -> http::request::Builder {
    move |b| b.header("x-api-key", key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_in_wait_mode_a_full_key_table_lets_no_key_through_unlimited() {
    // 2/s with burst 1 per key, a table bounded to about 2 keys and full of limited ones.
    let limit =
        Limit::new("per-key", Quota::per_second(2).with_burst(1), api_key()).with_max_keys(2);
    for i in 0..200 {
        let _ = limit
            .limiter()
            .unwrap()
            .check_key(&ClientKey::Text(format!("filler-{i}").into()));
    }
    let layer = RateLimitLayer::new()
        .limit(limit)
        .wait_up_to(Duration::from_millis(700));
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let addr = serve_router(app).await;
    let start = Instant::now();
    let requests: Vec<_> = (0..10)
        .map(|_| tokio::spawn(send(addr, with_key("newcomer".into()))))
        .collect();
    let mut passed = 0;
    for request in requests {
        if request.await.unwrap().status == StatusCode::OK {
            passed += 1;
        }
    }
    // Within the 0.7 s the requests may wait (plus the slot's wait), 2/s with burst 1
    // admits at most 2.
    assert!(
        passed <= 2,
        "{passed} of 10 passed in {:?} for one key at 2/s, burst 1",
        start.elapsed()
    );
}

#[tokio::test]
async fn retry_after_is_the_longest_wait_among_the_limits() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default()
        .limit(per_ip(&clock, Quota::per_second(1)))
        .limit(Limit::with_clock(
            "global",
            Quota::per_minute(1),
            KeySource::global(),
            clock.clone(),
        ));
    let addr = serve(layer).await;
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    let refused = get_plain(addr).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), "60");
    // A client that obeys is admitted.
    clock.advance(Duration::from_secs(60));
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_keyless_bucket_is_a_key_no_client_can_name() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default()
        .limit(Limit::with_clock(
            "per-key",
            Quota::per_hour(1),
            api_key(),
            clock.clone(),
        ))
        .on_missing_key(MissingKey::Shared);
    let addr = serve(layer).await;
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    assert_eq!(
        get_plain(addr).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "keyless requests share one bucket"
    );
    for name in ["<no key>", "", "keyless", "\\0keyless"] {
        assert_eq!(
            send(addr, with_key(name.into())).await.status,
            StatusCode::OK,
            "a client sending {name:?} shares the keyless bucket"
        );
    }
}

#[tokio::test]
async fn a_burst_window_past_the_end_of_time_gets_fields_not_a_panic() {
    let clock = ManualClock::new();
    let quota = Quota::try_new(1, Duration::from_secs(5_000_000_000))
        .unwrap()
        .with_burst(u32::MAX);
    let layer = RateLimitLayer::default()
        .limit(per_ip(&clock, quota))
        .headers_on_success(true);
    let addr = serve(layer).await;
    let reply = get_plain(addr).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply
        .header("ratelimit-policy")
        .starts_with("\"per-ip\";q="));
}

#[tokio::test]
async fn limit_names_are_escaped_or_refused() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default()
        .limit(Limit::with_clock(
            r#"a "quoted" \ name"#,
            Quota::per_hour(1),
            KeySource::global(),
            clock.clone(),
        ))
        .headers_on_success(true);
    let addr = serve(layer).await;
    let reply = get_plain(addr).await;
    assert_eq!(
        reply.header("ratelimit-policy"),
        r#""a \"quoted\" \\ name";q=1;w=3600"#
    );
    assert_eq!(
        reply.header("ratelimit"),
        r#""a \"quoted\" \\ name";r=0;t=3600"#
    );
    for bad in ["", "new\nline", "tab\there", "café", &"x".repeat(65)] {
        let err = Limit::try_new(bad, Quota::per_hour(1), KeySource::global()).unwrap_err();
        assert!(err.to_string().contains("printable ASCII"), "{err}");
    }
    let panicked = std::panic::catch_unwind(|| {
        Limit::new("new\nline", Quota::per_hour(1), KeySource::global())
    });
    assert!(panicked.is_err());
}

/// What a refusal's fields say for `key`, from one reading of its state.
fn fields_of(limit: &Limit<ManualClock>, key: &str) -> (String, String) {
    let state = limit
        .limiter()
        .unwrap()
        .snapshot_key(&ClientKey::Text(key.to_owned().into()));
    let ceil = |d: Duration| d.as_nanos().div_ceil(1_000_000_000);
    (
        format!(
            "\"per-key\";r={};t={}",
            state.remaining(),
            ceil(state.until_full())
        ),
        ceil(state.until_next()).max(1).to_string(),
    )
}

#[tokio::test]
async fn a_refusal_tells_the_keys_state_when_it_is_spent_and_when_the_table_is_full() {
    let clock = ManualClock::new();
    let limit = Limit::with_clock(
        "per-key",
        Quota::per_minute(3).with_burst(2),
        api_key(),
        clock.clone(),
    )
    .with_max_keys(2);
    let addr = serve(RateLimitLayer::default().limit(limit.clone())).await;
    let get = |key: &str| send(addr, with_key(key.to_owned()));

    // A spent key, at several instants between its cells.
    assert_eq!(get("a").await.status, StatusCode::OK);
    assert_eq!(get("a").await.status, StatusCode::OK);
    for step in [0, 7_300, 12_000, 699] {
        clock.advance(Duration::from_millis(step));
        let refused = get("a").await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        let (state, retry_after) = fields_of(&limit, "a");
        assert_eq!(refused.header("ratelimit"), state, "{step} ms on");
        assert_eq!(refused.header("retry-after"), retry_after, "{step} ms on");
    }

    // A newcomer refused because the table is full of spent keys spent nothing: it is told
    // the server is busy (503) until a slot frees, with no RateLimit field saying it has
    // nothing left.
    for i in 0..200 {
        let filler = ClientKey::Text(format!("filler-{i}").into());
        let _ = limit.limiter().unwrap().check_key_n(&filler, 2);
    }
    let refused = get("newcomer").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    let (_, retry_after) = fields_of(&limit, "newcomer");
    assert_eq!(refused.header("retry-after"), retry_after);
    assert_eq!(
        refused.header("ratelimit"),
        "<none>",
        "a spent quota it never touched"
    );
    assert!(
        refused.body.contains("as many clients as it has room for"),
        "{}",
        refused.body
    );
}

#[tokio::test]
async fn a_full_key_table_answers_503_or_lets_newcomers_through_as_configured() {
    let clock = ManualClock::new();
    let fill = |limit: &Limit<ManualClock>| {
        for i in 0..200 {
            let filler = ClientKey::Text(format!("filler-{i}").into());
            let _ = limit.limiter().unwrap().check_key(&filler);
        }
    };
    let quota = Quota::per_hour(1);
    let unavailable =
        Limit::with_clock("per-key", quota, api_key(), clock.clone()).with_max_keys(2);
    fill(&unavailable);
    let admit = Limit::with_clock("per-key", quota, api_key(), clock.clone())
        .with_max_keys(2)
        .when_table_full(TableFull::Admit);
    fill(&admit);
    for (limit, expected) in [
        (unavailable, StatusCode::SERVICE_UNAVAILABLE),
        (admit, StatusCode::OK),
    ] {
        for wait in [None, Some(Duration::from_millis(50))] {
            let mut layer = RateLimitLayer::default().limit(limit.clone());
            if let Some(wait) = wait {
                layer = layer.wait_up_to(wait);
            }
            let addr = serve(layer).await;
            let reply = send(addr, with_key("newcomer".into())).await;
            assert_eq!(reply.status, expected, "wait mode {wait:?}");
            assert_eq!(reply.header("ratelimit"), "<none>");
            // A stored key is still limited, whatever the policy.
            let spent = send(addr, with_key("filler-0".into())).await;
            assert_ne!(spent.status, StatusCode::OK);
        }
    }
}

#[tokio::test]
async fn a_request_costs_its_limit_what_the_limit_says_and_one_over_the_burst_never_passes() {
    let clock = ManualClock::new();
    let limit = Limit::with_clock("per-key", Quota::per_hour(10), api_key(), clock.clone())
        .cost_fn(|head| {
            head.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        });
    for wait in [None, Some(Duration::from_millis(20))] {
        let mut layer = RateLimitLayer::default().limit(limit.clone());
        if let Some(wait) = wait {
            layer = layer.wait_up_to(wait);
        }
        let addr = serve(layer).await;
        let key = format!("k-{wait:?}");
        let get = |cost: &str| {
            let (key, cost) = (key.clone(), cost.to_owned());
            send(addr, move |b| {
                b.header("x-api-key", key).header("x-cost", cost)
            })
        };
        // 10 cells: 4 + 4 pass, then 4 more do not, while 2 do.
        assert_eq!(get("4").await.status, StatusCode::OK, "{wait:?}");
        assert_eq!(get("4").await.status, StatusCode::OK, "{wait:?}");
        let refused = get("4").await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{wait:?}");
        // Its wait is for the 2 cells it lacks (a cell every 360 s), not for the next one.
        assert_eq!(refused.header("retry-after"), "720", "{wait:?}");
        assert_eq!(get("2").await.status, StatusCode::OK, "{wait:?}");
        // None left: the 4 cells it needs, not the prebuilt refusal's one.
        assert_eq!(get("4").await.header("retry-after"), "1440", "{wait:?}");
        // More than the burst can never pass, and the refusal says so (no Retry-After).
        let never = get("11").await;
        assert_eq!(never.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(never.header("retry-after"), "<none>");
        assert!(
            never.body.contains("can never be admitted"),
            "{}",
            never.body
        );
        // A free request passes even now.
        assert_eq!(get("0").await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn a_limit_applies_only_when_it_says_and_some_clients_have_quotas_of_their_own() {
    let clock = ManualClock::new();
    let writes = Limit::with_clock("writes", Quota::per_hour(1), api_key(), clock.clone())
        .only_when(|head| head.method() == http::Method::POST)
        .quota_for(|key| match key {
            ClientKey::Text(k) if k.starts_with("paid-") => Some(Quota::per_hour(3)),
            _ => None,
        });
    let app = axum::Router::new()
        .route("/", axum::routing::any(|| async { "ok" }))
        .layer(RateLimitLayer::default().limit(writes));
    let addr = serve_router(app).await;
    let call = |method: http::Method, key: &'static str| {
        send(addr, move |b| b.method(method).header("x-api-key", key))
    };
    // Reads are not limited at all; writes are, per key, with the paid tier's quota.
    for _ in 0..5 {
        assert_eq!(
            call(http::Method::GET, "free-1").await.status,
            StatusCode::OK
        );
    }
    // The free tier's one write an hour, the paid tier's three, then a refusal naming each.
    for (key, allowed, policy) in [
        ("free-1", 1, "\"writes\";q=1;w=3600"),
        ("paid-1", 3, "\"writes\";q=3;w=3600"),
    ] {
        for _ in 0..allowed {
            assert_eq!(call(http::Method::POST, key).await.status, StatusCode::OK);
        }
        let refused = call(http::Method::POST, key).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{key}");
        assert_eq!(refused.header("ratelimit-policy"), policy);
    }
}
