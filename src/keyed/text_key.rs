//! A text key that costs a bounded number of bytes to store, whatever its length.

use core::fmt;
use core::hash::{BuildHasher, Hash, Hasher};

use super::store::KeyRef;
use super::KeyedLimiter;
use crate::clock::Clock;
use crate::error::{Denied, InsufficientCapacity};
use core::time::Duration;
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
#[derive(Clone, PartialEq, Eq)]
pub struct TextKey(Repr);

#[derive(Clone, PartialEq, Eq)]
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
        TextKeyRef::new(text).to_key()
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

impl Hash for TextKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match &self.0 {
            Repr::Text(text) => TextKeyRef::Text(text).hash(state),
            Repr::Digest(digest) => TextKeyRef::Digest(*digest).hash(state),
        }
    }
}

/// A [`TextKey`] as its text names it, to find the key without making it (a short text
/// is borrowed, a long one digested): hashes as the key and tells it apart.
#[derive(Clone, Copy)]
pub(crate) enum TextKeyRef<'a> {
    Text(&'a str),
    Digest([u64; 2]),
}

impl<'a> TextKeyRef<'a> {
    /// What [`TextKey::new`] would make of `text`.
    #[inline]
    pub(crate) fn new(text: &'a str) -> TextKeyRef<'a> {
        if text.len() > TextKey::MAX_LEN {
            let digest = digest(text.as_bytes());
            TextKeyRef::Digest([(digest >> 64) as u64, digest as u64])
        } else {
            TextKeyRef::Text(text)
        }
    }
}

impl Hash for TextKeyRef<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            TextKeyRef::Text(text) => {
                state.write_u8(0);
                text.hash(state);
            }
            TextKeyRef::Digest(digest) => {
                state.write_u8(1);
                digest.hash(state);
            }
        }
    }
}

impl KeyRef<TextKey> for TextKeyRef<'_> {
    #[inline]
    fn is(&self, key: &TextKey) -> bool {
        match (self, &key.0) {
            (TextKeyRef::Text(a), Repr::Text(b)) => *a == &**b,
            (TextKeyRef::Digest(a), Repr::Digest(b)) => a == b,
            _ => false,
        }
    }

    fn to_key(&self) -> TextKey {
        TextKey(match *self {
            TextKeyRef::Text(text) => Repr::Text(text.into()),
            TextKeyRef::Digest(digest) => Repr::Digest(digest),
        })
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

impl<C: Clock> KeyedLimiter<TextKey, C> {
    /// [`KeyedLimiter::check_key_n`] for the key `text` names ([`TextKey::new`]), found
    /// without making it: a stored key's check allocates nothing (a new key is made once,
    /// to be stored). For a server that checks a header's value per request.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::check_key_n`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota, TextKey};
    /// let limiter = KeyedLimiter::<TextKey>::new(Quota::per_hour(2));
    /// assert!(limiter.check_text_n("tenant-a", 2).is_ok());
    /// assert!(limiter.check_text_n("tenant-a", 1).is_err());
    /// assert!(limiter.check_key(&TextKey::new("tenant-a")).is_err()); // the same key
    /// ```
    pub fn check_text_n(&self, text: &str, n: u32) -> Result<(), Denied> {
        match &self.quota_for {
            Some(_) => self.check_key_n(&TextKey::new(text), n),
            None => self.check_n_by(&TextKeyRef::new(text), self.quota.load(), n),
        }
    }

    /// [`KeyedLimiter::peek_key_n`] for the key `text` names, found without making it.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::peek_key_n`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::{KeyedLimiter, Quota, TextKey};
    /// let limiter = KeyedLimiter::<TextKey>::new(Quota::per_hour(1));
    /// limiter.check_text_n("tenant-a", 1).unwrap();
    /// assert!(limiter.peek_text_n("tenant-a", 1).unwrap().as_secs() > 3500);
    /// assert!(limiter.peek_text_n("tenant-b", 1).unwrap().is_zero());
    /// ```
    pub fn peek_text_n(&self, text: &str, n: u32) -> Result<Duration, InsufficientCapacity> {
        match &self.quota_for {
            Some(_) => self.peek_key_n(&TextKey::new(text), n),
            None => self.peek_n_by(&TextKeyRef::new(text), self.quota.load(), n),
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
