//! The coordinator: one owner of a provider quota. This file holds the state and the
//! lease protocol (request, settle, cancel, time); beside it are provider feedback
//! (`feedback.rs`), snapshot and restore (`snapshot.rs`) and the invariant checker
//! (`check.rs`). Pools are in `pool.rs`, the fair queue in `queue.rs`, weights in
//! `weight.rs`, metrics assembly in `metrics.rs`.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::agents::{Agents, Held, Sample};
use crate::bucket::{Axis, Demand};
use crate::config::{Config, Counting, Families};
use crate::decision::{Decision, Event, RejectReason, Settlement};
use crate::error::LeaseError;
use crate::ids::{AgentId, PoolId};
use crate::lease::{Ask, Bump, Entry, Fair, LeaseId, LeaseTable, Phase};
use crate::metrics::{self, Metrics};
use crate::pool::Pool;
use crate::queue::Key;
use crate::request::{LeaseRequest, Usage, charge, output_reserve, used};
use crate::rng::Rng;
use crate::tasks::{TaskId, TaskSpec, Tasks, Tokens};
use crate::time::Millis;
use crate::weight::{pending_bump, place_cost, small, virtual_cost, weight};

/// The most a wait is taken to exceed its refill time by, thousandths (100×), in what the
/// expected waits learn.
const RATIO_CAP: u128 = 100_000;

mod call;
mod check;
mod eta;
pub(crate) mod feedback;
pub(crate) mod promise;
mod snapshot;
mod tasks;

pub use snapshot::Snapshot;

/// The quota coordinator: a deterministic state machine with no clock, no I/O and no
/// ambient randomness. See the crate documentation for the calling protocol.
///
/// It serializes as its whole state ([`Coordinator::snapshot`]); deserializing one checks
/// that state as [`Coordinator::restore`] does (the configuration, then every table
/// against every other), so a forged or corrupted state is an error, never a coordinator
/// that panics later.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "snapshot::State")]
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
    #[serde(default)]
    tasks: Tasks,
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
            tasks: Tasks::default(),
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

    /// `pool` as an index into the pool table (and the configuration's pools, which it
    /// mirrors one to one: [`Coordinator::check`]), or `UnknownPool`.
    fn pool_index(&self, pool: PoolId) -> Result<u32, LeaseError> {
        if (pool.0 as usize) < self.pools.len() {
            Ok(pool.0)
        } else {
            Err(LeaseError::UnknownPool)
        }
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
        while let Some((id, bump)) = self.leases.pop_bump(now) {
            self.bump_queued(id, bump, now);
        }
        for p in 0..self.pools.len() {
            self.drain(u32::try_from(p).unwrap_or(u32::MAX), now);
        }
        self.watch_margins(now);
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
        if let Some(t) = entry.task {
            // Reaped unsettled: the reservation is what it is charged.
            let reserved = charged.get(Axis::Tokens);
            let tokens = Tokens {
                total: reserved,
                limited: reserved,
            };
            self.tasks.lease_ended(t, tokens, now);
        }
        self.events.push_back(Event::Expired {
            lease: id,
            agent: entry.agent,
            pool: PoolId(entry.pool),
        });
    }

    /// Grants what pool `p`'s queue can be granted now, then keeps its promises (see
    /// `coordinator/promise.rs`): the end of every input that moves the pool.
    fn drain(&mut self, p: u32, now: Millis) {
        self.grant_from_queue(p, now);
        self.keep_promises(p, now);
    }

    /// Grants queued tickets of pool `p` in virtual-finish order while the head fits.
    fn grant_from_queue(&mut self, p: u32, now: Millis) {
        let ttl = self.config.lease_ttl_ms;
        // At the end of time a lease would be born expired: nothing is granted.
        if now.plus(ttl) <= now {
            return;
        }
        loop {
            let Some(pool) = self.pools.get(p as usize) else {
                return;
            };
            if !pool.can_admit(now, ttl) {
                return;
            }
            let Some((key, _, slot)) = pool.queue.peek_min() else {
                return;
            };
            let Some(demand) = self.queued_charge(p, slot, now) else {
                return;
            };
            if !self.pools[p as usize].fits(&demand, self.config.window_ms) {
                return;
            }
            self.grant_queued(p, (key, slot), demand, now);
        }
    }

    /// What queued ticket `slot` of pool `p` is charged if granted at `now` (its prompt
    /// cache may have gone cold while it waited).
    fn queued_charge(&self, p: u32, slot: u32, now: Millis) -> Option<Demand> {
        let e = self.leases.by_slot(slot)?;
        let counting = self.counting(p)?;
        let cold = self
            .agents
            .get(e.agent_slot)
            .is_none_or(|a| a.cache_cold(p, now));
        Some(charge(counting, &e.ask, cold))
    }

    /// Grants queued ticket `slot` (its `key` in the queue) of pool `p` at `now`, charged
    /// `demand`: the head of the line.
    fn grant_queued(&mut self, p: u32, (key, slot): (Key, u32), demand: Demand, now: Millis) {
        let (window, ttl) = (self.config.window_ms, self.config.lease_ttl_ms);
        // The fields the grant needs, not a copy of the whole entry.
        let Some(&Entry {
            id,
            agent,
            agent_slot,
            task,
            fair,
            phase:
                Phase::Queued {
                    vstart,
                    enqueued_at,
                    in_line_ms,
                    ..
                },
            ..
        }) = self.leases.by_slot(slot)
        else {
            return;
        };
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return;
        };
        debug_assert_eq!(
            pool.queue.peek_min().map(|(k, _, _)| k),
            Some(key),
            "the head"
        );
        pool.queue.pop_head();
        pool.vtime = pool.vtime.max(vstart);
        let phase = pool.admit(demand, now, ttl, window);
        let waited_ms = now.since(enqueued_at);
        pool.waits.record(waited_ms);
        if in_line_ms > 0 {
            let ratio = u128::from(waited_ms) * 1000 / u128::from(in_line_ms);
            let ratio = u64::try_from(ratio.min(RATIO_CAP)).unwrap_or(u64::MAX);
            pool.wait_ratios[usize::from(!fair.small)].push(ratio, crate::history::CAPACITY);
        }
        if let Some(m) = pool.minute(now) {
            m.waited_ms = m.waited_ms.saturating_add(waited_ms);
        }
        pool.counters.granted_from_queue = pool.counters.granted_from_queue.saturating_add(1);
        let expires_at = now.plus(ttl);
        self.leases.schedule_bump(id, None);
        self.leases.activate(id, phase);
        self.leases
            .push_expiry(expires_at, id, self.config.max_leases);
        if let Some(a) = self.agents.get_mut(agent_slot) {
            a.queued = a.queued.saturating_sub(1);
            a.in_flight = a.in_flight.saturating_add(1);
            if let Some(ap) = a.pools.get_mut(p as usize) {
                ap.served = true;
            }
        }
        if let Some(t) = task.and_then(|t| self.tasks.get_mut(t)) {
            t.wait(waited_ms);
            t.calls = t.calls.saturating_add(1);
        }
        self.events.push_back(Event::Granted {
            lease: id,
            agent,
            pool: PoolId(p),
            expires_at,
            waited_ms,
        });
    }

    /// A queued ticket's agent's prompt cache has come within the bump window (or was due
    /// to): its place is recomputed as if it had asked now, with the bump, from the virtual
    /// start it has (it only moves ahead). A cache refreshed since is rescheduled; one gone
    /// cold earns nothing.
    fn bump_queued(&mut self, id: LeaseId, bump: Bump, now: Millis) {
        let window = self.config.weights.cache_bump_window_ms;
        let Some(&Entry {
            agent_slot,
            pool: p,
            ask,
            phase: Phase::Queued { key, vstart, .. },
            ..
        }) = self.leases.get(id)
        else {
            return;
        };
        let Some(agent) = self.agents.get(agent_slot) else {
            return;
        };
        let Some(warm_until) = agent.pools.get(p as usize).and_then(|a| a.cache_warm_until) else {
            return;
        };
        if now >= warm_until {
            return;
        }
        if warm_until.since(now) > window {
            let at = Millis(warm_until.0.saturating_sub(window));
            self.leases.schedule_bump(id, Some(Bump { at, ..bump }));
            return;
        }
        // Queued warm (a bump is only scheduled then), so its demand in the queue is the
        // warm one.
        let counting = self.counting(p).unwrap_or_default();
        let demand = charge(counting, &ask, false);
        let weight = u128::from(bump.weight);
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return;
        };
        let share = pool.dominant_share(&demand);
        // The same placing, at the bumped weight.
        let old = self.leases.get(id).map(|e| e.fair).unwrap_or_default();
        let fair = Fair {
            weight: bump.weight,
            cost: virtual_cost(share, weight),
            ..old
        };
        let place = vstart.saturating_add(place_cost(share, &fair, self.config.weights));
        if place >= key.vfinish {
            return;
        }
        let Some(slot) = pool.queue.remove(key) else {
            return;
        };
        let new = Key {
            vfinish: place,
            seq: key.seq,
        };
        // In line as cold (see `decide`).
        let cold = charge(counting, &ask, true);
        pool.queue.insert(new, cold, slot);
        // It went ahead of tickets whose bounds did not count it: they wait at most its
        // refill longer.
        pool.revise_for_debt(&cold, self.config.window_ms);
        let mut was = key.vfinish;
        if let Some(Entry {
            phase: Phase::Queued { key: k, .. },
            fair: f,
            ..
        }) = self.leases.get_mut(id)
        {
            *k = new;
            if f.weight > 0 {
                was = vstart.saturating_add(f.cost);
            }
            *f = fair;
        }
        if let Some(ap) = self
            .agents
            .get_mut(agent_slot)
            .and_then(|a| a.pools.get_mut(p as usize))
        {
            // Its clocks move by the bumped cost instead (a small call's own clock too).
            let by = was.saturating_sub(vstart.saturating_add(fair.cost));
            if fair.small && ap.last_small == was {
                ap.last_small = vstart.saturating_add(fair.cost);
            }
            ap.last_vfinish = ap.last_vfinish.saturating_sub(by);
        }
        self.agents.note_ask(agent_slot, p, weight, share);
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
        match retry_at {
            Some(retry_at) => Decision::Reject { retry_at, reason },
            None => Decision::NeverFits { reason },
        }
    }

    /// When to come back after a transient refusal: `hint` (the head's grant, a lease's
    /// expiry) if known and ahead, else one backoff base from now (a concurrency slot or
    /// an agent slot frees when some call settles, which the core cannot foresee).
    fn transient_retry(&self, now: Millis, hint: Option<Millis>) -> Millis {
        hint.filter(|t| *t > now)
            .unwrap_or_else(|| now.plus(self.config.backoff.base_ms))
    }

    /// A transient refusal of a request that fits the pool: the agent keeps the request's
    /// place in the fair order (`vstart`) until a rate window after `retry_at`, so coming
    /// back then it is not at the back of the line (see [`Coordinator::request_lease`]).
    fn refuse(
        &mut self,
        p: u32,
        agent_slot: u32,
        vstart: u128,
        now: Millis,
        retry_at: Millis,
        reason: RejectReason,
    ) -> Decision {
        let until = retry_at.plus(self.config.window_ms);
        self.agents.hold(agent_slot, p, Held { vstart, until });
        self.reject(p, now, Some(retry_at), reason)
    }

    /// Asks for capacity before a model call. Returns a [`Decision`]; errors only for a
    /// pool that does not exist or figures above 2^53 − 1 (state unchanged then).
    ///
    /// In order: the agent is found (or added); a request that cannot fit a whole window
    /// is rejected, as is one past the lease table's bound; a request at the head of the
    /// fair order that fits is granted; otherwise it joins the queue, unless the queue is
    /// full or the wait would pass `max_queue_wait_ms`.
    ///
    /// # No starvation
    ///
    /// A transient refusal (`wait_too_long`, `queue_full`, `too_many_leases`) keeps the
    /// request's place in the fair order (and so does a queued ticket's withdrawal, see
    /// [`Coordinator::cancel`]): the agent's next request in that pool, if it
    /// comes within a rate window after `retry_at`, starts at the virtual time the refused
    /// one had instead of at the back, and it is not refused as a wait too long again: it
    /// is queued whatever its wait (only a full queue or lease table can still refuse it).
    /// So a request that fits the pool and is asked again at each `retry_at` is granted
    /// within
    ///
    /// ```text
    /// wait ≤ (S + Σᵢ (P·wᵢ/w + sᵢ + eᵢ)) · window / (margin · 10⁹)
    /// ```
    ///
    /// where `S` is its dominant share (+1): its largest share of a known limit across the
    /// rate axes — input, output, combined tokens, requests — in parts per 10⁹ of that
    /// limit (a call of 2,000 output tokens on a 12,000 output-tokens-a-minute key has a
    /// share of 166,666,667 whatever its input), `P` the share its place in line accounts
    /// for (`S`, or for its agent's first call in the pool at most the quantum `Q`,
    /// `weights.quantum_permille` of a limit: the agent pays the whole share through its
    /// next place), `w` its weight, and the sum runs over the other agents asking meanwhile
    /// (weight `wᵢ`, largest share `sᵢ`, and `eᵢ` how far the first call of one that joins
    /// meanwhile exceeds the quantum, 0 for the others), under these
    /// assumptions: settled usage equals the reservation (no debt), the limits and margin
    /// do not change, no 429 pauses the pool, and weights are as at the first ask (a
    /// warm-cache bump given while a ticket waits, see `weights.cache_bump`, is a weight
    /// change: it moves that ticket ahead). (Weighted fair queueing, with a call's virtual
    /// cost `(s + 1)·10⁶ / w` from its dominant share `s`: each other agent can be served
    /// at most its weight's share of the span of virtual time up to this request's place,
    /// plus one request it had started and the excess of a first call placed before this
    /// one; what they are served together is then at most `S + Σᵢ (P·wᵢ/w + sᵢ + eᵢ)` parts
    /// of *every* axis's limit, which each axis refills at `margin · 10⁹` parts a window.
    /// Without the quantum a leaf agent that joins with a big call would wait for
    /// everyone's share of its whole size: a 20k-token call at weight 1 among 35 agents of
    /// weights 1 to 3 on a 120k-a-minute key, about 12 minutes; placed by a quantum of 1 %,
    /// about one round of the others' calls.) A settle corrects the agent's virtual finish to the
    /// share the call used (see [`Coordinator::settle`]), so an agent pays in line for what
    /// it consumed of what binds. `core/tests/starvation.rs` checks the bound over arbitrary
    /// mixes of other agents; a big request among forty looping small ones, which a refusal
    /// used to send to the back every time, is now granted within it.
    ///
    /// # The ETA is a promise
    ///
    /// A queued decision's `eta` is when the pool's refill covers the demand queued ahead
    /// of the ticket (each in full, as it will be charged), its own (at most the capacity:
    /// a call above it is granted from a full bucket), and everything every other agent
    /// asking in the pool could still be served ahead of it in the fair order: at most
    /// `(F − V₀)·w·m / (10⁶·m − w)` of dominant share — that many parts per 10⁹ of every
    /// limit — for an agent of weight `w` whose smallest ask had a share of `m`, plus the
    /// lead its small calls may take (`weights.small_lead_permille` of a limit, see
    /// below), where `F` is the ticket's virtual finish and `V₀` the earliest virtual start
    /// any other agent's next request can have (the pool's virtual time, or a kept place
    /// before it). While every concurrency slot is held it is also no earlier than the
    /// expiry of the lease in flight that frees a slot for it at the latest. The sums it
    /// needs are kept per pool, so it costs O(1) (a walk over the agents only while one
    /// holds a place). The promise is that bound plus an eighth of the wait to it: the
    /// headroom absorbs small debts (below) without a revision, where a promise exactly at
    /// its bound would be revised by every one.
    ///
    /// The core keeps it: no ticket is granted after the promise it holds, provided the
    /// host wakes at [`Coordinator::poll_timeout`]. What the bound cannot assume — a call
    /// that settles above its reservation, the provider's figures below the model, a 429's
    /// pause or margin cut, a capacity change, an agent that joins or asks with a higher
    /// weight or a smaller call, a warm-cache bump, a lease renewed past the expiry a
    /// promise counted on — re-issues the promise, at that instant, as an
    /// [`Event::Revised`] once the delays it has met since it was made exceed its headroom:
    /// the old promise moved by the most the events can delay it (a debt of `d` tokens on an
    /// axis refilling `c` a window, `d · window / c`), or the new bound if earlier, with
    /// headroom again; a ticket still waiting for a slot when its promise comes is promised the
    /// slot's expiry then. `core/tests/simulation.rs` (a thousand seeds of crashes, 429s
    /// and calls above their reservations) and `core/tests/promises.rs` (a saturated fleet
    /// whose output runs 30–100 % of `max_tokens`) check that no grant comes after its
    /// promise.
    ///
    /// The bound is what a host can rely on; what it should expect is
    /// [`Coordinator::expected_grant`], which the call step's `Wait::expected` carries.
    /// `max_queue_wait_ms` is compared with the refill time of the demand queued ahead, so
    /// a ticket can be queued with an `eta` past it.
    ///
    /// # Small calls and backfill
    ///
    /// A call whose dominant share is at most a quantum starts up to
    /// `weights.small_lead_permille` of a limit of virtual time before its agent's latest
    /// virtual finish (and after its previous small call's), so an agent's short calls
    /// are not queued behind its own big one's share. And a call that fits when it asks
    /// goes around tickets waiting for refill (backfill) where every ticket ahead of it
    /// would still be granted by its promise, a concurrency slot stays free, its agent is
    /// within that lead of the head's start, and it is within the first 64 of the line.
    ///
    /// # Tasks
    ///
    /// A request naming a `task` is charged to it (see [`Coordinator::open_task`]): a task
    /// not open yet is opened with the request's role and unblocks while fewer than three
    /// quarters of `max_tasks` are open (else the request runs untracked, counted in
    /// `metrics().tasks.untracked`; see [`Coordinator::open_task`]).
    /// A refusal starts the task's quota wait, which the next ask ends; a queued ticket's
    /// wait is added when it is granted or withdrawn.
    pub fn request_lease(
        &mut self,
        now: Millis,
        req: &LeaseRequest,
    ) -> Result<Decision, LeaseError> {
        let p = self.pool_index(req.pool)?;
        req.check_sizes()?;
        let now = self.advance(now);
        let task = self.task_for(req, now);
        let decision = self.decide(p, now, req, task);
        self.keep_promises(p, now);
        if let Some(t) = task {
            self.tasks.end_wait(t, now);
            match decision {
                Decision::Grant { .. } => {
                    if let Some(t) = self.tasks.get_mut(t) {
                        t.calls = t.calls.saturating_add(1);
                    }
                }
                Decision::Reject { .. } => self.tasks.start_wait(t, now),
                Decision::Queued { .. } | Decision::NeverFits { .. } => {}
            }
        }
        Ok(decision)
    }

    /// The open task a request is charged to, opened if new and there is room.
    fn task_for(&mut self, req: &LeaseRequest, now: Millis) -> Option<TaskId> {
        let task = req.task?;
        let spec = TaskSpec {
            task,
            role: req.role,
            unblocks: req.unblocks,
        };
        let bounds = (self.config.max_tasks, self.config.task_idle_ms);
        if self.tasks.open(&spec, now, bounds, false).is_some() {
            Some(task)
        } else {
            self.tasks.untracked = self.tasks.untracked.saturating_add(1);
            None
        }
    }

    /// [`Coordinator::request_lease`]'s decision, once the request is checked and time
    /// moved to `now`.
    fn decide(
        &mut self,
        p: u32,
        now: Millis,
        req: &LeaseRequest,
        task: Option<TaskId>,
    ) -> Decision {
        let counting = self.config.pools[p as usize].counting;
        let pools = self.pools.len();
        let found = self
            .agents
            .find_or_add(req.agent, now, pools, self.config.max_agents)
            .map(|(slot, _)| slot);
        let Some(agent_slot) = found else {
            // An agent becomes idle, and can make room, when a lease of its ends.
            let retry_at = self.transient_retry(now, self.leases.next_expiry());
            return self.reject(p, now, Some(retry_at), RejectReason::TooManyAgents);
        };
        // A family shares one place: its members with calls in line split its weight.
        self.agents.set_family(agent_slot, req.family);
        let members = match self.config.weights.families {
            Families::Shared => u128::from(self.agents.family_live(agent_slot)),
            Families::Flat => 1,
        };
        let Some(agent) = self.agents.get_mut(agent_slot) else {
            return self.reject(p, now, None, RejectReason::TooManyAgents);
        };
        agent.note_request(now, req.failure_signature);
        let own = agent
            .pools
            .get(p as usize)
            .map(|a| a.outputs)
            .unwrap_or_default();
        let pool = &self.pools[p as usize];
        let ask = req.ask(output_reserve(
            counting,
            &self.config.output_reserve,
            (&own, &pool.outputs),
            req.max_tokens,
            pool.bucket(Axis::OutputTokens).limit,
        ));
        let demand = charge(counting, &ask, agent.cache_cold(p, now));
        let share = self.pools[p as usize].dominant_share(&demand);
        // An agent's first call in the pool (none of its calls granted here yet: a refused
        // or withdrawn ask keeps that) is placed by at most a quantum of its share (see
        // `weights.quantum_permille`).
        let first = agent.pools.get(p as usize).is_none_or(|a| !a.served);
        let weight = (weight(
            &self.config.weights,
            req,
            agent,
            task.and_then(|t| self.tasks.get(t)),
            now,
        ) / members)
            .max(1);
        let (last_vfinish, last_small, held, warm_until) =
            agent.pools.get(p as usize).map_or((0, 0, None, None), |a| {
                (
                    a.last_vfinish,
                    a.last_small,
                    a.held_vstart(now),
                    a.cache_warm_until,
                )
            });
        if let Some(grew) = self.agents.note_ask(agent_slot, p, weight, share) {
            // The queued tickets' bounds counted less of this agent.
            self.revise_for_rates(p, grew, now);
        }

        // Refused for its size only if even the warm-cache charge is above a limit: the
        // provider serves a call whose uncached part fits (a long conversation's cached
        // prefix is not counted), so a cold-cache estimate above the limit is no reason to
        // refuse it. (A ticket whose cache goes cold while it waits is granted from a full
        // bucket, its queued demand being at most the capacity.)
        let pool = &self.pools[p as usize];
        let least = charge(counting, &ask, false);
        if let Some(axis) = pool.exceeds_limit(&least) {
            return self.reject(p, now, None, RejectReason::ExceedsCapacity { axis });
        }

        // A request refused earlier comes back to the place it had; any other starts where
        // the pool's virtual time is, or after the agent's previous request — a call no
        // bigger than a quantum after the agent's previous such call (see `weight::small`).
        let w = self.config.weights;
        let is_small = small(share, w);
        let after = if is_small {
            let lead = virtual_cost(crate::weight::small_lead(w), weight);
            last_small.max(last_vfinish.saturating_sub(lead))
        } else {
            last_vfinish
        };
        let vstart = held.unwrap_or_else(|| pool.vtime.max(after));
        if self.leases.live() >= self.config.max_leases {
            let retry_at = self.transient_retry(now, self.leases.next_expiry());
            return self.refuse(
                p,
                agent_slot,
                vstart,
                now,
                retry_at,
                RejectReason::TooManyLeases,
            );
        }
        // The agent pays its whole share (its next request starts at `vfinish`); a first
        // call is placed in line by at most a quantum of it.
        let fair = Fair {
            weight: u64::try_from(weight).unwrap_or(u64::MAX),
            cost: virtual_cost(share, weight),
            first,
            small: is_small,
        };
        let vfinish = vstart.saturating_add(fair.cost);
        let key = Key {
            vfinish: vstart.saturating_add(place_cost(share, &fair, w)),
            seq: self.seq,
        };
        let (ttl, window) = (self.config.lease_ttl_ms, self.config.window_ms);
        let first_in_line = pool.queue.peek_min().is_none_or(|(head, _, _)| key < head);
        let admit_now = pool.can_admit(now, ttl) && pool.fits(&demand, window);
        // Behind a head that waits for refill, a call that fits now goes first where every
        // promise ahead of it stands (see `Coordinator::backfill`).
        let backfill = admit_now
            && !first_in_line
            && self.may_backfill(p, (key, vstart, fair.weight), &demand, now);
        if admit_now && (first_in_line || backfill) {
            let pool = &mut self.pools[p as usize];
            let phase = pool.admit(demand, now, ttl, window);
            // With nobody waiting, virtual time moves to this grant's finish, so an agent
            // gains no credit from earlier uncontended use and owes none to late comers; a
            // backfill leaves it to the calls in line.
            if !backfill {
                pool.vtime = pool.vtime.max(if pool.queue.is_empty() {
                    vfinish
                } else {
                    vstart
                });
            }
            pool.counters.granted_now = pool.counters.granted_now.saturating_add(1);
            let lease = self.insert_lease(
                req.agent,
                agent_slot,
                p,
                ask,
                phase,
                (vfinish, fair),
                now,
                task,
            );
            let expires_at = now.plus(ttl);
            self.leases
                .push_expiry(expires_at, lease, self.config.max_leases);
            return Decision::Grant { lease, expires_at };
        }

        if pool.queue.len() >= self.config.max_queue_depth {
            let retry_at = self.transient_retry(now, self.pool_wake(p));
            return self.refuse(
                p,
                agent_slot,
                vstart,
                now,
                retry_at,
                RejectReason::QueueFull,
            );
        }
        // Insert first: the same walk gives the demand queued ahead, which sets the
        // expected wait. A ticket expected to wait too long is taken back out.
        let max_wait = self.config.max_queue_wait_ms;
        let pool = &mut self.pools[p as usize];
        // What it waits for in line, counted as if its prompt cache went cold while it
        // waits (the most it can be charged at its grant): the bounds of the tickets behind
        // it, and its own, hold whenever it is granted.
        // In the sums, as it will be charged: a ticket above a capacity is granted from a
        // full bucket and leaves the rest as debt the tickets behind it wait for; its own
        // wait is for a full bucket.
        let in_line = charge(counting, &ask, true);
        let inserted = pool.queue.insert(key, in_line, u32::MAX);
        let ahead = inserted.before.saturating_add(pool.within_caps(&in_line));
        let expected = pool.eta(now, &ahead, window);
        // A request back at its kept place is queued whatever its wait: it was already sent
        // away once, and coming back at `retry_at` is served.
        if expected.since(now) > max_wait && held.is_none() {
            pool.queue.undo_insert(key, inserted);
            let retry_at = Millis(expected.0.saturating_sub(max_wait)).max(now.plus(1));
            let reason = RejectReason::WaitTooLong;
            return self.refuse(p, agent_slot, vstart, now, retry_at, reason);
        }
        // Placed ahead of tickets already in line (a first call placed by a quantum, a
        // small call's lead, a higher weight): they wait at most its refill longer.
        if u64::from(pool.queue.len()) > inserted.before.get(Axis::Requests).saturating_add(1) {
            pool.revise_for_debt(&in_line, window);
        }
        // The promise: also what the other agents can still be served ahead of it, and the
        // concurrency slots the calls ahead of it need.
        let held = self.held(p, now);
        let rates = self.bound(p, (agent_slot, key.vfinish), &ahead, &held, now);
        let mut eta = promise::with_headroom(now, rates);
        // Every concurrency slot held: also when one frees for it at the latest.
        let pool = &self.pools[p as usize];
        if !pool.concurrency_free() {
            let n = usize::try_from(pool.in_flight).unwrap_or(usize::MAX);
            let slots = self.leases.expiries_in(p, n);
            let j = usize::try_from(inserted.before.get(Axis::Requests)).unwrap_or(usize::MAX);
            let ttl = self.config.lease_ttl_ms;
            eta = eta.max(promise::slot_frees(&slots, j, now, ttl));
        }
        let phase = Phase::Queued {
            key,
            vstart,
            enqueued_at: now,
            promised: eta,
            in_line_ms: expected.since(now),
            revising: false,
            checked: self.pools[p as usize].delay,
            budget: self.pools[p as usize]
                .delay
                .saturating_add(eta.since(rates)),
            bump: pending_bump(&self.config.weights, &ask, warm_until, weight, now),
        };
        let lease = self.insert_lease(
            req.agent,
            agent_slot,
            p,
            ask,
            phase,
            (vfinish, fair),
            now,
            task,
        );
        if let Phase::Queued { bump, .. } = phase {
            self.leases.schedule_bump(lease, bump);
        }
        let pool = &mut self.pools[p as usize];
        pool.queue.set_slot(inserted, LeaseTable::slot_of(lease));
        pool.counters.queued = pool.counters.queued.saturating_add(1);
        if let Some(m) = pool.minute(now) {
            m.queued = m.queued.saturating_add(1);
        }
        Decision::Queued { lease, eta }
    }

    /// Adds a granted lease or a queued ticket to the lease table and counts it on its
    /// agent, whose latest virtual finish in the pool it becomes.
    #[allow(clippy::too_many_arguments)] // one call's fields, read at both call sites
    #[inline]
    fn insert_lease(
        &mut self,
        agent: AgentId,
        agent_slot: u32,
        p: u32,
        ask: Ask,
        phase: Phase,
        (vfinish, fair): (u128, Fair),
        now: Millis,
        task: Option<TaskId>,
    ) -> LeaseId {
        self.seq = self.seq.saturating_add(1);
        let queued = matches!(phase, Phase::Queued { .. });
        let id = self.leases.insert(|id| Entry {
            id,
            agent,
            agent_slot,
            pool: p,
            ask,
            phase,
            task,
            fair,
        });
        if let Some(a) = self.agents.get_mut(agent_slot) {
            if queued {
                if a.queued == 0 {
                    a.queued_since = now;
                }
                a.queued = a.queued.saturating_add(1);
            } else {
                a.in_flight = a.in_flight.saturating_add(1);
            }
            if let Some(ap) = a.pools.get_mut(p as usize) {
                // Every call moves the agent's clock by its cost; a small one was placed by
                // the small calls' clock, which it moves, and moves the other from where it
                // was (or the start it was placed at, if later).
                if fair.small {
                    ap.last_small = vfinish;
                    let start = vfinish.saturating_sub(fair.cost);
                    ap.last_vfinish = ap.last_vfinish.max(start).saturating_add(fair.cost);
                } else {
                    ap.last_vfinish = vfinish;
                }
                ap.served |= !queued;
            }
        }
        self.agents.unhold(agent_slot, p);
        if let Some(t) = task {
            self.tasks.lease_began(t, now);
        }
        id
    }

    /// Reports what a granted lease really used. The difference from the reservation is
    /// refunded or charged at once (debt allowed), the concurrency slot is released, and
    /// queued tickets that now fit are granted (see [`Coordinator::poll_event`]).
    ///
    /// The agent's place in the fair order is corrected too: its latest virtual finish
    /// moves by the difference between the dominant share it was placed for and the one it
    /// used (back for a refund, forward for debt), so an agent that reserved `max_tokens`
    /// and used a fraction is not kept back as if it had used it all.
    ///
    /// This is the report of a call that completed with the provider's usage: it is a
    /// sample of estimate error (the agent's error figures in [`Coordinator::metrics`] and
    /// [`Event::EstimateAlert`]), unless it reports no tokens at all. A call the provider
    /// refused is settled by [`Coordinator::call_response`] and one that ended without a
    /// usage report by [`Coordinator::call_interrupted`]; neither is a sample, nor is a
    /// cancelled or expired lease.
    pub fn settle(
        &mut self,
        now: Millis,
        lease: LeaseId,
        usage: &Usage,
    ) -> Result<Settlement, LeaseError> {
        self.settle_as(now, lease, usage, Sample::Completed)
    }

    /// [`Coordinator::settle`], saying whether the usage is a sample of estimate error.
    pub(crate) fn settle_as(
        &mut self,
        now: Millis,
        lease: LeaseId,
        usage: &Usage,
        sample: Sample,
    ) -> Result<Settlement, LeaseError> {
        usage.check_sizes()?;
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
        let window = self.config.window_ms;
        // A call cannot use more of an axis than its limit allows in a window (a provider
        // refuses such a request): a larger figure is a wrong or hostile report, clamped so
        // it cannot put the pool in debt for ages.
        let actual = self.pools[p as usize].bounded_usage(used(counting, usage));
        if let Some(pool) = self.pools.get_mut(p as usize) {
            let excess = pool.reconcile(
                (&charged, gated, granted_at),
                (grant_level, now.since(granted_at)),
                &actual,
                window,
            );
            pool.revise_for_debt(&excess, window);
            pool.in_flight = pool.in_flight.saturating_sub(1);
            pool.counters.settled = pool.counters.settled.saturating_add(1);
            if let Some(m) = pool.minute(now) {
                m.used = m.used.saturating_add(actual);
            }
        }
        if let Some(t) = entry.task {
            // Every token the provider counted: under Anthropic counting the cache reads
            // are beside what counts against the limits; under OpenAI's they are in it.
            let limited = actual.get(Axis::Tokens);
            let reads = match counting {
                Counting::Anthropic => usage.cache_read_input_tokens,
                Counting::Openai => 0,
            };
            let tokens = Tokens {
                total: limited.saturating_add(reads),
                limited,
            };
            self.tasks.lease_ended(t, tokens, now);
        }
        self.correct_place(&entry, &actual);
        // A refused call never reached the model: its prefix was not cached by it.
        let cache_used = sample != Sample::Refused
            && (entry.ask.cached_prefix_tokens > 0
                || usage.cache_read_input_tokens > 0
                || usage.cache_creation_input_tokens > 0);
        let warm_until = cache_used.then(|| now.plus(self.config.prompt_cache_ttl_ms));
        let reported = actual.get(Axis::InputTokens) > 0 || actual.get(Axis::OutputTokens) > 0;
        let keep = self.config.output_reserve.samples;
        if sample == Sample::Completed && reported {
            if let Some(pool) = self.pools.get_mut(p as usize) {
                pool.outputs.push(
                    actual.get(Axis::OutputTokens),
                    usize::try_from(keep).unwrap_or(1),
                );
                // The margin's climb reads underestimates only: an estimate above what the
                // provider counted errs on the safe side (it was refunded) and holds
                // nothing back.
                let (reserved, used) = (
                    charged.get(Axis::InputTokens),
                    actual.get(Axis::InputTokens),
                );
                let under = if used > reserved {
                    crate::agents::error_permille(reserved, used)
                } else {
                    0
                };
                crate::pool::note_error(pool, under, self.config.margin.confirm_error_permille);
            }
        }
        if let Some(a) = self.agents.get_mut(entry.agent_slot) {
            let alert = (&self.config.estimate_alert, keep);
            if let Some(error_permille) =
                a.record_settle(now, p, warm_until, (&charged, &actual), sample, alert)
            {
                self.events.push_back(Event::EstimateAlert {
                    agent: entry.agent,
                    error_permille,
                });
            }
        }
        self.drain(p, now);
        Ok(Settlement {
            reserved: charged,
            used: actual,
        })
    }

    /// Withdraws a queued ticket, or gives back a granted lease whose call was never sent
    /// (everything it reserved is refunded). A withdrawn ticket's place in the fair order is
    /// kept for a rate window: the agent's next request in the pool starts where it stood,
    /// so a client that gave up waiting and asks again is not sent to the back.
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
        let mut withdrawn = None;
        match entry.phase {
            Phase::Queued {
                key,
                vstart,
                enqueued_at,
                ..
            } => {
                pool.queue.remove(key);
                if let Some(t) = entry.task.and_then(|t| self.tasks.get_mut(t)) {
                    t.wait(now.since(enqueued_at));
                }
                if let Some(t) = entry.task {
                    self.tasks.lease_ended(t, Tokens::default(), now);
                }
                if let Some(a) = agent {
                    a.queued = a.queued.saturating_sub(1);
                    // A withdrawn ticket received no service: if it was the agent's latest,
                    // its virtual finish goes back to where it started (and a small call's
                    // cost comes off the agent's other clock).
                    let finish = if entry.fair.weight == 0 {
                        key.vfinish
                    } else {
                        vstart.saturating_add(entry.fair.cost)
                    };
                    if let Some(ap) = a.pools.get_mut(p as usize) {
                        if entry.fair.small {
                            if ap.last_small == finish {
                                ap.last_small = vstart;
                            }
                            ap.last_vfinish = ap.last_vfinish.saturating_sub(entry.fair.cost);
                        } else if ap.last_vfinish == finish {
                            ap.last_vfinish = vstart;
                        }
                    }
                }
                withdrawn = Some(vstart);
            }
            Phase::Active {
                charged,
                gated,
                grant_level,
                granted_at,
                ..
            } => {
                let since = (grant_level, now.since(granted_at));
                let lease = (&charged, gated, granted_at);
                pool.reconcile(lease, since, &Demand::default(), window);
                pool.in_flight = pool.in_flight.saturating_sub(1);
                if let Some(a) = agent {
                    a.in_flight = a.in_flight.saturating_sub(1);
                }
                self.correct_place(&entry, &Demand::default());
                if let Some(t) = entry.task {
                    self.tasks.lease_ended(t, Tokens::default(), now);
                }
            }
        }
        // A client that gave up waiting (a timeout shorter than the wait, a user's Ctrl-C)
        // and asks again gets its place back: the withdrawn ticket's virtual start is kept
        // for a rate window, as for a refusal.
        if let Some(vstart) = withdrawn {
            let until = now.plus(window);
            self.agents
                .hold(entry.agent_slot, p, Held { vstart, until });
        }
        self.drain(p, now);
        Ok(())
    }

    /// A granted lease ended having used `used`: its agent's latest virtual finish in the
    /// pool moves by the difference between what that costs in the fair order and what the
    /// lease was placed for — back for a refund, forward for debt — so an agent pays in
    /// line for what it took of the limit that binds, not for what it reserved. (Its next
    /// request still starts no earlier than the pool's virtual time: a refund earns no
    /// credit against agents asking later.)
    fn correct_place(&mut self, entry: &Entry, used: &Demand) {
        let fair = entry.fair;
        if fair.weight == 0 {
            return;
        }
        let Some(pool) = self.pools.get(entry.pool as usize) else {
            return;
        };
        let cost = virtual_cost(pool.dominant_share(used), u128::from(fair.weight));
        let moved = |v: u128| {
            if cost >= fair.cost {
                v.saturating_add(cost - fair.cost)
            } else {
                v.saturating_sub(fair.cost - cost)
            }
        };
        if let Some(ap) = self
            .agents
            .get_mut(entry.agent_slot)
            .and_then(|a| a.pools.get_mut(entry.pool as usize))
        {
            ap.last_vfinish = moved(ap.last_vfinish);
            if fair.small {
                ap.last_small = moved(ap.last_small);
            }
        }
    }

    /// The operator holds a pool: nothing is granted from it until `until` (a key being
    /// rotated, a provider incident announced, a spend alarm). Leases already granted run
    /// on; queued tickets keep their places and are granted after the hold, like after a
    /// 429's pause (an ETA given before the hold does not count it). A hold only ever
    /// lengthens the pause in force and is bounded, like a provider's, by
    /// `feedback.max_pause_ms` from now: asking again extends it. Returns when grants
    /// resume; an [`Event::Paused`] is raised when the pause grew.
    ///
    /// `UnknownPool` for a pool that does not exist (nothing changes).
    pub fn hold(&mut self, now: Millis, pool: PoolId, until: Millis) -> Result<Millis, LeaseError> {
        let p = self.pool_index(pool)?;
        let now = self.advance(now);
        let until = until.min(now.plus(self.config.feedback.max_pause_ms));
        let Some(pl) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        if until > pl.paused_until {
            pl.pause_until(now, until);
            self.events.push_back(Event::Paused { pool, until });
        }
        let resumes = pl.paused_until.max(now);
        self.keep_promises(p, now);
        Ok(resumes)
    }

    /// Keeps a granted lease alive: its expiry moves to `now + lease_ttl_ms` (never
    /// earlier than it was) and the new expiry is returned. A host renews a lease while
    /// its call is still working (a streamed answer whose bytes still flow), so the
    /// reservation and the concurrency slot stay held until the call settles instead of
    /// being reaped at the first expiry. Time moves to `now` first, as for any input.
    ///
    /// `UnknownLease` for a lease that was never issued or has ended (settled, cancelled,
    /// or expired, including one whose expiry is due at `now`: renewing must come before
    /// it); `NotGranted` for a queued ticket (it holds nothing yet and cannot expire).
    /// The state is unchanged on an error.
    pub fn renew(&mut self, now: Millis, lease: LeaseId) -> Result<Millis, LeaseError> {
        match self.live(lease, now) {
            None => return Err(LeaseError::UnknownLease),
            Some(Entry {
                phase: Phase::Queued { .. },
                ..
            }) => return Err(LeaseError::NotGranted),
            Some(_) => {}
        }
        let now = self.advance(now);
        let ttl = self.config.lease_ttl_ms;
        let Some(Entry {
            phase: Phase::Active { expires_at, .. },
            ..
        }) = self.leases.get_mut(lease)
        else {
            return Err(LeaseError::UnknownLease);
        };
        let renewed = now.plus(ttl).max(*expires_at);
        if renewed == *expires_at {
            return Ok(renewed);
        }
        *expires_at = renewed;
        // Every expiry queued so far was set at or before `now` with the same TTL, so the
        // new one goes at the back and the queue stays in expiry order; the old entry no
        // longer matches the lease and is skipped (and pruned if it was the front).
        self.leases
            .push_expiry(renewed, lease, self.config.max_leases);
        self.leases.prune_expiries();
        // A slot held longer: a ticket whose promise counted on it is promised anew when
        // its promise comes (the host wakes then: `next_lapse`).
        let p = self.leases.get(lease).map_or(0, |e| e.pool);
        self.keep_promises(p, now);
        Ok(renewed)
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
            consider(self.next_lapse(u32::try_from(p).unwrap_or(u32::MAX)));
        }
        consider(self.next_floor_alert());
        consider(self.leases.next_bump());
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
        let mut e = self.events.pop_front()?;
        // A revision carries the ticket's promise as it is now: later revisions of the same
        // ticket were folded into this event rather than queued after it.
        if let Event::Revised { lease, eta, .. } = &mut e {
            if let Some(Phase::Queued {
                promised, revising, ..
            }) = self.leases.get_mut(*lease).map(|l| &mut l.phase)
            {
                if *revising {
                    *eta = *promised;
                    *revising = false;
                }
            }
        }
        Some(e)
    }

    /// How many events [`Coordinator::poll_event`] has to give now. A host that crosses a
    /// boundary per call (a binding) reads this after a call instead of polling for an event
    /// that is not there.
    ///
    /// ```
    /// use tokenwarden_core::{AgentId, Config, Coordinator, Decision, LeaseRequest, Millis, Usage};
    ///
    /// let config = r#"{"pools":[{"name":"p","requests_per_minute":60,"max_concurrent":1}]}"#;
    /// let mut c = Coordinator::new(Config::from_json(config).unwrap(), 1, Millis(0)).unwrap();
    /// let ask = |agent| LeaseRequest { agent: AgentId(agent), input_tokens: 10, max_tokens: 10, ..Default::default() };
    /// let Decision::Grant { lease, .. } = c.request_lease(Millis(0), &ask(1)).unwrap() else {
    ///     panic!("the first request is granted")
    /// };
    /// assert!(matches!(c.request_lease(Millis(1), &ask(2)).unwrap(), Decision::Queued { .. }));
    /// assert_eq!(c.pending_events(), 0);
    /// // The settle frees the one slot: the ticket is granted, and a `Granted` event waits.
    /// let used = Usage { input_tokens: 10, output_tokens: 5, ..Default::default() };
    /// c.settle(Millis(2), lease, &used).unwrap();
    /// assert_eq!(c.pending_events(), 1);
    /// assert!(c.poll_event().is_some());
    /// assert_eq!(c.pending_events(), 0);
    /// ```
    #[must_use]
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    /// Figures for dashboards and alerts, as of `now` (which only reads the clock value; no
    /// state moves).
    #[must_use]
    pub fn metrics(&self, now: Millis) -> Metrics {
        let now = self.now.max(now);
        let window = self.config.window_ms;
        let pools = self
            .pools
            .iter()
            .zip(&self.config.pools)
            .map(|(pool, cfg)| metrics::pool_metrics(pool, cfg, &self.agents, now, window))
            .collect();
        Metrics {
            now,
            pools,
            agents: {
                let expected = self.expected_grants();
                self.agents
                    .slots_in_id_order()
                    .map(|(slot, a)| metrics::agent_metrics(a, now, expected.get(&slot).copied()))
                    .collect()
            },
            live_leases: self.leases.live(),
            tasks: self.task_metrics(now),
        }
    }
}
