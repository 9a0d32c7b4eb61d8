//! A real axum server on an ephemeral loopback port and a real hyper client, for the
//! HTTP middleware's tests.

#![allow(dead_code)] // each test crate uses a different part

use std::net::SocketAddr;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline::clock::ManualClock;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::Quota;

/// Serves `layer` (on the real clock) around a `200 ok` route on an ephemeral loopback
/// port.
pub(crate) async fn serve_real(layer: RateLimitLayer) -> SocketAddr {
    serve_router(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

/// Serves `layer` around a `200 ok` route on an ephemeral loopback port.
pub(crate) async fn serve(layer: RateLimitLayer<ManualClock>) -> SocketAddr {
    serve_router(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

pub(crate) async fn serve_router(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

pub(crate) fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: http::HeaderMap,
    #[allow(dead_code)] // read by some of the test binaries that include this module
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap())
            .unwrap_or("<none>")
    }
}

pub(crate) async fn send(
    addr: SocketAddr,
    build: impl FnOnce(http::request::Builder) -> http::request::Builder,
) -> Reply {
    let request = build(Request::get(format!("http://{addr}/")))
        .body(Body::empty())
        .unwrap();
    let response = client().request(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub(crate) async fn get_plain(addr: SocketAddr) -> Reply {
    send(addr, |b| b).await
}

pub(crate) fn per_ip(clock: &ManualClock, quota: Quota) -> Limit<ManualClock> {
    Limit::with_clock("per-ip", quota, KeySource::peer_ip(), clock.clone())
}

/// Keyed by the `x-api-key` header.
pub(crate) fn api_key() -> KeySource {
    KeySource::header(http::HeaderName::from_static("x-api-key"))
}

/// A limit `per-key` ([`api_key`]) of `quota` on `clock`.
pub(crate) fn per_key(clock: &ManualClock, quota: Quota) -> Limit<ManualClock> {
    Limit::with_clock("per-key", quota, api_key(), clock.clone())
}
