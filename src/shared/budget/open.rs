//! Opening a shared budget: its builder, and its rates and cap as asked for and as its
//! file holds them.

use core::fmt;
use std::path::Path;
use std::sync::Arc;

use super::store::Region;
use super::{Handle, Inner, SharedBudget, MAX_WAITING};
use crate::budget::queue::State;
use crate::budget::Ledger;
use crate::clock::HostClock;
use crate::gcra::Params;
use crate::quota::Quota;
use crate::shared::error::SharedError;
use crate::shared::file::{self, Mapping, Want};
use crate::shared::layout::{self, Kind};
use crate::shared::options::{OnMismatch, OpenOptions};
use crate::sync::{Mutex, Ordering};

/// Builds a [`SharedBudget`]: its rates, by name, its in-flight cap, how to open its file.
///
/// # Examples
///
/// See [`SharedBudget`].
#[derive(Clone, Debug, Default)]
pub struct SharedBudgetBuilder {
    rates: Vec<(String, Quota)>,
    in_flight: Option<u32>,
    options: OpenOptions,
}

impl SharedBudget {
    /// A builder.
    ///
    /// # Examples
    ///
    /// See [`SharedBudget`].
    pub fn builder() -> SharedBudgetBuilder {
        SharedBudgetBuilder::default()
    }
}

impl SharedBudgetBuilder {
    crate::budget::rate_and_in_flight! {
        /// Adds a dimension: `quota` of `name` (at most
        /// [`MAX_DIMENSION_NAME_LEN`](crate::shared::MAX_DIMENSION_NAME_LEN) bytes; at most
        /// [`MAX_DIMENSIONS`](crate::shared::MAX_DIMENSIONS) of them).
        ///
        /// # Examples
        ///
        /// See [`SharedBudget`].
        fn rate;

        /// Caps the calls in flight over every process (at most [`MAX_WAITING`]).
        ///
        /// # Examples
        ///
        /// See [`SharedBudget`].
        fn in_flight;
    }

    /// How to open the file: whom to trust, the budget's name, and what to do when the
    /// file holds another budget ([`OnMismatch::Adopt`] takes the file's;
    /// [`OnMismatch::Replace`] is refused: a budget's turns on record were charged under
    /// its rates).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::{OnMismatch, SharedBudget};
    /// use paceline::Quota;
    ///
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-o-{}", std::process::id()));
    /// let first = SharedBudget::builder().rate("requests", Quota::per_second(5)).open(&path)?;
    /// let follower = SharedBudget::builder()
    ///     .rate("requests", Quota::per_second(9))
    ///     .options(OnMismatch::Adopt)
    ///     .open(&path)?;
    /// assert_eq!(follower.quota("requests")?, Quota::per_second(5));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn options(mut self, options: impl Into<OpenOptions>) -> Self {
        self.options = options.into();
        self
    }

    /// Opens the budget at `path`, making the file if there is none (see
    /// [`crate::shared`], "Who can use a file").
    ///
    /// # Errors
    ///
    /// [`SharedError::BadBudget`] for a budget that cannot be (no rate and no cap, a cap
    /// of 0, a name empty, too long or given twice, too many rates);
    /// [`SharedError::BudgetMismatch`] when the file holds another budget; and the
    /// errors of opening any shared file.
    ///
    /// # Examples
    ///
    /// See [`SharedBudget`].
    pub fn open(self, path: impl AsRef<Path>) -> Result<SharedBudget, SharedError> {
        let asked = Config::checked(self.rates, self.in_flight)?;
        let inner = open_file(path.as_ref(), asked, &self.options)?;
        // Opened again (the file removed or replaced at its path), it must hold this very
        // budget: the handle's clones go on with its dimensions.
        let options = self.options.on_mismatch(OnMismatch::Refuse);
        // Reading the fork generation registers the fork handlers early
        // (`clock/fork.rs`), the gate's among them.
        crate::clock::forks();
        Ok(SharedBudget {
            handle: Arc::new(Handle {
                path: inner.map.path().to_owned(),
                config: inner.config.clone(),
                options,
                current: Mutex::new(Arc::new(inner)),
            }),
        })
    }
}

/// Opens the budget file at `path` for the budget `asked` (see [`SharedBudgetBuilder::open`]).
pub(super) fn open_file(
    path: &Path,
    asked: Config,
    options: &OpenOptions,
) -> Result<Inner, SharedError> {
    let dims = asked.names.len();
    let init_config = asked.clone();
    let want = Want {
        kind: Kind::Budget { dims: dims as u64 },
        settle: Box::new(move |_: &Mapping, found: Kind| Ok(found)),
        init: Box::new(move |map: &Mapping| init_config.init(map)),
    };
    // The file's own kind comes back: its dimensions, whatever was asked.
    let opened = file::open(path, want, options)?;
    let Kind::Budget { dims } = opened.kind else {
        unreachable!("a budget file was asked for")
    };
    let map = opened.mapping;
    // Callers are recorded by process id, and a process whose turn holds a permit is
    // cleared out once its id is gone: in another PID namespace, ids name other processes.
    let made_in = map.word(layout::BUDGET_PIDNS_AT).load(Ordering::Relaxed);
    let here = crate::shared::process::namespace();
    if made_in != here && made_in != 0 && here != 0 {
        return Err(SharedError::BadBudget {
            reason: format!(
                "{} was made by a process in another PID namespace (a container sharing the \
                 directory): a budget records its callers by process id, which means another \
                 process there; share it only between processes of one PID namespace",
                map.path().display()
            ),
        });
    }
    let found = Config::read(&map, dims as usize).ok_or_else(|| SharedError::Corrupt {
        path: map.path().to_owned(),
        field: "budget rates",
    })?;
    // The same rates named in another order are the same budget: the file's order.
    let config = if found.same_as(&asked) {
        found
    } else {
        match options.on_mismatch {
            OnMismatch::Adopt => found,
            OnMismatch::Refuse => {
                return Err(SharedError::BudgetMismatch {
                    path: map.path().to_owned(),
                    file: found.to_string(),
                    asked: asked.to_string(),
                })
            }
            OnMismatch::Replace => {
                return Err(SharedError::BadBudget {
                    reason: format!(
                        "{} holds the budget {found}; a budget's rates are not replaced \
                         in place (its turns on record were charged under them): open it \
                         with OnMismatch::Adopt, or remove the file while no process \
                         uses it",
                        map.path().display()
                    ),
                })
            }
        }
    };
    Ok(Inner {
        dims: config.names.len(),
        config,
        clock: HostClock::new(opened.time),
        identity: opened.identity,
        map,
        local: Mutex::new(()),
    })
}

/// A budget's rates and cap, as asked for or as a file holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Config {
    pub(super) names: Box<[String]>,
    pub(super) quotas: Box<[Quota]>,
    pub(super) cap: Option<u32>,
}

impl Config {
    /// Whether two configs hold the same rates (in any order) and the same cap.
    fn same_as(&self, other: &Config) -> bool {
        let rates = |c: &Config| {
            let mut r: Vec<(String, Quota)> = c
                .names
                .iter()
                .cloned()
                .zip(c.quotas.iter().copied())
                .collect();
            r.sort_by(|a, b| a.0.cmp(&b.0));
            r
        };
        self.cap == other.cap && rates(self) == rates(other)
    }

    /// The budget asked for, or why it cannot be.
    fn checked(rates: Vec<(String, Quota)>, cap: Option<u32>) -> Result<Config, SharedError> {
        let bad = |reason: String| Err(SharedError::BadBudget { reason });
        if rates.is_empty() && cap.is_none() {
            return bad("a budget needs at least one rate or an in-flight cap".into());
        }
        if cap == Some(0) {
            return bad("an in-flight cap of 0 would never let a call run".into());
        }
        if cap.is_some_and(|c| c as usize > MAX_WAITING) {
            return bad(format!("an in-flight cap above {MAX_WAITING}"));
        }
        if rates.len() > layout::MAX_DIMENSIONS {
            return bad(format!(
                "{} rates; a shared budget has at most {}",
                rates.len(),
                layout::MAX_DIMENSIONS
            ));
        }
        for (i, (name, _)) in rates.iter().enumerate() {
            if name.is_empty() {
                return bad("a rate needs a non-empty name".into());
            }
            if name.len() > layout::MAX_DIMENSION_NAME_LEN {
                return bad(format!(
                    "the rate name {name:?} is longer than {} bytes",
                    layout::MAX_DIMENSION_NAME_LEN
                ));
            }
            if rates[..i].iter().any(|(n, _)| n == name) {
                return bad(format!("two rates are named {name:?}"));
            }
        }
        let (names, quotas): (Vec<_>, Vec<_>) = rates.into_iter().unzip();
        Ok(Config {
            names: names.into(),
            quotas: quotas.into(),
            cap,
        })
    }

    /// Writes the rates, the cap and a fresh state into a new file.
    fn init(&self, map: &Mapping) {
        // Relaxed: the magic's Release store publishes the new file (`file/make.rs`).
        let store = |at, value| map.word(at).store(value, Ordering::Relaxed);
        store(layout::BUDGET_CAP_AT, self.cap.map_or(0, u64::from));
        store(layout::BUDGET_PIDNS_AT, crate::shared::process::namespace());
        for (d, (name, quota)) in self.names.iter().zip(self.quotas.iter()).enumerate() {
            let mut bytes = [0u8; layout::MAX_DIMENSION_NAME_LEN];
            bytes[..name.len()].copy_from_slice(name.as_bytes());
            store(layout::budget_rate(d, 0), name.len() as u64);
            for (i, chunk) in bytes.chunks_exact(8).enumerate() {
                store(
                    layout::budget_rate(d, 1 + i),
                    u64::from_ne_bytes(chunk.try_into().expect("8 bytes")),
                );
            }
            store(layout::budget_rate(d, 5), quota.params().interval());
            store(layout::budget_rate(d, 6), u64::from(quota.params().burst()));
        }
        let params: Vec<Params> = self.quotas.iter().map(|q| *q.params()).collect();
        let region = Region {
            map,
            dims: self.names.len(),
        };
        region.init(&State::fresh(
            Ledger::with_capacity(&params, layout::BUDGET_LOG),
            MAX_WAITING,
        ));
    }

    /// The rates and cap a file holds, or `None` where they are damaged.
    fn read(map: &Mapping, dims: usize) -> Option<Config> {
        let load = |at| map.word(at).load(Ordering::Relaxed);
        let cap = match load(layout::BUDGET_CAP_AT) {
            0 => None,
            c => Some(
                u32::try_from(c)
                    .ok()
                    .filter(|&c| c as usize <= MAX_WAITING)?,
            ),
        };
        let mut names = Vec::with_capacity(dims);
        let mut quotas = Vec::with_capacity(dims);
        for d in 0..dims {
            let len = usize::try_from(load(layout::budget_rate(d, 0)))
                .ok()
                .filter(|l| (1..=layout::MAX_DIMENSION_NAME_LEN).contains(l))?;
            let bytes: Vec<u8> = (1..5)
                .flat_map(|i| load(layout::budget_rate(d, i)).to_ne_bytes())
                .take(len)
                .collect();
            names.push(String::from_utf8(bytes).ok()?);
            let burst = u32::try_from(load(layout::budget_rate(d, 6))).ok()?;
            let params = Params::new(load(layout::budget_rate(d, 5)), burst)?;
            quotas.push(Quota::from_params(params));
        }
        Some(Config {
            names: names.into(),
            quotas: quotas.into(),
            cap,
        })
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rates: Vec<String> = self
            .names
            .iter()
            .zip(self.quotas.iter())
            .map(|(n, q)| {
                format!(
                    "{n}: 1 every {:?}, bursts of {}",
                    q.emission_interval(),
                    q.burst()
                )
            })
            .collect();
        write!(f, "[{}]", rates.join("; "))?;
        match self.cap {
            Some(cap) => write!(f, " with {cap} in flight"),
            None => f.write_str(" with no in-flight cap"),
        }
    }
}
