//! The future that waits for a shared budget's turn.
//!
//! # Implementation notes
//!
//! A caller arrives on its first poll (a future never polled takes no place): admitted at
//! once, or in the queue. Asking again takes the file's lock, so a waiter asks only when
//! it may help (`budget/queue/admit.rs`, "Who looks again when"), reading the two epoch words (no
//! lock) in between:
//!
//! * every waiter at the instant its turn would come as things stand (the head's rates'
//!   instant; behind it, the instant if those ahead went as early as the rates allow),
//!   so that each wakes on its own time instead of after the one ahead of it;
//! * behind the head, `p` places back: once the queue's epoch has moved `p`, reading it
//!   every millisecond by the next in line, every `d` ms further back, `d` the departures
//!   still to come before its own turn, as the epoch tells them (at least
//!   every [`MAX_CHECK`]);
//! * the head and the first [`HEAD_WATCHERS`] behind it: whenever the head's epoch moves
//!   (a permit returned, a settle, a rate changed), read every millisecond by the head;
//! * anyone: at its deadline, and every [`REFRESH`] (up to four, far back) to show it is still
//!   there (a waiter silent for [`ABANDONED`](super::ABANDONED) loses its place); the
//!   head and the waiter behind it every [`ASK_FRONT`], since a permit's turn or the head
//!   may belong to a process that is gone, which only a look under the lock finds out.
//!
//! Each read is one clock alarm of the future's own. Dropping the future leaves the
//! queue (it has spent nothing); the queue's epoch then moves for those behind it.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use super::{Inner, SharedBudgetError, SharedTurn};
use crate::budget::queue::Step;
use crate::clock::Clock;
use crate::wait::alarm::Alarm;

/// How often a waiter near the front shows it is still there (one further back, every
/// two; one more than a hundred places back, every four).
const REFRESH: Duration = Duration::from_secs(1);

/// The waiters nearest the front watch the head's epoch too: a settle that refunds
/// brings their turns nearer, which those further back learn as they move up.
const HEAD_WATCHERS: usize = 4;

/// The longest a waiter goes without reading the epochs.
const MAX_CHECK: Duration = Duration::from_secs(1);

/// How often the head and the waiter behind it ask under the lock whatever the epochs
/// say: what holds them up (a permit's turn, the head) may belong to a process that is
/// gone, which only a look under the lock finds out.
const ASK_FRONT: Duration = Duration::from_millis(50);

const MS: u64 = 1_000_000;

/// The future of [`SharedBudget::acquire`](super::SharedBudget::acquire) and
/// [`SharedBudget::acquire_within`](super::SharedBudget::acquire_within): a
/// [`SharedTurn`] once it is the first in the queue, every dimension admits it and a
/// permit is free. Dropped before then, it gives its place up, having spent nothing. It
/// owns its budget's file (an `Arc`), so it is `'static`.
///
/// # Examples
///
/// See [`SharedBudget::acquire`](super::SharedBudget::acquire).
#[must_use = "futures do nothing unless polled"]
pub struct SharedAcquire {
    inner: Arc<Inner>,
    cells: Box<[u32]>,
    error: Option<SharedBudgetError>,
    /// The longest wait accepted, in clock nanoseconds.
    max: Option<u64>,
    phase: Phase,
    alarm: Option<Alarm>,
    /// When a pending wait should be looked at again (clock nanoseconds).
    next: u64,
}

/// What [`SharedAcquire::step`] comes to.
#[derive(Debug)]
pub enum SharedStep {
    /// The wait's answer.
    Ready(Result<SharedTurn, SharedBudgetError>),
    /// Not yet: step again after this long.
    Pending(Duration),
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    New,
    /// In the queue.
    Waiting(Wait),
    /// Admitted, not yet handed over.
    Admitted {
        ticket: u64,
    },
    Done,
}

/// What a waiter knows since it last asked.
#[derive(Clone, Copy, Debug)]
struct Wait {
    ticket: u64,
    deadline: Option<u64>,
    /// Ask again once the queue's epoch reaches this (a waiter behind the head).
    queue: Option<u64>,
    /// Ask again once the head's epoch moves from this (the head).
    head: Option<u64>,
    /// Ask again at this instant (the head's rates admit it then).
    at: Option<u64>,
    /// Read the epochs next at this instant.
    check: u64,
    /// How often to read them.
    every: u64,
    /// Ask again at this instant whatever the epochs say.
    refresh: u64,
}

impl SharedAcquire {
    pub(super) fn new(
        inner: Arc<Inner>,
        cells: Result<Box<[u32]>, SharedBudgetError>,
        max: Option<u64>,
    ) -> SharedAcquire {
        let (cells, error) = match cells {
            Ok(cells) => (cells, None),
            Err(e) => (Box::default(), Some(e)),
        };
        SharedAcquire {
            inner,
            cells,
            error,
            max,
            phase: Phase::New,
            alarm: None,
            next: 0,
        }
    }

    /// The phase a step leads to, with the epochs read before it and the time.
    fn after(step: Step, deadline: Option<u64>, (head, queue): (u64, u64), now: u64) -> Phase {
        match step {
            Step::Admitted { ticket } => Phase::Admitted { ticket },
            Step::Waiting { ticket, ahead, at } => {
                let ms = |n: u64| n.saturating_mul(MS);
                let every = match ahead {
                    // The head, and the next: its turn comes as soon as the head's is
                    // taken, and a settle's refund may bring that sooner than it could
                    // reckon.
                    0 | 1 => ms(1),
                    // Further back, as often as places may go by: a queue that moves
                    // faster than its projected instants (settles refund) must not leave
                    // the head's place empty while its next waiter has yet to look.
                    _ => ms(ahead as u64).min(MAX_CHECK.as_nanos() as u64),
                };
                let refresh = match ahead {
                    0 | 1 => ASK_FRONT,
                    2..=10 => REFRESH,
                    11..=100 => 2 * REFRESH,
                    _ => 4 * REFRESH,
                };
                Phase::Waiting(Wait {
                    ticket,
                    deadline,
                    queue: (ahead > 0).then(|| queue.wrapping_add(ahead as u64)),
                    head: (ahead <= HEAD_WATCHERS).then_some(head),
                    at,
                    check: now.saturating_add(every),
                    every,
                    refresh: now.saturating_add(refresh.as_nanos() as u64),
                })
            }
        }
    }

    /// One poll's work: `Ok(None)` once admitted, `Ok(Some(at))` to be polled again at
    /// `at`.
    fn advance(&mut self) -> Result<Option<u64>, SharedBudgetError> {
        loop {
            let now = self.inner.clock.now();
            match self.phase {
                Phase::New => {
                    let deadline = self.max.map(|m| now.saturating_add(m));
                    let epochs = self.inner.region().epochs();
                    let step = self.inner.step(&self.cells, deadline, |s, a| s.arrive(a))?;
                    self.phase = Self::after(step, deadline, epochs, now);
                }
                Phase::Waiting(mut w) => {
                    let (head, queue) = self.inner.region().epochs();
                    // An epoch moved far enough (wrapping: a difference below half the
                    // range is forward).
                    let moved = w
                        .queue
                        .is_some_and(|q| queue.wrapping_sub(q) < u64::MAX / 2)
                        || w.head.is_some_and(|h| head != h);
                    let due = [w.at, w.deadline, Some(w.refresh)]
                        .into_iter()
                        .flatten()
                        .any(|t| now >= t);
                    if !(moved || due) {
                        if now >= w.check {
                            // As often as places may still go by before its own: the
                            // departures left to its target, read off the epoch.
                            if let Some(target) = w.queue {
                                let left = target.wrapping_sub(queue).max(1);
                                w.every = left.saturating_mul(MS).min(MAX_CHECK.as_nanos() as u64);
                            }
                            w.check = now.saturating_add(w.every);
                            self.phase = Phase::Waiting(w);
                        }
                        let next = [w.at, w.deadline, Some(w.refresh), Some(w.check)]
                            .into_iter()
                            .flatten()
                            .min()
                            .unwrap_or(w.check);
                        return Ok(Some(next));
                    }
                    let ticket = w.ticket;
                    let step = self
                        .inner
                        .step(&self.cells, w.deadline, |s, a| s.ask_again(ticket, a));
                    match step {
                        Ok(step) => self.phase = Self::after(step, w.deadline, (head, queue), now),
                        Err(e) => {
                            // Off the record already (a deadline), or the file's error.
                            return Err(e);
                        }
                    }
                }
                Phase::Admitted { .. } | Phase::Done => return Ok(None),
            }
        }
    }

    /// Leaves the queue (a future dropped, or failed, before its turn).
    fn leave(&mut self) {
        if let Some(alarm) = self.alarm.take() {
            alarm.cancel(&self.inner.clock);
        }
        match core::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Waiting(w) => {
                // A file locked past patience: the place lapses once it stops asking.
                let _ = self.inner.end(w.ticket, &[], None);
            }
            Phase::Admitted { ticket } => {
                // Admitted but never handed over: ended at once, keeping its charge.
                let _ = self.inner.end(ticket, &self.cells, None);
            }
            Phase::New | Phase::Done => {}
        }
    }
}

impl SharedAcquire {
    /// Takes this wait one step without a waker, for an event loop that keeps its own
    /// timers (paceline's Python package): the turn or the error once answered, or how
    /// long until the wait should be stepped again. Nothing wakes a shared budget's
    /// waiter but its own clock (`waiting.rs`), so a loop that sleeps that long and steps
    /// again waits exactly as a polled future does, without a thread waking it.
    ///
    /// # Panics
    ///
    /// If stepped (or polled) after it was answered.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paceline::{shared::{SharedBudget, SharedStep}, Quota};
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-st-{}", std::process::id()));
    /// let budget = SharedBudget::builder().rate("requests", Quota::per_second(10)).open(&path)?;
    /// let mut waiting = budget.acquire(&[]);
    /// let turn = loop {
    ///     match waiting.step() {
    ///         SharedStep::Ready(turn) => break turn?,
    ///         SharedStep::Pending(again_in) => std::thread::sleep(again_in),
    ///     }
    /// };
    /// # drop(turn);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step(&mut self) -> SharedStep {
        match self.answer() {
            Poll::Ready(r) => SharedStep::Ready(r),
            Poll::Pending => {
                let now = self.inner.clock.now();
                SharedStep::Pending(Duration::from_nanos(self.next.saturating_sub(now)))
            }
        }
    }

    /// One poll's answer; when pending, `self.next` says when to look again.
    fn answer(&mut self) -> Poll<Result<SharedTurn, SharedBudgetError>> {
        if let Some(error) = self.error.take() {
            self.phase = Phase::Done;
            return Poll::Ready(Err(error));
        }
        assert!(
            !matches!(self.phase, Phase::Done),
            "SharedAcquire polled after it was answered"
        );
        match self.advance() {
            Err(e) => {
                self.leave();
                Poll::Ready(Err(e))
            }
            Ok(Some(wake_at)) => {
                self.next = wake_at;
                Poll::Pending
            }
            Ok(None) => {
                let Phase::Admitted { ticket } = self.phase else {
                    unreachable!("answered only once admitted")
                };
                self.phase = Phase::Done;
                if let Some(alarm) = self.alarm.take() {
                    alarm.cancel(&self.inner.clock);
                }
                let cells = core::mem::take(&mut self.cells);
                Poll::Ready(Ok(SharedTurn::new(Arc::clone(&self.inner), ticket, cells)))
            }
        }
    }
}

impl Future for SharedAcquire {
    type Output = Result<SharedTurn, SharedBudgetError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let answer = this.answer();
        if answer.is_pending() {
            let alarm = this.alarm.get_or_insert_with(Alarm::new);
            alarm.set(&this.inner.clock, this.next, cx.waker());
        }
        answer
    }
}

impl Drop for SharedAcquire {
    fn drop(&mut self) {
        self.leave();
    }
}

impl core::fmt::Debug for SharedAcquire {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedAcquire")
            .field("cells", &self.cells)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}
