//! A budget's lock across `fork`.
//!
//! Every operation of a budget takes its state's lock, and `fork` copies the calling
//! thread only: a child copied while another thread held a budget's lock would find it
//! held for ever. So every budget's lock is taken under one process-wide gate, shared
//! (a read lock, taken before the state's lock and let go after it), and the fork's
//! *prepare* handler takes the gate exclusively and keeps it across the fork
//! (`clock/fork.rs`): the copy is made while no thread is inside any budget's lock. The
//! gate is shared by every budget, and held only while a state lock is, for the few
//! hundred nanoseconds an operation takes.
//!
//! A budget operation never forks, and wakes its wakers after letting its lock go, so the
//! forking thread never holds the gate shared when its prepare handler asks for it.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::clock::fork::{self, Hooks};

static GATE: RwLock<()> = RwLock::new(());

std::thread_local! {
    /// The gate, held exclusively by the forking thread across the fork.
    static HELD: core::cell::Cell<Option<RwLockWriteGuard<'static, ()>>> =
        const { core::cell::Cell::new(None) };
}

static FORK_HOOKS: Hooks = Hooks::new(hold_for_fork, release_after_fork, release_after_fork);

/// Adds the hooks (once per process): a budget's constructor calls it before the budget's
/// lock is first taken.
pub(super) fn register() {
    fork::add(&FORK_HOOKS);
}

/// The gate, shared: taken before a budget's state lock, let go after it. Nothing under it
/// panics half-way, so poisoning carries no broken invariant.
pub(super) fn enter() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Fork's prepare handler: no thread is inside a budget's lock at the fork.
fn hold_for_fork() {
    HELD.with(|held| {
        // Registered twice (`fork.rs`): the first run holds it already.
        let guard = held
            .take()
            .unwrap_or_else(|| GATE.write().unwrap_or_else(PoisonError::into_inner));
        held.set(Some(guard));
    });
}

/// Fork's parent and child handlers: the gate goes. In the child, each budget forgets the
/// parent's waiters and turns at its next lock (`State::forget_before_fork`).
fn release_after_fork() {
    drop(HELD.with(core::cell::Cell::take));
}
