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

use crate::Refusal;

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

/// A serde-shaped core value with its object keys recased to camelCase (string values,
/// such as enum tags, are left alone): the JSON every host of the HTTP API answers.
#[must_use]
pub fn camel_keys(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                out.insert(camel(&k), camel_keys(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(camel_keys).collect()),
        other => other,
    }
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
    read(text).ok()
}

fn read(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let value = serde::Deserialize::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A request body that must be a JSON object, read by [`parse`]'s rule: 400 `invalid_json`
/// when it is not JSON (or nests deeper than [`MAX_DEPTH`]), 400 `invalid_argument` naming
/// the field whose number is past what a double holds (`1e400`: never read as null or
/// infinity), or when it is not an object.
pub fn parse_object(text: &str) -> Result<Map<String, Value>, Refusal> {
    let not_json = || Refusal::new(400, "invalid_json", "the request body is not JSON".into());
    let value = match parse(text) {
        Some(v) => v,
        None => {
            let e = match read(text) {
                Err(e) if e.to_string().starts_with("number out of range") => e,
                _ => return Err(not_json()),
            };
            let key = key_before(text, e.line(), e.column()).unwrap_or_default();
            return Err(Refusal::new(
                400,
                "invalid_argument",
                format!("`{key}` is a number out of range"),
            )
            .with_field(key));
        }
    };
    match value {
        Value::Object(m) => Ok(m),
        _ => Err(Refusal::new(
            400,
            "invalid_argument",
            "the request body must be a JSON object".into(),
        )),
    }
}

/// The object key whose value is at `line`:`column` (1-based, as serde_json reports an
/// error) in `text`: the string before the `:` before it.
fn key_before(text: &str, line: usize, column: usize) -> Option<String> {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    let at = (start + column).min(text.len());
    let before = text.get(..at)?.as_bytes();
    // Back over the number, then whitespace, the `:` and whitespace, to the key's end quote.
    let mut i = before.len();
    while i > 0 && !matches!(before[i - 1], b':' | b',' | b'[' | b'{') {
        i -= 1;
    }
    if i == 0 || before[i - 1] != b':' {
        return None;
    }
    i -= 1;
    while i > 0 && before[i - 1].is_ascii_whitespace() {
        i -= 1;
    }
    if i == 0 || before[i - 1] != b'"' {
        return None;
    }
    let end = i - 1;
    let mut j = end;
    while j > 0 && !(before[j - 1] == b'"' && (j < 2 || before[j - 2] != b'\\')) {
        j -= 1;
    }
    let key: String = serde_json::from_slice(before.get(j.checked_sub(1)?..=end)?).ok()?;
    Some(key)
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
    #[test]
    fn a_body_is_an_object_and_a_number_past_a_double_is_named() {
        use super::parse_object;
        assert_eq!(parse_object(r#"{"a":1}"#).unwrap()["a"], 1);
        let r = parse_object("{\"op\":\"settle\",\n \"usage\": {\"inputTokens\" : 1e400}}")
            .unwrap_err();
        assert_eq!(
            (r.status, r.code, r.field.as_deref()),
            (400, "invalid_argument", Some("inputTokens"))
        );
        assert_eq!(
            parse_object("[1e400]").unwrap_err().field.as_deref(),
            Some("")
        );
        assert_eq!(parse_object("{").unwrap_err().code, "invalid_json");
        assert_eq!(parse_object("[]").unwrap_err().code, "invalid_argument");
    }

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
