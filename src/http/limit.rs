//! One limit of the layer: its name (as the `RateLimit` fields write it), where its keys
//! are kept (`store.rs`) and its key source; and what to do with a request that has no
//! key.

use super::*;

/// One limit of a [`RateLimitLayer`]: a name (shown in the `RateLimit` fields), a quota
/// per key, and where the key comes from.
///
/// # Examples
///
/// ```
/// use paceline::{http::{KeySource, Limit}, Quota};
/// let per_key = Limit::new("per-key", Quota::per_minute(600), KeySource::header(http::HeaderName::from_static("x-api-key")))
///     .with_max_keys(100_000);
/// assert_eq!(per_key.limiter().map(|l| l.len()), Some(0));
/// ```
#[derive(Clone)]
pub struct Limit<C: Clock = DefaultClock> {
    pub(super) name: Arc<str>,
    /// `name` as a structured-field string, quotes and escapes included.
    pub(super) field_name: Arc<str>,
    pub(super) store: Store<C>,
    pub(super) source: KeySource,
    /// The refusal's headers and body, built once for `quota` (`prebuilt.rs`).
    pub(super) prebuilt: Arc<Prebuilt>,
    /// Its counts, labelled by `name` (feature `metrics`; nothing without it).
    pub(super) metrics: LimitMetrics,
    /// What a new client gets when the key table has no room for it.
    pub(super) table_full: TableFull,
    /// What a request costs it.
    pub(super) cost: Cost,
    /// Which requests it applies to (`None`: all).
    pub(super) when: Option<Exempt>,
}

/// What a request costs a limit ([`Limit::cost`], [`Limit::cost_fn`]).
#[derive(Clone, Default)]
pub(super) enum Cost {
    /// One cell: the usual limit, on its fastest path.
    #[default]
    One,
    Fixed(u32),
    From(Arc<dyn Fn(&Head<'_>) -> u32 + Send + Sync>),
}

impl Cost {
    /// The cells `head`'s request costs.
    #[inline]
    pub(super) fn of(&self, head: &Head<'_>) -> u32 {
        match self {
            Cost::One => 1,
            Cost::Fixed(n) => *n,
            Cost::From(f) => f(head),
        }
    }
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
pub(super) const DEFAULT_MAX_KEYS: usize = 1_000_000;

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
#[derive(Clone, PartialEq, Eq)]
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

debug_as_display!(InvalidLimitName);

/// `name` as a structured-field string (RFC 8941 `sf-string`), or why it cannot be one.
pub(super) fn field_name(name: &str) -> Result<Arc<str>, InvalidLimitName> {
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
        let field_name = field_name(name)?;
        Ok(Limit {
            prebuilt: Arc::new(Prebuilt::new(name, &field_name, quota)),
            metrics: LimitMetrics::new(name),
            field_name,
            name: name.into(),
            store: Store::Local(Arc::new(
                KeyedLimiter::with_clock(quota, clock).with_max_keys(DEFAULT_MAX_KEYS),
            )),
            source,
            table_full: TableFull::default(),
            cost: Cost::One,
            when: None,
        })
    }

    /// Applies this limit only to requests for which `when` is true (per method, per
    /// route): the others pass it untouched, as if it were not there.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit}, Quota};
    /// let writes = Limit::new("writes", Quota::per_minute(10), KeySource::peer_ip())
    ///     .only_when(|head| head.method() == http::Method::POST);
    /// # let _ = writes;
    /// ```
    pub fn only_when(
        mut self,
        when: impl Fn(&Head<'_>) -> bool + Send + Sync + 'static,
    ) -> Limit<C> {
        self.when = Some(Arc::new(when));
        self
    }

    /// Gives some clients a quota of their own (tiers: a free and a paid plan keyed by
    /// API key): `quota_for(key)` returns `Some(quota)` for those, `None` for the limit's
    /// own quota. Called on every check of a key, so keep it cheap. In-process limits only:
    /// a limit kept in a shared file has the file's one quota (this changes nothing there).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{ClientKey, KeySource, Limit}, Quota};
    /// let header = http::HeaderName::from_static("x-api-key");
    /// let per_key = Limit::new("per-key", Quota::per_minute(60), KeySource::header(header))
    ///     .quota_for(|key| match key {
    ///         ClientKey::Text(k) if k.starts_with("paid-") => Some(Quota::per_minute(6000)),
    ///         _ => None,
    ///     });
    /// # let _ = per_key;
    /// ```
    pub fn quota_for(
        mut self,
        quota_for: impl Fn(&ClientKey) -> Option<Quota> + Send + Sync + 'static,
    ) -> Limit<C> {
        match &mut self.store {
            Store::Local(limiter) => {
                *limiter = Arc::new(limiter.remade_with_quota_for(quota_for));
            }
            // A shared file's keys all take its one quota (documented on `Limit::shared`).
            #[cfg(feature = "shared")]
            Store::Shared(_) => {}
        }
        self
    }

    /// Makes each request cost `n` cells of this limit instead of one (an endpoint that
    /// costs the upstream ten times what another does); 0 makes requests free. A request
    /// that costs more than the burst can never pass: it is refused with `429` and a body
    /// that says so, without `Retry-After`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit}, Quota};
    /// let search = Limit::new("search", Quota::per_minute(100), KeySource::peer_ip()).cost(10);
    /// # let _ = search;
    /// ```
    pub fn cost(mut self, n: u32) -> Limit<C> {
        self.cost = if n == 1 { Cost::One } else { Cost::Fixed(n) };
        self
    }

    /// Each request's cost from its head (a batch endpoint's item count in a header, say),
    /// as [`Limit::cost`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit}, Quota};
    /// let batch = Limit::new("items", Quota::per_minute(1000), KeySource::peer_ip()).cost_fn(|head| {
    ///     head.headers().get("x-batch-size").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1)
    /// });
    /// # let _ = batch;
    /// ```
    pub fn cost_fn(mut self, f: impl Fn(&Head<'_>) -> u32 + Send + Sync + 'static) -> Limit<C> {
        self.cost = Cost::From(Arc::new(f));
        self
    }

    /// What a new client gets when this limit's key table has no room to store it (the
    /// bound of [`Limit::with_max_keys`] reached by clients still limited, or a shared
    /// file's table full): [`TableFull::Unavailable`] by default. Either way the client is
    /// never told it spent a quota it never touched.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit, TableFull}, Quota};
    /// let login = Limit::new("login", Quota::per_minute(5), KeySource::peer_ip())
    ///     .when_table_full(TableFull::Admit);
    /// # let _ = login;
    /// ```
    pub fn when_table_full(mut self, policy: TableFull) -> Limit<C> {
        self.table_full = policy;
        self
    }

    /// Whether a request this limit has no room to track passes.
    #[inline]
    pub(super) fn admits_when_full(&self) -> bool {
        self.table_full == TableFull::Admit
    }

    /// Bounds the keys this limit stores (default 1 000 000): at the bound, a new client
    /// is answered as [`Limit::when_table_full`] says (by default `503` with the time until
    /// a slot frees) rather than evicting a limited one; keys that refilled are forgotten
    /// first. A stored key costs at most about 100 bytes
    /// (long text keys are stored as a digest), so this bounds the limit's memory. Call it
    /// on a clone too: clones share the limiter, and its bound.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit}, Quota};
    /// let small = Limit::new("per-ip", Quota::per_second(1), KeySource::peer_ip()).with_max_keys(10_000);
    /// # let _ = small;
    /// ```
    ///
    /// A limit kept in a shared file ([`Limit::shared`]) holds the file's capacity
    /// instead, fixed when the file was made: this changes nothing there.
    pub fn with_max_keys(self, max: usize) -> Limit<C> {
        match &self.store {
            Store::Local(limiter) => limiter.set_max_keys(max),
            #[cfg(feature = "shared")]
            Store::Shared(_) => {}
        }
        self
    }

    /// The in-process keyed limiter behind this limit: to check, retune (`set_quota`) or
    /// inspect it outside the middleware. `None` for a limit kept in a shared file
    /// ([`Limit::shared`]), which any process inspects by opening the file.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{ClientKey, KeySource, Limit}, Quota};
    /// let limit = Limit::new("api", Quota::per_second(5), KeySource::global());
    /// assert_eq!(limit.limiter().unwrap().remaining_key(&ClientKey::Global), 5);
    /// ```
    pub fn limiter(&self) -> Option<&KeyedLimiter<ClientKey, C>> {
        match &self.store {
            Store::Local(limiter) => Some(limiter),
            #[cfg(feature = "shared")]
            Store::Shared(_) => None,
        }
    }
}

#[cfg(feature = "shared")]
impl Limit {
    /// A limit whose keys live in `limiter`, a shared file every process of the host
    /// opens (feature `shared`): the worker processes of one server (gunicorn, uvicorn's
    /// `--workers`, any pre-fork server) then enforce one bound per client between them,
    /// with no Redis. The quota and the key capacity are the file's. Keys are the same
    /// bytes in every process, whatever language it runs (Python's `paceline.asgi` shares
    /// the file too).
    ///
    /// # Errors
    ///
    /// [`InvalidLimitName`], as [`Limit::try_new`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{http::{KeySource, Limit, RateLimitLayer}, shared::SharedKeyedLimiter, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-http-shared-{}", std::process::id()));
    /// // In every worker: 10 per second per client, across all of them.
    /// let per_client = SharedKeyedLimiter::open(&path, Quota::per_second(10), 100_000)?;
    /// let layer = RateLimitLayer::new().limit(Limit::shared("per-ip", per_client, KeySource::peer_ip())?);
    /// # let _ = layer;
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shared(
        name: &str,
        limiter: impl Into<Arc<crate::shared::SharedKeyedLimiter>>,
        source: KeySource,
    ) -> Result<Limit, InvalidLimitName> {
        let limiter = limiter.into();
        let field_name = field_name(name)?;
        Ok(Limit {
            prebuilt: Arc::new(Prebuilt::new(name, &field_name, limiter.quota())),
            metrics: LimitMetrics::new(name),
            field_name,
            name: name.into(),
            store: Store::Shared(limiter),
            source,
            table_full: TableFull::default(),
            cost: Cost::One,
            when: None,
        })
    }
}

/// What a limit answers a new client its key table has no room to store
/// ([`Limit::when_table_full`]): the table holds as many clients as it was given room for,
/// every one still limited, and this one is new. It spent nothing, so it is never told it
/// did (no `429`, no `RateLimit` field saying `r=0`).
///
/// # Examples
///
/// ```
/// use paceline::http::TableFull;
/// assert_eq!(TableFull::default(), TableFull::Unavailable);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TableFull {
    /// `503 Service Unavailable` with `Retry-After` (the time until the table expects
    /// room, rounded up), no `RateLimit` field, and a body that says the limit is tracking
    /// as many clients as it has room for (gRPC: `UNAVAILABLE`). The
    /// server is busy, as far as that client can tell; a flood of new clients cannot
    /// push out the ones already limited.
    #[default]
    Unavailable,
    /// Let the request through without limiting it (nothing is stored or spent): the
    /// limit then protects only the clients it tracks. For limits whose refusal would cost
    /// more than an unlimited request.
    Admit,
}

/// Counting (feature `metrics`; every call empty without it).
impl<C: Clock> Limit<C> {
    #[inline]
    pub(super) fn count_admitted(&self) {
        self.metrics.admitted();
        self.count_keys();
    }

    #[inline]
    pub(super) fn count_refused(&self) {
        self.metrics.refused();
        self.count_keys();
    }

    pub(super) fn count_waited(&self, wait: Duration) {
        self.metrics.waited(wait);
        self.count_keys();
    }

    #[inline]
    fn count_keys(&self) {
        self.metrics.keys(|| self.store.now(), || self.store.len());
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
