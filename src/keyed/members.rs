//! A full shard's filter of its keys (`Members`): a Bloom filter, consulted before the
//! table so that a flood of new keys is refused without probing it (see `store`,
//! "Bounded under a flood").

use core::hash::{BuildHasher, Hash};

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::cell::TatWord;

/// A Bloom filter over the keys of a full shard (`Shard::members`): one 64-bit word per
/// key lookup, eight bits of filter per key, three of them set per key, so a key that is
/// not stored is ruled out about 95 % of the time (and a stored key never is).
pub(super) struct Members {
    words: Box<[u64]>,
}

impl Members {
    /// The filter of every key in `table`.
    pub(super) fn of<K: Hash>(
        table: &HashTable<(K, TatWord)>,
        hasher: &DefaultHashBuilder,
    ) -> Members {
        let words = (table.len() / 8).max(1).next_power_of_two();
        let mut members = Members {
            words: vec![0; words].into_boxed_slice(),
        };
        for (key, _) in table {
            members.insert(hasher.hash_one(key));
        }
        members
    }

    /// The word and the bits for a key's hash: its own mix of the hash, whose low bits
    /// also place the key in the table and whose top bits pick the shard.
    #[inline]
    fn bits(&self, hash: u64) -> (usize, u64) {
        let h = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // `words.len()` is a power of two, so the mask keeps the index in range.
        let word = (h >> 32) as usize & (self.words.len() - 1);
        let bits = 1 << (h & 63) | 1 << ((h >> 6) & 63) | 1 << ((h >> 12) & 63);
        (word, bits)
    }

    pub(super) fn insert(&mut self, hash: u64) {
        let (word, bits) = self.bits(hash);
        self.words[word] |= bits;
    }

    #[inline]
    pub(super) fn may_hold(&self, hash: u64) -> bool {
        let (word, bits) = self.bits(hash);
        self.words[word] & bits == bits
    }
}
