//! A key's cells taken from two keyed limiters together: what a caller whose work runs at
//! once takes from a booking limiter and the limiter that bounds when work runs, with the
//! key found in both by one hash and the clock read once.

use core::hash::Hash;

use super::store::KeyRef;
use super::text_key::TextKeyRef;
use super::{KeyedLimiter, TextKey};
use crate::clock::Clock;
use crate::error::{self, Denied, InsufficientCapacity, NotUntil};
use crate::gcra::{self, Params};

impl<K: Hash + Eq + Clone, C: Clock> KeyedLimiter<K, C> {
    /// An empty keyed limiter of this one's quota, clock and key bound that finds a key
    /// as this one does: the execution limiter to pass to
    /// [`KeyedLimiter::check_key_n_with`], which then hashes each key once for both. It
    /// shares no state with this one (no keys, no waiters, no later `set_quota`), and
    /// has no per-key quotas ([`KeyedLimiter::with_quota_for`] gives it its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let booked = KeyedLimiter::new(Quota::per_second(10)).with_max_keys(10_000);
    /// let running = booked.execution_lane();
    /// assert_eq!(running.quota(), booked.quota());
    /// assert!(running.check_key(&"a").is_ok());
    /// assert_eq!(booked.remaining_key(&"a"), 10); // a limiter of its own
    /// ```
    pub fn execution_lane(&self) -> KeyedLimiter<K, C> {
        let mut lane = KeyedLimiter::with_clock(self.quota(), self.clock.clone());
        lane.store = self.store.lane();
        lane
    }

    /// Admits `n` cells of `key` in this limiter and in `other` together, or none: what a
    /// caller whose work runs at once takes from a booking limiter and the limiter that
    /// bounds when work runs. `other` is looked at first, so that neither is spent unless
    /// both have room now; a caller racing on `other` may take its room between the look
    /// and the take, and then this limiter's cells stay spent (the strict side: never
    /// more through) and the answer is `other`'s refusal. Each limiter's own quota for
    /// the key decides for it. The clock is read once, this limiter's, so give it
    /// limiters that read one clock. For a key stored in both, the key is found in both
    /// at once (hashed once where `other` is this one's
    /// [`execution_lane`](Self::execution_lane)); otherwise it is `other.peek_key_n`,
    /// `self.check_key_n` and `other.check_key_n`, in that order, at that one reading. A
    /// limiter paired with itself takes `2n` cells of the key, or none.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] with the wait of the limiter that had no room (or whose table
    /// had none for a new key: [`NotUntil::is_table_full`]);
    /// [`Denied::InsufficientCapacity`] when `n` exceeds either burst (`2n` the burst of
    /// a limiter paired with itself; its count is `u32::MAX` where `2n` is past it).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let booked = KeyedLimiter::new(Quota::per_second(10));
    /// let running = booked.execution_lane();
    /// running.check_key_n(&"a", 10).unwrap(); // late work spent the execution bound
    /// assert!(booked.check_key_n_with(&"a", &running, 1).is_err());
    /// assert_eq!(booked.remaining_key(&"a"), 10); // nothing spent where the other had no room
    /// assert!(booked.check_key_n_with(&"b", &running, 1).is_ok());
    /// ```
    pub fn check_key_n_with(
        &self,
        key: &K,
        other: &KeyedLimiter<K, C>,
        n: u32,
    ) -> Result<(), Denied> {
        self.check_n_with_by(key, self.params_for(key), other, other.params_for(key), n)
    }

    /// [`KeyedLimiter::check_key_n_with`] for the key `key` names, under `mine` here and
    /// `theirs` in `other`.
    fn check_n_with_by<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        mine: Params,
        other: &KeyedLimiter<K, C>,
        theirs: Params,
        n: u32,
    ) -> Result<(), Denied> {
        if n == 0 {
            return Ok(());
        }
        if core::ptr::eq(self, other) {
            // Both takes from one cell: together or none means 2n cells at once (past
            // `u32::MAX`, over any burst).
            let Some(both) = n.checked_mul(2) else {
                return Err(InsufficientCapacity::new(u32::MAX, mine.burst()).into());
            };
            return self.check_n_by(key, mine, both);
        }
        // In the order of the steps this stands for, errors included: `other`'s look
        // first. Each cost is within its burst, so its room does not underflow.
        let other_cost = error::cost(&theirs, n)?;
        let other_room = theirs.tau() - other_cost;
        let cost = error::cost(&mine, n);
        let refused = |wait| Denied::from(NotUntil::from_nanos(wait));
        let together = self.store.with_stored_pair(
            &other.store,
            key,
            || self.now(),
            |word, other_word, now| {
                // The look reads `other`'s TAT relaxed (`TatWord::tat`): a hint that spares
                // this limiter a take the other would refuse; the takes decide.
                gcra::admit_in_room(other_word.tat(), now, other_cost, other_room)
                    .map_err(refused)?;
                let cost = cost?;
                word.spend(now, cost, mine.tau() - cost).map_err(refused)?;
                other_word
                    .spend(now, other_cost, other_room)
                    .map(drop)
                    .map_err(refused)
            },
        );
        if let Some(checked) = together {
            return checked;
        }
        // A key new to either: the three steps, each storing the key as it would alone,
        // all at one reading of the clock (a clock may step back between two readings,
        // and the look would then find room that the take refuses). The look is at the
        // time a take reads (not at the shard's forgetting time, which a clock that
        // stepped back is behind); at a key `other` has not stored, at what it would
        // store: its forgetting time, or no room (the table full).
        let now = self.now();
        let look = match other.store.with_stored_word(
            key,
            || now,
            |word, _| gcra::admit_in_room(word.tat(), now, other_cost, other_room),
        ) {
            Some(looked) => looked.map_err(refused),
            None => match other.store.vacancy(key, now) {
                Ok(tat) => gcra::admit_in_room(tat, now, other_cost, other_room).map_err(refused),
                Err(wait) => Err(NotUntil::no_room(wait).into()),
            },
        };
        look?;
        self.check_n_by_at(key, mine, n, || now)?;
        other.check_n_by_at(key, theirs, n, || now)
    }
}

impl<C: Clock> KeyedLimiter<TextKey, C> {
    /// [`KeyedLimiter::check_key_n_with`] for the key `text` names, found without making
    /// it (as [`KeyedLimiter::check_text_n`]).
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::check_key_n_with`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota, TextKey};
    /// let booked = KeyedLimiter::<TextKey>::new(Quota::per_second(2));
    /// let running = booked.execution_lane();
    /// assert!(booked.check_text_n_with("tenant-a", &running, 2).is_ok());
    /// assert!(booked.check_text_n_with("tenant-a", &running, 1).is_err());
    /// assert_eq!(running.remaining_key(&TextKey::new("tenant-a")), 0);
    /// ```
    pub fn check_text_n_with(
        &self,
        text: &str,
        other: &KeyedLimiter<TextKey, C>,
        n: u32,
    ) -> Result<(), Denied> {
        if self.quota_for.is_some() || other.quota_for.is_some() {
            return self.check_key_n_with(&TextKey::new(text), other, n);
        }
        let (mine, theirs) = (self.quota.load(), other.quota.load());
        self.check_n_with_by(&TextKeyRef::new(text), mine, other, theirs, n)
    }
}
