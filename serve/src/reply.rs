//! Answers: JSON bodies, tokenwarden's errors, and the same errors in a provider's format
//! for a proxied call (the official SDKs parse and show them).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokenwarden_gateway::Refusal;
use tokenwarden_provider::errors::{Stop, error_body};
use tokenwarden_provider::estimate::Provider;

/// The error type of a body stream.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every answer's body: whole, or streamed (a proxied answer, a kept-alive stream).
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;
/// An answer.
pub(crate) type Reply = Response<Body>;

/// A whole body.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// `status` with `body` as JSON.
pub(crate) fn json(status: u16, body: &Value) -> Reply {
    let text = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut res = Response::new(full(text));
    *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// Why a request is not answered as asked: tokenwarden's refusal (a status, a code, a
/// message, a field), or a stop of a model call (the provider crate's rule for its status
/// and retry headers).
#[derive(Debug)]
pub(crate) enum Failure {
    /// Refused (a bad field, an unknown lease, who may not act, …).
    Refused(Refusal),
    /// A lease request the core refused or gave up: `{ error: 'rejected', … }` in its body.
    Stopped {
        /// The stop.
        stop: Stop,
        /// The body's fields besides `error` and `message`.
        body: Value,
        /// `error`.
        code: &'static str,
        /// `message`.
        message: String,
    },
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Failure {
        Failure::Refused(r)
    }
}

/// A refusal, as tokenwarden's code and message.
pub(crate) fn refusal(status: u16, code: &'static str, message: impl Into<String>) -> Failure {
    Failure::Refused(Refusal::new(status, code, message.into()))
}

impl Failure {
    /// Status, tokenwarden's body and the retry headers.
    fn parts(&self) -> (u16, Value, Option<u64>, Option<bool>) {
        match self {
            Failure::Refused(r) => {
                let mut body = json!({ "error": r.code, "message": r.message });
                if let Some(f) = &r.field {
                    body["field"] = Value::from(f.as_str());
                }
                (r.status, body, None, None)
            }
            Failure::Stopped {
                stop,
                body,
                code,
                message,
            } => {
                let mut b = json!({ "error": code });
                if let Value::Object(m) = body {
                    for (k, v) in m {
                        b[k] = v.clone();
                    }
                }
                b["message"] = Value::from(message.as_str());
                (stop.status(), b, stop.retry_after_s(), stop.should_retry())
            }
        }
    }

    /// The answer: tokenwarden's `{ error, message, field? }`, or with `provider` (a proxied
    /// call) that provider's error format with tokenwarden's fields under `tokenwarden`.
    pub(crate) fn reply(&self, provider: Option<Provider>) -> Reply {
        let (status, body, retry_after, retry) = self.parts();
        let mut res = match provider {
            None => json(status, &body),
            Some(p) => {
                let message = format!(
                    "tokenwarden: {}",
                    body["message"].as_str().unwrap_or_default()
                );
                let mut res = json(status, &error_body(p, status, None, &message, &body));
                // A refusal of tokenwarden's says whether a retry helps; the provider's own
                // failures (not reached, timed out) leave it to the SDK's rule by status.
                let should = match (retry, self) {
                    (Some(true), _) => Some("true"),
                    (Some(false), _) | (None, Failure::Refused(_)) => Some("false"),
                    (None, Failure::Stopped { .. }) => None,
                };
                if let Some(s) = should {
                    res.headers_mut()
                        .insert("x-should-retry", HeaderValue::from_static(s));
                }
                res
            }
        };
        if let Some(s) = retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
        res
    }
}
