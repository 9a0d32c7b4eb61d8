//! The layer and its configuration: the builder users write.

use super::*;

pub(super) type Exempt = Arc<dyn Fn(&Head<'_>) -> bool + Send + Sync>;

/// A tower [`Layer`](tower_layer::Layer) that rate-limits requests: every [`Limit`] must
/// admit a request, or it is refused with `429` and `Retry-After` (see the [module
/// docs](crate::http) for everything it does).
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
    pub(super) config: Arc<Config<C>>,
}

#[derive(Clone)]
pub(super) struct Config<C: Clock> {
    pub(super) limits: Vec<Limit<C>>,
    /// `None`: the default, `OPTIONS` exempt (checked inline, no call through a pointer).
    pub(super) exempt: Option<Exempt>,
    /// `None`: the default (module docs of [`MissingKey`]).
    pub(super) missing: Option<MissingKey>,
    pub(super) headers_on_success: bool,
    pub(super) legacy_headers: bool,
    pub(super) wait_up_to: Option<Duration>,
    /// The refusal body's content type and text (`None`: the default plain text).
    pub(super) body: Option<(HeaderValue, BodyFn)>,
}

pub(super) type BodyFn = Arc<dyn Fn(&RefusalInfo<'_>) -> String + Send + Sync>;

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
    pub(super) limit: &'a str,
    pub(super) wait: Duration,
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
