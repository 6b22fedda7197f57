#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tokenwarden_core::headers::parse_rfc3339_ms;

/// 10000-01-01T00:00:00Z; no four-digit year reaches it, even with a -23:59 offset.
const YEAR_10000_MS: u64 = 253_402_300_800_000 + 86_400_000;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let Some(ms) = parse_rfc3339_ms(&s) else {
        return;
    };
    assert!(ms < YEAR_10000_MS, "{s:?} gave {ms}");
    // Formatting the result with an independent calendar and parsing it again must
    // give the same instant.
    let c = common::civil(ms);
    if c.year > 9999 {
        // 9999-12-31T23:59:59-01:00 (or a leap second that night) is in the year 10000,
        // which RFC 3339's four-digit years cannot write.
        return;
    }
    let canonical = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second, c.milli
    );
    assert_eq!(
        parse_rfc3339_ms(&canonical),
        Some(ms),
        "{s:?} -> {canonical}"
    );
});
