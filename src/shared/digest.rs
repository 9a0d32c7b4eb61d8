//! Key digests every process computes alike: 128 bits from a key's bytes under 256 bits
//! of seeds drawn when the file was made.
//!
//! # Implementation notes
//!
//! A check of a stored key hashes it on every call, so the digest is on the hot path; a
//! cryptographic hash (SipHash-1-3, 128 bits) cost as much as the whole in-process keyed
//! check. This one is the folded multiply (the 128-bit product of two 64-bit words, its
//! halves xored), the mixing step of fast table hashes, run in two lanes with seeds of
//! their own: each 16-byte block of the key is xored with a lane's seeds (and the lane's
//! state so far) and folded, and each lane is folded once more at the end. The algorithm
//! is this file's, fixed by the layout version, so a Python process and a Rust one
//! (whatever their builds) find a key in the same slot.
//!
//! What it must resist is a client choosing keys: its keys cannot be steered into one
//! bucket, or onto another client's digest, without the seeds, which only those who can
//! read the file know (and they can change any state there anyway). It is not a
//! cryptographic hash and is not used as one.

/// The seeds of one file's digests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Digester {
    seeds: [u64; 4],
}

/// An odd constant (the fractional bits of the golden ratio) that keeps an all-zero lane
/// from staying zero.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

/// The folded multiply: the two halves of the 128-bit product, xored.
#[inline(always)]
fn fold(x: u64, y: u64) -> u64 {
    let product = u128::from(x) * u128::from(y);
    (product as u64) ^ (product >> 64) as u64
}

#[inline(always)]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

#[inline(always)]
fn half(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    u64::from(u32::from_le_bytes(w))
}

/// Up to 16 bytes as two words, every byte in at least one (overlapping reads: the length,
/// mixed in separately, tells the overlaps apart).
#[inline(always)]
fn short(bytes: &[u8]) -> (u64, u64) {
    let len = bytes.len();
    if len >= 8 {
        (word(bytes, 0), word(bytes, len - 8))
    } else if len >= 4 {
        (half(bytes, 0), half(bytes, len - 4))
    } else if len > 0 {
        let spread = u64::from(bytes[0]) | u64::from(bytes[len / 2]) << 8;
        (spread | u64::from(bytes[len - 1]) << 16, 0)
    } else {
        (0, 0)
    }
}

impl Digester {
    pub(crate) fn new(seeds: [u64; 4]) -> Digester {
        Digester { seeds }
    }

    /// The digest of `bytes`: two 64-bit halves.
    #[inline]
    pub(crate) fn digest(&self, bytes: &[u8]) -> (u64, u64) {
        let [k0, k1, k2, k3] = self.seeds;
        let len = bytes.len() as u64;
        let (mut s0, mut s1) = (k0 ^ len.wrapping_mul(SPREAD), k2 ^ len);
        let tail = if bytes.len() <= 16 {
            bytes
        } else {
            let mut rest = bytes;
            while rest.len() > 16 {
                let (a, b) = (word(rest, 0), word(rest, 8));
                s0 = fold(a ^ k1, b ^ s0);
                s1 = fold(a ^ s1, b ^ k3);
                rest = &rest[16..];
            }
            // The last 16 bytes (overlapping the block before when the length is not a
            // multiple of 16).
            &bytes[bytes.len() - 16..]
        };
        let (a, b) = short(tail);
        let h0 = fold(a ^ k1, b ^ s0);
        let h1 = fold(a ^ s1, b ^ k3);
        (fold(h0 ^ k2, h1 ^ SPREAD), fold(h1 ^ k0, h0 ^ k3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const SEEDS: [u64; 4] = [
        0x0123_4567_89ab_cdef,
        0xfedc_ba98_7654_3210,
        0x0f1e_2d3c_4b5a_6978,
        0x8796_a5b4_c3d2_e1f0,
    ];

    #[test]
    fn the_digest_is_fixed_by_its_seeds_and_its_bytes() {
        let d = Digester::new(SEEDS);
        // The same on every build: a file's slots depend on it.
        assert_eq!(d.digest(b"203.0.113.7"), d.digest(b"203.0.113.7"));
        let other = Digester::new([1, 2, 3, 4]);
        assert_ne!(d.digest(b"203.0.113.7"), other.digest(b"203.0.113.7"));
        assert_eq!(
            d.digest(b""),
            Digester::new(SEEDS).digest(&[0u8; 0]),
            "the empty key has a digest too"
        );
    }

    #[test]
    fn every_length_and_every_byte_changes_the_digest() {
        let d = Digester::new(SEEDS);
        let mut seen = HashSet::new();
        // Keys of every length to 100 that differ in one byte, or only in their length
        // (zero bytes): no two digests (or either half of them) alike.
        for len in 0..100usize {
            let zeros = vec![0u8; len];
            assert!(seen.insert(d.digest(&zeros)), "length {len}");
            for at in 0..len {
                for bit in [1u8, 0x80] {
                    let mut key = zeros.clone();
                    key[at] ^= bit;
                    let (h0, h1) = d.digest(&key);
                    assert!(seen.insert((h0, h1)), "length {len}, byte {at}");
                }
            }
        }
        let halves: HashSet<u64> = seen.iter().map(|d| d.0).collect();
        assert_eq!(halves.len(), seen.len());
    }

    #[test]
    fn client_addresses_spread_evenly_over_buckets() {
        // 2^16 consecutive IPv4 addresses (the keys a /16 of clients sends) over 512
        // buckets by the high half, as the table picks them: each bucket gets its share
        // within the spread chance allows (mean 128, a standard deviation about 11).
        let d = Digester::new(SEEDS);
        let mut counts = [0u32; 512];
        for i in 0u32..1 << 16 {
            let mut key = [b'4', 0, 0, 0, 0];
            key[1..].copy_from_slice(&(0xcb00_0000 | i).to_be_bytes());
            let (h0, _) = d.digest(&key);
            counts[((u128::from(h0) * 512) >> 64) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 70 && *max < 190, "{min}..{max}");
    }
}
