//! Errors in each provider's own format, which its official SDKs parse and show: what a
//! host answers a client when tokenwarden, not the provider, ends a call (a refusal, a
//! limiter shutting down, the provider unreachable), with the status and retry advice of
//! each ([`Stop`]).

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

/// Why tokenwarden answers a model call in the provider's place, without forwarding it or
/// after the provider failed it: what a host answers is [`Stop::status`], a
/// [`Stop::retry_after_s`] and the [`Stop::should_retry`] the official SDKs obey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The core refused the call or gave up on it; `retry_after_ms`: when a retry may pass,
    /// if the core said waiting cures it (`None`: as asked it is never served).
    Refused {
        /// When to come back, ms.
        retry_after_ms: Option<u64>,
    },
    /// The core gave up on the call after the provider's own refusals (its 429s or
    /// overloads, retried as often as the core allows).
    GaveUp,
    /// No pool for the call's model.
    UnknownPool,
    /// The limiter is closed for good (an in-process driver its owner closed).
    Closed,
    /// The limiter is going away and another takes its place (a Worker restarting).
    Restarting,
    /// The provider could not be reached.
    Unreachable,
    /// The provider sent no answer in time (an upstream timeout).
    TimedOut,
}

impl Stop {
    /// A stop by its name (`refused`, `gave_up`, `unknown_pool`, `closed`, `restarting`,
    /// `unreachable`, `timed_out`); `retry_after_ms` is a refusal's.
    #[must_use]
    pub fn named(name: &str, retry_after_ms: Option<u64>) -> Option<Stop> {
        Some(match name {
            "refused" => Stop::Refused { retry_after_ms },
            "gave_up" => Stop::GaveUp,
            "unknown_pool" => Stop::UnknownPool,
            "closed" => Stop::Closed,
            "restarting" => Stop::Restarting,
            "unreachable" => Stop::Unreachable,
            "timed_out" => Stop::TimedOut,
            _ => return None,
        })
    }

    /// The HTTP status: 429 for a refusal waiting cures and for a call given up after the
    /// provider's refusals, 400 for a refusal waiting does not cure and for a model with no
    /// pool, 503 for a limiter closed or restarting, 502 for a provider not
    /// reached, 504 for one that did not answer in time.
    #[must_use]
    pub fn status(self) -> u16 {
        match self {
            Stop::Refused {
                retry_after_ms: Some(_),
            }
            | Stop::GaveUp => 429,
            Stop::Refused {
                retry_after_ms: None,
            }
            | Stop::UnknownPool => 400,
            Stop::Closed | Stop::Restarting => 503,
            Stop::Unreachable => 502,
            Stop::TimedOut => 504,
        }
    }

    /// `retry-after` in whole seconds (at least 1, rounded up): a refusal waiting cures.
    #[must_use]
    pub fn retry_after_s(self) -> Option<u64> {
        match self {
            Stop::Refused {
                retry_after_ms: Some(ms),
            } => Some(ms.div_ceil(1000).max(1)),
            _ => None,
        }
    }

    /// `x-should-retry`, which the official SDKs obey over the status: a retry helps a
    /// refusal with a retry time and a limiter that restarts, not a refusal without one, a
    /// call the core gave up on, a model with no pool or a closed limiter (the SDK would
    /// retry a 429 or a 503 by its status).
    /// `None` for the provider's own failures: the header is left out and the SDK's rule
    /// by status applies, as it would to the provider's answer.
    #[must_use]
    pub fn should_retry(self) -> Option<bool> {
        match self {
            Stop::Refused { retry_after_ms } => Some(retry_after_ms.is_some()),
            Stop::Restarting => Some(true),
            Stop::GaveUp | Stop::UnknownPool | Stop::Closed => Some(false),
            Stop::Unreachable | Stop::TimedOut => None,
        }
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

#[cfg(test)]
mod stop_tests {
    use super::Stop;

    #[test]
    fn each_stop_answers_its_status_and_retry_advice() {
        let wait = Stop::Refused {
            retry_after_ms: Some(2_001),
        };
        assert_eq!(
            (wait.status(), wait.retry_after_s(), wait.should_retry()),
            (429, Some(3), Some(true))
        );
        let soon = Stop::Refused {
            retry_after_ms: Some(0),
        };
        assert_eq!(soon.retry_after_s(), Some(1), "at least a second");
        let never = Stop::Refused {
            retry_after_ms: None,
        };
        assert_eq!(
            (never.status(), never.retry_after_s(), never.should_retry()),
            (400, None, Some(false))
        );
        assert_eq!(
            (Stop::Closed.status(), Stop::Closed.should_retry()),
            (503, Some(false))
        );
        assert_eq!(
            (Stop::Restarting.status(), Stop::Restarting.should_retry()),
            (503, Some(true))
        );
        assert_eq!(
            (Stop::UnknownPool.status(), Stop::UnknownPool.should_retry()),
            (400, Some(false))
        );
        assert_eq!(
            (Stop::Unreachable.status(), Stop::Unreachable.should_retry()),
            (502, None)
        );
        assert_eq!(
            (Stop::TimedOut.status(), Stop::TimedOut.should_retry()),
            (504, None)
        );
        assert_eq!(Stop::named("refused", None), Some(never));
        assert_eq!(Stop::named("gone", None), None);
    }
}
