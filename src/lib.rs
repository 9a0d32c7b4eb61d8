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
//! * [`Limiter`]: one quota shared by threads (`check`, `check_n`, `wait`) and tasks
//!   (`until_ready`, `until_n_ready`, `until_ready_within`).
//! * [`KeyedLimiter`]: one quota per key (client IP, API key) with bounded memory.
//! * [`clock`]: the default TSC clock and [`ManualClock`](clock::ManualClock) for tests.
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

// The layers, bottom up: `gcra` (pure arithmetic) and `sync` (the std/loom switch),
// `cell` (the one atomic word), then `clock` and `wait`, then the two limiters.
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
mod quota;
mod quota_cell;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "std")]
mod reservation;
mod snapshot;
#[cfg(feature = "stream")]
#[cfg_attr(docsrs, doc(cfg(feature = "stream")))]
pub mod stream;
mod sync;
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

pub use error::{Denied, InsufficientCapacity, NotUntil};
#[cfg(feature = "std")]
pub use keyed::{KeyReservation, KeyedLimiter};
pub use limiter::Limiter;
pub use quota::{Quota, QuotaError};
#[cfg(feature = "std")]
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

    /// `crate::gcra::admit`, the pure decision.
    pub fn admit(tat: u64, now: u64, cost: u64, tolerance: u64) -> Result<u64, u64> {
        crate::gcra::admit(tat, now, cost, tolerance)
    }
}
