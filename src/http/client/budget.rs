//! [`BudgetLayer`]: a tower client layer that books each request's cost on a
//! [`Budget`], follows each response's per-dimension fields, and hands the turn back in
//! the response for the caller to settle.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;
use std::time::SystemTime;

use http::{Request, Response};

use crate::budget::{Budget, BudgetError, Turn};
use crate::clock::{Clock, DefaultClock};
use crate::sync::Mutex;
use crate::upstream::DimensionSignal;

/// The error of a [`BudgetService`]: the inner service's, or the budget's (a cost naming
/// a dimension the budget lacks, or above a burst: nothing was booked or sent).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request's cost, as a request extension (`request.extensions_mut().insert(...)`);
/// a request without one costs 1 in every dimension.
///
/// # Examples
///
/// ```
/// use paceline::http::client::Cost;
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Cost::of(&[("tokens", 1_200)]));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cost(pub Vec<(String, u32)>);

impl Cost {
    /// A cost from `(dimension, cells)` pairs.
    ///
    /// # Examples
    ///
    /// ```
    /// let cost = paceline::http::client::Cost::of(&[("tokens", 900)]);
    /// assert_eq!(cost.0, [("tokens".to_string(), 900)]);
    /// ```
    pub fn of(costs: &[(&str, u32)]) -> Cost {
        Cost(costs.iter().map(|&(n, c)| (n.to_owned(), c)).collect())
    }
}

/// A request's turn, in its response's extensions: settle it once the body says the
/// real cost. Dropped with the response (every clone of it) unsettled, the turn ends
/// keeping its estimate.
///
/// # Examples
///
/// See [`BudgetLayer`].
pub struct Settle<C: Clock = DefaultClock>(pub(super) Arc<Mutex<Option<Turn<C>>>>);

impl<C: Clock> Clone for Settle<C> {
    fn clone(&self) -> Self {
        Settle(Arc::clone(&self.0))
    }
}

impl<C: Clock> core::fmt::Debug for Settle<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Settle").finish_non_exhaustive()
    }
}

impl<C: Clock> Settle<C> {
    /// The handle of `turn`, for a response's extensions.
    pub(super) fn of(turn: Turn<C>) -> Settle<C> {
        Settle(Arc::new(Mutex::new(Some(turn))))
    }

    /// Ends the turn with the real costs of the dimensions named
    /// ([`Turn::settle`]); `Ok(false)` if it has already ended.
    ///
    /// # Errors
    ///
    /// A dimension the budget does not have: the turn is left as it was.
    ///
    /// # Examples
    ///
    /// See [`BudgetLayer`].
    pub fn settle(&self, actual: &[(&str, u32)]) -> Result<bool, BudgetError> {
        // Taken out, then settled with the lock released: settling wakes the budget's
        // next caller.
        let Some(turn) = self.0.lock().take() else {
            return Ok(false);
        };
        match turn.settle(actual) {
            Ok(()) => Ok(true),
            Err(e) => {
                let error = e.error().clone();
                *self.0.lock() = Some(e.into_turn());
                Err(error)
            }
        }
    }

    /// Ends the turn keeping its estimate (nothing happens if it has already ended).
    ///
    /// # Examples
    ///
    /// See [`BudgetLayer`].
    pub fn release(&self) {
        let turn = self.0.lock().take();
        drop(turn);
    }
}

/// A tower layer for HTTP clients calling a model API: each request waits its turn on
/// `budget` for its [`Cost`] (a request extension; 1 in every dimension without one),
/// each response steers the budget by its per-dimension fields
/// ([`Budget::follow`]: `x-ratelimit-*-tokens`, `anthropic-ratelimit-*`, named
/// `RateLimit` policies, `Retry-After`; no wait past `max_hold`, 5 minutes by default),
/// and the turn comes back in the response's extensions as a [`Settle`], for the
/// caller to settle once the body says the real cost. A failed call ends its turn
/// keeping its estimate.
///
/// # Examples
///
/// ```
/// use paceline::budget::Budget;
/// use paceline::http::client::{BudgetLayer, Cost, Settle};
/// use paceline::Quota;
/// use tower_layer::Layer;
/// use tower_service::Service;
///
/// # futures::executor::block_on(async {
/// let budget = Budget::builder()
///     .rate("requests", Quota::per_minute(500))
///     .rate("tokens", Quota::per_minute(200_000))
///     .in_flight(8)
///     .build()?;
/// // A stand-in for a real client: says 100 tokens are left for 2 s.
/// let api = Api;
/// let mut client = BudgetLayer::new(budget.clone()).layer(api);
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Cost::of(&[("tokens", 1_200)]));
/// let response = client.call(request).await?;
/// assert_eq!(budget.in_flight(), 1);
/// // ... the body says 900 tokens were used ...
/// let turn = response.extensions().get::<Settle>().unwrap();
/// turn.settle(&[("tokens", 900)])?;
/// assert_eq!(budget.in_flight(), 0);
/// assert_eq!(budget.remaining("tokens")?, 100); // the provider's word
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// # }).unwrap();
/// # #[derive(Clone)]
/// # struct Api;
/// # impl Service<http::Request<()>> for Api {
/// #     type Response = http::Response<()>;
/// #     type Error = std::convert::Infallible;
/// #     type Future = std::future::Ready<Result<http::Response<()>, std::convert::Infallible>>;
/// #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
/// #         std::task::Poll::Ready(Ok(()))
/// #     }
/// #     fn call(&mut self, _: http::Request<()>) -> Self::Future {
/// #         let response = http::Response::builder()
/// #             .header("x-ratelimit-remaining-tokens", "100")
/// #             .header("x-ratelimit-reset-tokens", "2s")
/// #             .body(())
/// #             .unwrap();
/// #         std::future::ready(Ok(response))
/// #     }
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct BudgetLayer<C: Clock = DefaultClock> {
    budget: Budget<C>,
    max_hold: Duration,
}

impl<C: Clock> BudgetLayer<C> {
    /// Books on `budget`, following responses with waits of at most 5 minutes.
    ///
    /// # Examples
    ///
    /// See [`BudgetLayer`].
    pub fn new(budget: Budget<C>) -> BudgetLayer<C> {
        BudgetLayer {
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
    /// use paceline::http::client::BudgetLayer;
    /// let budget = Budget::builder().rate("tokens", paceline::Quota::per_minute(1_000)).build()?;
    /// let layer = BudgetLayer::new(budget).max_hold(std::time::Duration::from_secs(30));
    /// # let _ = layer;
    /// # Ok::<(), paceline::budget::BuildError>(())
    /// ```
    pub fn max_hold(mut self, max: Duration) -> BudgetLayer<C> {
        self.max_hold = max;
        self
    }
}

impl<S, C: Clock> tower_layer::Layer<S> for BudgetLayer<C> {
    type Service = BudgetService<S, C>;

    fn layer(&self, inner: S) -> BudgetService<S, C> {
        BudgetService {
            inner,
            budget: self.budget.clone(),
            max_hold: self.max_hold,
        }
    }
}

/// The service [`BudgetLayer`] makes.
///
/// # Examples
///
/// See [`BudgetLayer`].
#[derive(Clone, Debug)]
pub struct BudgetService<S, C: Clock = DefaultClock> {
    inner: S,
    budget: Budget<C>,
    max_hold: Duration,
}

impl<S, B, R, C> tower_service::Service<Request<B>> for BudgetService<S, C>
where
    S: tower_service::Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
    C: Clock,
{
    type Response = Response<R>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let cost = request
            .extensions()
            .get::<Cost>()
            .cloned()
            .unwrap_or_default();
        let budget = self.budget.clone();
        let max_hold = self.max_hold;
        // The service that was made ready goes with the request (tower's rule).
        let clone = self.inner.clone();
        let mut inner = core::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let costs: Vec<(&str, u32)> = cost.0.iter().map(|(n, c)| (n.as_str(), *c)).collect();
            let turn = budget.acquire(&costs).await?;
            // An error drops the turn: it ends keeping its estimate.
            let mut response = inner.call(request).await.map_err(Into::into)?;
            budget.follow(&signal(response.status(), response.headers()), max_hold);
            response.extensions_mut().insert(Settle::of(turn));
            Ok(response)
        })
    }
}

/// What a response's status and fields say of each dimension, read now.
pub(super) fn signal(status: http::StatusCode, headers: &http::HeaderMap) -> DimensionSignal {
    let fields = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()));
    DimensionSignal::read(status.as_u16(), fields, SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::Quota;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower_layer::Layer;
    use tower_service::Service;

    /// A stand-in API: answers with `status` and `headers`, or fails; counts its calls.
    #[derive(Clone)]
    struct Api {
        status: u16,
        headers: Vec<(&'static str, &'static str)>,
        fail: bool,
        calls: Arc<AtomicUsize>,
    }

    impl Service<Request<()>> for Api {
        type Response = Response<()>;
        type Error = std::io::Error;
        type Future = core::future::Ready<Result<Response<()>, std::io::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            // Relaxed: a count read after the calls, on the same thread.
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.fail {
                return core::future::ready(Err(std::io::Error::other("down")));
            }
            let mut response = Response::builder().status(self.status);
            for (n, v) in &self.headers {
                response = response.header(*n, *v);
            }
            core::future::ready(Ok(response.body(()).unwrap()))
        }
    }

    fn setup(
        api: Api,
    ) -> (
        Budget<ManualClock>,
        ManualClock,
        BudgetService<Api, ManualClock>,
    ) {
        let clock = ManualClock::new();
        let budget = Budget::builder()
            .rate("requests", Quota::per_second(10))
            .rate("tokens", Quota::per_second(1_000))
            .in_flight(4)
            .clock(clock.clone())
            .build()
            .unwrap();
        let service = BudgetLayer::new(budget.clone())
            .max_hold(Duration::from_secs(1))
            .layer(api);
        (budget, clock, service)
    }

    fn api(status: u16, headers: Vec<(&'static str, &'static str)>, fail: bool) -> Api {
        Api {
            status,
            headers,
            fail,
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn with_cost(costs: &[(&str, u32)]) -> Request<()> {
        let mut request = Request::new(());
        request.extensions_mut().insert(Cost::of(costs));
        request
    }

    #[test]
    fn hostile_fields_hold_for_max_hold_at_most() {
        let hostile = vec![
            ("retry-after", "999999999"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "9999h"),
        ];
        let (budget, _clock, mut service) = setup(api(429, hostile, false));
        let response = futures::executor::block_on(service.call(with_cost(&[("tokens", 5)])));
        let response = response.unwrap();
        drop(response);
        assert_eq!(budget.in_flight(), 0, "dropped with the response");
        let wait = budget.wait_time(&[]).unwrap();
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        assert!(wait >= Duration::from_millis(999), "{wait:?}");
    }

    #[test]
    fn the_turn_comes_back_to_settle() {
        let (budget, _clock, mut service) = setup(api(200, vec![], false));
        let response =
            futures::executor::block_on(service.call(with_cost(&[("tokens", 800)]))).unwrap();
        assert_eq!(budget.remaining("tokens").unwrap(), 200);
        let turn = response.extensions().get::<Settle<ManualClock>>().unwrap();
        assert!(turn.settle(&[("images", 1)]).is_err(), "not a dimension");
        assert_eq!(turn.settle(&[("tokens", 100)]), Ok(true));
        assert_eq!(turn.settle(&[("tokens", 100)]), Ok(false));
        assert_eq!(budget.remaining("tokens").unwrap(), 900);
        assert_eq!(budget.in_flight(), 0);
    }

    #[test]
    fn a_failed_call_or_a_bad_cost_ends_with_nothing_held() {
        let down = api(200, vec![], true);
        let calls = Arc::clone(&down.calls);
        let (budget, _clock, mut service) = setup(down);
        let failed = futures::executor::block_on(service.call(with_cost(&[("tokens", 10)])));
        assert!(failed.is_err());
        assert_eq!(budget.in_flight(), 0);
        let bad = futures::executor::block_on(service.call(with_cost(&[("images", 1)])));
        assert!(bad.is_err());
        let over = futures::executor::block_on(service.call(with_cost(&[("tokens", 5_000)])));
        assert!(over.is_err());
        // Relaxed: read on the thread that made the calls.
        assert_eq!(calls.load(Ordering::Relaxed), 1, "bad costs are never sent");
        assert_eq!(budget.in_flight(), 0);
    }
}
