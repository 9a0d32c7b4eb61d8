//! The hot paths' instruction counts, paceline beside governor, for callgrind.
//!
//! `instructions WORKLOAD ITERATIONS` runs one workload's operation ITERATIONS times
//! inside `measured`, which `benches/instructions.sh` has callgrind count alone
//! (`--collect-atstart=no --toggle-collect=instructions::measured`): the count divided by ITERATIONS
//! is the instructions one operation costs, the same on every run of the same build.
//! `instructions list` prints the workloads.

use std::cell::RefCell;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use http::{Request, Response};
use tower::{Layer, Service};

/// Runs `op` `iterations` times: the only code callgrind counts.
#[inline(never)]
fn measured(op: &dyn Fn() -> bool, iterations: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..iterations {
        admitted += u64::from(op());
    }
    admitted
}

type Op = Box<dyn Fn() -> bool>;

/// 10 000 client keys, visited in turn.
fn next_key() -> impl Fn() -> u64 {
    let next = std::cell::Cell::new(0u64);
    move || {
        let key = next.get();
        next.set((key + 1) % 10_000);
        key
    }
}

fn workload(name: &str) -> Option<Op> {
    let max = NonZeroU32::MAX;
    let op: Op = match name {
        "check_allowed/paceline" => {
            let l =
                paceline::Limiter::new(paceline::Quota::per_second(u32::MAX).with_burst(u32::MAX));
            Box::new(move || l.check().is_ok())
        }
        "check_allowed/governor" => {
            let l =
                governor::RateLimiter::direct(governor::Quota::per_second(max).allow_burst(max));
            Box::new(move || l.check().is_ok())
        }
        "check_denied/paceline" => {
            let l = paceline::Limiter::new(paceline::Quota::per_hour(1));
            l.check().unwrap();
            Box::new(move || l.check().is_ok())
        }
        "check_denied/governor" => {
            let l = governor::RateLimiter::direct(governor::Quota::per_hour(NonZeroU32::MIN));
            l.check().unwrap();
            Box::new(move || l.check().is_ok())
        }
        "check_n_allowed/paceline" => {
            let l =
                paceline::Limiter::new(paceline::Quota::per_second(u32::MAX).with_burst(u32::MAX));
            Box::new(move || l.check_n(3).is_ok())
        }
        "check_n_allowed/governor" => {
            let l =
                governor::RateLimiter::direct(governor::Quota::per_second(max).allow_burst(max));
            let three = NonZeroU32::new(3).unwrap();
            Box::new(move || matches!(l.check_n(three), Ok(Ok(()))))
        }
        // The floor: one clock read (quanta, which both limiters use) and one
        // compare-and-swap on a word of its own; what any exact clock-driven check pays.
        "floor/clock_and_cas" => {
            let clock = quanta::Clock::new();
            let start = clock.raw();
            let word = std::sync::atomic::AtomicU64::new(0);
            Box::new(move || {
                let now = clock.delta_as_nanos(start, clock.raw());
                let seen = word.load(std::sync::atomic::Ordering::Relaxed);
                word.compare_exchange(
                    seen,
                    now.max(seen) + 1,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
            })
        }
        "floor/default_clock" => {
            use paceline::clock::Clock;
            let clock = paceline::clock::DefaultClock::default();
            Box::new(move || black_box(clock.now()) > 0)
        }
        "remaining/paceline" => {
            let l = paceline::Limiter::new(paceline::Quota::per_second(100));
            Box::new(move || black_box(l.remaining()) > 0)
        }
        "check_key_under_limit/paceline" => {
            let l = paceline::KeyedLimiter::new(
                paceline::Quota::per_second(u32::MAX).with_burst(u32::MAX),
            );
            let key = next_key();
            Box::new(move || l.check_key(&key()).is_ok())
        }
        "check_key_under_limit/governor" => {
            let l = governor::RateLimiter::keyed(governor::Quota::per_second(max).allow_burst(max));
            let key = next_key();
            Box::new(move || l.check_key(&key()).is_ok())
        }
        "check_key_limited/paceline" => {
            let l = paceline::KeyedLimiter::new(paceline::Quota::per_hour(1));
            let key = next_key();
            for _ in 0..10_000 {
                let _ = l.check_key(&key());
            }
            Box::new(move || l.check_key(&key()).is_ok())
        }
        "check_key_limited/governor" => {
            let l = governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::MIN));
            let key = next_key();
            for _ in 0..10_000 {
                let _ = l.check_key(&key());
            }
            Box::new(move || l.check_key(&key()).is_ok())
        }
        // The HTTP layer's per-request path: a request from one of 10 000 client
        // addresses (axum's `ConnectInfo`, which both layers read) through the layer to a
        // service that answers at once. `http_call/bare`
        // is the same service without a layer; each layer's cost is its count minus that.
        "http_call/bare" => http_call(tower::layer::util::Identity::new()),
        "http_call/paceline" => http_call(paceline::http::RateLimitLayer::new().limit(
            paceline::http::Limit::new(
                "per-ip",
                paceline::Quota::per_second(1_000_000).with_burst(1_000_000),
                paceline::http::KeySource::peer_ip(),
            ),
        )),
        "http_call/governor" => http_call(tower_governor::GovernorLayer::new(
            tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1_000)
                .burst_size(1_000_000)
                .finish()
                .expect("a valid tower-governor config"),
        )),
        _ => return None,
    };
    Some(op)
}

/// One request through `layer` around a service that answers at once.
fn http_call<L>(layer: L) -> Op
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
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::new(client, 40_000)));
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

const WORKLOADS: &[&str] = &[
    "check_allowed/paceline",
    "check_allowed/governor",
    "check_denied/paceline",
    "check_denied/governor",
    "check_n_allowed/paceline",
    "check_n_allowed/governor",
    "remaining/paceline",
    "floor/clock_and_cas",
    "floor/default_clock",
    "check_key_under_limit/paceline",
    "check_key_under_limit/governor",
    "check_key_limited/paceline",
    "check_key_limited/governor",
    "http_call/bare",
    "http_call/paceline",
    "http_call/governor",
];

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_default();
    if name == "list" {
        for workload in WORKLOADS {
            println!("{workload}");
        }
        return;
    }
    let iterations: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let Some(op) = workload(&name) else {
        eprintln!("unknown workload {name:?}; `instructions list` names them");
        std::process::exit(2);
    };
    // Warm up outside the count: first-use initialisation (the clock's calibration, the
    // keyed table's growth to hold every key) is not the hot path.
    warm_up(&*op);
    let admitted = measured(&*op, iterations);
    println!("{name}: {admitted} of {iterations} admitted");
}

/// The warm-up: the same operation, not counted.
#[inline(never)]
fn warm_up(op: &dyn Fn() -> bool) {
    for _ in 0..20_000 {
        black_box(op());
    }
}
