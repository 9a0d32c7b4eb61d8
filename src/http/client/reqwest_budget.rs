//! [`BudgetMiddleware`]: [`BudgetLayer`](super::BudgetLayer) for reqwest, through
//! reqwest-middleware.

use core::time::Duration;

use reqwest_middleware::Middleware;

use super::budget::{signal, Cost, Settle};
use crate::budget::Budget;
use crate::clock::{Clock, DefaultClock};

/// A reqwest-middleware middleware (feature `reqwest`): what
/// [`BudgetLayer`](super::BudgetLayer) does for a tower client. A request's cost is its
/// [`Cost`] extension (`RequestBuilder::with_extension`; 1 in every dimension without
/// one), every response steers the budget by its per-dimension fields (no wait past
/// `max_hold`, 5 minutes by default), and the turn comes back in the response's
/// extensions as a [`Settle`]. A refusal is the caller's to retry: its next turn waits
/// out what the refusal said.
///
/// # Examples
///
/// ```
/// use paceline::budget::Budget;
/// use paceline::http::client::{BudgetMiddleware, Cost, Settle};
/// use paceline::Quota;
///
/// let budget = Budget::builder()
///     .rate("requests", Quota::per_minute(500))
///     .rate("tokens", Quota::per_minute(200_000))
///     .build()?;
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(BudgetMiddleware::new(budget))
///     .build();
/// let request = client
///     .post("http://127.0.0.1:9/v1/chat")
///     .with_extension(Cost::of(&[("tokens", 1_200)]));
/// // let response = request.send().await?;
/// // let used = ...; // from the body
/// // response.extensions().get::<Settle>().unwrap().settle(&[("tokens", used)])?;
/// # let _ = request;
/// # Ok::<(), paceline::budget::BuildError>(())
/// ```
#[derive(Clone, Debug)]
pub struct BudgetMiddleware<C: Clock = DefaultClock> {
    budget: Budget<C>,
    max_hold: Duration,
}

impl<C: Clock> BudgetMiddleware<C> {
    /// Books on `budget`, following responses with waits of at most 5 minutes.
    ///
    /// # Examples
    ///
    /// See [`BudgetMiddleware`].
    pub fn new(budget: Budget<C>) -> BudgetMiddleware<C> {
        BudgetMiddleware {
            budget,
            max_hold: Duration::from_secs(300),
        }
    }

    /// The longest wait a response may impose (a `Retry-After`, a reset).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::budget::Budget;
    /// use paceline::http::client::BudgetMiddleware;
    /// let budget = Budget::builder().rate("tokens", paceline::Quota::per_minute(1_000)).build()?;
    /// let middleware = BudgetMiddleware::new(budget).max_hold(std::time::Duration::from_secs(30));
    /// # let _ = middleware;
    /// # Ok::<(), paceline::budget::BuildError>(())
    /// ```
    pub fn max_hold(mut self, max: Duration) -> BudgetMiddleware<C> {
        self.max_hold = max;
        self
    }
}

impl<C: Clock> Middleware for BudgetMiddleware<C> {
    middleware_handle!(|self, request, extensions, next| async move {
        let cost = extensions.get::<Cost>().cloned().unwrap_or_default();
        let costs: Vec<(&str, u32)> = cost.0.iter().map(|(n, c)| (n.as_str(), *c)).collect();
        let turn = self
            .budget
            .acquire(&costs)
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        // An error drops the turn: it ends keeping its estimate.
        let mut response = next.run(request, extensions).await?;
        let signal = signal(response.status(), response.headers());
        self.budget.follow(&signal, self.max_hold);
        response.extensions_mut().insert(Settle::of(turn));
        Ok(response)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// Answers `count` requests on loopback with `response`; returns the address.
    fn serve(count: usize, response: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(count) {
                let mut stream = stream.unwrap();
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(response.as_bytes());
            }
        });
        format!("http://{address}/")
    }

    #[test]
    fn books_follows_hostile_fields_within_max_hold_and_hands_the_turn_back() {
        let url = serve(
            1,
            "HTTP/1.1 429 Too Many Requests\r\nretry-after: 999999999\r\n\
             x-ratelimit-remaining-tokens: 0\r\nx-ratelimit-reset-tokens: 9999h\r\n\
             anthropic-ratelimit-tokens-remaining: 7\r\n\
             content-length: 0\r\nconnection: close\r\n\r\n",
        );
        let budget = Budget::builder()
            .rate("requests", Quota::per_second(10))
            .rate("tokens", Quota::per_second(1_000))
            .build()
            .unwrap();
        let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(BudgetMiddleware::new(budget.clone()).max_hold(Duration::from_secs(2)))
            .build();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let response = runtime
            .block_on(
                client
                    .get(&url)
                    .with_extension(Cost::of(&[("tokens", 300)]))
                    .send(),
            )
            .unwrap();
        assert_eq!(response.status(), 429);
        assert_eq!(budget.in_flight(), 1);
        let settle = response.extensions().get::<Settle>().unwrap().clone();
        assert_eq!(settle.settle(&[("tokens", 0)]), Ok(true));
        assert_eq!(budget.in_flight(), 0);
        let wait = budget.wait_time(&[]).unwrap();
        assert!(wait <= Duration::from_secs(2), "{wait:?}");
        assert!(wait > Duration::from_millis(1_900), "{wait:?}");
        // A cost naming no dimension of the budget fails before anything is sent.
        let bad = runtime.block_on(
            client
                .get(&url)
                .with_extension(Cost::of(&[("images", 1)]))
                .send(),
        );
        assert!(bad.is_err());
    }
}
