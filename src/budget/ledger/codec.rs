//! A ledger as words, for a budget whose ledger lives in a file shared by processes
//! (`crate::shared::budget`), which keeps it as `u64`s and rebuilds it under its lock.
//!
//! ```text
//! word            field
//!    0            entries in the log (n)
//!    1            the id of the log's first entry
//!    2            the whole budget's hold
//!    3 + 4d ...   dimension d: interval, tau, TAT, base
//!    3 + 4D + d   dimension d's interval now
//!    3 + 5D + e*(5 + 2D) ...
//!                 entry e: kind (1 admission, 2 floor, 3 rescale) | open << 8, instant,
//!                 dimension, from, to, then D cells and D intervals (admissions)
//! ```
//!
//! Decoding checks what a damaged file could break: counts within the capacity, kinds,
//! dimensions in range, intervals of at least 1 ns (an interval divides), cells within
//! `u32`. Any other value only makes the file's decisions wrong, never a panic.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{Dimension, Entry, Ledger};

const ADMISSION: u64 = 1;
const FLOOR: u64 = 2;
const RESCALE: u64 = 3;

/// Words of a ledger of `dims` dimensions and `entries` log entries.
pub(crate) const fn words(dims: usize, entries: usize) -> usize {
    3 + 5 * dims + entries * entry_words(dims)
}

const fn entry_words(dims: usize) -> usize {
    5 + 2 * dims
}

impl Ledger {
    /// Appends the ledger's words to `out` (module docs).
    pub(crate) fn encode(&self, out: &mut Vec<u64>) {
        let dims = self.dims.len();
        out.reserve(words(dims, self.log.len()));
        out.extend([self.log.len() as u64, self.first, self.held]);
        for d in self.dims.iter() {
            out.extend([d.interval, d.tau, d.tat, d.base]);
        }
        out.extend(self.intervals.iter().copied());
        for entry in &self.log {
            let (kind, at, dim, from, to) = match entry {
                Entry::Admission { at, open, .. } => {
                    (ADMISSION | u64::from(*open) << 8, *at, 0, 0, 0)
                }
                Entry::Floor { dim, at } => (FLOOR, *at, *dim as u64, 0, 0),
                Entry::Rescale { dim, at, from, to } => (RESCALE, *at, *dim as u64, *from, *to),
            };
            out.extend([kind, at, dim, from, to]);
            match entry {
                Entry::Admission {
                    cells, intervals, ..
                } => {
                    out.extend(cells.iter().map(|&c| u64::from(c)));
                    out.extend(intervals.iter().copied());
                }
                _ => out.extend(core::iter::repeat_n(0, 2 * dims)),
            }
        }
    }

    /// The ledger of `dims` dimensions whose log holds at most `capacity` entries that
    /// `words` encode, or `None` where they cannot be one (module docs). `words` may run
    /// past the ledger's end.
    pub(crate) fn decode(words: &[u64], dims: usize, capacity: usize) -> Option<Ledger> {
        let head = words.get(..3 + 5 * dims)?;
        let n = usize::try_from(head[0]).ok().filter(|&n| n <= capacity)?;
        let (first, held) = (head[1], head[2]);
        let dimensions: Box<[Dimension]> = head[3..3 + 4 * dims]
            .chunks_exact(4)
            .map(|w| {
                (w[0] >= 1).then_some(Dimension {
                    interval: w[0],
                    tau: w[1],
                    tat: w[2],
                    base: w[3],
                })
            })
            .collect::<Option<_>>()?;
        let intervals: Arc<[u64]> = interval_list(&head[3 + 4 * dims..])?;
        let body = words.get(head.len()..head.len() + n * entry_words(dims))?;
        let mut log = VecDeque::with_capacity(n);
        let mut last: Option<Arc<[u64]>> = None;
        for e in body.chunks_exact(entry_words(dims)) {
            let (kind, at, dim, from, to) = (e[0], e[1], e[2], e[3], e[4]);
            let entry = match kind & 0xff {
                ADMISSION => {
                    let cells = e[5..5 + dims]
                        .iter()
                        .map(|&c| u32::try_from(c).ok())
                        .collect::<Option<Box<[u32]>>>()?;
                    let listed = interval_list(&e[5 + dims..])?;
                    let intervals = match last.take() {
                        Some(prev) if prev == listed => prev,
                        _ => listed,
                    };
                    last = Some(Arc::clone(&intervals));
                    Entry::Admission {
                        at,
                        cells,
                        intervals,
                        open: kind >> 8 & 1 == 1,
                    }
                }
                FLOOR => Entry::Floor {
                    dim: usize::try_from(dim).ok().filter(|&d| d < dims)?,
                    at,
                },
                RESCALE => Entry::Rescale {
                    dim: usize::try_from(dim).ok().filter(|&d| d < dims)?,
                    at,
                    from,
                    to,
                },
                _ => return None,
            };
            log.push_back(entry);
        }
        Some(Ledger {
            dims: dimensions,
            intervals,
            log,
            first,
            held,
            capacity,
        })
    }
}

/// The first `dims` words as intervals, each at least 1 ns (`dims` is the slice's length
/// cut by the caller), or `None`.
fn interval_list(words: &[u64]) -> Option<Arc<[u64]>> {
    words.iter().all(|&t| t >= 1).then(|| words.into())
}

#[cfg(test)]
mod tests {
    use super::super::Ready;
    use super::*;
    use crate::gcra::Params;
    use crate::quota::Quota;

    fn params(per_second: u32, burst: u32) -> Params {
        *Quota::per_second(per_second).with_burst(burst).params()
    }

    fn round_trip(ledger: &Ledger) -> Ledger {
        let mut words = Vec::new();
        ledger.encode(&mut words);
        assert_eq!(
            words.len(),
            super::words(ledger.dims.len(), ledger.log.len())
        );
        Ledger::decode(&words, ledger.dims.len(), ledger.capacity).expect("decodes")
    }

    #[test]
    fn a_ledger_decodes_to_what_was_encoded_and_decides_alike() {
        let mut ledger = Ledger::with_capacity(&[params(10, 5), params(1_000, 2_000)], 64);
        let a = ledger.admit(0, [1, 1_500].into());
        ledger.floor(0, 300_000_000);
        ledger.set_params(1, &params(500, 2_000), 10);
        let b = ledger.admit(400_000_000, [2, 100].into());
        ledger.hold(7);
        let mut copy = round_trip(&ledger);
        assert_eq!(format!("{copy:?}"), format!("{ledger:?}"));
        assert!(copy.consistent());
        for l in [&mut ledger, &mut copy] {
            l.settle(a, &[1, 1_500], &[None, Some(200)]);
            l.close(b);
        }
        assert_eq!(format!("{copy:?}"), format!("{ledger:?}"));
        assert_eq!(copy.ready(&[5, 10], 0), ledger.ready(&[5, 10], 0));
        assert_ne!(copy.ready(&[5, 10], 0), Ready::Now);
    }

    #[test]
    fn damaged_words_are_refused_and_short_ones_too() {
        let mut ledger = Ledger::with_capacity(&[params(10, 5), params(5, 5)], 4);
        ledger.admit(0, [1, 2].into());
        ledger.floor(1, 1);
        let mut words = Vec::new();
        ledger.encode(&mut words);
        let decode = |w: &[u64]| Ledger::decode(w, 2, 4).is_some();
        assert!(decode(&words));
        assert!(!decode(&words[..words.len() - 1]));
        let head = 3 + 5 * 2;
        let entry = head + entry_words(2);
        let damaged = |at: usize, value: u64| {
            let mut w = words.clone();
            w[at] = value;
            w
        };
        assert!(!decode(&damaged(0, 5)), "more entries than the capacity");
        assert!(!decode(&damaged(3, 0)), "an interval of 0");
        assert!(!decode(&damaged(3 + 8, 0)), "a current interval of 0");
        assert!(!decode(&damaged(head, 9)), "an unknown kind");
        assert!(!decode(&damaged(head + 5, u64::MAX)), "cells past u32");
        assert!(
            !decode(&damaged(head + 5 + 2, 0)),
            "an admission's interval of 0"
        );
        assert!(
            !decode(&damaged(entry + 2, 2)),
            "a floor's dimension out of range"
        );
    }
}
