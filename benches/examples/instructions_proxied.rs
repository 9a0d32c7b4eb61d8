//! Instruction counts of the HTTP layer's per-request path beside tower-governor's, for
//! a server behind a proxy that names clients in `X-Forwarded-For` (see
//! `benches/instructions/harness.rs`).

use std::cell::RefCell;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use http::{Request, Response};
use tower::{Layer, Service};

use harness::next_key;

#[path = "../instructions/harness.rs"]
mod harness;
use harness::Op;

fn workload(name: &str) -> Option<Op> {
    let op: Op = match name {
        // The same behind a proxy: the peer is the proxy (127.0.0.1) and the client is
        // named in `X-Forwarded-For`, as in `benches/http_e2e.rs`. paceline trusts the
        // proxy's address; tower-governor's `SmartIpKeyExtractor` reads the header.
        "http_proxied/bare" => http_call(tower::layer::util::Identity::new(), true),
        "http_proxied/paceline" => http_call(
            paceline_layer(paceline::http::KeySource::behind_proxies(["127.0.0.1/32"
                .parse()
                .expect("a network")])),
            true,
        ),
        "http_proxied/governor" => http_call(
            tower_governor::GovernorLayer::new(
                tower_governor::governor::GovernorConfigBuilder::default()
                    .per_nanosecond(1_000)
                    .burst_size(1_000_000)
                    .key_extractor(tower_governor::key_extractor::SmartIpKeyExtractor)
                    .finish()
                    .expect("a valid tower-governor config"),
            ),
            true,
        ),
        _ => return None,
    };
    Some(op)
}

/// paceline's layer with one generous limit (every request admitted), keyed by `source`.
fn paceline_layer(source: paceline::http::KeySource) -> paceline::http::RateLimitLayer {
    paceline::http::RateLimitLayer::new().limit(paceline::http::Limit::new(
        "per-ip",
        paceline::Quota::per_second(1_000_000).with_burst(1_000_000),
        source,
    ))
}

/// One request through `layer` around a service that answers at once: from one of 10 000
/// client addresses, directly or (`proxied`) named by a proxy's `X-Forwarded-For`.
fn http_call<L>(layer: L, proxied: bool) -> Op
where
    L: Layer<tower::util::ServiceFn<fn(Request<Body>) -> Answer>> + 'static,
    L::Service: Service<Request<Body>, Response = Response<Body>> + 'static,
{
    fn answer(_: Request<Body>) -> Answer {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
    let service = RefCell::new(layer.layer(tower::service_fn(answer as fn(_) -> _)));
    let key = next_key();
    Box::new(move || {
        let client = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + key() as u32));
        let mut request = Request::new(Body::empty());
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

type Answer = std::future::Ready<Result<Response<Body>, std::convert::Infallible>>;

fn main() {
    harness::main(
        &[
            "http_proxied/bare",
            "http_proxied/paceline",
            "http_proxied/governor",
        ],
        workload,
    );
}
