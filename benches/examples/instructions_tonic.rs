//! Instruction counts of the layer's per-request path on a tonic service (tonic's body
//! type for requests and responses) beside tower-governor's, for clients reaching the
//! server directly (see `benches/instructions/harness.rs`).

#[path = "../instructions/harness.rs"]
mod harness;
#[path = "../instructions/http.rs"]
mod http_request;

fn main() {
    harness::main(
        &[
            "tonic_call/bare",
            "tonic_call/paceline",
            "tonic_call/governor",
        ],
        |name| {
            let who = name.strip_prefix("tonic_call/")?;
            http_request::direct::<tonic::body::Body>(who)
        },
    );
}
