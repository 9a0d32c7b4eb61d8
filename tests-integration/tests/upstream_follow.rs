//! What the client layers make of each thing an upstream may say, against the fake
//! upstream of `support/fake_upstream.rs` on loopback (a real axum server, real hyper and
//! reqwest clients). Each test sets the upstream's behaviour, makes a few requests and
//! looks at what the upstream saw and when, or at the hold the client took.

use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;
use paceline::http::client::{PaceLayer, PaceMiddleware};
use paceline::upstream::FollowerConfig;
use paceline::Quota;
use tower::{Service, ServiceBuilder, ServiceExt};

#[path = "support/fake_upstream.rs"]
mod fake_upstream;
#[path = "support/http_server.rs"]
mod http_server;

use fake_upstream::{measure, Behavior, Fields, Upstream};

fn too_fast() -> Quota {
    Quota::per_second(100).with_burst(1)
}

fn middleware_client(layer: &PaceLayer) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PaceMiddleware::new(layer.clone()))
        .build()
}

/// 300 GETs of `upstream` from `tasks` tasks, through a client [`too_fast`] for it: all
/// answered, at most 3 % refused on the way, in the time 300 take at the 50/s the
/// upstream announces, and the first hold.
async fn three_hundred_at_fifty_per_second(upstream: &Upstream, tasks: usize) {
    let client = middleware_client(&PaceLayer::new(too_fast()));
    let (statuses, elapsed) = calls(
        &client,
        &upstream.url(),
        300,
        tasks,
        Duration::from_secs(30),
    )
    .await;
    assert!(statuses.iter().all(|s| *s == 200));
    let (refused, _) = measure(&upstream.take_log());
    assert!(refused <= 0.03, "{refused}");
    assert!(
        elapsed < Duration::from_secs_f64(300.0 / 50.0 / 0.9 + 1.5),
        "{elapsed:?}"
    );
}

/// `count` GETs of `url` from `tasks` tasks; the statuses, and how long they took. Fails
/// after `limit`.
async fn calls(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    count: usize,
    tasks: usize,
    limit: Duration,
) -> (Vec<u16>, Duration) {
    let started = Instant::now();
    let work = (0..tasks).map(|i| {
        let (client, url) = (client.clone(), url.to_owned());
        let share = count / tasks + usize::from(i < count % tasks);
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..share {
                let response = client.get(&url).send().await.unwrap();
                statuses.push(response.status().as_u16());
            }
            statuses
        })
    });
    let all = tokio::time::timeout(limit, futures::future::join_all(work))
        .await
        .expect("the calls took longer than the test allows");
    let statuses = all.into_iter().flat_map(Result::unwrap).collect();
    (statuses, started.elapsed())
}

fn policy(value: &str) -> Behavior {
    Behavior {
        policy: Some(value.to_owned()),
        ..Behavior::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_announced_window_never_parks_the_client() {
    let upstream = Upstream::start(policy("\"p\";q=1;w=1000000000")).await;
    let client = middleware_client(&PaceLayer::new(too_fast()));
    let (statuses, elapsed) = calls(&client, &upstream.url(), 3, 1, Duration::from_secs(10)).await;
    assert_eq!(statuses, [200; 3]);
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_pace_never_spaces_turns_past_max_hold() {
    let upstream = Upstream::start(policy("\"p\";q=1;w=30")).await;
    let layer = PaceLayer::with_config(
        too_fast(),
        FollowerConfig::default().max_hold(Duration::from_secs(1)),
    );
    let client = middleware_client(&layer);
    let (statuses, elapsed) = calls(&client, &upstream.url(), 4, 1, Duration::from_secs(10)).await;
    assert_eq!(statuses, [200; 4]);
    // Three turns at most 1 s apart (one request per 30 s was announced).
    assert!(elapsed > Duration::from_millis(1500), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(4500), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_policies_pace_by_the_shortest_window() {
    let upstream = Upstream::start(policy("\"burst\";q=10;w=1, \"daily\";q=1000;w=86400")).await;
    let client = middleware_client(&PaceLayer::new(too_fast()));
    let (statuses, elapsed) = calls(&client, &upstream.url(), 20, 5, Duration::from_secs(10)).await;
    assert_eq!(statuses, [200; 20]);
    // About 10 per second after the first response (not one per 86.4 s, nor 100/s).
    assert!(elapsed > Duration::from_millis(1500), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_announced_quota_brings_the_pace_back_up() {
    let upstream = Upstream::start(Behavior {
        rate: 20,
        burst: 1,
        ..Behavior::default()
    })
    .await;
    let client = middleware_client(&PaceLayer::new(too_fast()));
    calls(&client, &upstream.url(), 30, 5, Duration::from_secs(10)).await;
    upstream.set(Behavior {
        rate: 200,
        ..Behavior::default()
    });
    let (statuses, elapsed) =
        calls(&client, &upstream.url(), 100, 10, Duration::from_secs(10)).await;
    assert!(statuses.iter().all(|s| *s == 200));
    // Back to the configured 100/s: about 1 s (at the 20/s announced before, 5 s).
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_own_quota_change_is_kept() {
    let upstream = Upstream::start(Behavior::default()).await;
    let layer = PaceLayer::new(too_fast());
    let client = middleware_client(&layer);
    calls(&client, &upstream.url(), 5, 1, Duration::from_secs(10)).await;
    layer
        .limiter(&upstream.addr.to_string())
        .set_quota(Quota::per_second(10).with_burst(1));
    let (statuses, elapsed) = calls(&client, &upstream.url(), 20, 4, Duration::from_secs(10)).await;
    assert_eq!(statuses, [200; 20]);
    // 10/s, the caller's, though the upstream keeps announcing 50/s.
    assert!(elapsed > Duration::from_millis(1700), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_the_client_does_not_use_are_skipped() {
    let upstream = Upstream::start(policy(
        "\"default\";q=50;w=1;qu=\"request\";pk=:cHsxMjM0NQ==:",
    ))
    .await;
    three_hundred_at_fifty_per_second(&upstream, 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_date_retry_after_is_read_against_the_responses_date() {
    for skew in [-300, 300] {
        // Every request is refused: "come back at <the upstream's now + 2 s>", on a clock
        // `skew` seconds off ours.
        let upstream = Upstream::start(Behavior {
            refuse_all: Some(2),
            date_skew: Some(skew),
            fields: Fields::RetryAfter,
            ..Behavior::default()
        })
        .await;
        let layer = PaceLayer::new(too_fast());
        let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(PaceMiddleware::new(layer).retries(1))
            .build();
        let (statuses, _) = calls(&client, &upstream.url(), 1, 1, Duration::from_secs(10)).await;
        let seen = upstream.take_log();
        assert_eq!((statuses, seen.len()), (vec![429], 2));
        // The retry came after the 2 s hold, not at once (300 s behind) nor 300 s later.
        let gap = seen[1].0 - seen[0].0;
        assert!(
            gap > Duration::from_millis(1500) && gap < Duration::from_millis(3500),
            "{skew}: {gap:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_timeout_covers_the_wait_for_its_turn() {
    let upstream = Upstream::start(Behavior {
        refuse_all: Some(30),
        ..Behavior::default()
    })
    .await;
    let layer = PaceLayer::new(too_fast());
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PaceMiddleware::new(layer).retries(0))
        .build();
    let first = client.get(upstream.url()).send().await.unwrap();
    assert_eq!(first.status(), 429);
    let started = Instant::now();
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .get(upstream.url())
            .timeout(Duration::from_secs(1))
            .send(),
    )
    .await
    .expect("the request waited past its own timeout");
    assert!(second.is_err(), "{second:?}");
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booked_turns_move_to_a_lower_adopted_pace() {
    // 300 tasks book their turns at once, at 100/s; the policy the first refusal
    // announces must space them again at the upstream's pace.
    let upstream = Upstream::start(Behavior::default()).await;
    three_hundred_at_fifty_per_second(&upstream, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_on_one_host_never_holds_another_however_many_hosts_came_before() {
    let held = Upstream::start(Behavior {
        refuse_all: Some(60),
        ..Behavior::default()
    })
    .await;
    let other = Upstream::start(Behavior::default()).await;
    let layer = PaceLayer::new(too_fast());
    for i in 0..10_001 {
        layer.limiter(&format!("host-{i}.example:80"));
    }
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PaceMiddleware::new(layer.clone()).retries(0))
        .build();
    assert_eq!(client.get(held.url()).send().await.unwrap().status(), 429);
    let (statuses, elapsed) = calls(&client, &other.url(), 2, 1, Duration::from_secs(10)).await;
    assert_eq!(statuses, [200, 200]);
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_is_one_limiter_whether_its_default_port_is_written_or_not() {
    // Needs port 80 on loopback (CI runs as root); elsewhere there is nothing to show.
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:80") else {
        eprintln!("port 80 is not ours: skipped");
        return;
    };
    drop(listener);
    let upstream = Upstream::start_on(
        "127.0.0.1:80",
        Behavior {
            refuse_all: Some(5),
            ..Behavior::default()
        },
    )
    .await;
    let layer = PaceLayer::new(too_fast());
    let mut client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(http_server::client());
    let request = http::Request::get("http://127.0.0.1:80/")
        .body(Body::empty())
        .unwrap();
    let response = client.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.status(), 429);
    let _ = response.into_body().collect().await;
    // The hold is on the host however the next request writes it, through either layer.
    let started = Instant::now();
    let request = http::Request::get("http://127.0.0.1/")
        .body(Body::empty())
        .unwrap();
    let call = client.ready().await.unwrap().call(request);
    assert!(tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .is_err());
    let middleware = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PaceMiddleware::new(layer).retries(0))
        .build();
    let call = middleware.get("http://127.0.0.1/").send();
    assert!(tokio::time::timeout(Duration::from_secs(1), call)
        .await
        .is_err());
    assert!(started.elapsed() >= Duration::from_secs(3));
    let _ = upstream;
}

/// The hold a client takes from one refusal carrying `fields`.
async fn hold_from(fields: &[(&str, &str)], status_200: bool) -> Duration {
    let behavior = Behavior {
        fields: Fields::Bare,
        refuse_all: (!status_200).then_some(1),
        refusal_extra: fields
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        extra: if status_200 {
            fields
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        } else {
            Vec::new()
        },
        ..Behavior::default()
    };
    let upstream = Upstream::start(behavior).await;
    let layer = PaceLayer::with_config(
        too_fast(),
        FollowerConfig::default().max_hold(Duration::from_secs(2)),
    );
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(PaceMiddleware::new(layer.clone()).retries(0))
        .build();
    client.get(upstream.url()).send().await.unwrap();
    layer.limiter(&upstream.addr.to_string()).peek()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_values_are_read_as_meant() {
    let secs = |d: Duration| d.as_secs_f64();
    // Two Retry-After fields: the longest one readable counts (capped at max_hold).
    let two = hold_from(&[("retry-after", "60"), ("retry-after", "soon")], false).await;
    assert!((1.9..=2.0).contains(&secs(two)), "{two:?}");
    // 16 digits: capped like any long hold.
    let long = hold_from(&[("retry-after", "9999999999999999")], false).await;
    assert!((1.9..=2.0).contains(&secs(long)), "{long:?}");
    // Decimal seconds.
    let decimal = hold_from(&[("retry-after", "1.5")], false).await;
    assert!((1.4..=1.5).contains(&secs(decimal)), "{decimal:?}");
    // No 31 February: ignored, so no hold.
    let feb = hold_from(&[("retry-after", "Mon, 31 Feb 2099 00:00:00 GMT")], false).await;
    assert!(feb < Duration::from_millis(100), "{feb:?}");
    // A reset in Unix milliseconds, 1.5 s away.
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + Duration::from_millis(1500);
    let millis = at.as_millis().to_string();
    let epoch_ms = hold_from(
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &millis),
        ],
        true,
    )
    .await;
    assert!((1.2..=1.5).contains(&secs(epoch_ms)), "{epoch_ms:?}");
    // The draft-07 RateLimit field.
    let draft7 = hold_from(&[("ratelimit", "limit=10, remaining=0, reset=2")], true).await;
    assert!((1.9..=2.0).contains(&secs(draft7)), "{draft7:?}");
}
