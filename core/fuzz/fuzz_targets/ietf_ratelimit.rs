#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwarden_core::headers::{MAX_WAIT_MS, parse_ietf_ratelimit};

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let Some(items) = parse_ietf_ratelimit(&s) else {
        return;
    };
    let mut count = 0usize;
    for item in items.clone() {
        count += 1;
        assert!(
            item.reset_after_ms.is_none_or(|ms| ms <= MAX_WAIT_MS),
            "{s:?}"
        );
        // Names and units are slices of the input, never invented.
        for part in [item.policy, item.quota_unit].into_iter().flatten() {
            assert!(s.contains(part), "{s:?} does not contain {part:?}");
        }
        let _ = item.axis();
    }
    // A valid field has at least one item, and never more than it has bytes.
    assert!(count >= 1 && count <= s.len(), "{s:?} gave {count} items");
    // Iterating is deterministic.
    assert_eq!(items.clone().count(), count);
});
