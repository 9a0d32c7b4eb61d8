//! paceline's Redis script vs a port of go-redis/redis_rate's GCRA script vs a bare `INCR`
//! round trip (the floor of any one-round-trip limiter), same run, same server (a
//! `redis-server` this bench starts on a loopback port): checks per second with 1 and 64
//! concurrent callers, p50/p99 latency, and the round trips a refusal flood on one key
//! costs. `cargo bench --bench redis`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use redis::aio::ConnectionManager;

mod common;

/// redis_rate's script (github.com/go-redis/redis_rate, `allowN`), ported as is, minus
/// its `redis.replicate_commands()`.
const REDIS_RATE: &str = r#"
local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])
local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst
local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)
local tat = redis.call("GET", rate_limit_key)
if not tat then tat = now else tat = tonumber(tat) end
tat = math.max(tat, now)
local new_tat = tat + increment
local allow_at = new_tat - burst_offset
local diff = now - allow_at
local remaining = diff / emission_interval
if remaining < 0 then
  return {0, 0, tostring(diff * -1), tostring(tat - now)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
return {cost, 0, "-1", tostring(reset_after)}
"#;

#[path = "../tests-integration/tests/support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

#[derive(Clone)]
enum Contender {
    Paceline(Arc<paceline::redis::RedisLimiter>),
    RedisRate(ConnectionManager, Arc<redis::Script>),
    Incr(ConnectionManager),
}

impl Contender {
    async fn check(&self, key: &str) -> bool {
        match self {
            Contender::Paceline(l) => l.check_key(key).await.is_ok(),
            Contender::RedisRate(conn, script) => {
                let mut conn = conn.clone();
                let r: (i64, i64, String, String) = script
                    .key(format!("rr:{{{key}}}"))
                    .arg(1_000_000)
                    .arg(1_000_000)
                    .arg(1)
                    .arg(1)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                r.0 > 0
            }
            Contender::Incr(conn) => {
                let mut conn = conn.clone();
                let _: i64 = redis::cmd("INCR")
                    .arg(format!("incr:{{{key}}}"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                true
            }
        }
    }
}

/// `total` checks by `callers` concurrent tasks over 1000 keys: (checks/s, p50, p99).
async fn load(who: &Contender, callers: usize, total: usize) -> (f64, Duration, Duration) {
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let who = who.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                for i in 0..total / callers {
                    let key = format!("k{}", (i * 7 + c * 13) % 1000);
                    let t = Instant::now();
                    std::hint::black_box(who.check(&key).await);
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    all.sort();
    let p = |q: f64| all[((all.len() - 1) as f64 * q) as usize];
    (all.len() as f64 / elapsed.as_secs_f64(), p(0.5), p(0.99))
}

async fn commands_processed(conn: &mut ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn bench(c: &mut Criterion) {
    let server = Server::start();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let contenders = rt.block_on(async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let conn = ConnectionManager::new(client).await.unwrap();
        let paceline = paceline::redis::RedisLimiter::connect(
            &url,
            paceline::Quota::per_second(1_000_000).with_burst(1_000_000),
        )
        .await
        .unwrap();
        vec![
            ("paceline", Contender::Paceline(Arc::new(paceline))),
            (
                "redis_rate",
                Contender::RedisRate(conn.clone(), Arc::new(redis::Script::new(REDIS_RATE))),
            ),
            ("INCR floor", Contender::Incr(conn)),
        ]
    });
    let total = common::size(20_000, 640);
    let rounds = common::rounds().min(5);
    for callers in [1, 64] {
        for (name, who) in &contenders {
            let mut best = (0.0f64, Duration::MAX, Duration::MAX);
            for _ in 0..rounds {
                let r = rt.block_on(load(who, callers, total));
                if r.0 > best.0 {
                    best = r;
                }
            }
            eprintln!(
                "redis, {callers:>2} caller(s), {name:<10}: {:>8.0} checks/s, p50 {:>6.1} us, p99 {:>7.1} us (best of {rounds})",
                best.0,
                best.1.as_secs_f64() * 1e6,
                best.2.as_secs_f64() * 1e6
            );
        }
    }
    // A refusal flood on one key: how many commands reach Redis for 10 000 checks.
    rt.block_on(async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut admin = ConnectionManager::new(client).await.unwrap();
        let flood = common::size(10_000, 200);
        let strict = paceline::redis::RedisLimiter::connect(&url, paceline::Quota::per_hour(1))
            .await
            .unwrap();
        let rr = redis::Script::new(REDIS_RATE);
        let before = commands_processed(&mut admin).await;
        for _ in 0..flood {
            let _ = strict.check_key("flooded").await;
        }
        let paceline_cmds = commands_processed(&mut admin).await - before - 1;
        let before = commands_processed(&mut admin).await;
        for _ in 0..flood {
            let _: (i64, i64, String, String) = rr
                .key("rr:{flooded}")
                .arg(1)
                .arg(1)
                .arg(3600)
                .arg(1)
                .invoke_async(&mut admin)
                .await
                .unwrap();
        }
        let rr_cmds = commands_processed(&mut admin).await - before - 1;
        eprintln!(
            "redis, refusal flood of {flood} checks on one key: commands reaching Redis: paceline {paceline_cmds}, redis_rate {rr_cmds}"
        );
    });
    let mut group = c.benchmark_group("redis/1-caller");
    for (name, who) in &contenders {
        group.bench_function(*name, |b| b.iter(|| rt.block_on(who.check("k1"))));
    }
    group.finish();
    drop(server);
}

common::bench_main!(common::criterion());
