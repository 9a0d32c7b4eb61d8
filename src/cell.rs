//! The state word: the second layer ("the cell layer"), and the only code that touches a
//! limiter's atomic.
//!
//! Naming: a *cell* is what a request asks for (the unit of a quota, as in "`check_n(3)`
//! asks for 3 cells"); the atomic that keeps a limiter's state is a [`TatWord`].
//!
//! # Implementation notes
//!
//! A `TatWord` is one `AtomicU64` holding the theoretical arrival time (TAT) in
//! nanoseconds on the limiter's clock. Every update is a compare-and-swap from the value this thread
//! last observed to the value [`gcra::admit`] computed from it, so each admission is judged
//! against exactly the state it replaces: two threads can never both spend the same room.
//!
//! * **The deny path only loads.** A request that does not fit returns after the load (or
//!   after the failed CAS that showed it a newer value); it never writes, so a flood of
//!   denials leaves the cache line shared in every core's cache.
//! * **A failed CAS reuses the value it observed** and the caller's `now`: no second load,
//!   no second clock read. An exponential backoff timed on the time-stamp counter
//!   (`crate::sync::CasBackoff`) keeps a losing thread away while the winner completes
//!   several checks on the line it holds, up to a patience after which it retries at once.
//! * **Memory ordering is `Relaxed` everywhere.** The TAT is a single word that publishes
//!   no other data: a decision depends only on the word's own modification order, which
//!   is total for any ordering. The waiter list that sits beside a cell is guarded by its
//!   own mutex, which supplies every happens-before edge the list needs.
//!
//! The direct limiter wraps its cell in `CachePadded` so nothing else shares its line; the
//! keyed limiter stores bare cells in its map, one word per key, and runs the same code.

use crate::gcra;
use crate::sync::{AtomicU64, CasBackoff, Ordering};

/// One GCRA state word: the theoretical arrival time. See the module docs.
///
/// `repr(transparent)` so that a word that lives elsewhere, an `AtomicU64` in a file
/// mapped by several processes (`crate::shared`), is a `TatWord` in place.
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct TatWord {
    /// The theoretical arrival time, in nanoseconds on the limiter's clock.
    tat: AtomicU64,
}

impl TatWord {
    /// A fresh cell: TAT 0, so a full burst is admissible at once.
    pub(crate) fn new() -> TatWord {
        TatWord::starting_at(0)
    }

    /// A cell holding `tat`: from then on it is indistinguishable from a fresh one, and
    /// before then (a clock that steps back) it admits nothing a cell with that TAT would
    /// not (a keyed limiter's new keys start at its last sweep).
    #[cfg_attr(not(feature = "std"), allow(dead_code))] // keyed's
    pub(crate) fn starting_at(tat: u64) -> TatWord {
        TatWord {
            tat: AtomicU64::new(tat),
        }
    }

    /// The `TatWord` that `word` is: a word of a shared file's mapping.
    #[cfg(all(feature = "shared", not(loom)))]
    #[inline]
    pub(crate) fn in_place(word: &AtomicU64) -> &TatWord {
        // SAFETY: `TatWord` is `repr(transparent)` over its one `AtomicU64`, so the two
        // have one layout and a reference to one is a valid reference to the other, for
        // the same lifetime.
        unsafe { &*core::ptr::from_ref(word).cast::<TatWord>() }
    }

    /// The current TAT.
    #[inline]
    pub(crate) fn tat(&self) -> u64 {
        // Relaxed: a snapshot of one word that guards no other data (module docs).
        self.tat.load(Ordering::Relaxed)
    }

    /// Spends `cost` at `now` if it fits within `tolerance`; otherwise returns the wait in
    /// nanoseconds and writes nothing. Returns the TAT the admission produced.
    #[cfg_attr(not(feature = "std"), allow(dead_code))] // keyed's and waiting's
    #[inline]
    pub(crate) fn acquire(&self, now: u64, cost: u64, tolerance: u64) -> Result<u64, u64> {
        let Some(room) = tolerance.checked_sub(cost) else {
            return Err(u64::MAX);
        };
        if cost == 0 {
            // Nothing to spend: the verdict alone (a TAT behind `now` and one at `now` are
            // the same state, so nothing needs writing either way).
            return gcra::admit_in_room(self.tat(), now, 0, room);
        }
        self.spend(now, cost, room)
    }

    /// Spends `cost` (at least 1) at `now` if the TAT is at most `room` ahead of `now`
    /// (`room = tolerance - cost`); otherwise returns the wait in nanoseconds and writes
    /// nothing. Returns the TAT the admission produced. The one-cell check's path.
    #[inline]
    pub(crate) fn spend(&self, now: u64, cost: u64, room: u64) -> Result<u64, u64> {
        debug_assert!(cost > 0, "a positive cost always moves the TAT");
        // Relaxed: see the module docs; the CAS below re-validates whatever we read.
        let current = self.tat.load(Ordering::Relaxed);
        let next = gcra::admit_in_room(current, now, cost, room)?;
        // The uncontended case, inline; a collision takes the out-of-line loop (keeping
        // its backoff and registers off the path almost every check takes).
        // Relaxed on success and failure: as in `spend_contended`.
        match self
            .tat
            .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Ok(next),
            Err(observed) => self.spend_contended(observed, now, cost, room),
        }
    }

    /// [`TatWord::spend`] after a failed compare-and-swap, from the value it observed.
    #[cold]
    #[inline(never)]
    fn spend_contended(&self, observed: u64, now: u64, cost: u64, room: u64) -> Result<u64, u64> {
        let mut current = observed;
        let mut backoff = CasBackoff::new();
        backoff.spin();
        loop {
            let next = gcra::admit_in_room(current, now, cost, room)?;
            // Relaxed on success and failure: the word publishes nothing else, and the
            // failure value is only fed back into the arithmetic (module docs).
            match self.tat.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(next),
                Err(observed) => {
                    current = observed;
                    backoff.spin();
                }
            }
        }
    }

    /// Gives back `cost` nanoseconds that a cancelled booking took, if the TAT is still
    /// `expected` (the queue's last booking); returns whether it did.
    ///
    /// A TAT other than `expected` means a plain admission happened since the last booking,
    /// after every booked instant: the cancelled cells were then relied on and stay spent
    /// (see `crate::wait::queue`). Deciding on the value itself, with no clock reading,
    /// makes an admission racing the refund fail one of the two compare-and-swaps.
    #[cfg_attr(not(feature = "std"), allow(dead_code))] // waiting's
    pub(crate) fn refund(&self, expected: u64, cost: u64) -> bool {
        // Relaxed: the same single-word argument as `acquire`; bookings and refunds are
        // ordered among themselves by the waiter queue's mutex, which made `expected`
        // (written under it) visible to us, and a plain admission is a newer value in the
        // word's modification order, which makes this exchange fail.
        self.tat
            .compare_exchange(
                expected,
                expected.saturating_sub(cost),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

impl TatWord {
    /// [`TatWord::acquire`] on a word that may stop being the caller's between two reads
    /// (a shared key's slot word, which a claim can give to another key): `ours` is
    /// checked after each read of the word and before the swap that would write it, and
    /// `None` says the word was no longer ours (nothing written).
    ///
    /// Acquire on the reads and AcqRel on the swap: they pair with a claimer's flag and
    /// word moves, as the shared table's own check does (`crate::shared::table`, "Checks
    /// are lock-free"): a swap that succeeds read a value the claimer had not moved yet,
    /// and `ours` checked after that read saw no claim begun.
    #[cfg(feature = "std")]
    pub(crate) fn acquire_if(
        &self,
        now: u64,
        cost: u64,
        tolerance: u64,
        ours: Ours<'_>,
    ) -> Option<Result<u64, u64>> {
        let Some(room) = tolerance.checked_sub(cost) else {
            return Some(Err(u64::MAX));
        };
        let mut current = self.tat.load(Ordering::Acquire);
        loop {
            if !ours() {
                return None;
            }
            let next = match gcra::admit_in_room(current, now, cost, room) {
                Ok(next) => next,
                Err(wait) => return Some(Err(wait)),
            };
            if cost == 0 {
                return Some(Ok(next));
            }
            match self
                .tat
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Ok(next)),
                Err(seen) => current = seen,
            }
        }
    }

    /// Holds the word back for a hold (`Limiter::hold_for`): moves it `shift` later, and at
    /// least to `floor`, in one compare-and-swap loop (a plain admission may race it), on a
    /// word that may stop being the caller's (as [`TatWord::acquire_if`]); false if it was
    /// no longer ours (nothing written).
    #[cfg(feature = "std")]
    pub(crate) fn hold_if(&self, shift: u64, floor: u64, ours: Ours<'_>) -> bool {
        // Acquire and AcqRel: as in `acquire_if`.
        let mut seen = self.tat.load(Ordering::Acquire);
        loop {
            if !ours() {
                return false;
            }
            let held = seen.saturating_add(shift).max(floor);
            if held == seen {
                return true;
            }
            match self
                .tat
                .compare_exchange_weak(seen, held, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => seen = now,
            }
        }
    }

    /// Sets the word to `tat` (an operator's reset of a shared file, where waiting
    /// turns keep their order: `Waiters::reset`), while it is the caller's (as
    /// [`TatWord::acquire_if`]); false if it was no longer ours (nothing written). A reset
    /// overrides whatever admission raced it, by design.
    #[cfg(all(feature = "shared", unix, not(loom)))]
    pub(crate) fn set_if(&self, tat: u64, ours: Ours<'_>) -> bool {
        // Acquire and AcqRel: as in `acquire_if`.
        let mut seen = self.tat.load(Ordering::Acquire);
        loop {
            if !ours() {
                return false;
            }
            match self
                .tat
                .compare_exchange_weak(seen, tat, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => seen = now,
            }
        }
    }
}

/// Whether a word is still the one a caller works on, checked between reading it and
/// swapping it ([`TatWord::acquire_if`]): a limiter's own word always is; a shared key's
/// slot word can become another key's.
#[cfg(feature = "std")]
pub(crate) type Ours<'a> = &'a dyn Fn() -> bool;

/// [`Ours`] for a word that is always the caller's.
#[cfg(feature = "std")]
pub(crate) const ALWAYS_OURS: Ours<'static> = &|| true;

impl Default for TatWord {
    fn default() -> Self {
        TatWord::new()
    }
}
