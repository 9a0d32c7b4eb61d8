//! When Redis cannot answer: the stated policy, and which failures are outages at all.

use super::*;

/// What to do when Redis cannot answer (unreachable, or slower than the timeout). Errors
/// Redis *answers* are not outages: they never follow the policy.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
/// use paceline::{redis::{FailurePolicy, RedisLimiter}, Quota};
/// let limiter = RedisLimiter::connect("redis://127.0.0.1/", Quota::per_second(100))
///     .await?
///     .on_failure(FailurePolicy::FailOpen);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Refuse: [`RedisDenied::Unavailable`]. Never more than the quota; nothing passes
    /// while Redis is down.
    FailClosed,
    /// Admit: the service keeps working, unlimited while Redis is down.
    FailOpen,
    /// Decide in process with this quota (typically the fleet's quota divided by the
    /// number of workers), per key. The fleet may then exceed the quota by at most the
    /// sum of the local quotas.
    Local(Quota),
}

impl FailurePolicy {
    /// The policy's name in the metrics' `policy` label.
    pub(super) fn label(&self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::Local(_) => "local",
        }
    }
}

/// What a failed call means.
pub(super) enum Failure {
    /// No answer: unreachable, or slower than the timeout. The failure policy decides.
    Unreachable(redis::RedisError),
    /// Redis answered with an error: reported as it is (`RedisDenied::Rejected` or
    /// `OutOfMemory`), whatever the policy.
    Answered(RedisDenied),
}

impl Failure {
    /// [`Failure::of`], counted by kind for the limiter's metrics (feature `metrics`).
    pub(super) fn counted(e: redis::RedisError, metrics: &LimitMetrics) -> Failure {
        let failure = Failure::of(e);
        metrics.redis_failure(match &failure {
            Failure::Unreachable(_) => "unreachable",
            Failure::Answered(RedisDenied::OutOfMemory(_)) => "out_of_memory",
            Failure::Answered(_) => "rejected",
        });
        failure
    }

    pub(super) fn of(e: redis::RedisError) -> Failure {
        use redis::{ErrorKind, ServerErrorKind};
        let unreachable = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            // Redirections the client could not follow, a cluster without coverage.
            || e.is_cluster_error()
            // Another client's script past the server's time limit: Redis serves no one
            // until it ends or is killed, as while it loads.
            || e.code() == Some("BUSY")
            || matches!(
                e.kind(),
                ErrorKind::ClusterConnectionNotFound
                    | ErrorKind::Server(
                        ServerErrorKind::BusyLoading
                            | ServerErrorKind::MasterDown
                            | ServerErrorKind::ReadOnly
                    )
            );
        if unreachable {
            Failure::Unreachable(e)
        } else if e.code() == Some("OOM") {
            Failure::Answered(RedisDenied::OutOfMemory(e))
        } else {
            Failure::Answered(RedisDenied::Rejected(e))
        }
    }
}
