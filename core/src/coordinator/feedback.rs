//! Provider feedback: a response's status and rate-limit headers, fed back into the pool.

use super::Coordinator;
use crate::bucket::Axis;
use crate::config::{Config, Counting, MAX_TOKENS, PoolConfig};
use crate::decision::{Event, MarginReason};
use crate::error::LeaseError;
use crate::headers::{HeaderReport, RateAxis};
use crate::ids::PoolId;
use crate::lease::{Entry, LeaseId, Phase};
use crate::pool::Pool;
use crate::time::Millis;

/// Who saw a provider response: this host, or another process that reported it (a member of
/// a shared limiter), whose 429 pauses the pool for at most `feedback.max_reported_pause_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Host,
    Reported,
}

impl Source {
    pub(crate) fn of(reported: bool) -> Source {
        if reported {
            Source::Reported
        } else {
            Source::Host
        }
    }
}

impl Coordinator {
    /// Feeds a provider response's status and parsed rate-limit headers back in.
    ///
    /// Limits in the headers update the pool (a new tier changes capacity; an unknown limit
    /// becomes known); a `remaining` lower than the coordinator's view lowers the bucket.
    /// A 429 pauses new grants for the whole pool until its retry time (one 429, one
    /// fleet-wide pause; a parallel-request 429 does not pause, as it clears when calls
    /// finish), and a 429 against a granted `lease` cuts the margin once.
    pub fn handle_response(
        &mut self,
        now: Millis,
        pool: PoolId,
        lease: Option<LeaseId>,
        status: u16,
        report: &HeaderReport,
    ) -> Result<(), LeaseError> {
        self.response_from(now, (pool, lease), status, report, Source::Host)
    }

    /// [`Coordinator::handle_response`], saying who saw the response.
    pub(crate) fn response_from(
        &mut self,
        now: Millis,
        (pool, lease): (PoolId, Option<LeaseId>),
        status: u16,
        report: &HeaderReport,
        source: Source,
    ) -> Result<(), LeaseError> {
        let p = pool.0;
        let counting = self.counting(p).ok_or(LeaseError::UnknownPool)?;
        if let Some(id) = lease {
            match self.live(id, now) {
                Some(e) if e.pool == p => {}
                _ => return Err(LeaseError::UnknownLease),
            }
        }
        let now = self.advance(now);
        let Some(pl) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        let concurrency_known = pl.max_concurrent.is_some();
        let taken_back = pl.learn(
            (now, pool),
            report,
            counting,
            &self.config,
            &self.config.pools[p as usize],
        );
        self.events.extend(taken_back);
        if status == 429 {
            // The coordinator was wrong only if it granted the lease knowing every limit it
            // knows now; a lease granted blind (limits not yet learned) cuts nothing.
            let known = Axis::ALL
                .iter()
                .filter(|a| pl.bucket(**a).gates())
                .fold(0u8, |m, a| m | (1 << a.index()));
            let blind_on_concurrency =
                report.exceeded == Some(RateAxis::Concurrent) && !concurrency_known;
            let mut cut = false;
            if let Some(Entry {
                phase:
                    Phase::Active {
                        rate_limited,
                        gated,
                        ..
                    },
                ..
            }) = lease.and_then(|id| self.leases.get_mut(id))
            {
                if !*rate_limited {
                    *rate_limited = true;
                    cut = *gated & known == known && !blind_on_concurrency;
                }
            }
            let max_pause = match source {
                Source::Host => self.config.feedback.max_pause_ms,
                Source::Reported => self
                    .config
                    .feedback
                    .max_reported_pause_ms
                    .min(self.config.feedback.max_pause_ms),
            };
            pl.rate_limited(
                (now, pool),
                lease.is_some(),
                cut,
                report,
                &self.config,
                max_pause,
            )
            .into_iter()
            .flatten()
            .for_each(|e| self.events.push_back(e));
            // The call waits out the 429: its task's quota wait runs until the next ask.
            let task = lease
                .and_then(|id| self.leases.get(id))
                .and_then(|e| e.task);
            if let Some(t) = task {
                self.tasks.start_wait(t, now);
            }
            self.watch_margins(now);
        }
        self.drain(p, now);
        Ok(())
    }
}

impl Pool {
    /// Takes in what the headers say of limits and remaining capacity.
    /// Limits move only within `config.feedback`'s bounds around the configured ones.
    /// Each remaining figure is compared with the model (see [`Pool::compared`]); returns
    /// the event of a margin taken back to its start by a disagreement.
    fn learn(
        &mut self,
        (now, id): (Millis, PoolId),
        report: &HeaderReport,
        counting: Counting,
        config: &Config,
        pool: &PoolConfig,
    ) -> Option<Event> {
        self.counters.malformed_headers = self
            .counters
            .malformed_headers
            .saturating_add(u64::from(report.malformed));
        let tokens_axis = match counting {
            Counting::Openai => Some(Axis::Tokens),
            Counting::Anthropic => self.bucket(Axis::Tokens).limit.map(|_| Axis::Tokens),
        };
        // Whether every remaining figure compared agreed with the model (`None`: none given).
        let mut agrees: Option<bool> = None;
        let mapped = [
            (Some(Axis::Requests), &report.requests),
            (Some(Axis::InputTokens), &report.input_tokens),
            (Some(Axis::OutputTokens), &report.output_tokens),
            (tokens_axis, &report.tokens),
        ];
        for (axis, r) in mapped {
            let Some(axis) = axis else { continue };
            // The provider's figures are the whole key's: this coordinator holds its share.
            if let Some(limit) = r.limit.filter(|l| (1..=MAX_TOKENS).contains(l)) {
                let configured = pool.limit(axis).map(|v| config.part(v));
                let limit = config.feedback.bound_limit(config.part(limit), configured);
                let b = self.bucket(axis);
                if b.limit != Some(limit) {
                    let was_known = b.limit.is_some();
                    self.bucket_mut(axis).limit = Some(limit);
                    self.apply_cap(axis, config, !was_known);
                }
            }
            if let Some(remaining) = r.remaining {
                let b = self.bucket_mut(axis);
                let limit = b.limit.unwrap_or(0);
                let remaining = config.part(remaining.min(MAX_TOKENS));
                let resynced = b.resync(remaining, config.part(r.granularity), config.window_ms);
                if let Some(lowered) = resynced {
                    if lowered > 0 {
                        self.counters.resyncs = self.counters.resyncs.saturating_add(1);
                    }
                    let tolerance = u128::from(limit)
                        * u128::from(config.margin.agree_tolerance_permille)
                        / 1000;
                    let disagrees = u128::from(lowered) > tolerance;
                    agrees = Some(agrees.unwrap_or(true) && !disagrees);
                }
            }
        }
        if let Some(limit) = report
            .concurrent
            .limit
            .filter(|l| (1..=MAX_TOKENS).contains(l))
        {
            let configured = pool.max_concurrent.map(|v| config.part(v));
            self.max_concurrent = Some(config.feedback.bound_limit(config.part(limit), configured));
        }
        agrees.and_then(|a| self.compared(now, a, config, id))
    }

    /// A 429: counted; the pool paused until its retry time — the earlier of `retry-after`
    /// and the gateway's `reset_at` when both are given — except for a parallel-request 429,
    /// which pauses nothing and teaches an unknown concurrency limit instead; the margin cut
    /// when `cut`. The pause is at most `max_pause` ms.
    /// Returns the events that follow (at most a pause and a margin change).
    fn rate_limited(
        &mut self,
        (now, pool): (Millis, PoolId),
        on_lease: bool,
        cut: bool,
        report: &HeaderReport,
        config: &Config,
        max_pause: u64,
    ) -> [Option<Event>; 2] {
        self.counters.rate_limited = self.counters.rate_limited.saturating_add(1);
        if let Some(m) = self.minute(now) {
            m.rate_limited = m.rate_limited.saturating_add(1);
        }
        let mut paused = None;
        if report.exceeded != Some(RateAxis::Concurrent) {
            let exceeded_reset = match report.exceeded {
                Some(RateAxis::Requests) => report.requests.reset_after_ms,
                Some(RateAxis::Tokens) => report.tokens.reset_after_ms,
                Some(RateAxis::InputTokens) => report.input_tokens.reset_after_ms,
                Some(RateAxis::OutputTokens) => report.output_tokens.reset_after_ms,
                _ => None,
            };
            // A gateway's retry-after is the length of its window, an upper bound (seed
            // 000): with a reset time too, the earlier of the two is when the limit clears.
            let wait = match (report.retry_after_ms, report.reset_at_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
            .or(exceeded_reset)
            .unwrap_or(config.backoff.base_ms)
            .min(max_pause);
            let until = now.plus(wait);
            if until > self.paused_until {
                self.paused_until = until;
                paused = Some(Event::Paused { pool, until });
            }
        }
        // A parallel-request 429 while that limit is unknown teaches it: the provider
        // was full with the other calls in flight (this one counts in ours).
        if report.exceeded == Some(RateAxis::Concurrent) && self.max_concurrent.is_none() {
            let others = self.in_flight.saturating_sub(u64::from(on_lease));
            self.max_concurrent = Some(others.max(1));
        }
        let mut margin = None;
        if cut {
            self.counters.rate_limited_on_lease =
                self.counters.rate_limited_on_lease.saturating_add(1);
            let from = self.margin;
            self.margin = from
                .saturating_sub(config.margin.decrease_permille)
                .max(config.margin.floor_permille);
            self.margin_clock = now;
            self.set_caps(config, false);
            if self.margin != from {
                margin = Some(self.margin_moved(pool, from, MarginReason::RateLimited));
            }
        } else if self.margin >= config.margin.start_permille {
            // Any 429 holds a climb above the start: its interval starts again.
            self.margin_clock = now;
        }
        [paused, margin]
    }
}
