//! Instruction counts of the HTTP layer's per-request path beside tower-governor's, for
//! a server behind a proxy that names clients in `X-Forwarded-For` (see
//! `benches/instructions/harness.rs`).

#[path = "../instructions/harness.rs"]
mod harness;
#[path = "../instructions/http.rs"]
mod http_request;

use axum::body::Body;
use harness::Op;
use http_request::{
    call, governor_layer, paceline_layer, paceline_layer_on, Returning, Sparse, GOVERNOR_GENEROUS,
};
use tower_governor::key_extractor::SmartIpKeyExtractor;

/// paceline's key source: the client the proxy names, the proxy being the peer
/// (127.0.0.1), as in `benches/http_e2e.rs`.
fn behind_local_proxy() -> paceline::http::KeySource {
    paceline::http::KeySource::behind_proxies(["127.0.0.1/32".parse().expect("a network")])
}

fn workload(name: &str) -> Option<Op> {
    // paceline trusts the peer's address; tower-governor's `SmartIpKeyExtractor` reads the
    // header. `_returning`: each client back about every 0.8 s (`http_request::Returning`);
    // `_sparse`: every 3 s (`http_request::Sparse`). tower-governor keeps every key;
    // paceline's table keeps a client seen within the last second, and with no new client
    // it never sweeps at all.
    let op: Op = match name {
        "http_proxied/bare" | "http_proxied_returning/bare" | "http_proxied_sparse/bare" => {
            call::<_, Body>(tower::layer::util::Identity::new(), true)
        }
        "http_proxied/governor"
        | "http_proxied_returning/governor"
        | "http_proxied_sparse/governor" => {
            call::<_, Body>(governor_layer(SmartIpKeyExtractor, GOVERNOR_GENEROUS), true)
        }
        "http_proxied/paceline" => call::<_, Body>(paceline_layer(behind_local_proxy()), true),
        "http_proxied_returning/paceline" => {
            call::<_, Body>(paceline_layer_on::<Returning>(behind_local_proxy()), true)
        }
        "http_proxied_sparse/paceline" => {
            call::<_, Body>(paceline_layer_on::<Sparse>(behind_local_proxy()), true)
        }
        _ => return None,
    };
    Some(op)
}

fn main() {
    harness::main(
        &[
            "http_proxied/bare",
            "http_proxied/paceline",
            "http_proxied/governor",
            "http_proxied_returning/bare",
            "http_proxied_returning/paceline",
            "http_proxied_returning/governor",
            "http_proxied_sparse/bare",
            "http_proxied_sparse/paceline",
            "http_proxied_sparse/governor",
        ],
        workload,
    );
}
