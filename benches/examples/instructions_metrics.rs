//! The HTTP layer's per-request path with the `metrics` feature on and Prometheus's
//! recorder installed: what counting adds to an admitted and a refused request (see
//! `benches/instructions/harness.rs`; `benches/instructions.sh` compares these with
//! `instructions_http`'s, built without the feature).

#[path = "../instructions/harness.rs"]
mod harness;
#[path = "../instructions/http.rs"]
mod http_request;

fn main() {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder");
    harness::main(
        &[
            "http_call_metrics/paceline",
            "http_refused_metrics/paceline",
        ],
        |name| {
            let who = match name {
                "http_call_metrics/paceline" => "paceline",
                "http_refused_metrics/paceline" => "paceline-refused",
                _ => return None,
            };
            http_request::direct::<axum::body::Body>(who)
        },
    );
}
