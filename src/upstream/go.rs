//! Go's duration text (`time.Duration.String`), as OpenAI-style `x-ratelimit-reset-*`
//! fields send it: `6m0s`, `12ms`, `1.5s`, `2h3m4.5s`, `0s`.
//!
//! Strict about shape, saturating about size: a sign (a negative duration is no reset),
//! a missing unit, an unknown unit or anything after the last unit makes the value
//! unreadable (ignored by the caller); a value too large for `u64` nanoseconds (584
//! years) saturates, and the caller caps every wait it takes from it. Work is bounded: a
//! value longer than [`MAX_LEN`] bytes is not read.

use core::time::Duration;

/// The longest value read, in bytes.
const MAX_LEN: usize = 64;

/// The duration `value` spells, if it is Go duration text.
pub(super) fn go_duration(value: &str) -> Option<Duration> {
    if value.is_empty() || value.len() > MAX_LEN {
        return None;
    }
    if value == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = value;
    // Total nanoseconds; u128 holds any sum of at most 64 saturated u64 terms.
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let whole_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (whole, after) = rest.split_at(whole_len);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(f) => {
                let len = f.bytes().take_while(u8::is_ascii_digit).count();
                f.split_at(len)
            }
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_len = after
            .char_indices()
            .find(|&(_, c)| c == '.' || c.is_ascii_digit())
            .map_or(after.len(), |(i, _)| i);
        let (unit, next) = after.split_at(unit_len);
        let scale: u64 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let whole = whole.bytes().fold(0u128, |n, b| {
            n.saturating_mul(10)
                .saturating_add(u128::from(b - b'0'))
                .min(u128::from(u64::MAX))
        });
        // The fraction, to 18 digits: exact for every unit down to the nanosecond.
        let mut frac: u128 = 0;
        let mut denom: u128 = 1;
        for b in fraction.bytes().take(18) {
            frac = frac * 10 + u128::from(b - b'0');
            denom *= 10;
        }
        total = total
            .saturating_add(whole.saturating_mul(u128::from(scale)))
            .saturating_add(frac * u128::from(scale) / denom);
        rest = next;
    }
    let nanos = u64::try_from(total).unwrap_or(u64::MAX);
    Some(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::go_duration;
    use core::time::Duration;

    #[test]
    fn what_go_prints_reads_back() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration("12ms"), Some(ms(12)));
        assert_eq!(go_duration("1.5s"), Some(ms(1_500)));
        assert_eq!(go_duration("2h3m4.5s"), Some(ms(7_384_500)));
        assert_eq!(go_duration("0s"), Some(Duration::ZERO));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("1.000000001s"), Some(Duration::new(1, 1)));
        assert_eq!(go_duration("3us"), Some(Duration::from_micros(3)));
        assert_eq!(go_duration("3\u{b5}s"), Some(Duration::from_micros(3)));
        assert_eq!(go_duration("250ns"), Some(Duration::from_nanos(250)));
        assert_eq!(go_duration(".5s"), Some(ms(500)));
        assert_eq!(go_duration("0.5h"), Some(Duration::from_secs(1_800)));
    }

    #[test]
    fn hostile_text_is_ignored_and_huge_values_saturate() {
        for bad in [
            "", "-1s", "+1s", "1", "s", ".s", "1x", "1.5", "1s ", " 1s", "1S", "1sec", "1m-1s",
            "NaN", "nans", "inf", "1e9s", "1..5s", "0x10s", "1,5s", "\u{661}s",
        ] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
        let long = "1s".repeat(33);
        assert_eq!(go_duration(&long), None, "longer than MAX_LEN");
        let max = Some(Duration::from_nanos(u64::MAX));
        assert_eq!(
            go_duration("9999h"),
            Some(Duration::from_secs(9_999 * 3_600))
        );
        assert_eq!(go_duration("99999999999999999999999h"), max);
        assert_eq!(go_duration("5000000h5000000h5000000h"), max);
    }
}
