//! Whole-response tests of [`parse_headers`](super::parse_headers).

use super::*;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// Sat, 29 Nov 2026 10:00:00 GMT.
const NOW: u64 = 1_795_946_400_000;

fn parse(headers: &[(&str, &str)], now: Option<u64>) -> HeaderReport {
    parse_headers(headers.iter().copied(), now)
}

fn axis(
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<u64>,
    granularity: u64,
) -> AxisReport {
    AxisReport {
        limit,
        remaining,
        reset_after_ms: reset,
        granularity,
    }
}

#[test]
fn empty_headers_give_an_empty_report() {
    let r = parse(&[], Some(NOW));
    assert_eq!(r, HeaderReport::default());
    assert_eq!(r.requests.granularity, 1);
    assert!(!r.requests.is_reported());
}

#[test]
fn an_anthropic_token_figure_off_the_thousands_was_not_rounded() {
    // Anthropic rounds remaining tokens to thousands; a figure between them comes from
    // something that counts exactly (a gateway, a test server) and is taken as exact.
    let rounded = parse(
        &[("anthropic-ratelimit-input-tokens-remaining", "5000")],
        None,
    );
    assert_eq!(rounded.input_tokens, axis(None, Some(5_000), None, 1000));
    let exact = parse(
        &[("anthropic-ratelimit-input-tokens-remaining", "4818")],
        None,
    );
    assert_eq!(exact.input_tokens, axis(None, Some(4_818), None, 1));
    // Requests are always exact; a limit alone keeps the quantum.
    let limit = parse(&[("anthropic-ratelimit-output-tokens-limit", "8000")], None);
    assert_eq!(limit.output_tokens, axis(Some(8_000), None, None, 1000));
}

#[test]
fn ignores_unrelated_headers() {
    let r = parse(
        &[
            ("content-type", "application/json"),
            ("x-request-id", "abc"),
            ("server", "cloudflare"),
        ],
        Some(NOW),
    );
    assert_eq!(r, HeaderReport::default());
}

#[test]
fn reads_a_realistic_anthropic_response() {
    let r = parse(
        &[
            ("date", "Sat, 29 Nov 2026 10:00:00 GMT"),
            ("anthropic-ratelimit-requests-limit", "4000"),
            ("anthropic-ratelimit-requests-remaining", "3999"),
            ("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:01Z"),
            ("anthropic-ratelimit-tokens-limit", "480000"),
            ("anthropic-ratelimit-tokens-remaining", "476000"),
            ("anthropic-ratelimit-tokens-reset", "2026-11-29T10:00:00.5Z"),
            ("anthropic-ratelimit-input-tokens-limit", "400000"),
            ("anthropic-ratelimit-input-tokens-remaining", "397000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-11-29T10:00:00.5Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "80000"),
            ("anthropic-ratelimit-output-tokens-remaining", "79000"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-11-29T10:00:03Z",
            ),
            ("request-id", "req_011"),
        ],
        None,
    );
    assert_eq!(r.requests, axis(Some(4000), Some(3999), Some(1_000), 1));
    assert_eq!(
        r.tokens,
        axis(Some(480_000), Some(476_000), Some(500), 1000)
    );
    assert_eq!(
        r.input_tokens,
        axis(Some(400_000), Some(397_000), Some(500), 1000)
    );
    assert_eq!(
        r.output_tokens,
        axis(Some(80_000), Some(79_000), Some(3_000), 1000)
    );
    assert_eq!(r.recognised, 12);
    assert_eq!(r.malformed, 0);
}

#[test]
fn reads_an_anthropic_429() {
    let r = parse(
        &[
            ("Retry-After", "17"),
            ("x-should-retry", "true"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-11-29T10:00:17Z",
            ),
        ],
        Some(NOW),
    );
    assert_eq!(r.retry_after_ms, Some(17_000));
    assert_eq!(r.should_retry, Some(true));
    assert_eq!(r.output_tokens, axis(None, Some(0), Some(17_000), 1000));
}

#[test]
fn reads_a_realistic_openai_response() {
    let r = parse(
        &[
            ("x-ratelimit-limit-requests", "10000"),
            ("x-ratelimit-limit-tokens", "30000000"),
            ("x-ratelimit-remaining-requests", "9999"),
            ("x-ratelimit-remaining-tokens", "29999445"),
            ("x-ratelimit-reset-requests", "6ms"),
            ("x-ratelimit-reset-tokens", "1ms"),
            ("openai-processing-ms", "312"),
        ],
        None,
    );
    assert_eq!(r.requests, axis(Some(10_000), Some(9_999), Some(6), 1));
    assert_eq!(
        r.tokens,
        axis(Some(30_000_000), Some(29_999_445), Some(1), 1)
    );
    assert_eq!((r.recognised, r.malformed), (6, 0));
}

#[test]
fn reads_an_openai_429_with_retry_after_ms() {
    let r = parse(
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-reset-tokens", "1h2m3.5s"),
            ("retry-after", "20"),
            ("retry-after-ms", "19876"),
            ("x-should-retry", "false"),
        ],
        None,
    );
    assert_eq!(r.requests.reset_after_ms, Some(360_000));
    assert_eq!(r.tokens.reset_after_ms, Some(3_723_500));
    assert_eq!(r.retry_after_ms, Some(19_876));
    assert_eq!(r.should_retry, Some(false));
}

#[test]
fn prefers_retry_after_ms_regardless_of_order() {
    let r = parse(&[("retry-after-ms", "250"), ("retry-after", "3")], None);
    assert_eq!(r.retry_after_ms, Some(250));
    let r = parse(&[("retry-after-ms", "oops"), ("retry-after", "3")], None);
    assert_eq!(r.retry_after_ms, Some(3_000));
    assert_eq!(r.malformed, 1);
}

#[test]
fn reads_azure_plain_second_resets() {
    let r = parse(
        &[
            ("x-ratelimit-remaining-requests", "79"),
            ("x-ratelimit-remaining-tokens", "61353"),
            ("x-ratelimit-reset-requests", "1"),
            ("x-rate-limit-reset-tokens", "55"),
            ("retry-after-ms", "54321"),
            ("date", "Sat, 02 Mar 2024 21:35:09 GMT"),
        ],
        Some(NOW),
    );
    assert_eq!(r.requests, axis(None, Some(79), Some(1_000), 1));
    assert_eq!(r.tokens, axis(None, Some(61_353), Some(55_000), 1));
    assert_eq!(r.retry_after_ms, Some(54_321));
    assert_eq!((r.recognised, r.malformed), (5, 0));
}

#[test]
fn treats_azure_minus_one_as_unknown_not_malformed() {
    let r = parse(
        &[
            ("x-ratelimit-limit-tokens", "-1"),
            ("x-ratelimit-remaining-tokens", "-1"),
            ("x-ratelimit-reset-tokens", "0"),
            ("x-ratelimit-limit-requests", "-1"),
            ("x-ratelimit-remaining-requests", "-1"),
            ("x-ratelimit-reset-requests", "-1"),
        ],
        Some(NOW),
    );
    assert_eq!(r.tokens, AxisReport::default());
    assert_eq!(r.requests, AxisReport::default());
    assert_eq!((r.recognised, r.malformed), (6, 0));
}

#[test]
fn zero_reset_without_sentinel_means_now() {
    let r = parse(
        &[
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "0"),
        ],
        None,
    );
    assert_eq!(r.tokens, axis(None, Some(0), Some(0), 1));
    let r = parse(&[("x-ratelimit-reset-requests", "0s")], None);
    assert_eq!(r.requests.reset_after_ms, Some(0));
}

#[test]
fn clamps_negative_remaining_to_zero() {
    let r = parse(
        &[
            ("x-ratelimit-remaining-tokens", "-4500"),
            ("anthropic-ratelimit-requests-remaining", "-3"),
        ],
        None,
    );
    assert_eq!(r.tokens.remaining, Some(0));
    assert_eq!(r.requests.remaining, Some(0));
    assert_eq!(r.malformed, 0);
}

#[test]
fn counts_negative_limits_as_malformed() {
    let r = parse(&[("x-ratelimit-limit-requests", "-20")], None);
    assert_eq!(r.requests.limit, None);
    assert_eq!((r.recognised, r.malformed), (1, 1));
}

#[test]
fn matches_names_case_insensitively_and_with_underscores() {
    let r = parse(
        &[
            ("X-RateLimit-Remaining-Requests", "5"),
            ("ANTHROPIC-RATELIMIT-TOKENS-REMAINING", "7000"),
            ("Retry_After", "2"),
            ("RATE_LIMIT_TYPE", "RPM"),
        ],
        None,
    );
    assert_eq!(r.requests.remaining, Some(5));
    assert_eq!(r.tokens.remaining, Some(7_000));
    assert_eq!(r.retry_after_ms, Some(2_000));
    assert_eq!(r.exceeded, Some(RateAxis::Requests));
    assert_eq!(r.recognised, 4);
}

#[test]
fn last_valid_duplicate_wins() {
    let r = parse(
        &[
            ("x-ratelimit-remaining-requests", "10"),
            ("x-ratelimit-remaining-requests", "9"),
            ("x-ratelimit-remaining-requests", "garbage"),
            ("retry-after", "5"),
            ("retry-after", "7"),
            ("retry-after", "-1"),
        ],
        None,
    );
    assert_eq!(r.requests.remaining, Some(9));
    assert_eq!(r.retry_after_ms, Some(7_000));
    assert_eq!((r.recognised, r.malformed), (6, 2));
}

#[test]
fn clamps_huge_retry_after_to_one_day() {
    let huge = [
        "18446744073709551615",
        "9007199254740992",
        "340282366920938463463374607431768211456",
    ];
    for v in huge.iter().chain(&["86401"]) {
        let r = parse(&[("retry-after", v)], None);
        assert_eq!(r.retry_after_ms, Some(MAX_WAIT_MS), "{v}");
    }
    for v in huge.iter().chain(&["86400001"]) {
        let r = parse(&[("retry-after-ms", v)], None);
        assert_eq!(r.retry_after_ms, Some(MAX_WAIT_MS), "{v}");
    }
}

#[test]
fn huge_counts_saturate_instead_of_overflowing() {
    let r = parse(
        &[
            ("x-ratelimit-limit-tokens", "18446744073709551615"),
            ("x-ratelimit-remaining-tokens", "18446744073709551616"),
            ("anthropic-ratelimit-requests-limit", "9007199254740993"),
            ("x-ratelimit-reset-tokens", "18446744073709551615h"),
        ],
        None,
    );
    assert_eq!(
        r.tokens,
        axis(Some(u64::MAX), Some(u64::MAX), Some(MAX_WAIT_MS), 1)
    );
    assert_eq!(r.requests.limit, Some(9_007_199_254_740_993));
}

#[test]
fn counts_malformed_values_and_ignores_them() {
    let r = parse(
        &[
            ("x-ratelimit-limit-requests", ""),
            ("x-ratelimit-remaining-requests", "1.5"),
            ("x-ratelimit-reset-requests", "soon"),
            ("anthropic-ratelimit-tokens-reset", "in a minute"),
            ("retry-after", "Ñ"),
            ("retry-after-ms", "١٢"),
            ("x-should-retry", "maybe"),
            ("rate_limit_type", "bananas"),
            ("reset_at", "\u{0}"),
            ("RateLimit", "\"unterminated"),
            ("RateLimit-Policy", ",,"),
            ("RateLimit-Remaining", "many"),
        ],
        Some(NOW),
    );
    assert_eq!((r.recognised, r.malformed), (12, 12));
    let empty = HeaderReport {
        recognised: 12,
        malformed: 12,
        tokens: AxisReport {
            granularity: 1000,
            ..AxisReport::default()
        },
        ..HeaderReport::default()
    };
    assert_eq!(r, empty);
}

#[test]
fn resolves_absolute_times_against_the_date_header() {
    // The host clock is an hour fast; the provider's Date header keeps the wait right.
    let skewed_now = NOW + 3_600_000;
    let r = parse(
        &[
            ("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:30Z"),
            ("date", "Sat, 29 Nov 2026 10:00:00 GMT"),
        ],
        Some(skewed_now),
    );
    assert_eq!(r.requests.reset_after_ms, Some(30_000));
    // Without a Date header the host clock is all there is.
    let r = parse(
        &[("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:30Z")],
        Some(NOW - 5_000),
    );
    assert_eq!(r.requests.reset_after_ms, Some(35_000));
}

#[test]
fn malformed_date_header_falls_back_to_the_host_clock() {
    let r = parse(
        &[
            ("date", "yesterday"),
            ("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:30Z"),
        ],
        Some(NOW),
    );
    assert_eq!(r.requests.reset_after_ms, Some(30_000));
    // Date is a reference, not a rate-limit header: not counted either way.
    assert_eq!((r.recognised, r.malformed), (1, 0));
}

#[test]
fn absolute_times_without_any_clock_are_ignored_not_malformed() {
    let r = parse(
        &[
            ("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:30Z"),
            ("retry-after", "Sat, 29 Nov 2026 10:00:30 GMT"),
            ("reset_at", "1795946460"),
        ],
        None,
    );
    assert_eq!(r.requests.reset_after_ms, None);
    assert_eq!(r.retry_after_ms, None);
    assert_eq!(r.reset_at_ms, None);
    assert_eq!((r.recognised, r.malformed), (3, 0));
}

#[test]
fn http_date_in_the_past_gives_zero_wait() {
    let r = parse(
        &[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")],
        Some(NOW),
    );
    assert_eq!(r.retry_after_ms, Some(0));
    let r = parse(
        &[("anthropic-ratelimit-tokens-reset", "2000-01-01T00:00:00Z")],
        Some(NOW),
    );
    assert_eq!(r.tokens.reset_after_ms, Some(0));
}

#[test]
fn retry_after_date_uses_the_date_header() {
    let r = parse(
        &[
            ("Date", "Sat, 29 Nov 2026 10:00:00 GMT"),
            ("Retry-After", "Sat, 29 Nov 2026 10:01:00 GMT"),
        ],
        Some(0),
    );
    assert_eq!(r.retry_after_ms, Some(60_000));
}

#[test]
fn reads_the_gateway_429() {
    let r = parse(
        &[
            ("retry-after", "60"),
            ("rate_limit_type", "parallel_requests"),
            ("reset_at", "1795946412"),
        ],
        Some(NOW),
    );
    assert_eq!(r.retry_after_ms, Some(60_000));
    assert_eq!(r.exceeded, Some(RateAxis::Concurrent));
    assert_eq!(r.reset_at_ms, Some(12_000));
    assert_eq!((r.recognised, r.malformed), (3, 0));
}

#[test]
fn gateway_headers_accept_hyphens_and_x_prefix() {
    for (ty, at) in [
        ("rate-limit-type", "reset-at"),
        ("x-rate-limit-type", "x-reset-at"),
        ("x-rate_limit_type", "x-reset_at"),
        ("Rate-Limit-Type", "Reset-At"),
    ] {
        let r = parse(
            &[(ty, "requests_per_minute"), (at, "2026-11-29T10:00:45Z")],
            Some(NOW),
        );
        assert_eq!(r.exceeded, Some(RateAxis::Requests), "{ty}");
        assert_eq!(r.reset_at_ms, Some(45_000), "{at}");
    }
}

#[test]
fn gateway_reset_at_accepts_milliseconds() {
    let r = parse(&[("reset_at", "1795946400250")], Some(NOW));
    assert_eq!(r.reset_at_ms, Some(250));
    let r = parse(&[("reset_at", "1795946400000000")], Some(NOW));
    assert_eq!(r.reset_at_ms, Some(MAX_WAIT_MS));
    let r = parse(&[("reset_at", "0")], Some(NOW));
    assert_eq!(r.reset_at_ms, Some(0));
}

#[test]
fn unknown_limit_type_is_malformed() {
    let r = parse(&[("rate_limit_type", "vibes")], None);
    assert_eq!(r.exceeded, None);
    assert_eq!((r.recognised, r.malformed), (1, 1));
}

#[test]
fn reads_current_ietf_structured_fields() {
    let r = parse(
        &[
            (
                "RateLimit-Policy",
                "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400",
            ),
            ("RateLimit", "\"burst\";r=50;t=30, \"daily\";r=900;t=3600"),
        ],
        None,
    );
    assert_eq!(r.requests, axis(Some(100), Some(50), Some(30_000), 1));
    assert_eq!((r.recognised, r.malformed), (2, 0));
}

#[test]
fn ietf_fields_may_arrive_in_any_order_and_split() {
    let r = parse(
        &[
            ("RateLimit", "\"daily\";r=3;t=7200"),
            ("RateLimit-Policy", "\"burst\";q=100;w=60"),
            ("RateLimit", "\"burst\";r=50;t=30"),
            ("RateLimit-Policy", "\"daily\";q=1000;w=86400"),
        ],
        None,
    );
    assert_eq!(r.requests, axis(Some(1000), Some(3), Some(7_200_000), 1));
}

#[test]
fn ietf_token_unit_maps_to_tokens() {
    let r = parse(
        &[
            (
                "RateLimit-Policy",
                "\"tpm\";q=40000;qu=\"tokens\";w=60, \"rpm\";q=60;w=60",
            ),
            ("RateLimit", "\"tpm\";r=1200;t=12, \"rpm\";r=59;t=1"),
        ],
        None,
    );
    assert_eq!(r.tokens, axis(Some(40_000), Some(1_200), Some(12_000), 1));
    assert_eq!(r.requests, axis(Some(60), Some(59), Some(1_000), 1));
}

#[test]
fn reads_draft_07_combined_ratelimit() {
    let r = parse(&[("RateLimit", "limit=100, remaining=50, reset=5")], None);
    assert_eq!(r.requests, axis(Some(100), Some(50), Some(5_000), 1));
}

#[test]
fn reads_old_separate_ietf_headers() {
    let r = parse(
        &[
            ("RateLimit-Limit", "100, 100;w=10"),
            ("RateLimit-Remaining", "42"),
            ("RateLimit-Reset", "8"),
        ],
        None,
    );
    assert_eq!(r.requests, axis(Some(100), Some(42), Some(8_000), 1));
    assert_eq!((r.recognised, r.malformed), (3, 0));
}

#[test]
fn provider_headers_take_precedence_over_ietf() {
    let r = parse(
        &[
            ("RateLimit", "limit=100, remaining=1, reset=5"),
            ("x-ratelimit-remaining-requests", "77"),
        ],
        None,
    );
    assert_eq!(r.requests, axis(None, Some(77), None, 1));
}

#[test]
fn too_many_ietf_fields_are_dropped_and_counted() {
    let mut headers: Vec<(&str, String)> = Vec::new();
    for i in 0..10 {
        headers.push(("RateLimit", format!("\"p{i}\";r={}", 100 - i)));
    }
    let r = parse_headers(headers.iter().map(|(n, v)| (*n, v.as_str())), None);
    assert_eq!(r.requests.remaining, Some(93));
    assert_eq!((r.recognised, r.malformed), (10, 2));
}

#[test]
fn survives_hostile_values() {
    let long = "9".repeat(10_000);
    let nested = "(".repeat(5_000);
    let hostile = [
        "",
        " ",
        "-",
        "--1",
        "+1",
        "\u{0}",
        "\u{feff}12",
        "１２",
        "12\u{300}",
        "🦀",
        "1e309",
        "NaN",
        "-9223372036854775808",
        "-18446744073709551616",
        "9007199254740993.9999999999999999999",
        long.as_str(),
        nested.as_str(),
        "\"\\",
        "limit=",
        "0.",
        "Sun, 06 Nov 1994 25:49:37 GMT",
        "9999-99-99T99:99:99Z",
    ];
    let names = [
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
        "rate_limit_type",
        "reset_at",
        "date",
    ];
    for name in names {
        for value in hostile {
            for now in [None, Some(0), Some(NOW), Some(u64::MAX)] {
                let r = parse(&[(name, value), ("date", value)], now);
                for a in [
                    r.requests,
                    r.tokens,
                    r.input_tokens,
                    r.output_tokens,
                    r.concurrent,
                ] {
                    assert!(a.reset_after_ms.is_none_or(|ms| ms <= MAX_WAIT_MS));
                    assert!(a.granularity == 1 || a.granularity == 1000);
                }
                assert!(r.retry_after_ms.is_none_or(|ms| ms <= MAX_WAIT_MS));
                assert!(r.reset_at_ms.is_none_or(|ms| ms <= MAX_WAIT_MS));
                assert!(r.malformed <= r.recognised);
            }
        }
    }
}

#[test]
fn report_round_trips_through_json_with_snake_case_names() {
    let r = parse(
        &[
            ("anthropic-ratelimit-input-tokens-remaining", "1000"),
            ("rate_limit_type", "output_tokens_per_minute"),
            ("retry-after", "3"),
        ],
        None,
    );
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"input_tokens\":{\"limit\":null,\"remaining\":1000,\"reset_after_ms\":null,\"granularity\":1000}"));
    assert!(json.contains("\"exceeded\":\"output_tokens\""));
    assert!(json.contains("\"retry_after_ms\":3000"));
    let back: HeaderReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
    // Missing fields take their defaults, granularity 1 included.
    let sparse: HeaderReport = serde_json::from_str("{\"requests\":{\"remaining\":5}}").unwrap();
    assert_eq!(sparse.requests, axis(None, Some(5), None, 1));
}

#[test]
fn axis_accessor_matches_fields() {
    let r = parse(&[("x-ratelimit-remaining-tokens", "3")], None);
    assert_eq!(r.axis(RateAxis::Tokens).remaining, Some(3));
    assert_eq!(r.axis(RateAxis::Requests), &r.requests);
    assert_eq!(r.axis(RateAxis::Concurrent), &AxisReport::default());
}

#[test]
fn anthropic_minus_one_keeps_a_past_reset() {
    let r = parse(
        &[
            ("anthropic-ratelimit-requests-remaining", "-1"),
            ("anthropic-ratelimit-requests-reset", "2026-11-29T09:59:00Z"),
        ],
        Some(NOW),
    );
    assert_eq!(r.requests, axis(None, None, Some(0), 1));
    assert_eq!(r.malformed, 0);
}

#[test]
fn many_ietf_items_are_bounded() {
    // Eight full RateLimit fields whose items name no policy, and eight full policy
    // fields: matching is capped at 64 items per field.
    let limits: String = (0..200)
        .map(|i| format!("\"l{i}\";r={};t=5, ", 1000 - i))
        .collect();
    let limits = limits.trim_end_matches(", ");
    let policies: String = (0..200)
        .map(|i| format!("\"p{i}\";q={}, ", 10 + i))
        .collect();
    let policies = policies.trim_end_matches(", ");
    let mut headers: Vec<(&str, &str)> = Vec::new();
    for _ in 0..8 {
        headers.push(("RateLimit", limits));
        headers.push(("RateLimit-Policy", policies));
    }
    let r = parse(&headers, None);
    // Only the first 64 items of each field count: the lowest remaining seen is 1000 - 63.
    assert_eq!(r.requests.remaining, Some(937));
    assert_eq!((r.recognised, r.malformed), (16, 0));
}

/// The name matcher as first written (one normalised comparison per candidate name),
/// kept as the reference the fast [`classify`] must agree with.
mod reference {
    use super::super::{Family, Header, Kind, RateAxis, eq_norm};

    fn strip_prefix_norm<'s>(s: &'s str, prefix: &str) -> Option<&'s str> {
        let head = s.get(..prefix.len())?;
        if eq_norm(head, prefix) {
            s.get(prefix.len()..)
        } else {
            None
        }
    }

    fn kind_from(s: &str) -> Option<Kind> {
        [
            ("limit", Kind::Limit),
            ("remaining", Kind::Remaining),
            ("reset", Kind::Reset),
        ]
        .into_iter()
        .find(|(name, _)| eq_norm(s, name))
        .map(|(_, k)| k)
    }

    pub(super) const AXIS_NAMES: [(&str, RateAxis); 4] = [
        ("requests", RateAxis::Requests),
        ("tokens", RateAxis::Tokens),
        ("input-tokens", RateAxis::InputTokens),
        ("output-tokens", RateAxis::OutputTokens),
    ];

    pub(super) const X_AXIS_NAMES: [(&str, RateAxis); 7] = [
        ("requests", RateAxis::Requests),
        ("tokens", RateAxis::Tokens),
        ("input-tokens", RateAxis::InputTokens),
        ("output-tokens", RateAxis::OutputTokens),
        ("concurrent-requests", RateAxis::Concurrent),
        ("parallel-requests", RateAxis::Concurrent),
        ("concurrent", RateAxis::Concurrent),
    ];

    pub(super) const EXACT: [(&str, Header); 9] = [
        ("ratelimit-limit", Header::IetfLimit),
        ("ratelimit-remaining", Header::IetfRemaining),
        ("ratelimit-reset", Header::IetfReset),
        ("ratelimit", Header::IetfRateLimit),
        ("ratelimit-policy", Header::IetfPolicy),
        ("retry-after", Header::RetryAfter),
        ("retry-after-ms", Header::RetryAfterMs),
        ("x-should-retry", Header::ShouldRetry),
        ("date", Header::Date),
    ];

    pub(super) fn classify(name: &str) -> Option<Header> {
        let name = name.trim_ascii();
        if let Some(rest) = strip_prefix_norm(name, "anthropic-ratelimit-") {
            return AXIS_NAMES.iter().find_map(|&(axis_name, axis)| {
                let after = strip_prefix_norm(rest, axis_name)?;
                let kind = kind_from(strip_prefix_norm(after, "-")?)?;
                Some(Header::Axis(Family::Anthropic, axis, kind))
            });
        }
        for prefix in ["x-ratelimit-", "x-rate-limit-"] {
            let found = strip_prefix_norm(name, prefix).and_then(|rest| {
                let (kind_name, axis_name) = rest.split_once(['-', '_'])?;
                let kind = kind_from(kind_name)?;
                let &(_, axis) = X_AXIS_NAMES.iter().find(|(n, _)| eq_norm(axis_name, n))?;
                Some(Header::Axis(Family::OpenAi, axis, kind))
            });
            if found.is_some() {
                return found;
            }
        }
        if let Some(&(_, h)) = EXACT.iter().find(|(n, _)| eq_norm(name, n)) {
            return Some(h);
        }
        let base = strip_prefix_norm(name, "x-").unwrap_or(name);
        if eq_norm(base, "rate-limit-type") {
            Some(Header::LimitType)
        } else if eq_norm(base, "reset-at") {
            Some(Header::ResetAt)
        } else {
            None
        }
    }
}

/// Every name the reference recognises, spelled canonically.
fn canonical_names() -> Vec<String> {
    let kinds = ["limit", "remaining", "reset"];
    let mut names = Vec::new();
    for (axis, _) in reference::AXIS_NAMES {
        for kind in kinds {
            names.push(format!("anthropic-ratelimit-{axis}-{kind}"));
        }
    }
    for prefix in ["x-ratelimit-", "x-rate-limit-"] {
        for (axis, _) in reference::X_AXIS_NAMES {
            for kind in kinds {
                names.push(format!("{prefix}{kind}-{axis}"));
            }
        }
    }
    for (name, _) in reference::EXACT {
        names.push(String::from(name));
    }
    for name in [
        "rate-limit-type",
        "x-rate-limit-type",
        "reset-at",
        "x-reset-at",
    ] {
        names.push(String::from(name));
    }
    names
}

#[test]
fn fast_name_matching_agrees_with_the_reference() {
    let mut names = canonical_names();
    for (name, _) in [
        ("date", ""),
        ("content-type", ""),
        ("cf-ray", ""),
        ("anthropic-organization-id", ""),
        ("x-request-id", ""),
        ("x-ratelimit-limit", ""),
        ("x-ratelimit-", ""),
        ("anthropic-ratelimit-", ""),
        ("anthropic-ratelimit-tokens", ""),
        ("x-x-reset-at", ""),
        ("x-", ""),
        ("", ""),
        ("   ", ""),
        ("ratelimit-", ""),
        ("x-ratelimit-limit requests", ""),
        ("x-ratelimit-limit-input tokens", ""),
        ("x-ratelimit-limit input-tokens", ""),
        ("x_ratelimit_limit_input_tokens", ""),
        ("anthropic-ratelimit-input tokens-limit", ""),
        ("anthropic ratelimit requests limit", ""),
        ("x-ratelimit-reset-tokens\u{e9}", ""),
        ("\u{e9}x-ratelimit-reset-tokens", ""),
        ("x-ratelimit-r\u{e9}set-tokens", ""),
        (
            "anthropic-ratelimit-output-tokens-remaining-and-then-some-more-bytes",
            "",
        ),
    ] {
        names.push(String::from(name));
    }
    // Variants of every canonical name: case, separators, whitespace, truncation and
    // one more character.
    let canonical = canonical_names();
    for name in &canonical {
        names.push(name.to_ascii_uppercase());
        names.push(name.replace('-', "_"));
        names.push(name.replace('-', " "));
        names.push(format!("  {name}\t"));
        names.push(format!("{name}-"));
        names.push(format!("{name}s"));
        names.push(format!("x-{name}"));
        names.push(String::from(&name[..name.len() - 1]));
        names.push(String::from(&name[1..]));
        // Alternate case and separators character by character.
        let mixed: String = name
            .chars()
            .enumerate()
            .map(|(i, c)| match (c, i % 3) {
                ('-', 0) => '_',
                ('-', 1) => ' ',
                (c, 2) => c.to_ascii_uppercase(),
                (c, _) => c,
            })
            .collect();
        names.push(mixed);
        // Each single separator replaced by each alternative.
        for (i, c) in name.char_indices() {
            if c == '-' {
                for alt in ["_", " ", "", "--", "\u{e9}"] {
                    names.push(format!("{}{alt}{}", &name[..i], &name[i + 1..]));
                }
            }
        }
    }
    // Pseudo-random names over the letters and separators that matter.
    let alphabet = b"aAxXrRdDt-_ eilmnpqsuoc";
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 24) as usize;
        let mut s = String::new();
        let mut y = x;
        for _ in 0..len {
            y = y.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            s.push(char::from(alphabet[(y >> 59) as usize % alphabet.len()]));
        }
        names.push(s);
        // A known name with one position changed.
        let base = &canonical[(x >> 20) as usize % canonical.len()];
        let at = (x >> 40) as usize % base.len();
        let c = char::from(alphabet[(x >> 8) as usize % alphabet.len()]);
        names.push(format!("{}{c}{}", &base[..at], &base[at + 1..]));
    }
    let mut recognised = 0;
    for name in &names {
        let fast = classify(name);
        assert_eq!(fast, reference::classify(name), "{name:?}");
        recognised += usize::from(fast.is_some());
    }
    assert!(
        recognised > 500,
        "the variants exercise matching: {recognised}"
    );
}

#[test]
fn every_recognised_name_fits_the_name_buffer() {
    for name in canonical_names() {
        assert!(name.len() < MAX_NAME, "{name}");
        assert!(classify(&name).is_some(), "{name}");
    }
}
