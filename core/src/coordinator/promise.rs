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
//! input the core recomputes the bounds of the tickets it may have moved from the state,
//! and where one is past the promise it re-issues the promise as an [`Event::Revised`] — at
//! the instant of the event, before the old promise passes — to the earlier of that bound
//! and the old promise moved by the most the event can delay it (debt of `d` tokens on an
//! axis refilling `c` a window: `d · window / c`), plus headroom. A promise is made with an
//! eighth of its wait as headroom over its bound ([`with_headroom`]), so small debts are
//! absorbed without a revision. A promise replaced in time is kept: no ticket is granted
//! after the promise it holds when the host wakes at [`Coordinator::poll_timeout`].
//!
//! A promise is also what a backfill must respect ([`Coordinator::may_backfill`]): a call
//! that fits when it asks may go ahead of a head waiting for refill only where every ticket
//! ahead of it would still be granted by its promise.

use alloc::vec::Vec;

use super::Coordinator;
use crate::AgentId;
use crate::bucket::{Axis, Demand, product};
use crate::decision::Event;
use crate::ids::LeaseId;
use crate::ids::PoolId;
use crate::lease::Phase;
use crate::pool::{Pool, Revise};
use crate::time::Millis;

impl Pool {
    /// Marks the pool's promises for the end of the input.
    pub(crate) fn revise(&mut self, r: Revise) {
        self.revise = Some(match (self.revise, r) {
            (Some(Revise::By(a)), Revise::By(b)) => Revise::By(a.saturating_add(b)),
            (None, r) => r,
            _ => Revise::Recompute,
        });
    }

    /// Pauses the pool's grants until `until` (later than it was paused): every promise
    /// moves by at most the pause added.
    pub(crate) fn pause_until(&mut self, now: Millis, until: Millis) {
        let added = until.since(self.paused_until.max(now));
        self.paused_until = until;
        if added > 0 && !self.queue.is_empty() {
            self.revise(Revise::By(added));
        }
    }

    /// Debt of `excess` on the pool's axes that the bound did not assume (a call used more
    /// than it reserved, a level lowered to the provider's figure): it delays every grant
    /// by at most the time the most delayed axis takes to refill it.
    pub(crate) fn revise_for_debt(&mut self, excess: &Demand, window: u64) {
        // No line, no promise a debt could move.
        if self.queue.is_empty() {
            return;
        }
        let mut ms = 0u64;
        for a in Axis::ALL {
            let b = self.bucket(a);
            let d = excess.get(a);
            if d > 0 && b.gates() && b.cap > 0 {
                // In 64 bits when the product fits (the same result).
                let t = match d.checked_mul(window) {
                    Some(p) => p.div_ceil(b.cap),
                    None => u64::try_from(
                        (u128::from(d) * u128::from(window)).div_ceil(u128::from(b.cap)),
                    )
                    .unwrap_or(u64::MAX),
                };
                ms = ms.max(t);
            }
        }
        if ms > 0 {
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

    /// An agent of pool `p` can now be served more per unit of virtual time (`grew`, and a
    /// small-call lead if it asks for the first time): every other ticket's bound grows by
    /// at most what that is over the longest span in line (from the earliest start another
    /// agent can have to the last ticket's finish), which delays it by at most that
    /// demand's refill time.
    pub(super) fn revise_for_rates(
        &mut self,
        p: u32,
        (grew, first): (crate::agents::Rates, bool),
        now: Millis,
    ) {
        let Some(pool) = self.pools.get(p as usize) else {
            return;
        };
        let Some(last) = pool.queue.last_key() else {
            return;
        };
        let span = last
            .vfinish
            .saturating_sub(self.held(p, now).floor_for(u32::MAX));
        let amount = |rate: u128| {
            u64::try_from(span.saturating_mul(rate).div_ceil(1 << 32)).unwrap_or(u64::MAX)
        };
        let lead = if first {
            crate::weight::small_lead(self.config.weights)
        } else {
            0
        };
        // The requests axis counts the smaller of its share and its request count, which
        // grows by at most the larger of their growths.
        let mut more = pool.demand_of_share(amount(grew.share).saturating_add(lead));
        let r = Axis::Requests.index();
        more.0[r] = more.0[r].max(amount(grew.requests).saturating_add(u64::from(first)));
        let window = self.config.window_ms;
        if let Some(pool) = self.pools.get_mut(p as usize) {
            pool.revise_for_debt(&more, window);
        }
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

    /// Keeps pool `p`'s promises after an input (see the module doc). A debt marked
    /// [`Revise::By`] adds its delay to the pool's debt delay, and only the tickets whose
    /// promise had less slack over its bound than the delay added since they were last
    /// checked are checked: each whose bound from the state is now past its promise is
    /// promised the earlier of that bound and its old promise moved by that delay, as an
    /// [`Event::Revised`]. [`Revise::Recompute`] checks every ticket against its bound.
    /// And while every concurrency slot is held (the bound counts the rates, not how long
    /// calls hold their slots, which the core cannot know), a ticket whose promise has come
    /// is promised, at that instant, the expiry of the lease in flight that frees a slot
    /// for it at the latest (the `j`-th earliest for the `j`-th in line; a lease TTL more
    /// for each round of the slots), or its bound if later: [`Coordinator::poll_timeout`]
    /// wakes the host then. Each costs O(log n) per ticket it checks.
    #[inline]
    pub(super) fn keep_promises(&mut self, p: u32, now: Millis) {
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return;
        };
        // No line, no promise to keep (the common case: checked without a call).
        if pool.queue.is_empty() {
            pool.revise = None;
            return;
        }
        self.keep_queued_promises(p, now);
    }

    /// [`Coordinator::keep_promises`] for a pool with a line.
    #[inline(never)]
    fn keep_queued_promises(&mut self, p: u32, now: Millis) {
        let Some(pool) = self.pools.get_mut(p as usize) else {
            return;
        };
        let by = pool.revise.take();
        let candidates = match by {
            Some(Revise::Recompute) => pool
                .queue
                .in_order()
                .into_iter()
                .filter_map(|(_, slot)| self.leases.by_slot(slot).map(|e| e.id))
                .collect(),
            Some(Revise::By(ms)) => {
                pool.delay = pool.delay.saturating_add(ms);
                self.leases.take_over_budget(p, pool.delay)
            }
            None => Vec::new(),
        };
        let pool = &self.pools[p as usize];
        let blocked = !pool.concurrency_free();
        let lapsed = if blocked {
            self.leases.take_lapsed(p, now)
        } else {
            Vec::new()
        };
        if candidates.is_empty() && lapsed.is_empty() {
            return;
        }
        let held = self.held(p, now);
        // The expiries of the leases in flight, read the first time a ticket needs them.
        let in_flight = usize::try_from(pool.in_flight).unwrap_or(usize::MAX);
        let mut slots: Option<Vec<Millis>> = None;
        let ttl = self.config.lease_ttl_ms;
        let delay = pool.delay;
        let counting = self.counting(p).unwrap_or_default();
        // A ticket is checked once per input, however many heap entries named it (a heap
        // may hold an entry twice, and a ticket may be over budget and lapsed at once): a
        // second check would add headroom to a promise just made.
        let mut seen = alloc::collections::BTreeSet::new();
        for id in candidates.into_iter().chain(lapsed) {
            if !seen.insert(id) {
                continue;
            }
            let Some(e) = self.leases.get(id).copied() else {
                continue;
            };
            let Phase::Queued {
                key,
                promised,
                checked,
                budget,
                ..
            } = e.phase
            else {
                continue;
            };
            let pool = &self.pools[p as usize];
            // What is ahead of it in full, and its own (in line as cold, as it was queued)
            // at most a full bucket.
            let before = pool.queue.demand_before(key);
            let own = pool.within_caps(&crate::request::charge(counting, &e.ask, true));
            let bound = self.bound(
                p,
                (e.agent_slot, key.vfinish),
                &before.saturating_add(own),
                &held,
                now,
            );
            let mut eta = promised;
            if bound > promised {
                // Moved by at most the delay added since it was last checked; a promise
                // already past by then, or a recompute, takes the bound. With headroom
                // again.
                let moved = promised.plus(delay.saturating_sub(checked));
                eta = with_headroom(
                    now,
                    match by {
                        Some(Revise::By(_)) if moved >= now => bound.min(moved),
                        _ => bound,
                    },
                );
            }
            if blocked && eta <= now {
                let j = usize::try_from(before.get(Axis::Requests)).unwrap_or(usize::MAX);
                let slots = slots.get_or_insert_with(|| self.leases.expiries_in(p, in_flight));
                eta = with_headroom(now, bound)
                    .max(slot_frees(slots, j, now, ttl))
                    .max(now.plus(1));
            }
            let slack = eta.since(bound);
            let within = delay.saturating_add(slack);
            // A recompute that leaves a promise and asks no earlier check leaves the ticket
            // as it was (its older check is still sound: the promise then plus every delay
            // since bounds it), so that a snapshot changes only where a promise did. A
            // ticket taken off the budget heap is always put back.
            if eta == promised && by == Some(Revise::Recompute) && within >= budget {
                continue;
            }
            self.leases.set_promise(id, eta, (delay, within));
            if eta > promised {
                self.revised(id, e.agent, p, eta);
            }
        }
    }

    /// Queues the [`Event::Revised`] of ticket `id` (promised `eta`), unless one is already
    /// waiting to be polled: that one carries the promise in force when it is.
    fn revised(&mut self, id: LeaseId, agent: AgentId, p: u32, eta: Millis) {
        let Some(Phase::Queued { revising, .. }) = self.leases.get_mut(id).map(|e| &mut e.phase)
        else {
            return;
        };
        if !core::mem::replace(revising, true) {
            self.events.push_back(Event::Revised {
                lease: id,
                agent,
                pool: PoolId(p),
                eta,
            });
        }
    }

    /// Queued ticket `id`, whose [`Event::Revised`] is still waiting to be polled, leaves
    /// the line (granted or withdrawn) holding promise `promised`: the waiting event takes
    /// that promise, the one in force at the end, which `poll_event` can no longer read
    /// from the ticket. (Only a host that has not drained the events since the revision
    /// gets here; the walk is over what it has not polled.)
    pub(super) fn close_revision(&mut self, id: LeaseId, promised: Millis) {
        let waiting = self
            .events
            .iter_mut()
            .rev()
            .find(|e| matches!(e, Event::Revised { lease, .. } if *lease == id));
        debug_assert!(waiting.is_some(), "a revising ticket has its event waiting");
        if let Some(Event::Revised { eta, .. }) = waiting {
            *eta = promised;
        }
    }

    /// While every concurrency slot of pool `p` is held, the earliest promise of its queued
    /// tickets: when one may have to be replaced (see [`Coordinator::keep_promises`]).
    pub(super) fn next_lapse(&self, p: u32) -> Option<Millis> {
        let pool = self.pools.get(p as usize)?;
        if pool.concurrency_free() || pool.queue.is_empty() {
            return None;
        }
        self.leases.first_promise(p)
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
            let refilling = promised.since(pool.updated).saturating_sub(b.lag_ms);
            let by_then = product(b.cap, refilling).saturating_add(b.level);
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

/// A promise made at `now` on a bound `at` from the rates: the bound plus an eighth of the
/// wait to it ([`HEADROOM`]). (A slot's expiry is promised as it is: a renewal that moves
/// it is met when the promise comes.) A ticket's promise so has slack over its bound that absorbs debts (calls
/// that used more than they reserved, a pause, a ticket placed ahead) of up to that much
/// delay before it must be revised; without it, every debt would revise every ticket whose
/// promise is exactly its bound, which is all of them.
pub(super) fn with_headroom(now: Millis, at: Millis) -> Millis {
    at.plus(at.since(now) / HEADROOM)
}

/// The part of a wait added to its bound as a promise's slack (see [`with_headroom`]).
pub(crate) const HEADROOM: u64 = 8;

/// How far back in the line a request may be for [`Coordinator::may_backfill`] to let it
/// through: the bound of every ticket ahead of it is checked.
pub(crate) const BACKFILL_SCAN: usize = 64;
