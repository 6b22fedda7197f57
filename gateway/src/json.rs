//! The JSON the gateway's clients write: camelCase keys (`inputTokens`), read into the
//! core's types (snake_case in serde), with an error that names the field at fault.
//!
//! Every host of the HTTP API and the JavaScript bindings' `handle` read their input through
//! [`from_camel`], so a malformed value is refused in the same words everywhere.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A value that does not read as the type asked for: what was wrong, the field at fault
/// (camelCase) where one is, and whether it is a value out of range (a number too large, a
/// name that is not one of the choices) rather than one of the wrong type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// What was wrong, in words (`invalid input: `request.inputTokens`: invalid value: …`).
    pub message: String,
    /// The field at fault (its camelCase name), if one is.
    pub field: Option<String>,
    /// A value out of range (`true`) or of the wrong type.
    pub range: bool,
}

/// `snake_case` → `camelCase`.
#[must_use]
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

/// `camelCase` → `snake_case`.
#[must_use]
pub fn snake(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The deepest nesting [`parse`] reads.
pub const MAX_DEPTH: usize = 1024;

/// A client's JSON text read as a [`Value`], nested up to [`MAX_DEPTH`] levels (a request
/// body is bounded in size by its host; serde_json alone stops at 128 levels, before what
/// is wrong in a deeper value could be named). `None` when it is not JSON or nests deeper.
#[must_use]
pub fn parse(text: &str) -> Option<Value> {
    let mut depth = 0usize;
    let (mut in_string, mut escaped) = (false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return None;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let value = serde::Deserialize::deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// `value` (camelCase keys) read as a `T` of the core (snake_case in serde). A key already
/// holding `_` is refused with the camelCase spelling (it would otherwise be read as another
/// field's absence); a value serde refuses is refused naming its path and field. `what`
/// names the value in the message (`input`, `request`).
pub fn from_camel<T: DeserializeOwned>(value: Value, what: &str) -> Result<T, JsonError> {
    let value = snake_keys(value, what)?;
    T::deserialize(&value).map_err(|e| {
        let message = e.to_string();
        let why = camel_quoted(&message);
        let range = message.starts_with("invalid value")
            || message.starts_with("unknown variant")
            || message.contains("floating point");
        match blame(&value, &message) {
            Some((path, field)) => JsonError {
                message: format!("invalid {what}: `{path}`: {why}"),
                field: Some(field),
                range,
            },
            None => JsonError {
                message: format!("invalid {what}: {why}"),
                field: None,
                range,
            },
        }
    })
}

/// The path (camelCase, dotted) and field a serde error is about. The tagged value is
/// decoded from a buffer, which loses serde's own path, so the field is found from the
/// message: the one it names (`unknown field`, `missing field`), or else the value it
/// quotes (`integer `-1``, `unknown variant `admiral``), looked up in the value.
fn blame(input: &Value, message: &str) -> Option<(String, String)> {
    fn find(v: &Value, quoted: &str, path: &mut Vec<String>) -> bool {
        let within = |key: String, x: &Value, path: &mut Vec<String>| {
            path.push(key);
            let found = find(x, quoted, path);
            if !found {
                path.pop();
            }
            found
        };
        match v {
            Value::Object(map) => map.iter().any(|(k, x)| within(camel(k), x, path)),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .any(|(i, x)| within(i.to_string(), x, path)),
            Value::Number(n) => n.to_string() == quoted,
            Value::String(s) => s == quoted,
            _ => false,
        }
    }
    let quoted = message.split('`').nth(1)?;
    if message.starts_with("unknown field") || message.starts_with("missing field") {
        let field = camel(quoted);
        return Some((field.clone(), field));
    }
    let mut path = Vec::new();
    if !find(input, quoted, &mut path) {
        return None;
    }
    let field = path
        .iter()
        .rev()
        .find(|s| !s.chars().all(|c| c.is_ascii_digit()))?
        .clone();
    Some((path.join("."), field))
}

/// Object keys recased from camelCase; a key already holding `_` is refused.
fn snake_keys(v: Value, what: &str) -> Result<Value, JsonError> {
    Ok(match v {
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (k, v) in map {
                if k.contains('_') {
                    return Err(JsonError {
                        message: format!(
                            "unknown field `{k}` in the {what}; did you mean `{}`? (fields are camelCase)",
                            camel(&k)
                        ),
                        field: Some(k),
                        range: false,
                    });
                }
                out.insert(snake(&k), snake_keys(v, what)?);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| snake_keys(v, what))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        other => other,
    })
}

/// A serde message with each `` `snake_name` `` in it written as a client spells it
/// (`` `unixNowMs` ``); tags (`` `call_lease` `` after "variant") stay as written.
fn camel_quoted(message: &str) -> String {
    let keep = message.contains("variant");
    let mut out = String::with_capacity(message.len());
    for (i, part) in message.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 && !keep {
            out.push_str(&camel(part));
        } else {
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwarden_core::Input;

    #[test]
    fn reads_deep_values_up_to_the_bound() {
        let deep = |n: usize| alloc::format!("{{\"a\":{}{}}}", "[".repeat(n), "]".repeat(n));
        assert!(parse(&deep(500)).is_some());
        assert!(parse(&deep(MAX_DEPTH)).is_none(), "the object counts too");
        assert!(parse(&deep(MAX_DEPTH - 1)).is_some());
        // Brackets inside strings are text.
        assert!(parse(&alloc::format!("[\"{}\"]", "[".repeat(5000))).is_some());
        assert!(parse("[1] x").is_none());
    }

    #[test]
    fn recases_both_ways() {
        assert_eq!(camel("input_tokens_per_minute"), "inputTokensPerMinute");
        assert_eq!(snake("unixNowMs"), "unix_now_ms");
        assert_eq!(
            snake(&camel("cached_prefix_tokens")),
            "cached_prefix_tokens"
        );
    }

    #[test]
    fn names_the_field_at_fault() {
        let bad: Value = serde_json::from_str(
            r#"{"op":"request_lease","request":{"agent":1,"inputTokens":-1}}"#,
        )
        .unwrap();
        let e = from_camel::<Input>(bad, "input").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("inputTokens"), "{e:?}");
        assert!(e.message.contains("`request.inputTokens`"), "{}", e.message);
        assert!(e.range);
        let snake_key: Value =
            serde_json::from_str(r#"{"op":"settle","lease":1,"usage":{"input_tokens":3}}"#)
                .unwrap();
        let e = from_camel::<Input>(snake_key, "input").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("input_tokens"));
        assert!(e.message.contains("`inputTokens`"), "{}", e.message);
        let ok: Value =
            serde_json::from_str(r#"{"op":"settle","lease":1,"usage":{"inputTokens":3}}"#).unwrap();
        assert!(matches!(
            from_camel::<Input>(ok, "input"),
            Ok(Input::Settle { .. })
        ));
    }
}
