//! The HTTP layer end to end: a real axum server on 127.0.0.1, driven by a load generator
//! on keep-alive connections with 10 000 client addresses behind a trusted proxy's
//! `X-Forwarded-For`, with no layer, paceline's layer and tower_governor's, in
//! interleaved rounds of the same run. Prints throughput and p99 latency per variant and
//! each layer's cost against the bare server.
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

fn variants() -> Vec<(&'static str, Router)> {
    let paceline_layer = paceline::http::RateLimitLayer::new().limit(paceline::http::Limit::new(
        "per-client",
        paceline::Quota::per_second(1_000_000).with_burst(1_000_000),
        paceline::http::KeySource::behind_proxies(["127.0.0.0/8".parse().unwrap()]),
    ));
    let governor_config = Arc::new(
        tower_governor::governor::GovernorConfigBuilder::default()
            .per_nanosecond(1_000)
            .burst_size(1_000_000)
            .key_extractor(tower_governor::key_extractor::SmartIpKeyExtractor)
            .finish()
            .expect("a valid tower-governor config"),
    );
    vec![
        ("bare", router()),
        ("paceline", router().layer(paceline_layer)),
        (
            "tower_governor",
            router().layer(tower_governor::GovernorLayer::new(governor_config)),
        ),
    ]
}

/// Requests per second and the 99th-percentile latency over `seconds`.
async fn load(addr: SocketAddr, connections: u64, seconds: u64) -> (f64, Duration) {
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
                    assert_eq!(response.status(), 200, "nothing is refused here");
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
        for (name, app) in variants() {
            servers.push((name, serve_router(app).await));
        }
        println!(
            "{connections} keep-alive connections, {CLIENTS} client addresses via X-Forwarded-For, \
             {seconds} s per variant, {rounds} interleaved rounds"
        );
        let mut results: Vec<(&str, Vec<(f64, Duration)>)> = servers
            .iter()
            .map(|(name, _)| (*name, Vec::new()))
            .collect();
        for round in 0..rounds {
            for (i, (name, addr)) in servers.iter().enumerate() {
                let (rps, p99) = load(*addr, connections, seconds).await;
                println!("round {round}: {name:15} {rps:9.0} req/s   p99 {p99:?}");
                results[i].1.push((rps, p99));
            }
        }
        let median = |v: &Vec<(f64, Duration)>| {
            let mut rps: Vec<f64> = v.iter().map(|r| r.0).collect();
            rps.sort_by(f64::total_cmp);
            let mut p99: Vec<Duration> = v.iter().map(|r| r.1).collect();
            p99.sort();
            (rps[rps.len() / 2], p99[p99.len() / 2])
        };
        let (bare_rps, _) = median(&results[0].1);
        println!("\nmedians:");
        for (name, runs) in &results {
            let (rps, p99) = median(runs);
            println!(
                "{name:15} {rps:9.0} req/s ({:+5.1} % against bare)   p99 {p99:?}",
                (rps / bare_rps - 1.0) * 100.0
            );
        }
    });
}
