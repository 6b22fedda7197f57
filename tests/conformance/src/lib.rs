//! The reference runner for tokenwarden's conformance traces.
//!
//! A trace (schema in `tests/traces/SCHEMA.md`) is a configuration, a seed, a list of timed
//! inputs and the exact list of output records every runtime must produce. This crate
//! replays a trace through the native core and returns the records; the other runtimes'
//! runners are short adapters that do the same through their binding.

use serde_json::{Map, Value, json};
use tokenwarden_core::{
    Backoff, Config, Coordinator, HeaderReport, LeaseId, LeaseRequest, Millis, PoolId, Usage,
    parse_headers,
};

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

fn parse<T: serde::de::DeserializeOwned>(v: &Value, what: &str) -> Result<T, String> {
    serde_json::from_value(v.clone()).map_err(|e| format!("bad `{what}`: {e}"))
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn lease_error(e: tokenwarden_core::LeaseError) -> Value {
    match e {
        tokenwarden_core::LeaseError::TooLarge { field } => {
            json!({ "error": e.code(), "field": field })
        }
        _ => json!({ "error": e.code() }),
    }
}

fn timeout_value(c: &Coordinator) -> Value {
    c.poll_timeout().map_or(Value::Null, |t| json!(t.0))
}

fn drain_events(c: &mut Coordinator, at: u64, out: &mut Vec<Value>) {
    while let Some(e) = c.poll_event() {
        out.push(json!({ "at": at, "event": to_value(&e) }));
    }
}

/// Replays a trace and returns its output records.
pub fn run(trace: &Value) -> Result<Vec<Value>, String> {
    let config_json = serde_json::to_string(field(trace, "config")?).map_err(|e| e.to_string())?;
    let seed = u64_field(trace, "seed")?;
    let start = trace.get("start").and_then(Value::as_u64).unwrap_or(0);
    let mut out = Vec::new();
    let config = match Config::from_json(&config_json) {
        Ok(c) => c,
        Err(e) => {
            let mut rec = json!({ "at": start, "op": "new", "result": { "error": e.code() } });
            if let tokenwarden_core::ConfigError::Invalid { field, .. } = &e {
                rec["result"]["field"] = json!(field.to_string());
            }
            out.push(rec);
            return Ok(out);
        }
    };
    let mut c = Coordinator::new(config, seed, Millis(start)).map_err(|e| e.to_string())?;
    let inputs = field(trace, "inputs")?
        .as_array()
        .ok_or("`inputs` must be an array")?;
    for input in inputs {
        let at = u64_field(input, "at")?;
        let op = field(input, "op")?
            .as_str()
            .ok_or("`op` must be a string")?;
        // Drive: wake the coordinator at each timeout due by `at`, as a host would.
        let mut steps = 0;
        while let Some(t) = c.poll_timeout() {
            if t.0 > at {
                break;
            }
            steps += 1;
            if steps > MAX_DRIVE_STEPS {
                return Err(format!("poll_timeout does not progress at {t}"));
            }
            c.handle_timeout(t);
            let mut events = Vec::new();
            drain_events(&mut c, t.0, &mut events);
            if !events.is_empty() {
                out.push(json!({ "at": t.0, "op": "drive" }));
                out.extend(events);
            }
        }
        let now = Millis(at);
        let result = match op {
            "request_lease" => {
                let req: LeaseRequest = parse(field(input, "request")?, "request")?;
                match c.request_lease(now, &req) {
                    Ok(d) => to_value(&d),
                    Err(e) => lease_error(e),
                }
            }
            "settle" => {
                let lease = LeaseId(u64_field(input, "lease")?);
                let usage: Usage = parse(field(input, "usage")?, "usage")?;
                match c.settle(now, lease, &usage) {
                    Ok(s) => to_value(&s),
                    Err(e) => lease_error(e),
                }
            }
            "cancel" => match c.cancel(now, LeaseId(u64_field(input, "lease")?)) {
                Ok(()) => Value::Null,
                Err(e) => lease_error(e),
            },
            "response" => {
                let pool =
                    PoolId(u32::try_from(u64_field(input, "pool")?).map_err(|e| e.to_string())?);
                let lease = input.get("lease").and_then(Value::as_u64).map(LeaseId);
                let status =
                    u16::try_from(u64_field(input, "status")?).map_err(|e| e.to_string())?;
                let headers: Vec<(String, String)> = parse(field(input, "headers")?, "headers")?;
                let unix_now = input.get("unix_now_ms").and_then(Value::as_u64);
                let report: HeaderReport = parse_headers(
                    headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
                    unix_now,
                );
                match c.handle_response(now, pool, lease, status, &report) {
                    Ok(()) => json!({ "report": to_value(&report) }),
                    Err(e) => lease_error(e),
                }
            }
            "timeout" => {
                c.handle_timeout(now);
                Value::Null
            }
            "backoff" => {
                let mut state = Backoff {
                    failed: u32::try_from(input.get("failed").and_then(Value::as_u64).unwrap_or(0))
                        .map_err(|e| e.to_string())?,
                    last_retry_after_ms: input.get("last_retry_after_ms").and_then(Value::as_u64),
                };
                let retry_after = input.get("retry_after_ms").and_then(Value::as_u64);
                to_value(&c.backoff(&mut state, retry_after))
            }
            "metrics" => to_value(&c.metrics(now)),
            "snapshot_restore" => {
                let json = c.snapshot_json();
                c = Coordinator::restore_json(&json).map_err(|e| format!("restore failed: {e}"))?;
                Value::Null
            }
            other => return Err(format!("unknown op `{other}`")),
        };
        if let Some(check) = input.get("check") {
            if !subset(check, &result) {
                return Err(format!(
                    "check failed at {at} ({op}): expected {check} within {result}",
                ));
            }
        }
        out.push(
            json!({ "at": at, "op": op, "result": result, "next_timeout": timeout_value(&c) }),
        );
        drain_events(&mut c, at, &mut out);
        c.check()
            .map_err(|e| format!("state inconsistent after {op} at {at}: {e}"))?;
    }
    Ok(out)
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
