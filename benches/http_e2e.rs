//! The HTTP layer end to end: a real axum server on 127.0.0.1, driven by a load generator
//! on keep-alive connections with 10 000 client addresses behind a trusted proxy's
//! `X-Forwarded-For`, in interleaved rounds of the same run, in two regimes:
//!
//! - **admitted**: no layer, paceline's layer and tower_governor's, with quotas nothing
//!   reaches (every answer a 200);
//! - **flood**: every client over its limit (one request a minute), so every answer is a
//!   429 from paceline's or tower_governor's layer; beside them, the floor: a server with
//!   no layer whose handler answers every request with the same 429 (status, the four
//!   fields, the body), made once.
//!
//! Prints throughput and p99 latency per variant, and each variant's cost per request
//! against its regime's layerless server.
//!
//! `cargo bench -p paceline-benches --bench http_e2e` (`PACELINE_BENCH_ROUNDS`, default 3;
//! `PACELINE_HTTP_SECONDS` per round and variant, default 2; `PACELINE_HTTP_CONNECTIONS`,
//! default 32). Loopback only, bounded in time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

mod common;

#[path = "../tests-integration/tests/support/http_server.rs"]
mod http_server;
use http_server::serve_router;

const CLIENTS: u32 = 10_000;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// A variant: its name, its server, the status it answers, and the variant it is
/// measured against.
struct Variant {
    name: &'static str,
    app: Router,
    status: u16,
    against: &'static str,
}

fn variants() -> Vec<Variant> {
    let behind_proxy =
        || paceline::http::KeySource::behind_proxies(["127.0.0.0/8".parse().unwrap()]);
    let paceline_layer = |name: &str, quota: paceline::Quota| {
        paceline::http::RateLimitLayer::new().limit(paceline::http::Limit::new(
            name,
            quota,
            behind_proxy(),
        ))
    };
    let governor_layer = |nanos: u64, burst: u32| {
        tower_governor::GovernorLayer::new(Arc::new(
            tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(nanos)
                .burst_size(burst)
                .key_extractor(tower_governor::key_extractor::SmartIpKeyExtractor)
                .finish()
                .expect("a valid tower-governor config"),
        ))
    };
    let variant = |name, app, status, against| Variant {
        name,
        app,
        status,
        against,
    };
    vec![
        variant("bare", router(), 200, "bare"),
        variant(
            "paceline",
            router().layer(paceline_layer(
                "per-client",
                paceline::Quota::per_second(1_000_000).with_burst(1_000_000),
            )),
            200,
            "bare",
        ),
        variant(
            "tower_governor",
            router().layer(governor_layer(1_000, 1_000_000)),
            200,
            "bare",
        ),
        variant(
            "bare 429",
            Router::new().route("/", get(floor_refusal)),
            429,
            "bare 429",
        ),
        variant(
            "paceline flood",
            router().layer(paceline_layer("per-client", paceline::Quota::per_minute(1))),
            429,
            "bare 429",
        ),
        variant(
            "governor flood",
            router().layer(governor_layer(60_000_000_000, 1)),
            429,
            "bare 429",
        ),
    ]
}

/// The floor of a flood's answer: the 429 paceline's layer sends a client a minute from
/// its next request (status, `Retry-After`, `RateLimit-Policy`, `RateLimit`, the body),
/// every piece made once and cloned, with no limit, key or decision behind it.
async fn floor_refusal() -> axum::response::Response {
    use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
    use std::sync::OnceLock;
    static FIELDS: OnceLock<[(HeaderName, HeaderValue); 4]> = OnceLock::new();
    let fields = FIELDS.get_or_init(|| {
        [
            (
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (RETRY_AFTER, HeaderValue::from(60u64)),
            (
                HeaderName::from_static("ratelimit-policy"),
                HeaderValue::from_static("\"per-client\";q=1;w=60"),
            ),
            (
                HeaderName::from_static("ratelimit"),
                HeaderValue::from_static("\"per-client\";r=0;t=60"),
            ),
        ]
    });
    let body = Body::from(bytes::Bytes::from_static(
        b"Too Many Requests: limit \"per-client\", retry in 60 s\n",
    ));
    let mut response = axum::response::Response::new(body);
    *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    for (name, value) in fields {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

/// Requests per second and the 99th-percentile latency over `seconds`.
async fn load(addr: SocketAddr, status: u16, connections: u64, seconds: u64) -> (f64, Duration) {
    let client: Client<_, Body> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections as usize)
        .build_http();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let workers: Vec<_> = (0..connections)
        .map(|c| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = c as u32;
                while !stop.load(Ordering::Relaxed) {
                    i = i.wrapping_add(connections as u32);
                    let ip = i % CLIENTS;
                    let request = http::Request::get(format!("http://{addr}/"))
                        .header("x-forwarded-for", format!("10.0.{}.{}", ip / 256, ip % 256))
                        .body(Body::empty())
                        .unwrap();
                    let sent = Instant::now();
                    let response = client.request(request).await.expect("a response");
                    assert_eq!(response.status(), status, "every answer is the variant's");
                    let _ = response.into_body().collect().await;
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort();
    let p99 = all[all.len() * 99 / 100];
    (all.len() as f64 / elapsed, p99)
}

fn main() {
    let rounds = common::rounds();
    let seconds = env("PACELINE_HTTP_SECONDS", 2);
    let connections = env("PACELINE_HTTP_CONNECTIONS", 32);
    // Test mode (`cargo test --benches`): one short round proves it runs.
    let (rounds, seconds) = if std::env::args().any(|a| a == "--bench") {
        (rounds, seconds)
    } else {
        (1, 1)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut servers = Vec::new();
        for variant in variants() {
            let addr = serve_router(variant.app).await;
            servers.push((variant.name, variant.status, variant.against, addr));
        }
        println!(
            "{connections} keep-alive connections, {CLIENTS} client addresses via X-Forwarded-For, \
             {seconds} s per variant, {rounds} interleaved rounds"
        );
        let mut results: Vec<Vec<(f64, Duration)>> = vec![Vec::new(); servers.len()];
        for round in 0..rounds {
            for (i, (name, status, _, addr)) in servers.iter().enumerate() {
                if *status == 429 {
                    // Every client's one request a minute is spent before the round is
                    // timed (rounds are much shorter than a minute), so it sees refusals
                    // only.
                    warm(*addr).await;
                }
                let (rps, p99) = load(*addr, *status, connections, seconds).await;
                println!("round {round}: {name:15} {rps:9.0} req/s   p99 {p99:?}");
                results[i].push((rps, p99));
            }
        }
        let median = |v: &Vec<(f64, Duration)>| {
            let mut rps: Vec<f64> = v.iter().map(|r| r.0).collect();
            rps.sort_by(f64::total_cmp);
            let mut p99: Vec<Duration> = v.iter().map(|r| r.1).collect();
            p99.sort();
            (rps[rps.len() / 2], p99[p99.len() / 2])
        };
        println!("\nmedians (cost: wall time per request over the layerless server's, same answer):");
        for (i, (name, _, against, _)) in servers.iter().enumerate() {
            let (rps, p99) = median(&results[i]);
            let base = servers
                .iter()
                .position(|s| s.0 == *against)
                .map(|j| median(&results[j]).0)
                .unwrap_or(rps);
            println!(
                "{name:15} {rps:9.0} req/s ({:+5.1} % against {against}, {:+.2} µs a request)   p99 {p99:?}",
                (rps / base - 1.0) * 100.0,
                (1.0 / rps - 1.0 / base) * 1e6,
            );
        }
    });
}

/// One request from every client address (answered however the server answers it).
async fn warm(addr: SocketAddr) {
    let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
    for ip in 0..CLIENTS {
        let request = http::Request::get(format!("http://{addr}/"))
            .header("x-forwarded-for", format!("10.0.{}.{}", ip / 256, ip % 256))
            .body(Body::empty())
            .unwrap();
        let response = client.request(request).await.expect("a response");
        let _ = response.into_body().collect().await;
    }
}
