//! Every conversion between JavaScript values and core types, and every error thrown into
//! JavaScript. `lib.rs` only calls into here.
//!
//! The rules are the Node addon's, so both engines look the same to the shared driver:
//! a `u64` crosses as a `number` up to 2^53 − 1 and as a `bigint` above; arguments take a
//! non-negative integer `number` below 2^64 or a `bigint` in `0..2^64`; object keys are
//! camelCase and enum tags keep the core's snake_case spelling; errors are real `Error`,
//! `RangeError` or `TypeError` objects with the core's stable `code` (and `field`).
//!
//! Objects are read and built with `js-sys` here rather than through `serde-wasm-bindgen`:
//! it writes every `u64` either as a lossy `number` or always as a `bigint` (the rule above
//! is neither), and the one input it handled (header pairs) costs 2 KB of the gzipped
//! `.wasm` through it, against a budget of 150 KB. The hot calls skip objects altogether:
//! they use the register file shared with the addon (`tokenwarden-js-abi`).

use js_sys::{Array, BigInt, Object, Reflect};
use serde_json::Value;
use tokenwarden_core as core;
use tokenwarden_js_abi::{camel, io};
use wasm_bindgen::{JsCast, JsValue};

pub use tokenwarden_js_abi::ArgError;
use tokenwarden_js_abi::{ErrorKind, MAX_SAFE, u64_from_f64};

/// An error on its way into JavaScript: what the methods of `lib.rs` return.
#[derive(Debug)]
pub struct Thrown(pub ArgError);

impl From<ArgError> for Thrown {
    fn from(e: ArgError) -> Thrown {
        Thrown(e)
    }
}

impl From<Thrown> for JsValue {
    fn from(t: Thrown) -> JsValue {
        js_error(t.0)
    }
}

/// The JavaScript error object for `t`: a real `Error`, `RangeError` or `TypeError` with
/// `code` (and `field`) properties.
pub fn js_error(t: ArgError) -> JsValue {
    let err: js_sys::Error = match t.kind {
        ErrorKind::Error => js_sys::Error::new(&t.message),
        ErrorKind::Range => js_sys::RangeError::new(&t.message).unchecked_into(),
        ErrorKind::Type => js_sys::TypeError::new(&t.message).unchecked_into(),
    };
    let obj: &JsValue = err.as_ref();
    // Setting a property on a fresh error object cannot fail.
    let _ = Reflect::set(obj, &"code".into(), &t.code.into());
    if let Some(field) = &t.field {
        let _ = Reflect::set(obj, &"field".into(), &field.into());
    }
    err.into()
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
pub fn u64_arg(v: &JsValue, what: &str) -> Result<u64, ArgError> {
    if let Some(n) = v.as_f64() {
        return u64_from_f64(n, what);
    }
    if v.is_bigint() {
        return u64::try_from(v.clone()).map_err(|_| {
            ArgError::range(
                "invalid_argument",
                format!("`{what}` must be a bigint in 0..2^64"),
            )
            .with_field(what)
        });
    }
    Err(ArgError::type_error(format!(
        "`{what}` must be a number or a bigint, got {}",
        v.js_typeof().as_string().unwrap_or_default()
    ))
    .with_field(what))
}

/// Reads a `u32` argument (pool ids, unblocks, status).
pub fn u32_arg(v: &JsValue, what: &str) -> Result<u32, ArgError> {
    let n = u64_arg(v, what)?;
    u32::try_from(n).map_err(|_| {
        ArgError::range(
            "invalid_argument",
            format!("`{what}` must be below 2^32, got {n}"),
        )
        .with_field(what)
    })
}

/// An object argument, or a `TypeError` naming it.
fn object<'a>(v: &'a JsValue, what: &str) -> Result<&'a Object, ArgError> {
    v.dyn_ref::<Object>()
        .filter(|_| v.is_object())
        .ok_or_else(|| ArgError::type_error(format!("`{what}` must be an object")).with_field(what))
}

/// A property of an object argument (`undefined` when absent).
fn get(obj: &Object, key: &str) -> JsValue {
    // Interned: the key's JavaScript string is made once, not decoded from UTF-8 per call.
    Reflect::get(obj, &JsValue::from_str(wasm_bindgen::intern(key))).unwrap_or(JsValue::UNDEFINED)
}

/// An optional numeric property: absent (or `null`) is 0.
fn opt_u64(obj: &Object, key: &str) -> Result<u64, ArgError> {
    let v = get(obj, key);
    if v.is_undefined() || v.is_null() {
        Ok(0)
    } else {
        u64_arg(&v, key)
    }
}

/// Refuses a key the engine would not read (see [`tokenwarden_js_abi::unknown_key`]).
fn known_keys(o: &Object, fields: &[&str], what: &str) -> Result<(), ArgError> {
    for key in Object::keys(o).iter() {
        if let Some(e) =
            tokenwarden_js_abi::unknown_key(&key.as_string().unwrap_or_default(), fields, what)
        {
            return Err(e);
        }
    }
    Ok(())
}

/// `LeaseRequest` from `{ agent, pool, inputTokens?, cachedPrefixTokens?,
/// cachedPrefixConfirmed?, maxTokens?, role?, unblocks?, failureSignature?, task? }`.
pub fn lease_request(v: &JsValue) -> Result<core::LeaseRequest, ArgError> {
    let o = object(v, "request")?;
    known_keys(o, &io::LEASE_REQUEST_FIELDS, "lease request")?;
    let role = get(o, "role");
    let role = if role.is_undefined() || role.is_null() {
        core::Role::Worker
    } else {
        io::role_named(role.as_string().as_deref())?
    };
    let signature = get(o, "failureSignature");
    let unblocks = get(o, "unblocks");
    let confirmed = get(o, "cachedPrefixConfirmed");
    let cached_prefix_confirmed = if confirmed.is_undefined() || confirmed.is_null() {
        false
    } else {
        confirmed.as_bool().ok_or_else(|| {
            ArgError::type_error("`cachedPrefixConfirmed` must be a boolean".into())
                .with_field("cachedPrefixConfirmed")
        })?
    };
    Ok(core::LeaseRequest {
        agent: core::AgentId(u64_arg(&get(o, "agent"), "agent")?),
        pool: core::PoolId(u32_arg(&get(o, "pool"), "pool")?),
        input_tokens: opt_u64(o, "inputTokens")?,
        cached_prefix_tokens: opt_u64(o, "cachedPrefixTokens")?,
        cached_prefix_confirmed,
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
        task: {
            let task = get(o, "task");
            if task.is_undefined() || task.is_null() {
                None
            } else {
                Some(core::TaskId(u64_arg(&task, "task")?))
            }
        },
    })
}

/// `TaskSpec` from `{ task, role?, unblocks? }`.
pub fn task_spec(v: &JsValue) -> Result<core::TaskSpec, ArgError> {
    let o = object(v, "spec")?;
    let role = get(o, "role");
    let unblocks = get(o, "unblocks");
    Ok(core::TaskSpec {
        task: core::TaskId(u64_arg(&get(o, "task"), "task")?),
        role: if role.is_undefined() || role.is_null() {
            core::Role::Worker
        } else {
            io::role_named(role.as_string().as_deref())?
        },
        unblocks: if unblocks.is_undefined() || unblocks.is_null() {
            0
        } else {
            u32_arg(&unblocks, "unblocks")?
        },
    })
}

/// A task outcome from `"merged"`, `"abandoned"` or `"failed"`.
pub fn task_outcome(v: &JsValue) -> Result<core::TaskOutcome, ArgError> {
    match v.as_string().as_deref() {
        Some("merged") => Ok(core::TaskOutcome::Merged),
        Some("abandoned") => Ok(core::TaskOutcome::Abandoned),
        Some("failed") => Ok(core::TaskOutcome::Failed),
        _ => Err(ArgError::range(
            "invalid_argument",
            "`outcome` must be merged, abandoned or failed".into(),
        )
        .with_field("outcome")),
    }
}

/// `Usage` from `{ inputTokens?, cacheCreationInputTokens?, cacheReadInputTokens?, outputTokens? }`.
pub fn usage(v: &JsValue) -> Result<core::Usage, ArgError> {
    let o = object(v, "usage")?;
    known_keys(o, &io::USAGE_FIELDS, "usage")?;
    Ok(core::Usage {
        input_tokens: opt_u64(o, "inputTokens")?,
        cache_creation_input_tokens: opt_u64(o, "cacheCreationInputTokens")?,
        cache_read_input_tokens: opt_u64(o, "cacheReadInputTokens")?,
        output_tokens: opt_u64(o, "outputTokens")?,
    })
}

/// `Call` from `{ failed, refusals, lastRetryAfterMs }`.
pub fn call_state(v: &JsValue) -> Result<core::Call, ArgError> {
    let o = object(v, "call")?;
    let last = get(o, "lastRetryAfterMs");
    Ok(core::Call {
        failed: u32_arg(&get(o, "failed"), "failed")?,
        refusals: u32_arg(&get(o, "refusals"), "refusals")?,
        last_retry_after_ms: if last.is_undefined() || last.is_null() {
            None
        } else {
            Some(u64_arg(&last, "lastRetryAfterMs")?)
        },
    })
}

/// `Backoff` from `{ failed, lastRetryAfterMs }`.
pub fn backoff_state(v: &JsValue) -> Result<core::Backoff, ArgError> {
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

/// Header pairs `[[name, value], ...]`.
pub fn headers(v: &JsValue) -> Result<Vec<(String, String)>, ArgError> {
    let bad = || {
        ArgError::type_error("`headers` must be an array of [name, value] string pairs".into())
            .with_field("headers")
    };
    let list = v.dyn_ref::<Array>().ok_or_else(bad)?;
    let mut out = Vec::with_capacity(list.length() as usize);
    for pair in list.iter() {
        let pair = pair.dyn_into::<Array>().map_err(|_| bad())?;
        match (pair.get(0).as_string(), pair.get(1).as_string()) {
            (Some(name), Some(value)) if pair.length() == 2 => out.push((name, value)),
            _ => return Err(bad()),
        }
    }
    Ok(out)
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
///
/// As JSON text parsed on the JavaScript side (`tokenwarden_js_abi::camel_json`): two
/// crossings of the boundary in all, where building the object a property at a time took
/// one per key and value (a `call_response` result cost about 200 µs that way in workerd).
/// A value holding an integer above 2^53 − 1 (instants near `u64::MAX`, which `JSON.parse`
/// would round) is built property by property instead, so the number rule holds either way.
pub fn to_js<T: serde::Serialize>(v: &T) -> Result<JsValue, ArgError> {
    if let Some(text) = tokenwarden_js_abi::camel_json(v) {
        return js_sys::JSON::parse(&text).map_err(|_| {
            ArgError::state(
                "internal",
                "the engine wrote JSON that does not parse".to_string(),
            )
        });
    }
    serde_json::to_value(v)
        .map(|v| value_to_js(&v))
        .map_err(|e| ArgError::state("internal", e.to_string()))
}
