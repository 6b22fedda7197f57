//! A request's weight in the fair queue: its role, the tasks it unblocks, repeated
//! failures and a warm prompt cache (see `WeightConfig`).

use crate::agents::Agent;
use crate::config::WeightConfig;
use crate::lease::Bump;
use crate::request::{Ask, LeaseRequest, Role};
use crate::tasks::Task;
use crate::time::Millis;
use crate::weight::mul_permille;

/// A request's weight in the fair queue, in thousandths: role × (1 + bonus × unblocks, the
/// latter at most `max_unblocks`),
/// decayed per repeated identical failure down to the floor, bumped when the agent's warm
/// prompt cache is about to expire; at least 1. A request for a known task takes the
/// task's role, unblocks and repeated failures instead of its own and its agent's.
#[inline]
pub(super) fn weight(
    w: &WeightConfig,
    req: &LeaseRequest,
    (agent, members): (&Agent, u32),
    task: Option<&Task>,
    now: Millis,
) -> u128 {
    let (role, unblocks, repeats) = match task {
        Some(t) => (t.role, t.unblocks, t.repeats),
        None => (req.role, req.unblocks, agent.repeats),
    };
    // `Role::Auto`: a planner for the `members` of its family seen lately (see `Role`).
    let (role, unblocks) = match role {
        Role::Auto if members > 0 => (
            Role::Planner,
            if unblocks == 0 { members } else { unblocks },
        ),
        Role::Auto => (Role::Worker, unblocks),
        r => (r, unblocks),
    };
    let base = match role {
        Role::Planner => w.planner,
        Role::Reviewer => w.reviewer,
        Role::Worker | Role::Auto => w.worker,
    };
    let unblocks = u128::from(unblocks.min(w.max_unblocks));
    let mut weight = mul_permille(
        u128::from(base),
        1000 + u128::from(w.unblock_bonus) * unblocks,
    );
    let floor = u128::from(w.floor);
    for _ in 0..repeats.min(64) {
        if weight <= floor {
            break;
        }
        weight = mul_permille(weight, u128::from(w.repeat_failure_decay));
    }
    weight = weight.max(floor);
    if req.cached_prefix_tokens >= w.cache_bump_min_tokens && req.cached_prefix_tokens > 0 {
        if let Some(warm_until) = agent
            .pools
            .get(req.pool.0 as usize)
            .and_then(|p| p.cache_warm_until)
        {
            if now < warm_until && warm_until.since(now) <= w.cache_bump_window_ms {
                weight = mul_permille(weight, 1000 + u128::from(w.cache_bump));
            }
        }
    }
    weight.max(1)
}

/// The warm-cache bump a request queued at `now` without one is due while it waits: when
/// its agent's cache (warm until `warm_until`) comes within `cache_bump_window_ms`, with
/// its weight then (`weight`, bumped). `None` when the request was bumped at the ask, is
/// not eligible (a cached prefix below `cache_bump_min_tokens`, no bump configured) or
/// its cache is cold.
pub(super) fn pending_bump(
    w: &WeightConfig,
    ask: &Ask,
    warm_until: Option<Millis>,
    weight: u128,
    now: Millis,
) -> Option<Bump> {
    if w.cache_bump == 0
        || ask.cached_prefix_tokens == 0
        || ask.cached_prefix_tokens < w.cache_bump_min_tokens
    {
        return None;
    }
    let warm_until = warm_until.filter(|u| *u > now)?;
    let at = Millis(warm_until.0.saturating_sub(w.cache_bump_window_ms));
    (at > now).then(|| Bump {
        at,
        weight: u64::try_from(mul_permille(weight, 1000 + u128::from(w.cache_bump)))
            .unwrap_or(u64::MAX),
    })
}
