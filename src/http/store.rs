//! Where a limit keeps its keys: an in-process [`KeyedLimiter`], or (feature `shared`) a
//! [`SharedKeyedLimiter`] in a file every worker process of the host maps, so that
//! `uvicorn --workers 4`, gunicorn or any pre-fork server enforces one bound per client.
//! The layer asks the same six things of either.

use super::*;

#[cfg(feature = "shared")]
use crate::shared::{OwnedSharedKeyReservation, SharedKeyedLimiter};

/// A limit's keys (module docs).
pub(super) enum Store<C: Clock> {
    Local(Arc<KeyedLimiter<ClientKey, C>>),
    #[cfg(feature = "shared")]
    Shared(Arc<SharedKeyedLimiter>),
}

impl<C: Clock> Clone for Store<C> {
    fn clone(&self) -> Self {
        match self {
            Store::Local(limiter) => Store::Local(Arc::clone(limiter)),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => Store::Shared(Arc::clone(limiter)),
        }
    }
}

/// A booked turn on one limit (wait mode).
pub(super) enum Turn<'a, C: Clock> {
    Local(KeyReservation<'a, ClientKey, C>),
    #[cfg(feature = "shared")]
    Shared(OwnedSharedKeyReservation),
}

impl<C: Clock> Turn<'_, C> {
    pub(super) fn ready_in(&self) -> Duration {
        match self {
            Turn::Local(turn) => turn.ready_in(),
            #[cfg(feature = "shared")]
            Turn::Shared(turn) => turn.ready_in(),
        }
    }

    /// Gives the cell back if its instant has not come.
    pub(super) fn cancel(self) {
        drop(self);
    }
}

impl<C: Clock> Future for Turn<'_, C> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut() {
            Turn::Local(turn) => Pin::new(turn).poll(cx),
            #[cfg(feature = "shared")]
            Turn::Shared(turn) => Pin::new(turn).poll(cx),
        }
    }
}

/// A client key as a shared file's key bytes: one tag byte (`4`, `6`, `t`, `g`), then the
/// address's octets or the text, the same in every process.
#[cfg(feature = "shared")]
struct SharedKey {
    bytes: [u8; SHARED_KEY_MAX],
    len: usize,
}

/// A tag and the longest text key stored as it is.
#[cfg(feature = "shared")]
const SHARED_KEY_MAX: usize = 1 + crate::TextKey::MAX_LEN;

#[cfg(feature = "shared")]
impl SharedKey {
    fn of(key: &ClientKey) -> SharedKey {
        let mut out = SharedKey {
            bytes: [0; SHARED_KEY_MAX],
            len: 0,
        };
        let mut put = |tag: u8, rest: &[u8]| {
            // Text keys are at most `TextKey::MAX_LEN` bytes (longer ones are digests,
            // `ClientKey::bounded`); a longer one would be cut, never overflow.
            let rest = &rest[..rest.len().min(SHARED_KEY_MAX - 1)];
            out.bytes[0] = tag;
            out.bytes[1..=rest.len()].copy_from_slice(rest);
            out.len = 1 + rest.len();
        };
        match key {
            ClientKey::Ip(core::net::IpAddr::V4(ip)) => put(b'4', &ip.octets()),
            ClientKey::Ip(core::net::IpAddr::V6(ip)) => put(b'6', &ip.octets()),
            ClientKey::Text(text) => put(b't', text.as_bytes()),
            ClientKey::Global => put(b'g', &[]),
        }
        out
    }
}

#[cfg(feature = "shared")]
impl AsRef<[u8]> for SharedKey {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl<C: Clock> Store<C> {
    /// One cell for `key`: admitted, or the layer's refusal with the key's state then
    /// (made here, in its place: moved out as the refusal, it would be copied twice).
    #[inline]
    pub(super) fn check_or_state(&self, key: &ClientKey) -> Result<(), Refusal> {
        let checked = match self {
            Store::Local(limiter) => limiter.check_key_or_state(key),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => limiter.check_key_or_state(SharedKey::of(key)),
        };
        checked.map_err(Refusal::LimitedOne)
    }

    /// One cell for `key`, to give back with [`Store::refund`] if another limit refuses.
    pub(super) fn check_refundable(&self, key: &ClientKey) -> Result<KeyAdmission, NotUntil> {
        match self {
            Store::Local(limiter) => limiter.check_key_refundable(key),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => limiter.check_key_refundable(SharedKey::of(key)),
        }
    }

    /// `n` cells for `key`, to give back with [`Store::refund`] if another limit refuses.
    pub(super) fn check_refundable_n(
        &self,
        key: &ClientKey,
        n: u32,
    ) -> Result<KeyAdmission, Denied> {
        match self {
            Store::Local(limiter) => limiter.check_key_n_refundable(key, n),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => limiter.check_key_n_refundable(SharedKey::of(key), n),
        }
    }

    pub(super) fn refund(&self, key: &ClientKey, admission: KeyAdmission) {
        match self {
            Store::Local(limiter) => limiter.refund_key(key, admission),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => limiter.refund_key(SharedKey::of(key), admission),
        }
    }

    pub(super) fn snapshot(&self, key: &ClientKey) -> Snapshot {
        match self {
            Store::Local(limiter) => limiter.snapshot_key(key),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => limiter.snapshot_key(SharedKey::of(key)),
        }
    }

    /// Books `n` cells for `key` within `max`.
    pub(super) fn reserve_within(
        &self,
        key: &ClientKey,
        n: u32,
        max: Duration,
    ) -> Result<Turn<'_, C>, Denied> {
        match self {
            Store::Local(limiter) => limiter.reserve_key_within(key, n, max).map(Turn::Local),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => Arc::clone(limiter)
                .reserve_key_within_owned(SharedKey::of(key), n, max)
                .map(Turn::Shared),
        }
    }

    /// The keys stored (for the metrics' gauge).
    pub(super) fn len(&self) -> usize {
        match self {
            Store::Local(limiter) => limiter.len(),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => limiter.len(),
        }
    }

    /// Time now on the store's clock (ns; for the metrics' schedule).
    #[inline]
    pub(super) fn now(&self) -> u64 {
        match self {
            Store::Local(limiter) => limiter.clock_now(),
            #[cfg(feature = "shared")]
            Store::Shared(limiter) => limiter.clock_now(),
        }
    }
}
