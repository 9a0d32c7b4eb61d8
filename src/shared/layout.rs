//! Where everything sits in a shared file: the header's fields, the quota slots, the words,
//! the bucket locks and the key slots, as byte offsets. Pure arithmetic, no file access.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "PACELINE" (written last, before the file is linked into place)
//!      8     8  layout version (high 32 bits) | kind (1 direct, 2 keyed)
//!     16     8  file length in bytes
//!     24     8  time source: 1 counter, 2 monotonic
//!     32     8  counter scale: nanoseconds per 2^32 ticks
//!     40    16  boot id of the machine that made the file
//!     56     8  keys asked for (keyed files: the capacity C)
//!     64     8  buckets (keyed files)
//!     72     8  keys stored (keyed files; see `keyed/`)
//!     80     8  the process making this file anew (a file from an earlier boot), or 0
//!     88     8  the name's length in bytes
//!     96     8  current quota: generation << 3 | slot
//!    128   256  quota slots: 8 x (sequence, interval, burst, room for one cell)
//!    384    32  digest seeds (keyed files)
//!    416    64  the name of the limit the file holds (empty: unnamed)
//!    512        direct: 2 words, 64 bytes apart (booking, execution)
//!    512        keyed: two words per bucket (its lock, and its reach: how far from their
//!               home slots its keys may sit), the region rounded up to 64 bytes; then
//!               the key slots, `BUCKET_SLOTS` per bucket, 32 bytes each (tag, tag's low
//!               half, word, execution word)
//!    512        budget (`CAPACITY_AT` holds its dimensions, D): the lock word, the
//!               generation of the state (which copy is current), the in-flight cap, the
//!               two epoch hints (the head's, the queue's); at 576, D rates of 56 bytes (name's length,
//!               32 bytes of name, interval, burst); at 1024, two copies of the state
//!               (`crate::shared::budget`), `budget_state_words(D)` words each
//! ```
//!
//! Every field is a native-endian `u64`, read and written as an atomic: the processes that
//! share a file run on one machine.
//!
//! **How many slots a capacity takes.** A key lives in one bucket of [`BUCKET_SLOTS`]
//! slots, chosen by its digest. A keyed file asked for `C` keys has `2C` slots (rounded up
//! to whole buckets), so with `C` live keys each bucket expects half its slots taken; a
//! bucket overflows only when more than twice its share of keys land in it, which for
//! 128-slot buckets has a chance below 10^-11 per bucket (a Poisson tail), below 10^-6 for
//! the whole table at the largest capacity. So a table of capacity `C` stores `C` live keys
//! (and usually many more) before it refuses a new one. It costs 64 bytes per key of
//! capacity, plus 16 per bucket.

/// "PACELINE", read as a native `u64`.
pub(super) const MAGIC: u64 = u64::from_ne_bytes(*b"PACELINE");
/// The layout this code reads and writes.
pub(super) const VERSION: u32 = 2;

pub(super) const MAGIC_AT: usize = 0;
pub(super) const VERSION_AT: usize = 8;
pub(super) const LEN_AT: usize = 16;
pub(super) const TIME_AT: usize = 24;
pub(super) const SCALE_AT: usize = 32;
pub(super) const BOOT_AT: usize = 40;
pub(super) const CAPACITY_AT: usize = 56;
pub(super) const BUCKETS_AT: usize = 64;
pub(super) const STORED_AT: usize = 72;
pub(super) const REMAKER_AT: usize = 80;
pub(super) const NAME_LEN_AT: usize = 88;
pub(super) const QUOTA_CURRENT_AT: usize = 96;
pub(super) const QUOTA_SLOTS_AT: usize = 128;
/// Quota slots: a change writes one that is not current, then points the current word at
/// it (`quota.rs`).
pub(super) const QUOTA_SLOTS: usize = 8;
pub(super) const QUOTA_SLOT_LEN: usize = 32;
pub(super) const SEEDS_AT: usize = 384;
pub(super) const SEEDS: usize = 4;
pub(super) const NAME_AT: usize = 416;
/// The longest name a file holds, in bytes.
pub const MAX_NAME_LEN: usize = 64;
pub(super) const HEADER_LEN: usize = 512;

/// A direct file's words: the limiter's, and the execution-time bound's.
pub(super) const DIRECT_WORDS: usize = 2;
/// A cache line between the words, so they never share one.
pub(super) const DIRECT_WORD_STRIDE: usize = 64;
pub(super) const KEY_SLOT_LEN: usize = 32;
/// Slots per bucket: a key sits in one of its bucket's slots.
pub(super) const BUCKET_SLOTS: u64 = 128;

/// A budget file's lock word: the identity of the process holding it, or 0.
pub(super) const BUDGET_LOCK_AT: usize = HEADER_LEN;
/// Which copy of a budget's state is current: its low bit.
pub(super) const BUDGET_GENERATION_AT: usize = HEADER_LEN + 8;
/// A budget's in-flight cap (0: none).
pub(super) const BUDGET_CAP_AT: usize = HEADER_LEN + 16;
/// Counts what may let the head of a budget's queue in sooner (a permit returned, a
/// settle, a rate or hold changed): the head reads it to know whether to look again.
pub(super) const BUDGET_EPOCH_AT: usize = HEADER_LEN + 24;
/// Counts the waiters that left a budget's queue (admitted, or gone): a waiter reads it to
/// know whether it may have moved up.
pub(super) const BUDGET_QUEUE_AT: usize = HEADER_LEN + 32;
/// The PID namespace of the process that made a budget file (its inode; 0: unknown):
/// the ids its callers are recorded by mean something only there.
pub(super) const BUDGET_PIDNS_AT: usize = HEADER_LEN + 40;
pub(super) const BUDGET_RATES_AT: usize = HEADER_LEN + 64;
pub(super) const BUDGET_RATE_LEN: usize = 56;
/// The longest name of a shared budget's dimension, in bytes.
pub const MAX_DIMENSION_NAME_LEN: usize = 32;
/// The most dimensions a shared budget has.
pub const MAX_DIMENSIONS: usize = 8;
pub(super) const BUDGET_STATE_AT: usize = 1024;
/// Entries a shared budget's log holds.
pub(super) const BUDGET_LOG: usize = 1024;
/// Callers a shared budget's state records at once: turns in flight and waiters.
pub(super) const BUDGET_TURNS: usize = 2048;
/// Words of a budget's state record per caller: ticket, owner, turn, when last seen, and
/// its cells per dimension.
pub(super) const fn budget_caller_words(dims: usize) -> usize {
    4 + dims
}

/// Words of one copy of the state of a budget of `dims` dimensions: its counts, its callers,
/// its ledger.
pub(super) const fn budget_state_words(dims: usize) -> usize {
    4 + BUDGET_TURNS * budget_caller_words(dims) + crate::budget::ledger_words(dims, BUDGET_LOG)
}

/// Offset of a budget's state copy `copy` (0 or 1).
pub(super) const fn budget_state(dims: usize, copy: usize) -> usize {
    BUDGET_STATE_AT + copy * budget_state_words(dims) * 8
}

/// The most keys a shared keyed file may be asked to hold: 2^25 (its slots take 2 GiB).
pub const MAX_CAPACITY: u64 = 1 << 25;

const _: () = {
    assert!(NAME_AT + MAX_NAME_LEN <= HEADER_LEN);
    assert!(SEEDS_AT + SEEDS * 8 <= NAME_AT);
    assert!(QUOTA_SLOTS_AT + QUOTA_SLOTS * QUOTA_SLOT_LEN <= SEEDS_AT);
    assert!(BUCKET_SLOTS.is_power_of_two());
    assert!(BUDGET_RATES_AT + MAX_DIMENSIONS * BUDGET_RATE_LEN <= BUDGET_STATE_AT);
    assert!(8 + MAX_DIMENSION_NAME_LEN + 16 == BUDGET_RATE_LEN);
};

/// What a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One quota: [`crate::shared::SharedLimiter`].
    Direct,
    /// A quota per key: [`crate::shared::SharedKeyedLimiter`], made for `capacity` keys.
    Keyed { capacity: u64 },
    /// A budget: [`crate::shared::SharedBudget`], of `dims` dimensions.
    Budget { dims: u64 },
}

impl Kind {
    pub(super) fn code(self) -> u32 {
        match self {
            Kind::Direct => 1,
            Kind::Keyed { .. } => 2,
            Kind::Budget { .. } => 3,
        }
    }

    /// The file's length in bytes.
    pub(super) fn file_len(self) -> u64 {
        match self {
            Kind::Direct => (HEADER_LEN + DIRECT_WORDS * DIRECT_WORD_STRIDE) as u64,
            Kind::Keyed { capacity } => {
                slots_at(capacity) as u64 + buckets(capacity) * BUCKET_SLOTS * KEY_SLOT_LEN as u64
            }
            Kind::Budget { dims } => budget_state(dims as usize, 2) as u64,
        }
    }
}

/// The buckets a keyed file asked for `capacity` keys has: two slots per key, in whole
/// buckets (module docs).
pub(super) fn buckets(capacity: u64) -> u64 {
    capacity.saturating_mul(2).div_ceil(BUCKET_SLOTS).max(1)
}

/// The version-and-kind field.
pub(super) fn version_field(kind: Kind) -> u64 {
    u64::from(VERSION) << 32 | u64::from(kind.code())
}

/// Offset of direct word `i`.
pub(super) fn direct_word(i: usize) -> usize {
    HEADER_LEN + i * DIRECT_WORD_STRIDE
}

/// Offset of a budget's rate `d`'s field `f` (0 name's length, 1-4 name, 5 interval,
/// 6 burst).
pub(super) fn budget_rate(d: usize, f: usize) -> usize {
    BUDGET_RATES_AT + d * BUDGET_RATE_LEN + f * 8
}

/// Offset of bucket `b`'s lock word.
pub(super) fn bucket_lock(b: u64) -> usize {
    HEADER_LEN + b as usize * 16
}

/// Offset of bucket `b`'s reach word: one more than the farthest any of its keys sits
/// from its home slot.
pub(super) fn bucket_reach(b: u64) -> usize {
    bucket_lock(b) + 8
}

/// Offset of the first key slot of a file asked for `capacity` keys.
fn slots_at(capacity: u64) -> usize {
    HEADER_LEN + (buckets(capacity) as usize * 16).next_multiple_of(64)
}

/// Offset of slot `i`'s field `f` (0 tag, 1 tag's low half, 2 word, 3 execution word) in a
/// file asked for `capacity` keys.
pub(super) fn key_field(capacity: u64, i: u64, f: usize) -> usize {
    slots_at(capacity) + i as usize * KEY_SLOT_LEN + f * 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_file_has_two_slots_per_key_in_whole_buckets_after_its_locks() {
        assert_eq!(buckets(1), 1);
        assert_eq!(buckets(64), 1);
        assert_eq!(buckets(65), 2);
        assert_eq!(buckets(1_000_000), 15_625);
        let len = Kind::Keyed { capacity: 65 }.file_len();
        assert_eq!(len, 512 + 64 + 2 * 128 * 32);
        assert_eq!(key_field(65, 0, 0), 576);
        assert_eq!(key_field(65, 255, 3) + 8, len as usize);
        assert_eq!(bucket_reach(1) + 8, 544);
        let largest = Kind::Keyed {
            capacity: MAX_CAPACITY,
        }
        .file_len();
        assert!(largest < (1 << 31) + (1 << 24), "{largest}");
    }
}
