//! Calls to an API that limits you: follow what it says, for every task at once.
//!
//! An upstream that answers "slow down" (a `429` or `503` with `Retry-After`, the IETF
//! `RateLimit-Policy` / `RateLimit` fields, the common `X-RateLimit-*` ones, or a bare
//! `429`) should slow *every* caller of the client, not each one on its own schedule. A
//! [`Follower`] owns the limiter every request to one upstream waits on and steers it by
//! each response ([`Signal::read`]):
//!
//! * **holds** ([`Limiter::hold_for`](crate::Limiter::hold_for)): nothing before the
//!   instant the upstream named, booked turns included, then the pace resumes, spaced;
//! * an **announced pace**: the tightest policy whose window is at most a minute
//!   ([`PACE_WINDOW`]; longer windows are budgets, held when spent), followed at 95 %
//!   ([`PACE_SHARE`]) of its rate, one request at a time, down and back up, never above
//!   your own quota unless you allow it;
//! * a **learned rate**, where the upstream only refuses: halved (less the 5 % jitter
//!   share) at the first refusal when nothing else is known, cut by a tenth at each later
//!   one, grown back by 0.5 % of the rate after the cut per second (over 100 requests
//!   when the upstream's rate is known) (AIMD; constants and why in `learn.rs`);
//! * a **fixed window** recognised from the remaining counts: a client that spent one
//!   waits for its end, not for a whole rounded-up second.
//!
//! Nothing an upstream says makes a caller wait longer than
//! [`FollowerConfig::max_hold`] (5 minutes by default): not a `Retry-After`, not a reset,
//! not the spacing of a pace. A quota you set on the follower's limiter yourself stays
//! yours. [`Followers`] keeps one follower per host in a bounded table.
//!
//! ```
//! use paceline::upstream::{Follower, FollowerConfig, Signal};
//! use paceline::{clock::ManualClock, Quota};
//! use std::time::{Duration, SystemTime};
//!
//! let clock = ManualClock::new();
//! let api = Follower::with_clock(Quota::per_second(100).with_burst(1), FollowerConfig::default(), clock.clone());
//! // A response: too many requests, come back in 2 s, and the quota is 50 per second.
//! let sent = api.sent();
//! let headers = [("retry-after", &b"2"[..]), ("ratelimit-policy", &b"\"api\";q=50;w=1"[..])];
//! api.apply(&Signal::read(429, headers, SystemTime::now()), sent);
//! assert!(api.limiter().check().is_err());
//! clock.advance(Duration::from_secs(2));
//! assert!(api.limiter().check().is_ok());
//! // 95 % of 50 per second: one request every 21 ms.
//! assert_eq!(api.limiter().quota().emission_interval().as_micros(), 21_052);
//! ```
//!
//! A [`Budget`](crate::budget::Budget) of several rates follows the per-dimension
//! fields instead ([`DimensionSignal`], [`Budget::follow`](crate::budget::Budget::follow)).
//!
//! The HTTP client layers (`http::client`, features `tower` and `reqwest`) and the Python
//! package's `paceline.httpx` transports and `paceline.aiohttp` hook do this for every
//! response.

mod config;
mod date;
mod dims;
mod follower;
mod go;
mod learn;
mod sent;
mod sf;
mod signal;
mod table;
mod window;

pub use config::FollowerConfig;
pub use dims::{DimensionLeft, DimensionSignal, MAX_DIMENSIONS};
pub use follower::{Follower, PACE_SHARE};
pub use sent::Sent;
pub use signal::{Left, Policy, Reset, Signal, PACE_WINDOW};
pub use table::{Followers, MAX_HOSTS};
