//! The `metrics` feature, as an operator sees it: one Prometheus recorder for this test
//! binary (the facade takes one per process), real servers on loopback (axum, and a real
//! `redis-server` that goes away), and the counts read back from the exporter's text,
//! including a scrape of the example server's own `/metrics` endpoint. Each test uses
//! limit names of its own, so they share the recorder without sharing counts.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use paceline::clock::ManualClock;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::redis::{FailurePolicy, RedisDenied};
use paceline::Quota;

#[path = "support/http_server.rs"]
mod http_server;
use http_server::{client, send, serve, serve_real, serve_router};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

#[path = "../examples/support/app.rs"]
mod app;

fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .expect("the only recorder of this test binary")
        })
        .clone()
}

/// The value of the sample `name{labels}` in Prometheus text, 0 if absent.
fn sample(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0.0, |value| value.trim().parse().expect("a number"))
}

fn header_key() -> KeySource {
    KeySource::header(http::HeaderName::from_static("x-client"))
}

async fn get_as(addr: SocketAddr, client_name: &str) -> StatusCode {
    let name = client_name.to_owned();
    send(addr, move |b| b.header("x-client", name)).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_servers_metrics_endpoint_shows_what_it_admitted_and_refused() {
    let addr = serve_router(app::app(prometheus())).await;
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(send(addr, |b| b).await.status);
    }
    // 5/s with bursts of 10 per client: the first 10 pass (within the test's fraction of
    // a second), the 11th and 12th are refused by "per-ip".
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!(admitted >= 10, "{statuses:?}");
    let request = http::Request::get(format!("http://{addr}/metrics"))
        .body(axum::body::Body::empty())
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let per_ip = |name| sample(&text, name, "limit=\"per-ip\"");
    assert_eq!(per_ip("paceline_admitted_total"), admitted as f64, "{text}");
    assert_eq!(
        per_ip("paceline_refused_total"),
        (12 - admitted) as f64,
        "{text}"
    );
    assert_eq!(per_ip("paceline_keys"), 1.0, "{text}");
    // "global" sees only what "per-ip" let through.
    let global = |name| sample(&text, name, "limit=\"global\"");
    assert_eq!(global("paceline_admitted_total"), admitted as f64, "{text}");
    assert_eq!(global("paceline_refused_total"), 0.0, "{text}");
    assert!(text.contains("# HELP paceline_refused_total"), "{text}");
}

#[tokio::test]
async fn counts_follow_a_known_sequence_of_admissions_and_refusals() {
    let prometheus = prometheus();
    let clock = ManualClock::new();
    // Every request needs both: "seq-a" 1/s with bursts of 3, "seq-b" 2 a minute.
    let layer = RateLimitLayer::default()
        .limit(Limit::with_clock(
            "seq-a",
            Quota::per_second(1).with_burst(3),
            KeySource::global(),
            clock.clone(),
        ))
        .limit(Limit::with_clock(
            "seq-b",
            Quota::per_minute(2),
            KeySource::global(),
            clock.clone(),
        ));
    let addr = serve(layer).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(send(addr, |b| b).await.status);
    }
    clock.advance(Duration::from_secs(30)); // one more for "seq-b"
    for _ in 0..2 {
        statuses.push(send(addr, |b| b).await.status);
    }
    let ok = StatusCode::OK;
    let no = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(statuses, [ok, ok, no, no, no, ok, no]);
    let text = prometheus.render();
    let count = |name, limit| sample(&text, name, &format!("limit=\"{limit}\""));
    // Admitted by both: 3 requests. Refused: 4, all by "seq-b" ("seq-a" gave its cells
    // back and counts no refusal).
    assert_eq!(count("paceline_admitted_total", "seq-a"), 3.0, "{text}");
    assert_eq!(count("paceline_admitted_total", "seq-b"), 3.0, "{text}");
    assert_eq!(count("paceline_refused_total", "seq-a"), 0.0, "{text}");
    assert_eq!(count("paceline_refused_total", "seq-b"), 4.0, "{text}");
    assert_eq!(count("paceline_waited_total", "seq-b"), 0.0, "{text}");
}

#[tokio::test]
async fn the_key_gauge_is_read_at_most_once_a_second() {
    let prometheus = prometheus();
    let clock = ManualClock::new();
    let layer = RateLimitLayer::default().limit(Limit::with_clock(
        "seq-keys",
        Quota::per_second(10),
        header_key(),
        clock.clone(),
    ));
    let addr = serve(layer).await;
    for client_name in ["x", "y", "z"] {
        assert_eq!(get_as(addr, client_name).await, StatusCode::OK);
    }
    let keys = || sample(&prometheus.render(), "paceline_keys", "limit=\"seq-keys\"");
    // Read with the first request, when one key was stored; not again within the second.
    assert_eq!(keys(), 1.0);
    clock.advance(Duration::from_millis(1_500));
    assert_eq!(get_as(addr, "x").await, StatusCode::OK);
    assert_eq!(keys(), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_are_counted_with_their_waits() {
    let prometheus = prometheus();
    // 10 a second, one at a time; requests wait up to 2 s for their turn.
    let waits = RateLimitLayer::new()
        .limit(Limit::new(
            "waits",
            Quota::per_second(10).with_burst(1),
            KeySource::global(),
        ))
        .wait_up_to(Duration::from_secs(2));
    let addr = serve_real(waits).await;
    let requests: Vec<_> = (0..5).map(|_| tokio::spawn(send(addr, |b| b))).collect();
    for request in requests {
        assert_eq!(request.await.unwrap().status, StatusCode::OK);
    }
    let text = prometheus.render();
    let count = |name| sample(&text, name, "limit=\"waits\"");
    let (admitted, waited) = (
        count("paceline_admitted_total"),
        count("paceline_waited_total"),
    );
    assert_eq!(admitted + waited, 5.0, "{text}");
    // Sent together, at most one finds the cell free (a loaded machine may space them).
    assert!(waited >= 3.0, "{text}");
    assert_eq!(count("paceline_wait_seconds_count"), waited, "{text}");
    // Each waited a whole number of turns of 100 ms: at least 100 ms, at most 400 ms.
    let sum = count("paceline_wait_seconds_sum");
    assert!(sum >= 0.1 * waited - 0.05 && sum <= 0.4 * waited, "{text}");

    // A turn further than the wait allows is refused, and counted so.
    let refusing = RateLimitLayer::new()
        .limit(Limit::new(
            "waits-refused",
            Quota::per_minute(1),
            KeySource::global(),
        ))
        .wait_up_to(Duration::from_millis(100));
    let addr = serve_real(refusing).await;
    assert_eq!(send(addr, |b| b).await.status, StatusCode::OK);
    assert_eq!(
        send(addr, |b| b).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let text = prometheus.render();
    let count = |name| sample(&text, name, "limit=\"waits-refused\"");
    assert_eq!(count("paceline_admitted_total"), 1.0, "{text}");
    assert_eq!(count("paceline_refused_total"), 1.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_limiter_counts_decisions_failures_and_what_its_policy_decided() {
    let prometheus = prometheus();
    let server = Server::start();
    let quota = Quota::per_minute(2);
    let closed = server.limiter(quota).await.with_prefix("metrics-closed");
    let open = server
        .limiter(quota)
        .await
        .with_prefix("metrics-open")
        .on_failure(FailurePolicy::FailOpen)
        .with_timeout(Duration::from_millis(200));
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for _ in 0..3 {
        let _ = closed.check_key("k").await;
    }
    // Something else wrote at the limiter's key: Redis answers with an error.
    let _: () = redis::cmd("HSET")
        .arg("metrics-open:{hash}")
        .arg("a")
        .arg("1")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(matches!(
        open.check_key("hash").await,
        Err(RedisDenied::Rejected(_))
    ));
    // Redis goes away: the policies decide.
    drop(server);
    assert!(matches!(
        closed.check_key("k2").await,
        Err(RedisDenied::Unavailable(_))
    ));
    assert!(open.check_key("k2").await.is_ok());
    assert!(open.check_key("k3").await.is_ok());

    let text = prometheus.render();
    let closed_count =
        |name, extra: &str| sample(&text, name, &format!("limit=\"metrics-closed\"{extra}"));
    let open_count =
        |name, extra: &str| sample(&text, name, &format!("limit=\"metrics-open\"{extra}"));
    // Two admitted and one refused by Redis, one refused by the policy.
    assert_eq!(closed_count("paceline_admitted_total", ""), 2.0, "{text}");
    assert_eq!(closed_count("paceline_refused_total", ""), 2.0, "{text}");
    assert_eq!(
        closed_count("paceline_redis_failures_total", ",kind=\"unreachable\""),
        1.0,
        "{text}"
    );
    assert_eq!(
        closed_count(
            "paceline_redis_policy_total",
            ",policy=\"fail_closed\",decision=\"refused\""
        ),
        1.0,
        "{text}"
    );
    // An answered error is a failure, not a policy decision; the outage admitted twice.
    assert_eq!(
        open_count("paceline_redis_failures_total", ",kind=\"rejected\""),
        1.0,
        "{text}"
    );
    assert_eq!(
        open_count("paceline_redis_failures_total", ",kind=\"unreachable\""),
        2.0,
        "{text}"
    );
    assert_eq!(
        open_count(
            "paceline_redis_policy_total",
            ",policy=\"fail_open\",decision=\"admitted\""
        ),
        2.0,
        "{text}"
    );
    assert_eq!(open_count("paceline_admitted_total", ""), 2.0, "{text}");
}
