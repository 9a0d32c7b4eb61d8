//! Waiting a booked turn fleet-wide: the booking, made refundable before it is sent, and
//! the failure policy for waits.

use super::*;

impl RedisLimiter {
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
                    let wait = Duration::from_nanos(u64::try_from(wait).unwrap_or(0));
                    // Counted when booked: a waiter dropped while it sleeps gives its
                    // booking back, but it was served a turn.
                    self.metrics.waited(wait);
                    // Dropped while it sleeps (a cancelled waiter), the booking is given
                    // back.
                    tokio::time::sleep(wait).await;
                } else {
                    self.metrics.admitted();
                }
                booking.settle(); // its instant came: the cell is used
                Ok(())
            }
            Ok((_, wait, _)) => {
                booking.settle(); // refused: nothing booked
                self.metrics.refused();
                Err(RedisDenied::NotUntil(NotUntil::from_nanos(
                    u64::try_from(wait).unwrap_or(u64::MAX).max(1),
                )))
            }
            // `booking` is dropped unsettled below: the call may have booked.
            Err(e) => {
                let decided = match (
                    Failure::counted(e, &self.metrics),
                    &self.policy,
                    &self.local,
                ) {
                    (Failure::Answered(denied), _, _) => return Err(denied),
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
                };
                self.count_decision(decided.is_ok());
                decided
            }
        }
    }
}
