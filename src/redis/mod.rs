//! One quota across a fleet: GCRA with its state in Redis (cargo feature `redis`).
//!
//! ```no_run
//! # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
//! use paceline::redis::{FailurePolicy, RedisLimiter};
//! use paceline::Quota;
//!
//! // Every worker of the fleet builds the same limiter: together they admit 100/s.
//! let limiter = RedisLimiter::connect("redis://127.0.0.1/", Quota::per_second(100))
//!     .await?
//!     .on_failure(FailurePolicy::FailClosed);
//! if limiter.check_key("partner-api").await.is_ok() {
//!     // call the API
//! }
//! # Ok(()) }
//! ```
//!
//! # Implementation notes
//!
//! * **The same decisions as paceline's GCRA**, made server-side by one Lua script per call
//!   (sent with `EVALSHA`; the `redis` crate loads it again if the script cache was
//!   flushed), in whole nanoseconds (a 1.999 µs interval is 1999 ns) at the Redis
//!   server's `TIME`: one clock for the whole fleet, so machines whose clocks drift cannot
//!   over-admit. No `redis.replicate_commands()` (Redis 5+ replicates scripts by their
//!   effects). The script's arithmetic is exact (`scripts` explains how, in Lua's
//!   doubles); burst windows longer than about 52 days are refused when the limiter is
//!   built ([`RedisLimitError::WindowTooLong`]).
//! * **One Redis key per limited key**, `prefix:{key}`: the key is its own hash tag, so a
//!   Redis Cluster ([`RedisLimiter::connect_cluster`], feature `redis-cluster`) spreads
//!   keys over its slots and runs each decision on the master owning its key. Each expires once it has refilled, so Redis
//!   memory follows the active keys.
//! * **A local fast path that cannot over-admit**: a key Redis just refused is refused
//!   locally until the instant Redis gave, for as many cells as were refused or more
//!   (fewer cells fit sooner, and are asked for), so a flood of refusals for one key costs
//!   no round trips. Admissions always ask Redis.
//! * **When Redis is unreachable or slow** (each call has a timeout), the configured
//!   [`FailurePolicy`] decides: refuse, admit, or fall back to an in-process limiter with a
//!   share of the quota. The connection reconnects in the background. An error Redis
//!   *answered* is not an outage, and the policy does not apply: a value of another type
//!   or an unreadable value at the limiter's key ([`RedisDenied::Rejected`]) or a full
//!   server ([`RedisDenied::OutOfMemory`]) refuses, whatever the policy.
//! * **Bookings can always be given back**: a waiter books with an id chosen before its
//!   call is sent, so a booking whose answer never arrived (a timeout, a caller that went
//!   away) is given back as surely as one that was answered and then cancelled.
//! * **A Redis restart loses the state**: every key then starts with a full burst again
//!   (at most one extra burst per key across the restart).
//! * Resolution: Redis time is in microseconds, so a quota's interval must be at least
//!   1 µs (a million per second); finer quotas are refused with an error.

use core::fmt;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use redis::aio::ConnectionManager;

mod booking;
mod conn;
mod scripts;
use booking::Booking;
use conn::Conn;
use scripts::{MAX_WINDOW, REFUND, SCRIPT};

use crate::{KeyedLimiter, NotUntil, Quota};

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

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
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// The URL is not a Redis URL, or the server could not be reached or is not Redis.
    Connect(redis::RedisError),
    /// The quota's interval is below Redis time's microsecond resolution.
    IntervalBelowMicrosecond,
    /// The quota's burst window (interval × burst) is longer than about 52 days (2^52
    /// ns), past what the script keeps exact.
    WindowTooLong,
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
        }
    }
}

impl core::error::Error for RedisLimitError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            RedisLimitError::Connect(e) => Some(e),
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
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisDenied {
    /// Rate limited; try again after the wait.
    NotUntil(NotUntil),
    /// More cells than the burst: never admissible.
    InsufficientCapacity,
    /// Redis could not answer (unreachable, or slower than the timeout) and the policy is
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

/// A limiter whose state lives in Redis, shared by every process that uses the same
/// Redis, prefix and quota. See the [module docs](self).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use paceline::{redis::RedisLimiter, Quota};
/// let limiter = RedisLimiter::connect("redis://127.0.0.1/", Quota::per_second(50)).await?;
/// limiter.until_key_ready("partner-api").await?; // a booked turn, fleet-wide
/// # Ok(()) }
/// ```
pub struct RedisLimiter {
    conn: Conn,
    script: redis::Script,
    refund: Arc<redis::Script>,
    quota: Quota,
    prefix: String,
    timeout: Duration,
    policy: FailurePolicy,
    local: Option<KeyedLimiter<String>>,
    /// Keys Redis refused, and from when one cell would fit (the local fast path).
    refused: Mutex<HashMap<String, Instant>>,
    /// This limiter's part of every booking id, random per limiter.
    nonce: u64,
    /// The number of the next booking.
    bookings: AtomicU64,
    /// Test mode: decisions at this Redis time (µs) instead of the server's `TIME`.
    fixed_time: Mutex<Option<u64>>,
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("quota", &self.quota)
            .field("prefix", &self.prefix)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// How long connecting (and each answer while connecting) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Redis time is in microseconds: a quota finer than that cannot be kept; and the script
/// keeps windows up to `MAX_WINDOW` exact.
fn check_quota(quota: Quota) -> Result<(), RedisLimitError> {
    let interval = quota.emission_interval();
    if interval < Duration::from_micros(1) {
        return Err(RedisLimitError::IntervalBelowMicrosecond);
    }
    let window = interval.as_nanos() * u128::from(quota.burst());
    if window > u128::from(MAX_WINDOW) {
        return Err(RedisLimitError::WindowTooLong);
    }
    Ok(())
}

/// What a failed call means.
enum Failure {
    /// No answer: unreachable, or slower than the timeout. The failure policy decides.
    Unreachable(redis::RedisError),
    /// Redis answered with an error: reported as it is (`RedisDenied::Rejected` or
    /// `OutOfMemory`), whatever the policy.
    Answered(RedisDenied),
}

impl Failure {
    fn of(e: redis::RedisError) -> Failure {
        use redis::{ErrorKind, ServerErrorKind};
        let unreachable = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            // Redirections the client could not follow, a cluster without coverage.
            || e.is_cluster_error()
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

/// Nanoseconds of a duration, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A random number for this limiter's booking ids: different limiters (and processes)
/// never share ids on a key.
fn nonce() -> u64 {
    use core::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(Instant::now())
}

/// `call`'s answer, or a timeout error once `limit` has passed.
async fn within<T>(
    limit: Duration,
    call: impl core::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "timed out",
            format!("no answer within {limit:?}"),
        ))),
    }
}

/// Refused keys remembered locally at most (the map is cleared when it fills).
const MAX_REMEMBERED: usize = 100_000;

impl RedisLimiter {
    /// Connects to `url` (`redis://host:port/db`) and checks it answers like Redis. The
    /// connection reconnects in the background after failures.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Connect`] for a bad URL or a server that is not Redis;
    /// [`RedisLimitError::IntervalBelowMicrosecond`] for a quota finer than 1 µs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
    /// let limiter = paceline::redis::RedisLimiter::connect("redis://127.0.0.1:6379/", paceline::Quota::per_second(10)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str, quota: Quota) -> Result<RedisLimiter, RedisLimitError> {
        check_quota(quota)?;
        let client = redis::Client::open(url).map_err(RedisLimitError::Connect)?;
        // No response timeout of the connection's own: each call has the limiter's (one
        // timer per call, not two).
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None)
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(RedisLimitError::Connect)?;
        RedisLimiter::over(Conn::Node(conn), quota).await
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port/` each)
    /// and checks it answers. Each limited key is its own hash tag, so keys spread over
    /// the cluster's slots and every decision runs on the one master that owns its key;
    /// the connection follows `MOVED`/`ASK` redirections and reconnects in the
    /// background. Decisions are the same as [`RedisLimiter::connect`]'s.
    ///
    /// Needs cargo feature `redis-cluster`.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::connect`]; also when no node answers as a cluster member.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let limiter = paceline::redis::RedisLimiter::connect_cluster(&nodes, paceline::Quota::per_second(10)).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub async fn connect_cluster(
        nodes: &[&str],
        quota: Quota,
    ) -> Result<RedisLimiter, RedisLimitError> {
        check_quota(quota)?;
        let client = redis::cluster::ClusterClient::builder(nodes.iter().copied())
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(CONNECT_TIMEOUT)
            .retries(1)
            .build()
            .map_err(RedisLimitError::Connect)?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(RedisLimitError::Connect)?;
        RedisLimiter::over(Conn::Cluster(conn), quota).await
    }

    async fn over(mut conn: Conn, quota: Quota) -> Result<RedisLimiter, RedisLimitError> {
        let ping = async { redis::cmd("PING").query_async::<String>(&mut conn).await };
        within(CONNECT_TIMEOUT, ping)
            .await
            .map_err(RedisLimitError::Connect)?;
        Ok(RedisLimiter {
            conn,
            script: redis::Script::new(SCRIPT),
            refund: Arc::new(redis::Script::new(REFUND)),
            quota,
            prefix: "paceline".into(),
            timeout: Duration::from_millis(250),
            policy: FailurePolicy::FailClosed,
            local: None,
            refused: Mutex::new(HashMap::new()),
            nonce: nonce(),
            bookings: AtomicU64::new(0),
            fixed_time: Mutex::new(None),
        })
    }

    /// The prefix of every Redis key (default `paceline`): limiters with different prefixes
    /// are independent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
    /// let limiter = paceline::redis::RedisLimiter::connect("redis://127.0.0.1/", paceline::Quota::per_second(10))
    ///     .await?
    ///     .with_prefix("billing");
    /// # Ok(()) }
    /// ```
    pub fn with_prefix(mut self, prefix: &str) -> RedisLimiter {
        self.prefix = prefix.into();
        self
    }

    /// How long one call may take before the failure policy decides (default 250 ms).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
    /// let limiter = paceline::redis::RedisLimiter::connect("redis://127.0.0.1/", paceline::Quota::per_second(10))
    ///     .await?
    ///     .with_timeout(std::time::Duration::from_millis(50));
    /// # Ok(()) }
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> RedisLimiter {
        self.timeout = timeout;
        self
    }

    /// What to do when Redis cannot answer (default [`FailurePolicy::FailClosed`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
    /// use paceline::{redis::{FailurePolicy, RedisLimiter}, Quota};
    /// // 8 workers share 800/s; without Redis each keeps to its share.
    /// let limiter = RedisLimiter::connect("redis://127.0.0.1/", Quota::per_second(800))
    ///     .await?
    ///     .on_failure(FailurePolicy::Local(Quota::per_second(100)));
    /// # Ok(()) }
    /// ```
    pub fn on_failure(mut self, policy: FailurePolicy) -> RedisLimiter {
        self.local = match &policy {
            FailurePolicy::Local(quota) => Some(KeyedLimiter::new(*quota)),
            _ => None,
        };
        self.policy = policy;
        self
    }

    /// Test mode: every later decision is made at this Redis time (microseconds) instead
    /// of the server's clock, so a reference model can see the same time. `None` returns
    /// to the server's clock.
    #[doc(hidden)]
    pub fn set_fixed_time(&self, micros: Option<u64>) {
        *self.fixed_time.lock().unwrap_or_else(|e| e.into_inner()) = micros;
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Admits one cell for `key`, fleet-wide.
    ///
    /// # Errors
    ///
    /// See [`RedisDenied`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: paceline::redis::RedisLimiter) {
    /// match limiter.check_key("tenant-42").await {
    ///     Ok(()) => { /* go */ }
    ///     Err(denied) => eprintln!("{denied}"),
    /// }
    /// # }
    /// ```
    pub async fn check_key(&self, key: &str) -> Result<(), RedisDenied> {
        self.check_key_n(key, 1).await
    }

    /// Admits `n` cells for `key` at once, or none, fleet-wide.
    ///
    /// # Errors
    ///
    /// See [`RedisDenied`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: paceline::redis::RedisLimiter) {
    /// let batch_ok = limiter.check_key_n("exports", 5).await.is_ok();
    /// # }
    /// ```
    pub async fn check_key_n(&self, key: &str, n: u32) -> Result<(), RedisDenied> {
        check_key(key)?;
        if n > self.quota.burst() {
            return Err(RedisDenied::InsufficientCapacity);
        }
        if n == 0 {
            // Nothing asked for: granted at once, as in process.
            return Ok(());
        }
        if let Some(wait) = self.locally_refused(key, n) {
            return Err(RedisDenied::NotUntil(NotUntil::from_nanos(wait)));
        }
        match self.run(key, self.signed_cost(n), 0, "").await {
            Ok((1, _, _)) => Ok(()),
            Ok((_, wait, _)) => {
                let wait = u64::try_from(wait).unwrap_or(u64::MAX).max(1);
                self.remember_refusal(key, n, wait);
                Err(RedisDenied::NotUntil(NotUntil::from_nanos(wait)))
            }
            Err(e) => match Failure::of(e) {
                Failure::Answered(denied) => Err(denied),
                Failure::Unreachable(e) => self.on_unavailable(key, n, e),
            },
        }
    }

    /// How many cells a check for `key` would admit now; spends nothing.
    ///
    /// # Errors
    ///
    /// [`RedisDenied::Unavailable`] when Redis cannot answer (whatever the policy: there
    /// is no decision to make), [`RedisDenied::Rejected`] when it answers with an error,
    /// [`RedisDenied::BadKey`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: paceline::redis::RedisLimiter) {
    /// let left = limiter.remaining("tenant-42").await.unwrap_or(0);
    /// # }
    /// ```
    pub async fn remaining(&self, key: &str) -> Result<u32, RedisDenied> {
        check_key(key)?;
        match self.run(key, -1, 0, "").await {
            Ok((_, remaining, _)) => Ok(u32::try_from(remaining).unwrap_or(u32::MAX)),
            Err(e) => Err(match Failure::of(e) {
                Failure::Answered(denied) => denied,
                Failure::Unreachable(e) => RedisDenied::Unavailable(e),
            }),
        }
    }

    /// Waits `key`'s booked turn for one cell, fleet-wide: the booking takes its place in
    /// Redis (the same TAT every worker checks), so waiters across the fleet are served in
    /// booking order, and plain checks cannot take their place. The wait itself is a local
    /// sleep for the duration Redis gave (clock skew between machines does not matter).
    ///
    /// Dropped before its instant, the waiter gives its cell back unless a plain check was
    /// admitted on that key after it, or a later booking is still waiting (judged
    /// atomically by the server; a later booking's own refund then gives both back). The
    /// booking carries an id chosen before it is sent, so this holds even when its answer
    /// never arrived (the call timed out, the caller went away). Otherwise the cell stays
    /// spent (the limit only errs on the strict side). A turn more than about 52 days away
    /// is refused with [`RedisDenied::NotUntil`].
    ///
    /// # Errors
    ///
    /// [`RedisDenied::Unavailable`] (fail closed) when Redis cannot answer;
    /// [`RedisDenied::Rejected`] or [`RedisDenied::OutOfMemory`] when it answers with an
    /// error; [`RedisDenied::BadKey`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: paceline::redis::RedisLimiter) -> Result<(), paceline::redis::RedisDenied> {
    /// limiter.until_key_ready("partner-api").await?; // then call it
    /// # Ok(()) }
    /// ```
    pub async fn until_key_ready(&self, key: &str) -> Result<(), RedisDenied> {
        self.wait_turn(key, None).await
    }

    /// Waits for one cell for `key` only if it can be had within `max`; otherwise books
    /// nothing and says when it could be had. The maximum holds under every failure
    /// policy (with [`FailurePolicy::Local`], on the local limiter).
    ///
    /// # Errors
    ///
    /// [`RedisDenied::NotUntil`] when the turn is further than `max`; otherwise as
    /// [`RedisLimiter::until_key_ready`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: paceline::redis::RedisLimiter) {
    /// use std::time::Duration;
    /// if limiter.until_key_ready_within("report", Duration::from_millis(200)).await.is_err() {
    ///     // too busy: answer from the cache instead
    /// }
    /// # }
    /// ```
    pub async fn until_key_ready_within(
        &self,
        key: &str,
        max: Duration,
    ) -> Result<(), RedisDenied> {
        self.wait_turn(key, Some(max)).await
    }

    async fn wait_turn(&self, key: &str, max: Option<Duration>) -> Result<(), RedisDenied> {
        check_key(key)?;
        // No booking reaches further than the caller's maximum, nor past what the script
        // keeps exact.
        let extra = max.map_or(MAX_WINDOW, |max| nanos(max).min(MAX_WINDOW));
        let id = format!(
            "{:x}.{:x}",
            self.nonce,
            // Relaxed: a counter whose only job is to differ; it publishes nothing.
            self.bookings.fetch_add(1, Ordering::Relaxed)
        );
        // Made before the call is sent: whatever happens to the answer, dropping it
        // unsettled gives the cell back.
        let booking = Booking::new(
            self.conn.clone(),
            Arc::clone(&self.refund),
            self.redis_key(key),
            id,
            self.fixed_time(),
        );
        match self
            .run(key, self.signed_cost(1), extra, booking.id())
            .await
        {
            Ok((1, _, wait)) => {
                if wait > 0 {
                    // Dropped while it sleeps (a cancelled waiter), the booking is given
                    // back.
                    tokio::time::sleep(Duration::from_nanos(u64::try_from(wait).unwrap_or(0)))
                        .await;
                }
                booking.settle(); // its instant came: the cell is used
                Ok(())
            }
            Ok((_, wait, _)) => {
                booking.settle(); // refused: nothing booked
                Err(RedisDenied::NotUntil(NotUntil::from_nanos(
                    u64::try_from(wait).unwrap_or(u64::MAX).max(1),
                )))
            }
            // `booking` is dropped unsettled below: the call may have booked.
            Err(e) => match (Failure::of(e), &self.policy, &self.local) {
                (Failure::Answered(denied), _, _) => Err(denied),
                (Failure::Unreachable(_), FailurePolicy::FailOpen, _) => Ok(()),
                (Failure::Unreachable(_), FailurePolicy::Local(_), Some(local)) => {
                    let key = key.to_owned();
                    match max {
                        None => {
                            local.until_key_ready(&key).await;
                            Ok(())
                        }
                        Some(max) => local
                            .until_key_ready_within(&key, max)
                            .await
                            .map_err(RedisDenied::NotUntil),
                    }
                }
                (Failure::Unreachable(e), _, _) => Err(RedisDenied::Unavailable(e)),
            },
        }
    }

    /// `n` cells of the quota in nanoseconds (at most the burst window, so at most
    /// `MAX_WINDOW`: `check_quota`).
    fn cost(&self, n: u32) -> u64 {
        nanos(self.quota.emission_interval()).saturating_mul(u64::from(n))
    }

    /// [`RedisLimiter::cost`] as the script's signed argument (`-1` means a read).
    fn signed_cost(&self, n: u32) -> i64 {
        i64::try_from(self.cost(n)).unwrap_or(i64::MAX)
    }

    fn fixed_time(&self) -> Option<u64> {
        *self.fixed_time.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}:{{{}}}", self.prefix, key)
    }

    /// Runs the script for `cost` nanoseconds (`-1`: a read) within `extra` nanoseconds
    /// past the tolerance, booked under `id` if not empty.
    async fn run(
        &self,
        key: &str,
        cost: i64,
        extra: u64,
        id: &str,
    ) -> Result<(i64, i64, i64), redis::RedisError> {
        let time = self.fixed_time().map(|t| t.to_string()).unwrap_or_default();
        let mut conn = self.conn.clone();
        let call = async {
            self.script
                .key(self.redis_key(key))
                .arg(self.cost(1))
                .arg(self.cost(self.quota.burst()))
                .arg(cost)
                .arg(time)
                .arg(extra)
                .arg(id)
                .invoke_async::<(i64, i64, i64)>(&mut conn)
                .await
        };
        within(self.timeout, call).await
    }

    /// How long `n` cells of `key` are still refused locally, from Redis's last refusal.
    fn locally_refused(&self, key: &str, n: u32) -> Option<u64> {
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let one_fits = *refused.get(key)?;
        let more = self.quota.emission_interval() * (n - 1);
        let left = (one_fits + more).checked_duration_since(Instant::now())?;
        Some(nanos(left).max(1))
    }

    /// Remembers that `n` cells of `key` were refused for `wait` ns: one cell fits
    /// `(n - 1)` intervals sooner than `n` do.
    fn remember_refusal(&self, key: &str, n: u32, wait: u64) {
        if self.fixed_time().is_some() {
            return; // test mode: local time means nothing there
        }
        let sooner = nanos(self.quota.emission_interval()).saturating_mul(u64::from(n - 1));
        let Some(one) = wait.checked_sub(sooner).filter(|&w| w > 0) else {
            return; // one cell fits already
        };
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.len() >= MAX_REMEMBERED {
            refused.clear();
        }
        refused.insert(key.to_owned(), Instant::now() + Duration::from_nanos(one));
    }

    fn on_unavailable(&self, key: &str, n: u32, e: redis::RedisError) -> Result<(), RedisDenied> {
        match &self.policy {
            FailurePolicy::FailOpen => Ok(()),
            FailurePolicy::Local(_) => match &self.local {
                Some(local) => {
                    local
                        .check_key_n(&key.to_owned(), n)
                        .map_err(|denied| match denied {
                            crate::Denied::NotUntil(e) => RedisDenied::NotUntil(e),
                            crate::Denied::InsufficientCapacity(_) => {
                                RedisDenied::InsufficientCapacity
                            }
                        })
                }
                None => Err(RedisDenied::Unavailable(e)),
            },
            _ => Err(RedisDenied::Unavailable(e)),
        }
    }
}

/// Keys are 1 to [`MAX_KEY_LEN`] bytes.
fn check_key(key: &str) -> Result<(), RedisDenied> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(RedisDenied::BadKey);
    }
    Ok(())
}
