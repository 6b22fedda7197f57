#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tokenwarden_core::headers::{MAX_WAIT_MS, parse_http_date_ms, parse_retry_after_ms};

fuzz_target!(|data: &[u8]| {
    let (now, rest) = common::split_clock(data);
    let s = String::from_utf8_lossy(rest);
    let got = parse_retry_after_ms(&s, now);
    if let Some(ms) = got {
        assert!(ms <= MAX_WAIT_MS, "{s:?} gave {ms}");
    }
    match parse_http_date_ms(&s) {
        // An HTTP-date needs a clock and then gives the clamped distance to it.
        Some(at) => {
            let expected = now.map(|n| at.saturating_sub(n).min(MAX_WAIT_MS));
            assert_eq!(got, expected, "{s:?} at {now:?}");
        }
        // Delta-seconds never depend on the clock.
        None => {
            assert_eq!(parse_retry_after_ms(&s, None), got, "{s:?}");
            assert_eq!(parse_retry_after_ms(&s, Some(u64::MAX)), got, "{s:?}");
        }
    }
});
