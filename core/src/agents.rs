//! The agent table: a slab of agents with a free list, and an index from [`AgentId`] to
//! slab slot.
//!
//! A request looks its agent up once, by id, in the index; a lease keeps its agent's slot,
//! so settling, cancelling, draining and reaping reach the agent without a search. Only an
//! idle agent (nothing queued, nothing in flight) is ever removed, so a live lease's slot
//! always names its own agent.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::bucket::{Axis, Demand};
use crate::config::AlertConfig;
use crate::headers::RateAxis;
use crate::history::History;
use crate::ids::AgentId;
use crate::time::Millis;
use crate::weight::SCALE;

/// An agent's state in one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AgentPool {
    pub(crate) last_vfinish: u128,
    pub(crate) cache_warm_until: Option<Millis>,
    /// The place in the fair order kept for a refused request: its next request starts at
    /// this virtual time instead of at the back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) held: Option<Held>,
    /// The weight of its latest ask here (0 before its first): what another ticket's ETA
    /// assumes it keeps.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) weight: u64,
    /// The smallest dominant share it has asked for here (see `Pool::dominant_share`),
    /// plus one (0 before its first ask): what bounds how many requests it can send in a
    /// span of virtual time.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) smallest: u64,
    /// Whether a call of it has been granted here: until one is, its calls are first calls
    /// (placed by at most a quantum, see `weights.quantum_permille`).
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub(crate) served: bool,
    /// Output tokens of its latest completed calls here: what its output reservation is
    /// learned from.
    #[serde(default, skip_serializing_if = "History::is_empty")]
    pub(crate) outputs: History,
    /// The virtual finish of its latest call no bigger than a quantum here: where its next
    /// such call starts (at the pool's virtual time at the earliest). Its calls of every
    /// size move `last_vfinish`; only small ones move this (see `weight::small`).
    #[serde(default, skip_serializing_if = "is_zero_u128")]
    pub(crate) last_small: u128,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero_u128(n: &u128) -> bool {
    *n == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero_i32(n: &i32) -> bool {
    *n == 0
}

/// A place in the fair order kept across a refusal (`wait_too_long`, `queue_full`,
/// `too_many_leases`), so the request that comes back at its `retry_at` is not overtaken
/// by everything that arrived meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    /// The virtual start the refused request had.
    pub(crate) vstart: u128,
    /// The place is kept until then (the refusal's retry time plus one rate window).
    pub(crate) until: Millis,
}

/// An agent's share rates in one pool (see [`AgentPool::rates`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rates {
    /// Dominant share per unit of virtual time.
    pub(crate) share: u128,
    pub(crate) requests: u128,
}

/// Per pool, the sums of every agent's [`Rates`] and how many agents hold a place: what a
/// queued ticket's ETA needs in O(1). Derived from the agents (rebuilt on restore).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shares {
    pub(crate) rates: Rates,
    pub(crate) held: u32,
    /// Agents that have asked in the pool (a weight): each may be served a small-call lead
    /// beyond its place (see `weight::small`).
    pub(crate) asking: u32,
}

impl Shares {
    fn add(&mut self, r: Rates) {
        self.rates.share = self.rates.share.saturating_add(r.share);
        self.rates.requests = self.rates.requests.saturating_add(r.requests);
    }

    fn sub(&mut self, r: Rates) {
        self.rates.share = self.rates.share.saturating_sub(r.share);
        self.rates.requests = self.rates.requests.saturating_sub(r.requests);
    }
}

impl AgentPool {
    /// What this agent can be served ahead of another ticket per unit of virtual time, as
    /// dominant share and as requests, in 2⁻³² units (rounded up; see
    /// `coordinator/eta.rs`): a request of share `s` costs `(s + 1)·SCALE / w`, and at
    /// most `X·w·m / (SCALE·m − w)` of share in requests of share `m` fit in `X` of
    /// virtual time.
    pub(crate) fn rates(&self) -> Rates {
        if self.weight == 0 {
            return Rates::default();
        }
        let (w, m) = (u128::from(self.weight), u128::from(self.smallest.max(1)));
        let share = (SCALE * m)
            .checked_sub(w)
            .filter(|d| *d > 0)
            .and_then(|d| Some((w.checked_mul(m)? << 32).div_ceil(d)))
            .unwrap_or(u128::from(u64::MAX) << 32);
        Rates {
            share,
            requests: share.div_ceil(m),
        }
    }

    /// The virtual start kept for this agent's next request, if it comes back in time.
    pub(crate) fn held_vstart(&self, now: Millis) -> Option<u128> {
        self.held.filter(|h| now <= h.until).map(|h| h.vstart)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Agent {
    pub(crate) id: AgentId,
    pub(crate) last_seen: Millis,
    pub(crate) last_settle: Option<Millis>,
    pub(crate) queued: u32,
    pub(crate) in_flight: u32,
    pub(crate) queued_since: Millis,
    pub(crate) last_failure: Option<u64>,
    pub(crate) repeats: u32,
    pub(crate) settled: u64,
    /// Settles that were samples of estimate error (calls that completed with the
    /// provider's usage report): what the moving averages below are over.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) samples: u64,
    pub(crate) input_error: u32,
    pub(crate) output_error: u32,
    /// The signed counterparts of `input_error` and `output_error`: estimate above the
    /// actual figure positive.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub(crate) input_bias: i32,
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub(crate) output_bias: i32,
    pub(crate) misses: u32,
    pub(crate) alerting: bool,
    /// Absolute input-estimate errors (thousandths) of its latest completed calls: the
    /// alert watches their median.
    #[serde(default, skip_serializing_if = "History::is_empty")]
    pub(crate) errors: History,
    /// A wait the core told one of its calls to sit out with no ticket (a refusal, a 429,
    /// an overload), until it asks again or settles: what tells "blocked" from "quiet".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) waiting: Option<Waiting>,
    /// The root of the family it belongs to, when another agent is (its latest request's
    /// `family`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) family: Option<AgentId>,
    pub(crate) pools: Vec<AgentPool>,
}

/// What a call of the agent waits out with no ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WaitKind {
    Refused,
    RateLimited,
    BackingOff,
}

/// A wait without a ticket, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiting {
    pub(crate) kind: WaitKind,
    pub(crate) until: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) axis: Option<RateAxis>,
}

impl Agent {
    pub(crate) fn new(id: AgentId, now: Millis, pools: usize) -> Agent {
        Agent {
            id,
            last_seen: now,
            last_settle: None,
            queued: 0,
            in_flight: 0,
            queued_since: now,
            last_failure: None,
            repeats: 0,
            settled: 0,
            samples: 0,
            input_error: 0,
            output_error: 0,
            input_bias: 0,
            output_bias: 0,
            misses: 0,
            alerting: false,
            errors: History::default(),
            waiting: None,
            family: None,
            pools: alloc::vec![AgentPool::default(); pools],
        }
    }

    pub(crate) fn cache_cold(&self, pool: u32, now: Millis) -> bool {
        self.pools
            .get(pool as usize)
            .and_then(|p| p.cache_warm_until)
            .is_none_or(|w| now >= w)
    }

    /// Notes a request at `now`: the agent was seen, and a failure signature equal to the
    /// previous one counts as a repeat (which lowers its weight); any other resets it.
    #[inline]
    pub(crate) fn note_request(&mut self, now: Millis, failure_signature: Option<u64>) {
        self.last_seen = now;
        // Asking again ends whatever wait it was told to sit out.
        self.waiting = None;
        match failure_signature {
            Some(sig) if self.last_failure == Some(sig) => {
                self.repeats = self.repeats.saturating_add(1);
            }
            sig => {
                self.last_failure = sig;
                self.repeats = 0;
            }
        }
    }

    /// Notes a settled lease: the slot is free, the prompt cache is warm until
    /// `cache_warm_until` when the call used it, and, when the settle is a
    /// [`Sample::Completed`] call, the estimate errors move. Returns the agent's
    /// moving-average input error when it has just started alerting.
    #[inline]
    pub(crate) fn record_settle(
        &mut self,
        now: Millis,
        pool: u32,
        cache_warm_until: Option<Millis>,
        (charged, actual): (&Demand, &Demand),
        sample: Sample,
        (alert, keep_outputs): (&AlertConfig, u32),
    ) -> Option<u32> {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.last_seen = now;
        self.last_settle = Some(now);
        self.waiting = None;
        self.settled = self.settled.saturating_add(1);
        if let (Some(until), Some(ap)) = (cache_warm_until, self.pools.get_mut(pool as usize)) {
            ap.cache_warm_until = Some(until);
        }
        // A call the provider refused, one that ended without a usage report, or a report
        // of nothing at all says nothing about how good the estimate was.
        let reported = actual.get(Axis::InputTokens) > 0 || actual.get(Axis::OutputTokens) > 0;
        if sample != Sample::Completed || !reported {
            return None;
        }
        let (input, output) = (Axis::InputTokens, Axis::OutputTokens);
        let in_err = error_permille(charged.get(input), actual.get(input));
        let out_err = error_permille(charged.get(output), actual.get(output));
        let signed = |axis: Axis, err: u32| {
            let e = i32::try_from(err).unwrap_or(i32::MAX);
            if charged.get(axis) < actual.get(axis) {
                -e
            } else {
                e
            }
        };
        let (in_bias, out_bias) = (signed(input, in_err), signed(output, out_err));
        self.samples = self.samples.saturating_add(1);
        let first = self.samples == 1;
        let ewma = |old: u32, x: u32| {
            if first {
                x
            } else {
                ((u64::from(old) * 7 + u64::from(x)) / 8) as u32
            }
        };
        self.input_error = ewma(self.input_error, in_err);
        self.output_error = ewma(self.output_error, out_err);
        let ewma_signed = |old: i32, x: i32| {
            if first {
                x
            } else {
                // |x| ≤ 10^6, so the sum stays far inside i64 and the result inside i32.
                i32::try_from((i64::from(old) * 7 + i64::from(x)) / 8).unwrap_or(x)
            }
        };
        self.input_bias = ewma_signed(self.input_bias, in_bias);
        self.output_bias = ewma_signed(self.output_bias, out_bias);
        if let Some(ap) = self.pools.get_mut(pool as usize) {
            ap.outputs.push(
                actual.get(output),
                usize::try_from(keep_outputs).unwrap_or(1),
            );
        }
        // The alert watches the median of the latest completed calls' errors: one call far
        // off (a new conversation, a pasted file) does not raise it, an estimator that keeps
        // missing does.
        let window = usize::try_from(alert.samples).unwrap_or(1);
        self.errors.push(u64::from(in_err), window);
        if self.errors.len() < window {
            return None;
        }
        if self
            .errors
            .median_above(u64::from(alert.threshold_permille))
        {
            self.misses = self.misses.saturating_add(1);
            if self.misses >= alert.consecutive && !self.alerting {
                self.alerting = true;
                let median = self.errors.median().unwrap_or(u64::MAX);
                return Some(u32::try_from(median).unwrap_or(u32::MAX));
            }
        } else {
            self.misses = 0;
            self.alerting = false;
        }
        None
    }

    fn is_idle(&self) -> bool {
        self.queued == 0 && self.in_flight == 0
    }
}

/// Whether a settle is a sample of estimate error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sample {
    /// The call completed and the usage is the provider's report
    /// ([`crate::Coordinator::settle`]).
    Completed,
    /// The provider refused the call (a non-2xx response settled by
    /// [`crate::Coordinator::call_response`]): it read nothing, so no prompt cache was
    /// written either; the usage (none) is the core's rule, not a measure.
    Refused,
    /// It ended without a usage report ([`crate::Coordinator::call_interrupted`]): the
    /// usage is the core's rule, not a measure.
    Interrupted,
}

/// How far an estimate missed, in thousandths of the actual figure (at most 1000×).
pub(crate) fn error_permille(estimate: u64, actual: u64) -> u32 {
    let diff = estimate.abs_diff(actual);
    let e = match diff.checked_mul(1000) {
        // The common case, without a 128-bit division.
        Some(d) => u128::from(d / actual.max(1)),
        None => u128::from(diff) * 1000 / u128::from(actual.max(1)),
    };
    u32::try_from(e.min(1_000_000)).unwrap_or(1_000_000)
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "Stored")]
pub(crate) struct Agents {
    slots: Vec<Option<Agent>>,
    free: Vec<u32>,
    index: BTreeMap<AgentId, u32>,
    /// Per pool: derived from the agents, so neither stored (recomputed when a table is
    /// read back) nor compared.
    #[serde(skip)]
    shares: Vec<Shares>,
    /// Per family root: how many agents in the table name it as their family (derived,
    /// like `shares`). A root with none here has no members besides itself.
    #[serde(skip)]
    families: BTreeMap<AgentId, u32>,
}

/// The stored form of [`Agents`]: everything but the derived sums.
#[derive(Deserialize)]
struct Stored {
    slots: Vec<Option<Agent>>,
    free: Vec<u32>,
    index: BTreeMap<AgentId, u32>,
}

impl From<Stored> for Agents {
    fn from(s: Stored) -> Agents {
        let mut a = Agents {
            slots: s.slots,
            free: s.free,
            index: s.index,
            shares: Vec::new(),
            families: BTreeMap::new(),
        };
        a.shares = a.computed_shares();
        a.families = a.computed_families();
        a
    }
}

impl PartialEq for Agents {
    fn eq(&self, other: &Agents) -> bool {
        (&self.slots, &self.free, &self.index) == (&other.slots, &other.free, &other.index)
    }
}

impl Eq for Agents {}

impl Agents {
    /// The sums over every agent in pool `p`.
    pub(crate) fn shares(&self, p: u32) -> Shares {
        self.shares.get(p as usize).copied().unwrap_or_default()
    }

    /// The agent in `slot`'s state in pool `p`, with the pool's sums (added if the table
    /// has none for it yet).
    fn pool_parts(&mut self, slot: u32, p: u32) -> Option<(&mut AgentPool, &mut Shares)> {
        let i = p as usize;
        if self.shares.len() <= i {
            self.shares.resize(i.saturating_add(1), Shares::default());
        }
        let ap = self
            .slots
            .get_mut(slot as usize)?
            .as_mut()?
            .pools
            .get_mut(i)?;
        Some((ap, self.shares.get_mut(i)?))
    }

    /// The family counts as the agents say they are.
    fn computed_families(&self) -> BTreeMap<AgentId, u32> {
        let mut out = BTreeMap::new();
        for f in self.values().filter_map(|a| a.family) {
            *out.entry(f).or_insert(0u32) += 1;
        }
        out
    }

    /// Sets the family of the agent in `slot` (`None`, or its own id: it is a root).
    pub(crate) fn set_family(&mut self, slot: u32, family: Option<AgentId>) {
        let Some(a) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        let family = family.filter(|f| *f != a.id);
        if a.family == family {
            return;
        }
        if let Some(old) = core::mem::replace(&mut a.family, family) {
            leave(&mut self.families, old);
        }
        if let Some(new) = family {
            *self.families.entry(new).or_insert(0) += 1;
        }
    }

    /// How many agents name the agent in `slot` as their family's root and were seen at or
    /// after `since` (its subagents at work): 0 at once for an agent no one names.
    pub(crate) fn members_seen(&self, slot: u32, since: Millis) -> u32 {
        let Some(me) = self.get(slot) else {
            return 0;
        };
        if !self.families.contains_key(&me.id) {
            return 0;
        }
        let n = self
            .values()
            .filter(|a| a.family == Some(me.id) && a.last_seen >= since)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// How many members of the family of the agent in `slot` have a call queued or in
    /// flight, counting that agent as one whatever it has: 1 for an agent with no family.
    pub(crate) fn family_live(&self, slot: u32) -> u32 {
        let Some(me) = self.get(slot) else {
            return 1;
        };
        let root = me.family.unwrap_or(me.id);
        if !self.families.contains_key(&root) {
            return 1;
        }
        let live = self
            .values()
            .filter(|a| a.id != me.id && a.family.unwrap_or(a.id) == root)
            .filter(|a| a.queued > 0 || a.in_flight > 0)
            .count();
        u32::try_from(live).unwrap_or(u32::MAX).saturating_add(1)
    }

    /// The sums as the agents say they are, one per pool any agent knows.
    fn computed_shares(&self) -> Vec<Shares> {
        let pools = self.values().map(|a| a.pools.len()).max().unwrap_or(0);
        let mut out = alloc::vec![Shares::default(); pools];
        for a in self.values() {
            for (sh, ap) in out.iter_mut().zip(&a.pools) {
                sh.add(ap.rates());
                sh.asking = sh.asking.saturating_add(u32::from(ap.weight > 0));
                if ap.held.is_some() {
                    sh.held = sh.held.saturating_add(1);
                }
            }
        }
        out
    }

    /// Notes an ask in pool `p` with this weight and dominant share. Returns how much what
    /// the agent can be served per unit of virtual time grew (a higher weight, a smaller
    /// call, or a first ask), and whether it is a first ask (it may also be served a
    /// small-call lead): what the queued tickets' bounds assumed too little of. `None` when
    /// nothing grew.
    pub(crate) fn note_ask(
        &mut self,
        slot: u32,
        p: u32,
        weight: u128,
        share: u64,
    ) -> Option<(Rates, bool)> {
        let (ap, sh) = self.pool_parts(slot, p)?;
        let weight = u64::try_from(weight).unwrap_or(u64::MAX);
        let unit = share.saturating_add(1);
        let smallest = if ap.smallest == 0 {
            unit
        } else {
            ap.smallest.min(unit)
        };
        if (weight, smallest) == (ap.weight, ap.smallest) {
            return None;
        }
        let was = ap.rates();
        sh.sub(was);
        let first = ap.weight == 0 && weight > 0;
        sh.asking = sh.asking.saturating_add(u32::from(first));
        ap.weight = weight;
        ap.smallest = smallest;
        let now = ap.rates();
        sh.add(now);
        let grew = Rates {
            share: now.share.saturating_sub(was.share),
            requests: now.requests.saturating_sub(was.requests),
        };
        (grew != Rates::default() || first).then_some((grew, first))
    }

    /// Keeps a place in pool `p`'s fair order for the agent in `slot`.
    pub(crate) fn hold(&mut self, slot: u32, p: u32, held: Held) {
        if let Some((ap, sh)) = self.pool_parts(slot, p) {
            if ap.held.replace(held).is_none() {
                sh.held = sh.held.saturating_add(1);
            }
        }
    }

    /// Gives up the place kept in pool `p` for the agent in `slot`, if any.
    pub(crate) fn unhold(&mut self, slot: u32, p: u32) {
        if let Some((ap, sh)) = self.pool_parts(slot, p) {
            if ap.held.take().is_some() {
                sh.held = sh.held.saturating_sub(1);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of the agent with this id.
    pub(crate) fn find(&self, id: AgentId) -> Option<u32> {
        self.index.get(&id).copied()
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&Agent> {
        self.slots.get(slot as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut Agent> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// Adds an agent whose id is not in the table; returns its slot.
    pub(crate) fn insert(&mut self, agent: Agent) -> u32 {
        let id = agent.id;
        let slot = match self.free.pop() {
            Some(s) => {
                if let Some(o) = self.slots.get_mut(s as usize) {
                    *o = Some(agent);
                }
                s
            }
            None => {
                self.slots.push(Some(agent));
                u32::try_from(self.slots.len().saturating_sub(1)).unwrap_or(u32::MAX)
            }
        };
        self.index.insert(id, slot);
        slot
    }

    /// The agent with this id, added (with `pools` pools) if it is new; when the table holds
    /// `max` agents, the idle one least recently seen makes room. `None` when every agent
    /// is busy.
    #[inline]
    pub(crate) fn find_or_add(
        &mut self,
        id: AgentId,
        now: Millis,
        pools: usize,
        max: u32,
    ) -> Option<(u32, &mut Agent)> {
        let slot = match self.find(id) {
            Some(slot) => slot,
            None => {
                if self.len() >= max as usize {
                    self.evict_idle()?;
                }
                self.insert(Agent::new(id, now, pools))
            }
        };
        self.get_mut(slot).map(|a| (slot, a))
    }

    /// Removes the idle agent least recently seen (ties: lowest id); `None` if every agent
    /// is busy.
    pub(crate) fn evict_idle(&mut self) -> Option<AgentId> {
        let (slot, id) = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().filter(|a| a.is_idle()).map(|a| (i, a)))
            .min_by_key(|(_, a)| (a.last_seen, a.id))
            .map(|(i, a)| (i, a.id))?;
        if let Some(gone) = self.slots.get_mut(slot).and_then(Option::take) {
            if let Some(f) = gone.family {
                leave(&mut self.families, f);
            }
            for (sh, ap) in self.shares.iter_mut().zip(&gone.pools) {
                sh.sub(ap.rates());
                sh.asking = sh.asking.saturating_sub(u32::from(ap.weight > 0));
                if ap.held.is_some() {
                    sh.held = sh.held.saturating_sub(1);
                }
            }
        }
        self.free.push(u32::try_from(slot).unwrap_or(u32::MAX));
        self.index.remove(&id);
        Some(id)
    }

    /// Every agent with its slot, in slot order.
    pub(crate) fn slots(&self) -> impl Iterator<Item = (u32, &Agent)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, a)| Some((u32::try_from(i).ok()?, a.as_ref()?)))
    }

    /// Every agent, in slot order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Agent> {
        self.slots.iter().filter_map(Option::as_ref)
    }

    /// Every agent, in id order.
    /// (slot, agent) in id order.
    pub(crate) fn slots_in_id_order(&self) -> impl Iterator<Item = (u32, &Agent)> {
        self.index
            .values()
            .filter_map(|s| self.get(*s).map(|a| (*s, a)))
    }

    /// Structural check used on restore: the index and the slab name each other one to
    /// one, and the free list holds each empty slot exactly once.
    pub(crate) fn is_consistent(&self) -> bool {
        let occupied = self.slots.iter().filter(|s| s.is_some()).count();
        if occupied != self.index.len() || occupied + self.free.len() != self.slots.len() {
            return false;
        }
        let index_ok = self
            .index
            .iter()
            .all(|(id, s)| self.get(*s).is_some_and(|a| a.id == *id));
        let mut seen = alloc::vec![false; self.slots.len()];
        let free_ok = self.free.iter().all(|f| {
            let i = *f as usize;
            let empty = self.slots.get(i).is_some_and(Option::is_none);
            match seen.get_mut(i) {
                Some(s) if empty && !*s => {
                    *s = true;
                    true
                }
                _ => false,
            }
        });
        let computed = self.computed_shares();
        let shares_ok = (0..computed.len().max(self.shares.len())).all(|p| {
            let p = u32::try_from(p).unwrap_or(u32::MAX);
            let want = computed.get(p as usize).copied().unwrap_or_default();
            self.shares(p) == want
        });
        index_ok && free_ok && shares_ok && self.families == self.computed_families()
    }
}

/// One member fewer names `root` as its family.
fn leave(families: &mut BTreeMap<AgentId, u32>, root: AgentId) {
    if let Some(n) = families.get_mut(&root) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            families.remove(&root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: u64, last_seen: u64) -> Agent {
        Agent::new(AgentId(id), Millis(last_seen), 1)
    }

    #[test]
    fn per_pool_shares_follow_asks_holds_evictions_and_reads_back() {
        let mut t = Agents::default();
        let a = t.insert(agent(1, 0));
        let b = t.insert(agent(2, 5));
        assert_eq!(t.shares(0), Shares::default(), "nobody has asked");
        t.note_ask(a, 0, 1_000, 1_499);
        let one = t.shares(0).rates;
        // Weight 1 in requests of share 1,500: just over 1/1,000,000 of share per unit.
        assert_eq!(
            one.share,
            ((1_000u128 * 1_500) << 32).div_ceil(1_000_000 * 1_500 - 1_000)
        );
        assert_eq!(one.requests, one.share.div_ceil(1_500));
        t.note_ask(b, 0, 2_000, 99);
        t.note_ask(a, 0, 1_000, 5_000); // bigger than its smallest: nothing changes
        assert_eq!(
            t.shares(0).rates.share,
            one.share + t.get(b).map_or(0, |x| x.pools[0].rates().share)
        );
        t.hold(
            b,
            0,
            Held {
                vstart: 7,
                until: Millis(100),
            },
        );
        t.hold(
            b,
            0,
            Held {
                vstart: 8,
                until: Millis(100),
            },
        );
        assert_eq!(t.shares(0).held, 1, "one agent holds one place");
        assert!(t.is_consistent());
        let back: Agents = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back.shares(0), t.shares(0), "recomputed when read back");
        assert!(back.is_consistent());
        t.unhold(b, 0);
        t.unhold(b, 0);
        assert_eq!(t.shares(0).held, 0);
        assert_eq!(t.evict_idle(), Some(AgentId(1)));
        assert_eq!(
            t.shares(0).rates,
            t.get(b).map(|x| x.pools[0].rates()).unwrap()
        );
        assert!(t.is_consistent());
        t.slots[b as usize].as_mut().unwrap().pools[0].weight = 3_000;
        assert!(
            !t.is_consistent(),
            "a sum that disagrees with the agents is caught"
        );
    }

    #[test]
    fn eviction_takes_the_least_recently_seen_idle_agent_then_the_lowest_id() {
        let mut t = Agents::default();
        t.insert(agent(5, 10));
        t.insert(agent(3, 10));
        let busy = t.insert(agent(1, 1));
        t.insert(agent(9, 20));
        if let Some(a) = t.get_mut(busy) {
            a.in_flight = 1;
        }
        assert_eq!(t.evict_idle(), Some(AgentId(3)));
        assert_eq!(t.evict_idle(), Some(AgentId(5)));
        assert_eq!(t.evict_idle(), Some(AgentId(9)));
        assert_eq!(t.evict_idle(), None, "only a busy agent is left");
        assert!(t.is_consistent());
    }

    #[test]
    fn freed_slots_are_reused_and_iteration_follows_ids() {
        let mut t = Agents::default();
        for id in [7, 2, 4] {
            t.insert(agent(id, u64::from(id == 2)));
        }
        assert_eq!(t.evict_idle(), Some(AgentId(4)));
        let slot = t.insert(agent(1, 5));
        assert_eq!(slot, 2, "the freed slot is reused");
        let ids: Vec<u64> = t.slots_in_id_order().map(|(_, a)| a.id.0).collect();
        assert_eq!(ids, [1, 2, 7]);
        assert_eq!(t.find(AgentId(7)), Some(0));
        assert_eq!(t.find(AgentId(4)), None);
        assert!(t.is_consistent());
    }

    #[test]
    fn corrupt_tables_are_detected() {
        let mut t = Agents::default();
        t.insert(agent(1, 0));
        t.insert(agent(2, 0));
        t.evict_idle();
        assert!(t.is_consistent());

        let mut dup = t.clone();
        dup.free.push(0);
        dup.slots.push(None);
        assert!(!dup.is_consistent(), "a free slot listed twice");

        let mut wrong = t.clone();
        wrong.index.insert(AgentId(2), 0);
        assert!(!wrong.is_consistent(), "index names another agent's slot");

        let mut out = t.clone();
        out.free = alloc::vec![9];
        assert!(!out.is_consistent(), "free slot out of range");
    }
}
