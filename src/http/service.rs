//! The service the layer wraps around yours, and its response future.

use super::*;

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
    pub(super) inner: S,
    pub(super) config: Arc<Config<C>>,
}

impl<S, C: Clock> RateLimit<S, C> {
    /// The wrapped service.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::RateLimitLayer;
    /// use tower_layer::Layer;
    /// let limited = RateLimitLayer::new().layer(7u8);
    /// assert_eq!(*limited.get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::RateLimitLayer;
    /// use tower_layer::Layer;
    /// let mut limited = RateLimitLayer::new().layer(7u8);
    /// *limited.get_mut() += 1;
    /// assert_eq!(limited.into_inner(), 8);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::RateLimitLayer;
    /// use tower_layer::Layer;
    /// assert_eq!(RateLimitLayer::new().layer("svc").into_inner(), "svc");
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
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
        // The usual refusal, cached: its response is made when polled.
        Usual { refusal: Option<Arc<Cached>> },
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
            State::Refused { .. } | State::Usual { .. } => "ResponseFuture::Refused",
            State::Waiting { .. } => "ResponseFuture::Waiting",
        })
    }
}

impl<F, R, E> Future for ResponseFuture<F, R, E>
where
    F: Future<Output = Result<Response<R>, E>>,
    R: RefusalBody,
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
            Projected::Usual { refusal } => match refusal.take() {
                Some(refusal) => Poll::Ready(Ok(refusal.response())),
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
                let fields = super::decision::success_fields(config, &head).map(Box::new);
                ResponseFuture::admitted(self.inner.call(request), fields)
            }
            Err(why) => refuse(config, &head, &why),
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
                    let head = Head::of(&request);
                    let keys = match keys(&config, &head) {
                        Ok(keys) => keys,
                        Err(why) => return Ok(plain_refusal(&why)),
                    };
                    let costs = costs(&config, &head);
                    let grpc = grpc(&head);
                    let max = config.wait_up_to.unwrap_or_default();
                    if let Err(why) = admit_waiting(&config, &keys, &costs, max, None).await {
                        let refused =
                            super::decision::waiting_refusal::<C, R>(&config, &keys, grpc, &why);
                        return Ok(refused.into_response());
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
pub(super) fn refuse<C: Clock, F, R: RefusalBody, E>(
    config: &Config<C>,
    head: &Head<'_>,
    why: &Refusal,
) -> ResponseFuture<F, R, E> {
    match why {
        Refusal::LimitedOne(refused) => {
            match usual_limit(config).and_then(|p| p.refused(refused)) {
                Some(cached) if !grpc(head) => ResponseFuture {
                    state: State::Usual {
                        refusal: Some(Arc::clone(cached)),
                    },
                },
                _ => refuse_other(config, head, why),
            }
        }
        why => refuse_other(config, head, why),
    }
}

/// [`refuse`] for any but the usual refusal (out of line: it keeps `refuse`'s frame small).
#[inline(never)]
fn refuse_other<C: Clock, F, R: RefusalBody, E>(
    config: &Config<C>,
    head: &Head<'_>,
    why: &Refusal,
) -> ResponseFuture<F, R, E> {
    match why {
        Refusal::MissingKey(why) => ResponseFuture::refused(plain_refusal(why)),
        Refusal::Limited(refused) => {
            let keys = keys(config, head).unwrap_or_default();
            let states = states(config, &keys);
            ResponseFuture::refused(refusal(config, &states, grpc(head), *refused))
        }
        Refusal::LimitedOne(refused) => {
            let state = refused.snapshot();
            let refused = RefusedBy {
                limit: 0,
                wait: state.until_next(),
                table_full: !refused.spent,
            };
            ResponseFuture::refused(refusal(config, &[Some(state)], grpc(head), refused))
        }
    }
}
