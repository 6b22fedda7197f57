//! Promises: a queued ticket's `eta` is a bound on its grant, and the core keeps it.
//!
//! The bound (see `eta.rs` and [`Coordinator::request_lease`]) is computed from the state:
//! the demand queued ahead of the ticket and its own, what every other agent can still be
//! served ahead of it in the fair order, and, while every concurrency slot is held, when
//! enough slots free for the calls ahead of it. It holds while nothing happens that it does
//! not assume. Some things it cannot assume away: a call that uses more than it reserved (its
//! output is reserved as a learned percentile, so about one call in twenty does), the
//! provider's figures below the model, a 429's pause, a margin cut, an agent that joins or
//! asks with a higher weight or a smaller call than it had, a warm-cache bump, a renewal
//! that keeps a slot past its expiry. Each marks the pool ([`Revise`]); at the end of the
//! input the core recomputes every queued ticket's bound from the state, and where it is
//! past the promise it re-issues the promise as an [`Event::Revised`] — at the instant of
//! the event, before the old promise passes — to the earlier of that bound and the old
//! promise moved by the most the event can delay it (debt of `d` tokens on an axis refilling
//! `c` a window: `d · window / c`). A promise replaced in time is kept: no ticket is granted
//! after the promise it holds when the host wakes at [`Coordinator::poll_timeout`].
//!
//! A promise is also what a backfill must respect ([`Coordinator::may_backfill`]): a call
//! that fits when it asks may go ahead of a head waiting for refill only where every ticket
//! ahead of it would still be granted by its promise.

use alloc::vec::Vec;

use super::Coordinator;
use crate::bucket::{Axis, Demand, product};
use crate::decision::Event;
use crate::ids::PoolId;
use crate::lease::Phase;
use crate::pool::Pool;
use crate::time::Millis;

/// What may have moved a pool's queued tickets past their promises during an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Revise {
    /// Debt the bound did not assume: every promise moves by at most this many ms.
    By(u64),
    /// Something else (a pause, a cut, a weight, a renewal): the bound from the state.
    Recompute,
}

impl Pool {
    /// Marks the pool's promises for the end of the input.
    pub(crate) fn revise(&mut self, r: Revise) {
        self.revise = Some(match (self.revise, r) {
            (Some(Revise::By(a)), Revise::By(b)) => Revise::By(a.saturating_add(b)),
            (None, r) => r,
            _ => Revise::Recompute,
        });
    }

    /// Debt of `excess` on the pool's axes that the bound did not assume (a call used more
    /// than it reserved, a level lowered to the provider's figure): it delays every grant
    /// by at most the time the most delayed axis takes to refill it.
    pub(crate) fn revise_for_debt(&mut self, excess: &Demand, window: u64) {
        let mut ms = 0u64;
        for a in Axis::ALL {
            let b = self.bucket(a);
            let d = excess.get(a);
            if d > 0 && b.gates() && b.cap > 0 {
                let t = (u128::from(d) * u128::from(window)).div_ceil(u128::from(b.cap));
                ms = ms.max(u64::try_from(t).unwrap_or(u64::MAX));
            }
        }
        if ms > 0 && !self.queue.is_empty() {
            self.revise(Revise::By(ms));
        }
    }
}

/// The two smallest places other agents hold in a pool's fair order (the earliest virtual
/// start another agent's next request can have is the pool's virtual time or one of
/// these): computed once for a pass over the queue.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    vtime: u128,
    least: Option<(u32, u128)>,
    second: Option<u128>,
}

impl Held {
    /// The earliest virtual start an agent other than the one in slot `me` can have.
    pub(super) fn floor_for(&self, me: u32) -> u128 {
        let held = match self.least {
            Some((slot, v)) if slot != me => Some(v),
            Some(_) => self.second,
            None => None,
        };
        held.map_or(self.vtime, |v| v.min(self.vtime))
    }
}

impl Coordinator {
    /// The places held in pool `p`'s fair order at `now` (see [`Held`]).
    pub(super) fn held(&self, p: u32, now: Millis) -> Held {
        let mut out = Held {
            vtime: self.pools.get(p as usize).map_or(0, |pool| pool.vtime),
            least: None,
            second: None,
        };
        if self.agents.shares(p).held == 0 {
            return out;
        }
        for (slot, a) in self.agents.slots() {
            let Some(v) = a.pools.get(p as usize).and_then(|ap| ap.held_vstart(now)) else {
                continue;
            };
            match out.least {
                Some((_, l)) if v >= l => out.second = Some(out.second.map_or(v, |s| s.min(v))),
                _ => {
                    out.second = out.least.map(|(_, l)| l);
                    out.least = Some((slot, v));
                }
            }
        }
        out
    }

    /// The bound on the grant of a ticket of the agent in slot `me` finishing at virtual
    /// time `vfinish`, with `ahead` the demand queued ahead of it and its own: when the
    /// pool's refill covers that and what the other agents can still be served ahead of it
    /// (see `eta.rs`). The rates only: while every concurrency slot is held, the caller
    /// also waits for one to free (see [`slot_frees`]).
    pub(super) fn bound(
        &self,
        p: u32,
        (me, vfinish): (u32, u128),
        ahead: &Demand,
        held: &Held,
        now: Millis,
    ) -> Millis {
        let Some(pool) = self.pools.get(p as usize) else {
            return now;
        };
        let (others, _) = self.overtaking_from(p, me, vfinish, held.floor_for(me));
        pool.eta(now, &ahead.saturating_add(others), self.config.window_ms)
    }

    /// Keeps pool `p`'s promises after an input that marked it (see the module doc): each
    /// queued ticket whose bound from the state is past its promise is promised the earlier
    /// of that bound and its old promise moved by the marked delay, as an
    /// [`Event::Revised`]. And while every concurrency slot is held (the bound counts the
    /// rates, not how long calls hold their slots, which the core cannot know), a ticket
    /// whose promise comes before a slot frees is promised, at that instant, the expiry of
    /// the lease in flight that frees a slot for it at the latest (the `j`-th earliest for
    /// the `j`-th in line; a lease TTL more for each round of the slots), or its bound if
    /// later: [`Coordinator::poll_timeout`] wakes the host then.
    pub(super) fn keep_promises(&mut self, p: u32, now: Millis) {
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return;
        };
        let by = pool.revise.take();
        let blocked = !pool.concurrency_free() && !pool.queue.is_empty();
        if pool.queue.is_empty() || (by.is_none() && !blocked) {
            return;
        }
        let pool = &self.pools[p as usize];
        let held = self.held(p, now);
        let slots = if blocked {
            let n = usize::try_from(pool.in_flight).unwrap_or(usize::MAX);
            self.leases.expiries_in(p, n)
        } else {
            Vec::new()
        };
        let ttl = self.config.lease_ttl_ms;
        let mut ahead = Demand::default();
        let mut revised = Vec::new();
        for (j, (slot, demand)) in pool.queue.demands_in_order().into_iter().enumerate() {
            // Its own wait is for at most a full bucket; the tickets behind it wait for all.
            let need = ahead.saturating_add(pool.within_caps(&demand));
            ahead = ahead.saturating_add(demand);
            let Some(e) = self.leases.by_slot(slot) else {
                continue;
            };
            let Phase::Queued { key, promised, .. } = e.phase else {
                continue;
            };
            let bound = self.bound(p, (e.agent_slot, key.vfinish), &need, &held, now);
            let mut eta = promised;
            if by.is_some() && bound > promised {
                eta = match by {
                    Some(Revise::By(ms)) if promised.plus(ms) >= now => {
                        bound.min(promised.plus(ms))
                    }
                    _ => bound,
                };
            }
            if blocked && eta <= now {
                eta = bound.max(slot_frees(&slots, j, now, ttl)).max(now.plus(1));
            }
            if eta > promised {
                revised.push((e.id, e.agent, eta));
            }
        }
        for (id, agent, eta) in revised {
            let Some(Phase::Queued {
                promised, revising, ..
            }) = self.leases.get_mut(id).map(|e| &mut e.phase)
            else {
                continue;
            };
            *promised = eta;
            // One event per ticket in the queue however often it is revised before the host
            // polls (it carries the promise in force then): the queue stays bounded by the
            // tickets, even when every agent of a large fleet joins at once.
            if !core::mem::replace(revising, true) {
                self.events.push_back(Event::Revised {
                    lease: id,
                    agent,
                    pool: PoolId(p),
                    eta,
                });
            }
        }
    }

    /// While every concurrency slot of pool `p` is held, the earliest promise of its queued
    /// tickets: when one may have to be replaced (see [`Coordinator::keep_promises`]).
    pub(super) fn next_lapse(&self, p: u32) -> Option<Millis> {
        let pool = self.pools.get(p as usize)?;
        if pool.concurrency_free() || pool.queue.is_empty() {
            return None;
        }
        pool.queue
            .in_order()
            .into_iter()
            .filter_map(|(_, slot)| match self.leases.by_slot(slot)?.phase {
                Phase::Queued { promised, .. } => Some(promised),
                Phase::Active { .. } => None,
            })
            .min()
    }

    /// How much more each axis of pool `p` can give away now with the ticket of the agent
    /// in slot `me` (finishing at virtual time `vfinish`, `ahead` queued ahead of it and
    /// its own) still granted by its promise `promised`: the refill up to the promise
    /// above what its bound needs, per axis, in tokens (`i128::MAX` on an axis that does
    /// not gate; negative past it).
    fn slack(
        &self,
        p: u32,
        (me, vfinish, promised): (u32, u128, Millis),
        ahead: &Demand,
        held: &Held,
        now: Millis,
    ) -> [i128; 4] {
        let mut out = [i128::MAX; 4];
        let Some(pool) = self.pools.get(p as usize) else {
            return [-1; 4];
        };
        if promised < now.max(pool.paused_until) {
            return [-1; 4];
        }
        let window = self.config.window_ms;
        let (others, _) = self.overtaking_from(p, me, vfinish, held.floor_for(me));
        let need = ahead.saturating_add(others);
        for a in Axis::ALL {
            let b = pool.bucket(a);
            if !b.gates() {
                continue;
            }
            let by_then = product(b.cap, promised.since(pool.updated)).saturating_add(b.level);
            out[a.index()] =
                by_then.div_euclid(i128::from(window.max(1))) - i128::from(need.get(a));
        }
        out
    }

    /// Backfill: whether a new request of pool `p`, placed at `key` behind a head that
    /// waits for refill, that fits now may be granted at once, ahead of the line — the way
    /// HPC schedulers backfill small jobs around a reserved one: every ticket ahead of it
    /// keeps its promise with `demand` taken now (so no promise moves), a concurrency slot
    /// stays free for the head, it is within the first [`BACKFILL_SCAN`] of the line, and
    /// its agent is at most a quantum ahead of the calls being served (see `lead`). It pays
    /// for its place as any call (its agent's virtual finish moves); the pool's virtual time
    /// stays that of the line. Tickets already in line are granted in order: a call that
    /// fits when it asks goes at once, one that waits keeps its place, and a wait stays
    /// what the line says it is.
    pub(super) fn may_backfill(
        &self,
        p: u32,
        (key, vstart, weight): (crate::queue::Key, u128, u64),
        demand: &Demand,
        now: Millis,
    ) -> bool {
        let Some(pool) = self.pools.get(p as usize) else {
            return false;
        };
        // Eligible: its agent is at most a quantum ahead of its share (see `lead`).
        let head =
            pool.queue
                .peek_min()
                .and_then(|(_, _, slot)| match self.leases.by_slot(slot)?.phase {
                    Phase::Queued { vstart, .. } => Some(vstart),
                    Phase::Active { .. } => None,
                });
        let lead = self.lead(weight);
        if vstart > pool.vtime.max(head.unwrap_or(0)).saturating_add(lead) {
            return false;
        }
        if pool
            .concurrency_cap()
            .is_some_and(|cap| pool.in_flight.saturating_add(1) >= cap)
        {
            return false;
        }
        let tickets = pool.queue.first_in_order(BACKFILL_SCAN);
        if tickets.len() == BACKFILL_SCAN && tickets.last().is_some_and(|(k, _, _)| *k < key) {
            return false;
        }
        let held = self.held(p, now);
        let mut ahead = Demand::default();
        for (k, slot, stored) in tickets.into_iter().take_while(|(k, _, _)| *k < key) {
            let Some(e) = self.leases.by_slot(slot) else {
                return false;
            };
            let Phase::Queued { promised, .. } = e.phase else {
                return false;
            };
            let need = ahead.saturating_add(pool.within_caps(&stored));
            ahead = ahead.saturating_add(stored);
            let slack = self.slack(p, (e.agent_slot, k.vfinish, promised), &need, &held, now);
            if Axis::ALL
                .iter()
                .any(|a| i128::from(demand.get(*a)) > slack[a.index()])
            {
                return false;
            }
        }
        true
    }

    /// How far ahead of the calls being served (the virtual start of the head, or the
    /// pool's virtual time) a call may start and still be backfilled: a quantum's virtual
    /// time at its weight. An agent is so served at most a quantum of the limit ahead of
    /// its share (as in WF2Q, where only calls that have started in virtual time are
    /// eligible, plus that quantum): a backfill lets small calls through, not an agent that
    /// has already had its share past the others.
    fn lead(&self, weight: u64) -> u128 {
        crate::weight::virtual_cost(
            crate::weight::quantum(self.config.weights),
            u128::from(weight.max(1)),
        )
    }
}

/// When a slot frees for the `j`-th ticket in line (from 0) at the latest while every slot
/// is held, `slots` being the expiries of the leases in flight, earliest first: the
/// `j`-th of them, or for a ticket past them one lease TTL later for each round of the
/// slots (a slot taken by a ticket ahead of it frees within a TTL of its grant) — or a TTL
/// from `now` if none is known. A renewal moves an expiry: the promise made on it is then
/// replaced when it comes.
pub(super) fn slot_frees(slots: &[Millis], j: usize, now: Millis, ttl: u64) -> Millis {
    match slots.len() {
        0 => now.plus(ttl),
        n => {
            let rounds = u64::try_from(j / n).unwrap_or(u64::MAX);
            slots[j % n].plus(ttl.saturating_mul(rounds))
        }
    }
}

/// How far back in the line a request may be for [`Coordinator::may_backfill`] to let it
/// through: the bound of every ticket ahead of it is checked.
pub(crate) const BACKFILL_SCAN: usize = 64;
