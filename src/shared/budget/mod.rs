//! [`SharedBudget`]: a [`Budget`](crate::budget::Budget) for every process that opens the
//! same file. The handle and what its clones share live here; opening in `open.rs`, the
//! public methods in `methods.rs`, the decisions in `admit.rs`, the file's lock and state
//! in `store.rs`, waiting in `waiting.rs`, turns in `turn.rs`.

mod error;
mod methods;
mod open;
mod store;
mod turn;
mod waiting;

use core::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::error::SharedError;
use super::file::{self, Mapping};
use super::options::OpenOptions;
use super::process;
use crate::budget::queue::{Ask, Refusal, State, Step};
use crate::budget::{cells_for, settled_for, BudgetError};
use crate::clock::{gate, Clock, HostClock};
use crate::sync::Mutex;
use open::{open_file, Config};
use store::Region;

pub use crate::budget::queue::ABANDONED;
pub use error::{SharedBudgetError, SharedSettleError};
pub use open::SharedBudgetBuilder;
pub use store::{LOCK_PATIENCE, MAX_WAITING};
pub use turn::SharedTurn;
pub use waiting::{SharedAcquire, SharedStep};

/// Several rates and an in-flight cap shared by every process that opens one file: the
/// promises of [`Budget`](crate::budget::Budget), across processes.
///
/// * **One turn across every dimension, FIFO, never partial.** Callers of every process
///   wait in one queue in the file, in arrival order; the first is admitted when every
///   dimension admits it and a permit is free, and only then is it charged, in every
///   dimension at once. A heavy caller is never overtaken by light ones. A caller
///   dropped before its turn has spent nothing, and the one behind it moves up.
/// * **In flight.** The cap holds over every process at every instant. A permit returns
///   when its turn is settled or dropped, also on a panic or a cancellation, and when its
///   process is gone (killed, or exited without ending it).
/// * **Settled after the call**, as in one process ([`SharedTurn::settle`]): a refund
///   gives back only what no later admission relied on, a charge delays those behind.
///
/// Clones share one opened file; a file removed or replaced at its path is opened again
/// at the next call, so that every process goes on sharing one budget (turns taken in the
/// file before end there). Every call takes the file's lock for microseconds (a
/// budget guards API calls, not a nanosecond hot path); a process killed inside it is
/// taken over at once, one stopped inside it makes the others' calls fail after
/// [`LOCK_PATIENCE`] with [`SharedError::Locked`], changing nothing.
///
/// # Examples
///
/// ```
/// use paceline::shared::SharedBudget;
/// use paceline::Quota;
///
/// # let path = std::env::temp_dir().join(format!("paceline-doc-budget-{}", std::process::id()));
/// // Every worker process opens the same file ("/dev/shm/model-api" on Linux).
/// let budget = SharedBudget::builder()
///     .rate("requests", Quota::per_minute(500))
///     .rate("tokens", Quota::per_minute(200_000))
///     .in_flight(8)
///     .open(&path)?;
/// let turn = budget.acquire_blocking(&[("tokens", 1_200)])?;
/// // ... the call; its response says it used 900 tokens ...
/// turn.settle(&[("tokens", 900)])?;
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SharedBudget {
    handle: Arc<Handle>,
}

/// What the clones of a [`SharedBudget`] share: the file open now, and how to open its
/// path again.
struct Handle {
    /// The file the path led to when last looked at.
    current: Mutex<Arc<Inner>>,
    /// The path, absolute.
    path: PathBuf,
    /// The budget every file at the path must hold.
    config: Config,
    /// How the path is opened again (refusing another budget).
    options: OpenOptions,
}

impl SharedBudget {
    /// The file the path leads to now: the one open, or, once it was removed or replaced
    /// at its path (an operator, a cleaner of `/tmp`), the one there now, opened (or made)
    /// again, so that every process goes on sharing one budget. Turns and waiters of the
    /// file before go on in it.
    fn current(&self) -> Result<Arc<Inner>, SharedError> {
        let handle = &self.handle;
        let mut current = gate::lock(&handle.current);
        if !file::is_at(&handle.path, current.identity) {
            let inner = open_file(&handle.path, handle.config.clone(), &handle.options)?;
            *current = Arc::new(inner);
        }
        Ok(Arc::clone(&current))
    }

    /// The file open now, as it is (for what needs no look at the path).
    fn open_now(&self) -> Arc<Inner> {
        Arc::clone(&gate::lock(&self.handle.current))
    }
}

/// What the handles of one opened budget file share.
pub(crate) struct Inner {
    map: Mapping,
    dims: usize,
    config: Config,
    clock: HostClock,
    /// The file's device and inode.
    identity: (u64, u64),
    /// Threads of this process take the file's lock one at a time (`store.rs`).
    local: Mutex<()>,
}

impl Inner {
    fn region(&self) -> Region<'_> {
        Region {
            map: &self.map,
            dims: self.dims,
        }
    }

    /// Runs `f` on the state under this process's mutex and the file's lock, writing it
    /// back; advances the epochs (`admit.rs`) by the waiters that left the queue and the
    /// turns that ended (and by one more for the head's when `moves` says the rates or
    /// holds changed).
    fn with<R>(&self, moves: bool, f: impl FnOnce(&mut State, u64) -> R) -> Result<R, SharedError> {
        let _local = gate::lock(&self.local);
        let region = self.region();
        let mut left = (0, 0);
        let out = region.with(self.map.path(), |state| {
            let before = state.roll();
            let now = self.clock.now();
            let out = f(state, now);
            left = state.departures(&before);
            (out, true)
        })?;
        region.bump(left.0 + u64::from(moves), left.1);
        Ok(out)
    }

    fn cells(&self, costs: &[(&str, u32)]) -> Result<Box<[u32]>, BudgetError> {
        cells_for(&self.config.names, &self.config.quotas, costs)
    }

    /// A step for a caller asking `cells` with `deadline`, made by `f`.
    fn step(
        &self,
        cells: &[u32],
        deadline: Option<u64>,
        f: impl FnOnce(&mut State, &Ask<'_>) -> Result<Step, Refusal>,
    ) -> Result<Step, SharedBudgetError> {
        let me = process::identity();
        let cap = self.config.cap;
        let outcome = self.with(false, |state, now| {
            let ask = Ask {
                cells,
                cap,
                now,
                deadline,
                me,
                alive: &process::still,
            };
            f(state, &ask)
        })?;
        outcome.map_err(|refusal| match refusal {
            Refusal::Budget(e) => SharedBudgetError::Budget(e),
            Refusal::Full => SharedBudgetError::File(SharedError::TooManyCallers {
                path: self.map.path().to_owned(),
            }),
        })
    }

    /// Ends caller `ticket` of this process (module docs of `admit.rs`).
    fn end(
        &self,
        ticket: u64,
        charged: &[u32],
        actual: Option<&[Option<u32>]>,
    ) -> Result<(), SharedError> {
        self.with(false, |state, _| {
            state.end(ticket, charged, actual);
        })
    }
}

impl fmt::Debug for SharedBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBudget")
            .field("path", &self.handle.path)
            .field("dimensions", &self.dimensions().collect::<Vec<_>>())
            .field("in_flight", &self.handle.config.cap)
            .finish_non_exhaustive()
    }
}

/// Settled cells for `costs`, for [`SharedTurn::settle`].
fn settled(inner: &Inner, costs: &[(&str, u32)]) -> Result<Box<[Option<u32>]>, BudgetError> {
    settled_for(&inner.config.names, costs)
}
