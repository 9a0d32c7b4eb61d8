//! Instruction counts of the HTTP layer's per-request path beside tower-governor's, for
//! a server that clients reach directly (see `benches/instructions/harness.rs`).

#[path = "../instructions/harness.rs"]
mod harness;
#[path = "../instructions/http.rs"]
mod http_request;

fn main() {
    harness::main(
        &[
            "http_call/bare",
            "http_call/paceline",
            "http_call/governor",
            "http_refused/floor",
            "http_refused/paceline",
            "http_refused/governor",
        ],
        |name| {
            let who = match name.strip_prefix("http_refused/") {
                Some(who) => format!("{who}-refused"),
                None => name.strip_prefix("http_call/")?.to_owned(),
            };
            http_request::direct::<axum::body::Body>(&who)
        },
    );
}
