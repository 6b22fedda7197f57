//! The conformance replay procedure (tests/traces/SCHEMA.md) through a
//! [`PluginCoordinator`]: the same steps as `tokenwarden_conformance::run`, so its output
//! must equal the native runner's record for record.

#![allow(dead_code, unreachable_pub)]

use std::sync::OnceLock;

use serde_json::{Value, json};
use tokenwarden_core::{Backoff, LeaseId, LeaseRequest, Millis, PoolId, Usage};
use tokenwarden_wasmtime::{COMPONENT, Error, Plugin, PluginCoordinator};

/// One compiled plugin per test binary (compiling is the slow part).
pub fn plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let engine = Plugin::default_engine().expect("engine");
        Plugin::new(&engine, COMPONENT).expect("the built component loads")
    })
}

/// Every trace file, sorted by name.
pub fn traces() -> Vec<(String, Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/traces");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("tests/traces exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable trace");
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).expect("trace is JSON"))
        })
        .collect()
}

/// When to hot-reload the coordinator during a replay.
#[derive(Clone, Copy, Debug)]
pub enum Reload {
    Never,
    /// Before every input (after the drive step).
    EveryInput,
}

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

/// A core error as a record; a plugin failure fails the replay.
fn error_value(e: Error) -> Result<Value, String> {
    match e {
        Error::Lease(tokenwarden_core::LeaseError::TooLarge { field }) => {
            Ok(json!({ "error": "too_large", "field": field }))
        }
        Error::Lease(l) => Ok(json!({ "error": l.code() })),
        other => Err(format!("plugin failure: {other}")),
    }
}

fn plugin_err(e: Error) -> String {
    format!("plugin failure: {e}")
}

fn timeout_value(c: &mut PluginCoordinator) -> Result<Value, String> {
    Ok(c.poll_timeout()
        .map_err(plugin_err)?
        .map_or(Value::Null, |t| json!(t.0)))
}

fn drain_events(c: &mut PluginCoordinator, at: u64, out: &mut Vec<Value>) -> Result<(), String> {
    while let Some(e) = c.poll_event().map_err(plugin_err)? {
        out.push(json!({ "at": at, "event": to_value(&e) }));
    }
    Ok(())
}

/// Replays `trace` through the plugin and returns its output records.
pub fn run(trace: &Value, reload: Reload, reload_into: &Plugin) -> Result<Vec<Value>, String> {
    let config_json = serde_json::to_string(field(trace, "config")?).map_err(|e| e.to_string())?;
    let seed = u64_field(trace, "seed")?;
    let start = trace.get("start").and_then(Value::as_u64).unwrap_or(0);
    let mut out = Vec::new();
    let mut c = match plugin().coordinator(&config_json, seed, Millis(start)) {
        Ok(c) => c,
        Err(Error::Config { code, field, .. }) => {
            let mut rec = json!({ "at": start, "op": "new", "result": { "error": code } });
            if let Some(field) = field {
                rec["result"]["field"] = json!(field);
            }
            out.push(rec);
            return Ok(out);
        }
        Err(e) => return Err(plugin_err(e)),
    };
    let inputs = field(trace, "inputs")?
        .as_array()
        .ok_or("`inputs` must be an array")?;
    for input in inputs {
        let at = u64_field(input, "at")?;
        let op = field(input, "op")?
            .as_str()
            .ok_or("`op` must be a string")?;
        let mut steps = 0;
        while let Some(t) = c.poll_timeout().map_err(plugin_err)? {
            if t.0 > at {
                break;
            }
            steps += 1;
            if steps > tokenwarden_conformance::MAX_DRIVE_STEPS {
                return Err(format!("poll_timeout does not progress at {t}"));
            }
            c.handle_timeout(t).map_err(plugin_err)?;
            let mut events = Vec::new();
            drain_events(&mut c, t.0, &mut events)?;
            if !events.is_empty() {
                out.push(json!({ "at": t.0, "op": "drive" }));
                out.extend(events);
            }
        }
        if matches!(reload, Reload::EveryInput) {
            c.reload(reload_into).map_err(plugin_err)?;
        }
        let now = Millis(at);
        let result = match op {
            "request_lease" => {
                let req: LeaseRequest = parse(field(input, "request")?, "request")?;
                match c.request_lease(now, &req) {
                    Ok(d) => to_value(&d),
                    Err(e) => error_value(e)?,
                }
            }
            "settle" => {
                let lease = LeaseId(u64_field(input, "lease")?);
                let usage: Usage = parse(field(input, "usage")?, "usage")?;
                match c.settle(now, lease, &usage) {
                    Ok(s) => to_value(&s),
                    Err(e) => error_value(e)?,
                }
            }
            "cancel" => match c.cancel(now, LeaseId(u64_field(input, "lease")?)) {
                Ok(()) => Value::Null,
                Err(e) => error_value(e)?,
            },
            "response" => {
                let pool =
                    PoolId(u32::try_from(u64_field(input, "pool")?).map_err(|e| e.to_string())?);
                let lease = input.get("lease").and_then(Value::as_u64).map(LeaseId);
                let status =
                    u16::try_from(u64_field(input, "status")?).map_err(|e| e.to_string())?;
                let headers: Vec<(String, String)> = parse(field(input, "headers")?, "headers")?;
                let unix_now = input.get("unix_now_ms").and_then(Value::as_u64);
                match c.handle_response(
                    now,
                    pool,
                    lease,
                    status,
                    headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
                    unix_now,
                ) {
                    Ok(report) => json!({ "report": to_value(&report) }),
                    Err(e) => error_value(e)?,
                }
            }
            "timeout" => {
                c.handle_timeout(now).map_err(plugin_err)?;
                Value::Null
            }
            "backoff" => {
                let mut state = Backoff {
                    failed: u32::try_from(input.get("failed").and_then(Value::as_u64).unwrap_or(0))
                        .map_err(|e| e.to_string())?,
                    last_retry_after_ms: input.get("last_retry_after_ms").and_then(Value::as_u64),
                };
                let retry_after = input.get("retry_after_ms").and_then(Value::as_u64);
                to_value(&c.backoff(&mut state, retry_after).map_err(plugin_err)?)
            }
            "metrics" => to_value(&c.metrics(now).map_err(plugin_err)?),
            "snapshot_restore" => {
                let json = c.snapshot_json().map_err(plugin_err)?;
                c = plugin().restore_json(&json).map_err(plugin_err)?;
                Value::Null
            }
            other => return Err(format!("unknown op `{other}`")),
        };
        if let Some(check) = input.get("check")
            && !tokenwarden_conformance::subset(check, &result)
        {
            return Err(format!(
                "check failed at {at} ({op}): expected {check} within {result}"
            ));
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

/// Compares records with the trace's `expected`, naming the first difference.
pub fn compare(expected: &[Value], got: &[Value]) -> Result<(), String> {
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        if e != g {
            return Err(format!(
                "record {i} differs:\n  expected {e}\n  got      {g}"
            ));
        }
    }
    if expected.len() != got.len() {
        return Err(format!(
            "expected {} records, got {}",
            expected.len(),
            got.len()
        ));
    }
    Ok(())
}
