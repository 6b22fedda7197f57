#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tokenwarden_core::headers::{AxisReport, MAX_WAIT_MS, parse_headers};

fuzz_target!(|data: &[u8]| {
    let (now, rest) = common::split_clock(data);
    let text = String::from_utf8_lossy(rest);
    // One header per line, `name: value`; a line without a colon is a name with an
    // empty value.
    let pairs: Vec<(&str, &str)> = text
        .split('\n')
        .map(|line| line.split_once(':').unwrap_or((line, "")))
        .collect();
    let report = parse_headers(pairs.iter().copied(), now);

    let axes: [AxisReport; 5] = [
        report.requests,
        report.tokens,
        report.input_tokens,
        report.output_tokens,
        report.concurrent,
    ];
    for axis in axes {
        assert!(
            axis.reset_after_ms.is_none_or(|ms| ms <= MAX_WAIT_MS),
            "{report:?}"
        );
        assert!(
            axis.granularity == 1 || axis.granularity == 1000,
            "{report:?}"
        );
    }
    assert!(
        report.retry_after_ms.is_none_or(|ms| ms <= MAX_WAIT_MS),
        "{report:?}"
    );
    assert!(
        report.reset_at_ms.is_none_or(|ms| ms <= MAX_WAIT_MS),
        "{report:?}"
    );
    assert!(report.malformed <= report.recognised, "{report:?}");
    assert!(report.recognised as usize <= pairs.len(), "{report:?}");
    // Deterministic: the same headers give the same report.
    assert_eq!(parse_headers(pairs.iter().copied(), now), report);
});
