//! The configuration: one JSON shape shared by every runtime.
//!
//! Fractions are integers in thousandths (`850` = 85 %, weight `3000` = 3.0) so that every
//! runtime computes the same decisions. Every field except `pools` has a default.

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, FieldPath};

pub use crate::bucket::MAX_TOKENS;
pub use crate::time::MAX_DURATION_MS;

/// How a provider counts tokens against its limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Counting {
    /// Anthropic: cache reads do not count toward input tokens/min (a cold cache charges the
    /// whole cached prefix as input); output tokens/min counts actual output, reserved up front
    /// as `max_tokens` and corrected on settle.
    #[default]
    Anthropic,
    /// OpenAI: one tokens/min figure, pre-charged with `max(max_tokens, input estimate)` and
    /// corrected to input + output on settle; cached prompt tokens still count.
    Openai,
}

/// One provider limit group, e.g. one model on one key. A `null` limit is unknown: that
/// axis does not gate until a response header reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// A name for metrics and logs.
    pub name: String,
    /// How usage maps onto the axes.
    #[serde(default)]
    pub counting: Counting,
    /// Input tokens per window.
    #[serde(default)]
    pub input_tokens_per_minute: Option<u64>,
    /// Output tokens per window.
    #[serde(default)]
    pub output_tokens_per_minute: Option<u64>,
    /// Input plus output tokens per window (OpenAI's TPM).
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Requests per window.
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    /// Requests in flight at once; a streaming response holds its slot until settled.
    #[serde(default)]
    pub max_concurrent: Option<u64>,
}

impl PoolConfig {
    /// The configured limit of `axis`, if any.
    pub(crate) fn limit(&self, axis: crate::bucket::Axis) -> Option<u64> {
        use crate::bucket::Axis;
        match axis {
            Axis::InputTokens => self.input_tokens_per_minute,
            Axis::OutputTokens => self.output_tokens_per_minute,
            Axis::Tokens => self.tokens_per_minute,
            Axis::Requests => self.requests_per_minute,
        }
    }
}

/// The AIMD safety margin: the share of each real limit the coordinator hands out.
///
/// The margin is for what is uncertain: estimates of tokens, and use of the key outside
/// the coordinator. So it has two parts. The token axes (input, output, combined tokens)
/// start at `start_permille`. The axes counted exactly — requests and calls in flight: a
/// request is one request — keep none (1000) until there is evidence of use outside the
/// coordinator: the provider's remaining requests below the core's count by more than
/// `agree_tolerance_permille`, or a 429 on a lease granted within every limit that is not
/// about tokens. Each such piece of evidence cuts their margin by `decrease_permille` (down
/// to `floor_permille`); it recovers `increase_permille` a clean interval up to 1000.
///
/// On the axes the provider charges when a call arrives (input, requests; OpenAI's combined
/// tokens) its remaining figures set the level both ways: to the share of the figure the
/// estimates of the calls that spend it may take (`1000 −` the largest underestimate among
/// the pool's latest `confirm_samples` or more completed calls, at least the margin; the
/// margin before that many have settled), less what no call of the coordinator's claims
/// yet (a reservation granted within `feedback.arrival_ms` of the answer, which may not
/// have reached it, except the call answered), up to the limit itself. A provider's bucket
/// starts full and refills at the whole limit, so its figure is often above the core's
/// model: that burst is spent, never more than the figure allows. Answers are read in no
/// fixed order: each figure bounds the provider's remaining from above, grown at the
/// limit's refill since its call was granted, and no level is raised past the least such
/// bound. On an axis charged as calls produce (Anthropic's output) the figure does not hold
/// what the calls in flight will produce: the model's reservations do, and the figure only
/// lowers the level (to `remaining − (limit − capacity)`), as use by others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MarginConfig {
    /// Starting margin, thousandths (850 = 85 %).
    pub start_permille: u32,
    /// Cut on a 429 against a granted lease.
    pub decrease_permille: u32,
    /// Lowest margin.
    pub floor_permille: u32,
    /// Rise after each clean interval.
    pub increase_permille: u32,
    /// Highest margin the rises reach (default 970). Up to `start_permille` the margin
    /// recovers after a cut one step per clean interval; above it, it climbs
    /// (`confirm_step_permille` a clean interval) only on
    /// evidence that the reserve is idle: a clean interval with no 429 of any kind, the
    /// pool's completed calls not underestimated (`confirm_error_permille`), and the provider's
    /// own remaining-capacity headers agreeing with the model within the last interval
    /// (`agree_tolerance_permille`). A 429 cuts it as below the start; a disagreement takes
    /// it back to the start. Without remaining headers from the provider it stays at the
    /// start.
    ///
    /// Why 97 %: the start's 15 % is there for estimate error and traffic outside the
    /// coordinator. Once completed calls are estimated within 10 % at the median and the
    /// provider's counters agree with ours, what is left to absorb is a single call's
    /// error above the median until it settles (charged as debt at once) and the rounding
    /// of the provider's own figures: 3 points of the limit, against 15 points of idle
    /// quota at the start.
    pub ceiling_permille: u32,
    /// The step of a confirmed rise above `start_permille`, thousandths per clean interval
    /// (default 30: the start to the ceiling in four minutes). Larger than the recovery's
    /// `increase_permille`: each step above the start is backed by the provider's own
    /// figures, where a recovery after a cut is a guess.
    pub confirm_step_permille: u32,
    /// A rise above `start_permille` needs the median input underestimate of the pool's
    /// latest completed calls (up to 16) at or below this, thousandths (100 = 10 %). An
    /// estimate above what the provider counted is no underestimate: it erred on the safe
    /// side, was refunded, and holds the climb back no more than an exact one.
    pub confirm_error_permille: u32,
    /// ... over at least this many completed calls (1 to 16; default 8).
    pub confirm_samples: u32,
    /// The provider's remaining capacity may be below the model's by at most this share
    /// of the limit, thousandths (default 50: 5 %), and still agree with it. More is a
    /// disagreement: the bucket is lowered to the provider's figure (as always), and a
    /// margin above its start goes back to the start. Why 5 %: the provider charges a
    /// call's input when it arrives and the model corrects an under-estimate when the call
    /// settles, so calls in flight that were estimated a little low show as a shortfall of
    /// a few percent of a small key's limit (measured: 12 Claude-Code-like agents on an
    /// 18,500-a-minute key, estimates within 5 % at the median, showed a shortfall above
    /// 1 % twice in four minutes, with no 429); traffic outside the coordinator — what the
    /// reserve is for — shows as more, and a shortfall of any size still lowers the bucket.
    pub agree_tolerance_permille: u32,
    /// Length of a clean interval (no 429 on the pool).
    pub clean_interval_ms: u64,
    /// How close to the floor counts as "at the floor" for the outsider alert, thousandths
    /// (50: within 5 points).
    pub floor_alert_band_permille: u32,
    /// How long the margin must stay at the floor, without a rise (a rise means a clean
    /// interval passed with no 429), before [`Event::MarginAtFloor`] is raised: 429s that
    /// keep coming despite the leases mean something outside the coordinator is using the
    /// key. 0 turns the alert off.
    ///
    /// [`Event::MarginAtFloor`]: crate::Event::MarginAtFloor
    pub floor_alert_ms: u64,
}

impl Default for MarginConfig {
    fn default() -> Self {
        MarginConfig {
            start_permille: 850,
            decrease_permille: 50,
            floor_permille: 600,
            increase_permille: 10,
            ceiling_permille: 970,
            confirm_step_permille: 30,
            confirm_error_permille: 100,
            confirm_samples: 8,
            agree_tolerance_permille: 50,
            clean_interval_ms: 60_000,
            floor_alert_band_permille: 50,
            floor_alert_ms: 300_000,
        }
    }
}

/// Weighted-fair-queue weights, thousandths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WeightConfig {
    /// Base weight of a planner.
    pub planner: u32,
    /// Base weight of a reviewer.
    pub reviewer: u32,
    /// Base weight of a worker.
    pub worker: u32,
    /// Bonus per downstream task waiting on this one: weight × (1 + bonus × unblocks).
    pub unblock_bonus: u32,
    /// Most downstream tasks a request's `unblocks` counts for (default 32): a caller
    /// claiming a billion cannot take the whole queue.
    pub max_unblocks: u32,
    /// Factor per repeated identical failure: weight × decay^repeats.
    pub repeat_failure_decay: u32,
    /// Lowest weight after decay.
    pub floor: u32,
    /// Bonus for an agent whose warm prompt cache is about to expire: weight × (1 + bump).
    /// A request queued earlier gets it while it waits: when its agent's cache comes
    /// within `cache_bump_window_ms` (a wake-up of [`crate::Coordinator::poll_timeout`]),
    /// its virtual finish is recomputed from its virtual start with the bumped weight.
    pub cache_bump: u32,
    /// "About to expire": the cache expires within this many ms.
    pub cache_bump_window_ms: u64,
    /// Only caches at least this many tokens long earn the bump.
    pub cache_bump_min_tokens: u64,
    /// The most of an agent's *first* call's dominant share in a pool that its place in
    /// line accounts for, thousandths of a limit (default 50: 5 %). The agent pays for the
    /// whole share — its next call starts that much later in virtual time — but its first
    /// call is placed as if it were at most a quantum, so a leaf agent that joins with a
    /// big call starts within about a round of the others' calls instead of after
    /// everyone's share of its whole size (at weight 1 among dozens of agents, many
    /// minutes). Later calls are placed by their whole share, so small calls keep their
    /// short waits. Why 5 %: above a typical small call's share (a few thousand tokens, or
    /// the requests limit's share of one call), so ordinary first calls keep their order
    /// by weight, and low enough that a 20k-token call on a 120k key (17 %) is placed
    /// after a few rounds of small calls, not a dozen. 1000 places every call by its whole
    /// share.
    pub quantum_permille: u32,
    /// How far ahead of everything its agent was served a small call (one no bigger than
    /// the quantum) may start in the fair order, thousandths of a limit (default 50: one
    /// quantum). An agent's small calls are placed after its previous small call, but at
    /// most this far before its previous call of any size: a small call after a big one
    /// does not wait for the big one's whole share, and an agent is served at most this
    /// much beyond its share at any time. Why 50: in the simulator's `mixed` scenario
    /// (ten seeds) it cuts small calls' p95 wait per token by 46–85 % against 0 and costs
    /// big calls 5–31 %; 100 cut small calls a little more (66–89 %) for 24–45 % on big
    /// calls. 0 places every call after the agent's previous call, whatever its size.
    pub small_lead_permille: u32,
    /// How a family (an agent and the subagents it spawned: requests that name it as their
    /// `family`) is placed in the fair order. `shared` (the default): the family has one
    /// share, split among its members with calls in line — each member's weight is
    /// divided by how many of them have a call queued or in flight (hierarchical fair
    /// queueing), so a session that fans out into twenty subagents gets one session's
    /// share, not twenty. `flat`: every member is an agent of its own with its own share
    /// (the family only shows in the metrics).
    pub families: Families,
}

/// How a family shares the fair order (see [`WeightConfig::families`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Families {
    /// One share per family, split among its members with calls in line.
    #[default]
    Shared,
    /// One share per member.
    Flat,
}

impl Default for WeightConfig {
    fn default() -> Self {
        WeightConfig {
            planner: 3000,
            reviewer: 2000,
            worker: 1000,
            unblock_bonus: 500,
            max_unblocks: 32,
            repeat_failure_decay: 500,
            floor: 100,
            cache_bump: 500,
            cache_bump_window_ms: 60_000,
            cache_bump_min_tokens: 1024,
            quantum_permille: 50,
            small_lead_permille: 50,
            families: Families::Shared,
        }
    }
}

/// Optional slow start on the token axes: capacity ramps linearly from `start_permille` of
/// the margin-adjusted limit to all of it over `ramp_ms` after the coordinator starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowStartConfig {
    /// Share of capacity at start, thousandths.
    pub start_permille: u32,
    /// Time to reach full capacity.
    pub ramp_ms: u64,
}

/// The call lifecycle's waits after a failed send ([`Coordinator::call_response`](crate::Coordinator::call_response)):
/// full jitter, `retry-after` plus a small offset, and when to give up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackoffConfig {
    /// First delay ceiling; doubles per attempt (full jitter draws from 0 to it).
    pub base_ms: u64,
    /// Largest delay ceiling.
    pub cap_ms: u64,
    /// Attempts before giving up.
    pub max_attempts: u32,
    /// Random offset added to a provider's Retry-After, drawn from 0 to this.
    pub retry_after_jitter_ms: u64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base_ms: 1000,
            cap_ms: 30_000,
            max_attempts: 6,
            retry_after_jitter_ms: 1000,
        }
    }
}

/// When to raise an estimate-error alert for an agent: when the median absolute input
/// error of its last `samples` completed calls stays above `threshold_permille` for
/// `consecutive` completed calls in a row. Only calls that completed with the provider's
/// usage report are samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertConfig {
    /// A median input-estimate error above this, thousandths of the actual figure, is a
    /// miss (default 200: seed 003's 20 %).
    pub threshold_permille: u32,
    /// How many of the agent's latest completed calls the median is over (1 to 16,
    /// default 9). The alert needs that many samples.
    pub samples: u32,
    /// Alert after this many misses in a row (default 1: the median over nine calls
    /// already says the error stays high, not that one call missed).
    pub consecutive: u32,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig {
            threshold_permille: 200,
            samples: 9,
            consecutive: 1,
        }
    }
}

/// How much output a call reserves under Anthropic counting, where the provider counts
/// output tokens against its output limit as they are produced and `max_tokens` does not
/// factor in (Anthropic's rate-limit documentation): a learned high percentile of what the
/// same agent's calls in the pool really produced, never above the call's `max_tokens`
/// nor the output limit. Output beyond the reservation is charged as debt on settle. Under
/// OpenAI counting the provider pre-charges `max_tokens`, and so does the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutputReserveConfig {
    /// The percentile of recent settled output reserved, thousandths (default 950).
    pub percentile_permille: u32,
    /// How many recent completed calls per agent and pool the percentile is over (1 to 16,
    /// default 16). An agent with none yet is reserved the same percentile of the pool's
    /// latest calls, whoever made them.
    pub samples: u32,
    /// Reserved when the pool has no completed call yet, at most the call's `max_tokens`
    /// (default 4096).
    pub initial_tokens: u64,
}

impl Default for OutputReserveConfig {
    fn default() -> Self {
        OutputReserveConfig {
            percentile_permille: 950,
            samples: 16,
            initial_tokens: 4096,
        }
    }
}

/// How far provider feedback (response headers, 429s) may move a pool: bounds that keep a
/// wrong or hostile report from locking a quota (a reported limit of 1, a day-long pause).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeedbackConfig {
    /// A reported limit for an axis whose limit is configured is kept at or above this share
    /// of the configured limit, thousandths (default 250: a quarter).
    pub min_limit_permille: u32,
    /// … and at or below this multiple of it, thousandths (default 4000: four times).
    pub max_limit_permille: u32,
    /// The longest a 429 may pause the pool, ms (default one day, the longest any parsed
    /// header may ask for).
    pub max_pause_ms: u64,
    /// The longest a 429 reported by another process may pause the pool, ms (default one
    /// minute, a rate window): a member of a shared limiter reports the responses its own
    /// calls get (the `reported` input flag), and one member's report is evidence for the
    /// whole quota for at most this long. Never above `max_pause_ms`.
    pub max_reported_pause_ms: u64,
    /// How long a granted call may take to reach the provider, ms (default 1,000): an
    /// answer's remaining figures hold, on the axes the provider charges when a call
    /// arrives (input, requests; OpenAI's combined tokens), the calls granted at least this
    /// long before the answer was read; the reservations of those granted since are taken
    /// out of the figure before the level follows it (see [`MarginConfig`]). And a grant
    /// that takes from a full bucket whose capacity is (nearly) the whole limit — the
    /// requests axis, counted exactly — withholds this long of its refill, as the provider's
    /// bucket starts refilling only when the call arrives.
    pub arrival_ms: u64,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        FeedbackConfig {
            min_limit_permille: 250,
            max_limit_permille: 4000,
            max_pause_ms: crate::headers::MAX_WAIT_MS,
            max_reported_pause_ms: 60_000,
            arrival_ms: 1_000,
        }
    }
}

impl FeedbackConfig {
    /// A reported limit, kept within the bounds around `configured` (when there is one).
    pub(crate) fn bound_limit(&self, reported: u64, configured: Option<u64>) -> u64 {
        let Some(c) = configured else {
            return reported;
        };
        let lo = u128::from(c) * u128::from(self.min_limit_permille) / 1000;
        let hi = u128::from(c) * u128::from(self.max_limit_permille) / 1000;
        let bounded = u128::from(reported).clamp(lo.max(1), hi.max(1));
        u64::try_from(bounded).unwrap_or(MAX_TOKENS).min(MAX_TOKENS)
    }
}

/// The policy for one model call from first ask to final answer (see
/// [`Coordinator::call_lease`](crate::Coordinator::call_lease) and
/// [`Coordinator::call_response`](crate::Coordinator::call_response)). The number of failed
/// sends before giving up and the delays between them are [`BackoffConfig`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallConfig {
    /// Refusals with a retry time waited out before the call gives up (default 20). A
    /// refused request keeps its place in the fair order, so this bounds only calls that
    /// keep meeting a full queue or lease table.
    pub max_refusals: u32,
    /// A wait at least this long tells the agent to checkpoint its turn before waiting
    /// (default 30 s; for a queued call, its expected wait, not its bound). A wait at least
    /// as long as `prompt_cache_ttl_ms` does too: the prompt cache will be cold when it
    /// resumes.
    pub checkpoint_after_ms: u64,
    /// First delay ceiling after a parallel-request (concurrency) 429, which clears when
    /// other calls finish: it doubles per attempt, capped by the response's `retry-after`
    /// and `backoff.cap_ms` (default 1 s).
    pub concurrency_base_ms: u64,
}

impl Default for CallConfig {
    fn default() -> Self {
        CallConfig {
            max_refusals: 20,
            checkpoint_after_ms: 30_000,
            concurrency_base_ms: 1000,
        }
    }
}

/// The whole configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The limit groups; a lease names one by its index.
    pub pools: Vec<PoolConfig>,
    /// Length of the rate window the `*_per_minute` limits refer to.
    #[serde(default = "defaults::window_ms")]
    pub window_ms: u64,
    /// The AIMD margin.
    #[serde(default)]
    pub margin: MarginConfig,
    /// A granted lease not settled within this time is reaped, with no refund.
    #[serde(default = "defaults::lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    /// The longest a granted lease lives, renewals included: a renewal never moves its
    /// expiry past its grant plus this, so no caller holds a reservation or a concurrency
    /// slot longer by renewing (from `lease_ttl_ms` to 30 days). Unset, it is an hour or
    /// `lease_ttl_ms` if that is longer ([`Config::lease_life_ms`]): an hour is the longest
    /// call the Anthropic SDKs plan for (they expect a call of 128,000 output tokens to take
    /// up to an hour, and refuse to send one that long unstreamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lease_life_ms: Option<u64>,
    /// A request whose estimated wait exceeds this is rejected rather than queued.
    #[serde(default = "defaults::max_queue_wait_ms")]
    pub max_queue_wait_ms: u64,
    /// Most tickets queued per pool; beyond it requests are rejected.
    #[serde(default = "defaults::max_queue_depth")]
    pub max_queue_depth: u32,
    /// Most leases and tickets alive at once, all pools together.
    #[serde(default = "defaults::max_leases")]
    pub max_leases: u32,
    /// Most distinct agents tracked; the least recently seen idle agent is forgotten beyond it.
    #[serde(default = "defaults::max_agents")]
    pub max_agents: u32,
    /// Most tasks open at once (see [`Coordinator::open_task`](crate::Coordinator::open_task)).
    /// Requests naming tasks nobody opened fill at most three quarters of it.
    #[serde(default = "defaults::max_tasks")]
    pub max_tasks: u32,
    /// A task with no activity (opened, a lease asked for it, a failure) for this long is
    /// ended as abandoned when the task table needs room (default 1 hour, 1 ms to 30
    /// days). An hour outlasts the pauses of a live task (a long test run, a review, a
    /// queue wait of many minutes) while a table filled by callers naming junk tasks, or
    /// by hosts that never end theirs, frees itself within the hour.
    #[serde(default = "defaults::task_idle_ms")]
    pub task_idle_ms: u64,
    /// How long a provider keeps an agent's prompt cache warm after its last call.
    #[serde(default = "defaults::prompt_cache_ttl_ms")]
    pub prompt_cache_ttl_ms: u64,
    /// Queue weights.
    #[serde(default)]
    pub weights: WeightConfig,
    /// Optional slow start.
    #[serde(default)]
    pub slow_start: Option<SlowStartConfig>,
    /// Backoff policy.
    #[serde(default)]
    pub backoff: BackoffConfig,
    /// Estimate-error alerting.
    #[serde(default)]
    pub estimate_alert: AlertConfig,
    /// The output reservation under Anthropic counting.
    #[serde(default)]
    pub output_reserve: OutputReserveConfig,
    /// Bounds on what provider feedback may do to a pool.
    #[serde(default)]
    pub feedback: FeedbackConfig,
    /// The call lifecycle: refusals before giving up, when to checkpoint.
    #[serde(default)]
    pub call: CallConfig,
    /// Minutes of per-minute metrics kept per pool.
    #[serde(default = "defaults::metrics_minutes")]
    pub metrics_minutes: u32,
    /// The share of the key this coordinator holds: 1 (the default) for the whole key, `n`
    /// for one of `n` processes that split it (a remote driver's fallback while its limiter
    /// is unreachable). Every configured limit and `max_concurrent`, and every limit and
    /// remaining figure the provider reports for the key, count `1/n` here (rounded up, at
    /// least 1). From 1 to 4096.
    #[serde(default = "defaults::share", skip_serializing_if = "is_whole")]
    pub share: u32,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_whole(share: &u32) -> bool {
    *share == 1
}

mod defaults {
    pub(super) fn share() -> u32 {
        1
    }
    pub(super) fn window_ms() -> u64 {
        60_000
    }
    pub(super) fn lease_ttl_ms() -> u64 {
        120_000
    }
    pub(super) const MAX_LEASE_LIFE_MS: u64 = 3_600_000;
    pub(super) fn max_queue_wait_ms() -> u64 {
        60_000
    }
    pub(super) fn max_queue_depth() -> u32 {
        1024
    }
    pub(super) fn max_leases() -> u32 {
        4096
    }
    pub(super) fn max_agents() -> u32 {
        1024
    }
    pub(super) fn max_tasks() -> u32 {
        4096
    }
    pub(super) fn task_idle_ms() -> u64 {
        3_600_000
    }
    pub(super) fn prompt_cache_ttl_ms() -> u64 {
        300_000
    }
    pub(super) fn metrics_minutes() -> u32 {
        60
    }
}

impl Config {
    /// This coordinator's part of a figure for the whole key (see [`Config::share`]):
    /// `v / share` rounded up, at least 1 unless `v` is 0.
    #[must_use]
    pub fn part(&self, v: u64) -> u64 {
        match self.share {
            0 | 1 => v,
            n => v.div_ceil(u64::from(n)).max(u64::from(v > 0)),
        }
    }

    /// The longest a granted lease lives (see [`Config::max_lease_life_ms`]): as
    /// configured, else an hour or `lease_ttl_ms` if that is longer.
    #[must_use]
    pub fn lease_life_ms(&self) -> u64 {
        self.max_lease_life_ms
            .unwrap_or(defaults::MAX_LEASE_LIFE_MS.max(self.lease_ttl_ms))
    }

    /// A configuration with one pool and every other field at its default.
    #[must_use]
    pub fn single_pool(pool: PoolConfig) -> Config {
        Config {
            pools: alloc::vec![pool],
            window_ms: defaults::window_ms(),
            margin: MarginConfig::default(),
            lease_ttl_ms: defaults::lease_ttl_ms(),
            max_lease_life_ms: None,
            max_queue_wait_ms: defaults::max_queue_wait_ms(),
            max_queue_depth: defaults::max_queue_depth(),
            max_leases: defaults::max_leases(),
            max_agents: defaults::max_agents(),
            max_tasks: defaults::max_tasks(),
            task_idle_ms: defaults::task_idle_ms(),
            prompt_cache_ttl_ms: defaults::prompt_cache_ttl_ms(),
            weights: WeightConfig::default(),
            slow_start: None,
            backoff: BackoffConfig::default(),
            estimate_alert: AlertConfig::default(),
            output_reserve: OutputReserveConfig::default(),
            feedback: FeedbackConfig::default(),
            call: CallConfig::default(),
            metrics_minutes: defaults::metrics_minutes(),
            share: defaults::share(),
        }
    }

    /// Parses and validates the JSON shape.
    pub fn from_json(json: &str) -> Result<Config, ConfigError> {
        let config: Config = serde_json::from_str(json).map_err(ConfigError::Parse)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_pools()?;
        self.validate_timing()?;
        self.validate_weights_and_bounds()
    }

    fn validate_pools(&self) -> Result<(), ConfigError> {
        if self.pools.is_empty() {
            return Err(top("pools", "must hold at least one pool"));
        }
        if self.pools.len() > 1024 {
            return Err(top("pools", "must hold at most 1024 pools"));
        }
        for (i, p) in self.pools.iter().enumerate() {
            let bad = |name: &'static str, reason: &'static str| ConfigError::Invalid {
                field: FieldPath {
                    pool: Some(i),
                    name,
                },
                reason,
            };
            if p.name.is_empty() || p.name.len() > 256 {
                return Err(bad("name", "must be 1 to 256 bytes long"));
            }
            if self.pools.iter().take(i).any(|q| q.name == p.name) {
                return Err(bad("name", "must be unique"));
            }
            for (name, v) in [
                ("input_tokens_per_minute", p.input_tokens_per_minute),
                ("output_tokens_per_minute", p.output_tokens_per_minute),
                ("tokens_per_minute", p.tokens_per_minute),
                ("requests_per_minute", p.requests_per_minute),
                ("max_concurrent", p.max_concurrent),
            ] {
                match v {
                    Some(0) => return Err(bad(name, "must be at least 1 (use null for unknown)")),
                    Some(v) if v > MAX_TOKENS => return Err(bad(name, "must be at most 2^53 - 1")),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Durations, the margin and backoff.
    fn validate_timing(&self) -> Result<(), ConfigError> {
        duration("window_ms", self.window_ms, 1)?;
        duration("lease_ttl_ms", self.lease_ttl_ms, 1)?;
        if let Some(life) = self.max_lease_life_ms {
            duration("max_lease_life_ms", life, 1)?;
            if life < self.lease_ttl_ms {
                return Err(top("max_lease_life_ms", "must be at least lease_ttl_ms"));
            }
        }
        duration("max_queue_wait_ms", self.max_queue_wait_ms, 0)?;
        duration("prompt_cache_ttl_ms", self.prompt_cache_ttl_ms, 0)?;
        duration("task_idle_ms", self.task_idle_ms, 1)?;
        duration("margin.clean_interval_ms", self.margin.clean_interval_ms, 1)?;
        duration(
            "weights.cache_bump_window_ms",
            self.weights.cache_bump_window_ms,
            0,
        )?;
        duration("backoff.base_ms", self.backoff.base_ms, 1)?;
        duration("call.checkpoint_after_ms", self.call.checkpoint_after_ms, 0)?;
        duration("call.concurrency_base_ms", self.call.concurrency_base_ms, 1)?;
        duration("backoff.cap_ms", self.backoff.cap_ms, 1)?;
        duration(
            "backoff.retry_after_jitter_ms",
            self.backoff.retry_after_jitter_ms,
            0,
        )?;
        let m = &self.margin;
        permille("margin.start_permille", m.start_permille, 1)?;
        permille("margin.floor_permille", m.floor_permille, 1)?;
        permille("margin.ceiling_permille", m.ceiling_permille, 1)?;
        permille("margin.decrease_permille", m.decrease_permille, 0)?;
        permille("margin.increase_permille", m.increase_permille, 0)?;
        permille(
            "margin.agree_tolerance_permille",
            m.agree_tolerance_permille,
            0,
        )?;
        permille("margin.confirm_step_permille", m.confirm_step_permille, 0)?;
        if m.confirm_samples == 0 || m.confirm_samples as usize > crate::history::CAPACITY {
            return Err(top("margin.confirm_samples", "must be between 1 and 16"));
        }
        permille(
            "margin.floor_alert_band_permille",
            m.floor_alert_band_permille,
            0,
        )?;
        if m.floor_permille > m.ceiling_permille {
            return Err(top(
                "margin.floor_permille",
                "must not exceed margin.ceiling_permille",
            ));
        }
        if m.start_permille < m.floor_permille || m.start_permille > m.ceiling_permille {
            return Err(top(
                "margin.start_permille",
                "must lie between margin.floor_permille and margin.ceiling_permille",
            ));
        }
        if self.backoff.cap_ms < self.backoff.base_ms {
            return Err(top("backoff.cap_ms", "must be at least backoff.base_ms"));
        }
        if self.backoff.max_attempts == 0 || self.backoff.max_attempts > 64 {
            return Err(top("backoff.max_attempts", "must be between 1 and 64"));
        }
        Ok(())
    }

    /// Queue weights, slow start, the estimate alert and the table bounds.
    fn validate_weights_and_bounds(&self) -> Result<(), ConfigError> {
        if !(1..=4096).contains(&self.share) {
            return Err(top("share", "must be between 1 and 4096"));
        }
        let w = &self.weights;
        for (name, v) in [
            ("weights.planner", w.planner),
            ("weights.reviewer", w.reviewer),
            ("weights.worker", w.worker),
        ] {
            if v == 0 || v > 1_000_000 {
                return Err(top(name, "must be between 1 and 1000000 (thousandths)"));
            }
        }
        if w.floor == 0 || w.floor > 1_000_000 {
            return Err(top(
                "weights.floor",
                "must be between 1 and 1000000 (thousandths)",
            ));
        }
        if w.unblock_bonus > 1_000_000 {
            return Err(top(
                "weights.unblock_bonus",
                "must be at most 1000000 (thousandths)",
            ));
        }
        if w.cache_bump > 1_000_000 {
            return Err(top(
                "weights.cache_bump",
                "must be at most 1000000 (thousandths)",
            ));
        }
        permille("weights.repeat_failure_decay", w.repeat_failure_decay, 0)?;
        permille("weights.quantum_permille", w.quantum_permille, 0)?;
        permille("weights.small_lead_permille", w.small_lead_permille, 0)?;
        if w.cache_bump_min_tokens > MAX_TOKENS {
            return Err(top(
                "weights.cache_bump_min_tokens",
                "must be at most 2^53 - 1",
            ));
        }
        if let Some(s) = &self.slow_start {
            permille("slow_start.start_permille", s.start_permille, 1)?;
            duration("slow_start.ramp_ms", s.ramp_ms, 1)?;
        }
        permille(
            "estimate_alert.threshold_permille",
            self.estimate_alert.threshold_permille,
            0,
        )?;
        if self.estimate_alert.consecutive == 0 || self.estimate_alert.consecutive > 1_000_000 {
            return Err(top(
                "estimate_alert.consecutive",
                "must be between 1 and 1000000",
            ));
        }
        let history = u32::try_from(crate::history::CAPACITY).unwrap_or(u32::MAX);
        if self.estimate_alert.samples == 0 || self.estimate_alert.samples > history {
            return Err(top("estimate_alert.samples", "must be between 1 and 16"));
        }
        let o = &self.output_reserve;
        permille(
            "output_reserve.percentile_permille",
            o.percentile_permille,
            1,
        )?;
        if o.samples == 0 || o.samples > history {
            return Err(top("output_reserve.samples", "must be between 1 and 16"));
        }
        if o.initial_tokens == 0 || o.initial_tokens > MAX_TOKENS {
            return Err(top(
                "output_reserve.initial_tokens",
                "must be between 1 and 2^53 - 1",
            ));
        }
        let f = &self.feedback;
        if f.min_limit_permille == 0 || f.min_limit_permille > 1000 {
            return Err(top(
                "feedback.min_limit_permille",
                "must be between 1 and 1000 (thousandths)",
            ));
        }
        if f.max_limit_permille < 1000 || f.max_limit_permille > 1_000_000 {
            return Err(top(
                "feedback.max_limit_permille",
                "must be between 1000 and 1000000 (thousandths)",
            ));
        }
        duration("feedback.max_pause_ms", f.max_pause_ms, 1)?;
        duration("feedback.max_reported_pause_ms", f.max_reported_pause_ms, 1)?;
        duration("feedback.arrival_ms", f.arrival_ms, 0)?;
        if self.max_queue_depth == 0 || self.max_queue_depth > 1_000_000 {
            return Err(top("max_queue_depth", "must be between 1 and 1000000"));
        }
        if self.max_leases == 0 || self.max_leases > 1_000_000 {
            return Err(top("max_leases", "must be between 1 and 1000000"));
        }
        if self.max_agents == 0 || self.max_agents > 1_000_000 {
            return Err(top("max_agents", "must be between 1 and 1000000"));
        }
        if self.max_tasks == 0 || self.max_tasks > 1_000_000 {
            return Err(top("max_tasks", "must be between 1 and 1000000"));
        }
        if self.metrics_minutes == 0 || self.metrics_minutes > 1440 {
            return Err(top("metrics_minutes", "must be between 1 and 1440"));
        }
        Ok(())
    }
}

/// An error for a top-level field.
fn top(name: &'static str, reason: &'static str) -> ConfigError {
    ConfigError::Invalid {
        field: FieldPath { pool: None, name },
        reason,
    }
}

/// A duration between `min` ms and 30 days.
fn duration(name: &'static str, v: u64, min: u64) -> Result<(), ConfigError> {
    if v < min || v > MAX_DURATION_MS {
        Err(top(
            name,
            if min == 0 {
                "must be at most 30 days"
            } else {
                "must be between 1 ms and 30 days"
            },
        ))
    } else {
        Ok(())
    }
}

/// A ratio in thousandths between `min` and 1000.
fn permille(name: &'static str, v: u32, min: u32) -> Result<(), ConfigError> {
    if v < min || v > 1000 {
        Err(top(
            name,
            if min == 0 {
                "must be at most 1000 (thousandths)"
            } else {
                "must be between 1 and 1000 (thousandths)"
            },
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn minimal() -> &'static str {
        r#"{"pools":[{"name":"sonnet","input_tokens_per_minute":400000,"output_tokens_per_minute":80000,"requests_per_minute":120,"max_concurrent":20}]}"#
    }

    #[test]
    fn minimal_json_fills_defaults() {
        let c = Config::from_json(minimal()).unwrap();
        assert_eq!(c.margin.start_permille, 850);
        assert_eq!(c.window_ms, 60_000);
        assert_eq!(c.pools[0].counting, Counting::Anthropic);
    }

    #[test]
    fn error_names_the_pool_field() {
        let json = r#"{"pools":[{"name":"a"},{"name":"b","requests_per_minute":0}]}"#;
        let e = Config::from_json(json).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid config: pools[1].requests_per_minute must be at least 1 (use null for unknown)"
        );
    }

    #[test]
    fn rejects_limits_beyond_2_pow_53() {
        let json = r#"{"pools":[{"name":"a","tokens_per_minute":18446744073709551615}]}"#;
        let e = Config::from_json(json).unwrap_err().to_string();
        assert!(e.contains("pools[0].tokens_per_minute"), "{e}");
    }

    #[test]
    fn unknown_field_is_named() {
        let json = r#"{"pools":[{"name":"a"}],"margn":{}}"#;
        let e = Config::from_json(json).unwrap_err().to_string();
        assert!(e.contains("margn"), "{e}");
    }

    #[test]
    fn margin_floor_above_start_is_rejected() {
        let json = r#"{"pools":[{"name":"a"}],"margin":{"floor_permille":900}}"#;
        let e = Config::from_json(json).unwrap_err().to_string();
        assert!(e.contains("margin.floor_permille"), "{e}");
    }

    #[test]
    fn duplicate_pool_names_are_rejected() {
        let json = r#"{"pools":[{"name":"a"},{"name":"a"}]}"#;
        let e = Config::from_json(json).unwrap_err().to_string();
        assert!(e.contains("pools[1].name must be unique"), "{e}");
    }
}
