//! Waiting for a shared key's cells: holds, futures, blocking waits and reservations,
//! through the waiting layer's queue (one queue per key with waiters in this process).

use core::future::Future;
use core::time::Duration;
use std::sync::Arc;

use super::SharedKeyedLimiter;
use crate::cell::{Ours, TatWord};
use crate::clock::{Clock, HostClock};
use crate::error::Denied;
use crate::gcra::Params;
use crate::shared::table::Key;
use crate::wait::{
    self,
    block::block_on,
    future::{Acquire, Target},
    queue::Waiters,
};

impl SharedKeyedLimiter {
    /// This process's queue of waiters for `key` (made on demand; queues nobody holds and
    /// nobody waits in are dropped once there are many).
    pub(super) fn waiters_of(&self, key: Key) -> Arc<Waiters<HostClock>> {
        let mut queues = crate::clock::gate::lock(&self.waiters);
        if queues.len() >= 64 {
            queues.retain(|_, queue| Arc::strong_count(queue) > 1 || !queue.is_empty());
        }
        Arc::clone(
            queues
                .entry(key)
                .or_insert_with(|| Waiters::new(self.clock.clone())),
        )
    }

    /// Holds every cell of `key` back for `d` from now (as
    /// [`SharedLimiter::hold_for`](crate::shared::SharedLimiter::hold_for) for its one quota),
    /// storing the key if it is not (a key no slot can take is not held). At most
    /// [`MAX_HOLD`](crate::shared::MAX_HOLD); [`SharedKeyedLimiter::reset_key`] ends one.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-khold-{}", std::process::id()));
    /// let per_host = SharedKeyedLimiter::open(&path, Quota::per_second(10), 64)?;
    /// per_host.hold_key_for("api.example.com", Duration::from_secs(1));
    /// assert!(per_host.check_key("api.example.com").is_err());
    /// assert!(per_host.check_key("other.example.com").is_ok());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hold_key_for(&self, key: impl AsRef<[u8]>, d: Duration) {
        let target = self.target(key.as_ref());
        let (waiters, params) = (target.waiters(), target.params());
        let now = self.clock.now();
        let d = d.min(crate::shared::MAX_HOLD);
        let until = now.saturating_add(wait::duration_nanos(d));
        // Again if the key's slot became another key's meanwhile (it had refilled).
        loop {
            match target.with_word(|cell, ours| waiters.hold(cell, ours, &params, now, until)) {
                Ok(Some(arm)) => return waiters.schedule(arm),
                Ok(None) => continue,
                Err(_) => return,
            }
        }
    }

    fn target(&self, key: &[u8]) -> KeyTarget<&SharedKeyedLimiter> {
        KeyTarget {
            key: self.key(key),
            limiter: self,
        }
    }

    /// Waits its booked turn for one cell of `key`, in every process's FIFO for that key.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-ke-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(1000).with_burst(1), 64)?;
    /// futures::executor::block_on(async {
    ///     limiter.until_key_ready("a").await;
    ///     limiter.until_key_ready("a").await; // ~1 ms later
    /// });
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_key_ready(&self, key: impl AsRef<[u8]>) -> impl Future<Output = ()> + Send + '_ {
        wait::ready(self.target(key.as_ref()))
    }

    /// Waits its booked turn for `n` cells of `key` if it comes within `max`; otherwise
    /// books nothing.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when the turn is further than `max`;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # use std::time::Duration;
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kf-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_hour(1), 64)?;
    /// limiter.check_key("a")?;
    /// let soon = limiter.until_key_n_ready_within("a", 1, Duration::from_secs(1));
    /// assert!(futures::executor::block_on(soon).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn until_key_n_ready_within(
        &self,
        key: impl AsRef<[u8]>,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + '_ {
        wait::n_ready_within(self.target(key.as_ref()), n, max)
    }

    /// Blocks the calling thread for its booked turn for one cell of `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kg-{}", std::process::id()));
    /// let limiter = SharedKeyedLimiter::open(&path, Quota::per_second(1000).with_burst(1), 64)?;
    /// limiter.wait_key("a");
    /// limiter.wait_key("a");
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_key(&self, key: impl AsRef<[u8]>) {
        block_on(self.until_key_ready(key));
    }

    /// Books `n` cells of `key` within `max`, owning the limiter: a value that gives them
    /// back if dropped before its instant (as
    /// [`KeyedLimiter::reserve_key_within_owned`](crate::KeyedLimiter::reserve_key_within_owned)).
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when the turn is further than `max`, or no slot can take a new
    /// key (nothing booked); [`Denied::InsufficientCapacity`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::SharedKeyedLimiter, Quota};
    /// # use std::{sync::Arc, time::Duration};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-kh-{}", std::process::id()));
    /// let limiter = Arc::new(SharedKeyedLimiter::open(&path, Quota::per_second(100), 64)?);
    /// let turn = Arc::clone(&limiter).reserve_key_within_owned("a", 1, Duration::MAX)?;
    /// assert!(turn.is_ready());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_key_within_owned(
        self: Arc<Self>,
        key: impl AsRef<[u8]>,
        n: u32,
        max: Duration,
    ) -> Result<OwnedSharedKeyReservation, Denied> {
        let key = self.key(key.as_ref());
        let target = KeyTarget { key, limiter: self };
        crate::wait::turn::Turn::book(Acquire::new(target, n, wait::duration_nanos(max)))
            .map(|turn| OwnedSharedKeyReservation { turn })
    }
}

/// One key of a shared keyed limiter, as the waiting path's target.
#[derive(Debug)]
pub(crate) struct KeyTarget<L> {
    limiter: L,
    key: Key,
}

impl<L: core::ops::Deref<Target = SharedKeyedLimiter>> Target for KeyTarget<L> {
    type Clock = HostClock;

    fn params(&self) -> Params {
        self.limiter.params()
    }

    fn clock(&self) -> &HostClock {
        &self.limiter.clock
    }

    fn waiters(&self) -> Arc<Waiters<HostClock>> {
        self.limiter.waiters_of(self.key)
    }

    fn with_word<R>(&self, f: impl FnOnce(&TatWord, Ours<'_>) -> R) -> Result<R, u64> {
        // A stored key's word, lock-free: the queue's writes check the slot still holds the
        // key between reading the word and swapping it (as a check does), so a claim that
        // gives the slot to another key meanwhile is never written into. A new key is
        // stored under its bucket's lock first.
        let limiter = &*self.limiter;
        let key = self.key;
        let slot = match limiter.find(key) {
            Some(slot) => slot,
            None => {
                let now = limiter.clock.now();
                limiter.with_bucket_lock(key, now, |token| limiter.claim_locked(key, now, token))?
            }
        };
        let ours = || slot.holds(key);
        Ok(f(TatWord::in_place(slot.words[limiter.lane]), &ours))
    }

    fn with_stored_word<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R> {
        let limiter = &*self.limiter;
        let slot = limiter.find(self.key)?;
        Some(f(
            TatWord::in_place(slot.words[limiter.lane]),
            limiter.clock.now(),
        ))
    }
}

/// A booked turn for a key of a [`SharedKeyedLimiter`], owning the limiter: made by
/// [`SharedKeyedLimiter::reserve_key_within_owned`]; the promises of a
/// [`SharedReservation`](crate::shared::SharedReservation).
///
/// # Examples
///
/// ```
/// # use paceline::{shared::SharedKeyedLimiter, Quota};
/// # use std::{sync::Arc, time::Duration};
/// # let path = std::env::temp_dir().join(format!("paceline-doc-ki-{}", std::process::id()));
/// let limiter = Arc::new(SharedKeyedLimiter::open(&path, Quota::per_second(100), 64)?);
/// let turn = Arc::clone(&limiter).reserve_key_within_owned("a", 1, Duration::MAX)?;
/// std::thread::spawn(move || turn.wait()).join().unwrap();
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct OwnedSharedKeyReservation {
    turn: crate::wait::turn::Turn<KeyTarget<Arc<SharedKeyedLimiter>>>,
}

impl OwnedSharedKeyReservation {
    crate::wait::turn::reservation_methods!(
        "let path = std::env::temp_dir().join(format!(\"paceline-doc-kj-{}\", std::process::id()));\nlet limiter = std::sync::Arc::new(paceline::shared::SharedKeyedLimiter::open(&path, paceline::Quota::per_second(1000), 64).unwrap());\nlet turn = limiter.reserve_key_within_owned(\"a\", 1, std::time::Duration::MAX).unwrap();"
    );
}

impl core::fmt::Debug for OwnedSharedKeyReservation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OwnedSharedKeyReservation")
            .field("ready_in", &self.ready_in())
            .finish_non_exhaustive()
    }
}

impl Future for OwnedSharedKeyReservation {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(
        mut self: core::pin::Pin<&mut Self>,
        cx: &mut core::task::Context<'_>,
    ) -> core::task::Poll<()> {
        self.turn.poll(cx)
    }
}
