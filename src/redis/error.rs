//! What can go wrong: building a fleet limiter, and a check.

use super::*;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Why a Redis-backed limiter could not be built.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use paceline::{redis::{RedisLimitError, RedisLimiter}, Quota};
/// let bad = RedisLimiter::connect("not a url", Quota::per_second(1)).await;
/// assert!(matches!(bad, Err(RedisLimitError::Connect(_))));
/// # }
/// ```
#[non_exhaustive]
pub enum RedisLimitError {
    /// The URL is not a Redis URL, or the server could not be reached or is not Redis.
    Connect(redis::RedisError),
    /// The quota's interval is below Redis time's microsecond resolution.
    IntervalBelowMicrosecond,
    /// The quota's burst window (interval × burst) is longer than about 52 days (2^52
    /// ns), past what the script keeps exact.
    WindowTooLong,
    /// The server (or, for a cluster, one of its masters) does not run Lua scripts: it
    /// refused to load paceline's (a server built without its script engine, or one that
    /// disables `EVAL`/`SCRIPT`). Every decision is a script, so nothing would work.
    NoScripts(redis::RedisError),
}

impl fmt::Display for RedisLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisLimitError::Connect(e) => write!(f, "cannot use Redis: {e}"),
            RedisLimitError::IntervalBelowMicrosecond => {
                f.write_str("the quota's interval is below 1 µs, Redis time's resolution")
            }
            RedisLimitError::WindowTooLong => f.write_str(
                "the quota's burst window (interval × burst) is longer than 2^52 ns (52 days), \
                 the most a fleet limiter keeps exact",
            ),
            RedisLimitError::NoScripts(e) => write!(
                f,
                "the server does not run Lua scripts, which every fleet decision is \
                 (SCRIPT LOAD refused: {e})"
            ),
        }
    }
}

impl core::error::Error for RedisLimitError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            RedisLimitError::Connect(e) | RedisLimitError::NoScripts(e) => Some(e),
            RedisLimitError::IntervalBelowMicrosecond | RedisLimitError::WindowTooLong => None,
        }
    }
}

/// Why a check was refused.
///
/// # Examples
///
/// ```no_run
/// # async fn run(limiter: paceline::redis::RedisLimiter) {
/// use paceline::redis::RedisDenied;
/// match limiter.check_key("tenant-42").await {
///     Ok(()) => { /* go */ }
///     Err(RedisDenied::NotUntil(wait)) => println!("retry in {:?}", wait.wait_time()),
///     Err(RedisDenied::Unavailable(e)) => eprintln!("Redis is down, failing closed: {e}"),
///     Err(other) => eprintln!("{other}"),
/// }
/// # }
/// ```
#[non_exhaustive]
pub enum RedisDenied {
    /// Rate limited; try again after the wait.
    NotUntil(NotUntil),
    /// More cells than the burst: never admissible.
    InsufficientCapacity,
    /// Redis could not answer (unreachable, slower than the timeout, loading, or `BUSY`
    /// running another client's script) and the policy is
    /// [`FailurePolicy::FailClosed`]; also from [`RedisLimiter::remaining`], which has no
    /// decision to fall back on.
    Unavailable(redis::RedisError),
    /// The key is empty or longer than [`MAX_KEY_LEN`].
    BadKey,
    /// Redis answered with an error: a value of another type, or one that is not the
    /// limiter's, at the limiter's key (something else writes there), or a script error.
    /// Not an outage: nothing is admitted, whatever the failure policy.
    Rejected(redis::RedisError),
    /// Redis is out of memory (`maxmemory` reached with a policy that evicts nothing) and
    /// refused to write. Not an outage: nothing is admitted, whatever the failure policy.
    OutOfMemory(redis::RedisError),
}

impl fmt::Display for RedisDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisDenied::NotUntil(e) => e.fmt(f),
            RedisDenied::InsufficientCapacity => f.write_str("more cells than the burst"),
            RedisDenied::Unavailable(e) => write!(f, "Redis unreachable or too slow: {e}"),
            RedisDenied::BadKey => write!(f, "keys are 1 to {MAX_KEY_LEN} bytes"),
            RedisDenied::Rejected(e) => write!(f, "Redis refused the rate-limit call: {e}"),
            RedisDenied::OutOfMemory(e) => write!(f, "Redis is out of memory: {e}"),
        }
    }
}

impl core::error::Error for RedisDenied {}

debug_as_display!(RedisLimitError, RedisDenied);

/// Keys are 1 to [`MAX_KEY_LEN`] bytes.
pub(super) fn check_key(key: &str) -> Result<(), RedisDenied> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(RedisDenied::BadKey);
    }
    Ok(())
}
