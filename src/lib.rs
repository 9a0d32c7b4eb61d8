//! Lock-free rate limiting: a GCRA limiter whose whole state is one atomic word.
//!
//! `pacer` decides in a few nanoseconds, without locks, whether an action may happen now
//! under a rate limit ("100 per second, bursts of 10"), and lets threads and async tasks
//! wait *just long enough*, in order, when it may not.
//!
//! ```
//! use pacer::{Limiter, Quota};
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

#![cfg_attr(docsrs, feature(doc_cfg))]

mod cell;
pub mod clock;
mod error;
mod gcra;
mod keyed;
mod limiter;
mod quota;
mod sync;
mod wait;
mod wake_list;

pub use error::{Denied, InsufficientCapacity, NotUntil};
pub use keyed::KeyedLimiter;
pub use limiter::Limiter;
pub use quota::{Quota, QuotaError};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
