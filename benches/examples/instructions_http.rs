//! Instruction counts of the HTTP layer's per-request path beside tower-governor's, for
//! a server that clients reach directly (see `benches/instructions/harness.rs`).

#[path = "../instructions/harness.rs"]
mod harness;
#[path = "../instructions/http.rs"]
mod http_request;

use axum::body::Body;
use harness::Op;
use http_request::{call, governor_layer, paceline_layer};
use tower_governor::key_extractor::PeerIpKeyExtractor;

fn workload(name: &str) -> Option<Op> {
    // Each layer's cost is its count minus `http_call/bare`, the same call without one.
    let op: Op = match name {
        "http_call/bare" => call::<_, Body>(tower::layer::util::Identity::new(), false),
        "http_call/paceline" => {
            call::<_, Body>(paceline_layer(paceline::http::KeySource::peer_ip()), false)
        }
        "http_call/governor" => call::<_, Body>(governor_layer(PeerIpKeyExtractor), false),
        _ => return None,
    };
    Some(op)
}

fn main() {
    harness::main(
        &["http_call/bare", "http_call/paceline", "http_call/governor"],
        workload,
    );
}
