//! The reference runner for tokenwarden's conformance traces.
//!
//! A trace (schema in `tests/traces/SCHEMA.md`) is a configuration, a seed, a list of timed
//! inputs and the exact list of output records every runtime must produce. This crate
//! replays a trace through the native core and returns the records; the other runtimes'
//! runners are short adapters that do the same through their binding.

use serde_json::{Map, Value, json};
use tokenwarden_core::{
    Backoff, Call, Config, Coordinator, HeaderReport, LeaseId, LeaseRequest, Millis, PoolId,
    TaskId, TaskOutcome, TaskSpec, Usage, parse_headers,
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

/// A runtime that can replay traces: the native core, or an adapter over a binding. Each
/// method mirrors one core call and returns its result as a record value (core errors
/// become `{"error": code}` values); an `Err(String)` is a failure of the runtime itself
/// and fails the replay.
pub trait Engine: Sized {
    /// `Coordinator::new`; `Ok(Err(result))` is a configuration error as its record value.
    fn create(config_json: &str, seed: u64, start: u64) -> Result<Result<Self, Value>, String>;
    /// `request_lease`.
    fn request_lease(&mut self, now: u64, req: &LeaseRequest) -> Result<Value, String>;
    /// `settle`.
    fn settle(&mut self, now: u64, lease: u64, usage: &Usage) -> Result<Value, String>;
    /// `cancel`.
    fn cancel(&mut self, now: u64, lease: u64) -> Result<Value, String>;
    /// `renew`; the value is the new expiry.
    fn renew(&mut self, now: u64, lease: u64) -> Result<Value, String>;
    /// `parse_headers` then `handle_response`; the value is `{"report": ...}`.
    fn response(&mut self, now: u64, r: &Response) -> Result<Value, String>;
    /// `handle_timeout`.
    fn handle_timeout(&mut self, now: u64) -> Result<(), String>;
    /// `poll_timeout`.
    fn poll_timeout(&mut self) -> Result<Option<u64>, String>;
    /// `poll_event`, serialized.
    fn poll_event(&mut self) -> Result<Option<Value>, String>;
    /// `backoff` from the given state.
    fn backoff(&mut self, state: Backoff, retry_after_ms: Option<u64>) -> Result<Value, String>;
    /// `call_lease` from the given state; the value is `{"call": state, "step": step}`.
    fn call_lease(&mut self, now: u64, call: Call, req: &LeaseRequest) -> Result<Value, String>;
    /// `parse_headers` then `call_response` from the given state; the value is
    /// `{"call": state, "step": step, "settled": settlement or null, "report": report}`.
    fn call_response(&mut self, now: u64, call: Call, r: &Response) -> Result<Value, String>;
    /// `call_interrupted`; the value is the settlement.
    fn call_interrupted(
        &mut self,
        now: u64,
        lease: u64,
        seen: Option<&Usage>,
    ) -> Result<Value, String>;
    /// `open_task`; the value is null (or the error record).
    fn open_task(&mut self, now: u64, spec: &TaskSpec) -> Result<Value, String>;
    /// `task_failed`; the value is the repeats in a row.
    fn task_failed(&mut self, now: u64, task: u64, signature: u64) -> Result<Value, String>;
    /// `end_task`; the value is the task's summary.
    fn end_task(&mut self, now: u64, task: u64, outcome: TaskOutcome) -> Result<Value, String>;
    /// `metrics`, serialized.
    fn metrics(&mut self, now: u64) -> Result<Value, String>;
    /// Replaces the coordinator by one restored from its own snapshot.
    fn snapshot_restore(&mut self) -> Result<(), String>;
    /// `Coordinator::check`.
    fn check(&mut self) -> Result<(), String>;
    /// Called after the drive step, before each input (a hot reload, for instance).
    fn before_input(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// The arguments of a `response` input.
#[derive(Clone, Debug)]
pub struct Response {
    /// Pool index.
    pub pool: u32,
    /// The lease the response belongs to, if any.
    pub lease: Option<u64>,
    /// HTTP status.
    pub status: u16,
    /// Header name/value pairs.
    pub headers: Vec<(String, String)>,
    /// The host's wall clock, if the trace gives one.
    pub unix_now_ms: Option<u64>,
}

/// The native core, the reference.
pub struct Native(Coordinator);

fn native_result<T: serde::Serialize>(r: Result<T, tokenwarden_core::LeaseError>) -> Value {
    r.map_or_else(lease_error, |v| to_value(&v))
}

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
    fn request_lease(&mut self, now: u64, req: &LeaseRequest) -> Result<Value, String> {
        Ok(native_result(self.0.request_lease(Millis(now), req)))
    }
    fn settle(&mut self, now: u64, lease: u64, usage: &Usage) -> Result<Value, String> {
        Ok(native_result(self.0.settle(
            Millis(now),
            LeaseId(lease),
            usage,
        )))
    }
    fn cancel(&mut self, now: u64, lease: u64) -> Result<Value, String> {
        Ok(native_result(self.0.cancel(Millis(now), LeaseId(lease))))
    }
    fn renew(&mut self, now: u64, lease: u64) -> Result<Value, String> {
        Ok(native_result(self.0.renew(Millis(now), LeaseId(lease))))
    }
    fn response(&mut self, now: u64, r: &Response) -> Result<Value, String> {
        let pairs = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        let report: HeaderReport = parse_headers(pairs, r.unix_now_ms);
        let lease = r.lease.map(LeaseId);
        Ok(
            match self
                .0
                .handle_response(Millis(now), PoolId(r.pool), lease, r.status, &report)
            {
                Ok(()) => json!({ "report": to_value(&report) }),
                Err(e) => lease_error(e),
            },
        )
    }
    fn handle_timeout(&mut self, now: u64) -> Result<(), String> {
        self.0.handle_timeout(Millis(now));
        Ok(())
    }
    fn poll_timeout(&mut self) -> Result<Option<u64>, String> {
        Ok(self.0.poll_timeout().map(|t| t.0))
    }
    fn poll_event(&mut self) -> Result<Option<Value>, String> {
        Ok(self.0.poll_event().map(|e| to_value(&e)))
    }
    fn backoff(
        &mut self,
        mut state: Backoff,
        retry_after_ms: Option<u64>,
    ) -> Result<Value, String> {
        Ok(to_value(&self.0.backoff(&mut state, retry_after_ms)))
    }
    fn call_lease(
        &mut self,
        now: u64,
        mut call: Call,
        req: &LeaseRequest,
    ) -> Result<Value, String> {
        Ok(match self.0.call_lease(Millis(now), &mut call, req) {
            Ok(step) => json!({ "call": to_value(&call), "step": to_value(&step) }),
            Err(e) => lease_error(e),
        })
    }
    fn call_response(&mut self, now: u64, mut call: Call, r: &Response) -> Result<Value, String> {
        let pairs = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        let report: HeaderReport = parse_headers(pairs, r.unix_now_ms);
        let lease = r.lease.map(LeaseId);
        Ok(
            match self.0.call_response(
                Millis(now),
                &mut call,
                PoolId(r.pool),
                lease,
                r.status,
                &report,
            ) {
                Ok(answer) => json!({
                    "call": to_value(&call),
                    "step": to_value(&answer.step),
                    "settled": to_value(&answer.settled),
                    "report": to_value(&report),
                }),
                Err(e) => lease_error(e),
            },
        )
    }
    fn call_interrupted(
        &mut self,
        now: u64,
        lease: u64,
        seen: Option<&Usage>,
    ) -> Result<Value, String> {
        Ok(native_result(self.0.call_interrupted(
            Millis(now),
            LeaseId(lease),
            seen,
        )))
    }
    fn open_task(&mut self, now: u64, spec: &TaskSpec) -> Result<Value, String> {
        Ok(native_result(self.0.open_task(Millis(now), spec)))
    }
    fn task_failed(&mut self, now: u64, task: u64, signature: u64) -> Result<Value, String> {
        Ok(native_result(self.0.task_failed(
            Millis(now),
            TaskId(task),
            signature,
        )))
    }
    fn end_task(&mut self, now: u64, task: u64, outcome: TaskOutcome) -> Result<Value, String> {
        Ok(native_result(self.0.end_task(
            Millis(now),
            TaskId(task),
            outcome,
        )))
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

/// The arguments of a `response` or `call_response` input.
fn response_input(input: &Value) -> Result<Response, String> {
    Ok(Response {
        pool: u32::try_from(u64_field(input, "pool")?).map_err(|e| e.to_string())?,
        lease: input.get("lease").and_then(Value::as_u64),
        status: u16::try_from(u64_field(input, "status")?).map_err(|e| e.to_string())?,
        headers: parse(field(input, "headers")?, "headers")?,
        unix_now_ms: input.get("unix_now_ms").and_then(Value::as_u64),
    })
}

/// The state of the trace's call `name`: what its last step returned, or a new call.
fn call_state(calls: &std::collections::BTreeMap<u64, Value>, name: u64) -> Result<Call, String> {
    calls
        .get(&name)
        .map_or(Ok(Call::new()), |v| parse(v, "call state"))
}

/// Keeps the state a call step returned (an error leaves it as it was).
fn keep_call(calls: &mut std::collections::BTreeMap<u64, Value>, name: u64, result: &Value) {
    if let Some(state) = result.get("call") {
        calls.insert(name, state.clone());
    }
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
            c.handle_timeout(t)?;
            let mut events = Vec::new();
            drain_events(&mut c, t, &mut events)?;
            if !events.is_empty() {
                out.push(json!({ "at": t, "op": "drive" }));
                out.extend(events);
            }
        }
        c.before_input()?;
        let result = match op {
            "request_lease" => c.request_lease(at, &parse(field(input, "request")?, "request")?)?,
            "settle" => {
                let usage: Usage = parse(field(input, "usage")?, "usage")?;
                c.settle(at, u64_field(input, "lease")?, &usage)?
            }
            "cancel" => c.cancel(at, u64_field(input, "lease")?)?,
            "renew" => c.renew(at, u64_field(input, "lease")?)?,
            "response" => c.response(at, &response_input(input)?)?,
            "timeout" => {
                c.handle_timeout(at)?;
                Value::Null
            }
            "backoff" => {
                let state = Backoff {
                    failed: u32::try_from(input.get("failed").and_then(Value::as_u64).unwrap_or(0))
                        .map_err(|e| e.to_string())?,
                    last_retry_after_ms: input.get("last_retry_after_ms").and_then(Value::as_u64),
                };
                c.backoff(state, input.get("retry_after_ms").and_then(Value::as_u64))?
            }
            "call_lease" => {
                let name = u64_field(input, "call")?;
                let req = parse(field(input, "request")?, "request")?;
                let result = c.call_lease(at, call_state(&calls, name)?, &req)?;
                keep_call(&mut calls, name, &result);
                result
            }
            "call_response" => {
                let name = u64_field(input, "call")?;
                let r = response_input(input)?;
                let result = c.call_response(at, call_state(&calls, name)?, &r)?;
                keep_call(&mut calls, name, &result);
                result
            }
            "call_interrupted" => {
                let seen: Option<Usage> = match input.get("seen") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(parse(v, "seen")?),
                };
                c.call_interrupted(at, u64_field(input, "lease")?, seen.as_ref())?
            }
            "open_task" => c.open_task(at, &parse(field(input, "task")?, "task")?)?,
            "task_failed" => c.task_failed(
                at,
                u64_field(input, "task")?,
                u64_field(input, "signature")?,
            )?,
            "end_task" => c.end_task(
                at,
                u64_field(input, "task")?,
                parse(field(input, "outcome")?, "outcome")?,
            )?,
            "metrics" => c.metrics(at)?,
            "snapshot_restore" => {
                c.snapshot_restore()?;
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
            json!({ "at": at, "op": op, "result": result, "next_timeout": timeout_value(&mut c)? }),
        );
        drain_events(&mut c, at, &mut out)?;
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
