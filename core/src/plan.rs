//! Sizing a fleet before it runs (seed 002: "size against the late-session rate, leave
//! 70–80 % headroom"): from a pool's limits and a description of the agents, how many fit,
//! which limit binds, and how much a given fleet would wait.
//!
//! The arithmetic, per agent kind and per minute, late in a session (the average of the
//! last quarter of its turns, when its context has grown most):
//!
//! ```text
//! input    = turns/min × (late input tokens, less the cached share under Anthropic counting)
//! output   = turns/min × output tokens
//! tokens   = input + output                      (OpenAI: input is every prompt token)
//! requests = turns/min
//! in flight = turns/min × call seconds / 60      (Little's law)
//! ```
//!
//! each multiplied by `1 + fan_out` (the subagents each agent runs alongside itself, alike).
//! The fleet's demand per axis is the sum over kinds; at `headroom` (thousandths of each
//! limit) the fleet fits while every axis's demand is at most `headroom × limit`. Agents that
//! fit: the fleet scaled by the largest factor that keeps every axis within headroom, in
//! whole agents of the kinds' mix. Above 100 % of a limit the work cannot all be done at the
//! fleet's pace: the coordinator makes the wait orderly (nobody gets a 429) and each turn
//! stretches by the binding axis's demand ÷ limit.

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::config::{Counting, PoolConfig};

/// Why a fleet description cannot be sized: the field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    /// The field (`agents[0].input_tokens_last`), or empty for text that is not a fleet
    /// description at all.
    pub field: String,
    /// What is wrong, in lowercase words.
    pub reason: String,
}

impl core::fmt::Display for PlanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.field.is_empty() {
            write!(f, "not a fleet description: {}", self.reason)
        } else {
            write!(f, "{}: {}", self.field, self.reason)
        }
    }
}

/// [`plan_fleet`] on a JSON fleet description ([`FleetPlan`]'s fields, snake_case).
pub fn plan_fleet_json(json: &str) -> Result<Plan, PlanError> {
    let p: FleetPlan = serde_json::from_str(json).map_err(|e| PlanError {
        field: String::new(),
        reason: alloc::format!("{e}"),
    })?;
    plan_fleet(&p)
}

/// One kind of agent in a fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentKind {
    /// A name for the answer.
    pub name: String,
    /// How many agents of this kind.
    pub count: u32,
    /// Model calls per minute per agent, thousandths (a turn every 90 s is 667).
    pub calls_per_minute_milli: u64,
    /// Input tokens of its first call in a session.
    pub input_tokens_first: u64,
    /// Input tokens of its last call (the context grown over the session).
    pub input_tokens_last: u64,
    /// Output tokens per call.
    pub output_tokens: u64,
    /// Share of the input read from the prompt cache, thousandths (not counted against the
    /// input limit under Anthropic counting; counted under OpenAI's).
    #[serde(default)]
    pub cached_permille: u32,
    /// How long a call takes, ms (for the concurrency it needs).
    #[serde(default = "default_call_ms")]
    pub call_ms: u64,
    /// Subagents each agent runs alongside itself, alike (default 0).
    #[serde(default)]
    pub fan_out: u32,
}

fn default_call_ms() -> u64 {
    20_000
}

/// A fleet to size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetPlan {
    /// The pool (its limits and counting rules).
    pub pool: PoolConfig,
    /// The agents.
    pub agents: Vec<AgentKind>,
    /// The share of each limit to plan to, thousandths (default 750: seed 002's 70–80 %).
    #[serde(default = "default_headroom")]
    pub headroom_permille: u32,
}

fn default_headroom() -> u32 {
    750
}

/// One axis of the answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanAxis {
    /// `input_tokens`, `output_tokens`, `tokens`, `requests` or `concurrent`.
    pub axis: String,
    /// The limit (per minute; in flight for `concurrent`).
    pub limit: u64,
    /// The fleet's late-session demand (per minute; in flight for `concurrent`).
    pub demand: u64,
    /// Demand ÷ limit, thousandths.
    pub used_permille: u64,
}

/// The answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Every limited axis.
    pub axes: Vec<PlanAxis>,
    /// The axis that binds first (the highest share used), if any axis is limited.
    pub binding_axis: Option<String>,
    /// Agents in the fleet (counting subagents).
    pub agents: u64,
    /// Agents of the same mix that fit within the headroom on every axis; `None` when the
    /// fleet puts no demand on any limited axis (any number of them fits).
    pub agents_that_fit: Option<u64>,
    /// Whether the fleet as described fits within the headroom.
    pub fits: bool,
    /// How much longer each turn takes than the fleet's own pace, thousandths (1000: not
    /// at all; 2000: each turn takes twice as long, waiting for quota): the binding axis's
    /// demand ÷ limit when above 1.
    pub turn_stretch_permille: u64,
}

/// Sizes a fleet (see the module documentation for the arithmetic). Errors name the field.
pub fn plan_fleet(p: &FleetPlan) -> Result<Plan, PlanError> {
    let bad = |field: &str, why: &str| PlanError {
        field: field.into(),
        reason: why.into(),
    };
    if p.agents.is_empty() {
        return Err(bad("agents", "must name at least one kind of agent"));
    }
    if p.headroom_permille == 0 || p.headroom_permille > 1000 {
        return Err(bad(
            "headroom_permille",
            "must be between 1 and 1000 (thousandths)",
        ));
    }
    for (i, k) in p.agents.iter().enumerate() {
        let at = |f: &str| alloc::format!("agents[{i}].{f}");
        if k.input_tokens_last < k.input_tokens_first {
            return Err(bad(
                &at("input_tokens_last"),
                "must be at least input_tokens_first (a context grows)",
            ));
        }
        if k.cached_permille > 1000 {
            return Err(bad(&at("cached_permille"), "must be at most 1000"));
        }
        for (f, v) in [
            ("calls_per_minute_milli", k.calls_per_minute_milli),
            ("input_tokens_last", k.input_tokens_last),
            ("output_tokens", k.output_tokens),
            ("call_ms", k.call_ms),
        ] {
            if v > 1 << 40 {
                return Err(bad(&at(f), "is too large"));
            }
        }
    }
    let limits = [
        ("input_tokens", p.pool.input_tokens_per_minute),
        ("output_tokens", p.pool.output_tokens_per_minute),
        ("tokens", p.pool.tokens_per_minute),
        ("requests", p.pool.requests_per_minute),
        ("concurrent", p.pool.max_concurrent),
    ];
    // The pool's limits as a configuration takes them (see `Config::validate`).
    for (field, v) in [
        (
            "pool.input_tokens_per_minute",
            p.pool.input_tokens_per_minute,
        ),
        (
            "pool.output_tokens_per_minute",
            p.pool.output_tokens_per_minute,
        ),
        ("pool.tokens_per_minute", p.pool.tokens_per_minute),
        ("pool.requests_per_minute", p.pool.requests_per_minute),
        ("pool.max_concurrent", p.pool.max_concurrent),
    ] {
        match v {
            Some(0) => return Err(bad(field, "must be at least 1 (use null for unknown)")),
            Some(v) if v > crate::config::MAX_TOKENS => {
                return Err(bad(field, "must be at most 2^53 - 1"));
            }
            _ => {}
        }
    }
    if limits.iter().all(|(_, l)| l.is_none()) {
        return Err(bad(
            "pool",
            "has no limit to plan against: give at least one of input_tokens_per_minute, \
             output_tokens_per_minute, tokens_per_minute, requests_per_minute, max_concurrent",
        ));
    }
    let anthropic = p.pool.counting == Counting::Anthropic;
    // Per axis: demand in thousandths of a unit per minute (in flight for concurrency).
    let mut demand = [0u128; 5];
    let mut agents = 0u64;
    for k in &p.agents {
        let n = u128::from(k.count) * (1 + u128::from(k.fan_out));
        agents = agents.saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
        let rate = u128::from(k.calls_per_minute_milli);
        // The last quarter of the session: its average context is 7/8 of the way.
        let late = u128::from(k.input_tokens_first)
            + (u128::from(k.input_tokens_last - k.input_tokens_first) * 7) / 8;
        let counted = if anthropic {
            late * u128::from(1000 - k.cached_permille) / 1000
        } else {
            late
        };
        let input = n * rate * counted;
        let output = n * rate * u128::from(k.output_tokens);
        demand[0] += input;
        demand[1] += output;
        demand[2] += input + output;
        demand[3] += n * rate;
        demand[4] += n * rate * u128::from(k.call_ms) / 60_000;
    }
    let mut axes = Vec::new();
    // The fleet's scale that fits: min over axes of headroom × limit ÷ demand.
    let mut scale: Option<(u128, u128)> = None;
    for (i, (name, limit)) in limits.iter().enumerate() {
        let Some(limit) = *limit else { continue };
        let d = demand[i];
        // Limits are at least 1 (checked above).
        let used = d / u128::from(limit);
        axes.push(PlanAxis {
            axis: (*name).into(),
            limit,
            demand: u64::try_from(d.div_ceil(1000)).unwrap_or(u64::MAX),
            used_permille: u64::try_from(used).unwrap_or(u64::MAX),
        });
        if d > 0 {
            let room = u128::from(limit) * u128::from(p.headroom_permille);
            // room ÷ d as a fraction; keep the smallest.
            if scale.is_none_or(|(n, dd)| room * dd < n * d) {
                scale = Some((room, d));
            }
        }
    }
    let binding_axis = axes
        .iter()
        .max_by_key(|a| a.used_permille)
        .filter(|a| a.demand > 0)
        .map(|a| a.axis.clone());
    let top = axes.iter().map(|a| a.used_permille).max().unwrap_or(0);
    let agents_that_fit =
        scale.map(|(room, d)| u64::try_from(u128::from(agents) * room / d).unwrap_or(u64::MAX));
    Ok(Plan {
        fits: axes
            .iter()
            .all(|a| a.used_permille <= u64::from(p.headroom_permille)),
        axes,
        binding_axis,
        agents,
        agents_that_fit,
        turn_stretch_permille: top.max(1000),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Plan {
        plan_fleet(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn seed_000s_gateway_binds_on_parallel_requests_or_requests() {
        // 120 requests a minute, 20 in parallel; 20 agents each calling every 30 s for
        // 20 s: 40 requests a minute, 13.3 in flight.
        let p = plan(
            r#"{"pool":{"name":"mag","requests_per_minute":120,"max_concurrent":20},
                "agents":[{"name":"agent","count":20,"calls_per_minute_milli":2000,
                "input_tokens_first":2000,"input_tokens_last":60000,"output_tokens":1000,"call_ms":20000}]}"#,
        );
        let conc = p.axes.iter().find(|a| a.axis == "concurrent").unwrap();
        assert_eq!(
            conc.demand, 14,
            "40 calls/min × 20 s ÷ 60 s = 13.3 in flight"
        );
        assert_eq!(conc.used_permille, 666);
        let req = p.axes.iter().find(|a| a.axis == "requests").unwrap();
        assert_eq!((req.demand, req.used_permille), (40, 333));
        assert_eq!(p.binding_axis.as_deref(), Some("concurrent"));
        // 20 × 750 / 666.7 = 22.5: 22 agents fit at 75 %.
        assert_eq!(p.agents_that_fit, Some(22));
        assert!(p.fits);
        assert_eq!(p.turn_stretch_permille, 1000);
    }

    #[test]
    fn late_session_input_binds_and_an_oversized_fleet_stretches_its_turns() {
        // Seed 003's fleet: 4 refactor agents at 80k a turn, 16 lint fixers at 2k, every
        // 90 s, on 400k input tokens a minute.
        let p = plan(
            r#"{"pool":{"name":"key","input_tokens_per_minute":400000,"output_tokens_per_minute":80000,"requests_per_minute":4000},
                "agents":[
                  {"name":"refactor","count":4,"calls_per_minute_milli":667,"input_tokens_first":20000,"input_tokens_last":80000,"output_tokens":2000},
                  {"name":"lint","count":16,"calls_per_minute_milli":667,"input_tokens_first":2000,"input_tokens_last":2000,"output_tokens":500}]}"#,
        );
        let input = p.axes.iter().find(|a| a.axis == "input_tokens").unwrap();
        // Late refactor context: 20k + 7/8 × 60k = 72.5k; × 0.667 × 4 = 193,430; lint
        // 2k × 0.667 × 16 = 21,344.
        assert_eq!(input.demand, 214_774);
        assert_eq!(p.binding_axis.as_deref(), Some("input_tokens"));
        assert!(p.fits, "{p:?}");
        // 20 × 300,000 ÷ 214,774 = 27.9.
        assert_eq!(p.agents_that_fit, Some(27));
        // Twice the fleet on half the limit: 2.15× over, turns stretch 2.1×.
        let p = plan(
            r#"{"pool":{"name":"key","input_tokens_per_minute":200000},
                "agents":[{"name":"refactor","count":8,"calls_per_minute_milli":667,"input_tokens_first":20000,"input_tokens_last":80000,"output_tokens":2000}]}"#,
        );
        assert!(!p.fits);
        assert_eq!(p.turn_stretch_permille, 1934);
    }

    #[test]
    fn anthropic_cache_reads_do_not_count_and_bad_input_names_the_field() {
        let p = plan(
            r#"{"pool":{"name":"k","input_tokens_per_minute":100000},
                "agents":[{"name":"a","count":1,"calls_per_minute_milli":1000,"input_tokens_first":10000,"input_tokens_last":10000,"output_tokens":0,"cached_permille":900}]}"#,
        );
        assert_eq!(p.axes[0].demand, 1_000);
        let e = plan_fleet(
            &serde_json::from_str(
                r#"{"pool":{"name":"k"},"agents":[{"name":"a","count":1,"calls_per_minute_milli":1,"input_tokens_first":10,"input_tokens_last":5,"output_tokens":0}]}"#,
            )
            .unwrap(),
        )
        .unwrap_err();
        assert!(
            alloc::format!("{e}").contains("agents[0].input_tokens_last"),
            "{e}"
        );
    }

    #[test]
    fn a_pool_that_cannot_be_planned_against_is_refused_by_name() {
        let refused = |pool: &str| {
            let json = alloc::format!(
                r#"{{"pool":{pool},"agents":[{{"name":"a","count":3,"calls_per_minute_milli":2000,"input_tokens_first":1000,"input_tokens_last":2000,"output_tokens":100}}]}}"#
            );
            alloc::format!("{}", plan_fleet_json(&json).unwrap_err())
        };
        let e = refused(r#"{"name":"k"}"#);
        assert!(e.starts_with("pool: has no limit to plan against"), "{e}");
        let e = refused(r#"{"name":"k","input_tokens_per_minute":1000,"requests_per_minute":0}"#);
        assert_eq!(
            e,
            "pool.requests_per_minute: must be at least 1 (use null for unknown)"
        );
        let e = refused(r#"{"name":"k","max_concurrent":9007199254740992}"#);
        assert_eq!(e, "pool.max_concurrent: must be at most 2^53 - 1");
    }

    #[test]
    fn a_fleet_that_uses_no_limited_axis_fits_in_any_number() {
        let p = plan(
            r#"{"pool":{"name":"k","max_concurrent":4},
                "agents":[{"name":"a","count":3,"calls_per_minute_milli":2000,"input_tokens_first":10,"input_tokens_last":10,"output_tokens":1,"call_ms":0}]}"#,
        );
        assert_eq!(p.agents_that_fit, None);
        assert!(p.fits);
        assert_eq!(p.binding_axis, None);
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains(r#""agents_that_fit":null"#), "{json}");
    }
}
