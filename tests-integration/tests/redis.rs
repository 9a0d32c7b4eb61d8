//! The Redis-backed limiter against a real `redis-server` on 127.0.0.1, which each test
//! starts on a port of its own (and stops): decisions equal the reference model at the
//! same (fixed) time, two clients share one quota, and the faults: the server going away
//! mid-run and coming back, a slow server, a flushed script cache, bad input.
//! `.ci/run` installs `redis-server` from Debian's packages when it is missing.

use std::net::TcpListener;
use std::time::Duration;

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

#[test]
fn decisions_equal_the_reference_model_at_the_same_time() {
    let server = Server::start();
    runtime().block_on(async {
        // Intervals in whole microseconds (Redis time's unit), the model in nanoseconds.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..6u64 {
            let interval_us = 1 + next() % 5_000;
            let burst = 1 + (next() % 8) as u32;
            let quota = Quota::try_new(1, Duration::from_micros(interval_us))
                .unwrap()
                .with_burst(burst);
            let (limiter, mut model) = modelled(&server, quota, &format!("model{case}")).await;
            let start_us = 1_000_000_000u64;
            let mut now_us = start_us;
            for step in 0..150 {
                match next() % 4 {
                    0 => now_us += next() % (interval_us * 3),
                    _ => {
                        let n = (next() % u64::from(burst + 2)) as u32;
                        limiter.set_fixed_time(Some(now_us));
                        let real = outcome(limiter.check_key_n("k", n).await);
                        let expected = model.check_n(u128::from(now_us - start_us) * 1_000, n);
                        assert_eq!(real, expected, "case {case}, step {step}, n {n}");
                        let left = limiter.remaining_key("k").await.unwrap();
                        assert_eq!(
                            u128::from(left),
                            model.remaining(u128::from(now_us - start_us) * 1_000),
                            "case {case}, step {step}"
                        );
                    }
                }
            }
        }
    });
}

#[test]
fn two_clients_sharing_a_key_admit_exactly_the_bound() {
    let server = Server::start();
    runtime().block_on(async {
        // 10 per second, burst 5; two workers with their own connections, at fixed times
        // 0, 10 ms, ..., 990 ms: the bound for that second is 5 + 9 = 14 (cells at 0,
        // then one per 100 ms up to 900 ms).
        let quota = Quota::per_second(10).with_burst(5);
        let a = server.limiter(quota).await;
        let b = server.limiter(quota).await;
        let mut admitted = 0;
        for tick in 0..100u64 {
            let t = 5_000_000 + tick * 10_000;
            for worker in [&a, &b] {
                worker.set_fixed_time(Some(t));
                for _ in 0..3 {
                    if worker.check_key("shared").await.is_ok() {
                        admitted += 1;
                    }
                }
            }
        }
        assert_eq!(admitted, 14);
    });
}

#[test]
fn the_real_clock_paces_and_a_refused_key_is_refused_locally() {
    let server = Server::start();
    runtime().block_on(async {
        let limiter = server.limiter(Quota::per_second(2)).await;
        assert!(limiter.check_key_n("k", 2).await.is_ok());
        let wait = match limiter.check_key("k").await {
            Err(RedisDenied::NotUntil(e)) => e.wait_time(),
            other => panic!("{other:?}"),
        };
        assert!(wait > Duration::from_millis(300) && wait <= Duration::from_millis(500));
        // Refused again without asking Redis: stop the server, the answer is the same.
        drop(server);
        assert!(matches!(
            limiter.check_key("k").await,
            Err(RedisDenied::NotUntil(_))
        ));
    });
}

#[test]
fn the_server_going_away_applies_the_policy_and_service_resumes() {
    let server = Server::start();
    let port = server.port;
    let url = server.url();
    runtime().block_on(async {
        let quota = Quota::per_second(1000);
        let closed = RedisLimiter::connect(&url, quota)
            .await
            .unwrap()
            .with_timeout(Duration::from_millis(200));
        let open = RedisLimiter::connect(&url, quota)
            .await
            .unwrap()
            .with_timeout(Duration::from_millis(200))
            .on_failure(FailurePolicy::FailOpen);
        let local = RedisLimiter::connect(&url, quota)
            .await
            .unwrap()
            .with_timeout(Duration::from_millis(200))
            .on_failure(FailurePolicy::Local(Quota::per_hour(2)));
        assert!(closed.check_key("a").await.is_ok());
        drop(server);
        assert!(matches!(
            closed.check_key("b").await,
            Err(RedisDenied::Unavailable(_))
        ));
        assert!(open.check_key("b").await.is_ok());
        // The local share: 2 per hour for this key, then refused.
        assert!(local.check_key("c").await.is_ok());
        assert!(local.check_key("c").await.is_ok());
        assert!(matches!(
            local.check_key("c").await,
            Err(RedisDenied::NotUntil(_))
        ));
        // The server comes back (state lost: a fresh burst); the connection reconnects.
        let _back = Server::on(port);
        let mut resumed = false;
        for _ in 0..100 {
            if closed.check_key("d").await.is_ok() {
                resumed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(resumed, "no service after the server came back");
    });
}

#[test]
fn a_slow_server_times_out_and_a_flushed_script_cache_is_reloaded() {
    let server = Server::start();
    runtime().block_on(async {
        let limiter = server
            .limiter(Quota::per_second(100))
            .await
            .with_timeout(Duration::from_millis(100));
        assert!(limiter.check_key("k").await.is_ok());
        let client = redis::Client::open(server.url()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(limiter.check_key("k").await.is_ok(), "EVALSHA fell back");
        // The server sleeps 1 s: the call gives up after 100 ms and fails closed.
        let sleeper = tokio::spawn(async move {
            let mut admin = client.get_multiplexed_async_connection().await.unwrap();
            stall(&mut admin, "1").await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let start = std::time::Instant::now();
        assert!(matches!(
            limiter.check_key("k").await,
            Err(RedisDenied::Unavailable(_))
        ));
        assert!(start.elapsed() < Duration::from_millis(900));
        sleeper.await.unwrap();
    });
}

#[test]
fn bad_input_gets_clear_errors() {
    let server = Server::start();
    runtime().block_on(async {
        assert!(matches!(
            RedisLimiter::connect("not a url", Quota::per_second(1)).await,
            Err(RedisLimitError::Connect(_))
        ));
        // A port where nothing (or something that is not Redis) answers.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}/", silent.local_addr().unwrap());
        drop(silent);
        assert!(RedisLimiter::connect(&url, Quota::per_second(1))
            .await
            .is_err());
        assert!(matches!(
            RedisLimiter::connect(&server.url(), Quota::per_second(2_000_000)).await,
            Err(RedisLimitError::IntervalBelowMicrosecond)
        ));
        let limiter = server.limiter(Quota::per_second(1)).await;
        let long = "x".repeat(paceline::redis::MAX_KEY_LEN + 1);
        assert!(matches!(
            limiter.check_key(&long).await,
            Err(RedisDenied::BadKey)
        ));
        assert!(matches!(
            limiter.check_key("").await,
            Err(RedisDenied::BadKey)
        ));
        assert!(matches!(
            limiter.check_key_n("k", 2).await,
            Err(RedisDenied::InsufficientCapacity)
        ));
    });
}

#[test]
fn waiters_across_clients_are_served_in_booking_order() {
    let server = Server::start();
    runtime().block_on(async {
        // 20 per second, burst 1: after a spent cell, bookings are 50 ms apart.
        let quota = Quota::per_second(20).with_burst(1);
        let a = std::sync::Arc::new(server.limiter(quota).await);
        let b = std::sync::Arc::new(server.limiter(quota).await);
        assert!(a.check_key("q").await.is_ok());
        let start = std::time::Instant::now();
        let first = tokio::spawn({
            let a = a.clone();
            async move {
                a.until_key_ready("q").await.unwrap();
                start.elapsed()
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await; // a books first
        let second = tokio::spawn({
            let b = b.clone();
            async move {
                b.until_key_ready("q").await.unwrap();
                start.elapsed()
            }
        });
        // A plain check cannot take a booked place.
        assert!(matches!(a.check_key("q").await, Err(RedisDenied::NotUntil(_))));
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        assert!(first >= Duration::from_millis(35), "{first:?}");
        assert!(second >= first + Duration::from_millis(35), "{first:?} then {second:?}");
        assert!(second < Duration::from_secs(3));
        // Within a deadline shorter than the turn: refused at once, nothing booked.
        let refused = a.until_key_ready_within("q", Duration::from_millis(1)).await;
        assert!(matches!(refused, Err(RedisDenied::NotUntil(e)) if e.wait_time() > Duration::from_millis(1)));
    });
}

#[test]
fn a_waiter_dropped_before_its_instant_gives_its_cell_back() {
    let server = Server::start();
    runtime().block_on(async {
        let limiter = server.limiter(Quota::per_second(1).with_burst(1)).await;
        assert!(limiter.check_key("w").await.is_ok()); // the bucket is full again in 1 s
                                                       // A waiter booked 1 s ahead gives up after 50 ms.
        let gave_up =
            tokio::time::timeout(Duration::from_millis(50), limiter.until_key_ready("w")).await;
        assert!(gave_up.is_err());
        // Its refund runs in the background; then a check waits for the first cell's
        // refill (under 1 s), not for the dropped booking's (under 2 s).
        let mut wait = Duration::MAX;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            limiter.set_fixed_time(None); // also forgets the local refusal cache
            wait = match limiter.check_key("w").await {
                Err(RedisDenied::NotUntil(e)) => e.wait_time(),
                other => panic!("{other:?}"),
            };
            if wait < Duration::from_millis(1_000) {
                break;
            }
        }
        assert!(
            wait < Duration::from_millis(1_000),
            "not refunded: {wait:?} to wait"
        );
    });
}

#[test]
fn the_limiter_loads_the_scripts_redis_scripts_exports() {
    // Other clients of the same keys (the Python package) run `paceline::redis_scripts`:
    // it must be the very text the limiter loads and runs.
    let server = Server::start();
    runtime().block_on(async {
        let limiter = server.limiter(Quota::per_second(10)).await;
        assert!(limiter.check_key("k").await.is_ok());
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for text in [
            paceline::redis_scripts::DECIDE,
            paceline::redis_scripts::REFUND,
        ] {
            let sha = redis::Script::new(text).get_hash().to_owned();
            let exists: Vec<bool> = redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(&sha)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(exists, [true], "{sha}");
        }
        // A read tells how far ahead the key's state is: one cell of 100 ms spent.
        let (kind, remaining, ahead): (i64, i64, i64) = redis::cmd("EVAL")
            .arg(paceline::redis_scripts::DECIDE)
            .arg(1)
            .arg("paceline:{k}")
            .arg(100_000_000u64)
            .arg(1_000_000_000u64)
            .arg(-1)
            .arg("")
            .arg(0)
            .arg("")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!((kind, remaining), (2, 9));
        assert!(0 < ahead && ahead <= 100_000_000, "{ahead}");
    });
}
