//! The end of a lease: settle, cancel, renew, and the operator's hold (see
//! [`Coordinator::settle`]).

use super::Coordinator;
use crate::agents::{Held, Sample};
use crate::bucket::{Axis, Demand};
use crate::config::Counting;
use crate::decision::{Event, Settlement};
use crate::error::LeaseError;
use crate::ids::{LeaseId, PoolId};
use crate::lease::{Entry, Phase};
use crate::request::{Usage, used};
use crate::tasks::Tokens;
use crate::time::Millis;
use crate::weight::virtual_cost;

impl Coordinator {
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
        self.granted(lease, now)?;
        let now = self.advance(now);
        // The lease may have been reaped by advancing to `now`.
        let entry = self.take_lease(lease)?;
        let Phase::Active {
            charged,
            gated,
            grant_level,
            granted_at,
            held,
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
                (&charged, gated, granted_at, held),
                (grant_level, now.since(granted_at)),
                &actual,
                window,
            );
            pool.revise_for_debt(&excess, window);
            debug_assert!(pool.in_flight > 0, "a granted lease holds a slot");
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
        let entry = self.take_lease(lease)?;
        if let Phase::Queued {
            promised,
            revising: true,
            ..
        } = entry.phase
        {
            self.close_revision(lease, promised);
        }
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
                held,
                ..
            } => {
                let since = (grant_level, now.since(granted_at));
                let lease = (&charged, gated, granted_at, held);
                pool.reconcile(lease, since, &Demand::default(), window);
                debug_assert!(pool.in_flight > 0, "a granted lease holds a slot");
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
    /// 429's pause (an ETA given before the hold does not count it). The hold is bounded,
    /// like a provider's pause, by `feedback.max_pause_ms` from now. Asking again replaces
    /// the operator's hold: a later `until` extends it, an earlier one shortens it, and one
    /// at or before `now` lifts it — never below what the provider's 429s asked for, which
    /// the hold does not touch. Returns when grants resume; an [`Event::Paused`] is raised
    /// when that moved.
    ///
    /// `UnknownPool` for a pool that does not exist (nothing changes).
    pub fn hold(&mut self, now: Millis, pool: PoolId, until: Millis) -> Result<Millis, LeaseError> {
        let p = self.pool_index(pool)?;
        let now = self.advance(now);
        let until = until.min(now.plus(self.config.feedback.max_pause_ms));
        let Some(pl) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        pl.held_until = until;
        let resume = pl.limited_until.max(until).max(now);
        let before = pl.paused_until.max(now);
        if resume > before {
            pl.pause_until(now, resume);
            self.events.push_back(Event::Paused {
                pool,
                until: resume,
            });
        } else if resume < before {
            // Shortened or lifted: every promise stands (a grant can only come sooner), and
            // what fits is granted now.
            pl.paused_until = resume;
            self.events.push_back(Event::Paused {
                pool,
                until: resume,
            });
            self.drain(p, now);
        }
        self.keep_promises(p, now);
        Ok(resume)
    }

    /// Keeps a granted lease alive: its expiry moves to `now + lease_ttl_ms` (never
    /// earlier than it was, never past its grant plus `max_lease_life_ms`) and the new
    /// expiry is returned. A host renews a lease while its call is still working (a
    /// streamed answer whose bytes still flow), so the reservation and the concurrency slot
    /// stay held until the call settles instead of being reaped at the first expiry; at its
    /// life's end a renewal answers the expiry it has, and the lease is reaped then, so no
    /// caller holds a slot without end by renewing. Time moves to `now` first, as for any
    /// input.
    ///
    /// `UnknownLease` for a lease that was never issued or has ended (settled, cancelled,
    /// or expired, including one whose expiry is due at `now`: renewing must come before
    /// it); `NotGranted` for a queued ticket (it holds nothing yet and cannot expire).
    /// The state is unchanged on an error.
    pub fn renew(&mut self, now: Millis, lease: LeaseId) -> Result<Millis, LeaseError> {
        self.granted(lease, now)?;
        let now = self.advance(now);
        let ttl = self.config.lease_ttl_ms;
        let life = self.config.lease_life_ms();
        let Some(Entry {
            phase:
                Phase::Active {
                    granted_at,
                    expires_at,
                    ..
                },
            ..
        }) = self.leases.get_mut(lease)
        else {
            return Err(LeaseError::UnknownLease);
        };
        let renewed = now.plus(ttl).min(granted_at.plus(life)).max(*expires_at);
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

    /// `Ok` for a granted lease live at `now`; `UnknownLease` for one that never was or
    /// has ended, `NotGranted` for a queued ticket.
    fn granted(&self, lease: LeaseId, now: Millis) -> Result<(), LeaseError> {
        match self.live(lease, now) {
            None => Err(LeaseError::UnknownLease),
            Some(Entry {
                phase: Phase::Queued { .. },
                ..
            }) => Err(LeaseError::NotGranted),
            Some(_) => Ok(()),
        }
    }

    /// Takes lease `lease` (granted or queued) out of the table; `UnknownLease` if it is
    /// not there.
    #[inline(always)]
    fn take_lease(&mut self, lease: LeaseId) -> Result<Entry, LeaseError> {
        let live = self.leases.live();
        let entry = self.leases.remove(lease).ok_or(LeaseError::UnknownLease)?;
        debug_assert_eq!(self.leases.live() + 1, live, "the lease left the table");
        self.leases.prune_expiries();
        Ok(entry)
    }
}
