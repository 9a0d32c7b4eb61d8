//! What `tests/redis.rs` and `tests/redis_cluster.rs` share (each includes this file by
//! path, beside the reference model): a runtime, a decision as the model writes it, a
//! limiter paired with the model it must decide as, and a stalled server.

use paceline::redis::{RedisDenied, RedisLimiter};
use paceline::Quota;

use crate::redis_server::Server;
use crate::reference_model::{Model, Outcome};

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub(crate) fn outcome(result: Result<(), RedisDenied>) -> Outcome {
    match result {
        Ok(()) => Outcome::Admitted,
        Err(RedisDenied::NotUntil(e)) => Outcome::Wait(e.wait_time().as_nanos()),
        Err(RedisDenied::InsufficientCapacity) => Outcome::Never,
        Err(other) => panic!("unexpected {other:?}"),
    }
}

/// A limiter of `quota` on `server`, its keys under `prefix` (apart from other cases'), and
/// a fresh model of the same quota.
#[allow(dead_code)] // `tests/redis_cluster.rs` has models of its own
pub(crate) async fn modelled(server: &Server, quota: Quota, prefix: &str) -> (RedisLimiter, Model) {
    (
        server.limiter(quota).await.with_prefix(prefix),
        Model::new(quota),
    )
}

/// Stalls the server behind `admin` for `seconds` (`DEBUG SLEEP`). Its own answer may time
/// out on the client side: only the stall matters, so the result is dropped.
#[allow(dead_code)] // `tests/redis_cluster.rs` stops its nodes instead
pub(crate) async fn stall(admin: &mut redis::aio::MultiplexedConnection, seconds: &str) {
    let _: redis::RedisResult<()> = redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(seconds)
        .query_async(admin)
        .await;
}
