//! Deciding a request's head without a tower service: what [`RateLimit`]'s `call` decides,
//! as a value, for any server that is not a tower stack (hyper on its own, actix, a
//! binding in another language): admit (with the fields to add), refuse (with the
//! response to send), or wait for a booked turn.

use super::*;

use core::sync::atomic::{AtomicBool, Ordering};

/// What a [`RateLimitLayer`] decided for a request ([`RateLimitLayer::decide`]).
///
/// # Examples
///
/// ```
/// use paceline::http::{Decision, Head, KeySource, Limit, RateLimitLayer};
/// use paceline::Quota;
///
/// let layer = RateLimitLayer::new().limit(Limit::new("global", Quota::per_hour(1), KeySource::global()));
/// let request = http::Request::get("/").body(()).unwrap();
/// assert!(matches!(layer.decide::<String>(&Head::of(&request)), Decision::Admit(_)));
/// match layer.decide::<String>(&Head::of(&request)) {
///     Decision::Refuse(refused) => {
///         assert_eq!(refused.response().status(), 429);
///         assert_eq!(refused.limit(), Some("global"));
///     }
///     _ => unreachable!(),
/// }
/// ```
#[derive(Debug)]
pub enum Decision<R> {
    /// Pass the request on.
    Admit(Admitted),
    /// Answer it with this refusal.
    Refuse(Refused<R>),
    /// Wait mode ([`RateLimitLayer::wait_up_to`]): its turn is booked; await this (or drop
    /// it to give the turn back) for the decision.
    Wait(Waiting<R>),
}

/// An admitted request: the fields to add to its response, when the layer puts them on
/// responses that passed ([`RateLimitLayer::headers_on_success`]).
///
/// # Examples
///
/// ```
/// use paceline::http::{Decision, Head, KeySource, Limit, RateLimitLayer};
/// use paceline::Quota;
///
/// let layer = RateLimitLayer::new()
///     .limit(Limit::new("global", Quota::per_second(5), KeySource::global()))
///     .headers_on_success(true);
/// let request = http::Request::get("/").body(()).unwrap();
/// let Decision::Admit(admitted) = layer.decide::<String>(&Head::of(&request)) else { panic!() };
/// assert_eq!(admitted.fields().unwrap()["ratelimit"], "\"global\";r=4;t=1");
/// ```
#[derive(Debug, Default)]
pub struct Admitted {
    fields: Option<http::HeaderMap>,
}

impl Admitted {
    /// The `RateLimit-Policy` / `RateLimit` fields (and the legacy ones, if asked for) to
    /// add to the response; `None` when the layer adds none to responses that passed.
    pub fn fields(&self) -> Option<&http::HeaderMap> {
        self.fields.as_ref()
    }

    /// The fields, owned.
    pub fn into_fields(self) -> Option<http::HeaderMap> {
        self.fields
    }
}

/// A refused request: the response to send, and why.
///
/// # Examples
///
/// ```
/// use paceline::http::{Decision, Head, KeySource, Limit, RateLimitLayer};
/// use paceline::Quota;
///
/// let layer = RateLimitLayer::new().limit(Limit::new("api", Quota::per_minute(1), KeySource::global()));
/// let request = http::Request::get("/").body(()).unwrap();
/// let _ = layer.decide::<String>(&Head::of(&request));
/// let Decision::Refuse(refused) = layer.decide::<String>(&Head::of(&request)) else { panic!() };
/// assert_eq!(refused.response().headers()["retry-after"], "60");
/// assert!(refused.wait().as_secs() > 58 && !refused.is_table_full());
/// ```
#[derive(Debug)]
pub struct Refused<R> {
    response: Response<R>,
    limit: Option<Arc<str>>,
    wait: Duration,
    table_full: bool,
}

impl<R> Refused<R> {
    /// The response: `429` (or gRPC `RESOURCE_EXHAUSTED`) with `Retry-After` and the
    /// `RateLimit` fields, `503` for a client a key table had no room for, or the status
    /// configured for a request without a key ([`MissingKey`]).
    pub fn response(&self) -> &Response<R> {
        &self.response
    }

    /// The response, owned.
    pub fn into_response(self) -> Response<R> {
        self.response
    }

    /// The limit that admits the request last (`None` for a request without a key).
    pub fn limit(&self) -> Option<&str> {
        self.limit.as_deref()
    }

    /// How long until the request would be admitted (zero for a request without a key).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether it was refused because a limit's key table had no room for a new client
    /// (the `503`), not because the client spent its quota.
    pub fn is_table_full(&self) -> bool {
        self.table_full
    }
}

/// A request waiting for its booked turn (wait mode): resolves to the request's decision,
/// admitted or refused. Dropped before then, it gives back every turn it booked.
#[must_use = "dropping the wait gives its booked turns back"]
pub struct Waiting<R> {
    future: Pin<Box<dyn Future<Output = Result<Admitted, Refused<R>>> + Send>>,
    /// Set by [`Waiting::book`] for the poll it makes (the future reads it once its
    /// turns are booked).
    hold: Arc<AtomicBool>,
}

/// A request's own bound on its wait, in its extensions: the layer waits at most this
/// long for the request (or [`RateLimitLayer::wait_up_to`], if shorter). For a server
/// that spent part of a request's deadline before asking the layer (an async key
/// function, a step of its own): it passes what is left.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paceline::http::{Decision, Head, KeySource, Limit, RateLimitLayer, WaitWithin};
/// use paceline::Quota;
///
/// let layer = RateLimitLayer::new()
///     .limit(Limit::new("slow", Quota::per_second(1).with_burst(1), KeySource::global()))
///     .wait_up_to(Duration::from_secs(5));
/// let mut request = http::Request::get("/").body(()).unwrap();
/// let Decision::Wait(first) = layer.decide::<String>(&Head::of(&request)) else { panic!() };
/// drop(futures::executor::block_on(first));
/// // The next turn is a second away: past what is left of this request's deadline.
/// request.extensions_mut().insert(WaitWithin(Duration::from_millis(100)));
/// let Decision::Wait(late) = layer.decide::<String>(&Head::of(&request)) else { panic!() };
/// assert!(futures::executor::block_on(late).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitWithin(pub Duration);

impl<R> Waiting<R> {
    /// Books every limit's turn (what the first poll does) without taking any yet:
    /// `Pending` once they are booked, even when all are due now, or `Ready` with the
    /// refusal when a limit's turn is too far. Dropped after this, the request gives every
    /// turn back, the cells admitted at once included; polled again (awaited), it takes
    /// them when the last is due. For a server that must also book turns elsewhere (a
    /// limit kept in Redis) before it commits to this request.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paceline::http::{Decision, Head, KeySource, Limit, RateLimitLayer};
    /// use paceline::Quota;
    ///
    /// let layer = RateLimitLayer::new()
    ///     .limit(Limit::new("one", Quota::per_hour(1), KeySource::global()))
    ///     .wait_up_to(Duration::from_secs(1));
    /// let request = http::Request::get("/").body(()).unwrap();
    /// let waker = futures::task::noop_waker();
    /// let mut cx = std::task::Context::from_waker(&waker);
    /// let Decision::Wait(mut held) = layer.decide::<String>(&Head::of(&request)) else { panic!() };
    /// assert!(std::pin::Pin::new(&mut held).book(&mut cx).is_pending());
    /// drop(held); // the cell taken at once is given back
    /// let Decision::Wait(again) = layer.decide::<String>(&Head::of(&request)) else { panic!() };
    /// assert!(futures::executor::block_on(again).is_ok());
    /// ```
    pub fn book(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Admitted, Refused<R>>> {
        // Relaxed: set and read on this thread, within this poll; it publishes nothing.
        self.hold.store(true, Ordering::Relaxed);
        let outcome = self.future.as_mut().poll(cx);
        // A refusal ends before the flag is read: it must not hold a later poll.
        self.hold.store(false, Ordering::Relaxed);
        outcome
    }
}

impl<R> fmt::Debug for Waiting<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiting").finish_non_exhaustive()
    }
}

impl<R> Future for Waiting<R> {
    type Output = Result<Admitted, Refused<R>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.future.as_mut().poll(cx)
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// Decides a request from its head, as the layer's service does before it calls yours
    /// (the same limits, keys, exemptions, fields and refusals): for servers and bindings
    /// that are not tower stacks. Put the peer address in the head's extensions as a
    /// `SocketAddr` (or a [`PeerName`] for a peer that has no IP address).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::http::{Decision, Head, KeySource, Limit, RateLimitLayer};
    /// use paceline::Quota;
    ///
    /// let layer = RateLimitLayer::new()
    ///     .limit(Limit::new("per-ip", Quota::per_minute(2), KeySource::peer_ip()));
    /// let mut request = http::Request::get("/").body(()).unwrap();
    /// request.extensions_mut().insert("203.0.113.7:40000".parse::<std::net::SocketAddr>().unwrap());
    /// let statuses: Vec<u16> = (0..3)
    ///     .map(|_| match layer.decide::<String>(&Head::of(&request)) {
    ///         Decision::Admit(_) => 200,
    ///         Decision::Refuse(refused) => refused.response().status().as_u16(),
    ///         Decision::Wait(_) => unreachable!("no wait mode"),
    ///     })
    ///     .collect();
    /// assert_eq!(statuses, [200, 200, 429]);
    /// ```
    pub fn decide<R: RefusalBody + Send + 'static>(&self, head: &Head<'_>) -> Decision<R> {
        let config = &*self.config;
        let exempt = match &config.exempt {
            None => head.method() == http::Method::OPTIONS,
            Some(exempt) => exempt(head),
        };
        if exempt {
            return Decision::Admit(Admitted::default());
        }
        if config.wait_up_to.is_some() {
            return self.decide_waiting(head);
        }
        match admit_now(config, head) {
            Ok(()) => Decision::Admit(Admitted {
                fields: success_fields(config, head),
            }),
            Err(why) => Decision::Refuse(refusal_of(config, head, &why)),
        }
    }

    /// [`RateLimitLayer::decide`] in wait mode.
    fn decide_waiting<R: RefusalBody + Send + 'static>(&self, head: &Head<'_>) -> Decision<R> {
        let keys = match keys(&self.config, head) {
            Ok(keys) => keys,
            Err(why) => {
                return Decision::Refuse(refusal_of(&self.config, head, &Refusal::MissingKey(why)))
            }
        };
        let config = Arc::clone(&self.config);
        let grpc = grpc(head);
        let costs = costs(&config, head);
        let mut max = config.wait_up_to.unwrap_or_default();
        if let Some(within) = head.extensions().get::<WaitWithin>() {
            max = max.min(within.0);
        }
        let hold = Arc::new(AtomicBool::new(false));
        let held = Arc::clone(&hold);
        Decision::Wait(Waiting {
            hold,
            future: Box::pin(async move {
                match admit_waiting(&config, &keys, &costs, max, Some(&held)).await {
                    Ok(()) => Ok(Admitted {
                        fields: config.headers_on_success.then(|| {
                            let mut fields = http::HeaderMap::new();
                            put_fields(&config, config.limits.iter().zip(&keys), &mut fields);
                            fields
                        }),
                    }),
                    Err(why) => Err(waiting_refusal(&config, &keys, grpc, &why)),
                }
            }),
        })
    }
}

/// The refusal of a waiting request, from its keys (wait mode reads them before it waits).
pub(super) fn waiting_refusal<C: Clock, R: RefusalBody>(
    config: &Config<C>,
    keys: &[Option<ClientKey>],
    grpc: bool,
    why: &Refusal,
) -> Refused<R> {
    let refused = match why {
        Refusal::MissingKey(missing) => {
            return Refused {
                response: plain_refusal(missing),
                limit: None,
                wait: Duration::ZERO,
                table_full: false,
            }
        }
        Refusal::Limited(refused) => *refused,
        Refusal::LimitedOne(one) => RefusedBy {
            limit: 0,
            wait: one.snapshot().until_next(),
            table_full: !one.spent,
        },
    };
    let states = states(config, keys);
    let longest = if refused.table_full {
        refused
    } else {
        longest_wait(&states, refused)
    };
    Refused {
        response: refusal(config, &states, grpc, refused),
        limit: Some(Arc::clone(&config.limits[longest.limit].name)),
        wait: longest.wait,
        table_full: refused.table_full,
    }
}

/// The fields an admitted request's response gets, when the layer adds them.
pub(super) fn success_fields<C: Clock>(
    config: &Config<C>,
    head: &Head<'_>,
) -> Option<http::HeaderMap> {
    config.headers_on_success.then(|| {
        let mut fields = http::HeaderMap::new();
        if let Ok(keys) = keys(config, head) {
            put_fields(config, config.limits.iter().zip(&keys), &mut fields);
        }
        fields
    })
}

/// A refusal as a value: the response the layer's service would send, and why.
fn refusal_of<C: Clock, R: RefusalBody>(
    config: &Config<C>,
    head: &Head<'_>,
    why: &Refusal,
) -> Refused<R> {
    let grpc = grpc(head);
    match why {
        Refusal::MissingKey(missing) => Refused {
            response: plain_refusal(missing),
            limit: None,
            wait: Duration::ZERO,
            table_full: false,
        },
        Refusal::Limited(refused) => {
            let keys = keys(config, head).unwrap_or_default();
            let states = states(config, &keys);
            let longest = if refused.table_full {
                *refused
            } else {
                longest_wait(&states, *refused)
            };
            Refused {
                response: refusal(config, &states, grpc, *refused),
                limit: Some(Arc::clone(&config.limits[longest.limit].name)),
                wait: longest.wait,
                table_full: refused.table_full,
            }
        }
        Refusal::LimitedOne(one) => {
            let state = one.snapshot();
            let refused = RefusedBy {
                limit: 0,
                wait: state.until_next(),
                table_full: !one.spent,
            };
            let response = match usual_limit(config).and_then(|p| p.refused(one)) {
                Some(cached) if !grpc => cached.response(),
                _ => refusal(config, &[Some(state)], grpc, refused),
            };
            Refused {
                response,
                limit: Some(Arc::clone(&config.limits[0].name)),
                wait: refused.wait,
                table_full: refused.table_full,
            }
        }
    }
}
