//! The future that waits for a shared budget's turn.
//!
//! # Implementation notes
//!
//! A caller arrives on its first poll (a future never polled takes no place): admitted at
//! once, or in the queue. Asking again takes the file's lock, so a waiter asks only when
//! it may help (`admit.rs`, "Who looks again when"), reading the two epoch words (no
//! lock) in between:
//!
//! * behind the head, `p` places back: once the queue's epoch has moved `p`, reading it
//!   every `p` milliseconds (at least every [`MAX_CHECK`]);
//! * the head: at the instant its rates admit it, and whenever the head's epoch moves
//!   (a permit returned, a settle, a rate changed), read every millisecond;
//! * anyone: at its deadline, and every [`REFRESH`] to show it is still there (a waiter
//!   silent for [`ABANDONED`](super::ABANDONED) loses its place); the head and the
//!   waiter behind it every [`ASK_FRONT`], since a permit's turn or the head may belong
//!   to a process that is gone, which only a look under the lock finds out.
//!
//! Each read is one clock alarm of the future's own. Dropping the future leaves the
//! queue (it has spent nothing); the queue's epoch then moves for those behind it.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use super::admit::Step;
use super::{Inner, SharedBudgetError, SharedTurn};
use crate::clock::Clock;
use crate::wait::alarm::Alarm;

/// How often a waiter shows it is still there.
const REFRESH: Duration = Duration::from_secs(1);

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
        }
    }

    /// The phase a step leads to, with the epochs read before it and the time.
    fn after(step: Step, deadline: Option<u64>, (head, queue): (u64, u64), now: u64) -> Phase {
        match step {
            Step::Admitted { ticket } => Phase::Admitted { ticket },
            Step::Waiting { ticket, ahead, at } => {
                let every = if ahead == 0 {
                    MS
                } else {
                    (ahead as u64 * MS).min(MAX_CHECK.as_nanos() as u64)
                };
                Phase::Waiting(Wait {
                    ticket,
                    deadline,
                    queue: (ahead > 0).then(|| queue.wrapping_add(ahead as u64)),
                    head: (ahead == 0).then_some(head),
                    at,
                    check: now.saturating_add(every),
                    every,
                    refresh: now.saturating_add(if ahead <= 1 {
                        ASK_FRONT.as_nanos() as u64
                    } else {
                        REFRESH.as_nanos() as u64
                    }),
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

impl Future for SharedAcquire {
    type Output = Result<SharedTurn, SharedBudgetError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(error) = this.error.take() {
            this.phase = Phase::Done;
            return Poll::Ready(Err(error));
        }
        assert!(
            !matches!(this.phase, Phase::Done),
            "SharedAcquire polled after it was answered"
        );
        match this.advance() {
            Err(e) => {
                this.leave();
                Poll::Ready(Err(e))
            }
            Ok(Some(wake_at)) => {
                let alarm = this.alarm.get_or_insert_with(Alarm::new);
                alarm.set(&this.inner.clock, wake_at, cx.waker());
                Poll::Pending
            }
            Ok(None) => {
                let Phase::Admitted { ticket } = this.phase else {
                    unreachable!("answered only once admitted")
                };
                this.phase = Phase::Done;
                if let Some(alarm) = this.alarm.take() {
                    alarm.cancel(&this.inner.clock);
                }
                let cells = core::mem::take(&mut this.cells);
                Poll::Ready(Ok(SharedTurn::new(Arc::clone(&this.inner), ticket, cells)))
            }
        }
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
