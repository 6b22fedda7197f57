//! The metrics assembled from the coordinator's state (the types are in `metrics.rs`).

use alloc::vec::Vec;

use crate::agents::{Agent, Agents, WaitKind};
use crate::bucket::Axis;
use crate::config::PoolConfig;
use crate::metrics::*;
use crate::pool::Pool;
use crate::time::Millis;

/// A pool's figures as of `now` (a minute still open counts as incomplete).
pub(crate) fn pool_metrics(
    pool: &Pool,
    cfg: &PoolConfig,
    agents: &Agents,
    now: Millis,
    window: u64,
) -> PoolMetrics {
    let current_minute = now.0 / MINUTE_MS;
    let mut minutes: Vec<MinuteStats> = pool
        .minutes
        .iter()
        .filter(|m| m.minute <= current_minute && *m != &MinuteStats::default())
        .copied()
        .collect();
    minutes.sort_by_key(|m| m.minute);
    let last_complete = minutes
        .iter()
        .rev()
        .find(|m| m.minute + 1 == current_minute);
    let axes = Axis::ALL
        .iter()
        .map(|&axis| axis_metrics(pool, axis, last_complete, window))
        .collect();
    // Binding axis and fleet advice over up to five complete minutes.
    let recent: Vec<&MinuteStats> = minutes
        .iter()
        .filter(|m| m.minute < current_minute && m.minute + 5 >= current_minute)
        .collect();
    let binding = binding_axis(pool, || recent.iter().copied());
    let fleet = binding.and_then(|axis| fleet_advice(pool, axis, &recent, agents, current_minute));
    PoolMetrics {
        name: cfg.name.clone(),
        margin_permille: pool.margin,
        margin_reason: pool.margin_reason,
        underestimate_p50_permille: pool
            .errors
            .median()
            .map(|e| u32::try_from(e).unwrap_or(u32::MAX)),
        exact_margin_permille: pool.exact_margin,
        headers_agreed_at: pool.agreed_at,
        margin_at_floor_since: pool.floor_since,
        paused_until: pool.paused_until,
        in_flight: pool.in_flight,
        max_concurrent: pool.max_concurrent,
        queue_depth: pool.queue.len(),
        axes,
        binding_axis: binding,
        queue_wait_p50_ms: pool.waits.percentile(500),
        queue_wait_p95_ms: pool.waits.percentile(950),
        counters: pool.counters,
        minutes,
        fleet,
    }
}

fn axis_metrics(
    pool: &Pool,
    axis: Axis,
    last_complete: Option<&MinuteStats>,
    window: u64,
) -> AxisMetrics {
    let b = pool.bucket(axis);
    let last_minute = last_complete.map_or(0, |m| m.used.get(axis));
    AxisMetrics {
        axis,
        limit: b.limit,
        capacity: if b.gates() { b.cap } else { 0 },
        available: i64::try_from(b.available(window)).unwrap_or(i64::MIN),
        last_minute,
        last_minute_permille: b.limit.map_or(0, |l| {
            u32::try_from(u128::from(last_minute) * 1000 / u128::from(l.max(1))).unwrap_or(u32::MAX)
        }),
    }
}

/// The binding axis over up to five complete minutes before `now`, as metrics report it.
/// (No allocation: it runs inside the core's steady state, on the alert.)
pub(crate) fn recent_binding_axis(pool: &Pool, now: Millis) -> Option<Axis> {
    let current = now.0 / MINUTE_MS;
    let recent = || {
        pool.minutes.iter().filter(move |m| {
            m.minute < current && m.minute + 5 >= current && **m != MinuteStats::default()
        })
    };
    binding_axis(pool, recent)
}

/// The known axis with the largest share of its limit used over the minutes `recent`
/// yields (a closure: each axis walks them again, with no allocation).
fn binding_axis<'a, I: Iterator<Item = &'a MinuteStats>>(
    pool: &Pool,
    recent: impl Fn() -> I,
) -> Option<Axis> {
    let mut binding: Option<(Axis, u128)> = None;
    for &axis in &Axis::ALL {
        let Some(limit) = pool.bucket(axis).limit else {
            continue;
        };
        let total: u128 = recent().map(|m| u128::from(m.used.get(axis))).sum();
        let share = total * 1_000_000 / u128::from(limit);
        if total > 0 && binding.is_none_or(|(_, s)| share > s) {
            binding = Some((axis, share));
        }
    }
    binding.map(|(a, _)| a)
}

/// How many agents like the ones measured over `recent` fit in 75 % of the binding limit.
fn fleet_advice(
    pool: &Pool,
    axis: Axis,
    recent: &[&MinuteStats],
    agents: &Agents,
    current_minute: u64,
) -> Option<FleetAdvice> {
    let limit = pool.bucket(axis).limit?;
    let first = recent.first()?.minute;
    let span = (current_minute - first).max(1);
    let since = Millis(first.saturating_mul(MINUTE_MS));
    let measured = agents
        .values()
        .filter(|a| a.last_settle.is_some_and(|t| t >= since))
        .count();
    let measured = u32::try_from(measured).ok().filter(|m| *m > 0)?;
    // Weighted to the latest minutes: minute `first + k` weighs `k + 1`; a minute with no
    // activity (not in `recent`) counts as nothing used and nothing waited.
    let weight = |m: &MinuteStats| u128::from(m.minute - first + 1);
    let weights: u128 = (1..=u128::from(span)).sum();
    let used: u128 = recent
        .iter()
        .map(|m| weight(m) * u128::from(m.used.get(axis)))
        .sum();
    let waited: u128 = recent
        .iter()
        .map(|m| weight(m) * u128::from(m.waited_ms))
        .sum();
    let served = u64::try_from(used / weights / u128::from(measured))
        .unwrap_or(u64::MAX)
        .max(1);
    // The share of the agents' time spent waiting, per weighted minute.
    let waiting =
        (waited * 1000 / (weights * u128::from(MINUTE_MS) * u128::from(measured))).min(950);
    let waiting = u32::try_from(waiting).unwrap_or(950);
    let demand = u64::try_from(u128::from(served) * 1000 / u128::from(1000 - waiting))
        .unwrap_or(u64::MAX)
        .max(1);
    Some(FleetAdvice {
        axis,
        per_agent_per_minute: demand,
        served_per_agent_per_minute: served,
        waiting_permille: waiting,
        agents_measured: measured,
        agents_at_75_percent: limit / 4 * 3 / demand,
    })
}

/// One agent's figures.
pub(crate) fn agent_metrics(a: &Agent, now: Millis, expected: Option<Millis>) -> AgentMetrics {
    AgentMetrics {
        agent: a.id,
        family: a.family,
        activity: if a.queued > 0 {
            AgentActivity::Queued {
                since: a.queued_since,
                expected_grant: expected,
            }
        } else if a.in_flight > 0 {
            AgentActivity::InFlight
        } else {
            match a.waiting {
                Some(w) if w.until > now => match w.kind {
                    WaitKind::Refused => AgentActivity::Refused { until: w.until },
                    WaitKind::RateLimited => AgentActivity::RateLimited {
                        until: w.until,
                        axis: w.axis,
                    },
                    WaitKind::BackingOff => AgentActivity::BackingOff { until: w.until },
                },
                _ => AgentActivity::Idle,
            }
        },
        queued: a.queued,
        in_flight: a.in_flight,
        settled: a.settled,
        input_error_permille: a.input_error,
        output_error_permille: a.output_error,
        input_bias_permille: a.input_bias,
        output_bias_permille: a.output_bias,
        alerting: a.alerting,
        repeat_failures: a.repeats,
        last_seen: a.last_seen,
    }
}
