//! The fleet limiter: connecting, deciding through the script, the local refusal cache,
//! waiting booked turns.

use super::conn::{within, CONNECT_TIMEOUT};
use super::*;

/// A limiter whose state lives in Redis, shared by every process that uses the same
/// Redis, prefix and quota. See the [module docs](crate::redis).
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
    pub(super) conn: Conn,
    pub(super) script: redis::Script,
    pub(super) refund: Arc<redis::Script>,
    pub(super) quota: Quota,
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) policy: FailurePolicy,
    pub(super) local: Option<KeyedLimiter<String>>,
    /// Keys Redis refused, and from when one cell would fit (the local fast path).
    pub(super) refused: Mutex<HashMap<String, Instant>>,
    /// This limiter's part of every booking id, random per limiter.
    pub(super) nonce: u64,
    /// The number of the next booking.
    pub(super) bookings: AtomicU64,
    /// Its counts, labelled by `prefix` (feature `metrics`; nothing without it).
    pub(super) metrics: LimitMetrics,
    /// Test mode (feature `test-util`): decisions at this Redis time in µs instead of the
    /// server's `TIME`; 0 when off. Read on every call: one relaxed load.
    pub(super) fixed_time: AtomicU64,
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

/// Redis time is in microseconds: a quota finer than that cannot be kept; and the script
/// keeps windows up to `MAX_WINDOW` exact.
pub(super) fn check_quota(quota: Quota) -> Result<(), RedisLimitError> {
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

/// Nanoseconds of a duration, saturating.
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A random number for this limiter's booking ids: different limiters (and processes)
/// never share ids on a key.
pub(super) fn nonce() -> u64 {
    use core::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(Instant::now())
}

/// Refused keys remembered locally at most (the map is cleared when it fills).
pub(super) const MAX_REMEMBERED: usize = 100_000;

impl RedisLimiter {
    /// Connects to `url` (`redis://host:port/db`) and checks it answers like Redis. The
    /// connection reconnects in the background after failures.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Connect`] for a bad URL or a server that is not Redis;
    /// [`RedisLimitError::NoScripts`] for a server that does not run Lua scripts;
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
        let conn = super::conn::node(url)
            .await
            .map_err(RedisLimitError::Connect)?;
        RedisLimiter::over(conn, quota).await
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
        // Every decision is a script: both are loaded now.
        super::conn::load_scripts(&conn, &[DECIDE, REFUND])
            .await
            .map_err(RedisLimitError::NoScripts)?;
        Ok(RedisLimiter {
            conn,
            script: redis::Script::new(DECIDE),
            refund: Arc::new(redis::Script::new(REFUND)),
            quota,
            prefix: "paceline".into(),
            timeout: Duration::from_millis(250),
            policy: FailurePolicy::FailClosed,
            local: None,
            refused: Mutex::new(HashMap::new()),
            nonce: nonce(),
            bookings: AtomicU64::new(0),
            fixed_time: AtomicU64::new(0),
            metrics: LimitMetrics::new("paceline"),
        })
    }

    /// The prefix of every Redis key (default `paceline`): limiters with different prefixes
    /// are independent. It also names the limiter in its metrics (feature `metrics`).
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
        self.metrics = LimitMetrics::new(prefix);
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

    /// Test mode (cargo feature `test-util`, for tests that compare decisions with a
    /// model): every later decision is made at this Redis time (microseconds, above 0)
    /// instead of the server's clock. `None` returns to the server's clock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(limiter: paceline::redis::RedisLimiter) {
    /// limiter.set_fixed_time(Some(1_000_000));
    /// let at_one_second = limiter.check_key("k").await;
    /// # }
    /// ```
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn set_fixed_time(&self, micros: Option<u64>) {
        // Relaxed: as in `fixed_time`.
        self.fixed_time.store(
            micros.unwrap_or(0).max(u64::from(micros.is_some())),
            Ordering::Relaxed,
        );
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
            self.metrics.refused();
            return Err(RedisDenied::NotUntil(NotUntil::from_nanos(wait)));
        }
        match self.run(key, self.signed_cost(n), 0, "").await {
            Ok((1, _, _)) => {
                self.metrics.admitted();
                Ok(())
            }
            Ok((_, wait, _)) => {
                let wait = u64::try_from(wait).unwrap_or(u64::MAX).max(1);
                self.remember_refusal(key, n, wait);
                self.metrics.refused();
                Err(RedisDenied::NotUntil(NotUntil::from_nanos(wait)))
            }
            Err(e) => match Failure::counted(e, &self.metrics) {
                Failure::Answered(denied) => Err(denied),
                Failure::Unreachable(e) => {
                    let decided = self.on_unavailable(key, n, e);
                    self.count_decision(decided.is_ok());
                    decided
                }
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
    /// let left = limiter.remaining_key("tenant-42").await.unwrap_or(0);
    /// # }
    /// ```
    pub async fn remaining_key(&self, key: &str) -> Result<u32, RedisDenied> {
        check_key(key)?;
        match self.run(key, -1, 0, "").await {
            Ok((_, remaining, _)) => Ok(u32::try_from(remaining).unwrap_or(u32::MAX)),
            Err(e) => Err(match Failure::counted(e, &self.metrics) {
                Failure::Answered(denied) => denied,
                Failure::Unreachable(e) => RedisDenied::Unavailable(e),
            }),
        }
    }

    /// The old name of [`RedisLimiter::remaining_key`].
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::remaining_key`].
    #[deprecated(note = "renamed remaining_key, as KeyedLimiter::remaining_key")]
    pub async fn remaining(&self, key: &str) -> Result<u32, RedisDenied> {
        self.remaining_key(key).await
    }

    /// `n` cells of the quota in nanoseconds (at most the burst window, so at most
    /// `MAX_WINDOW`: `check_quota`).
    pub(super) fn cost(&self, n: u32) -> u64 {
        nanos(self.quota.emission_interval()).saturating_mul(u64::from(n))
    }

    /// [`RedisLimiter::cost`] as the script's signed argument (`-1` means a read).
    pub(super) fn signed_cost(&self, n: u32) -> i64 {
        i64::try_from(self.cost(n)).unwrap_or(i64::MAX)
    }

    pub(super) fn fixed_time(&self) -> Option<u64> {
        // Relaxed: a setting of the test mode, which publishes nothing else.
        Some(self.fixed_time.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }

    pub(super) fn redis_key(&self, key: &str) -> String {
        format!("{}:{{{}}}", self.prefix, key)
    }

    /// Runs the script for `cost` nanoseconds (`-1`: a read) within `extra` nanoseconds
    /// past the tolerance, booked under `id` if not empty.
    pub(super) async fn run(
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

    /// Counts a decision the failure policy made, as admitted or refused and by policy.
    pub(super) fn count_decision(&self, admitted: bool) {
        self.metrics.policy_decision(self.policy.label(), admitted);
        if admitted {
            self.metrics.admitted();
        } else {
            self.metrics.refused();
        }
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
