//! Waiting per key: the keyed limiter's booked FIFO waits, owned or borrowed, and its
//! reservations, all through the same waiting path as the direct limiter.

use core::future::Future;
use core::hash::Hash;
use core::ops::Deref;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use super::store::MIN_SWEEP_LEN;
use super::KeyedLimiter;
use crate::cell::{Ours, TatWord, ALWAYS_OURS};
use crate::clock::Clock;
use crate::error::{Denied, InsufficientCapacity, NotUntil};
use crate::gcra::Params;
use crate::wait::future::{Acquire, Target};
use crate::wait::queue::Waiters;
use crate::wait::turn::{reservation_methods, Turn};
use crate::wait::{self, block::block_on};

impl<K: Hash + Eq + Clone, C: Clock> KeyedLimiter<K, C> {
    /// Waits `key`'s booked turn for one cell (the same FIFO promises as
    /// [`Limiter::until_ready`](crate::Limiter::until_ready)).
    ///
    /// The key bound of [`KeyedLimiter::with_max_keys`] holds here too: a new key that
    /// finds its shard full of limited keys books nothing and waits until a slot frees,
    /// then tries again.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(1000).with_burst(1));
    /// futures::executor::block_on(async {
    ///     limiter.until_key_ready(&"job").await;
    ///     limiter.until_key_ready(&"job").await; // about 1 ms later
    /// });
    /// ```
    pub fn until_key_ready(&self, key: &K) -> impl Future<Output = ()> + Send + '_
    where
        K: Send + Sync,
    {
        wait::ready(self.target(key))
    }

    /// Waits `key`'s booked turn for `n` cells at once.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(10));
    /// futures::executor::block_on(async {
    ///     assert!(limiter.until_key_n_ready(&1, 10).await.is_ok());
    ///     assert!(limiter.until_key_n_ready(&1, 11).await.is_err());
    /// });
    /// ```
    pub fn until_key_n_ready(
        &self,
        key: &K,
        n: u32,
    ) -> impl Future<Output = Result<(), InsufficientCapacity>> + Send + '_
    where
        K: Send + Sync,
    {
        wait::n_ready(self.target(key), n)
    }

    /// Waits for one cell for `key` only if it can be had within `max`; otherwise books
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] when the cell cannot be had within `max` (or, for a new key at the key
    /// bound, when no slot frees within `max`).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::new(Quota::per_hour(1));
    /// futures::executor::block_on(async {
    ///     assert!(limiter.until_key_ready_within(&1, Duration::ZERO).await.is_ok());
    ///     assert!(limiter.until_key_ready_within(&1, Duration::from_secs(1)).await.is_err());
    /// });
    /// ```
    pub fn until_key_ready_within(
        &self,
        key: &K,
        max: Duration,
    ) -> impl Future<Output = Result<(), NotUntil>> + Send + '_
    where
        K: Send + Sync,
    {
        wait::ready_within(self.target(key), max)
    }

    /// Waits for `n` cells for `key` within `max`, or books nothing.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] when the cells cannot be had within `max`;
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{Denied, KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::new(Quota::per_second(4));
    /// futures::executor::block_on(async {
    ///     limiter.until_key_n_ready_within(&"a", 4, Duration::ZERO).await.unwrap();
    ///     let late = limiter.until_key_n_ready_within(&"a", 2, Duration::from_millis(100)).await;
    ///     assert!(matches!(late, Err(Denied::NotUntil(_))));
    /// });
    /// ```
    pub fn until_key_n_ready_within(
        &self,
        key: &K,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + '_
    where
        K: Send + Sync,
    {
        wait::n_ready_within(self.target(key), n, max)
    }

    /// Blocks the calling thread until one cell is admitted for `key`, in the same booked
    /// FIFO as the key's async waiters. Don't call it inside an async task.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(1000).with_burst(1));
    /// let start = std::time::Instant::now();
    /// for _ in 0..3 {
    ///     limiter.wait_key(&"job");
    /// }
    /// assert!(start.elapsed().as_millis() >= 2);
    /// ```
    pub fn wait_key(&self, key: &K)
    where
        K: Send + Sync,
    {
        block_on(self.until_key_ready(key));
    }

    /// Holds every cell of `key` back for `d` from now, booked turns included, as
    /// [`Limiter::hold_for`](crate::Limiter::hold_for) does for its one quota. The key is
    /// stored if it is not (a key that a full table cannot store is not held).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, KeyedLimiter, Quota};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let per_host = KeyedLimiter::with_clock(Quota::per_second(10), clock.clone());
    /// per_host.hold_key_for(&"api.example.com", Duration::from_secs(1));
    /// assert!(per_host.check_key(&"api.example.com").is_err());
    /// assert!(per_host.check_key(&"other.example.com").is_ok());
    /// clock.advance(Duration::from_secs(1));
    /// assert!(per_host.check_key(&"api.example.com").is_ok());
    /// ```
    pub fn hold_key_for(&self, key: &K, d: Duration) {
        let target = KeyTarget {
            limiter: self,
            key: key.clone(),
        };
        let (waiters, params) = (target.waiters(), target.params());
        let held = self.with_word(key, |cell, now| {
            let until = now.saturating_add(wait::duration_nanos(d));
            waiters.hold(cell, ALWAYS_OURS, &params, now, until)
        });
        if let Ok(Some(arm)) = held {
            waiters.schedule(arm);
        }
    }

    /// Blocks the calling thread until `n` cells are admitted for `key` at once.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] at once when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::new(Quota::per_second(10));
    /// limiter.wait_key_n(&1, 10).unwrap();
    /// assert!(limiter.wait_key_n(&1, 11).is_err());
    /// ```
    pub fn wait_key_n(&self, key: &K, n: u32) -> Result<(), InsufficientCapacity>
    where
        K: Send + Sync,
    {
        block_on(self.until_key_n_ready(key, n))
    }

    /// Blocks for one cell for `key` only if it can be had within `max`; otherwise books
    /// nothing (the keyed twin of [`Limiter::wait_within`](crate::Limiter::wait_within)).
    ///
    /// # Errors
    ///
    /// [`NotUntil`] when the cell cannot be had within `max`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::new(Quota::per_hour(1));
    /// limiter.wait_key_within(&"a", Duration::ZERO).unwrap();
    /// assert!(limiter.wait_key_within(&"a", Duration::from_millis(1)).is_err());
    /// ```
    pub fn wait_key_within(&self, key: &K, max: Duration) -> Result<(), NotUntil>
    where
        K: Send + Sync,
    {
        block_on(self.until_key_ready_within(key, max))
    }

    /// Books `n` cells for `key` now and says from when they may be used (the keyed twin
    /// of [`Limiter::reserve`](crate::Limiter::reserve)): a place in the key's FIFO;
    /// given back if dropped (or cancelled) before its instant.
    ///
    /// # Errors
    ///
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the key's burst;
    /// [`Denied::NotUntil`] for a new key at a full key table (nothing booked; the wait
    /// is until a slot frees) or past the end of representable time.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::with_clock(Quota::per_second(10), ManualClock::new());
    /// limiter.check_key_n(&"a", 10).unwrap();
    /// let turn = limiter.reserve_key(&"a", 2).unwrap();
    /// assert_eq!(turn.ready_in(), Duration::from_millis(200));
    /// ```
    pub fn reserve_key(&self, key: &K, n: u32) -> Result<KeyReservation<'_, K, C>, Denied> {
        Turn::book(Acquire::new(self.target(key), n, u64::MAX)).map(|turn| KeyReservation { turn })
    }

    /// [`KeyedLimiter::reserve_key`], but only if the cells can be had within `max`;
    /// otherwise books nothing.
    ///
    /// # Errors
    ///
    /// [`Denied::NotUntil`] with the wait when it is longer than `max` (nothing booked);
    /// [`Denied::InsufficientCapacity`] when `n` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// use std::time::Duration;
    /// let limiter = KeyedLimiter::new(Quota::per_minute(1));
    /// assert!(limiter.reserve_key_within(&"a", 1, Duration::ZERO).is_ok());
    /// assert!(limiter.reserve_key_within(&"a", 1, Duration::from_secs(1)).is_err());
    /// ```
    pub fn reserve_key_within(
        &self,
        key: &K,
        n: u32,
        max: Duration,
    ) -> Result<KeyReservation<'_, K, C>, Denied> {
        Turn::book(Acquire::new(self.target(key), n, wait::duration_nanos(max)))
            .map(|turn| KeyReservation { turn })
    }

    /// [`KeyedLimiter::reserve_key_within`] on a shared limiter, owning it and the key:
    /// `'static`, to keep in a struct, a task or a foreign object (`Duration::MAX` for no
    /// maximum).
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::reserve_key_within`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// use std::{sync::Arc, time::Duration};
    /// let limiter = Arc::new(KeyedLimiter::new(Quota::per_second(10)));
    /// let turn = Arc::clone(&limiter).reserve_key_within_owned("a".to_string(), 3, Duration::MAX).unwrap();
    /// assert!(turn.is_ready());
    /// ```
    pub fn reserve_key_within_owned(
        self: Arc<Self>,
        key: K,
        n: u32,
        max: Duration,
    ) -> Result<OwnedKeyReservation<K, C>, Denied> {
        Turn::book(Acquire::new(
            KeyTarget { limiter: self, key },
            n,
            wait::duration_nanos(max),
        ))
        .map(|turn| OwnedKeyReservation { turn })
    }

    /// [`KeyedLimiter::until_key_ready`] on a shared limiter: the future owns it (an `Arc`
    /// clone) and the key, so it is `'static`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// use std::sync::Arc;
    /// let limiter = Arc::new(KeyedLimiter::new(Quota::per_second(1000).with_burst(1)));
    /// let turn = Arc::clone(&limiter).until_key_ready_owned("job".to_string());
    /// std::thread::spawn(move || futures::executor::block_on(turn)).join().unwrap();
    /// ```
    pub fn until_key_ready_owned(
        self: Arc<Self>,
        key: K,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        K: Send + Sync + 'static,
    {
        wait::ready(KeyTarget { limiter: self, key })
    }

    /// [`KeyedLimiter::until_key_n_ready_within`] on a shared limiter, owning it and the
    /// key (see [`KeyedLimiter::until_key_ready_owned`]).
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::until_key_n_ready_within`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota};
    /// use std::{sync::Arc, time::Duration};
    /// let limiter = Arc::new(KeyedLimiter::new(Quota::per_hour(1)));
    /// let first = Arc::clone(&limiter).until_key_n_ready_within_owned(7u32, 1, Duration::ZERO);
    /// assert!(futures::executor::block_on(first).is_ok());
    /// ```
    pub fn until_key_n_ready_within_owned(
        self: Arc<Self>,
        key: K,
        n: u32,
        max: Duration,
    ) -> impl Future<Output = Result<(), Denied>> + Send + 'static
    where
        K: Send + Sync + 'static,
    {
        wait::n_ready_within(KeyTarget { limiter: self, key }, n, max)
    }

    pub(super) fn target(&self, key: &K) -> KeyTarget<&Self, K> {
        KeyTarget {
            limiter: self,
            key: key.clone(),
        }
    }
}

/// `n` cells booked for one key of a [`KeyedLimiter`], usable from an instant this value
/// tells: the keyed twin of [`Reservation`](crate::Reservation), with the same promises.
/// Made by [`KeyedLimiter::reserve_key`].
///
/// # Examples
///
/// ```
/// let limiter = paceline::KeyedLimiter::new(paceline::Quota::per_second(100));
/// let turn = limiter.reserve_key(&"tenant", 3).unwrap();
/// assert!(turn.is_ready());
/// turn.wait();
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct KeyReservation<'a, K: Hash + Eq + Clone, C: Clock> {
    turn: Turn<KeyTarget<&'a KeyedLimiter<K, C>, K>>,
}

impl<K: Hash + Eq + Clone + Send + Sync, C: Clock> KeyReservation<'_, K, C> {
    reservation_methods!(
        "let limiter = paceline::KeyedLimiter::new(paceline::Quota::per_second(1000));\nlet turn = limiter.reserve_key(&1u32, 1).unwrap();"
    );
}

/// A [`KeyReservation`] that owns its limiter and key: made by
/// [`KeyedLimiter::reserve_key_within_owned`]; the same promises.
///
/// # Examples
///
/// ```
/// use paceline::{KeyedLimiter, Quota};
/// use std::{sync::Arc, time::Duration};
/// let limiter = Arc::new(KeyedLimiter::new(Quota::per_second(100)));
/// let turn = limiter.reserve_key_within_owned(7u64, 1, Duration::MAX).unwrap();
/// std::thread::spawn(move || turn.wait()).join().unwrap();
/// ```
#[must_use = "dropping a reservation before its instant gives its cells back"]
pub struct OwnedKeyReservation<K: Hash + Eq + Clone, C: Clock> {
    turn: Turn<KeyTarget<Arc<KeyedLimiter<K, C>>, K>>,
}

impl<K: Hash + Eq + Clone + Send + Sync, C: Clock> OwnedKeyReservation<K, C> {
    reservation_methods!(
        "let limiter = std::sync::Arc::new(paceline::KeyedLimiter::new(paceline::Quota::per_second(1000)));\nlet turn = limiter.reserve_key_within_owned(1u32, 1, std::time::Duration::MAX).unwrap();"
    );
}

impl<K: Hash + Eq + Clone, C: Clock> core::fmt::Debug for OwnedKeyReservation<K, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OwnedKeyReservation")
            .field("ready_in", &self.turn.ready_in())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Future for OwnedKeyReservation<K, C> {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.turn.poll(cx)
    }
}

impl<K: Hash + Eq + Clone, C: Clock> core::fmt::Debug for KeyReservation<'_, K, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyReservation")
            .field("ready_in", &self.turn.ready_in())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Future for KeyReservation<'_, K, C> {
    type Output = ();

    /// Ready at the reservation's instant (at once if it has come).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.turn.poll(cx)
    }
}

/// A waiting future's view of one key, through a borrowed or a shared limiter.
pub(crate) struct KeyTarget<L, K> {
    limiter: L,
    key: K,
}

impl<L, K, C> Target for KeyTarget<L, K>
where
    L: Deref<Target = KeyedLimiter<K, C>>,
    K: Hash + Eq + Clone,
    C: Clock,
{
    type Clock = C;

    fn params(&self) -> Params {
        self.limiter.params_for(&self.key)
    }

    fn clock(&self) -> &C {
        &self.limiter.clock
    }

    fn waiters(&self) -> Arc<Waiters<C>> {
        let limiter = &*self.limiter;
        let mut queues = crate::clock::gate::lock(&limiter.waiters);
        if queues.map.len() >= MIN_SWEEP_LEN && queues.map.len() >= 2 * queues.cleaned_len {
            queues.clean();
        }
        Arc::clone(
            queues
                .map
                .entry(self.key.clone())
                .or_insert_with(|| Waiters::new(limiter.clock.clone())),
        )
    }

    fn with_word<R>(&self, f: impl FnOnce(&TatWord, Ours<'_>) -> R) -> Result<R, u64> {
        // The cell stays the key's while the shard's read lock is held around `f`.
        self.limiter
            .with_word(&self.key, |cell, _| f(cell, ALWAYS_OURS))
    }

    fn with_stored_word<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R> {
        self.limiter.with_stored_word(&self.key, f)
    }
}
