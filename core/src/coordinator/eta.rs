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
use crate::bucket::{Axis, Demand};
use crate::lease::{LeaseId, Phase};
use crate::time::Millis;

impl Coordinator {
    /// When the queued ticket `lease` is expected to be granted: when the pool's refill
    /// covers the demand queued ahead of it in the fair order and its own, as things stand
    /// now (no pause past `now`'s, nobody overtaking it, every reservation as asked).
    /// Granted tickets' refunds make it earlier, later arrivals that overtake it later; a
    /// wait for a concurrency slot is not in it. It is what a wait is announced as (the
    /// checkpoint flag follows it); the queued decision's `eta` stays the bound. `None`
    /// when `lease` is not a queued ticket.
    #[must_use]
    pub fn expected_grant(&self, lease: LeaseId) -> Option<Millis> {
        let entry = self.leases.get(lease)?;
        let Phase::Queued { key, .. } = entry.phase else {
            return None;
        };
        let pool = self.pools.get(entry.pool as usize)?;
        let ahead = pool.queue.demand_before(key);
        let own = self.queued_demand(entry.pool, lease)?;
        Some(pool.eta(self.now, &ahead.saturating_add(own), self.config.window_ms))
    }

    /// The demand a queued ticket waits for in line (its reservation as `drain` would
    /// compute it now, each axis at most its capacity).
    fn queued_demand(&self, p: u32, lease: LeaseId) -> Option<Demand> {
        let entry = self.leases.get(lease)?;
        let counting = self.config.pools.get(p as usize)?.counting;
        let cold = self
            .agents
            .get(entry.agent_slot)
            .is_none_or(|a| a.cache_cold(p, self.now));
        let pool = self.pools.get(p as usize)?;
        Some(pool.within_caps(&crate::request::charge(counting, &entry.ask, cold)))
    }

    /// Per agent slot, the expected grant of its first ticket in the fair order of any
    /// pool (the earliest), for the metrics.
    pub(super) fn expected_grants(&self) -> alloc::collections::BTreeMap<u32, Millis> {
        let mut out = alloc::collections::BTreeMap::new();
        let window = self.config.window_ms;
        for pool in &self.pools {
            let mut ahead = Demand::default();
            for (slot, demand) in pool.queue.demands_in_order() {
                ahead = ahead.saturating_add(demand);
                let Some(entry) = self.leases.by_slot(slot) else {
                    continue;
                };
                let at = pool.eta(self.now, &ahead, window);
                out.entry(entry.agent_slot)
                    .and_modify(|t: &mut Millis| *t = (*t).min(at))
                    .or_insert(at);
            }
        }
        out
    }

    /// The most the agents in pool `p` other than the one in slot `me` can be served
    /// ahead of a ticket finishing at virtual time `vfinish`, if each keeps the weight and
    /// the smallest size it has asked with so far.
    pub(super) fn overtaking(&self, p: u32, me: u32, vfinish: u128, now: Millis) -> Demand {
        let mut from = self.pools.get(p as usize).map_or(0, |pool| pool.vtime);
        let shares = self.agents.shares(p);
        if shares.held > 0 {
            for (slot, a) in self.agents.slots() {
                if let Some(h) = a.pools.get(p as usize).and_then(|ap| ap.held_vstart(now)) {
                    if slot != me {
                        from = from.min(h);
                    }
                }
            }
        }
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
        let share = amount(shares.rates.share.saturating_sub(mine.share));
        let requests = amount(shares.rates.requests.saturating_sub(mine.requests));
        let Some(pool) = self.pools.get(p as usize) else {
            return Demand::default();
        };
        let mut out = pool.demand_of_share(share);
        let r = Axis::Requests.index();
        out.0[r] = out.0[r].min(requests);
        out
    }
}
