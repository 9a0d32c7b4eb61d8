//! The client side: a tower layer that paces outgoing requests and follows what each
//! upstream says ([`PaceLayer`]), and the same for reqwest ([`PaceMiddleware`], feature
//! `reqwest`); a tower layer that books each request on a [`Budget`](crate::budget::Budget)
//! of several rates and follows each response's per-dimension fields ([`BudgetLayer`]).

/// `reqwest_middleware::Middleware::handle`, its signature as `#[async_trait]` writes it
/// (paceline does not depend on async-trait), answering with the future `$body`.
#[cfg(feature = "reqwest")]
macro_rules! middleware_handle {
    (|$self:ident, $request:ident, $extensions:ident, $next:ident| $body:expr) => {
        fn handle<'life0, 'life1, 'life2, 'async_trait>(
            &'life0 $self,
            $request: reqwest::Request,
            $extensions: &'life1 mut http::Extensions,
            $next: reqwest_middleware::Next<'life2>,
        ) -> core::pin::Pin<
            Box<
                dyn core::future::Future<
                        Output = reqwest_middleware::Result<reqwest::Response>,
                    > + Send
                    + 'async_trait,
            >,
        >
        where
            Self: 'async_trait,
            'life0: 'async_trait,
            'life1: 'async_trait,
            'life2: 'async_trait,
        {
            Box::pin($body)
        }
    };
}

mod budget;
pub use self::budget::{BoxError, BudgetLayer, BudgetService, Cost, Settle};
#[cfg(feature = "reqwest")]
mod reqwest;
#[cfg(feature = "reqwest")]
mod reqwest_budget;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use self::reqwest::PaceMiddleware;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use self::reqwest_budget::BudgetMiddleware;

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;
use std::time::SystemTime;

use http::{Request, Response};

use crate::upstream::{Follower, FollowerConfig, Followers, Signal};
use crate::{Limiter, Quota};

/// A tower layer for HTTP clients (hyper-util's client, a tonic `Channel`, any
/// `Service<Request<B>>`): every request waits its booked turn on its upstream host's
/// [`Follower`], and every response steers that follower for every caller at once (a
/// `Retry-After`, or a field saying nothing is left until a reset, holds the host until
/// then, booked turns included; an announced pace is followed; refusals alone teach the
/// upstream's rate; see [`crate::upstream`]).
///
/// Each host (a request URI's host and port, or its `Host` header; a scheme's default
/// port is the same host as no port) has its own follower, in a table of at most
/// [`MAX_HOSTS`](crate::upstream::MAX_HOSTS) idle hosts ([`Followers`]). A refusal is
/// returned to the caller, whose next request waits out the hold.
///
/// # Examples
///
/// ```
/// use paceline::http::client::PaceLayer;
/// use paceline::Quota;
/// use tower_layer::Layer;
///
/// // 100 calls per second to each upstream host, one at a time.
/// let layer = PaceLayer::new(Quota::per_second(100).with_burst(1));
/// let service = layer.layer(tower_service_fn());
/// # fn tower_service_fn() -> impl Clone { () }
/// # let _ = service;
/// ```
#[derive(Clone, Debug)]
pub struct PaceLayer {
    hosts: Arc<Followers>,
}

impl PaceLayer {
    /// Paces each upstream host by `quota`, following its signals with
    /// [`FollowerConfig::default`] (waits of up to 5 minutes, never faster than `quota`).
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::client::PaceLayer::new(paceline::Quota::per_second(10));
    /// assert_eq!(layer.quota(), paceline::Quota::per_second(10));
    /// ```
    pub fn new(quota: Quota) -> PaceLayer {
        PaceLayer::with_config(quota, FollowerConfig::default())
    }

    /// [`PaceLayer::new`] with how to follow the upstreams.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::client::PaceLayer;
    /// use paceline::upstream::FollowerConfig;
    /// use std::time::Duration;
    ///
    /// let layer = PaceLayer::with_config(
    ///     paceline::Quota::per_second(10),
    ///     FollowerConfig::default().max_hold(Duration::from_secs(30)),
    /// );
    /// # let _ = layer;
    /// ```
    pub fn with_config(quota: Quota, config: FollowerConfig) -> PaceLayer {
        PaceLayer {
            hosts: Arc::new(Followers::new(quota, config)),
        }
    }

    /// The configured quota of each host.
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::client::PaceLayer::new(paceline::Quota::per_minute(1));
    /// assert_eq!(layer.quota(), paceline::Quota::per_minute(1));
    /// ```
    pub fn quota(&self) -> Quota {
        self.hosts.configured()
    }

    /// The follower of `host` (`name` or `name:port`; made if it is new).
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::client::PaceLayer::new(paceline::Quota::per_second(5));
    /// assert!(layer.follower("api.example.com").announced().is_none());
    /// ```
    pub fn follower(&self, host: &str) -> Arc<Follower> {
        self.hosts.get(&authority_key(host, None))
    }

    /// The limiter of `host`'s follower: to see its pace, to share it with callers that
    /// do not go through the layer, or to set your own quota for that host (it stays
    /// yours).
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::client::PaceLayer::new(paceline::Quota::per_second(5));
    /// assert_eq!(layer.limiter("api.example.com").remaining(), 5);
    /// // The scheme's default port is the same host.
    /// assert!(std::sync::Arc::ptr_eq(&layer.limiter("api.example.com"), &layer.limiter("api.example.com:443")));
    /// ```
    pub fn limiter(&self, host: &str) -> Arc<Limiter> {
        Arc::clone(self.follower(host).limiter())
    }
}

/// A host's key: its name in lower case, and its port unless it is the scheme's default
/// (80 for `http`, 443 for `https`; either, when the scheme is not known).
pub(crate) fn host_key(host: &str, port: Option<u16>, scheme: Option<&str>) -> String {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let default = match scheme.map(str::to_ascii_lowercase).as_deref() {
        Some("http") | Some("ws") => port == Some(80),
        Some("https") | Some("wss") => port == Some(443),
        _ => matches!(port, Some(80 | 443)),
    };
    match port {
        Some(port) if !default => format!("{host}:{port}"),
        _ => host,
    }
}

/// [`host_key`] of an authority or `Host` value (`user@name:port`, `[::1]:8080`).
fn authority_key(authority: &str, scheme: Option<&str>) -> String {
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = match authority.rsplit_once(':') {
        // Not an IPv6 address's last colon: the port.
        Some((host, port)) if !port.contains(']') => (host, port.parse().ok()),
        _ => (authority, None),
    };
    host_key(host, port, scheme)
}

impl<S> tower_layer::Layer<S> for PaceLayer {
    type Service = Pace<S>;

    fn layer(&self, inner: S) -> Pace<S> {
        Pace {
            inner,
            hosts: Arc::clone(&self.hosts),
        }
    }
}

/// The service [`PaceLayer`] makes.
///
/// # Examples
///
/// See [`PaceLayer`].
#[derive(Clone, Debug)]
pub struct Pace<S> {
    inner: S,
    hosts: Arc<Followers>,
}

/// What a response says, as [`Signal::read`] reads it.
fn signal_of(status: u16, headers: &http::HeaderMap) -> Signal {
    Signal::read(
        status,
        headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes())),
        SystemTime::now(),
    )
}

impl<S, B, R> tower_service::Service<Request<B>> for Pace<S>
where
    S: tower_service::Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let uri = request.uri();
        let key = match uri.host() {
            Some(host) => host_key(host, uri.port_u16(), uri.scheme_str()),
            None => request
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| authority_key(h, uri.scheme_str()))
                .unwrap_or_default(),
        };
        let follower = self.hosts.get(&key);
        // The service that was made ready goes with the request; a clone stays for the
        // next `poll_ready` (tower's rule for services that are `Clone`).
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            follower.until_ready().await;
            let sent = follower.sent();
            let response = inner.call(request).await?;
            follower.apply(
                &signal_of(response.status().as_u16(), response.headers()),
                sent,
            );
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{authority_key, host_key};

    #[test]
    fn one_host_one_key_whatever_its_spelling() {
        assert_eq!(
            host_key("API.example.com", Some(443), Some("https")),
            "api.example.com"
        );
        assert_eq!(
            host_key("api.example.com.", None, Some("https")),
            "api.example.com"
        );
        assert_eq!(
            host_key("api.example.com", Some(80), Some("https")),
            "api.example.com:80"
        );
        assert_eq!(host_key("127.0.0.1", Some(8080), None), "127.0.0.1:8080");
        assert_eq!(
            authority_key("user:pw@Example.com:80", Some("http")),
            "example.com"
        );
        assert_eq!(authority_key("[::1]:8080", None), "[::1]:8080");
        assert_eq!(authority_key("[::1]", None), "[::1]");
    }
}
