//! A deterministic discrete-event simulator of an agent fleet on one API key.
//!
//! Virtual time in milliseconds, a seeded PRNG, no sleeping: an hour of a 50-agent fleet
//! runs in well under a second. The coordinator strategies run on the reference host loop
//! (`tokenwarden-host-loop`), the loop every shipped host runs, through the core's protocol
//! only: the call lifecycle's ask (`call_lease`), obeyed (send, wait in line for the grant,
//! ask again at `until`, give up), the provider's answer and rate-limit headers fed back
//! (`call_response`), a success settled with the provider's usage, tasks opened, failed and
//! ended as `Input`s; the simulator is the world around it (agents, provider, clock).
//! The strategies without a coordinator keep the simulator's own event loop.
//!
//! The model, from the write-up this project starts from:
//! - agents loop read → think → edit → test, about 90 s a cycle, and start together from
//!   one push, so their model calls land in waves;
//! - refactor turns send about 80k input tokens, lint turns about 2k; a conversation's
//!   history is a cached prefix, free of the input limit while the cache is warm (5 min);
//! - without a coordinator, a call that stays rate-limited past the harness's patience
//!   breaks the turn: the agent re-reads, re-tests and re-plans, spending 5–20× the failed
//!   call's tokens; the coordinator strategies checkpoint before waiting, so a wait costs
//!   no re-plan.

pub mod bodies;
pub mod bridge;
pub mod provider;
pub mod report;
mod scenarios;
pub mod time;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tokenwarden_core::{
    AgentId, Axis, Config, Coordinator, Input, LeaseId, LeaseRequest, Millis, PoolId, Rng, Role,
    Settlement, TaskFigures, TaskId, TaskOutcome, TaskSpec, Usage,
};
use tokenwarden_host_loop::{CallSpec, Ended, Host, Reply as HostReply, Sent, World};

use bodies::{Conversation, Preamble, Prompt, PromptCache, Reply, Vocab};
use bridge::EstimatorBridge;

pub use provider::Limits;
use provider::{Provider, Send};
pub use scenarios::{scenario, scenarios};

/// How the fleet handles the shared quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// (a) Each agent sends when ready and backs off on a 429 (full jitter, base 1 s, cap
    /// 30 s, 6 attempts).
    Backoff,
    /// (b) The official SDKs' defaults: 2 retries, 0.5–8 s with 75–100 % jitter,
    /// Retry-After honoured up to 60 s; then the turn fails.
    SdkDefaults,
    /// (c) A shared requests-per-minute counter in front of every call, token-blind.
    SharedRpm,
    /// (d) The coordinator, every agent weighted the same.
    CoordinatorEqual,
    /// (e) The coordinator with roles, unblocked-task bonus, loop decay and cache bump.
    Coordinator,
}

impl Strategy {
    /// All five, in report order.
    pub const ALL: [Strategy; 5] = [
        Strategy::Backoff,
        Strategy::SdkDefaults,
        Strategy::SharedRpm,
        Strategy::CoordinatorEqual,
        Strategy::Coordinator,
    ];

    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Strategy::Backoff => "(a) per-agent backoff",
            Strategy::SdkDefaults => "(b) SDK defaults",
            Strategy::SharedRpm => "(c) shared RPM counter",
            Strategy::CoordinatorEqual => "(d) coordinator, equal weights",
            Strategy::Coordinator => "(e) coordinator",
        }
    }

    /// Identifier for file names.
    pub fn id(self) -> &'static str {
        match self {
            Strategy::Backoff => "backoff",
            Strategy::SdkDefaults => "sdk",
            Strategy::SharedRpm => "shared-rpm",
            Strategy::CoordinatorEqual => "coord-equal",
            Strategy::Coordinator => "coordinator",
        }
    }

    /// Whether the strategy runs the coordinator.
    pub fn uses_coordinator(self) -> bool {
        matches!(self, Strategy::CoordinatorEqual | Strategy::Coordinator)
    }
}

/// The size of an agent's turns.
#[derive(Clone, Copy, Debug)]
pub struct TurnShape {
    /// Prompt tokens on a task's first turn.
    pub context_start: u64,
    /// Prompt growth per turn (tool output, edits).
    pub growth: u64,
    /// Prompt tokens each later turn sends fresh (files re-read, test output): the rest is
    /// the conversation's cached prefix.
    pub new_tokens: u64,
    /// Largest prompt.
    pub context_max: u64,
    /// `max_tokens` of each call.
    pub max_tokens: u64,
    /// Turns per task.
    pub turns: u32,
}

/// One agent of a scenario.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// Name in charts.
    pub name: String,
    /// Role (sets its weight under strategy (e)).
    pub role: Role,
    /// Its turns.
    pub shape: TurnShape,
    /// Tool time between calls (read, edit, test), ms; ±10 % jitter.
    pub tool_ms: u64,
    /// Draw tool time from an exponential distribution with this mean instead (Poisson arrivals).
    pub exponential_tool: bool,
    /// Agents whose task `k` must finish before this agent's task `k` starts.
    pub depends_on: Vec<usize>,
    /// Stuck on the same failing test: every turn fails the same way and a task takes
    /// three times the turns.
    pub looping: bool,
    /// Tenant, for fairness figures.
    pub tenant: usize,
    /// Tasks in the agent's backlog; `None` keeps it working until the run ends.
    pub tasks: Option<u32>,
    /// Each call draws its size instead of following `shape`: every fourth call sends
    /// 15–20k fresh tokens with `max_tokens` 2000, the others 1–2k with 500 (`mixed`).
    pub mixed_sizes: bool,
    /// The model its request bodies name (scenarios with [`Scenario::product_estimator`]).
    pub model: &'static str,
    /// A long pause now and then (the developer away, a long build): per turn, the chance
    /// in thousandths, and its length in ms (uniform between the two).
    pub pause: (u64, u64, u64),
}

/// A simulated situation.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Identifier.
    pub name: &'static str,
    /// One line on what it shows.
    pub description: &'static str,
    /// The key's real limits.
    pub limits: Limits,
    /// Virtual minutes to run (at most: a run whose agents all have finite backlogs ends
    /// when the last task is done).
    pub minutes: u64,
    /// The fleet.
    pub agents: Vec<AgentSpec>,
    /// Agents start within this many ms of the push.
    pub start_spread_ms: u64,
    /// Input tokens/min sent by something outside the fleet on the same key.
    pub outsider_input_per_min: u64,
    /// Input estimates are off by up to this many thousandths, either way.
    pub estimate_noise_permille: u64,
    /// Settle this long after the response ends.
    pub settle_delay_ms: u64,
    /// Actual output as thousandths of `max_tokens`: uniform in this range.
    pub output_permille: (u64, u64),
    /// The coordinator starts with no limits and learns them from headers.
    pub headers_only: bool,
    /// The coordinator's margin ceiling (thousandths).
    pub margin_ceiling: u32,
    /// Weights planner/reviewer/worker (thousandths) under strategy (e).
    pub weights: (u32, u32, u32),
    /// The strategies compared.
    pub strategies: Vec<Strategy>,
    /// The goal this scenario checks, for the report.
    pub goal: &'static str,
    /// The agents send generated Anthropic request bodies ([`bodies`]): the product's own
    /// estimator (the provider crate's, which every engine package runs; see [`bridge`])
    /// estimates each one for its lease and observes each settled call; the provider counts
    /// them exactly and keeps the prompt cache by content. `shape.context_start` is the
    /// task's first message (pasted files), `context_max` the history at which the agent
    /// compacts it, `max_tokens` and `turns` as elsewhere; a broken turn sends its call
    /// again 30 s later (no re-plan model).
    pub product_estimator: bool,
    /// `weights.small_lead_permille` under the coordinator strategies (the product's
    /// default; the `mixed` scenario's goal compares with 0).
    pub small_lead_permille: u32,
}

/// Per-minute usage at the provider.
#[derive(Clone, Copy, Debug, Default)]
pub struct Minute {
    /// Input tokens charged (uncached, including cold prefixes).
    pub input: u64,
    /// Output tokens produced.
    pub output: u64,
    /// Requests admitted.
    pub requests: u64,
    /// 429s.
    pub rate_limited: u64,
    /// Coordinator margin at the end of the minute (thousandths), if any.
    pub margin: Option<u32>,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Scenario name.
    pub scenario: &'static str,
    /// The seed it ran with.
    pub seed: u64,
    /// Strategy.
    pub strategy: Strategy,
    /// Calls sent to the provider (admitted or refused).
    pub sent: u64,
    /// 429s among them.
    pub rate_limited: u64,
    /// Turns broken by a rate limit (re-plans).
    pub broken_turns: u64,
    /// Tokens charged by the provider (uncached input + output), fleet only.
    pub fleet_tokens: u64,
    /// Every token the provider counted for the fleet: `fleet_tokens` and the cache reads
    /// (which Anthropic bills but does not count against the input limit).
    pub fleet_all_tokens: u64,
    /// Tasks finished (a looping agent's tasks end by giving up and are not counted).
    pub tasks_finished: u64,
    /// Tasks still running at the end (their age is in `task_times`).
    pub tasks_unfinished: u64,
    /// Task times, ms, sorted: finished tasks and, at their age, tasks still running.
    pub task_times: Vec<u64>,
    /// (agent, task time ms) of every finished task.
    pub tasks_by_agent: Vec<(usize, u64)>,
    /// Leases the coordinator granted from its queue (coordinator strategies).
    pub granted_from_queue: u64,
    /// Agent-ms blocked agents spent waiting on an upstream agent's model call.
    pub critical_path_wait_ms: u64,
    /// Per tenant: tokens charged.
    pub tenant_tokens: Vec<u64>,
    /// Per minute, up to the end of the run.
    pub minutes: Vec<Minute>,
    /// When the run ended (ms): the last task done, or the time limit.
    pub ended_at: u64,
    /// (time, agent) of each turn's first attempt.
    pub turn_starts: Vec<(u64, usize)>,
    /// Times of 429s.
    pub rate_limit_times: Vec<u64>,
    /// Lowest margin seen (coordinator strategies).
    pub min_margin: Option<u32>,
    /// The margin floor configured.
    pub margin_floor: u32,
    /// Most requests the provider saw in flight at once.
    pub max_in_flight: u64,
    /// The provider's limits.
    pub limits: Limits,
    /// Every call admitted by the provider: who, its size, and how long it waited.
    pub calls: Vec<CallRecord>,
    /// Per agent: tokens charged (uncached input + output).
    pub agent_tokens: Vec<u64>,
    /// Coordinator strategies: the product's own task figures (`metrics().tasks`, since
    /// start) at the end of the run, from the tasks the simulator opened, charged and ended
    /// through the core's task API.
    pub product: Option<TaskFigures>,
    /// Scenarios with the product's estimator: every settled call's estimate against its
    /// usage.
    pub estimates: Vec<EstimateSample>,
    /// Which estimator made them ([`bridge::EstimatorBridge::describe`]).
    pub estimator: Option<String>,
    /// The core's own estimate error per agent at the end of the run
    /// (`metrics().agents[].input_error_permille`, a moving average), thousandths.
    pub agent_input_error_permille: Vec<u32>,
}

/// One settled call of a scenario with the product's estimator.
#[derive(Clone, Copy, Debug)]
pub struct EstimateSample {
    /// The agent.
    pub agent: usize,
    /// The estimator's `inputTokens`.
    pub estimate_input: u64,
    /// The estimator's `cachedPrefixTokens`.
    pub estimate_cached: u64,
    /// Input tokens the core reserved for the call (the estimate as the core charged it:
    /// the cached prefix too when it took the agent's cache for cold), from its settlement.
    pub reserved_input: u64,
    /// Input tokens the call used by the core's counting (uncached input + cache writes),
    /// from its settlement.
    pub used_input: u64,
    /// Every prompt token the provider counted (input + cache writes + cache reads).
    pub prompt: u64,
    /// Cache reads among them.
    pub cache_read: u64,
}

impl EstimateSample {
    /// |reserved − used| / used on the input axis: the error the core measures.
    pub fn input_error(&self) -> f64 {
        self.reserved_input.abs_diff(self.used_input) as f64 / self.used_input.max(1) as f64
    }

    /// |estimate − actual| / actual over the whole prompt (the estimator's input + cached
    /// prefix against every prompt token counted).
    pub fn prompt_error(&self) -> f64 {
        (self.estimate_input + self.estimate_cached).abs_diff(self.prompt) as f64
            / self.prompt.max(1) as f64
    }
}

/// One call the provider admitted.
#[derive(Clone, Copy, Debug)]
pub struct CallRecord {
    /// The agent.
    pub agent: usize,
    /// Prompt tokens (fresh + cached prefix).
    pub input: u64,
    /// Its `max_tokens`.
    pub max_tokens: u64,
    /// From its first attempt to its admission, ms.
    pub waited_ms: u64,
}

impl RunResult {
    // Seed 003's four numbers (429 rate, tokens per finished task, task time, critical-path
    // wait). For the coordinator strategies they are the product's own figures
    // (`metrics().tasks`, from the tasks the simulator runs through the core's task API);
    // for the others, with no product in the loop, the simulator's bookkeeping (`own_*`).

    /// 429s per call: the product's 429 rate (429s per lease granted) under a coordinator
    /// strategy, else 429s per call sent.
    pub fn rate_limited_ratio(&self) -> f64 {
        match self.product.and_then(|p| p.rate_limited_permille) {
            Some(permille) => f64::from(permille) / 1000.0,
            None => self.own_rate_limited_ratio(),
        }
    }

    /// 429s per call sent, as the simulator counted them.
    pub fn own_rate_limited_ratio(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            self.rate_limited as f64 / self.sent as f64
        }
    }

    /// Tokens per finished task: every token the provider counted (cache reads included),
    /// the product's tokens per merged task (the tokens of every ended task, failed ones
    /// included, per merged one) under a coordinator strategy.
    pub fn tokens_per_task(&self) -> Option<f64> {
        match self.product {
            Some(p) => p.tokens_per_merged_task.map(|t| t as f64),
            None => self.own_tokens_per_task(),
        }
    }

    /// The part of [`RunResult::tokens_per_task`] that counts against the limits (uncached
    /// input, cache writes, output).
    pub fn limited_tokens_per_task(&self) -> Option<f64> {
        match self.product {
            Some(p) => p.rate_limited_tokens_per_merged_task.map(|t| t as f64),
            None => self.own_limited_tokens_per_task(),
        }
    }

    /// Every token the provider counted for the fleet per finished task, as the simulator
    /// counted.
    pub fn own_tokens_per_task(&self) -> Option<f64> {
        (self.tasks_finished > 0).then(|| self.fleet_all_tokens as f64 / self.tasks_finished as f64)
    }

    /// Tokens counted against the limits per finished task, as the simulator counted.
    pub fn own_limited_tokens_per_task(&self) -> Option<f64> {
        (self.tasks_finished > 0).then(|| self.fleet_tokens as f64 / self.tasks_finished as f64)
    }

    /// A percentile of task time, seconds: the product's p50 and p95 of merged tasks (within
    /// 12.5 %) under a coordinator strategy, else (and for other percentiles) the
    /// simulator's, which also counts unfinished tasks at their age.
    pub fn task_time_s(&self, permille: usize) -> Option<f64> {
        let product = self.product.and_then(|p| match permille {
            500 => Some(p.task_time_p50_ms),
            950 => Some(p.task_time_p95_ms),
            _ => None,
        });
        match product {
            Some(ms) => ms.map(|ms| ms as f64 / 1000.0),
            None => self.own_task_time_s(permille),
        }
    }

    /// A percentile of task time, seconds, as the simulator measured it.
    pub fn own_task_time_s(&self, permille: usize) -> Option<f64> {
        if self.task_times.is_empty() {
            return None;
        }
        let i =
            ((self.task_times.len() * permille).div_ceil(1000)).clamp(1, self.task_times.len()) - 1;
        Some(self.task_times[i] as f64 / 1000.0)
    }

    /// Critical-path wait, agent-ms: the product's (the time each task's model calls were
    /// outstanding, ask to settle, times the tasks blocked on it) under a coordinator
    /// strategy, else the simulator's (each call's first try to its answer, times the
    /// agents blocked on it then).
    pub fn critical_path_wait(&self) -> u64 {
        self.product
            .map_or(self.critical_path_wait_ms, |p| p.critical_path_wait_ms)
    }

    /// Share of each limit used over the run after the first `skip` minutes: (input,
    /// output, requests) as fractions of the real limit.
    pub fn shares(&self, skip: usize) -> (f64, f64, f64) {
        let m = &self.minutes[skip.min(self.minutes.len())..];
        let n = m.len().max(1) as f64;
        let sum = |f: fn(&Minute) -> u64| m.iter().map(f).sum::<u64>() as f64;
        (
            sum(|x| x.input) / (n * self.limits.input_tpm as f64),
            sum(|x| x.output) / (n * self.limits.output_tpm as f64),
            sum(|x| x.requests) / (n * self.limits.rpm as f64),
        )
    }

    /// The binding axis's share (the highest of the three).
    pub fn binding_share(&self, skip: usize) -> (&'static str, f64) {
        let (i, o, r) = self.shares(skip);
        if i >= o && i >= r {
            ("input tokens/min", i)
        } else if o >= r {
            ("output tokens/min", o)
        } else {
            ("requests/min", r)
        }
    }

    /// Jain's fairness index over tenants' tokens.
    pub fn jain(&self) -> f64 {
        let x: Vec<f64> = self.tenant_tokens.iter().map(|&t| t as f64).collect();
        let s: f64 = x.iter().sum();
        let s2: f64 = x.iter().map(|v| v * v).sum();
        if s2 == 0.0 {
            1.0
        } else {
            s * s / (x.len() as f64 * s2)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// An agent's tool time is over: it makes its next call.
    Ready(usize),
    /// A backoff delay is over: try the call again (no coordinator).
    Retry(usize),
    /// The provider finished the call of this agent (attempt tag; no coordinator).
    Complete(usize, u64),
    /// The shared RPM counter may have a slot.
    RpmWake,
    /// Traffic from outside the fleet.
    Outsider,
    /// End of a minute: sample.
    Minute,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Tool,
    Blocked,
    Waiting,
    InFlight,
    /// Its backlog is done.
    Done,
}

#[derive(Clone, Copy, Debug)]
struct Call {
    new_tokens: u64,
    prefix: u64,
    max_tokens: u64,
    output: u64,
    estimate_new: u64,
    /// The cached prefix the lease names (the prefix itself, or the product estimator's).
    estimate_prefix: u64,
    /// The product estimator saw that prefix cached (`cachedPrefixConfirmed`).
    estimate_confirmed: bool,
    replan: bool,
    /// The call's id at the estimator bridge, and whether its body was sent.
    body_call: Option<(u64, bool)>,
}

#[derive(Clone, Debug)]
struct Agent {
    state: State,
    task: u32,
    turn: u32,
    context: u64,
    task_start: u64,
    tasks_done: u32,
    call: Option<Call>,
    tag: u64,
    attempts: u32,
    first_try: u64,
    calls_made: u64,
    /// The HTTP status of the agent's last answer.
    status: u16,
    wait_since: u64,
    /// While a call is outstanding: since when its critical-path wait was last counted
    /// (the agents blocked on this one changed then, or the call began).
    cp_since: Option<u64>,
    replan_left: u32,
    pending_usage: Option<Usage>,
    /// The sent call's estimate (input, cached prefix) and bridge id, for its settlement.
    pending_estimate: Option<(u64, u64, Option<u64>)>,
    in_task: bool,
}

/// What a scenario with the product's estimator adds to a run.
struct Bodies {
    vocab: Vocab,
    preamble: Preamble,
    cache: PromptCache,
    bridge: EstimatorBridge,
    convs: Vec<Option<Conversation>>,
    /// The call being made: its request and the reply it will get.
    pending: Vec<Option<(Prompt, Reply)>>,
    next_call: u64,
}

struct Sim<'a> {
    sc: &'a Scenario,
    strategy: Strategy,
    rng: Rng,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    provider: Provider,
    coord: Option<Coordinator>,
    /// What the host loop is to tell the core and to start (coordinator strategies).
    inputs: Vec<Input>,
    starts: Vec<(u64, CallSpec)>,
    /// The host loop's calls, to the agent making each.
    host_calls: std::collections::BTreeMap<u64, usize>,
    agents: Vec<Agent>,
    rpm_level: i128,
    rpm_updated: u64,
    rpm_queue: std::collections::VecDeque<usize>,
    rpm_wake: bool,
    bodies: Option<Bodies>,
    r: RunResult,
}

const HARNESS_PATIENCE_MS: u64 = 60_000;

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, strategy: Strategy, seed: u64) -> Sim<'a> {
        let n = sc.agents.len();
        let bodies = if sc.product_estimator {
            let vocab = Vocab::new();
            let preamble = Preamble::new(&vocab);
            Some(Bodies {
                vocab,
                preamble,
                cache: PromptCache::default(),
                bridge: EstimatorBridge::new(),
                convs: vec![None; n],
                pending: vec![None; n],
                next_call: 0,
            })
        } else {
            None
        };
        let estimator = bodies.as_ref().map(|b| b.bridge.describe.clone());
        let coord = strategy.uses_coordinator().then(|| {
            Coordinator::new(coordinator_config(sc, strategy), seed, Millis(0))
                .expect("scenario config is valid")
        });
        let minutes = usize::try_from(sc.minutes).unwrap_or(0);
        let tenants = sc
            .agents
            .iter()
            .map(|a| a.tenant)
            .max()
            .map_or(0, |t| t + 1);
        Sim {
            sc,
            strategy,
            rng: Rng::new(seed ^ 0x5EED),
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            provider: Provider::new(sc.limits, n + 1, 1_795_946_400_000),
            coord,
            inputs: Vec::new(),
            starts: Vec::new(),
            host_calls: Default::default(),
            agents: (0..n)
                .map(|_| Agent {
                    state: State::Tool,
                    task: 0,
                    turn: 0,
                    context: 0,
                    task_start: 0,
                    tasks_done: 0,
                    call: None,
                    tag: 0,
                    attempts: 0,
                    first_try: 0,
                    calls_made: 0,
                    status: 0,
                    wait_since: 0,
                    cp_since: None,
                    replan_left: 0,
                    pending_usage: None,
                    pending_estimate: None,
                    in_task: false,
                })
                .collect(),
            rpm_level: i128::from(sc.limits.rpm * 850 / 1000) * 60_000,
            rpm_updated: 0,
            rpm_queue: Default::default(),
            rpm_wake: false,
            bodies,
            r: RunResult {
                scenario: sc.name,
                seed,
                strategy,
                sent: 0,
                rate_limited: 0,
                broken_turns: 0,
                fleet_tokens: 0,
                fleet_all_tokens: 0,
                tasks_finished: 0,
                tasks_unfinished: 0,
                task_times: Vec::new(),
                granted_from_queue: 0,
                tasks_by_agent: Vec::new(),
                critical_path_wait_ms: 0,
                tenant_tokens: vec![0; tenants],
                minutes: vec![Minute::default(); minutes],
                ended_at: 0,
                turn_starts: Vec::new(),
                rate_limit_times: Vec::new(),
                min_margin: None,
                margin_floor: 600,
                max_in_flight: 0,
                limits: sc.limits,
                calls: Vec::new(),
                agent_tokens: vec![0; n],
                product: None,
                estimates: Vec::new(),
                estimator,
                agent_input_error_permille: Vec::new(),
            },
        }
    }

    fn at(&mut self, t: u64, ev: Ev) {
        if let (Ev::Ready(i), true) = (ev, self.strategy.uses_coordinator()) {
            // The host loop starts the call at `t` and asks the world for it then.
            self.starts.push((
                t,
                CallSpec {
                    request: LeaseRequest::default(),
                    tag: i as u64,
                },
            ));
            return;
        }
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// The agent making the host loop's call `id`.
    fn host_agent(&self, id: u64) -> Option<usize> {
        self.host_calls.get(&id).copied()
    }

    /// An input for the core (coordinator strategies; without one, nothing is told).
    fn tell(&mut self, input: Input) {
        if self.strategy.uses_coordinator() {
            self.inputs.push(input);
        }
    }

    fn uniform(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.rng.below_or_eq(hi.saturating_sub(lo))
    }

    /// Exponential with the given mean, from integer draws (inverse transform on a fine grid).
    fn exponential(&mut self, mean: u64) -> u64 {
        let u = (self.rng.below_or_eq(1_000_000 - 1) + 1) as f64 / 1_000_000.0;
        (-u.ln() * mean as f64) as u64
    }

    fn minute_mut(&mut self) -> Option<&mut Minute> {
        let i = usize::try_from(self.now / 60_000).ok()?;
        self.r.minutes.get_mut(i)
    }

    fn run(mut self) -> RunResult {
        let end = self.sc.minutes * 60_000;
        for i in 0..self.agents.len() {
            let t = self.uniform(0, self.sc.start_spread_ms);
            self.at(t, Ev::Ready(i));
        }
        if self.sc.outsider_input_per_min > 0 {
            self.at(0, Ev::Outsider);
        }
        for m in 1..=self.sc.minutes {
            self.at(m * 60_000 - 1, Ev::Minute);
        }
        let finite = self.sc.agents.iter().all(|a| a.tasks.is_some());
        if let Some(coord) = self.coord.take() {
            // The coordinator strategies: the reference host loop drives the core, the
            // simulator is its world.
            let first = std::mem::take(&mut self.starts);
            let epoch = self.provider.epoch_unix_ms;
            let mut host = Host::new(coord, first).with_wall_clock(epoch);
            host.run(&mut self, end.saturating_sub(1));
            let ended_at = if finite && self.all_done() {
                host.now
            } else {
                end
            };
            return self.finish(ended_at, Some(&host.coord));
        }
        let mut ended_at = end;
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            if t >= end {
                break;
            }
            if finite && self.all_done() {
                ended_at = self.now;
                break;
            }
            self.now = t;
            match ev {
                Ev::Ready(i) => self.begin_call(i),
                Ev::Retry(i) => self.attempt(i),
                Ev::Complete(i, tag) => self.complete(i, tag),
                Ev::RpmWake => {
                    self.rpm_wake = false;
                    self.release_rpm();
                }
                Ev::Outsider | Ev::Minute => self.clock_event(ev, None),
            }
        }
        self.finish(ended_at, None)
    }

    /// Traffic from outside the fleet, or the end of a minute (its sample of the margin).
    fn clock_event(&mut self, ev: Ev, coord: Option<&Coordinator>) {
        match ev {
            Ev::Outsider => self.outsider(),
            Ev::Minute => {
                let margin = coord.map(|c| c.metrics(Millis(self.now)).pools[0].margin_permille);
                if let Some(m) = margin {
                    self.r.min_margin = Some(self.r.min_margin.map_or(m, |x| x.min(m)));
                }
                if let Some(min) = self.minute_mut() {
                    min.margin = margin;
                }
            }
            _ => debug_assert!(false, "{ev:?} is not a clock event"),
        }
    }

    /// The run's figures, ended at `ended_at` (the coordinator's own, when there is one).
    fn finish(mut self, ended_at: u64, coord: Option<&Coordinator>) -> RunResult {
        let end = self.sc.minutes * 60_000;
        // Tasks not finished at the end (running, or not started for lack of time) count
        // with their age so far, so a strategy that stalls long tasks is not flattered by
        // finishing only short ones.
        for (i, a) in self.agents.iter().enumerate() {
            let spec = &self.sc.agents[i];
            if spec.looping {
                continue;
            }
            if a.in_task {
                self.r.task_times.push(ended_at - a.task_start);
                self.r.tasks_unfinished += 1;
            }
            if let Some(n) = spec.tasks {
                let left = n.saturating_sub(a.tasks_done + u32::from(a.in_task));
                for _ in 0..left {
                    self.r.task_times.push(ended_at);
                    self.r.tasks_unfinished += 1;
                }
            }
        }
        self.r.ended_at = ended_at;
        let used_minutes = usize::try_from(ended_at.div_ceil(60_000)).unwrap_or(0);
        self.r.minutes.truncate(used_minutes.max(1));
        self.r.task_times.sort_unstable();
        self.r.max_in_flight = self.provider.max_in_flight_seen;
        if let Some(c) = coord {
            let m = c.metrics(Millis(end.max(c.now().0)));
            self.r.granted_from_queue = m.pools[0].counters.granted_from_queue;
            self.r.product = Some(c.metrics(Millis(ended_at.max(c.now().0))).tasks.since_start);
            self.r.margin_floor = c.config().margin.floor_permille;
            if self.bodies.is_some() {
                self.r.agent_input_error_permille = c
                    .metrics(Millis(ended_at.max(c.now().0)))
                    .agents
                    .iter()
                    .filter(|a| a.settled > 0)
                    .map(|a| a.input_error_permille)
                    .collect();
            }
            c.check().expect("coordinator state stays consistent");
        }
        self.r
    }

    fn all_done(&self) -> bool {
        self.agents
            .iter()
            .zip(&self.sc.agents)
            .all(|(a, s)| s.tasks.is_some_and(|n| a.tasks_done >= n))
    }

    fn blocked_on(&self, i: usize) -> u64 {
        let task = self.agents[i].task;
        self.sc
            .agents
            .iter()
            .enumerate()
            .filter(|(j, s)| {
                s.depends_on.contains(&i)
                    && self.agents[*j].state == State::Blocked
                    && self.agents[*j].task == task
            })
            .count() as u64
    }

    /// Adds the time since agent `i`'s call last counted, times the agents blocked on it,
    /// to the critical-path wait (seed 003: blocked agents waiting on an upstream agent's
    /// model call, from its first try to its answer); `ended` when the call is over.
    fn count_critical_path(&mut self, i: usize, ended: bool) {
        let now = self.now;
        if let Some(since) = self.agents[i].cp_since {
            self.r.critical_path_wait_ms += (now - since) * self.blocked_on(i);
            self.agents[i].cp_since = (!ended).then_some(now);
        }
    }

    fn deps_done(&self, i: usize) -> bool {
        let task = self.agents[i].task;
        self.sc.agents[i]
            .depends_on
            .iter()
            .all(|&d| self.agents[d].tasks_done > task)
    }

    /// The agent is ready for its next call (or its next task).
    fn begin_call(&mut self, i: usize) {
        if self.agents[i].state == State::Done {
            return;
        }
        if !self.agents[i].in_task {
            if !self.deps_done(i) {
                // The upstream agents' calls out now have held one agent fewer up until now.
                for d in self.sc.agents[i].depends_on.clone() {
                    self.count_critical_path(d, false);
                }
                self.agents[i].state = State::Blocked;
                // The upstream tasks now hold one more agent up: the coordinator hears it
                // as they run (their critical-path wait and weight follow).
                for d in self.sc.agents[i].depends_on.clone() {
                    if self.agents[d].in_task {
                        self.task_update(d);
                    }
                }
                return;
            }
            self.agents[i].in_task = true;
            self.agents[i].task_start = self.now;
            self.agents[i].context = self.sc.agents[i].shape.context_start;
            self.task_update(i);
        }
        if self.bodies.is_some() {
            self.begin_body_call(i);
            return;
        }
        let spec = &self.sc.agents[i];
        let a = &self.agents[i];
        let replan = a.replan_left > 0;
        // A task's first turn and a re-plan rebuild the context from scratch: nothing cached.
        let (new_tokens, prefix) = if replan || a.turn == 0 {
            (a.context, 0)
        } else {
            let new = spec.shape.new_tokens.max(1).min(a.context);
            (new, a.context - new)
        };
        let mut max_tokens = spec.shape.max_tokens;
        let (new_tokens, prefix) = if spec.mixed_sizes {
            // Every fourth call is big, so each agent asks for the same mix: what differs
            // between agents is what the scheduler did, not the luck of the draw.
            let big = (self.agents[i].calls_made + i as u64) % 4 == 0;
            self.agents[i].calls_made += 1;
            let (lo, hi, max) = if big {
                (15_000, 20_000, 2_000)
            } else {
                (1_000, 2_000, 500)
            };
            max_tokens = max;
            (self.uniform(lo, hi), 0)
        } else {
            (new_tokens, prefix)
        };
        let (lo, hi) = self.sc.output_permille;
        let output = max_tokens * self.uniform(lo, hi) / 1000;
        let noise = self.sc.estimate_noise_permille;
        let estimate_new = if noise == 0 {
            new_tokens
        } else {
            let f = self.uniform(1000 - noise, 1000 + noise);
            new_tokens * f / 1000
        };
        self.agents[i].call = Some(Call {
            new_tokens,
            prefix,
            max_tokens,
            output,
            estimate_new,
            estimate_prefix: prefix,
            estimate_confirmed: false,
            replan,
            body_call: None,
        });
        // A looping agent's later turns fail the same way as the one before: its task reports
        // it once a turn (same signature), which under (e) halves its weight down to the
        // floor (under (d) the decay is off).
        let looping = self.sc.agents[i].looping && self.agents[i].turn > 0 && !replan;
        if looping {
            let task = self.task_id(i);
            self.tell(Input::TaskFailed {
                task,
                signature: 0xF00D ^ i as u64,
                member: None,
            });
        }
        self.r.turn_starts.push((self.now, i));
        self.start_attempts(i);
    }

    /// The next call of an agent of a scenario with the product's estimator: the request
    /// body its conversation makes (a new conversation on a task's first turn, compacted
    /// past `context_max`), and the reply it will get.
    fn begin_body_call(&mut self, i: usize) {
        let spec = &self.sc.agents[i];
        let (model, shape) = (spec.model, spec.shape);
        let context = if shape.context_start == 0 {
            0
        } else {
            self.uniform(shape.context_start / 2, shape.context_start * 3 / 2)
        };
        let task = self.agents[i].task;
        let Some(b) = self.bodies.as_mut() else {
            return;
        };
        let rng = &mut self.rng;
        let conv =
            b.convs[i].get_or_insert_with(|| Conversation::new(&b.vocab, rng, i, task, context));
        if conv.tokens > shape.context_max {
            conv.compact(&b.vocab, rng);
        }
        let reply = conv.reply(&b.vocab, rng);
        let prompt = conv.prompt(&b.preamble, model, shape.max_tokens);
        b.next_call += 1;
        self.agents[i].call = Some(Call {
            new_tokens: prompt.total,
            prefix: 0,
            max_tokens: shape.max_tokens,
            output: reply.output,
            estimate_new: 0,
            estimate_prefix: 0,
            estimate_confirmed: false,
            replan: false,
            body_call: Some((b.next_call, false)),
        });
        b.pending[i] = Some((prompt, reply));
        self.r.turn_starts.push((self.now, i));
        self.start_attempts(i);
    }

    fn start_attempts(&mut self, i: usize) {
        let a = &mut self.agents[i];
        a.attempts = 0;
        a.first_try = self.now;
        a.state = State::Waiting;
        a.wait_since = self.now;
        a.cp_since = Some(self.now);
        self.attempt(i);
    }

    /// One attempt at the agent's call, through the strategy's admission. Under a
    /// coordinator the host loop asks for the call next ([`World::request`]).
    fn attempt(&mut self, i: usize) {
        match self.strategy {
            Strategy::Backoff | Strategy::SdkDefaults => self.send_direct(i),
            Strategy::SharedRpm => {
                self.rpm_queue.push_back(i);
                self.release_rpm();
            }
            Strategy::CoordinatorEqual | Strategy::Coordinator => {}
        }
    }

    /// The id of agent `i`'s current task in the core's task table.
    fn task_id(&self, i: usize) -> TaskId {
        TaskId(i as u64 * 1_000_000 + u64::from(self.agents[i].task))
    }

    /// Opens agent `i`'s task in the coordinator, or updates what it unblocks: its role and
    /// the agents blocked on it now (the DAG's live out-degree). Under (d) the
    /// configuration weighs them all the same.
    fn task_update(&mut self, i: usize) {
        let spec = TaskSpec {
            task: self.task_id(i),
            role: self.sc.agents[i].role,
            unblocks: u32::try_from(self.blocked_on(i)).unwrap_or(u32::MAX),
        };
        self.tell(Input::OpenTask {
            task: spec,
            member: None,
        });
    }

    /// Ends agent `i`'s current task in the coordinator.
    fn task_end(&mut self, i: usize, outcome: TaskOutcome) {
        let task = self.task_id(i);
        self.tell(Input::EndTask {
            task,
            outcome,
            member: None,
        });
    }

    /// The lease request of an ask of the agent's call: the product's estimate of its body
    /// (when the scenario has one) and its task brought up to date first.
    fn lease_request(&mut self, i: usize) -> Option<LeaseRequest> {
        let mut call = self.agents[i].call?;
        // The product's estimator estimates the body on every ask, as the `fetch` wrapper
        // does (the same body object each time: it is sent once).
        if let (Some(b), Some((id, sent))) = (self.bodies.as_mut(), call.body_call) {
            let body = match (&b.pending[i], sent) {
                (Some((p, _)), false) => Some(p.body.as_str()),
                _ => None,
            };
            let e = b.bridge.estimate(id, self.now, body);
            assert_eq!(
                e.max_tokens, call.max_tokens,
                "the driver reads the body's max_tokens"
            );
            call.estimate_new = e.input_tokens;
            call.estimate_prefix = e.cached_prefix_tokens;
            call.estimate_confirmed = e.cached_prefix_confirmed;
            call.body_call = Some((id, true));
            self.agents[i].call = Some(call);
        }
        self.task_update(i);
        Some(LeaseRequest {
            agent: AgentId(i as u64),
            pool: PoolId(0),
            input_tokens: call.estimate_new,
            cached_prefix_tokens: call.estimate_prefix,
            cached_prefix_confirmed: call.estimate_confirmed,
            max_tokens: call.max_tokens,
            task: Some(self.task_id(i)),
            ..LeaseRequest::default()
        })
    }

    fn release_rpm(&mut self) {
        let cap = i128::from(self.sc.limits.rpm * 850 / 1000);
        let full = cap * 60_000;
        self.rpm_level = (self.rpm_level + i128::from(self.now - self.rpm_updated) * cap).min(full);
        self.rpm_updated = self.now;
        while !self.rpm_queue.is_empty() && self.rpm_level >= 60_000 {
            self.rpm_level -= 60_000;
            if let Some(i) = self.rpm_queue.pop_front() {
                self.send_direct(i);
            }
        }
        if !self.rpm_queue.is_empty() && !self.rpm_wake {
            let need = 60_000 - self.rpm_level;
            let ms = u64::try_from((need + cap - 1) / cap.max(1))
                .unwrap_or(1)
                .max(1);
            self.rpm_wake = true;
            self.at(self.now + ms, Ev::RpmWake);
        }
    }

    /// Sends the agent's call to the provider now: what it admitted (the call's latency and
    /// the usage it will report) or its refusal, with the simulator's bookkeeping of both.
    fn admit(&mut self, i: usize) -> Option<Result<(u64, Usage), provider::Refused>> {
        let call = self.agents[i].call?;
        self.r.sent += 1;
        self.agents[i].attempts += 1;
        let now = self.now;
        // A generated body: the provider counts it by its prompt cache.
        let split = self
            .bodies
            .as_ref()
            .and_then(|b| b.pending[i].as_ref().map(|(p, _)| b.cache.split(now, p)));
        let send = match split {
            Some(s) => Send {
                caller: i,
                new_tokens: s.write + s.uncached,
                prefix_tokens: 0,
            },
            None => Send {
                caller: i,
                new_tokens: call.new_tokens,
                prefix_tokens: call.prefix,
            },
        };
        match self.provider.send(now, &send) {
            Ok(adm) => {
                if let (Some(b), Some(s)) = (self.bodies.as_mut(), split) {
                    if let Some((p, _)) = &b.pending[i] {
                        b.cache.commit(now, p, &s);
                    }
                }
                let waited = now - self.agents[i].wait_since;
                self.agents[i].state = State::InFlight;
                let latency = 1_500 + call.output * 1000 / 60 + send.new_tokens / 50;
                let usage = match split {
                    Some(s) => Usage {
                        input_tokens: s.uncached,
                        cache_creation_input_tokens: s.write,
                        cache_read_input_tokens: s.read,
                        output_tokens: call.output,
                    },
                    None => Usage {
                        input_tokens: call.new_tokens,
                        cache_creation_input_tokens: adm.cache_creation,
                        cache_read_input_tokens: adm.cache_read,
                        output_tokens: call.output,
                    },
                };
                self.agents[i].pending_usage = Some(usage);
                self.agents[i].pending_estimate = Some((
                    call.estimate_new,
                    call.estimate_prefix,
                    call.body_call.map(|(id, _)| id),
                ));
                let charged = adm.input_tokens;
                self.r.calls.push(CallRecord {
                    agent: i,
                    input: call.new_tokens + call.prefix,
                    max_tokens: call.max_tokens,
                    waited_ms: waited,
                });
                self.r.agent_tokens[i] += charged;
                self.r.fleet_tokens += charged;
                self.r.fleet_all_tokens += charged + usage.cache_read_input_tokens;
                self.r.tenant_tokens[self.sc.agents[i].tenant] += charged;
                if let Some(m) = self.minute_mut() {
                    m.input += charged;
                    m.requests += 1;
                }
                Some(Ok((latency, usage)))
            }
            Err(refused) => {
                self.r.rate_limited += 1;
                self.r.rate_limit_times.push(now);
                if let Some(m) = self.minute_mut() {
                    m.rate_limited += 1;
                }
                Some(Err(refused))
            }
        }
    }

    /// Sends the agent's call with no coordinator: the provider's answer comes after the
    /// call's latency, and a 429 is the strategy's to retry.
    fn send_direct(&mut self, i: usize) {
        match self.admit(i) {
            Some(Ok((latency, _))) => {
                self.agents[i].tag += 1;
                let tag = self.agents[i].tag;
                self.at(self.now + latency, Ev::Complete(i, tag));
            }
            Some(Err(refused)) => self.backoff_or_break(i, refused.retry_after_s * 1000),
            None => {}
        }
    }

    /// Non-coordinator strategies: back off, or give up and break the turn.
    fn backoff_or_break(&mut self, i: usize, retry_after_ms: u64) {
        let attempts = self.agents[i].attempts;
        let delay = match self.strategy {
            Strategy::SdkDefaults => {
                if attempts > 2 {
                    None
                } else {
                    let base = (500u64 << (attempts - 1)).min(8_000);
                    let jittered = base * self.uniform(750, 1000) / 1000;
                    Some(if retry_after_ms <= 60_000 {
                        retry_after_ms.max(jittered)
                    } else {
                        jittered
                    })
                }
            }
            _ => {
                if attempts >= 6 {
                    None
                } else {
                    let ceiling = (1_000u64 << (attempts - 1)).min(30_000);
                    Some(self.uniform(0, ceiling))
                }
            }
        };
        match delay {
            Some(d) if self.now + d - self.agents[i].first_try <= HARNESS_PATIENCE_MS => {
                self.at(self.now + d, Ev::Retry(i))
            }
            _ => self.break_turn(i),
        }
    }

    /// The harness gives up on the turn: re-read, re-test and re-plan, spending 5–20× the
    /// failed call's tokens, then make the call again.
    fn break_turn(&mut self, i: usize) {
        self.r.broken_turns += 1;
        self.count_critical_path(i, true);
        if let Some(b) = self.bodies.as_mut() {
            // A generated body's call is made again (a new request of the same history)
            // after the harness's 30 s; the estimator never hears of this one.
            let call = self.agents[i].call.take();
            b.pending[i] = None;
            if let Some(Call {
                body_call: Some((id, true)),
                ..
            }) = call
            {
                b.bridge.forget(id);
            }
            self.agents[i].state = State::Tool;
            let t = self.now + 30_000;
            self.at(t, Ev::Ready(i));
            return;
        }
        let Some(call) = self.agents[i].call.take() else {
            return;
        };
        let failed = call.new_tokens + call.prefix;
        let mult = self.uniform(5, 20);
        let a = &mut self.agents[i];
        a.state = State::Tool;
        // The context is rebuilt from scratch (cold), and the re-plan calls add up to
        // mult × the failed call. Failing while re-planning does not start a second
        // re-plan: the failed re-plan call is made again after the re-read.
        if !call.replan {
            a.context = failed;
            a.replan_left = u32::try_from(mult).unwrap_or(20);
        }
        let t = self.now + 30_000;
        self.at(t, Ev::Ready(i));
    }

    /// The provider is done with the agent's call: its output is charged.
    fn provider_done(&mut self, i: usize) {
        let Some(call) = self.agents[i].call else {
            return;
        };
        let now = self.now;
        self.provider.complete(now, i, call.prefix, call.output);
        self.r.fleet_tokens += call.output;
        self.r.fleet_all_tokens += call.output;
        self.r.tenant_tokens[self.sc.agents[i].tenant] += call.output;
        self.r.agent_tokens[i] += call.output;
        if let Some(m) = self.minute_mut() {
            m.output += call.output;
        }
    }

    /// The answer of a call sent with no coordinator.
    fn complete(&mut self, i: usize, tag: u64) {
        if self.agents[i].tag != tag || self.agents[i].state != State::InFlight {
            return;
        }
        self.provider_done(i);
        self.finish_turn(i);
    }

    /// The host settled the agent's call: the product's estimator observes its usage, as
    /// the `fetch` wrapper has it do, and the estimate is recorded against the settlement.
    fn settled(&mut self, i: usize, s: &Settlement) {
        let Some(usage) = self.agents[i].pending_usage.take() else {
            return;
        };
        let estimate = self.agents[i].pending_estimate.take();
        let now = self.now;
        if let (Some(b), Some((_, _, Some(id)))) = (self.bodies.as_mut(), estimate) {
            b.bridge.observe(id, now, &usage);
        }
        if let (Some((input, cached, _)), true) = (estimate, self.bodies.is_some()) {
            self.r.estimates.push(EstimateSample {
                agent: i,
                estimate_input: input,
                estimate_cached: cached,
                reserved_input: s.reserved.get(Axis::InputTokens),
                used_input: s.used.get(Axis::InputTokens),
                prompt: usage.input_tokens
                    + usage.cache_creation_input_tokens
                    + usage.cache_read_input_tokens,
                cache_read: usage.cache_read_input_tokens,
            });
        }
    }

    fn finish_turn(&mut self, i: usize) {
        let spec = self.sc.agents[i].clone();
        let call = self.agents[i].call.take();
        let now = self.now;
        // The call is answered: whoever is blocked on us waited on it from its first try
        // (through every wait and retry) to now, its own latency included.
        self.count_critical_path(i, true);
        // The reply and its tool results join the conversation.
        if let Some(b) = self.bodies.as_mut() {
            if let (Some((_, reply)), Some(conv)) = (b.pending[i].take(), b.convs[i].as_mut()) {
                conv.append(reply);
            }
        }
        let a = &mut self.agents[i];
        a.state = State::Tool;
        if call.is_some_and(|c| c.replan) {
            a.replan_left = a.replan_left.saturating_sub(1);
            let t = now + 10_000;
            self.at(t, Ev::Ready(i));
            return;
        }
        a.turn += 1;
        a.context = (a.context + spec.shape.growth).min(spec.shape.context_max);
        let turns = if spec.looping {
            spec.shape.turns * 3
        } else {
            spec.shape.turns
        };
        if a.turn >= turns {
            a.turn = 0;
            a.in_task = false;
            a.tasks_done += 1;
            // A looping agent's task ends by giving up: its tokens are waste, not a
            // finished task.
            let outcome = if spec.looping {
                TaskOutcome::Failed
            } else {
                TaskOutcome::Merged
            };
            self.task_end(i, outcome);
            if let Some(b) = self.bodies.as_mut() {
                b.convs[i] = None;
            }
            let a = &mut self.agents[i];
            a.task += 1;
            if !spec.looping {
                self.r.tasks_finished += 1;
                self.r.task_times.push(now - a.task_start);
                self.r.tasks_by_agent.push((i, now - a.task_start));
            }
            // Unblock agents waiting on this task.
            for j in 0..self.agents.len() {
                if self.agents[j].state == State::Blocked && self.deps_done(j) {
                    self.agents[j].state = State::Tool;
                    self.at(now, Ev::Ready(j));
                }
            }
        }
        if spec.tasks.is_some_and(|n| self.agents[i].tasks_done >= n) {
            self.agents[i].state = State::Done;
            return;
        }
        let tool = if spec.exponential_tool {
            self.exponential(spec.tool_ms)
        } else {
            let jitter = spec.tool_ms / 10;
            self.uniform(spec.tool_ms - jitter, spec.tool_ms + jitter)
        };
        let (chance, lo, hi) = spec.pause;
        let tool = if chance > 0 && self.uniform(0, 999) < chance {
            self.uniform(lo, hi)
        } else {
            tool
        };
        self.at(now + tool, Ev::Ready(i));
    }

    /// A script outside the coordinator: a burst every 20 s, whatever the limits say.
    fn outsider(&mut self) {
        let per_call = self.sc.outsider_input_per_min / 3;
        let caller = self.agents.len();
        let now = self.now;
        if self
            .provider
            .send(
                now,
                &Send {
                    caller,
                    new_tokens: per_call,
                    prefix_tokens: 0,
                },
            )
            .is_ok()
        {
            self.provider.complete(now, caller, 0, 50);
            if let Some(m) = self.minute_mut() {
                m.input += per_call;
                m.output += 50;
            }
        }
        self.at(now + 20_000, Ev::Outsider);
    }
}

/// The world of the coordinator strategies: the host loop asks the simulator for each
/// call's request, sends through its provider, and tells it what became of each call.
impl World for Sim<'_> {
    fn request(&mut self, now: u64, id: u64, call: &CallSpec, first: bool) -> Option<LeaseRequest> {
        self.now = now;
        let i = usize::try_from(call.tag).ok()?;
        if first {
            self.host_calls.insert(id, i);
            // The agent's tool time is over: its next call (or task) begins, unless it is
            // blocked on another agent's task or its backlog is done.
            self.begin_call(i);
            if self.agents[i].state != State::Waiting {
                return None;
            }
        }
        self.lease_request(i)
    }

    fn send(&mut self, now: u64, _id: u64, call: &CallSpec, _lease: LeaseId) -> Sent {
        self.now = now;
        let i = call.tag as usize;
        let reply = match self.admit(i) {
            Some(Ok((latency, usage))) => HostReply {
                status: 200,
                headers: Vec::new(),
                duration_ms: latency,
                usage,
                settle_after_ms: self.sc.settle_delay_ms,
            },
            // Refused before any work: the 429 and its headers come back at once.
            refused => HostReply {
                status: 429,
                headers: refused
                    .and_then(Result::err)
                    .map(|r| r.headers)
                    .unwrap_or_default(),
                duration_ms: 0,
                usage: Usage::default(),
                settle_after_ms: 0,
            },
        };
        self.agents[i].status = reply.status;
        Sent::Reply(reply)
    }

    fn answered(&mut self, now: u64, id: u64, _lease: LeaseId, reply: Option<&mut HostReply>) {
        self.now = now;
        let Some(reply) = reply else { return };
        if reply.status != 200 {
            return;
        }
        let i = self.host_agent(id);
        if let Some(i) = i {
            self.provider_done(i);
        }
        // The rate-limit headers of a success are the provider's as it answers.
        reply.headers = self.provider.headers(now);
    }

    fn settled(&mut self, now: u64, id: u64, _lease: LeaseId, s: &Settlement) {
        self.now = now;
        if let Some(i) = self.host_agent(id) {
            self.settled(i, s);
        }
    }

    fn ended(&mut self, now: u64, _id: u64, call: &CallSpec, how: Ended) -> Vec<(u64, CallSpec)> {
        self.now = now;
        let i = call.tag as usize;
        match how {
            Ended::Delivered if self.agents[i].status == 200 => self.finish_turn(i),
            // A 429 handed over, or the lifecycle gave up: the harness breaks the turn.
            _ => self.break_turn(i),
        }
        Vec::new()
    }

    fn outbox(&mut self) -> (Vec<Input>, Vec<(u64, CallSpec)>) {
        (
            std::mem::take(&mut self.inputs),
            std::mem::take(&mut self.starts),
        )
    }

    fn next_tick(&self) -> Option<u64> {
        self.events.peek().map(|Reverse((t, _, _))| *t)
    }

    fn tick(&mut self, now: u64, coord: &Coordinator) {
        self.now = now;
        while let Some(Reverse((t, _, ev))) = self.events.peek().copied() {
            if t > now {
                break;
            }
            self.events.pop();
            self.clock_event(ev, Some(coord));
        }
    }

    fn done(&self) -> bool {
        self.sc.agents.iter().all(|a| a.tasks.is_some()) && self.all_done()
    }
}

/// The coordinator configuration a scenario runs with under a coordinator strategy: (e) with
/// the scenario's role weights and the default unblock bonus and failure decay; (d) with
/// every weight equal (roles 1:1:1, no unblock bonus, no failure decay), so both are told
/// the same tasks and the product measures both the same way.
pub fn coordinator_config(sc: &Scenario, strategy: Strategy) -> Config {
    let l = sc.limits;
    let known = |v: u64| {
        if sc.headers_only {
            "null".to_string()
        } else {
            v.to_string()
        }
    };
    let (planner, reviewer, worker) = if strategy == Strategy::Coordinator {
        sc.weights
    } else {
        (1000, 1000, 1000)
    };
    let (bonus, decay) = if strategy == Strategy::Coordinator {
        (500, 500)
    } else {
        (0, 1000)
    };
    let json = format!(
        r#"{{"pools":[{{"name":"key","input_tokens_per_minute":{},"output_tokens_per_minute":{},
            "requests_per_minute":{},"max_concurrent":{}}}],
            "margin":{{"ceiling_permille":{}}},
            "max_queue_wait_ms":120000,
            "weights":{{"planner":{planner},"reviewer":{reviewer},"worker":{worker},
                "unblock_bonus":{bonus},"repeat_failure_decay":{decay},
                "small_lead_permille":{}}}}}"#,
        known(l.input_tpm),
        known(l.output_tpm),
        known(l.rpm),
        known(l.concurrent),
        sc.margin_ceiling,
        sc.small_lead_permille,
    );
    Config::from_json(&json).expect("scenario config is valid")
}

/// Runs one scenario under one strategy.
pub fn run(sc: &Scenario, strategy: Strategy, seed: u64) -> RunResult {
    Sim::new(sc, strategy, seed).run()
}
