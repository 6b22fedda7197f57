//! The ETA of a queued ticket as an upper bound: the demand queued ahead of it, its own,
//! and everything the other agents known to the pool can still be served before it under
//! weighted fair queueing.
//!
//! A ticket with virtual finish `F` is served after every request with a smaller virtual
//! finish and before every request with a larger one. Another agent's next request starts
//! at its kept place, or at the larger of the pool's virtual time `V` and its own latest
//! virtual finish, so no earlier than `V₀` (the smaller of `V` and every kept place);
//! each of its requests costs `(t + 1)·10⁶ / w` of virtual time (rounded down). So what it
//! can have served ahead of `F` weighs at most `X` combined tokens, where
//! `X·10⁶/w − n ≤ F − V₀` for its `n ≤ X/m` requests of at least `m` tokens each:
//!
//! ```text
//! X ≤ (F − V₀)·w·m / (10⁶·m − w)        requests ≤ X / m
//! ```
//!
//! The per-agent rates `w·m / (10⁶·m − w)` and `… / m` are kept summed per pool (updated
//! when an agent's weight or smallest size changes, or it leaves the table), so the bound
//! costs O(1); only while some agent in the pool holds a place is `V₀` found by a walk over
//! the agents. `X` is added on every token axis (a request's input or output tokens are at
//! most its combined reservation) and the request count on the requests axis; the ETA is
//! when the pool's refill covers the total.

use super::Coordinator;
use crate::bucket::{Axis, Demand};
use crate::time::Millis;

impl Coordinator {
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
        let tokens = amount(shares.rates.tokens.saturating_sub(mine.tokens));
        let requests = amount(shares.rates.requests.saturating_sub(mine.requests));
        let mut out = Demand::default();
        for axis in [Axis::InputTokens, Axis::OutputTokens, Axis::Tokens] {
            out.0[axis.index()] = tokens;
        }
        out.0[Axis::Requests.index()] = requests;
        out
    }
}
