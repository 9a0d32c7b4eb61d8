//! A text key that costs a bounded number of bytes to store, whatever its length.

use core::fmt;
use core::hash::BuildHasher;
use std::hash::RandomState;
use std::sync::OnceLock;

/// A text key (an API key, a tenant, a client name from a header) for a
/// [`KeyedLimiter`](crate::KeyedLimiter), stored as it is up to [`TextKey::MAX_LEN`] bytes
/// and as a 128-bit digest of itself beyond: a client that sends a 1 MB key costs the
/// limiter no more memory than one that sends a short one.
///
/// The digest is two SipHash-1-3 hashes under keys drawn once per process, so clients
/// cannot aim for collisions, and it is kept apart from short keys (no text equals a
/// digest). Two long keys share a limit only if their 128-bit digests collide.
///
/// # Examples
///
/// ```
/// use paceline::{KeyedLimiter, Quota, TextKey};
///
/// let per_token = KeyedLimiter::new(Quota::per_second(10)).with_max_keys(100_000);
/// assert!(per_token.check_key(&TextKey::new("token-123")).is_ok());
/// let huge = "x".repeat(1 << 20);
/// assert!(per_token.check_key(&TextKey::new(&huge)).is_ok()); // stored in 16 bytes
/// assert_eq!(TextKey::new("token-123").as_str(), Some("token-123"));
/// assert_eq!(TextKey::new(&huge).as_str(), None);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TextKey(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Text(Box<str>),
    /// The digest's halves: two `u64`s keep the key at 24 bytes (a `u128` aligns to 16).
    Digest([u64; 2]),
}

impl TextKey {
    /// The longest text stored as it is, in bytes.
    pub const MAX_LEN: usize = 64;

    /// The key for `text`: the text itself up to [`TextKey::MAX_LEN`] bytes, its digest
    /// beyond.
    ///
    /// # Examples
    ///
    /// ```
    /// let key = paceline::TextKey::new("tenant-a");
    /// assert_eq!(key, paceline::TextKey::from(String::from("tenant-a")));
    /// ```
    pub fn new(text: &str) -> TextKey {
        if text.len() > Self::MAX_LEN {
            let digest = digest(text.as_bytes());
            TextKey(Repr::Digest([(digest >> 64) as u64, digest as u64]))
        } else {
            TextKey(Repr::Text(text.into()))
        }
    }

    /// The text, if it was short enough to be stored as it is.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(paceline::TextKey::new("a").as_str(), Some("a"));
    /// ```
    pub fn as_str(&self) -> Option<&str> {
        match &self.0 {
            Repr::Text(text) => Some(text),
            Repr::Digest(_) => None,
        }
    }
}

impl From<&str> for TextKey {
    fn from(text: &str) -> TextKey {
        TextKey::new(text)
    }
}

impl From<String> for TextKey {
    /// Keeps the string's allocation when it is short enough to be stored as it is.
    fn from(text: String) -> TextKey {
        if text.len() > Self::MAX_LEN {
            TextKey::new(&text)
        } else {
            TextKey(Repr::Text(text.into_boxed_str()))
        }
    }
}

impl fmt::Debug for TextKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Text(text) => fmt::Debug::fmt(text, f),
            Repr::Digest([high, low]) => write!(f, "TextKey(digest {high:016x}{low:016x})"),
        }
    }
}

/// A 128-bit digest of `bytes`: two SipHash-1-3 hashes under keys drawn once per process.
pub(crate) fn digest(bytes: &[u8]) -> u128 {
    static SEEDS: OnceLock<[RandomState; 2]> = OnceLock::new();
    let [a, b] = SEEDS.get_or_init(|| [RandomState::new(), RandomState::new()]);
    u128::from(a.hash_one(bytes)) << 64 | u128::from(b.hash_one(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_are_stored_as_digests_apart_from_every_text() {
        let long = "k".repeat(TextKey::MAX_LEN + 1);
        let key = TextKey::new(&long);
        assert_eq!(key, TextKey::from(long.clone()));
        assert_ne!(key, TextKey::new(&"k".repeat(TextKey::MAX_LEN + 2)));
        assert!(key.as_str().is_none());
        // At the bound, the text itself.
        let at = "k".repeat(TextKey::MAX_LEN);
        assert_eq!(TextKey::new(&at).as_str(), Some(at.as_str()));
        assert!(core::mem::size_of::<TextKey>() <= 24);
    }
}
