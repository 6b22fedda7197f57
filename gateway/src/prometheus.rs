//! A coordinator's metrics in the Prometheus text exposition format, version 0.0.4, for one
//! quota of one fleet: what `GET …/metrics?format=prometheus` answers, written once for the
//! edge Worker (through the wasm build's `gatewayRule`) and `tokenwarden serve`.
//!
//! The input is the metrics as camelCase JSON (the core's `Metrics`, as the engine's
//! `metrics(now)` returns them), with what a host adds: each agent's `name` and its family's
//! `familyName`, and the `ceilings` hit (`{ since, pools: [{ pool, rateLimited: { <axis>: n },
//! rejected: { <reason>[:<axis>]: n } }] }`).
//!
//! Every sample carries `fleet` and `quota` labels; per-pool families add `pool`, per-axis
//! ones `axis`, per-agent ones `agent` (the agent's name; at most [`MAX_AGENT_LABELS`] of
//! them and `other`). Families are written in a fixed order, each as one group (HELP, TYPE,
//! then its samples); a family with no sample (say `tokenwarden_limit` before any limit is
//! known) is left out. No timestamps: the scraper stamps the samples.
//!
//! The output is what the edge's JavaScript wrote before this module (`prometheusText`),
//! byte for byte: values read as JavaScript's `Number()` reads them (a string `"NaN"` or
//! `"Infinity"` is NaN or infinite, as a host passing JSON spells those), numbers written as
//! its `String()` writes them, integers exactly, names ordered by UTF-16 code units. One
//! thing a JSON object cannot carry is the order its keys were inserted in: an object's
//! entries (the ceilings' axes and reasons, counters the core does not have) come in
//! JavaScript's order for integer keys, then in the order of the keys. And where
//! JavaScript's comparisons order nothing (a figure an agent is ranked by that is NaN, a
//! `familyName` that is not a string), the ranking is this module's sort's, not V8's.
//!
//! ```
//! use tokenwarden_gateway::prometheus;
//!
//! let metrics = serde_json::json!({ "now": 0, "liveLeases": 2, "pools": [], "agents": [] });
//! let text = prometheus::text(&metrics, "acme", "main");
//! assert!(text.starts_with("# HELP tokenwarden_live_leases Leases and queued tickets alive.\n"));
//! assert!(text.contains("tokenwarden_live_leases{fleet=\"acme\",quota=\"main\"} 2\n"));
//! ```

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cmp::Ordering;

use serde_json::Value;

/// The `Content-Type` of [`text`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Agents (and families) labelled by name in the per-agent (per-family) families; the rest
/// are summed as `other`.
pub const MAX_AGENT_LABELS: usize = 20;

/// What an agent can be doing (the core's `activity.state`).
const AGENT_STATES: [&str; 6] = [
    "idle",
    "in_flight",
    "queued",
    "refused",
    "rate_limited",
    "backing_off",
];

/// What each of the core's `PoolCounters` counts, by camelCase key, in the order the core
/// writes them.
const COUNTER_HELP: [(&str, &str); 11] = [
    ("grantedNow", "Leases granted without waiting."),
    ("grantedFromQueue", "Leases granted from the queue."),
    ("queued", "Requests that had to queue."),
    ("rejected", "Requests rejected (any reason)."),
    ("settled", "Leases settled."),
    ("cancelled", "Leases and tickets cancelled."),
    ("expired", "Leases reaped unsettled (no refund)."),
    ("rateLimited", "429 responses reported."),
    (
        "rateLimitedOnLease",
        "429 responses reported against a granted lease (each one cut the margin).",
    ),
    ("resyncs", "Times a provider header lowered a bucket."),
    (
        "malformedHeaders",
        "Provider headers that were recognised but malformed, and ignored.",
    ),
];

const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// Renders `metrics` as Prometheus text (exposition format 0.0.4), every sample labelled
/// with `fleet` and `quota`: one `\n`-terminated line each.
///
/// `metrics` is the coordinator's metrics as camelCase JSON (what the engine's
/// `metrics(now)` returns), with the agents' `name` and `familyName` and the `ceilings` when
/// the host adds them. A field missing or of another type is read as JavaScript would
/// (`undefined`, `Number()`, `String()`), never refused.
#[must_use]
pub fn text(metrics: &Value, fleet: &str, quota: &str) -> String {
    let base = Labels::new(fleet, quota);
    let metrics = Some(metrics);
    let now = to_number(get(metrics, "now"));
    let pools = array(get(metrics, "pools"));
    let agents = array(get(metrics, "agents"));
    let mut out = Exposition::default();

    let live = out.family(
        "tokenwarden_live_leases",
        GAUGE,
        "Leases and queued tickets alive.",
    );
    out.raw(live, &base, get(metrics, "liveLeases"));

    let by_state_family = out.family(
        "tokenwarden_agents",
        GAUGE,
        "Agents known to the coordinator, by what they are doing now.",
    );
    let mut by_state: Vec<(String, u64)> =
        AGENT_STATES.iter().map(|s| (String::from(*s), 0)).collect();
    for a in agents {
        let state = nullish(get(get(Some(a), "activity"), "state"))
            .map_or_else(|| String::from("unknown"), |s| js_string(Some(s)));
        match by_state.iter_mut().find(|(s, _)| *s == state) {
            Some((_, n)) => *n += 1,
            None => by_state.push((state, 1)),
        }
    }
    for (state, n) in &by_state {
        out.num(by_state_family, &base.with("state", state), count(*n));
    }

    let alerting = out.family(
        "tokenwarden_agents_alerting",
        GAUGE,
        "Agents whose token estimates are off enough to raise the estimate-error alert.",
    );
    let n = agents
        .iter()
        .filter(|a| matches!(a.get("alerting"), Some(Value::Bool(true))))
        .count();
    out.num(alerting, &base, count(n));

    // Per agent, by name: the MAX_AGENT_LABELS most active agents each under its own `agent`
    // label, the rest summed under agent="other", so the series stay bounded.
    let in_flight = out.family(
        "tokenwarden_agent_in_flight",
        GAUGE,
        &format!(
            "Leases in flight, per agent (the {MAX_AGENT_LABELS} most active by name, the rest as \"other\")."
        ),
    );
    let queued = out.family(
        "tokenwarden_agent_queued",
        GAUGE,
        "Tickets queued, per agent.",
    );
    let settled = out.family(
        "tokenwarden_agent_settled_total",
        COUNTER,
        "Leases settled, per agent.",
    );
    let state_family = out.family(
        "tokenwarden_agent_state",
        GAUGE,
        "What each agent is doing now: 1 for its state, 0 for the others (for \"other\", how many agents are in each state). Waiting is queued, refused (until a retry time), rate_limited (waiting out a 429) or backing_off (an overload).",
    );
    let rate_limited = out.family(
        "tokenwarden_agent_rate_limited",
        GAUGE,
        "Agents waiting out a 429, by the limit the provider named or its headers showed spent (axis \"unknown\" when neither did): 1 per named agent, a count for \"other\".",
    );
    let wait = out.family(
        "tokenwarden_agent_wait_remaining_seconds",
        GAUGE,
        "Seconds until a waiting agent is expected to go on: a refusal, 429 or overload wait until its end, a queued ticket until its expected grant (for \"other\", the longest).",
    );
    for (agent, f) in per_agent(agents) {
        let l = base.with("agent", &agent);
        out.num(in_flight, &l, f.in_flight);
        out.num(queued, &l, f.queued);
        out.num(settled, &l, f.settled);
        for (state, n) in AGENT_STATES.iter().zip(f.states) {
            out.num(state_family, &l.with("state", state), count(n));
        }
        for (axis, n) in &f.rate_limited_axes {
            out.num(rate_limited, &l.with("axis", axis), count(*n));
        }
        if let Some(until) = f.wait_until {
            out.num(wait, &l, js_max(0.0, until - now) / 1000.0);
        }
    }

    // Families (an agent and the subagents whose calls name it), by the root's name: the
    // MAX_AGENT_LABELS busiest, the rest summed as "other".
    let members = out.family(
        "tokenwarden_family_members",
        GAUGE,
        &format!(
            "Agents in a family: its root and the subagents whose calls name it (the {MAX_AGENT_LABELS} busiest families by root name, the rest as \"other\")."
        ),
    );
    let busy = out.family(
        "tokenwarden_family_busy",
        GAUGE,
        "Members of a family with a call queued or in flight: by default the family shares one place in the fair order, split among them.",
    );
    for (family, f_members, f_busy) in per_family(agents) {
        let l = base.with("family", &family);
        out.num(members, &l, count(f_members));
        out.num(busy, &l, count(f_busy));
    }

    let limit = out.family(
        "tokenwarden_limit",
        GAUGE,
        "The provider's limit per rate window (tokens or requests, by axis), where known.",
    );
    let capacity = out.family(
        "tokenwarden_capacity",
        GAUGE,
        "Effective capacity per rate window (limit x margin x ramp), for axes with a known limit.",
    );
    let available = out.family(
        "tokenwarden_available",
        GAUGE,
        "Capacity available now, for axes with a known limit; negative is debt.",
    );
    let used = out.family(
        "tokenwarden_used_last_minute",
        GAUGE,
        "Usage in the last complete minute.",
    );
    let used_ratio = out.family(
        "tokenwarden_used_last_minute_ratio",
        GAUGE,
        "Usage in the last complete minute against the provider's limit, for axes with a known limit.",
    );
    let margin = out.family(
        "tokenwarden_margin_ratio",
        GAUGE,
        "Share of the provider limit the coordinator currently grants (1 = all of it).",
    );
    let paused = out.family(
        "tokenwarden_paused",
        GAUGE,
        "1 while grants are paused after a 429, else 0.",
    );
    let at_floor = out.family(
        "tokenwarden_margin_at_floor_seconds",
        GAUGE,
        "How long the margin has sat at its floor without rising (0 when it is not there); past margin.floor_alert_ms something outside the coordinator is using the key.",
    );
    let queue_depth = out.family("tokenwarden_queue_depth", GAUGE, "Tickets queued.");
    let pool_in_flight = out.family("tokenwarden_in_flight", GAUGE, "Leases in flight.");
    let max_concurrent = out.family(
        "tokenwarden_max_concurrent",
        GAUGE,
        "The concurrency limit, where known.",
    );
    let queue_wait = out.family(
        "tokenwarden_queue_wait_seconds",
        GAUGE,
        "Wait of leases granted from the queue, by quantile (within 12.5 %).",
    );

    let mut counter_keys: Vec<&str> = Vec::new();
    for pool in pools {
        for (key, _) in counters(Some(pool)) {
            if !counter_keys.contains(&key) {
                counter_keys.push(key);
            }
        }
    }
    for key in counter_keys {
        let help = COUNTER_HELP.iter().find(|(k, _)| *k == key).map_or_else(
            || format!("The coordinator's {key} counter."),
            |(_, h)| (*h).into(),
        );
        out.family(&counter_name(key), COUNTER, &help);
    }

    // The ceilings hit (the host's counters since it started, beside the core's metrics):
    // 429s by the limit the provider named, refusals by reason and axis.
    let by_axis = out.family(
        "tokenwarden_rate_limited_by_axis_total",
        COUNTER,
        "429 responses reported, by the limit the provider said was exceeded (its rate_limit_type; \"unknown\" when it named none), since the quota's object started.",
    );
    let by_reason = out.family(
        "tokenwarden_rejected_by_reason_total",
        COUNTER,
        "Requests refused, by the core's reason (and the axis, for exceeds_capacity), since the quota's object started.",
    );
    for c in array(get(get(metrics, "ceilings"), "pools")) {
        let c = Some(c);
        let p = base.with("pool", &js_string(get(c, "pool")));
        for (axis, n) in entries(get(c, "rateLimited")) {
            out.raw(by_axis, &p.with("axis", axis), Some(n));
        }
        for (key, n) in entries(get(c, "rejected")) {
            let mut parts = key.split(':');
            let l = p.with("reason", parts.next().unwrap_or_default());
            let l = match parts.next() {
                Some(axis) => l.with("axis", axis),
                None => l,
            };
            out.raw(by_reason, &l, Some(n));
        }
    }

    let at_75 = out.family(
        "tokenwarden_fleet_agents_at_75_percent",
        GAUGE,
        "Agents like the measured ones that fit at 75 % of the binding limit.",
    );
    let measured = out.family(
        "tokenwarden_fleet_agents_measured",
        GAUGE,
        "Agents the fleet advice was measured on.",
    );
    let per_minute = out.family(
        "tokenwarden_fleet_per_agent_per_minute",
        GAUGE,
        "One active agent's demand per minute on the binding axis (served / the share of time not waiting on quota).",
    );
    let served_per_minute = out.family(
        "tokenwarden_fleet_served_per_agent_per_minute",
        GAUGE,
        "One active agent's usage per minute on the binding axis, as served.",
    );
    let waiting = out.family(
        "tokenwarden_fleet_waiting_ratio",
        GAUGE,
        "The share of the measured agents' time spent waiting on quota.",
    );

    // Tasks: seed 003's four numbers (429 rate, tokens per merged task, task time,
    // critical-path wait), since start and over the last complete minute.
    let tasks = get(metrics, "tasks");
    if truthy(tasks) {
        tasks_families(&mut out, &base, tasks);
    }

    for pool in pools {
        let pool = Some(pool);
        let p = base.with("pool", &js_string(get(pool, "name")));
        for axis in array(get(pool, "axes")) {
            let axis = Some(axis);
            let a = p.with("axis", &js_string(get(axis, "axis")));
            let known = nullish(get(axis, "limit")).is_some();
            if known {
                out.raw(limit, &a, get(axis, "limit"));
                out.raw(capacity, &a, get(axis, "capacity"));
                out.raw(available, &a, get(axis, "available"));
            }
            out.raw(used, &a, get(axis, "lastMinute"));
            if known {
                let permille = to_number(get(axis, "lastMinutePermille"));
                out.num(used_ratio, &a, permille / 1000.0);
            }
        }
        out.num(margin, &p, to_number(get(pool, "marginPermille")) / 1000.0);
        let is_paused = to_number(get(pool, "pausedUntil")) > now;
        out.num(paused, &p, if is_paused { 1.0 } else { 0.0 });
        let floor = match nullish(get(pool, "marginAtFloorSince")) {
            None => 0.0,
            Some(since) => js_max(0.0, now - to_number(Some(since))) / 1000.0,
        };
        out.num(at_floor, &p, floor);
        out.raw(queue_depth, &p, get(pool, "queueDepth"));
        out.raw(pool_in_flight, &p, get(pool, "inFlight"));
        if let Some(max) = nullish(get(pool, "maxConcurrent")) {
            out.raw(max_concurrent, &p, Some(max));
        }
        for (quantile, key) in [("0.5", "queueWaitP50Ms"), ("0.95", "queueWaitP95Ms")] {
            if let Some(ms) = nullish(get(pool, key)) {
                let seconds = to_number(Some(ms)) / 1000.0;
                out.num(queue_wait, &p.with("quantile", quantile), seconds);
            }
        }
        for (key, value) in counters(pool) {
            // Declared above, with the other counters.
            if let Some(family) = out.by_name.get(&counter_name(key)) {
                out.raw(family, &p, Some(value));
            }
        }
        let fleet = get(pool, "fleet");
        if truthy(fleet) {
            let f = p.with("axis", &js_string(get(fleet, "axis")));
            out.raw(at_75, &f, get(fleet, "agentsAt75Percent"));
            out.raw(measured, &f, get(fleet, "agentsMeasured"));
            out.raw(per_minute, &f, get(fleet, "perAgentPerMinute"));
            let served = nullish(get(fleet, "servedPerAgentPerMinute"))
                .or_else(|| get(fleet, "perAgentPerMinute"));
            out.raw(served_per_minute, &f, served);
            let permille = to_number(get(fleet, "waitingPermille"));
            out.num(waiting, &f, permille / 1000.0);
        }
    }
    out.finish()
}

/// The task families and their samples (`tasks` present).
fn tasks_families(out: &mut Exposition, base: &Labels, tasks: Option<&Value>) {
    let since_start = get(tasks, "sinceStart");
    let open = out.family("tokenwarden_tasks_open", GAUGE, "Tasks open now.");
    out.raw(open, base, get(tasks, "open"));
    let ended = out.family(
        "tokenwarden_tasks_ended_total",
        COUNTER,
        "Tasks ended, by outcome.",
    );
    for outcome in ["merged", "abandoned", "failed"] {
        out.raw(
            ended,
            &base.with("outcome", outcome),
            get(since_start, outcome),
        );
    }
    let untracked = out.family(
        "tokenwarden_tasks_untracked_total",
        COUNTER,
        "Requests that named a task the full task table could not take.",
    );
    out.raw(untracked, base, get(tasks, "untracked"));
    let tokens = out.family(
        "tokenwarden_task_tokens_total",
        COUNTER,
        "Tokens charged to the tasks that ended.",
    );
    out.raw(tokens, base, get(since_start, "tokens"));
    let seconds = out.family(
        "tokenwarden_task_seconds",
        GAUGE,
        "Wall time of the merged tasks since start, by quantile (within 3.2 %).",
    );
    for (quantile, key) in [("0.5", "taskTimeP50Ms"), ("0.95", "taskTimeP95Ms")] {
        if let Some(ms) = nullish(get(since_start, key)) {
            let s = to_number(Some(ms)) / 1000.0;
            out.num(seconds, &base.with("quantile", quantile), s);
        }
    }
    let per_task = out.family(
        "tokenwarden_tokens_per_merged_task",
        GAUGE,
        "Every token the provider counted for the ended tasks (every outcome; cache reads included) per merged task, since start and over the last complete minute.",
    );
    let limited_per_task = out.family(
        "tokenwarden_rate_limited_tokens_per_merged_task",
        GAUGE,
        "The part of tokenwarden_tokens_per_merged_task that counts against the rate limits, since start and over the last complete minute.",
    );
    let mean = out.family(
        "tokenwarden_task_seconds_mean",
        GAUGE,
        "Mean wall time of the merged tasks, since start and over the last complete minute.",
    );
    let critical = out.family(
        "tokenwarden_critical_path_wait_seconds",
        GAUGE,
        "Time the ended tasks had a model call outstanding (ask to settle) times the tasks each unblocks (agent-seconds), since start and over the last complete minute.",
    );
    let quota_wait = out.family(
        "tokenwarden_quota_wait_seconds",
        GAUGE,
        "Time the ended tasks waited on the quota, since start and over the last complete minute.",
    );
    let ratio = out.family(
        "tokenwarden_rate_limited_ratio",
        GAUGE,
        "429 responses per call sent, since start and over the last complete minute.",
    );
    for (span, key) in [("since_start", "sinceStart"), ("last_minute", "lastMinute")] {
        let f = get(tasks, key);
        if !truthy(f) {
            continue;
        }
        let s = base.with("span", span);
        if let Some(n) = nullish(get(f, "tokensPerMergedTask")) {
            out.raw(per_task, &s, Some(n));
        }
        if let Some(n) = nullish(get(f, "rateLimitedTokensPerMergedTask")) {
            out.raw(limited_per_task, &s, Some(n));
        }
        if let Some(ms) = nullish(get(f, "taskTimeMeanMs")) {
            out.num(mean, &s, to_number(Some(ms)) / 1000.0);
        }
        let ms = to_number(get(f, "criticalPathWaitMs"));
        out.num(critical, &s, ms / 1000.0);
        out.num(quota_wait, &s, to_number(get(f, "quotaWaitMs")) / 1000.0);
        if let Some(permille) = nullish(get(f, "rateLimitedPermille")) {
            out.num(ratio, &s, to_number(Some(permille)) / 1000.0);
        }
    }
}

/// An agent's figures, or the sum of those under one label.
#[derive(Default)]
struct AgentFigures {
    in_flight: f64,
    queued: f64,
    settled: f64,
    /// Agents in each of [`AGENT_STATES`].
    states: [usize; AGENT_STATES.len()],
    /// Agents waiting out a 429, by axis, in the order first seen.
    rate_limited_axes: Vec<(String, usize)>,
    /// When the (longest) wait ends, Unix ms.
    wait_until: Option<f64>,
}

/// One agent, ranked.
struct Ranked {
    label: String,
    in_flight: f64,
    queued: f64,
    settled: f64,
    last_seen: f64,
    state: usize,
    active: f64,
    axis: Option<String>,
    wait_until: Option<f64>,
}

/// The per-agent figures by label: the [`MAX_AGENT_LABELS`] most active agents (most in
/// flight and queued, a waiting one counting as one queued, then most settled, then the most
/// recently seen), each by its name (its id where it has none), then `other` holding the sum
/// of the rest, if any (its states counted, its wait the longest).
fn per_agent(agents: &[Value]) -> Vec<(String, AgentFigures)> {
    let ranked: Vec<Ranked> = agents
        .iter()
        .map(|a| {
            let a = Some(a);
            let activity = get(a, "activity");
            let raw_state = get(activity, "state").and_then(Value::as_str);
            let state = raw_state
                .and_then(|s| AGENT_STATES.iter().position(|x| *x == s))
                .unwrap_or(0);
            // queued, refused, rate_limited or backing_off
            let waiting = state >= 2;
            let in_flight = to_number(get(a, "inFlight"));
            let queued = to_number(get(a, "queued"));
            let axis = (AGENT_STATES[state] == "rate_limited").then(|| {
                get(activity, "axis")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_string()
            });
            let label = match get(a, "name") {
                Some(Value::String(name)) if !name.is_empty() => name.clone(),
                _ => js_string(get(a, "agent")),
            };
            let wait_until = match AGENT_STATES[state] {
                "queued" => nullish(get(activity, "expectedGrant")),
                "refused" | "rate_limited" | "backing_off" => nullish(get(activity, "until")),
                _ => None,
            }
            .map(|t| to_number(Some(t)));
            Ranked {
                label,
                in_flight,
                queued,
                settled: to_number(get(a, "settled")),
                last_seen: to_number(get(a, "lastSeen")),
                state,
                active: in_flight + js_max(queued, if waiting { 1.0 } else { 0.0 }),
                axis,
                wait_until,
            }
        })
        .collect();
    let order = sorted(ranked.len(), &|x, y| {
        let (x, y) = (&ranked[x], &ranked[y]);
        by_difference(y.active - x.active)
            .or_else(|| by_difference(y.settled - x.settled))
            .or_else(|| by_difference(y.last_seen - x.last_seen))
            .unwrap_or_else(|| utf16_cmp(&x.label, &y.label))
    });
    // At most MAX_AGENT_LABELS + 1 labels: found by looking through them.
    let mut out: Vec<(String, AgentFigures)> = Vec::new();
    for (i, a) in order.into_iter().map(|at| &ranked[at]).enumerate() {
        let named = out.iter().any(|(label, _)| *label == a.label);
        let label = if i < MAX_AGENT_LABELS && !named {
            a.label.as_str()
        } else {
            "other"
        };
        let at = out.iter().position(|(l, _)| l == label).unwrap_or_else(|| {
            out.push((label.into(), AgentFigures::default()));
            out.len() - 1
        });
        let f = &mut out[at].1;
        f.in_flight += a.in_flight;
        f.queued += a.queued;
        f.settled += a.settled;
        f.states[a.state] += 1;
        if let Some(axis) = &a.axis {
            match f.rate_limited_axes.iter_mut().find(|(x, _)| x == axis) {
                Some((_, n)) => *n += 1,
                None => f.rate_limited_axes.push((axis.clone(), 1)),
            }
        }
        if let Some(t) = a.wait_until {
            f.wait_until = Some(js_max(f.wait_until.unwrap_or(t), t));
        }
    }
    // `other` last, whether or not an agent is named so.
    if let Some(i) = out.iter().position(|(label, _)| label == "other") {
        let other = out.remove(i);
        out.push(other);
    }
    out
}

/// A family's label: its root's name as given (`familyName`, which a comparison reads as
/// JavaScript's `<` would when it is not a string) or its id.
struct FamilyLabel {
    text: String,
    /// The number a comparison reads, when the name is not a string.
    number: Option<f64>,
}

/// Per family (an agent some other agent names as its `family`), by its root's name (or id):
/// `(label, members, busy)`: members (the root, if known, and its subagents) and how many
/// have a call queued or in flight; the [`MAX_AGENT_LABELS`] busiest, then the rest summed
/// as `other`.
fn per_family(agents: &[Value]) -> Vec<(String, usize, usize)> {
    let mut roots: Vec<(FamilyLabel, usize, usize)> = Vec::new();
    let mut index = Index::default();
    for a in agents {
        let Some(family) = nullish(a.get("family")) else {
            continue;
        };
        let id = js_string(Some(family));
        if index.get(&id).is_some() {
            continue;
        }
        let label = match nullish(a.get("familyName")) {
            None => FamilyLabel {
                text: id.clone(),
                number: None,
            },
            Some(Value::String(s)) => FamilyLabel {
                text: s.clone(),
                number: None,
            },
            Some(other) => FamilyLabel {
                text: js_string(Some(other)),
                number: match other {
                    Value::Array(_) | Value::Object(_) => None,
                    n => Some(to_number(Some(n))),
                },
            },
        };
        index.insert(id, roots.len());
        roots.push((label, 0, 0));
    }
    for a in agents {
        let a = Some(a);
        let id = js_string(nullish(get(a, "family")).or_else(|| get(a, "agent")));
        let Some(i) = index.get(&id) else {
            continue;
        };
        let queued = to_number(nullish(get(a, "queued")));
        let in_flight = to_number(nullish(get(a, "inFlight")));
        roots[i].1 += 1;
        if queued > 0.0 || in_flight > 0.0 {
            roots[i].2 += 1;
        }
    }
    let order = sorted(roots.len(), &|x, y| {
        let ((x, x_members, x_busy), (y, y_members, y_busy)) = (&roots[x], &roots[y]);
        y_busy
            .cmp(x_busy)
            .then_with(|| y_members.cmp(x_members))
            .then_with(|| js_label_cmp(x, y))
    });
    let mut out: Vec<(String, usize, usize)> = Vec::new();
    let mut rest: Option<(usize, usize)> = None;
    for (i, (label, members, busy)) in order.into_iter().map(|at| &roots[at]).enumerate() {
        let (members, busy) = (*members, *busy);
        if i < MAX_AGENT_LABELS {
            out.push((label.text.clone(), members, busy));
        } else {
            let (m, b) = rest.get_or_insert((0, 0));
            *m += members;
            *b += busy;
        }
    }
    if let Some((members, busy)) = rest {
        out.push((String::from("other"), members, busy));
    }
    out
}

/// `x.label < y.label ? -1 : x.label > y.label ? 1 : 0` of two family labels.
fn js_label_cmp(x: &FamilyLabel, y: &FamilyLabel) -> Ordering {
    if x.number.is_none() && y.number.is_none() {
        return utf16_cmp(&x.text, &y.text);
    }
    let n = |l: &FamilyLabel| l.number.unwrap_or_else(|| string_to_number(&l.text));
    n(x).partial_cmp(&n(y)).unwrap_or(Ordering::Equal)
}

/// A sort comparator's difference (`y.n - x.n`) as JavaScript's `||` chain reads it: 0 and
/// NaN go on to the next key.
fn by_difference(d: f64) -> Option<Ordering> {
    if d < 0.0 {
        Some(Ordering::Less)
    } else if d > 0.0 {
        Some(Ordering::Greater)
    } else {
        None
    }
}

/// Strings compared by UTF-16 code units, as JavaScript's `<` compares them.
fn utf16_cmp(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// A pool's counters, by key, in the order JavaScript reads the core's object: integer
/// keys first, then the core's counters in its order, then any other.
fn counters(pool: Option<&Value>) -> Vec<(&str, &Value)> {
    let all = entries(get(pool, "counters"));
    let rank: Vec<usize> = all
        .iter()
        .map(|(key, _)| match index_key(key) {
            Some(_) => 0,
            None => {
                let core = COUNTER_HELP.iter().position(|(k, _)| k == key);
                1 + core.unwrap_or(COUNTER_HELP.len())
            }
        })
        .collect();
    let order = sorted(all.len(), &|x, y| rank[x].cmp(&rank[y]));
    order.into_iter().map(|i| all[i]).collect()
}

/// An object's entries in JavaScript's order (`Object.entries`): integer keys ascending,
/// then the others in the object's order. Nothing for anything but an object.
fn entries(v: Option<&Value>) -> Vec<(&str, &Value)> {
    let Some(Value::Object(map)) = v else {
        return Vec::new();
    };
    let all: Vec<(&str, &Value)> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let rank: Vec<(u8, u32)> = all
        .iter()
        .map(|(k, _)| index_key(k).map_or((1, 0), |i| (0, i)))
        .collect();
    let order = sorted(all.len(), &|x, y| rank[x].cmp(&rank[y]));
    order.into_iter().map(|i| all[i]).collect()
}

/// The order of `n` items by `cmp`: a stable merge sort, the one sort of this module. Not the
/// standard library's: that may panic when `cmp` is not a total order, which JavaScript's
/// `||` chains of differences are not when a figure is NaN (and each sort instantiated
/// would cost the wasm build kilobytes).
fn sorted(n: usize, cmp: &dyn Fn(usize, usize) -> Ordering) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut merged: Vec<usize> = alloc::vec![0; n];
    let mut width = 1;
    while width < n {
        let mut start = 0;
        while start < n {
            let mid = n.min(start + width);
            let end = n.min(start + 2 * width);
            let (mut left, mut right, mut at) = (start, mid, start);
            while left < mid && right < end {
                // The left one first unless the right one sorts strictly before it.
                if cmp(order[right], order[left]) == Ordering::Less {
                    merged[at] = order[right];
                    right += 1;
                } else {
                    merged[at] = order[left];
                    left += 1;
                }
                at += 1;
            }
            merged[at..at + mid - left].copy_from_slice(&order[left..mid]);
            at += mid - left;
            merged[at..end].copy_from_slice(&order[right..end]);
            start = end;
        }
        core::mem::swap(&mut order, &mut merged);
        width *= 2;
    }
    order
}

/// Names to indices, in a sorted list (smaller in the wasm build than a map).
#[derive(Default)]
struct Index(Vec<(String, usize)>);

impl Index {
    fn get(&self, key: &str) -> Option<usize> {
        let at = self.0.binary_search_by(|(k, _)| k.as_str().cmp(key)).ok()?;
        Some(self.0[at].1)
    }

    /// Adds `key` (unless it is there already).
    fn insert(&mut self, key: String, value: usize) {
        if let Err(at) = self.0.binary_search_by(|(k, _)| k.as_str().cmp(&key)) {
            self.0.insert(at, (key, value));
        }
    }
}

/// The index a key is (a canonical integer below 2³² − 1), which JavaScript puts first.
fn index_key(key: &str) -> Option<u32> {
    let canonical = key == "0" || (!key.starts_with('0') && !key.is_empty());
    if !canonical || key.len() > 10 || !key.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    key.parse::<u32>().ok().filter(|i| *i != u32::MAX)
}

/// `tokenwarden_<key in snake case>_total`.
fn counter_name(key: &str) -> String {
    format!("tokenwarden_{}_total", snake_case(key))
}

/// `grantedFromQueue` → `granted_from_queue`, restricted to a metric name's characters (one
/// `_` per UTF-16 code unit of any other).
fn snake_case(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else {
            for _ in 0..c.len_utf16() {
                out.push('_');
            }
        }
    }
    out
}

/// Rendered labels, `fleet="…",quota="…"` and any more.
#[derive(Clone)]
struct Labels(String);

impl Labels {
    fn new(fleet: &str, quota: &str) -> Labels {
        Labels(String::new())
            .with("fleet", fleet)
            .with("quota", quota)
    }

    /// These labels and one more.
    fn with(&self, key: &str, value: &str) -> Labels {
        let mut s = String::with_capacity(self.0.len() + key.len() + value.len() + 4);
        s.push_str(&self.0);
        if !s.is_empty() {
            s.push(',');
        }
        s.push_str(key);
        s.push_str("=\"");
        escape_label_value(&mut s, value);
        s.push('"');
        Labels(s)
    }
}

/// A label value as the text format wants it: backslash, double quote and line feed escaped.
fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// HELP text: backslash and line feed escaped.
fn escape_help(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// One family: its type, HELP and sample lines.
struct Family {
    name: String,
    kind: &'static str,
    help: String,
    lines: String,
}

/// Families in declaration order, each with its samples; written out as one group each.
#[derive(Default)]
struct Exposition {
    families: Vec<Family>,
    by_name: Index,
}

impl Exposition {
    /// Declares a family (a name declared already keeps its first type and help): its index.
    fn family(&mut self, name: &str, kind: &'static str, help: &str) -> usize {
        if let Some(i) = self.by_name.get(name) {
            return i;
        }
        self.families.push(Family {
            name: name.into(),
            kind,
            help: help.into(),
            lines: String::new(),
        });
        self.by_name.insert(name.into(), self.families.len() - 1);
        self.families.len() - 1
    }

    fn line(&mut self, family: usize, labels: &Labels, value: &str) {
        let f = &mut self.families[family];
        f.lines.push_str(&f.name);
        f.lines.push('{');
        f.lines.push_str(&labels.0);
        f.lines.push_str("} ");
        f.lines.push_str(value);
        f.lines.push('\n');
    }

    /// A sample of a number.
    fn num(&mut self, family: usize, labels: &Labels, value: f64) {
        self.line(family, labels, &format_value(value));
    }

    /// A sample of a value as the metrics hold it: an integer exactly, anything else as
    /// `Number()` reads it (missing or null: 0).
    fn raw(&mut self, family: usize, labels: &Labels, value: Option<&Value>) {
        match value {
            Some(Value::Number(n)) if n.is_u64() || n.is_i64() => {
                let text = n.to_string();
                self.line(family, labels, &text);
            }
            v => self.num(family, labels, to_number(v)),
        }
    }

    fn finish(self) -> String {
        let mut text = String::new();
        for f in self.families {
            if f.lines.is_empty() {
                continue;
            }
            text.push_str("# HELP ");
            text.push_str(&f.name);
            text.push(' ');
            escape_help(&mut text, &f.help);
            text.push_str("\n# TYPE ");
            text.push_str(&f.name);
            text.push(' ');
            text.push_str(f.kind);
            text.push('\n');
            text.push_str(&f.lines);
        }
        text
    }
}

/// A field of an object (`v?.key`); `None` when `v` is not an object or has no such field.
fn get<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    v?.as_object()?.get(key)
}

/// `v`, unless it is null or missing (the left side of JavaScript's `??`).
fn nullish(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

/// The elements of an array; none for anything else (`v ?? []`).
fn array(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Array(a)) => a,
        _ => &[],
    }
}

/// Whether JavaScript reads `v` as true in a condition.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|n| n != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(_) | Value::Object(_)) => true,
    }
}

/// A count as a sample's number.
#[allow(clippy::cast_precision_loss)] // counts of agents, far below 2^53
fn count(n: impl TryInto<u64>) -> f64 {
    n.try_into().unwrap_or(u64::MAX) as f64
}

/// `Number(v ?? 0)`: what JavaScript reads as a number (a string `"NaN"` is NaN,
/// `"Infinity"` infinite, `""` 0; an object NaN).
fn to_number(v: Option<&Value>) -> f64 {
    match v {
        None | Some(Value::Null | Value::Bool(false)) => 0.0,
        Some(Value::Bool(true)) => 1.0,
        Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
        Some(Value::String(s)) => string_to_number(s),
        Some(v @ (Value::Array(_) | Value::Object(_))) => string_to_number(&js_string(Some(v))),
    }
}

/// JavaScript's `Number(string)`: decimal (with an exponent), `0x`/`0o`/`0b` integers,
/// `Infinity`, surrounding whitespace ignored, empty 0; anything else NaN.
fn string_to_number(s: &str) -> f64 {
    let t = s.trim_matches(is_js_whitespace);
    if t.is_empty() {
        return 0.0;
    }
    match t {
        "Infinity" | "+Infinity" => return f64::INFINITY,
        "-Infinity" => return f64::NEG_INFINITY,
        _ => {}
    }
    let radix = match t.get(..2) {
        Some("0x" | "0X") => 16,
        Some("0o" | "0O") => 8,
        Some("0b" | "0B") => 2,
        _ => 10,
    };
    if radix != 10 {
        return radix_integer(&t[2..], radix);
    }
    if is_decimal_literal(t) {
        decimal(t)
    } else {
        f64::NAN
    }
}

/// A decimal literal (checked) read as serde_json reads the same number in JSON (which the
/// rest of the metrics are read with; the wasm build then needs no other float parser);
/// beyond the range of a float, infinite.
fn decimal(t: &str) -> f64 {
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exponent) = t.split_at(t.find(['e', 'E']).unwrap_or(t.len()));
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let int = int.trim_start_matches('0');
    let mut json = String::with_capacity(t.len() + 2);
    if negative {
        json.push('-');
    }
    json.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        json.push('.');
        json.push_str(frac);
    }
    json.push_str(exponent);
    match serde_json::from_str::<Value>(&json) {
        Ok(v) => v.as_f64().unwrap_or(f64::NAN),
        Err(_) if negative => f64::NEG_INFINITY,
        Err(_) => f64::INFINITY,
    }
}

/// The digits of a `0x`/`0o`/`0b` literal; NaN when there are none or another character.
#[allow(clippy::cast_precision_loss)] // rounded to the nearest, as JavaScript does
fn radix_integer(digits: &str, radix: u32) -> f64 {
    if digits.is_empty() {
        return f64::NAN;
    }
    let mut exact: Option<u64> = Some(0);
    let mut approx = 0.0_f64;
    for c in digits.chars() {
        let Some(d) = c.to_digit(radix) else {
            return f64::NAN;
        };
        exact = exact
            .and_then(|n| n.checked_mul(u64::from(radix)))
            .and_then(|n| n.checked_add(u64::from(d)));
        approx = approx * f64::from(radix) + f64::from(d);
    }
    exact.map_or(approx, |n| n as f64)
}

/// `[+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?`: JavaScript's
/// `StrDecimalLiteral` but for `Infinity`.
fn is_decimal_literal(t: &str) -> bool {
    let b = t.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    let mut mantissa = digits(&mut i);
    if b.get(i) == Some(&b'.') {
        i += 1;
        mantissa += digits(&mut i);
    }
    if mantissa == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// JavaScript's white space and line terminators (what `Number()` trims).
fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202f}'
                | '\u{205f}'
                | '\u{3000}'
                | '\u{feff}'
    )
}

/// JavaScript's `String(v)` (`undefined` for a missing value).
fn js_string(v: Option<&Value>) -> String {
    match v {
        None => String::from("undefined"),
        Some(Value::Null) => String::from("null"),
        Some(Value::Bool(b)) => String::from(if *b { "true" } else { "false" }),
        Some(Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
        Some(Value::Number(n)) => js_number(n.as_f64().unwrap_or(f64::NAN)),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let mut out = String::new();
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if !item.is_null() {
                    out.push_str(&js_string(Some(item)));
                }
            }
            out
        }
        Some(Value::Object(_)) => String::from("[object Object]"),
    }
}

/// A sample's value: `String(n)`, with NaN and the infinities in the format's spelling.
fn format_value(n: f64) -> String {
    if n.is_nan() {
        String::from("NaN")
    } else if n == f64::INFINITY {
        String::from("+Inf")
    } else if n == f64::NEG_INFINITY {
        String::from("-Inf")
    } else {
        js_number(n)
    }
}

/// JavaScript's `String(n)`: the shortest digits that read back as `n`, as an integer or a
/// decimal for exponents from -7 to 20, else in exponent notation (`1e+21`, `1.5e-7`).
fn js_number(n: f64) -> String {
    if n.is_nan() {
        return String::from("NaN");
    }
    if n == 0.0 {
        return String::from("0");
    }
    if n.is_infinite() {
        return String::from(if n > 0.0 { "Infinity" } else { "-Infinity" });
    }
    let mut out = String::new();
    if n < 0.0 {
        out.push('-');
    }
    // The shortest round-trip digits (serde_json's, ryu), laid out as JavaScript does.
    let shortest =
        serde_json::Number::from_f64(n.abs()).map_or_else(String::new, |n| n.to_string());
    let (mantissa, exponent) = match shortest.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (shortest.as_str(), 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = [int, frac].concat();
    let leading = all.bytes().take_while(|b| *b == b'0').count();
    let digits = all[leading..].trim_end_matches('0');
    // n = 0.<digits> × 10^point
    let point = i32::try_from(int.len()).unwrap_or(i32::MAX) - i32::try_from(leading).unwrap_or(0)
        + exponent;
    let k = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    let zeros = |out: &mut String, n: i32| {
        for _ in 0..n {
            out.push('0');
        }
    };
    if k <= point && point <= 21 {
        out.push_str(digits);
        zeros(&mut out, point - k);
    } else if 0 < point && point <= 21 {
        let (a, b) = digits.split_at(usize::try_from(point).unwrap_or(0));
        out.push_str(a);
        out.push('.');
        out.push_str(b);
    } else if -6 < point && point <= 0 {
        out.push_str("0.");
        zeros(&mut out, -point);
        out.push_str(digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        out.push('e');
        out.push(if point > 0 { '+' } else { '-' });
        out.push_str(&(point - 1).unsigned_abs().to_string());
    }
    out
}

/// `Math.max(a, b)`: NaN if either is.
fn js_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if b > a {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use serde_json::json;

    #[test]
    fn numbers_are_written_as_javascript_writes_them() {
        for (n, js) in [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-3.0, "-3"),
            (0.1, "0.1"),
            (0.1 + 0.2, "0.30000000000000004"),
            (123_456_789.123, "123456789.123"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e21, "1.5e+21"),
            (1e-6, "0.000001"),
            (1.5e-6, "0.0000015"),
            (1e-7, "1e-7"),
            (-1.5e-7, "-1.5e-7"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (18_446_744_073_709_551_615.0, "18446744073709552000"),
            (0.001, "0.001"),
            (1234.567, "1234.567"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(js_number(n), js, "{n:e}");
        }
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
    }

    #[test]
    fn values_are_read_as_javascript_reads_them() {
        let n = |v: Value| to_number(Some(&v));
        assert_eq!(to_number(None), 0.0);
        assert_eq!(n(Value::Null), 0.0);
        assert_eq!(n(json!(true)), 1.0);
        assert_eq!(n(json!(" 12 ")), 12.0);
        assert_eq!(n(json!("0x1f")), 31.0);
        assert_eq!(n(json!("0b101")), 5.0);
        assert_eq!(n(json!(".5")), 0.5);
        assert_eq!(n(json!("5.")), 5.0);
        assert_eq!(n(json!("-1e3")), -1000.0);
        assert_eq!(n(json!("")), 0.0);
        assert_eq!(n(json!("007.50")), 7.5);
        assert_eq!(n(json!("+.5e1")), 5.0);
        assert_eq!(n(json!("1e400")), f64::INFINITY);
        assert_eq!(n(json!("-1e400")), f64::NEG_INFINITY);
        assert_eq!(n(json!("0e99999")), 0.0);
        assert_eq!(
            n(json!("123456789012345678901234567890")),
            1.2345678901234568e29
        );
        assert_eq!(n(json!("Infinity")), f64::INFINITY);
        assert_eq!(n(json!("-Infinity")), f64::NEG_INFINITY);
        assert_eq!(n(json!([])), 0.0);
        assert_eq!(n(json!([7])), 7.0);
        for nan in [
            json!("NaN"),
            json!("abc"),
            json!("inf"),
            json!("1_000"),
            json!("."),
            json!("1e"),
            json!("-0x1"),
            json!({}),
            json!([1, 2]),
        ] {
            assert!(n(nan.clone()).is_nan(), "{nan}");
        }
        assert_eq!(js_string(None), "undefined");
        assert_eq!(js_string(Some(&json!([1, null, "a", [2, 3]]))), "1,,a,2,3");
        assert_eq!(js_string(Some(&json!(1.5))), "1.5");
        assert_eq!(js_string(Some(&json!(u64::MAX))), "18446744073709551615");
    }

    #[test]
    fn names_and_labels_are_escaped() {
        assert_eq!(snake_case("grantedFromQueue"), "granted_from_queue");
        assert_eq!(snake_case("a-b\u{1F600}Ä"), "a_b___");
        let l = Labels::new("fl\"eet", "a\\b\nc");
        assert_eq!(l.0, r#"fleet="fl\"eet",quota="a\\b\nc""#);
        let mut help = String::new();
        escape_help(&mut help, "a\\b\"c\nd");
        assert_eq!(help, r#"a\\b"c\nd"#);
    }

    #[test]
    fn object_entries_come_in_javascript_order() {
        let v = json!({ "b": 1, "10": 2, "9": 3, "a": 4, "01": 5, "4294967295": 6 });
        let keys: Vec<&str> = entries(Some(&v)).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec!["9", "10", "01", "4294967295", "a", "b"]);
        let pool = json!({ "counters": { "zeta": 0, "settled": 1, "grantedNow": 2, "7": 3 } });
        let keys: Vec<&str> = counters(Some(&pool)).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec!["7", "grantedNow", "settled", "zeta"]);
    }

    #[test]
    fn the_counters_are_the_cores_in_its_order() {
        // The help's order is the order the core writes its counters in (its field order).
        let json =
            serde_json::to_string(&tokenwarden_core::PoolCounters::default()).unwrap_or_default();
        let mut at = 0;
        for (key, _) in COUNTER_HELP {
            let snake = snake_case(key);
            let found = json[at..].find(&format!("\"{snake}\""));
            assert!(found.is_some(), "{key} ({snake}) after {at} in {json}");
            at += found.unwrap_or(0) + 1;
        }
        assert_eq!(json.matches(':').count(), COUNTER_HELP.len(), "{json}");
    }

    #[test]
    fn agents_rank_by_activity_and_the_rest_are_other() {
        let mut agents: Vec<Value> = (0..25)
            .map(|i| json!({ "agent": i, "name": format!("bot-{i}"), "settled": i, "activity": { "state": "idle" } }))
            .collect();
        agents.push(json!({ "agent": 99, "inFlight": 2, "activity": { "state": "in_flight" } }));
        agents
            .push(json!({ "agent": 98, "activity": { "state": "rate_limited", "until": 5_000 } }));
        let text = text(
            &json!({ "now": 2_000, "liveLeases": 1, "pools": [], "agents": agents }),
            "f",
            "q",
        );
        let settled: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("tokenwarden_agent_settled_total{"))
            .collect();
        assert_eq!(settled.len(), MAX_AGENT_LABELS + 1);
        assert_eq!(
            settled[0],
            r#"tokenwarden_agent_settled_total{fleet="f",quota="q",agent="99"} 0"#
        );
        assert_eq!(
            settled[MAX_AGENT_LABELS],
            r#"tokenwarden_agent_settled_total{fleet="f",quota="q",agent="other"} 21"#,
            "bot-0 to bot-6 summed"
        );
        assert!(text.contains(
            "tokenwarden_agent_rate_limited{fleet=\"f\",quota=\"q\",agent=\"98\",axis=\"unknown\"} 1\n"
        ));
        assert!(text.contains(
            "tokenwarden_agent_wait_remaining_seconds{fleet=\"f\",quota=\"q\",agent=\"98\"} 3\n"
        ));
        assert!(text.contains("tokenwarden_agents{fleet=\"f\",quota=\"q\",state=\"idle\"} 25\n"));
    }

    #[test]
    fn the_sort_is_stable_and_never_panics() {
        let keys = [3, 1, 2, 1, 3, 0, 2, 1, 5, 4, 0, 9, 1];
        let order = sorted(keys.len(), &|x, y| keys[x].cmp(&keys[y]));
        let mut expected: Vec<usize> = (0..keys.len()).collect();
        expected.sort_by_key(|i| keys[*i]);
        assert_eq!(order, expected);
        // NaN figures make JavaScript's comparator no order at all: any order, no panic.
        let agents: Vec<Value> = (0..100)
            .map(|i| {
                let odd = if i % 3 == 0 { json!("x") } else { json!(i % 7) };
                json!({ "agent": i, "inFlight": odd, "settled": (i * 37) % 11, "lastSeen": if i % 5 == 0 { json!("y") } else { json!(i) } })
            })
            .collect();
        let text = text(&json!({ "agents": agents }), "f", "q");
        assert!(text.contains("agent=\"other\""));
    }

    #[test]
    fn families_are_counted_by_root() {
        let agents = json!([
            { "agent": 1, "activity": { "state": "idle" } },
            { "agent": 2, "family": 1, "familyName": "lead", "inFlight": 1 },
            { "agent": 3, "family": 1, "familyName": "lead" },
            { "agent": 4, "family": 5 },
        ]);
        let text = text(&json!({ "agents": agents }), "f", "q");
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("tokenwarden_family_"))
            .collect();
        assert_eq!(
            lines,
            vec![
                r#"tokenwarden_family_members{fleet="f",quota="q",family="lead"} 3"#,
                r#"tokenwarden_family_members{fleet="f",quota="q",family="5"} 1"#,
                r#"tokenwarden_family_busy{fleet="f",quota="q",family="lead"} 1"#,
                r#"tokenwarden_family_busy{fleet="f",quota="q",family="5"} 0"#,
            ]
        );
    }

    #[test]
    fn integers_are_exact_and_empty_families_left_out() {
        let metrics = json!({
            "now": 5,
            "liveLeases": 0,
            "pools": [{
                "name": "p",
                "axes": [{ "axis": "tokens", "limit": u64::MAX, "capacity": 1, "available": -3,
                           "lastMinute": 0, "lastMinutePermille": 0 }],
                "marginPermille": 1000,
                "pausedUntil": u64::MAX,
                "counters": { "settled": 0 },
            }],
            "ceilings": { "pools": [{ "pool": "p", "rejected": { "exceeds_capacity:tokens": 2, "queue_full": 1 } }] },
        });
        let text = text(&metrics, "f", "q");
        assert!(text.contains(
            "tokenwarden_limit{fleet=\"f\",quota=\"q\",pool=\"p\",axis=\"tokens\"} 18446744073709551615\n"
        ));
        assert!(text.contains(
            "tokenwarden_available{fleet=\"f\",quota=\"q\",pool=\"p\",axis=\"tokens\"} -3\n"
        ));
        assert!(text.contains("tokenwarden_paused{fleet=\"f\",quota=\"q\",pool=\"p\"} 1\n"));
        assert!(text.contains(
            "tokenwarden_rejected_by_reason_total{fleet=\"f\",quota=\"q\",pool=\"p\",reason=\"exceeds_capacity\",axis=\"tokens\"} 2\n"
        ));
        assert!(text.contains(
            "tokenwarden_rejected_by_reason_total{fleet=\"f\",quota=\"q\",pool=\"p\",reason=\"queue_full\"} 1\n"
        ));
        assert!(!text.contains("tokenwarden_queue_wait_seconds"));
        assert!(!text.contains("tokenwarden_tasks_open"));
        let mut types = text.lines().filter(|l| l.starts_with("# TYPE "));
        assert!(types.all(|t| text.matches(&format!("{t}\n")).count() == 1));
    }
}
