//! The HTTP layer with limits kept in a shared file (`Limit::shared`): two servers, as
//! two worker processes would be, each opening the file on its own, on 127.0.0.1 with a
//! real hyper client. One bound per client between them; a refusal by another limit
//! gives the shared cell back; the fields read the shared state. (The file's own
//! cross-process behaviour, with real processes killed mid-run, is in the root crate's
//! `tests/shared_processes.rs`; Python's uvicorn workers in `python/tests/test_asgi.py`.)

use std::path::PathBuf;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::shared::SharedKeyedLimiter;
use paceline::Quota;

#[path = "support/http_server.rs"]
mod http_server;
use http_server::{send, serve_router};

/// A path of this test's own, removed when dropped.
struct File(PathBuf);

impl File {
    fn new(name: &str) -> File {
        let path = std::env::temp_dir().join(format!(
            "paceline-http-shared-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        File(path)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn header_key() -> KeySource {
    KeySource::header(http::HeaderName::from_static("x-client"))
}

/// A "worker": its own opener of `file`, its own server.
async fn worker(file: &File, quota: Quota, extra: Option<Limit>) -> std::net::SocketAddr {
    let opened = SharedKeyedLimiter::open(&file.0, quota, 1024).unwrap();
    let mut layer = RateLimitLayer::new()
        .limit(Limit::shared("per-client", opened, header_key()).unwrap())
        .headers_on_success(true);
    if let Some(extra) = extra {
        layer = layer.limit(extra);
    }
    serve_router(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

async fn get_as(addr: std::net::SocketAddr, client: &str) -> http_server::Reply {
    let client = client.to_owned();
    send(addr, move |b| b.header("x-client", client)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_enforce_one_bound_per_client_between_them() {
    let file = File::new("bound");
    let quota = Quota::per_hour(5);
    let (a, b) = (
        worker(&file, quota, None).await,
        worker(&file, quota, None).await,
    );
    // Alternating between the workers, each client gets its 5 and no more.
    for client in ["alice", "bob"] {
        let mut admitted = 0;
        for i in 0..12 {
            let addr = if i % 2 == 0 { a } else { b };
            let reply = get_as(addr, client).await;
            if reply.status == StatusCode::OK {
                admitted += 1;
                assert_eq!(
                    reply.header("ratelimit"),
                    format!("\"per-client\";r={};t={}", 5 - admitted, admitted * 720),
                );
            } else {
                assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(reply.header("ratelimit"), "\"per-client\";r=0;t=3600");
                assert_eq!(reply.header("retry-after"), "720");
            }
        }
        assert_eq!(admitted, 5, "{client}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_another_limit_gives_the_shared_cell_back() {
    let file = File::new("refund");
    let quota = Quota::per_hour(5);
    // After the shared per-client limit, an in-process global limit of 2 an hour.
    let global = Limit::new("global", Quota::per_hour(2), KeySource::global());
    let a = worker(&file, quota, Some(global)).await;
    let b = worker(&file, quota, None).await;
    for _ in 0..2 {
        assert_eq!(get_as(a, "carol").await.status, StatusCode::OK);
    }
    // Refused by "global": carol's shared cells are given back each time.
    for _ in 0..3 {
        assert_eq!(
            get_as(a, "carol").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    // So the other worker, with no global limit, still has her 3 other cells.
    for _ in 0..3 {
        assert_eq!(get_as(b, "carol").await.status, StatusCode::OK);
    }
    assert_eq!(
        get_as(b, "carol").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}
