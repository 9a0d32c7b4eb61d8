//! One quota across a fleet: GCRA with its state in Redis (cargo feature `redis`).
//!
//! ```no_run
//! # async fn run() -> Result<(), pacer::redis::RedisLimitError> {
//! use pacer::redis::{FailurePolicy, RedisLimiter};
//! use pacer::Quota;
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
//! * **The same decisions as pacer's GCRA**, made server-side by one Lua script per call
//!   (sent with `EVALSHA`; the `redis` crate loads it again if the script cache was
//!   flushed), in integer microseconds read from the Redis server's `TIME`: one clock for
//!   the whole fleet, so machines whose clocks drift cannot over-admit. No
//!   `redis.replicate_commands()` (Redis 5+ replicates scripts by their effects).
//! * **One Redis key per limited key**, `prefix:{key}`: the key is its own hash tag, so a
//!   Redis Cluster ([`RedisLimiter::connect_cluster`], feature `redis-cluster`) spreads
//!   keys over its slots and runs each decision on the master owning its key. Each expires once it has refilled, so Redis
//!   memory follows the active keys.
//! * **A local fast path that cannot over-admit**: a key Redis just refused is refused
//!   locally until the instant Redis gave, so a flood of refusals for one key costs no
//!   round trips. Admissions always ask Redis.
//! * **When Redis is unreachable or slow** (each call has a timeout), the configured
//!   [`FailurePolicy`] decides: refuse, admit, or fall back to an in-process limiter with a
//!   share of the quota. The connection reconnects in the background.
//! * **A Redis restart loses the state**: every key then starts with a full burst again
//!   (at most one extra burst per key across the restart).
//! * Resolution: Redis time is in microseconds, so a quota's interval must be at least
//!   1 µs (a million per second); finer quotas are refused with an error.

use core::fmt;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use redis::aio::ConnectionManager;

mod conn;
use conn::Conn;

use crate::{KeyedLimiter, NotUntil, Quota};

/// The GCRA decision, in microseconds. `ARGV`: interval, tolerance, cost, a fixed time
/// (empty: the server's `TIME`), and how long a booking may wait (0 for a plain check).
/// Returns `{1, tat, wait}` when admitted (booked: `wait` until its instant), `{0, wait,
/// 0}` when not, `{2, remaining, 0}` for a read (cost -1).
const SCRIPT: &str = r"
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local extra = tonumber(ARGV[5])
local now
if ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local base = tat
if now > base then base = now end
local backlog = base - now
if cost < 0 then
  if backlog >= tau then return {2, 0, 0} end
  return {2, math.floor((tau - backlog) / interval), 0}
end
if backlog > tau + extra - cost then
  return {0, backlog - (tau - cost), 0}
end
if cost == 0 then return {1, tat, 0} end
local new = base + cost
if ARGV[4] ~= '' then
  -- Test mode: the server's clock is not the decisions' clock, so no expiry by it.
  redis.call('SET', KEYS[1], string.format('%d', new))
else
  redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1)
end
local wait = new - tau - now
if wait < 0 then wait = 0 end
return {1, new, wait}
";

/// Gives a booking back: only while the key still holds exactly the TAT that booking
/// left (nothing was admitted or booked after it) and its instant has not come, judged
/// atomically at the server's time. `ARGV`: booked TAT, cost, instant (all µs).
const REFUND: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat ~= tonumber(ARGV[1]) or now >= tonumber(ARGV[3]) then return 0 end
local new = tat - tonumber(ARGV[2])
if new <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1)
end
return 1
";

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// What to do when Redis cannot answer (unreachable, or slower than the timeout).
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
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// The URL is not a Redis URL, or the server could not be reached or is not Redis.
    Connect(redis::RedisError),
    /// The quota's interval is below Redis time's microsecond resolution.
    IntervalBelowMicrosecond,
}

impl fmt::Display for RedisLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisLimitError::Connect(e) => write!(f, "cannot use Redis: {e}"),
            RedisLimitError::IntervalBelowMicrosecond => {
                f.write_str("the quota's interval is below 1 µs, Redis time's resolution")
            }
        }
    }
}

impl core::error::Error for RedisLimitError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            RedisLimitError::Connect(e) => Some(e),
            RedisLimitError::IntervalBelowMicrosecond => None,
        }
    }
}

/// Why a check was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisDenied {
    /// Rate limited; try again after the wait.
    NotUntil(NotUntil),
    /// More cells than the burst: never admissible.
    InsufficientCapacity,
    /// Redis could not answer and the policy is [`FailurePolicy::FailClosed`].
    Unavailable(redis::RedisError),
    /// The key is empty or longer than [`MAX_KEY_LEN`].
    BadKey,
}

impl fmt::Display for RedisDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisDenied::NotUntil(e) => e.fmt(f),
            RedisDenied::InsufficientCapacity => f.write_str("more cells than the burst"),
            RedisDenied::Unavailable(e) => write!(f, "Redis unavailable (failing closed): {e}"),
            RedisDenied::BadKey => write!(f, "keys are 1 to {MAX_KEY_LEN} bytes"),
        }
    }
}

impl core::error::Error for RedisDenied {}

/// A limiter whose state lives in Redis, shared by every process that uses the same
/// Redis, prefix and quota. See the [module docs](self).
pub struct RedisLimiter {
    conn: Conn,
    script: redis::Script,
    refund: Arc<redis::Script>,
    quota: Quota,
    prefix: String,
    timeout: Duration,
    policy: FailurePolicy,
    local: Option<KeyedLimiter<String>>,
    /// Keys Redis refused, and until when (the local fast path).
    refused: Mutex<HashMap<String, Instant>>,
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

/// Redis time is in microseconds: a quota finer than that cannot be kept.
fn check_quota(quota: Quota) -> Result<(), RedisLimitError> {
    if quota.emission_interval() < Duration::from_micros(1) {
        return Err(RedisLimitError::IntervalBelowMicrosecond);
    }
    Ok(())
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
    /// # async fn run() -> Result<(), pacer::redis::RedisLimitError> {
    /// let limiter = pacer::redis::RedisLimiter::connect("redis://127.0.0.1:6379/", pacer::Quota::per_second(10)).await?;
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
    /// # async fn run() -> Result<(), pacer::redis::RedisLimitError> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let limiter = pacer::redis::RedisLimiter::connect_cluster(&nodes, pacer::Quota::per_second(10)).await?;
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
            prefix: "pacer".into(),
            timeout: Duration::from_millis(250),
            policy: FailurePolicy::FailClosed,
            local: None,
            refused: Mutex::new(HashMap::new()),
            fixed_time: Mutex::new(None),
        })
    }

    /// The prefix of every Redis key (default `pacer`): limiters with different prefixes
    /// are independent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), pacer::redis::RedisLimitError> {
    /// let limiter = pacer::redis::RedisLimiter::connect("redis://127.0.0.1/", pacer::Quota::per_second(10))
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
    /// # async fn run() -> Result<(), pacer::redis::RedisLimitError> {
    /// let limiter = pacer::redis::RedisLimiter::connect("redis://127.0.0.1/", pacer::Quota::per_second(10))
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
    /// # async fn run() -> Result<(), pacer::redis::RedisLimitError> {
    /// use pacer::{redis::{FailurePolicy, RedisLimiter}, Quota};
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
    /// # async fn run(limiter: pacer::redis::RedisLimiter) {
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
    /// # async fn run(limiter: pacer::redis::RedisLimiter) {
    /// let batch_ok = limiter.check_key_n("exports", 5).await.is_ok();
    /// # }
    /// ```
    pub async fn check_key_n(&self, key: &str, n: u32) -> Result<(), RedisDenied> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(RedisDenied::BadKey);
        }
        if n > self.quota.burst() {
            return Err(RedisDenied::InsufficientCapacity);
        }
        if let Some(wait) = self.locally_refused(key) {
            return Err(RedisDenied::NotUntil(NotUntil::from_nanos(wait)));
        }
        let cost = self.micros(n);
        match self.run(key, cost, 0).await {
            Ok((1, _, _)) => Ok(()),
            Ok((_, wait_us, _)) => {
                let wait = Duration::from_micros(u64::try_from(wait_us).unwrap_or(0));
                self.remember_refusal(key, wait);
                Err(RedisDenied::NotUntil(NotUntil::from_nanos(
                    u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX),
                )))
            }
            Err(e) => self.on_unavailable(key, n, e),
        }
    }

    /// How many cells a check for `key` would admit now; spends nothing.
    ///
    /// # Errors
    ///
    /// [`RedisDenied::Unavailable`] when Redis cannot answer (whatever the policy: there
    /// is no decision to make), [`RedisDenied::BadKey`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: pacer::redis::RedisLimiter) {
    /// let left = limiter.remaining("tenant-42").await.unwrap_or(0);
    /// # }
    /// ```
    pub async fn remaining(&self, key: &str) -> Result<u32, RedisDenied> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(RedisDenied::BadKey);
        }
        match self.run(key, -1, 0).await {
            Ok((_, remaining, _)) => Ok(u32::try_from(remaining).unwrap_or(u32::MAX)),
            Err(e) => Err(RedisDenied::Unavailable(e)),
        }
    }

    /// Waits `key`'s booked turn for one cell, fleet-wide: the booking takes its place in
    /// Redis (the same TAT every worker checks), so waiters across the fleet are served in
    /// booking order, and plain checks cannot take their place. The wait itself is a local
    /// sleep for the duration Redis gave (clock skew between machines does not matter).
    ///
    /// Dropped before its instant, the waiter gives its cell back if nothing was admitted
    /// or booked on that key after it (judged atomically by the server); otherwise the cell
    /// stays spent (the limit only errs on the strict side).
    ///
    /// # Errors
    ///
    /// [`RedisDenied::Unavailable`] (fail closed) when Redis cannot answer;
    /// [`RedisDenied::BadKey`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: pacer::redis::RedisLimiter) -> Result<(), pacer::redis::RedisDenied> {
    /// limiter.until_key_ready("partner-api").await?; // then call it
    /// # Ok(()) }
    /// ```
    pub async fn until_key_ready(&self, key: &str) -> Result<(), RedisDenied> {
        self.wait_turn(key, i64::MAX / 4).await
    }

    /// Waits for one cell for `key` only if it can be had within `max`; otherwise books
    /// nothing and says when it could be had.
    ///
    /// # Errors
    ///
    /// [`RedisDenied::NotUntil`] when the turn is further than `max`; otherwise as
    /// [`RedisLimiter::until_key_ready`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: pacer::redis::RedisLimiter) {
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
        let max_us = i64::try_from(max.as_micros()).unwrap_or(i64::MAX / 4);
        self.wait_turn(key, max_us.min(i64::MAX / 4)).await
    }

    async fn wait_turn(&self, key: &str, max_wait_us: i64) -> Result<(), RedisDenied> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(RedisDenied::BadKey);
        }
        let cost = self.micros(1);
        match self.run(key, cost, max_wait_us).await {
            Ok((1, _, 0)) => Ok(()),
            Ok((1, tat, wait_us)) => {
                let instant = tat - self.micros(self.quota.burst());
                let mut booking = Booking {
                    conn: self.conn.clone(),
                    refund: Arc::clone(&self.refund),
                    key: Some(self.redis_key(key)),
                    tat,
                    cost,
                    instant,
                };
                tokio::time::sleep(Duration::from_micros(u64::try_from(wait_us).unwrap_or(0)))
                    .await;
                booking.key = None; // its instant came: the cell is used
                Ok(())
            }
            Ok((_, wait_us, _)) => Err(RedisDenied::NotUntil(NotUntil::from_nanos(
                u64::try_from(wait_us).unwrap_or(0).saturating_mul(1_000),
            ))),
            Err(e) => match (&self.policy, &self.local) {
                (FailurePolicy::FailOpen, _) => Ok(()),
                (FailurePolicy::Local(_), Some(local)) => {
                    local.until_key_ready(&key.to_owned()).await;
                    Ok(())
                }
                _ => Err(RedisDenied::Unavailable(e)),
            },
        }
    }

    /// `n` cells of the quota in microseconds.
    fn micros(&self, n: u32) -> i64 {
        let interval = self.quota.emission_interval().as_micros();
        i64::try_from(interval.saturating_mul(u128::from(n))).unwrap_or(i64::MAX)
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}:{{{}}}", self.prefix, key)
    }

    async fn run(
        &self,
        key: &str,
        cost: i64,
        max_wait_us: i64,
    ) -> Result<(i64, i64, i64), redis::RedisError> {
        let tau = self.micros(self.quota.burst());
        let interval = self.micros(1);
        let fixed = *self.fixed_time.lock().unwrap_or_else(|e| e.into_inner());
        let time = fixed.map(|t| t.to_string()).unwrap_or_default();
        let mut conn = self.conn.clone();
        let call = async {
            self.script
                .key(self.redis_key(key))
                .arg(interval)
                .arg(tau)
                .arg(cost)
                .arg(time)
                .arg(max_wait_us)
                .invoke_async::<(i64, i64, i64)>(&mut conn)
                .await
        };
        within(self.timeout, call).await
    }

    fn locally_refused(&self, key: &str) -> Option<u64> {
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let until = *refused.get(key)?;
        let left = until.checked_duration_since(Instant::now())?;
        Some(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
    }

    fn remember_refusal(&self, key: &str, wait: Duration) {
        if self
            .fixed_time
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return; // test mode: local time means nothing there
        }
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.len() >= MAX_REMEMBERED {
            refused.clear();
        }
        refused.insert(key.to_owned(), Instant::now() + wait);
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

/// A booking waiting for its instant; dropped before it (a waiter cancelled or timed
/// out), it asks Redis to give the cell back, in the background.
struct Booking {
    conn: Conn,
    refund: Arc<redis::Script>,
    /// `None` once the booking is used.
    key: Option<String>,
    tat: i64,
    cost: i64,
    instant: i64,
}

impl Drop for Booking {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut conn, refund) = (self.conn.clone(), Arc::clone(&self.refund));
        let (tat, cost, instant) = (self.tat, self.cost, self.instant);
        runtime.spawn(async move {
            // Best effort: if Redis cannot answer, the cell stays spent (strict side).
            let call = async {
                refund
                    .key(key)
                    .arg(tat)
                    .arg(cost)
                    .arg(instant)
                    .invoke_async::<i64>(&mut conn)
                    .await
            };
            let _ = within(CONNECT_TIMEOUT, call).await;
        });
    }
}
