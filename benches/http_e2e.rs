//! The HTTP layer end to end: a real axum server on 127.0.0.1, driven by a load generator
//! on keep-alive connections with 10 000 client addresses behind a trusted proxy's
//! `X-Forwarded-For`, in interleaved rounds of the same run, in two regimes:
//!
//! - **admitted**: no layer, an identity layer (what any tower layer costs at least),
//!   paceline's layer and tower_governor's, with quotas nothing reaches (every answer a
//!   200);
//! - **flood**: every client over its limit (one request a minute), so every answer is a
//!   429 from paceline's or tower_governor's layer; beside them, the floor: a server with
//!   no layer whose handler answers every request with the same 429 (status, the four
//!   fields, the body), made once.
//!
//! The servers run on a runtime of their own (two threads, named `e2e-server`), so the
//! CPU time their threads spend (`/proc/self/task/*/schedstat`, in nanoseconds) divided by
//! the requests served is the server's CPU per request, apart from the load generator's.
//! Prints throughput, p99 latency and server CPU per request per variant (median and
//! spread over the rounds), each variant's cost against its regime's layerless server,
//! and an admitted layer's CPU over the identity layer's as a share of a bare request's.
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
            "identity",
            router().layer(tower::layer::util::Identity::new()),
            200,
            "bare",
        ),
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

/// The name of the servers' threads.
const SERVER_THREAD: &str = "e2e-server";

/// Nanoseconds the servers' threads have run so far, or `None` where the kernel does not
/// say (`/proc/self/task/*/schedstat` missing).
fn server_cpu_ns() -> Option<u64> {
    // Threads not started yet have run for no time.
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != SERVER_THREAD {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// One round of one variant: requests per second, the 99th-percentile latency, and the
/// server's CPU per request in microseconds (NaN where unknown).
#[derive(Clone, Copy)]
struct Round {
    rps: f64,
    p99: Duration,
    cpu_us: f64,
}

/// Requests per second, the 99th-percentile latency and the number of requests, over
/// `seconds`.
async fn load(
    addr: SocketAddr,
    status: u16,
    connections: u64,
    seconds: u64,
) -> (f64, Duration, usize) {
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
                    // Under a flood a client whose minute ran out during the round (its
                    // cell spent before an earlier round, refused at this round's warm-up)
                    // is admitted once: at most one request per client in the round.
                    let expired = status == 429 && response.status() == 200;
                    assert!(
                        response.status() == status || expired,
                        "every answer is the variant's: {} for {status}",
                        response.status()
                    );
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
    (all.len() as f64 / elapsed, p99, all.len())
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
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(SERVER_THREAD)
        .enable_all()
        .build()
        .unwrap();
    let mut servers = Vec::new();
    for variant in variants() {
        // Spawned on the servers' runtime (`serve_router` spawns on the current one).
        let addr = server_runtime.block_on(serve_router(variant.app));
        servers.push((variant.name, variant.status, variant.against, addr));
    }
    runtime.block_on(async {
        println!(
            "{connections} keep-alive connections, {CLIENTS} client addresses via X-Forwarded-For, \
             {seconds} s per variant, {rounds} interleaved rounds"
        );
        let mut results: Vec<Vec<Round>> = vec![Vec::new(); servers.len()];
        for round in 0..rounds {
            for (i, (name, status, _, addr)) in servers.iter().enumerate() {
                if *status == 429 {
                    // Every client's one request a minute is spent before the round is
                    // timed (rounds are much shorter than a minute), so it sees refusals
                    // only.
                    warm(*addr).await;
                }
                let cpu_before = server_cpu_ns();
                let (rps, p99, requests) = load(*addr, *status, connections, seconds).await;
                let cpu_us = match (cpu_before, server_cpu_ns()) {
                    (Some(before), Some(after)) => {
                        after.saturating_sub(before) as f64 / 1e3 / requests as f64
                    }
                    _ => f64::NAN,
                };
                println!(
                    "round {round}: {name:15} {rps:9.0} req/s   p99 {p99:?}   server CPU {cpu_us:.2} µs/request"
                );
                results[i].push(Round { rps, p99, cpu_us });
            }
        }
        let sorted = |v: &[Round], f: fn(&Round) -> f64| {
            let mut x: Vec<f64> = v.iter().map(f).collect();
            x.sort_by(f64::total_cmp);
            x
        };
        let median = |v: &[Round], f: fn(&Round) -> f64| {
            let x = sorted(v, f);
            x[x.len() / 2]
        };
        let of = |name: &str| servers.iter().position(|s| s.0 == name);
        println!(
            "\nmedians over {rounds} rounds [min-max] (cost: against the layerless server with the same answer):"
        );
        for (i, (name, _, against, _)) in servers.iter().enumerate() {
            let rounds = &results[i];
            let rps = median(rounds, |r| r.rps);
            let p99 = median(rounds, |r| r.p99.as_secs_f64()) * 1e6;
            let cpu = sorted(rounds, |r| r.cpu_us);
            let base = of(against).map_or(rps, |j| median(&results[j], |r| r.rps));
            let base_cpu = of(against).map_or(f64::NAN, |j| median(&results[j], |r| r.cpu_us));
            println!(
                "{name:15} {rps:9.0} req/s [{:.0}-{:.0}] ({:+5.1} % against {against})   p99 {p99:.0} µs   \
                 server CPU {:.2} µs/request [{:.2}-{:.2}] ({:+.2} µs)",
                sorted(rounds, |r| r.rps)[0],
                sorted(rounds, |r| r.rps)[rounds.len() - 1],
                (rps / base - 1.0) * 100.0,
                cpu[cpu.len() / 2],
                cpu[0],
                cpu[cpu.len() - 1],
                cpu[cpu.len() / 2] - base_cpu,
            );
        }
        if let (Some(bare), Some(identity)) = (of("bare"), of("identity")) {
            let bare = median(&results[bare], |r| r.cpu_us);
            let identity = median(&results[identity], |r| r.cpu_us);
            println!("\nadmitted, server CPU over the identity layer's, as a share of a bare request's ({bare:.2} µs):");
            for name in ["paceline", "tower_governor"] {
                if let Some(i) = of(name) {
                    let layer = median(&results[i], |r| r.cpu_us) - identity;
                    println!("{name:15} {layer:+.2} µs = {:+.1} %", layer / bare * 100.0);
                }
            }
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
