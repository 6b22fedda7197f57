//! The scenarios: the write-up's fleet, and the situations each goal is about.

use tokenwarden_core::Role;

use super::{AgentSpec, Limits, Scenario, Strategy, TurnShape};

/// The key of the write-up's fleet: Anthropic-style token limits with the gateway's 120
/// requests/min and 20 parallel requests.
const KEY: Limits = Limits {
    input_tpm: 170_000,
    output_tpm: 48_000,
    rpm: 120,
    concurrent: 20,
};

fn agent(name: &str, role: Role, shape: TurnShape, tool_ms: u64) -> AgentSpec {
    AgentSpec {
        name: name.to_string(),
        role,
        shape,
        tool_ms,
        exponential_tool: false,
        depends_on: Vec::new(),
        looping: false,
        tenant: 0,
        tasks: None,
        mixed_sizes: false,
        model: "claude-sonnet-4-5",
        pause: (0, 0, 0),
    }
}

// A refactor turn sends ~80k tokens: the plan and a dozen files re-read, plus test output.
// Only the conversation's stable head stays in the prompt cache between turns.
const REFACTOR: TurnShape = TurnShape {
    context_start: 80_000,
    growth: 4_000,
    new_tokens: 40_000,
    context_max: 110_000,
    max_tokens: 4_096,
    turns: 6,
};
const LINT: TurnShape = TurnShape {
    context_start: 2_000,
    growth: 500,
    new_tokens: 1_200,
    context_max: 4_000,
    max_tokens: 1_024,
    turns: 3,
};
const PLAN: TurnShape = TurnShape {
    context_start: 30_000,
    growth: 3_000,
    new_tokens: 12_000,
    context_max: 50_000,
    max_tokens: 4_096,
    turns: 4,
};
const REPAIR: TurnShape = TurnShape {
    context_start: 10_000,
    growth: 2_000,
    new_tokens: 5_000,
    context_max: 24_000,
    max_tokens: 2_048,
    turns: 4,
};
const REVIEW: TurnShape = TurnShape {
    context_start: 20_000,
    growth: 3_000,
    new_tokens: 8_000,
    context_max: 35_000,
    max_tokens: 2_048,
    turns: 3,
};

/// Mean think time in `mixed`: 40 agents × 5.5k tokens a call on average (a quarter
/// 17.5k, the rest 1.5k) offering 1.5 × 120k a minute is one call per agent every ~73 s,
/// of which ~9 s is the call itself.
const MIXED_TOOL_MS: u64 = 64_000;

/// The write-up's fleet: 20 agents from one push, in lock step on a ~90 s loop.
fn seed003_fleet() -> Vec<AgentSpec> {
    const TOOL: u64 = 80_000;
    let mut v = vec![agent("planner", Role::Planner, PLAN, TOOL)];
    for k in 0..6 {
        let mut a = agent(&format!("repair-{k}"), Role::Worker, REPAIR, TOOL);
        a.depends_on = vec![0];
        v.push(a);
    }
    let mut reviewer = agent("reviewer", Role::Reviewer, REVIEW, TOOL);
    reviewer.depends_on = (1..=6).collect();
    v.push(reviewer);
    for k in 0..4 {
        v.push(agent(
            &format!("refactor-{k}"),
            Role::Worker,
            REFACTOR,
            TOOL,
        ));
    }
    for k in 0..8 {
        let mut a = agent(&format!("lint-{k}"), Role::Worker, LINT, TOOL);
        a.looping = k < 2;
        v.push(a);
    }
    for (i, a) in v.iter_mut().enumerate() {
        a.tenant = i;
        // One push's backlog: every agent has a fixed list of tasks, so every strategy
        // runs the same work and task-time percentiles compare like with like.
        a.tasks = Some(match a.role {
            Role::Planner | Role::Reviewer => 4,
            _ if a.shape.context_start >= 80_000 => 3,
            _ if a.depends_on.is_empty() => 8,
            _ => 4,
        });
    }
    v
}

/// 50 independent callers with exponential think times: Poisson arrivals at `load`
/// thousandths of the input limit.
fn poisson_fleet(n: usize, new_tokens: u64, max_tokens: u64, load_permille: u64) -> Vec<AgentSpec> {
    // Demand per agent per minute = new_tokens / cycle; cycle ≈ mean tool time + ~5 s latency.
    let per_agent = KEY.input_tpm * load_permille / 1000 / n as u64;
    let cycle_ms = new_tokens * 60_000 / per_agent;
    let tool = cycle_ms.saturating_sub(5_000).max(1_000);
    let shape = TurnShape {
        context_start: new_tokens,
        growth: 0,
        new_tokens,
        context_max: new_tokens,
        max_tokens,
        turns: 1,
    };
    (0..n)
        .map(|i| {
            let mut a = agent(&format!("caller-{i}"), Role::Worker, shape, tool);
            a.exponential_tool = true;
            a.tenant = i;
            a
        })
        .collect()
}

fn base(
    name: &'static str,
    description: &'static str,
    goal: &'static str,
    agents: Vec<AgentSpec>,
) -> Scenario {
    Scenario {
        name,
        description,
        limits: KEY,
        minutes: 60,
        agents,
        start_spread_ms: 5_000,
        outsider_input_per_min: 0,
        estimate_noise_permille: 0,
        settle_delay_ms: 0,
        output_permille: (200, 600),
        headers_only: false,
        margin_ceiling: 850,
        weights: (3000, 2000, 1000),
        strategies: Strategy::ALL.to_vec(),
        goal,
        product_estimator: false,
        small_lead_permille: tokenwarden_core::WeightConfig::default().small_lead_permille,
    }
}

/// Every scenario, in report order.
pub fn scenarios() -> Vec<Scenario> {
    let mut out = Vec::new();

    out.push(base(
        "seed003",
        "20 agents from one push: a planner unblocking 6 repair agents, a reviewer after them, 4 refactor agents (~80k-token turns), 8 lint agents (~2k), 2 of them looping on the same failing test.",
        "coordinator 429s <= 0.1% of requests; tokens per finished task >= 30% below (a) and (b); p95 task time >= 2x better; critical-path wait lowest with (e)",
        seed003_fleet(),
    ));
    if let Some(s) = out.last_mut() {
        s.minutes = 120;
    }

    // The tightest key every call of the fleet still fits: its biggest call, a refactor
    // re-planned from scratch, sends 110k fresh tokens, and 130k x the 85 % margin is 110.5k.
    let mut s = base(
        "seed003-tight",
        "seed003's fleet on a key with 130k input tokens/min instead of 170k (the least on which its biggest call, 110k tokens, still fits the 85 % margin): the coordinator queues in the waves.",
        "critical-path wait lowest with (e); p95 task time >= 2x better than (a) and (b); tokens per finished task >= 30% below both",
        seed003_fleet(),
    );
    s.minutes = 240;
    s.limits = Limits {
        input_tpm: 130_000,
        ..KEY
    };
    out.push(s);

    let mut s = base(
        "saturate",
        "50 callers, Poisson arrivals at 1.5x the input limit, honest estimates; margin ceiling 100% (nothing else uses the key).",
        ">= 97% of the binding limit with <= 0.1% 429s",
        poisson_fleet(50, 6_000, 512, 1_500),
    );
    s.margin_ceiling = 1000;
    out.push(s);

    let mut agents = poisson_fleet(40, 2_000, 4_096, 400);
    for a in &mut agents {
        a.tool_ms = 10_000;
    }
    let mut s = base(
        "overreserve",
        "40 callers whose output is 30-100% of max_tokens (4096): output tokens/min binds and reservations are refunded on settle; margin ceiling 100%.",
        ">= 90% of output tokens/min used",
        agents,
    );
    s.output_permille = (300, 1000);
    s.margin_ceiling = 1000;
    out.push(s);

    let mut s = base(
        "noisy",
        "50 callers at 1.2x the input limit whose input estimates are off by up to +-20%, settling 50 ms after the response.",
        "<= 1% 429s",
        poisson_fleet(50, 6_000, 512, 1_200),
    );
    s.estimate_noise_permille = 200;
    s.settle_delay_ms = 50;
    out.push(s);

    let mut s = base(
        "headers-only",
        "The coordinator starts with no limits and learns them from response headers; 50 callers at 1.5x the input limit; margin ceiling 100%.",
        ">= 90% of the limit within two windows",
        poisson_fleet(50, 6_000, 512, 1_500),
    );
    s.headers_only = true;
    s.margin_ceiling = 1000;
    s.strategies = vec![Strategy::CoordinatorEqual, Strategy::Coordinator];
    out.push(s);

    let heavy = TurnShape {
        context_start: 20_000,
        growth: 0,
        new_tokens: 20_000,
        context_max: 20_000,
        max_tokens: 256,
        turns: 1,
    };
    let light = TurnShape {
        context_start: 2_000,
        growth: 0,
        new_tokens: 2_000,
        context_max: 2_000,
        max_tokens: 256,
        turns: 1,
    };
    let agents = (0..10)
        .map(|i| {
            let mut a = agent(
                &format!("tenant-{i}"),
                Role::Worker,
                if i == 0 { heavy } else { light },
                200,
            );
            a.tenant = i;
            a
        })
        .collect();
    let mut s = base(
        "fairness",
        "10 backlogged tenants on one key, one sending 10x heavier calls; requests/min raised to 2000 so tokens bind.",
        "Jain fairness >= 0.95 over tenants' tokens",
        agents,
    );
    s.limits.rpm = 2_000;
    out.push(s);

    let shape = TurnShape {
        context_start: 5_000,
        growth: 0,
        new_tokens: 5_000,
        context_max: 5_000,
        max_tokens: 256,
        turns: 1,
    };
    let agents = (0..12)
        .map(|i| {
            let (role, tenant) = match i % 3 {
                0 => (Role::Worker, 0),
                1 => (Role::Reviewer, 1),
                _ => (Role::Planner, 2),
            };
            let mut a = agent(&format!("w{}-{i}", [1, 2, 4][tenant]), role, shape, 200);
            a.tenant = tenant;
            a
        })
        .collect();
    let mut s = base(
        "weights",
        "Three backlogged groups of 4 agents weighted 1:2:4 (worker 1, reviewer 2, planner 4).",
        "token shares within +-5% of 1/7, 2/7, 4/7 under (e)",
        agents,
    );
    s.weights = (4000, 2000, 1000);
    s.limits.rpm = 2_000;
    s.strategies = vec![Strategy::CoordinatorEqual, Strategy::Coordinator];
    out.push(s);

    // 40 agents, a quarter of whose calls are big: roles 4 planners, 8 reviewers, 28
    // workers; Poisson think time sized so the fleet offers 1.5x the input limit.
    let agents = (0..40)
        .map(|i| {
            let role = match i {
                0..4 => Role::Planner,
                4..12 => Role::Reviewer,
                _ => Role::Worker,
            };
            let mut a = agent(&format!("mixed-{i}"), role, LINT, MIXED_TOOL_MS);
            a.mixed_sizes = true;
            a.exponential_tool = true;
            a.tenant = i;
            a
        })
        .collect();
    let mut s = base(
        "mixed",
        "40 agents (4 planners, 8 reviewers, 28 workers) offering 1.5x the input limit: every fourth call of each agent 15-20k tokens with max_tokens 2000, the others 1-2k with 500; Poisson think times; the SDK fleet's limits (120k input / 12k output tokens, 90 requests a minute, 10 parallel).",
        "no call waits past its bound; small calls' p95 wait per token at most 0.6x and big calls' at most 1.35x the order without the small-call lead; Jain within a role >= 0.95; 0 429s",
        agents,
    );
    s.limits = Limits {
        input_tpm: 120_000,
        output_tpm: 12_000,
        rpm: 90,
        concurrent: 10,
    };
    s.minutes = 30;
    out.push(s);

    // Claude-Code-like sessions whose request bodies the simulator generates: the product's
    // own estimator (the provider crate's, as every engine package runs it) sizes every lease.
    let agents = (0..12)
        .map(|i| {
            let opus = i >= 8;
            let shape = TurnShape {
                context_start: if opus { 8_000 } else { 3_000 },
                growth: 0,
                new_tokens: 0,
                context_max: 55_000,
                max_tokens: if opus { 128_000 } else { 32_000 },
                turns: if opus { 20 } else { 30 },
            };
            let role = if i == 0 { Role::Planner } else { Role::Worker };
            let mut a = agent(&format!("session-{i}"), role, shape, 6_000);
            a.model = if opus {
                "claude-opus-4-1"
            } else {
                "claude-sonnet-4-5"
            };
            // Now and then the developer is away, or a build runs long: the session's
            // cache expires.
            a.pause = (20, 360_000, 900_000);
            a.tenant = i;
            a
        })
        .collect();
    let mut s = base(
        "estimator",
        "12 Claude-Code-like sessions (8 on one model with max_tokens 32000, 4 on another with 128000) whose Anthropic request bodies the simulator generates: 12 tools, a system prompt in two blocks with a breakpoint, a history growing each turn by a tool_use and its tool_result, the rolling breakpoint on the newest message, compaction past 55k tokens, a 6-15 min pause after 2% of turns. The coordinator leases by the product's estimator (the provider crate's, which DefaultEstimator runs in every engine package, observing every settled call as the fetch wrapper does); the provider counts every token exactly and applies Anthropic's prompt-cache rules.",
        "<= 1% 429s with the product's estimates; the core's median input-estimate error <= 10%",
        agents,
    );
    s.limits = Limits {
        input_tpm: 70_000,
        output_tpm: 24_000,
        rpm: 100,
        concurrent: 10,
    };
    s.minutes = 30;
    s.product_estimator = true;
    s.strategies = vec![Strategy::Coordinator];
    out.push(s);

    let mut s = base(
        "outsider",
        "The seed003 fleet while a script outside the coordinator sends 60k input tokens/min on the same key.",
        "the margin adapts and never drops below its floor",
        seed003_fleet(),
    );
    s.outsider_input_per_min = 60_000;
    s.minutes = 120;
    out.push(s);

    out
}

/// One scenario by name.
pub fn scenario(name: &str) -> Option<Scenario> {
    scenarios().into_iter().find(|s| s.name == name)
}
