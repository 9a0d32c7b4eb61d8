//! Per-request overhead of paceline's tower layer vs tower-governor's on the same axum
//! router, in the same run: an in-process `Service::call` loop over 10 000 client
//! addresses (axum's `ConnectInfo`), on 1 and 2 threads. Overhead is each layered
//! router's time per request minus that of the same router with a layer that does nothing
//! (any layer makes axum box each route, which is not the limiter's cost); quotas are
//! generous, so every
//! request is admitted (the path every request of a healthy server takes).
//!
//! A fourth router, `floor`, carries a layer that does only what any layer keyed by the
//! peer's address with shared state must do per request, and no limiting at all: axum
//! clones the layer's service (here an `Arc` increment and decrement, as for both
//! limiters) and the layer reads the peer address from the request's extensions. Its
//! overhead bounds from below what a limiter layer on this router can cost.
//!
//! `cargo bench --bench http`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use criterion::{BenchmarkId, Criterion};
use http::Request;
use tower::ServiceExt;

mod common;

const CLIENTS: u32 = 10_000;

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn contenders() -> Vec<(&'static str, Router)> {
    let paceline_layer = paceline::http::RateLimitLayer::new().limit(paceline::http::Limit::new(
        "per-ip",
        paceline::Quota::per_second(1_000_000).with_burst(1_000_000),
        paceline::http::KeySource::peer_ip(),
    ));
    let governor_config = tower_governor::governor::GovernorConfigBuilder::default()
        .per_nanosecond(1_000)
        .burst_size(1_000_000)
        .finish()
        .expect("a valid tower-governor config");
    vec![
        // Any layer makes axum box each route: a no-op layer is the baseline, so that what
        // is measured is each limiter's own work.
        (
            "noop-layer",
            router().layer(tower::util::MapRequestLayer::new(|r: Request<Body>| r)),
        ),
        ("paceline", router().layer(paceline_layer)),
        (
            "tower-governor",
            router().layer(tower_governor::GovernorLayer::new(governor_config)),
        ),
        ("floor", router().layer(Floor(Arc::new(())))),
    ]
}

/// The floor: shared state cloned with the service, the peer address read, nothing else.
#[derive(Clone)]
struct Floor(Arc<()>);

impl<S> tower::Layer<S> for Floor {
    type Service = FloorService<S>;

    fn layer(&self, inner: S) -> FloorService<S> {
        FloorService {
            inner,
            _shared: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct FloorService<S> {
    inner: S,
    _shared: Arc<()>,
}

impl<S: tower::Service<Request<B>>, B> tower::Service<Request<B>> for FloorService<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        let peer = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip());
        black_box(peer);
        self.inner.call(request)
    }
}

/// `iters` requests per thread from rotating client addresses; returns time per request.
fn run(app: &Router, threads: usize, iters: u64) -> Duration {
    let app = app.clone();
    common::per_op_across_threads(threads, move |t| {
        futures::executor::block_on(async {
            for i in 0..iters {
                let client = (i as u32).wrapping_mul(2_654_435_761) % CLIENTS + t as u32 * CLIENTS;
                let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + client));
                let mut request = Request::get("/").body(Body::empty()).unwrap();
                request
                    .extensions_mut()
                    .insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
                let response = app.clone().oneshot(request).await.unwrap();
                black_box(response.status());
            }
        })
    })
}

fn bench(c: &mut Criterion) {
    let contenders = contenders();
    // Paired rounds: all three in turn, round after round, overhead ratio per round.
    let requests: u64 = common::size(200_000, 2_000);
    let rounds = common::rounds();
    for threads in [1, 2] {
        let mut ratios = Vec::new();
        let mut paceline_ns = Vec::new();
        let mut governor_ns = Vec::new();
        let mut floor_ns = Vec::new();
        for _ in 0..rounds {
            let per = requests / threads as u64;
            let times: Vec<f64> = contenders
                .iter()
                .map(|(_, app)| run(app, threads, per).as_nanos() as f64 / per as f64)
                .collect();
            let (bare, paceline, governor, floor) = (times[0], times[1], times[2], times[3]);
            paceline_ns.push(paceline - bare);
            governor_ns.push(governor - bare);
            floor_ns.push(floor - bare);
            ratios.push((paceline - bare) / (governor - bare));
        }
        let (median, min, max) = common::spread(&mut ratios);
        let (p, _, _) = common::spread(&mut paceline_ns);
        let (g, _, _) = common::spread(&mut governor_ns);
        let (f, _, _) = common::spread(&mut floor_ns);
        eprintln!(
            "http, {threads} thread(s): overhead per request paceline {p:.0} ns, tower-governor \
             {g:.0} ns, floor {f:.0} ns ({:.2} of tower-governor's); paceline/tower-governor \
             median {median:.2} (min {min:.2}, max {max:.2}) over {rounds} rounds of \
             {requests} requests",
            f / g
        );
    }
    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("http/{threads}-thread"));
        for (who, app) in &contenders {
            group.bench_function(BenchmarkId::from_parameter(who), |b| {
                b.iter_custom(|iters| run(app, threads, iters))
            });
        }
        group.finish();
    }
}

common::bench_main!(common::criterion());
