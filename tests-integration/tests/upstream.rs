//! The client side against a real upstream on loopback: an axum server limited by
//! paceline's own layer to 50 requests per second (bursts of 10), which answers 429 with
//! `Retry-After` and the IETF fields, and a hyper client behind `PaceLayer` configured too
//! fast (100 per second). The server logs every request it sees.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use paceline::http::client::PaceLayer;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::Quota;
use tower::{Service, ServiceBuilder, ServiceExt};

#[path = "support/http_server.rs"]
mod http_server;

type Log = Arc<Mutex<Vec<(Instant, u16)>>>;

async fn upstream() -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let logged = log.clone();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new().limit(Limit::new(
            "api",
            Quota::per_second(50).with_burst(10),
            KeySource::global(),
        )))
        // Outside the limit: sees every request, refused or not.
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let log = logged.clone();
            async move {
                let response: Response = next.run(request).await;
                log.lock()
                    .unwrap()
                    .push((Instant::now(), response.status().as_u16()));
                response
            }
        }));
    (http_server::serve_router(app).await, log)
}

/// `tasks` tasks that each make 20 calls in a row: every status they saw, and how long
/// they took in all.
async fn in_tasks<F>(
    tasks: usize,
    call: impl Fn() -> F + Clone + Send + 'static,
) -> (Vec<u16>, Duration)
where
    F: std::future::Future<Output = u16> + Send + 'static,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..tasks)
        .map(|_| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..20 {
                    statuses.push(call().await);
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    (statuses, started.elapsed())
}

/// How many requests the upstream refused.
fn refusals(log: &Log) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(_, s)| *s == 429)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_configured_too_fast_converges_to_the_upstreams_pace() {
    let (addr, log) = upstream().await;
    let layer = PaceLayer::new(Quota::per_second(100).with_burst(1));
    let client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(http_server::client());
    let call = move || {
        let mut client = client.clone();
        async move {
            let request = http::Request::get(format!("http://{addr}/"))
                .body(Body::empty())
                .unwrap();
            let response = client.ready().await.unwrap().call(request).await.unwrap();
            let status = response.status().as_u16();
            let _ = response.into_body().collect().await;
            status
        }
    };
    let (statuses, elapsed) = in_tasks(50, call).await;
    let refused = refusals(&log);
    assert_eq!(statuses.len(), 1000);
    // A deaf client at 100/s would be refused about half the time.
    assert!(refused < 30, "{refused} refusals");
    // 1000 at 50/s, within 15 %, plus the one-second hold of the first refusal.
    assert!(
        elapsed <= Duration::from_secs_f64(20.0 * 1.15 + 1.0),
        "{elapsed:?}"
    );
    // It follows the pace the upstream announced, one request at a time.
    let host = addr.to_string();
    assert_eq!(layer.follower(&host).announced(), Some(50.0));
    assert_eq!(layer.limiter(&host).quota().burst(), 1);
    // Another host was never held or slowed.
    assert_eq!(layer.limiter("elsewhere.example").quota(), layer.quota());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_through_the_middleware_converges_and_retries_refusals() {
    use paceline::http::client::PaceMiddleware;

    let (addr, log) = upstream().await;
    let layer = PaceLayer::new(Quota::per_second(100).with_burst(1));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PaceMiddleware::new(layer.clone()))
        .build();
    let call = move || {
        let client = client.clone();
        async move {
            let response = client.get(format!("http://{addr}/")).send().await.unwrap();
            response.status().as_u16()
        }
    };
    let (statuses, elapsed) = in_tasks(20, call).await;
    let refused = refusals(&log);
    // Refusals were sent again in new turns: the callers saw none.
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 400);
    assert!(
        refused >= 1,
        "nothing was refused: the retries went untried"
    );
    assert!(refused < 12, "{refused} refusals");
    assert!(
        elapsed <= Duration::from_secs_f64(8.0 * 1.15 + 1.0),
        "{elapsed:?}"
    );
    assert_eq!(layer.follower(&addr.to_string()).announced(), Some(50.0));
}
