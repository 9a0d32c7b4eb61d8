//! A wait given a deadline by a clock: a future that ends at `deadline` if the wait it
//! holds has not ended by then (dropping that wait, so a booking it made is given back).

use core::future::Future;
use core::task::Poll;

use super::alarm::Alarm;
use crate::clock::Clock;

/// Drops the alarm's clock entry however the wait ends (a finished wait, the deadline, or
/// the caller dropping the future).
struct Cancel<'a, C: Clock> {
    alarm: Alarm,
    clock: &'a C,
}

impl<C: Clock> Drop for Cancel<'_, C> {
    fn drop(&mut self) {
        self.alarm.cancel(self.clock);
    }
}

/// `wait`'s output, or `None` once `clock` reads `deadline` first.
pub(crate) async fn within<C: Clock, F: Future>(
    clock: &C,
    deadline: u64,
    wait: F,
) -> Option<F::Output> {
    let mut wait = core::pin::pin!(wait);
    let guard = Cancel {
        alarm: Alarm::new(),
        clock,
    };
    core::future::poll_fn(|cx| {
        if let Poll::Ready(out) = wait.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if guard.clock.now() >= deadline {
            return Poll::Ready(None);
        }
        guard.alarm.set(guard.clock, deadline, cx.waker());
        Poll::Pending
    })
    .await
}
