//! What `tests/redis.rs` and `tests/redis_cluster.rs` share (each includes this file by
//! path, beside the reference model): a runtime, and a decision as the model writes it.

use paceline::redis::RedisDenied;

use crate::reference_model::Outcome;

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
