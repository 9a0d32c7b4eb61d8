//! [`PaceMiddleware`]: the client layer for reqwest, through reqwest-middleware.

use core::future::Future;
use core::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use reqwest_middleware::{Middleware, Next};

use super::{Hosts, PaceLayer};
use crate::upstream::Signal;

/// Methods a refusal is sent again for without the caller's say: they change nothing
/// twice (RFC 9110, 9.2.2).
const IDEMPOTENT: [&str; 6] = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"];

/// A reqwest-middleware middleware (feature `reqwest`): what [`PaceLayer`] does for a
/// tower client, for a `reqwest_middleware::ClientWithMiddleware`. Every request waits its
/// booked turn on its host's limiter; every response steers that limiter; a request
/// refused with a 429 is sent again in a new turn (which waits out the hold the refusal
/// announced), up to `retries` times, for idempotent methods unless
/// [`PaceMiddleware::retry_any_method`] says otherwise (and only when reqwest can clone
/// the request: not for a streamed body).
///
/// # Examples
///
/// ```
/// use paceline::http::client::{PaceLayer, PaceMiddleware};
/// use paceline::Quota;
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(PaceMiddleware::new(PaceLayer::new(Quota::per_second(100).with_burst(1))))
///     .build();
/// # let _ = client;
/// ```
#[derive(Clone, Debug)]
pub struct PaceMiddleware {
    hosts: Arc<Hosts>,
    retries: u32,
    any_method: bool,
}

impl PaceMiddleware {
    /// The middleware for `layer`'s hosts (a layer and a middleware made from it share
    /// every host's limiter), retrying a refused request twice.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::http::client::{PaceLayer, PaceMiddleware};
    /// let middleware = PaceMiddleware::new(PaceLayer::new(paceline::Quota::per_second(5)));
    /// # let _ = middleware;
    /// ```
    pub fn new(layer: PaceLayer) -> PaceMiddleware {
        PaceMiddleware {
            hosts: layer.hosts,
            retries: 2,
            any_method: false,
        }
    }

    /// How many times a request refused with a 429 is sent again (0: never).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::http::client::{PaceLayer, PaceMiddleware};
    /// let middleware = PaceMiddleware::new(PaceLayer::new(paceline::Quota::per_second(5)))
    ///     .retries(0);
    /// # let _ = middleware;
    /// ```
    pub fn retries(mut self, retries: u32) -> PaceMiddleware {
        self.retries = retries;
        self
    }

    /// Sends refused requests again whatever their method (a `POST` too: only for APIs
    /// where a refused request did nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::http::client::{PaceLayer, PaceMiddleware};
    /// let middleware = PaceMiddleware::new(PaceLayer::new(paceline::Quota::per_second(5)))
    ///     .retry_any_method();
    /// # let _ = middleware;
    /// ```
    pub fn retry_any_method(mut self) -> PaceMiddleware {
        self.any_method = true;
        self
    }
}

impl Middleware for PaceMiddleware {
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        request: reqwest::Request,
        extensions: &'life1 mut http::Extensions,
        next: Next<'life2>,
    ) -> Pin<
        Box<
            dyn Future<Output = reqwest_middleware::Result<reqwest::Response>>
                + Send
                + 'async_trait,
        >,
    >
    where
        Self: 'async_trait,
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
    {
        Box::pin(async move {
            let url = request.url();
            let name = match (url.host_str(), url.port()) {
                (Some(host), Some(port)) => format!("{host}:{port}"),
                (Some(host), None) => host.to_owned(),
                (None, _) => String::new(),
            };
            let host = self.hosts.host(&name);
            let retryable = self.any_method || IDEMPOTENT.contains(&request.method().as_str());
            let mut request = request;
            let mut attempt = 0;
            loop {
                Arc::clone(&host.limiter).until_ready_owned().await;
                let again = (retryable && attempt < self.retries)
                    .then(|| request.try_clone())
                    .flatten();
                let response = next.clone().run(request, extensions).await?;
                let signal = Signal::read(
                    response.status().as_u16(),
                    response
                        .headers()
                        .iter()
                        .map(|(name, value)| (name.as_str(), value.as_bytes())),
                    SystemTime::now(),
                );
                host.following.apply(&*host.limiter, &signal);
                match again {
                    Some(next_try) if response.status().as_u16() == 429 => {
                        request = next_try;
                        attempt += 1;
                    }
                    _ => return Ok(response),
                }
            }
        })
    }
}
