//! What the JavaScript bindings of `tokenwarden-core` share, so the napi-rs addon and the
//! wasm-bindgen build check arguments, name errors and lay out their fast paths the same
//! way (and the shared JavaScript driver cannot tell them apart):
//!
//! - argument checks: a `u64` argument is a non-negative integer below 2^64; a `number`
//!   result is exact below 2^53 ([`MAX_SAFE`]) and a `bigint` above;
//! - [`ArgError`]: the class (`Error`, `RangeError`, `TypeError`), stable code, message and
//!   offending field of every error a binding throws, built from the core's errors;
//! - [`camel`] / [`camel_keys`]: object keys in camelCase, enum tags left alone;
//! - [`handle`]: the host protocol from JavaScript, the core's `Input` decoded from
//!   camelCase JSON text (a bad field named) and handed to `Coordinator::handle`;
//! - [`io`]: the register-file layouts of the hot calls (a `Float64Array` of
//!   [`io::IO_SLOTS`] slots) with their field orders and codes, and the result held back
//!   when it needs `bigint`s;
//! - [`ERROR_CODES`]: every code an engine throws.
//!
//! The TypeScript side of this convention, `driver/ts/abi.ts`, is generated from these
//! tables by [`typescript`]; `cargo test -p tokenwarden-js-abi` fails when the committed
//! file differs (`UPDATE_ABI=1` rewrites it), and tests here check each table against the
//! core's own types and against the readers and writers below.

use serde::Deserialize;
use serde_json::{Map, Value};
use tokenwarden_core as core;

/// The largest integer a JavaScript `number` holds exactly: 2^53 − 1.
pub const MAX_SAFE: u64 = (1 << 53) - 1;

/// Every stable code an engine's errors carry (`error.code`): the core's lease, config and
/// restore errors, plus `invalid_argument` for mistyped or out-of-range arguments and
/// `internal` for a result that could not be built, and `corrupt` from the consistency
/// check.
pub const ERROR_CODES: [&str; 16] = [
    "unknown_pool",
    "unknown_lease",
    "not_granted",
    "too_large",
    "invalid_argument",
    "config_parse",
    "invalid_config",
    "snapshot_version",
    "snapshot_parse",
    "snapshot_config",
    "snapshot_corrupt",
    "unknown_task",
    "too_many_tasks",
    "forbidden",
    "internal",
    "corrupt",
];

/// The JavaScript class of an [`ArgError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// `Error`: the call was well formed but the state refuses it (unknown lease, …).
    Error,
    /// `RangeError`: a value out of range.
    Range,
    /// `TypeError`: a value of the wrong type.
    Type,
}

/// An error for a binding to throw: its class, stable code, message and offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    /// Which JavaScript error class.
    pub kind: ErrorKind,
    /// The stable code (`error.code`), the same in every binding.
    pub code: &'static str,
    /// The message, in lowercase words.
    pub message: String,
    /// The offending field (`error.field`), where there is one.
    pub field: Option<String>,
}

impl ArgError {
    /// A value outside its allowed range.
    #[must_use]
    pub fn range(code: &'static str, message: String) -> ArgError {
        ArgError {
            kind: ErrorKind::Range,
            code,
            message,
            field: None,
        }
    }

    /// A value of the wrong type (code `invalid_argument`).
    #[must_use]
    pub fn type_error(message: String) -> ArgError {
        ArgError {
            kind: ErrorKind::Type,
            code: "invalid_argument",
            message,
            field: None,
        }
    }

    /// A refusal by the state (an `Error`).
    #[must_use]
    pub fn state(code: &'static str, message: String) -> ArgError {
        ArgError {
            kind: ErrorKind::Error,
            code,
            message,
            field: None,
        }
    }

    /// Attaches the name of the offending field.
    #[must_use]
    pub fn with_field(mut self, field: impl Into<String>) -> ArgError {
        self.field = Some(field.into());
        self
    }
}

impl From<core::LeaseError> for ArgError {
    /// `too_large` is a `RangeError` naming the JavaScript field; the others are `Error`s.
    fn from(e: core::LeaseError) -> ArgError {
        let message = e.to_string();
        match e {
            core::LeaseError::TooLarge { field } => {
                ArgError::range(e.code(), message).with_field(camel(field))
            }
            _ => ArgError::state(e.code(), message),
        }
    }
}

impl From<&core::ConfigError> for ArgError {
    /// `field` is the path in the configuration JSON (`pools[1].requests_per_minute`).
    fn from(e: &core::ConfigError) -> ArgError {
        let t = ArgError::state(e.code(), e.to_string());
        if let core::ConfigError::Invalid { field, .. } = e {
            t.with_field(field.to_string())
        } else {
            t
        }
    }
}

impl From<&core::RestoreError> for ArgError {
    fn from(e: &core::RestoreError) -> ArgError {
        ArgError::state(e.code(), e.to_string())
    }
}

/// A `number` argument as a `u64`: a non-negative integer below 2^64.
#[inline]
pub fn u64_from_f64(n: f64, what: &str) -> Result<u64, ArgError> {
    // 2^64 as f64 is exact; anything at or above it does not fit. Within the range, the
    // cast back is exact only for an integer (a cast, where `fract()` is a libm call).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked: range, exact
    let v = n as u64;
    #[allow(clippy::cast_precision_loss)] // the point: equal only when exact
    if (0.0..18_446_744_073_709_551_616.0).contains(&n) && v as f64 == n {
        Ok(v)
    } else {
        Err(not_u64(n, what))
    }
}

#[cold]
fn not_u64(n: f64, what: &str) -> ArgError {
    ArgError::range(
        "invalid_argument",
        format!(
            "`{what}` must be a non-negative integer below 2^64, got {}",
            shown(n)
        ),
    )
    .with_field(what)
}

/// A `number` argument as a `u32` (pool ids, unblocks, HTTP status).
#[inline]
pub fn u32_from_f64(n: f64, what: &str) -> Result<u32, ArgError> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked: range, exact
    let v = n as u32;
    if (0.0..=f64::from(u32::MAX)).contains(&n) && f64::from(v) == n {
        Ok(v)
    } else {
        Err(not_u32(n, what))
    }
}

#[cold]
fn not_u32(n: f64, what: &str) -> ArgError {
    ArgError::range(
        "invalid_argument",
        format!("`{what}` must be an integer in 0..2^32, got {}", shown(n)),
    )
    .with_field(what)
}

/// A number for a message, without Rust's float formatting (~15 KB of wasm): integers as
/// integers, anything else by kind.
pub(crate) fn shown(n: f64) -> String {
    if n.is_nan() {
        "NaN".into()
    } else if n.is_infinite() {
        if n > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        }
    } else if n.fract() == 0.0 && n.abs() < 9.0e15 {
        #[allow(clippy::cast_possible_truncation)] // an integer below 2^53 in magnitude
        let i = n as i64;
        i.to_string()
    } else {
        "a fractional or out-of-range number".into()
    }
}

/// A `bigint` argument (its sign and 64-bit value, and whether it fit) as a `u64`.
pub fn u64_from_bigint(
    negative: bool,
    value: u64,
    lossless: bool,
    what: &str,
) -> Result<u64, ArgError> {
    if negative || !lossless {
        Err(ArgError::range(
            "invalid_argument",
            format!("`{what}` must be a bigint in 0..2^64"),
        )
        .with_field(what))
    } else {
        Ok(value)
    }
}

pub use tokenwarden_gateway::json::{camel, camel_keys};

/// A core value as JSON text with camelCase object keys, serialized straight from the
/// value (no [`Value`] in between: building one cost about 13 times the serialization for
/// a metrics object); `None` when it holds an integer above 2^53 − 1, which `JSON.parse`
/// would round (take [`camel_keys`] then). The same keys and values as
/// `camel_keys(to_value(v))`, in the value's own field order.
#[must_use]
pub fn camel_json<T: serde::Serialize>(v: &T) -> Option<String> {
    let text = serde_json::to_vec(v).ok()?;
    // One pass into one buffer: bytes are copied as they are; a key (a string followed by
    // `:`) holding an underscore is recased where it was just copied, in place.
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        match b {
            b'"' => {
                let start = out.len();
                let mut end = i + 1;
                let mut underscore = false;
                while let Some(&c) = text.get(end) {
                    match c {
                        b'"' => break,
                        b'\\' => end += 2,
                        c => {
                            underscore |= c == b'_';
                            end += 1;
                        }
                    }
                }
                let end = (end + 1).min(text.len());
                out.extend_from_slice(&text[i..end]);
                i = end;
                if underscore && text.get(i) == Some(&b':') {
                    recase_in_place(&mut out, start);
                }
            }
            b'0'..=b'9' => {
                // An integer run (serde_json writes no `+`; a `-` sign is before the run).
                let start = i;
                let mut integer = true;
                while let Some(&c) = text.get(i) {
                    if !matches!(c, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                        break;
                    }
                    integer &= c.is_ascii_digit();
                    i += 1;
                }
                let digits = &text[start..i];
                let negative = start > 0 && text[start - 1] == b'-';
                // More than 16 digits, or 16 above 2^53 − 1 (9007199254740991).
                if integer
                    && !negative
                    && (digits.len() > 16
                        || (digits.len() == 16 && digits > b"9007199254740991".as_slice()))
                {
                    return None;
                }
                out.extend_from_slice(digits);
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    // Only ASCII `_` bytes were removed and ASCII letters uppercased: still UTF-8.
    String::from_utf8(out).ok()
}

/// Recases the key `out[start..]` (a quoted JSON string) to camelCase where it lies: each
/// `_` is dropped and the byte after it uppercased, which is [`camel`] on its text.
fn recase_in_place(out: &mut Vec<u8>, start: usize) {
    let mut write = start;
    let mut upper = false;
    for read in start..out.len() {
        let c = out[read];
        if c == b'_' {
            upper = true;
            continue;
        }
        out[write] = if upper { c.to_ascii_uppercase() } else { c };
        upper = false;
        write += 1;
    }
    out.truncate(write);
}

/// Whether every integer in `v` is exact as a JavaScript `number`.
#[must_use]
pub fn all_safe(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_u64().is_none_or(|u| u <= MAX_SAFE),
        Value::Array(items) => items.iter().all(all_safe),
        Value::Object(map) => map.values().all(all_safe),
        _ => true,
    }
}

/// A serde-shaped core value with camelCase keys, or an internal error.
pub fn camel_value<T: serde::Serialize>(v: &T) -> Result<Value, ArgError> {
    serde_json::to_value(v)
        .map(camel_keys)
        .map_err(|e| ArgError::state("internal", e.to_string()))
}

/// The host protocol's input ([`core::Input`]) from JSON text with camelCase keys, as the
/// JavaScript engines' `handle` takes it (integers above 2^53 − 1 written out exactly).
/// A snake_case key is refused with the camelCase spelling, as everywhere in the JS API;
/// a malformed input is `invalid_argument` naming what serde found wrong
/// ([`tokenwarden_gateway::json::from_camel`]).
pub fn input_from_json(text: &str) -> Result<core::Input, ArgError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ArgError::type_error(format!("the input is not JSON: {e}")))?;
    tokenwarden_gateway::json::from_camel(value, "input").map_err(ArgError::from)
}

impl From<tokenwarden_gateway::json::JsonError> for ArgError {
    /// A number out of range or a name that is not one of the choices is a `RangeError`;
    /// anything else a `TypeError`; both `invalid_argument` with the field.
    fn from(e: tokenwarden_gateway::json::JsonError) -> ArgError {
        let err = if e.range {
            ArgError::range("invalid_argument", e.message)
        } else {
            ArgError::type_error(e.message)
        };
        match e.field {
            Some(field) => err.with_field(field),
            None => err,
        }
    }
}

/// The host protocol's answer ([`core::Output`]) for `input` (JSON text, camelCase keys)
/// applied at `now`: what both JavaScript engines' `handle` does before encoding the
/// [`core::Output`] as their other results (camelCase keys). Errors are thrown as every
/// other call's.
pub fn handle(c: &mut core::Coordinator, now: u64, input: &str) -> Result<core::Output, ArgError> {
    let input = input_from_json(input)?;
    Ok(c.handle(core::Millis(now), &input)?)
}

/// The provider crate, for the bindings' usage readers.
pub use tokenwarden_provider as provider;

/// `modelCall(method, target)`: which API a request is a model call of
/// ([`tokenwarden_provider::model_call`]: the path as the provider's router reads it, so no
/// look-alike passes unleased), as `anthropic_messages`, `openai_chat` or
/// `openai_responses`; `None` for a request that passes through.
#[must_use]
pub fn model_call(method: &str, target: &str) -> Option<&'static str> {
    tokenwarden_provider::model_call(method, target).map(tokenwarden_provider::Api::name)
}

pub(crate) fn usage_json(u: Option<tokenwarden_provider::Usage>) -> String {
    match u {
        None => "null".into(),
        Some(u) => format!(
            r#"{{"inputTokens":{},"cacheCreationInputTokens":{},"cacheReadInputTokens":{},"outputTokens":{}}}"#,
            u.input_tokens,
            u.cache_creation_input_tokens,
            u.cache_read_input_tokens,
            u.output_tokens
        ),
    }
}

/// Header pairs from their text (`name\nvalue\n…`, every name and value followed by a line
/// feed: how the bindings pass headers).
pub fn header_pairs(headers: &str) -> Result<Vec<(&str, &str)>, ArgError> {
    let bad = || {
        ArgError::range(
            "invalid_argument",
            "`headers` must be names and values, each followed by a line feed".into(),
        )
        .with_field("headers")
    };
    let mut pairs = Vec::new();
    if !headers.is_empty() {
        let mut lines = headers.strip_suffix('\n').ok_or_else(bad)?.split('\n');
        while let Some(name) = lines.next() {
            pairs.push((name, lines.next().ok_or_else(bad)?));
        }
    }
    Ok(pairs)
}

/// `callerIdentity(headers, base)`: who a call is by its client's session headers, and its
/// family ([`tokenwarden_provider::identity()`]), under the name `base` when the URL or a
/// credential gives one: `{"name", "parent", "root"}` as JSON text, or `null`. `headers` as
/// [`header_pairs`] reads them.
pub fn caller_identity(headers: &str, base: Option<&str>) -> Result<String, ArgError> {
    let pairs = header_pairs(headers)?;
    Ok(match tokenwarden_provider::identity(&pairs, base) {
        None => "null".into(),
        Some(who) => {
            serde_json::json!({ "name": who.name, "parent": who.parent, "root": who.root })
                .to_string()
        }
    })
}

/// `planFleet(json)`: the core's fleet sizing ([`core::plan_fleet_json`]) on a fleet
/// description in the core's snake_case JSON, answered as camelCase JSON; an error names
/// the field as the description spells it and is `invalid_argument`.
pub fn plan_fleet(json: &str) -> Result<String, ArgError> {
    let plan = core::plan_fleet_json(json).map_err(|e| {
        // The description is the core's snake_case JSON: the field is named as written.
        let field = e.field.clone();
        let message = if e.field.is_empty() {
            format!("not a fleet description: {}", e.reason)
        } else {
            format!("`{field}` {}", e.reason)
        };
        let err = ArgError::range("invalid_argument", message);
        if e.field.is_empty() {
            err
        } else {
            err.with_field(field)
        }
    })?;
    // A figure above 2^53 − 1 (demand far past a small limit) is written as it is and
    // read by `JSON.parse` rounded: a plan's figures are sizes, not ids.
    camel_json(&plan)
        .or_else(|| {
            serde_json::to_value(&plan)
                .ok()
                .and_then(|v| serde_json::to_string(&camel_keys(v)).ok())
        })
        .ok_or_else(|| ArgError::range("internal", "the plan does not serialize".into()))
}

pub mod exchange;
pub mod gateway;
pub mod members;
pub mod timeline;
pub mod waitlog;

pub mod io {
    //! The register file of the hot calls.
    use super::{ArgError, MAX_SAFE, core, u32_from_f64, u64_from_f64};

    /// The axis's code: its position in [`AXES`] (and in demand arrays).
    fn axis_index(a: core::Axis) -> u64 {
        match a {
            core::Axis::InputTokens => 0,
            core::Axis::OutputTokens => 1,
            core::Axis::Tokens => 2,
            core::Axis::Requests => 3,
        }
    }

    /// The fast path's register file: a `Float64Array` the JavaScript wrapper owns and the
    /// addon reads arguments from and writes results to, so a hot call crosses the boundary
    /// with no object to read or build (napi property access by name costs ~100 ns a field).
    /// Every slot holds an exact integer below 2^53, or −1 for "none". The slots are named
    /// in one table ([`SLOT_TABLE`]: the modules [`arg`], [`response`], [`decision`],
    /// [`settlement`], [`call`], [`report`], [`rate_axis`], [`after`]), which both sides
    /// index by. Layouts, per call:
    ///
    /// | call | arguments in | results out | returns |
    /// |---|---|---|---|
    /// | `requestLeaseIo` | [`arg::NOW`], the request from [`arg::REQUEST`] ([`LEASE_REQUEST_FIELDS`] order; role 0 worker, 1 reviewer, 2 planner) | [`decision`] (instant: expires at / eta / retry at) | `DECISION_*` |
    /// | `settleIo` | [`arg::NOW`], [`arg::LEASE`], the usage from [`arg::USAGE`] ([`USAGE_FIELDS`] order) | [`settlement`] | 0 |
    /// | `cancelIo` | [`arg::NOW`], [`arg::LEASE`] | — | 0 |
    /// | `handleTimeoutIo` | [`arg::NOW`] | — | 0 |
    /// | `pollEventIo` | — | the event's fields in declaration order | `EVENT_*`, or −1 |
    /// | `callLeaseIo` | `requestLeaseIo`'s, then the call from [`arg::CALL`] (as in [`call`]) | [`call`] | `STEP_*` |
    /// | `callResponseIo(io, headers)` | [`response`] | [`call`] with its settlement, and [`report`] | `STEP_*` |
    /// | `handleResponseIo(io, headers)` | [`response`], without the call | [`report`] | 0 |
    ///
    /// The two response calls take the headers as one string, each name and value followed
    /// by a line feed (`name\nvalue\nname\nvalue\n`): one string crosses instead of an array
    /// of pairs (a header can hold no line feed, so none is ambiguous).
    ///
    /// A result with a value above 2^53 − 1 returns `WIDE` instead; `takeWide()` then hands
    /// it over as an object with `bigint`s.
    ///
    /// Every one of these calls that returns (not one that throws) also leaves the
    /// coordinator's state after it in the last two slots ([`io_after`]): how many events
    /// `pollEvent` has to give ([`EVENTS_SLOT`]) and what `pollTimeout` answers
    /// ([`TIMEOUT_SLOT`]), so the wrapper does not cross again to ask. They hold until
    /// the next call that changes the coordinator.
    pub const IO_SLOTS: usize = 50;

    /// One table of the register file's named slots, per layout: the Rust writers and
    /// readers below index by these names, and `abi.ts` mirrors every one as
    /// `SLOT_<LAYOUT>_<NAME>` (generated from [`SLOT_TABLE`]), which the TypeScript side
    /// indexes by. A slot is an index into the `Float64Array`.
    macro_rules! slots {
        ($( $( #[doc = $doc:literal] )* $layout:ident { $( $name:ident = $i:expr ),* $(,)? } )*) => {
            $(
                $( #[doc = $doc] )*
                #[allow(missing_docs)]
                pub mod $layout {
                    $( pub const $name: usize = $i; )*
                }
            )*
            /// Every layout and its named slots, for the generated TypeScript.
            pub const SLOT_TABLE: &[(&str, &[(&str, usize)])] = &[
                $( (stringify!($layout), &[ $( (stringify!($name), $i) ),* ]) ),*
            ];
        };
    }

    slots! {
        /// The first argument slots: `now`, then (`cancelIo`, `settleIo`) the lease; then
        /// `settleIo`'s usage (`USAGE_FIELDS` order) and `requestLeaseIo`'s request
        /// (`LEASE_REQUEST_FIELDS` order, from `REQUEST`), and `callLeaseIo`'s call state.
        arg { NOW = 0, LEASE = 1, USAGE = 2, REQUEST = 1, CALL = 12 }
        /// `callResponseIo` / `handleResponseIo` arguments.
        response { NOW = 0, POOL = 1, LEASE = 2, STATUS = 3, UNIX_NOW_MS = 4, CALL = 5 }
        /// `requestLeaseIo`'s results.
        decision { LEASE = 0, INSTANT = 1, REASON = 2, AXIS = 3 }
        /// `settleIo`'s results: reserved ×4 from `RESERVED`, used ×4 from `USED`.
        settlement { RESERVED = 0, USED = 4 }
        /// `callLeaseIo` / `callResponseIo` results: the call, its step, then
        /// `callResponseIo`'s settlement (reserved ×4 from `RESERVED`, used ×4 from `USED`).
        call {
            FAILED = 0, REFUSALS = 1, LAST_RETRY_AFTER_MS = 2, LEASE = 3, INSTANT = 4,
            REASON = 5, REFUSAL = 6, REFUSAL_AXIS = 7, ATTEMPTS = 8, CHECKPOINT = 9,
            GIVE_UP_RETRY_AFTER_MS = 10, SETTLED = 11, RESERVED = 12, USED = 16, EXPECTED = 20,
        }
        /// The header report: its fields, then from `AXES` one block of `rate_axis::WIDTH`
        /// slots per axis of `RATE_AXES`.
        report {
            RECOGNISED = 21, MALFORMED = 22, RETRY_AFTER_MS = 23, RESET_AT_MS = 24,
            SHOULD_RETRY = 25, EXCEEDED = 26, AXES = 27,
        }
        /// One axis's block of the header report.
        rate_axis { LIMIT = 0, REMAINING = 1, RESET_AFTER_MS = 2, GRANULARITY = 3, WIDTH = 4 }
        /// After every register-file call that returns: the events waiting, `pollTimeout`.
        after { EVENTS = 48, TIMEOUT = 49 }
    }
    /// After a register-file call: the events waiting ([`Coordinator::pending_events`]).
    ///
    /// [`Coordinator::pending_events`]: tokenwarden_core::Coordinator::pending_events
    pub const EVENTS_SLOT: usize = after::EVENTS;
    /// After a register-file call: `pollTimeout()`'s instant, −1 for none, −2 for one
    /// above 2^53 − 1 (ask `pollTimeout()` for its `bigint`).
    pub const TIMEOUT_SLOT: usize = after::TIMEOUT;
    /// The lease was granted.
    pub const DECISION_GRANT: i32 = 0;
    /// The request was queued.
    pub const DECISION_QUEUED: i32 = 1;
    /// The request was refused for now; the instant slot says when to ask again.
    pub const DECISION_REJECT: i32 = 2;
    /// The request can never be served as asked (the instant slot is −1).
    pub const DECISION_NEVER: i32 = 3;
    /// The result does not fit a `number`: fetch it with `takeWide()`.
    pub const WIDE: i32 = 9;

    /// `requestLeaseIo`'s argument slots 1 to 11 (slot 0 is `now`): the lease request's
    /// fields by their JavaScript names, in slot order (`cachedPrefixConfirmed` is 1 or 0;
    /// an optional field is −1 when absent).
    pub const LEASE_REQUEST_FIELDS: [&str; 11] = tokenwarden_gateway::members::LEASE_REQUEST_FIELDS;
    /// `callLeaseIo`'s first call-state slot (`failed`, then `refusals`, `lastRetryAfterMs`):
    /// after `now` and the lease request.
    pub const CALL_STATE_SLOT: usize = arg::CALL;
    /// `settleIo`'s argument slots 2 to 5 (0 is `now`, 1 the lease): the usage's fields.
    pub const USAGE_FIELDS: [&str; 4] = tokenwarden_gateway::members::USAGE_FIELDS;
    /// Role codes in the `role` slot: the index in this list.
    pub const ROLES: [core::Role; 4] = [
        core::Role::Worker,
        core::Role::Reviewer,
        core::Role::Planner,
        core::Role::Auto,
    ];
    /// Reject reasons in a rejected decision's reason slot: the index in this list (the
    /// core's tags).
    pub const REJECT_REASONS: [&str; 5] = [
        "exceeds_capacity",
        "wait_too_long",
        "queue_full",
        "too_many_leases",
        "too_many_agents",
    ];
    /// Axis codes (a rejected decision's axis slot): the index in [`core::Axis::ALL`].
    pub const AXES: [core::Axis; 4] = core::Axis::ALL;
    /// A margin change's reason (slot 3 of its event): the index in this list (the core's
    /// tags).
    pub const MARGIN_REASONS: [&str; 4] = [
        "rate_limited",
        "recovered",
        "confirmed",
        "headers_disagreed",
    ];

    fn margin_reason_index(r: core::MarginReason) -> u64 {
        match r {
            core::MarginReason::RateLimited => 0,
            core::MarginReason::Recovered => 1,
            core::MarginReason::Confirmed => 2,
            core::MarginReason::HeadersDisagreed => 3,
        }
    }

    /// `pollEventIo`'s return codes: the index in this list (the core's event tags).
    pub const EVENTS: [&str; 7] = [
        "granted",
        "expired",
        "margin_changed",
        "paused",
        "estimate_alert",
        "margin_at_floor",
        "revised",
    ];

    /// The call lifecycle's step codes (`callLeaseIo`, `callResponseIo`).
    pub const STEP_SEND: i32 = 0;
    /// Wait (for a ticket's grant, or to ask again).
    pub const STEP_WAIT: i32 = 1;
    /// Hand the response over.
    pub const STEP_DELIVER: i32 = 2;
    /// Give up.
    pub const STEP_GIVE_UP: i32 = 3;
    /// A wait's reason code: the index in this list (the core's tags).
    pub const WAIT_REASONS: [&str; 4] = ["queued", "refused", "rate_limited", "overloaded"];
    /// A give-up's reason code: the index in this list (the core's tags).
    pub const GIVE_UP_REASONS: [&str; 3] = ["never_fits", "refusals", "attempts"];
    /// The header report's axes, in slot order (and `exceeded`'s code: the index here).
    pub const RATE_AXES: [&str; 5] = [
        "requests",
        "tokens",
        "input_tokens",
        "output_tokens",
        "concurrent",
    ];
    /// The header report's first slot: recognised, malformed, retry after, reset at,
    /// should retry (−1 none, 0, 1), exceeded (−1 none, else its [`RATE_AXES`] index), then
    /// per axis of [`RATE_AXES`] limit, remaining, reset after, granularity.
    pub const REPORT_SLOT: usize = report::RECOGNISED;

    /// The roles' names, in [`ROLES`] order (the core's serde tags, as objects spell them).
    pub const ROLE_NAMES: [&str; 4] = ["worker", "reviewer", "planner", "auto"];

    /// An unknown role: a `RangeError` naming the field.
    fn bad_role() -> ArgError {
        ArgError::range(
            "invalid_argument",
            "`role` must be planner, reviewer, worker or auto".into(),
        )
        .with_field("role")
    }

    /// Keeps `result` for `takeWide()` when the register file could not hold it; returns
    /// `code`. Both bindings hold a `wide` slot and call this after every writer.
    pub fn narrow(wide: &mut Option<WideResult>, code: i32, result: WideResult) -> i32 {
        if code == WIDE {
            *wide = Some(result);
        }
        code
    }

    /// Writes the coordinator's state after a call into [`EVENTS_SLOT`] and
    /// [`TIMEOUT_SLOT`]. Every binding calls it at the end of each register-file call that
    /// returns.
    pub fn io_after(io: &mut [f64], c: &core::Coordinator) {
        let events = u64::try_from(c.pending_events()).unwrap_or(u64::MAX);
        put(&mut io[EVENTS_SLOT..], &[events.min(MAX_SAFE)]);
        io[TIMEOUT_SLOT] = match c.poll_timeout() {
            None => -1.0,
            Some(t) if t.0 <= MAX_SAFE => t.0 as f64,
            Some(_) => -2.0,
        };
    }

    /// A register file with fewer than [`IO_SLOTS`] slots is refused.
    pub fn check_len(io: &[f64]) -> Result<(), ArgError> {
        if io.len() < IO_SLOTS {
            return Err(ArgError::range(
                "invalid_argument",
                format!("the io buffer needs {IO_SLOTS} slots, got {}", io.len()),
            ));
        }
        Ok(())
    }

    fn fits(values: &[u64]) -> bool {
        values.iter().all(|&v| v <= MAX_SAFE)
    }

    #[allow(clippy::cast_precision_loss)] // exact: callers check `fits` first
    fn put(io: &mut [f64], values: &[u64]) {
        for (slot, &v) in io.iter_mut().zip(values) {
            *slot = v as f64;
        }
    }

    /// A slot as a `u64` argument.
    fn slot(io: &[f64], i: usize, what: &str) -> Result<u64, ArgError> {
        u64_from_f64(io[i], what)
    }

    /// An optional slot: −1 is "none".
    fn opt_slot(io: &[f64], i: usize, what: &str) -> Result<Option<u64>, ArgError> {
        if io[i] == -1.0 {
            Ok(None)
        } else {
            slot(io, i, what).map(Some)
        }
    }

    /// The index of `name` in `list` (at compile time: a name not there fails the build).
    const fn index_of(list: &[&str], name: &str) -> usize {
        let mut i = 0;
        while i < list.len() {
            let (a, b) = (list[i].as_bytes(), name.as_bytes());
            if a.len() == b.len() {
                let mut j = 0;
                while j < a.len() && a[j] == b[j] {
                    j += 1;
                }
                if j == a.len() {
                    return i;
                }
            }
            i += 1;
        }
        panic!("no such field")
    }

    /// The slot of a lease-request field, by its name in [`LEASE_REQUEST_FIELDS`]. Call it in
    /// a `const { … }` block: evaluated at run time it compares strings (the wasm build,
    /// optimised for size, does not fold it), 15 % of a wasm `requestLease + settle`.
    const fn req(name: &str) -> usize {
        arg::REQUEST + index_of(&LEASE_REQUEST_FIELDS, name)
    }

    /// The slot of a usage field, by its name in [`USAGE_FIELDS`] (in a `const { … }` block, as `req`).
    const fn usage(name: &str) -> usize {
        arg::USAGE + index_of(&USAGE_FIELDS, name)
    }

    /// Reads `now` ([`arg::NOW`]).
    pub fn io_now(io: &[f64]) -> Result<core::Millis, ArgError> {
        slot(io, arg::NOW, "now").map(core::Millis)
    }

    /// Reads `requestLeaseIo`'s arguments.
    pub fn io_lease_request(io: &[f64]) -> Result<core::LeaseRequest, ArgError> {
        Ok(core::LeaseRequest {
            agent: core::AgentId(slot(io, const { req("agent") }, "agent")?),
            pool: core::PoolId(u32_from_f64(io[const { req("pool") }], "pool")?),
            input_tokens: slot(io, const { req("inputTokens") }, "inputTokens")?,
            cached_prefix_tokens: slot(
                io,
                const { req("cachedPrefixTokens") },
                "cachedPrefixTokens",
            )?,
            max_tokens: slot(io, const { req("maxTokens") }, "maxTokens")?,
            role: u32_from_f64(io[const { req("role") }], "role")
                .ok()
                .and_then(|i| ROLES.get(i as usize).copied())
                .ok_or_else(bad_role)?,
            unblocks: u32_from_f64(io[const { req("unblocks") }], "unblocks")?,
            failure_signature: opt_slot(io, const { req("failureSignature") }, "failureSignature")?,
            task: opt_slot(io, const { req("task") }, "task")?.map(core::TaskId),
            family: opt_slot(io, const { req("family") }, "family")?.map(core::AgentId),
            cached_prefix_confirmed: match io[const { req("cachedPrefixConfirmed") }] {
                0.0 => false,
                1.0 => true,
                _ => {
                    return Err(ArgError::type_error(
                        "`cachedPrefixConfirmed` must be a boolean".into(),
                    )
                    .with_field("cachedPrefixConfirmed"));
                }
            },
        })
    }

    /// Writes a decision; `WIDE` when an instant does not fit a `number`.
    pub fn io_decision(io: &mut [f64], d: &core::Decision) -> i32 {
        let none = u64::MAX; // written as −1 below
        let (code, lease, at, reason, axis_index) = match *d {
            core::Decision::Grant { lease, expires_at } => {
                (DECISION_GRANT, lease.0, expires_at.0, 0, 0)
            }
            core::Decision::Queued { lease, eta } => (DECISION_QUEUED, lease.0, eta.0, 0, 0),
            core::Decision::Reject { retry_at, reason } => {
                let (r, a) = reject_code(reason);
                (DECISION_REJECT, 0, retry_at.0, r, a)
            }
            core::Decision::NeverFits { reason } => {
                let (r, a) = reject_code(reason);
                (DECISION_NEVER, 0, none, r, a)
            }
        };
        if at != none && !fits(&[at]) {
            return WIDE;
        }
        put(&mut io[decision::LEASE..], &[lease]);
        put(&mut io[decision::INSTANT..], &[at]);
        put(&mut io[decision::REASON..], &[reason]);
        put(&mut io[decision::AXIS..], &[axis_index]);
        if at == none {
            io[decision::INSTANT] = -1.0;
        }
        code
    }

    /// Reads the lease id ([`arg::LEASE`], `cancelIo`).
    pub fn io_lease(io: &[f64]) -> Result<core::LeaseId, ArgError> {
        slot(io, arg::LEASE, "lease").map(core::LeaseId)
    }

    /// Reads `settleIo`'s arguments.
    pub fn io_settle(io: &[f64]) -> Result<(core::LeaseId, core::Usage), ArgError> {
        let field = |name: &str, i: usize| slot(io, i, name);
        Ok((
            core::LeaseId(slot(io, arg::LEASE, "lease")?),
            core::Usage {
                input_tokens: field("inputTokens", const { usage("inputTokens") })?,
                cache_creation_input_tokens: field(
                    "cacheCreationInputTokens",
                    const { usage("cacheCreationInputTokens") },
                )?,
                cache_read_input_tokens: field(
                    "cacheReadInputTokens",
                    const { usage("cacheReadInputTokens") },
                )?,
                output_tokens: field("outputTokens", const { usage("outputTokens") })?,
            },
        ))
    }

    /// Writes a settlement; `WIDE` when an amount does not fit a `number`.
    pub fn io_settlement(io: &mut [f64], s: &core::Settlement) -> i32 {
        if !fits(&s.reserved.0) || !fits(&s.used.0) {
            return WIDE;
        }
        put(&mut io[settlement::RESERVED..], &s.reserved.0);
        put(&mut io[settlement::USED..], &s.used.0);
        0
    }

    /// Granted, expired, margin changed, paused, estimate alert, margin at floor, revised:
    /// `pollEventIo`'s codes (the index in [`EVENTS`]).
    pub const EVENT_GRANTED: i32 = 0;

    /// Writes an event; `WIDE` when a field does not fit a `number`.
    pub fn io_event(io: &mut [f64], e: &core::Event) -> i32 {
        let (code, fields): (i32, [u64; 5]) = match *e {
            core::Event::Granted {
                lease,
                agent,
                pool,
                expires_at,
                waited_ms,
            } => (
                EVENT_GRANTED,
                [lease.0, agent.0, u64::from(pool.0), expires_at.0, waited_ms],
            ),
            core::Event::Expired { lease, agent, pool } => {
                (1, [lease.0, agent.0, u64::from(pool.0), 0, 0])
            }
            core::Event::MarginChanged {
                pool,
                from_permille,
                to_permille,
                reason,
            } => (
                2,
                [
                    u64::from(pool.0),
                    u64::from(from_permille),
                    u64::from(to_permille),
                    margin_reason_index(reason),
                    0,
                ],
            ),
            core::Event::Paused { pool, until } => (3, [u64::from(pool.0), until.0, 0, 0, 0]),
            core::Event::EstimateAlert {
                agent,
                error_permille,
            } => (4, [agent.0, u64::from(error_permille), 0, 0, 0]),
            // The axis slot: its index in `AXES`, or 4 when no usage named one.
            core::Event::MarginAtFloor {
                pool,
                axis,
                margin_permille,
                since,
            } => (
                5,
                [
                    u64::from(pool.0),
                    axis.map_or(4, axis_index),
                    u64::from(margin_permille),
                    since.0,
                    0,
                ],
            ),
            core::Event::Revised {
                lease,
                agent,
                pool,
                eta,
            } => (6, [lease.0, agent.0, u64::from(pool.0), eta.0, 0]),
        };
        if !fits(&fields) {
            return WIDE;
        }
        put(io, &fields);
        code
    }

    fn reject_code(r: core::RejectReason) -> (u64, u64) {
        match r {
            core::RejectReason::ExceedsCapacity { axis: a } => (0, axis_index(a)),
            core::RejectReason::WaitTooLong => (1, 0),
            core::RejectReason::QueueFull => (2, 0),
            core::RejectReason::TooManyLeases => (3, 0),
            core::RejectReason::TooManyAgents => (4, 0),
        }
    }

    /// Slot writes that remember whether every value fitted a `number`.
    struct Slots<'a> {
        io: &'a mut [f64],
        fits: bool,
    }

    impl Slots<'_> {
        #[allow(clippy::cast_precision_loss)] // exact: checked against MAX_SAFE
        fn set(&mut self, i: usize, v: u64) {
            if v > MAX_SAFE {
                self.fits = false;
            }
            self.io[i] = v as f64;
        }
        fn opt(&mut self, i: usize, v: Option<u64>) {
            match v {
                Some(v) => self.set(i, v),
                None => self.io[i] = -1.0,
            }
        }
    }

    /// Reads a call's state from `at` on, laid out as in the results (failed, refusals,
    /// last Retry-After: [`call::FAILED`] and on).
    fn io_call_at(io: &[f64], at: usize) -> Result<core::Call, ArgError> {
        Ok(core::Call {
            failed: u32_from_f64(io[at + call::FAILED], "failed")?,
            refusals: u32_from_f64(io[at + call::REFUSALS], "refusals")?,
            last_retry_after_ms: opt_slot(io, at + call::LAST_RETRY_AFTER_MS, "lastRetryAfterMs")?,
        })
    }

    /// Reads `callLeaseIo`'s arguments: `now`, the request, the call.
    pub fn io_call_lease(
        io: &[f64],
    ) -> Result<(core::Millis, core::LeaseRequest, core::Call), ArgError> {
        Ok((
            io_now(io)?,
            io_lease_request(io)?,
            io_call_at(io, arg::CALL)?,
        ))
    }

    /// The arguments of `callResponseIo` and `handleResponseIo`, the headers parsed.
    pub struct ResponseIo {
        /// Slot 0.
        pub now: core::Millis,
        /// Slot 1.
        pub pool: core::PoolId,
        /// Slot 2 (−1: none).
        pub lease: Option<core::LeaseId>,
        /// Slot 3.
        pub status: u16,
        /// What the headers said (slot 4, Unix now, for absolute reset times).
        pub report: core::HeaderReport,
    }

    /// Reads the response calls' arguments, parsing `headers` (see the table above).
    pub fn io_response(io: &[f64], headers: &str) -> Result<ResponseIo, ArgError> {
        let status =
            u16::try_from(u32_from_f64(io[response::STATUS], "status")?).map_err(|_| {
                ArgError::range("invalid_argument", "`status` must be below 65536".into())
                    .with_field("status")
            })?;
        let unix = opt_slot(io, response::UNIX_NOW_MS, "unixNowMs")?;
        let pairs = super::header_pairs(headers)?;
        Ok(ResponseIo {
            now: slot(io, response::NOW, "now").map(core::Millis)?,
            pool: core::PoolId(u32_from_f64(io[response::POOL], "pool")?),
            lease: opt_slot(io, response::LEASE, "lease")?.map(core::LeaseId),
            status,
            report: core::parse_headers(pairs, unix),
        })
    }

    /// Reads `callResponseIo`'s call (from [`response::CALL`]).
    pub fn io_response_call(io: &[f64]) -> Result<core::Call, ArgError> {
        io_call_at(io, response::CALL)
    }

    /// Writes a call and its step; returns the `STEP_*` code, or `WIDE`.
    pub fn io_call_step(io: &mut [f64], call: &core::Call, step: &core::CallStep) -> i32 {
        let mut w = Slots { io, fits: true };
        w.set(call::FAILED, u64::from(call.failed));
        w.set(call::REFUSALS, u64::from(call.refusals));
        w.opt(call::LAST_RETRY_AFTER_MS, call.last_retry_after_ms);
        for i in [
            call::LEASE,
            call::INSTANT,
            call::REASON,
            call::REFUSAL,
            call::GIVE_UP_RETRY_AFTER_MS,
            call::EXPECTED,
        ] {
            w.io[i] = -1.0;
        }
        for i in [call::REFUSAL_AXIS, call::ATTEMPTS, call::CHECKPOINT] {
            w.io[i] = 0.0;
        }
        let refusal = |w: &mut Slots<'_>, r: Option<core::RejectReason>| {
            if let Some(r) = r {
                let (code, axis) = reject_code(r);
                w.set(call::REFUSAL, code);
                w.set(call::REFUSAL_AXIS, axis);
            }
        };
        let code = match *step {
            core::CallStep::Send { lease, expires_at } => {
                w.set(call::LEASE, lease.0);
                w.set(call::INSTANT, expires_at.0);
                STEP_SEND
            }
            core::CallStep::Wait(core::Wait {
                until,
                expected,
                reason,
                ticket,
                refusal: r,
                attempt,
                checkpoint,
            }) => {
                w.opt(call::LEASE, ticket.map(|t| t.0));
                w.set(call::INSTANT, until.0);
                w.set(call::EXPECTED, expected.0);
                w.set(call::REASON, wait_code(reason));
                refusal(&mut w, r);
                w.set(call::ATTEMPTS, u64::from(attempt));
                w.set(call::CHECKPOINT, u64::from(checkpoint));
                STEP_WAIT
            }
            core::CallStep::Deliver => STEP_DELIVER,
            core::CallStep::GiveUp(core::GiveUp {
                reason,
                refusal: r,
                attempts,
                last_retry_after_ms,
            }) => {
                w.set(call::REASON, give_up_code(reason));
                refusal(&mut w, r);
                w.set(call::ATTEMPTS, u64::from(attempts));
                w.opt(call::GIVE_UP_RETRY_AFTER_MS, last_retry_after_ms);
                STEP_GIVE_UP
            }
        };
        if w.fits { code } else { WIDE }
    }

    /// Writes `callResponseIo`'s settlement ([`call::SETTLED`], [`call::RESERVED`],
    /// [`call::USED`]); false if it needs `bigint`s.
    pub fn io_settled(io: &mut [f64], settled: Option<&core::Settlement>) -> bool {
        let mut w = Slots { io, fits: true };
        let (flag, reserved, used) =
            settled.map_or((0, [0; 4], [0; 4]), |s| (1, s.reserved.0, s.used.0));
        w.set(call::SETTLED, flag);
        for (i, (&r, &u)) in reserved.iter().zip(&used).enumerate() {
            w.set(call::RESERVED + i, r);
            w.set(call::USED + i, u);
        }
        w.fits
    }

    /// Writes a header report from [`REPORT_SLOT`]; false if it needs `bigint`s.
    pub fn io_report(io: &mut [f64], r: &core::HeaderReport) -> bool {
        let mut w = Slots { io, fits: true };
        w.set(report::RECOGNISED, u64::from(r.recognised));
        w.set(report::MALFORMED, u64::from(r.malformed));
        w.opt(report::RETRY_AFTER_MS, r.retry_after_ms);
        w.opt(report::RESET_AT_MS, r.reset_at_ms);
        w.opt(report::SHOULD_RETRY, r.should_retry.map(u64::from));
        w.opt(
            report::EXCEEDED,
            r.exceeded.map(|a| rate_axis_index(a) as u64),
        );
        for (i, axis) in RATE_AXIS_ORDER.iter().enumerate() {
            let a = r.axis(*axis);
            let base = report::AXES + rate_axis::WIDTH * i;
            w.opt(base + rate_axis::LIMIT, a.limit);
            w.opt(base + rate_axis::REMAINING, a.remaining);
            w.opt(base + rate_axis::RESET_AFTER_MS, a.reset_after_ms);
            w.set(base + rate_axis::GRANULARITY, a.granularity);
        }
        w.fits
    }

    fn wait_code(r: core::WaitReason) -> u64 {
        match r {
            core::WaitReason::Queued => 0,
            core::WaitReason::Refused => 1,
            core::WaitReason::RateLimited => 2,
            core::WaitReason::Overloaded => 3,
        }
    }

    fn give_up_code(r: core::GiveUpReason) -> u64 {
        match r {
            core::GiveUpReason::NeverFits => 0,
            core::GiveUpReason::Refusals => 1,
            core::GiveUpReason::Attempts => 2,
        }
    }

    const RATE_AXIS_ORDER: [core::headers::RateAxis; 5] = [
        core::headers::RateAxis::Requests,
        core::headers::RateAxis::Tokens,
        core::headers::RateAxis::InputTokens,
        core::headers::RateAxis::OutputTokens,
        core::headers::RateAxis::Concurrent,
    ];

    fn rate_axis_index(a: core::headers::RateAxis) -> usize {
        RATE_AXIS_ORDER.iter().position(|x| *x == a).unwrap_or(0)
    }

    /// The register file's calls, each as both bindings run it: read the arguments from
    /// `io`, apply them to `c`, write the results and the state after ([`io_after`]) into
    /// `io`, and answer the code (a result that needs `bigint`s held in `wide`). A binding
    /// only finds its register file and turns an error into its own exception.
    pub mod run {
        use super::{
            ArgError, ResponseIo, WIDE, WideResult, core, io_after, io_call_lease, io_call_step,
            io_decision, io_event, io_lease, io_lease_request, io_now, io_report, io_response_call,
            io_settle, io_settled, io_settlement, narrow,
        };

        /// A binding's coordinator, register file and held-back result.
        pub type Parts<'a> = (
            &'a mut core::Coordinator,
            &'a mut [f64],
            &'a mut Option<WideResult>,
        );

        /// `requestLeaseIo`: `DECISION_*`, or `WIDE`.
        pub fn request_lease((c, io, wide): Parts<'_>) -> Result<i32, ArgError> {
            let (now, req) = (io_now(io)?, io_lease_request(io)?);
            let d = c.request_lease(now, &req)?;
            io_after(io, c);
            Ok(narrow(wide, io_decision(io, &d), WideResult::Decision(d)))
        }

        /// `settleIo`: 0, or `WIDE`.
        pub fn settle((c, io, wide): Parts<'_>) -> Result<i32, ArgError> {
            let now = io_now(io)?;
            let (lease, usage) = io_settle(io)?;
            let s = c.settle(now, lease, &usage)?;
            io_after(io, c);
            Ok(narrow(
                wide,
                io_settlement(io, &s),
                WideResult::Settlement(s),
            ))
        }

        /// `cancelIo` (now, lease).
        pub fn cancel((c, io, _): Parts<'_>) -> Result<(), ArgError> {
            c.cancel(io_now(io)?, io_lease(io)?)?;
            io_after(io, c);
            Ok(())
        }

        /// `handleTimeoutIo` (now).
        pub fn handle_timeout((c, io, _): Parts<'_>) -> Result<(), ArgError> {
            c.handle_timeout(io_now(io)?);
            io_after(io, c);
            Ok(())
        }

        /// `pollEventIo`: the event's code, −1 for none, or `WIDE`.
        pub fn poll_event((c, io, wide): Parts<'_>) -> i32 {
            let code = match c.poll_event() {
                None => -1,
                Some(e) => narrow(wide, io_event(io, &e), WideResult::Event(e)),
            };
            io_after(io, c);
            code
        }

        /// `callLeaseIo`: a `STEP_*` code, or `WIDE`.
        pub fn call_lease((c, io, wide): Parts<'_>) -> Result<i32, ArgError> {
            let (now, req, mut call) = io_call_lease(io)?;
            let step: core::CallStep = c.call_lease(now, &mut call, &req)?.into();
            io_after(io, c);
            let code = io_call_step(io, &call, &step);
            Ok(narrow(wide, code, WideResult::CallLease(call, step)))
        }

        /// `callResponseIo`, the response's slots and headers read into `r`: a `STEP_*`
        /// code, or `WIDE`.
        pub fn call_response((c, io, wide): Parts<'_>, r: ResponseIo) -> Result<i32, ArgError> {
            let mut call = io_response_call(io)?;
            let a = c.call_response(r.now, &mut call, r.pool, r.lease, r.status, &r.report)?;
            let mut code = io_call_step(io, &call, &a.step.into());
            if !io_settled(io, a.settled.as_ref()) || !io_report(io, &r.report) {
                code = WIDE;
            }
            io_after(io, c);
            Ok(narrow(
                wide,
                code,
                WideResult::CallResponse(call, a, r.report),
            ))
        }

        /// `handleResponseIo`, the response read into `r`: 0, or `WIDE`.
        pub fn handle_response((c, io, wide): Parts<'_>, r: ResponseIo) -> Result<i32, ArgError> {
            c.handle_response(r.now, r.pool, r.lease, r.status, &r.report)?;
            let code = if io_report(io, &r.report) { 0 } else { WIDE };
            io_after(io, c);
            Ok(narrow(wide, code, WideResult::Report(r.report)))
        }
    }

    /// A result held back from the fast path because it needs `bigint`s.
    #[derive(Debug, Clone, Copy)]
    pub enum WideResult {
        /// From `requestLeaseIo`.
        Decision(core::Decision),
        /// From `settleIo`.
        Settlement(core::Settlement),
        /// From `pollEventIo`.
        Event(core::Event),
        /// From `callLeaseIo`.
        CallLease(core::Call, core::CallStep),
        /// From `callResponseIo`.
        CallResponse(core::Call, core::CallResponse, core::HeaderReport),
        /// From `handleResponseIo`.
        Report(core::HeaderReport),
    }

    impl WideResult {
        /// The result as the object path answers it (the decision, settlement or event;
        /// `{ call, step }`, `{ call, step, settled, report }`, the report): what
        /// `takeWide()` returns, recased by the binding.
        #[must_use]
        pub fn json(&self) -> serde_json::Value {
            let v = match self {
                WideResult::Decision(d) => serde_json::to_value(d),
                WideResult::Settlement(s) => serde_json::to_value(s),
                WideResult::Event(e) => serde_json::to_value(e),
                WideResult::CallLease(call, step) => {
                    Ok(serde_json::json!({ "call": call, "step": step }))
                }
                WideResult::CallResponse(call, a, report) => Ok(serde_json::json!({
                    "call": call, "step": a.step, "settled": a.settled, "report": report
                })),
                WideResult::Report(r) => serde_json::to_value(r),
            };
            // The core's types serialize without fail (no maps with non-string keys).
            v.unwrap_or(serde_json::Value::Null)
        }
    }
}

mod ts;
pub use ts::typescript;

#[cfg(test)]
mod tests;

/// The encoding named `encoding` (`o200k_base` or `cl100k_base`), for `tokenizer`.
pub fn encoding(encoding: &str) -> Result<tokenwarden_provider::bpe::Encoding, ArgError> {
    tokenwarden_provider::bpe::Encoding::from_name(encoding).ok_or_else(|| {
        ArgError::range(
            "invalid_argument",
            format!("`encoding` must be o200k_base or cl100k_base, got {encoding:?}"),
        )
        .with_field("encoding")
    })
}

/// A tokenizer for `encoding` from its ranks file (`provider/data/<encoding>.bpe`, shipped
/// beside the bindings): a ranks file that is not that encoding's is refused as
/// `invalid_argument` on `ranks`, with what is wrong with it.
pub fn tokenizer(encoding: &str, ranks: &[u8]) -> Result<tokenwarden_provider::bpe::Bpe, ArgError> {
    let e = self::encoding(encoding)?;
    tokenwarden_provider::bpe::Bpe::new(e, ranks).map_err(|why| {
        ArgError::range("invalid_argument", format!("{e} ranks: {why}")).with_field("ranks")
    })
}

/// The estimator's options as the bindings take them: camelCase JSON (`{}`: the defaults),
/// unknown fields refused.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EstimatorOptions {
    initial_bytes_per_token: Option<f64>,
    initial_tokens_per_proxy_token: Option<f64>,
    learning_rate: Option<f64>,
    safety: Option<f64>,
    cached_prefixes: Option<u64>,
    min_cache_tokens: Option<u64>,
    tokenizer: Option<bool>,
}

/// An estimator ([`tokenwarden_provider::estimate::Estimator`]) from its options' JSON
/// text.
pub fn estimator(options: &str) -> Result<tokenwarden_provider::estimate::Estimator, ArgError> {
    use tokenwarden_provider::estimate::{Estimator, Options};
    let o: EstimatorOptions = serde_json::from_str(options).map_err(|e| {
        ArgError::range("invalid_argument", format!("estimator options: {e}")).with_field("options")
    })?;
    let d = Options::default();
    let options = Options {
        initial_bytes_per_token: o
            .initial_bytes_per_token
            .unwrap_or(d.initial_bytes_per_token),
        initial_tokens_per_proxy_token: o
            .initial_tokens_per_proxy_token
            .unwrap_or(d.initial_tokens_per_proxy_token),
        learning_rate: o.learning_rate.unwrap_or(d.learning_rate),
        safety: o.safety.unwrap_or(d.safety),
        cached_prefixes: o.cached_prefixes.map_or(d.cached_prefixes, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        }),
        min_cache_tokens: o.min_cache_tokens.unwrap_or(d.min_cache_tokens),
        tokenizer: o.tokenizer.unwrap_or(d.tokenizer),
    };
    Estimator::new(options)
        .map_err(|e| ArgError::range("invalid_argument", e.to_string()).with_field(e.field))
}

/// The provider named `name` (`anthropic` or `openai`).
pub fn estimate_provider(name: &str) -> Result<tokenwarden_provider::estimate::Provider, ArgError> {
    tokenwarden_provider::estimate::Provider::from_name(name).ok_or_else(|| {
        ArgError::range(
            "invalid_argument",
            format!("`provider` must be anthropic or openai, got {name:?}"),
        )
        .with_field("provider")
    })
}

/// A request body's JSON text, parsed: it must be a JSON object.
pub fn request_body(text: &str) -> Result<Value, ArgError> {
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(ArgError::range(
            "invalid_argument",
            "the request body must be a JSON object".into(),
        )
        .with_field("body")),
        Err(e) => Err(ArgError::range(
            "invalid_argument",
            format!("the request body is not JSON: {e}"),
        )
        .with_field("body")),
    }
}

/// `estimate(now, provider, model, body)`: `{"id","inputTokens","cachedPrefixTokens",
/// "cachedPrefixConfirmed"}` as JSON text.
pub fn estimate(
    e: &mut tokenwarden_provider::estimate::Estimator,
    now: f64,
    provider: &str,
    model: &str,
    body: &str,
) -> Result<String, ArgError> {
    let now = u64_of(now, "now")?;
    let provider = estimate_provider(provider)?;
    let (id, est) = e
        .estimate_text(now, provider, model, body)
        .map_err(|why| ArgError::range("invalid_argument", why).with_field("body"))?;
    Ok(format!(
        r#"{{"id":{id},"inputTokens":{},"cachedPrefixTokens":{},"cachedPrefixConfirmed":{}}}"#,
        est.input_tokens, est.cached_prefix_tokens, est.cached_prefix_confirmed
    ))
}

/// A settled call's usage as the estimator takes it: camelCase JSON
/// (`{inputTokens, cacheReadInputTokens, cacheCreationInputTokens, outputTokens}`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObservedUsage {
    #[serde(default)]
    input_tokens: f64,
    #[serde(default)]
    cache_read_input_tokens: f64,
    #[serde(default)]
    cache_creation_input_tokens: f64,
    #[serde(default)]
    output_tokens: f64,
}

/// `observe(id, now, provider, model, body, actual, usage)`: learns from a settled call.
/// `body` (its JSON text) is needed only when the estimate is no longer remembered: then
/// `false` without it (call again with it), `true` once learned from.
#[allow(clippy::too_many_arguments)]
pub fn observe(
    e: &mut tokenwarden_provider::estimate::Estimator,
    id: f64,
    now: f64,
    provider: &str,
    model: &str,
    body: Option<&str>,
    actual: f64,
    usage: Option<&str>,
) -> Result<bool, ArgError> {
    let id = u64_of(id, "id")?;
    let now = u64_of(now, "now")?;
    let provider = estimate_provider(provider)?;
    let actual = if actual.is_finite() && actual > 0.0 {
        u64_of(actual.floor(), "actualInputTokens")?
    } else {
        0
    };
    let usage = match usage {
        None => None,
        Some(text) => {
            let u: ObservedUsage = serde_json::from_str(text).map_err(|err| {
                ArgError::range("invalid_argument", format!("usage: {err}")).with_field("usage")
            })?;
            let n = |x: f64| {
                if x.is_finite() && x > 0.0 {
                    x as u64
                } else {
                    0
                }
            };
            Some(tokenwarden_provider::Usage {
                input_tokens: n(u.input_tokens),
                cache_read_input_tokens: n(u.cache_read_input_tokens),
                cache_creation_input_tokens: n(u.cache_creation_input_tokens),
                output_tokens: n(u.output_tokens),
            })
        }
    };
    let body = match body {
        Some(text) => Some(request_body(text)?),
        None => None,
    };
    Ok(e.observe(
        id,
        now,
        provider,
        model,
        body.as_ref(),
        actual,
        usage.as_ref(),
    ))
}

/// A non-negative integral `f64` from JavaScript as `u64`.
fn u64_of(x: f64, field: &'static str) -> Result<u64, ArgError> {
    if x.is_finite() && x >= 0.0 && x.fract() == 0.0 && x <= 9_007_199_254_740_991.0 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(x as u64)
    } else {
        Err(ArgError::range(
            "invalid_argument",
            format!("`{field}` must be a non-negative integer, got {x}"),
        )
        .with_field(field))
    }
}

/// The fields of a request body `callShape` reads; the rest of the body is skipped
/// unparsed.
#[derive(Deserialize)]
struct ShapeFields {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    max_tokens: Option<Value>,
    #[serde(default)]
    max_output_tokens: Option<Value>,
    #[serde(default)]
    max_completion_tokens: Option<Value>,
    #[serde(default)]
    stream: Option<Value>,
}

/// `callShape(provider, body)`: `{"model","maxTokens","stream"}` as JSON text (the
/// provider crate's `call_shape`, on the few fields it reads).
pub fn call_shape(provider: &str, body: &str) -> Result<String, ArgError> {
    let provider = estimate_provider(provider)?;
    let f: ShapeFields = match serde_json::from_str(body) {
        Ok(f) => f,
        Err(_) => {
            // Not an object of those fields: say why as the full parse does.
            request_body(body)?;
            return Err(ArgError::range(
                "invalid_argument",
                "the request body must be a JSON object".into(),
            )
            .with_field("body"));
        }
    };
    let mut o = Map::new();
    for (k, v) in [
        ("model", f.model),
        ("max_tokens", f.max_tokens),
        ("max_output_tokens", f.max_output_tokens),
        ("max_completion_tokens", f.max_completion_tokens),
        ("stream", f.stream),
    ] {
        if let Some(v) = v {
            o.insert(k.into(), v);
        }
    }
    let s = tokenwarden_provider::estimate::call_shape(provider, &Value::Object(o));
    Ok(format!(
        r#"{{"model":{},"maxTokens":{},"stream":{}}}"#,
        Value::String(s.model),
        s.max_tokens,
        s.stream
    ))
}

/// `promptBytes(provider, body)`: `{"prefix","rest"}` as JSON text (see
/// [`tokenwarden_provider::estimate::prompt_bytes`]).
pub fn prompt_bytes(provider: &str, body: &str) -> Result<String, ArgError> {
    let provider = estimate_provider(provider)?;
    let body = request_body(body)?;
    let (prefix, rest) = tokenwarden_provider::estimate::prompt_bytes(provider, &body);
    Ok(format!(r#"{{"prefix":{prefix},"rest":{rest}}}"#))
}

/// `knowsPrefixOf(provider, model, body)`.
pub fn knows_prefix_of(
    e: &tokenwarden_provider::estimate::Estimator,
    provider: &str,
    model: &str,
    body: &str,
) -> Result<bool, ArgError> {
    Ok(e.knows_prefix_of(estimate_provider(provider)?, model, &request_body(body)?))
}

/// `recordPromptTokens(provider, model, body, tokens)`.
pub fn record_prompt_tokens(
    e: &mut tokenwarden_provider::estimate::Estimator,
    provider: &str,
    model: &str,
    body: &str,
    tokens: f64,
) -> Result<(), ArgError> {
    let tokens = u64_of(tokens, "tokens")?;
    e.record_prompt_tokens(
        estimate_provider(provider)?,
        model,
        &request_body(body)?,
        tokens,
    );
    Ok(())
}

/// `ratios(provider, model)`: units per token by class (prose, code, CJK, document).
pub fn ratios(
    e: &tokenwarden_provider::estimate::Estimator,
    provider: &str,
    model: &str,
) -> Result<Vec<f64>, ArgError> {
    Ok(e.ratios(estimate_provider(provider)?, model).to_vec())
}

/// `needsTokenizer(provider, model)`: the encoding an estimate needs and has not been
/// given, or `None`.
pub fn needs_tokenizer(
    e: &tokenwarden_provider::estimate::Estimator,
    provider: &str,
    model: &str,
) -> Result<Option<&'static str>, ArgError> {
    Ok(e.needs_tokenizer(estimate_provider(provider)?, model)
        .map(tokenwarden_provider::bpe::Encoding::name))
}

/// The arguments of an error in a provider's format: the provider, the status (100–599)
/// and tokenwarden's fields (a JSON object's text).
fn error_parts(
    provider: &str,
    status: f64,
    tokenwarden: &str,
) -> Result<(tokenwarden_provider::estimate::Provider, u16, Value), ArgError> {
    let provider = estimate_provider(provider)?;
    let status = u16::try_from(u64_of(status, "status")?)
        .ok()
        .filter(|s| (100..=599).contains(s))
        .ok_or_else(|| {
            ArgError::range(
                "invalid_argument",
                format!("`status` must be an HTTP status (100 to 599), got {status}"),
            )
            .with_field("status")
        })?;
    let fields = match serde_json::from_str::<Value>(tokenwarden) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return Err(ArgError::range(
                "invalid_argument",
                "`tokenwarden` must be a JSON object's text".into(),
            )
            .with_field("tokenwarden"));
        }
    };
    Ok((provider, status, fields))
}

/// `errorAnswer(provider, status, type, message, tokenwarden, stream)`: an error in the
/// provider's format — a body (JSON text, [`tokenwarden_provider::errors::error_body`]) or,
/// with `stream`, one event of its stream format
/// ([`tokenwarden_provider::errors::error_event`]).
pub fn error_answer(
    provider: &str,
    status: f64,
    kind: Option<&str>,
    message: &str,
    tokenwarden: &str,
    stream: bool,
) -> Result<String, ArgError> {
    use tokenwarden_provider::errors::{error_body, error_event};
    let (provider, status, fields) = error_parts(provider, status, tokenwarden)?;
    Ok(if stream {
        error_event(provider, status, kind, message, &fields)
    } else {
        serde_json::to_string(&error_body(provider, status, kind, message, &fields))
            .unwrap_or_default()
    })
}

/// `stopAnswer(stop, retryAfterMs)`: how tokenwarden answers a call it stops
/// ([`tokenwarden_provider::errors::Stop`], by name): `[status, retry-after seconds or -1,
/// x-should-retry 1 / 0, or -1 to leave it out]`.
pub fn stop_answer(stop: &str, retry_after_ms: Option<f64>) -> Result<[f64; 3], ArgError> {
    let ms = retry_after_ms
        .map(|v| u64_of(v, "retryAfterMs"))
        .transpose()?;
    let s = tokenwarden_provider::errors::Stop::named(stop, ms).ok_or_else(|| {
        ArgError::range(
            "invalid_argument",
            format!("`stop` must be refused, gave_up, unknown_pool, closed, restarting, unreachable or timed_out, got {stop:?}"),
        )
        .with_field("stop")
    })?;
    #[allow(clippy::cast_precision_loss)] // seconds of at most 2^64 ms: shown, not counted
    Ok([
        f64::from(s.status()),
        s.retry_after_s().map_or(-1.0, |v| v as f64),
        s.should_retry().map_or(-1.0, |r| f64::from(u8::from(r))),
    ])
}

/// `checkFleets(text, serveFile)`: the fleets configuration checked by the gateway crate
/// ([`tokenwarden_gateway::config::Fleets`]): the Worker's `TOKENWARDEN_FLEETS` text, or with
/// `serve_file` `tokenwarden serve --config`'s file (`{ "fleets": … }`). Answers the fleets
/// object as JSON text; refuses with `invalid_config` naming the place as `field`.
pub fn check_fleets(text: &str, serve_file: bool) -> Result<String, ArgError> {
    use tokenwarden_gateway::config::Fleets;
    let checked = if serve_file {
        Fleets::from_serve_file(text)
    } else {
        Fleets::from_json(text)
    };
    match checked {
        // Serializing a `Value` cannot fail.
        Ok(fleets) => Ok(serde_json::to_string(&fleets.json).unwrap_or_default()),
        Err(e) => {
            let err = ArgError::range("invalid_config", e.to_string());
            Err(if e.path.is_empty() {
                err
            } else {
                err.with_field(e.path)
            })
        }
    }
}

/// `proxiedCall(rest, search, headers, secrets, credential)`: the proxy's first step
/// ([`tokenwarden_gateway::proxy::proxied_call`]) for a proxied request: `rest` the path
/// after `…/proxy`, `search` the query string, `headers` the request's header names and
/// values in turn, joined by line feeds (which neither may hold: one string crosses the
/// boundary, not one per name and value), `secrets` the fleet's, `credential` the agent of
/// the caller's credential. Answers JSON text: `{"call":{provider, path, query, headers,
/// name, family, role, task, unblocks, failureSignature}}`, `headers` the places of the
/// pairs to send, `name` who the call is and `family` its family's root (a subagent's), or
/// `{"refused":{status, error, message, field?}}` for the host to answer.
pub fn proxied_call(
    rest: &str,
    search: &str,
    headers: &str,
    secrets: &[String],
    credential: Option<&str>,
) -> Result<String, ArgError> {
    use serde_json::{Value, json};
    use tokenwarden_gateway::proxy::{Incoming, proxied_call};
    let mut items = headers.split('\n');
    let pairs: Vec<(&str, &str)> = if headers.is_empty() {
        Vec::new()
    } else {
        std::iter::from_fn(|| Some((items.next()?, items.next()?))).collect()
    };
    if !headers.is_empty() && headers.split('\n').count() != 2 * pairs.len() {
        return Err(ArgError::type_error(
            "`headers` must hold names and values in turn, joined by line feeds".into(),
        )
        .with_field("headers"));
    }
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    let out = match proxied_call(&Incoming {
        rest,
        search,
        headers: &pairs,
        secrets: &secrets,
        credential,
    }) {
        Ok(c) => json!({ "call": {
            "provider": c.provider,
            "path": c.path,
            "query": c.query,
            "headers": c.headers,
            "name": c.name,
            "family": c.family,
            "role": c.role,
            "task": c.task,
            "unblocks": c.unblocks,
            // At most 2^53 - 1: exact as a JavaScript number.
            "failureSignature": c.failure_signature,
        }}),
        Err(r) => {
            let mut refused = json!({ "status": r.status, "error": r.code, "message": r.message });
            if let (Some(field), Value::Object(m)) = (r.field, &mut refused) {
                m.insert("field".into(), Value::from(field));
            }
            json!({ "refused": refused })
        }
    };
    Ok(out.to_string())
}

/// `proxiedProvider(rest, anthropicVersion)`: the provider a proxied request speaks, for its
/// errors ([`tokenwarden_gateway::proxy::proxied_provider`]); `None` when its path cannot
/// be read.
#[must_use]
pub fn proxied_provider(rest: &str, anthropic_version: bool) -> Option<String> {
    tokenwarden_gateway::proxy::proxied_provider(rest, anthropic_version).map(Into::into)
}

/// `countTokensBody(body)`: the `count_tokens` request for a Messages body's JSON text (its
/// counted fields, [`tokenwarden_provider::count_tokens::body`]), as JSON text.
pub fn count_tokens_body(body: &str) -> Result<String, ArgError> {
    let body = request_body(body)?;
    Ok(serde_json::to_string(&tokenwarden_provider::count_tokens::body(&body)).unwrap_or_default())
}

/// `countTokensPause(status, retryAfter, unixNowMs, pauseMs)`: how long to stop counting
/// after a failed count ([`tokenwarden_provider::count_tokens::pause_after_failure`]).
pub fn count_tokens_pause(
    status: Option<f64>,
    retry_after: Option<&str>,
    unix_now_ms: f64,
    pause_ms: f64,
) -> Result<f64, ArgError> {
    let status = match status {
        None => None,
        Some(s) => Some(u16::try_from(u64_of(s, "status")?).unwrap_or(u16::MAX)),
    };
    let ms = tokenwarden_provider::count_tokens::pause_after_failure(
        status,
        retry_after,
        u64_of(unix_now_ms, "unixNowMs")?,
        u64_of(pause_ms, "pauseMs")?,
    );
    #[allow(clippy::cast_precision_loss)] // at most MAX_PAUSE_MS
    Ok(ms as f64)
}

/// `limiterAnswer(status, code, retryAfter, waitedMs, timeoutMs)`: what the remote driver
/// does with an answer of the limiter ([`tokenwarden_gateway::limiter::limiter_answer`]), as
/// JSON text: `{"do":"read"}`, `{"do":"refused"}`, `{"do":"retry","afterMs":…}` or
/// `{"do":"unreachable"}`.
pub fn limiter_answer(
    status: f64,
    code: Option<&str>,
    retry_after: Option<&str>,
    waited_ms: f64,
    timeout_ms: f64,
) -> Result<String, ArgError> {
    use tokenwarden_gateway::limiter::Verdict;
    let status = u16::try_from(u64_of(status, "status")?).map_err(|_| {
        ArgError::range(
            "invalid_argument",
            format!("`status` must be an HTTP status, got {status}"),
        )
        .with_field("status")
    })?;
    let verdict = tokenwarden_gateway::limiter::limiter_answer(
        status,
        code,
        retry_after,
        u64_of(waited_ms, "waitedMs")?,
        u64_of(timeout_ms, "timeoutMs")?,
    );
    Ok(match verdict {
        Verdict::Read => r#"{"do":"read"}"#.into(),
        Verdict::Refused => r#"{"do":"refused"}"#.into(),
        Verdict::Retry { after_ms } => format!(r#"{{"do":"retry","afterMs":{after_ms}}}"#),
        Verdict::Unreachable => r#"{"do":"unreachable"}"#.into(),
    })
}
