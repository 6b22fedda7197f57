//! The ETA of a queued ticket as an upper bound: the demand queued ahead of it, its own,
//! and everything the other agents known to the pool can still be served before it under
//! weighted fair queueing.
//!
//! A ticket with virtual finish `F` is served after every request with a smaller virtual
//! finish and before every request with a larger one. Another agent's next request starts
//! at its kept place, or at the larger of the pool's virtual time `V` and its own latest
//! virtual finish, so no earlier than `V₀` (the smaller of `V` and every kept place);
//! each of its requests costs `(s + 1)·10⁶ / w` of virtual time (rounded down), `s` its
//! dominant share (parts per 10⁹ of the limit that binds it, see `Pool::dominant_share`).
//! So what it can have served ahead of `F` has a total share of at most `X`, where
//! `X·10⁶/w − n ≤ F − V₀` for its `n ≤ X/m` requests of share at least `m` each:
//!
//! ```text
//! X ≤ (F − V₀)·w·m / (10⁶·m − w)        requests ≤ X / m
//! ```
//!
//! The per-agent rates `w·m / (10⁶·m − w)` and `… / m` are kept summed per pool (updated
//! when an agent's weight or smallest share changes, or it leaves the table), so the bound
//! costs O(1); only while some agent in the pool holds a place is `V₀` found by a walk over
//! the agents. A total share `X` is at most `X` parts of each axis's limit (a request's
//! share is its largest on any axis), which is added on every axis, the requests axis at
//! most the request count; the ETA is when the pool's refill covers the total. (A settle
//! that corrects an agent's virtual finish to what it used keeps this true of what it
//! used; the bound assumes, as the crate's does, that usage equals the reservation.)

use super::Coordinator;

/// How many waits of its size a pool learns from before its expected waits follow them.
const LEARNED: usize = 8;
use crate::bucket::{Axis, Demand};
use crate::ids::LeaseId;
use crate::lease::Phase;
use crate::time::Millis;

impl Coordinator {
    /// When the queued ticket `lease` is expected to be granted: the refill time of the
    /// demand queued ahead of it in the fair order and its own (as things stand: no pause
    /// past `now`'s, every reservation as asked), scaled by how the waits of the pool's
    /// latest tickets of its size (small or big: see `weights.small_lead_permille`) came
    /// out against theirs — which counts what the line does not show: calls placed ahead of
    /// it later (agents asking again with an earlier place, a higher weight), refunds of
    /// reservations, small calls let through — and never after its promise. Until the pool
    /// has seen eight such waits, the refill time and what the agents asking now can still
    /// be placed ahead of it (each its weight's share of the virtual time from where its
    /// next call starts to the ticket's place) at the rate the pool hands its limit out. A
    /// wait for a concurrency slot is not in it. It is what a wait is announced as (the
    /// checkpoint flag follows it); the queued decision's `eta` stays the bound. `None`
    /// when `lease` is not a queued ticket.
    #[must_use]
    pub fn expected_grant(&self, lease: LeaseId) -> Option<Millis> {
        self.grant_at(lease, 500)
    }

    /// [`Coordinator::expected_grant`] at the `permille`-th percentile of the learned waits
    /// (the median for the expected grant; a high one for whether to checkpoint, so that a
    /// wait that may well turn out long is flagged).
    pub(super) fn grant_at(&self, lease: LeaseId, permille: u32) -> Option<Millis> {
        let entry = self.leases.get(lease)?;
        let Phase::Queued { key, promised, .. } = entry.phase else {
            return None;
        };
        let p = entry.pool;
        let pool = self.pools.get(p as usize)?;
        let window = self.config.window_ms;
        let own = pool.within_caps(&self.queued_demand(p, lease)?);
        let ahead = pool.queue.demand_before(key);
        let refill = pool
            .eta(self.now, &ahead.saturating_add(own), window)
            .since(self.now);
        let ratios = &pool.wait_ratios[usize::from(!entry.fair.small)];
        let ms = match ratios
            .percentile(permille)
            .filter(|_| ratios.len() >= LEARNED)
        {
            Some(r) => {
                let scaled = u128::from(refill) * u128::from(r) / 1000;
                u64::try_from(scaled).unwrap_or(u64::MAX)
            }
            None => refill.saturating_add(self.placed_later(p, entry.agent_slot, key.vfinish)),
        };
        Some(self.now.plus(ms).min(promised.max(self.now)))
    }

    /// What the agents asking in pool `p` (within a rate window), other than the one in
    /// `me`, can still be placed ahead of virtual time `vfinish`, as the ms the pool takes
    /// to hand that share of its limit out at its margin: each its weight's share of the
    /// virtual time from where its next call starts.
    fn placed_later(&self, p: u32, me: u32, vfinish: u128) -> u64 {
        let Some(pool) = self.pools.get(p as usize) else {
            return 0;
        };
        let window = self.config.window_ms;
        let since = Millis(self.now.0.saturating_sub(window));
        let mut share: u128 = 0;
        for (slot, a) in self.agents.slots() {
            if slot == me || a.last_seen < since {
                continue;
            }
            let Some(ap) = a.pools.get(p as usize).filter(|ap| ap.weight > 0) else {
                continue;
            };
            let span = vfinish.saturating_sub(pool.vtime.max(ap.last_vfinish));
            share = share
                .saturating_add(span.saturating_mul(u128::from(ap.weight)) / crate::weight::SCALE);
        }
        let rate = u128::from(crate::bucket::SHARE_UNIT) * u128::from(pool.margin.max(1)) / 1000;
        u64::try_from(share.saturating_mul(u128::from(window)) / rate.max(1)).unwrap_or(u64::MAX)
    }

    /// The demand a queued ticket waits for in line (its reservation as `drain` would
    /// compute it now).
    fn queued_demand(&self, p: u32, lease: LeaseId) -> Option<Demand> {
        let entry = self.leases.get(lease)?;
        let counting = self.config.pools.get(p as usize)?.counting;
        let cold = self
            .agents
            .get(entry.agent_slot)
            .is_none_or(|a| a.cache_cold(p, self.now));
        Some(crate::request::charge(counting, &entry.ask, cold))
    }

    /// Per agent slot, the expected grant of its first ticket in each pool's fair order
    /// (the earliest over pools), for the metrics: one estimate per agent and pool, not
    /// one per ticket.
    pub(super) fn expected_grants(&self) -> alloc::collections::BTreeMap<u32, Millis> {
        let mut out = alloc::collections::BTreeMap::new();
        let mut seen = alloc::collections::BTreeSet::new();
        for pool in &self.pools {
            seen.clear();
            for (_, slot) in pool.queue.in_order() {
                let Some(entry) = self.leases.by_slot(slot) else {
                    continue;
                };
                if !seen.insert(entry.agent_slot) {
                    continue;
                }
                let Some(at) = self.expected_grant(entry.id) else {
                    continue;
                };
                out.entry(entry.agent_slot)
                    .and_modify(|t: &mut Millis| *t = (*t).min(at))
                    .or_insert(at);
            }
        }
        out
    }

    /// The most the agents in pool `p` other than the one in slot `me` can be served
    /// ahead of a ticket finishing at virtual time `vfinish`, if each keeps the weight and
    /// the smallest size it has asked with so far and none starts earlier than virtual time
    /// `from` (see [`super::promise::Held`]): the demand, and the number of requests.
    pub(super) fn overtaking_from(
        &self,
        p: u32,
        me: u32,
        vfinish: u128,
        from: u128,
    ) -> (Demand, u64) {
        let shares = self.agents.shares(p);
        let mine = self
            .agents
            .get(me)
            .and_then(|a| a.pools.get(p as usize))
            .map(crate::agents::AgentPool::rates)
            .unwrap_or_default();
        let span = vfinish.saturating_sub(from);
        let amount = |rate: u128| {
            let fixed = span.saturating_mul(rate);
            u64::try_from(fixed.div_ceil(1 << 32)).unwrap_or(u64::MAX)
        };
        // Each of them may also be served its small calls' lead beyond its place.
        let me_asking = self
            .agents
            .get(me)
            .and_then(|a| a.pools.get(p as usize))
            .is_some_and(|ap| ap.weight > 0);
        let others = u64::from(shares.asking.saturating_sub(u32::from(me_asking)));
        let lead = crate::weight::small_lead(self.config.weights).saturating_mul(others);
        let share = amount(shares.rates.share.saturating_sub(mine.share)).saturating_add(lead);
        let requests = amount(shares.rates.requests.saturating_sub(mine.requests));
        let Some(pool) = self.pools.get(p as usize) else {
            return (Demand::default(), 0);
        };
        let mut out = pool.demand_of_share(share);
        let r = Axis::Requests.index();
        out.0[r] = out.0[r].min(requests);
        (out, requests)
    }
}
