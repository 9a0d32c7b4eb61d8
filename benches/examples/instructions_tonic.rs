//! Instruction counts of the layer's per-request path on a tonic service (tonic's body
//! type for requests and responses) beside tower-governor's, for clients reaching the
//! server directly (see `benches/instructions/harness.rs`).

#[path = "../instructions/harness.rs"]
mod harness;
#[path = "../instructions/http.rs"]
mod http_request;

use harness::Op;
use http_request::{call, governor_layer, paceline_layer};
use tonic::body::Body;
use tower_governor::key_extractor::PeerIpKeyExtractor;

fn workload(name: &str) -> Option<Op> {
    let op: Op = match name {
        "tonic_call/bare" => call::<_, Body>(tower::layer::util::Identity::new(), false),
        "tonic_call/paceline" => {
            call::<_, Body>(paceline_layer(paceline::http::KeySource::peer_ip()), false)
        }
        "tonic_call/governor" => call::<_, Body>(governor_layer(PeerIpKeyExtractor), false),
        _ => return None,
    };
    Some(op)
}

fn main() {
    harness::main(
        &[
            "tonic_call/bare",
            "tonic_call/paceline",
            "tonic_call/governor",
        ],
        workload,
    );
}
