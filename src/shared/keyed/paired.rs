//! A key's cells taken from both lanes together: what a caller whose work runs at once
//! takes from the booking lane and the execution lane, with one look-up of the key.

use std::sync::Arc;

use super::SharedKeyedLimiter;
use crate::clock::Clock;
use crate::error::{self, Denied, NotUntil};
use crate::gcra;
use crate::shared::table::{Key, Moved, Slot};

impl SharedKeyedLimiter {
    /// Admits `n` cells of `key` in this lane and in `other` together, or none: what a
    /// caller whose work runs at once takes from the booking lane and the execution lane
    /// ([`SharedKeyedLimiter::execution_lane`]). `other` is looked at first, so that
    /// neither is spent unless both have room now; another process may take `other`'s
    /// room between the look and the take, and then this lane's cells stay spent (the
    /// strict side: never more through) and the answer is `other`'s refusal. For two lanes
    /// of one file the key is digested and found once, and the clock and the quota read
    /// once, for both; otherwise it is `other.peek_key_n`, `self.check_key_n` and
    /// `other.check_key_n`, in that order.
    ///
    /// # Errors
    ///
    /// As [`SharedKeyedLimiter::check_key_n`], for the lane that had no room.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kw-{}", std::process::id()));
    /// let booked = SharedKeyedLimiter::open(&path, Quota::per_second(10), 64)?;
    /// let running = booked.execution_lane();
    /// running.check_key_n("a", 10)?; // the work of late turns spent the execution lane
    /// assert!(booked.check_key_n_with("a", &running, 1).is_err());
    /// assert_eq!(booked.remaining_key("a"), 10); // nothing spent where the other had no room
    /// assert!(booked.check_key_n_with("b", &running, 1).is_ok());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key_n_with(
        &self,
        key: impl AsRef<[u8]>,
        other: &SharedKeyedLimiter,
        n: u32,
    ) -> Result<(), Denied> {
        let key = key.as_ref();
        if !self.lanes_of_one_file(other) {
            let wait = other.peek_key_n(key, n)?;
            if !wait.is_zero() {
                return Err(NotUntil::from_nanos(crate::wait::duration_nanos(wait)).into());
            }
            self.check_key_n(key, n)?;
            return other.check_key_n(key, n);
        }
        let params = self.params();
        let cost = error::cost(&params, n)?;
        if cost == 0 {
            return Ok(());
        }
        let digest = self.key(key);
        let now = self.clock.now();
        let room = params.tau().saturating_sub(cost);
        match self.with_slot(digest, now, |slot| {
            self.spend_both(&slot, digest, other.lane, now, cost, room)
        }) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(wait)) => Err(NotUntil::from_nanos(wait).into()),
            Err(wait) => Err(NotUntil::no_room(wait).into()),
        }
    }

    /// [`SharedKeyedLimiter::check_key_n_with`] for a key already stored; `None` (nothing
    /// checked) for one that is not, as [`SharedKeyedLimiter::check_key_n_if_stored`]:
    /// a stored key's check never waits on another process.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kwi-{}", std::process::id()));
    /// let booked = SharedKeyedLimiter::open(&path, Quota::per_second(10), 64)?;
    /// let running = booked.execution_lane();
    /// assert!(booked.check_key_n_with_if_stored("a", &running, 1).is_none());
    /// booked.check_key_n_with("a", &running, 1)?; // stores it
    /// assert!(matches!(booked.check_key_n_with_if_stored("a", &running, 1), Some(Ok(()))));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key_n_with_if_stored(
        &self,
        key: impl AsRef<[u8]>,
        other: &SharedKeyedLimiter,
        n: u32,
    ) -> Option<Result<(), Denied>> {
        let key = key.as_ref();
        if !self.lanes_of_one_file(other) {
            self.find(self.key(key))?;
            return Some(self.check_key_n_with(key, other, n));
        }
        let params = self.params();
        let cost = match error::cost(&params, n) {
            Ok(0) => return Some(Ok(())),
            Ok(cost) => cost,
            Err(denied) => return Some(Err(denied)),
        };
        let digest = self.key(key);
        let now = self.clock.now();
        let room = params.tau().saturating_sub(cost);
        loop {
            let slot = self.find(digest)?;
            if let Ok(both) = self.spend_both(&slot, digest, other.lane, now, cost, room) {
                return Some(both.map_err(|wait| NotUntil::from_nanos(wait).into()));
            }
        }
    }

    /// Whether `other` is the other lane of this limiter's file.
    fn lanes_of_one_file(&self, other: &SharedKeyedLimiter) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared) && self.lane != other.lane
    }

    /// On `key`'s slot: looks at lane `other`, then spends this lane, then `other`;
    /// `Ok(Err(wait))` with the wait of the first with no room, `Err(Moved)` when the slot
    /// was not `key`'s before anything was spent (look again). A slot that stops holding
    /// `key` once this lane is spent answers as a refusal: this lane's TAT is then ahead
    /// of now, so no claim takes the slot (only an operator's reset or a repair could),
    /// and a retry would spend this lane twice.
    fn spend_both(
        &self,
        slot: &Slot<'_>,
        key: Key,
        other: usize,
        now: u64,
        cost: u64,
        room: u64,
    ) -> Result<Result<(), u64>, Moved> {
        // The look (an Acquire load, as every read of a slot's word): a hint that spares
        // this lane a take the other would refuse; the takes' exchanges decide.
        if let Err(wait) = gcra::admit_in_room(slot.word(other), now, cost, room) {
            // Read before knowing the slot is `key`'s: a refusal counts only if it is.
            return if slot.holds(key) {
                Ok(Err(wait))
            } else {
                Err(Moved)
            };
        }
        if let Err(wait) = slot.spend(key, self.lane, now, cost, room)? {
            return Ok(Err(wait));
        }
        Ok(match slot.spend(key, other, now, cost, room) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(wait)) => Err(wait),
            Err(Moved) => Err(cost),
        })
    }
}
