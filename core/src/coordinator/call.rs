//! The call lifecycle's decisions (see [`crate::call`]).

use super::Coordinator;
use super::feedback::Source;
use crate::agents::{Sample, WaitKind, Waiting};
use crate::call::{
    Call, CallResponse, GiveUp, GiveUpReason, LeaseStep, ResponseStep, Wait, WaitReason,
};
use crate::decision::Decision;
use crate::error::LeaseError;
use crate::headers::{HeaderReport, RateAxis};
use crate::ids::LeaseId;
use crate::ids::PoolId;
use crate::lease::Phase;
use crate::request::{LeaseRequest, Usage};
use crate::time::Millis;
use alloc::vec::Vec;

impl Coordinator {
    /// Asks for capacity for `call` ([`Coordinator::request_lease`]) and says what to do:
    /// send, wait in the queue, wait out a refusal (the request keeps its place in the fair
    /// order, so asking again at `until` is served), or give up (a request that can never
    /// fit, or `call.max_refusals` refusals).
    pub fn call_lease(
        &mut self,
        now: Millis,
        call: &mut Call,
        req: &LeaseRequest,
    ) -> Result<LeaseStep, LeaseError> {
        let decision = self.request_lease(now, req)?;
        let now = self.now;
        Ok(match decision {
            Decision::Grant { lease, expires_at } => LeaseStep::Send { lease, expires_at },
            Decision::Queued { lease, eta } => {
                // Told to checkpoint by a wait it may well have (the 90th percentile of what
                // the pool's waits came out to), not by its bound (which may be many times
                // longer) nor its median (which half the waits exceed).
                let expected = self.expected_grant(lease).unwrap_or(eta).min(eta);
                let long = self.grant_at(lease, 900).unwrap_or(eta).min(eta);
                let mut wait = self.wait(now, call, eta, WaitReason::Queued, Some(lease), None);
                wait.expected = expected.max(now);
                wait.checkpoint = self.checkpoint(long.since(now));
                LeaseStep::Wait(wait)
            }
            Decision::Reject {
                retry_at: at,
                reason,
            } => {
                call.refusals = call.refusals.saturating_add(1);
                if call.refusals > self.config.call.max_refusals {
                    LeaseStep::GiveUp(self.give_up(call, GiveUpReason::Refusals, Some(reason)))
                } else {
                    let wait = self.wait(now, call, at, WaitReason::Refused, None, Some(reason));
                    self.note_wait(self.agents.find(req.agent), &wait, None);
                    if let Ok(p) = self.pool_index(req.pool) {
                        self.count_wait(p, now, &wait);
                    }
                    LeaseStep::Wait(wait)
                }
            }
            Decision::NeverFits { reason } => {
                LeaseStep::GiveUp(self.give_up(call, GiveUpReason::NeverFits, Some(reason)))
            }
        })
    }

    /// Feeds a provider response back ([`Coordinator::handle_response`]) and says what to
    /// do with it: deliver it, wait and ask again, or give up.
    ///
    /// Retried: a 429 unless the provider sends `x-should-retry: false`, and a status of
    /// 500 or above when it sends `x-should-retry: true`. Everything else is delivered. A
    /// response that is not a success (a status outside 200–299) is settled here, as
    /// nothing used: the provider refused it before generating. The wait after a 429:
    ///
    /// - a parallel-request (concurrency) 429 clears when other calls finish: full jitter
    ///   below `call.concurrency_base_ms × 2^(n−1)`, capped by `retry-after` and
    ///   `backoff.cap_ms`;
    /// - any other 429 with `retry-after`: until the earlier of `retry-after` and the
    ///   gateway's `reset_at`, plus up to `backoff.retry_after_jitter_ms`;
    /// - without `retry-after` (and for a retried server error): full jitter below
    ///   `backoff.base_ms × 2^(n−1)`, capped at `backoff.cap_ms`.
    ///
    /// After `backoff.max_attempts` failed sends the call gives up with the last
    /// `Retry-After`. The answer carries the step and, when the core settled the lease, the
    /// settlement. Errors (state unchanged) as for `handle_response`.
    pub fn call_response(
        &mut self,
        now: Millis,
        call: &mut Call,
        pool: PoolId,
        lease: Option<LeaseId>,
        status: u16,
        report: &HeaderReport,
    ) -> Result<CallResponse, LeaseError> {
        self.call_response_from(now, call, (pool, lease), status, report, Source::Host)
    }

    /// [`Coordinator::call_response`], saying who saw the response.
    pub(crate) fn call_response_from(
        &mut self,
        now: Millis,
        call: &mut Call,
        (pool, lease): (PoolId, Option<LeaseId>),
        status: u16,
        report: &HeaderReport,
        source: Source,
    ) -> Result<CallResponse, LeaseError> {
        self.response_from(now, (pool, lease), status, report, source)?;
        let now = self.now;
        let agent = lease
            .and_then(|id| self.leases.get(id))
            .map(|e| e.agent_slot);
        // Refused before any generation: the call cost no tokens. (`handle_response` checked
        // the lease is live; settling it cannot fail but for a queued ticket.)
        let settled = match lease {
            Some(id) if !(200..300).contains(&status) => self
                .settle_as(now, id, &Usage::default(), Sample::Refused)
                .ok(),
            _ => None,
        };
        let step = self.response_step(now, call, status, report);
        // The limit the provider named, or else the one its headers showed spent.
        let axis = report.limit_hit();
        if let ResponseStep::Wait(wait) = &step {
            self.note_wait(agent, wait, axis);
            if let Ok(p) = self.pool_index(pool) {
                self.count_wait(p, now, wait);
            }
        }
        Ok(CallResponse { step, settled })
    }

    /// Adds a wait told with no ticket to the pool's minute (a queued ticket's wait is
    /// counted when it is granted), for the fleet advice's demand.
    fn count_wait(&mut self, p: u32, now: Millis, wait: &Wait) {
        if let Wait {
            until,
            ticket: None,
            ..
        } = *wait
        {
            if let Some(m) = self
                .pools
                .get_mut(p as usize)
                .and_then(|pool| pool.minute(now))
            {
                m.waited_ms = m.waited_ms.saturating_add(until.since(now));
            }
        }
    }

    /// Keeps a wait without a ticket on the agent, for its activity in the metrics: a
    /// queued call shows as queued already, a call sent or delivered waits for nothing.
    fn note_wait(&mut self, agent: Option<u32>, wait: &Wait, axis: Option<RateAxis>) {
        let Wait {
            until,
            reason,
            ticket: None,
            ..
        } = *wait
        else {
            return;
        };
        let kind = match reason {
            WaitReason::Queued => return,
            WaitReason::Refused => WaitKind::Refused,
            WaitReason::RateLimited => WaitKind::RateLimited,
            WaitReason::Overloaded => WaitKind::BackingOff,
        };
        if let Some(a) = agent.and_then(|slot| self.agents.get_mut(slot)) {
            a.waiting = Some(Waiting {
                kind,
                until,
                axis: (kind == WaitKind::RateLimited).then_some(axis).flatten(),
            });
        }
    }

    fn response_step(
        &mut self,
        now: Millis,
        call: &mut Call,
        status: u16,
        report: &HeaderReport,
    ) -> ResponseStep {
        let retryable = match report.should_retry {
            Some(false) => false,
            Some(true) => status == 429 || status >= 500,
            None => status == 429,
        };
        if !retryable {
            return ResponseStep::Deliver;
        }
        call.failed = call.failed.saturating_add(1);
        if report.retry_after_ms.is_some() {
            call.last_retry_after_ms = report.retry_after_ms;
        }
        let b = self.config.backoff;
        if call.failed >= b.max_attempts {
            return ResponseStep::GiveUp(self.give_up(call, GiveUpReason::Attempts, None));
        }
        let concurrent = status == 429 && report.exceeded == Some(RateAxis::Concurrent);
        let delay = match report.retry_after_ms {
            _ if concurrent => {
                let cap = report.retry_after_ms.unwrap_or(b.cap_ms).min(b.cap_ms);
                let top = ceiling(self.config.call.concurrency_base_ms, call.failed, cap);
                self.rng.below_or_eq(top).max(1)
            }
            Some(ra) if status == 429 => {
                let ra = report.reset_at_ms.map_or(ra, |reset| reset.min(ra));
                ra.saturating_add(self.rng.below_or_eq(b.retry_after_jitter_ms))
                    .max(1)
            }
            _ => self
                .rng
                .below_or_eq(ceiling(b.base_ms, call.failed, b.cap_ms))
                .max(1),
        };
        let reason = if status == 429 {
            WaitReason::RateLimited
        } else {
            WaitReason::Overloaded
        };
        ResponseStep::Wait(self.wait(now, call, now.plus(delay), reason, None, None))
    }

    /// Settles a lease whose call ended without a usage report (the connection dropped,
    /// the agent aborted, the stream broke): the provider may have processed all of it, so
    /// it is charged conservatively. `seen` is what the host saw before the end (the usage
    /// the stream had reported so far, with output tokens counted from the text received),
    /// or `None` when nothing came back: the input is charged as reported, else as
    /// reserved (cached prefix included, as uncached); the output as seen plus 16, up to
    /// `max_tokens`, or the whole output reservation when nothing was seen (`max_tokens`
    /// under OpenAI counting, the learned reservation under Anthropic's).
    pub fn call_interrupted(
        &mut self,
        now: Millis,
        lease: LeaseId,
        seen: Option<&Usage>,
    ) -> Result<crate::Settlement, LeaseError> {
        let ask = match self.live(lease, now) {
            None => return Err(LeaseError::UnknownLease),
            Some(e) if matches!(e.phase, Phase::Queued { .. }) => {
                return Err(LeaseError::NotGranted);
            }
            Some(e) => e.ask,
        };
        let reserved_input = ask.input_tokens.saturating_add(ask.cached_prefix_tokens);
        let usage = match seen {
            None => Usage {
                input_tokens: reserved_input,
                output_tokens: ask.output_reserve(),
                ..Usage::default()
            },
            Some(u) => {
                let reported = u
                    .input_tokens
                    .saturating_add(u.cache_creation_input_tokens)
                    .saturating_add(u.cache_read_input_tokens);
                let mut usage = if reported > 0 {
                    *u
                } else {
                    Usage {
                        input_tokens: reserved_input,
                        ..Usage::default()
                    }
                };
                usage.output_tokens = u.output_tokens.saturating_add(16).min(ask.max_tokens);
                usage
            }
        };
        self.settle_as(now, lease, &usage, Sample::Interrupted)
    }

    /// The host restarted: every call it had in flight died with it. Each live lease or
    /// ticket not in `keep` (those the host still holds, e.g. for its API clients) is ended
    /// as the core ends a call cut short: a granted lease is charged as an interrupted call
    /// that returned nothing ([`Coordinator::call_interrupted`] with `None`), a queued ticket
    /// withdrawn ([`Coordinator::cancel`]). Returns the ids ended, each list in id order.
    /// Time moves to `now` first; leases whose expiry is due are reaped by it, not ended
    /// here.
    pub fn restarted(&mut self, now: Millis, keep: &[LeaseId]) -> (Vec<LeaseId>, Vec<LeaseId>) {
        self.handle_timeout(now);
        let now = self.now;
        let mut kept = keep.to_vec();
        kept.sort_unstable();
        let mut ended: Vec<(LeaseId, bool)> = self
            .leases
            .entries()
            .filter(|e| kept.binary_search(&e.id).is_err())
            .map(|e| (e.id, matches!(e.phase, Phase::Queued { .. })))
            .collect();
        ended.sort_unstable_by_key(|(id, _)| *id);
        let (mut interrupted, mut withdrawn) = (Vec::new(), Vec::new());
        for (id, queued) in ended {
            if queued {
                if self.cancel(now, id).is_ok() {
                    withdrawn.push(id);
                }
            } else if self.call_interrupted(now, id, None).is_ok() {
                interrupted.push(id);
            }
        }
        (interrupted, withdrawn)
    }

    fn wait(
        &self,
        now: Millis,
        call: &Call,
        until: Millis,
        reason: WaitReason,
        ticket: Option<LeaseId>,
        refusal: Option<crate::RejectReason>,
    ) -> Wait {
        let until = until.max(now);
        Wait {
            until,
            expected: until,
            reason,
            ticket,
            refusal,
            attempt: call.failed,
            checkpoint: self.checkpoint(until.since(now)),
        }
    }

    /// Whether a wait of `long` ms is long enough to checkpoint the turn before it.
    fn checkpoint(&self, long: u64) -> bool {
        long >= self.config.call.checkpoint_after_ms
            || (self.config.prompt_cache_ttl_ms > 0 && long >= self.config.prompt_cache_ttl_ms)
    }

    fn give_up(
        &self,
        call: &Call,
        reason: GiveUpReason,
        refusal: Option<crate::RejectReason>,
    ) -> GiveUp {
        GiveUp {
            reason,
            refusal,
            attempts: call.failed,
            last_retry_after_ms: call.last_retry_after_ms,
        }
    }
}

/// `min(cap, base × 2^(failed − 1))`, without overflow: the ceiling of a full-jitter wait.
fn ceiling(base: u64, failed: u32, cap: u64) -> u64 {
    let exp = failed.saturating_sub(1).min(63);
    base.checked_shl(exp)
        .filter(|c| c >> exp == base)
        .map_or(cap, |c| c.min(cap))
}

#[cfg(test)]
mod tests {
    use super::ceiling;

    #[test]
    fn ceiling_doubles_up_to_the_cap_and_never_overflows() {
        assert_eq!(ceiling(1_000, 1, 30_000), 1_000);
        assert_eq!(ceiling(1_000, 3, 30_000), 4_000);
        assert_eq!(ceiling(1_000, 10, 30_000), 30_000);
        // base × 2^(n−1) would overflow: the cap, not a wrapped product.
        assert_eq!(ceiling(u64::MAX / 2, 3, u64::MAX), u64::MAX);
        assert_eq!(ceiling(u64::MAX / 2, 2, 7), 7);
        assert_eq!(ceiling(1, 64, u64::MAX), 1 << 63);
        assert_eq!(ceiling(0, 0, 5), 0);
    }
}
