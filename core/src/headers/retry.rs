//! `Retry-After`, `retry-after-ms`, `x-should-retry`, and the gateway's
//! `rate_limit_type` / `reset_at` pair.

use super::date::{parse_http_date_ms, parse_rfc3339_ms};
use super::num::{Parsed, clamp_wait, parse_decimal_scaled, parse_seconds_ms};
use super::{RateAxis, When, eq_norm, strip_suffix_norm};

/// Parses a `Retry-After` value into a relative wait in milliseconds.
///
/// The value is either delta-seconds (`"120"`; a decimal fraction such as `"1.5"` is
/// accepted and rounded up to whole milliseconds) or an HTTP-date, which is turned
/// into a wait against `unix_now_ms` (a date in the past gives 0; without a clock an
/// HTTP-date gives `None`). Negative, empty and unparseable values give `None`;
/// huge values are clamped to [`MAX_WAIT_MS`](super::MAX_WAIT_MS).
#[must_use]
pub fn parse_retry_after_ms(v: &str, unix_now_ms: Option<u64>) -> Option<u64> {
    match retry_after(v) {
        Parsed::Value(when) => when.resolve(unix_now_ms),
        Parsed::Unknown | Parsed::Malformed => None,
    }
}

/// `Retry-After` as a wait or an absolute time.
pub(super) fn retry_after(v: &str) -> Parsed<When> {
    let s = v.trim_ascii();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        return match parse_seconds_ms(s) {
            Some(ms) => Parsed::Value(When::After(ms)),
            None => Parsed::Malformed,
        };
    }
    match parse_http_date_ms(s) {
        Some(at) => Parsed::Value(When::At(at)),
        None => Parsed::Malformed,
    }
}

/// `retry-after-ms`: non-negative milliseconds, a decimal fraction rounds up.
pub(super) fn retry_after_ms(v: &str) -> Parsed<u64> {
    match parse_decimal_scaled(v.trim_ascii(), 0) {
        Some(ms) => Parsed::Value(clamp_wait(ms)),
        None => Parsed::Malformed,
    }
}

/// `x-should-retry`: `true` or `false`, any case.
pub(super) fn should_retry(v: &str) -> Parsed<bool> {
    let s = v.trim_ascii();
    if s.eq_ignore_ascii_case("true") {
        Parsed::Value(true)
    } else if s.eq_ignore_ascii_case("false") {
        Parsed::Value(false)
    } else {
        Parsed::Malformed
    }
}

/// The gateway's `rate_limit_type`: which limit a 429 was about.
///
/// Matching ignores case and treats `_`, `-` and space alike, and a trailing
/// `_per_second` / `_per_minute` / `_per_hour` / `_per_day` is ignored, so
/// `requests_per_minute`, `Requests-Per-Minute` and `requests` all name
/// [`RateAxis::Requests`]. Abbreviations such as `rpm`, `tpm`, `itpm` and `otpm` are
/// understood too.
pub(super) fn rate_limit_type(v: &str) -> Parsed<RateAxis> {
    const PER: [&str; 8] = [
        "-per-second",
        "-per-sec",
        "-per-minute",
        "-per-min",
        "-per-hour",
        "-per-day",
        "-per-month",
        "",
    ];
    const NAMES: [(&str, RateAxis); 43] = [
        ("requests", RateAxis::Requests),
        ("request", RateAxis::Requests),
        ("reqs", RateAxis::Requests),
        ("rps", RateAxis::Requests),
        ("rpm", RateAxis::Requests),
        ("rph", RateAxis::Requests),
        ("rpd", RateAxis::Requests),
        ("tokens", RateAxis::Tokens),
        ("token", RateAxis::Tokens),
        ("total-tokens", RateAxis::Tokens),
        ("tps", RateAxis::Tokens),
        ("tpm", RateAxis::Tokens),
        ("tph", RateAxis::Tokens),
        ("tpd", RateAxis::Tokens),
        ("input-tokens", RateAxis::InputTokens),
        ("input-token", RateAxis::InputTokens),
        ("input", RateAxis::InputTokens),
        ("prompt-tokens", RateAxis::InputTokens),
        ("itpm", RateAxis::InputTokens),
        ("itph", RateAxis::InputTokens),
        ("itpd", RateAxis::InputTokens),
        ("output-tokens", RateAxis::OutputTokens),
        ("output-token", RateAxis::OutputTokens),
        ("output", RateAxis::OutputTokens),
        ("completion-tokens", RateAxis::OutputTokens),
        ("otpm", RateAxis::OutputTokens),
        ("otph", RateAxis::OutputTokens),
        ("otpd", RateAxis::OutputTokens),
        ("parallel-requests", RateAxis::Concurrent),
        ("parallel-request", RateAxis::Concurrent),
        ("max-parallel-requests", RateAxis::Concurrent),
        ("parallel", RateAxis::Concurrent),
        ("concurrent", RateAxis::Concurrent),
        ("concurrent-requests", RateAxis::Concurrent),
        ("concurrent-request", RateAxis::Concurrent),
        ("max-concurrent-requests", RateAxis::Concurrent),
        ("concurrency", RateAxis::Concurrent),
        ("in-flight", RateAxis::Concurrent),
        ("inflight", RateAxis::Concurrent),
        ("in-flight-requests", RateAxis::Concurrent),
        ("simultaneous-requests", RateAxis::Concurrent),
        ("connections", RateAxis::Concurrent),
        ("concurrent-connections", RateAxis::Concurrent),
    ];
    let s = v.trim_ascii();
    for suffix in PER {
        let Some(base) = strip_suffix_norm(s, suffix) else {
            continue;
        };
        if let Some(&(_, axis)) = NAMES.iter().find(|(name, _)| eq_norm(base, name)) {
            return Parsed::Value(axis);
        }
    }
    Parsed::Malformed
}

/// Above this a numeric `reset_at` is read as Unix milliseconds rather than seconds
/// (10^11 seconds is the year 5138; 10^11 milliseconds is 1973).
const RESET_AT_MS_THRESHOLD: u64 = 100_000_000_000;

/// The gateway's `reset_at`: Unix seconds, Unix milliseconds, RFC 3339 (or an
/// HTTP-date), always absolute.
pub(super) fn reset_at(v: &str) -> Parsed<When> {
    let s = v.trim_ascii();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        let whole = s.split('.').next().and_then(super::num::parse_digits);
        let at = match whole {
            Some(w) if w > RESET_AT_MS_THRESHOLD => parse_decimal_scaled(s, 0),
            Some(_) => parse_decimal_scaled(s, 3),
            None => None,
        };
        if let Some(at) = at {
            return Parsed::Value(When::At(at));
        }
    }
    match parse_rfc3339_ms(s).or_else(|| parse_http_date_ms(s)) {
        Some(at) => Parsed::Value(When::At(at)),
        None => Parsed::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::MAX_WAIT_MS;

    const NOW: u64 = 1_795_946_400_000; // Sat, 29 Nov 2026 10:00:00 GMT

    #[test]
    fn retry_after_reads_delta_seconds() {
        assert_eq!(parse_retry_after_ms("60", None), Some(60_000));
        assert_eq!(parse_retry_after_ms(" 0 ", None), Some(0));
        assert_eq!(parse_retry_after_ms("1.5", None), Some(1_500));
        assert_eq!(parse_retry_after_ms("0.0001", None), Some(1));
    }

    #[test]
    fn clamps_huge_retry_after_to_one_day() {
        assert_eq!(parse_retry_after_ms("86401", None), Some(MAX_WAIT_MS));
        assert_eq!(
            parse_retry_after_ms("18446744073709551615", None),
            Some(MAX_WAIT_MS)
        );
        assert_eq!(
            parse_retry_after_ms("9007199254740993", None),
            Some(MAX_WAIT_MS)
        );
        assert_eq!(
            parse_retry_after_ms("1".repeat(400).as_str(), None),
            Some(MAX_WAIT_MS)
        );
    }

    #[test]
    fn rejects_negative_and_garbage_retry_after() {
        for bad in [
            "-1", "-0.5", "", "soon", "1s", "1e3", "NaN", "∞", "12 34", "0x10",
        ] {
            assert_eq!(parse_retry_after_ms(bad, Some(NOW)), None, "{bad:?}");
            assert_eq!(retry_after(bad), Parsed::Malformed, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_http_date_needs_a_clock() {
        let v = "Sat, 29 Nov 2026 10:00:30 GMT";
        assert_eq!(parse_retry_after_ms(v, Some(NOW)), Some(30_000));
        assert_eq!(parse_retry_after_ms(v, None), None);
        assert_eq!(retry_after(v), Parsed::Value(When::At(NOW + 30_000)));
    }

    #[test]
    fn retry_after_http_date_in_the_past_gives_zero() {
        assert_eq!(
            parse_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", Some(NOW)),
            Some(0)
        );
    }

    #[test]
    fn retry_after_http_date_far_ahead_is_clamped() {
        assert_eq!(
            parse_retry_after_ms("Fri, 31 Dec 9999 23:59:59 GMT", Some(NOW)),
            Some(MAX_WAIT_MS)
        );
    }

    #[test]
    fn retry_after_ms_accepts_fractions_and_clamps() {
        assert_eq!(retry_after_ms("1500"), Parsed::Value(1_500));
        assert_eq!(retry_after_ms("1500.2"), Parsed::Value(1_501));
        assert_eq!(
            retry_after_ms("18446744073709551616"),
            Parsed::Value(MAX_WAIT_MS)
        );
        assert_eq!(retry_after_ms("-5"), Parsed::Malformed);
        assert_eq!(retry_after_ms(""), Parsed::Malformed);
    }

    #[test]
    fn should_retry_is_a_boolean() {
        assert_eq!(should_retry("true"), Parsed::Value(true));
        assert_eq!(should_retry(" FALSE "), Parsed::Value(false));
        assert_eq!(should_retry("yes"), Parsed::Malformed);
        assert_eq!(should_retry(""), Parsed::Malformed);
    }

    #[test]
    fn maps_gateway_limit_types_to_axes() {
        for (v, axis) in [
            ("requests_per_minute", RateAxis::Requests),
            ("Requests-Per-Minute", RateAxis::Requests),
            ("rpm", RateAxis::Requests),
            ("RPD", RateAxis::Requests),
            ("requests", RateAxis::Requests),
            ("parallel_requests", RateAxis::Concurrent),
            ("concurrent", RateAxis::Concurrent),
            ("max_parallel_requests", RateAxis::Concurrent),
            ("tokens", RateAxis::Tokens),
            ("tokens_per_minute", RateAxis::Tokens),
            ("tpm", RateAxis::Tokens),
            ("input_tokens", RateAxis::InputTokens),
            ("input_tokens_per_minute", RateAxis::InputTokens),
            ("output_tokens", RateAxis::OutputTokens),
            ("OTPM", RateAxis::OutputTokens),
            (" requests per day ", RateAxis::Requests),
        ] {
            assert_eq!(rate_limit_type(v), Parsed::Value(axis), "{v:?}");
        }
        for bad in [
            "",
            "bananas",
            "per_minute",
            "requests_per_fortnight",
            "requests__",
            "rpmx",
            "ｒｐｍ",
        ] {
            assert_eq!(rate_limit_type(bad), Parsed::Malformed, "{bad:?}");
        }
    }

    #[test]
    fn reset_at_accepts_seconds_milliseconds_and_rfc3339() {
        assert_eq!(reset_at("1795946400"), Parsed::Value(When::At(NOW)));
        assert_eq!(reset_at("1795946400000"), Parsed::Value(When::At(NOW)));
        assert_eq!(
            reset_at("1795946400.25"),
            Parsed::Value(When::At(NOW + 250))
        );
        assert_eq!(
            reset_at("2026-11-29T10:00:00Z"),
            Parsed::Value(When::At(NOW))
        );
        assert_eq!(
            reset_at("Sat, 29 Nov 2026 10:00:00 GMT"),
            Parsed::Value(When::At(NOW))
        );
        assert_eq!(
            reset_at("18446744073709551615"),
            Parsed::Value(When::At(u64::MAX))
        );
        assert_eq!(reset_at("-1795946400"), Parsed::Malformed);
        assert_eq!(reset_at("tomorrow"), Parsed::Malformed);
        assert_eq!(reset_at(""), Parsed::Malformed);
    }
}
