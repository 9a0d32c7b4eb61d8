//! A waiting task's one registration with its clock, for a wait that books nothing (a new
//! key waiting for room in a full key table).
//!
//! # Implementation notes
//!
//! Handing the task's own waker to `Clock::wake_at` on every poll would leave one clock
//! entry per poll, each keeping the task alive until its instant, whether or not the
//! future is still there (a `select!` loop re-polls thousands of times). Instead the
//! future owns one `Alarm`: the clock gets a waker for the alarm, once per instant; a
//! re-poll only replaces the task waker inside it; dropping the future takes the task
//! waker out and asks the clock to forget the alarm. So a waiting future costs at most
//! one clock entry, and none once it is gone (with any clock that implements
//! `Clock::forget_waker`; with one that does not, the entry holds only the empty alarm
//! until its instant).

use core::task::Waker;
use std::sync::Arc;
use std::task::Wake;

use crate::clock::Clock;
use crate::sync::Mutex;

/// The alarm's state.
#[derive(Debug, Default)]
struct Ring {
    /// The task to wake; taken when the alarm rings or its future goes.
    task: Option<Waker>,
    /// Where the task was set: the process's fork generation and the setting thread's
    /// token. An alarm inherited by a forked child rings there too (the child's timer
    /// serves what it copied); the task of a thread that did not come along is then
    /// neither woken (its executor is gone, and may hold its locks in the child) nor
    /// dropped (for the same reason): it is leaked.
    set_in: (u64, usize),
    /// The clock instant the clock was last asked to ring at; `None` once it rang (or
    /// before it was set).
    set_for: Option<u64>,
}

#[derive(Debug, Default)]
struct Inner(Mutex<Ring>);

impl Wake for Inner {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let (task, (generation, thread)) = {
            let mut ring = self.0.lock();
            ring.set_for = None;
            (ring.task.take(), ring.set_in)
        };
        // Woken after the lock: a task's waker is foreign code.
        if let Some(task) = task {
            if crate::clock::runs_here(generation, thread) {
                task.wake();
            } else {
                core::mem::forget(task);
            }
        }
    }
}

/// One task's registration with its clock (module docs).
#[derive(Debug)]
pub(crate) struct Alarm {
    inner: Arc<Inner>,
    /// The waker the clock holds: rings `inner`.
    ring: Waker,
}

impl Alarm {
    pub(crate) fn new() -> Alarm {
        let inner = Arc::new(Inner::default());
        Alarm {
            ring: Waker::from(Arc::clone(&inner)),
            inner,
        }
    }

    /// Wakes `task` once `clock` reads `at`: asks the clock only if it is not already set
    /// for that instant; otherwise only the task waker is replaced.
    pub(crate) fn set<C: Clock>(&self, clock: &C, at: u64, task: &Waker) {
        let (ask, forget, _old) = {
            let mut ring = self.inner.0.lock();
            let old = match &ring.task {
                Some(current) if current.will_wake(task) => None,
                _ => ring.task.replace(task.clone()),
            };
            ring.set_in = (crate::clock::forks(), crate::clock::thread_token());
            let previous = ring.set_for.replace(at);
            (previous != Some(at), previous.is_some(), old)
            // `_old`, a replaced task waker, is dropped after the lock.
        };
        if ask {
            if forget {
                // Set for another instant: that entry is no longer needed.
                clock.forget_waker(&self.ring);
            }
            clock.wake_at(at, self.ring.clone());
        }
    }

    /// Lets go of the task and of the clock's entry, if any.
    pub(crate) fn cancel<C: Clock>(&self, clock: &C) {
        let (task, set) = {
            let mut ring = self.inner.0.lock();
            (ring.task.take(), ring.set_for.take().is_some())
        };
        drop(task);
        if set {
            clock.forget_waker(&self.ring);
        }
    }
}
