//! Integer and fixed-point number parsing for header values.
//!
//! Everything here works on ASCII bytes, never allocates, never uses floats and
//! saturates instead of overflowing: a hostile value can only ever produce
//! `u64::MAX`, never a panic or a wrapped number.

use super::MAX_WAIT_MS;

/// Outcome of parsing one header value that carries a single number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parsed<T> {
    /// A usable value.
    Value(T),
    /// A well-formed value that carries no information (a `-1` sentinel, or an
    /// absolute time with no clock to compare it to). Neither used nor malformed.
    Unknown,
    /// The value could not be parsed.
    Malformed,
}

/// The decimal value of an ASCII digit.
pub(super) const fn digit(b: u8) -> Option<u8> {
    if b.is_ascii_digit() {
        Some(b.wrapping_sub(b'0'))
    } else {
        None
    }
}

/// `10^exp`, saturating.
pub(super) const fn pow10(exp: u32) -> u64 {
    10u64.saturating_pow(exp)
}

/// Parses one or more ASCII digits (nothing else) into a `u64`, saturating at `u64::MAX`.
pub(super) fn parse_digits(s: &str) -> Option<u64> {
    parse_digit_bytes(s.as_bytes())
}

/// [`parse_digits`] on bytes.
pub(super) fn parse_digit_bytes(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut acc: u64 = 0;
    for &b in s {
        let d = digit(b)?;
        acc = acc.saturating_mul(10).saturating_add(u64::from(d));
    }
    Some(acc)
}

/// Splits an optional leading `-` off a value: `(negative, rest)`.
pub(super) fn split_sign(s: &str) -> (bool, &str) {
    match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    }
}

/// Parses a limit or remaining count.
///
/// `-1` is the "not tracked" sentinel (Azure OpenAI sends it) and gives
/// [`Parsed::Unknown`]. Any other negative number gives `negative` (the caller
/// decides: a remaining count clamps to 0, a limit is malformed).
pub(super) fn parse_count(v: &str, negative: Parsed<u64>) -> Parsed<u64> {
    let (neg, digits) = split_sign(v.trim_ascii());
    match parse_digits(digits) {
        None => Parsed::Malformed,
        Some(0) => Parsed::Value(0),
        Some(1) if neg => Parsed::Unknown,
        Some(_) if neg => negative,
        Some(n) => Parsed::Value(n),
    }
}

/// Parses an unsigned decimal `int[.frac]` into units of `10^-scale`, rounding any
/// remainder up. Requires at least one integer digit and, when a `.` is present, at
/// least one fraction digit. Saturates at `u64::MAX`.
///
/// `parse_decimal_scaled("1.5", 3) == Some(1500)`, `parse_decimal_scaled("0.0001", 3) == Some(1)`.
pub(super) fn parse_decimal_scaled(s: &str, scale: u32) -> Option<u64> {
    let bytes = s.as_bytes();
    let (int_part, frac_part) = match bytes.iter().position(|&b| b == b'.') {
        Some(dot) => {
            let int_part = bytes.get(..dot)?;
            let frac_part = bytes.get(dot.saturating_add(1)..)?;
            if frac_part.is_empty() {
                return None;
            }
            (int_part, frac_part)
        }
        None => (bytes, &[][..]),
    };
    let whole = parse_digit_bytes(int_part)?;
    let mut frac: u64 = 0;
    let mut used: u32 = 0;
    let mut round_up = false;
    for &b in frac_part {
        let d = digit(b)?;
        if used < scale {
            frac = frac.saturating_mul(10).saturating_add(u64::from(d));
            used = used.saturating_add(1);
        } else if d != 0 {
            round_up = true;
        }
    }
    let frac = frac.saturating_mul(pow10(scale.saturating_sub(used)));
    Some(
        whole
            .saturating_mul(pow10(scale))
            .saturating_add(frac)
            .saturating_add(u64::from(round_up)),
    )
}

/// Parses non-negative decimal seconds (`"30"`, `"1.5"`) into milliseconds, rounding
/// sub-millisecond remainders up and clamping to [`MAX_WAIT_MS`]. Negative, empty or
/// non-numeric values give `None`.
pub(super) fn parse_seconds_ms(v: &str) -> Option<u64> {
    parse_decimal_scaled(v.trim_ascii(), 3).map(clamp_wait)
}

/// Clamps a wait to [`MAX_WAIT_MS`].
pub(super) const fn clamp_wait(ms: u64) -> u64 {
    if ms > MAX_WAIT_MS { MAX_WAIT_MS } else { ms }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_digits_and_saturates_on_overflow() {
        assert_eq!(parse_digits("0"), Some(0));
        assert_eq!(parse_digits("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_digits("18446744073709551616"), Some(u64::MAX));
        assert_eq!(
            parse_digits("99999999999999999999999999999999"),
            Some(u64::MAX)
        );
        assert_eq!(parse_digits(""), None);
        assert_eq!(parse_digits("+1"), None);
        assert_eq!(parse_digits("1 2"), None);
        assert_eq!(parse_digits("١٢"), None); // Arabic-Indic digits are not ASCII digits
    }

    #[test]
    fn counts_treat_minus_one_as_unknown_and_other_negatives_per_caller() {
        assert_eq!(parse_count(" 42 ", Parsed::Malformed), Parsed::Value(42));
        assert_eq!(parse_count("-1", Parsed::Malformed), Parsed::Unknown);
        assert_eq!(parse_count("-7", Parsed::Value(0)), Parsed::Value(0));
        assert_eq!(parse_count("-7", Parsed::Malformed), Parsed::Malformed);
        assert_eq!(parse_count("-0", Parsed::Malformed), Parsed::Value(0));
        assert_eq!(parse_count("-", Parsed::Malformed), Parsed::Malformed);
        assert_eq!(parse_count("1.5", Parsed::Malformed), Parsed::Malformed);
    }

    #[test]
    fn decimal_fractions_round_up_past_the_scale() {
        assert_eq!(parse_decimal_scaled("1.5", 3), Some(1500));
        assert_eq!(parse_decimal_scaled("1.25", 3), Some(1250));
        assert_eq!(parse_decimal_scaled("0.0001", 3), Some(1));
        assert_eq!(parse_decimal_scaled("0.0000", 3), Some(0));
        assert_eq!(parse_decimal_scaled("2", 3), Some(2000));
        assert_eq!(parse_decimal_scaled("1.", 3), None);
        assert_eq!(parse_decimal_scaled(".5", 3), None);
        assert_eq!(parse_decimal_scaled("1.2.3", 3), None);
        assert_eq!(parse_decimal_scaled("-1", 3), None);
        assert_eq!(
            parse_decimal_scaled("18446744073709551615.9", 3),
            Some(u64::MAX)
        );
    }

    #[test]
    fn seconds_clamp_to_one_day() {
        assert_eq!(parse_seconds_ms("60"), Some(60_000));
        assert_eq!(parse_seconds_ms("9007199254740992"), Some(MAX_WAIT_MS));
        assert_eq!(parse_seconds_ms("86400.001"), Some(MAX_WAIT_MS));
        assert_eq!(parse_seconds_ms("-3"), None);
    }
}
