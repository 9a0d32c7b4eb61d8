//! [`PaceMiddleware`]: the client layer for reqwest, through reqwest-middleware.

use std::sync::Arc;
use std::time::Instant;

use reqwest_middleware::Middleware;

use super::{host_key, signal_of, PaceLayer};
use crate::upstream::Followers;

/// Methods a refusal is sent again for without the caller's say: they change nothing
/// twice (RFC 9110, 9.2.2).
const IDEMPOTENT: [&str; 6] = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"];

/// A reqwest-middleware middleware (feature `reqwest`): what [`PaceLayer`] does for a
/// tower client, for a `reqwest_middleware::ClientWithMiddleware`. Every request waits its
/// booked turn on its host's follower; every response steers that follower; a request
/// refused with a 429 is sent again in a new turn (which waits out the hold the refusal
/// announced), up to `retries` times, for idempotent methods unless
/// [`PaceMiddleware::retry_any_method`] says otherwise (and only when reqwest can clone
/// the request: not for a streamed body).
///
/// A request with its own timeout (`RequestBuilder::timeout`) waits for its turns within
/// it: a turn further away than what is left of it (or moved there by a hold while it
/// waits) fails the request at once with paceline's [`NotUntil`](crate::NotUntil) (in
/// `reqwest_middleware::Error::Middleware`), having booked nothing, and the time spent
/// waiting comes off the timeout reqwest applies to the exchange.
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
    hosts: Arc<Followers>,
    retries: u32,
    any_method: bool,
}

impl PaceMiddleware {
    /// The middleware for `layer`'s hosts (a layer and a middleware made from it share
    /// every host's follower), retrying a refused request twice.
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
    middleware_handle!(|self, request, extensions, next| async move {
        let url = request.url();
        // `url` leaves a scheme's default port out, written or not.
        let key = host_key(
            url.host_str().unwrap_or_default(),
            url.port_or_known_default(),
            Some(url.scheme()),
        );
        let follower = self.hosts.get(&key);
        let retryable = self.any_method || IDEMPOTENT.contains(&request.method().as_str());
        let deadline = request.timeout().map(|t| (Instant::now(), *t));
        let mut request = request;
        let mut attempt = 0;
        loop {
            match deadline {
                Some((start, timeout)) => {
                    let left = timeout.saturating_sub(start.elapsed());
                    follower
                        .until_ready_within(left)
                        .await
                        .map_err(reqwest_middleware::Error::middleware)?;
                    *request.timeout_mut() = Some(timeout.saturating_sub(start.elapsed()));
                }
                None => follower.until_ready().await,
            }
            let again = (retryable && attempt < self.retries)
                .then(|| request.try_clone())
                .flatten();
            let sent = follower.sent();
            let response = next.clone().run(request, extensions).await?;
            let status = response.status().as_u16();
            follower.apply(&signal_of(status, response.headers()), sent);
            match again {
                Some(next_try) if status == 429 => {
                    request = next_try;
                    attempt += 1;
                }
                _ => return Ok(response),
            }
        }
    });
}
