//! Lock-free rate limiting: a GCRA limiter whose whole state is one atomic word.
//!
//! `paceline` decides in a few nanoseconds, without locks, whether an action may happen now
//! under a rate limit ("100 per second, bursts of 10"), and lets threads and async tasks
//! wait *just long enough*, in order, when it may not.
//!
//! ```
//! use paceline::{Limiter, Quota};
//!
//! // A third-party API allows 100 calls per second, at most 10 at once.
//! let limiter = Limiter::new(Quota::per_second(100).with_burst(10));
//!
//! // Hot path: admit or refuse, never block.
//! match limiter.check() {
//!     Ok(()) => { /* call the API */ }
//!     Err(not_until) => println!("retry in {:?}", not_until.wait_time()),
//! }
//!
//! // Or wait your booked turn (any executor; here a thread).
//! limiter.wait();
//! ```
//!
//! Quotas are a rate and a burst: `Quota::per_second(100)` admits 100 at once, then one
//! every 10 ms; `Quota::per_second(100).with_burst(1)` never admits more than 100 in any
//! one-second window.
//!
//! # One example per job
//!
//! * **Threads** share a [`Limiter`] by reference or `Arc`: `check()` to admit or refuse,
//!   `wait()` for a booked turn.
//! * **Async tasks** (any executor) `until_ready().await` their booked turn; owned forms
//!   (`until_ready_owned`, [`OwnedReservation`]) live in spawned tasks and structs.
//! * **A server per client** uses a [`KeyedLimiter`] (bounded memory), or the tower layer
//!   `http::RateLimitLayer` (feature `tower`):
//!
//!   ```
//!   use paceline::{KeyedLimiter, Quota};
//!   let per_ip = KeyedLimiter::new(Quota::per_second(20)).with_max_keys(1_000_000);
//!   assert!(per_ip.check_key(&"203.0.113.7").is_ok());
//!   ```
//! * **Several processes on one host** share one quota through a file they all map:
//!   `shared::SharedLimiter` (feature `shared`).
//! * **A fleet** shares one quota through Redis: `redis::RedisLimiter` (feature `redis`),
//!   and one budget: `redis::RedisBudget`.
//! * **A runtime or framework** implements [`clock::Clock`] over its own timer, or drives
//!   waiters with [`Limiter::next_waiter_due_in`] and [`Limiter::wake_due_waiters`]; tests
//!   use [`ManualClock`](clock::ManualClock).
//!
//! # Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `std` (default) | the default clock, waiting (async and blocking), reservations, [`KeyedLimiter`] |
//! | `tokio` | `clock::TokioClock`: waiters woken by a tokio runtime's timer |
//! | `stream` | `stream::throttle`: a `Stream`'s items no faster than a limiter allows |
//! | `tower` | `http::RateLimitLayer`: 429, `Retry-After`, the IETF `RateLimit` fields |
//! | `axum`, `tonic` | the layer's peer address from axum's or tonic's connection info |
//! | `reqwest` | `http::client::PaceMiddleware`: client pacing for reqwest |
//! | `redis`, `redis-cluster` | `redis::RedisLimiter`, `redis::RedisBudget`: one quota or budget across a fleet |
//! | `redis-scripts` | `redis_scripts`, `budget::fleet`: the fleet's scripts and decisions for another Redis client |
//! | `shared` | `shared::SharedLimiter`, `SharedKeyedLimiter`: one quota across the processes of one host |
//!
//! Without `std`, paceline is `no_std` and allocates nothing: [`Quota`],
//! [`Limiter::check`], `check_n`, `remaining`, `snapshot`, `peek_n` and `set_quota` on a
//! clock of your own.
//!
//! # How it decides
//!
//! With emission interval `T` (period / count) and burst `b`, a request for `n` cells at
//! time `t` is admitted iff `max(TAT, t) + n*T - t <= b*T`, and then the theoretical arrival
//! time becomes `TAT = max(TAT, t) + n*T`. No background task refills anything: time does.
//! A denied request changes nothing.
//!
//! # Waiting
//!
//! A waiting future books its cells in the same word on its first poll, so its instant is
//! fixed and plain `check()` callers cannot overtake it; waiters finish in booking order;
//! dropping one before its instant gives its cells back. Waiters park on an intrusive list
//! (no allocation per waiter) and one timer entry per limiter serves them all.

#![cfg_attr(not(feature = "std"), no_std)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// `Debug` as `Display` for the crate's errors: what a `main` returning one prints (and an
/// `unwrap` panics with) reads as the message, not as a struct dump.
macro_rules! debug_as_display {
    ($($t:ty),+ $(,)?) => {$(
        impl core::fmt::Debug for $t {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                core::fmt::Display::fmt(self, f)
            }
        }
    )+};
}

/// `From` each wrapped error for an error enum: `Enum { Variant(Source), ... }` makes a
/// `Source` into `Enum::Variant`.
macro_rules! from_variants {
    ($enum:ty { $($variant:ident($source:ty)),+ $(,)? }) => {$(
        impl From<$source> for $enum {
            fn from(e: $source) -> Self {
                Self::$variant(e)
            }
        }
    )+};
}

// Three layers, bottom up: `gcra` (the pure arithmetic), `cell` (the one atomic word; with
// `quota_cell`, the quota read beside it), and the adapters (`wait` and `clock`, the
// limiters in `limiter` and `keyed`, `reservation`, `stream`, and the integrations in
// `http/` and `redis/`, which use only the public API). `sync` is the std/loom switch
// under all of them. Each layer imports only from the ones below it.
#[cfg(all(feature = "std", not(loom)))]
pub mod budget;
mod cell;
pub mod clock;
mod error;
mod gcra;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod http;
#[cfg(feature = "std")]
mod keyed;
mod limiter;
#[cfg(all(feature = "std", feature = "metrics"))]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(all(feature = "std", not(feature = "metrics")))]
mod metrics;
mod quota;
mod quota_cell;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
// The fleet limiter's Lua, apart from it: other clients of the same keys (the Python
// package) run the very same text without the Redis client crate.
#[cfg(feature = "redis-scripts")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-scripts")))]
#[path = "redis/scripts.rs"]
pub mod redis_scripts;
#[cfg(feature = "std")]
mod reservation;
#[cfg(all(feature = "shared", unix, not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "shared")))]
pub mod shared;
// Under loom, the key slots' claim protocol alone, for the models.
#[cfg(all(feature = "shared", loom))]
#[path = "shared/table.rs"]
mod shared_table;
mod snapshot;
#[cfg(feature = "stream")]
#[cfg_attr(docsrs, doc(cfg(feature = "stream")))]
pub mod stream;
mod sync;
#[cfg(all(feature = "std", not(loom)))]
pub mod upstream;
#[cfg(feature = "std")]
mod wait;

// Test support, apart from the library: the fuzz bodies (public for `fuzz/`, hidden) and
// the reference model they and `tests/model.rs` check against.
#[cfg(all(feature = "std", any(fuzzing, test)))]
#[doc(hidden)]
#[allow(missing_docs, unreachable_pub)]
#[path = "testing/fuzzing.rs"]
pub mod fuzzing;
#[cfg(all(feature = "std", any(fuzzing, test)))]
#[path = "testing/reference_model.rs"]
#[allow(dead_code)] // the fuzz bodies use part of it; `tests/model.rs` uses the rest
mod reference_model;
// So that the reference model names the API as `paceline::…` both here and where
// `tests/model.rs` includes it: it uses nothing of the crate but its public API.
#[cfg(all(feature = "std", any(fuzzing, test)))]
extern crate self as paceline;

#[cfg(all(feature = "std", not(loom)))]
pub use budget::Budget;
pub use error::{Denied, InsufficientCapacity, NotUntil};
#[cfg(feature = "std")]
pub use keyed::{KeyAdmission, KeyReservation, KeyedLimiter, OwnedKeyReservation, TextKey};
pub use limiter::Limiter;
pub use quota::{Quota, QuotaError};
#[cfg(feature = "std")]
pub use reservation::{OwnedReservation, Reservation};
pub use snapshot::Snapshot;

/// Internals for the loom models in `loom-tests/`: the cell layer, the keyed shards' lock
/// and the pure arithmetic, reached without copying their code. Not part of the API.
#[cfg(loom)]
#[doc(hidden)]
pub mod __loom {
    /// The atomic cell, exactly as the limiters use it.
    #[derive(Debug, Default)]
    pub struct TatWord(crate::cell::TatWord);

    impl TatWord {
        /// A fresh cell (TAT 0).
        pub fn new() -> TatWord {
            TatWord(crate::cell::TatWord::new())
        }

        /// `crate::cell::TatWord::acquire`.
        pub fn acquire(&self, now: u64, cost: u64, tolerance: u64) -> Result<u64, u64> {
            self.0.acquire(now, cost, tolerance)
        }

        /// The current TAT.
        pub fn tat(&self) -> u64 {
            self.0.tat()
        }
    }

    /// The keyed shards' reader-writer lock, exactly as the store uses it.
    #[derive(Debug)]
    pub struct ReadMostly<T>(crate::sync::ReadMostly<T>);

    impl<T> ReadMostly<T> {
        /// A lock with `slots` reader slots.
        pub fn new(value: T, slots: usize) -> ReadMostly<T> {
            ReadMostly(crate::sync::ReadMostly::new(value, slots))
        }

        /// Runs `f` under a read lock.
        pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
            f(&self.0.read())
        }

        /// Runs `f` under the write lock.
        pub fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
            self.0.write(f)
        }
    }

    /// A shared file's key slot (`crate::shared::table`), its four words owned here.
    #[cfg(feature = "shared")]
    #[derive(Debug)]
    pub struct KeySlot {
        tag: crate::sync::AtomicU64,
        low: crate::sync::AtomicU64,
        words: [crate::sync::AtomicU64; 2],
    }

    #[cfg(feature = "shared")]
    impl KeySlot {
        /// A slot holding the key `(tag, low)` (tag 0: empty) with these words.
        pub fn new(tag: u64, low: u64, words: [u64; 2]) -> KeySlot {
            use crate::sync::AtomicU64;
            KeySlot {
                tag: AtomicU64::new(tag),
                low: AtomicU64::new(low),
                words: words.map(AtomicU64::new),
            }
        }

        fn slot(&self) -> crate::shared_table::Slot<'_> {
            crate::shared_table::Slot {
                tag: &self.tag,
                low: &self.low,
                words: [&self.words[0], &self.words[1]],
            }
        }

        /// `Slot::spend` for the key `(tag, low)`: `None` when the slot is not its.
        pub fn spend(
            &self,
            key: (u64, u64),
            lane: usize,
            now: u64,
            cost: u64,
            room: u64,
        ) -> Option<Result<u64, u64>> {
            let key = crate::shared_table::Key::from_digest(key.0, key.1);
            self.slot().spend(key, lane, now, cost, room).ok()
        }

        /// `Slot::claim_until` (the caller stands for the claim lock: one claimer at a
        /// time); `stop` kills the claimer after that step.
        pub fn claim(&self, key: (u64, u64), now: u64, stop: u8) -> bool {
            let key = crate::shared_table::Key::from_digest(key.0, key.1);
            self.slot()
                .claim_until(key, now, &crate::shared_table::Claiming(()), stop)
        }

        /// `Slot::sweep` (the caller stands for the bucket's lock): empties the slot if
        /// its key has refilled.
        pub fn sweep(&self, now: u64) -> bool {
            self.slot().sweep(now, &crate::shared_table::Claiming(()))
        }

        /// Whether the slot holds the key `(tag, low)`.
        pub fn holds(&self, key: (u64, u64)) -> bool {
            self.slot()
                .holds(crate::shared_table::Key::from_digest(key.0, key.1))
        }

        /// The tag, with its claiming flag if set.
        pub fn tag(&self) -> u64 {
            self.tag.load(crate::sync::Ordering::SeqCst)
        }

        /// Word `lane`.
        pub fn word(&self, lane: usize) -> u64 {
            self.words[lane].load(crate::sync::Ordering::SeqCst)
        }
    }

    /// `crate::gcra::admit`, the pure decision.
    pub fn admit(tat: u64, now: u64, cost: u64, tolerance: u64) -> Result<u64, u64> {
        crate::gcra::admit(tat, now, cost, tolerance)
    }
}
