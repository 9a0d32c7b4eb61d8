//! Spinning after a failed compare-and-swap, in a form loom can schedule around.

/// Exponential backoff for a failed compare-and-swap.
///
/// crossbeam's `Backoff` spins with `core::hint::spin_loop`, which loom cannot see, so a
/// model with it would never yield to the other threads. This one goes through the shim:
/// under loom every step is a `loom::hint::spin_loop`, which lets loom schedule another
/// thread.
#[derive(Debug)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    /// The largest step: at most `2^MAX_STEP` spin hints per failed attempt, so a thread
    /// never sits out for more than a few hundred nanoseconds.
    const MAX_STEP: u32 = 6;

    pub(crate) const fn new() -> Self {
        Self { step: 0 }
    }

    /// Spins for a while that doubles on every call, up to `2^MAX_STEP` hints.
    pub(crate) fn spin(&mut self) {
        // Under loom one hint is one scheduling point; more would only grow the model.
        #[cfg(loom)]
        loom::hint::spin_loop();
        #[cfg(not(loom))]
        for _ in 0..(1u32 << self.step) {
            core::hint::spin_loop();
        }
        if self.step < Self::MAX_STEP {
            self.step += 1;
        }
    }
}
