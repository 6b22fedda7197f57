//! Anthropic's `count_tokens` endpoint as the estimator's opt-in asks it: the part of a
//! Messages body it counts, and how long to stop asking after a count failed.

use serde_json::{Map, Value};

/// The fields of a Messages request that `count_tokens` takes (and that count).
pub const COUNTED: [&str; 6] = [
    "model",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "thinking",
];

/// Counting stops this long after a failure (a timeout, the network, a 5xx) by default.
pub const PAUSE_MS: u64 = 10_000;
/// After a 429 or 529 without a `Retry-After`, counting stops this long.
pub const RATE_LIMITED_PAUSE_MS: u64 = 30_000;
/// No pause is longer than this, whatever a `Retry-After` says.
pub const MAX_PAUSE_MS: u64 = 600_000;

/// The `count_tokens` request for a Messages body: its [`COUNTED`] fields only.
#[must_use]
pub fn body(messages: &Value) -> Value {
    let mut out = Map::new();
    for k in COUNTED {
        if let Some(v) = messages.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    Value::Object(out)
}

/// How long to stop counting after a failed count: for a 429 or 529 (`status`) its
/// `Retry-After` (seconds, or an HTTP date against `unix_now_ms`, read as the core reads the
/// provider's), else [`RATE_LIMITED_PAUSE_MS`]; for any other failure (another status, or
/// none: a timeout, the network) `pause_ms`; at most [`MAX_PAUSE_MS`].
#[must_use]
pub fn pause_after_failure(
    status: Option<u16>,
    retry_after: Option<&str>,
    unix_now_ms: u64,
    pause_ms: u64,
) -> u64 {
    let ms = if matches!(status, Some(429 | 529)) {
        retry_after
            .and_then(|v| tokenwarden_core::headers::parse_retry_after_ms(v, Some(unix_now_ms)))
            .unwrap_or(RATE_LIMITED_PAUSE_MS)
    } else {
        pause_ms
    };
    ms.min(MAX_PAUSE_MS)
}
