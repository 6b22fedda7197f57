//! A request's decision: grant now, queue with a promise, or refuse (see
//! [`Coordinator::request_lease`]).

use super::Coordinator;
use super::promise;
use super::weigh::{pending_bump, weight};
use crate::agents::Held;
use crate::bucket::{Axis, Demand};
use crate::config::Families;
use crate::decision::{Decision, RejectReason};
use crate::error::LeaseError;
use crate::ids::{AgentId, LeaseId, TaskId};
use crate::lease::{Entry, Fair, LeaseTable, Phase};
use crate::queue::Key;
use crate::request::{Ask, LeaseRequest, charge, output_reserve};
use crate::tasks::{Opener, TaskSpec};
use crate::time::Millis;
use crate::weight::{place_cost, small, virtual_cost};

impl Coordinator {
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
    /// [`Event::Revised`](crate::Event::Revised) once the delays it has met since it was made exceed its headroom:
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
        if self
            .tasks
            .open(&spec, now, bounds, Opener::Request(req.agent))
            .is_ok()
        {
            Some(task)
        } else {
            self.tasks.untracked = self.tasks.untracked.saturating_add(1);
            None
        }
    }

    /// [`Coordinator::request_lease`]'s decision, once the request is checked and time
    /// moved to `now`: placed in the pool's fair order, then granted now, or queued with a
    /// promise.
    fn decide(
        &mut self,
        p: u32,
        now: Millis,
        req: &LeaseRequest,
        task: Option<TaskId>,
    ) -> Decision {
        let placed = match self.place(p, now, req, task) {
            Ok(placed) => placed,
            Err(refused) => return refused,
        };
        if let Some(granted) = self.grant_now(p, now, req, task, &placed) {
            return granted;
        }
        self.enqueue(p, now, req, task, &placed)
    }

    /// Finds (or adds) the asking agent and places its request in pool `p`'s fair order:
    /// its weight, what it is charged, its virtual start and finish. Refused here: no room
    /// for the agent or the lease, or a call above a limit even with a warm cache.
    fn place(
        &mut self,
        p: u32,
        now: Millis,
        req: &LeaseRequest,
        task: Option<TaskId>,
    ) -> Result<Placed, Decision> {
        let counting = self.config.pools[p as usize].counting;
        let pools = self.pools.len();
        let found = self
            .agents
            .find_or_add(req.agent, now, pools, self.config.max_agents)
            .map(|(slot, _)| slot);
        let Some(agent_slot) = found else {
            // An agent becomes idle, and can make room, when a lease of its ends.
            let retry_at = self.transient_retry(now, self.leases.next_expiry());
            return Err(self.reject(p, now, Some(retry_at), RejectReason::TooManyAgents));
        };
        // A family shares one place: its members with calls in line split its weight.
        self.agents.set_family(agent_slot, req.family);
        let members = match self.config.weights.families {
            Families::Shared => u128::from(self.agents.family_live(agent_slot)),
            Families::Flat => 1,
        };
        // The family members a request with the core's role (`Role::Auto`) plans for: those
        // seen within a rate window (before this ask marks the agent seen).
        let task_state = task.and_then(|t| self.tasks.get(t));
        let auto = task_state.map_or(req.role, |t| t.role) == crate::request::Role::Auto;
        let seen = if auto {
            let since = Millis(now.0.saturating_sub(self.config.window_ms));
            self.agents.members_seen(agent_slot, since)
        } else {
            0
        };
        let Some(agent) = self.agents.get_mut(agent_slot) else {
            return Err(self.reject(p, now, None, RejectReason::TooManyAgents));
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
        let weight =
            (weight(&self.config.weights, req, (agent, seen), task_state, now) / members).max(1);
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
            return Err(self.reject(p, now, None, RejectReason::ExceedsCapacity { axis }));
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
            let reason = RejectReason::TooManyLeases;
            return Err(self.refuse(p, agent_slot, vstart, now, retry_at, reason));
        }
        // The agent pays its whole share (its next request starts at `vfinish`); a first
        // call is placed in line by at most a quantum of it.
        let fair = Fair {
            weight: u64::try_from(weight).unwrap_or(u64::MAX),
            cost: virtual_cost(share, weight),
            first,
            small: is_small,
        };
        let key = Key {
            vfinish: vstart.saturating_add(place_cost(share, &fair, w)),
            seq: self.seq,
        };
        debug_assert!(key.vfinish >= vstart, "a place is never before its start");
        Ok(Placed {
            agent_slot,
            ask,
            demand,
            weight,
            fair,
            vstart,
            vfinish: vstart.saturating_add(fair.cost),
            key,
            kept: held.is_some(),
            warm_until,
        })
    }

    /// Grants a placed request at once if it may go now: it fits, a concurrency slot is
    /// free, and it is first in line or may go around the tickets waiting for refill (see
    /// [`Coordinator::may_backfill`]). `None`: it waits in line.
    fn grant_now(
        &mut self,
        p: u32,
        now: Millis,
        req: &LeaseRequest,
        task: Option<TaskId>,
        placed: &Placed,
    ) -> Option<Decision> {
        let (ttl, window) = (self.config.lease_ttl_ms, self.config.window_ms);
        let pool = &self.pools[p as usize];
        let first_in_line = pool
            .queue
            .peek_min()
            .is_none_or(|(head, _, _)| placed.key < head);
        let admit_now = pool.can_admit(now, ttl) && pool.fits(&placed.demand, window);
        // Behind a head that waits for refill, a call that fits now goes first where every
        // promise ahead of it stands (see `Coordinator::backfill`).
        let backfill = admit_now
            && !first_in_line
            && self.may_backfill(
                p,
                (placed.key, placed.vstart, placed.fair.weight),
                &placed.demand,
                now,
            );
        if !(admit_now && (first_in_line || backfill)) {
            return None;
        }
        let lag = self.config.feedback.arrival_ms;
        let pool = &mut self.pools[p as usize];
        let in_flight = pool.in_flight;
        let phase = pool.admit(placed.demand, (now, ttl, lag), window);
        debug_assert_eq!(pool.in_flight, in_flight + 1, "a grant holds one more slot");
        // With nobody waiting, virtual time moves to this grant's finish, so an agent gains
        // no credit from earlier uncontended use and owes none to late comers; a backfill
        // leaves it to the calls in line.
        if !backfill {
            pool.vtime = pool.vtime.max(if pool.queue.is_empty() {
                placed.vfinish
            } else {
                placed.vstart
            });
        }
        pool.counters.granted_now = pool.counters.granted_now.saturating_add(1);
        let lease = self.insert_lease(
            req.agent,
            placed.agent_slot,
            p,
            placed.ask,
            phase,
            (placed.vfinish, placed.fair),
            now,
            task,
        );
        let expires_at = now.plus(ttl);
        self.leases
            .push_expiry(expires_at, lease, self.config.max_leases);
        Some(Decision::Grant { lease, expires_at })
    }

    /// Queues a placed request with its promise (see [`Coordinator::request_lease`]), or
    /// refuses it for now: the queue is full, or its wait would pass `max_queue_wait_ms`
    /// (unless it comes back to a place it kept).
    fn enqueue(
        &mut self,
        p: u32,
        now: Millis,
        req: &LeaseRequest,
        task: Option<TaskId>,
        placed: &Placed,
    ) -> Decision {
        let counting = self.config.pools[p as usize].counting;
        let (agent_slot, key, vstart) = (placed.agent_slot, placed.key, placed.vstart);
        let pool = &self.pools[p as usize];
        if pool.queue.len() >= self.config.max_queue_depth {
            let retry_at = self.transient_retry(now, self.pool_wake(p));
            let reason = RejectReason::QueueFull;
            return self.refuse(p, agent_slot, vstart, now, retry_at, reason);
        }
        // Insert first: the same walk gives the demand queued ahead, which sets the
        // expected wait. A ticket expected to wait too long is taken back out.
        let (max_wait, window) = (self.config.max_queue_wait_ms, self.config.window_ms);
        let pool = &mut self.pools[p as usize];
        // What it waits for in line, counted as if its prompt cache went cold while it
        // waits (the most it can be charged at its grant): the bounds of the tickets behind
        // it, and its own, hold whenever it is granted.
        // In the sums, as it will be charged: a ticket above a capacity is granted from a
        // full bucket and leaves the rest as debt the tickets behind it wait for; its own
        // wait is for a full bucket.
        let in_line = charge(counting, &placed.ask, true);
        let queued = pool.queue.len();
        let inserted = pool.queue.insert(key, in_line, u32::MAX);
        debug_assert_eq!(pool.queue.len(), queued + 1, "the ticket joined the line");
        let ahead = inserted.before.saturating_add(pool.within_caps(&in_line));
        let expected = pool.eta(now, &ahead, window);
        // A request back at its kept place is queued whatever its wait: it was already sent
        // away once, and coming back at `retry_at` is served.
        if expected.since(now) > max_wait && !placed.kept {
            pool.queue.undo_insert(key, inserted);
            debug_assert_eq!(pool.queue.len(), queued, "the ticket left the line");
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
        debug_assert!(
            eta >= rates && eta >= now,
            "a promise is never before its bound"
        );
        let delay = self.pools[p as usize].delay;
        let phase = Phase::Queued {
            key,
            vstart,
            enqueued_at: now,
            promised: eta,
            in_line_ms: expected.since(now),
            revising: false,
            checked: delay,
            budget: delay.saturating_add(eta.since(rates)),
            bump: pending_bump(
                &self.config.weights,
                &placed.ask,
                placed.warm_until,
                placed.weight,
                now,
            ),
        };
        let lease = self.insert_lease(
            req.agent,
            agent_slot,
            p,
            placed.ask,
            phase,
            (placed.vfinish, placed.fair),
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
}

/// A request placed in a pool's fair order (see [`Coordinator::place`]).
struct Placed {
    agent_slot: u32,
    ask: Ask,
    /// What it is charged if granted now.
    demand: Demand,
    /// Its weight in the pool (its family's split included).
    weight: u128,
    fair: Fair,
    vstart: u128,
    /// Where its agent's next request starts: `vstart` plus its whole cost.
    vfinish: u128,
    /// Its place in line.
    key: Key,
    /// It came back to a place kept for it after a refusal.
    kept: bool,
    /// Until when its agent's prompt cache is warm, if it is.
    warm_until: Option<Millis>,
}
