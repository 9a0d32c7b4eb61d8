//! Rate limiting for HTTP servers: a tower middleware (cargo feature `tower`) for axum,
//! hyper services and tonic, answering `429 Too Many Requests` with `Retry-After` and
//! the IETF `RateLimit-Policy` / `RateLimit` fields.
//!
//! ```
//! use axum::{routing::get, Router};
//! use paceline::http::{KeySource, Limit, RateLimitLayer};
//! use paceline::Quota;
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(
//!         RateLimitLayer::new()
//!             // Every client address (IPv6 by /64): 10 per second, bursts of 20.
//!             .limit(Limit::new("per-ip", Quota::per_second(10).with_burst(20), KeySource::peer_ip()))
//!             // And the whole service: 1000 per second.
//!             .limit(Limit::new("global", Quota::per_second(1000), KeySource::global())),
//!     );
//! // Serve it with `into_make_service_with_connect_info::<SocketAddr>()` so the peer
//! // address is known (see `examples/http_server.rs`).
//! ```
//!
//! # Implementation notes
//!
//! * **Several limits at once.** A request passes only if every limit admits it. Limits
//!   are checked in order; when a later one refuses, the cells the earlier ones just
//!   admitted are given back by a compare-and-swap from exactly the state they left, so a
//!   refused request spends nothing (if another request was admitted on that key in the
//!   nanoseconds between, the cell stays spent: the limits only ever err on the strict
//!   side).
//! * **Refusals** carry `Retry-After` in whole seconds *rounded up*, never earlier than
//!   the moment the request would be admitted: the longest wait among the limits, read
//!   after the request's own cells were given back (tower-governor truncates, so a client told
//!   `0` for a 0.9 s wait retries early and is refused again), and `RateLimit-Policy`
//!   (`"name";q=burst;w=window`) and `RateLimit` (`"name";r=remaining;t=seconds until
//!   full`) for every limit, read from one snapshot each. gRPC requests
//!   (`content-type: application/grpc…`) get a trailers-only `RESOURCE_EXHAUSTED`
//!   (`grpc-status: 8`) instead, which tonic clients understand.
//! * **Keys** come from the peer address (forwarding headers only through configured
//!   trusted proxies, right-most untrusted hop first), grouped by /64 for IPv6, or from a
//!   header, one global key, or a closure ([`KeySource`]). A request without a key is
//!   handled as configured ([`MissingKey`]), never with a 500; keyless requests share a
//!   key no client can name. Text keys over 64 bytes are stored as a seeded 128-bit
//!   digest, so a stored key costs a bounded number of bytes whatever clients send.
//! * **Waiting instead of refusing** ([`RateLimitLayer::wait_up_to`]): a request books its
//!   turn (paceline's FIFO) on every limit first, then waits for all of them at once, up to
//!   a maximum; a limit that cannot admit it in time (one that waited for room in a full
//!   key table included) refuses it and gives back what the other limits booked. A client that goes away drops the request's future, which gives back every
//!   booking whose instant has not come.
//! * **Memory** needs no clean-up task: each limit is a [`KeyedLimiter`] that forgets
//!   idle clients on its own, with a bound on stored keys (1 000 000 by default). A new
//!   client the bound leaves no room for gets `503` with `Retry-After`, never a `429` that
//!   would say it spent its quota ([`TableFull`]; or is let through, [`TableFull::Admit`]).
//! * `OPTIONS` requests (CORS preflights) are not limited by default ([`RateLimitLayer::exempt`]).
//!
//! The client side, pacing outgoing requests and following what each upstream answers,
//! is [`client::PaceLayer`].

mod admission;
mod body;
pub mod client;
mod decision;
mod fields;
mod forwarded;
mod key;
mod layer;
mod limit;
mod network;
mod prebuilt;
mod response;
mod service;
mod store;

pub use body::RefusalBody;
pub use decision::{Admitted, Decision, Refused, WaitWithin, Waiting};
use key::Missing;
pub use key::{ClientKey, Head, KeySource, PeerName};
pub use layer::{RateLimitLayer, RefusalInfo};
pub use limit::{InvalidLimitName, Limit, MissingKey, TableFull};
pub use network::{Network, NetworkError};
pub use service::{RateLimit, ResponseFuture};

use admission::*;
use fields::*;
use layer::*;
use limit::Cost;
use prebuilt::*;
use response::*;
use store::{Store, Turn};

use core::fmt;
use core::future::Future;
use core::pin::Pin;

use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};

use crate::clock::{Clock, DefaultClock};
use crate::metrics::LimitMetrics;
use crate::snapshot::OneRefused;
use crate::KeyedLimiter;
use crate::{Denied, InsufficientCapacity, NotUntil, Quota, Snapshot};
use crate::{KeyAdmission, KeyReservation};
