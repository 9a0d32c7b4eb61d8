//! An admission that can be given back: what taking one cell from several limits at
//! once, or none, needs (the HTTP layer's several limits; any caller's too).

use core::hash::Hash;

use super::KeyedLimiter;
use crate::clock::Clock;
use crate::error::{Denied, NotUntil};

/// A cell [`KeyedLimiter::check_key_refundable`] admitted, which
/// [`KeyedLimiter::refund_key`] can give back: the state the admission left and its cost.
///
/// # Examples
///
/// ```
/// use paceline::{KeyedLimiter, Quota};
/// let per_user = KeyedLimiter::new(Quota::per_minute(10));
/// let global = KeyedLimiter::new(Quota::per_minute(1));
/// let first = per_user.check_key_refundable(&"ann").unwrap();
/// global.check_key(&()).unwrap();
/// // The second request passes its own limit, then the global one refuses it:
/// let second = per_user.check_key_refundable(&"ann").unwrap();
/// if global.check_key(&()).is_err() {
///     per_user.refund_key(&"ann", second); // a refused request spends nothing
/// }
/// assert_eq!(per_user.remaining_key(&"ann"), 9);
/// # let _ = first;
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "an admission is kept unless it is refunded"]
pub struct KeyAdmission {
    tat: u64,
    cost: u64,
}

impl KeyAdmission {
    /// The TAT the admission left and its cost, for a limiter of another kind (the shared
    /// keyed limiter) that keeps the same record.
    #[cfg(feature = "shared")]
    #[cfg_attr(loom, allow(dead_code))] // loom builds leave the shared keyed limiter out
    pub(crate) fn new(tat: u64, cost: u64) -> KeyAdmission {
        KeyAdmission { tat, cost }
    }

    #[cfg(feature = "shared")]
    #[cfg_attr(loom, allow(dead_code))] // as `new`
    pub(crate) fn parts(self) -> (u64, u64) {
        (self.tat, self.cost)
    }
}

impl<K: Hash + Eq + Clone, C: Clock> KeyedLimiter<K, C> {
    /// [`KeyedLimiter::check_key`], returning what [`KeyedLimiter::refund_key`] needs to
    /// give the cell back: for taking a cell from several limits at once or none.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::check_key`].
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::KeyedLimiter::new(paceline::Quota::per_hour(1));
    /// let admitted = limiter.check_key_refundable(&7).unwrap();
    /// limiter.refund_key(&7, admitted);
    /// assert!(limiter.check_key(&7).is_ok());
    /// ```
    pub fn check_key_refundable(&self, key: &K) -> Result<KeyAdmission, NotUntil> {
        self.acquire_one(key)
            .map(|(tat, cost)| KeyAdmission { tat, cost })
    }

    /// [`KeyedLimiter::check_key_n`], returning what [`KeyedLimiter::refund_key`] needs to
    /// give the cells back: `n` cells of several limits at once, or none.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::check_key_n`].
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::KeyedLimiter::new(paceline::Quota::per_hour(5));
    /// let admitted = limiter.check_key_n_refundable(&7, 3).unwrap();
    /// limiter.refund_key(&7, admitted);
    /// assert_eq!(limiter.remaining_key(&7), 5);
    /// ```
    pub fn check_key_n_refundable(&self, key: &K, n: u32) -> Result<KeyAdmission, Denied> {
        let params = self.params_for(key);
        let cost = crate::error::cost(&params, n)?;
        match self.with_word(key, |cell, now| cell.acquire(now, cost, params.tau())) {
            Ok(Ok(tat)) => Ok(KeyAdmission { tat, cost }),
            Ok(Err(wait)) => Err(NotUntil::from_nanos(wait).into()),
            Err(wait) => Err(NotUntil::no_room(wait).into()),
        }
    }

    /// Gives back the cell `admission` took, if nothing was admitted or booked on `key`
    /// since (otherwise it stays spent: the limit only ever errs on the strict side). Call
    /// it only for a cell that was not used: an explicit refund is the caller's word that
    /// nothing was done with it, whatever the time.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = paceline::KeyedLimiter::new(paceline::Quota::per_hour(2));
    /// let a = limiter.check_key_refundable(&"k").unwrap();
    /// let b = limiter.check_key_refundable(&"k").unwrap();
    /// limiter.refund_key(&"k", a); // not the last admission: stays spent
    /// limiter.refund_key(&"k", b); // the last one: given back
    /// assert_eq!(limiter.remaining_key(&"k"), 1);
    /// ```
    pub fn refund_key(&self, key: &K, admission: KeyAdmission) {
        let _ = self.with_stored_word(key, |cell, _| cell.refund(admission.tat, admission.cost));
    }
}
