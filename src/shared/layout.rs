//! Where everything sits in a shared file: the header's fields, the quota slots, the words
//! and the key slots, as byte offsets. Pure arithmetic, no file access.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "PACELINE" (written last when a file is made)
//!      8     8  layout version (high 32 bits) | kind (1 direct, 2 keyed)
//!     16     8  file length in bytes
//!     24     8  time source: 1 counter, 2 monotonic
//!     32     8  counter scale: nanoseconds per 2^32 ticks
//!     40    16  boot id of the machine that made the file
//!     56     8  key slots (keyed files)
//!     64    16  digest seeds (keyed files)
//!     96     8  current quota: generation << 3 | slot
//!    128   256  quota slots: 8 x (sequence, interval, burst, room for one cell)
//!    512        direct: 2 words, 64 bytes apart (booking, execution)
//!    512        keyed: key slots of 32 bytes (tag, tag's low half, word, execution word)
//! ```
//!
//! Every field is a native-endian `u64`, read and written as an atomic: the processes that
//! share a file run on one machine.

/// "PACELINE", read as a native `u64`.
pub(super) const MAGIC: u64 = u64::from_ne_bytes(*b"PACELINE");
/// The layout this code reads and writes.
pub(super) const VERSION: u32 = 1;

pub(super) const MAGIC_AT: usize = 0;
pub(super) const VERSION_AT: usize = 8;
pub(super) const LEN_AT: usize = 16;
pub(super) const TIME_AT: usize = 24;
pub(super) const SCALE_AT: usize = 32;
pub(super) const BOOT_AT: usize = 40;
pub(super) const CAPACITY_AT: usize = 56;
pub(super) const SEEDS_AT: usize = 64;
pub(super) const QUOTA_CURRENT_AT: usize = 96;
pub(super) const QUOTA_SLOTS_AT: usize = 128;
/// Quota slots: a change writes one that is not current, then points the current word at
/// it (`quota.rs`).
pub(super) const QUOTA_SLOTS: usize = 8;
pub(super) const QUOTA_SLOT_LEN: usize = 32;
pub(super) const HEADER_LEN: usize = 512;

/// A direct file's words: the limiter's, and the execution-time bound's.
pub(super) const DIRECT_WORDS: usize = 2;
/// A cache line between the words, so they never share one.
pub(super) const DIRECT_WORD_STRIDE: usize = 64;
pub(super) const KEY_SLOT_LEN: usize = 32;

/// The most key slots a shared keyed file may hold: 2^26 (2 GiB of slots).
pub const MAX_CAPACITY: u64 = 1 << 26;

/// What a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One quota: [`crate::shared::SharedLimiter`].
    Direct,
    /// A quota per key: [`crate::shared::SharedKeyedLimiter`], with this many key slots.
    Keyed { capacity: u64 },
}

impl Kind {
    pub(super) fn code(self) -> u32 {
        match self {
            Kind::Direct => 1,
            Kind::Keyed { .. } => 2,
        }
    }

    /// The file's length in bytes.
    pub(super) fn file_len(self) -> u64 {
        match self {
            Kind::Direct => (HEADER_LEN + DIRECT_WORDS * DIRECT_WORD_STRIDE) as u64,
            Kind::Keyed { capacity } => HEADER_LEN as u64 + capacity * KEY_SLOT_LEN as u64,
        }
    }
}

/// The version-and-kind field.
pub(super) fn version_field(kind: Kind) -> u64 {
    u64::from(VERSION) << 32 | u64::from(kind.code())
}

/// Offset of direct word `i`.
pub(super) fn direct_word(i: usize) -> usize {
    HEADER_LEN + i * DIRECT_WORD_STRIDE
}

/// Offset of key slot `i`'s field `f` (0 tag, 1 tag's low half, 2 word, 3 execution word).
pub(super) fn key_field(i: u64, f: usize) -> usize {
    HEADER_LEN + i as usize * KEY_SLOT_LEN + f * 8
}
