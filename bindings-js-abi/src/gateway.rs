//! The gateway's and the provider crate's rules without state for a JavaScript host: the
//! HTTP API's routes and who a request is ([`gateway_rule`], one JSON text in and out), and
//! the identity rules the npm package exports ([`identity`]).

use serde_json::{Value, json};

use crate::ArgError;
use crate::members::refused;

/// The gateway's rules for a JavaScript host without state of their own (its routes,
/// [`tokenwarden_gateway::routes`], and who a request is, [`tokenwarden_gateway::auth`]),
/// one JSON text in and out. `input.op` is one of:
///
/// - `route` `{ method, path, query?, accept?, upgrade? }` → the route (see [`route_json`])
/// - `authenticate` `{ fleet: { secret, adminSecret?, proxyOpen } | null, name, token?,
///   authorization?, proxy?, credential? }` → `{ agent, open }`
/// - `admin` `{ fleet, authorization? }` → `{}`
/// - `credential` `{ secret, fleet, agent }` → `{ credential }`
/// - `sign` `{ secret, fleet, quota, lease, epoch }` → `{ handle }`
/// - `open` `{ secret, fleet, quota, handle }` → `{ id, epoch }`
/// - `name` `{ kind, name }` → `{}` (a fleet or quota name from a URL; 404 otherwise)
/// - `answer` `{ route, input?, output, now?, clients? }` → `{ status, body }`: what the
///   member route `route` answers for the coordinator's `output` to `input`
///   ([`tokenwarden_gateway::answers`]: `lease` grant/queued/reject, the per-verb shapes)
/// - `limits` `{}` → `{ body, proxyBody }` (the bytes an API request's body and a proxied
///   one are read up to by default: [`tokenwarden_gateway::routes::MAX_BODY_BYTES`], …)
/// - `keepalive` `{}` → `{ afterMs, everyMs, waiting, sent }` (a waiting stream's head after
///   `afterMs`, then one of the two SSE comments every `everyMs`)
/// - `redirect` `{ provider, status, location? }` → `{ status, body }` (the provider's
///   redirect answered as a 502 in its error format, never handed on)
/// - `streamError` `{ provider, status, body }` → `{ event }` (a kept-alive stream's answer
///   that is no stream, as one SSE error event)
/// - `failureEvent` `{ provider, status, code, message }` → `{ event }` (a kept-alive
///   stream that ended without an answer)
/// - `status` `{ code }` → `{ status }` (the HTTP status for an engine error's code, null
///   for none of them: [`tokenwarden_gateway::Refusal::status_of`])
/// - `clockAdvance` `{ body }` → `{ ms }` (tests only: how far `POST …/admin/clock` moves
///   a quota's clock; [`tokenwarden_gateway::routes::clock_advance`])
/// - `ceiling` `{ pool? }` → `{ text }` (what a pool's metrics say holds it: the wait log's
///   words), `printable` `{ text }` → `{ text }` (control characters escaped)
/// - `prometheus` `{ metrics, fleet, quota }` → `{ text }` (the metrics, camelCase as the
///   engine's `metrics(now)` returns them with a host's names and `ceilings`, in Prometheus's
///   text format: [`tokenwarden_gateway::prometheus::text`]; never refused)
///
/// A refusal is `{"refused": {status, error, message}}`; an input not of these shapes is an
/// `ArgError`.
pub fn gateway_rule(input: &str) -> Result<String, ArgError> {
    use tokenwarden_gateway::auth;
    use tokenwarden_gateway::config::{Fleet, ProxyOpen};
    let v: Value = serde_json::from_str(input)
        .map_err(|e| ArgError::type_error(format!("the auth input is not JSON: {e}")))?;
    let text = |k: &str| v.get(k).and_then(Value::as_str);
    let need = |k: &str| {
        text(k).ok_or_else(|| {
            ArgError::type_error(format!("the auth input needs `{k}` (a string)")).with_field(k)
        })
    };
    let fleet = match v.get("fleet") {
        Some(Value::Object(f)) => Some(Fleet {
            secret: f
                .get("secret")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
            admin_secret: f
                .get("adminSecret")
                .and_then(Value::as_str)
                .map(String::from),
            proxy_open: match f.get("proxyOpen") {
                Some(Value::Bool(true)) => ProxyOpen::Open,
                Some(Value::String(s)) if s == "credential" => ProxyOpen::Credential,
                _ => ProxyOpen::Closed,
            },
            quotas: std::collections::BTreeMap::new(),
        }),
        _ => None,
    };
    let presented = auth::Presented {
        token: text("token"),
        authorization: text("authorization"),
    };
    let op = need("op")?;
    if op == "prometheus" {
        let metrics = v.get("metrics").filter(|m| m.is_object()).ok_or_else(|| {
            ArgError::type_error("the prometheus input needs `metrics` (an object)".into())
                .with_field("metrics")
        })?;
        let text = tokenwarden_gateway::prometheus::text(metrics, need("fleet")?, need("quota")?);
        let mut o = JsonObject::default();
        o.text("text", Some(&text));
        return Ok(o.end());
    }
    if op == "answer" {
        // What a route answers for the coordinator's output (the gateway crate's shapes).
        let route = need("route")?;
        let out = v.get("output").filter(|o| o.is_object()).ok_or_else(|| {
            ArgError::type_error("the answer input needs `output` (an object)".into())
                .with_field("output")
        })?;
        if route == "lease" {
            let now = v.get("now").and_then(Value::as_u64).unwrap_or(0);
            let clients = v.get("clients").and_then(Value::as_u64).unwrap_or(1);
            let (status, body) = tokenwarden_gateway::answers::lease_answer(out, now, clients)
                .ok_or_else(|| {
                    ArgError::type_error(format!(
                        "`output` is no lease step: {}",
                        out.get("output").unwrap_or(&Value::Null)
                    ))
                    .with_field("output")
                })?;
            return Ok(json!({ "status": status, "body": body }).to_string());
        }
        let input = v.get("input").unwrap_or(&Value::Null);
        let body = tokenwarden_gateway::answers::verb_answer(route, input, out);
        return Ok(json!({ "status": 200, "body": body }).to_string());
    }
    if op == "limits" {
        use tokenwarden_gateway::routes::{MAX_BODY_BYTES, MAX_PROXY_BODY_BYTES};
        return Ok(
            json!({ "body": MAX_BODY_BYTES, "proxyBody": MAX_PROXY_BODY_BYTES }).to_string(),
        );
    }
    if op == "keepalive" || op == "redirect" || op == "streamError" || op == "failureEvent" {
        use tokenwarden_gateway::proxy;
        let status = v
            .get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .unwrap_or(502);
        let out = match op {
            "keepalive" => json!({
                "afterMs": proxy::KEEPALIVE_AFTER_MS,
                "everyMs": proxy::KEEPALIVE_EVERY_MS,
                "waiting": proxy::keepalive_comment(false),
                "sent": proxy::keepalive_comment(true),
            }),
            "redirect" => {
                let (status, body) =
                    proxy::redirect_answer(need("provider")?, status, text("location"));
                json!({ "status": status, "body": body })
            }
            "streamError" => json!({
                "event": proxy::answer_as_stream_error(need("provider")?, status, text("body").unwrap_or("").as_bytes()),
            }),
            _ => json!({
                "event": proxy::failure_event(need("provider")?, status, need("code")?, need("message")?),
            }),
        };
        return Ok(out.to_string());
    }
    if op == "status" {
        let status = tokenwarden_gateway::Refusal::status_of(need("code")?);
        return Ok(json!({ "status": status }).to_string());
    }
    if op == "clockAdvance" {
        let body = match v.get("body") {
            Some(Value::Object(m)) => m.clone(),
            _ => {
                return Err(ArgError::type_error(
                    "clockAdvance needs `body`, the request's JSON object".into(),
                )
                .with_field("body"));
            }
        };
        return Ok(match tokenwarden_gateway::routes::clock_advance(&body) {
            Ok(ms) => json!({ "ms": ms }).to_string(),
            Err(r) => refused(&r),
        });
    }
    if op == "ceiling" {
        let pool = v.get("pool").filter(|p| p.is_object());
        let text = tokenwarden_gateway::waitlog::ceiling_of(pool);
        return Ok(json!({ "text": text }).to_string());
    }
    if op == "printable" {
        let text = tokenwarden_gateway::waitlog::printable(need("text")?);
        return Ok(json!({ "text": text }).to_string());
    }
    if op == "route" {
        let read = tokenwarden_gateway::routes::route(&tokenwarden_gateway::routes::Request {
            method: need("method")?,
            path: need("path")?,
            query: text("query").unwrap_or(""),
            accept: text("accept"),
            upgrade: text("upgrade"),
        });
        return Ok(match read {
            Ok(r) => route_json(&r),
            Err(r) => refused(&r),
        });
    }
    let out = match op {
        "authenticate" => auth::authenticate(
            fleet.as_ref(),
            need("name")?,
            &presented,
            v.get("proxy").and_then(Value::as_bool).unwrap_or(false),
            text("credential"),
        )
        .map(|c| json!({ "agent": c.agent, "open": c.open })),
        "admin" => auth::authenticate_admin(fleet.as_ref(), &presented).map(|()| json!({})),
        "credential" => auth::agent_credential(need("secret")?, need("fleet")?, need("agent")?)
            .map(|c| json!({ "credential": c })),
        "sign" => {
            let lease = v
                .get("lease")
                .and_then(Value::as_u64)
                .ok_or_else(|| ArgError::type_error("`lease` must be an id".into()))?;
            auth::sign_handle(
                need("secret")?,
                need("fleet")?,
                need("quota")?,
                lease,
                need("epoch")?,
            )
            .map(|h| json!({ "handle": h }))
        }
        "open" => auth::open_handle(
            need("secret")?,
            need("fleet")?,
            need("quota")?,
            need("handle")?,
        )
        .map(|(id, epoch)| json!({ "id": id, "epoch": epoch })),
        "name" => auth::check_name(need("kind")?, need("name")?).map(|_| json!({})),
        other => {
            return Err(ArgError::type_error(format!("no auth rule `{other}`")).with_field("op"));
        }
    };
    Ok(match out {
        Ok(v) => v.to_string(),
        Err(r) => refused(&r),
    })
}

/// A route as JSON text: `{ route: "health" }`, `{ route: "credential", fleet, agent }` or
/// `{ route: "quota", fleet, quota, kind, … }` with `kind` one of `dashboard`, `admin`
/// (`admin`: `reset`, `hold`, `clock` or null), `handle`, `lease`, `wait` (`handle`,
/// `waitMs`), `cancel` (`handle`), `on_lease` (`handle`, `verb`: its member route),
/// `open_task`, `on_task` (`task`, `done`), `response`, `metrics` (`prometheus`),
/// `timeline`, `proxy` (`path`, `credential`), `proxy_upgrade` (`path`), `not_found`. (Written
/// field by field: building a `Value` cost the wasm build three times the code.)
#[must_use]
pub fn route_json(r: &tokenwarden_gateway::routes::Route) -> String {
    use tokenwarden_gateway::routes::{Admin, QuotaRoute, Route};
    let mut o = JsonObject::default();
    match r {
        Route::Health => o.text("route", Some("health")),
        Route::Credential { fleet, agent } => {
            o.text("route", Some("credential"));
            o.text("fleet", Some(fleet));
            o.text("agent", Some(agent));
        }
        Route::Quota {
            fleet,
            quota,
            route,
        } => {
            o.text("route", Some("quota"));
            o.text("fleet", Some(fleet));
            o.text("quota", Some(quota));
            let kind = match route {
                QuotaRoute::Dashboard => "dashboard",
                QuotaRoute::Admin(a) => {
                    o.text(
                        "admin",
                        a.map(|a| match a {
                            Admin::Reset => "reset",
                            Admin::Hold => "hold",
                            Admin::Clock => "clock",
                        }),
                    );
                    "admin"
                }
                QuotaRoute::Handle => "handle",
                QuotaRoute::Lease => "lease",
                QuotaRoute::Wait { handle, wait_ms } => {
                    o.text("handle", Some(handle));
                    o.raw("waitMs", &wait_ms.to_string());
                    "wait"
                }
                QuotaRoute::Cancel { handle } => {
                    o.text("handle", Some(handle));
                    "cancel"
                }
                QuotaRoute::OnLease { handle, verb } => {
                    o.text("handle", Some(handle));
                    o.text("verb", Some(verb.member_route()));
                    "on_lease"
                }
                QuotaRoute::OpenTask => "open_task",
                QuotaRoute::OnTask { task, done } => {
                    o.text("task", Some(task));
                    o.raw("done", if *done { "true" } else { "false" });
                    "on_task"
                }
                QuotaRoute::Response => "response",
                QuotaRoute::Metrics { prometheus } => {
                    o.raw("prometheus", if *prometheus { "true" } else { "false" });
                    "metrics"
                }
                QuotaRoute::Timeline => "timeline",
                QuotaRoute::Proxy { path, credential } => {
                    o.text("path", Some(path));
                    o.text("credential", credential.as_deref());
                    "proxy"
                }
                QuotaRoute::ProxyUpgrade { path } => {
                    o.text("path", Some(path));
                    "proxy_upgrade"
                }
                QuotaRoute::NotFound => "not_found",
            };
            o.text("kind", Some(kind));
        }
    }
    o.end()
}

/// A JSON object written field by field.
#[derive(Default)]
struct JsonObject(String);

impl JsonObject {
    fn key(&mut self, k: &str) {
        self.0.push(if self.0.is_empty() { '{' } else { ',' });
        self.0.push('"');
        self.0.push_str(k);
        self.0.push_str("\":");
    }

    /// A string field (`null` for `None`), escaped.
    fn text(&mut self, k: &str, v: Option<&str>) {
        self.key(k);
        match v.and_then(|v| serde_json::to_string(v).ok()) {
            Some(t) => self.0.push_str(&t),
            None => self.0.push_str("null"),
        }
    }

    /// A field of JSON text as it is.
    fn raw(&mut self, k: &str, v: &str) {
        self.key(k);
        self.0.push_str(v);
    }

    fn end(mut self) -> String {
        if self.0.is_empty() {
            self.0.push('{');
        }
        self.0.push('}');
        self.0
    }
}

/// An identity rule of the provider crate ([`mod@tokenwarden_provider::identity`]), as the npm
/// package exports it: `task` (`a` a task's name: its id), `agent` (`a` an agent's name: its
/// unkeyed 32-bit id) or `failure` (`a` the failing test, `b` the diff: the signature).
pub fn identity(kind: &str, a: &str, b: &str) -> Result<f64, ArgError> {
    use tokenwarden_provider::identity as id;
    let n = match kind {
        "task" => id::task_id_for(a),
        "agent" => id::agent_id_for(a),
        "failure" => id::failure_signature(a, b),
        other => {
            return Err(ArgError::range(
                "invalid_argument",
                format!("no identity rule `{other}`: task, agent or failure"),
            )
            .with_field("kind"));
        }
    };
    // Each is at most 53 bits: an exact `number`.
    #[allow(clippy::cast_precision_loss)]
    Ok(n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_answers_the_text() {
        // A golden file of the gateway crate's: the edge's JavaScript wrote this text for it.
        let input = include_str!("../../gateway/tests/fixtures/prometheus/hostile_labels.json");
        let expected = include_str!("../../gateway/tests/fixtures/prometheus/hostile_labels.txt");
        let answer: Value = serde_json::from_str(&gateway_rule(input).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer, json!({ "text": expected }));
    }

    #[test]
    fn prometheus_needs_metrics_fleet_and_quota() {
        for (input, field) in [
            (
                json!({ "op": "prometheus", "fleet": "f", "quota": "q" }),
                "metrics",
            ),
            (
                json!({ "op": "prometheus", "metrics": [], "fleet": "f", "quota": "q" }),
                "metrics",
            ),
            (
                json!({ "op": "prometheus", "metrics": {}, "quota": "q" }),
                "fleet",
            ),
            (
                json!({ "op": "prometheus", "metrics": {}, "fleet": "f", "quota": 1 }),
                "quota",
            ),
        ] {
            let e = gateway_rule(&input.to_string()).err();
            assert_eq!(e.and_then(|e| e.field).as_deref(), Some(field), "{input}");
        }
        let empty = gateway_rule(r#"{"op":"prometheus","metrics":{},"fleet":"","quota":""}"#);
        assert!(
            empty.is_ok_and(|t| t.starts_with(r##"{"text":"# HELP tokenwarden_live_leases "##))
        );
    }
}
