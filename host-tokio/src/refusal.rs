//! A call tokenwarden ends itself, answered as the provider would.

use bytes::Bytes;
use serde_json::{Value, json};
use tokenwarden_core::{GiveUp, GiveUpReason, RejectReason};
use tokenwarden_provider::errors::{Stop, error_body};
use tokenwarden_provider::estimate::Provider;

/// A model call the core ended without sending it (or after the provider's own refusals):
/// the answer a client gets in the provider's place — the status, `retry-after` and
/// `x-should-retry` of [`Stop`], an error body in the provider's format with tokenwarden's
/// fields under `tokenwarden`, and `x-tokenwarden-refusal: 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// Whose format the answer follows.
    pub provider: Provider,
    /// Why the call ended.
    pub stop: Stop,
    /// What a person reads.
    pub message: String,
    /// tokenwarden's own fields (`error`, and for a refusal `reason`, `gaveUp`).
    pub fields: Value,
}

impl Refusal {
    /// The core gave up on the call.
    pub(crate) fn gave_up(provider: Provider, g: &GiveUp) -> Refusal {
        let gave_up = match g.reason {
            GiveUpReason::NeverFits => "never_fits",
            GiveUpReason::Refusals => "refusals",
            GiveUpReason::Attempts => "attempts",
        };
        match g.refusal {
            Some(reason) => {
                let why = why(reason);
                let message = if g.reason == GiveUpReason::Refusals {
                    format!(
                        "tokenwarden: lease rejected: {why}; the call gave up after the configured number of refusals (call.max_refusals)"
                    )
                } else {
                    format!("tokenwarden: lease rejected: {why}; it can never be served as asked")
                };
                Refusal {
                    provider,
                    stop: Stop::Refused {
                        retry_after_ms: None,
                    },
                    fields: json!({
                        "error": "rejected",
                        "reason": serde_json::to_value(reason).unwrap_or(Value::Null),
                        "retryAt": null,
                        "retryAfterMs": null,
                        "gaveUp": gave_up,
                        "message": message,
                    }),
                    message,
                }
            }
            None => {
                let message = format!(
                    "tokenwarden: the call gave up ({gave_up}) after {} sends the provider refused",
                    g.attempts
                );
                Refusal {
                    provider,
                    stop: Stop::GaveUp,
                    fields: json!({ "error": "rejected", "gaveUp": gave_up, "message": message }),
                    message,
                }
            }
        }
    }

    /// The coordinator was closed while the call asked or waited: another takes its place.
    pub(crate) fn closed(provider: Provider) -> Refusal {
        let message = "tokenwarden: this limiter handed its quota on (another instance or a share of the quota takes its place); retry".to_owned();
        Refusal {
            provider,
            stop: Stop::Restarting,
            fields: json!({ "error": "closed", "message": message }),
            message,
        }
    }

    /// No pool serves the call's model.
    pub(crate) fn unknown_pool(provider: Provider, model: &str, pools: &str) -> Refusal {
        let message = format!(
            "tokenwarden: no pool for model {model:?}: name a pool after it or give the agent one (Agent::pool); pools: {pools}"
        );
        Refusal {
            provider,
            stop: Stop::UnknownPool,
            fields: json!({ "error": "unknown_pool", "message": message }),
            message,
        }
    }

    /// The HTTP status.
    #[must_use]
    pub fn status(&self) -> u16 {
        self.stop.status()
    }

    /// The answer: status, headers and body.
    #[must_use]
    pub fn to_response(&self) -> http::Response<Bytes> {
        let status = self.status();
        let body = error_body(self.provider, status, None, &self.message, &self.fields);
        let mut b = http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("x-tokenwarden-refusal", "1");
        if let Some(s) = self.stop.retry_after_s() {
            b = b.header(http::header::RETRY_AFTER, s);
        }
        if let Some(r) = self.stop.should_retry() {
            b = b.header("x-should-retry", if r { "true" } else { "false" });
        }
        let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        b.body(bytes)
            .unwrap_or_else(|_| http::Response::new(Bytes::new()))
    }
}

/// A refusal's reason as a person reads it.
fn why(reason: RejectReason) -> String {
    let v = serde_json::to_value(reason).unwrap_or(Value::Null);
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("refused");
    if kind == "exceeds_capacity" {
        let axis = v.get("axis").and_then(Value::as_str).unwrap_or("capacity");
        format!("the request needs more {axis} than the pool allows in a window")
    } else {
        kind.replace('_', " ")
    }
}
