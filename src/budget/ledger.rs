//! A budget's arithmetic: each dimension's GCRA state, and the log of admissions that
//! lets a settle replay them exactly. No clock, no lock: the queue (`state.rs`) hands it
//! `now`, and the unit tests and the property tests drive it directly.
//!
//! # Implementation notes
//!
//! Each dimension `d` has an emission interval `T_d`, a tolerance `tau_d = b_d * T_d`
//! and a TAT `x_d`, all `u64` nanoseconds on the budget's clock. Costs are whole cells
//! (`u32`). A turn costing `c_d` conforms in `d` at `t` iff `x_d + c_d*T_d - tau_d <= t`
//! (`c_d <= b_d` is checked before, so `c_d*T_d <= tau_d` and this is GCRA's
//! `max(x_d, t) + c_d*T_d - t <= tau_d`). It is admitted at `t` only when it conforms in
//! every dimension, and only then is anything charged, in every dimension at once:
//! `x_d = max(x_d, t) + c_d*T_d`.
//!
//! **Settling by replay.** One admission is the map `x -> max(x, t_k) + c_k*T`, so a
//! dimension's TAT is its *base* (the TAT before the oldest admission still in the log)
//! run through the log's admissions in order. The log keeps every admission since the
//! oldest one not yet settled. A settle replaces that turn's cost and replays the log
//! from the base: the TAT becomes exactly what it would have been had the turn been
//! charged its real cost at its admission. A refund therefore gives back only what no
//! later admission relied on: where a later admission found the dimension idle
//! (`t_k > x`), the clamp `max(x, t_k)` already absorbed the difference, and the replay
//! gives none of it back (subtracting the difference from the TAT would). A charge
//! raises the TAT by at most the difference. Invariant, for every dimension, after every
//! operation: `x_d == replay(base_d, log)` (the property tests check it).
//!
//! Settled entries at the front of the log are folded into the base and dropped. The
//! log holds at most [`LOG_CAPACITY`] entries: an entry that finds it full closes
//! the oldest entry as if its turn had settled at its estimate, and that turn's later
//! settle is *beyond the log*: a charge is added to the base (at least what an exact
//! replay would add, since every admission's map moves its input by at most as much), a
//! refund is lost. A fork's child forgets the log the same way (`forget_log`).
//!
//! Every map is monotone and moves its output by at most what its input or its cost
//! moved (a rate change's rescale, by the same ratio as the interval: in cells, what it
//! moved), which is what makes the window bound hold (see `docs/BUDGETS.md`): a decision
//! made while a turn still carries an estimate below its real cost sees a TAT lower than
//! the exact one by at most that under-estimate.
//!
//! **Range.** Replay runs in `u128` and saturates at `u64::MAX` (584 years): a TAT
//! there admits nothing more, so an absurd charge blocks its dimension rather than wrap.
//! An admission whose new TAT would pass `u64::MAX` is never made (`Ready::Never`).
//!
//! **Holds and rate changes.** An upstream's word about a dimension ("whole again only
//! at X", "nothing before X") is a *floor* on its TAT: the map `x -> max(x, F)`, which is
//! monotone and moves its output by at most what its input moved, like an admission's.
//! So a floor is logged as an entry of its own (`Entry::Floor`), replayed in its place:
//! a settle recomputing the TAT keeps every floor applied after the settled admission,
//! and a refund cannot give back what a floor took. A rate change keeps the log's cells
//! priced at the interval that admitted them: each admission carries the intervals in
//! force when it was made (one shared `Arc` until a rate changes), and the backlog past
//! the change keeps its count of cells at the new interval, as an entry of its own
//! (`Entry::Rescale`, the map `x -> at + (x - at) * to / from` past `at`, monotone like
//! the others), so that a slower rate never frees cells and a faster one never leaves a
//! wait longer than its own (a rate changes when an upstream announces a lower one:
//! `Budget::follow`). A faster rate can bring a replay below the base, so a floor is then
//! logged even at or below the base. A hold
//! of the whole budget (a `Retry-After` that names no dimension) is one more instant,
//! `held`, that `ready` waits for beside the dimensions.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::gcra::Params;

/// The most entries a budget's log holds (admissions, and the floors an upstream's word
/// put on a dimension while turns were open): a turn that outlives this many later
/// entries (counted from the oldest turn not yet ended) keeps its estimate, and its
/// settle can then only charge, not refund.
///
/// # Examples
///
/// ```
/// assert_eq!(paceline::budget::LOG_CAPACITY, 4096);
/// ```
pub const LOG_CAPACITY: usize = 4096;

/// One dimension's quota and state.
#[derive(Clone, Debug)]
struct Dimension {
    /// The emission interval `T`, at least 1 ns.
    interval: u64,
    /// `tau = burst * T`, saturated at `u64::MAX`.
    tau: u64,
    /// The TAT: `replay(base, log)`.
    tat: u64,
    /// The TAT before the log's first entry.
    base: u64,
}

/// One entry of the log: an admission, kept while a turn admitted at or before it is
/// unsettled, or a floor on one dimension's TAT applied since.
#[derive(Clone, Debug)]
enum Entry {
    Admission {
        /// The admission instant.
        at: u64,
        /// Cells charged per dimension (the estimate, then the settled cost).
        cells: Box<[u32]>,
        /// The emission intervals in force at admission, per dimension.
        intervals: Arc<[u64]>,
        /// Whether its turn may still settle.
        open: bool,
    },
    /// Dimension `dim`'s TAT became at least `at`.
    Floor { dim: usize, at: u64 },
    /// Dimension `dim`'s interval went from `from` to `to` at `at`: the backlog past
    /// `at` is the same count of cells at the new interval.
    Rescale {
        dim: usize,
        at: u64,
        from: u64,
        to: u64,
    },
}

impl Entry {
    /// Dimension `d`'s TAT after this entry, from `x`.
    fn apply(&self, d: usize, x: u64) -> u64 {
        match self {
            Entry::Admission {
                at,
                cells,
                intervals,
                ..
            } => step(x, *at, cells[d], intervals[d]),
            Entry::Floor { dim, at } if *dim == d => x.max(*at),
            Entry::Rescale { dim, at, from, to } if *dim == d => rescale(x, *at, *from, *to),
            Entry::Floor { .. } | Entry::Rescale { .. } => x,
        }
    }

    fn is_open(&self) -> bool {
        matches!(self, Entry::Admission { open: true, .. })
    }
}

/// When a turn can be admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ready {
    /// At the instant asked about.
    Now,
    /// At this later instant, as things stand.
    At(u64),
    /// Never: its new TAT would pass the end of representable time.
    Never,
}

/// Every dimension's state and the settle log (module docs).
#[derive(Clone, Debug)]
pub(crate) struct Ledger {
    dims: Box<[Dimension]>,
    /// Each dimension's emission interval now, shared by the admissions made under it.
    intervals: Arc<[u64]>,
    log: VecDeque<Entry>,
    /// The id of `log[0]`; entries (admissions and floors) are numbered in order.
    first: u64,
    /// Nothing is admitted before this instant (a hold of the whole budget).
    held: u64,
    /// The most entries the log holds ([`LOG_CAPACITY`] in a process; a shared file's
    /// log is smaller).
    capacity: usize,
}

/// A rate change's map: the backlog `tat - at` (if any) counted in cells of `from`,
/// made the same count of cells of `to` (rounded up: never fewer), saturated.
fn rescale(tat: u64, at: u64, from: u64, to: u64) -> u64 {
    if tat <= at || from == 0 {
        return tat;
    }
    let backlog = u128::from(tat - at) * u128::from(to);
    let scaled = backlog.div_ceil(u128::from(from));
    u64::try_from(u128::from(at) + scaled).unwrap_or(u64::MAX)
}

/// One admission's map: `max(tat, at) + cells * interval`, saturated at `u64::MAX`.
fn step(tat: u64, at: u64, cells: u32, interval: u64) -> u64 {
    let next = u128::from(tat.max(at)) + u128::from(cells) * u128::from(interval);
    u64::try_from(next).unwrap_or(u64::MAX)
}

impl Ledger {
    /// A ledger whose dimensions are fresh (TAT 0: a full burst each).
    pub(crate) fn new(quotas: &[Params]) -> Ledger {
        Ledger::with_capacity(quotas, LOG_CAPACITY)
    }

    /// A fresh ledger whose log holds at most `capacity` entries (at least 1).
    pub(crate) fn with_capacity(quotas: &[Params], capacity: usize) -> Ledger {
        Ledger {
            dims: quotas
                .iter()
                .map(|p| Dimension {
                    interval: p.interval(),
                    tau: p.tau(),
                    tat: 0,
                    base: 0,
                })
                .collect(),
            intervals: quotas.iter().map(Params::interval).collect(),
            log: VecDeque::new(),
            first: 0,
            held: 0,
            capacity: capacity.max(1),
        }
    }

    /// The earliest instant, not before `now`, at which `cells` conform in every
    /// dimension as things stand. `cells` has one count per dimension, each within its
    /// burst.
    pub(crate) fn ready(&self, cells: &[u32], now: u64) -> Ready {
        let mut at = now.max(self.held);
        for (d, &c) in self.dims.iter().zip(cells) {
            let need = u128::from(d.tat) + u128::from(c) * u128::from(d.interval);
            // The instant it conforms in `d`: `tat + c*T - tau`, never below `now`.
            let fits = need.saturating_sub(u128::from(d.tau));
            let Ok(fits) = u64::try_from(fits) else {
                return Ready::Never;
            };
            at = at.max(fits);
        }
        // Admitted at `at`, each TAT becomes `max(tat, at) + c*T`: it must be
        // representable (`gcra::admit` denies for ever rather than saturate).
        let fits_in_time = self.dims.iter().zip(cells).all(|(d, &c)| {
            u128::from(d.tat.max(at)) + u128::from(c) * u128::from(d.interval)
                <= u128::from(u64::MAX)
        });
        match (fits_in_time, at == now) {
            (false, _) => Ready::Never,
            (true, true) => Ready::Now,
            (true, false) => Ready::At(at),
        }
    }

    /// Admits `cells` at `now` (the caller saw `ready(cells, now) == Ready::Now`),
    /// charging every dimension; returns the admission's id for `settle` and `close`.
    pub(crate) fn admit(&mut self, now: u64, cells: Box<[u32]>) -> u64 {
        self.make_room();
        if self.log.is_empty() {
            for d in self.dims.iter_mut() {
                d.base = d.tat;
            }
        }
        for (d, &c) in self.dims.iter_mut().zip(cells.iter()) {
            d.tat = step(d.tat, now, c, d.interval);
        }
        self.log.push_back(Entry::Admission {
            at: now,
            cells,
            intervals: Arc::clone(&self.intervals),
            open: true,
        });
        self.next_id() - 1
    }

    /// A log that is full closes its oldest unsettled turn at its estimate (module
    /// docs), making room for one entry.
    fn make_room(&mut self) {
        if self.log.len() >= self.capacity {
            if let Some(Entry::Admission { open, .. }) = self.log.front_mut() {
                *open = false;
            }
            self.trim();
        }
    }

    /// Raises dimension `d`'s TAT to at least `at` (its bucket is whole again no sooner
    /// than `at`), as a floor a later replay keeps (module docs). A floor below the TAT
    /// is still logged while turns are open: a refund may yet bring the TAT down to it.
    pub(crate) fn floor(&mut self, d: usize, at: u64) {
        if !self.log.is_empty() {
            self.make_room();
        }
        if self.log.is_empty() {
            // No replay can reach back past this: set it directly (the next admission
            // takes the TAT as its base).
            if at > self.dims[d].tat {
                self.dims[d].tat = at;
                self.dims[d].base = at;
            }
            return;
        }
        // Every replay passes through the base and only rises (`step` never lowers
        // its input): a floor at or below the base can never bind, unless a faster rate
        // logged since may bring the TAT below the base.
        let lowers =
            |e: &Entry| matches!(e, Entry::Rescale { dim, from, to, .. } if *dim == d && to < from);
        if at <= self.dims[d].base && !self.log.iter().any(lowers) {
            return;
        }
        self.log.push_back(Entry::Floor { dim: d, at });
        self.dims[d].tat = self.dims[d].tat.max(at);
    }

    /// Holds every turn until `until` (a hold of the whole budget).
    pub(crate) fn hold(&mut self, until: u64) {
        self.held = self.held.max(until);
    }

    /// The instant of the whole budget's hold (0: none).
    #[cfg(test)]
    fn held(&self) -> u64 {
        self.held
    }

    /// Dimension `d`'s interval and burst window now.
    pub(crate) fn pace(&self, d: usize) -> (u64, u64) {
        (self.dims[d].interval, self.dims[d].tau)
    }

    /// Dimension `d`'s quota is now `params` at `now`: later admissions are priced at
    /// its interval, logged ones keep theirs, and the backlog past `now` stays the same
    /// count of cells (module docs), as an entry a later replay keeps.
    pub(crate) fn set_params(&mut self, d: usize, params: &Params, now: u64) {
        let (from, to) = (self.dims[d].interval, params.interval());
        if from != to {
            let entry = Entry::Rescale {
                dim: d,
                at: now,
                from,
                to,
            };
            if self.log.is_empty() {
                // No replay can reach back past this: applied directly.
                let dim = &mut self.dims[d];
                dim.tat = entry.apply(d, dim.tat);
                dim.base = dim.tat;
            } else {
                self.make_room();
                self.dims[d].tat = entry.apply(d, self.dims[d].tat);
                self.log.push_back(entry);
            }
        }
        let dim = &mut self.dims[d];
        dim.interval = params.interval();
        dim.tau = params.tau();
        let mut intervals = self.intervals.to_vec();
        intervals[d] = params.interval();
        self.intervals = intervals.into();
    }

    /// The id the next admission gets.
    fn next_id(&self) -> u64 {
        self.first + self.log.len() as u64
    }

    /// Settles admission `id`, charged `charged`: each dimension with `Some(cells)` in
    /// `actual` now costs that many (the others keep their charge), and the turn is
    /// closed. Beyond the log only charges apply (module docs).
    pub(crate) fn settle(&mut self, id: u64, charged: &[u32], actual: &[Option<u32>]) {
        match self.open_entry(id) {
            Some(i) => {
                if let Entry::Admission { open, cells, .. } = &mut self.log[i] {
                    *open = false;
                    for (cell, new) in cells.iter_mut().zip(actual) {
                        if let Some(new) = *new {
                            *cell = new;
                        }
                    }
                }
                for (d, new) in actual.iter().enumerate() {
                    if new.is_some() {
                        self.replay(d);
                    }
                }
            }
            None => {
                for (d, (&was, new)) in charged.iter().zip(actual).enumerate() {
                    let extra = new.unwrap_or(was).saturating_sub(was);
                    if extra > 0 {
                        let dim = &mut self.dims[d];
                        dim.base = step(dim.base, 0, extra, dim.interval);
                        self.replay(d);
                    }
                }
            }
        }
        self.trim();
    }

    /// Closes admission `id` at its estimate (a turn dropped unsettled).
    pub(crate) fn close(&mut self, id: u64) {
        if let Some(i) = self.open_entry(id) {
            if let Entry::Admission { open, .. } = &mut self.log[i] {
                *open = false;
            }
            self.trim();
        }
    }

    /// The index in the log of admission `id`, if it is there and open.
    fn open_entry(&self, id: u64) -> Option<usize> {
        let i = usize::try_from(id.checked_sub(self.first)?).ok()?;
        self.log.get(i).filter(|e| e.is_open()).map(|_| i)
    }

    /// Recomputes dimension `d`'s TAT from its base through the log.
    fn replay(&mut self, d: usize) {
        let tat = self
            .log
            .iter()
            .fold(self.dims[d].base, |x, e| e.apply(d, x));
        self.dims[d].tat = tat;
    }

    /// Folds settled entries at the front of the log into the base.
    fn trim(&mut self) {
        while self.log.front().is_some_and(|e| !e.is_open()) {
            if let Some(e) = self.log.pop_front() {
                for (d, dim) in self.dims.iter_mut().enumerate() {
                    dim.base = e.apply(d, dim.base);
                }
                self.first += 1;
            }
        }
    }

    /// Forgets the log, keeping every charge as it stands (a fork's child: the turns
    /// of the threads that did not come along never settle).
    pub(crate) fn forget_log(&mut self) {
        self.first = self.next_id();
        self.log.clear();
        for d in self.dims.iter_mut() {
            d.base = d.tat;
        }
    }

    /// The instant a turn costing `cells` would be admitted behind `ahead` (each
    /// admitted in order, as early as the rates allow), as things stand: no permit
    /// counted, no settle to come. `None`: never.
    pub(crate) fn simulate<'a>(
        &self,
        ahead: impl Iterator<Item = &'a [u32]>,
        cells: &'a [u32],
        now: u64,
    ) -> Option<u64> {
        let mut ledger = Ledger {
            dims: self.dims.clone(),
            intervals: Arc::clone(&self.intervals),
            log: VecDeque::new(),
            first: 0,
            held: self.held,
            capacity: self.capacity,
        };
        let mut at = now;
        for turn in ahead.chain(core::iter::once(cells)) {
            at = match ledger.ready(turn, at) {
                Ready::Now => at,
                Ready::At(later) => later,
                Ready::Never => return None,
            };
            for (d, &c) in ledger.dims.iter_mut().zip(turn) {
                d.tat = step(d.tat, at, c, d.interval);
            }
        }
        Some(at)
    }

    /// Cells of dimension `d` that would conform at `now`, spending nothing.
    pub(crate) fn remaining(&self, d: usize, now: u64) -> u64 {
        if self.held > now {
            return 0;
        }
        let dim = &self.dims[d];
        let backlog = dim.tat.max(now) - now;
        dim.tau.saturating_sub(backlog) / dim.interval
    }

    /// Dimension `d`'s TAT.
    #[cfg(test)]
    fn tat(&self, d: usize) -> u64 {
        self.dims[d].tat
    }

    /// The instant from which every dimension is whole again and no hold is in force.
    #[cfg(feature = "redis-scripts")]
    pub(crate) fn whole_at(&self) -> u64 {
        self.dims.iter().map(|d| d.tat).fold(self.held, u64::max)
    }

    /// Admissions in the log.
    #[cfg(test)]
    fn logged(&self) -> usize {
        self.log.len()
    }

    /// Whether every TAT equals its replay (the module's invariant), for tests.
    #[cfg(test)]
    fn consistent(&self) -> bool {
        (0..self.dims.len()).all(|d| {
            let dim = &self.dims[d];
            self.log.iter().fold(dim.base, |x, e| e.apply(d, x)) == dim.tat
        })
    }
}

#[cfg(any(feature = "shared", feature = "redis-scripts"))]
pub(crate) mod codec;
#[cfg(test)]
mod tests;
