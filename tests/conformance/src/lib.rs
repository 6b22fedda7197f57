//! The reference runner for tokenwarden's conformance traces.
//!
//! A trace (schema in `tests/traces/SCHEMA.md`) is a configuration, a seed, a list of timed
//! inputs and the exact list of output records every runtime must produce. This crate
//! replays a trace through the native core and returns the records; the other runtimes'
//! runners are short adapters that do the same through their binding.
//!
//! A runner is "decode, handle, encode": each input record is the core's host-protocol
//! `Input` (its `op` and fields, with `at` and `check` beside them), handed to the engine's
//! `handle`; the `Output` it answers is the record's `result`, as the core encodes it. An
//! input the runner has never heard of needs nothing here.

use serde_json::{Map, Value, json};
use tokenwarden_core::{Config, Coordinator, Input, Millis};

/// Most driven wake-ups between two inputs before the runner calls the trace broken.
pub const MAX_DRIVE_STEPS: usize = 1_000_000;

fn field<'a>(input: &'a Value, name: &str) -> Result<&'a Value, String> {
    input
        .get(name)
        .ok_or_else(|| format!("input is missing `{name}`"))
}

fn u64_field(input: &Value, name: &str) -> Result<u64, String> {
    field(input, name)?
        .as_u64()
        .ok_or_else(|| format!("`{name}` must be an unsigned integer"))
}

/// Serializes a core value into a record field.
pub fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// A core error as a record: `{"error": code}` (plus `field` for `too_large`).
#[must_use]
pub fn lease_error(e: tokenwarden_core::LeaseError) -> Value {
    match e {
        tokenwarden_core::LeaseError::TooLarge { field } => {
            json!({ "error": e.code(), "field": field })
        }
        _ => json!({ "error": e.code() }),
    }
}

/// A runtime that can replay traces: the native core, or an adapter over a binding. An
/// `Err(String)` is a failure of the runtime itself and fails the replay; the core's
/// refusals are values (`{"error": code}`).
pub trait Engine: Sized {
    /// `Coordinator::new`; `Ok(Err(result))` is a configuration error as its record value.
    fn create(config_json: &str, seed: u64, start: u64) -> Result<Result<Self, Value>, String>;
    /// The host protocol: `input` is the core's `Input` as JSON (`op`-tagged, snake_case),
    /// the answer its `Output` as JSON, or the error as a record value ([`lease_error`]).
    fn handle(&mut self, now: u64, input: &Value) -> Result<Value, String>;
    /// `poll_timeout`.
    fn poll_timeout(&mut self) -> Result<Option<u64>, String>;
    /// `poll_event`, serialized.
    fn poll_event(&mut self) -> Result<Option<Value>, String>;
    /// `metrics(now)`, serialized.
    fn metrics(&mut self, now: u64) -> Result<Value, String>;
    /// Replaces the coordinator with one restored from its own snapshot.
    fn snapshot_restore(&mut self) -> Result<(), String>;
    /// `Coordinator::check`.
    fn check(&mut self) -> Result<(), String>;
    /// Called after the drive step, before each input (a hot reload, for instance).
    fn before_input(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// The native core, the reference.
pub struct Native(Coordinator);

impl Engine for Native {
    fn create(config_json: &str, seed: u64, start: u64) -> Result<Result<Self, Value>, String> {
        let config = match Config::from_json(config_json) {
            Ok(c) => c,
            Err(e) => {
                let mut result = json!({ "error": e.code() });
                if let tokenwarden_core::ConfigError::Invalid { field, .. } = &e {
                    result["field"] = json!(field.to_string());
                }
                return Ok(Err(result));
            }
        };
        Coordinator::new(config, seed, Millis(start))
            .map(|c| Ok(Native(c)))
            .map_err(|e| e.to_string())
    }
    fn handle(&mut self, now: u64, input: &Value) -> Result<Value, String> {
        let input: Input =
            serde_json::from_value(input.clone()).map_err(|e| format!("bad input {input}: {e}"))?;
        Ok(self
            .0
            .handle(Millis(now), &input)
            .map_or_else(lease_error, |out| to_value(&out)))
    }
    fn poll_timeout(&mut self) -> Result<Option<u64>, String> {
        Ok(self.0.poll_timeout().map(|t| t.0))
    }
    fn poll_event(&mut self) -> Result<Option<Value>, String> {
        Ok(self.0.poll_event().map(|e| to_value(&e)))
    }
    fn metrics(&mut self, now: u64) -> Result<Value, String> {
        Ok(to_value(&self.0.metrics(Millis(now))))
    }
    fn snapshot_restore(&mut self) -> Result<(), String> {
        let json = self.0.snapshot_json();
        self.0 = Coordinator::restore_json(&json).map_err(|e| format!("restore failed: {e}"))?;
        Ok(())
    }
    fn check(&mut self) -> Result<(), String> {
        self.0.check().map_err(str::to_string)
    }
}

/// The input record as the core's `Input`: without `at` and `check`, and a call step's
/// `call` (the call's name in the trace) replaced by the state its last step returned.
fn input_of(
    record: &Value,
    calls: &std::collections::BTreeMap<u64, Value>,
) -> Result<Value, String> {
    let mut input = record
        .as_object()
        .ok_or("an input is a JSON object")?
        .clone();
    input.remove("at");
    input.remove("check");
    if let Some(name) = input.get("call").and_then(Value::as_u64) {
        let state = calls.get(&name).cloned().unwrap_or_else(|| json!({}));
        input.insert("call".into(), state);
    }
    Ok(Value::Object(input))
}

fn timeout_value<E: Engine>(c: &mut E) -> Result<Value, String> {
    Ok(c.poll_timeout()?.map_or(Value::Null, |t| json!(t)))
}

fn drain_events<E: Engine>(c: &mut E, at: u64, out: &mut Vec<Value>) -> Result<(), String> {
    while let Some(e) = c.poll_event()? {
        out.push(json!({ "at": at, "event": e }));
    }
    Ok(())
}

/// Replays a trace through the native core and returns its output records.
pub fn run(trace: &Value) -> Result<Vec<Value>, String> {
    run_with::<Native>(trace)
}

/// Replays a trace through any [`Engine`], by the procedure in `tests/traces/SCHEMA.md`.
pub fn run_with<E: Engine>(trace: &Value) -> Result<Vec<Value>, String> {
    let config_json = serde_json::to_string(field(trace, "config")?).map_err(|e| e.to_string())?;
    let seed = u64_field(trace, "seed")?;
    let start = trace.get("start").and_then(Value::as_u64).unwrap_or(0);
    let mut out = Vec::new();
    let mut c = match E::create(&config_json, seed, start)? {
        Ok(c) => c,
        Err(result) => {
            out.push(json!({ "at": start, "op": "new", "result": result }));
            return Ok(out);
        }
    };
    let inputs = field(trace, "inputs")?
        .as_array()
        .ok_or("`inputs` must be an array")?;
    let mut calls = std::collections::BTreeMap::new();
    for input in inputs {
        let at = u64_field(input, "at")?;
        let op = field(input, "op")?
            .as_str()
            .ok_or("`op` must be a string")?;
        // Drive: wake the coordinator at each timeout due by `at`, as a host would.
        let mut steps = 0;
        while let Some(t) = c.poll_timeout()? {
            if t > at {
                break;
            }
            steps += 1;
            if steps > MAX_DRIVE_STEPS {
                return Err(format!("poll_timeout does not progress at {t}ms"));
            }
            c.handle(t, &json!({ "op": "timeout" }))?;
            let mut events = Vec::new();
            drain_events(&mut c, t, &mut events)?;
            if !events.is_empty() {
                out.push(json!({ "at": t, "op": "drive" }));
                out.extend(events);
            }
        }
        c.before_input()?;
        let result = match op {
            "metrics" => metrics_record(input, c.metrics(at)?),
            "snapshot_restore" => {
                c.snapshot_restore()?;
                Value::Null
            }
            _ => {
                let result = c.handle(at, &input_of(input, &calls)?)?;
                // A call step's state is kept under its name (an error leaves it as it was).
                if let (Some(name), Some(state)) = (
                    input.get("call").and_then(Value::as_u64),
                    result.get("call"),
                ) {
                    calls.insert(name, state.clone());
                }
                result
            }
        };
        if let Some(check) = input.get("check") {
            if !subset(check, &result) {
                return Err(format!(
                    "check failed at {at} ({op}): expected {check} within {result}",
                ));
            }
        }
        out.push(
            json!({ "at": at, "op": op, "result": result, "next_timeout": timeout_value(&mut c)? }),
        );
        drain_events(&mut c, at, &mut out)?;
        c.check()
            .map_err(|e| format!("state inconsistent after {op} at {at}: {e}"))?;
    }
    Ok(out)
}

/// A `metrics` record's `result`: the whole metrics for an input marked `"whole": true` or
/// without a `check`, else only what its `check` names ([`project`]), so a trace that is not
/// about metrics does not change when a metrics field is added.
#[must_use]
pub fn metrics_record(input: &Value, metrics: Value) -> Value {
    match input.get("check") {
        Some(check) if input.get("whole") != Some(&Value::Bool(true)) => project(&metrics, check),
        _ => metrics,
    }
}

/// The part of `got` that `want` names: an object's keys that `want` has, an array's
/// elements that `want`'s elements match (as [`subset`] pairs them, in order), each
/// projected in turn; anything else as it is.
#[must_use]
pub fn project(got: &Value, want: &Value) -> Value {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => Value::Object(
            w.iter()
                .filter_map(|(k, wv)| g.get(k).map(|gv| (k.clone(), project(gv, wv))))
                .collect(),
        ),
        (Value::Array(w), Value::Array(g)) => {
            let mut rest = g.iter();
            Value::Array(
                w.iter()
                    .filter_map(|wv| rest.find(|gv| subset(wv, gv)).map(|gv| project(gv, wv)))
                    .collect(),
            )
        }
        _ => got.clone(),
    }
}

/// Whether `want` is contained in `got`: objects by key (extra keys in `got` are fine),
/// arrays as an in-order subsequence of matching elements, everything else by equality.
#[must_use]
pub fn subset(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w
            .iter()
            .all(|(k, v)| g.get(k).is_some_and(|gv| subset(v, gv))),
        (Value::Array(w), Value::Array(g)) => {
            let mut rest = g.iter();
            w.iter().all(|wv| rest.any(|gv| subset(wv, gv)))
        }
        _ => want == got,
    }
}

/// Checks a trace's hand-written `checks` on events: each `expect_events` entry must
/// appear, in order, among the produced event records.
pub fn check_expected_events(trace: &Value, records: &[Value]) -> Result<(), String> {
    let Some(wants) = trace.get("expect_events").and_then(Value::as_array) else {
        return Ok(());
    };
    let events: Vec<&Value> = records
        .iter()
        .filter(|r| r.get("event").is_some())
        .collect();
    let mut i = 0;
    for want in wants {
        loop {
            let Some(got) = events.get(i) else {
                return Err(format!("expected event {want} not produced (in order)"));
            };
            i += 1;
            if subset(want, got) {
                break;
            }
        }
    }
    Ok(())
}

/// Replays a trace and compares against its `expected` records.
pub fn verify(trace: &Value) -> Result<(), String> {
    let got = run(trace)?;
    check_expected_events(trace, &got)?;
    let expected = trace
        .get("expected")
        .and_then(Value::as_array)
        .ok_or("trace has no `expected`: run with --bless")?;
    if expected.len() != got.len() {
        return Err(format!(
            "expected {} records, got {}",
            expected.len(),
            got.len()
        ));
    }
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        if e != g {
            return Err(format!(
                "record {i} differs:\n  expected {e}\n  got      {g}"
            ));
        }
    }
    Ok(())
}

/// Replays a trace and writes its records into `expected` (after its checks pass).
pub fn bless(trace: &mut Value) -> Result<(), String> {
    let got = run(trace)?;
    check_expected_events(trace, &got)?;
    let obj: &mut Map<String, Value> = trace.as_object_mut().ok_or("a trace is a JSON object")?;
    obj.insert("expected".into(), Value::Array(got));
    Ok(())
}
