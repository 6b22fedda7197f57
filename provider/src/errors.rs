//! Errors in each provider's own format, which its official SDKs parse and show: what a
//! host answers a client when tokenwarden, not the provider, ends a call (a refusal, a
//! limiter shutting down, the provider unreachable).

use alloc::format;
use alloc::string::String;

use serde_json::{Map, Value};

use crate::estimate::Provider;

/// The provider's error type for an HTTP status (both providers use these names).
#[must_use]
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 426 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error body in `provider`'s format with tokenwarden's own fields under `tokenwarden`:
/// Anthropic `{"type":"error","error":{"type","message"},"tokenwarden":…}`, OpenAI
/// `{"error":{"message","type","code"},"tokenwarden":…}` (`code` is tokenwarden's `error`
/// field). The type is [`error_type`]'s for `status` unless `error_type` names one.
#[must_use]
pub fn error_body(
    provider: Provider,
    status: u16,
    kind: Option<&str>,
    message: &str,
    tokenwarden: &Value,
) -> Value {
    let ty = Value::String(kind.unwrap_or_else(|| error_type(status)).into());
    let message = Value::String(message.into());
    let mut error = Map::new();
    let mut out = Map::new();
    match provider {
        Provider::Anthropic => {
            error.insert("type".into(), ty);
            error.insert("message".into(), message);
            out.insert("type".into(), Value::String("error".into()));
            out.insert("error".into(), Value::Object(error));
        }
        Provider::Openai => {
            error.insert("message".into(), message);
            error.insert("type".into(), ty);
            error.insert(
                "code".into(),
                tokenwarden.get("error").cloned().unwrap_or(Value::Null),
            );
            out.insert("error".into(), Value::Object(error));
        }
    }
    out.insert("tokenwarden".into(), tokenwarden.clone());
    Value::Object(out)
}

/// One error event in `provider`'s stream format (a call that fails after its answer began
/// streaming): Anthropic `event: error` with the error body, OpenAI a `data:` line of it.
#[must_use]
pub fn error_event(
    provider: Provider,
    status: u16,
    kind: Option<&str>,
    message: &str,
    tokenwarden: &Value,
) -> String {
    let body = error_body(provider, status, kind, message, tokenwarden);
    let data = serde_json::to_string(&body).unwrap_or_default();
    match provider {
        Provider::Anthropic => format!("event: error\ndata: {data}\n\n"),
        Provider::Openai => format!("data: {data}\n\n"),
    }
}
