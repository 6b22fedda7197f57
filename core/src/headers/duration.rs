//! Go-style durations (`"6m0s"`, `"1.5s"`, `"20ms"`, `"20µs"`), as OpenAI sends in
//! `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens`.

use super::num::{Parsed, clamp_wait, digit, parse_count, parse_seconds_ms};

const NS_PER_MS: u128 = 1_000_000;

/// Most fraction digits kept exactly; later digits only decide rounding up.
/// 10^18 times the largest unit (an hour, 3.6e12 ns) still fits in a `u128`.
const MAX_FRAC_DIGITS: u32 = 18;

/// Parses a Go `time.Duration` string into whole milliseconds.
///
/// Accepts a sequence of `<decimal><unit>` pairs with units `h`, `m`, `s`, `ms`,
/// `us`, `µs` (U+00B5), `μs` (U+03BC) and `ns`, e.g. `"6m0s"`, `"1h2m3.5s"`, `"12ms"`,
/// plus the bare `"0"`. Sub-millisecond remainders round up (`"20µs"` is 1 ms), so a
/// wait is never shortened. Huge values saturate and are clamped to
/// [`MAX_WAIT_MS`](super::MAX_WAIT_MS). Negative, empty, unit-less (other than `"0"`)
/// or otherwise malformed input gives `None`.
#[must_use]
pub fn parse_go_duration_ms(v: &str) -> Option<u64> {
    let s = v.trim_ascii();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s.as_bytes();
    let mut total_ns: u128 = 0;
    while !rest.is_empty() {
        let (whole, after_whole) = take_digits(rest);
        let (frac, after_frac) = match after_whole.split_first() {
            Some((b'.', tail)) => take_digits(tail),
            _ => (&[][..], after_whole),
        };
        if whole.is_empty() && frac.is_empty() {
            return None;
        }
        let (unit_ns, after_unit) = take_unit(after_frac)?;
        total_ns = total_ns.saturating_add(component_ns(whole, frac, unit_ns));
        rest = after_unit;
    }
    let ms = total_ns.div_ceil(NS_PER_MS);
    Some(clamp_wait(u64::try_from(ms).unwrap_or(u64::MAX)))
}

/// Parses an OpenAI/Azure `x-ratelimit-reset-*` value into a relative wait.
///
/// OpenAI sends Go durations (`"6m0s"`); Azure OpenAI sends plain seconds, integer or
/// decimal, without a unit (`"55"`, `"0.5"`), and `-1` when it does not track the axis.
pub(super) fn parse_reset_duration(v: &str) -> Parsed<u64> {
    let s = v.trim_ascii();
    if let Some(ms) = parse_seconds_ms(s) {
        return Parsed::Value(ms);
    }
    if s.starts_with('-') {
        // `-1` is Azure's "unknown"; other negative resets are nonsense.
        return match parse_count(s, Parsed::Malformed) {
            Parsed::Unknown => Parsed::Unknown,
            _ => Parsed::Malformed,
        };
    }
    match parse_go_duration_ms(s) {
        Some(ms) => Parsed::Value(ms),
        None => Parsed::Malformed,
    }
}

/// Splits the leading run of ASCII digits off `b`.
fn take_digits(b: &[u8]) -> (&[u8], &[u8]) {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    b.split_at_checked(n).unwrap_or((b, &[]))
}

/// Recognises a unit at the start of `b`: its length in nanoseconds and the rest.
fn take_unit(b: &[u8]) -> Option<(u128, &[u8])> {
    const UNITS: [(&[u8], u128); 8] = [
        (b"ns", 1),
        (b"us", 1_000),
        ("\u{b5}s".as_bytes(), 1_000),
        ("\u{3bc}s".as_bytes(), 1_000),
        (b"ms", 1_000_000),
        (b"s", 1_000_000_000),
        (b"m", 60_000_000_000),
        (b"h", 3_600_000_000_000),
    ];
    // Two-letter units come first so "ms" is not read as "m" followed by "s".
    UNITS
        .iter()
        .find_map(|&(name, ns)| b.strip_prefix(name).map(|rest| (ns, rest)))
}

/// `whole.frac` units of `unit_ns` nanoseconds, in nanoseconds, rounded up, saturating.
fn component_ns(whole: &[u8], frac: &[u8], unit_ns: u128) -> u128 {
    let mut w: u128 = 0;
    for &b in whole {
        let d = digit(b).map_or(0, u128::from);
        w = w.saturating_mul(10).saturating_add(d);
    }
    let mut f: u128 = 0;
    let mut scale: u128 = 1;
    let mut used: u32 = 0;
    let mut sticky = false;
    for &b in frac {
        let d = digit(b).map_or(0, u128::from);
        if used < MAX_FRAC_DIGITS {
            f = f.saturating_mul(10).saturating_add(d);
            scale = scale.saturating_mul(10);
            used = used.saturating_add(1);
        } else if d != 0 {
            sticky = true;
        }
    }
    let num = f.saturating_mul(unit_ns);
    let mut frac_ns = num.checked_div(scale).unwrap_or(0);
    if sticky || num.checked_rem(scale).unwrap_or(0) != 0 {
        frac_ns = frac_ns.saturating_add(1);
    }
    w.saturating_mul(unit_ns).saturating_add(frac_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::MAX_WAIT_MS;

    #[test]
    fn parses_openai_reset_durations() {
        assert_eq!(parse_go_duration_ms("6m0s"), Some(360_000));
        assert_eq!(parse_go_duration_ms("1s"), Some(1_000));
        assert_eq!(parse_go_duration_ms("1.5s"), Some(1_500));
        assert_eq!(parse_go_duration_ms("12ms"), Some(12));
        assert_eq!(parse_go_duration_ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(parse_go_duration_ms("0s"), Some(0));
        assert_eq!(parse_go_duration_ms("0"), Some(0));
        assert_eq!(parse_go_duration_ms(" 34s "), Some(34_000));
        assert_eq!(parse_go_duration_ms("59.999s"), Some(59_999));
        assert_eq!(parse_go_duration_ms("0.5m"), Some(30_000));
        assert_eq!(parse_go_duration_ms(".5s"), Some(500));
        assert_eq!(parse_go_duration_ms("1.s"), Some(1_000));
    }

    #[test]
    fn rounds_sub_millisecond_durations_up() {
        assert_eq!(parse_go_duration_ms("20µs"), Some(1));
        assert_eq!(parse_go_duration_ms("20\u{3bc}s"), Some(1));
        assert_eq!(parse_go_duration_ms("20us"), Some(1));
        assert_eq!(parse_go_duration_ms("1ns"), Some(1));
        assert_eq!(parse_go_duration_ms("1000000ns"), Some(1));
        assert_eq!(parse_go_duration_ms("1000001ns"), Some(2));
        assert_eq!(parse_go_duration_ms("1.0001ms"), Some(2));
        assert_eq!(parse_go_duration_ms("0.0000000000000000000001s"), Some(1));
        assert_eq!(parse_go_duration_ms("0.0000000000000000000000s"), Some(0));
    }

    #[test]
    fn clamps_huge_durations_to_one_day() {
        assert_eq!(parse_go_duration_ms("25h"), Some(MAX_WAIT_MS));
        assert_eq!(
            parse_go_duration_ms("18446744073709551615h"),
            Some(MAX_WAIT_MS)
        );
        assert_eq!(
            parse_go_duration_ms("99999999999999999999999999999999999999999999h99999m"),
            Some(MAX_WAIT_MS)
        );
        assert_eq!(
            parse_go_duration_ms("9007199254740992ms"),
            Some(MAX_WAIT_MS)
        );
    }

    #[test]
    fn rejects_malformed_durations() {
        for bad in [
            "", " ", "-1s", "5", "1.5", "s", "1x", "1sm", "1 s", "1S", "1hh", ".s", "1..5s", "—1s",
            "1µ", "\u{b5}s", "1s-", "NaN", "inf",
        ] {
            assert_eq!(parse_go_duration_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reset_values_accept_azure_plain_seconds_and_sentinel() {
        assert_eq!(parse_reset_duration("55"), Parsed::Value(55_000));
        assert_eq!(parse_reset_duration("0.5"), Parsed::Value(500));
        assert_eq!(parse_reset_duration("0"), Parsed::Value(0));
        assert_eq!(parse_reset_duration("6m0s"), Parsed::Value(360_000));
        assert_eq!(parse_reset_duration("-1"), Parsed::Unknown);
        assert_eq!(parse_reset_duration("-2"), Parsed::Malformed);
        assert_eq!(parse_reset_duration("-1s"), Parsed::Malformed);
        assert_eq!(parse_reset_duration("soon"), Parsed::Malformed);
    }
}
