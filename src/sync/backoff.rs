//! Spinning after a failed compare-and-swap, in a form loom can schedule around.

/// Exponential backoff for a failed compare-and-swap (the read-mostly lock's).
///
/// crossbeam's `Backoff` spins with `core::hint::spin_loop`, which loom cannot see, so a
/// model with it would never yield to the other threads. This one goes through the shim:
/// under loom every step is a `loom::hint::spin_loop`, which lets loom schedule another
/// thread.
#[cfg(feature = "std")]
#[derive(Debug)]
pub(crate) struct Backoff {
    step: u32,
}

#[cfg(feature = "std")]
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

    /// As [`Backoff::spin`] until the spins reach their longest, then gives the rest of
    /// this thread's time slice away: for waiting on another thread that may not be
    /// running (a reader descheduled holding a slot, with more threads than cores).
    pub(crate) fn snooze(&mut self) {
        #[cfg(not(loom))]
        if self.step >= Self::MAX_STEP {
            std::thread::yield_now();
            return;
        }
        self.spin();
    }
}

/// Backoff for threads racing on one limiter's word: sits out a span of time that doubles
/// after every failure, from [`CasBackoff::FIRST`] to [`CasBackoff::LAST`] ticks of the
/// time-stamp counter, and stops sitting out once a thread has been kept waiting for
/// [`CasBackoff::PATIENCE`] spans.
///
/// Chosen by measurement (`benches/contention.rs`; BENCHMARKS.md, "Contention"):
///
/// * **A span of time, not a count of spin hints.** A hint's cost differs about tenfold
///   between processors (a `pause` is ~140 cycles on recent Intel cores and a few dozen on
///   AMD), so a count tuned on one family sits out far too long or too briefly on the
///   other.
/// * **Long spans.** With 2 to 16 threads hammering one limiter, the thread that won a race
///   completes several checks on the line it holds while the losers stay away; shorter
///   ceilings lost up to half the throughput on 16 threads.
/// * **Retrying from the value the failure returned** (no fresh load after sitting out)
///   keeps the winner's line undisturbed; reloading cost half the throughput.
/// * **Patience, then no politeness.** Long spans alone let a loser starve for as long as
///   other threads keep winning (over 100 ms seen on 16 threads). After `PATIENCE` spans a
///   thread retries at once until it wins: a failed compare-and-swap brings the line to
///   its core, so the retry that follows it almost always succeeds.
///
/// Where there is no time-stamp counter to read (other architectures, and Miri), a span of
/// `n` ticks is `n / FIRST` spin hints: 1, 2, 4, .. 64.
#[derive(Debug)]
pub(crate) struct CasBackoff {
    /// How long the next [`CasBackoff::spin`] lasts, in ticks.
    span: u32,
    /// How many spans this thread has sat out.
    waited: u32,
}

impl CasBackoff {
    /// The first span: about 70–130 ns at the 2–3.5 GHz a time-stamp counter runs at.
    const FIRST: u32 = 256;
    /// The longest span: about 5–8 µs.
    const LAST: u32 = 16_384;
    /// Spans sat out before a thread stops sitting out: 114 432 ticks in all, about
    /// 33–57 µs.
    const PATIENCE: u32 = 12;

    pub(crate) const fn new() -> Self {
        Self {
            span: Self::FIRST,
            waited: 0,
        }
    }

    /// Sits out the current span and doubles it (up to [`CasBackoff::LAST`]); returns at
    /// once when the thread has run out of patience.
    pub(crate) fn spin(&mut self) {
        // Under loom one hint is one scheduling point, whatever the span.
        #[cfg(loom)]
        loom::hint::spin_loop();
        if self.waited >= Self::PATIENCE {
            return;
        }
        self.waited += 1;
        #[cfg(all(not(loom), target_arch = "x86_64", not(miri)))]
        {
            let span = u64::from(self.span);
            let start = ticks();
            // Bounded by a hint count as well (a hint takes at least a tick), so a counter
            // that stood still could not hold a thread here.
            for _ in 0..span {
                if ticks().wrapping_sub(start) >= span {
                    break;
                }
                core::hint::spin_loop();
            }
        }
        #[cfg(all(not(loom), any(not(target_arch = "x86_64"), miri)))]
        for _ in 0..self.span / Self::FIRST {
            core::hint::spin_loop();
        }
        self.span = (self.span * 2).min(Self::LAST);
    }
}

/// The time-stamp counter: a constant-rate count of ticks on every x86-64 processor made
/// in the last fifteen years.
#[cfg(all(not(loom), target_arch = "x86_64", not(miri)))]
#[inline]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` has no preconditions: it reads a counter every x86-64 processor has
    // and writes nothing.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::CasBackoff;

    #[test]
    fn cas_backoff_doubles_to_its_ceiling_then_runs_out_of_patience() {
        let mut backoff = CasBackoff::new();
        let mut spans = Vec::new();
        for _ in 0..CasBackoff::PATIENCE {
            spans.push(backoff.span);
            backoff.spin();
        }
        assert_eq!(
            spans[..7],
            [256, 512, 1024, 2048, 4096, 8192, 16_384],
            "doubling from FIRST"
        );
        assert!(spans[7..].iter().all(|&s| s == CasBackoff::LAST));
        assert_eq!(backoff.waited, CasBackoff::PATIENCE);
        // Out of patience: every further call returns without sitting out or counting.
        for _ in 0..1_000 {
            backoff.spin();
        }
        assert_eq!(backoff.waited, CasBackoff::PATIENCE);
        assert_eq!(backoff.span, CasBackoff::LAST);
    }
}
