//! The future that waits for a budget's turn.
//!
//! # Implementation notes
//!
//! The future joins the queue on its first poll (a future never polled takes no place)
//! and admits itself in a later poll once it is the head and the budget admits it; in
//! between it holds only its ticket. Its `Drop` leaves the queue and wakes the new head
//! if it was the head: so a cancelled caller (a timeout, `select!`, a dropped task) has
//! spent nothing and takes nobody's turn. The head's rate wait is one clock alarm of its
//! own (`crate::wait::alarm`: one clock entry however often it is polled, none once it
//! is dropped); waiters behind the head set none unless they have a deadline.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::sync::Arc;

use super::state::{Decision, State};
use super::{wake, BudgetError, Shared, Turn};
use crate::clock::{Clock, DefaultClock};
use crate::wait::alarm::Alarm;

/// The future of [`Budget::acquire`](super::Budget::acquire) and
/// [`Budget::acquire_within`](super::Budget::acquire_within): a [`Turn`] once every
/// dimension admits the caller and a permit is free, in arrival order.
///
/// Dropping it before then gives its place up: it has spent nothing, and the caller
/// behind it moves up. It owns a clone of the budget, so it is `'static`.
///
/// # Examples
///
/// ```
/// use paceline::budget::Budget;
/// use paceline::Quota;
///
/// let budget = Budget::builder().rate("requests", Quota::per_second(5)).build()?;
/// let turn = futures::executor::block_on(budget.acquire(&[]))?;
/// drop(turn);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<C: Clock = DefaultClock> {
    shared: Arc<Shared<C>>,
    /// The cells asked for per dimension (empty once answered).
    cells: Box<[u32]>,
    /// The error to answer with, for costs the budget cannot take.
    error: Option<BudgetError>,
    /// The longest wait accepted, in clock nanoseconds; `None`: no deadline.
    max: Option<u64>,
    phase: Phase,
    /// The clock alarm for the head's instant or the deadline, made when first needed.
    alarm: Option<Alarm>,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Not polled yet.
    New,
    /// In the queue, with its deadline (clock nanoseconds).
    Queued { ticket: u64, deadline: Option<u64> },
    /// Answered.
    Done,
}

/// What a poll comes to, decided under the lock and acted on after it.
enum Step {
    Admitted(u64, u64),
    Refused(BudgetError),
    /// Pending; wake at this instant (or only when someone else wakes it).
    Wait(Option<u64>),
}

impl<C: Clock> Acquire<C> {
    pub(super) fn new(
        shared: Arc<Shared<C>>,
        cells: Result<Box<[u32]>, BudgetError>,
        max: Option<u64>,
    ) -> Acquire<C> {
        let (cells, error) = match cells {
            Ok(cells) => (cells, None),
            Err(error) => (Box::default(), Some(error)),
        };
        Acquire {
            shared,
            cells,
            error,
            max,
            phase: Phase::New,
            alarm: None,
        }
    }
}

impl<C: Clock> core::fmt::Debug for Acquire<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Acquire")
            .field("cells", &self.cells)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

/// The head's or a queued waiter's step at `now`. `gone` receives wakers to drop after
/// unlocking, `next` the new head's to wake.
fn queued_step(
    state: &mut State,
    ticket: u64,
    deadline: Option<u64>,
    cells: &[u32],
    now: u64,
    gone: &mut Option<Waker>,
    next: &mut Option<Waker>,
) -> Step {
    let mut alarm = deadline;
    if state.is_head(ticket) {
        match state.decide(cells, now) {
            Decision::Admit => {
                (*gone, *next) = state.leave(ticket);
                let id = state.admit(cells.into(), now);
                return Step::Admitted(id, state.generation);
            }
            Decision::At(at) => alarm = Some(deadline.map_or(at, |d| d.min(at))),
            Decision::Permit | Decision::Never => {}
        }
    }
    if deadline.is_some_and(|d| d <= now) {
        (*gone, *next) = state.leave(ticket);
        return Step::Refused(BudgetError::TimedOut);
    }
    Step::Wait(alarm)
}

impl<C: Clock> Future for Acquire<C> {
    type Output = Result<Turn<C>, BudgetError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `Acquire` is `Unpin`: every field is.
        let this = self.get_mut();
        if let Phase::Done = this.phase {
            panic!("a budget's `Acquire` was polled after it finished");
        }
        if let Some(error) = this.error.take() {
            this.phase = Phase::Done;
            return Poll::Ready(Err(error));
        }
        let cells = &this.cells;
        let now = this.shared.clock.now();
        let (mut gone, mut next) = (None, None);
        let step = {
            let mut state = this.shared.lock();
            match this.phase {
                // (`Done` panicked above.)
                Phase::New | Phase::Done => {
                    let refused = this.max.and_then(|max| {
                        let wait = match state.estimate(cells, now) {
                            Some(at) => at - now,
                            None => u64::MAX,
                        };
                        (wait > max).then(|| BudgetError::NotWithin {
                            wait: if wait == u64::MAX {
                                Duration::MAX
                            } else {
                                Duration::from_nanos(wait)
                            },
                        })
                    });
                    if let Some(refused) = refused {
                        Step::Refused(refused)
                    } else if state.queued() == 0 && state.decide(cells, now) == Decision::Admit {
                        Step::Admitted(state.admit(cells.clone(), now), state.generation)
                    } else {
                        let ticket = state.enqueue(cells.clone(), cx.waker().clone());
                        let deadline = this.max.map(|max| now.saturating_add(max));
                        this.phase = Phase::Queued { ticket, deadline };
                        queued_step(
                            &mut state, ticket, deadline, cells, now, &mut gone, &mut next,
                        )
                    }
                }
                Phase::Queued { ticket, deadline } => {
                    let ticket = if state.is_queued(ticket) {
                        gone = state.set_waker(ticket, cx.waker());
                        ticket
                    } else {
                        // A fork's child forgot the queue: join it again.
                        let ticket = state.enqueue(cells.clone(), cx.waker().clone());
                        this.phase = Phase::Queued { ticket, deadline };
                        ticket
                    };
                    let mut replaced = None;
                    let step = queued_step(
                        &mut state,
                        ticket,
                        deadline,
                        cells,
                        now,
                        &mut replaced,
                        &mut next,
                    );
                    gone = gone.or(replaced);
                    step
                }
            }
        };
        // Unlocked: drop and wake wakers now.
        drop(gone);
        wake(next);
        let clock = &this.shared.clock;
        match step {
            Step::Wait(at) => {
                match at {
                    Some(at) => {
                        this.alarm
                            .get_or_insert_with(Alarm::new)
                            .set(clock, at, cx.waker())
                    }
                    None => {
                        if let Some(alarm) = &this.alarm {
                            alarm.cancel(clock);
                        }
                    }
                }
                Poll::Pending
            }
            Step::Admitted(id, generation) => {
                this.finish();
                let cells = core::mem::take(&mut this.cells);
                let shared = Arc::clone(&this.shared);
                Poll::Ready(Ok(Turn::new(shared, id, cells, generation)))
            }
            Step::Refused(error) => {
                this.finish();
                Poll::Ready(Err(error))
            }
        }
    }
}

impl<C: Clock> Acquire<C> {
    /// Answered: no place in the queue, no alarm.
    fn finish(&mut self) {
        self.phase = Phase::Done;
        if let Some(alarm) = &self.alarm {
            alarm.cancel(&self.shared.clock);
        }
    }
}

impl<C: Clock> Drop for Acquire<C> {
    fn drop(&mut self) {
        if let Phase::Queued { ticket, .. } = self.phase {
            let (gone, next) = self.shared.lock().leave(ticket);
            drop(gone);
            wake(next);
        }
        if let Some(alarm) = &self.alarm {
            alarm.cancel(&self.shared.clock);
        }
    }
}
