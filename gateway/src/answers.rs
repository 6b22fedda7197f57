//! What each route of the HTTP API answers, from the coordinator's output (as the camelCase
//! JSON every host answers with): the shapes of `POST …/leases` (`grant`, `queued`,
//! `reject`), of `POST …/responses` (the call's next step) and of the per-verb routes.
//! Lease ids are left as the coordinator's numbers: the host signs them as handles.

use alloc::format;
use alloc::string::String;

use serde_json::{Map, Value, json};

/// A call's next step (`send`, `wait`, `give_up`, `deliver`) from a call lifecycle output
/// (`{ output, … }`): `{ kind, …the step's fields }`; `None` for another output.
#[must_use]
pub fn step_of(out: &Value) -> Option<Value> {
    let mut step = Map::new();
    let kind = out.get("output")?.as_str()?;
    match kind {
        "send" => {
            step.insert("lease".into(), out.get("lease")?.clone());
            step.insert("expiresAt".into(), out.get("expiresAt")?.clone());
        }
        "wait" | "give_up" => {
            let key = if kind == "wait" { "wait" } else { "giveUp" };
            for (k, v) in out.get(key)?.as_object()? {
                step.insert(k.clone(), v.clone());
            }
        }
        "deliver" => {}
        _ => return None,
    }
    step.insert("kind".into(), Value::from(kind));
    Some(Value::Object(step))
}

/// A refusal's words: why (`reason.kind`, or the axis a request exceeds) and what follows
/// (a retry time, never, or a call given up after its refusals). The driver's
/// `LeaseRejectedError` says the same.
#[must_use]
pub fn rejected_message(
    reason: &Value,
    retry_after_ms: Option<u64>,
    gave_up: Option<&str>,
) -> String {
    let kind = reason
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("refused");
    let why = if kind == "exceeds_capacity" {
        let axis = reason
            .get("axis")
            .and_then(Value::as_str)
            .unwrap_or("capacity");
        format!("the request needs more {axis} than the pool allows in a window")
    } else {
        kind.replace('_', " ")
    };
    match (gave_up, retry_after_ms) {
        (Some("refusals"), _) => format!(
            "lease rejected: {why}; the call gave up after the configured number of refusals (call.max_refusals)"
        ),
        (_, None) => format!("lease rejected: {why}; it can never be served as asked"),
        (_, Some(ms)) => {
            // Tenths of a second, rounded half up as JavaScript's toFixed(1) does here.
            let tenths = (ms + 50) / 100;
            format!(
                "lease rejected: {why}; retry in {}.{} s",
                tenths / 10,
                tenths % 10
            )
        }
    }
}

/// `POST …/leases`'s answer to a `call_lease` output `out` at `now` with `clients` remote
/// drivers seen: 200 `{ kind: 'grant', lease, expiresAt }`, 202 `{ kind: 'queued', lease,
/// eta }` or 200 `{ kind: 'reject', retryable, retryAt, retryAfterMs, reason, message }`,
/// each with `call`, `step` (no lease ids in it) and `clients`. `None` for an output that
/// is none of these (a bug to report).
#[must_use]
pub fn lease_answer(out: &Value, now: u64, clients: u64) -> Option<(u16, Value)> {
    let mut step = step_of(out)?;
    if let Value::Object(m) = &mut step {
        m.remove("lease");
        m.remove("ticket");
    }
    let call = out.get("call").cloned().unwrap_or(Value::Null);
    let kind = out.get("output")?.as_str()?;
    let wait = out.get("wait");
    let ticket = wait.and_then(|w| w.get("ticket")).filter(|t| !t.is_null());
    let (status, mut body) = match (kind, ticket) {
        ("send", _) => (
            200,
            json!({ "kind": "grant", "lease": out.get("lease")?, "expiresAt": out.get("expiresAt")? }),
        ),
        ("wait", Some(t)) => (
            202,
            json!({ "kind": "queued", "lease": t, "eta": wait?.get("until")? }),
        ),
        ("wait" | "give_up", _) => {
            let retry_at = if kind == "wait" {
                wait?.get("until")?.as_u64()
            } else {
                None
            };
            let give_up = out.get("giveUp");
            let reason = if kind == "wait" {
                wait?.get("refusal")?
            } else {
                give_up?.get("refusal")?
            };
            if reason.is_null() {
                return None;
            }
            let gave_up = give_up
                .and_then(|g| g.get("reason"))
                .and_then(Value::as_str);
            let retry_after_ms = retry_at.map(|t| t.saturating_sub(now));
            (
                200,
                json!({
                    "kind": "reject",
                    "retryable": retry_at.is_some() && gave_up.is_none(),
                    "retryAt": retry_at,
                    "retryAfterMs": retry_after_ms,
                    "reason": reason,
                    "message": rejected_message(reason, retry_after_ms, gave_up),
                }),
            )
        }
        _ => return None,
    };
    body["call"] = call;
    body["step"] = step;
    body["clients"] = Value::from(clients);
    Some((status, body))
}

/// The answer of a per-verb route (the member route `route` of
/// [`crate::members::Members::route`]) to the coordinator's output `out`, the input as
/// read being `input`: `settle`/`interrupted` the settlement, `cancel` `{ cancelled }`,
/// `renew` `{ expiresAt }`, `response` `{ call, step, settled, report }`, `task`
/// `{ task, open }`, `task-failed` `{ task, repeats }`, `task-done` the task's summary.
#[must_use]
pub fn verb_answer(route: &str, input: &Value, out: &Value) -> Value {
    let field = |k: &str| out.get(k).cloned().unwrap_or(Value::Null);
    match route {
        "settle" | "interrupted" => field("settlement"),
        "cancel" => json!({ "cancelled": true }),
        "renew" => json!({ "expiresAt": field("expiresAt") }),
        "response" => json!({
            "call": field("call"),
            "step": step_of(out).unwrap_or(Value::Null),
            "settled": field("settled"),
            "report": field("report"),
        }),
        "task" => json!({ "task": input["task"]["task"], "open": true }),
        "task-failed" => json!({ "task": input["task"], "repeats": field("inARow") }),
        "task-done" => field("summary"),
        _ => out.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_why_and_when_as_the_driver_does() {
        let r = json!({ "kind": "exceeds_capacity", "axis": "input_tokens" });
        assert_eq!(
            rejected_message(&r, None, None),
            "lease rejected: the request needs more input_tokens than the pool allows in a window; it can never be served as asked"
        );
        let r = json!({ "kind": "over_budget" });
        assert_eq!(
            rejected_message(&r, Some(1_250), None),
            "lease rejected: over budget; retry in 1.3 s"
        );
        assert_eq!(
            rejected_message(&r, Some(0), None),
            "lease rejected: over budget; retry in 0.0 s"
        );
        assert!(rejected_message(&r, Some(5), Some("refusals")).contains("call.max_refusals"));
    }

    #[test]
    fn each_call_output_is_a_lease_answer() {
        let send =
            json!({ "output": "send", "lease": 7, "expiresAt": 9_000, "call": { "attempt": 0 } });
        let (status, body) = lease_answer(&send, 1_000, 2).unwrap();
        assert_eq!(status, 200);
        assert_eq!(body["kind"], "grant");
        assert_eq!(body["lease"], 7);
        assert_eq!(
            body["step"],
            json!({ "kind": "send", "expiresAt": 9_000 }),
            "no lease id in the step"
        );
        assert_eq!(body["clients"], 2);

        let queued = json!({ "output": "wait", "wait": { "ticket": 8, "until": 5_000, "refusal": null, "reason": "queued" }, "call": {} });
        let (status, body) = lease_answer(&queued, 1_000, 1).unwrap();
        assert_eq!(
            (status, &body["kind"], &body["lease"], &body["eta"]),
            (202, &json!("queued"), &json!(8), &json!(5_000))
        );
        assert!(body["step"].get("ticket").is_none());

        let refused = json!({ "output": "wait", "wait": { "ticket": null, "until": 3_000, "refusal": { "kind": "over_budget" }, "reason": "refused" }, "call": {} });
        let (status, body) = lease_answer(&refused, 1_000, 1).unwrap();
        assert_eq!(
            (
                status,
                &body["kind"],
                &body["retryAfterMs"],
                &body["retryable"]
            ),
            (200, &json!("reject"), &json!(2_000), &json!(true))
        );

        let gave_up = json!({ "output": "give_up", "giveUp": { "reason": "never_fits", "refusal": { "kind": "exceeds_capacity", "axis": "requests" } }, "call": {} });
        let (_, body) = lease_answer(&gave_up, 1_000, 1).unwrap();
        assert_eq!(
            (&body["retryable"], &body["retryAt"]),
            (&json!(false), &Value::Null)
        );

        assert!(lease_answer(&json!({ "output": "renewed" }), 0, 1).is_none());
    }
}
