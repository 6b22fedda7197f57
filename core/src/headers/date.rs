//! Calendar arithmetic and the two absolute time formats providers send: RFC 3339
//! (`2026-11-29T10:00:00Z`, Anthropic resets) and HTTP-date
//! (`Sun, 06 Nov 1994 08:49:37 GMT`, `Date` and `Retry-After`).
//!
//! Every parser validates its fields to small ranges (year 0..=9999, month 1..=12,
//! day 1..=31, ...) before doing arithmetic, so the plain integer arithmetic on those
//! validated values below cannot overflow.

use super::num::digit;

const MS_PER_SECOND: i64 = 1_000;
const SECONDS_PER_DAY: i64 = 86_400;

/// Whether `year` is a leap year in the proleptic Gregorian calendar.
pub(super) const fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Number of days in `month` (1..=12) of `year`; 0 for an invalid month.
pub(super) const fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days from 1970-01-01 to `year-month-day` (proleptic Gregorian; negative before 1970).
///
/// Callers pass a validated date (`month` 1..=12, `day` 1..=31, `|year|` well below
/// 10^12). The year is shifted to start in March, so the leap day is the last day of
/// the shifted year; a 400-year cycle has exactly 146 097 days.
pub(super) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Year starting on March 1st: January and February belong to the previous one.
    let y = if month <= 2 { year - 1 } else { year };
    // Which 400-year cycle, rounding towards negative infinity.
    let cycle = if y >= 0 { y / 400 } else { (y - 399) / 400 };
    let year_of_cycle = y - cycle * 400; // 0..=399
    // Month index counted from March (0) to February (11).
    let shifted_month = i64::from(if month > 2 { month - 3 } else { month + 9 });
    // Days before the 1st of each March-based month follow (153 * m + 2) / 5:
    // 0, 31, 61, 92, 122, 153, 184, 214, 245, 275, 306, 337.
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(day) - 1; // 0..=365
    let day_of_cycle = year_of_cycle * 365 + year_of_cycle / 4 - year_of_cycle / 100 + day_of_year;
    // 719 468 days separate 0000-03-01 from 1970-01-01.
    cycle * 146_097 + day_of_cycle - 719_468
}

/// Unix milliseconds of a validated UTC date-time, or `None` before 1970.
fn unix_ms(
    year: i64,
    month: u32,
    day: u32,
    hms: (u32, u32, u32),
    offset_s: i64,
    ms: i64,
) -> Option<u64> {
    let (hour, minute, second) = hms;
    let days = days_from_civil(year, month, day);
    let seconds = days * SECONDS_PER_DAY
        + i64::from(hour) * 3_600
        + i64::from(minute) * 60
        + i64::from(second)
        - offset_s;
    u64::try_from(seconds * MS_PER_SECOND + ms).ok()
}

/// A byte cursor over a date string.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str) -> Self {
        Cursor { rest: s.as_bytes() }
    }

    /// Exactly `n` ASCII digits.
    fn digits(&mut self, n: usize) -> Option<u32> {
        let (head, tail) = self.rest.split_at_checked(n)?;
        let mut acc: u32 = 0;
        for &b in head {
            acc = acc.checked_mul(10)?.checked_add(u32::from(digit(b)?))?;
        }
        self.rest = tail;
        Some(acc)
    }

    /// One or two ASCII digits.
    fn one_or_two_digits(&mut self) -> Option<u32> {
        let n = self
            .rest
            .iter()
            .take(2)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if n == 0 { None } else { self.digits(n) }
    }

    /// Consumes `b` if it is next.
    fn eat(&mut self, b: u8) -> bool {
        match self.rest.split_first() {
            Some((&c, tail)) if c == b => {
                self.rest = tail;
                true
            }
            _ => false,
        }
    }

    /// Consumes and returns the next byte.
    fn next(&mut self) -> Option<u8> {
        let (&c, tail) = self.rest.split_first()?;
        self.rest = tail;
        Some(c)
    }

    fn peek(&self) -> Option<u8> {
        self.rest.first().copied()
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// `hh:mm:ss` with hour 0..=23, minute 0..=59, second 0..=60 (leap second).
fn time_of_day(c: &mut Cursor<'_>) -> Option<(u32, u32, u32)> {
    let hour = c.digits(2)?;
    if !c.eat(b':') {
        return None;
    }
    let minute = c.digits(2)?;
    if !c.eat(b':') {
        return None;
    }
    let second = c.digits(2)?;
    (hour <= 23 && minute <= 59 && second <= 60).then_some((hour, minute, second))
}

/// Whether `day` exists in `month` of `year`.
fn valid_date(year: i64, month: u32, day: u32) -> bool {
    day >= 1 && day <= days_in_month(year, month)
}

/// Parses an RFC 3339 date-time into Unix milliseconds.
///
/// Accepts `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+hh:mm|-hh:mm)`, with `T`/`t`/space as the
/// separator and `Z`/`z` for UTC. Fractional seconds beyond milliseconds round up (a
/// reset is never reported earlier than sent). A leap second (`:60`) is accepted.
/// Times before 1970 and invalid dates (`2025-02-29`) give `None`.
#[must_use]
pub fn parse_rfc3339_ms(v: &str) -> Option<u64> {
    let mut c = Cursor::new(v.trim_ascii());
    let year = c.digits(4)?;
    if !c.eat(b'-') {
        return None;
    }
    let month = c.digits(2)?;
    if !c.eat(b'-') {
        return None;
    }
    let day = c.digits(2)?;
    let year = i64::from(year);
    if !(1..=12).contains(&month) || !valid_date(year, month, day) {
        return None;
    }
    if !matches!(c.next()?, b'T' | b't' | b' ') {
        return None;
    }
    let hms = time_of_day(&mut c)?;
    let mut ms: u64 = 0;
    if c.eat(b'.') {
        let mut used = 0u32;
        let mut round_up = false;
        let mut any = false;
        while let Some(d) = c.peek().and_then(digit) {
            c.next();
            any = true;
            if used < 3 {
                ms = ms * 10 + u64::from(d);
                used += 1;
            } else if d != 0 {
                round_up = true;
            }
        }
        if !any {
            return None;
        }
        ms = ms * super::num::pow10(3 - used) + u64::from(round_up);
    }
    let offset_s: i64 = match c.next()? {
        b'Z' | b'z' => 0,
        sign @ (b'+' | b'-') => {
            let oh = c.digits(2)?;
            if !c.eat(b':') {
                return None;
            }
            let om = c.digits(2)?;
            if oh > 23 || om > 59 {
                return None;
            }
            let magnitude = i64::from(oh) * 3_600 + i64::from(om) * 60;
            if sign == b'-' { -magnitude } else { magnitude }
        }
        _ => return None,
    };
    if !c.is_empty() {
        return None;
    }
    // ms is at most 1000 here (999 rounded up).
    unix_ms(year, month, day, hms, offset_s, i64::try_from(ms).ok()?)
}

/// Month number (1..=12) of an English three-letter month name, case-insensitively.
fn month_from_name(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let pos = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(name))?;
    u32::try_from(pos).ok().map(|p| p + 1)
}

/// Whether `name` is an English day name, short (`Sun`) or long (`Sunday`).
fn is_day_name(name: &str) -> bool {
    const SHORT: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    const LONG: [&str; 7] = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    SHORT
        .iter()
        .chain(LONG.iter())
        .any(|d| d.eq_ignore_ascii_case(name))
}

/// Parses an HTTP-date (RFC 9110 §5.6.7) into Unix milliseconds.
///
/// Accepts the preferred IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete
/// RFC 850 form (`Sunday, 06-Nov-94 08:49:37 GMT`) and ANSI C `asctime()` form
/// (`Sun Nov  6 08:49:37 1994`). Names are matched case-insensitively and the day name
/// is not checked against the date. A two-digit RFC 850 year below 70 is read as
/// 20xx, otherwise 19xx. Invalid dates and times before 1970 give `None`.
#[must_use]
pub fn parse_http_date_ms(v: &str) -> Option<u64> {
    let mut tokens = v.split_ascii_whitespace();
    let first = tokens.next()?;
    if let Some(day_name) = first.strip_suffix(',') {
        if !is_day_name(day_name) {
            return None;
        }
        let second = tokens.next()?;
        if second.contains('-') {
            rfc850(second, tokens)
        } else {
            imf_fixdate(second, tokens)
        }
    } else {
        if !is_day_name(first) {
            return None;
        }
        asctime(tokens)
    }
}

/// Finishes a date given its parts as strings; checks ranges.
fn finish_http_date(year: i64, month: u32, day: u32, time: &str) -> Option<u64> {
    if !valid_date(year, month, day) {
        return None;
    }
    let mut c = Cursor::new(time);
    let hms = time_of_day(&mut c)?;
    if !c.is_empty() {
        return None;
    }
    unix_ms(year, month, day, hms, 0, 0)
}

/// Whether `zone` names UTC the way HTTP-dates do.
fn is_gmt(zone: &str) -> bool {
    zone.eq_ignore_ascii_case("GMT") || zone.eq_ignore_ascii_case("UTC")
}

/// A day of month: one or two digits, nothing else.
fn day_of_month(s: &str) -> Option<u32> {
    let mut c = Cursor::new(s);
    let day = c.one_or_two_digits()?;
    c.is_empty().then_some(day)
}

/// A four-digit year, nothing else.
fn four_digit_year(s: &str) -> Option<i64> {
    let mut c = Cursor::new(s);
    let year = c.digits(4)?;
    c.is_empty().then_some(i64::from(year))
}

/// `06 Nov 1994 08:49:37 GMT` after the day name.
fn imf_fixdate<'a>(day: &str, mut rest: impl Iterator<Item = &'a str>) -> Option<u64> {
    let day = day_of_month(day)?;
    let month = month_from_name(rest.next()?)?;
    let year = four_digit_year(rest.next()?)?;
    let time = rest.next()?;
    if !is_gmt(rest.next()?) || rest.next().is_some() {
        return None;
    }
    finish_http_date(year, month, day, time)
}

/// `06-Nov-94 08:49:37 GMT` after the day name.
fn rfc850<'a>(date: &str, mut rest: impl Iterator<Item = &'a str>) -> Option<u64> {
    let mut parts = date.split('-');
    let day = day_of_month(parts.next()?)?;
    let month = month_from_name(parts.next()?)?;
    let year_text = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let year = match year_text.len() {
        2 => {
            let yy = i64::from(Cursor::new(year_text).digits(2)?);
            if yy < 70 { 2000 + yy } else { 1900 + yy }
        }
        _ => four_digit_year(year_text)?,
    };
    let time = rest.next()?;
    if !is_gmt(rest.next()?) || rest.next().is_some() {
        return None;
    }
    finish_http_date(year, month, day, time)
}

/// `Nov  6 08:49:37 1994` after the day name.
fn asctime<'a>(mut rest: impl Iterator<Item = &'a str>) -> Option<u64> {
    let month = month_from_name(rest.next()?)?;
    let day = day_of_month(rest.next()?)?;
    let time = rest.next()?;
    let year = four_digit_year(rest.next()?)?;
    if rest.next().is_some() {
        return None;
    }
    finish_http_date(year, month, day, time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_from_civil_matches_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2000, 1, 1), 10_957);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 11, 29), 20_786);
        assert_eq!(days_from_civil(0, 3, 1), -719_468);
        assert_eq!(days_from_civil(9999, 12, 31), 2_932_896);
    }

    #[test]
    fn leap_years_follow_gregorian_rules() {
        assert!(is_leap_year(2000));
        assert!(is_leap_year(2024));
        assert!(!is_leap_year(1900));
        assert!(!is_leap_year(2100));
        assert!(!is_leap_year(2025));
        // 2024-02-29 exists and is followed by 2024-03-01; 1900 and 2100 have no Feb 29.
        assert_eq!(
            days_from_civil(2024, 3, 1) - days_from_civil(2024, 2, 29),
            1
        );
        assert_eq!(
            days_from_civil(2024, 3, 1) - days_from_civil(2024, 2, 28),
            2
        );
        assert_eq!(
            days_from_civil(2100, 3, 1) - days_from_civil(2100, 2, 28),
            1
        );
        assert_eq!(
            days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28),
            2
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
        assert_eq!(parse_rfc3339_ms("2025-02-29T00:00:00Z"), None);
        assert_eq!(parse_rfc3339_ms("2100-02-29T00:00:00Z"), None);
        assert_eq!(
            parse_rfc3339_ms("2000-02-29T00:00:00Z"),
            Some(951_782_400_000)
        );
    }

    #[test]
    fn days_from_civil_is_consecutive_across_four_centuries() {
        let mut expected = days_from_civil(1900, 1, 1);
        for year in 1900..2300 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    assert_eq!(days_from_civil(year, month, day), expected);
                    expected += 1;
                }
            }
        }
        assert_eq!(expected - days_from_civil(1900, 1, 1), 146_097);
    }

    #[test]
    fn parses_rfc3339_with_fractions_and_offsets() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T10:00:00Z"),
            Some(1_795_946_400_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T10:00:00.5Z"),
            Some(1_795_946_400_500)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T10:00:00.123456Z"),
            Some(1_795_946_400_124)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T10:00:00.123000Z"),
            Some(1_795_946_400_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T11:30:00+01:30"),
            Some(1_795_946_400_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T05:00:00-05:00"),
            Some(1_795_946_400_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29t10:00:00z"),
            Some(1_795_946_400_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29 10:00:00Z"),
            Some(1_795_946_400_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T23:59:60Z"),
            Some(1_795_996_800_000)
        );
        assert_eq!(
            parse_rfc3339_ms("9999-12-31T23:59:59.999Z"),
            Some(253_402_300_799_999)
        );
    }

    #[test]
    fn rejects_malformed_rfc3339() {
        for bad in [
            "",
            "2026-11-29",
            "2026-11-29T10:00:00",
            "2026-11-29T10:00Z",
            "2026-13-01T00:00:00Z",
            "2026-00-01T00:00:00Z",
            "2026-11-31T00:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T10:60:00Z",
            "2026-11-29T10:00:61Z",
            "2026-11-29T10:00:00.Z",
            "2026-11-29T10:00:00+1:00",
            "2026-11-29T10:00:00+24:00",
            "2026-11-29T10:00:00Zjunk",
            "+2026-11-29T10:00:00Z",
            "２０２６-11-29T10:00:00Z",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:30:00+01:00",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn parses_all_three_http_date_forms() {
        let expected = Some(784_111_777_000);
        assert_eq!(
            parse_http_date_ms("Sun, 06 Nov 1994 08:49:37 GMT"),
            expected
        );
        assert_eq!(
            parse_http_date_ms("Sunday, 06-Nov-94 08:49:37 GMT"),
            expected
        );
        assert_eq!(parse_http_date_ms("Sun Nov  6 08:49:37 1994"), expected);
        assert_eq!(
            parse_http_date_ms("sun, 06 nov 1994 08:49:37 gmt"),
            expected
        );
        assert_eq!(
            parse_http_date_ms("Sat, 29 Nov 2026 10:00:00 GMT"),
            Some(1_795_946_400_000)
        );
        assert_eq!(
            parse_http_date_ms("Thursday, 01-Jan-70 00:00:00 GMT"),
            Some(0)
        );
        assert_eq!(
            parse_http_date_ms("Wednesday, 29-Feb-28 00:00:00 GMT"),
            Some(1_835_395_200_000)
        );
    }

    #[test]
    fn rejects_malformed_http_dates() {
        for bad in [
            "",
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 29 Feb 1900 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sun, 006 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94-1 08:49:37 GMT",
            "Sun Nov  6 08:49:37",
            "Wed, 31 Dec 1969 23:59:59 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT\u{0}",
            "Sün, 06 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_http_date_ms(bad), None, "{bad:?}");
        }
    }
}
