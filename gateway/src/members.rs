//! The members of one quota: what a member of the fleet may send through the HTTP API
//! (`POST …/handle`, and the per-verb routes that are shapes of it), checked against who it
//! is, and the table of the leases and tickets members hold.
//!
//! A member sends one of the core's inputs ([`MEMBER_INPUTS`]) in the HTTP API's shape:
//! camelCase fields, an agent or a family by name or number, a pool by name or index, a task
//! by id or name, leases as the gateway's own ids (the host opens and signs the handles).
//! [`Members::check`] answers the core's [`Input`] for it, or the [`Refusal`] a host sends
//! back: who may act comes first (a lease of another agent's is 403, one never issued 404,
//! whatever the body holds), then the fields (400 naming the first one at fault). The host
//! applies the input to its coordinator and hands the output to [`Members::applied`], which
//! keeps the table: a lease granted or a ticket queued for a member is recorded with its
//! agent (and the full name it was asked under), an ended one dropped. The coordinator's
//! events keep it too ([`Members::event`]: a grant from the line, a promise revised, an
//! expiry), and say which long polls to answer now ([`Members::take_wakes`]).
//! [`Members::apply`] does the three steps for a host that holds the coordinator itself.
//!
//! An agent credential is a [`Who`]: it acts only for its own agent (a request naming another
//! is 403) and only on its own agent's leases and tasks. The fleet's secret acts for any.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::{Map, Value, json};
use tokenwarden_core::{Coordinator, Event, Input, LeaseError, Millis, Output};

use crate::Refusal;
use crate::json::{JsonError, from_camel};
use crate::names::{AgentNames, NameWrite};

/// The core's inputs a member of the fleet may send, with the fields each takes besides
/// `op`: the core's own, less what the gateway sets itself (`reported`, `member`,
/// `unixNowMs`). The operator's inputs (`hold`, `restarted`, `timeout`) are not a member's.
pub const MEMBER_INPUTS: [(&str, &[&str]); 11] = [
    ("request_lease", &["request"]),
    ("call_lease", &["call", "request"]),
    ("settle", &["lease", "usage"]),
    ("cancel", &["lease"]),
    ("renew", &["lease"]),
    ("response", &["pool", "lease", "status", "headers"]),
    (
        "call_response",
        &["call", "pool", "lease", "status", "headers"],
    ),
    ("call_interrupted", &["lease", "seen"]),
    ("open_task", &["task"]),
    ("task_failed", &["task", "signature"]),
    ("end_task", &["task", "outcome"]),
];

/// The fields of a lease request, as a member writes them.
pub const LEASE_REQUEST_FIELDS: [&str; 11] = [
    "agent",
    "pool",
    "inputTokens",
    "cachedPrefixTokens",
    "maxTokens",
    "role",
    "unblocks",
    "failureSignature",
    "task",
    "cachedPrefixConfirmed",
    "family",
];

/// The fields of a usage (`usage` of a settle, `seen` of an interrupted call).
pub const USAGE_FIELDS: [&str; 4] = [
    "inputTokens",
    "cacheCreationInputTokens",
    "cacheReadInputTokens",
    "outputTokens",
];

/// The longest a long poll on a ticket is held (ms): a longer timeout asked is cut to it.
pub const MAX_WAIT_MS: u64 = 30_000;

/// At most this many header pairs in a report, each name and value at most 8 KiB.
pub const MAX_HEADER_PAIRS: usize = 256;
/// Remote drivers remembered per quota ([`Members::seen`]).
pub const MAX_CLIENTS: usize = 1024;
/// How long a remote driver is remembered after it was last seen, ms.
pub const CLIENT_TTL_MS: u64 = 60_000;

/// The longest header name or value in a report (characters).
pub const MAX_HEADER_BYTES: usize = 8192;

/// The largest integer a JavaScript `number` holds exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// An agent credential's agent: the one agent its holder may act for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who {
    /// Its id (from the name, [`crate::names`]).
    pub id: u64,
    /// Its name.
    pub name: String,
}

/// Whether a member's lease is a queued ticket or granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// In line.
    Queued,
    /// Granted.
    Granted,
}

/// A member's lease or ticket, as the table keeps it. A host stores it as the JSON of
/// [`Record::to_json`] (`{ state, agent, name?, pool, eta?, expiresAt?, waitedMs? }`, the
/// shape the Worker has always stored), read back by [`Record::from_json`]. (Written by
/// hand, not derived: the derived reading costs the wasm build more than the table.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Queued or granted.
    pub state: LeaseState,
    /// Its agent.
    pub agent: u64,
    /// The name it was asked under (absent for a numeric agent).
    pub name: Option<String>,
    /// Its pool.
    pub pool: u32,
    /// A ticket's promise.
    pub eta: Option<u64>,
    /// A lease's expiry.
    pub expires_at: Option<u64>,
    /// How long a lease waited in line (ms).
    pub waited_ms: Option<u64>,
}

impl Record {
    /// The record as stored.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let state = match self.state {
            LeaseState::Queued => "queued",
            LeaseState::Granted => "granted",
        };
        m.insert("state".into(), Value::from(state));
        m.insert("agent".into(), Value::from(self.agent));
        if let Some(n) = &self.name {
            m.insert("name".into(), Value::from(n.as_str()));
        }
        m.insert("pool".into(), Value::from(self.pool));
        for (k, v) in [
            ("eta", self.eta),
            ("expiresAt", self.expires_at),
            ("waitedMs", self.waited_ms),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), Value::from(v));
            }
        }
        Value::Object(m)
    }

    /// A stored record; `None` when `v` is not one.
    #[must_use]
    pub fn from_json(v: &Value) -> Option<Record> {
        let state = match v.get("state")?.as_str()? {
            "queued" => LeaseState::Queued,
            "granted" => LeaseState::Granted,
            _ => return None,
        };
        let opt = |k: &str| v.get(k).and_then(Value::as_u64);
        Some(Record {
            state,
            agent: v.get("agent")?.as_u64()?,
            name: v.get("name").and_then(Value::as_str).map(String::from),
            pool: u32::try_from(v.get("pool")?.as_u64()?).ok()?,
            eta: opt("eta"),
            expires_at: opt("expiresAt"),
            waited_ms: opt("waitedMs"),
        })
    }
}

/// What a checked input leaves for [`Members::applied`]: the input, and for a lease asked
/// for, who asked it in which pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// The core's input.
    pub input: Input,
    /// The same input as the HTTP API's JSON (camelCase keys), which reads as `input`.
    pub json: Value,
    /// A lease request's agent, the name it was asked under, and its pool.
    asked: Option<(u64, Option<String>, u32)>,
}

/// What the table reads of the coordinator's output to a member's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A lease granted (`granted`, `send`).
    Leased {
        /// The lease.
        lease: u64,
        /// Its expiry.
        expires_at: u64,
    },
    /// A ticket in line (`queued`, `wait` with a ticket).
    Queued {
        /// The ticket.
        ticket: u64,
        /// Its promise.
        eta: u64,
    },
    /// A lease's new expiry (`renewed`).
    Renewed {
        /// The expiry.
        expires_at: u64,
    },
    /// The lease ended: settled by the member (`settled`), or by the core (a response
    /// that was not a success, with its `settled`).
    Ended,
    /// Nothing the table keeps.
    Other,
}

impl Answer {
    /// What the table reads of `out`.
    #[must_use]
    pub fn of(out: &Output) -> Answer {
        match out {
            Output::Granted { lease, expires_at }
            | Output::Send {
                lease, expires_at, ..
            } => Answer::Leased {
                lease: lease.0,
                expires_at: expires_at.0,
            },
            Output::Queued { lease, eta } => Answer::Queued {
                ticket: lease.0,
                eta: eta.0,
            },
            Output::Wait {
                wait:
                    tokenwarden_core::Wait {
                        ticket: Some(t),
                        until,
                        ..
                    },
                ..
            } => Answer::Queued {
                ticket: t.0,
                eta: until.0,
            },
            Output::Renewed { expires_at } => Answer::Renewed {
                expires_at: expires_at.0,
            },
            Output::Settled { .. }
            | Output::Wait {
                settled: Some(_), ..
            }
            | Output::GiveUp {
                settled: Some(_), ..
            }
            | Output::Deliver {
                settled: Some(_), ..
            } => Answer::Ended,
            _ => Answer::Other,
        }
    }

    /// What the table reads of an output as JSON (camelCase keys, as the JavaScript
    /// engines answer it); [`Answer::Other`] for anything else.
    #[must_use]
    pub fn of_json(out: &Value) -> Answer {
        let int = |v: &Value| v.as_u64();
        let settled = out.get("settled").is_some_and(|s| !s.is_null());
        let got = match out.get("output").and_then(Value::as_str) {
            Some("granted" | "send") => int(&out["lease"])
                .zip(int(&out["expiresAt"]))
                .map(|(lease, expires_at)| Answer::Leased { lease, expires_at }),
            Some("queued") => int(&out["lease"])
                .zip(int(&out["eta"]))
                .map(|(ticket, eta)| Answer::Queued { ticket, eta }),
            Some("wait") if !settled => int(&out["wait"]["ticket"])
                .zip(int(&out["wait"]["until"]))
                .map(|(ticket, eta)| Answer::Queued { ticket, eta }),
            Some("renewed") => {
                int(&out["expiresAt"]).map(|expires_at| Answer::Renewed { expires_at })
            }
            Some("settled") => Some(Answer::Ended),
            Some("wait" | "give_up" | "deliver") if settled => Some(Answer::Ended),
            _ => None,
        };
        got.unwrap_or(Answer::Other)
    }
}

/// What a long poll on a ticket does ([`Members::wait`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Poll {
    /// Hold the poll for up to this long (ms), then ask again with no time left; a wake
    /// ([`Members::take_wakes`]) ends it sooner.
    Hold(u64),
    /// Answer now: 200 with a grant, or 202 with the ticket's promise (its body, without
    /// the handle and epoch the host adds).
    Answer {
        /// 200 or 202.
        status: u16,
        /// `{ kind: 'grant', expiresAt, waitedMs }` or `{ kind: 'queued', eta }`.
        body: Value,
    },
}

/// The members of one quota (see the module doc).
#[derive(Clone, Debug)]
pub struct Members {
    /// The records by lease id (sorted: ids mostly grow, so most inserts are at the end).
    leases: Vec<(u64, Record)>,
    names: AgentNames,
    pools: Vec<String>,
    wakes: Vec<u64>,
    /// Remote drivers' process ids and when each was last seen (oldest first).
    clients: VecDeque<(String, u64)>,
}

impl Members {
    /// The members of a quota of a fleet whose secret is `secret` (agent ids are keyed by
    /// it), with the quota's pools by name, in order.
    #[must_use]
    pub fn new(secret: &str, pools: Vec<String>) -> Members {
        Members {
            leases: Vec::new(),
            names: AgentNames::new(secret),
            pools,
            wakes: Vec::new(),
            clients: VecDeque::new(),
        }
    }

    /// Keys the agent ids by the fleet's secret `secret` (a host that learns it after it
    /// restored the table), seeded with the names it stored (see [`AgentNames::seed`]).
    pub fn key(&mut self, secret: &str, stored: impl IntoIterator<Item = (u64, String)>) {
        self.names = AgentNames::new(secret);
        self.names.seed(stored);
    }

    /// The quota's pools by name (after a reset that read its configuration again).
    pub fn set_pools(&mut self, pools: Vec<String>) {
        self.pools = pools;
    }

    /// The agent names and ids.
    pub fn names(&mut self) -> &mut AgentNames {
        &mut self.names
    }

    /// The name an id was made from, if it is still remembered.
    #[must_use]
    pub fn name_of(&self, id: u64) -> Option<&str> {
        self.names.name_of(id)
    }

    /// The agent names' store writes since the last call.
    pub fn take_name_writes(&mut self) -> Vec<NameWrite> {
        self.names.take_writes()
    }

    /// The credential of agent `name`.
    pub fn who(&mut self, name: &str) -> Who {
        Who {
            id: self.names.id(name),
            name: String::from(name),
        }
    }

    /// The table, by lease id.
    #[must_use]
    pub fn records(&self) -> &[(u64, Record)] {
        &self.leases
    }

    /// Lease `id`'s record.
    #[must_use]
    pub fn record(&self, id: u64) -> Option<&Record> {
        self.find(id).ok().map(|i| &self.leases[i].1)
    }

    /// The table as a host stored it (after a restart).
    pub fn restore(&mut self, records: impl IntoIterator<Item = (u64, Record)>) {
        self.leases = records.into_iter().collect();
        self.leases.sort_by_key(|(id, _)| *id);
        self.leases.dedup_by_key(|(id, _)| *id);
    }

    fn find(&self, id: u64) -> Result<usize, usize> {
        self.leases.binary_search_by_key(&id, |(i, _)| *i)
    }

    fn record_mut(&mut self, id: u64) -> Option<&mut Record> {
        self.find(id).ok().map(|i| &mut self.leases[i].1)
    }

    fn insert(&mut self, id: u64, rec: Record) {
        match self.find(id) {
            Ok(i) => self.leases[i].1 = rec,
            Err(i) => self.leases.insert(i, (id, rec)),
        }
    }

    fn remove(&mut self, id: u64) -> Option<Record> {
        self.find(id).ok().map(|i| self.leases.remove(i).1)
    }

    /// Remembers the remote driver `client` (an `x-tokenwarden-client` id of 1 to 64
    /// characters `[A-Za-z0-9_-]`; anything else is not counted) seen at `now`, forgetting
    /// those not seen for [`CLIENT_TTL_MS`] and the oldest past [`MAX_CLIENTS`]; answers how
    /// many processes share the quota (at least 1: the caller). A remote driver's fallback
    /// while the limiter is unreachable is that share of it.
    pub fn seen(&mut self, client: Option<&str>, now: u64) -> u64 {
        let client = client.filter(|c| {
            (1..=64).contains(&c.len())
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
        if let Some(c) = client {
            self.clients.retain(|(k, _)| k != c);
            self.clients.push_back((c.to_string(), now));
            if self.clients.len() > MAX_CLIENTS {
                self.clients.pop_front();
            }
        }
        while self
            .clients
            .front()
            .is_some_and(|(_, at)| now.saturating_sub(*at) > CLIENT_TTL_MS)
        {
            self.clients.pop_front();
        }
        self.clients.len().max(1) as u64
    }

    /// The coordinator's metrics (camelCase JSON) with each agent's name beside its id
    /// (`name`: the name the id was made from, or null for a numeric agent or one not seen
    /// since the table started), a subagent's family by its root's name (`familyName`), and
    /// `ceilings` (a host's timeline's counters) when given.
    pub fn name_metrics(&self, metrics: &mut Value, ceilings: Option<Value>) {
        if let Some(agents) = metrics.get_mut("agents").and_then(Value::as_array_mut) {
            for a in agents {
                let name = a
                    .get("agent")
                    .and_then(Value::as_u64)
                    .and_then(|id| self.name_of(id));
                let name = name.map_or(Value::Null, Value::from);
                let family = a.get("family").and_then(Value::as_u64);
                if let Some(m) = a.as_object_mut() {
                    m.insert("name".into(), name);
                    if let Some(f) = family {
                        let n = self.name_of(f).map_or(Value::Null, Value::from);
                        m.insert("familyName".into(), n);
                    }
                }
            }
        }
        if let (Some(c), Some(m)) = (ceilings, metrics.as_object_mut()) {
            m.insert("ceilings".into(), c);
        }
    }

    /// Ends every record (a reset): every long poll is answered now. Answers how many
    /// there were.
    pub fn clear(&mut self) -> usize {
        let n = self.leases.len();
        self.wakes.extend(self.leases.iter().map(|(id, _)| *id));
        self.leases.clear();
        self.names.rewrite_all();
        n
    }

    /// The long polls to answer now (their tickets granted, ended, or their promise moved
    /// past one about to come), since the last call.
    pub fn take_wakes(&mut self) -> Vec<u64> {
        core::mem::take(&mut self.wakes)
    }

    /// Lease `lease`'s record; 404 if there is none, 403 if `who` (an agent credential) is
    /// not its agent — by the full name where the record has one, not only by the id.
    pub fn known(&self, lease: Option<&Value>, who: Option<&Who>) -> Result<&Record, Refusal> {
        let rec = lease
            .and_then(safe_int)
            .and_then(|id| self.record(id))
            .ok_or_else(|| {
                Refusal::new(
                    404,
                    "unknown_lease",
                    "no such lease: never issued, or already settled, cancelled or expired".into(),
                )
            })?;
        if let Some(w) = who {
            if rec.agent != w.id || rec.name.as_ref().is_some_and(|n| *n != w.name) {
                return Err(Refusal::new(
                    403,
                    "forbidden",
                    format!(
                        "this lease is another agent's: the credential of {} ends only its own leases",
                        w.name
                    ),
                ));
            }
        }
        Ok(rec)
    }

    /// A long poll on ticket `lease` with `timeout_ms` left: held while it is queued and
    /// time is left (at most [`MAX_WAIT_MS`]), else answered.
    pub fn wait(
        &self,
        lease: Option<&Value>,
        who: Option<&Who>,
        timeout_ms: u64,
    ) -> Result<Poll, Refusal> {
        let rec = self.known(lease, who)?;
        Ok(match rec.state {
            LeaseState::Queued if timeout_ms > 0 => Poll::Hold(timeout_ms.min(MAX_WAIT_MS)),
            LeaseState::Queued => Poll::Answer {
                status: 202,
                body: json!({ "kind": "queued", "eta": rec.eta }),
            },
            LeaseState::Granted => Poll::Answer {
                status: 200,
                body: json!({
                    "kind": "grant",
                    "expiresAt": rec.expires_at,
                    "waitedMs": rec.waited_ms.unwrap_or(0),
                }),
            },
        })
    }

    /// A member's request to a route of the HTTP API, checked: the core's input to apply,
    /// or why not. `route` is `handle` (the body is a member input as it is) or one of the
    /// per-verb routes that are shapes of it: `lease` (a lease request, with the `call` an
    /// earlier answer returned), `settle` (the body is the usage), `cancel`, `interrupted`
    /// (`{ seen? }`), `renew` (no body), `response` (a report: `{ lease, status, headers,
    /// pool?, call? }`), `task` (`{ task, role?, unblocks? }`), `task-failed`
    /// (`{ signature }`) and `task-done` (`{ outcome? | merged? }`). `id` is the lease or
    /// task the route's path names.
    pub fn route(
        &mut self,
        route: &str,
        id: Option<&Value>,
        who: Option<&Who>,
        body: &Value,
    ) -> Result<Checked, Refusal> {
        let fields = |allowed: &[&str]| -> Result<&Map<String, Value>, Refusal> {
            let b = body
                .as_object()
                .ok_or_else(|| invalid("the body must be a JSON object".into(), None))?;
            only(b, allowed, "the body", &[])?;
            Ok(b)
        };
        let id = id.cloned().unwrap_or(Value::Null);
        let input = match route {
            "handle" => body.clone(),
            "lease" => {
                let mut request = body
                    .as_object()
                    .ok_or_else(|| invalid("the body must be a lease request object".into(), None))?
                    .clone();
                let mut input = Map::new();
                input.insert("op".into(), Value::from("call_lease"));
                if let Some(call) = request.remove("call") {
                    input.insert("call".into(), call);
                }
                input.insert("request".into(), Value::Object(request));
                Value::Object(input)
            }
            "settle" => json!({ "op": "settle", "lease": id, "usage": body }),
            "cancel" => json!({ "op": "cancel", "lease": id }),
            "interrupted" => {
                self.known(Some(&id), who)?;
                let b = fields(&["seen"])?;
                json!({ "op": "call_interrupted", "lease": id, "seen": b.get("seen").cloned().unwrap_or(Value::Null) })
            }
            "renew" => {
                self.known(Some(&id), who)?;
                fields(&[]).map_err(|r| Refusal {
                    message: format!("{}: renew takes none", r.message),
                    ..r
                })?;
                json!({ "op": "renew", "lease": id })
            }
            "response" => {
                let mut b = fields(&["pool", "lease", "status", "headers", "call"])?.clone();
                // A member's report, through the call lifecycle (a fresh call when it sends
                // none).
                b.insert("op".into(), Value::from("call_response"));
                Value::Object(b)
            }
            "task" => json!({ "op": "open_task", "task": body }),
            "task-failed" => {
                let b = body
                    .as_object()
                    .ok_or_else(|| invalid("the body must be a JSON object".into(), None))?;
                if let Some(k) = b.keys().find(|k| *k != "signature") {
                    return Err(invalid(
                        format!(
                            "unknown field `{k}` in the body: send `signature`, a hash of the failing test and the diff (failureSignature)"
                        ),
                        Some(k),
                    ));
                }
                json!({ "op": "task_failed", "task": id, "signature": b.get("signature").cloned().unwrap_or(Value::Null) })
            }
            "task-done" => {
                let b = fields(&["outcome", "merged"])?;
                let merged = match b.get("merged") {
                    None => None,
                    Some(Value::Bool(m)) => Some(*m),
                    Some(_) => {
                        return Err(invalid(
                            "`merged` must be true or false".into(),
                            Some("merged"),
                        ));
                    }
                };
                let outcome = b.get("outcome").cloned().unwrap_or_else(|| {
                    Value::from(if merged == Some(false) {
                        "abandoned"
                    } else {
                        "merged"
                    })
                });
                json!({ "op": "end_task", "task": id, "outcome": outcome })
            }
            _ => {
                return Err(Refusal::new(404, "not_found", "no such route".into()));
            }
        };
        self.check(who, &input)
    }

    /// A member's input checked (see the module doc): the core's input to apply, or why
    /// not.
    pub fn check(&mut self, who: Option<&Who>, input: &Value) -> Result<Checked, Refusal> {
        let body = input.as_object().ok_or_else(|| {
            invalid(
                "the input must be a JSON object: { op, … }".into(),
                Some("input"),
            )
        })?;
        let op = body.get("op").and_then(Value::as_str);
        let Some((op, fields)) = MEMBER_INPUTS.iter().find(|(name, _)| Some(*name) == op) else {
            let ops: Vec<&str> = MEMBER_INPUTS.iter().map(|(n, _)| *n).collect();
            return Err(invalid(
                format!(
                    "`op` must be one of {} (the core's inputs a member of the fleet sends; see API.md)",
                    ops.join(", ")
                ),
                Some("op"),
            ));
        };
        // The fields are checked after who may act: another agent's lease or task is 403
        // or 404 whatever the body holds.
        let check_fields = || only(body, fields, &format!("the {op} input"), &["op"]);
        let mut out = Map::new();
        out.insert("op".into(), Value::from(*op));
        let mut asked = None;
        match *op {
            "request_lease" | "call_lease" => {
                check_fields()?;
                let given = body
                    .get("request")
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        invalid(
                            "`request` must be a lease request object".into(),
                            Some("request"),
                        )
                    })?;
                if let Some(k) = given
                    .keys()
                    .find(|k| !LEASE_REQUEST_FIELDS.contains(&k.as_str()))
                {
                    return Err(invalid(
                        format!("unknown field `{k}` in the lease request"),
                        Some(k),
                    ));
                }
                let mut request = given.clone();
                let pool = match given.get("pool") {
                    Some(Value::String(name)) => {
                        let p = self.pool(name)?;
                        request.insert("pool".into(), Value::from(p));
                        p
                    }
                    None | Some(Value::Null) => {
                        request.remove("pool");
                        0
                    }
                    // Not an index: the core's reading refuses it, naming the field.
                    Some(other) => safe_int(other)
                        .and_then(|p| u32::try_from(p).ok())
                        .unwrap_or(u32::MAX),
                };
                let (agent, name) = self.agent_for(given.get("agent"), who)?;
                request.insert("agent".into(), Value::from(agent));
                // A family is named as an agent is. A credential's member may name only its
                // own agent (403 otherwise: naming another's family would divide that
                // family's share), which is a root: nothing to pass on.
                match given.get("family") {
                    None | Some(Value::Null) => {
                        request.remove("family");
                    }
                    family => {
                        let (id, _) = self.agent_for(family, who)?;
                        if who.is_none() {
                            request.insert("family".into(), Value::from(id));
                        } else {
                            request.remove("family");
                        }
                    }
                }
                match given.get("task") {
                    None | Some(Value::Null) => {
                        request.remove("task");
                    }
                    Some(task) => {
                        request.insert("task".into(), Value::from(task_id(task, "task")?));
                    }
                }
                if *op == "call_lease" {
                    out.insert("call".into(), call_state(body.get("call"))?);
                }
                out.insert("request".into(), Value::Object(request));
                asked = Some((agent, name, pool));
            }
            "settle" | "call_interrupted" => {
                self.known(body.get("lease"), who)?;
                check_fields()?;
                out.insert("lease".into(), body["lease"].clone());
                let (field, usage) = if *op == "settle" {
                    ("usage", body.get("usage"))
                } else {
                    ("seen", body.get("seen").filter(|v| !v.is_null()))
                };
                if usage.is_some() || *op == "settle" {
                    let usage = usage.and_then(Value::as_object).ok_or_else(|| {
                        invalid(format!("`{field}` must be a usage object"), Some(field))
                    })?;
                    only(usage, &USAGE_FIELDS, &format!("`{field}`"), &[])?;
                    out.insert(field.into(), Value::Object(usage.clone()));
                }
            }
            "cancel" | "renew" => {
                self.known(body.get("lease"), who)?;
                check_fields()?;
                out.insert("lease".into(), body["lease"].clone());
            }
            "response" | "call_response" => {
                check_fields()?;
                check_header_pairs(body.get("headers"))?;
                let status = body.get("status").and_then(safe_int);
                if !status.is_some_and(|s| (100..=599).contains(&s)) {
                    return Err(invalid(
                        "`status` must be an HTTP status (100 to 599)".into(),
                        Some("status"),
                    ));
                }
                // Evidence about one call: the granted lease it was sent under, held by
                // the reporter, in the lease's own pool.
                let lease = body.get("lease").filter(|v| !v.is_null()).ok_or_else(|| {
                    invalid(
                        "`lease` must be the handle of the granted lease whose call this response answers: a report is evidence about one call".into(),
                        Some("lease"),
                    )
                })?;
                let rec = self.known(Some(lease), who)?;
                if rec.state != LeaseState::Granted {
                    return Err(Refusal::new(
                        409,
                        "not_granted",
                        "this lease is a queued ticket: nothing was sent under it, so no response can answer it".into(),
                    )
                    .with_field("lease"));
                }
                let own = rec.pool;
                let pool = match body.get("pool") {
                    None | Some(Value::Null) => Some(own),
                    Some(Value::String(name)) => Some(self.pool(name)?),
                    Some(other) => safe_int(other).and_then(|p| u32::try_from(p).ok()),
                };
                if pool != Some(own) {
                    return Err(invalid(
                        "`pool` must be the pool of the lease the response answers".into(),
                        Some("pool"),
                    ));
                }
                if *op == "call_response" {
                    out.insert("call".into(), call_state(body.get("call"))?);
                }
                out.insert("pool".into(), Value::from(own));
                out.insert("lease".into(), lease.clone());
                out.insert("status".into(), body["status"].clone());
                out.insert("headers".into(), body["headers"].clone());
                // A member's report of its own call: the core bounds the pause one report
                // may cause (`feedback.max_reported_pause_ms`).
                out.insert("reported".into(), Value::Bool(true));
            }
            "open_task" => {
                check_fields()?;
                let task = body.get("task").and_then(Value::as_object).ok_or_else(|| {
                    invalid(
                        "`task` must be a task object: { task, role?, unblocks? }".into(),
                        Some("task"),
                    )
                })?;
                only(task, &["task", "role", "unblocks"], "the task", &[])?;
                let id = task_id(task.get("task").unwrap_or(&Value::Null), "task")?;
                let role = role_of(task.get("role"))?;
                let unblocks = match task.get("unblocks") {
                    None => 0,
                    Some(v) => unblocks_of(v)?,
                };
                out.insert(
                    "task".into(),
                    json!({ "task": id, "role": role, "unblocks": unblocks }),
                );
                // A member may open a new task only while fewer than three quarters of
                // `max_tasks` are open, and acts only on its own agent's (the core's rule).
                member_of(&mut out, who);
            }
            "task_failed" => {
                let task = task_id(body.get("task").unwrap_or(&Value::Null), "task")?;
                check_fields()?;
                // A hash the client computed (failureSignature); never the test or diff.
                let signature = body.get("signature").and_then(safe_int).ok_or_else(|| {
                    invalid(
                        "`signature` must be a non-negative integer (failureSignature(test, diff))"
                            .into(),
                        Some("signature"),
                    )
                })?;
                out.insert("task".into(), Value::from(task));
                out.insert("signature".into(), Value::from(signature));
                member_of(&mut out, who);
            }
            "end_task" => {
                let task = task_id(body.get("task").unwrap_or(&Value::Null), "task")?;
                check_fields()?;
                let outcome = body.get("outcome").and_then(Value::as_str);
                if !matches!(outcome, Some("merged" | "abandoned" | "failed")) {
                    return Err(invalid(
                        "`outcome` must be merged, abandoned or failed".into(),
                        Some("outcome"),
                    ));
                }
                out.insert("task".into(), Value::from(task));
                out.insert("outcome".into(), body["outcome"].clone());
                member_of(&mut out, who);
            }
            _ => unreachable!("MEMBER_INPUTS names only the ops above"),
        }
        let json = Value::Object(out);
        let input = from_camel::<Input>(json.clone(), "input").map_err(refusal_of)?;
        Ok(Checked { input, json, asked })
    }

    /// Keeps the table after the host applied `checked`'s input and the coordinator
    /// answered `output`.
    pub fn applied(&mut self, checked: &Checked, output: &Output) {
        self.answered(checked, Answer::of(output));
    }

    /// [`Members::applied`] with what the table reads of the output.
    pub fn answered(&mut self, checked: &Checked, answer: Answer) {
        if let Some((agent, name, pool)) = &checked.asked {
            let rec = |state, eta, expires_at, waited_ms| Record {
                state,
                agent: *agent,
                name: name.clone(),
                pool: *pool,
                eta,
                expires_at,
                waited_ms,
            };
            match answer {
                Answer::Leased { lease, expires_at } => {
                    self.insert(
                        lease,
                        rec(LeaseState::Granted, None, Some(expires_at), Some(0)),
                    );
                }
                Answer::Queued { ticket, eta } => {
                    self.insert(ticket, rec(LeaseState::Queued, Some(eta), None, None));
                }
                _ => {}
            }
            return;
        }
        match (&checked.input, answer) {
            (
                Input::Settle { lease, .. }
                | Input::CallInterrupted { lease, .. }
                | Input::CallResponse {
                    lease: Some(lease), ..
                },
                Answer::Ended,
            ) => {
                self.remove(lease.0);
            }
            (Input::Cancel { lease }, _) => {
                self.remove(lease.0);
                // A long poll on a cancelled ticket ends now (404), not at its timeout.
                self.wakes.push(lease.0);
            }
            (Input::Renew { lease }, Answer::Renewed { expires_at }) => {
                if let Some(rec) = self.record_mut(lease.0) {
                    rec.expires_at = Some(expires_at);
                }
            }
            _ => {}
        }
    }

    /// A coordinator's event at `now`: a member's ticket granted from the line, its promise
    /// revised, a lease expired.
    pub fn event(&mut self, e: &Event, now: Millis) {
        match e {
            Event::Granted {
                lease,
                expires_at,
                waited_ms,
                ..
            } => self.granted(lease.0, expires_at.0, *waited_ms),
            Event::Revised { lease, eta, .. } => self.revised(lease.0, eta.0, now.0),
            Event::Expired { lease, .. } => self.expired(lease.0),
            _ => {}
        }
    }

    /// Ticket `lease` granted (a long poll on it answers now).
    pub fn granted(&mut self, lease: u64, expires_at: u64, waited_ms: u64) {
        if let Some(rec) = self.record_mut(lease) {
            rec.state = LeaseState::Granted;
            rec.eta = None;
            rec.expires_at = Some(expires_at);
            rec.waited_ms = Some(waited_ms);
            self.wakes.push(lease);
        }
    }

    /// Ticket `lease`'s promise moved to `eta` at `now`. A long poll on it answers now with
    /// the new one when the old one would pass before the poll ends; otherwise its next
    /// answer carries it (a joining fleet revises many promises: no storm of answers).
    pub fn revised(&mut self, lease: u64, eta: u64, now: u64) {
        if let Some(rec) = self.record_mut(lease) {
            if rec.state == LeaseState::Queued {
                let passing = rec.eta.unwrap_or(0) <= now.saturating_add(MAX_WAIT_MS);
                rec.eta = Some(eta);
                if passing {
                    self.wakes.push(lease);
                }
            }
        }
    }

    /// Lease `lease` expired (reaped).
    pub fn expired(&mut self, lease: u64) {
        if self.remove(lease).is_some() {
            self.wakes.push(lease);
        }
    }

    /// Checks `input` from `who`, applies it to `c` at `now` and keeps the table: the
    /// three steps for a host that holds the coordinator itself. The events the input
    /// produced are the host's to drain (and to hand to [`Members::event`]).
    pub fn apply(
        &mut self,
        c: &mut Coordinator,
        now: Millis,
        who: Option<&Who>,
        input: &Value,
    ) -> Result<Output, Refusal> {
        let checked = self.check(who, input)?;
        let output = c.handle(now, &checked.input).map_err(Refusal::from)?;
        self.applied(&checked, &output);
        Ok(output)
    }

    /// The operator's hold (`{ pool?, forMs }`) at `now`, checked: the core's `hold` input.
    pub fn hold(&self, body: &Value, now: Millis) -> Result<Input, Refusal> {
        let b = body
            .as_object()
            .ok_or_else(|| invalid("the hold must be a JSON object".into(), None))?;
        only(b, &["pool", "forMs"], "the hold", &[])?;
        let ms = b
            .get("forMs")
            .and_then(safe_int)
            .filter(|ms| *ms <= 86_400_000)
            .ok_or_else(|| {
                invalid(
                    "`forMs` must be an integer number of milliseconds from 0 to 86400000".into(),
                    Some("forMs"),
                )
            })?;
        let pool = match b.get("pool") {
            None => Some(0),
            Some(Value::String(name)) => self.pools.iter().position(|p| p == name),
            Some(v) => safe_int(v).and_then(|p| usize::try_from(p).ok()),
        }
        .filter(|p| *p < self.pools.len())
        .ok_or_else(|| {
            Refusal::new(
                400,
                "unknown_pool",
                format!(
                    "`pool` must be a pool's name or index; the quota has {}",
                    self.pools.join(", ")
                ),
            )
            .with_field("pool")
        })?;
        Ok(Input::Hold {
            pool: tokenwarden_core::PoolId(u32::try_from(pool).unwrap_or(u32::MAX)),
            until: now.plus(ms),
        })
    }

    /// The index of the pool named `name`; 400 `unknown_pool` naming the pools.
    fn pool(&self, name: &str) -> Result<u32, Refusal> {
        self.pools
            .iter()
            .position(|p| p == name)
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| {
                let known: Vec<String> = self.pools.iter().map(|p| format!("{p:?}")).collect();
                Refusal::new(
                    400,
                    "unknown_pool",
                    format!(
                        "no pool named {name:?}; the configuration has {}",
                        known.join(", ")
                    ),
                )
                .with_field("pool")
            })
    }

    /// The agent a request acts for, and the name it is asked under (`None` for a numeric
    /// agent): an agent credential's own, which the body may only repeat.
    fn agent_for(
        &mut self,
        given: Option<&Value>,
        who: Option<&Who>,
    ) -> Result<(u64, Option<String>), Refusal> {
        let Some(w) = who else {
            return match given {
                Some(v) if safe_int(v).is_some() => Ok((safe_int(v).unwrap_or(0), None)),
                Some(Value::String(name)) if (1..=128).contains(&js_len(name)) => {
                    Ok((self.names.id(name), Some(name.clone())))
                }
                _ => Err(invalid(
                    "`agent` must be a non-negative integer or a name (1 to 128 characters)".into(),
                    Some("agent"),
                )),
            };
        };
        // A remote driver sends the number its fetch wrapper derives from the name
        // (`agentIdFor`): that number stands for the credential's own agent, nothing more.
        let same = match given {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => *s == w.name,
            Some(v) => safe_int(v).is_some_and(|n| {
                n == w.id || n == tokenwarden_provider::identity::agent_id_for(&w.name)
            }),
        };
        if !same {
            return Err(Refusal::new(
                403,
                "forbidden",
                format!(
                    "this credential is {}'s: it leases only for that agent",
                    w.name
                ),
            ));
        }
        Ok((w.id, Some(w.name.clone())))
    }
}

/// `b` holding no field but `fields` (and `also`); else 400 naming the first other one.
fn only(b: &Map<String, Value>, fields: &[&str], what: &str, also: &[&str]) -> Result<(), Refusal> {
    match b
        .keys()
        .find(|k| !fields.contains(&k.as_str()) && !also.contains(&k.as_str()))
    {
        Some(k) => Err(invalid(format!("unknown field `{k}` in {what}"), Some(k))),
        None => Ok(()),
    }
}

/// The `member` of a task input: an agent credential's agent (the core lets a member act
/// only on its own agent's tasks), nothing for the fleet secret (the operator acts on any).
fn member_of(out: &mut Map<String, Value>, who: Option<&Who>) {
    if let Some(w) = who {
        out.insert("member".into(), Value::from(w.id));
    }
}

/// A task as a client names it: an integer id, or a name (1 to 256 characters) turned into
/// one ([`tokenwarden_provider::identity::task_id_for`]).
pub fn task_id(task: &Value, field: &str) -> Result<u64, Refusal> {
    if let Some(id) = safe_int(task) {
        return Ok(id);
    }
    match task {
        Value::String(name) if (1..=256).contains(&js_len(name)) => {
            Ok(tokenwarden_provider::identity::task_id_for(name))
        }
        _ => Err(invalid(
            format!(
                "`{field}` must be a task id (a non-negative integer) or a name (1 to 256 characters)"
            ),
            Some(field),
        )),
    }
}

/// A count of downstream tasks (`unblocks`): an integer from 0 to 2^32 − 1, or its digits.
fn unblocks_of(v: &Value) -> Result<u64, Refusal> {
    let n = match v {
        Value::String(s)
            if (1..=10).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) =>
        {
            s.parse::<u64>().ok()
        }
        other => safe_int(other),
    };
    n.filter(|n| *n <= u64::from(u32::MAX)).ok_or_else(|| {
        invalid(
            "`unblocks` must be an integer from 0 to 4294967295".into(),
            Some("unblocks"),
        )
    })
}

/// A task's role; `worker` when none is named.
fn role_of(v: Option<&Value>) -> Result<&'static str, Refusal> {
    match v {
        None | Some(Value::Null) => Ok("worker"),
        Some(Value::String(s)) => ["planner", "reviewer", "worker", "auto"]
            .into_iter()
            .find(|r| r == s)
            .ok_or(()),
        Some(_) => Err(()),
    }
    .map_err(|()| {
        invalid(
            "`role` must be planner, reviewer, worker or auto".into(),
            Some("role"),
        )
    })
}

/// A call's state as a client sent it back (`{ failed, refusals, lastRetryAfterMs }`),
/// checked; a fresh call when none is sent.
fn call_state(c: Option<&Value>) -> Result<Value, Refusal> {
    let Some(c) = c else {
        return Ok(json!({}));
    };
    let bad = |field: &str, why: &str| invalid(format!("`{field}` {why}"), Some(field));
    let c = c.as_object().ok_or_else(|| {
        bad(
            "call",
            "must be the `call` object an earlier answer returned",
        )
    })?;
    if let Some(k) = c
        .keys()
        .find(|k| !["failed", "refusals", "lastRetryAfterMs"].contains(&k.as_str()))
    {
        return Err(bad(&format!("call.{k}"), "is not a field of a call"));
    }
    let count = |k: &str| -> Result<u64, Refusal> {
        match c.get(k) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => safe_int(v)
                .filter(|n| *n <= u64::from(u32::MAX))
                .ok_or_else(|| {
                    bad(
                        &format!("call.{k}"),
                        "must be an integer from 0 to 4294967295",
                    )
                }),
        }
    };
    let last = match c.get("lastRetryAfterMs") {
        None | Some(Value::Null) => Value::Null,
        Some(v) => Value::from(
            safe_int(v)
                .ok_or_else(|| bad("call.lastRetryAfterMs", "must be null or milliseconds"))?,
        ),
    };
    Ok(
        json!({ "failed": count("failed")?, "refusals": count("refusals")?, "lastRetryAfterMs": last }),
    )
}

/// `headers` of a report: an array of `[name, value]` string pairs, bounded; 400 naming the
/// bad entry.
fn check_header_pairs(headers: Option<&Value>) -> Result<(), Refusal> {
    let pairs = headers.and_then(Value::as_array).ok_or_else(|| {
        invalid(
            "`headers` must be an array of [name, value] pairs".into(),
            Some("headers"),
        )
    })?;
    if pairs.len() > MAX_HEADER_PAIRS {
        return Err(invalid(
            format!("`headers` must hold at most {MAX_HEADER_PAIRS} pairs"),
            Some("headers"),
        ));
    }
    for (i, pair) in pairs.iter().enumerate() {
        let field = format!("headers[{i}]");
        let strings = match pair.as_array().map(Vec::as_slice) {
            Some([Value::String(n), Value::String(v)]) => Some((n, v)),
            _ => None,
        };
        let Some((name, value)) = strings else {
            return Err(invalid(
                format!("`{field}` must be a [name, value] pair of strings"),
                Some(&field),
            ));
        };
        if js_len(name) > MAX_HEADER_BYTES || js_len(value) > MAX_HEADER_BYTES {
            return Err(invalid(
                format!(
                    "`{field}` must have a name and value of at most {MAX_HEADER_BYTES} characters"
                ),
                Some(&field),
            ));
        }
    }
    Ok(())
}

/// A JSON number that is an integer from 0 to 2^53 − 1 (a JavaScript safe integer).
fn safe_int(v: &Value) -> Option<u64> {
    let n = v.as_number()?;
    if let Some(u) = n.as_u64() {
        return (u <= MAX_SAFE).then_some(u);
    }
    let f = n.as_f64()?;
    // `3.0` is the integer 3 in JavaScript.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let u = f as u64;
    (f >= 0.0 && f <= MAX_SAFE as f64 && u as f64 == f).then_some(u)
}

/// A string's length as JavaScript counts it (UTF-16 code units).
fn js_len(s: &str) -> usize {
    s.encode_utf16().count()
}

fn invalid(message: String, field: Option<&str>) -> Refusal {
    let r = Refusal::new(400, "invalid_argument", message);
    match field {
        Some(f) => r.with_field(f),
        None => r,
    }
}

fn refusal_of(e: JsonError) -> Refusal {
    let r = Refusal::new(400, "invalid_argument", e.message);
    match e.field {
        Some(f) => r.with_field(f),
        None => r,
    }
}

impl From<LeaseError> for Refusal {
    /// The core's refusal of a member's input, with the HTTP status the API gives it.
    fn from(e: LeaseError) -> Refusal {
        let status = Refusal::status_of(e.code()).unwrap_or(400);
        let field = match &e {
            LeaseError::TooLarge { field } => Some(crate::json::camel(field)),
            _ => None,
        };
        let r = Refusal::new(status, e.code(), e.to_string());
        match field {
            Some(f) => r.with_field(f),
            None => r,
        }
    }
}

impl Refusal {
    /// The refusal as the HTTP API's error body: `{ error, message, field? }`.
    #[must_use]
    pub fn body(&self) -> Value {
        let mut b = json!({ "error": self.code, "message": self.message });
        if let Some(f) = &self.field {
            b["field"] = Value::from(f.to_string());
        }
        b
    }
}
