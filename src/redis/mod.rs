//! One quota across a fleet: GCRA with its state in Redis (cargo feature `redis`); and
//! [`RedisBudget`], a [`Budget`](crate::budget::Budget) for every client of one Redis.
//!
//! ```no_run
//! # async fn run() -> Result<(), paceline::redis::RedisLimitError> {
//! use paceline::redis::{FailurePolicy, RedisLimiter};
//! use paceline::Quota;
//!
//! // Every worker of the fleet builds the same limiter: together they admit 100/s.
//! let limiter = RedisLimiter::connect("redis://127.0.0.1/", Quota::per_second(100))
//!     .await?
//!     .on_failure(FailurePolicy::FailClosed);
//! if limiter.check_key("partner-api").await.is_ok() {
//!     // call the API
//! }
//! # Ok(()) }
//! ```
//!
//! # Implementation notes
//!
//! * **The same decisions as paceline's GCRA**, made server-side by one Lua script per call
//!   (sent with `EVALSHA`; the `redis` crate loads it again if the script cache was
//!   flushed), in whole nanoseconds (a 1.999 µs interval is 1999 ns) at the Redis
//!   server's `TIME`: one clock for the whole fleet, so machines whose clocks drift cannot
//!   over-admit. No `redis.replicate_commands()` (Redis 5+ replicates scripts by their
//!   effects). The script's arithmetic is exact (`scripts` explains how, in Lua's
//!   doubles); burst windows longer than about 52 days are refused when the limiter is
//!   built ([`RedisLimitError::WindowTooLong`]).
//! * **One Redis key per limited key**, `prefix:{key}`: the key is its own hash tag, so a
//!   Redis Cluster ([`RedisLimiter::connect_cluster`], feature `redis-cluster`) spreads
//!   keys over its slots and runs each decision on the master owning its key. Each expires once it has refilled, so Redis
//!   memory follows the active keys.
//! * **A local fast path that cannot over-admit**: a key Redis just refused is refused
//!   locally until the instant Redis gave, for as many cells as were refused or more
//!   (fewer cells fit sooner, and are asked for), so a flood of refusals for one key costs
//!   no round trips. Admissions always ask Redis.
//! * **When Redis is unreachable or slow** (each call has a timeout; a server loading, a
//!   replica made read-only, a master down, or `BUSY` with another client's script past
//!   its time limit count too), the configured
//!   [`FailurePolicy`] decides: refuse, admit, or fall back to an in-process limiter with a
//!   share of the quota. The connection reconnects in the background. An error Redis
//!   *answered* is not an outage, and the policy does not apply: a value of another type
//!   or one the limiter did not write at its key (a number or text another application
//!   keeps there, never overwritten: [`RedisDenied::Rejected`]) or a full
//!   server ([`RedisDenied::OutOfMemory`]) refuses, whatever the policy.
//! * **Bookings can always be given back**: a waiter books with an id chosen before its
//!   call is sent, so a booking whose answer never arrived (a timeout, a caller that went
//!   away) is given back as surely as one that was answered and then cancelled. A key
//!   remembers its 32 latest bookings since its last plain admission: with more callers
//!   waiting on one key at once, the oldest ones' cancellations give nothing back (their
//!   turns stay spent, the strict side).
//! * **A Redis restart loses the state**: every key then starts with a full burst again
//!   (at most one extra burst per key across the restart).
//! * Resolution: Redis time is in microseconds, so a quota's interval must be at least
//!   1 µs (a million per second); finer quotas are refused with an error.

use core::fmt;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod booking;
mod budget;
mod conn;
mod error;
mod limiter;
mod policy;
use crate::redis_scripts as scripts;
mod waiting;
use booking::Booking;
use conn::Conn;
use scripts::{DECIDE, MAX_WINDOW, REFUND};

pub use budget::{RedisBudget, RedisBudgetBuilder, RedisBudgetError, RedisSettleError, RedisTurn};
use error::check_key;
pub use error::{RedisDenied, RedisLimitError, MAX_KEY_LEN};
use limiter::nanos;
pub use limiter::RedisLimiter;
use policy::Failure;
pub use policy::FailurePolicy;

use crate::metrics::LimitMetrics;
use crate::{KeyedLimiter, NotUntil, Quota};
