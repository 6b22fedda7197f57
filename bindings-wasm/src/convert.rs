//! Every conversion between JavaScript values and core types, and every error thrown into
//! JavaScript. `lib.rs` only calls into here.
//!
//! The rules are the Node addon's, so both engines look the same to the shared driver:
//! a `u64` crosses as a `number` up to 2^53 − 1 and as a `bigint` above; arguments take a
//! non-negative integer `number` below 2^64 or a `bigint` in `0..2^64`; object keys are
//! camelCase and enum tags keep the core's snake_case spelling; errors are real `Error`,
//! `RangeError` or `TypeError` objects with the core's stable `code` (and `field`).
//!
//! Inputs cross as the core's `Input` in JSON text (`tokenwarden_js_abi::handle`), the hot
//! ones also through the register file shared with the addon (`tokenwarden-js-abi`).
//! Results are built with `js-sys` rather than through `serde-wasm-bindgen`, which writes
//! every `u64` either as a lossy `number` or always as a `bigint` (the rule above is
//! neither).

use js_sys::{Array, BigInt, Object, Reflect};
use serde_json::Value;
use tokenwarden_js_abi::camel;
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
