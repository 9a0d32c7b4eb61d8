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
//!   idle clients on its own, with a bound on stored keys (1 000 000 by default).
//! * `OPTIONS` requests (CORS preflights) are not limited by default ([`RateLimitLayer::exempt`]).

mod body;
mod key;

pub use body::RefusalBody;
use key::Missing;
pub use key::{ClientKey, Head, KeySource, Network, NetworkError};

use core::fmt;
use core::future::Future;
use core::pin::Pin;

use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};

use crate::clock::{Clock, DefaultClock};
use crate::keyed::{Booked, KeyedLimiter, Undo};
use crate::{Denied, NotUntil, Quota, Snapshot};

/// One limit of a [`RateLimitLayer`]: a name (shown in the `RateLimit` fields), a quota
/// per key, and where the key comes from.
///
/// # Examples
///
/// ```
/// use paceline::{http::{KeySource, Limit}, Quota};
/// let per_key = Limit::new("per-key", Quota::per_minute(600), KeySource::header(http::HeaderName::from_static("x-api-key")))
///     .with_max_keys(100_000);
/// assert_eq!(per_key.limiter().len(), 0);
/// ```
#[derive(Clone)]
pub struct Limit<C: Clock = DefaultClock> {
    name: Arc<str>,
    /// `name` as a structured-field string, quotes and escapes included.
    field_name: Arc<str>,
    limiter: Arc<KeyedLimiter<ClientKey, C>>,
    source: KeySource,
}

impl<C: Clock> fmt::Debug for Limit<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Stored keys per limit unless [`Limit::with_max_keys`] says otherwise.
const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A limit name that cannot be sent in the `RateLimit` fields: names are printable ASCII
/// (`"` and `\` are fine, and escaped), 1 to 64 characters.
///
/// # Examples
///
/// ```
/// use paceline::{http::{KeySource, Limit}, Quota};
/// let err = Limit::try_new("per-ip\n", Quota::per_second(1), KeySource::peer_ip()).unwrap_err();
/// assert!(err.to_string().contains("printable ASCII"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidLimitName {
    name: String,
}

impl fmt::Display for InvalidLimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "limit name {:?} cannot be sent in the RateLimit fields: use 1 to 64 printable \
             ASCII characters",
            self.name
        )
    }
}

impl core::error::Error for InvalidLimitName {}

/// `name` as a structured-field string (RFC 8941 `sf-string`), or why it cannot be one.
fn field_name(name: &str) -> Result<Arc<str>, InvalidLimitName> {
    let printable = name.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if name.is_empty() || name.len() > 64 || !printable {
        return Err(InvalidLimitName { name: name.into() });
    }
    let mut quoted = String::with_capacity(name.len() + 2);
    quoted.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    Ok(quoted.into())
}

impl Limit {
    /// A limit of `quota` per key from `source`, on the default clock.
    ///
    /// # Panics
    ///
    /// If `name` cannot be sent in the `RateLimit` fields (see [`InvalidLimitName`]);
    /// [`Limit::try_new`] returns the error instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit}, Quota};
    /// let per_ip = Limit::new("per-ip", Quota::per_minute(600), KeySource::peer_ip());
    /// # let _ = per_ip;
    /// ```
    pub fn new(name: &str, quota: Quota, source: KeySource) -> Limit {
        Limit::with_clock(name, quota, source, DefaultClock::default())
    }

    /// [`Limit::new`], with an error for a name that cannot be sent in the `RateLimit`
    /// fields.
    ///
    /// # Errors
    ///
    /// [`InvalidLimitName`] unless the name is 1 to 64 printable ASCII characters.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit}, Quota};
    /// assert!(Limit::try_new("per \"tenant\"", Quota::per_second(5), KeySource::global()).is_ok());
    /// assert!(Limit::try_new("per-ip\n", Quota::per_second(5), KeySource::peer_ip()).is_err());
    /// ```
    pub fn try_new(name: &str, quota: Quota, source: KeySource) -> Result<Limit, InvalidLimitName> {
        Limit::try_with_clock(name, quota, source, DefaultClock::default())
    }
}

impl<C: Clock> Limit<C> {
    /// A limit on the given clock (a `ManualClock` in tests).
    ///
    /// # Panics
    ///
    /// As [`Limit::new`], for a name that cannot be sent in the `RateLimit` fields.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, http::{KeySource, Limit}, Quota};
    /// let limit = Limit::with_clock("api", Quota::per_second(5), KeySource::global(), ManualClock::new());
    /// # let _ = limit;
    /// ```
    pub fn with_clock(name: &str, quota: Quota, source: KeySource, clock: C) -> Limit<C> {
        match Limit::try_with_clock(name, quota, source, clock) {
            Ok(limit) => limit,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`Limit::with_clock`], with an error for a name that cannot be sent.
    ///
    /// # Errors
    ///
    /// [`InvalidLimitName`], as [`Limit::try_new`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{clock::ManualClock, http::{KeySource, Limit}, Quota};
    /// let bad = Limit::try_with_clock("café", Quota::per_second(5), KeySource::global(), ManualClock::new());
    /// assert!(bad.is_err());
    /// ```
    pub fn try_with_clock(
        name: &str,
        quota: Quota,
        source: KeySource,
        clock: C,
    ) -> Result<Limit<C>, InvalidLimitName> {
        Ok(Limit {
            field_name: field_name(name)?,
            name: name.into(),
            limiter: Arc::new(
                KeyedLimiter::with_clock(quota, clock).with_max_keys(DEFAULT_MAX_KEYS),
            ),
            source,
        })
    }

    /// Bounds the keys this limit stores (default 1 000 000): at the bound, a new client
    /// is refused (with the time until a slot frees) rather than evicting a limited one;
    /// keys that refilled are forgotten first. A stored key costs at most about 100 bytes
    /// (long text keys are stored as a digest), so this bounds the limit's memory. Call it
    /// before cloning the limit: a clone shares the limiter, and then this changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit}, Quota};
    /// let small = Limit::new("per-ip", Quota::per_second(1), KeySource::peer_ip()).with_max_keys(10_000);
    /// # let _ = small;
    /// ```
    pub fn with_max_keys(mut self, max: usize) -> Limit<C> {
        if let Some(limiter) = Arc::get_mut(&mut self.limiter) {
            limiter.set_max_keys(max);
        }
        self
    }

    /// The keyed limiter behind this limit: to check, retune (`set_quota`) or inspect it
    /// outside the middleware.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{ClientKey, KeySource, Limit}, Quota};
    /// let limit = Limit::new("api", Quota::per_second(5), KeySource::global());
    /// assert_eq!(limit.limiter().remaining_key(&ClientKey::Global), 5);
    /// ```
    pub fn limiter(&self) -> &KeyedLimiter<ClientKey, C> {
        &self.limiter
    }
}

/// What to do with a request that has no key for a limit (no such header, a forwarding
/// chain that cannot be read, no peer address).
///
/// Unless you choose, a request the *client* left keyless is [`MissingKey::Shared`], and
/// a limit keyed by the peer address on a server that passes none (axum served without
/// `into_make_service_with_connect_info`, say) answers `500 Internal Server Error` with a
/// body that names the fix, and logs one line to standard error: otherwise every client
/// would silently share one bucket.
///
/// # Examples
///
/// ```
/// use paceline::http::{MissingKey, RateLimitLayer};
/// let strict = RateLimitLayer::new().on_missing_key(MissingKey::Refuse(http::StatusCode::BAD_REQUEST));
/// let shared = RateLimitLayer::new().on_missing_key(MissingKey::Shared);
/// # let _ = (strict, shared);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Count it under one key shared by every keyless request (the default for requests
    /// the client left keyless; choosing it also covers a server that passes no peer
    /// address): it is limited, and it cannot exhaust anyone else's budget.
    #[default]
    Shared,
    /// Do not apply this limit to it.
    Skip,
    /// Refuse it with this status (for example `400 Bad Request`).
    Refuse(StatusCode),
}

type Exempt = Arc<dyn Fn(&Head<'_>) -> bool + Send + Sync>;

/// A tower [`Layer`](tower_layer::Layer) that rate-limits requests: every [`Limit`] must
/// admit a request, or it is refused with `429` and `Retry-After` (see the [module
/// docs](self) for everything it does).
///
/// # Examples
///
/// ```
/// use axum::{routing::get, Router};
/// use paceline::http::{KeySource, Limit, RateLimitLayer};
/// use paceline::Quota;
///
/// let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(
///     RateLimitLayer::new()
///         .limit(Limit::new("per-ip", Quota::per_second(10), KeySource::peer_ip()))
///         .headers_on_success(true),
/// );
/// // Serve with `app.into_make_service_with_connect_info::<std::net::SocketAddr>()`.
/// ```
#[derive(Clone)]
pub struct RateLimitLayer<C: Clock = DefaultClock> {
    config: Arc<Config<C>>,
}

#[derive(Clone)]
struct Config<C: Clock> {
    limits: Vec<Limit<C>>,
    /// `None`: the default, `OPTIONS` exempt (checked inline, no call through a pointer).
    exempt: Option<Exempt>,
    /// `None`: the default (module docs of [`MissingKey`]).
    missing: Option<MissingKey>,
    headers_on_success: bool,
    legacy_headers: bool,
    wait_up_to: Option<Duration>,
    /// The refusal body's content type and text (`None`: the default plain text).
    body: Option<(HeaderValue, BodyFn)>,
}

type BodyFn = Arc<dyn Fn(&RefusalInfo<'_>) -> String + Send + Sync>;

/// What a refusal tells its client, for a body of your own
/// ([`RateLimitLayer::refusal_body`]).
///
/// # Examples
///
/// ```
/// use http::HeaderValue;
/// let layer = paceline::http::RateLimitLayer::new().refusal_body(
///     HeaderValue::from_static("text/plain"),
///     |refusal| format!("slow down: {} in {} s", refusal.limit(), refusal.retry_after_secs()),
/// );
/// # let _ = layer;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RefusalInfo<'a> {
    limit: &'a str,
    wait: Duration,
}

impl RefusalInfo<'_> {
    /// The name of the limit that refused.
    pub fn limit(&self) -> &str {
        self.limit
    }

    /// How long until the request would be admitted.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The `Retry-After` value sent: whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.wait).max(1)
    }
}

impl<C: Clock> fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limits", &self.config.limits)
            .field("missing", &self.config.missing)
            .field("headers_on_success", &self.config.headers_on_success)
            .field("wait_up_to", &self.config.wait_up_to)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Default for RateLimitLayer<C> {
    fn default() -> Self {
        RateLimitLayer {
            config: Arc::new(Config {
                limits: Vec::new(),
                exempt: None,
                missing: None,
                headers_on_success: false,
                legacy_headers: false,
                wait_up_to: None,
                body: None,
            }),
        }
    }
}

impl RateLimitLayer {
    /// A layer with no limit yet (add them with [`RateLimitLayer::limit`]); `OPTIONS`
    /// requests exempt.
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::RateLimitLayer::new();
    /// # let _ = layer;
    /// ```
    pub fn new() -> RateLimitLayer {
        RateLimitLayer::default()
    }
}

impl<C: Clock> RateLimitLayer<C> {
    fn config(&mut self) -> &mut Config<C> {
        Arc::make_mut(&mut self.config)
    }

    /// Adds a limit; a request passes only if every limit admits it.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit, RateLimitLayer}, Quota};
    /// let layer = RateLimitLayer::new()
    ///     .limit(Limit::new("per-ip", Quota::per_second(10), KeySource::peer_ip()));
    /// # let _ = layer;
    /// ```
    pub fn limit(mut self, limit: Limit<C>) -> RateLimitLayer<C> {
        self.config().limits.push(limit);
        self
    }

    /// Which requests are not limited at all (default: `OPTIONS`, so CORS preflights
    /// never eat a client's budget). Replaces the default.
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::RateLimitLayer::new()
    ///     .exempt(|head| head.method() == http::Method::OPTIONS || head.uri().path() == "/health");
    /// # let _ = layer;
    /// ```
    pub fn exempt(
        mut self,
        exempt: impl Fn(&Head<'_>) -> bool + Send + Sync + 'static,
    ) -> RateLimitLayer<C> {
        self.config().exempt = Some(Arc::new(exempt));
        self
    }

    /// What to do with a request that has no key for a limit (default: see
    /// [`MissingKey`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::{MissingKey, RateLimitLayer};
    /// let strict = RateLimitLayer::new().on_missing_key(MissingKey::Refuse(http::StatusCode::BAD_REQUEST));
    /// # let _ = strict;
    /// ```
    pub fn on_missing_key(mut self, missing: MissingKey) -> RateLimitLayer<C> {
        self.config().missing = Some(missing);
        self
    }

    /// Also puts the `RateLimit-Policy` and `RateLimit` fields on responses that passed.
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::RateLimitLayer::new().headers_on_success(true);
    /// # let _ = layer;
    /// ```
    pub fn headers_on_success(mut self, on: bool) -> RateLimitLayer<C> {
        self.config().headers_on_success = on;
        self
    }

    /// Also writes the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds) fields, for clients that read only those, from the
    /// tightest limit (the fewest cells left); wherever the `RateLimit` fields go (refusals,
    /// and responses that passed with [`RateLimitLayer::headers_on_success`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::RateLimitLayer::new().legacy_headers(true);
    /// # let _ = layer;
    /// ```
    pub fn legacy_headers(mut self, on: bool) -> RateLimitLayer<C> {
        self.config().legacy_headers = on;
        self
    }

    /// Instead of refusing at once, a request waits its booked turn for up to `max`, then
    /// proceeds, or is refused if its turn would come later. Every limit books its cell
    /// before any waiting: a limit that cannot admit within `max` gives back what the
    /// earlier limits booked, and a request whose client goes away while it waits gives
    /// back every booking whose instant has not come.
    ///
    /// # Examples
    ///
    /// ```
    /// let patient = paceline::http::RateLimitLayer::new().wait_up_to(std::time::Duration::from_millis(250));
    /// # let _ = patient;
    /// ```
    pub fn wait_up_to(mut self, max: Duration) -> RateLimitLayer<C> {
        self.config().wait_up_to = Some(max);
        self
    }

    /// The body of `429` refusals, and its content type (default: `text/plain`, naming
    /// the limit and the seconds to wait). gRPC refusals carry no body.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::HeaderValue;
    /// let json = paceline::http::RateLimitLayer::new().refusal_body(
    ///     HeaderValue::from_static("application/json"),
    ///     |refusal| format!(r#"{{"error":"rate_limited","limit":"{}","retry_after":{}}}"#,
    ///         refusal.limit(), refusal.retry_after_secs()),
    /// );
    /// # let _ = json;
    /// ```
    pub fn refusal_body(
        mut self,
        content_type: HeaderValue,
        body: impl Fn(&RefusalInfo<'_>) -> String + Send + Sync + 'static,
    ) -> RateLimitLayer<C> {
        self.config().body = Some((content_type, Arc::new(body)));
        self
    }
}

impl<S, C: Clock> tower_layer::Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> RateLimit<S, C> {
        RateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around yours (made by the layer; with tower's
/// `ServiceBuilder` or axum's `Router::layer`).
///
/// # Examples
///
/// ```
/// use paceline::http::{KeySource, Limit, RateLimitLayer};
/// use tower_layer::Layer;
///
/// let layer = RateLimitLayer::new()
///     .limit(Limit::new("global", paceline::Quota::per_second(100), KeySource::global()));
/// let routes = axum::Router::<()>::new().route("/", axum::routing::get(|| async { "ok" }));
/// let service = layer.layer(routes); // a `tower_service::Service` of axum requests
/// # let _ = service;
/// ```
#[derive(Clone)]
pub struct RateLimit<S, C: Clock = DefaultClock> {
    inner: S,
    config: Arc<Config<C>>,
}

impl<S, C: Clock> fmt::Debug for RateLimit<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// The future of [`RateLimit`]'s `call`: the inner service's own future when the
    /// decision was made at once (no allocation), a ready refusal, or (wait mode) a boxed
    /// wait followed by the call.
    pub struct ResponseFuture<F, R, E> {
        #[pin]
        state: State<F, R, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = Projected]
    enum State<F, R, E> {
        // Admitted: the inner call, and the fields to add to its response.
        Admitted {
            #[pin]
            inner: F,
            // Boxed: a `HeaderMap` inline would make every admitted request's future
            // ~100 bytes larger, moved with it, to carry `None` in the usual case.
            fields: Option<Box<http::HeaderMap>>,
        },
        // Refused (or refused for a missing key): the response until it is returned.
        Refused { response: Option<Response<R>> },
        // Waiting its booked turn, then the inner call.
        Waiting {
            future: Pin<Box<dyn Future<Output = Result<Response<R>, E>> + Send>>,
        },
    }
}

impl<F, R, E> ResponseFuture<F, R, E> {
    fn admitted(inner: F, fields: Option<Box<http::HeaderMap>>) -> Self {
        ResponseFuture {
            state: State::Admitted { inner, fields },
        }
    }

    fn refused(response: Response<R>) -> Self {
        ResponseFuture {
            state: State::Refused {
                response: Some(response),
            },
        }
    }
}

impl<F, R, E> fmt::Debug for ResponseFuture<F, R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.state {
            State::Admitted { .. } => "ResponseFuture::Admitted",
            State::Refused { .. } => "ResponseFuture::Refused",
            State::Waiting { .. } => "ResponseFuture::Waiting",
        })
    }
}

impl<F, R, E> Future for ResponseFuture<F, R, E>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            Projected::Admitted { inner, fields } => {
                if fields.is_none() {
                    // The usual case: the inner response as it is, not moved through here.
                    return inner.poll(cx);
                }
                let mut response = match inner.poll(cx) {
                    Poll::Ready(Ok(response)) => response,
                    other => return other,
                };
                if let Some(fields) = fields.take() {
                    response.headers_mut().extend(*fields);
                }
                Poll::Ready(Ok(response))
            }
            Projected::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending, // polled after completion
            },
            Projected::Waiting { future } => future.as_mut().poll(cx),
        }
    }
}

impl<S, B, R, C> tower_service::Service<Request<B>> for RateLimit<S, C>
where
    S: tower_service::Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    R: RefusalBody + Send + 'static,
    C: Clock,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, R, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let config = &*self.config;
        let exempt = match &config.exempt {
            None => request.method() == http::Method::OPTIONS,
            Some(exempt) => exempt(&Head::of(&request)),
        };
        if exempt {
            return ResponseFuture::admitted(self.inner.call(request), None);
        }
        if config.wait_up_to.is_some() {
            return self.call_waiting(request);
        }
        let head = Head::of(&request);
        match admit_now(config, &head) {
            Ok(()) => {
                let fields = config.headers_on_success.then(|| {
                    let mut fields = Box::new(http::HeaderMap::new());
                    if let Ok(keys) = keys(config, &head) {
                        put_fields(config, config.limits.iter().zip(&keys), &mut fields);
                    }
                    fields
                });
                ResponseFuture::admitted(self.inner.call(request), fields)
            }
            Err(why) => refuse(config, &head, why),
        }
    }
}

impl<S, C: Clock> RateLimit<S, C> {
    /// Wait mode's `call` (kept out of line: the usual path's frame stays small).
    #[inline(never)]
    fn call_waiting<B, R>(&mut self, request: Request<B>) -> ResponseFuture<S::Future, R, S::Error>
    where
        S: tower_service::Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
        S::Future: Send,
        B: Send + 'static,
        R: RefusalBody + Send + 'static,
    {
        // The ready service goes into the wait; a clone takes its place (tower's swap).
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        ResponseFuture {
            state: State::Waiting {
                future: Box::pin(async move {
                    let keys = match keys(&config, &Head::of(&request)) {
                        Ok(keys) => keys,
                        Err(why) => return Ok(plain_refusal(why)),
                    };
                    if let Err(refused) = admit_waiting(&config, &keys).await {
                        return Ok(refusal(&config, &keys, &Head::of(&request), refused));
                    }
                    let mut response = inner.call(request).await?;
                    if config.headers_on_success {
                        put_fields(
                            &config,
                            config.limits.iter().zip(&keys),
                            response.headers_mut(),
                        );
                    }
                    Ok(response)
                }),
            },
        }
    }
}

/// The response future of a refused request (out of line: refusals are the rare path).
#[cold]
#[inline(never)]
fn refuse<C: Clock, F, R: RefusalBody, E>(
    config: &Config<C>,
    head: &Head<'_>,
    why: Refusal,
) -> ResponseFuture<F, R, E> {
    match why {
        Refusal::MissingKey(why) => ResponseFuture::refused(plain_refusal(why)),
        Refusal::Limited(refused) => {
            let keys = keys(config, head).unwrap_or_default();
            ResponseFuture::refused(refusal(config, &keys, head, refused))
        }
    }
}

/// Why a request is answered without a decision: its key is missing.
#[derive(Clone, Debug)]
enum NoKey {
    /// As configured ([`MissingKey::Refuse`]).
    Refuse(StatusCode),
    /// The server passes no peer address to a limit keyed by it: a 500 naming the fix.
    NoPeerAddress(Arc<str>),
}

/// The key of one limit for this request: `Ok(None)` skips the limit.
fn key<C: Clock>(
    config: &Config<C>,
    limit: &Limit<C>,
    head: &Head<'_>,
) -> Result<Option<ClientKey>, NoKey> {
    match limit.source.key(head) {
        Ok(key) => Ok(Some(key)),
        Err(why) => match (config.missing, why) {
            (None, Missing::PeerAddress) => {
                warn_once_no_peer_address(&limit.name);
                Err(NoKey::NoPeerAddress(Arc::clone(&limit.name)))
            }
            (None | Some(MissingKey::Shared), _) => Ok(Some(ClientKey::keyless())),
            (Some(MissingKey::Skip), _) => Ok(None),
            (Some(MissingKey::Refuse(status)), _) => Err(NoKey::Refuse(status)),
        },
    }
}

/// What the 500 of a server that passes no peer address says, and its one log line.
fn no_peer_address_message(limit: &str) -> String {
    format!(
        "paceline: the rate limit {limit:?} keys clients by their address, but this server \
         passes none to it. With axum, serve \
         `app.into_make_service_with_connect_info::<SocketAddr>()`; with hyper, insert each \
         connection's `SocketAddr` into its requests' extensions; or share one bucket on \
         purpose with `.on_missing_key(MissingKey::Shared)`.\n"
    )
}

/// Logs the misconfiguration once per process, to standard error.
#[cold]
fn warn_once_no_peer_address(limit: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    // Relaxed: a flag that only keeps the line from repeating; it publishes nothing.
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprint!("{}", no_peer_address_message(limit));
    }
}

/// Every limit's key for this request.
fn keys<C: Clock>(config: &Config<C>, head: &Head<'_>) -> Result<Vec<Option<ClientKey>>, NoKey> {
    config
        .limits
        .iter()
        .map(|limit| key(config, limit, head))
        .collect()
}

enum Refusal {
    MissingKey(NoKey),
    Limited(Refused),
}

/// Takes one cell from every limit, or none (module docs). Allocates only to remember
/// what to undo when more than one limit applies.
fn admit_now<C: Clock>(config: &Config<C>, head: &Head<'_>) -> Result<(), Refusal> {
    if let [limit] = config.limits.as_slice() {
        // One limit: nothing to undo, whatever happens.
        return match key(config, limit, head) {
            Ok(Some(key)) => limit
                .limiter
                .check_key(&key)
                .map_err(|e| Refusal::Limited(refused(0, e))),
            Ok(None) => Ok(()),
            Err(why) => Err(Refusal::MissingKey(why)),
        };
    }
    let mut taken: Vec<(usize, ClientKey, Undo)> = Vec::new();
    let last = config.limits.len().saturating_sub(1);
    for (i, limit) in config.limits.iter().enumerate() {
        let key = match key(config, limit, head) {
            Ok(Some(key)) => key,
            Ok(None) => continue,
            Err(why) => {
                undo_all(config, taken);
                return Err(Refusal::MissingKey(why));
            }
        };
        match limit.limiter.check_key_undoably(&key) {
            // The last limit's admission never needs undoing.
            Ok(_) if i == last => {}
            Ok(undo) => taken.push((i, key, undo)),
            Err(e) => {
                undo_all(config, taken);
                return Err(Refusal::Limited(refused(i, e)));
            }
        }
    }
    Ok(())
}

fn undo_all<C: Clock>(config: &Config<C>, taken: Vec<(usize, ClientKey, Undo)>) {
    for (i, key, undo) in taken {
        config.limits[i].limiter.undo(&key, undo);
    }
}

/// Which limit refused, and how long until it would admit.
struct Refused {
    limit: usize,
    wait: Duration,
}

/// Wait mode: books one cell on every limit first (admitted now, or a place in the key's
/// FIFO), each within the configured maximum, then waits for the latest. A limit that
/// cannot admit within the maximum gives back what the earlier limits booked, and so does
/// a request dropped while waiting (its client gone): a booking before its instant is
/// cancelled, an admission undone. A cell whose instant has come stays spent.
async fn admit_waiting<C: Clock>(
    config: &Config<C>,
    keys: &[Option<ClientKey>],
) -> Result<(), Refused> {
    let max = config.wait_up_to.unwrap_or_default();
    let mut booked = Bookings {
        config,
        taken: Vec::with_capacity(keys.len()),
    };
    for (i, (limit, key)) in config.limits.iter().zip(keys).enumerate() {
        let Some(key) = key else { continue };
        match limit.limiter.book_key_within(key, max) {
            Ok(booking) => booked.taken.push((i, key, Some(booking))),
            // `booked` is dropped here: the earlier limits get their cells back.
            Err(e) => return Err(refused(i, e)),
        }
    }
    // Every booking at once: the request proceeds when the last is due. A booking can
    // still be refused: one that waited for room in a full key table, found it, and then
    // could not be had within the maximum. The request is then refused, and dropping
    // `booked` gives the others back (those whose instant has come stay spent).
    core::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, _, booking) in &mut booked.taken {
            let Some(Booked::Later(acquire)) = booking else {
                continue;
            };
            match acquire.as_mut().poll(cx) {
                // Used: nothing to give back, and never polled again.
                Poll::Ready(Ok(())) => *booking = None,
                Poll::Ready(Err(Denied::NotUntil(e))) => return Poll::Ready(Err(refused(*i, e))),
                Poll::Ready(Err(Denied::InsufficientCapacity(_))) => {
                    unreachable!("one cell always fits a burst of at least one")
                }
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    })
    .await?;
    for (_, _, booking) in &mut booked.taken {
        *booking = None; // admitted now, or at an instant that has come: used
    }
    Ok(())
}

/// The cells a waiting request booked so far, given back unless used.
struct Bookings<'a, C: Clock> {
    config: &'a Config<C>,
    taken: Vec<Taken<'a, C>>,
}

/// A limit's index, the request's key for it, and its booking (`None` once used).
type Taken<'a, C> = (usize, &'a ClientKey, Option<Booked<'a, ClientKey, C>>);

impl<C: Clock> Drop for Bookings<'_, C> {
    fn drop(&mut self) {
        for (i, key, booking) in self.taken.drain(..) {
            match booking {
                Some(Booked::Now(undo)) => self.config.limits[i].limiter.undo(key, undo),
                // Dropping a booking cancels it (its cell back if before its instant).
                Some(Booked::Later(acquire)) => drop(acquire),
                None => {}
            }
        }
    }
}

fn refused(limit: usize, e: NotUntil) -> Refused {
    Refused {
        limit,
        wait: e.wait_time(),
    }
}

/// The limit that will admit the request last, and when: a request needs every limit,
/// so a client told less than the longest wait among them would be refused again. Reads
/// each limit's state after the request's own cells were given back.
fn longest_wait<C: Clock>(
    config: &Config<C>,
    keys: &[Option<ClientKey>],
    refused: Refused,
) -> Refused {
    config
        .limits
        .iter()
        .zip(keys)
        .enumerate()
        .filter_map(|(i, (limit, key))| {
            let wait = limit.limiter.snapshot_key(key.as_ref()?).until_next();
            Some(Refused { limit: i, wait })
        })
        .fold(refused, |longest, other| {
            if other.wait > longest.wait {
                other
            } else {
                longest
            }
        })
}

/// Whole seconds, rounded up: a client told this never retries before its turn.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

fn plain_refusal<R: RefusalBody>(why: NoKey) -> Response<R> {
    let (status, text) = match why {
        NoKey::Refuse(status) => (status, format!("{status}\n")),
        NoKey::NoPeerAddress(limit) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            no_peer_address_message(&limit),
        ),
    };
    let mut response = Response::new(R::from_text(text));
    *response.status_mut() = status;
    response
}

/// The 429 (or gRPC `RESOURCE_EXHAUSTED`) for a refused request.
fn refusal<C: Clock, R: RefusalBody>(
    config: &Config<C>,
    keys: &[Option<ClientKey>],
    head: &Head<'_>,
    refused: Refused,
) -> Response<R> {
    let refused = longest_wait(config, keys, refused);
    let retry_after = ceil_secs(refused.wait).max(1);
    let name = &config.limits[refused.limit].name;
    let grpc = head
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    let mut response = if grpc {
        let mut response = Response::new(R::from_text(String::new()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(
            HeaderName::from_static("grpc-status"),
            HeaderValue::from_static("8"),
        );
        if let Ok(message) =
            HeaderValue::from_str(&format!("rate limited by {name}: retry in {retry_after} s"))
        {
            headers.insert(HeaderName::from_static("grpc-message"), message);
        }
        response
    } else {
        let (content_type, text) = match &config.body {
            Some((content_type, body)) => {
                let info = RefusalInfo {
                    limit: name,
                    wait: refused.wait,
                };
                (content_type.clone(), body(&info))
            }
            None => (
                HeaderValue::from_static("text/plain; charset=utf-8"),
                format!("Too Many Requests: limit \"{name}\", retry in {retry_after} s\n"),
            ),
        };
        let mut response = Response::new(R::from_text(text));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(CONTENT_TYPE, content_type);
        response
    };
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after));
    put_fields(
        config,
        config.limits.iter().zip(keys),
        response.headers_mut(),
    );
    response
}

/// A limit's policy as the `RateLimit-Policy` field writes it: `q` cells per `w` seconds,
/// with `w` the burst window in whole seconds (at least 1) and `q` the cells the
/// sustained rate admits in `w`, rounded down. So `q / w` is never above the real rate and
/// within one cell per window of it (2/s with a burst of 3 is `q=4;w=2`, 100/s with a
/// burst of 1 is `q=100;w=1`); the burst itself is what `r` says when the client is idle.
fn policy(quota: Quota) -> (u64, u64) {
    let interval = quota.emission_interval().as_nanos().max(1);
    let window = quota
        .emission_interval()
        .checked_mul(quota.burst())
        .unwrap_or(Duration::MAX);
    let w = ceil_secs(window).max(1);
    let q = u128::from(w) * 1_000_000_000 / interval;
    (u64::try_from(q).unwrap_or(u64::MAX), w)
}

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) for every
/// limit that applies to this request, and the legacy `X-RateLimit-*` fields of the
/// tightest of them when asked for.
fn put_fields<'a, C: Clock>(
    config: &Config<C>,
    limits: impl Iterator<Item = (&'a Limit<C>, &'a Option<ClientKey>)>,
    headers: &mut http::HeaderMap,
) {
    let mut policies = Vec::new();
    let mut states = Vec::new();
    // The tightest limit: the fewest cells left, then the longest until full.
    let mut tightest: Option<(u32, u64, u64)> = None;
    for (limit, key) in limits {
        let Some(key) = key else { continue };
        let state: Snapshot = limit.limiter.snapshot_key(key);
        let (q, w) = policy(state.quota());
        let t = ceil_secs(state.until_full());
        policies.push(format!("{};q={q};w={w}", limit.field_name));
        states.push(format!(
            "{};r={};t={t}",
            limit.field_name,
            state.remaining()
        ));
        let candidate = (state.remaining(), t, q);
        let tighter = |&(r, until, _): &(u32, u64, u64)| {
            candidate.0 < r || (candidate.0 == r && candidate.1 > until)
        };
        if tightest.as_ref().is_none_or(tighter) {
            tightest = Some(candidate);
        }
    }
    for (name, items) in [("ratelimit-policy", policies), ("ratelimit", states)] {
        if let Ok(value) = HeaderValue::from_str(&items.join(", ")) {
            if !items.is_empty() {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
    }
    if let (true, Some((remaining, reset, limit))) = (config.legacy_headers, tightest) {
        for (name, value) in [
            ("x-ratelimit-limit", limit),
            ("x-ratelimit-remaining", u64::from(remaining)),
            ("x-ratelimit-reset", reset),
        ] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ceil_secs;
    use core::time::Duration;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::from_millis(900)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_nanos(2_000_000_001)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }
}
