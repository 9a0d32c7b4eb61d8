//! Taking one cell from every limit at once, or none: keys worked out once per request,
//! immediate and wait-mode admission, and giving cells back on a refusal.

use super::*;

use core::sync::atomic::{AtomicBool, Ordering};

/// Why a request is answered without a decision: its key is missing.
#[derive(Clone, Debug)]
pub(super) enum NoKey {
    /// As configured ([`MissingKey::Refuse`]).
    Refuse(StatusCode),
    /// The server passes no peer address to a limit keyed by it: a 500 naming the fix.
    NoPeerAddress(Arc<str>),
    /// The request costs a limit more cells than its burst: it can never be admitted.
    Unaffordable {
        limit: Arc<str>,
        cost: u32,
        burst: u32,
    },
}

/// The key of one limit for this request: `Ok(None)` skips the limit.
pub(super) fn key<C: Clock>(
    config: &Config<C>,
    limit: &Limit<C>,
    head: &Head<'_>,
) -> Result<Option<ClientKey>, NoKey> {
    if limit.when.as_ref().is_some_and(|when| !when(head)) {
        return Ok(None);
    }
    match limit.source.key(head) {
        Ok(key) => Ok(Some(key)),
        Err(missing) => no_key(config, limit, missing),
    }
}

/// What a request without a key for `limit` gets, as configured (out of line: the rare
/// path).
#[cold]
#[inline(never)]
fn no_key<C: Clock>(
    config: &Config<C>,
    limit: &Limit<C>,
    missing: Missing,
) -> Result<Option<ClientKey>, NoKey> {
    match (config.missing, missing) {
        (None, Missing::PeerAddress) => {
            warn_once_no_peer_address(&limit.name);
            Err(NoKey::NoPeerAddress(Arc::clone(&limit.name)))
        }
        (None | Some(MissingKey::Shared), _) => Ok(Some(ClientKey::keyless())),
        (Some(MissingKey::Skip), _) => Ok(None),
        (Some(MissingKey::Refuse(status)), _) => Err(NoKey::Refuse(status)),
    }
}

/// What the 500 of a server that passes no peer address says, and its one log line.
pub(super) fn no_peer_address_message(limit: &str) -> String {
    format!(
        "paceline: the rate limit {limit:?} keys clients by their address, but this server \
         passes none to it. With axum, serve \
         `app.into_make_service_with_connect_info::<SocketAddr>()`; with hyper, insert each \
         connection's `SocketAddr` into its requests' extensions; or share one bucket on \
         purpose with `.on_missing_key(MissingKey::Shared)`.\n"
    )
}

/// Logs the misconfiguration once per process, to standard error.
#[cold]
pub(super) fn warn_once_no_peer_address(limit: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    // Relaxed: a flag that only keeps the line from repeating; it publishes nothing.
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprint!("{}", no_peer_address_message(limit));
    }
}

/// What this request costs each limit.
pub(super) fn costs<C: Clock>(config: &Config<C>, head: &Head<'_>) -> Vec<u32> {
    config
        .limits
        .iter()
        .map(|limit| limit.cost.of(head))
        .collect()
}

/// Every limit's key for this request.
pub(super) fn keys<C: Clock>(
    config: &Config<C>,
    head: &Head<'_>,
) -> Result<Vec<Option<ClientKey>>, NoKey> {
    config
        .limits
        .iter()
        .map(|limit| key(config, limit, head))
        .collect()
}

pub(super) enum Refusal {
    MissingKey(NoKey),
    Limited(RefusedBy),
    /// The one limit of a layer refused; its key's state then, read by the check (so the
    /// refusal does not look the key up again).
    LimitedOne(OneRefused),
}

/// Takes one cell from every limit, or none (module docs). Allocates only to remember
/// what to undo when more than one limit applies.
pub(super) fn admit_now<C: Clock>(config: &Config<C>, head: &Head<'_>) -> Result<(), Refusal> {
    if let [limit @ Limit {
        cost: Cost::One,
        when: None,
        ..
    }] = config.limits.as_slice()
    {
        // One limit, one cell: nothing to undo, whatever happens.
        return match limit.source.key(head) {
            Ok(key) => check_one(limit, &key),
            Err(missing) => match no_key(config, limit, missing) {
                Ok(Some(key)) => check_one(limit, &key),
                Ok(None) => Ok(()),
                Err(why) => Err(Refusal::MissingKey(why)),
            },
        };
    }
    let mut taken: Vec<(usize, ClientKey, KeyAdmission)> = Vec::new();
    let last = config.limits.len().saturating_sub(1);
    let mut last_admitted = false;
    for (i, limit) in config.limits.iter().enumerate() {
        let key = match key(config, limit, head) {
            Ok(Some(key)) => key,
            Ok(None) => continue,
            Err(why) => {
                undo_all(config, taken);
                return Err(Refusal::MissingKey(why));
            }
        };
        let checked = match limit.cost.of(head) {
            1 => limit.store.check_refundable(&key),
            n => match limit.store.check_refundable_n(&key, n) {
                Ok(admission) => Ok(admission),
                Err(Denied::NotUntil(e)) => Err(e),
                Err(Denied::InsufficientCapacity(e)) => {
                    undo_all(config, taken);
                    limit.count_refused();
                    return Err(Refusal::MissingKey(unaffordable(limit, e)));
                }
            },
        };
        match checked {
            // The last limit's admission never needs giving back.
            Ok(_) if i == last => last_admitted = true,
            Ok(admission) => taken.push((i, key, admission)),
            // Nothing taken: nothing to give back.
            Err(e) if e.is_table_full() && limit.admits_when_full() => {}
            Err(e) => {
                undo_all(config, taken);
                limit.count_refused();
                return Err(Refusal::Limited(refused(i, e)));
            }
        }
    }
    // Counted once every limit has admitted (no code without the `metrics` feature).
    for (i, _, _) in &taken {
        config.limits[*i].count_admitted();
    }
    if last_admitted {
        config.limits[last].count_admitted();
    }
    Ok(())
}

/// The one limit of a layer, for `key`: admitted, or refused with the key's state.
#[inline]
fn check_one<C: Clock>(limit: &Limit<C>, key: &ClientKey) -> Result<(), Refusal> {
    let checked = limit.store.check_or_state(key);
    match checked {
        Ok(()) => limit.count_admitted(),
        Err(Refusal::LimitedOne(ref refused)) if !refused.spent => {
            return untracked(limit, checked)
        }
        Err(_) => limit.count_refused(),
    }
    checked
}

/// [`check_one`] for a key the limit's table had no room for: let through untracked if the
/// limit says so ([`TableFull::Admit`]), else refused (out of line: rare, and it keeps the
/// refusals' usual path short).
#[cold]
#[inline(never)]
fn untracked<C: Clock>(limit: &Limit<C>, checked: Result<(), Refusal>) -> Result<(), Refusal> {
    if limit.admits_when_full() {
        limit.count_admitted();
        return Ok(());
    }
    limit.count_refused();
    checked
}

/// Gives back the cells a refused request took from the earlier limits.
pub(super) fn undo_all<C: Clock>(config: &Config<C>, taken: Vec<(usize, ClientKey, KeyAdmission)>) {
    for (i, key, admission) in taken {
        config.limits[i].store.refund(&key, admission);
    }
}

/// One limit's cell for a waiting request: admitted now (refundable), or a booked place
/// in the key's FIFO (given back if dropped before its instant).
pub(super) enum Booked<'a, C: Clock> {
    Now(KeyAdmission),
    Later(Turn<'a, C>),
    /// Admitted without a cell: the limit's key table had no room for a new key, and the
    /// limit admits such requests ([`TableFull::Admit`]).
    Untracked,
}

/// `cost` cells of `key` on `limit` within `max`: admitted now, booked for later, or why
/// not.
fn book<'a, C: Clock>(
    limit: &'a Limit<C>,
    key: &ClientKey,
    cost: u32,
    max: Duration,
) -> Result<Booked<'a, C>, Denied> {
    match limit.store.check_refundable_n(key, cost) {
        Ok(admission) => return Ok(Booked::Now(admission)),
        Err(Denied::NotUntil(e)) if e.is_table_full() && limit.admits_when_full() => {
            return Ok(Booked::Untracked)
        }
        Err(Denied::NotUntil(e)) if e.wait_time() > max => return Err(e.into()),
        Err(Denied::NotUntil(_)) => {}
        Err(too_large) => return Err(too_large),
    }
    match limit.store.reserve_within(key, cost, max) {
        Ok(turn) => Ok(Booked::Later(turn)),
        Err(Denied::NotUntil(e)) if e.is_table_full() && limit.admits_when_full() => {
            Ok(Booked::Untracked)
        }
        // Too late, or a new key at a full key table (nothing booked, the wait until a
        // slot frees), or more than the burst: the request is refused.
        Err(denied) => Err(denied),
    }
}

/// The refusal of a request that costs `limit` more cells than its burst.
#[cold]
fn unaffordable<C: Clock>(limit: &Limit<C>, e: InsufficientCapacity) -> NoKey {
    NoKey::Unaffordable {
        limit: Arc::clone(&limit.name),
        cost: e.requested(),
        burst: e.burst(),
    }
}

/// Which limit refused, how long until it would admit, and whether it refused because its
/// key table had no room for a new key (not because the key spent its quota).
#[derive(Clone, Copy)]
pub(super) struct RefusedBy {
    pub(super) limit: usize,
    pub(super) wait: Duration,
    pub(super) table_full: bool,
}

/// Wait mode: books one cell on every limit first (admitted now, or a place in the key's
/// FIFO), each within the configured maximum, then waits for the latest. A limit that
/// cannot admit within the maximum gives back what the earlier limits booked, and so does
/// a request dropped while waiting (its client gone): a booking before its instant is
/// cancelled, an admission undone. A cell whose instant has come stays spent.
pub(super) async fn admit_waiting<C: Clock>(
    config: &Config<C>,
    keys: &[Option<ClientKey>],
    costs: &[u32],
    max: Duration,
    hold: Option<&AtomicBool>,
) -> Result<(), Refusal> {
    let mut booked = Bookings {
        config,
        taken: Vec::with_capacity(keys.len()),
    };
    for (i, ((limit, key), &cost)) in config.limits.iter().zip(keys).zip(costs).enumerate() {
        let Some(key) = key else { continue };
        match book(limit, key, cost, max) {
            Ok(booking) => booked.taken.push((i, key, Some(booking))),
            // `booked` is dropped here: the earlier limits get their cells back.
            Err(Denied::NotUntil(e)) => {
                limit.count_refused();
                return Err(Refusal::Limited(refused(i, e)));
            }
            Err(Denied::InsufficientCapacity(e)) => {
                limit.count_refused();
                return Err(Refusal::MissingKey(unaffordable(limit, e)));
            }
        }
    }
    // Each limit's wait, known at booking, counted once every limit has booked (a
    // request dropped while waiting is then counted as it would have been served).
    for (i, _, booking) in &booked.taken {
        let limit = &config.limits[*i];
        match booking {
            Some(Booked::Later(turn)) if !turn.ready_in().is_zero() => {
                limit.count_waited(turn.ready_in());
            }
            _ => limit.count_admitted(),
        }
    }
    if let Some(hold) = hold {
        // `Waiting::book`: stop here once, every turn booked and none taken yet (dropped
        // now, `booked` gives back even the cells admitted at once).
        HeldOnce(hold).await;
    }
    // Every booking at once: the request proceeds when the last is due.
    core::future::poll_fn(|cx| {
        let mut pending = false;
        for (_, _, booking) in &mut booked.taken {
            let Some(Booked::Later(turn)) = booking else {
                continue;
            };
            match Pin::new(turn).poll(cx) {
                // Used: nothing to give back, and never polled again.
                Poll::Ready(()) => *booking = None,
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    for (_, _, booking) in &mut booked.taken {
        *booking = None; // admitted now, or at an instant that has come: used
    }
    Ok(())
}

/// The cells a waiting request booked so far, given back unless used.
pub(super) struct Bookings<'a, C: Clock> {
    config: &'a Config<C>,
    taken: Vec<Taken<'a, C>>,
}

/// A limit's index, the request's key for it, and its booking (`None` once used).
pub(super) type Taken<'a, C> = (usize, &'a ClientKey, Option<Booked<'a, C>>);

impl<C: Clock> Drop for Bookings<'_, C> {
    fn drop(&mut self) {
        for (i, key, booking) in self.taken.drain(..) {
            match booking {
                Some(Booked::Now(admission)) => {
                    self.config.limits[i].store.refund(key, admission);
                }
                // Dropping a booking cancels it (its cell back if before its instant).
                Some(Booked::Later(turn)) => turn.cancel(),
                Some(Booked::Untracked) | None => {}
            }
        }
    }
}

pub(super) fn refused(limit: usize, e: NotUntil) -> RefusedBy {
    RefusedBy {
        limit,
        wait: e.wait_time(),
        table_full: e.is_table_full(),
    }
}

/// Pending once when its flag is set ([`Waiting::book`](super::Waiting::book)), waking
/// itself, so that the poll that booked a waiting request's turns ends there.
struct HeldOnce<'a>(&'a AtomicBool);

impl Future for HeldOnce<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Relaxed: the flag is set and read by the same poll's thread (`book` sets it,
        // then polls), and publishes no other data.
        if self.0.swap(false, Ordering::Relaxed) {
            cx.waker().wake_by_ref();
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}
