//! The part of structured fields (RFC 9651) the rate-limit fields use: a list of items
//! (a string, token, integer, decimal, byte sequence or boolean) with `;key=value`
//! parameters, and the dictionary form of an earlier draft (`limit=10, remaining=0`).
//!
//! # Implementation notes
//!
//! Lenient where leniency is safe, strict where a value becomes time: a member whose item
//! or parameters do not parse is left out, never guessed at, but a parameter this crate
//! does not use (`pk=:...:`, `qu="request"`, anything a later draft adds) is skipped
//! whatever its type, and the member it sits on still counts. Numbers keep their whole
//! part (saturating at `u64::MAX`: 16 digits are as readable as 15, and a later cap
//! bounds them) and up to nine digits of fraction. Work is bounded: at most
//! [`MAX_MEMBERS`] members of a field and [`MAX_PARAMS`] parameters of a member are read.

/// Members of one field value read; the rest are ignored.
pub(super) const MAX_MEMBERS: usize = 32;
/// Parameters of one member read; the rest are ignored.
pub(super) const MAX_PARAMS: usize = 16;

/// A non-negative number: whole units and nanounits (the fraction, to nine digits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Number {
    pub(super) whole: u64,
    pub(super) nanos: u32,
}

impl Number {
    /// The number as an integer, if it has no fraction.
    pub(super) fn integer(self) -> Option<u64> {
        (self.nanos == 0).then_some(self.whole)
    }

    /// The number as seconds.
    pub(super) fn seconds(self) -> core::time::Duration {
        core::time::Duration::new(self.whole, self.nanos)
    }
}

/// A bare item, as far as these fields care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Item<'a> {
    Number(Number),
    /// A string, a token, a byte sequence, a boolean, a negative number: well formed, and
    /// nothing this crate reads a value from.
    Other(&'a str),
}

impl Item<'_> {
    pub(super) fn number(self) -> Option<Number> {
        match self {
            Item::Number(n) => Some(n),
            Item::Other(_) => None,
        }
    }
}

/// One member of a list: its item (or, in the dictionary form, its key and value) and its
/// parameters.
#[derive(Debug)]
pub(super) struct Member<'a> {
    /// The dictionary form's key (`limit` in `limit=10`); `None` for a list item.
    pub(super) key: Option<&'a str>,
    pub(super) item: Item<'a>,
    params: Vec<(&'a str, Item<'a>)>,
}

impl<'a> Member<'a> {
    /// The number a parameter holds, if it is there and a number (the first of repeated
    /// keys: RFC 9651 keeps the last, but a repeated key is a server's mistake, and any
    /// choice is as good).
    pub(super) fn number(&self, key: &str) -> Option<Number> {
        self.params
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.number())
    }
}

/// The members of a field value, each well formed one in order (at most
/// [`MAX_MEMBERS`]).
pub(super) fn members(value: &str) -> Vec<Member<'_>> {
    split_outside_quotes(value, b',')
        .take(MAX_MEMBERS)
        .filter_map(member)
        .collect()
}

fn member(text: &str) -> Option<Member<'_>> {
    let mut parts = split_outside_quotes(text, b';');
    let head = parts.next()?.trim();
    // The dictionary form: `key=value` (a string item holds no top-level `=`).
    let (key, item) = match head.split_once('=') {
        Some((key, value)) if !head.starts_with('"') && is_key(key.trim()) => {
            (Some(key.trim()), bare(value.trim())?)
        }
        _ => (None, bare(head)?),
    };
    let mut params = Vec::new();
    for param in parts.take(MAX_PARAMS) {
        let param = param.trim();
        let (k, v) = match param.split_once('=') {
            Some((k, v)) => (k.trim(), bare(v.trim())?),
            // A key alone is the boolean true.
            None => (param, Item::Other("?1")),
        };
        if !is_key(k) {
            return None;
        }
        params.push((k, v));
    }
    Some(Member { key, item, params })
}

/// A key: a lowercase letter or `*`, then lowercase letters, digits, `_-.*`.
fn is_key(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'*'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'))
}

/// A bare item: `None` if it is not well formed.
fn bare(text: &str) -> Option<Item<'_>> {
    let first = *text.as_bytes().first()?;
    match first {
        b'"' => {
            let inner = text.strip_prefix('"')?.strip_suffix('"')?;
            let mut escaped = false;
            for b in inner.bytes() {
                match b {
                    _ if escaped => {
                        if b != b'"' && b != b'\\' {
                            return None;
                        }
                        escaped = false;
                    }
                    b'\\' => escaped = true,
                    b'"' => return None,
                    0x20..=0x7e => {}
                    _ => return None,
                }
            }
            (!escaped).then_some(Item::Other(text))
        }
        b':' => {
            let inner = text.strip_prefix(':')?.strip_suffix(':')?;
            inner
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
                .then_some(Item::Other(text))
        }
        b'?' => matches!(text, "?0" | "?1").then_some(Item::Other(text)),
        b'-' => number(&text[1..]).map(|_| Item::Other(text)),
        b'0'..=b'9' => number(text).map(Item::Number),
        b'a'..=b'z' | b'A'..=b'Z' | b'*' => text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
            .then_some(Item::Other(text)),
        _ => None,
    }
}

/// A decimal number: digits, then optionally `.` and digits. Digits past the ninth of the
/// fraction are read and dropped; the whole part saturates.
pub(super) fn number(text: &str) -> Option<Number> {
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (text, None),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole = whole.bytes().fold(0u64, |n, b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    });
    let mut nanos = 0u32;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut scale = 100_000_000u32;
        for b in fraction.bytes().take(9) {
            nanos += u32::from(b - b'0') * scale;
            scale /= 10;
        }
    }
    Some(Number { whole, nanos })
}

/// Splits on `sep` outside double quotes (a quoted name may hold `,` or `;`).
pub(super) fn split_outside_quotes(value: &str, sep: u8) -> impl Iterator<Item = &str> {
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    let mut positions = value.bytes().enumerate();
    let mut done = false;
    core::iter::from_fn(move || {
        if done {
            return None;
        }
        for (i, b) in positions.by_ref() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                _ if b == sep && !quoted => {
                    let part = &value[start..i];
                    start = i + 1;
                    return Some(part);
                }
                _ => {}
            }
        }
        done = true;
        Some(&value[start..])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(whole: u64, nanos: u32) -> Item<'static> {
        Item::Number(Number { whole, nanos })
    }

    #[test]
    fn items_of_every_type_parse_and_only_numbers_carry_a_value() {
        assert_eq!(bare("42"), Some(n(42, 0)));
        assert_eq!(bare("1.5"), Some(n(1, 500_000_000)));
        assert_eq!(bare("0.000000001999"), Some(n(0, 1)));
        assert_eq!(bare("99999999999999999999999"), Some(n(u64::MAX, 0)));
        for other in [
            "\"a,b;c\"",
            "\"q\\\"x\"",
            ":cHsxMjM0NQ==:",
            "?1",
            "tok/en",
            "-3",
            "-3.5",
        ] {
            assert!(matches!(bare(other), Some(Item::Other(_))), "{other}");
        }
        for bad in [
            "",
            "\"open",
            "\"a\"b\"",
            ":not base64!:",
            "?2",
            "1.",
            ".5",
            "1e9",
            "(x)",
        ] {
            assert_eq!(bare(bad), None, "{bad}");
        }
    }

    #[test]
    fn unknown_parameters_are_skipped_whatever_their_type() {
        let m = members(r#""default";q=50;w=1;qu="request";pk=:cHsxMjM0NQ==:;flag"#);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].number("q").and_then(Number::integer), Some(50));
        assert_eq!(m[0].number("w").and_then(Number::integer), Some(1));
        assert_eq!(m[0].number("qu"), None);
    }

    #[test]
    fn the_dictionary_form_and_broken_members() {
        let m = members("limit=10, remaining=0, reset=2");
        let keys: Vec<_> = m.iter().map(|m| (m.key, m.item)).collect();
        assert_eq!(
            keys,
            [
                (Some("limit"), n(10, 0)),
                (Some("remaining"), n(0, 0)),
                (Some("reset"), n(2, 0))
            ]
        );
        // A broken member is left out; the others stay.
        let m = members(r#""a";q=5;w=1, "b;q=7, "c";q=x=y;w=1"#);
        assert_eq!(m.len(), 1);
        assert_eq!(members(&",".repeat(10_000)).len(), 0);
        assert_eq!(members(&"\"a\";q=1,".repeat(1_000)).len(), MAX_MEMBERS);
    }
}
