//! The public waiting methods, written and documented once for every limiter whose waits
//! go through `crate::wait` (`Limiter`, `shared::SharedLimiter`): each is a thin call
//! into the one waiting path, so only their types differ.

/// Expands to the waiting methods inside an `impl` block of a limiter that implements
/// `Target`. `$setup` is hidden doc lines that import what an example uses, `$open` and
/// `$close` surround a `Quota` to make the limiter, `$end` hidden lines that end an
/// example; `$res` and `$owned` are the reservation types.
macro_rules! waiting_methods {
    (
        setup: $setup:literal,
        open: $open:literal,
        close: $close:literal,
        end: $end:literal,
        reservation: $res:ty,
        owned_reservation: $owned:ty $(,)?
    ) => {
        /// Waits its turn for one cell.
        ///
        /// The first poll books the cell (plain `check()` callers cannot take it after
        /// that); the future finishes at the booked instant, in booking order. Dropping it
        /// before then gives the cell back. A future never polled books nothing. Works on
        /// any executor.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_second(1000).with_burst(1)", $close, ";")]
        /// futures::executor::block_on(async {
        ///     for _ in 0..3 {
        ///         limiter.until_ready().await; // ~1 ms apart
        ///     }
        /// });
        #[doc = $end]
        /// ```
        pub fn until_ready(&self) -> impl core::future::Future<Output = ()> + Send + '_ {
            $crate::wait::ready(self)
        }

        /// Waits its turn for `n` cells at once (booked like [`Self::until_ready`]).
        ///
        /// # Errors
        ///
        /// [`InsufficientCapacity`](crate::InsufficientCapacity) at once when `n` exceeds
        /// the burst; nothing is booked.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_second(100)", $close, ";")]
        /// futures::executor::block_on(async {
        ///     limiter.until_n_ready(100).await.unwrap();
        ///     assert!(limiter.until_n_ready(101).await.is_err());
        /// });
        #[doc = $end]
        /// ```
        pub fn until_n_ready(
            &self,
            n: u32,
        ) -> impl core::future::Future<Output = Result<(), $crate::InsufficientCapacity>> + Send + '_
        {
            $crate::wait::n_ready(self, n)
        }

        /// Waits for one cell, but only if it can be had within `max`; otherwise books
        /// nothing and says when it could be had.
        ///
        /// # Errors
        ///
        /// [`NotUntil`](crate::NotUntil) with the wait (longer than `max`) measured from
        /// the first poll.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_minute(1)", $close, ";")]
        /// futures::executor::block_on(async {
        ///     limiter.until_ready_within(Duration::ZERO).await.unwrap();
        ///     let err = limiter.until_ready_within(Duration::from_secs(1)).await.unwrap_err();
        ///     assert!(err.wait_time() > Duration::from_secs(58));
        /// });
        #[doc = $end]
        /// ```
        pub fn until_ready_within(
            &self,
            max: core::time::Duration,
        ) -> impl core::future::Future<Output = Result<(), $crate::NotUntil>> + Send + '_ {
            $crate::wait::ready_within(self, max)
        }

        /// Waits for `n` cells within `max`, or books nothing (see
        /// [`Self::until_ready_within`]).
        ///
        /// # Errors
        ///
        /// [`Denied::NotUntil`](crate::Denied::NotUntil) when the cells cannot be had
        /// within `max`; [`Denied::InsufficientCapacity`](crate::Denied::InsufficientCapacity)
        /// when `n` exceeds the burst.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_second(4)", $close, ";")]
        /// futures::executor::block_on(async {
        ///     // The burst is spent; 2 more cells need 500 ms, more than the 100 ms we allow.
        ///     limiter.until_n_ready_within(4, Duration::ZERO).await.unwrap();
        ///     let late = limiter.until_n_ready_within(2, Duration::from_millis(100)).await;
        ///     assert!(matches!(late, Err(Denied::NotUntil(_))));
        /// });
        #[doc = $end]
        /// ```
        pub fn until_n_ready_within(
            &self,
            n: u32,
            max: core::time::Duration,
        ) -> impl core::future::Future<Output = Result<(), $crate::Denied>> + Send + '_ {
            $crate::wait::n_ready_within(self, n, max)
        }

        /// [`Self::until_ready`] owning the limiter (an `Arc` clone), so the future is
        /// `'static`: for a spawned task, a struct, a foreign object.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = Arc::new(", $open, "Quota::per_second(1000).with_burst(1)", $close, ");")]
        /// let turn = Arc::clone(&limiter).until_ready_owned();
        /// std::thread::spawn(move || futures::executor::block_on(turn)).join().unwrap();
        #[doc = $end]
        /// ```
        pub fn until_ready_owned(
            self: std::sync::Arc<Self>,
        ) -> impl core::future::Future<Output = ()> + Send + 'static {
            $crate::wait::ready(self)
        }

        /// [`Self::until_n_ready`] owning the limiter (see [`Self::until_ready_owned`]).
        ///
        /// # Errors
        ///
        /// [`InsufficientCapacity`](crate::InsufficientCapacity) at once when `n` exceeds
        /// the burst; nothing is booked.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = Arc::new(", $open, "Quota::per_second(10)", $close, ");")]
        /// let ten = Arc::clone(&limiter).until_n_ready_owned(10);
        /// assert!(futures::executor::block_on(ten).is_ok());
        #[doc = $end]
        /// ```
        pub fn until_n_ready_owned(
            self: std::sync::Arc<Self>,
            n: u32,
        ) -> impl core::future::Future<Output = Result<(), $crate::InsufficientCapacity>>
               + Send
               + 'static {
            $crate::wait::n_ready(self, n)
        }

        /// [`Self::until_n_ready_within`] owning the limiter (see
        /// [`Self::until_ready_owned`]).
        ///
        /// # Errors
        ///
        /// As [`Self::until_n_ready_within`].
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = Arc::new(", $open, "Quota::per_hour(1)", $close, ");")]
        /// let first = Arc::clone(&limiter).until_n_ready_within_owned(1, Duration::ZERO);
        /// assert!(futures::executor::block_on(first).is_ok());
        /// let second = Arc::clone(&limiter).until_n_ready_within_owned(1, Duration::from_secs(1));
        /// assert!(futures::executor::block_on(second).is_err());
        #[doc = $end]
        /// ```
        pub fn until_n_ready_within_owned(
            self: std::sync::Arc<Self>,
            n: u32,
            max: core::time::Duration,
        ) -> impl core::future::Future<Output = Result<(), $crate::Denied>> + Send + 'static {
            $crate::wait::n_ready_within(self, n, max)
        }

        /// Books `n` cells now and says from when they may be used, as a value that gives
        /// them back if dropped before then. Like Go's `Limiter.Reserve`: the booking takes
        /// its place in the same FIFO as waiters, so nobody overtakes it.
        ///
        /// # Errors
        ///
        /// [`Denied::InsufficientCapacity`](crate::Denied::InsufficientCapacity) when `n`
        /// exceeds the burst (nothing booked); [`Denied::NotUntil`](crate::Denied::NotUntil)
        /// only when the booking would pass the end of representable time (584 years).
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_second(100).with_burst(1)", $close, ";")]
        /// limiter.check().unwrap();
        /// let turn = limiter.reserve(1).unwrap();
        /// if turn.ready_in() > Duration::from_millis(50) {
        ///     drop(turn); // not worth waiting: the cell goes back
        /// } else {
        ///     turn.wait(); // or `turn.await` in async code
        /// }
        #[doc = $end]
        /// ```
        pub fn reserve(&self, n: u32) -> Result<$res, $crate::Denied> {
            <$res>::book($crate::wait::future::Acquire::new(self, n, u64::MAX))
        }

        /// [`Self::reserve`], but only if the cells can be had within `max`; otherwise
        /// books nothing.
        ///
        /// # Errors
        ///
        /// [`Denied::NotUntil`](crate::Denied::NotUntil) with the wait when it is longer
        /// than `max` (nothing booked);
        /// [`Denied::InsufficientCapacity`](crate::Denied::InsufficientCapacity) when `n`
        /// exceeds the burst.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_minute(1)", $close, ";")]
        /// assert!(limiter.reserve_within(1, Duration::ZERO).is_ok());
        /// assert!(limiter.reserve_within(1, Duration::from_secs(1)).is_err()); // a minute away
        #[doc = $end]
        /// ```
        pub fn reserve_within(
            &self,
            n: u32,
            max: core::time::Duration,
        ) -> Result<$res, $crate::Denied> {
            <$res>::book($crate::wait::future::Acquire::new(
                self,
                n,
                $crate::wait::duration_nanos(max),
            ))
        }

        /// [`Self::reserve`] returning a reservation that owns the limiter (an `Arc`
        /// clone): `'static`, to keep in a struct, a spawned task or a foreign object.
        ///
        /// # Errors
        ///
        /// As [`Self::reserve`].
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = Arc::new(", $open, "Quota::per_second(100).with_burst(1)", $close, ");")]
        /// let turn = Arc::clone(&limiter).reserve_owned(1).unwrap();
        /// assert!(turn.is_ready());
        #[doc = $end]
        /// ```
        pub fn reserve_owned(self: std::sync::Arc<Self>, n: u32) -> Result<$owned, $crate::Denied> {
            <$owned>::book($crate::wait::future::Acquire::new(self, n, u64::MAX))
        }

        /// [`Self::reserve_within`], owning the limiter (see [`Self::reserve_owned`]).
        ///
        /// # Errors
        ///
        /// As [`Self::reserve_within`].
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = Arc::new(", $open, "Quota::per_minute(1)", $close, ");")]
        /// assert!(Arc::clone(&limiter).reserve_within_owned(1, Duration::ZERO).is_ok());
        /// assert!(Arc::clone(&limiter).reserve_within_owned(1, Duration::ZERO).is_err());
        #[doc = $end]
        /// ```
        pub fn reserve_within_owned(
            self: std::sync::Arc<Self>,
            n: u32,
            max: core::time::Duration,
        ) -> Result<$owned, $crate::Denied> {
            <$owned>::book($crate::wait::future::Acquire::new(
                self,
                n,
                $crate::wait::duration_nanos(max),
            ))
        }

        /// Blocks the calling thread until one cell is admitted, in the same booked FIFO
        /// as the async waiters. Don't call it inside an async task: use
        /// [`Self::until_ready`].
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_second(1000).with_burst(1)", $close, ";")]
        /// let start = std::time::Instant::now();
        /// for _ in 0..5 {
        ///     limiter.wait();
        /// }
        /// assert!(start.elapsed().as_millis() >= 4);
        #[doc = $end]
        /// ```
        pub fn wait(&self) {
            $crate::wait::block::block_on(self.until_ready());
        }

        /// Blocks the calling thread until `n` cells are admitted at once.
        ///
        /// # Errors
        ///
        /// [`InsufficientCapacity`](crate::InsufficientCapacity) at once when `n` exceeds
        /// the burst.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_second(10)", $close, ";")]
        /// limiter.wait_n(10).unwrap();
        /// assert!(limiter.wait_n(11).is_err());
        #[doc = $end]
        /// ```
        pub fn wait_n(&self, n: u32) -> Result<(), $crate::InsufficientCapacity> {
            $crate::wait::block::block_on(self.until_n_ready(n))
        }

        /// Blocks for one cell only if it can be had within `max`; otherwise books nothing.
        ///
        /// # Errors
        ///
        /// [`NotUntil`](crate::NotUntil) when the cell cannot be had within `max`.
        ///
        /// # Examples
        ///
        /// ```
        #[doc = $setup]
        #[doc = concat!("let limiter = ", $open, "Quota::per_hour(1)", $close, ";")]
        /// limiter.wait_within(Duration::ZERO).unwrap();
        /// assert!(limiter.wait_within(Duration::from_millis(1)).is_err());
        #[doc = $end]
        /// ```
        pub fn wait_within(&self, max: core::time::Duration) -> Result<(), $crate::NotUntil> {
            $crate::wait::block::block_on(self.until_ready_within(max))
        }
    };
}

pub(crate) use waiting_methods;
