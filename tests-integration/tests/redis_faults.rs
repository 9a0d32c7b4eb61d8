//! The fleet limiter under faults and hostile state, against real `redis-server`s on
//! loopback ports: bookings whose answers never arrive, refusals of several cells,
//! intervals of a fraction of a microsecond, values Redis holds that the limiter did not
//! write, a full server, the local fallback's deadline, windows past what the script
//! keeps exact. Each test failed on the code before its fix.

use std::time::{Duration, Instant};

use paceline::redis::{FailurePolicy, RedisDenied, RedisLimitError, RedisLimiter};
use paceline::Quota;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

#[path = "../../src/testing/reference_model.rs"]
#[allow(dead_code)]
mod reference_model;

#[path = "support/redis_common.rs"]
mod redis_common;
use redis_common::{modelled, outcome, runtime, stall};

async fn admin(server: &Server) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn redis_cmd(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd.query_async(conn).await.unwrap();
}

#[test]
fn bookings_whose_answers_never_arrive_are_given_back() {
    let server = Server::start();
    runtime().block_on(async {
        // One cell per 10 s, burst 1, spent.
        let quota = Quota::per_minute(6).with_burst(1);
        let limiter = server
            .limiter(quota)
            .await
            .with_timeout(Duration::from_millis(100));
        limiter.check_key("k").await.unwrap();
        // The server stalls for 0.7 s: waiters time out (their calls give up
        // after 100 ms) or are dropped by their callers, while their bookings wait in
        // the server's queue.
        let sleeper = tokio::spawn({
            let mut admin = admin(&server).await;
            async move {
                stall(&mut admin, "0.7").await;
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waits = (0..10).map(|i| {
            let limiter = &limiter;
            async move {
                if i % 2 == 0 {
                    let late = limiter.until_key_ready("k").await;
                    assert!(matches!(late, Err(RedisDenied::Unavailable(_))), "{late:?}");
                } else {
                    let gone = tokio::time::timeout(
                        Duration::from_millis(50),
                        limiter.until_key_ready("k"),
                    );
                    assert!(gone.await.is_err());
                }
            }
        });
        futures::future::join_all(waits).await;
        sleeper.await.unwrap();
        // The refunds land once the server answers again.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let wait = match limiter.check_key("k").await {
            Err(RedisDenied::NotUntil(e)) => e.wait_time(),
            other => panic!("{other:?}"),
        };
        assert!(
            wait <= Duration::from_secs(10),
            "the key is blocked for {wait:?} after a 0.7 s stall"
        );
    });
}

#[test]
fn realtime_a_refusal_of_many_cells_refuses_no_fewer_locally() {
    let server = Server::start();
    runtime().block_on(async {
        let limiter = server.limiter(Quota::per_hour(100).with_burst(10)).await;
        limiter.check_key_n("k", 6).await.unwrap();
        assert!(matches!(
            limiter.check_key_n("k", 5).await,
            Err(RedisDenied::NotUntil(_))
        ));
        // 4 cells are left: single cells and a batch of 4 are asked for, not refused.
        assert!(limiter.check_key_n("k", 0).await.is_ok());
        for _ in 0..4 {
            assert!(limiter.check_key("k").await.is_ok());
        }
        let refused = limiter.check_key("k").await;
        assert!(
            matches!(refused, Err(RedisDenied::NotUntil(_))),
            "{refused:?}"
        );
        assert!(
            limiter.check_key_n("k", 0).await.is_ok(),
            "0 cells are always granted"
        );
    });
}

#[test]
fn fractional_microsecond_intervals_decide_as_the_in_process_model() {
    let server = Server::start();
    runtime().block_on(async {
        for (interval, burst) in [(1_999u64, 20_000u32), (3_333, 300), (1_000_001, 7)] {
            let quota = Quota::try_new(1, Duration::from_nanos(interval))
                .unwrap()
                .with_burst(burst);
            let (limiter, mut model) = modelled(&server, quota, &format!("frac{interval}")).await;
            let mut now_us = 1_000_000u64;
            let mut seed = interval;
            for step in 0..400 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                now_us += (seed >> 40) % 50;
                let n = ((seed >> 20) % u64::from(burst / 2 + 1)) as u32;
                limiter.set_fixed_time(Some(now_us));
                let real = outcome(limiter.check_key_n("k", n).await);
                let expected = model.check_n(u128::from(now_us) * 1000, n);
                assert_eq!(real, expected, "interval {interval} ns, step {step}, n {n}");
            }
        }
    });
}

#[test]
fn errors_redis_answered_are_not_outages() {
    let server = Server::start();
    runtime().block_on(async {
        let quota = Quota::per_minute(2).with_burst(5);
        let open = server
            .limiter(quota)
            .await
            .on_failure(FailurePolicy::FailOpen);
        let closed = server.limiter(quota).await;
        let mut admin = admin(&server).await;
        // Something else wrote a hash at the limiter's key: nothing is admitted.
        redis_cmd(&mut admin, &["HSET", "paceline:{hash}", "a", "1"]).await;
        for _ in 0..10 {
            let r = open.check_key("hash").await;
            assert!(matches!(r, Err(RedisDenied::Rejected(_))), "{r:?}");
        }
        let r = closed.check_key("hash").await;
        assert!(matches!(r, Err(RedisDenied::Rejected(_))), "{r:?}");
        assert!(matches!(
            open.remaining_key("hash").await,
            Err(RedisDenied::Rejected(_))
        ));
        // Values the limiter never writes: refused as unreadable, never a 0 wait.
        // Nor numbers another application keeps there, nor values of the limiter's shape
        // that no limiter wrote (one from 1970: a limiter's value expires with its TAT;
        // a tail that is not a list of bookings).
        for value in [
            "1e300",
            "inf",
            "nan",
            "garbage",
            "99999999999999999999999",
            "42",
            "-5",
            "1 2",
            "1 2 not-ours",
        ] {
            redis_cmd(&mut admin, &["SET", "paceline:{bad}", value]).await;
            let r = open.check_key("bad").await;
            assert!(matches!(r, Err(RedisDenied::Rejected(_))), "{value}: {r:?}");
            let kept: String = redis::cmd("GET")
                .arg("paceline:{bad}")
                .query_async(&mut admin)
                .await
                .unwrap();
            assert_eq!(kept, value);
        }
        // A full server that evicts nothing: its own error, nothing admitted.
        redis_cmd(
            &mut admin,
            &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
        )
        .await;
        redis_cmd(&mut admin, &["CONFIG", "SET", "maxmemory", "1"]).await;
        for _ in 0..5 {
            let r = open.check_key("full").await;
            assert!(matches!(r, Err(RedisDenied::OutOfMemory(_))), "{r:?}");
        }
        redis_cmd(&mut admin, &["CONFIG", "SET", "maxmemory", "0"]).await;
        assert!(open.check_key("full").await.is_ok());
        // An outage still follows the policy, and says so plainly.
        drop(server);
        assert!(open.check_key("other").await.is_ok());
        let down = open.remaining_key("other").await.unwrap_err();
        assert!(matches!(down, RedisDenied::Unavailable(_)));
        assert!(!down.to_string().contains("failing closed"), "{down}");
    });
}

#[test]
fn the_local_fallback_keeps_the_callers_maximum() {
    let server = Server::start();
    let url = server.url();
    runtime().block_on(async {
        let limiter = RedisLimiter::connect(&url, Quota::per_second(100))
            .await
            .unwrap()
            .with_timeout(Duration::from_millis(100))
            .on_failure(FailurePolicy::Local(Quota::per_minute(30).with_burst(1)));
        drop(server);
        let max = Duration::from_millis(50);
        assert!(limiter.until_key_ready_within("k", max).await.is_ok());
        let start = Instant::now();
        let late = limiter.until_key_ready_within("k", max).await;
        assert!(matches!(late, Err(RedisDenied::NotUntil(_))), "{late:?}");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
    });
}

#[test]
fn windows_past_what_the_script_keeps_exact_are_refused_at_connect() {
    let server = Server::start();
    runtime().block_on(async {
        let huge = Quota::per_hour(1).with_burst(u32::MAX);
        let refused = RedisLimiter::connect(&server.url(), huge).await;
        assert!(
            matches!(refused, Err(RedisLimitError::WindowTooLong)),
            "{refused:?}"
        );
        // 50 days is fine.
        let long = Quota::per_hour(1).with_burst(1_200);
        assert!(RedisLimiter::connect(&server.url(), long).await.is_ok());
    });
}

#[test]
fn a_server_that_does_not_run_scripts_is_refused_at_connect_with_the_reason() {
    // A server whose script commands are switched off, as some managed services do.
    let server = Server::with_args(&[
        "--rename-command",
        "SCRIPT",
        "",
        "--rename-command",
        "EVAL",
        "",
        "--rename-command",
        "EVALSHA",
        "",
    ]);
    let result = runtime().block_on(RedisLimiter::connect(&server.url(), Quota::per_second(5)));
    match result {
        Err(e @ RedisLimitError::NoScripts(_)) => {
            let text = e.to_string();
            assert!(text.contains("does not run Lua scripts"), "{text}");
            assert!(text.contains("SCRIPT LOAD refused"), "{text}");
        }
        Err(other) => panic!("the wrong error: {other}"),
        Ok(_) => panic!("connected to a server that cannot run a single decision"),
    }
    // The same server with its scripts is fine.
    let fine = Server::start();
    assert!(runtime()
        .block_on(RedisLimiter::connect(&fine.url(), Quota::per_second(5)))
        .is_ok());
}

#[test]
fn a_server_busy_with_another_clients_script_is_an_outage() {
    let server = Server::with_args(&["--lua-time-limit", "20"]);
    let cli = |args: &[&str]| {
        let mut command = std::process::Command::new(redis_server::cli_binary());
        command
            .args(["-p", &server.port.to_string()])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command
    };
    let outcome = runtime().block_on(async {
        let quota = Quota::per_second(10);
        let open = server
            .limiter(quota)
            .await
            .on_failure(FailurePolicy::FailOpen);
        let closed = server.limiter(quota).await;
        // Another tenant's endless script: past its time limit Redis answers BUSY to all.
        let mut blocker = cli(&["EVAL", "while true do end", "0"]).spawn().unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let outcome = (open.check_key("k").await, closed.check_key("k").await);
        let _ = cli(&["SCRIPT", "KILL"]).status();
        let _ = blocker.wait();
        outcome
    });
    assert!(outcome.0.is_ok(), "{:?}", outcome.0);
    assert!(
        matches!(outcome.1, Err(RedisDenied::Unavailable(_))),
        "{:?}",
        outcome.1
    );
}
