//! The tower middleware behind a real axum server on 127.0.0.1, driven by a real hyper
//! client: status codes and exact header values (on a manual clock), per-key isolation,
//! trusted proxies, IPv6 grouping, several limits, exemptions, gRPC, waiting with client
//! disconnects, and the GCRA bound over a window of real time.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use paceline::clock::ManualClock;
use paceline::http::{KeySource, Limit, MissingKey, RateLimitLayer};
use paceline::Quota;

#[path = "support/http_server.rs"]
mod http_server;
use http_server::{api_key, client, get_plain, per_ip, per_key, send, serve, serve_router, Reply};

/// Asserts that `refused` is the `per-ip` limit's default 429 (no cell left) for
/// `Retry-After: retry_after` and `t` seconds until full, under the policy item `policy`
/// (`q=..;w=..`): every field and the body. `at` names the moment in a failure.
fn assert_default_refusal(refused: &Reply, retry_after: u64, t: u64, policy: &str, at: &str) {
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{at}");
    assert_eq!(
        refused.header("retry-after"),
        retry_after.to_string(),
        "{at}"
    );
    assert_eq!(
        refused.header("ratelimit"),
        format!("\"per-ip\";r=0;t={t}"),
        "{at}"
    );
    assert_eq!(
        refused.header("ratelimit-policy"),
        format!("\"per-ip\";{policy}"),
        "{at}"
    );
    assert_eq!(
        refused.header("content-type"),
        "text/plain; charset=utf-8",
        "{at}"
    );
    assert_eq!(
        refused.body,
        format!("Too Many Requests: limit \"per-ip\", retry in {retry_after} s\n"),
        "{at}"
    );
}

#[tokio::test]
async fn refusals_are_429_with_retry_after_rounded_up_and_ratelimit_fields() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default()
        .limit(per_ip(&clock, Quota::per_second(1).with_burst(2)))
        .headers_on_success(true);
    let addr = serve(layer).await;
    let first = get_plain(addr).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("ratelimit-policy"), "\"per-ip\";q=2;w=2");
    assert_eq!(first.header("ratelimit"), "\"per-ip\";r=1;t=1");
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    assert_default_refusal(&get_plain(addr).await, 1, 2, "q=2;w=2", "after the burst");
    // 0.9 s to wait: rounded up to 1, never down to 0 (the retry would come too early).
    clock.advance(Duration::from_millis(100));
    let refused = get_plain(addr).await;
    assert_eq!(refused.header("retry-after"), "1");
    assert_eq!(refused.header("ratelimit"), "\"per-ip\";r=0;t=2");
    clock.advance(Duration::from_millis(900));
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
}

/// In wait mode a request that cannot be admitted within the maximum is refused at once,
/// with the same fields and body as a refusal without waiting (the cached refusal, read
/// from the key's state after the booking failed).
#[tokio::test]
async fn wait_mode_refuses_past_its_maximum_with_the_usual_refusal() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default()
        .limit(per_ip(&clock, Quota::per_second(1)))
        .wait_up_to(Duration::from_millis(500));
    let addr = serve(layer).await;
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    // The next cell is 1 s away, past the 0.5 s a request may wait.
    assert_default_refusal(&get_plain(addr).await, 1, 1, "q=1;w=1", "past the maximum");
}

/// The usual refusal is cached per `Retry-After` and `t`; with a burst window that is not
/// whole seconds, `t` is sometimes one more than `Retry-After` plus the window's whole
/// seconds, and each refusal still carries its own values, the same as a snapshot's.
#[tokio::test]
async fn cached_refusals_carry_their_own_wait_and_time_until_full() {
    let clock = ManualClock::new();
    // 1.5 s an interval, a burst of 2: full 1.5 s after the next cell.
    let layer =
        RateLimitLayer::default().limit(per_ip(&clock, Quota::per_minute(40).with_burst(2)));
    let addr = serve(layer).await;
    for _ in 0..2 {
        assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    }
    // (elapsed ms, Retry-After, t): the next cell at 1.5 s, full at 3 s.
    let mut now = 0;
    for (at, retry_after, t) in [
        (0, 2, 3),
        (200, 2, 3),
        (700, 1, 3),
        (1_400, 1, 2),
        (1_499, 1, 2),
    ] {
        clock.advance(Duration::from_millis(at - now));
        now = at;
        for _ in 0..2 {
            let refused = get_plain(addr).await;
            assert_default_refusal(&refused, retry_after, t, "q=2;w=3", &format!("{at} ms"));
        }
    }
    clock.advance(Duration::from_millis(1_500 - now));
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
}

#[tokio::test]
async fn each_key_has_its_own_budget() {
    let clock = ManualClock::new();
    let by_key = per_key(&clock, Quota::per_hour(1));
    let addr = serve(RateLimitLayer::default().limit(by_key)).await;
    let with_key = |key: &'static str| move |b: http::request::Builder| b.header("x-api-key", key);
    assert_eq!(send(addr, with_key("a")).await.status, StatusCode::OK);
    assert_eq!(
        send(addr, with_key("a")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(addr, with_key("b")).await.status, StatusCode::OK);
    // No header: counted under one shared key by default, so it is limited too.
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    assert_eq!(get_plain(addr).await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_request_without_a_key_can_be_refused_instead() {
    let clock = ManualClock::new();
    let by_key = per_key(&clock, Quota::per_hour(1));
    let layer = RateLimitLayer::default()
        .limit(by_key)
        .on_missing_key(MissingKey::Refuse(StatusCode::BAD_REQUEST));
    let addr = serve(layer).await;
    assert_eq!(get_plain(addr).await.status, StatusCode::BAD_REQUEST);
}

/// The status of a request to `addr` that says it was forwarded for `chain`
/// (`X-Forwarded-For`).
async fn forwarded_for(addr: std::net::SocketAddr, chain: &'static str) -> StatusCode {
    let header = move |b: http::request::Builder| b.header("x-forwarded-for", chain);
    send(addr, header).await.status
}

#[tokio::test]
async fn only_trusted_proxies_are_believed_and_the_spoofed_left_is_ignored() {
    let clock = ManualClock::new();
    // The test client connects from 127.0.0.1: trusted here, so X-Forwarded-For counts.
    let behind_lb = Limit::with_clock(
        "per-ip",
        Quota::per_hour(1),
        KeySource::behind_proxies([
            "127.0.0.0/8".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ]),
        clock.clone(),
    );
    let addr = serve(RateLimitLayer::default().limit(behind_lb)).await;
    assert_eq!(
        forwarded_for(addr, "6.6.6.6, 1.2.3.4, 10.0.0.9").await,
        StatusCode::OK
    );
    // The client rewrote its left-most entry: still 1.2.3.4, still limited.
    assert_eq!(
        forwarded_for(addr, "7.7.7.7, 1.2.3.4").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(forwarded_for(addr, "1.2.3.5").await, StatusCode::OK);
    // These proxies write X-Forwarded-For: a `Forwarded` header is the client's own, and
    // naming another address in it changes nothing (1.2.3.4 is still limited).
    let both = |b: http::request::Builder| {
        b.header("forwarded", "for=8.8.8.8")
            .header("x-forwarded-for", "1.2.3.4")
    };
    assert_eq!(send(addr, both).await.status, StatusCode::TOO_MANY_REQUESTS);
    // A byte that is not UTF-8 in the client's part of the chain makes it no less keyed.
    let obs = |b: http::request::Builder| {
        b.header(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff, 1.2.3.4").unwrap(),
        )
    };
    assert_eq!(send(addr, obs).await.status, StatusCode::TOO_MANY_REQUESTS);
    // An untrusted peer is keyed by itself, whatever it claims: without trust, 127.0.0.1
    // is the key and its claims change nothing.
    let direct = per_ip(&clock, Quota::per_hour(1));
    let addr = serve(RateLimitLayer::default().limit(direct)).await;
    assert_eq!(forwarded_for(addr, "1.1.1.1").await, StatusCode::OK);
    assert_eq!(
        forwarded_for(addr, "2.2.2.2").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn ipv6_clients_are_grouped_by_prefix() {
    let clock = ManualClock::new();
    let by_64 = Limit::with_clock(
        "per-ip",
        Quota::per_hour(1),
        KeySource::behind_proxies(["127.0.0.0/8".parse().unwrap()]),
        clock.clone(),
    );
    let addr = serve(RateLimitLayer::default().limit(by_64)).await;
    assert_eq!(forwarded_for(addr, "2001:db8:1:2::a").await, StatusCode::OK);
    // Another address of the same /64: the same client.
    assert_eq!(
        forwarded_for(addr, "2001:db8:1:2:ffff::b").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(forwarded_for(addr, "2001:db8:1:3::a").await, StatusCode::OK);
    // With /128, every address is its own client.
    let by_128 = Limit::with_clock(
        "per-ip",
        Quota::per_hour(1),
        KeySource::behind_proxies(["127.0.0.0/8".parse().unwrap()]).ipv6_prefix(128),
        clock,
    );
    let addr = serve(RateLimitLayer::default().limit(by_128)).await;
    assert_eq!(forwarded_for(addr, "2001:db8::a").await, StatusCode::OK);
    assert_eq!(forwarded_for(addr, "2001:db8::b").await, StatusCode::OK);
}

#[tokio::test]
async fn a_refusal_by_a_later_limit_spends_nothing_from_the_earlier() {
    let clock = ManualClock::new();
    let per_key = per_key(&clock, Quota::per_hour(1));
    let global = Limit::with_clock(
        "global",
        Quota::per_second(1),
        KeySource::global(),
        clock.clone(),
    );
    let addr = serve(RateLimitLayer::default().limit(per_key).limit(global)).await;
    let with_key = |key: &'static str| move |b: http::request::Builder| b.header("x-api-key", key);
    assert_eq!(send(addr, with_key("x")).await.status, StatusCode::OK);
    let refused = send(addr, with_key("y")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.header("retry-after") == "1");
    assert!(refused.header("ratelimit").contains("\"global\";r=0"));
    // y's hourly cell was given back when the global limit refused: after a second, y
    // passes (had it been spent, y would wait an hour).
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(addr, with_key("y")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn in_wait_mode_a_refusal_by_a_later_limit_gives_the_earlier_cells_back() {
    let clock = ManualClock::new();
    let header = api_key();
    // Per key: 10 per second, burst 1 (a second request books 100 ms ahead); then the
    // whole service: 1 per hour. Requests may wait up to 5 s.
    let per_key = Limit::with_clock(
        "per-key",
        Quota::per_second(10).with_burst(1),
        header,
        clock.clone(),
    );
    let global = Limit::with_clock(
        "global",
        Quota::per_hour(1),
        KeySource::global(),
        clock.clone(),
    );
    let layer = RateLimitLayer::default()
        .limit(per_key.clone())
        .limit(global)
        .wait_up_to(Duration::from_secs(5));
    let addr = serve(layer).await;
    let with_key = |key: &'static str| move |b: http::request::Builder| b.header("x-api-key", key);
    let key = |k: &str| paceline::http::ClientKey::Text(k.into());
    assert_eq!(send(addr, with_key("x")).await.status, StatusCode::OK);
    // x's per-key cell is booked 100 ms ahead, then the global limit refuses (an hour):
    // the booking is cancelled, and x's state is back to what the first request left.
    let after_first = per_key
        .limiter()
        .unwrap()
        .snapshot_key(&key("x"))
        .until_full();
    let refused = send(addr, with_key("x")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), "3600");
    assert_eq!(
        per_key
            .limiter()
            .unwrap()
            .snapshot_key(&key("x"))
            .until_full(),
        after_first,
        "the booked per-key cell was not given back"
    );
    // y's per-key cell is admitted at once, then the global limit refuses: undone.
    assert_eq!(
        send(addr, with_key("y")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        per_key.limiter().unwrap().remaining_key(&key("y")),
        1,
        "y's cell was spent"
    );
}

#[tokio::test]
async fn the_refusal_body_is_configurable() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default()
        .limit(per_ip(&clock, Quota::per_hour(1)))
        .refusal_body(
            http::HeaderValue::from_static("application/json"),
            |refusal| {
                format!(
                    r#"{{"limit":"{}","retry_after":{},"wait_ms":{}}}"#,
                    refusal.limit(),
                    refusal.retry_after_secs(),
                    refusal.wait().as_millis()
                )
            },
        );
    let addr = serve(layer).await;
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    let request = Request::get(format!("http://{addr}/"))
        .body(Body::empty())
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        r#"{"limit":"per-ip","retry_after":3600,"wait_ms":3600000}"#
    );
}

#[tokio::test]
async fn options_requests_are_exempt_by_default() {
    let clock = ManualClock::new();
    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).options(|| async { "preflight" }),
        )
        .layer(RateLimitLayer::default().limit(per_ip(&clock, Quota::per_hour(1))));
    let addr = serve_router(app).await;
    for _ in 0..3 {
        assert_eq!(
            send(addr, |b| b.method(Method::OPTIONS)).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    assert_eq!(get_plain(addr).await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn grpc_requests_get_resource_exhausted() {
    let clock = ManualClock::new();
    let addr = serve(RateLimitLayer::default().limit(per_ip(&clock, Quota::per_hour(1)))).await;
    let grpc = |b: http::request::Builder| b.header("content-type", "application/grpc");
    assert_eq!(send(addr, grpc).await.status, StatusCode::OK);
    let refused = send(addr, grpc).await;
    assert_eq!(
        refused.status,
        StatusCode::OK,
        "gRPC carries errors in grpc-status"
    );
    assert_eq!(refused.header("grpc-status"), "8");
    assert_eq!(refused.header("content-type"), "application/grpc");
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn realtime_waiting_mode_proceeds_in_turn_and_a_client_that_leaves_gives_its_cell_back() {
    multi_thread().block_on(async {
        let patient = |quota| {
            let limit = Limit::new("per-ip", quota, KeySource::peer_ip());
            let layer = RateLimitLayer::new()
                .limit(limit.clone())
                .wait_up_to(Duration::from_secs(5));
            (
                limit,
                Router::new()
                    .route("/", get(|| async { "ok" }))
                    .layer(layer),
            )
        };
        let (_, app) = patient(Quota::per_second(10).with_burst(1));
        let addr = serve_router(app).await;
        assert_eq!(get_plain(addr).await.status, StatusCode::OK);
        // The next one waits its turn (about 100 ms) instead of a 429.
        let start = Instant::now();
        assert_eq!(get_plain(addr).await.status, StatusCode::OK);
        assert!(
            start.elapsed() >= Duration::from_millis(80),
            "{:?}",
            start.elapsed()
        );

        // One per second: the first passes, the second books 1 s ahead (the bucket then
        // full 2 s from now) and its client gives up after 50 ms.
        let (limit, app) = patient(Quota::per_second(1).with_burst(1));
        let addr = serve_router(app).await;
        assert_eq!(get_plain(addr).await.status, StatusCode::OK);
        let gone = tokio::time::timeout(Duration::from_millis(50), get_plain(addr)).await;
        assert!(gone.is_err(), "the request was still waiting");
        // The server notices the closed connection and drops the waiting request, which
        // gives its booking back: the bucket is then full 1 s after the first request,
        // not 2 s. Without the refund it would read over 1.4 s for the next half second.
        let key = paceline::http::ClientKey::Ip("127.0.0.1".parse().unwrap());
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut until_full = Duration::MAX;
        while Instant::now() < deadline {
            until_full = limit.limiter().unwrap().snapshot_key(&key).until_full();
            if until_full < Duration::from_millis(1_000) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            until_full < Duration::from_millis(1_000),
            "the departed client's cell was not given back ({until_full:?} until full)"
        );
    });
}

#[test]
fn realtime_the_number_of_200s_over_a_window_is_the_gcra_bound() {
    multi_thread().block_on(async {
        // 20 per second, burst 5; requests back to back for about a second.
        let layer = RateLimitLayer::new().limit(Limit::new(
            "per-ip",
            Quota::per_second(20).with_burst(5),
            KeySource::peer_ip(),
        ));
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let addr = serve_router(app).await;
        let client = client();
        let start = Instant::now();
        let mut ok = 0u64;
        let mut sent = 0u64;
        while start.elapsed() < Duration::from_millis(1_000) && sent < 20_000 {
            let request = Request::get(format!("http://{addr}/"))
                .body(Body::empty())
                .unwrap();
            let response = client.request(request).await.unwrap();
            if response.status() == StatusCode::OK {
                ok += 1;
            }
            let _ = response.into_body().collect().await;
            sent += 1;
        }
        let elapsed = start.elapsed();
        // GCRA: at most burst + elapsed / T cells in the window (T = 50 ms); and, with
        // requests arriving far faster than the rate, at least that minus one interval's
        // worth lost at each end.
        let bound = 5 + (elapsed.as_millis() as u64) / 50;
        assert!(ok <= bound, "{ok} admitted, bound {bound} over {elapsed:?}");
        assert!(
            ok + 2 >= bound,
            "{ok} admitted, bound {bound} over {elapsed:?} ({sent} sent)"
        );
    });
}

#[tokio::test]
async fn a_plain_hyper_service_with_full_bytes_bodies() {
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::ServiceBuilder;

    // No framework: hyper serves a tower service; the layer reads the peer address from
    // a `SocketAddr` extension the connection loop adds, and writes its refusal into the
    // service's own `Full<Bytes>` body.
    let clock = ManualClock::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limit = per_ip(&clock, Quota::per_hour(1));
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::default().limit(limit.clone()))
        .service_fn(|_request: Request<hyper::body::Incoming>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("ok"))))
        });
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = service.clone();
            let per_connection = tower::ServiceExt::map_request(
                service,
                move |mut request: Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(peer);
                    request
                },
            );
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                hyper_util::rt::TokioIo::new(stream),
                hyper_util::service::TowerToHyperService::new(per_connection),
            ));
        }
    });
    assert_eq!(get_plain(addr).await.status, StatusCode::OK);
    let request = Request::get(format!("http://{addr}/"))
        .body(Body::empty())
        .unwrap();
    let refused = client().request(request).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "3600");
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(std::str::from_utf8(&body)
        .unwrap()
        .starts_with("Too Many Requests"));
    // Counted under the peer address, not the keyless key.
    let peer = paceline::http::ClientKey::Ip("127.0.0.1".parse().unwrap());
    assert_eq!(limit.limiter().unwrap().remaining_key(&peer), 0);
}
