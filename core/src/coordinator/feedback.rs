//! Provider feedback: a response's status and rate-limit headers, fed back into the pool.

use super::Coordinator;
use crate::bucket::{Axis, Demand, Resync};
use crate::config::{Config, Counting, MAX_TOKENS, PoolConfig};
use crate::decision::{Event, MarginReason};
use crate::error::LeaseError;
use crate::headers::{HeaderReport, RateAxis};
use crate::ids::LeaseId;
use crate::ids::PoolId;
use crate::lease::{Entry, Phase};
use crate::pool::Revise;
use crate::pool::{Pool, counted_on_arrival};
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
        let in_flight = self.uncounted(p, report, lease);
        let Some(pl) = self.pools.get_mut(p as usize) else {
            return Err(LeaseError::UnknownPool);
        };
        let concurrency_known = pl.max_concurrent.is_some();
        let (taken_back, set) = pl.learn(
            (now, pool),
            (report, in_flight, status == 429),
            counting,
            &self.config,
            &self.config.pools[p as usize],
        );
        self.events.extend(taken_back);
        // The figures on this answer hold this lease's real usage where they set a level.
        if let Some(Entry {
            phase: Phase::Active { held, .. },
            ..
        }) = lease.and_then(|id| self.leases.get_mut(id))
        {
            *held |= set;
        }
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
            // One lease pauses the pool at most once, as it cuts the margin at most once: a
            // call gets one answer, so a second 429 on the same lease is a repeat (a host
            // reporting twice, or a member keeping the pool paused with its own lease).
            let mut first = true;
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
                first = !*rate_limited;
                if first {
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
                (lease.is_some(), first),
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

    /// What the provider's remaining figures in `report` may not hold yet of pool `p`'s
    /// leases in flight, per axis, and the grant instant up to which they hold them. An axis
    /// the provider charges when a call arrives (input, requests; OpenAI's combined
    /// tokens) holds every call granted at least `feedback.arrival_ms` before the answer was
    /// read, and maybe not those granted since (except the lease `answered`, which reached
    /// the provider before the figures on its answer were written, and a lease whose own
    /// answer already set a level); an axis charged as a call produces
    /// (Anthropic's output) holds none of the reservations in flight. Walks the lease table
    /// only when the report has a remaining figure.
    fn uncounted(&self, p: u32, report: &HeaderReport, answered: Option<LeaseId>) -> InFlight {
        let any = [
            &report.requests,
            &report.input_tokens,
            &report.output_tokens,
            &report.tokens,
        ]
        .iter()
        .any(|r| r.remaining.is_some());
        // Granted at least `feedback.arrival_ms` before the answer was read: arrived
        // before it was written.
        let arrived = self
            .now
            .0
            .checked_sub(self.config.feedback.arrival_ms)
            .map(Millis);
        let mut out = InFlight {
            demand: Demand::default(),
            held_up_to: arrived,
            written_after: self.now,
        };
        if !any {
            return out;
        }
        let counting = self.counting(p).unwrap_or_default();
        for e in self.leases.entries().filter(|e| e.pool == p) {
            let Phase::Active {
                granted_at,
                charged,
                gated,
                held: held_bits,
                ..
            } = e.phase
            else {
                continue;
            };
            // The answer's own lease reached the provider before its figures were written.
            let own = answered == Some(e.id);
            if own {
                out.written_after = granted_at;
            }
            let held = arrived.is_some_and(|at| granted_at <= at) || own;
            // Only what was taken from a level is held out of it (an axis learned after the
            // grant is charged its usage when the lease settles).
            for axis in Axis::ALL {
                let taken = gated & (1 << axis.index()) != 0;
                let held = held || held_bits & (1 << axis.index()) != 0;
                if taken && !(held && counted_on_arrival(axis, counting)) {
                    let i = axis.index();
                    out.demand.0[i] = out.demand.0[i].saturating_add(charged.get(axis));
                }
            }
        }
        out
    }
}

/// The reservations in flight a provider's remaining figures do not hold yet (see
/// `Coordinator::uncounted`), and the grant instant up to which the leases in flight are
/// held in the figures of the axes charged on arrival.
pub(crate) struct InFlight {
    demand: Demand,
    held_up_to: Option<Millis>,
    /// The earliest the figures may have been written: the answered lease's grant (now
    /// when the answer names none).
    written_after: Millis,
}

impl Pool {
    /// Takes in what the headers say of limits and remaining capacity.
    /// Limits move only within `config.feedback`'s bounds around the configured ones.
    /// Each remaining figure is compared with the model (see [`Pool::compared`]); returns
    /// the event of a margin taken back to its start by a disagreement.
    fn learn(
        &mut self,
        (now, id): (Millis, PoolId),
        (report, in_flight, limited): (&HeaderReport, InFlight, bool),
        counting: Counting,
        config: &Config,
        pool: &PoolConfig,
    ) -> (Option<Event>, u8) {
        self.counters.malformed_headers = self
            .counters
            .malformed_headers
            .saturating_add(u64::from(report.malformed));
        let tokens_axis = match counting {
            Counting::Openai => Some(Axis::Tokens),
            Counting::Anthropic => self.bucket(Axis::Tokens).limit.map(|_| Axis::Tokens),
        };
        // The axes charged on arrival whose level a figure set.
        let mut set_mask = 0u8;
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
                    let was = b.limit;
                    self.bucket_mut(axis).limit = Some(limit);
                    self.apply_cap(axis, config, was.is_none());
                    // A lower limit refills slower; a newly known one gates.
                    if was.is_none_or(|w| limit < w) {
                        self.revise(Revise::Recompute);
                    }
                }
            }
            if let Some(remaining) = r.remaining {
                // On an axis charged on arrival the level is the share of the figure the
                // estimates of the calls that spend it may take, less what no call of ours
                // claims yet, lowered or raised; on one charged as calls produce the figure
                // only lowers it.
                let (margin, start) = if axis == Axis::Requests {
                    (self.exact_margin, 1000)
                } else {
                    (self.margin, config.margin.start_permille)
                };
                // A 429 (this answer), or one or a disagreement within a clean interval,
                // says the model is ahead of the provider: keep the whole reserve.
                let evidence = limited
                    || self
                        .outside_at
                        .is_some_and(|at| now < at.plus(config.margin.clean_interval_ms));
                // The calls the level goes to are estimates (none on the requests axis).
                let spend = if axis == Axis::Requests {
                    margin
                } else {
                    self.spend_permille(config)
                };
                let how = if counted_on_arrival(axis, counting) && margin >= start && !evidence {
                    Resync::Follow {
                        uncounted: in_flight.demand.get(axis),
                        spend,
                    }
                } else {
                    Resync::Lower
                };
                // A figure above what a lower one read earlier allows was written before
                // it: the level follows the lower one.
                let mut figure = config.part(remaining.min(MAX_TOKENS));
                if counted_on_arrival(axis, counting) {
                    figure = self.figure_bound(
                        axis,
                        figure,
                        (now, in_flight.written_after),
                        config.window_ms,
                    );
                }
                let b = self.bucket_mut(axis);
                let limit = b.limit.unwrap_or(0);
                let figure = (figure, config.part(r.granularity));
                let before = b.available(config.window_ms);
                let resynced = b.resync(figure, how, config.window_ms);
                // A level lowered is debt the bounds did not assume.
                let lowered = before.saturating_sub(b.available(config.window_ms));
                if lowered > 0 {
                    let mut excess = Demand::default();
                    excess.0[axis.index()] = u64::try_from(lowered).unwrap_or(u64::MAX);
                    self.revise_for_debt(&excess, config.window_ms);
                }
                if let Some((above, set)) = resynced {
                    if set && above > 0 {
                        self.counters.resyncs = self.counters.resyncs.saturating_add(1);
                    }
                    // The leases the figure holds are settled on this axis as they are.
                    if set && counted_on_arrival(axis, counting) {
                        self.counted[axis.index()] = in_flight.held_up_to;
                        set_mask |= 1 << axis.index();
                    }
                    let tolerance = u128::from(limit)
                        * u128::from(config.margin.agree_tolerance_permille)
                        / 1000;
                    let disagrees = u128::from(above) > tolerance;
                    if disagrees {
                        self.outside_at = Some(now);
                    }
                    agrees = Some(agrees.unwrap_or(true) && !disagrees);
                    // Fewer requests left than the coordinator counted: someone else sends
                    // on this key.
                    if disagrees && axis == Axis::Requests {
                        self.exact_evidence(now, config);
                    }
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
        (
            agrees.and_then(|a| self.compared(now, a, config, id)),
            set_mask,
        )
    }

    /// A 429: counted; the pool paused until its retry time — the earlier of `retry-after`
    /// and the gateway's `reset_at` when both are given — except for a parallel-request 429,
    /// which pauses nothing and teaches an unknown concurrency limit instead, and a repeat
    /// on a lease that already had one (`first` false), which pauses nothing more; the
    /// margin cut when `cut`. The pause is at most `max_pause` ms.
    /// Returns the events that follow (at most a pause and a margin change).
    fn rate_limited(
        &mut self,
        (now, pool): (Millis, PoolId),
        (on_lease, first): (bool, bool),
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
        if first && report.exceeded != Some(RateAxis::Concurrent) {
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
            self.limited_until = self.limited_until.max(until);
            if until > self.paused_until {
                self.pause_until(now, until);
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
                self.revise(Revise::Recompute);
                margin = Some(self.margin_moved(pool, from, MarginReason::RateLimited));
            }
        } else if self.margin >= config.margin.start_permille {
            // Any 429 holds a climb above the start: its interval starts again.
            self.margin_clock = now;
        }
        // A request is counted exactly, so a 429 about requests or calls in flight (or
        // about nothing it names) on a lease granted within every limit is evidence of use
        // outside the coordinator: the exact axes' margin is cut. One about tokens is not.
        let about = report.limit_hit();
        let on_tokens = matches!(
            about,
            Some(RateAxis::InputTokens | RateAxis::OutputTokens | RateAxis::Tokens)
        );
        if cut && !on_tokens {
            self.exact_evidence(now, config);
        } else {
            self.exact_clock = now;
        }
        if cut {
            self.outside_at = Some(now);
        }
        [paused, margin]
    }
}
