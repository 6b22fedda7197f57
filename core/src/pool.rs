//! A pool: the buckets of one provider limit group, its margin, pause, fair queue and
//! per-minute figures, and the arithmetic of taking, refunding and waiting for capacity.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::bucket::{Axis, Bucket, Demand, SHARE_UNIT};
use crate::config::{Config, Counting, MAX_TOKENS};
use crate::decision::{Event, MarginReason};
use crate::history::History;
use crate::ids::PoolId;
use crate::lease::Phase;
use crate::metrics::{MINUTE_MS, MinuteStats, PoolCounters, WaitHistogram};
use crate::queue::Queue;
use crate::time::Millis;

const RAMP_STEPS: u64 = 10;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pool {
    pub(crate) buckets: [Bucket; 4],
    /// The provider's limit on calls in flight (`None` while unknown); a grant needs
    /// `in_flight` below it times `exact_margin` ([`Pool::concurrency_free`]).
    pub(crate) max_concurrent: Option<u64>,
    pub(crate) in_flight: u64,
    /// The margin of the token axes (input, output, combined tokens), thousandths: their
    /// reservations are estimates.
    pub(crate) margin: u32,
    /// The margin of the axes counted exactly (requests, concurrency), thousandths: 1000
    /// (none) unless there is evidence of use outside the coordinator — the provider's
    /// remaining requests below the core's count, or a 429 that is not about tokens — which
    /// cuts it like the token margin; it recovers one step a clean interval up to 1000.
    #[serde(default = "full_permille", skip_serializing_if = "is_full_permille")]
    pub(crate) exact_margin: u32,
    /// The exact axes' margin's last cut or step (or any 429): its next step is one clean
    /// interval later.
    #[serde(default)]
    pub(crate) exact_clock: Millis,
    /// Per axis, the grant instant up to which the leases in flight are counted in the
    /// level as the provider's remaining figure had them (see [`Pool::resync`]): a lease
    /// granted then or earlier is settled on that axis with no refund and no debt, its
    /// real usage being in the figure already.
    #[serde(default, skip_serializing_if = "all_none")]
    pub(crate) counted: [Option<Millis>; 4],
    /// Per axis, the least the provider's remaining figures allow at `at`: each figure
    /// grown at the whole limit's refill since it may have been written, the least of them
    /// (grown on from `at` at the same rate). Answers are read in no fixed order, so a
    /// figure written before calls that have since reached the provider may be read after
    /// a fresher, lower one; a level is never raised past this bound (see
    /// [`Pool::figure_bound`]).
    #[serde(default, skip_serializing_if = "all_none")]
    pub(crate) figures: [Option<(u64, Millis)>; 4],
    /// The last evidence that the model is above what the provider counts (a 429 that cut
    /// the margin, or remaining figures below the model by more than the tolerance): for a
    /// clean interval after it the level keeps the whole reserve below the figure and is
    /// only lowered, instead of following it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) outside_at: Option<Millis>,
    /// How the waits of the pool's latest tickets granted from the queue compared with what
    /// was expected of them by the demand in line (their wait ÷ the refill time of the
    /// demand queued ahead and their own when they were queued, thousandths), small calls
    /// and big ones apart (see `weight::small`): what a ticket's expected grant scales its
    /// own refill time by — later arrivals placed ahead, refunds, calls let through.
    #[serde(default, skip_serializing_if = "no_ratios")]
    pub(crate) wait_ratios: [History; 2],
    /// What moved the queued tickets' bounds during the input under way (cleared when the
    /// promises are kept at its end: never set between inputs, so not stored).
    #[serde(skip)]
    pub(crate) revise: Option<Revise>,
    /// The debt delay, ms: the sum of every delay debts (calls above their reservation, a
    /// level lowered to the provider's figure) have put on the pool's promises. A ticket
    /// whose promise had a slack of `s` over its bound when the delay was `d` needs
    /// checking again only once the delay passes `d + s` (see `coordinator/promise.rs`).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub(crate) delay: u64,
    /// Last 429 or last margin step: the next step is one clean interval later.
    pub(crate) margin_clock: Millis,
    pub(crate) ramp_step: u64,
    /// Grants resume then: the later of the provider's pause and the operator's hold.
    pub(crate) paused_until: Millis,
    /// The provider's part of the pause (its 429s' retry times).
    #[serde(default)]
    pub(crate) limited_until: Millis,
    /// The operator's hold in force ([`crate::Coordinator::hold`]), which a later hold may
    /// shorten or lift; `Millis(0)`: none.
    #[serde(default)]
    pub(crate) held_until: Millis,
    /// Buckets are refilled up to this instant.
    pub(crate) updated: Millis,
    pub(crate) queue: Queue,
    pub(crate) vtime: u128,
    pub(crate) counters: PoolCounters,
    pub(crate) minutes: Vec<MinuteStats>,
    /// The minute last written and its index in `minutes` (`minute % minutes.len()`), so
    /// the common case, another event in the same minute, needs no division.
    pub(crate) minute_now: u64,
    pub(crate) minute_slot: u32,
    pub(crate) waits: WaitHistogram,
    /// Since when the margin has been within `margin.floor_alert_band_permille` of its
    /// floor, and whether [`Event::MarginAtFloor`](crate::Event::MarginAtFloor) was raised
    /// for that stretch.
    #[serde(default)]
    pub(crate) floor_since: Option<Millis>,
    #[serde(default)]
    pub(crate) floor_alerted: bool,
    /// The margin when the watch last looked: a rise (a clean interval passed, so the 429s
    /// paused) starts the stretch again.
    #[serde(default)]
    pub(crate) floor_level: u32,
    /// Output tokens of the pool's latest completed calls, any agent's: the output
    /// reservation of an agent with no history of its own here.
    #[serde(default, skip_serializing_if = "History::is_empty")]
    pub(crate) outputs: History,
    /// Input underestimates (thousandths of what the provider counted; 0 for an estimate
    /// at or above it) of the pool's latest completed calls, any agent's: what a climb of
    /// the margin above its start reads.
    #[serde(default, skip_serializing_if = "History::is_empty")]
    pub(crate) errors: History,
    /// How many of `errors` are within `margin.confirm_error_permille`: their median is
    /// within it when at least half of them are (kept as they change, so a wake-up needs
    /// no sort).
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub(crate) errors_within: u8,
    /// When the provider's remaining-capacity headers last agreed with the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) agreed_at: Option<Millis>,
    /// Why the margin last moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) margin_reason: Option<MarginReason>,
}

const SHARE_UNIT_U128: u128 = SHARE_UNIT as u128;

/// What may have moved a pool's queued tickets past their promises during an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Revise {
    /// Debt the bound did not assume: every promise moves by at most this many ms.
    By(u64),
    /// Something else (a pause, a cut, a weight, a renewal): the bound from the state.
    Recompute,
}

/// `amount` as parts of `limit` (> 0), rounded up; in 64-bit arithmetic when it fits.
#[inline]
fn share_of(amount: u64, limit: u64) -> u64 {
    if let Some(scaled) = amount.checked_mul(SHARE_UNIT) {
        return scaled.div_ceil(limit);
    }
    let share = (u128::from(amount) * SHARE_UNIT_U128).div_ceil(u128::from(limit));
    u64::try_from(share).unwrap_or(u64::MAX)
}

/// Records a completed call's input underestimate (thousandths) in `errors`,
/// keeping `errors_within` its count within `bound`.
pub(crate) fn note_error(pool: &mut Pool, error: u32, bound: u32) {
    let keep = crate::history::CAPACITY;
    let bound = u64::from(bound);
    if pool.errors.leaving(keep).is_some_and(|e| e <= bound) {
        pool.errors_within = pool.errors_within.saturating_sub(1);
    }
    pool.errors.push(u64::from(error), keep);
    if u64::from(error) <= bound {
        pool.errors_within = pool.errors_within.saturating_add(1);
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero_u8(n: &u8) -> bool {
    *n == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn full_permille() -> u32 {
    1000
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_full_permille(n: &u32) -> bool {
    *n == 1000
}

fn no_ratios(r: &[History; 2]) -> bool {
    r.iter().all(History::is_empty)
}

/// Whether no axis has a value (what a per-axis field that is not written out skips).
fn all_none<T>(a: &[Option<T>; 4]) -> bool {
    a.iter().all(Option::is_none)
}

/// Whether the provider charges `axis` when a call arrives under `counting` (so its
/// remaining figure holds every call that arrived before the answer it came with), rather
/// than as the call produces (Anthropic's output, and its combined axis, which holds it).
pub(crate) fn counted_on_arrival(axis: Axis, counting: Counting) -> bool {
    match axis {
        Axis::InputTokens | Axis::Requests => true,
        Axis::OutputTokens => false,
        Axis::Tokens => counting == Counting::Openai,
    }
}

pub(crate) fn ceil_div(a: u128, b: u128) -> u128 {
    if b == 0 { u128::MAX } else { a.div_ceil(b) }
}

impl Pool {
    pub(crate) fn new(config: &Config, index: usize, now: Millis) -> Pool {
        let p = config.pools.get(index);
        // This coordinator's share of each configured limit (`Config::share`).
        let limit = |f: fn(&crate::config::PoolConfig) -> Option<u64>| {
            p.and_then(f).map(|v| config.part(v))
        };
        let mut pool = Pool {
            buckets: [
                Bucket::new(limit(|p| p.input_tokens_per_minute)),
                Bucket::new(limit(|p| p.output_tokens_per_minute)),
                Bucket::new(limit(|p| p.tokens_per_minute)),
                Bucket::new(limit(|p| p.requests_per_minute)),
            ],
            max_concurrent: limit(|p| p.max_concurrent),
            in_flight: 0,
            margin: config.margin.start_permille,
            exact_margin: 1000,
            exact_clock: now,
            counted: [None; 4],
            figures: [None; 4],
            outside_at: None,
            wait_ratios: [History::default(), History::default()],
            revise: None,
            delay: 0,
            margin_clock: now,
            ramp_step: if config.slow_start.is_some() {
                0
            } else {
                RAMP_STEPS
            },
            paused_until: now,
            limited_until: now,
            held_until: Millis(0),
            updated: now,
            queue: Queue::new(),
            vtime: 0,
            counters: PoolCounters::default(),
            minutes: alloc::vec![MinuteStats::default(); config.metrics_minutes as usize],
            minute_now: 0,
            minute_slot: 0,
            waits: WaitHistogram::new(),
            floor_since: None,
            floor_alerted: false,
            floor_level: 0,
            outputs: History::default(),
            errors: History::default(),
            errors_within: 0,
            agreed_at: None,
            margin_reason: None,
        };
        // Anthropic charges input when a call arrives (output as it is produced: ours is
        // reserved as a learned figure and corrected on settle; OpenAI pre-charges its one
        // figure at arrival the way we reserve it).
        pool.bucket_mut(Axis::InputTokens).charged_on_arrival =
            p.is_some_and(|p| p.counting == Counting::Anthropic);
        pool.set_caps(config, true);
        pool
    }

    pub(crate) fn ramp_permille(&self, config: &Config) -> u64 {
        match config.slow_start {
            Some(s) if self.ramp_step < RAMP_STEPS => {
                let start = u64::from(s.start_permille);
                start + (1000 - start) * self.ramp_step / RAMP_STEPS
            }
            _ => 1000,
        }
    }

    /// The margin of `axis`: the token margin, or on the requests axis (counted exactly:
    /// a request is one request) the exact axes' margin.
    pub(crate) fn margin_of(&self, axis: Axis) -> u32 {
        if axis == Axis::Requests {
            self.exact_margin
        } else {
            self.margin
        }
    }

    pub(crate) fn cap_for(&self, axis: Axis, limit: u64, config: &Config) -> u64 {
        let ramp = if axis == Axis::Requests {
            1000
        } else {
            self.ramp_permille(config)
        };
        let margin = u128::from(self.margin_of(axis));
        let cap = u128::from(limit) * margin * u128::from(ramp) / 1_000_000;
        u64::try_from(cap).unwrap_or(u64::MAX).max(1)
    }

    /// Capacity ignoring the ramp: the most the pool can ever hand out in a window at
    /// this axis's margin. Kept in [`Bucket::nominal`] by [`Pool::apply_cap`].
    pub(crate) fn nominal_cap(&self, axis: Axis, limit: u64) -> u64 {
        scale_permille(limit, self.margin_of(axis)).max(1)
    }

    /// The most calls the pool lets be in flight: the provider's limit times the exact
    /// axes' margin (the limit itself unless use outside the coordinator was seen), at
    /// least one; `None` while the limit is unknown.
    pub(crate) fn concurrency_cap(&self) -> Option<u64> {
        self.max_concurrent
            .map(|m| scale_permille(m, self.exact_margin).max(1))
    }

    /// Sets an axis's effective and nominal capacity from its limit, the margin and the
    /// ramp (nothing while the limit is unknown).
    pub(crate) fn apply_cap(&mut self, axis: Axis, config: &Config, start_full: bool) {
        if let Some(limit) = self.bucket(axis).limit {
            let cap = self.cap_for(axis, limit, config);
            let nominal = self.nominal_cap(axis, limit);
            let b = self.bucket_mut(axis);
            b.nominal = nominal;
            let was = b.cap;
            b.set_cap(cap, config.window_ms, start_full);
            // A lower capacity refills slower; a higher one fills a bucket further before
            // a ticket above the old one is granted from it: either can move a bound.
            if cap != was && !self.queue.is_empty() {
                self.revise(Revise::Recompute);
            }
        }
    }

    pub(crate) fn set_caps(&mut self, config: &Config, start_full: bool) {
        for axis in Axis::ALL {
            self.apply_cap(axis, config, start_full);
        }
    }

    pub(crate) fn bucket(&self, axis: Axis) -> &Bucket {
        &self.buckets[axis.index()]
    }

    pub(crate) fn bucket_mut(&mut self, axis: Axis) -> &mut Bucket {
        &mut self.buckets[axis.index()]
    }

    pub(crate) fn refill_to(&mut self, t: Millis, window: u64) {
        let elapsed = t.since(self.updated);
        if elapsed > 0 {
            for b in &mut self.buckets {
                b.refill(elapsed, window);
            }
            self.updated = t;
        }
    }

    /// When a margin next rises, if nothing changes before: the token margin's or the
    /// exact axes' (see [`Pool::next_token_step`], [`Pool::next_exact_step`]).
    pub(crate) fn next_margin_step(&self, config: &Config) -> Option<Millis> {
        match (self.next_token_step(config), self.next_exact_step(config)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the exact axes' margin next rises: one clean interval after its last cut or
    /// step (or the last 429) while it is below 1000.
    fn next_exact_step(&self, config: &Config) -> Option<Millis> {
        let m = &config.margin;
        (self.exact_margin < 1000 && m.increase_permille > 0)
            .then(|| self.exact_clock.plus(m.clean_interval_ms))
    }

    /// The evidence of use outside the coordinator on the axes counted exactly (a 429 about
    /// requests or calls in flight, the provider's remaining requests below the count):
    /// their margin is cut by `margin.decrease_permille`, down to the floor.
    pub(crate) fn exact_evidence(&mut self, now: Millis, config: &Config) {
        let m = &config.margin;
        self.exact_margin = self
            .exact_margin
            .saturating_sub(m.decrease_permille)
            .max(m.floor_permille);
        self.exact_clock = now;
        self.apply_cap(Axis::Requests, config, false);
        self.revise(Revise::Recompute);
    }

    /// When the token margin next rises, if nothing changes before: one clean interval
    /// after the last cut or step while below the start; above it, at the first instant
    /// from then on at which the evidence holds (see [`Pool::confirmed_at`]), none while it
    /// does not.
    fn next_token_step(&self, config: &Config) -> Option<Millis> {
        let m = &config.margin;
        if self.margin < m.start_permille {
            return (m.increase_permille > 0).then(|| self.margin_clock.plus(m.clean_interval_ms));
        }
        if self.margin >= m.ceiling_permille || m.confirm_step_permille == 0 {
            return None;
        }
        self.confirmed_at(self.margin_clock.plus(m.clean_interval_ms), config)
    }

    /// The share (thousandths) of a remaining figure on a token axis that may be handed
    /// out in estimates: the calls it goes to are charged what they really use, up to
    /// `1000 / share` times their estimates. Once `margin.confirm_samples` calls have
    /// settled it is `1000 −` the largest underestimate among the pool's latest completed
    /// calls (all of the figure when none was under), and never less than the margin; before
    /// that, the margin.
    pub(crate) fn spend_permille(&self, config: &Config) -> u32 {
        if self.errors.len() < config.margin.confirm_samples as usize {
            return self.margin;
        }
        let worst = self.errors.percentile(1000).unwrap_or(1000);
        let learned = 1000u32.saturating_sub(u32::try_from(worst).unwrap_or(1000));
        learned.max(self.margin)
    }

    /// The first instant at or after `due` at which a rise above the start is confirmed,
    /// if the evidence as it stands holds then: the pool's latest completed calls
    /// (`margin.confirm_samples` of them at least) underestimated by at most
    /// `margin.confirm_error_permille` at the median (an overestimate counts as none), and the provider's remaining headers
    /// having agreed with the model within the clean interval before that instant. The
    /// evidence only changes on an input, so the instant is exact whenever the host wakes.
    fn confirmed_at(&self, due: Millis, config: &Config) -> Option<Millis> {
        let m = &config.margin;
        let agreed = self.agreed_at?;
        // The median (nearest rank: the ⌈n/2⌉-th smallest) is within the bound when at
        // least ⌈n/2⌉ of the n figures are.
        let n = self.errors.len();
        if n < m.confirm_samples as usize || usize::from(self.errors_within) < n.div_ceil(2) {
            return None;
        }
        let at = due.max(agreed);
        (at.since(agreed) < m.clean_interval_ms).then_some(at)
    }

    /// What the provider's remaining figures said of the model: they `agree` (each within
    /// `margin.agree_tolerance_permille` of its limit below ours, or above it), or some
    /// bucket was lowered by more, which holds the margin at its start (taking it back
    /// there from above). Returns the event of a margin taken back.
    pub(crate) fn compared(
        &mut self,
        now: Millis,
        agree: bool,
        config: &Config,
        pool: PoolId,
    ) -> Option<Event> {
        if agree {
            self.agreed_at = Some(now);
            return None;
        }
        self.agreed_at = None;
        let start = config.margin.start_permille;
        if self.margin < start {
            return None;
        }
        self.margin_clock = now;
        let from = self.margin;
        if from == start {
            return None;
        }
        self.margin = start;
        self.set_caps(config, false);
        self.revise(Revise::Recompute);
        Some(self.margin_moved(pool, from, MarginReason::HeadersDisagreed))
    }

    /// Records a move of the margin from `from` to the current one and its event.
    pub(crate) fn margin_moved(&mut self, pool: PoolId, from: u32, reason: MarginReason) -> Event {
        self.margin_reason = Some(reason);
        Event::MarginChanged {
            pool,
            from_permille: from,
            to_permille: self.margin,
            reason,
        }
    }

    pub(crate) fn next_ramp_step(&self, config: &Config, started: Millis) -> Option<Millis> {
        let s = config.slow_start?;
        (self.ramp_step < RAMP_STEPS).then(|| {
            let at = u128::from(self.ramp_step + 1) * u128::from(s.ramp_ms);
            started.plus(u64::try_from(at.div_ceil(u128::from(RAMP_STEPS))).unwrap_or(u64::MAX))
        })
    }

    /// Moves the pool to `t`, applying margin steps and ramp steps at their exact instants
    /// so the result does not depend on how often the host calls in.
    pub(crate) fn advance(
        &mut self,
        t: Millis,
        config: &Config,
        started: Millis,
        pool: PoolId,
        events: &mut VecDeque<Event>,
    ) {
        loop {
            let margin_at = self.next_token_step(config);
            let exact_at = self.next_exact_step(config);
            let ramp_at = self.next_ramp_step(config, started);
            let Some(next) = [margin_at, exact_at, ramp_at].into_iter().flatten().min() else {
                break;
            };
            if next > t {
                break;
            }
            self.refill_to(next, config.window_ms);
            if exact_at == Some(next) {
                let step = config.margin.increase_permille;
                self.exact_margin = self.exact_margin.saturating_add(step).min(1000);
                self.exact_clock = next;
            }
            if margin_at == Some(next) {
                // Recovering stops at the start; beyond it each step is confirmed.
                let m = &config.margin;
                let from = self.margin;
                let (step, top, reason) = if from < m.start_permille {
                    (
                        m.increase_permille,
                        m.start_permille,
                        MarginReason::Recovered,
                    )
                } else {
                    (
                        m.confirm_step_permille,
                        m.ceiling_permille,
                        MarginReason::Confirmed,
                    )
                };
                self.margin = from.saturating_add(step).min(top);
                self.margin_clock = next;
                events.push_back(self.margin_moved(pool, from, reason));
            }
            if ramp_at == Some(next) {
                self.ramp_step += 1;
            }
            self.set_caps(config, false);
        }
        self.refill_to(t, config.window_ms);
    }

    pub(crate) fn minute(&mut self, now: Millis) -> Option<&mut MinuteStats> {
        let minute = now.0 / MINUTE_MS;
        if minute != self.minute_now {
            let len = self.minutes.len() as u64;
            self.minute_slot = u32::try_from(minute % len.max(1)).unwrap_or(0);
            self.minute_now = minute;
        }
        let slot = self.minutes.get_mut(self.minute_slot as usize)?;
        // A slot still holding an older minute starts afresh. (A slot equal to the default
        // one holds minute 0 with nothing in it: restarting it changes nothing.)
        if slot.minute != minute {
            *slot = MinuteStats {
                minute,
                ..MinuteStats::default()
            };
        }
        Some(slot)
    }

    pub(crate) fn fits(&self, d: &Demand, window: u64) -> bool {
        Axis::ALL
            .iter()
            .all(|a| self.bucket(*a).fits(d.get(*a), window))
    }

    pub(crate) fn concurrency_free(&self) -> bool {
        self.concurrency_cap().is_none_or(|m| self.in_flight < m)
    }

    /// Grants `demand` now: takes the reservation and a concurrency slot, counts the grant,
    /// and returns the lease's active phase.
    /// `lag_ms`: how long the call may take to reach the provider (see [`Bucket::take`]).
    pub(crate) fn admit(
        &mut self,
        demand: Demand,
        (now, ttl, lag_ms): (Millis, u64, u64),
        window: u64,
    ) -> Phase {
        let gated = self.take(&demand, lag_ms, window);
        self.in_flight = self.in_flight.saturating_add(1);
        if let Some(m) = self.minute(now) {
            m.granted = m.granted.saturating_add(1);
        }
        Phase::Active {
            granted_at: now,
            expires_at: now.plus(ttl),
            charged: demand,
            gated,
            rate_limited: false,
            grant_level: self.bucket(Axis::InputTokens).level,
            held: 0,
        }
    }

    /// Takes `d` from every gating axis; returns the mask of axes it was taken from.
    pub(crate) fn take(&mut self, d: &Demand, lag_ms: u64, window: u64) -> u8 {
        let mut gated = 0u8;
        for a in Axis::ALL {
            let b = self.bucket_mut(a);
            if b.gates() {
                b.take(d.get(a), lag_ms, window);
                gated |= 1 << a.index();
            }
        }
        gated
    }

    /// Settles a lease granted at `granted_at`: the difference is refunded or charged on
    /// axes it was taken from; an axis that became known after the grant is charged the
    /// actual usage. An axis whose level was last set from the provider's figure while the
    /// figure already held this lease (see [`Pool::counted`]), or from a figure on its own
    /// answer (`held`), is left as it is: the real usage is in it.
    ///
    /// Returns the usage beyond what the lease had taken from each axis: the debt no bound
    /// assumed.
    pub(crate) fn reconcile(
        &mut self,
        (charged, gated, granted_at, held): (&Demand, u8, Millis, u8),
        (grant_level, elapsed): (i128, u64),
        actual: &Demand,
        window: u64,
    ) -> Demand {
        let mut excess = Demand::default();
        for axis in Axis::ALL {
            if self.counted[axis.index()].is_some_and(|upto| granted_at <= upto)
                || held & (1 << axis.index()) != 0
            {
                continue;
            }
            let b = self.bucket_mut(axis);
            let i = axis.index();
            if gated & (1 << i) != 0 {
                let room = b.refund_room(grant_level, elapsed, window);
                b.release(charged.get(axis), actual.get(axis), room, window);
                excess.0[i] = actual.get(axis).saturating_sub(charged.get(axis));
            } else {
                b.charge(actual.get(axis), window);
                excess.0[i] = if b.gates() { actual.get(axis) } else { 0 };
            }
        }
        excess
    }

    /// Takes in a remaining figure of `axis` read at `now`, written at `written_after` or
    /// later (the answered call's grant: it reached the provider first), and returns what
    /// it allows: the figure, or less if the bound of the figures read before is below it
    /// (this one was written first, before calls that since reached the provider). Each
    /// figure bounds what the provider has now from above by itself grown at the limit's
    /// refill since it may have been written (calls reaching the provider only take from
    /// it); the least such bound is kept (`Pool::figures`).
    pub(crate) fn figure_bound(
        &mut self,
        axis: Axis,
        figure: u64,
        (now, written_after): (Millis, Millis),
        window: u64,
    ) -> u64 {
        let limit = self.bucket(axis).limit.unwrap_or(MAX_TOKENS);
        let grown = |f: u64, since: Millis| {
            let refill =
                u128::from(now.since(since)) * u128::from(limit) / u128::from(window.max(1));
            u64::try_from(u128::from(f).saturating_add(refill)).unwrap_or(u64::MAX)
        };
        let slot = &mut self.figures[axis.index()];
        let before = slot.map_or(u64::MAX, |(f, at)| grown(f, at));
        let allowed = figure.min(before).min(limit);
        let bound = before.min(grown(figure, written_after)).min(limit);
        *slot = Some((bound, now));
        allowed
    }

    /// `usage` (as `request::used` computes it: tokens = input + output) with input and
    /// output each at most their limit where it is known, and tokens their sum, at most its
    /// own limit.
    pub(crate) fn bounded_usage(&self, usage: Demand) -> Demand {
        let bound = |axis: Axis, v: u64| self.bucket(axis).limit.map_or(v, |l| v.min(l));
        let input = bound(Axis::InputTokens, usage.get(Axis::InputTokens));
        let output = bound(Axis::OutputTokens, usage.get(Axis::OutputTokens));
        let tokens = bound(Axis::Tokens, input.saturating_add(output));
        Demand([input, output, tokens, usage.get(Axis::Requests)])
    }

    /// The dominant share of `d`: its largest share of a known limit across the rate axes
    /// (input, output, combined tokens, requests), in [`SHARE_UNIT`] parts of that limit,
    /// rounded up, at most [`MAX_TOKENS`]; 0 while no limit is known. What a call costs in
    /// the fair order (see `Coordinator::request_lease`): it pays for what it takes of the
    /// limit that binds it, not for its token sum.
    #[inline]
    pub(crate) fn dominant_share(&self, d: &Demand) -> u64 {
        let mut worst = 0u64;
        for a in Axis::ALL {
            if let Some(limit) = self.bucket(a).limit.filter(|l| *l > 0) {
                worst = worst.max(share_of(d.get(a), limit));
            }
        }
        worst.min(MAX_TOKENS)
    }

    /// The most a total dominant share of `share` can hold on each rate axis: `share`
    /// parts of each known limit (rounded up), 0 on an axis whose limit is unknown (it
    /// does not gate). The inverse of [`Pool::dominant_share`], for the ETA's bound.
    pub(crate) fn demand_of_share(&self, share: u64) -> Demand {
        let mut out = Demand::default();
        for a in Axis::ALL {
            if let Some(limit) = self.bucket(a).limit {
                out.0[a.index()] = match share.checked_mul(limit) {
                    // The common case, a 64-bit division by a constant.
                    Some(parts) => parts.div_ceil(SHARE_UNIT),
                    None => {
                        let amount =
                            (u128::from(share) * u128::from(limit)).div_ceil(SHARE_UNIT_U128);
                        u64::try_from(amount).unwrap_or(u64::MAX)
                    }
                };
            }
        }
        out
    }

    /// Whether a grant may be made at `now` at all: not paused, a concurrency slot free, and
    /// a lease of `ttl` not born expired at the end of time.
    #[inline]
    pub(crate) fn can_admit(&self, now: Millis, ttl: u64) -> bool {
        now >= self.paused_until && now.plus(ttl) > now && self.concurrency_free()
    }

    /// The first axis on which `worst` (the cold-cache reservation) exceeds the limit
    /// itself: a call the provider refuses as well, whatever the wait (a single request
    /// above a per-minute limit gets a 429 that no retry clears). A call within the limit
    /// but above what the margin hands out in a window is not refused: it is granted when
    /// the bucket is full (see [`Bucket::fits`]), so it waits at most the time the bucket
    /// takes to fill, one window from empty.
    #[inline]
    pub(crate) fn exceeds_limit(&self, worst: &Demand) -> Option<Axis> {
        Axis::ALL
            .into_iter()
            .find(|&axis| self.bucket(axis).limit.is_some_and(|l| worst.get(axis) > l))
    }

    /// `d` with each gating axis at most its capacity: what a request waits for in line
    /// (one larger than the capacity is granted once the bucket is full).
    #[inline]
    pub(crate) fn within_caps(&self, d: &Demand) -> Demand {
        let mut out = *d;
        for a in Axis::ALL {
            let b = self.bucket(a);
            if b.gates() {
                out.0[a.index()] = out.get(a).min(b.cap);
            }
        }
        out
    }

    /// When a ticket with `need` (its own demand plus all queued ahead of it) in line would
    /// be granted, if estimates hold: refill until the total fits, not before the pause
    /// ends, not before `now`.
    #[inline]
    pub(crate) fn eta(&self, now: Millis, need: &Demand, window: u64) -> Millis {
        self.updated
            .plus(self.ms_until_total(need, window))
            .max(self.paused_until)
            .max(now)
    }

    /// Ms from `updated` until a total of `need` fits on every axis (no full-bucket rule:
    /// this is for sums of several requests).
    pub(crate) fn ms_until_total(&self, need: &Demand, window: u64) -> u64 {
        let mut worst = 0u128;
        for a in Axis::ALL {
            let b = self.bucket(a);
            if !b.gates() {
                continue;
            }
            let want = crate::bucket::product(need.get(a), window);
            let deficit = want.saturating_sub(b.level);
            if deficit > 0 {
                let deficit = deficit.unsigned_abs();
                let ms = match u64::try_from(deficit) {
                    // The common case, without a 128-bit division.
                    Ok(d) if b.cap > 0 => u128::from(d.div_ceil(b.cap)),
                    _ => ceil_div(deficit, u128::from(b.cap)),
                };
                worst = worst.max(ms.saturating_add(u128::from(b.lag_ms)));
            }
        }
        u64::try_from(worst).unwrap_or(u64::MAX)
    }
}

/// `v × permille / 1000`, rounded down: in 64 bits where the product fits (it is asked on
/// every admission; a 128-bit division is a library call), in 128 otherwise.
pub(crate) fn scale_permille(v: u64, permille: u32) -> u64 {
    match v.checked_mul(u64::from(permille)) {
        Some(product) => product / 1000,
        None => u64::try_from(u128::from(v) * u128::from(permille) / 1000).unwrap_or(u64::MAX),
    }
}
