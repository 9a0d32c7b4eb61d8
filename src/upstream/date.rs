//! HTTP-dates (RFC 9110, 5.6.7) as Unix seconds: `Sun, 06 Nov 1994 08:49:37 GMT`
//! (IMF-fixdate), `Sunday, 06-Nov-94 08:49:37 GMT` (RFC 850) and
//! `Sun Nov  6 08:49:37 1994` (asctime). A date that names no real day (31 February, a
//! 29 February outside a leap year) is no date.

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
    const DAYS: [u64; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let index = MONTHS.iter().position(|m| *m == month)?;
    let month = index as u64 + 1;
    let days_in_month = DAYS[index] + u64::from(index == 1 && leap(year));
    let day = number(day).filter(|d| (1..=days_in_month).contains(d))?;
    let mut hms = time.split(':');
    let mut field = || hms.next().filter(|f| f.len() == 2).and_then(number);
    let (h, m, s) = (field()?, field()?, field()?);
    if hms.next().is_some() || h > 23 || m > 59 || s > 60 || !(1970..=9999).contains(&year) {
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

#[cfg(test)]
mod tests {
    use super::http_date;

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
