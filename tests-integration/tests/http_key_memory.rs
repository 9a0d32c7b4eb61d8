//! What a keyed HTTP limit holds when clients send huge keys: each stored key costs a
//! bounded number of bytes, whatever its header's length. Measured with a counting
//! allocator (live bytes), so this file holds a single test.

use http::StatusCode;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::Quota;

#[path = "support/http_server.rs"]
mod http_server;
use http_server::{send, serve_router};

#[path = "../../tests/common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

const KEYS: usize = 1_500;

fn huge_key(i: usize) -> String {
    format!("{i:06}{}", "k".repeat(100_000))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_header_keys_are_stored_small() {
    let limit = Limit::new(
        "per-key",
        Quota::per_hour(1),
        KeySource::header(http::HeaderName::from_static("x-api-key")),
    );
    let view = limit.clone();
    let addr = serve_router(
        axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(RateLimitLayer::new().limit(limit)),
    )
    .await;
    let request = |key: String| send(addr, move |b| b.header("x-api-key", key));
    // Warm up the connection pool and the server's buffers.
    assert_eq!(request("warm-up".into()).await.status, StatusCode::OK);
    let before = live();
    for i in 0..KEYS {
        assert_eq!(request(huge_key(i)).await.status, StatusCode::OK);
    }
    // Each key is its own client: a second request with one of them is limited.
    assert_eq!(
        request(huge_key(7)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(view.limiter().unwrap().len(), KEYS + 1);
    let per_key = (live() - before) / KEYS as isize;
    // Stored as they came, each would hold its 100 KB.
    assert!(per_key < 1_024, "{per_key} bytes held per 100 KB key");
}
