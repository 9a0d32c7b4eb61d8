//! The HTTP families' request: one from one of 10 000 client addresses through a layer to
//! a service that answers at once (see `harness.rs`).

use std::cell::RefCell;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower::{Layer, Service};

use super::harness::{next_key, Op};

/// paceline's layer with one generous limit (every request admitted), keyed by `source`,
/// on the [`Stepped`] clock.
pub fn paceline_layer(
    source: paceline::http::KeySource,
) -> paceline::http::RateLimitLayer<Stepped> {
    paceline_layer_on(source)
}

/// [`paceline_layer`] on a clock of the caller's choice.
pub fn paceline_layer_on<C: paceline::clock::Clock + Default>(
    source: paceline::http::KeySource,
) -> paceline::http::RateLimitLayer<C> {
    paceline::http::RateLimitLayer::default().limit(paceline::http::Limit::with_clock(
        "per-ip",
        paceline::Quota::per_second(1_000_000).with_burst(1_000_000),
        source,
        C::default(),
    ))
}

/// A clock for instruction counts that do not depend on how fast the run goes: each read
/// moves it on by [`Stepped::STEP`]. Under callgrind a request takes 50 to 100 times its
/// native time, so on the real clock 10 000 clients come back to the keyed table that much
/// more slowly than they would natively, and how often the table forgets and stores them
/// again would depend on the machine's load during the count. With this clock a request
/// takes as long as it does natively (a read or two per request), whatever the load. Its
/// read is an atomic add, a few instructions fewer than the default clock's
/// (`rdtsc` and a scale). `STEP` is the nanoseconds a read moves it on: 500 by default;
/// [`Returning`] is a slower pace.
#[derive(Clone, Default)]
pub struct Stepped<const STEP: u64 = 500>(std::sync::Arc<std::sync::atomic::AtomicU64>);

/// A clock at which each of the 10 000 clients comes back about every 0.8 s (40 µs a
/// read, two reads a request: a server at about 12 000 requests a second): slower than
/// the keyed table's sweeps, within the second for which a sweep keeps a client.
#[allow(dead_code)] // the proxied family's alone
pub type Returning = Stepped<40_000>;

/// A clock at which each of the 10 000 clients comes back about every 3 s (150 µs a
/// read): later than the second a sweep keeps a client, but a population with no new
/// client never makes the keyed table sweep, so they stay stored.
#[allow(dead_code)] // the proxied family's alone
pub type Sparse = Stepped<150_000>;

impl<const STEP: u64> paceline::clock::Clock for Stepped<STEP> {
    fn now(&self) -> u64 {
        // Relaxed: one thread reads it; it orders nothing.
        self.0
            .fetch_add(STEP, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(STEP)
    }

    fn wake_at(&self, _: u64, waker: std::task::Waker) {
        // Nothing in these workloads waits.
        waker.wake();
    }
}

/// paceline's layer with a spent limit: one request per client per minute, so after the
/// warm-up (two rounds of the 10 000 clients) every request is refused, with a wait of
/// under a minute (a flood against a per-second or per-minute limit). On the [`Stepped`]
/// clock.
pub fn paceline_refusing(
    source: paceline::http::KeySource,
) -> paceline::http::RateLimitLayer<Stepped> {
    paceline::http::RateLimitLayer::default().limit(paceline::http::Limit::with_clock(
        "per-ip",
        paceline::Quota::per_minute(1),
        source,
        Stepped::default(),
    ))
}

/// tower-governor's rate as spent: a cell a minute, bursts of one.
pub const GOVERNOR_SPENT: (std::time::Duration, u32) = (std::time::Duration::from_secs(60), 1);

/// tower-governor's rate as generous: a cell a microsecond, bursts of a million.
pub const GOVERNOR_GENEROUS: (std::time::Duration, u32) =
    (std::time::Duration::from_nanos(1_000), 1_000_000);

/// tower-governor's layer: one cell per `period`, bursts of `burst` ([`GOVERNOR_SPENT`],
/// [`GOVERNOR_GENEROUS`]), keyed by `extractor`.
pub fn governor_layer<K, B>(
    extractor: K,
    (period, burst): (std::time::Duration, u32),
) -> tower_governor::GovernorLayer<K, governor::middleware::NoOpMiddleware, B>
where
    K: tower_governor::key_extractor::KeyExtractor,
{
    tower_governor::GovernorLayer::new(
        tower_governor::governor::GovernorConfigBuilder::default()
            .period(period)
            .burst_size(burst)
            .key_extractor(extractor)
            .finish()
            .expect("a valid tower-governor config"),
    )
}

/// The direct-client workloads with bodies of type `B`: `bare` (no layer), `paceline`
/// and `governor`, each keyed by the peer address, every request admitted; and the same
/// flooded, every request refused (`-refused`), beside `floor-refused`, a service that
/// sends the same 429 itself. A layer's cost is its count minus `bare`'s, or for a
/// refusal minus the floor's.
#[allow(dead_code)] // the proxied family has no direct clients
pub fn direct<B>(who: &str) -> Option<Op>
where
    B: Default + paceline::http::RefusalBody + Send + 'static,
    Response<B>: From<tower_governor::GovernorError>,
{
    let by_peer = |rate| governor_layer(tower_governor::key_extractor::PeerIpKeyExtractor, rate);
    Some(match who {
        "bare" => call::<_, B>(tower::layer::util::Identity::new(), false),
        "paceline" => call::<_, B>(paceline_layer(paceline::http::KeySource::peer_ip()), false),
        "governor" => call::<_, B>(by_peer(GOVERNOR_GENEROUS), false),
        "paceline-refused" => call::<_, B>(
            paceline_refusing(paceline::http::KeySource::peer_ip()),
            false,
        ),
        "governor-refused" => call::<_, B>(by_peer(GOVERNOR_SPENT), false),
        "floor-refused" => call_answering::<_, B>(
            tower::layer::util::Identity::new(),
            false,
            refuse_with_fields::<B> as fn(_) -> _,
        ),
        _ => return None,
    })
}

/// The service's answer: an empty 200 at once.
pub type Answer<B> = std::future::Ready<Result<Response<B>, std::convert::Infallible>>;

/// The service behind the layer.
pub type Inner<B> = tower::util::ServiceFn<fn(Request<B>) -> Answer<B>>;

fn answer<B: Default>(_: Request<B>) -> Answer<B> {
    std::future::ready(Ok(Response::new(B::default())))
}

/// What any layer pays at least to refuse with the IETF fields: a 429 with the four
/// header fields paceline's refusal sends, the whole field map made once and cloned (the
/// cheapest way to send them: inserting the four into an empty map costs about twice as
/// much), and a body made once (no limit, no key, no decision).
fn refuse_with_fields<B: Default + paceline::http::RefusalBody>(_: Request<B>) -> Answer<B> {
    use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
    use std::sync::OnceLock;
    static FIELDS: OnceLock<HeaderMap> = OnceLock::new();
    static BODY: OnceLock<bytes::Bytes> = OnceLock::new();
    let fields = FIELDS.get_or_init(|| {
        const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
        const STATE: HeaderName = HeaderName::from_static("ratelimit");
        let mut fields = HeaderMap::with_capacity(4);
        fields.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        fields.insert(RETRY_AFTER, HeaderValue::from(60u64));
        fields.insert(POLICY, HeaderValue::from_static("\"per-ip\";q=1;w=60"));
        fields.insert(STATE, HeaderValue::from_static("\"per-ip\";r=0;t=60"));
        fields
    });
    let body = BODY.get_or_init(|| {
        bytes::Bytes::from_static(b"Too Many Requests: limit \"per-ip\", retry in 60 s\n")
    });
    let mut response = Response::new(B::from_bytes(body.clone()));
    *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    *response.headers_mut() = fields.clone();
    std::future::ready(Ok(response))
}

/// One request through `layer` around a service that answers at once: from one of 10 000
/// client addresses (axum's `ConnectInfo`, which both layers read), directly or
/// (`proxied`) named by a proxy's `X-Forwarded-For`, with bodies of type `B`.
pub fn call<L, B>(layer: L, proxied: bool) -> Op
where
    B: Default + 'static,
    L: Layer<Inner<B>> + 'static,
    L::Service: Service<Request<B>, Response = Response<B>> + 'static,
{
    call_answering(layer, proxied, answer::<B> as fn(_) -> _)
}

/// [`call`] around a service that answers with `answer`.
pub fn call_answering<L, B>(layer: L, proxied: bool, answer: fn(Request<B>) -> Answer<B>) -> Op
where
    B: Default + 'static,
    L: Layer<Inner<B>> + 'static,
    L::Service: Service<Request<B>, Response = Response<B>> + 'static,
{
    let service = RefCell::new(layer.layer(tower::service_fn(answer)));
    let key = next_key();
    Box::new(move || {
        let client = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + key() as u32));
        let mut request = Request::new(B::default());
        let peer = if proxied {
            let named = http::HeaderValue::try_from(client.to_string()).expect("an address");
            request.headers_mut().insert("x-forwarded-for", named);
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            client
        };
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::new(peer, 40_000)));
        let mut service = service.borrow_mut();
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(Ok(())) = service.poll_ready(&mut cx) else {
            return false;
        };
        let mut call = pin!(service.call(request));
        match call.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(response)) => response.status().is_success(),
            _ => false,
        }
    })
}
