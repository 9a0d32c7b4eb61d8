//! HTTP-dates (RFC 9110, 5.6.7) as Unix seconds: `Sun, 06 Nov 1994 08:49:37 GMT`
//! (IMF-fixdate), `Sunday, 06-Nov-94 08:49:37 GMT` (RFC 850) and
//! `Sun Nov  6 08:49:37 1994` (asctime); and RFC 3339 timestamps
//! (`2026-11-26T14:10:24.5Z`, `...+01:00`) as Unix time. A date that names no real day
//! (31 February, a 29 February outside a leap year) is no date; years run from 1970 to
//! 9999.

use core::time::Duration;

/// Unix seconds of an HTTP-date, if `value` is one.
pub(super) fn http_date(value: &str) -> Option<u64> {
    let mut words = [""; 6];
    let mut count = 0;
    for word in value.split_whitespace() {
        *words.get_mut(count)? = word;
        count += 1;
    }
    match &words[..count] {
        // IMF-fixdate.
        [_, day, month, year, time, "GMT"] => civil(number(year)?, month, day, time),
        // RFC 850: "06-Nov-94".
        [_, date, time, "GMT"] => {
            let mut parts = date.split('-');
            let (day, month, year) = (parts.next()?, parts.next()?, parts.next()?);
            if parts.next().is_some() {
                return None;
            }
            let year = match year.len() {
                // Two-digit years: 70..99 are the 1900s, the rest the 2000s (RFC 9110).
                2 => number(year).map(|y| if y >= 70 { 1900 + y } else { 2000 + y })?,
                _ => number(year)?,
            };
            civil(year, month, day, time)
        }
        // asctime.
        [_, month, day, time, year] => civil(number(year)?, month, day, time),
        _ => None,
    }
}

/// A short run of decimal digits.
fn number(text: &str) -> Option<u64> {
    (!text.is_empty() && text.len() <= 4 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

fn leap(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

/// Unix seconds of a proleptic Gregorian date and `hh:mm:ss` time, in UTC, for years
/// 1970 to 9999.
fn civil(year: u64, month: &str, day: &str, time: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let index = MONTHS.iter().position(|m| *m == month)?;
    let mut hms = time.split(':');
    let mut field = || hms.next().filter(|f| f.len() == 2).and_then(number);
    let (h, m, s) = (field()?, field()?, field()?);
    if hms.next().is_some() {
        return None;
    }
    unix(year, index as u64 + 1, number(day)?, (h, m, s))
}

/// Unix seconds of a proleptic Gregorian date (month 1 to 12) and time of day, in UTC,
/// for years 1970 to 9999; `None` for a day or time that does not exist.
fn unix(year: u64, month: u64, day: u64, (h, m, s): (u64, u64, u64)) -> Option<u64> {
    const DAYS: [u64; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let index = usize::try_from(month.checked_sub(1)?).ok()?;
    let days_in_month = DAYS.get(index)? + u64::from(index == 1 && leap(year));
    if !(1..=days_in_month).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    if !(1970..=9999).contains(&year) {
        return None;
    }
    // Days from 1970-01-01 (Howard Hinnant's days_from_civil, for years from 1970).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + h * 3_600 + m * 60 + s)
}

/// Unix time of an RFC 3339 timestamp (`2026-11-26T14:10:24Z`, a fraction of up to nine
/// digits, `t`/`z` in either case, a `+hh:mm`/`-hh:mm` offset), if `value` is one and
/// names an instant from 1970 on.
pub(super) fn rfc3339(value: &str) -> Option<Duration> {
    let b = value.as_bytes();
    if b.len() < 20 || b.len() > 40 || !value.is_ascii() {
        return None;
    }
    let digits = |from: usize, len: usize| -> Option<u64> {
        let text = value.get(from..from + len)?;
        text.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| text.parse().ok())?
    };
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if seps.iter().any(|&(i, c)| b[i] != c) || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (h, m, s) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    let mut rest = &value[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 || len > 9 {
            return None;
        }
        let mut scale = 100_000_000u32;
        for c in fraction[..len].bytes() {
            nanos += u32::from(c - b'0') * scale;
            scale /= 10;
        }
        rest = &fraction[len..];
    }
    // The offset, in seconds east of UTC.
    let offset: i64 = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (digits(value.len() - 5, 2)?, digits(value.len() - 2, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let east = i64::try_from(oh * 3_600 + om * 60).ok()?;
            if *sign == b'+' {
                east
            } else {
                -east
            }
        }
        _ => return None,
    };
    let local = unix(year, month, day, (h, m, s))?;
    let utc = i64::try_from(local).ok()?.checked_sub(offset)?;
    Some(Duration::new(u64::try_from(utc).ok()?, nanos))
}

#[cfg(test)]
mod tests {
    use super::{http_date, rfc3339};
    use core::time::Duration;

    #[test]
    fn rfc3339_timestamps_in_utc_with_offsets_and_fractions() {
        // 784111777 is 1994-11-06T08:49:37Z.
        let at = |s: &str| rfc3339(s).map(|d| (d.as_secs(), d.subsec_nanos()));
        assert_eq!(at("1994-11-06T08:49:37Z"), Some((784_111_777, 0)));
        assert_eq!(at("1994-11-06t08:49:37z"), Some((784_111_777, 0)));
        assert_eq!(at("1994-11-06T09:49:37+01:00"), Some((784_111_777, 0)));
        assert_eq!(at("1994-11-06T03:19:37-05:30"), Some((784_111_777, 0)));
        assert_eq!(
            at("1994-11-06T08:49:37.25Z"),
            Some((784_111_777, 250_000_000))
        );
        assert_eq!(
            at("1994-11-06T08:49:37.123456789Z"),
            Some((784_111_777, 123_456_789))
        );
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(Duration::ZERO));
        assert_eq!(
            at("9999-12-31T23:59:59Z").map(|(s, _)| s),
            Some(253_402_300_799)
        );
    }

    #[test]
    fn rfc3339_junk_is_no_instant() {
        for bad in [
            "",
            "1994-11-06",
            "1994-11-06T08:49:37",
            "1994-11-06T08:49:37+0100",
            "1994-11-06T08:49:37.Z",
            "1994-11-06T08:49:37.1234567890Z",
            "1994-13-06T08:49:37Z",
            "1994-02-30T08:49:37Z",
            "1994-11-06T24:00:00Z",
            "1994-11-06T08:60:00Z",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00+01:00",
            "+1994-11-06T08:49:37Z",
            "-001-11-06T08:49:37Z",
            "1994-11-06T08:49:37Z ",
            "1994-11-06T08:49:37Zjunk",
            "1994-11-06T08:49:37+24:00",
            "1994-11-06T08:4:370Z",
            "１９９４-11-06T08:49:37Z",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn all_three_forms() {
        // 784111777 is Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example).
        for date in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(http_date(date), Some(784_111_777), "{date}");
        }
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date("Sat, 29 Feb 2020 12:00:00 GMT"),
            Some(1_582_977_600)
        );
    }

    #[test]
    fn days_that_do_not_exist_are_no_dates() {
        for bad in [
            "",
            "Mon, 31 Feb 2099 00:00:00 GMT",
            "Mon, 30 Feb 2024 00:00:00 GMT",
            "Mon, 29 Feb 2100 00:00:00 GMT",
            "Mon, 31 Apr 2030 00:00:00 GMT",
            "Mon, 00 Jan 2030 00:00:00 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT and more words",
            "Sun, 06 Nov 99999 08:49:37 GMT",
            "tomorrow",
        ] {
            assert_eq!(http_date(bad), None, "{bad}");
        }
        assert!(http_date("Thu, 29 Feb 2024 00:00:00 GMT").is_some());
        assert!(http_date("Tue, 29 Feb 2000 00:00:00 GMT").is_some());
    }
}
