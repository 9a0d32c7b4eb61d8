//! The fuzz body for the upstream's per-dimension rate-limit fields, followed by a budget.

use core::time::Duration;

use super::Bytes;
use crate::clock::ManualClock;
use crate::Quota;

/// `DimensionSignal::read` on hostile responses, then `Budget::follow`: reading never
/// panics, is deterministic, keeps at most `MAX_DIMENSIONS` dimensions with unique,
/// folded names; and nothing a response says keeps a one-cell turn out longer than
/// `max_hold` plus the dimension's own burst window.
///
/// The input: a status byte, then fields, each a name byte (one of the providers' field
/// names, or free text), a dimension byte, a value length byte, and the value's bytes.
pub fn dimension_signal(data: &[u8]) {
    use crate::budget::Budget;
    use crate::upstream::{DimensionSignal, MAX_DIMENSIONS};
    use std::time::{SystemTime, UNIX_EPOCH};

    const NAMES: [&str; 12] = [
        "retry-after",
        "date",
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit-",
        "x-ratelimit-remaining-",
        "x-ratelimit-reset-",
        "anthropic-ratelimit-",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "",
    ];
    const DIMS: [&str; 6] = [
        "requests",
        "tokens",
        "input-tokens",
        "output-tokens",
        "Tokens",
        "x",
    ];
    const PARTS: [&str; 3] = ["-limit", "-remaining", "-reset"];
    let mut bytes = Bytes(data);
    let status = [200u16, 429, 503, 500][usize::from(bytes.u8() % 4)];
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    while !bytes.is_empty() && headers.len() < 64 {
        let n = bytes.u8();
        let d = bytes.u8();
        let len = usize::from(bytes.u8() % 64).min(bytes.0.len());
        let (value, rest) = bytes.0.split_at(len);
        bytes.0 = rest;
        let base = NAMES[usize::from(n) % NAMES.len()];
        let dim = DIMS[usize::from(d) % DIMS.len()];
        let name = match base {
            "x-ratelimit-limit-" | "x-ratelimit-remaining-" | "x-ratelimit-reset-" => {
                format!("{base}{dim}")
            }
            "anthropic-ratelimit-" => {
                format!("{base}{dim}{}", PARTS[usize::from(d / 8) % PARTS.len()])
            }
            "" => String::from_utf8_lossy(value).into_owned(),
            _ => base.to_owned(),
        };
        headers.push((name, value.to_vec()));
    }
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let read = |at: SystemTime| {
        DimensionSignal::read(
            status,
            headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
            at,
        )
    };
    let signal = read(now);
    assert_eq!(signal, read(now), "reading is deterministic");
    let left = signal.left();
    assert!(left.len() <= MAX_DIMENSIONS, "{} dimensions", left.len());
    for (i, dim) in left.iter().enumerate() {
        assert!(
            !dim.name.is_empty() && dim.name.len() <= 64,
            "{:?}",
            dim.name
        );
        assert!(!dim.name.contains('-') && dim.name == dim.name.to_lowercase());
        assert!(left[..i].iter().all(|other| other.name != dim.name));
    }
    // Followed by a budget: every turn of one cell admitted after max_hold plus the
    // dimension's burst window (the budget's clock starts late, so no instant underflows).
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    let quota = Quota::per_second(10).with_burst(5);
    let budget = Budget::builder()
        .rate("requests", quota)
        .rate("tokens", quota)
        .rate("input_tokens", quota)
        .clock(clock.clone())
        .build()
        .expect("a valid budget");
    let max_hold = Duration::from_secs(1);
    budget.follow(&signal, max_hold);
    clock.advance(max_hold + Duration::from_millis(500));
    assert!(
        budget.try_acquire(&[]).is_ok(),
        "a response kept a turn out past max_hold: {signal:?}"
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn absurd_provider_fields_keep_no_turn_out_past_max_hold() {
        // Fields a provider could send, at their most absurd: each field is a name byte,
        // a dimension byte, the value's length and the value.
        let field = |name: u8, dim: u8, value: &str| {
            let mut f = vec![name, dim, value.len() as u8];
            f.extend_from_slice(value.as_bytes());
            f
        };
        for (name, dim, value) in [
            (0, 0, "99999999999999999999"),
            (0, 0, "Fri, 31 Dec 9999 23:59:59 GMT"),
            (6, 1, "9999h"),
            (6, 1, "1e300s"),
            (5, 1, "0"),
            (7, 1, "2999-01-01T00:00:00Z"),
            (7, 9, "0"),
            (2, 0, "\"tokens\";r=0;t=99999999999"),
            (3, 0, "\"tokens\";q=1;w=1000000000"),
            (10, 0, "1800000999999"),
        ] {
            let mut data = vec![1];
            data.extend(field(name, dim, value));
            data.extend(field(5, 0, "0"));
            super::dimension_signal(&data);
        }
    }
}
