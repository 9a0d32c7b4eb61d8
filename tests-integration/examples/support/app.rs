//! The example server's application, shared with the test that scrapes it
//! (`tests/metrics.rs`): the limited route, and `/metrics` beside it, not limited.

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::Quota;

/// `/` limited per client address (5 per second, bursts of 10) and for the whole service
/// (100 per second); `/metrics` renders what `prometheus` recorded, in Prometheus's text
/// format.
pub fn app(prometheus: PrometheusHandle) -> Router {
    let layer = RateLimitLayer::new()
        .limit(Limit::new(
            "per-ip",
            Quota::per_second(5).with_burst(10),
            KeySource::peer_ip(),
        ))
        .limit(Limit::new(
            "global",
            Quota::per_second(100),
            KeySource::global(),
        ))
        .headers_on_success(true);
    let limited = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    let metrics = Router::new().route("/metrics", get(move || async move { prometheus.render() }));
    limited.merge(metrics)
}
