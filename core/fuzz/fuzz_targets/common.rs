//! Helpers shared by the fuzz targets: input splitting and an independent, naive
//! calendar used as an oracle for the date parsers.

#![allow(dead_code)]

/// Splits an optional wall clock off the input: when the first byte is odd, the next
/// eight bytes (little endian) are the clock. Returns the clock and the rest.
pub fn split_clock(data: &[u8]) -> (Option<u64>, &[u8]) {
    match data.split_first() {
        Some((flag, rest)) if flag & 1 == 1 => match rest.split_first_chunk::<8>() {
            Some((clock, tail)) => (Some(u64::from_le_bytes(*clock)), tail),
            None => (None, rest),
        },
        Some((_, rest)) => (None, rest),
        None => (None, data),
    }
}

fn is_leap(y: u64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn month_len(y: u64, m: u64) -> u64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: u64,
    pub month: u64,
    pub day: u64,
    pub hour: u64,
    pub minute: u64,
    pub second: u64,
    pub milli: u64,
}

/// Unix milliseconds to a calendar time by counting days year by year and month by
/// month: slow, obviously right, and independent of the crate's closed formula.
pub fn civil(unix_ms: u64) -> Civil {
    let milli = unix_ms % 1000;
    let secs = unix_ms / 1000;
    let mut days = secs / 86_400;
    let rem = secs % 86_400;
    let mut year = 1970;
    loop {
        let len = if is_leap(year) { 366 } else { 365 };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let mut month = 1;
    loop {
        let len = month_len(year, month);
        if days < len {
            break;
        }
        days -= len;
        month += 1;
    }
    Civil {
        year,
        month,
        day: days + 1,
        hour: rem / 3600,
        minute: rem % 3600 / 60,
        second: rem % 60,
        milli,
    }
}

pub const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
