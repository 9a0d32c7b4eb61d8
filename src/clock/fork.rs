//! Surviving `fork`: the clock threads paceline runs itself, started again in the child.
//!
//! # Implementation notes
//!
//! `fork` copies the calling thread only. A process that forked after its default clock's
//! timer thread (or a coarse clock's upkeep thread) started has, in the child, the
//! timer's map and the limiters' queues exactly as they were, but no thread serving them:
//! every sleeper in the child would wait for ever. So each of those modules registers
//! three hooks with this module, which runs them from the three handlers it registers
//! with `pthread_atfork`, once per process:
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
//!
//! **Registered once, early, for every module.** One set of handlers serves every module's
//! hooks and the fork count; this module knows the others only as [`Hooks`] they add
//! (the clock module hands it the whole set, so they are added early; each module also
//! adds its own before it first takes its lock). The handlers run the hooks that were
//! added when the fork's *prepare* ran, in the order they were added; hooks are
//! independent of each other, so the order is immaterial. The C library runs the handlers it had when a
//! fork began: a set registered while another thread forks does not run for that fork,
//! and the child inherits the timer exactly as it was copied, server thread recorded and
//! gone, so its waiters sleep for ever. Registered by the first wait, that window was as
//! wide as a program that forks soon after it starts waiting makes it. So the set is
//! registered by the first limiter or clock made in the process (every constructor reads
//! [`generation`]), holding no lock of paceline's. What remains is a fork in another
//! thread at the very moment the process's first limiter or clock is made, and used
//! before the fork copies the process: that child's clock threads are not restarted.
//!
//! **Registering never hangs a child.** `pthread_atfork` waits while the C library runs
//! a fork's handlers, and a child copied while a thread of its parent was registering
//! would find a `Once` around the registration "running" for ever, and hang. So the
//! registration is recorded in one atomic word instead: done, or the process id of the
//! process one of whose threads is registering. A thread of that same process waits for
//! it (it finishes when the fork does); a thread that finds another process's id (its
//! parent's, copied mid-registration) registers the handlers itself. The child handler
//! marks them registered in the child, so that handlers that ran are not registered
//! again. A claim of this process's own id that lasts longer than any fork (an
//! ancestor's, whose id this process was given again) is taken over after
//! [`CLAIM_PATIENCE`]; a prepare handler registered twice finds its lock held by its own
//! thread and leaves it at that.

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What a module does around a fork (module docs): each function runs inside `fork`, so it
/// must not unwind, and only locks, moves values and spawns threads.
pub(crate) struct Hooks {
    /// In the forking thread before the fork: take the module's lock and keep it.
    prepare: fn(),
    /// In the parent after the fork: let it go.
    parent: fn(),
    /// In the child: start the threads that did not come along, and let the lock go.
    child: fn(),
    /// Whether these hooks are in [`SLOTS`].
    added: AtomicBool,
}

impl Hooks {
    pub(crate) const fn new(prepare: fn(), parent: fn(), child: fn()) -> Hooks {
        Hooks {
            prepare,
            parent,
            child,
            added: AtomicBool::new(false),
        }
    }
}

/// The hooks added, in the order they were; the first null slot ends them.
static SLOTS: [AtomicPtr<Hooks>; 4] = [const { AtomicPtr::new(ptr::null_mut()) }; 4];

/// How many hooks the running fork's *prepare* handler ran (the parent and child handlers
/// run those, and no hook added since).
static PREPARED: AtomicUsize = AtomicUsize::new(0);

/// Whether the clock module's whole set of hooks was added ([`generation`]).
static ALL_ADDED: AtomicBool = AtomicBool::new(false);

/// Forks this process descends through, counted by the child handler.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The [`thread_token`] of the thread that made this process by forking (0 in the first).
static FORKER: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// Its address tells a thread from the others (a forked child's thread keeps the
    /// address it had in the parent).
    static TOKEN: u8 = const { 0 };
}

/// The calling thread's token: unique among the threads alive in this process, and the
/// same in a forked child for the thread that forked.
pub(crate) fn thread_token() -> usize {
    TOKEN.with(|token| ptr::from_ref(token) as usize)
}

/// Whether a task registered by the thread of token `thread` when this process's line
/// had gone through `generation` forks still runs here: registered in this process, or
/// by the thread that forked it, just before (the other threads did not come along).
pub(crate) fn runs_here(generation: u64, thread: usize) -> bool {
    // Relaxed: as in `generation`; FORKER is written by the child handler before the
    // child had another thread.
    let now = FORKS.load(Ordering::Relaxed);
    generation == now || (generation + 1 == now && thread == FORKER.load(Ordering::Relaxed))
}

/// [`REGISTERED`], or the id of the process one of whose threads is registering the
/// handlers, or 0 before anyone has.
static REGISTRATION: AtomicU32 = AtomicU32::new(0);

/// `REGISTRATION` once the handlers are registered. No process has this id: Linux caps
/// ids at 2^22, and the BSDs and macOS lower still.
const REGISTERED: u32 = u32::MAX;

/// How long a thread waits for a registration claimed in its own process before it
/// registers the handlers itself: far longer than a fork takes (module docs).
const CLAIM_PATIENCE: Duration = Duration::from_secs(1);

/// How many forks lie between this process and the one that first asked: 0 in the
/// process where paceline was first used, 1 in its children, and so on. Adds `all` (every
/// module's hooks) and registers the fork handlers on its first call in a process.
pub(crate) fn generation(all: &[&'static Hooks]) -> u64 {
    // Acquire: pairs with the Release below, so whoever sees the set added sees the
    // handlers registered and every slot filled.
    if !ALL_ADDED.load(Ordering::Acquire) {
        for hooks in all {
            add(hooks);
        }
        ALL_ADDED.store(true, Ordering::Release);
    }
    // Relaxed: the counter publishes nothing. The child handler runs before the child
    // has any thread but the forking one, and later threads are spawned after it.
    FORKS.load(Ordering::Relaxed)
}

/// Adds a module's `hooks` unless they are, registering the handlers first: a module
/// calls this before it first takes the lock its hooks hold across a fork.
pub(crate) fn add(hooks: &'static Hooks) {
    // Acquire: pairs with the Release below (the slot is filled and the handlers
    // registered).
    if hooks.added.load(Ordering::Acquire) {
        return;
    }
    register();
    let wanted = ptr::from_ref(hooks).cast_mut();
    for slot in &SLOTS {
        // AcqRel: Release publishes the hooks to the handlers' Acquire loads; Acquire
        // reads another module's hooks to compare (a copied child may have added these
        // already, before its `added` was set).
        match slot.compare_exchange(ptr::null_mut(), wanted, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(there) if there == wanted => break,
            Err(_) => {}
        }
    }
    debug_assert!(
        SLOTS.iter().any(|s| s.load(Ordering::Relaxed) == wanted),
        "more fork hooks than slots"
    );
    hooks.added.store(true, Ordering::Release);
}

/// The hooks the running fork prepared, in order.
fn prepared() -> impl DoubleEndedIterator<Item = &'static Hooks> {
    // Relaxed: written by `prepare` in this same thread.
    let n = PREPARED.load(Ordering::Relaxed);
    SLOTS[..n].iter().map(|slot| {
        // Acquire: pairs with `add`'s Release.
        let hooks = slot.load(Ordering::Acquire);
        // SAFETY: slots below `PREPARED` were non-null when `prepare` counted them, slots
        // are never emptied, and each holds a `&'static Hooks`.
        unsafe { &*hooks }
    })
}

/// Registers the fork handlers unless they are. Returns once they are registered in this
/// process, never waiting on a registration that a fork copied half-way (module docs).
fn register() {
    // Acquire: pairs with the Release below, so whoever sees the handlers registered
    // sees every effect of registering them.
    let mut seen = REGISTRATION.load(Ordering::Acquire);
    let mut waiting_since: Option<Instant> = None;
    while seen != REGISTERED {
        let me = std::process::id();
        let since = *waiting_since.get_or_insert_with(Instant::now);
        if seen == me && since.elapsed() < CLAIM_PATIENCE {
            // Another thread of this process is registering: it returns when the fork
            // that holds it up (if any) is over.
            std::thread::yield_now();
            seen = REGISTRATION.load(Ordering::Acquire);
            continue;
        }
        // Nobody has registered, or a fork copied another process's registration
        // half-way (that process's id): claim it for this process.
        match REGISTRATION.compare_exchange(seen, me, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {
                at_fork(Some(prepare), Some(parent), Some(child));
                REGISTRATION.store(REGISTERED, Ordering::Release);
                return;
            }
            Err(now) => seen = now,
        }
    }
}

/// Before the fork: no module is half-way through a change when the process is copied.
extern "C" fn prepare() {
    // Acquire: pairs with `add`'s Release, so a counted slot's hooks are seen whole.
    let n = SLOTS
        .iter()
        .take_while(|slot| !slot.load(Ordering::Acquire).is_null())
        .count();
    // Relaxed: read back by this same thread in `parent` or `child`.
    PREPARED.store(n, Ordering::Relaxed);
    for hooks in prepared() {
        (hooks.prepare)();
    }
}

/// In the parent after the fork: the locks go in the reverse order they were taken.
extern "C" fn parent() {
    for hooks in prepared().rev() {
        (hooks.parent)();
    }
}

/// In the child: count the fork, and start the threads that did not come along.
extern "C" fn child() {
    // Relaxed: the child has no other thread yet; threads spawned later see these.
    REGISTRATION.store(REGISTERED, Ordering::Relaxed);
    FORKS.fetch_add(1, Ordering::Relaxed);
    FORKER.store(thread_token(), Ordering::Relaxed);
    for hooks in prepared() {
        (hooks.child)();
    }
}

/// Registers the three handlers (see the module docs). Registration failing (out of
/// memory) leaves forked children without the restart, as they were before; nothing else
/// depends on it.
#[cfg(unix)]
fn at_fork(
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
fn at_fork(
    _prepare: Option<extern "C" fn()>,
    _parent: Option<extern "C" fn()>,
    _child: Option<extern "C" fn()>,
) {
}
