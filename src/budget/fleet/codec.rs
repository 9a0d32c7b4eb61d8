//! A fleet budget's value in Redis: a text header the write script checks, then the
//! state as little-endian words in base64 (so that clients that decode replies as text,
//! as redis-py's `decode_responses=True` does, read it whole).
//!
//! ```text
//! "PLB1 <generation>\n"        the header: the value's generation, in decimal
//! word 0                       the rules' fingerprint (`Rules::fingerprint`)
//!      1                       the next ticket
//!      2                       when callers were last checked for owners that are gone
//!      3, 4                    callers on record (n), owners' leases (m)
//!      5 ...                   n callers: ticket, owner, turn (u64::MAX: none), seen,
//!                              then one count of cells per dimension
//!      ...                     m leases: owner, until
//!      ...                     the ledger (`Ledger::encode`)
//! ```
//!
//! Decoding checks what a damaged or foreign value could break (counts within the room,
//! cells within `u32`, the ledger's own checks) and refuses the value otherwise: it is
//! never read as a fresh state and never overwritten.

use crate::budget::queue::{Caller, State};
use crate::budget::Ledger;

/// The header's first bytes: the format's name and version.
pub(super) const MAGIC: &[u8] = b"PLB1 ";

/// `Caller::turn` of a caller still waiting for a permit.
const NO_TURN: u64 = u64::MAX;

/// What a value holds besides its generation.
#[derive(Debug)]
pub(super) struct Stored {
    pub(super) fingerprint: u64,
    pub(super) state: State,
    /// Each owner's lease: its callers are cleared out once `until` has passed.
    pub(super) leases: Vec<(u64, u64)>,
}

/// The value for `stored` at `generation`.
pub(super) fn encode(generation: u64, stored: &Stored) -> Vec<u8> {
    let state = &stored.state;
    let mut words = vec![
        stored.fingerprint,
        state.next_ticket,
        state.last_reap,
        state.callers.len() as u64,
        stored.leases.len() as u64,
    ];
    for c in &state.callers {
        words.extend([c.ticket, c.owner, c.turn.unwrap_or(NO_TURN), c.seen]);
        words.extend(c.cells.iter().map(|&n| u64::from(n)));
    }
    for &(owner, until) in &stored.leases {
        words.extend([owner, until]);
    }
    state.ledger.encode(&mut words);
    let mut bytes = Vec::with_capacity(words.len() * 8);
    for w in words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    let mut out = format!("PLB1 {generation}\n").into_bytes();
    base64(&bytes, &mut out);
    out
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Appends `bytes` in base64 (standard alphabet, padded) to `out`.
fn base64(bytes: &[u8], out: &mut Vec<u8>) {
    out.reserve(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
}

/// The bytes `text` holds in base64, or `None` where it is not base64.
fn unbase64(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let quads = text.len() / 4;
    for (q, quad) in text.chunks_exact(4).enumerate() {
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && q + 1 != quads) {
            return None;
        }
        let mut n = 0;
        for &c in &quad[..4 - pad] {
            n = n << 6 | value(c)?;
        }
        n <<= 6 * pad as u32;
        let got = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&got[..3 - pad]);
    }
    Some(out)
}

/// The generation and what `value` holds, or `None` for a value this format does not
/// describe, or one out of range (`dims` dimensions, at most `room` callers and `log`
/// log entries).
pub(super) fn decode(value: &[u8], dims: usize, room: usize, log: usize) -> Option<(u64, Stored)> {
    let rest = value.strip_prefix(MAGIC)?;
    let end = rest.iter().position(|&b| b == b'\n')?;
    let digits = core::str::from_utf8(&rest[..end]).ok()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let generation: u64 = digits.parse().ok()?;
    let body = unbase64(&rest[end + 1..])?;
    if !body.len().is_multiple_of(8) {
        return None;
    }
    let words: Vec<u64> = body
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let head = words.get(..5)?;
    let n = usize::try_from(head[3]).ok().filter(|&n| n <= room)?;
    let m = usize::try_from(head[4]).ok().filter(|&m| m <= room)?;
    let record = 4 + dims;
    let callers_end = 5 + n * record;
    let leases_end = callers_end + 2 * m;
    let callers = words
        .get(5..callers_end)?
        .chunks_exact(record)
        .map(|w| {
            Some(Caller {
                ticket: w[0],
                owner: w[1],
                turn: Some(w[2]).filter(|&t| t != NO_TURN),
                seen: w[3],
                cells: w[4..]
                    .iter()
                    .map(|&c| u32::try_from(c).ok())
                    .collect::<Option<_>>()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let leases = words
        .get(callers_end..leases_end)?
        .chunks_exact(2)
        .map(|w| (w[0], w[1]))
        .collect();
    let ledger_words = words.get(leases_end..)?;
    let entries = usize::try_from(*ledger_words.first()?)
        .ok()
        .filter(|&e| e <= log)?;
    if ledger_words.len() != crate::budget::ledger_words(dims, entries) {
        return None;
    }
    let ledger = Ledger::decode(ledger_words, dims, log)?;
    Some((
        generation,
        Stored {
            fingerprint: head[0],
            state: State {
                ledger,
                callers,
                next_ticket: head[1],
                last_reap: head[2],
                room,
            },
            leases,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_reads_back_what_it_wrote_and_refuses_what_it_did_not() {
        for len in 0..20 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut text = Vec::new();
            base64(&bytes, &mut text);
            assert_eq!(unbase64(&text).as_deref(), Some(&bytes[..]), "{len}");
        }
        let mut text = Vec::new();
        base64(b"paceline", &mut text);
        assert_eq!(text, b"cGFjZWxpbmU=");
        for bad in [&b"cGFj?WxpbmU="[..], b"cGF", b"c===", b"cG==ZWxp"] {
            assert_eq!(unbase64(bad), None, "{bad:?}");
        }
    }
}
