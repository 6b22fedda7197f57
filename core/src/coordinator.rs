//! The coordinator: one owner of a provider quota.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::agents::{Agent, Agents};
use crate::backoff::{Backoff, BackoffStep};
use crate::bucket::{Axis, Bucket, Demand};
use crate::config::{Config, Counting, MAX_TOKENS};
use crate::error::{LeaseError, RestoreError};
use crate::headers::{HeaderReport, RateAxis};
use crate::lease::{Ask, Entry, LeaseId, LeaseTable, Phase};
use crate::metrics::{
    AgentActivity, AgentMetrics, AxisMetrics, FleetAdvice, MINUTE_MS, Metrics, MinuteStats,
    PoolCounters, PoolMetrics, WaitHistogram,
};
use crate::queue::{Key, Queue};
use crate::rng::Rng;
use crate::time::Millis;

/// An agent, named by the host. Any `u64`; JavaScript hosts keep it below 2^53.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct AgentId(pub u64);

/// A pool, by its index in [`Config::pools`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct PoolId(pub u32);

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
}

/// A request for capacity before one model call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who asks.
    pub agent: AgentId,
    /// Which limit group the call goes to.
    pub pool: PoolId,
    /// Prompt tokens counted locally, excluding the cached prefix.
    pub input_tokens: u64,
    /// Tokens of the prompt covered by the agent's prompt cache. Charged as input when the
    /// cache has probably expired (or always, under OpenAI counting).
    pub cached_prefix_tokens: u64,
    /// The call's `max_tokens`: the output reservation, refunded on settle.
    pub max_tokens: u64,
    /// The agent's role.
    pub role: Role,
    /// Downstream tasks waiting on this one.
    pub unblocks: u32,
    /// A hash of the agent's last failure (failing test, diff hash); the same value twice
    /// in a row halves the weight. `None` when the last turn did not fail.
    pub failure_signature: Option<u64>,
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

/// Why a request was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RejectReason {
    /// The request needs more of this axis than the pool hands out in a whole window: it
    /// would wait forever.
    ExceedsCapacity {
        /// The axis.
        axis: Axis,
    },
    /// The estimated wait is longer than `max_queue_wait_ms`.
    WaitTooLong,
    /// The pool's queue holds `max_queue_depth` tickets.
    QueueFull,
    /// `max_leases` leases and tickets are alive.
    TooManyLeases,
    /// `max_agents` agents are tracked and none is idle.
    TooManyAgents,
}

/// The answer to [`Coordinator::request_lease`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[must_use]
pub enum Decision {
    /// Send now; settle before `expires_at` or the reservation is kept without refund.
    Grant {
        /// The lease to settle.
        lease: LeaseId,
        /// When it is reaped.
        expires_at: Millis,
    },
    /// In line: an [`Event::Granted`] with this id follows. Checkpoint before waiting.
    Queued {
        /// The ticket, which becomes the lease.
        lease: LeaseId,
        /// Estimated grant time (assumes estimates hold and no higher-priority arrivals).
        eta: Millis,
    },
    /// Not now. Come back at `retry_at` (`None`: this request can never be served as asked).
    Reject {
        /// When a new request has a fair chance.
        retry_at: Option<Millis>,
        /// Why.
        reason: RejectReason,
    },
}

/// The answer to [`Coordinator::settle`]: what the lease had reserved and what it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlement {
    /// Reserved at grant, per axis.
    pub reserved: Demand,
    /// Used, per axis, by the pool's counting rules.
    pub used: Demand,
}

/// Something that happened, for the host to act on or log. Drain with
/// [`Coordinator::poll_event`] after every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Event {
    /// A queued ticket was granted: the agent may send now.
    Granted {
        /// The lease (same id as the ticket).
        lease: LeaseId,
        /// Its agent.
        agent: AgentId,
        /// Its pool.
        pool: PoolId,
        /// When it is reaped.
        expires_at: Millis,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A lease was not settled in time and was reaped with no refund.
    Expired {
        /// The lease.
        lease: LeaseId,
        /// Its agent.
        agent: AgentId,
        /// Its pool.
        pool: PoolId,
    },
    /// The pool's margin moved.
    MarginChanged {
        /// The pool.
        pool: PoolId,
        /// Before, thousandths.
        from_permille: u32,
        /// After, thousandths.
        to_permille: u32,
    },
    /// A 429 paused new grants for the whole pool.
    Paused {
        /// The pool.
        pool: PoolId,
        /// Until when.
        until: Millis,
    },
    /// An agent's input estimates have missed by more than the threshold for
    /// `estimate_alert.consecutive` settles in a row.
    EstimateAlert {
        /// The agent.
        agent: AgentId,
        /// Its moving-average input error, thousandths.
        error_permille: u32,
    },
}

const RAMP_STEPS: u64 = 10;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Pool {
    buckets: [Bucket; 4],
    max_concurrent: Option<u64>,
    in_flight: u64,
    margin: u32,
    /// Last 429 or last margin step: the next step is one clean interval later.
    margin_clock: Millis,
    ramp_step: u64,
    paused_until: Millis,
    /// Buckets are refilled up to this instant.
    updated: Millis,
    queue: Queue,
    vtime: u128,
    counters: PoolCounters,
    minutes: Vec<MinuteStats>,
    /// The minute last written and its index in `minutes` (`minute % minutes.len()`), so
    /// the common case, another event in the same minute, needs no division.
    minute_now: u64,
    minute_slot: u32,
    waits: WaitHistogram,
}

/// The quota coordinator: a deterministic state machine with no clock, no I/O and no
/// ambient randomness. See the crate documentation for the calling protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coordinator {
    config: Config,
    rng: Rng,
    now: Millis,
    started: Millis,
    seq: u64,
    pools: Vec<Pool>,
    leases: LeaseTable,
    agents: Agents,
    events: VecDeque<Event>,
}

/// A serialized coordinator: restore it to get one that makes the same decisions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Format version; [`Snapshot::VERSION`] for this build.
    pub version: u32,
    /// The whole state.
    pub state: Coordinator,
}

impl Snapshot {
    /// The format this build writes and reads.
    pub const VERSION: u32 = 1;
}

fn ceil_div(a: u128, b: u128) -> u128 {
    if b == 0 { u128::MAX } else { a.div_ceil(b) }
}

impl Pool {
    fn new(config: &Config, index: usize, now: Millis) -> Pool {
        let p = config.pools.get(index);
        let limit = |f: fn(&crate::config::PoolConfig) -> Option<u64>| p.and_then(f);
        let mut pool = Pool {
            buckets: [
                Bucket::new(limit(|p| p.input_tokens_per_minute)),
                Bucket::new(limit(|p| p.output_tokens_per_minute)),
                Bucket::new(limit(|p| p.tokens_per_minute)),
                Bucket::new(limit(|p| p.requests_per_minute)),
            ],
            max_concurrent: limit(|p| p.max_concurrent),
            in_flight: 0,
            margin: config.margin.start_permille,
            margin_clock: now,
            ramp_step: if config.slow_start.is_some() {
                0
            } else {
                RAMP_STEPS
            },
            paused_until: now,
            updated: now,
            queue: Queue::new(),
            vtime: 0,
            counters: PoolCounters::default(),
            minutes: alloc::vec![MinuteStats::default(); config.metrics_minutes as usize],
            minute_now: 0,
            minute_slot: 0,
            waits: WaitHistogram::new(),
        };
        // Anthropic charges input when a call arrives (output is reserved at max_tokens and
        // corrected, like ours; OpenAI pre-charges its one figure the same way).
        pool.bucket_mut(Axis::InputTokens).charged_on_arrival =
            p.is_some_and(|p| p.counting == Counting::Anthropic);
        pool.set_caps(config, true);
        pool
    }

    fn ramp_permille(&self, config: &Config) -> u64 {
        match config.slow_start {
            Some(s) if self.ramp_step < RAMP_STEPS => {
                let start = u64::from(s.start_permille);
                start + (1000 - start) * self.ramp_step / RAMP_STEPS
            }
            _ => 1000,
        }
    }

    fn cap_for(&self, axis: Axis, limit: u64, config: &Config) -> u64 {
        let ramp = if axis == Axis::Requests {
            1000
        } else {
            self.ramp_permille(config)
        };
        let cap = u128::from(limit) * u128::from(self.margin) * u128::from(ramp) / 1_000_000;
        u64::try_from(cap).unwrap_or(u64::MAX).max(1)
    }

    /// Capacity ignoring the ramp: the most the pool can ever hand out in a window at
    /// this margin. Kept in [`Bucket::nominal`] by [`Pool::apply_cap`].
    fn nominal_cap(&self, limit: u64) -> u64 {
        let cap = u128::from(limit) * u128::from(self.margin) / 1000;
        u64::try_from(cap).unwrap_or(u64::MAX).max(1)
    }

    /// Sets an axis's effective and nominal capacity from its limit, the margin and the
    /// ramp (nothing while the limit is unknown).
    fn apply_cap(&mut self, axis: Axis, config: &Config, start_full: bool) {
        if let Some(limit) = self.bucket(axis).limit {
            let cap = self.cap_for(axis, limit, config);
            let nominal = self.nominal_cap(limit);
            let b = self.bucket_mut(axis);
            b.nominal = nominal;
            b.set_cap(cap, config.window_ms, start_full);
        }
    }

    fn set_caps(&mut self, config: &Config, start_full: bool) {
        for axis in Axis::ALL {
            self.apply_cap(axis, config, start_full);
        }
    }

    fn bucket(&self, axis: Axis) -> &Bucket {
        &self.buckets[axis.index()]
    }

    fn bucket_mut(&mut self, axis: Axis) -> &mut Bucket {
        &mut self.buckets[axis.index()]
    }

    fn refill_to(&mut self, t: Millis, window: u64) {
        let elapsed = t.since(self.updated);
        if elapsed > 0 {
            for b in &mut self.buckets {
                b.refill(elapsed, window);
            }
            self.updated = t;
        }
    }

    fn next_margin_step(&self, config: &Config) -> Option<Millis> {
        (self.margin < config.margin.ceiling_permille && config.margin.increase_permille > 0)
            .then(|| self.margin_clock.plus(config.margin.clean_interval_ms))
    }

    fn next_ramp_step(&self, config: &Config, started: Millis) -> Option<Millis> {
        let s = config.slow_start?;
        (self.ramp_step < RAMP_STEPS).then(|| {
            let at = u128::from(self.ramp_step + 1) * u128::from(s.ramp_ms);
            started.plus(u64::try_from(at.div_ceil(u128::from(RAMP_STEPS))).unwrap_or(u64::MAX))
        })
    }

    /// Moves the pool to `t`, applying margin steps and ramp steps at their exact instants
    /// so the result does not depend on how often the host calls in.
    fn advance(
        &mut self,
        t: Millis,
        config: &Config,
        started: Millis,
        pool: PoolId,
        events: &mut VecDeque<Event>,
    ) {
        loop {
            let margin_at = self.next_margin_step(config);
            let ramp_at = self.next_ramp_step(config, started);
            let next = match (margin_at, ramp_at) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => break,
            };
            if next > t {
                break;
            }
            self.refill_to(next, config.window_ms);
            if margin_at == Some(next) {
                let from = self.margin;
                self.margin = from
                    .saturating_add(config.margin.increase_permille)
                    .min(config.margin.ceiling_permille);
                self.margin_clock = next;
                events.push_back(Event::MarginChanged {
                    pool,
                    from_permille: from,
                    to_permille: self.margin,
                });
            }
            if ramp_at == Some(next) {
                self.ramp_step += 1;
            }
            self.set_caps(config, false);
        }
        self.refill_to(t, config.window_ms);
    }

    fn minute(&mut self, now: Millis) -> Option<&mut MinuteStats> {
        let minute = now.0 / MINUTE_MS;
        if minute != self.minute_now {
            let len = self.minutes.len() as u64;
            self.minute_slot = u32::try_from(minute % len.max(1)).unwrap_or(0);
            self.minute_now = minute;
        }
        let slot = self.minutes.get_mut(self.minute_slot as usize)?;
        // A slot still holding an older minute starts afresh. (A slot equal to the default
        // one holds minute 0 with nothing in it: restarting it changes nothing.)
        if slot.minute != minute {
            *slot = MinuteStats {
                minute,
                ..MinuteStats::default()
            };
        }
        Some(slot)
    }

    fn fits(&self, d: &Demand, window: u64) -> bool {
        Axis::ALL
            .iter()
            .all(|a| self.bucket(*a).fits(d.get(*a), window))
    }

    fn concurrency_free(&self) -> bool {
        self.max_concurrent.is_none_or(|m| self.in_flight < m)
    }

    /// Grants `demand` now: takes the reservation and a concurrency slot, counts the grant,
    /// and returns the lease's active phase.
    fn admit(&mut self, demand: Demand, now: Millis, ttl: u64, window: u64) -> Phase {
        let gated = self.take(&demand, window);
        self.in_flight = self.in_flight.saturating_add(1);
        if let Some(m) = self.minute(now) {
            m.granted = m.granted.saturating_add(1);
        }
        Phase::Active {
            granted_at: now,
            expires_at: now.plus(ttl),
            charged: demand,
            gated,
            rate_limited: false,
            grant_level: self.bucket(Axis::InputTokens).level,
        }
    }

    /// Takes `d` from every gating axis; returns the mask of axes it was taken from.
    fn take(&mut self, d: &Demand, window: u64) -> u8 {
        let mut gated = 0u8;
        for a in Axis::ALL {
            let b = self.bucket_mut(a);
            if b.gates() {
                b.take(d.get(a), window);
                gated |= 1 << a.index();
            }
        }
        gated
    }

    /// Settles a lease's axes: the difference is refunded or charged on axes it was taken
    /// from; an axis that became known after the grant is charged the actual usage.
    fn reconcile(
        &mut self,
        charged: &Demand,
        gated: u8,
        (grant_level, elapsed): (i128, u64),
        actual: &Demand,
        window: u64,
    ) {
        for axis in Axis::ALL {
            let b = self.bucket_mut(axis);
            if gated & (1 << axis.index()) != 0 {
                let room = b.refund_room(grant_level, elapsed, window);
                b.release(charged.get(axis), actual.get(axis), room, window);
            } else {
                b.charge(actual.get(axis), window);
            }
        }
    }

    /// Ms from `updated` until a total of `need` fits on every axis (no full-bucket rule:
    /// this is for sums of several requests).
    fn ms_until_total(&self, need: &Demand, window: u64) -> u64 {
        let mut worst = 0u128;
        for a in Axis::ALL {
            let b = self.bucket(a);
            if !b.gates() {
                continue;
            }
            let want = i128::from(need.get(a)).saturating_mul(i128::from(window));
            let deficit = want.saturating_sub(b.level);
            if deficit > 0 {
                let deficit = deficit.unsigned_abs();
                let ms = match u64::try_from(deficit) {
                    // The common case, without a 128-bit division.
                    Ok(d) if b.cap > 0 => u128::from(d.div_ceil(b.cap)),
                    _ => ceil_div(deficit, u128::from(b.cap)),
                };
                worst = worst.max(ms);
            }
        }
        u64::try_from(worst).unwrap_or(u64::MAX)
    }
}

fn error_permille(estimate: u64, actual: u64) -> u32 {
    let diff = estimate.abs_diff(actual);
    let e = match diff.checked_mul(1000) {
        // The common case, without a 128-bit division.
        Some(d) => u128::from(d / actual.max(1)),
        None => u128::from(diff) * 1000 / u128::from(actual.max(1)),
    };
    u32::try_from(e.min(1_000_000)).unwrap_or(1_000_000)
}

/// `a × b / 1000`, in 64-bit arithmetic when the product fits (it does for every valid
/// configuration), so the common case needs no 128-bit division. Same result either way.
fn mul_permille(a: u128, b: u128) -> u128 {
    if let (Ok(a), Ok(b)) = (u64::try_from(a), u64::try_from(b)) {
        if let Some(p) = a.checked_mul(b) {
            return u128::from(p / 1000);
        }
    }
    a.saturating_mul(b) / 1000
}

/// A ticket's length in virtual time: `(tokens + 1) × 10^6 / weight` (weight ≥ 1), in
/// 64-bit arithmetic when the operands fit. Same result either way.
fn virtual_cost(tokens: u64, weight: u128) -> u128 {
    if let (Some(scaled), Ok(w)) = (
        tokens.checked_add(1).and_then(|c| c.checked_mul(1_000_000)),
        u64::try_from(weight),
    ) {
        return u128::from(scaled / w.max(1));
    }
    let cost = u128::from(tokens).saturating_add(1);
    cost.saturating_mul(1_000_000) / weight.max(1)
}

/// Reservation for an ask under a pool's counting rules, given whether the cache is cold.
fn charge(counting: Counting, ask: &Ask, cold: bool) -> Demand {
    let (input, tokens) = match counting {
        Counting::Anthropic => {
            let input =
                ask.input_tokens
                    .saturating_add(if cold { ask.cached_prefix_tokens } else { 0 });
            (input, input.saturating_add(ask.max_tokens))
        }
        Counting::Openai => {
            let input = ask.input_tokens.saturating_add(ask.cached_prefix_tokens);
            (input, input.max(ask.max_tokens))
        }
    };
    Demand([input, ask.max_tokens, tokens, 1])
}

/// Usage under a pool's counting rules.
fn used(counting: Counting, u: &Usage) -> Demand {
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

impl Coordinator {
    /// A coordinator for `config`, its PRNG seeded with `seed` (hosts draw it from the OS),
    /// starting at `now`.
    pub fn new(config: Config, seed: u64, now: Millis) -> Result<Coordinator, crate::ConfigError> {
        config.validate()?;
        let pools = (0..config.pools.len())
            .map(|i| Pool::new(&config, i, now))
            .collect();
        Ok(Coordinator {
            config,
            rng: Rng::new(seed),
            now,
            started: now,
            seq: 0,
            pools,
            leases: LeaseTable::new(),
            agents: Agents::default(),
            events: VecDeque::new(),
        })
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The latest instant the coordinator has seen.
    #[must_use]
    pub fn now(&self) -> Millis {
        self.now
    }

    /// The index of the pool with this name.
    #[must_use]
    pub fn pool_id(&self, name: &str) -> Option<PoolId> {
        let i = self.config.pools.iter().position(|p| p.name == name)?;
        u32::try_from(i).ok().map(PoolId)
    }

    /// The entry of a lease that is still alive at `now`: a lease whose expiry is due by
    /// then is already gone as far as callers can tell, and saying so must not move any
    /// state (errors leave the coordinator untouched).
    fn live(&self, lease: LeaseId, now: Millis) -> Option<&Entry> {
        let now = self.now.max(now);
        self.leases
            .get(lease)
            .filter(|e| !matches!(e.phase, Phase::Active { expires_at, .. } if expires_at <= now))
    }

    /// The counting rules of pool `p`, if it exists.
    fn counting(&self, p: u32) -> Option<Counting> {
        self.config.pools.get(p as usize).map(|c| c.counting)
    }

    fn clamp(&mut self, now: Millis) -> Millis {
        self.now = self.now.max(now);
        self.now
    }

    /// Brings every pool to `now`: margin and ramp steps, refill, reaping, queue draining.
    fn advance(&mut self, now: Millis) -> Millis {
        let now = self.clamp(now);
        for (i, pool) in self.pools.iter_mut().enumerate() {
            let id = PoolId(u32::try_from(i).unwrap_or(u32::MAX));
            pool.advance(now, &self.config, self.started, id, &mut self.events);
        }
        while let Some(id) = self.leases.pop_expired(now) {
            self.reap(id, now);
        }
        for p in 0..self.pools.len() {
            self.drain(u32::try_from(p).unwrap_or(u32::MAX), now);
        }
        now
    }

    fn reap(&mut self, id: LeaseId, now: Millis) {
        let Some(entry) = self.leases.remove(id) else {
            return;
        };
        let Phase::Active { charged, gated, .. } = entry.phase else {
            return;
        };
        self.leases.prune_expiries();
        let window = self.config.window_ms;
        if let Some(pool) = self.pools.get_mut(entry.pool as usize) {
            // No refund: the reservation is assumed spent, and its credit is dropped.
            for axis in Axis::ALL {
                if gated & (1 << axis.index()) != 0 {
                    let reserved = charged.get(axis);
                    pool.bucket_mut(axis).release(reserved, reserved, 0, window);
                }
            }
            pool.in_flight = pool.in_flight.saturating_sub(1);
            pool.counters.expired = pool.counters.expired.saturating_add(1);
            if let Some(m) = pool.minute(now) {
                m.used = m.used.saturating_add(charged);
            }
        }
        if let Some(agent) = self.agents.get_mut(entry.agent_slot) {
            agent.in_flight = agent.in_flight.saturating_sub(1);
        }
        self.events.push_back(Event::Expired {
            lease: id,
            agent: entry.agent,
            pool: PoolId(entry.pool),
        });
    }

    /// Grants queued tickets of pool `p` in virtual-finish order while the head fits.
    fn drain(&mut self, p: u32, now: Millis) {
        let window = self.config.window_ms;
        let ttl = self.config.lease_ttl_ms;
        let counting = self.counting(p).unwrap_or_default();
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return;
        };
        // At the end of time a lease would be born expired: nothing is granted.
        if now.plus(ttl) <= now {
            return;
        }
        loop {
            if now < pool.paused_until || !pool.concurrency_free() {
                return;
            }
            let Some((_, _, slot)) = pool.queue.peek_min() else {
                return;
            };
            let Some(entry) = self.leases.by_slot(slot).copied() else {
                return;
            };
            let Phase::Queued {
                vstart,
                enqueued_at,
                ..
            } = entry.phase
            else {
                return;
            };
            let cold = self
                .agents
                .get(entry.agent_slot)
                .is_none_or(|a| a.cache_cold(p, now));
            let demand = charge(counting, &entry.ask, cold);
            if !pool.fits(&demand, window) {
                return;
            }
            pool.queue.pop_head();
            let phase = pool.admit(demand, now, ttl, window);
            pool.vtime = pool.vtime.max(vstart);
            let waited_ms = now.since(enqueued_at);
            pool.waits.record(waited_ms);
            pool.counters.granted_from_queue = pool.counters.granted_from_queue.saturating_add(1);
            let expires_at = now.plus(ttl);
            if let Some(e) = self.leases.get_mut(entry.id) {
                e.phase = phase;
            }
            self.leases
                .push_expiry(expires_at, entry.id, self.config.max_leases);
            if let Some(a) = self.agents.get_mut(entry.agent_slot) {
                a.queued = a.queued.saturating_sub(1);
                a.in_flight = a.in_flight.saturating_add(1);
            }
            self.events.push_back(Event::Granted {
                lease: entry.id,
                agent: entry.agent,
                pool: PoolId(p),
                expires_at,
                waited_ms,
            });
        }
    }

    fn weight(&self, req: &LeaseRequest, agent: &Agent, now: Millis) -> u128 {
        let w = &self.config.weights;
        let base = match req.role {
            Role::Planner => w.planner,
            Role::Reviewer => w.reviewer,
            Role::Worker => w.worker,
        };
        let unblocks = u128::from(req.unblocks.min(1_000_000));
        let mut weight = mul_permille(
            u128::from(base),
            1000 + u128::from(w.unblock_bonus) * unblocks,
        );
        let floor = u128::from(w.floor);
        for _ in 0..agent.repeats.min(64) {
            if weight <= floor {
                break;
            }
            weight = mul_permille(weight, u128::from(w.repeat_failure_decay));
        }
        weight = weight.max(floor);
        if req.cached_prefix_tokens >= w.cache_bump_min_tokens && req.cached_prefix_tokens > 0 {
            if let Some(warm_until) = agent
                .pools
                .get(req.pool.0 as usize)
                .and_then(|p| p.cache_warm_until)
            {
                if now < warm_until && warm_until.since(now) <= w.cache_bump_window_ms {
                    weight = mul_permille(weight, 1000 + u128::from(w.cache_bump));
                }
            }
        }
        weight.max(1)
    }

    /// Finds or creates the agent; returns its slot, or `None` when the table is full of
    /// busy agents.
    fn agent_slot(&mut self, id: AgentId, now: Millis) -> Option<u32> {
        if let Some(slot) = self.agents.find(id) {
            return Some(slot);
        }
        if self.agents.len() >= self.config.max_agents as usize {
            self.agents.evict_idle()?;
        }
        Some(self.agents.insert(Agent::new(id, now, self.pools.len())))
    }

    fn reject(
        &mut self,
        p: u32,
        now: Millis,
        retry_at: Option<Millis>,
        reason: RejectReason,
    ) -> Decision {
        if let Some(pool) = self.pools.get_mut(p as usize) {
            pool.counters.rejected = pool.counters.rejected.saturating_add(1);
            if let Some(m) = pool.minute(now) {
                m.rejected = m.rejected.saturating_add(1);
            }
        }
        Decision::Reject { retry_at, reason }
    }

    /// Asks for capacity before a model call. Returns a [`Decision`]; errors only for a
    /// pool that does not exist or figures above 2^53 − 1 (state unchanged then).
    pub fn request_lease(
        &mut self,
        now: Millis,
        req: &LeaseRequest,
    ) -> Result<Decision, LeaseError> {
        let p = req.pool.0;
        let Some(counting) = self.counting(p) else {
            return Err(LeaseError::UnknownPool);
        };
        for (field, v) in [
            ("input_tokens", req.input_tokens),
            ("cached_prefix_tokens", req.cached_prefix_tokens),
            ("max_tokens", req.max_tokens),
        ] {
            if v > MAX_TOKENS {
                return Err(LeaseError::TooLarge { field });
            }
        }
        let now = self.advance(now);
        let window = self.config.window_ms;

        let Some(agent_slot) = self.agent_slot(req.agent, now) else {
            return Ok(self.reject(p, now, None, RejectReason::TooManyAgents));
        };
        let Some(agent) = self.agents.get_mut(agent_slot) else {
            return Ok(self.reject(p, now, None, RejectReason::TooManyAgents));
        };
        agent.last_seen = now;
        match req.failure_signature {
            Some(sig) if agent.last_failure == Some(sig) => {
                agent.repeats = agent.repeats.saturating_add(1)
            }
            sig => {
                agent.last_failure = sig;
                agent.repeats = 0;
            }
        }
        let cold = agent.cache_cold(p, now);
        let ask = Ask {
            input_tokens: req.input_tokens,
            cached_prefix_tokens: req.cached_prefix_tokens,
            max_tokens: req.max_tokens,
        };
        let demand = charge(counting, &ask, cold);
        // Capacity is checked against the cold-cache reservation: a ticket that waits may
        // see its cache expire and be charged the whole prefix when it is granted.
        let worst = charge(counting, &ask, true);

        let Some(pool) = self.pools.get(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        for axis in Axis::ALL {
            let Some(limit) = pool.bucket(axis).limit else {
                continue;
            };
            let demand = worst;
            if demand.get(axis) > pool.bucket(axis).nominal {
                let ceiling =
                    u128::from(limit) * u128::from(self.config.margin.ceiling_permille) / 1000;
                let retry_at = if u128::from(demand.get(axis)) > ceiling
                    || self.config.margin.increase_permille == 0
                {
                    None
                } else {
                    // Once the margin has recovered enough.
                    let needed = ceil_div(u128::from(demand.get(axis)) * 1000, u128::from(limit));
                    let steps = ceil_div(
                        needed.saturating_sub(u128::from(pool.margin)),
                        u128::from(self.config.margin.increase_permille),
                    );
                    let wait =
                        steps.saturating_mul(u128::from(self.config.margin.clean_interval_ms));
                    Some(
                        pool.margin_clock
                            .plus(u64::try_from(wait).unwrap_or(u64::MAX)),
                    )
                };
                return Ok(self.reject(p, now, retry_at, RejectReason::ExceedsCapacity { axis }));
            }
        }
        if self.leases.live() >= self.config.max_leases {
            let retry_at = self.leases.next_expiry();
            return Ok(self.reject(p, now, retry_at, RejectReason::TooManyLeases));
        }

        let Some(agent) = self.agents.get(agent_slot) else {
            return Err(LeaseError::UnknownPool);
        };
        let weight = self.weight(req, agent, now);
        let last_vfinish = agent.pools.get(p as usize).map_or(0, |a| a.last_vfinish);
        let Some(pool) = self.pools.get(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        let vstart = pool.vtime.max(last_vfinish);
        let vfinish = vstart.saturating_add(virtual_cost(demand.get(Axis::Tokens), weight));
        let key = Key {
            vfinish,
            seq: self.seq,
        };
        let ahead = pool.queue.peek_min().is_none_or(|(head, _, _)| key < head);
        let ttl = self.config.lease_ttl_ms;

        if ahead
            && now >= pool.paused_until
            && now.plus(ttl) > now
            && pool.concurrency_free()
            && pool.fits(&demand, window)
        {
            self.seq = self.seq.saturating_add(1);
            let expires_at = now.plus(ttl);
            let Some(pool) = self.pools.get_mut(p as usize) else {
                return Err(LeaseError::UnknownPool);
            };
            let phase = pool.admit(demand, now, ttl, window);
            // With nobody waiting, virtual time moves to this grant's finish, so an agent
            // gains no credit from earlier uncontended use and owes none to late comers.
            pool.vtime = pool.vtime.max(if pool.queue.is_empty() {
                vfinish
            } else {
                vstart
            });
            pool.counters.granted_now = pool.counters.granted_now.saturating_add(1);
            let id = self.leases.insert(|id| Entry {
                id,
                agent: req.agent,
                agent_slot,
                pool: p,
                ask,
                phase,
            });
            self.leases
                .push_expiry(expires_at, id, self.config.max_leases);
            if let Some(a) = self.agents.get_mut(agent_slot) {
                a.in_flight = a.in_flight.saturating_add(1);
                if let Some(ap) = a.pools.get_mut(p as usize) {
                    ap.last_vfinish = vfinish;
                }
            }
            return Ok(Decision::Grant {
                lease: id,
                expires_at,
            });
        }

        if pool.queue.len() >= self.config.max_queue_depth {
            let retry_at = self.pool_wake(p);
            return Ok(self.reject(p, now, retry_at, RejectReason::QueueFull));
        }
        let max_wait = self.config.max_queue_wait_ms;
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        // Insert first: the same walk gives the demand queued ahead, which sets the ETA. A
        // ticket that would wait too long is taken back out.
        let inserted = pool.queue.insert(key, demand, u32::MAX);
        let need = inserted.before.saturating_add(demand);
        let eta = pool
            .updated
            .plus(pool.ms_until_total(&need, window))
            .max(pool.paused_until)
            .max(now);
        if eta.since(now) > max_wait {
            pool.queue.undo_insert(key, inserted);
            let retry_at = Millis(eta.0.saturating_sub(max_wait)).max(now.plus(1));
            return Ok(self.reject(p, now, Some(retry_at), RejectReason::WaitTooLong));
        }

        self.seq = self.seq.saturating_add(1);
        let id = self.leases.insert(|id| Entry {
            id,
            agent: req.agent,
            agent_slot,
            pool: p,
            ask,
            phase: Phase::Queued {
                key,
                vstart,
                enqueued_at: now,
            },
        });
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        pool.queue.set_slot(inserted, LeaseTable::slot_of(id));
        pool.counters.queued = pool.counters.queued.saturating_add(1);
        if let Some(m) = pool.minute(now) {
            m.queued = m.queued.saturating_add(1);
        }
        if let Some(a) = self.agents.get_mut(agent_slot) {
            if a.queued == 0 {
                a.queued_since = now;
            }
            a.queued = a.queued.saturating_add(1);
            if let Some(ap) = a.pools.get_mut(p as usize) {
                ap.last_vfinish = vfinish;
            }
        }
        Ok(Decision::Queued { lease: id, eta })
    }

    /// Reports what a granted lease really used. The difference from the reservation is
    /// refunded or charged at once (debt allowed), the concurrency slot is released, and
    /// queued tickets that now fit are granted (see [`Coordinator::poll_event`]).
    pub fn settle(
        &mut self,
        now: Millis,
        lease: LeaseId,
        usage: &Usage,
    ) -> Result<Settlement, LeaseError> {
        for (field, v) in [
            ("input_tokens", usage.input_tokens),
            (
                "cache_creation_input_tokens",
                usage.cache_creation_input_tokens,
            ),
            ("cache_read_input_tokens", usage.cache_read_input_tokens),
            ("output_tokens", usage.output_tokens),
        ] {
            if v > MAX_TOKENS {
                return Err(LeaseError::TooLarge { field });
            }
        }
        match self.live(lease, now) {
            None => return Err(LeaseError::UnknownLease),
            Some(Entry {
                phase: Phase::Queued { .. },
                ..
            }) => return Err(LeaseError::NotGranted),
            Some(_) => {}
        }
        let now = self.advance(now);
        // The lease may have been reaped by advancing to `now`.
        let Some(entry) = self.leases.remove(lease) else {
            return Err(LeaseError::UnknownLease);
        };
        self.leases.prune_expiries();
        let Phase::Active {
            charged,
            gated,
            grant_level,
            granted_at,
            ..
        } = entry.phase
        else {
            return Err(LeaseError::NotGranted);
        };
        let p = entry.pool;
        let counting = self.counting(p).unwrap_or_default();
        let actual = used(counting, usage);
        let window = self.config.window_ms;
        if let Some(pool) = self.pools.get_mut(p as usize) {
            pool.reconcile(
                &charged,
                gated,
                (grant_level, now.since(granted_at)),
                &actual,
                window,
            );
            pool.in_flight = pool.in_flight.saturating_sub(1);
            pool.counters.settled = pool.counters.settled.saturating_add(1);
            if let Some(m) = pool.minute(now) {
                m.used = m.used.saturating_add(actual);
            }
        }
        let ttl = self.config.prompt_cache_ttl_ms;
        let alert = self.config.estimate_alert;
        if let Some(a) = self.agents.get_mut(entry.agent_slot) {
            a.in_flight = a.in_flight.saturating_sub(1);
            a.last_seen = now;
            a.last_settle = Some(now);
            a.settled = a.settled.saturating_add(1);
            let cache_used = entry.ask.cached_prefix_tokens > 0
                || usage.cache_read_input_tokens > 0
                || usage.cache_creation_input_tokens > 0;
            if cache_used {
                if let Some(ap) = a.pools.get_mut(p as usize) {
                    ap.cache_warm_until = Some(now.plus(ttl));
                }
            }
            let in_err = error_permille(
                charged.get(Axis::InputTokens),
                actual.get(Axis::InputTokens),
            );
            let out_err = error_permille(
                charged.get(Axis::OutputTokens),
                actual.get(Axis::OutputTokens),
            );
            let ewma = |old: u32, x: u32| {
                if a.settled == 1 {
                    x
                } else {
                    ((u64::from(old) * 7 + u64::from(x)) / 8) as u32
                }
            };
            a.input_error = ewma(a.input_error, in_err);
            a.output_error = ewma(a.output_error, out_err);
            if in_err > alert.threshold_permille {
                a.misses = a.misses.saturating_add(1);
                if a.misses >= alert.consecutive && !a.alerting {
                    a.alerting = true;
                    self.events.push_back(Event::EstimateAlert {
                        agent: entry.agent,
                        error_permille: a.input_error,
                    });
                }
            } else {
                a.misses = 0;
                a.alerting = false;
            }
        }
        self.drain(p, now);
        Ok(Settlement {
            reserved: charged,
            used: actual,
        })
    }

    /// Withdraws a queued ticket, or gives back a granted lease whose call was never sent
    /// (everything it reserved is refunded).
    pub fn cancel(&mut self, now: Millis, lease: LeaseId) -> Result<(), LeaseError> {
        if self.live(lease, now).is_none() {
            return Err(LeaseError::UnknownLease);
        }
        let now = self.advance(now);
        let Some(entry) = self.leases.remove(lease) else {
            return Err(LeaseError::UnknownLease);
        };
        self.leases.prune_expiries();
        let p = entry.pool;
        let window = self.config.window_ms;
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        pool.counters.cancelled = pool.counters.cancelled.saturating_add(1);
        let agent = self.agents.get_mut(entry.agent_slot);
        match entry.phase {
            Phase::Queued { key, vstart, .. } => {
                pool.queue.remove(key);
                if let Some(a) = agent {
                    a.queued = a.queued.saturating_sub(1);
                    // A withdrawn ticket received no service: if it was the agent's latest,
                    // its virtual finish goes back to where it started.
                    if let Some(ap) = a.pools.get_mut(p as usize) {
                        if ap.last_vfinish == key.vfinish {
                            ap.last_vfinish = vstart;
                        }
                    }
                }
            }
            Phase::Active {
                charged,
                gated,
                grant_level,
                granted_at,
                ..
            } => {
                let since = (grant_level, now.since(granted_at));
                pool.reconcile(&charged, gated, since, &Demand::default(), window);
                pool.in_flight = pool.in_flight.saturating_sub(1);
                if let Some(a) = agent {
                    a.in_flight = a.in_flight.saturating_sub(1);
                }
            }
        }
        self.drain(p, now);
        Ok(())
    }

    /// Feeds a provider response's status and parsed rate-limit headers back in.
    ///
    /// Limits in the headers update the pool (a new tier changes capacity; an unknown limit
    /// becomes known); a `remaining` lower than the coordinator's view lowers the bucket.
    /// A 429 pauses new grants for the whole pool until its retry time (one 429, one
    /// fleet-wide pause; a parallel-request 429 does not pause, as it clears when calls
    /// finish), and a 429 against a granted `lease` cuts the margin once.
    pub fn handle_response(
        &mut self,
        now: Millis,
        pool: PoolId,
        lease: Option<LeaseId>,
        status: u16,
        report: &HeaderReport,
    ) -> Result<(), LeaseError> {
        let p = pool.0;
        let Some(counting) = self.counting(p) else {
            return Err(LeaseError::UnknownPool);
        };
        if let Some(id) = lease {
            match self.live(id, now) {
                Some(e) if e.pool == p => {}
                _ => return Err(LeaseError::UnknownLease),
            }
        }
        let now = self.advance(now);
        let window = self.config.window_ms;
        let config = &self.config;
        let Some(pl) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        pl.counters.malformed_headers = pl
            .counters
            .malformed_headers
            .saturating_add(u64::from(report.malformed));

        let concurrency_known = pl.max_concurrent.is_some();
        let tokens_axis = match counting {
            Counting::Openai => Some(Axis::Tokens),
            Counting::Anthropic => pl.bucket(Axis::Tokens).limit.map(|_| Axis::Tokens),
        };
        let mapped = [
            (Some(Axis::Requests), &report.requests),
            (Some(Axis::InputTokens), &report.input_tokens),
            (Some(Axis::OutputTokens), &report.output_tokens),
            (tokens_axis, &report.tokens),
        ];
        for (axis, r) in mapped {
            let Some(axis) = axis else { continue };
            if let Some(limit) = r.limit.filter(|l| (1..=MAX_TOKENS).contains(l)) {
                let b = pl.bucket(axis);
                if b.limit != Some(limit) {
                    let was_known = b.limit.is_some();
                    pl.bucket_mut(axis).limit = Some(limit);
                    pl.apply_cap(axis, config, !was_known);
                }
            }
            if let Some(remaining) = r.remaining {
                if pl
                    .bucket_mut(axis)
                    .resync(remaining.min(MAX_TOKENS), r.granularity, window)
                {
                    pl.counters.resyncs = pl.counters.resyncs.saturating_add(1);
                }
            }
        }
        if let Some(limit) = report
            .concurrent
            .limit
            .filter(|l| (1..=MAX_TOKENS).contains(l))
        {
            pl.max_concurrent = Some(limit);
        }

        if status == 429 {
            pl.counters.rate_limited = pl.counters.rate_limited.saturating_add(1);
            if let Some(m) = pl.minute(now) {
                m.rate_limited = m.rate_limited.saturating_add(1);
            }
            if report.exceeded != Some(RateAxis::Concurrent) {
                let exceeded_reset = match report.exceeded {
                    Some(RateAxis::Requests) => report.requests.reset_after_ms,
                    Some(RateAxis::Tokens) => report.tokens.reset_after_ms,
                    Some(RateAxis::InputTokens) => report.input_tokens.reset_after_ms,
                    Some(RateAxis::OutputTokens) => report.output_tokens.reset_after_ms,
                    _ => None,
                };
                let wait = report
                    .retry_after_ms
                    .or(report.reset_at_ms)
                    .or(exceeded_reset)
                    .unwrap_or(config.backoff.base_ms)
                    .min(crate::headers::MAX_WAIT_MS);
                let until = now.plus(wait);
                if until > pl.paused_until {
                    pl.paused_until = until;
                    self.events.push_back(Event::Paused { pool, until });
                }
            }
            // A parallel-request 429 while that limit is unknown teaches it: the provider
            // was full with the other calls in flight (this one counts in ours).
            if report.exceeded == Some(RateAxis::Concurrent) && pl.max_concurrent.is_none() {
                let others = pl.in_flight.saturating_sub(u64::from(lease.is_some()));
                pl.max_concurrent = Some(others.max(1));
            }
            // The coordinator was wrong only if it granted the lease knowing every limit it
            // knows now; a lease granted blind (limits not yet learned) cuts nothing.
            let known = Axis::ALL
                .iter()
                .filter(|a| pl.bucket(**a).gates())
                .fold(0u8, |m, a| m | (1 << a.index()));
            let mut cut = false;
            if let Some(id) = lease {
                if let Some(Entry {
                    phase:
                        Phase::Active {
                            rate_limited,
                            gated,
                            ..
                        },
                    ..
                }) = self.leases.get_mut(id)
                {
                    if !*rate_limited {
                        *rate_limited = true;
                        let blind_on_concurrency =
                            report.exceeded == Some(RateAxis::Concurrent) && !concurrency_known;
                        cut = *gated & known == known && !blind_on_concurrency;
                    }
                }
            }
            if cut {
                pl.counters.rate_limited_on_lease =
                    pl.counters.rate_limited_on_lease.saturating_add(1);
                let from = pl.margin;
                pl.margin = from
                    .saturating_sub(config.margin.decrease_permille)
                    .max(config.margin.floor_permille);
                pl.margin_clock = now;
                pl.set_caps(config, false);
                if pl.margin != from {
                    self.events.push_back(Event::MarginChanged {
                        pool,
                        from_permille: from,
                        to_permille: pl.margin,
                    });
                }
            }
        }
        self.drain(p, now);
        Ok(())
    }

    /// Moves time forward: reaps expired leases, steps the margin, grants queued tickets.
    /// Call it at [`Coordinator::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Millis) {
        self.advance(now);
    }

    /// The next instant the coordinator wants [`Coordinator::handle_timeout`], if any.
    /// Waking earlier or later is safe; waking exactly then gives the reference decisions.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        let mut next = self.leases.next_expiry();
        let mut consider = |t: Option<Millis>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for p in 0..self.pools.len() {
            let Some(pool) = self.pools.get(p) else {
                continue;
            };
            consider(pool.next_margin_step(&self.config));
            consider(pool.next_ramp_step(&self.config, self.started));
            consider(self.pool_wake(u32::try_from(p).unwrap_or(u32::MAX)));
        }
        next.map(|t| t.max(self.now))
    }

    /// When pool `p`'s queue head would fit, if it has a head that is not waiting on a
    /// concurrency slot.
    fn pool_wake(&self, p: u32) -> Option<Millis> {
        let pool = self.pools.get(p as usize)?;
        let (_, _, slot) = pool.queue.peek_min()?;
        if !pool.concurrency_free() {
            return None;
        }
        // The same reservation `drain` would compute now (a prompt cache may have gone cold
        // while the ticket waited).
        let entry = self.leases.by_slot(slot)?;
        let counting = self.config.pools.get(p as usize)?.counting;
        let cold = self
            .agents
            .get(entry.agent_slot)
            .is_none_or(|a| a.cache_cold(p, self.now));
        let demand = charge(counting, &entry.ask, cold);
        let window = self.config.window_ms;
        let mut worst = 0u64;
        for a in Axis::ALL {
            worst = worst.max(pool.bucket(a).ms_until_fits(demand.get(a), window)?);
        }
        let at = pool.updated.plus(worst).max(pool.paused_until);
        // Nothing is granted at the end of time (the lease would be born expired).
        (at.plus(self.config.lease_ttl_ms) > at).then_some(at)
    }

    /// The next event, oldest first.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next backoff step for a call that failed despite the coordinator: draws from the
    /// coordinator's seeded PRNG, so every runtime backs off identically.
    pub fn backoff(&mut self, state: &mut Backoff, retry_after_ms: Option<u64>) -> BackoffStep {
        state.on_failure(&self.config.backoff, &mut self.rng, retry_after_ms)
    }

    /// Figures for dashboards and alerts, as of `now` (which only reads the clock value; no
    /// state moves).
    #[must_use]
    pub fn metrics(&self, now: Millis) -> Metrics {
        let now = self.now.max(now);
        let window = self.config.window_ms;
        let current_minute = now.0 / MINUTE_MS;
        let pools = self
            .pools
            .iter()
            .zip(&self.config.pools)
            .map(|(pool, cfg)| {
                let mut minutes: Vec<MinuteStats> = pool
                    .minutes
                    .iter()
                    .filter(|m| m.minute <= current_minute && *m != &MinuteStats::default())
                    .copied()
                    .collect();
                minutes.sort_by_key(|m| m.minute);
                let last_complete = minutes
                    .iter()
                    .rev()
                    .find(|m| m.minute + 1 == current_minute);
                let axes: Vec<AxisMetrics> = Axis::ALL
                    .iter()
                    .map(|&axis| {
                        let b = pool.bucket(axis);
                        let last_minute = last_complete.map_or(0, |m| m.used.get(axis));
                        AxisMetrics {
                            axis,
                            limit: b.limit,
                            capacity: if b.gates() { b.cap } else { 0 },
                            available: i64::try_from(b.available(window)).unwrap_or(i64::MIN),
                            last_minute,
                            last_minute_permille: b.limit.map_or(0, |l| {
                                u32::try_from(u128::from(last_minute) * 1000 / u128::from(l.max(1)))
                                    .unwrap_or(u32::MAX)
                            }),
                        }
                    })
                    .collect();
                // Binding axis and fleet advice over up to five complete minutes.
                let recent: Vec<&MinuteStats> = minutes
                    .iter()
                    .filter(|m| m.minute < current_minute && m.minute + 5 >= current_minute)
                    .collect();
                let mut binding: Option<(Axis, u128)> = None;
                for &axis in &Axis::ALL {
                    let Some(limit) = pool.bucket(axis).limit else {
                        continue;
                    };
                    let total: u128 = recent.iter().map(|m| u128::from(m.used.get(axis))).sum();
                    let share = total * 1_000_000 / u128::from(limit);
                    if total > 0 && binding.is_none_or(|(_, s)| share > s) {
                        binding = Some((axis, share));
                    }
                }
                let fleet = binding.and_then(|(axis, _)| {
                    let limit = pool.bucket(axis).limit?;
                    let first = recent.first()?.minute;
                    let span = (current_minute - first).max(1);
                    let since = Millis(first.saturating_mul(MINUTE_MS));
                    let measured = self
                        .agents
                        .values()
                        .filter(|a| a.last_settle.is_some_and(|t| t >= since))
                        .count();
                    let measured = u32::try_from(measured).ok().filter(|m| *m > 0)?;
                    let total: u64 = recent
                        .iter()
                        .map(|m| m.used.get(axis))
                        .fold(0, u64::saturating_add);
                    let per_agent = total / span / u64::from(measured);
                    let per_agent = per_agent.max(1);
                    Some(FleetAdvice {
                        axis,
                        per_agent_per_minute: per_agent,
                        agents_measured: measured,
                        agents_at_75_percent: limit / 4 * 3 / per_agent,
                    })
                });
                PoolMetrics {
                    name: cfg.name.clone(),
                    margin_permille: pool.margin,
                    paused_until: pool.paused_until,
                    in_flight: pool.in_flight,
                    max_concurrent: pool.max_concurrent,
                    queue_depth: pool.queue.len(),
                    axes,
                    binding_axis: binding.map(|(a, _)| a),
                    queue_wait_p50_ms: pool.waits.percentile(500),
                    queue_wait_p95_ms: pool.waits.percentile(950),
                    counters: pool.counters,
                    minutes,
                    fleet,
                }
            })
            .collect();
        let agents = self
            .agents
            .in_id_order()
            .map(|a| AgentMetrics {
                agent: a.id,
                activity: if a.queued > 0 {
                    AgentActivity::Queued {
                        since: a.queued_since,
                    }
                } else if a.in_flight > 0 {
                    AgentActivity::InFlight
                } else {
                    AgentActivity::Idle
                },
                queued: a.queued,
                in_flight: a.in_flight,
                settled: a.settled,
                input_error_permille: a.input_error,
                output_error_permille: a.output_error,
                alerting: a.alerting,
                repeat_failures: a.repeats,
                last_seen: a.last_seen,
            })
            .collect();
        Metrics {
            now,
            pools,
            agents,
            live_leases: self.leases.live(),
        }
    }

    /// The whole state, ready to serialize.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: Snapshot::VERSION,
            state: self.clone(),
        }
    }

    /// The snapshot as JSON text.
    #[must_use]
    pub fn snapshot_json(&self) -> String {
        // Serializing plain data to a String cannot fail.
        serde_json::to_string(&self.snapshot()).unwrap_or_default()
    }

    /// A coordinator from a snapshot; it makes the same decisions the original would.
    pub fn restore(snapshot: Snapshot) -> Result<Coordinator, RestoreError> {
        if snapshot.version != Snapshot::VERSION {
            return Err(RestoreError::UnsupportedVersion(snapshot.version));
        }
        let c = snapshot.state;
        c.config.validate().map_err(RestoreError::Config)?;
        c.check().map_err(RestoreError::Corrupt)?;
        Ok(c)
    }

    /// [`Coordinator::restore`] from JSON text.
    pub fn restore_json(json: &str) -> Result<Coordinator, RestoreError> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let v: Version = serde_json::from_str(json).map_err(RestoreError::Parse)?;
        if v.version != Snapshot::VERSION {
            return Err(RestoreError::UnsupportedVersion(v.version));
        }
        let s: Snapshot = serde_json::from_str(json).map_err(RestoreError::Parse)?;
        Coordinator::restore(s)
    }

    /// Internal consistency: used on restore and by tests.
    #[doc(hidden)]
    pub fn check(&self) -> Result<(), &'static str> {
        if self.pools.len() != self.config.pools.len() {
            return Err("pool count differs from config");
        }
        if !self.leases.is_consistent() {
            return Err("lease table");
        }
        let mut queued = alloc::vec![0u32; self.pools.len()];
        let mut active = alloc::vec![0u64; self.pools.len()];
        let mut per_agent: BTreeMap<AgentId, (u32, u32)> = BTreeMap::new();
        for e in self.leases.entries() {
            let i = e.pool as usize;
            let counts = per_agent.entry(e.agent).or_default();
            match e.phase {
                Phase::Queued { .. } => {
                    *queued.get_mut(i).ok_or("lease names a missing pool")? += 1;
                    counts.0 += 1;
                }
                Phase::Active { .. } => {
                    *active.get_mut(i).ok_or("lease names a missing pool")? += 1;
                    counts.1 += 1;
                }
            }
            if self
                .agents
                .get(e.agent_slot)
                .is_none_or(|a| a.id != e.agent)
            {
                return Err("lease names a missing agent");
            }
        }
        for (i, pool) in self.pools.iter().enumerate() {
            if !pool.queue.is_consistent() {
                return Err("queue structure");
            }
            if queued.get(i) != Some(&pool.queue.len()) || active.get(i) != Some(&pool.in_flight) {
                return Err("queue or in-flight count differs from lease table");
            }
            // Keys are distinct in the queue, so matching them makes the queue and the
            // pool's queued tickets one to one.
            for (key, slot) in pool.queue.in_order() {
                match self.leases.by_slot(slot) {
                    Some(Entry {
                        phase: Phase::Queued { key: k, .. },
                        pool: q,
                        ..
                    }) if *q as usize == i && *k == key => {}
                    _ => return Err("queue names a slot that is not queued in this pool"),
                }
            }
            if pool.minutes.len() != self.config.metrics_minutes as usize
                || u64::from(pool.minute_slot)
                    != pool.minute_now % u64::from(self.config.metrics_minutes.max(1))
                || !pool.waits.is_consistent()
            {
                return Err("metrics");
            }
            if pool.margin < self.config.margin.floor_permille
                || pool.margin > self.config.margin.ceiling_permille
            {
                return Err("margin outside floor and ceiling");
            }
            if pool.updated > self.now {
                return Err("pool ahead of coordinator clock");
            }
            if pool
                .buckets
                .iter()
                .any(|b| b.nominal != b.limit.map_or(0, |l| pool.nominal_cap(l)))
            {
                return Err("nominal capacity differs from limit and margin");
            }
        }
        if !self.agents.is_consistent() {
            return Err("agent table");
        }
        for a in self.agents.values() {
            let (q, f) = per_agent.get(&a.id).copied().unwrap_or_default();
            if a.queued != q || a.in_flight != f || a.pools.len() != self.pools.len() {
                return Err("agent counts differ from lease table");
            }
        }
        if self.agents.len() > self.config.max_agents as usize
            || self.leases.live() > self.config.max_leases
        {
            return Err("tables beyond their configured bounds");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// Two pools' worth of state: agents, a granted lease, queued tickets, minutes used.
    fn busy() -> Coordinator {
        let config = Config::from_json(
            r#"{"pools":[{"name":"p","input_tokens_per_minute":40000,
                "output_tokens_per_minute":8000,"requests_per_minute":50,"max_concurrent":1}],
                "metrics_minutes":7}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut c = Coordinator::new(config, 1, Millis(0)).unwrap_or_else(|e| panic!("{e}"));
        for (t, agent) in [(0, 1), (10, 2), (20, 3), (30, 2), (70_000, 4)] {
            let req = LeaseRequest {
                agent: AgentId(agent),
                input_tokens: 1_000,
                max_tokens: 500,
                ..Default::default()
            };
            let _ = c.request_lease(Millis(t), &req);
        }
        c.check().unwrap_or_else(|e| panic!("{e}"));
        c
    }

    fn restore_edited(c: &Coordinator, edit: impl FnOnce(&mut Value)) -> Result<(), RestoreError> {
        let mut v = serde_json::to_value(c.snapshot()).unwrap_or(Value::Null);
        edit(&mut v["state"]);
        let s: Snapshot = serde_json::from_value(v).map_err(RestoreError::Parse)?;
        Coordinator::restore(s).map(|_| ())
    }

    #[test]
    fn snapshots_round_trip_with_the_new_tables() {
        let c = busy();
        let back = Coordinator::restore_json(&c.snapshot_json()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, c);
        assert!(restore_edited(&c, |_| {}).is_ok());
    }

    #[test]
    fn restore_refuses_corrupt_indices() {
        let c = busy();
        let corrupt = |what: &str, edit: &dyn Fn(&mut Value)| {
            assert!(
                matches!(restore_edited(&c, edit), Err(RestoreError::Corrupt(_))),
                "{what} must be refused"
            );
        };
        corrupt("a lease naming another agent's slot", &|s| {
            s["leases"]["slots"][0]["entry"]["agent_slot"] = json!(1);
        });
        corrupt("a lease naming a slot past the table", &|s| {
            s["leases"]["slots"][0]["entry"]["agent_slot"] = json!(99);
        });
        corrupt("an agent index naming the wrong slot", &|s| {
            s["agents"]["index"]["1"] = json!(2);
        });
        corrupt("an agent slot on the free list", &|s| {
            s["agents"]["free"] = json!([0]);
        });
        corrupt("a queue head that is not the smallest key", &|s| {
            let q = &mut s["pools"][0]["queue"];
            let root = q["root"].clone();
            let head = q["head"].clone();
            q["head"] = if root == head { json!(99) } else { root };
        });
        corrupt("a queue ticket naming another lease slot", &|s| {
            s["pools"][0]["queue"]["tickets"][0]["slot"] = json!(0);
        });
        corrupt("a queue key that differs from its lease's", &|s| {
            let v = &mut s["pools"][0]["queue"]["nodes"][0]["vfinish_lo"];
            *v = json!(v.as_u64().unwrap_or(0) + 1);
        });
        corrupt("a cached minute slot that is not minute % len", &|s| {
            s["pools"][0]["minute_slot"] = json!(0);
        });
        corrupt(
            "a nominal capacity that does not match limit and margin",
            &|s| {
                s["pools"][0]["buckets"][0]["nominal"] = json!(40_000);
            },
        );
    }
}
