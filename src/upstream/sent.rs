//! [`Sent`]: when a request was sent, so that its answer is read against the pace it
//! was sent at.

/// When a request was sent, by the follower's clock ([`Follower::sent`](super::Follower::sent)).
///
/// # Examples
///
/// ```
/// let follower = paceline::upstream::Follower::new(paceline::Quota::per_second(5), Default::default());
/// let sent = follower.sent();
/// # let _ = sent;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sent(u64);

impl Sent {
    /// The instant as nanoseconds on the follower's clock (to carry it through code that
    /// holds plain numbers, a foreign-language binding's).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::upstream::{Follower, Sent};
    /// let follower = Follower::new(paceline::Quota::per_second(5), Default::default());
    /// let sent = follower.sent();
    /// assert_eq!(Sent::from_nanos(sent.nanos()), sent);
    /// ```
    pub fn nanos(&self) -> u64 {
        self.0
    }

    /// The instant `nanos` on the follower's clock (what [`Sent::nanos`] gave).
    ///
    /// # Examples
    ///
    /// See [`Sent::nanos`].
    pub fn from_nanos(nanos: u64) -> Sent {
        Sent(nanos)
    }
}
