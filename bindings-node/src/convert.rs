//! Every conversion between JavaScript values and core types, and every error the addon
//! throws. `lib.rs` only calls into here.
//!
//! Numbers: JavaScript numbers are exact integers below 2^53, so every `u64` the core
//! returns crosses as a `number` when it is at most 2^53 − 1 and as a `bigint` above
//! (`U64`). Arguments accept either: a non-negative integer `number`, or a `bigint` in
//! `0..2^64`. Lease ids are always below 2^53, so they are plain numbers.
//!
//! Keys: results are the core's serde shapes with camelCase keys; enum tags keep the
//! core's snake_case spelling (`"exceeds_capacity"`, `"input_tokens"`), the same strings as
//! in the trace files. Inputs cross as the core's `Input` in JSON text
//! (`tokenwarden_js_abi::handle`) or through the register file.

use napi::bindgen_prelude::{BigInt, Either, JsObjectValue};
use napi::{Env, JsError, JsRangeError, JsTypeError, JsValue, Status};
use serde_json::Value;
/// The register-file layouts and the result held back when it needs `bigint`s.
pub use tokenwarden_js_abi::io::{self, WideResult};
use tokenwarden_js_abi::{MAX_SAFE, all_safe, camel_value, u64_from_bigint, u64_from_f64};

/// An unsigned 64-bit integer as JavaScript sees it: `number` up to 2^53 − 1, `bigint` above.
pub type U64 = Either<f64, BigInt>;

/// A `u64` for JavaScript: a `number` when exact, a `bigint` otherwise.
pub fn u64_to_js(v: u64) -> U64 {
    if v <= MAX_SAFE {
        #[allow(clippy::cast_precision_loss)] // exact: v < 2^53
        Either::A(v as f64)
    } else {
        Either::B(BigInt::from(v))
    }
}

/// An error about to be thrown into JavaScript (shared with the wasm build).
pub use tokenwarden_js_abi::ArgError as Thrown;
use tokenwarden_js_abi::ErrorKind;

/// Throws `t` as a real JavaScript `Error`/`RangeError`/`TypeError` with `code` (and
/// `field`) properties, and returns the marker napi-rs expects after a throw.
pub fn throw(t: Thrown, env: &Env) -> napi::Error {
    let base = napi::Error::new(t.code.to_owned(), t.message);
    let value = match t.kind {
        ErrorKind::Error => JsError::from(base).into_unknown(*env),
        ErrorKind::Range => JsRangeError::from(base).into_unknown(*env),
        ErrorKind::Type => JsTypeError::from(base).into_unknown(*env),
    };
    let thrown = value.coerce_to_object().and_then(|mut obj| {
        if let Some(field) = &t.field {
            obj.set_named_property("field", field.as_str())?;
        }
        env.throw(obj)
    });
    match thrown {
        Ok(()) => napi::Error::from_status(Status::PendingException),
        Err(e) => e,
    }
}

/// Reads an unsigned integer argument named `what`.
pub fn u64_arg(v: &U64, what: &str) -> Result<u64, Thrown> {
    match v {
        Either::A(n) => u64_from_f64(*n, what),
        Either::B(b) => {
            let (negative, value, lossless) = b.get_u64();
            u64_from_bigint(negative, value, lossless, what)
        }
    }
}

/// Serializes a core value for JavaScript with camelCase keys.
pub fn to_js_value<T: serde::Serialize>(v: &T) -> Result<Value, Thrown> {
    camel_value(v)
}

/// A core value for JavaScript as JSON text (camelCase keys) when `JSON.parse` reads it
/// exactly, else as an object with `bigint`s. Big objects cross much faster as one
/// string than property by property (a metrics object: ~60 µs as properties).
pub fn to_js_json<T: serde::Serialize>(v: &T) -> Result<Either<String, Value>, Thrown> {
    if let Some(text) = tokenwarden_js_abi::camel_json(v) {
        return Ok(Either::A(text));
    }
    let value = to_js_value(v)?;
    if all_safe(&value) {
        Ok(Either::A(value.to_string()))
    } else {
        Ok(Either::B(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_args_accept_exact_integers_only() {
        assert_eq!(u64_arg(&Either::A(5.0), "x").ok(), Some(5));
        assert!(u64_arg(&Either::A(-1.0), "x").is_err());
        assert!(u64_arg(&Either::A(1.5), "x").is_err());
        assert!(u64_arg(&Either::A(f64::NAN), "x").is_err());
        assert!(u64_arg(&Either::A(18_446_744_073_709_551_616.0), "x").is_err());
        assert_eq!(
            u64_arg(&Either::B(BigInt::from(u64::MAX)), "x").ok(),
            Some(u64::MAX)
        );
        assert!(u64_arg(&Either::B(BigInt::from(-1i64)), "x").is_err());
        assert!(matches!(u64_to_js((1 << 53) - 1), Either::A(_)));
        assert!(matches!(u64_to_js(1 << 53), Either::B(_)));
    }
}
