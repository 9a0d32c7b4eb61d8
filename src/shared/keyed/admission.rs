//! A shared key's cell taken so that it can be given back (what the HTTP layer needs to
//! take a cell from several limits at once or none), and the key's state read without
//! spending: its snapshot, the cells left, the wait for `n`.

use core::time::Duration;

use super::SharedKeyedLimiter;
use crate::clock::Clock;
use crate::error::{self, Denied, NotUntil};
use crate::gcra;

impl SharedKeyedLimiter {
    /// [`SharedKeyedLimiter::check_key`], returning what
    /// [`SharedKeyedLimiter::refund_key`] needs to give the cell back: for taking a cell
    /// from several limits at once or none ([`KeyedLimiter::check_key_refundable`] across
    /// processes).
    ///
    /// [`KeyedLimiter::check_key_refundable`]: crate::KeyedLimiter::check_key_refundable
    ///
    /// # Errors
    ///
    /// [`NotUntil`] as [`SharedKeyedLimiter::check_key`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kr-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(1), 64)?;
    /// let taken = limiter.check_key_refundable("a")?;
    /// limiter.refund_key("a", taken); // nothing was done with it
    /// assert!(limiter.check_key("a").is_ok());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key_refundable(
        &self,
        key: impl AsRef<[u8]>,
    ) -> Result<crate::KeyAdmission, NotUntil> {
        self.spend_one(self.key(key.as_ref()))
            .map(|(tat, cost)| crate::KeyAdmission::new(tat, cost))
            .map_err(NotUntil::from)
    }

    /// [`SharedKeyedLimiter::check_key_n`], returning what
    /// [`SharedKeyedLimiter::refund_key`] needs to give the cells back.
    ///
    /// # Errors
    ///
    /// As [`SharedKeyedLimiter::check_key_n`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-knr-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(5), 64)?;
    /// let taken = limiter.check_key_n_refundable("a", 3)?;
    /// limiter.refund_key("a", taken);
    /// assert_eq!(limiter.remaining_key("a"), 5);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_key_n_refundable(
        &self,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<crate::KeyAdmission, Denied> {
        let params = self.params();
        let cost = error::cost(&params, n)?;
        if cost == 0 {
            return Ok(crate::KeyAdmission::new(0, 0));
        }
        let key = self.key(key.as_ref());
        let now = self.clock.now();
        let room = params.tau().saturating_sub(cost);
        match self.with_slot(key, now, |slot| slot.spend(key, self.lane, now, cost, room)) {
            Ok(Ok(tat)) => Ok(crate::KeyAdmission::new(tat, cost)),
            Ok(Err(wait)) => Err(NotUntil::from_nanos(wait).into()),
            Err(wait) => Err(NotUntil::no_room(wait).into()),
        }
    }

    /// Gives back the cell `admission` (from [`SharedKeyedLimiter::check_key_refundable`]
    /// on this limiter and key) took, if nothing was admitted or booked on `key` since, in
    /// any process; otherwise it stays spent (the limit only ever errs on the strict side).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kr2-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(2), 64)?;
    /// let a = limiter.check_key_refundable("k")?;
    /// let b = limiter.check_key_refundable("k")?;
    /// limiter.refund_key("k", a); // not the last admission: stays spent
    /// limiter.refund_key("k", b); // the last one: given back
    /// assert_eq!(limiter.remaining_key("k"), 1);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_key(&self, key: impl AsRef<[u8]>, admission: crate::KeyAdmission) {
        let key = self.key(key.as_ref());
        let (tat, cost) = admission.parts();
        if let Some(slot) = self.find(key) {
            slot.refund(key, self.lane, tat, cost);
        }
    }

    /// `key`'s state now (as [`KeyedLimiter::snapshot_key`]): its quota, the cells a
    /// check would admit, and the time until the next one and until its whole burst is
    /// back. For a key that is not stored, its whole burst (or, when no slot could take
    /// it, nothing until a slot frees).
    ///
    /// [`KeyedLimiter::snapshot_key`]: crate::KeyedLimiter::snapshot_key
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-ks-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(10), 64)?;
    /// limiter.check_key_n("a", 10)?;
    /// let state = limiter.snapshot_key("a");
    /// assert_eq!((state.remaining(), state.until_full().as_millis() > 900), (0, true));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot_key(&self, key: impl AsRef<[u8]>) -> crate::Snapshot {
        let params = self.params();
        let key = self.key(key.as_ref());
        let now = self.clock.now();
        match self.find(key) {
            Some(slot) => crate::Snapshot::of(params, slot.word(self.lane), now),
            None if self.has_room(key, now) => crate::Snapshot::of(params, 0, now),
            None => crate::Snapshot::refused(params, self.room_wait(key, now)),
        }
    }

    /// [`SharedKeyedLimiter::check_key`] answering a refusal with the key's state just
    /// then, worked out from the refusal (the HTTP layer's 429 fields).
    #[cfg(feature = "tower")]
    pub(crate) fn check_key_or_state(
        &self,
        key: impl AsRef<[u8]>,
    ) -> Result<(), crate::snapshot::OneRefused> {
        use crate::snapshot::OneRefused;
        let params = self.params();
        match self.spend_one(self.key(key.as_ref())) {
            Ok(_) => Ok(()),
            Err(super::Refusal::Spent(wait)) => Err(OneRefused::spent(params, wait)),
            Err(super::Refusal::NoSlot(wait)) => Err(OneRefused::no_slot(params, wait)),
        }
    }

    /// Time now on the host clock (ns; the HTTP layer's metrics schedule by it).
    #[cfg(feature = "tower")]
    pub(crate) fn clock_now(&self) -> u64 {
        self.clock.now()
    }

    /// Whether `key` is stored, or the table has room to store it now; stores nothing.
    /// False exactly when a check of `key` now would be refused as by a full table
    /// ([`NotUntil::is_table_full`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-khr-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(1), 64)?;
    /// assert!(limiter.has_room_for("a"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn has_room_for(&self, key: impl AsRef<[u8]>) -> bool {
        let key = self.key(key.as_ref());
        self.find(key).is_some() || self.has_room(key, self.clock.now())
    }

    /// How many cells `check_key_n` would admit for `key` right now; spends and stores
    /// nothing (0 for a new key that no slot can take).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-ka-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(10), 64)?;
    /// limiter.check_key_n("a", 4)?;
    /// assert_eq!((limiter.remaining_key("a"), limiter.remaining_key("b")), (6, 10));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remaining_key(&self, key: impl AsRef<[u8]>) -> u32 {
        let params = self.params();
        let key = self.key(key.as_ref());
        let now = self.clock.now();
        match self.find(key) {
            Some(slot) => gcra::remaining(slot.word(self.lane), now, &params),
            None if self.has_room(key, now) => params.burst(),
            None => 0,
        }
    }

    /// How long from now until `n` cells of `key` would be admitted (zero: now); spends
    /// and stores nothing.
    ///
    /// # Errors
    ///
    /// [`crate::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kb-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(1), 64)?;
    /// limiter.check_key("a")?;
    /// assert!(limiter.peek_key_n("a", 1)?.as_secs() > 3500);
    /// assert!(limiter.peek_key_n("b", 1)?.is_zero());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_key_n(
        &self,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Duration, crate::InsufficientCapacity> {
        let params = self.params();
        let cost = match error::cost(&params, n) {
            Ok(cost) => cost,
            Err(Denied::InsufficientCapacity(e)) => return Err(e),
            Err(Denied::NotUntil(e)) => return Ok(e.wait_time()),
        };
        let key = self.key(key.as_ref());
        let now = self.clock.now();
        let wait = match self.find(key) {
            Some(slot) => gcra::admit(slot.word(self.lane), now, cost, params.tau()).err(),
            None if self.has_room(key, now) => None,
            None => Some(self.room_wait(key, now)),
        };
        Ok(Duration::from_nanos(wait.unwrap_or(0)))
    }
}
