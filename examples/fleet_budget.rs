//! One client of a fleet budget in Redis: `TASKS` tasks of this process take turns of
//! one request each from a `RedisBudget` (40 requests a second, bursts of 4, at most 2
//! calls in flight over every client of the budget, in any language), each holding its
//! turn for `HOLD_MS` as a call would. Prints `start end` per turn, in seconds since the
//! Unix epoch, so that the turns of several clients can be laid side by side.
//!
//! ```text
//! redis-server --port 6379 &
//! cargo run --features redis --example fleet_budget -- redis://127.0.0.1:6379 calls 8 4 30
//! ```
//!
//! A Python client of the same name shares the budget:
//! `paceline.redis.RedisBudget(client, "calls", in_flight=2,
//! requests=paceline.Rate(40, per=1.0, burst=4))`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paceline::redis::RedisBudget;
use paceline::Quota;

fn seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let name = args.next().unwrap_or_else(|| "calls".into());
    let turns: u32 = args.next().map_or(Ok(8), |a| a.parse())?;
    let tasks: u32 = args.next().map_or(Ok(4), |a| a.parse())?;
    let hold = Duration::from_millis(args.next().map_or(Ok(30), |a| a.parse())?);
    let budget = RedisBudget::builder()
        .rate("requests", Quota::per_second(40).with_burst(4))
        .in_flight(2)
        .timeout(Duration::from_secs(5))
        .connect(&url, &name)
        .await?;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let budget = budget.clone();
        // This task's share of the turns.
        let mine = turns / tasks + u32::from(task < turns % tasks);
        handles.push(tokio::spawn(async move {
            let mut spans = Vec::new();
            for _ in 0..mine {
                let turn = budget.acquire(&[("requests", 1)]).await?;
                let start = seconds();
                tokio::time::sleep(hold).await;
                let end = seconds();
                turn.settle(&[("requests", 1)]).await?;
                spans.push((start, end));
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(spans)
        }));
    }
    for handle in handles {
        for (start, end) in handle.await?.map_err(|e| e.to_string())? {
            println!("{start:.6} {end:.6}");
        }
    }
    Ok(())
}
