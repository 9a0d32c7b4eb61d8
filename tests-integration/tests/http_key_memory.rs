//! What a keyed HTTP limit holds when clients send huge keys: each stored key costs a
//! bounded number of bytes, whatever its header's length. Measured with a counting
//! allocator (live bytes), so this file holds a single test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use http::StatusCode;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::Quota;

#[path = "support/http_server.rs"]
mod http_server;
use http_server::{send, serve_router};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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
    let before = LIVE.load(Ordering::SeqCst);
    for i in 0..KEYS {
        assert_eq!(request(huge_key(i)).await.status, StatusCode::OK);
    }
    // Each key is its own client: a second request with one of them is limited.
    assert_eq!(
        request(huge_key(7)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(view.limiter().len(), KEYS + 1);
    let per_key = (LIVE.load(Ordering::SeqCst) - before) / KEYS as isize;
    // Stored as they came, each would hold its 100 KB.
    assert!(per_key < 1_024, "{per_key} bytes held per 100 KB key");
}
