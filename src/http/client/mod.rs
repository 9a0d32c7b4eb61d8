//! The client side: a tower layer that paces outgoing requests and follows what each
//! upstream says ([`PaceLayer`]), and the same for reqwest ([`PaceMiddleware`], feature
//! `reqwest`).

#[cfg(feature = "reqwest")]
mod reqwest;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use self::reqwest::PaceMiddleware;

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http::{Request, Response};

use crate::upstream::{Follow, Following, Signal};
use crate::{Limiter, Quota};

/// Hosts a layer keeps a limiter for; past this, new hosts share one.
const MAX_HOSTS: usize = 10_000;

/// A tower layer for HTTP clients (hyper-util's client, a tonic `Channel`, any
/// `Service<Request<B>>`): every request waits its booked turn on its upstream host's
/// limiter, and every response steers that limiter for every caller at once (a
/// `Retry-After` or a `RateLimit` field saying nothing is left holds the host until then,
/// booked turns included; a `RateLimit-Policy` below the configured quota becomes the
/// quota; see [`crate::upstream`]).
///
/// Each host (a request URI's authority, or its `Host` header) gets its own limiter of
/// `quota`, up to 10 000 hosts (then new hosts share one). A refusal is returned to the
/// caller, whose next request waits out the hold.
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
    hosts: Arc<Hosts>,
}

#[derive(Debug)]
struct Hosts {
    quota: Quota,
    follow: Follow,
    map: Mutex<HashMap<String, Arc<Host>>>,
    /// The limiter of hosts beyond `MAX_HOSTS`.
    overflow: Arc<Host>,
}

/// One upstream host: its limiter, and how it follows the host's signals.
#[derive(Debug)]
struct Host {
    limiter: Arc<Limiter>,
    following: Following,
}

impl Host {
    fn new(quota: Quota, follow: Follow) -> Arc<Host> {
        Arc::new(Host {
            limiter: Arc::new(Limiter::new(quota)),
            following: Following::new(quota, follow),
        })
    }
}

impl PaceLayer {
    /// Paces each upstream host by `quota`, following its signals with
    /// [`Follow::default`] (holds of up to 5 minutes, never faster than `quota`).
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::client::PaceLayer::new(paceline::Quota::per_second(10));
    /// assert_eq!(layer.quota(), paceline::Quota::per_second(10));
    /// ```
    pub fn new(quota: Quota) -> PaceLayer {
        PaceLayer::following(quota, Follow::default())
    }

    /// [`PaceLayer::new`] with how to follow the upstreams' signals.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::client::PaceLayer;
    /// use paceline::upstream::Follow;
    /// use std::time::Duration;
    ///
    /// let layer = PaceLayer::following(
    ///     paceline::Quota::per_second(10),
    ///     Follow::default().max_hold(Duration::from_secs(30)),
    /// );
    /// # let _ = layer;
    /// ```
    pub fn following(quota: Quota, follow: Follow) -> PaceLayer {
        PaceLayer {
            hosts: Arc::new(Hosts {
                quota,
                follow,
                map: Mutex::new(HashMap::new()),
                overflow: Host::new(quota, follow),
            }),
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
        self.hosts.quota
    }

    /// The limiter for `host` (made if it is new): to see its state, or to share it with
    /// callers that do not go through the layer.
    ///
    /// # Examples
    ///
    /// ```
    /// let layer = paceline::http::client::PaceLayer::new(paceline::Quota::per_second(5));
    /// assert_eq!(layer.limiter("api.example.com").remaining(), 5);
    /// ```
    pub fn limiter(&self, host: &str) -> Arc<Limiter> {
        Arc::clone(&self.hosts.host(host).limiter)
    }
}

impl Hosts {
    fn host(&self, name: &str) -> Arc<Host> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(host) = map.get(name) {
            return Arc::clone(host);
        }
        if map.len() >= MAX_HOSTS {
            return Arc::clone(&self.overflow);
        }
        let host = Host::new(self.quota, self.follow);
        map.insert(name.to_owned(), Arc::clone(&host));
        host
    }
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
    hosts: Arc<Hosts>,
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
        let name = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                let host = request.headers().get(http::header::HOST)?;
                host.to_str().ok().map(str::to_owned)
            })
            .unwrap_or_default();
        let host = self.hosts.host(&name);
        // The service that was made ready goes with the request; a clone stays for the
        // next `poll_ready` (tower's rule for services that are `Clone`).
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            Arc::clone(&host.limiter).until_ready_owned().await;
            let response = inner.call(request).await?;
            let signal = Signal::read(
                response.status().as_u16(),
                response
                    .headers()
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_bytes())),
                SystemTime::now(),
            );
            host.following.apply(&*host.limiter, &signal);
            Ok(response)
        })
    }
}
