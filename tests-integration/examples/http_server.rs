//! An axum server limiting each client address: 5 requests per second, bursts of 10
//! (IPv6 clients by /64), and 100 per second for the whole service. Refusals are
//! `429 Too Many Requests` with `Retry-After` and the IETF `RateLimit` fields; every
//! response carries the fields. `/metrics` shows paceline's counts in Prometheus's format.
//!
//! ```sh
//! cargo run -p paceline-tests-integration --example http_server
//! for i in $(seq 12); do curl -si http://127.0.0.1:3000/ | head -1; done
//! curl -s http://127.0.0.1:3000/metrics
//! ```
//!
//! `PACELINE_HTTP_ADDR` picks another address; `PACELINE_HTTP_SECONDS` stops it after a while.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;

mod support {
    pub mod app;
}

#[tokio::main]
async fn main() {
    // paceline counts through the `metrics` facade (feature `metrics`): any recorder
    // receives them, here Prometheus's.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("no other recorder is installed");
    let app = support::app::app(prometheus);
    let addr = std::env::var("PACELINE_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .unwrap_or_else(|e| panic!("cannot listen on {addr}: {e}"));
    println!(
        "listening on http://{} (per client: 5/s, bursts of 10; whole service: 100/s; \
         counts at /metrics)",
        listener.local_addr().expect("a bound address")
    );
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    match std::env::var("PACELINE_HTTP_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seconds) => {
            let _ = tokio::time::timeout(Duration::from_secs(seconds), server).await;
        }
        None => server.await.expect("the server failed"),
    }
}
