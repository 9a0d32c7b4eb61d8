//! `stream::throttle`: a stream's items paced by a limiter, on a manual clock and on tokio,
//! several streams sharing one limiter in order.

use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use paceline::clock::ManualClock;
use paceline::{Limiter, Quota};

mod common;
use common::{quota, T};

#[test]
fn a_throttled_stream_is_paced_on_a_manual_clock() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(2), clock.clone());
    let mut items = pin!(paceline::stream::throttle(
        futures::stream::iter(0..5),
        &limiter
    ));
    let next = |items: &mut Pin<&mut paceline::stream::Throttled<'_, _, _>>| {
        items
            .as_mut()
            .poll_next(&mut Context::from_waker(Waker::noop()))
    };
    // The burst: two at once, then one per interval.
    assert_eq!(next(&mut items), Poll::Ready(Some(0)));
    assert_eq!(next(&mut items), Poll::Ready(Some(1)));
    assert_eq!(next(&mut items), Poll::Pending);
    assert_eq!(next(&mut items), Poll::Pending);
    clock.advance(T);
    assert_eq!(next(&mut items), Poll::Ready(Some(2)));
    assert_eq!(next(&mut items), Poll::Pending);
    clock.advance(T);
    assert_eq!(next(&mut items), Poll::Ready(Some(3)));
    clock.advance(T);
    assert_eq!(next(&mut items), Poll::Ready(Some(4)));
    assert_eq!(next(&mut items), Poll::Ready(None));
}

#[test]
fn throttled_streams_sharing_a_limiter_are_served_in_order() {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(quota(1), clock.clone());
    limiter.check().unwrap();
    let mut a = pin!(paceline::stream::throttle(
        futures::stream::iter(["a1", "a2"]),
        &limiter
    ));
    let mut b = pin!(paceline::stream::throttle(
        futures::stream::iter(["b1"]),
        &limiter
    ));
    let cx = &mut Context::from_waker(Waker::noop());
    assert_eq!(a.as_mut().poll_next(cx), Poll::Pending); // a1 books 100 ms
    assert_eq!(b.as_mut().poll_next(cx), Poll::Pending); // b1 books 200 ms
    clock.advance(T);
    assert_eq!(
        b.as_mut().poll_next(cx),
        Poll::Pending,
        "b1 may not overtake a1"
    );
    assert_eq!(a.as_mut().poll_next(cx), Poll::Ready(Some("a1")));
    assert_eq!(a.as_mut().poll_next(cx), Poll::Pending); // a2 books 300 ms
    clock.advance(T);
    assert_eq!(b.as_mut().poll_next(cx), Poll::Ready(Some("b1")));
    clock.advance(T);
    assert_eq!(a.as_mut().poll_next(cx), Poll::Ready(Some("a2")));
}

#[test]
fn realtime_a_throttled_stream_on_tokio() {
    let rt = common::tokio_runtime();
    let limiter = Arc::new(Limiter::new(Quota::per_second(200).with_burst(1)));
    let start = Instant::now();
    // An `Arc` makes the stream 'static, so it can be spawned.
    let task = rt.spawn(async move {
        paceline::stream::throttle(futures::stream::iter(0..20u32), limiter)
            .collect::<Vec<_>>()
            .await
    });
    let items = rt.block_on(task).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(items, (0..20).collect::<Vec<_>>());
    // 19 intervals of 5 ms after the first; generous upper bound for a loaded machine.
    assert!(elapsed >= Duration::from_millis(94), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}
