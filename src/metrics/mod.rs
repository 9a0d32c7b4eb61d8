//! Counts for the people who run a server (cargo feature `metrics`), through the
//! [`metrics`](https://docs.rs/metrics) crate's facade: whichever recorder the application
//! installs (a Prometheus, OpenTelemetry or StatsD exporter) receives them, unchanged.
//! Install it before the first request; the HTTP layer's limits are labelled by their
//! name, a [`RedisLimiter`](crate::redis::RedisLimiter) by its key prefix.
//!
//! | metric | kind | labels | counts |
//! |---|---|---|---|
//! | `paceline_admitted_total` | counter | `limit` | requests admitted at once |
//! | `paceline_waited_total` | counter | `limit` | requests admitted after waiting their turn |
//! | `paceline_refused_total` | counter | `limit` | requests this limit refused |
//! | `paceline_wait_seconds` | histogram | `limit` | how long each waiting request waited |
//! | `paceline_keys` | gauge | `limit` | keys the limit stores (read at most once a second) |
//! | `paceline_redis_failures_total` | counter | `limit`, `kind` | calls Redis did not serve: `unreachable` (or too slow), `rejected` (an error answer), `out_of_memory` |
//! | `paceline_redis_policy_total` | counter | `limit`, `policy`, `decision` | what the failure policy (`fail_open`, `fail_closed`, `local`) decided (`admitted`, `refused`) while Redis could not answer |
//!
//! A request refused by one of several limits counts as refused by that limit only (the
//! others gave its cells back). With the feature off none of this is compiled: no
//! instruction is added to a check.
//!
//! ```
//! # #[cfg(feature = "tower")] {
//! use paceline::http::{KeySource, Limit, RateLimitLayer};
//! use paceline::Quota;
//! // With a recorder installed (for Prometheus, `metrics_exporter_prometheus::
//! // PrometheusBuilder::new().install_recorder()`), this limit's requests are counted as
//! // `paceline_admitted_total{limit="per-ip"}` and so on.
//! let layer = RateLimitLayer::new().limit(Limit::new("per-ip", Quota::per_second(10), KeySource::peer_ip()));
//! # let _ = layer;
//! # }
//! ```

// The HTTP layer and the Redis limiter count, each with the hooks it needs; a build with
// one of them (or neither) leaves the others unused.
#![cfg_attr(
    not(all(feature = "tower", feature = "redis")),
    allow(dead_code, unused_imports)
)]

#[cfg(feature = "metrics")]
mod on;
#[cfg(feature = "metrics")]
pub(crate) use on::LimitMetrics;

#[cfg(not(feature = "metrics"))]
mod off;
#[cfg(not(feature = "metrics"))]
pub(crate) use off::LimitMetrics;
