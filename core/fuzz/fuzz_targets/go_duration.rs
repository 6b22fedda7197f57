#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwarden_core::headers::{MAX_WAIT_MS, parse_go_duration_ms};

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let got = parse_go_duration_ms(&s);
    if let Some(ms) = got {
        assert!(ms <= MAX_WAIT_MS, "{s:?} gave {ms}");
        // Surrounding whitespace never matters.
        assert_eq!(parse_go_duration_ms(&format!(" {s}\t")), got, "{s:?}");
        let body = s.trim_ascii();
        let body = body.strip_prefix('+').unwrap_or(body);
        if body != "0" {
            // A trailing zero component adds nothing.
            assert_eq!(parse_go_duration_ms(&format!("{body}0s")), got, "{s:?}");
            // A leading second never shortens the wait (it may only hit the clamp).
            let longer = parse_go_duration_ms(&format!("1s{body}"));
            assert!(longer.is_some_and(|l| l >= ms && l <= MAX_WAIT_MS), "{s:?}");
            if ms < MAX_WAIT_MS - 1000 {
                assert_eq!(longer, Some(ms + 1000), "{s:?}");
            }
        }
    }
});
