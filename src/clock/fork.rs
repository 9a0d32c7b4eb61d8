//! Surviving `fork`: the clock threads paceline runs itself, started again in the child.
//!
//! # Implementation notes
//!
//! `fork` copies the calling thread only. A process that forked after its default clock's
//! timer thread (or a coarse clock's upkeep thread) started has, in the child, the
//! timer's map and the limiters' queues exactly as they were, but no thread serving them:
//! every sleeper in the child would wait for ever. So each of those modules registers
//! three handlers with `pthread_atfork`, once per process:
//!
//! * *prepare* (in the forking thread, before the fork) takes the module's lock and keeps
//!   it across the fork, so that no other thread is half-way through changing what the
//!   lock guards when the copy is made (the timer also waits, briefly, until its thread is
//!   between wake-ups: a wake-up holds a limiter's queue lock for a moment);
//! * *parent* releases it;
//! * *child* forgets the threads that did not come along, starts new ones for whatever
//!   is still pending, and releases it.
//!
//! **A queue's armed wake-up.** A limiter's queue remembers the wake-up it asked its clock
//! for, and does not ask again for a later instant. Another thread may have recorded one
//! and not yet asked when the process forks; the child would then wait for a wake-up
//! nobody asked for. So the queue records the [`generation`] (forks this process's line
//! has gone through) with it, and a record from before a fork counts as no record.
//!
//! Handlers run inside `fork`, in C's calling convention: they must not unwind, so they
//! only lock (poisoning ignored), move values and spawn threads, none of which panics.
//! A thread that cannot be spawned in the child is spawned by the next wake-up request.

use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// Forks this process descends through, counted by a child handler.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// How many forks lie between this process and the one that first asked: 0 in the
/// process where paceline was first used, 1 in its children, and so on.
pub(crate) fn generation() -> u64 {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| at_fork(None, None, Some(count_fork)));
    // Relaxed: the counter publishes nothing. The child handler runs before the child
    // has any thread but the forking one, and later threads are spawned after it.
    FORKS.load(Ordering::Relaxed)
}

extern "C" fn count_fork() {
    // Relaxed: as in `generation`.
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Registers the three handlers (see the module docs). Registration failing (out of
/// memory) leaves forked children without the restart, as they were before; nothing else
/// depends on it.
#[cfg(unix)]
pub(super) fn at_fork(
    prepare: Option<extern "C" fn()>,
    parent: Option<extern "C" fn()>,
    child: Option<extern "C" fn()>,
) {
    let c = |handler: Option<extern "C" fn()>| handler.map(|f| f as unsafe extern "C" fn());
    // SAFETY: each handler is a plain `extern "C" fn()` that never unwinds (module docs)
    // and lives for the whole program, as `pthread_atfork` requires.
    let _ = unsafe { libc::pthread_atfork(c(prepare), c(parent), c(child)) };
}

/// Elsewhere there is no `fork`.
#[cfg(not(unix))]
pub(super) fn at_fork(
    _prepare: Option<extern "C" fn()>,
    _parent: Option<extern "C" fn()>,
    _child: Option<extern "C" fn()>,
) {
}
