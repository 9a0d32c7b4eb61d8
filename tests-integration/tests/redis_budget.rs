//! The fleet budget (`redis::RedisBudget`) against a real `redis-server` on a loopback
//! port: several clients (each its own owner, as processes of a fleet are) sharing one
//! queue, one cap and the rates; settles; clients that vanish with turns in flight;
//! values the budget did not write; the server going away and coming back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::budget::fleet::LEASE;
use paceline::budget::BudgetError;
use paceline::redis::{RedisBudget, RedisBudgetError};
use paceline::Quota;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `test` on a runtime of its own with the URL of a fresh server, which outlives the
/// runtime.
fn on_server<F: std::future::Future<Output = ()>>(test: impl FnOnce(String) -> F) {
    let server = Server::start();
    runtime().block_on(test(server.url()));
}

async fn budget(url: &str, name: &str, rates: &[(&str, Quota)], cap: Option<u32>) -> RedisBudget {
    let mut builder = RedisBudget::builder();
    for (n, q) in rates {
        builder = builder.rate(*n, *q);
    }
    if let Some(cap) = cap {
        builder = builder.in_flight(cap);
    }
    builder.connect(url, name).await.unwrap()
}

async fn set(url: &str, key: &str, value: &str) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[test]
fn clients_share_the_cap_and_every_caller_gets_its_turn() {
    on_server(|url| async move {
        let clients = [
            budget(&url, "cap", &[], Some(2)).await,
            budget(&url, "cap", &[], Some(2)).await,
        ];
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let b = clients[i % 2].clone();
                let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                tokio::spawn(async move {
                    let turn = b.acquire(&[]).await.unwrap();
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    drop(turn);
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2, "the cap held, and was used");
        // Every permit came back.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(clients[0].in_flight().await.unwrap(), 0);
        assert_eq!(clients[1].waiting().await.unwrap(), 0);
    });
}

#[test]
fn clients_together_keep_to_the_rates() {
    on_server(|url| async move {
        let rates = [("requests", Quota::per_second(50).with_burst(5))];
        let clients = [
            budget(&url, "rate", &rates, None).await,
            budget(&url, "rate", &rates, None).await,
            budget(&url, "rate", &rates, None).await,
        ];
        let started = Instant::now();
        let tasks: Vec<_> = (0..45)
            .map(|i| {
                let b = clients[i % 3].clone();
                tokio::spawn(async move { drop(b.acquire(&[]).await.unwrap()) })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // 5 at once, then 40 at 20 ms each: at least 0.8 s, whatever the clients.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(780), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    });
}

#[test]
fn a_heavy_caller_is_not_overtaken_and_a_settle_refunds_for_every_client() {
    on_server(|url| async move {
        let rates = [("tokens", Quota::per_second(100).with_burst(100))];
        let a = budget(&url, "settle", &rates, None).await;
        let b = budget(&url, "settle", &rates, None).await;
        let turn = a.acquire(&[("tokens", 100)]).await.unwrap();
        // b's heavy caller waits first; a's light one after it waits behind it.
        let heavy = tokio::spawn({
            let b = b.clone();
            async move { (b.acquire(&[("tokens", 80)]).await.unwrap(), Instant::now()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let light = tokio::spawn({
            let a = a.clone();
            async move { (a.acquire(&[("tokens", 1)]).await.unwrap(), Instant::now()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(b.waiting().await.unwrap(), 2);
        // The call used 10 of its 100 tokens: 90 come back, for the heavy caller at once.
        let settled = Instant::now();
        turn.settle(&[("tokens", 10)]).await.unwrap();
        let (heavy, heavy_at) = heavy.await.unwrap();
        let (light, light_at) = light.await.unwrap();
        assert!(
            heavy_at - settled < Duration::from_millis(300),
            "{:?}",
            heavy_at - settled
        );
        assert!(
            heavy_at <= light_at,
            "the light caller did not overtake the heavy one"
        );
        drop((heavy, light));
    });
}

#[test]
fn a_client_that_vanishes_with_turns_gives_their_permits_back_within_a_lease() {
    let server = Server::start();
    let url = server.url();
    // A client on a runtime of its own takes the one permit, and vanishes: its runtime
    // (with its renewing task) is gone, its turn never ended, as a killed process's.
    let vanished = runtime();
    vanished.block_on(async {
        let b = budget(&url, "lease", &[], Some(1)).await;
        std::mem::forget(b.acquire(&[]).await.unwrap());
    });
    drop(vanished);
    runtime().block_on(async {
        let b = budget(&url, "lease", &[], Some(1)).await;
        let started = Instant::now();
        let turn = tokio::time::timeout(LEASE * 2, b.acquire(&[])).await;
        let took = started.elapsed();
        assert!(turn.unwrap().is_ok());
        assert!(took <= LEASE + Duration::from_secs(1), "{took:?}");
    });
}

#[test]
fn a_client_holding_a_turn_past_its_lease_keeps_its_permit() {
    on_server(|url| async move {
        let a = budget(&url, "renew", &[], Some(1)).await;
        let b = budget(&url, "renew", &[], Some(1)).await;
        let turn = a.acquire(&[]).await.unwrap();
        // Longer than a lease: a's client renews it, so b waits for the turn's end.
        let longer = LEASE + Duration::from_secs(2);
        let late = b.acquire_within(&[], longer).await;
        assert!(
            matches!(late, Err(RedisBudgetError::Budget(BudgetError::TimedOut))),
            "{late:?}"
        );
        drop(turn);
        let turn = tokio::time::timeout(Duration::from_secs(2), b.acquire(&[])).await;
        assert!(turn.unwrap().is_ok());
    });
}

#[test]
fn a_dropped_waiter_leaves_the_queue_and_a_deadline_too_far_off_is_refused_at_once() {
    on_server(|url| async move {
        let rates = [("requests", Quota::per_minute(1).with_burst(1))];
        let b = budget(&url, "leave", &rates, None).await;
        let turn = b.acquire(&[]).await.unwrap();
        let gone = tokio::time::timeout(Duration::from_millis(100), b.acquire(&[])).await;
        assert!(gone.is_err());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(b.waiting().await.unwrap(), 0);
        let started = Instant::now();
        let far = b.acquire_within(&[], Duration::from_secs(1)).await;
        assert!(
            matches!(
                far,
                Err(RedisBudgetError::Budget(BudgetError::NotWithin { .. }))
            ),
            "{far:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(500));
        assert_eq!(b.waiting().await.unwrap(), 0, "nothing was booked");
        drop(turn);
    });
}

#[test]
fn a_value_it_did_not_write_is_refused_and_never_overwritten() {
    let server = Server::start();
    let url = server.url();
    runtime().block_on(async {
        set(&url, "paceline:{foreign}:budget", "someone else's").await;
        let b = budget(&url, "foreign", &[], Some(1)).await;
        let refused = b.try_acquire(&[]).await;
        assert!(
            matches!(refused, Err(RedisBudgetError::Foreign(_))),
            "{refused:?}"
        );
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let kept: String = redis::cmd("GET")
            .arg("paceline:{foreign}:budget")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kept, "someone else's");
        // A value of another type: Redis's own refusal.
        let _: () = redis::cmd("RPUSH")
            .arg("paceline:{listed}:budget")
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
        let listed = budget(&url, "listed", &[], Some(1)).await;
        let wrong = listed.acquire(&[]).await;
        assert!(
            matches!(wrong, Err(RedisBudgetError::Rejected(_))),
            "{wrong:?}"
        );
        // Another budget of the same name with other rates: refused too.
        let one = budget(&url, "rules", &[("r", Quota::per_second(5))], None).await;
        drop(one.try_acquire(&[]).await.unwrap());
        let other = budget(&url, "rules", &[("r", Quota::per_second(6))], None).await;
        let mismatch = other.try_acquire(&[]).await;
        assert!(
            matches!(mismatch, Err(RedisBudgetError::Foreign(_))),
            "{mismatch:?}"
        );
    });
}

#[test]
fn the_server_going_away_fails_calls_within_the_timeout_and_its_return_serves_again() {
    let server = Server::start();
    let port = server.port;
    runtime().block_on(async {
        let b = RedisBudget::builder()
            .in_flight(1)
            .timeout(Duration::from_millis(200))
            .connect(&server.url(), "away")
            .await
            .unwrap();
        let turn = b.acquire(&[]).await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.acquire(&[]).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(server);
        let started = Instant::now();
        let failed = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(failed, Err(RedisBudgetError::Unavailable(_))),
            "{failed:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        let down = b.try_acquire(&[]).await;
        assert!(
            matches!(down, Err(RedisBudgetError::Unavailable(_))),
            "{down:?}"
        );
        drop(turn);
        // A server again on the same port (empty: a restart loses the budget).
        let _back = Server::on(port);
        let mut served = None;
        for _ in 0..50 {
            match b.try_acquire(&[]).await {
                Ok(turn) => {
                    served = Some(turn);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        assert!(served.is_some(), "served again once the server is back");
    });
}

#[test]
fn the_turns_of_a_budget_lost_to_a_flushall_end_nothing_in_the_one_made_again() {
    let server = Server::start();
    let url = server.url();
    runtime().block_on(async {
        let b = budget(&url, "lost", &[], Some(2)).await;
        let old = [b.acquire(&[]).await.unwrap(), b.acquire(&[]).await.unwrap()];
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        let new = [b.acquire(&[]).await.unwrap(), b.acquire(&[]).await.unwrap()];
        for turn in old {
            turn.settle(&[]).await.unwrap();
        }
        assert_eq!(
            b.in_flight().await.unwrap(),
            2,
            "the new turns are still counted"
        );
        assert!(matches!(
            b.try_acquire(&[]).await,
            Err(RedisBudgetError::Budget(BudgetError::WouldWait))
        ));
        drop(new);
    });
}

#[test]
fn a_name_that_would_split_the_keys_over_cluster_slots_is_refused() {
    on_server(|url| async move {
        for name in ["", "}x", "a}b"] {
            let built = RedisBudget::builder()
                .in_flight(1)
                .connect(&url, name)
                .await;
            assert!(matches!(built, Err(RedisBudgetError::BadName)), "{name:?}");
        }
        let one_tag = RedisBudget::builder()
            .in_flight(1)
            .connect(&url, "a{b")
            .await;
        assert!(one_tag.is_ok());
    });
}
