//! The upstream matrix's Rust half (`python/bench/upstream_matrix.py` drives it): a fake
//! upstream on loopback for one row of the matrix, and paceline's Rust client against it.
//!
//! ```text
//! cargo run --release -p paceline-benches --example upstream_matrix -- serve ROW
//!     serves ROW on an ephemeral loopback port, prints `PORT <port>`, stops at EOF on stdin
//! cargo run --release -p paceline-benches --example upstream_matrix -- client URL TASKS REQUESTS
//!     REQUESTS GETs of URL from TASKS tasks through `PaceMiddleware` at 100/s, burst 1
//! ```
//!
//! Rows (each allows 50 requests per second): `ietf`, `retry-after`, `x`, `bare` (a GCRA
//! limit, bursts of 10, saying that much), the same four with `-window` (a fixed 1 s
//! window), `x-burst1` and `bare-burst1` (a GCRA limit with no burst: `x-burst1` names
//! the limit and reports 0 left on every answer), and `paceline-1`, `paceline-10`,
//! `paceline-50` (paceline's own axum layer with that burst, its default fields).

use std::io::Read;
use std::time::{Duration, Instant};

use paceline::http::client::{PaceLayer, PaceMiddleware};
use paceline::Quota;

#[path = "../../tests-integration/tests/support/fake_upstream.rs"]
mod fake_upstream;

use fake_upstream::{Behavior, Fields, Upstream};

async fn serve(row: &str) -> Upstream {
    if let Some(burst) = row.strip_prefix("paceline-") {
        let burst = burst.parse().expect("paceline-BURST");
        return Upstream::paceline(Quota::per_second(50).with_burst(burst)).await;
    }
    let (row, burst) = match row.strip_suffix("-burst1") {
        Some(fields) => (fields, 1),
        None => (row, Behavior::default().burst),
    };
    let (fields, window) = match row.strip_suffix("-window") {
        Some(fields) => (fields, Some(Duration::from_secs(1))),
        None => (row, None),
    };
    let fields = match fields {
        "ietf" => Fields::Ietf,
        "retry-after" => Fields::RetryAfter,
        "x" => Fields::X,
        "bare" => Fields::Bare,
        other => panic!("no row {other}"),
    };
    Upstream::start(Behavior {
        fields,
        window,
        burst,
        ..Behavior::default()
    })
    .await
}

async fn client(url: String, tasks: usize, requests: usize) {
    let layer = PaceLayer::new(Quota::per_second(100).with_burst(1));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PaceMiddleware::new(layer).retries(u32::MAX))
        .build();
    let started = Instant::now();
    let work: Vec<_> = (0..tasks)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            let share = requests / tasks + usize::from(i < requests % tasks);
            tokio::spawn(async move {
                for _ in 0..share {
                    let response = client.get(&url).send().await.expect("loopback");
                    assert_eq!(response.status(), 200);
                }
            })
        })
        .collect();
    for task in work {
        task.await.unwrap();
    }
    println!("done {:.3}", started.elapsed().as_secs_f64());
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve", row] => {
            let upstream = serve(row).await;
            println!("PORT {}", upstream.addr.port());
            // Serves until the driver closes stdin.
            tokio::task::spawn_blocking(|| {
                let mut sink = Vec::new();
                let _ = std::io::stdin().read_to_end(&mut sink);
            })
            .await
            .unwrap();
        }
        ["client", url, tasks, requests] => {
            client(
                url.to_string(),
                tasks.parse().expect("TASKS"),
                requests.parse().expect("REQUESTS"),
            )
            .await;
        }
        _ => {
            eprintln!("usage: upstream_matrix serve ROW | client URL TASKS REQUESTS");
            std::process::exit(2);
        }
    }
}
