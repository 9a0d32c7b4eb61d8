//! What a user sees when configuring the HTTP layer, on a real axum server: a server that
//! passes no peer address is loud, the policy field states the real rate, the legacy
//! `X-RateLimit-*` fields on request.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use paceline::clock::ManualClock;
use paceline::http::{KeySource, Limit, MissingKey, RateLimitLayer};
use paceline::Quota;

#[path = "support/http_server.rs"]
mod http_server;
use http_server::{client, get_plain, per_ip, serve};

/// Serves `app` the way the mistake is made: no connect info.
async fn serve_without_connect_info(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn get_text(addr: SocketAddr) -> (StatusCode, String) {
    let request = http::Request::get(format!("http://{addr}/"))
        .body(Body::empty())
        .unwrap();
    let response = client().request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_server_that_passes_no_peer_address_answers_500_naming_the_fix() {
    let layer = RateLimitLayer::new().limit(Limit::new(
        "per-ip",
        Quota::per_second(1),
        KeySource::peer_ip(),
    ));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let addr = serve_without_connect_info(app).await;
    let (status, body) = get_text(addr).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        body.contains("into_make_service_with_connect_info"),
        "{body}"
    );
    assert!(body.contains("MissingKey::Shared"), "{body}");
    // Sharing one bucket stays available, as an explicit choice.
    let shared = RateLimitLayer::new()
        .limit(Limit::new(
            "per-ip",
            Quota::per_hour(1),
            KeySource::peer_ip(),
        ))
        .on_missing_key(MissingKey::Shared);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(shared);
    let addr = serve_without_connect_info(app).await;
    assert_eq!(get_text(addr).await.0, StatusCode::OK);
    assert_eq!(get_text(addr).await.0, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_policy_states_the_real_rate_never_above_it() {
    let clock = ManualClock::new();
    for (quota, policy) in [
        (Quota::per_second(2).with_burst(3), "q=4;w=2"),
        (Quota::per_second(100).with_burst(1), "q=100;w=1"),
        (Quota::per_second(10).with_burst(20), "q=20;w=2"),
        (Quota::per_minute(1), "q=1;w=60"),
        (
            Quota::try_new(3, Duration::from_secs(7))
                .unwrap()
                .with_burst(1),
            // The burst window rounds up to 3 s, where 1 per 3 s would be 78 % of the
            // rate: the window grows to the 7 s in which the rate is a whole count.
            "q=3;w=7",
        ),
    ] {
        let layer = RateLimitLayer::default()
            .limit(per_ip(&clock, quota))
            .headers_on_success(true);
        let addr = serve(layer).await;
        let reply = get_plain(addr).await;
        assert_eq!(
            reply.header("ratelimit-policy"),
            format!("\"per-ip\";{policy}"),
            "{quota:?}"
        );
    }
}

#[tokio::test]
async fn legacy_fields_come_from_the_tightest_limit_on_request() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default()
        .limit(per_ip(&clock, Quota::per_minute(10)))
        .limit(Limit::with_clock(
            "global",
            Quota::per_second(1).with_burst(2),
            KeySource::global(),
            clock.clone(),
        ))
        .headers_on_success(true)
        .legacy_headers(true);
    let addr = serve(layer).await;
    let first = get_plain(addr).await;
    assert_eq!(first.status, StatusCode::OK);
    // per-ip: 9 left; global: 1 left, full in 1 s. The global limit is the tightest.
    assert_eq!(first.header("x-ratelimit-limit"), "2");
    assert_eq!(first.header("x-ratelimit-remaining"), "1");
    assert_eq!(first.header("x-ratelimit-reset"), "1");
    // Without asking, none.
    let plain = RateLimitLayer::default()
        .limit(per_ip(&clock, Quota::per_minute(10)))
        .headers_on_success(true);
    let addr = serve(plain).await;
    assert_eq!(get_plain(addr).await.header("x-ratelimit-limit"), "<none>");
}
