//! The HTTP API (see edge/API.md): each request routed, authenticated and answered by the
//! gateway crate's rules, with this process's coordinators.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request};
use http_body::Body as _;
use hyper::body::Incoming;
use serde_json::{Map, Value, json};
use tokenwarden_gateway::Refusal;
use tokenwarden_gateway::answers::{lease_answer, verb_answer};
use tokenwarden_gateway::auth::{self, Presented};
use tokenwarden_gateway::config::Fleets;
use tokenwarden_gateway::json::camel_keys;
use tokenwarden_gateway::limiter;
use tokenwarden_gateway::routes::{self, Admin, QuotaRoute, Route};

use crate::cluster::{FORWARDED, Role, forward};
use crate::proxy::{self, Upstream};
use crate::quota::{Live, Quota};
use crate::reply::{Failure, Reply, json, refusal};

/// A request body (not a proxied one) read whole up to this many bytes, and a proxied one:
/// the gateway crate's defaults.
pub(crate) use tokenwarden_gateway::routes::{
    MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES, MAX_PROXY_BODY_BYTES as DEFAULT_MAX_PROXY_BODY_BYTES,
};
/// What is read of a body no route takes, so the connection stays usable.
const DRAIN_BYTES: usize = 1024 * 1024;

/// How the server runs.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// `POST …/admin/clock` moves a quota's clock by hand (tests only).
    pub(crate) test_clock: bool,
    /// The largest body of an API call.
    pub(crate) max_body: usize,
    /// The largest body of a proxied call.
    pub(crate) max_proxy_body: usize,
}

/// The server: the fleets and their quotas.
pub(crate) struct App {
    pub(crate) fleets: Fleets,
    pub(crate) quotas: BTreeMap<(String, String), Arc<Quota>>,
    pub(crate) options: Options,
}

/// The Unix time, ms.
pub(crate) fn unix_now() -> u64 {
    #[expect(clippy::disallowed_methods, reason = "the host owns the wall clock")]
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    t.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A request's body, whole, up to `max` bytes (413 beyond).
pub(crate) async fn read_body(
    body: &mut Incoming,
    declared: Option<&str>,
    max: usize,
) -> Result<Bytes, Failure> {
    let too_large = || {
        refusal(
            413,
            "body_too_large",
            format!("the request body is larger than {max} bytes"),
        )
    };
    if declared
        .and_then(|d| d.parse::<u64>().ok())
        .is_some_and(|n| n > max as u64)
    {
        return Err(too_large());
    }
    let mut out = BytesMut::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx)).await
    {
        let frame = frame.map_err(|e| {
            refusal(
                400,
                "invalid_body",
                format!("the request body could not be read: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(too_large());
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

/// Reads (up to [`DRAIN_BYTES`]) a body no route took, so the connection stays usable.
async fn drain(body: &mut Incoming) {
    let mut seen = 0;
    while seen <= DRAIN_BYTES {
        match std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx)).await {
            Some(Ok(frame)) => seen += frame.data_ref().map_or(0, Bytes::len),
            _ => return,
        }
    }
}

/// A JSON object from a body (400 naming what is wrong: the gateway crate's rule).
pub(crate) fn json_object(bytes: &[u8]) -> Result<Map<String, Value>, Failure> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| refusal(400, "invalid_json", "the request body is not JSON"))?;
    Ok(tokenwarden_gateway::json::parse_object(text)?)
}

impl App {
    /// One request's answer.
    pub(crate) async fn serve(self: Arc<App>, req: Request<Incoming>) -> Result<Reply, Infallible> {
        let (parts, mut body) = req.into_parts();
        let res = self.route(&parts, &mut body).await;
        drain(&mut body).await;
        Ok(res.unwrap_or_else(|(f, provider)| f.reply(provider)))
    }

    async fn route(
        &self,
        parts: &http::request::Parts,
        body: &mut Incoming,
    ) -> Result<Reply, (Failure, Option<tokenwarden_provider::estimate::Provider>)> {
        let h = &parts.headers;
        let path = parts.uri.path();
        let query = parts
            .uri
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let r = routes::route(&routes::Request {
            method: parts.method.as_str(),
            path,
            query: &query,
            accept: header_str(h, "accept"),
            upgrade: header_str(h, "upgrade"),
        })
        .map_err(|r| (Failure::from(r), None))?;
        let presented = Presented {
            token: header_str(h, "x-tokenwarden-token"),
            authorization: header_str(h, "authorization"),
        };
        let plain = |r: Result<Reply, Failure>| r.map_err(|f| (f, None));
        let (fleet, quota, qr) = match r {
            Route::Health => {
                return Ok(json(
                    200,
                    &json!({ "ok": true, "service": "tokenwarden serve" }),
                ));
            }
            Route::Credential { fleet, agent } => {
                return plain(self.credential(&fleet, &agent, &presented));
            }
            Route::Quota {
                fleet,
                quota,
                route,
            } => (fleet, quota, route),
        };
        let f = self.fleets.fleets.get(&fleet);
        // The dashboard page carries no data and needs no secret: it asks for it and then
        // fetches the metrics with it.
        if qr == QuotaRoute::Dashboard {
            let base = format!("/v1/fleets/{fleet}/quotas/{quota}");
            let mut res = http::Response::new(crate::reply::full(crate::dashboard::page(
                &fleet, &quota, &base,
            )));
            let h = res.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/html; charset=utf-8"),
            );
            h.insert(
                http::header::CACHE_CONTROL,
                http::HeaderValue::from_static("no-store"),
            );
            h.insert("x-frame-options", http::HeaderValue::from_static("DENY"));
            h.insert(
                "content-security-policy",
                http::HeaderValue::from_static(crate::dashboard::CSP),
            );
            return Ok(res);
        }
        // In a cluster, the quota's owner answers: a follower forwards the request as it came
        // (the owner authenticates it); an owner whose term lapsed answers nothing until it
        // knows again; with no owner known this instance answers from its share.
        if let Some(seat) = self
            .quotas
            .get(&(fleet.clone(), quota.clone()))
            .and_then(|q| q.seat.as_ref())
        {
            match seat.role() {
                Role::Follower(url) if !h.contains_key(FORWARDED) => {
                    return plain(
                        forward(seat, &url, parts, body, self.options.max_proxy_body).await,
                    );
                }
                Role::Follower(_) => {
                    return plain(Err(refusal(
                        503,
                        limiter::OWNER_MOVED,
                        "this instance does not own the quota (it moved while the request was forwarded); retry",
                    )));
                }
                Role::Owner(_) if !seat.owns() => {
                    return plain(Err(refusal(
                        503,
                        limiter::OWNER_LAPSED,
                        "this instance's owner lease of the quota lapsed and is being renewed or handed on; retry",
                    )));
                }
                Role::Owner(_) | Role::Unknown => {}
            }
        }
        if let QuotaRoute::Admin(admin) = qr {
            return plain(self.admin(&fleet, &quota, admin, &presented, body, h).await);
        }
        let is_proxy = matches!(
            qr,
            QuotaRoute::Proxy { .. } | QuotaRoute::ProxyUpgrade { .. }
        );
        let provider = match &qr {
            QuotaRoute::Proxy { path, .. } | QuotaRoute::ProxyUpgrade { path } => {
                tokenwarden_gateway::proxy::proxied_provider(
                    &path["/proxy".len()..],
                    h.contains_key("anthropic-version"),
                )
                .and_then(tokenwarden_provider::estimate::Provider::from_name)
            }
            _ => None,
        };
        let fail = |f: Failure| (f, provider);
        let credential = match &qr {
            QuotaRoute::Proxy {
                credential: Some(c),
                ..
            } if presented.token.is_none() => Some(c.as_str()),
            _ => None,
        };
        let caller = auth::authenticate(f, &fleet, &presented, is_proxy, credential)
            .map_err(|r| fail(r.into()))?;
        let Some(q) = self.quotas.get(&(fleet.clone(), quota.clone())) else {
            return Err(fail(refusal(
                404,
                "not_found",
                "no such quota in this fleet",
            )));
        };
        // A remote driver names its process (only an authenticated caller is counted: a
        // secretless one cannot inflate the count).
        let client = if caller.open {
            None
        } else {
            header_str(h, "x-tokenwarden-client")
        };
        let now = unix_now();
        let clients = q.seen(client, now);
        let who = caller.agent.as_deref();
        let max = self.options.max_body;
        let declared = header_str(h, "content-length");
        let live = q.live();
        match qr {
            QuotaRoute::Handle => {
                let mut input = json_object(&read_body(body, declared, max).await.map_err(fail)?)
                    .map_err(fail)?;
                match input.get("lease") {
                    Some(Value::String(handle)) => {
                        let id = opened(q, &live, handle).map_err(fail)?;
                        input.insert("lease".into(), Value::from(id));
                    }
                    None | Some(Value::Null) => {}
                    Some(_) => {
                        return Err(fail(Refusal::new(400, "invalid_argument", "`lease` must be a lease handle an earlier answer gave (tw2.…), not a number".into()).with_field("lease").into()));
                    }
                }
                let (_, mut out) = q
                    .member(&live, "handle", None, who, &Value::Object(input))
                    .map_err(|r| fail(r.into()))?;
                sign(q, &live, &mut out["lease"]);
                if let Some(w) = out.get_mut("wait").filter(|w| w.is_object()) {
                    sign(q, &live, &mut w["ticket"]);
                }
                out["clients"] = Value::from(clients);
                Ok(self.written(q, &live, json(200, &out)).await)
            }
            QuotaRoute::Lease => {
                let b = json_object(&read_body(body, declared, max).await.map_err(fail)?)
                    .map_err(fail)?;
                let (_, out) = q
                    .member(&live, "lease", None, who, &Value::Object(b))
                    .map_err(|r| fail(r.into()))?;
                let Some((status, mut answer)) = lease_answer(&out, live.tw.now().0, clients)
                else {
                    return Err(fail(refusal(
                        500,
                        "internal",
                        "call_lease answered no lease step",
                    )));
                };
                sign(q, &live, &mut answer["lease"]);
                Ok(self.written(q, &live, json(status, &answer)).await)
            }
            QuotaRoute::Wait { handle, wait_ms } => {
                let id = opened(q, &live, &handle).map_err(fail)?;
                let (status, mut b) = q.wait(id, who, wait_ms).await.map_err(|r| fail(r.into()))?;
                b["lease"] = Value::from(id);
                sign(q, &live, &mut b["lease"]);
                // A grant is answered once it is saved, as every change a reply acknowledges
                // is: a restart (or, in a cluster, the next owner) knows the lease.
                if status == 200 {
                    return Ok(self.written(q, &live, json(status, &b)).await);
                }
                Ok(json(status, &b))
            }
            QuotaRoute::Cancel { handle } => {
                let id = opened(q, &live, &handle).map_err(fail)?;
                q.member(&live, "cancel", Some(&Value::from(id)), who, &json!({}))
                    .map_err(|r| fail(r.into()))?;
                Ok(self
                    .written(q, &live, json(200, &json!({ "cancelled": true })))
                    .await)
            }
            QuotaRoute::OnLease { handle, verb } => {
                let id = opened(q, &live, &handle).map_err(fail)?;
                let b = json_object(&read_body(body, declared, max).await.map_err(fail)?)
                    .map_err(fail)?;
                let route = verb.member_route();
                let (input, out) = q
                    .member(&live, route, Some(&Value::from(id)), who, &Value::Object(b))
                    .map_err(|r| fail(r.into()))?;
                Ok(self
                    .written(q, &live, json(200, &verb_answer(route, &input, &out)))
                    .await)
            }
            QuotaRoute::OpenTask | QuotaRoute::OnTask { .. } => {
                let b = json_object(&read_body(body, declared, max).await.map_err(fail)?)
                    .map_err(fail)?;
                let (route, id) = match qr {
                    QuotaRoute::OnTask { task, done } => (
                        if done { "task-done" } else { "task-failed" },
                        Some(Value::String(task)),
                    ),
                    _ => ("task", None),
                };
                let (input, out) = q
                    .member(&live, route, id.as_ref(), who, &Value::Object(b))
                    .map_err(|r| fail(r.into()))?;
                Ok(self
                    .written(q, &live, json(200, &verb_answer(route, &input, &out)))
                    .await)
            }
            QuotaRoute::Response => {
                let mut b = json_object(&read_body(body, declared, max).await.map_err(fail)?)
                    .map_err(fail)?;
                let lease = match b.get("lease") {
                    Some(Value::String(handle)) => {
                        Value::from(opened(q, &live, handle).map_err(fail)?)
                    }
                    _ => Value::Null,
                };
                b.insert("lease".into(), lease);
                let (input, out) = q
                    .member(&live, "response", None, who, &Value::Object(b))
                    .map_err(|r| fail(r.into()))?;
                Ok(self
                    .written(q, &live, json(200, &verb_answer("response", &input, &out)))
                    .await)
            }
            QuotaRoute::Metrics { prometheus } => {
                let m = metrics(q, &live);
                if prometheus {
                    use tokenwarden_gateway::prometheus;
                    let mut res = http::Response::new(crate::reply::full(prometheus::text(
                        &m, &fleet, &quota,
                    )));
                    res.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static(prometheus::CONTENT_TYPE),
                    );
                    return Ok(res);
                }
                Ok(json(200, &m))
            }
            QuotaRoute::Timeline => {
                let pools = pool_names(q);
                let now = live.tw.now().0;
                let side = q.side();
                let view = side.timeline.view(
                    now,
                    |id| side.members.name_of(id).map(str::to_owned),
                    &pools,
                );
                drop(side);
                Ok(json(200, &view))
            }
            QuotaRoute::Dashboard => {
                unreachable!("the dashboard is answered before authentication")
            }
            QuotaRoute::ProxyUpgrade { .. } => Err(fail(refusal(
                426,
                "websocket_not_supported",
                "tokenwarden proxies HTTP only: send the call as an HTTP request (the Responses API streams over server-sent events with \"stream\": true)",
            ))),
            QuotaRoute::Proxy { path, .. } => {
                let secrets: Vec<&str> = f
                    .map(|f| {
                        [Some(f.secret.as_str()), f.admin_secret.as_deref()]
                            .into_iter()
                            .flatten()
                            .collect()
                    })
                    .unwrap_or_default();
                let max = self.options.max_proxy_body;
                proxy::call(
                    &Upstream::here(),
                    q,
                    &live,
                    parts,
                    body,
                    &path,
                    &query,
                    &secrets,
                    who,
                    max,
                )
                .await
                .map_err(fail)
            }
            QuotaRoute::NotFound | QuotaRoute::Admin(_) => {
                Err(fail(refusal(404, "not_found", "no such route; see API.md")))
            }
        }
    }

    /// `res` once the change it answers, made on `live`'s coordinator, is on disk (an
    /// acknowledged lease is never lost). The writes save the whole state, so a write that
    /// lands after the change carries it — unless `live` was replaced meanwhile (a reset,
    /// or in a cluster another term or a share), which makes the change not acknowledged.
    async fn written(&self, q: &Quota, live: &Live, res: Reply) -> Reply {
        let n = q.store.changed(Duration::ZERO);
        let saved = q.store.written(n).await;
        if saved && !live.tw.is_closed() {
            return res;
        }
        // In a cluster: the change was not saved under this instance's term (it ended, or the
        // store did not answer), so it is not acknowledged.
        refusal(
            503,
            limiter::NOT_SAVED,
            "the change could not be saved under this instance's state of the quota (replaced, or in a cluster its owner term ended or the store did not answer); retry",
        )
        .reply(None)
    }

    fn credential(
        &self,
        fleet: &str,
        agent: &str,
        presented: &Presented<'_>,
    ) -> Result<Reply, Failure> {
        let f = self.fleets.fleets.get(fleet);
        let caller = auth::authenticate(f, fleet, presented, false, None)?;
        if caller.agent.is_some() {
            return Err(refusal(
                403,
                "forbidden",
                "an agent credential cannot mint credentials: use the fleet secret",
            ));
        }
        let secret = f.map(|f| f.secret.as_str()).unwrap_or_default();
        let credential = auth::agent_credential(secret, fleet, agent)?;
        Ok(json(
            200,
            &json!({ "agent": agent, "credential": credential }),
        ))
    }

    async fn admin(
        &self,
        fleet: &str,
        quota: &str,
        admin: Option<Admin>,
        presented: &Presented<'_>,
        body: &mut Incoming,
        h: &HeaderMap,
    ) -> Result<Reply, Failure> {
        auth::authenticate_admin(self.fleets.fleets.get(fleet), presented)?;
        let Some(q) = self.quotas.get(&(fleet.to_owned(), quota.to_owned())) else {
            return Err(refusal(404, "not_found", "no such quota in this fleet"));
        };
        let live = q.live();
        let declared = header_str(h, "content-length");
        match admin {
            Some(Admin::Reset) => {
                let ended = q
                    .reset(unix_now())
                    .map_err(|e| refusal(500, "internal", e))?;
                let fresh = q.live();
                Ok(self
                    .written(
                        q,
                        &fresh,
                        json(200, &json!({ "reset": true, "ended": ended })),
                    )
                    .await)
            }
            Some(Admin::Hold) => {
                let b = json_object(&read_body(body, declared, self.options.max_body).await?)?;
                let (pool, until) = q.hold(&live, &Value::Object(b))?;
                Ok(self
                    .written(
                        q,
                        &live,
                        json(200, &json!({ "held": true, "pool": pool, "until": until })),
                    )
                    .await)
            }
            Some(Admin::Clock) if self.options.test_clock => {
                let b = json_object(&read_body(body, declared, self.options.max_body).await?)?;
                let ms = routes::clock_advance(&b)?;
                Ok(json(200, &json!({ "now": live.tw.advance(ms).0 })))
            }
            _ => Err(refusal(404, "not_found", "no such admin route; see API.md")),
        }
    }
}

/// A lease's id from its handle: 403 another quota's, 404 a forged one or one from before
/// a reset.
fn opened(q: &Quota, live: &Live, handle: &str) -> Result<u64, Failure> {
    let (id, epoch) = auth::open_handle(q.secret(), &q.fleet, &q.name, handle)?;
    if epoch != live.epoch {
        return Err(refusal(
            404,
            "unknown_lease",
            "no such lease: this handle is from before the quota was reset",
        ));
    }
    Ok(id)
}

/// A lease id in an answer, as its signed handle.
fn sign(q: &Quota, live: &Live, v: &mut Value) {
    if let Some(id) = v.as_u64()
        && let Ok(h) = auth::sign_handle(q.secret(), &q.fleet, &q.name, id, &live.epoch)
    {
        *v = Value::String(h);
    }
}

/// The quota's pools by name, in order.
fn pool_names(q: &Quota) -> Vec<String> {
    q.conf.config.pools.iter().map(|p| p.name.clone()).collect()
}

/// The coordinator's metrics (camelCase), each agent's name beside its id, and the
/// ceilings hit (429s by limit, refusals by reason: the timeline's counters): the member
/// table's rule.
fn metrics(q: &Quota, live: &Live) -> Value {
    let m = live
        .tw
        .inspect(|c, now| serde_json::to_value(c.metrics(now)).map(camel_keys));
    let mut m = m.unwrap_or(Value::Null);
    let side = q.side();
    let ceilings = side.timeline.ceilings(&pool_names(q));
    side.members.name_metrics(&mut m, Some(ceilings));
    m
}
