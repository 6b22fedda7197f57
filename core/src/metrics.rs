//! Metrics: per-minute usage against each limit, counters, queue-wait percentiles,
//! per-agent state and estimate error, and fleet-sizing advice.
//!
//! Everything here is integer (thousandths for ratios) so that every runtime reports the
//! same figures; bindings may convert to floats for display. The types are here, and so is
//! their assembly from a pool's and the agent table's state ([`Coordinator::metrics`] calls it).
//!
//! [`Coordinator::metrics`]: crate::Coordinator::metrics

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::bucket::{Axis, Demand};
use crate::decision::MarginReason;
use crate::headers::RateAxis;
use crate::ids::AgentId;
use crate::time::Millis;

/// Milliseconds in a metrics minute (fixed, whatever the rate window).
pub const MINUTE_MS: u64 = 60_000;

/// One minute of one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteStats {
    /// Minute number: `now / 60000`.
    pub minute: u64,
    /// Usage settled in this minute (plus the reservation of leases reaped in it), per axis.
    pub used: Demand,
    /// Leases granted (at once or from the queue).
    pub granted: u32,
    /// Requests that had to queue.
    pub queued: u32,
    /// Requests rejected.
    pub rejected: u32,
    /// 429 responses reported.
    pub rate_limited: u32,
    /// Time agents spent waiting on quota, ms, counted in the minute the wait was told or
    /// ended: queue waits of tickets granted in it, and the waits the call lifecycle told
    /// calls to sit out after a refusal or a 429. What the fleet advice reads demand from.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub waited_ms: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Counters since the coordinator started, per pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCounters {
    /// Leases granted without waiting.
    pub granted_now: u64,
    /// Leases granted from the queue.
    pub granted_from_queue: u64,
    /// Requests that had to queue.
    pub queued: u64,
    /// Requests rejected (any reason).
    pub rejected: u64,
    /// Leases settled.
    pub settled: u64,
    /// Leases and tickets cancelled.
    pub cancelled: u64,
    /// Leases reaped unsettled (no refund).
    pub expired: u64,
    /// 429 responses reported.
    pub rate_limited: u64,
    /// 429 responses reported against a granted lease (each one cut the margin).
    pub rate_limited_on_lease: u64,
    /// Times a provider header lowered a bucket.
    pub resyncs: u64,
    /// Provider headers that were recognised but malformed, and ignored.
    pub malformed_headers: u64,
}

const OCTAVES: usize = 40;

/// A log-linear histogram of milliseconds: `2^BITS` sub-buckets per power of two, so a
/// percentile is within `2^-BITS` of the true value. Fixed size, no allocation when
/// recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogHistogram<const BITS: u32> {
    counts: Vec<u64>,
    total: u64,
}

/// Queue waits: 8 sub-buckets per power of two (within 12.5 %).
pub(crate) type WaitHistogram = LogHistogram<3>;
/// Task times: 32 sub-buckets per power of two (within 3.2 %): a task's minutes matter to
/// the second where a queue wait's milliseconds do not.
pub(crate) type TaskTimeHistogram = LogHistogram<5>;

impl<const BITS: u32> LogHistogram<BITS> {
    const SUB: usize = 1 << BITS;
    const LEN: usize = Self::SUB * OCTAVES + Self::SUB;

    pub(crate) fn new() -> Self {
        LogHistogram {
            counts: alloc::vec![0; Self::LEN],
            total: 0,
        }
    }

    fn index(ms: u64) -> usize {
        if ms < Self::SUB as u64 {
            return ms as usize;
        }
        let octave = 63 - ms.leading_zeros(); // >= BITS
        let shift = octave - BITS;
        let sub = ((ms >> shift) as usize) & (Self::SUB - 1);
        ((octave - BITS + 1) as usize * Self::SUB + sub).min(Self::LEN - 1)
    }

    /// Upper bound (inclusive) of the values in bucket `i`.
    fn upper(i: usize) -> u64 {
        if i < Self::SUB {
            return i as u64;
        }
        let octave = u32::try_from(i / Self::SUB).unwrap_or(u32::MAX) + BITS - 1;
        let sub = (i % Self::SUB) as u64;
        let shift = octave - BITS;
        let low = (Self::SUB as u64 + sub) << shift;
        low.saturating_add((1u64 << shift) - 1)
    }

    pub(crate) fn record(&mut self, ms: u64) {
        if let Some(c) = self.counts.get_mut(Self::index(ms)) {
            *c = c.saturating_add(1);
            self.total = self.total.saturating_add(1);
        }
    }

    /// The `permille`-th percentile (500 = median), as a bucket upper bound.
    pub(crate) fn percentile(&self, permille: u64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = (u128::from(self.total) * u128::from(permille))
            .div_ceil(1000)
            .max(1);
        let mut seen = 0u128;
        for (i, c) in self.counts.iter().enumerate() {
            seen += u128::from(*c);
            if seen >= rank {
                return Some(Self::upper(i));
            }
        }
        None
    }

    pub(crate) fn is_consistent(&self) -> bool {
        self.counts.len() == Self::LEN
            && self.counts.iter().fold(0u64, |a, c| a.saturating_add(*c)) == self.total
    }
}

/// What an agent is doing right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum AgentActivity {
    /// Waiting in a queue since this instant (its earliest ticket still queued).
    Queued {
        /// When the agent went from no queued ticket to one.
        since: Millis,
        /// When its first ticket in line is expected to be granted (see
        /// [`Coordinator::expected_grant`](crate::Coordinator::expected_grant)): the figure
        /// to show a person. The queued decision's `eta` is the bound.
        expected_grant: Option<Millis>,
    },
    /// Holding at least one granted lease.
    InFlight,
    /// Told to ask again at `until`: refused for now (the queue full, the wait too long, a
    /// table full). Its place in the fair order is kept. (Waiting, not quiet.)
    Refused {
        /// When it may ask again.
        until: Millis,
    },
    /// The provider answered 429: waiting it out until `until`.
    RateLimited {
        /// When it retries.
        until: Millis,
        /// The limit the provider said was exceeded (its `rate_limit_type`), or else the one
        /// its headers showed spent; `None` when the response said neither.
        axis: Option<RateAxis>,
    },
    /// The provider was overloaded (a server error it said to retry): backing off until
    /// `until`.
    BackingOff {
        /// When it retries.
        until: Millis,
    },
    /// None of these.
    Idle,
}

/// Per-agent figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMetrics {
    /// The agent.
    pub agent: AgentId,
    /// The root of its family, when it is another agent's subagent (its requests name that
    /// agent as their `family`): a dashboard shows the family together, and by default the
    /// family shares one place in the fair order (see `weights.families`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<AgentId>,
    /// What it is doing.
    pub activity: AgentActivity,
    /// Tickets queued.
    pub queued: u32,
    /// Leases in flight.
    pub in_flight: u32,
    /// Leases settled.
    pub settled: u64,
    /// Moving average of |estimate − actual| / actual for input tokens, thousandths, over
    /// the calls that completed with the provider's usage (a 429, an interrupted call, a
    /// cancel or an expiry is not a sample; see [`crate::Coordinator::settle`]).
    pub input_error_permille: u32,
    /// The same for output tokens (max_tokens against actual output: usually large).
    pub output_error_permille: u32,
    /// Moving average of (estimate − actual) / actual for input tokens, thousandths, over
    /// the same samples: positive when the estimates are above what the provider counted,
    /// negative below (the signed side of `input_error_permille`; each sample within
    /// ±1,000,000).
    pub input_bias_permille: i32,
    /// The same for output tokens.
    pub output_bias_permille: i32,
    /// Whether the estimate-error alert is raised.
    pub alerting: bool,
    /// Current weight multiplier from repeated identical failures (thousandths).
    pub repeat_failures: u32,
    /// Last time the agent made a request or settled.
    pub last_seen: Millis,
}

/// How many agents like the measured ones fit at 75 % of the binding ceiling, from what
/// they want, not what they were served: an agent that spends a share `f` of its time
/// waiting on quota would use `served ÷ (1 − f)` if it never waited (its demand). Both are
/// weighted to the latest minutes (minute `i` of the last five has weight `i`), where
/// sessions are late and contexts longest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetAdvice {
    /// The axis that binds (highest usage against its limit).
    pub axis: Axis,
    /// One active agent's demand per minute on that axis: served ÷ (1 − waiting share).
    pub per_agent_per_minute: u64,
    /// One active agent's usage per minute on that axis, as served.
    #[serde(default)]
    pub served_per_agent_per_minute: u64,
    /// The share of the measured agents' time spent waiting on quota, thousandths (at most
    /// 950: the advice does not extrapolate further).
    #[serde(default)]
    pub waiting_permille: u32,
    /// Agents measured (those that settled a lease in the measured minutes).
    pub agents_measured: u32,
    /// Agents of that kind that fit at 75 % of the real limit.
    pub agents_at_75_percent: u64,
}

/// One axis of one pool, as metrics see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AxisMetrics {
    /// The axis.
    pub axis: Axis,
    /// The real limit per window, if known.
    pub limit: Option<u64>,
    /// Effective capacity per window (limit × margin × ramp).
    pub capacity: u64,
    /// Tokens (or requests) available now; negative is debt.
    pub available: i64,
    /// Usage in the last complete minute.
    pub last_minute: u64,
    /// Usage in the last complete minute against the real limit, thousandths.
    pub last_minute_permille: u32,
}

/// One pool's figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMetrics {
    /// The pool's name.
    pub name: String,
    /// Current margin, thousandths.
    pub margin_permille: u32,
    /// Why the margin last moved (`None` before it first did).
    pub margin_reason: Option<MarginReason>,
    /// The median input underestimate of the pool's latest completed calls (up to 16; an
    /// estimate at or above what the provider counted is 0), thousandths: what a climb of
    /// the margin above its start needs at or below `margin.confirm_error_permille`.
    pub underestimate_p50_permille: Option<u32>,
    /// The margin of the axes counted exactly (requests, concurrency), thousandths: 1000
    /// unless use outside the coordinator was seen (see `MarginConfig`).
    pub exact_margin_permille: u32,
    /// When the provider's remaining-capacity headers last agreed with the model (a climb
    /// above the start needs an agreement within the clean interval); `None` if they never
    /// did or the last comparison disagreed.
    pub headers_agreed_at: Option<Millis>,
    /// Since when the margin has sat at its floor (within
    /// `margin.floor_alert_band_permille`) without rising, if it has; past
    /// `margin.floor_alert_ms` the `margin_at_floor` event was raised: something outside
    /// the coordinator is using the key.
    pub margin_at_floor_since: Option<Millis>,
    /// Grants are paused until this instant after a 429 (in the past when not paused).
    pub paused_until: Millis,
    /// Leases in flight.
    pub in_flight: u64,
    /// The concurrency limit, if known.
    pub max_concurrent: Option<u64>,
    /// Tickets queued.
    pub queue_depth: u32,
    /// Per rate axis.
    pub axes: Vec<AxisMetrics>,
    /// The axis with the highest usage against its limit over the last complete minutes.
    pub binding_axis: Option<Axis>,
    /// Median wait of leases granted from the queue, ms.
    pub queue_wait_p50_ms: Option<u64>,
    /// 95th percentile of the same.
    pub queue_wait_p95_ms: Option<u64>,
    /// Counters since start.
    pub counters: PoolCounters,
    /// The kept minutes, oldest first (the last one is the current, partial minute).
    pub minutes: Vec<MinuteStats>,
    /// Fleet-sizing advice, once there is usage to measure.
    pub fleet: Option<FleetAdvice>,
}

/// Everything the coordinator reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metrics {
    /// The instant the figures were taken.
    pub now: Millis,
    /// Per pool, in configuration order.
    pub pools: Vec<PoolMetrics>,
    /// Per agent, by id.
    pub agents: Vec<AgentMetrics>,
    /// Leases and tickets alive.
    pub live_leases: u32,
    /// Tasks: seed 003's four numbers (429 rate, tokens per merged task, task time,
    /// critical-path wait), since start and over the last complete minute.
    pub tasks: TaskMetrics,
}

/// Seed 003's four numbers over a span (since start, or one minute).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFigures {
    /// Tasks that ended merged.
    pub merged: u64,
    /// Tasks that ended abandoned.
    pub abandoned: u64,
    /// Tasks that ended failed.
    pub failed: u64,
    /// Tokens charged to the tasks that ended (every outcome), every token the provider
    /// counted, and those of their leases that settled after the task ended.
    pub tokens: u64,
    /// The part of `tokens` that counts against the limits.
    #[serde(default)]
    pub rate_limited_tokens: u64,
    /// `tokens / merged`: what a merged task cost, failures and abandoned work included.
    pub tokens_per_merged_task: Option<u64>,
    /// `rate_limited_tokens / merged`.
    #[serde(default)]
    pub rate_limited_tokens_per_merged_task: Option<u64>,
    /// Median wall time of the merged tasks, ms (since start: within 3.2 %; per minute:
    /// the mean, `task_time_mean_ms`, is given instead).
    pub task_time_p50_ms: Option<u64>,
    /// 95th percentile of the same.
    pub task_time_p95_ms: Option<u64>,
    /// Mean wall time of the merged tasks, ms.
    pub task_time_mean_ms: Option<u64>,
    /// Quota wait of the ended tasks, ms.
    pub quota_wait_ms: u64,
    /// Critical-path wait of the ended tasks, agent-ms (see [`TaskSummary`](crate::TaskSummary)).
    pub critical_path_wait_ms: u64,
    /// Leases granted in the span, across pools (the calls sent).
    pub calls: u64,
    /// 429 responses reported in the span, across pools.
    pub rate_limited: u64,
    /// `rate_limited / calls`, thousandths.
    pub rate_limited_permille: Option<u32>,
}

/// The task figures [`Metrics`](crate::Metrics) carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskMetrics {
    /// Tasks open now.
    pub open: u32,
    /// Requests that named a task the full table could not take (run without one).
    pub untracked: u64,
    /// Since the coordinator started.
    pub since_start: TaskFigures,
    /// The last complete minute (`minute` is its number).
    pub last_minute: TaskFigures,
    /// The number of that minute: `now / 60000 − 1`.
    pub minute: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_percentiles_are_within_one_bucket() {
        let mut h = WaitHistogram::new();
        for ms in 1..=1000u64 {
            h.record(ms);
        }
        let p50 = h.percentile(500).unwrap();
        let p95 = h.percentile(950).unwrap();
        assert!((500..=563).contains(&p50), "p50 {p50}");
        assert!((950..=1024).contains(&p95), "p95 {p95}");
        assert!(h.is_consistent());
    }

    #[test]
    fn histogram_handles_zero_and_u64_max() {
        let mut h = WaitHistogram::new();
        h.record(0);
        h.record(u64::MAX);
        assert_eq!(h.percentile(500), Some(0));
        assert!(h.percentile(1000).unwrap() > 1 << 40);
    }

    fn bounds_cover_every_value<const BITS: u32>() {
        for ms in (0..5000u64).chain([1 << 20, (1 << 20) + 12345, 1 << 41]) {
            let i = LogHistogram::<BITS>::index(ms);
            assert!(LogHistogram::<BITS>::upper(i) >= ms, "{ms} in bucket {i}");
            if i > 0 {
                assert!(
                    LogHistogram::<BITS>::upper(i - 1) < ms,
                    "{ms} in bucket {i}"
                );
            }
        }
    }

    #[test]
    fn bucket_bounds_cover_every_value() {
        bounds_cover_every_value::<3>();
        bounds_cover_every_value::<5>();
    }

    #[test]
    fn task_time_percentiles_are_within_a_thirty_second() {
        let mut h = TaskTimeHistogram::new();
        for s in 1..=1000u64 {
            h.record(s * 1000);
        }
        let p95 = h.percentile(950).unwrap();
        assert!((950_000..=980_000).contains(&p95), "p95 {p95}");
        assert!(h.is_consistent());
    }
}
