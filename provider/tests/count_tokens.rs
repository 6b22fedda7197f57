//! Anthropic's `count_tokens` as the estimator asks it: what is sent, how long to pause.
use serde_json::json;
use tokenwarden_provider::count_tokens::{
    MAX_PAUSE_MS, RATE_LIMITED_PAUSE_MS, body, pause_after_failure,
};

#[test]
fn only_the_counted_fields_are_sent() {
    let messages = json!({
        "model": "claude-sonnet-4-6", "max_tokens": 1000, "stream": true, "metadata": { "user_id": "u" },
        "system": "s", "messages": [{ "role": "user", "content": "hi" }], "tools": [], "tool_choice": { "type": "auto" },
        "thinking": { "type": "enabled", "budget_tokens": 1024 }, "temperature": 0.5
    });
    assert_eq!(
        body(&messages),
        json!({ "model": "claude-sonnet-4-6", "system": "s", "messages": [{ "role": "user", "content": "hi" }],
                "tools": [], "tool_choice": { "type": "auto" }, "thinking": { "type": "enabled", "budget_tokens": 1024 } })
    );
}

#[test]
fn a_rate_limited_count_pauses_as_its_retry_after_says() {
    let now = 1_700_000_000_000; // 2023-11-14T22:13:20Z
    assert_eq!(
        pause_after_failure(Some(429), Some("12"), now, 10_000),
        12_000
    );
    assert_eq!(
        pause_after_failure(Some(529), Some("1.5"), now, 10_000),
        1_500
    );
    // An HTTP date, against the caller's clock.
    assert_eq!(
        pause_after_failure(
            Some(429),
            Some("Tue, 14 Nov 2023 22:14:20 GMT"),
            now,
            10_000
        ),
        60_000
    );
    // No (or an unreadable) Retry-After: 30 s; never more than 10 min.
    assert_eq!(
        pause_after_failure(Some(429), None, now, 10_000),
        RATE_LIMITED_PAUSE_MS
    );
    assert_eq!(
        pause_after_failure(Some(429), Some("soon"), now, 10_000),
        RATE_LIMITED_PAUSE_MS
    );
    assert_eq!(
        pause_after_failure(Some(429), Some("86400"), now, 10_000),
        MAX_PAUSE_MS
    );
    // Another failure: the configured pause, whatever its Retry-After.
    assert_eq!(
        pause_after_failure(Some(500), Some("120"), now, 10_000),
        10_000
    );
    assert_eq!(pause_after_failure(None, None, now, 2_500), 2_500);
}
