//! The future that waits for a shared budget's turn.
//!
//! # Implementation notes
//!
//! A caller arrives on its first poll (a future never polled takes no place): booked at
//! once, or on record as a waiter for a permit. A waiter knows how many permits must
//! come back before its own (`behind`); each permit returned and each place given up
//! advances the file's epoch by one, so the waiter reads the epoch word (no lock) every
//! millisecond or so and asks under the lock only once the epoch has moved that far, at
//! its deadline, or every [`REFRESH`] to show it is still there (a waiter silent for
//! [`ABANDONED`](super::ABANDONED) loses its place). A booked turn sleeps until its
//! instant on one clock alarm. Dropping the future gives the place up, or the booking
//! back (as far as no caller booked after it relied on it: a settle to zero).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;

use super::admit::{Step, MAX_POLL};
use super::{Inner, SharedBudgetError, SharedTurn};
use crate::budget::BudgetError;
use crate::clock::Clock;
use crate::wait::alarm::Alarm;

/// How often a waiter for a permit shows it is still there.
const REFRESH: Duration = Duration::from_secs(1);

/// The future of [`SharedBudget::acquire`](super::SharedBudget::acquire) and
/// [`SharedBudget::acquire_within`](super::SharedBudget::acquire_within): a
/// [`SharedTurn`] once it has a permit and its instant has come, in arrival order over
/// every process. Dropped before then, it gives its place and its booking back. It owns
/// its budget's file (an `Arc`), so it is `'static`.
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
    /// On record as a waiter for a permit.
    Waiting {
        ticket: u64,
        deadline: Option<u64>,
        /// The epoch at which asking again may help.
        epoch: u64,
        /// When to read the epoch next.
        check: u64,
        /// When to ask again whatever the epoch.
        refresh: u64,
    },
    /// Booked at `at`, with its permit.
    Booked {
        ticket: u64,
        at: u64,
    },
    Done,
}

impl SharedAcquire {
    pub(super) fn new(
        inner: Arc<Inner>,
        cells: Result<Box<[u32]>, BudgetError>,
        max: Option<u64>,
    ) -> SharedAcquire {
        let (cells, error) = match cells {
            Ok(cells) => (cells, None),
            Err(e) => (Box::default(), Some(SharedBudgetError::Budget(e))),
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

    /// The phase a step leads to, at `now`.
    fn after(&self, step: Step, deadline: Option<u64>, epoch: u64, now: u64) -> Phase {
        match step {
            Step::Booked { ticket, at, .. } => Phase::Booked { ticket, at },
            Step::Waiting { ticket, behind } => {
                let every =
                    Duration::from_millis(behind as u64).clamp(Duration::from_millis(1), MAX_POLL);
                Phase::Waiting {
                    ticket,
                    deadline,
                    epoch: epoch.wrapping_add(behind as u64),
                    check: now.saturating_add(every.as_nanos() as u64),
                    refresh: now.saturating_add(REFRESH.as_nanos() as u64),
                }
            }
        }
    }

    /// One poll's work: `Some` once answered.
    fn advance(&mut self) -> Result<Option<u64>, SharedBudgetError> {
        loop {
            let now = self.inner.clock.now();
            match self.phase {
                Phase::New => {
                    let deadline = self.max.map(|m| now.saturating_add(m));
                    let epoch = self.inner.region().epoch();
                    let step = self.inner.step(&self.cells, deadline, |s, a| s.arrive(a))?;
                    self.phase = self.after(step, deadline, epoch, now);
                }
                Phase::Waiting {
                    ticket,
                    deadline,
                    epoch,
                    check,
                    refresh,
                } => {
                    let seen = self.inner.region().epoch();
                    let moved = seen.wrapping_sub(epoch) < u64::MAX / 2;
                    let due = deadline.is_some_and(|d| now >= d);
                    if !(moved || due || now >= refresh) {
                        if now < check {
                            return Ok(Some(check.min(deadline.unwrap_or(u64::MAX))));
                        }
                        let every =
                            check.saturating_sub(refresh.saturating_sub(REFRESH.as_nanos() as u64));
                        self.phase = Phase::Waiting {
                            ticket,
                            deadline,
                            epoch,
                            check: now.saturating_add(every.max(1_000_000)),
                            refresh,
                        };
                        continue;
                    }
                    let step = self
                        .inner
                        .step(&self.cells, deadline, |s, a| s.ask_again(ticket, a));
                    match step {
                        Ok(step) => self.phase = self.after(step, deadline, seen, now),
                        Err(e) => {
                            // The place is given up (`ask_again` took it off the record).
                            self.phase = Phase::Done;
                            return Err(e);
                        }
                    }
                }
                Phase::Booked { at, .. } => {
                    return Ok((now < at).then_some(at));
                }
                Phase::Done => return Ok(None),
            }
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
                let Phase::Booked { ticket, .. } = this.phase else {
                    unreachable!("answered only once booked")
                };
                this.phase = Phase::Done;
                let cells = core::mem::take(&mut this.cells);
                Poll::Ready(Ok(SharedTurn::new(Arc::clone(&this.inner), ticket, cells)))
            }
        }
    }
}

impl SharedAcquire {
    /// Gives the place or the booking back (a future dropped or failed before its turn).
    fn leave(&mut self) {
        if let Some(alarm) = self.alarm.take() {
            alarm.cancel(&self.inner.clock);
        }
        match core::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Waiting { ticket, .. } => {
                // A file locked past patience: the place lapses once it stops asking.
                let _ = self.inner.end(ticket, &[], None);
            }
            Phase::Booked { ticket, .. } => {
                let zero = vec![Some(0); self.cells.len()];
                // As above: the turn then stays on record until this process is gone.
                let _ = self.inner.end(ticket, &self.cells, Some(&zero));
            }
            Phase::New | Phase::Done => {}
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
