//! paceline's own server describes what it enforces: a client that follows its fields
//! exactly (sends at most what `RateLimit` says is left, spaces the rest `w / q` apart as
//! `RateLimit-Policy` says, waits out `Retry-After` or `t` when nothing is left) is never
//! refused, and the policy's `q / w` is within 1 % of the real rate, for bursts of 1 and
//! up. The layer runs on a manual clock, in process.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use paceline::clock::ManualClock;
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::Quota;
use tower::{Layer, ServiceExt};

struct Fields {
    status: u16,
    /// `q`, `w` of `RateLimit-Policy`.
    policy: (u64, u64),
    /// `r`, `t` of `RateLimit`.
    state: (u64, u64),
    retry_after: Option<u64>,
}

fn param(item: &str, key: &str) -> u64 {
    item.split(';')
        .find_map(|p| p.trim().strip_prefix(&format!("{key}=")))
        .unwrap()
        .parse()
        .unwrap()
}

async fn call(layer: &RateLimitLayer<ManualClock>) -> Fields {
    let service = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    let response = service
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let policy = text("ratelimit-policy").unwrap();
    let state = text("ratelimit").unwrap();
    Fields {
        status: response.status().as_u16(),
        policy: (param(&policy, "q"), param(&policy, "w")),
        state: (param(&state, "r"), param(&state, "t")),
        retry_after: text("retry-after").map(|v| v.parse().unwrap()),
    }
}

#[tokio::test]
async fn a_client_that_follows_the_fields_exactly_is_never_refused() {
    let every = |ms: u64, burst: u32| {
        Quota::try_new(1, Duration::from_millis(ms))
            .unwrap()
            .with_burst(burst)
    };
    for quota in [
        Quota::per_second(50).with_burst(1),
        Quota::per_second(50).with_burst(10),
        Quota::per_second(50).with_burst(50),
        Quota::per_second(2).with_burst(1),
        Quota::per_second(3).with_burst(2),
        Quota::per_second(10).with_burst(20),
        every(700, 1),
    ] {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(100));
        let layer = RateLimitLayer::<ManualClock>::default()
            .limit(Limit::with_clock(
                "api",
                quota,
                KeySource::global(),
                clock.clone(),
            ))
            .headers_on_success(true);
        // Idle: what is left is the burst, less this request.
        let first = call(&layer).await;
        assert_eq!(first.status, 200);
        let (q, w) = first.policy;
        let spacing = Duration::from_secs(w) / u32::try_from(q).unwrap();
        let real = quota.emission_interval();
        assert!(spacing >= real, "{quota:?}: {q}/{w} is above the rate");
        assert!(
            spacing.as_secs_f64() <= real.as_secs_f64() * 1.0101,
            "{quota:?}: {q}/{w} is more than 1 % below the rate"
        );
        // The rest of the burst at once, then the policy's spacing, for 200 requests.
        for _ in 0..first.state.0 {
            assert_eq!(call(&layer).await.status, 200, "{quota:?}");
        }
        for i in 0..200 {
            clock.advance(spacing);
            let fields = call(&layer).await;
            assert_eq!(fields.status, 200, "{quota:?}: request {i} refused");
            assert_eq!(fields.retry_after, None);
        }
    }
}

#[tokio::test]
async fn retry_after_and_t_are_never_shorter_than_the_wait() {
    for quota in [
        Quota::per_second(2).with_burst(1),
        Quota::per_second(50).with_burst(10),
        Quota::per_second(10).with_burst(20),
    ] {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(100));
        let layer = RateLimitLayer::<ManualClock>::default().limit(Limit::with_clock(
            "api",
            quota,
            KeySource::global(),
            clock.clone(),
        ));
        // Three requests every 37 ms (81/s), more than any of these allows.
        let mut refusals = 0;
        for i in 0..600 {
            let fields_or_ok = respond(&layer).await;
            if fields_or_ok.status() == 429 {
                refusals += 1;
                let header = |name: &str| fields_or_ok.headers()[name].to_str().unwrap().to_owned();
                let retry_after: u64 = header("retry-after").parse().unwrap();
                let t = param(&header("ratelimit"), "t");
                assert!(
                    t >= retry_after,
                    "{quota:?}: t={t} < Retry-After {retry_after}"
                );
                // A client that waits Retry-After is admitted.
                clock.advance(Duration::from_secs(retry_after));
                assert_eq!(call_with(&layer).await, 200, "{quota:?}");
            }
            if i % 3 == 2 {
                clock.advance(Duration::from_millis(37));
            }
        }
        assert!(refusals > 0, "{quota:?}: nothing refused, nothing shown");
    }
}

/// The answer of `layer` around an empty `200` to a `GET /`.
async fn respond(layer: &RateLimitLayer<ManualClock>) -> Response<Body> {
    let service = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    service
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap()
}

async fn call_with(layer: &RateLimitLayer<ManualClock>) -> u16 {
    respond(layer).await.status().as_u16()
}
