//! A quota's recent call events, for the dashboard's 429-vs-turn overlay (seed 003's test:
//! do the 429 waves line up with the work or with the retries?) and the ceilings named in
//! the metrics and Prometheus. Kept in memory only (a restart starts an empty ring):
//!
//! - a ring of at most [`MAX_EVENTS`] events of the last [`WINDOW_MS`]: call starts
//!   (`send`, a grant: the call goes to the provider now; `waitedMs` the time it queued
//!   first), refusals (`refused` until a time, the core's reason and axis), 429s
//!   (`rate_limited`, the provider's own limit type in `exceeded`) and the waits a proxied
//!   call sits out after a 429 or an overload (`backoff` until a time);
//! - counters since it started: 429s by the limit the provider named, refusals by reason
//!   (and axis, for `exceeds_capacity`), per pool.
//!
//! A host tells it what happened: [`Timeline::record`] each input it applied with its
//! output, [`Timeline::event`] each event the core raised (a host whose driver announces
//! these as events of its own calls [`Timeline::granted`], [`Timeline::rejected`],
//! [`Timeline::rate_limited`], [`Timeline::waiting`] and [`Timeline::forget`] directly).
//! Whatever callers send, the ring holds at most [`MAX_EVENTS`] small records and the
//! counters a fixed set of keys per pool.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::{Map, Value, json};
use tokenwarden_core::{Event, Input, Output, RejectReason, WaitReason};

/// How far back the timeline goes, ms.
pub const WINDOW_MS: u64 = 10 * 60_000;
/// Events kept at most (the oldest are overwritten).
pub const MAX_EVENTS: usize = 4096;
/// Granted leases remembered for naming the agent of a 429 (a report names only its lease).
const MAX_LEASE_AGENTS: usize = 4096;

/// The limit types a provider names, and `unknown` for none.
const RATE_LIMIT_AXES: [&str; 6] = [
    "requests",
    "tokens",
    "input_tokens",
    "output_tokens",
    "concurrent",
    "unknown",
];
/// The core's refusal kinds.
const REFUSAL_REASONS: [&str; 5] = [
    "exceeds_capacity",
    "wait_too_long",
    "queue_full",
    "too_many_leases",
    "too_many_agents",
];
const AXES: [&str; 4] = ["input_tokens", "output_tokens", "tokens", "requests"];

/// One event of the ring.
#[derive(Clone, Debug)]
struct Entry {
    t: u64,
    agent: Option<u64>,
    pool: u32,
    /// `kind` and the kind's own fields.
    fields: Fields,
}

/// An event's own fields: a grant's (one on every call, kept without a map) or a map.
#[derive(Clone, Debug)]
enum Fields {
    Send { waited_ms: u64 },
    Map(Map<String, Value>),
}

impl Fields {
    /// `{ kind, … }`.
    fn to_map(&self) -> Map<String, Value> {
        match self {
            Fields::Send { waited_ms } => {
                let mut m = Map::new();
                m.insert("waitedMs".into(), Value::from(*waited_ms));
                m.insert("kind".into(), Value::from("send"));
                m
            }
            Fields::Map(m) => m.clone(),
        }
    }
}

/// Counters of one pool.
#[derive(Clone, Debug, Default)]
struct Ceiling {
    rate_limited: Vec<(String, u64)>,
    rejected: Vec<(String, u64)>,
}

fn bump(list: &mut Vec<(String, u64)>, key: String) {
    match list.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => *n += 1,
        None => list.push((key, 1)),
    }
}

/// A quota's timeline (see the module doc).
#[derive(Clone, Debug)]
pub struct Timeline {
    ring: VecDeque<Entry>,
    /// lease → agent, of granted leases (least recently granted first).
    lease_agent: BTreeMap<u64, u64>,
    /// The leases of `lease_agent`, least recently granted first (an entry whose lease
    /// left the map, or was granted again later, is skipped when it comes up).
    lease_order: VecDeque<u64>,
    /// Per pool, in the order first counted.
    ceilings: Vec<(u32, Ceiling)>,
    since: u64,
}

/// What happened to a call, as the timeline and the wait log keep it: read from the core's
/// outputs ([`CallEvent::of_output`]) and events ([`CallEvent::of_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallEvent {
    /// A lease granted (at once, or from the line after `waited_ms`): the call starts.
    Granted {
        /// The lease.
        lease: u64,
        /// Its agent.
        agent: u64,
        /// Its pool.
        pool: u32,
        /// Time in line, ms.
        waited_ms: u64,
    },
    /// A ticket in line, granted by `eta` at the latest.
    Queued {
        /// The ticket.
        lease: u64,
        /// Its agent.
        agent: u64,
        /// Its pool.
        pool: u32,
        /// The bound.
        eta: u64,
        /// Whether the core told the call to checkpoint its turn first.
        checkpoint: bool,
    },
    /// A request refused until `retry_at` (`None`: never as asked).
    Rejected {
        /// The agent.
        agent: u64,
        /// The pool.
        pool: u32,
        /// Why.
        reason: RejectReason,
        /// When to ask again.
        retry_at: Option<u64>,
    },
    /// A 429 reported.
    RateLimited {
        /// The pool.
        pool: u32,
        /// The lease it was sent under.
        lease: Option<u64>,
        /// The provider's `retry-after`, ms.
        retry_after_ms: Option<u64>,
        /// The limit the provider named (the core's name).
        exceeded: Option<String>,
    },
    /// A sent call waits until `until` after a 429 (`rate_limited`) or an overload
    /// (`overloaded`), then is sent again.
    Waiting {
        /// The lease it was sent under.
        lease: u64,
        /// The pool.
        pool: u32,
        /// Until when.
        until: u64,
        /// `rate_limited` or `overloaded`.
        cause: &'static str,
        /// Failed sends so far.
        attempt: u32,
    },
    /// A lease reaped unsettled.
    Expired {
        /// The lease.
        lease: u64,
    },
}

impl CallEvent {
    /// The call event of a core event, if it is one (a grant from the line, an expiry).
    #[must_use]
    pub fn of_event(e: &Event) -> Option<CallEvent> {
        match e {
            Event::Granted {
                lease,
                agent,
                pool,
                waited_ms,
                ..
            } => Some(CallEvent::Granted {
                lease: lease.0,
                agent: agent.0,
                pool: pool.0,
                waited_ms: *waited_ms,
            }),
            Event::Expired { lease, .. } => Some(CallEvent::Expired { lease: lease.0 }),
            _ => None,
        }
    }

    /// The call events of `input` answered `output`: a lease granted, queued or refused; a
    /// 429 reported; a wait after a 429 or an overload.
    #[must_use]
    pub fn of_output(input: &Input, output: &Output) -> Vec<CallEvent> {
        let mut out = Vec::new();
        let asked = match input {
            Input::RequestLease { request } | Input::CallLease { request, .. } => Some(request),
            _ => None,
        };
        if let Some(r) = asked {
            let (agent, pool) = (r.agent.0, r.pool.0);
            let refused = |reason: &RejectReason, retry_at: Option<u64>| CallEvent::Rejected {
                agent,
                pool,
                reason: *reason,
                retry_at,
            };
            let queued = |lease: u64, eta: u64, checkpoint: bool| CallEvent::Queued {
                lease,
                agent,
                pool,
                eta,
                checkpoint,
            };
            match output {
                Output::Granted { lease, .. } | Output::Send { lease, .. } => {
                    out.push(CallEvent::Granted {
                        lease: lease.0,
                        agent,
                        pool,
                        waited_ms: 0,
                    })
                }
                Output::Queued { lease, eta } => out.push(queued(lease.0, eta.0, false)),
                Output::Refused { reason, retry_at } => out.push(refused(reason, Some(retry_at.0))),
                Output::NeverFits { reason } => out.push(refused(reason, None)),
                Output::Wait { wait, .. } => match (wait.ticket, &wait.refusal) {
                    (Some(t), _) => out.push(queued(t.0, wait.until.0, wait.checkpoint)),
                    (None, Some(reason)) => out.push(refused(reason, Some(wait.until.0))),
                    (None, None) => {}
                },
                Output::GiveUp { give_up, .. } => {
                    if let Some(reason) = &give_up.refusal {
                        out.push(refused(reason, None));
                    }
                }
                _ => {}
            }
            return out;
        }
        let (pool, lease, status, call) = match input {
            Input::Response {
                pool,
                lease,
                status,
                ..
            } => (*pool, *lease, *status, false),
            Input::CallResponse {
                pool,
                lease,
                status,
                ..
            } => (*pool, *lease, *status, true),
            _ => return out,
        };
        let report = match output {
            Output::Reported { report } | Output::Deliver { report, .. } => Some(report),
            Output::Wait { report, .. } | Output::GiveUp { report, .. } => report.as_ref(),
            _ => None,
        };
        if let (429, Some(report)) = (status, report) {
            out.push(CallEvent::RateLimited {
                pool: pool.0,
                lease: lease.map(|l| l.0),
                retry_after_ms: report.retry_after_ms,
                exceeded: report.exceeded.as_ref().and_then(tag),
            });
        }
        // A sent call's wait after a 429 or an overload.
        if let (true, Some(lease), Output::Wait { wait, .. }) = (call, lease, output) {
            let cause = match wait.reason {
                WaitReason::RateLimited => Some("rate_limited"),
                WaitReason::Overloaded => Some("overloaded"),
                _ => None,
            };
            if let Some(cause) = cause {
                out.push(CallEvent::Waiting {
                    lease: lease.0,
                    pool: pool.0,
                    until: wait.until.0,
                    cause,
                    attempt: wait.attempt,
                });
            }
        }
        out
    }
}

/// The core's name for a value (an enum's serde tag).
fn tag<T: serde::Serialize>(v: &T) -> Option<String> {
    match serde_json::to_value(v).ok()? {
        Value::String(s) => Some(s),
        Value::Object(m) => m
            .get("kind")
            .and_then(Value::as_str)
            .map(ToString::to_string),
        _ => None,
    }
}

impl Timeline {
    /// An empty timeline whose counters start at `now` (Unix ms).
    #[must_use]
    pub fn new(now: u64) -> Timeline {
        Timeline {
            ring: VecDeque::new(),
            lease_agent: BTreeMap::new(),
            lease_order: VecDeque::new(),
            ceilings: Vec::new(),
            since: now,
        }
    }

    /// Forgets everything (the quota was reset); the counters start again at `now`.
    pub fn clear(&mut self, now: u64) {
        *self = Timeline::new(now);
    }

    /// How many events the ring holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether the ring is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    fn push(
        &mut self,
        t: u64,
        kind: &str,
        agent: Option<u64>,
        pool: u32,
        mut fields: Map<String, Value>,
    ) {
        fields.insert("kind".into(), Value::from(kind));
        self.keep(t, agent, pool, Fields::Map(fields));
    }

    fn keep(&mut self, t: u64, agent: Option<u64>, pool: u32, fields: Fields) {
        if self.ring.len() == MAX_EVENTS {
            self.ring.pop_front();
        }
        self.ring.push_back(Entry {
            t,
            agent,
            pool,
            fields,
        });
    }

    fn ceiling(&mut self, pool: u32) -> &mut Ceiling {
        let i = match self.ceilings.iter().position(|(p, _)| *p == pool) {
            Some(i) => i,
            None => {
                self.ceilings.push((pool, Ceiling::default()));
                self.ceilings.len() - 1
            }
        };
        &mut self.ceilings[i].1
    }

    /// A call starts at `t`: lease `lease` of `agent` granted in `pool` after waiting
    /// `waited_ms` in line.
    pub fn granted(&mut self, t: u64, lease: u64, agent: u64, pool: u32, waited_ms: u64) {
        self.lease_agent.insert(lease, agent);
        self.lease_order.push_back(lease);
        while self.lease_agent.len() > MAX_LEASE_AGENTS {
            match self.lease_order.pop_front() {
                Some(old) => {
                    self.lease_agent.remove(&old);
                }
                None => break,
            }
        }
        // Forgotten leases leave their places behind: rebuilt when they pile up.
        if self.lease_order.len() > 2 * MAX_LEASE_AGENTS {
            let map = &self.lease_agent;
            self.lease_order.retain(|l| map.contains_key(l));
        }
        self.keep(t, Some(agent), pool, Fields::Send { waited_ms });
    }

    /// Lease `lease` ended unsettled: its agent is no longer needed to name a 429.
    pub fn forget(&mut self, lease: u64) {
        self.lease_agent.remove(&lease);
    }

    /// `agent` refused at `t` in `pool` for `reason` (the core's `RejectReason` as its
    /// JSON: `{ kind, axis? }`), until `retry_at` (`None`: never as asked).
    pub fn rejected(
        &mut self,
        t: u64,
        agent: u64,
        pool: u32,
        reason: &Value,
        retry_at: Option<u64>,
    ) {
        let kind = reason
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("other");
        let kind = if REFUSAL_REASONS.contains(&kind) {
            kind
        } else {
            "other"
        };
        let axis = reason
            .get("axis")
            .and_then(Value::as_str)
            .filter(|a| kind == "exceeds_capacity" && AXES.contains(a));
        let key = match axis {
            Some(a) => alloc::format!("{kind}:{a}"),
            None => kind.to_string(),
        };
        bump(&mut self.ceiling(pool).rejected, key);
        let mut f = Map::new();
        f.insert("until".into(), retry_at.map_or(Value::Null, Value::from));
        f.insert("reason".into(), Value::from(kind));
        f.insert("axis".into(), axis.map_or(Value::Null, Value::from));
        self.push(t, "refused", Some(agent), pool, f);
    }

    /// A 429 reported at `t` in `pool` for `lease` (if any), with the provider's
    /// `retry-after` and the limit it said was exceeded (`exceeded`, the core's name).
    pub fn rate_limited(
        &mut self,
        t: u64,
        pool: u32,
        lease: Option<u64>,
        retry_after_ms: Option<u64>,
        exceeded: Option<&str>,
    ) {
        let exceeded = exceeded.filter(|e| RATE_LIMIT_AXES.contains(e));
        bump(
            &mut self.ceiling(pool).rate_limited,
            exceeded.unwrap_or("unknown").into(),
        );
        let agent = lease.and_then(|l| self.agent_of(l));
        let mut f = Map::new();
        f.insert("exceeded".into(), exceeded.map_or(Value::Null, Value::from));
        f.insert(
            "retryAfterMs".into(),
            retry_after_ms.map_or(Value::Null, Value::from),
        );
        f.insert(
            "until".into(),
            retry_after_ms.map_or(Value::Null, |ms| Value::from(t + ms)),
        );
        self.push(t, "rate_limited", agent, pool, f);
    }

    /// A proxied call of `agent` waits `delay_ms` from `t` in `pool` after a 429
    /// (`cause` `rate_limited`) or an overload (`overloaded`); other causes are not kept.
    pub fn waiting(&mut self, t: u64, agent: u64, pool: u32, delay_ms: u64, cause: &str) {
        if cause != "rate_limited" && cause != "overloaded" {
            return;
        }
        let mut f = Map::new();
        f.insert("until".into(), Value::from(t + delay_ms));
        f.insert("cause".into(), Value::from(cause));
        self.push(t, "backoff", Some(agent), pool, f);
    }

    /// The core raised `e` at `t`: a grant from the line, an expiry.
    pub fn event(&mut self, e: &Event, t: u64) {
        if let Some(ev) = CallEvent::of_event(e) {
            self.note(&ev, t);
        }
    }

    /// A host applied `input` at `t` (the core's time, Unix ms) and the core answered
    /// `output`: a grant, a refusal, a 429 reported, a wait after one.
    pub fn record(&mut self, input: &Input, output: &Output, t: u64) {
        for ev in CallEvent::of_output(input, output) {
            self.note(&ev, t);
        }
    }

    /// The agent of granted lease `lease`, while remembered.
    #[must_use]
    pub fn agent_of(&self, lease: u64) -> Option<u64> {
        self.lease_agent.get(&lease).copied()
    }

    /// Keeps call event `ev` at `t`.
    pub fn note(&mut self, ev: &CallEvent, t: u64) {
        match ev {
            CallEvent::Granted {
                lease,
                agent,
                pool,
                waited_ms,
            } => self.granted(t, *lease, *agent, *pool, *waited_ms),
            CallEvent::Queued { .. } => {}
            CallEvent::Expired { lease } => self.forget(*lease),
            CallEvent::Rejected {
                agent,
                pool,
                reason,
                retry_at,
            } => {
                let v = serde_json::to_value(reason).unwrap_or(Value::Null);
                self.rejected(t, *agent, *pool, &v, *retry_at);
            }
            CallEvent::RateLimited {
                pool,
                lease,
                retry_after_ms,
                exceeded,
            } => self.rate_limited(t, *pool, *lease, *retry_after_ms, exceeded.as_deref()),
            CallEvent::Waiting {
                lease,
                pool,
                until,
                cause,
                ..
            } => {
                if let Some(agent) = self.agent_of(*lease) {
                    self.waiting(t, agent, *pool, until.saturating_sub(t), cause);
                }
            }
        }
    }

    /// The events of the last [`WINDOW_MS`] before `now`, oldest first, agents by name
    /// (their id as text where `name_of` knows none) and pools by name: `{ now, from,
    /// windowMs, maxEvents, events }`, what `GET …/timeline` answers.
    #[must_use]
    pub fn view(
        &self,
        now: u64,
        name_of: impl Fn(u64) -> Option<String>,
        pools: &[String],
    ) -> Value {
        let from = now.saturating_sub(WINDOW_MS);
        let events: Vec<Value> = self
            .ring
            .iter()
            .filter(|e| e.t >= from)
            .map(|e| {
                let mut m = e.fields.to_map();
                m.insert("t".into(), Value::from(e.t));
                m.insert(
                    "agent".into(),
                    e.agent.map_or(Value::Null, |a| {
                        Value::from(name_of(a).unwrap_or_else(|| a.to_string()))
                    }),
                );
                m.insert("pool".into(), Value::from(pool_name(pools, e.pool)));
                Value::Object(m)
            })
            .collect();
        json!({ "now": now, "from": from, "windowMs": WINDOW_MS, "maxEvents": MAX_EVENTS, "events": events })
    }

    /// The counters by pool name: `{ since, pools: [{ pool, rateLimited: { <axis>: n },
    /// rejected: { <reason>[:<axis>]: n } }] }` (pools with no 429 and no refusal left out).
    #[must_use]
    pub fn ceilings(&self, pools: &[String]) -> Value {
        let obj = |list: &[(String, u64)]| {
            Value::Object(
                list.iter()
                    .map(|(k, n)| (k.clone(), Value::from(*n)))
                    .collect(),
            )
        };
        let out: Vec<Value> = self
            .ceilings
            .iter()
            .map(|(p, c)| json!({ "pool": pool_name(pools, *p), "rateLimited": obj(&c.rate_limited), "rejected": obj(&c.rejected) }))
            .collect();
        json!({ "since": self.since, "pools": out })
    }
}

fn pool_name(pools: &[String], pool: u32) -> String {
    pools
        .get(pool as usize)
        .cloned()
        .unwrap_or_else(|| pool.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn pools() -> Vec<String> {
        vec!["default".into()]
    }

    #[test]
    fn grants_refusals_and_429s_are_kept_by_agent_and_pool() {
        let mut tl = Timeline::new(1_000);
        tl.granted(2_000, 7, 42, 0, 150);
        tl.rejected(
            2_500,
            43,
            0,
            &json!({ "kind": "exceeds_capacity", "axis": "input_tokens" }),
            None,
        );
        tl.rejected(2_600, 43, 0, &json!({ "kind": "made_up" }), Some(9_000));
        tl.rate_limited(3_000, 0, Some(7), Some(2_000), Some("input_tokens"));
        tl.rate_limited(3_100, 0, Some(99), None, Some("not-an-axis"));
        tl.waiting(3_200, 42, 0, 1_000, "rate_limited");
        tl.waiting(3_300, 42, 0, 1_000, "rejected");
        let v = tl.view(
            4_000,
            |id| (id == 42).then(|| "alice".to_string()),
            &pools(),
        );
        let events = v["events"].as_array().unwrap();
        assert_eq!(events.len(), 6, "the refusal wait is not a backoff");
        assert_eq!(
            events[0],
            json!({ "t": 2_000, "kind": "send", "agent": "alice", "pool": "default", "waitedMs": 150 })
        );
        assert_eq!(events[1]["reason"], "exceeds_capacity");
        assert_eq!(events[1]["axis"], "input_tokens");
        assert_eq!(events[1]["agent"], "43", "no name: the id as text");
        assert_eq!(events[2]["reason"], "other");
        assert_eq!(events[3]["agent"], "alice", "a 429's agent by its lease");
        assert_eq!(events[3]["until"], 5_000);
        assert_eq!(events[4]["agent"], Value::Null);
        assert_eq!(events[4]["exceeded"], Value::Null);
        assert_eq!(events[5]["kind"], "backoff");
        let c = tl.ceilings(&pools());
        assert_eq!(c["since"], 1_000);
        assert_eq!(
            c["pools"][0]["rateLimited"],
            json!({ "input_tokens": 1, "unknown": 1 })
        );
        assert_eq!(
            c["pools"][0]["rejected"],
            json!({ "exceeds_capacity:input_tokens": 1, "other": 1 })
        );
    }

    #[test]
    fn the_ring_is_bounded_and_the_window_moves() {
        let mut tl = Timeline::new(0);
        for i in 0..(MAX_EVENTS as u64 + 10) {
            tl.granted(i, i, 1, 0, 0);
        }
        assert_eq!(tl.len(), MAX_EVENTS);
        assert_eq!(tl.lease_agent.len(), MAX_LEASE_AGENTS);
        let v = tl.view(WINDOW_MS + 100, |_| None, &pools());
        assert_eq!(v["from"], 100);
        assert_eq!(v["events"][0]["t"], 100);
        tl.clear(5);
        assert!(tl.is_empty());
        assert_eq!(tl.ceilings(&pools())["pools"], json!([]));
    }
}
