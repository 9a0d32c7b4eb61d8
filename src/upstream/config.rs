//! [`FollowerConfig`]: how a [`Follower`](super::Follower) follows its upstream.

use core::time::Duration;

/// How a [`Follower`](super::Follower) follows its upstream: the longest wait anything
/// the upstream says may impose, whether it may go faster than configured when told so,
/// and when an announced quota is forgotten.
///
/// (The name says what it configures: a follower. One name per concept: the follower is
/// the thing that follows one upstream, in Rust and in Python.)
///
/// # Examples
///
/// ```
/// use paceline::upstream::FollowerConfig;
/// use std::time::Duration;
///
/// let config = FollowerConfig::default()
///     .max_hold(Duration::from_secs(60))      // a "Retry-After: 86400" holds 60 s
///     .revert_after(Duration::from_secs(30)); // an announced quota forgotten after 30 s of silence
/// assert_eq!(config.hold_cap(), Duration::from_secs(60));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerConfig {
    pub(super) max_hold: Duration,
    pub(super) above_configured: bool,
    pub(super) revert_after: Option<Duration>,
    pub(super) execution_bound: bool,
}

impl Default for FollowerConfig {
    /// Waits of up to 5 minutes, never faster than configured, an announced quota kept
    /// until another is announced, the execution bound on.
    fn default() -> FollowerConfig {
        FollowerConfig {
            max_hold: Duration::from_secs(300),
            above_configured: false,
            revert_after: None,
            execution_bound: true,
        }
    }
}

impl FollowerConfig {
    /// The longest any one thing the upstream says makes a caller wait: a longer
    /// `Retry-After` (a year, by mistake or malice) holds this long, and an announced or
    /// learned pace never spaces two requests further apart than this.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::FollowerConfig;
    /// let config = FollowerConfig::default().max_hold(std::time::Duration::ZERO);
    /// assert!(config.hold_cap().is_zero()); // nothing the upstream says slows the client
    /// ```
    pub fn max_hold(mut self, max: Duration) -> FollowerConfig {
        self.max_hold = max;
        self
    }

    /// The longest wait the upstream may impose ([`FollowerConfig::max_hold`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let config = paceline::upstream::FollowerConfig::default();
    /// assert_eq!(config.hold_cap().as_secs(), 300);
    /// ```
    pub fn hold_cap(&self) -> Duration {
        self.max_hold
    }

    /// Whether an announced quota above the configured one is followed (by default it is
    /// not: the configured quota is the caller's own ceiling).
    ///
    /// # Examples
    ///
    /// ```
    /// let config = paceline::upstream::FollowerConfig::default().above_configured(true);
    /// # let _ = config;
    /// ```
    pub fn above_configured(mut self, allowed: bool) -> FollowerConfig {
        self.above_configured = allowed;
        self
    }

    /// Forgets an announced quota once the upstream has announced none for this long (by
    /// default an announced quota stays until another is announced: many upstreams send
    /// their fields only on refusals, and a client that follows them gets none).
    ///
    /// # Examples
    ///
    /// ```
    /// let config = paceline::upstream::FollowerConfig::default()
    ///     .revert_after(std::time::Duration::from_secs(60));
    /// # let _ = config;
    /// ```
    pub fn revert_after(mut self, silence: Duration) -> FollowerConfig {
        self.revert_after = Some(silence);
        self
    }

    /// Takes each request's cell again, from a second limiter of the same pace and holds,
    /// at the moment it is about to be sent (see the crate's "bound when the work runs"):
    /// a task that resumes late (an executor or event loop that stalled, a machine too
    /// busy to run it) waits again instead of leaving together with the others that were
    /// late, and a turn that came just before a hold does not leave inside it. On by
    /// default: the limit a follower keeps is the upstream's, where arriving together is
    /// what gets refused. It costs each request one more check.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = paceline::upstream::FollowerConfig::default().execution_bound(false);
    /// # let _ = config;
    /// ```
    pub fn execution_bound(mut self, on: bool) -> FollowerConfig {
        self.execution_bound = on;
        self
    }
}
