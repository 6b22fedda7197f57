//! Every conversion between JavaScript values and core types, and every error thrown into
//! JavaScript. `lib.rs` only calls into here.
//!
//! The rules are the Node addon's, so both engines look the same to the shared driver:
//! a `u64` crosses as a `number` up to 2^53 − 1 and as a `bigint` above; arguments take a
//! non-negative integer `number` below 2^64 or a `bigint` in `0..2^64`; object keys are
//! camelCase and enum tags keep the core's snake_case spelling; errors are real `Error`,
//! `RangeError` or `TypeError` objects with the core's stable `code` (and `field`).
//!
//! Inputs with plain shapes (header pairs) go through `serde-wasm-bindgen`; outputs are
//! built by hand, because serde-wasm-bindgen writes every `u64` either as a lossy `number`
//! or always as a `bigint`, and the rule above is neither.

use js_sys::{Array, BigInt, Object, Reflect};
use serde_json::Value;
use tokenwarden_core as core;
use wasm_bindgen::{JsCast, JsValue};

/// The largest integer a `number` holds exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// An error about to be thrown into JavaScript.
#[derive(Debug)]
pub struct Thrown {
    kind: Kind,
    code: &'static str,
    message: String,
    field: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Error,
    Range,
    Type,
}

impl Thrown {
    /// A value outside its allowed range (`RangeError`).
    pub fn range(code: &'static str, message: String) -> Thrown {
        Thrown {
            kind: Kind::Range,
            code,
            message,
            field: None,
        }
    }

    /// A value of the wrong type (`TypeError`, code `invalid_argument`).
    pub fn type_error(message: String) -> Thrown {
        Thrown {
            kind: Kind::Type,
            code: "invalid_argument",
            message,
            field: None,
        }
    }

    /// Attaches the offending field (`error.field`).
    pub fn with_field(mut self, field: impl Into<String>) -> Thrown {
        self.field = Some(field.into());
        self
    }

    /// The JavaScript error object.
    pub fn into_js(self) -> JsValue {
        let err: js_sys::Error = match self.kind {
            Kind::Error => js_sys::Error::new(&self.message),
            Kind::Range => js_sys::RangeError::new(&self.message).unchecked_into(),
            Kind::Type => js_sys::TypeError::new(&self.message).unchecked_into(),
        };
        let obj: &JsValue = err.as_ref();
        // Setting a property on a fresh error object cannot fail.
        let _ = Reflect::set(obj, &"code".into(), &self.code.into());
        if let Some(field) = &self.field {
            let _ = Reflect::set(obj, &"field".into(), &field.into());
        }
        err.into()
    }
}

impl From<Thrown> for JsValue {
    fn from(t: Thrown) -> JsValue {
        t.into_js()
    }
}

/// A core `LeaseError`; `too_large` names the JavaScript field.
pub fn lease_error(e: core::LeaseError) -> Thrown {
    let message = e.to_string();
    match e {
        core::LeaseError::TooLarge { field } => {
            Thrown::range(e.code(), message).with_field(camel(field))
        }
        _ => Thrown {
            kind: Kind::Error,
            code: e.code(),
            message,
            field: None,
        },
    }
}

/// A core `ConfigError`; `field` is the path in the configuration JSON.
pub fn config_error(e: &core::ConfigError) -> Thrown {
    let t = Thrown {
        kind: Kind::Error,
        code: e.code(),
        message: e.to_string(),
        field: None,
    };
    if let core::ConfigError::Invalid { field, .. } = e {
        t.with_field(field.to_string())
    } else {
        t
    }
}

/// A core `RestoreError`.
pub fn restore_error(e: &core::RestoreError) -> Thrown {
    Thrown {
        kind: Kind::Error,
        code: e.code(),
        message: e.to_string(),
        field: None,
    }
}

/// A `u64` for JavaScript: a `number` when exact, a `bigint` otherwise.
pub fn u64_to_js(v: u64) -> JsValue {
    if v <= MAX_SAFE {
        #[allow(clippy::cast_precision_loss)] // exact: v < 2^53
        JsValue::from_f64(v as f64)
    } else {
        BigInt::from(v).into()
    }
}

/// Reads an unsigned integer argument named `what`.
pub fn u64_arg(v: &JsValue, what: &str) -> Result<u64, Thrown> {
    if let Some(n) = v.as_f64() {
        if n.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&n) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked above
            return Ok(n as u64);
        }
        // JavaScript formats the number: Rust's float formatting would add ~15 KB of code.
        let shown = js_sys::Number::from(n)
            .to_string_with_radix(10)
            .map(String::from)
            .unwrap_or_default();
        return Err(Thrown::range(
            "invalid_argument",
            format!("`{what}` must be a non-negative integer below 2^64, got {shown}"),
        )
        .with_field(what));
    }
    if v.is_bigint() {
        return u64::try_from(v.clone()).map_err(|_| {
            Thrown::range(
                "invalid_argument",
                format!("`{what}` must be a bigint in 0..2^64"),
            )
            .with_field(what)
        });
    }
    Err(Thrown::type_error(format!(
        "`{what}` must be a number or a bigint, got {}",
        v.js_typeof().as_string().unwrap_or_default()
    ))
    .with_field(what))
}

/// Reads a `u32` argument (pool ids, unblocks, status).
pub fn u32_arg(v: &JsValue, what: &str) -> Result<u32, Thrown> {
    let n = u64_arg(v, what)?;
    u32::try_from(n).map_err(|_| {
        Thrown::range(
            "invalid_argument",
            format!("`{what}` must be below 2^32, got {n}"),
        )
        .with_field(what)
    })
}

/// An object argument, or a `TypeError` naming it.
fn object<'a>(v: &'a JsValue, what: &str) -> Result<&'a Object, Thrown> {
    v.dyn_ref::<Object>()
        .filter(|_| v.is_object())
        .ok_or_else(|| Thrown::type_error(format!("`{what}` must be an object")).with_field(what))
}

/// A property of an object argument (`undefined` when absent).
fn get(obj: &Object, key: &str) -> JsValue {
    // Interned: the key's JavaScript string is made once, not decoded from UTF-8 per call.
    Reflect::get(obj, &JsValue::from_str(wasm_bindgen::intern(key))).unwrap_or(JsValue::UNDEFINED)
}

/// An optional numeric property: absent (or `null`) is 0.
fn opt_u64(obj: &Object, key: &str) -> Result<u64, Thrown> {
    let v = get(obj, key);
    if v.is_undefined() || v.is_null() {
        Ok(0)
    } else {
        u64_arg(&v, key)
    }
}

/// `LeaseRequest` from `{ agent, pool, inputTokens?, cachedPrefixTokens?, maxTokens?, role?,
/// unblocks?, failureSignature? }`.
pub fn lease_request(v: &JsValue) -> Result<core::LeaseRequest, Thrown> {
    let o = object(v, "request")?;
    let role = get(o, "role");
    let role = if role.is_undefined() || role.is_null() {
        core::Role::Worker
    } else {
        match role.as_string().as_deref() {
            Some("worker") => core::Role::Worker,
            Some("reviewer") => core::Role::Reviewer,
            Some("planner") => core::Role::Planner,
            _ => {
                return Err(Thrown::range(
                    "invalid_argument",
                    "`role` must be planner, reviewer or worker".into(),
                )
                .with_field("role"));
            }
        }
    };
    let signature = get(o, "failureSignature");
    let unblocks = get(o, "unblocks");
    Ok(core::LeaseRequest {
        agent: core::AgentId(u64_arg(&get(o, "agent"), "agent")?),
        pool: core::PoolId(u32_arg(&get(o, "pool"), "pool")?),
        input_tokens: opt_u64(o, "inputTokens")?,
        cached_prefix_tokens: opt_u64(o, "cachedPrefixTokens")?,
        max_tokens: opt_u64(o, "maxTokens")?,
        role,
        unblocks: if unblocks.is_undefined() || unblocks.is_null() {
            0
        } else {
            u32_arg(&unblocks, "unblocks")?
        },
        failure_signature: if signature.is_undefined() || signature.is_null() {
            None
        } else {
            Some(u64_arg(&signature, "failureSignature")?)
        },
    })
}

/// `Usage` from `{ inputTokens?, cacheCreationInputTokens?, cacheReadInputTokens?, outputTokens? }`.
pub fn usage(v: &JsValue) -> Result<core::Usage, Thrown> {
    let o = object(v, "usage")?;
    Ok(core::Usage {
        input_tokens: opt_u64(o, "inputTokens")?,
        cache_creation_input_tokens: opt_u64(o, "cacheCreationInputTokens")?,
        cache_read_input_tokens: opt_u64(o, "cacheReadInputTokens")?,
        output_tokens: opt_u64(o, "outputTokens")?,
    })
}

/// `Backoff` from `{ failed, lastRetryAfterMs }`.
pub fn backoff_state(v: &JsValue) -> Result<core::Backoff, Thrown> {
    let o = object(v, "state")?;
    let last = get(o, "lastRetryAfterMs");
    Ok(core::Backoff {
        failed: u32_arg(&get(o, "failed"), "failed")?,
        last_retry_after_ms: if last.is_undefined() || last.is_null() {
            None
        } else {
            Some(u64_arg(&last, "lastRetryAfterMs")?)
        },
    })
}

/// Header pairs `[[name, value], ...]` (through serde-wasm-bindgen).
pub fn headers(v: JsValue) -> Result<Vec<(String, String)>, Thrown> {
    serde_wasm_bindgen::from_value(v).map_err(|e| {
        Thrown::type_error(format!(
            "`headers` must be an array of [name, value] string pairs: {e}"
        ))
        .with_field("headers")
    })
}

/// `snake_case` → `camelCase`.
pub fn camel(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut upper = false;
    for c in s.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn set(obj: &Object, key: &str, value: &JsValue) {
    // Defining a data property on a plain object cannot fail.
    let _ = Reflect::set(obj, &JsValue::from_str(wasm_bindgen::intern(key)), value);
}

/// A serde JSON value as a JavaScript value with camelCase keys and the number rule.
pub fn value_to_js(v: &Value) -> JsValue {
    match v {
        Value::Null => JsValue::NULL,
        Value::Bool(b) => JsValue::from_bool(*b),
        Value::Number(n) => match n.as_u64() {
            Some(u) => u64_to_js(u),
            None => JsValue::from_f64(n.as_f64().unwrap_or(f64::NAN)),
        },
        // Strings in core output are enum tags and names: few and repeated.
        Value::String(s) => JsValue::from_str(wasm_bindgen::intern(s)),
        Value::Array(items) => items.iter().map(value_to_js).collect::<Array>().into(),
        Value::Object(map) => {
            let obj = Object::new();
            for (k, v) in map {
                set(&obj, &camel(k), &value_to_js(v));
            }
            obj.into()
        }
    }
}

/// Serializes a core value for JavaScript.
pub fn to_js<T: serde::Serialize>(v: &T) -> Result<JsValue, Thrown> {
    serde_json::to_value(v)
        .map(|v| value_to_js(&v))
        .map_err(|e| Thrown {
            kind: Kind::Error,
            code: "internal",
            message: e.to_string(),
            field: None,
        })
}
