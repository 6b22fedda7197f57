//! The coordinator: one owner of a provider quota. This file holds the state, time and
//! the grants from the line; beside it: a request's decision (`decide.rs`), the end of a
//! lease (`settle.rs`), the call lifecycle (`call.rs`), provider feedback
//! (`feedback.rs`), promises and backfill (`promise.rs`), expected waits (`eta.rs`), a
//! request's weight (`weigh.rs`), tasks (`tasks.rs`), metrics assembly (`report.rs`),
//! snapshot and restore (`snapshot.rs`) and the invariant checker (`check.rs`). Pools are
//! in `pool.rs`, the fair queue in `queue.rs`, virtual time in `weight.rs`, the metrics'
//! types in `metrics.rs`.
//!
//! The crate's modules import in one direction, with no circle: `time`, `ids`, `error`,
//! `headers`, `history` and `rng` at the bottom; then `bucket`, `config`, `request`,
//! `decision`, `call`, `metrics`, `queue`, `lease`, `weight`, `tasks`, `agents`, `pool`;
//! the coordinator on top, and `protocol` over it.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::agents::Agents;
use crate::bucket::{Axis, Demand};
use crate::config::{Config, Counting};
use crate::decision::Event;
use crate::error::LeaseError;
use crate::ids::LeaseId;
use crate::ids::PoolId;
use crate::lease::{Bump, Entry, Fair, LeaseTable, Phase};
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::queue::Key;
use crate::request::charge;
use crate::rng::Rng;
use crate::tasks::{Tasks, Tokens};
use crate::time::Millis;
use crate::weight::{place_cost, virtual_cost};

/// The most a wait is taken to exceed its refill time by, thousandths (100×), in what the
/// expected waits learn.
const RATIO_CAP: u128 = 100_000;

mod call;
mod check;
mod decide;
mod eta;
pub(crate) mod feedback;
mod promise;
mod report;
mod settle;
mod snapshot;
mod tasks;
mod weigh;

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
                    promised,
                    revising,
                    ..
                },
            ..
        }) = self.leases.by_slot(slot)
        else {
            return;
        };
        if revising {
            self.close_revision(id, promised);
        }
        let lag = self.config.feedback.arrival_ms;
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return;
        };
        debug_assert_eq!(
            pool.queue.peek_min().map(|(k, _, _)| k),
            Some(key),
            "the head"
        );
        let (queued, in_flight) = (pool.queue.len(), pool.in_flight);
        pool.queue.pop_head();
        pool.vtime = pool.vtime.max(vstart);
        let phase = pool.admit(demand, (now, ttl, lag), window);
        debug_assert_eq!(pool.queue.len() + 1, queued, "the head left the line");
        debug_assert_eq!(pool.in_flight, in_flight + 1, "and holds a slot");
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
            .map(|(pool, cfg)| report::pool_metrics(pool, cfg, &self.agents, now, window))
            .collect();
        Metrics {
            now,
            pools,
            agents: {
                let expected = self.expected_grants();
                self.agents
                    .slots_in_id_order()
                    .map(|(slot, a)| report::agent_metrics(a, now, expected.get(&slot).copied()))
                    .collect()
            },
            live_leases: self.leases.live(),
            tasks: self.task_metrics(now),
        }
    }
}
