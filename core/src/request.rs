//! What a host asks for before a model call and reports after it, and the reservation
//! and usage they come to under a pool's counting rules.

use serde::{Deserialize, Serialize};

use crate::bucket::Demand;
use crate::config::{Counting, MAX_TOKENS, OutputReserveConfig};
use crate::error::LeaseError;
use crate::history::History;
use crate::ids::{AgentId, PoolId, TaskId};

/// An agent's role in the task graph; it sets the base queue weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Plans work that unblocks others (weight 3 by default).
    Planner,
    /// Reviews (weight 2).
    Reviewer,
    /// A leaf worker (weight 1).
    #[default]
    Worker,
    /// The core decides: a planner while agents of the agent's family (its subagents, which
    /// name it as their `family`) were seen within a rate window — their calls wait on its
    /// own, so it unblocks that many unless the request says — else a worker. What a host
    /// passes when the caller names no role, so every host weighs a family alike.
    Auto,
}

/// A request for capacity before one model call.
///
/// In JSON every field but `agent` may be left out (its default); a request that names no
/// agent is refused, not taken as agent 0's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who asks.
    pub agent: AgentId,
    /// Which limit group the call goes to.
    #[serde(default)]
    pub pool: PoolId,
    /// Prompt tokens counted locally, excluding the cached prefix.
    #[serde(default)]
    pub input_tokens: u64,
    /// Tokens of the prompt covered by the agent's prompt cache. Charged as input when the
    /// cache has probably expired (or always, under OpenAI counting).
    #[serde(default)]
    pub cached_prefix_tokens: u64,
    /// The host knows `cached_prefix_tokens` is in the provider's cache now: it saw a call
    /// with this very prefix (by content, from any agent) served or written to the cache
    /// within its lifetime, as the fetch wrapper's default estimator does. The prefix is then
    /// charged as a cache read even when this agent's own cache is cold — its first call
    /// reading a system prompt and tools other agents keep warm. Without it (a host that
    /// only knows where the breakpoints are) the core charges the whole prefix whenever the
    /// agent's own last cache use is older than `prompt_cache_ttl_ms`. Anthropic counting
    /// only: OpenAI counts cached tokens anyway.
    #[serde(default)]
    pub cached_prefix_confirmed: bool,
    /// The call's `max_tokens`. Under OpenAI counting it is the output reservation, as the
    /// provider pre-charges it; under Anthropic counting, which counts output as it is
    /// produced, the reservation is a learned high percentile of the agent's settled
    /// output, at most this (see [`OutputReserveConfig`](crate::OutputReserveConfig)).
    /// Either way the difference is refunded or charged on settle.
    #[serde(default)]
    pub max_tokens: u64,
    /// The agent's role.
    #[serde(default)]
    pub role: Role,
    /// Downstream tasks waiting on this one.
    #[serde(default)]
    pub unblocks: u32,
    /// A hash of the agent's last failure (failing test, diff hash); the same value twice
    /// in a row halves the weight. `None` when the last turn did not fail.
    #[serde(default)]
    pub failure_signature: Option<u64>,
    /// The task the call is for. Its role, unblocks and failure history then set the
    /// weight (instead of `role`, `unblocks` and `failure_signature`), and it is charged
    /// the call's tokens and waits. A task not open yet is opened with this request's
    /// role and unblocks (see [`Coordinator::open_task`](crate::Coordinator::open_task)).
    #[serde(default)]
    pub task: Option<TaskId>,
    /// The agent whose family this one belongs to: the session that spawned it as a
    /// subagent (`None`, or the agent itself: it is a family's root). By default a family
    /// shares one place in the fair order, split among its members with calls in line
    /// (see [`WeightConfig::families`](crate::WeightConfig::families)); the metrics show
    /// each agent's family. A host sets it only from what it knows of the caller (a
    /// member of a shared limiter names its own subagents): naming another's family
    /// divides that family's share.
    #[serde(default)]
    pub family: Option<AgentId>,
}

/// What a call really used, as the provider reports it (Anthropic's field names; an OpenAI
/// host puts `prompt_tokens − cached_tokens` in `input_tokens` and `cached_tokens` in
/// `cache_read_input_tokens`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

/// What the lease was asked for, kept until it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ask {
    pub(crate) input_tokens: u64,
    pub(crate) cached_prefix_tokens: u64,
    /// [`LeaseRequest::cached_prefix_confirmed`](crate::LeaseRequest::cached_prefix_confirmed).
    #[serde(default)]
    pub(crate) cached_prefix_confirmed: bool,
    pub(crate) max_tokens: u64,
    /// The output reserved, decided at the ask (see [`crate::OutputReserveConfig`]); at
    /// most `max_tokens`. A lease stored before it existed reserves `max_tokens`.
    #[serde(default = "no_reserve")]
    pub(crate) output: u64,
}

fn no_reserve() -> u64 {
    u64::MAX
}

impl Ask {
    /// The output this lease reserves: its decided reservation, at most `max_tokens`.
    #[inline]
    pub(crate) fn output_reserve(&self) -> u64 {
        self.output.min(self.max_tokens)
    }
}

impl LeaseRequest {
    /// The request's token figures, by field name (the name an error reports).
    fn sizes(&self) -> [(&'static str, u64); 3] {
        [
            ("input_tokens", self.input_tokens),
            ("cached_prefix_tokens", self.cached_prefix_tokens),
            ("max_tokens", self.max_tokens),
        ]
    }

    /// `TooLarge` naming the first figure above [`MAX_TOKENS`].
    #[inline]
    pub(crate) fn check_sizes(&self) -> Result<(), LeaseError> {
        check_sizes(&self.sizes())
    }

    /// The figures a lease keeps to recompute its reservation, with the output reserved
    /// (`output`, at most `max_tokens`).
    pub(crate) fn ask(&self, output: u64) -> Ask {
        Ask {
            input_tokens: self.input_tokens,
            cached_prefix_tokens: self.cached_prefix_tokens,
            cached_prefix_confirmed: self.cached_prefix_confirmed,
            max_tokens: self.max_tokens,
            output: output.min(self.max_tokens),
        }
    }
}

impl Usage {
    /// `TooLarge` naming the first figure above [`MAX_TOKENS`].
    pub(crate) fn check_sizes(&self) -> Result<(), LeaseError> {
        check_sizes(&[
            ("input_tokens", self.input_tokens),
            (
                "cache_creation_input_tokens",
                self.cache_creation_input_tokens,
            ),
            ("cache_read_input_tokens", self.cache_read_input_tokens),
            ("output_tokens", self.output_tokens),
        ])
    }
}

#[inline]
fn check_sizes(sizes: &[(&'static str, u64)]) -> Result<(), LeaseError> {
    for &(field, v) in sizes {
        if v > MAX_TOKENS {
            return Err(LeaseError::TooLarge { field });
        }
    }
    Ok(())
}

/// Reservation for an ask under a pool's counting rules, given whether the agent's own
/// cache is cold (a prefix the host confirmed cached is a read either way).
///
/// Anthropic: input is the uncached part (the whole prefix when the cache is cold), output
/// the reservation decided at the ask. OpenAI: every prompt token, and the combined axis
/// pre-charged `max(max_tokens, input)` as the provider does.
pub(crate) fn charge(counting: Counting, ask: &Ask, cold: bool) -> Demand {
    let output = ask.output_reserve();
    let (input, tokens) = match counting {
        Counting::Anthropic => {
            let input = ask
                .input_tokens
                .saturating_add(if cold && !ask.cached_prefix_confirmed {
                    ask.cached_prefix_tokens
                } else {
                    0
                });
            (input, input.saturating_add(output))
        }
        Counting::Openai => {
            let input = ask.input_tokens.saturating_add(ask.cached_prefix_tokens);
            (input, input.max(output))
        }
    };
    Demand([input, output, tokens, 1])
}

/// The output a call reserves (see [`OutputReserveConfig`]): under OpenAI counting its
/// `max_tokens`; under Anthropic counting the configured percentile of the agent's own
/// recent output in the pool (`own`), else of the pool's (`pool`), else the initial
/// figure — at most `max_tokens`, and at most the output limit when one is known, so that
/// no call is refused for the size of its `max_tokens`.
pub(crate) fn output_reserve(
    counting: Counting,
    cfg: &OutputReserveConfig,
    (own, pool): (&History, &History),
    max_tokens: u64,
    output_limit: Option<u64>,
) -> u64 {
    match counting {
        Counting::Openai => max_tokens,
        Counting::Anthropic => {
            let learned = own
                .percentile(cfg.percentile_permille)
                .or_else(|| pool.percentile(cfg.percentile_permille))
                .unwrap_or(cfg.initial_tokens);
            // A call that produced nothing still reserves one token: the bound on how many
            // calls a span of virtual time holds needs every reservation above zero.
            let reserve = learned.max(1).min(max_tokens);
            output_limit.map_or(reserve, |l| reserve.min(l))
        }
    }
}

/// Usage under a pool's counting rules.
pub(crate) fn used(counting: Counting, u: &Usage) -> Demand {
    let input = match counting {
        Counting::Anthropic => u.input_tokens.saturating_add(u.cache_creation_input_tokens),
        Counting::Openai => u
            .input_tokens
            .saturating_add(u.cache_creation_input_tokens)
            .saturating_add(u.cache_read_input_tokens),
    };
    Demand([
        input,
        u.output_tokens,
        input.saturating_add(u.output_tokens),
        1,
    ])
}
