//! A fixed-size batch of wakers, filled under a lock and woken after it is released.
//!
//! Waking (or dropping) a `Waker` runs arbitrary executor code, which may poll the very
//! future whose lock is held; so paceline never does either inside a critical section. Code
//! that empties a queue takes up to [`WakeList::CAPACITY`] wakers per critical section,
//! unlocks, wakes them, and goes round again (tokio's `WakeList` does the same).
//!
//! A waker that panics does not strand the others: each wake runs under `catch_unwind`,
//! and the first panic is handed back once the whole batch is woken, for the caller to
//! resume when its own state is consistent again.

use core::task::Waker;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The payload of a waker's panic, to be resumed with `std::panic::resume_unwind`.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

pub(crate) struct WakeList {
    wakers: [Option<Waker>; WakeList::CAPACITY],
    len: usize,
}

impl core::fmt::Debug for WakeList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WakeList").field("len", &self.len).finish()
    }
}

impl WakeList {
    pub(crate) const CAPACITY: usize = 32;

    pub(crate) fn new() -> WakeList {
        WakeList {
            wakers: Default::default(),
            len: 0,
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len == Self::CAPACITY
    }

    /// Adds a waker; the caller checks [`WakeList::is_full`] first.
    pub(crate) fn push(&mut self, waker: Waker) {
        debug_assert!(!self.is_full());
        self.wakers[self.len] = Some(waker);
        self.len += 1;
    }

    /// Wakes every waker, in the order they were pushed. Call with no lock held.
    ///
    /// # Errors
    ///
    /// The payload of the first waker that panicked; every other waker was still woken.
    pub(crate) fn wake_all(&mut self) -> Result<(), Panic> {
        let mut first = Ok(());
        for slot in &mut self.wakers[..self.len] {
            if let Some(waker) = slot.take() {
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| waker.wake())) {
                    first = first.and(Err(panic));
                }
            }
        }
        self.len = 0;
        first
    }
}

impl Drop for WakeList {
    fn drop(&mut self) {
        // A list dropped unwoken (a panic between filling and waking) still wakes its
        // tasks rather than stranding them; a second panic is not raised from a drop.
        let _ = self.wake_all();
    }
}
