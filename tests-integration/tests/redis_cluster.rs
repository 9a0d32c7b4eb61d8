//! The Redis-backed limiter over a real 3-master Redis Cluster on loopback ports (each
//! test starts its own, with `redis-cli --cluster create`, and stops it): keys spread over
//! every master, decisions equal the reference model, clients share one quota, waiting is
//! booked, a flushed script cache is reloaded on the master that needs it, and a master
//! going away applies the policy to its keys only, then service resumes.

use std::time::Duration;

use paceline::redis::{FailurePolicy, RedisDenied, RedisLimiter};
use paceline::Quota;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Cluster;

#[path = "../../src/testing/reference_model.rs"]
#[allow(dead_code)]
mod reference_model;
use reference_model::Model;

#[path = "support/redis_common.rs"]
mod redis_common;
use redis_common::{outcome, runtime};

/// Runs `test` on a runtime of its own with a fresh cluster, which the test owns.
fn on_cluster<F: std::future::Future<Output = ()>>(test: impl FnOnce(Cluster) -> F) {
    let cluster = Cluster::start();
    runtime().block_on(test(cluster));
}

async fn connect(cluster: &Cluster, quota: Quota) -> RedisLimiter {
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisLimiter::connect_cluster(&nodes, quota).await.unwrap()
}

/// The keys node `i` holds (`KEYS` is fine on a test's few keys).
fn keys_on(cluster: &Cluster, i: usize) -> Vec<String> {
    cluster
        .cli(i, &["keys", "*"])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn keys_spread_over_every_master_and_decisions_equal_the_model() {
    on_cluster(|cluster| async move {
        let quota = Quota::try_new(1, Duration::from_micros(700))
            .unwrap()
            .with_burst(3);
        let limiter = connect(&cluster, quota).await;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let keys: Vec<String> = (0..24).map(|i| format!("tenant-{i}")).collect();
        let mut models: Vec<Model> = keys.iter().map(|_| Model::new(quota)).collect();
        let start_us = 2_000_000_000u64;
        let mut now_us = start_us;
        for step in 0..400 {
            if next() % 4 == 0 {
                now_us += next() % 2_100;
                continue;
            }
            let k = (next() % keys.len() as u64) as usize;
            let n = (next() % 5) as u32;
            limiter.set_fixed_time(Some(now_us));
            let real = outcome(limiter.check_key_n(&keys[k], n).await);
            let expected = models[k].check_n(u128::from(now_us - start_us) * 1_000, n);
            assert_eq!(real, expected, "step {step}, key {k}, n {n}");
        }
        // In test mode the keys do not expire: every master holds some of them, each
        // under its own hash tag.
        let mut total = 0;
        for i in 0..3 {
            let held = keys_on(&cluster, i);
            assert!(!held.is_empty(), "master {i} holds no key");
            assert!(
                held.iter().all(|k| k.starts_with("paceline:{tenant-")),
                "{held:?}"
            );
            total += held.len();
        }
        assert!(total <= keys.len());
    });
}

#[test]
fn two_cluster_clients_sharing_keys_admit_exactly_the_bound() {
    on_cluster(|cluster| async move {
        // 10 per second, burst 5, three keys (on different masters, as the test above
        // shows they spread): at times 0, 10 ms, ..., 990 ms each key admits 5 + 9 = 14.
        let quota = Quota::per_second(10).with_burst(5);
        let a = connect(&cluster, quota).await;
        let b = connect(&cluster, quota).await;
        let keys = ["alpha", "beta", "gamma"];
        let mut admitted = [0; 3];
        for tick in 0..100u64 {
            let t = 5_000_000 + tick * 10_000;
            for worker in [&a, &b] {
                worker.set_fixed_time(Some(t));
                for (k, key) in keys.iter().enumerate() {
                    for _ in 0..3 {
                        if worker.check_key(key).await.is_ok() {
                            admitted[k] += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(admitted, [14; 3]);
    });
}

#[test]
fn waiting_is_booked_and_a_flushed_script_cache_is_reloaded() {
    on_cluster(|cluster| async move {
        let quota = Quota::per_second(20).with_burst(1);
        let limiter = connect(&cluster, quota).await;
        let start = std::time::Instant::now();
        for key in ["a", "b", "c", "d"] {
            assert!(limiter.check_key(key).await.is_ok());
        }
        for i in 0..3 {
            assert_eq!(cluster.cli(i, &["script", "flush"]).trim(), "OK");
        }
        // Each key's booked turn is 50 ms after its spent cell, whichever master runs it,
        // so the first wait alone ends at least 50 ms after `start` (less a little for the
        // clocks: Redis gives the wait, the sleep is local).
        for key in ["a", "b", "c", "d"] {
            limiter.until_key_ready(key).await.unwrap();
        }
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "{:?}",
            start.elapsed()
        );
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(matches!(
            limiter.check_key("a").await,
            Err(RedisDenied::NotUntil(_))
        ));
    });
}

#[test]
fn a_master_going_away_applies_the_policy_to_its_keys_and_service_resumes() {
    let mut cluster = Cluster::start();
    let rt = runtime();
    let quota = Quota::per_second(1000);
    let (closed, local) = rt.block_on(async {
        let closed = connect(&cluster, quota)
            .await
            .with_timeout(Duration::from_millis(300));
        let local = connect(&cluster, quota)
            .await
            .with_timeout(Duration::from_millis(300))
            .on_failure(FailurePolicy::Local(Quota::per_hour(2)));
        // Find a key that lives on master 0, and one that does not.
        for i in 0..40 {
            closed.set_fixed_time(Some(1_000_000));
            closed.check_key(&format!("k{i}")).await.unwrap();
        }
        closed.set_fixed_time(None);
        (closed, local)
    });
    let on_0 = keys_on(&cluster, 0)[0].clone();
    let on_0 = on_0
        .trim_start_matches("paceline:{")
        .trim_end_matches('}')
        .to_owned();
    let on_1 = keys_on(&cluster, 1)[0].clone();
    let on_1 = on_1
        .trim_start_matches("paceline:{")
        .trim_end_matches('}')
        .to_owned();
    // The values written at the fixed time have no expiry and a 1970 timestamp: on the
    // servers' clock no limiter left them there (they would be refused), so they go.
    for i in 0..3 {
        cluster.cli(i, &["FLUSHALL"]);
    }
    cluster.stop(0);
    rt.block_on(async {
        let gone = closed.check_key(&on_0).await;
        assert!(matches!(gone, Err(RedisDenied::Unavailable(_))), "{gone:?}");
        // The local share: 2 per hour for that key, then refused.
        assert!(local.check_key(&on_0).await.is_ok());
        assert!(local.check_key(&on_0).await.is_ok());
        assert!(matches!(
            local.check_key(&on_0).await,
            Err(RedisDenied::NotUntil(_))
        ));
        // With a master down, a cluster refuses every slot by default
        // (`cluster-require-full-coverage yes`), so other keys fail the same way once the
        // nodes notice; none of it panics.
        let _ = closed.check_key(&on_1).await;
    });
    cluster.restart(0);
    rt.block_on(async {
        let mut resumed = false;
        for _ in 0..100 {
            if closed.check_key(&on_0).await.is_ok() && closed.check_key(&on_1).await.is_ok() {
                resumed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(resumed, "no service after the master came back");
    });
}
