//! The HTTP API's routes: which one a request is, from its method, path and query, or the
//! refusal (404 naming what is not there). A host then authenticates it ([`crate::auth`]) and
//! does what the route is.
//!
//! ```text
//! GET  /  or  /healthz                                   the health answer
//! POST /v1/fleets/<fleet>/agents/<agent>/credential      mint an agent credential
//!      /v1/fleets/<fleet>/quotas/<quota>/…
//! GET    dashboard                                       the dashboard page (no secret)
//! POST   admin/reset | admin/hold | admin/clock          the operator's (admin secret)
//! POST   handle                                          one input of the core's protocol
//! POST   leases                                          a lease request
//! GET    leases/<handle>?wait=<ms>                       a long poll on a ticket
//! DELETE leases/<handle>                                 cancel
//! POST   leases/<handle>/settle | interrupted | renew
//! POST   tasks | tasks/<task>/failed | tasks/<task>/done
//! POST   responses                                       a report of a provider's answer
//! GET    metrics[?format=prometheus] | timeline
//! *      proxy/…                                         proxy mode
//! *      agents/<agent or credential>/<role>[/task/<t>][/unblocks/<n>]/<anthropic|openai>/…
//!                                                        proxy mode with a base URL alone
//! ```

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::Refusal;
use crate::auth::{check_name, is_credential};

/// An API request's body (a lease, a settle, a report) is read up to this many bytes unless
/// the host is configured otherwise (`TOKENWARDEN_MAX_BODY_BYTES`); past it, 413.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// A proxied provider request's body: up to 32 MiB (Anthropic's own request limit) unless
/// the host is configured otherwise (`TOKENWARDEN_MAX_PROXY_BODY_BYTES`); past it, 413 and
/// nothing forwarded.
pub const MAX_PROXY_BODY_BYTES: usize = 32 * 1024 * 1024;

/// A request's route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /` or `/healthz`.
    Health,
    /// `POST /v1/fleets/<fleet>/agents/<agent>/credential`: needs the fleet's own secret.
    Credential {
        /// The fleet.
        fleet: String,
        /// The agent named (percent-decoded; the rule for names is the credential's).
        agent: String,
    },
    /// A route of one quota.
    Quota {
        /// The fleet.
        fleet: String,
        /// The quota.
        quota: String,
        /// Which.
        route: QuotaRoute,
    },
}

/// The operator's routes (`…/admin/…`, the fleet's admin secret).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admin {
    /// `POST admin/reset`.
    Reset,
    /// `POST admin/hold`.
    Hold,
    /// `POST admin/clock` (tests only: where the host moves time by hand).
    Clock,
}

/// The verbs on a lease by its handle (`POST leases/<handle>/<verb>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseVerb {
    /// `settle`.
    Settle,
    /// `interrupted`.
    Interrupted,
    /// `renew`.
    Renew,
}

impl LeaseVerb {
    /// The member route ([`crate::members::Members::route`]) it is.
    #[must_use]
    pub fn member_route(self) -> &'static str {
        match self {
            LeaseVerb::Settle => "settle",
            LeaseVerb::Interrupted => "interrupted",
            LeaseVerb::Renew => "renew",
        }
    }
}

/// A route of one quota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuotaRoute {
    /// `GET dashboard`: the page carries no data and needs no secret.
    Dashboard,
    /// `POST admin/…`: any other admin path is a 404 *after* the admin secret is checked.
    Admin(Option<Admin>),
    /// `POST handle`.
    Handle,
    /// `POST leases`.
    Lease,
    /// `GET leases/<handle>?wait=<ms>`.
    Wait {
        /// The handle, as the path gives it.
        handle: String,
        /// How long to hold the poll (ms, as asked; the members' rule bounds it).
        wait_ms: u64,
    },
    /// `DELETE leases/<handle>`.
    Cancel {
        /// The handle.
        handle: String,
    },
    /// `POST leases/<handle>/<verb>`.
    OnLease {
        /// The handle.
        handle: String,
        /// The verb.
        verb: LeaseVerb,
    },
    /// `POST tasks`.
    OpenTask,
    /// `POST tasks/<task>/failed` or `…/done`.
    OnTask {
        /// The task's id or name, percent-decoded.
        task: String,
        /// `true` for `done`, `false` for `failed`.
        done: bool,
    },
    /// `POST responses`.
    Response,
    /// `GET metrics`: as Prometheus text with `?format=prometheus` or an `Accept` of
    /// `text/plain`.
    Metrics {
        /// Prometheus text rather than JSON.
        prometheus: bool,
    },
    /// `GET timeline`.
    Timeline,
    /// Proxy mode: `path` is `/proxy/…` (the base-URL form rewritten to it, its segments
    /// still percent-encoded), with a credential the path gave in place of the agent's
    /// name.
    Proxy {
        /// `/proxy/…`.
        path: String,
        /// An agent credential given in the path.
        credential: Option<String>,
    },
    /// A WebSocket upgrade to the proxy (`path` as for [`QuotaRoute::Proxy`]): 426, in the
    /// provider's error format (Codex then falls back to HTTP at once).
    ProxyUpgrade {
        /// `/proxy/…`.
        path: String,
    },
    /// Nothing here (after authentication: an unauthenticated caller learns nothing).
    NotFound,
}

/// What a host read of a request to route it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The method.
    pub method: &'a str,
    /// The URL's path, still percent-encoded.
    pub path: &'a str,
    /// The URL's query string (`?…` or empty).
    pub query: &'a str,
    /// The `Accept` header.
    pub accept: Option<&'a str>,
    /// The `Upgrade` header.
    pub upgrade: Option<&'a str>,
}

fn not_found(message: &str) -> Refusal {
    Refusal::new(404, "not_found", message.into())
}

/// A path segment, percent-decoded; a malformed escape (or one that is not UTF-8) is a 404,
/// like any unknown name.
pub fn decoded(segment: &str) -> Result<String, Refusal> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| core::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(v) = hex else {
                return Err(not_found(
                    "no such route: malformed percent-encoding in the path",
                ));
            };
            out.push(v);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| not_found("no such route: malformed percent-encoding in the path"))
}

/// The value of query parameter `name` (the first), as written.
fn param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .trim_start_matches('?')
        .split('&')
        .find_map(|kv| match kv.split_once('=') {
            Some((k, v)) if k == name => Some(v),
            None if kv == name => Some(""),
            _ => None,
        })
}

/// The route of a request, or the refusal (404 for a path that names nothing, 400 for a
/// `wait` that is not milliseconds).
pub fn route(req: &Request<'_>) -> Result<Route, Refusal> {
    let path = req.path;
    if path == "/" || path == "/healthz" {
        return Ok(Route::Health);
    }
    let Some(after) = path.strip_prefix("/v1/fleets/") else {
        return Err(not_found("no such route; see API.md"));
    };
    let (fleet_seg, rest) = after.split_once('/').unwrap_or((after, ""));
    if let Some(tail) = rest.strip_prefix("agents/") {
        if let Some((agent, "credential")) = tail.split_once('/') {
            if !agent.is_empty() && req.method == "POST" {
                let fleet = decoded(fleet_seg)?;
                check_name("fleet", &fleet)?;
                return Ok(Route::Credential {
                    fleet,
                    agent: decoded(agent)?,
                });
            }
        }
    }
    let Some(tail) = rest.strip_prefix("quotas/") else {
        return Err(not_found("no such route; see API.md"));
    };
    let (quota_seg, rest) = match tail.find('/') {
        Some(i) => (&tail[..i], &tail[i..]),
        None => (tail, "/"),
    };
    if fleet_seg.is_empty() || quota_seg.is_empty() {
        return Err(not_found("no such route; see API.md"));
    }
    let fleet = decoded(fleet_seg)?;
    check_name("fleet", &fleet)?;
    let quota = decoded(quota_seg)?;
    check_name("quota", &quota)?;
    let route = quota_route(req, rest)?;
    Ok(Route::Quota {
        fleet,
        quota,
        route,
    })
}

fn quota_route(req: &Request<'_>, rest: &str) -> Result<QuotaRoute, Refusal> {
    let method = req.method;
    if method == "GET" && rest == "/dashboard" {
        return Ok(QuotaRoute::Dashboard);
    }
    // The base-URL form for tools that can set nothing else.
    let (rest, credential) = match agent_path(rest)? {
        Some((path, credential)) => (path, credential),
        None => (String::from(rest), None),
    };
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    if parts.first() == Some(&"admin") {
        let admin = match (method, rest.as_str()) {
            ("POST", "/admin/reset") => Some(Admin::Reset),
            ("POST", "/admin/hold") => Some(Admin::Hold),
            ("POST", "/admin/clock") => Some(Admin::Clock),
            _ => None,
        };
        return Ok(QuotaRoute::Admin(admin));
    }
    let proxy = parts.first() == Some(&"proxy") && method != "OPTIONS" && method != "HEAD";
    if proxy {
        if req
            .upgrade
            .is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
        {
            return Ok(QuotaRoute::ProxyUpgrade { path: rest });
        }
        return Ok(QuotaRoute::Proxy {
            path: rest,
            credential,
        });
    }
    Ok(match (method, parts.as_slice()) {
        ("POST", ["handle"]) if rest == "/handle" => QuotaRoute::Handle,
        ("POST", ["leases"]) if rest == "/leases" => QuotaRoute::Lease,
        ("GET", ["leases", handle]) => {
            let wait = param(req.query, "wait").unwrap_or("0");
            let ms = (1..=6)
                .contains(&wait.len())
                .then(|| wait.parse::<u64>().ok())
                .flatten()
                .filter(|_| wait.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    Refusal::new(
                        400,
                        "invalid_argument",
                        "`wait` must be milliseconds (0 to 30000)".into(),
                    )
                })?;
            QuotaRoute::Wait {
                handle: (*handle).to_string(),
                wait_ms: ms,
            }
        }
        ("DELETE", ["leases", handle]) => QuotaRoute::Cancel {
            handle: (*handle).to_string(),
        },
        ("POST", ["leases", handle, verb]) => {
            let verb = match *verb {
                "settle" => LeaseVerb::Settle,
                "interrupted" => LeaseVerb::Interrupted,
                "renew" => LeaseVerb::Renew,
                _ => return Ok(QuotaRoute::NotFound),
            };
            QuotaRoute::OnLease {
                handle: (*handle).to_string(),
                verb,
            }
        }
        ("POST", ["tasks"]) if rest == "/tasks" => QuotaRoute::OpenTask,
        ("POST", ["tasks", task, verb @ ("failed" | "done")]) => QuotaRoute::OnTask {
            task: decoded(task)?,
            done: *verb == "done",
        },
        ("POST", ["responses"]) if rest == "/responses" => QuotaRoute::Response,
        ("GET", ["metrics"]) if rest == "/metrics" => QuotaRoute::Metrics {
            prometheus: param(req.query, "format") == Some("prometheus")
                || req.accept.is_some_and(|a| a.contains("text/plain")),
        },
        ("GET", ["timeline"]) if rest == "/timeline" => QuotaRoute::Timeline,
        _ => QuotaRoute::NotFound,
    })
}

const ROLES: [&str; 4] = ["planner", "reviewer", "worker", "auto"];

/// `/agents/a1/worker/task/fix/anthropic/v1/messages` → `/proxy/agent/a1/role/worker/task/fix/v1/messages`;
/// `/agents/a1/worker/openai/chat/completions` → `…/v1/chat/completions` (the OpenAI SDKs'
/// base URL usually ends in `/v1`, which may be left out here); `None` for any other path.
/// An agent credential in place of the name is answered beside the path (the call is that
/// agent's). Segments stay percent-encoded; the proxy decodes and checks them.
fn agent_path(rest: &str) -> Result<Option<(String, Option<String>)>, Refusal> {
    let p: Vec<&str> = rest.split('/').collect();
    if p.get(1) != Some(&"agents") || p.len() < 5 {
        return Ok(None);
    }
    let credential = is_credential(p[2]).then(|| String::from(p[2]));
    let agent = match &credential {
        Some(c) => c.split('.').nth(2).unwrap_or(""),
        None => p[2],
    };
    let role = p[3];
    if !ROLES.contains(&role) {
        return Err(not_found(&format!(
            "no such route: the role in /agents/<agent>/<role>/… must be planner, reviewer, worker or auto, got {role:?}"
        )));
    }
    let mut i = 4;
    let mut extra = Vec::new();
    while matches!(p.get(i), Some(&("task" | "unblocks"))) && i + 1 < p.len() {
        extra.push(p[i]);
        extra.push(p[i + 1]);
        i += 2;
    }
    let provider = p.get(i).copied().unwrap_or("");
    let mut tail = format!("/{}", p.get(i + 1..).unwrap_or(&[]).join("/"));
    if provider == "openai" && !tail.starts_with("/v1/") {
        tail = format!("/v1{tail}");
    }
    if provider != "anthropic" && provider != "openai" {
        return Err(not_found(
            "no such route: /agents/<agent>/<role>/[task/<t>/][unblocks/<n>/] must be followed by anthropic or openai",
        ));
    }
    let mut path = format!("/proxy/agent/{agent}/role/{role}");
    for seg in extra {
        path.push('/');
        path.push_str(seg);
    }
    path.push_str(&tail);
    Ok(Some((path, credential)))
}

/// The longest a test may move a quota's clock in one `POST …/admin/clock`, ms (a day).
pub const MAX_CLOCK_ADVANCE_MS: u64 = 86_400_000;

/// The body of `POST …/admin/clock` (tests only: `TOKENWARDEN_TEST_CLOCK=1`),
/// `{ advanceMs }`: how far to move the quota's clock, ms; 400 naming the field otherwise.
pub fn clock_advance(body: &serde_json::Map<String, serde_json::Value>) -> Result<u64, Refusal> {
    if let Some(k) = body.keys().find(|k| *k != "advanceMs") {
        return Err(Refusal::new(
            400,
            "invalid_argument",
            format!("unknown field `{k}` in the body"),
        )
        .with_field(k.as_str()));
    }
    body.get("advanceMs")
        .and_then(serde_json::Value::as_u64)
        .filter(|ms| *ms <= MAX_CLOCK_ADVANCE_MS)
        .ok_or_else(|| {
            Refusal::new(
                400,
                "invalid_argument",
                format!("`advanceMs` must be an integer number of milliseconds from 0 to {MAX_CLOCK_ADVANCE_MS}"),
            )
            .with_field("advanceMs")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_advance_is_a_whole_day_at_most_and_nothing_else() {
        let body = |t: &str| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(t).unwrap()
        };
        assert_eq!(clock_advance(&body(r#"{"advanceMs":1500}"#)), Ok(1500));
        assert_eq!(
            clock_advance(&body(r#"{"advanceMs":86400000}"#)),
            Ok(MAX_CLOCK_ADVANCE_MS)
        );
        for bad in [
            r#"{"advanceMs":86400001}"#,
            r#"{"advanceMs":-1}"#,
            r#"{"advanceMs":1.5}"#,
            r#"{}"#,
        ] {
            assert_eq!(
                clock_advance(&body(bad)).unwrap_err().field.as_deref(),
                Some("advanceMs"),
                "{bad}"
            );
        }
        let r = clock_advance(&body(r#"{"advanceMs":1,"by":2}"#)).unwrap_err();
        assert_eq!((r.status, r.field.as_deref()), (400, Some("by")));
    }

    fn get(
        method: &'static str,
        path: &'static str,
        query: &'static str,
    ) -> Result<Route, Refusal> {
        route(&Request {
            method,
            path,
            query,
            accept: None,
            upgrade: None,
        })
    }

    fn quota_route_of(r: Result<Route, Refusal>) -> QuotaRoute {
        match r {
            Ok(Route::Quota { route, .. }) => route,
            other => panic!("{other:?}"),
        }
    }

    const Q: &str = "/v1/fleets/f/quotas/q";

    #[test]
    fn every_route() {
        let at = |m: &'static str, rest: &str, query: &'static str| {
            let path: &'static str = alloc::boxed::Box::leak(format!("{Q}{rest}").into_boxed_str());
            quota_route_of(get(m, path, query))
        };
        assert_eq!(get("GET", "/healthz", ""), Ok(Route::Health));
        assert_eq!(
            get("POST", "/v1/fleets/f/agents/al%69ce/credential", ""),
            Ok(Route::Credential {
                fleet: "f".into(),
                agent: "alice".into()
            })
        );
        assert_eq!(at("GET", "/dashboard", ""), QuotaRoute::Dashboard);
        assert_eq!(
            at("POST", "/admin/hold", ""),
            QuotaRoute::Admin(Some(Admin::Hold))
        );
        assert_eq!(at("GET", "/admin/hold", ""), QuotaRoute::Admin(None));
        assert_eq!(at("POST", "/handle", ""), QuotaRoute::Handle);
        assert_eq!(at("POST", "/leases", ""), QuotaRoute::Lease);
        assert_eq!(
            at("GET", "/leases/tw2.x", "?wait=5000"),
            QuotaRoute::Wait {
                handle: "tw2.x".into(),
                wait_ms: 5000
            }
        );
        assert_eq!(
            at("DELETE", "/leases/h", ""),
            QuotaRoute::Cancel { handle: "h".into() }
        );
        assert_eq!(
            at("POST", "/leases/h/renew", ""),
            QuotaRoute::OnLease {
                handle: "h".into(),
                verb: LeaseVerb::Renew
            }
        );
        assert_eq!(at("POST", "/leases/h/x", ""), QuotaRoute::NotFound);
        assert_eq!(
            at("POST", "/tasks/fix%2Dlogin/done", ""),
            QuotaRoute::OnTask {
                task: "fix-login".into(),
                done: true
            }
        );
        assert_eq!(
            at("GET", "/metrics", "?format=prometheus"),
            QuotaRoute::Metrics { prometheus: true }
        );
        assert_eq!(
            at("POST", "/proxy/v1/messages", ""),
            QuotaRoute::Proxy {
                path: "/proxy/v1/messages".into(),
                credential: None
            }
        );
        assert_eq!(at("HEAD", "/proxy/v1/messages", ""), QuotaRoute::NotFound);
        assert_eq!(at("GET", "/nothing", ""), QuotaRoute::NotFound);
    }

    #[test]
    fn the_base_url_form_is_proxy_mode() {
        let at = |rest: &str| {
            let path: &'static str = alloc::boxed::Box::leak(format!("{Q}{rest}").into_boxed_str());
            quota_route_of(get("POST", path, ""))
        };
        assert_eq!(
            at("/agents/a1/worker/task/fix/anthropic/v1/messages"),
            QuotaRoute::Proxy {
                path: "/proxy/agent/a1/role/worker/task/fix/v1/messages".into(),
                credential: None
            }
        );
        assert_eq!(
            at("/agents/twa1.f.bob.MAC/planner/openai/chat/completions"),
            QuotaRoute::Proxy {
                path: "/proxy/agent/bob/role/planner/v1/chat/completions".into(),
                credential: Some("twa1.f.bob.MAC".into())
            }
        );
        for bad in [
            "/agents/a1/boss/anthropic/v1/messages",
            "/agents/a1/worker/gemini/v1/x",
        ] {
            let path: &'static str = alloc::boxed::Box::leak(format!("{Q}{bad}").into_boxed_str());
            assert_eq!(get("POST", path, "").unwrap_err().status, 404, "{bad}");
        }
    }

    #[test]
    fn refusals() {
        assert_eq!(get("GET", "/v2", "").unwrap_err().status, 404);
        assert_eq!(
            get("GET", "/v1/fleets/a%zz/quotas/q/metrics", "")
                .unwrap_err()
                .status,
            404
        );
        assert_eq!(
            get("GET", "/v1/fleets/a b/quotas/q/metrics", "")
                .unwrap_err()
                .message,
            "no such fleet"
        );
        let e = get("GET", "/v1/fleets/f/quotas/q/leases/h", "?wait=1e3").unwrap_err();
        assert_eq!(
            (e.status, e.message.as_str()),
            (400, "`wait` must be milliseconds (0 to 30000)")
        );
        let upgrade = route(&Request {
            method: "GET",
            path: "/v1/fleets/f/quotas/q/proxy/v1/responses",
            query: "",
            accept: None,
            upgrade: Some("WebSocket"),
        });
        assert_eq!(
            quota_route_of(upgrade),
            QuotaRoute::ProxyUpgrade {
                path: "/proxy/v1/responses".into()
            }
        );
    }
}
