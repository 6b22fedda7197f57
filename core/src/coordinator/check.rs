//! The invariant checker: every table agrees with every other (run on restore, by tests,
//! and by the model-based proptests after every step).

use alloc::collections::BTreeMap;

use super::Coordinator;
use crate::ids::AgentId;
use crate::lease::{Entry, Phase};

impl Coordinator {
    /// Internal consistency: used on restore and by tests.
    #[doc(hidden)]
    pub fn check(&self) -> Result<(), &'static str> {
        if self.pools.len() != self.config.pools.len() {
            return Err("pool count differs from config");
        }
        if !self.leases.is_consistent() {
            return Err("lease table");
        }
        if !self.tasks.is_consistent(self.config.max_tasks) {
            return Err("task table");
        }
        let mut queued = alloc::vec![0u32; self.pools.len()];
        let mut active = alloc::vec![0u64; self.pools.len()];
        let mut per_agent: BTreeMap<AgentId, (u32, u32)> = BTreeMap::new();
        // A sequence number is taken per request: 2^62 of them is centuries of requests,
        // and one near the end of the range would wrap into duplicate queue keys.
        if self.seq >= 1 << 62 {
            return Err("sequence number out of range");
        }
        let ttl = self.config.lease_ttl_ms;
        for e in self.leases.entries() {
            let i = e.pool as usize;
            // Granted (or renewed) at or before now with the TTL: a later expiry would hold
            // its reservation and concurrency slot past what any renewal gives.
            if let Phase::Active { expires_at, .. } = e.phase {
                if expires_at > self.now.plus(ttl) {
                    return Err("a lease expiring after now + lease_ttl_ms");
                }
            }
            let counts = per_agent.entry(e.agent).or_default();
            match e.phase {
                Phase::Queued { .. } => {
                    *queued.get_mut(i).ok_or("lease names a missing pool")? += 1;
                    counts.0 += 1;
                }
                Phase::Active { .. } => {
                    *active.get_mut(i).ok_or("lease names a missing pool")? += 1;
                    counts.1 += 1;
                }
            }
            if self
                .agents
                .get(e.agent_slot)
                .is_none_or(|a| a.id != e.agent)
            {
                return Err("lease names a missing agent");
            }
        }
        for (i, pool) in self.pools.iter().enumerate() {
            let bound = u64::from(self.config.margin.confirm_error_permille);
            if usize::from(pool.errors_within) != pool.errors.count_at_most(bound) {
                return Err("a pool's count of estimate errors within the climb's bound");
            }
            if !pool.queue.is_consistent() {
                return Err("queue structure");
            }
            if queued.get(i) != Some(&pool.queue.len()) || active.get(i) != Some(&pool.in_flight) {
                return Err("queue or in-flight count differs from lease table");
            }
            // Keys are distinct in the queue, so matching them makes the queue and the
            // pool's queued tickets one to one.
            for (key, slot) in pool.queue.in_order() {
                match self.leases.by_slot(slot) {
                    Some(Entry {
                        phase: Phase::Queued { key: k, .. },
                        pool: q,
                        ..
                    }) if *q as usize == i && *k == key => {}
                    _ => return Err("queue names a slot that is not queued in this pool"),
                }
            }
            if pool.minutes.len() != self.config.metrics_minutes as usize
                || u64::from(pool.minute_slot)
                    != pool.minute_now % u64::from(self.config.metrics_minutes.max(1))
                || !pool.waits.is_consistent()
            {
                return Err("metrics");
            }
            if pool.margin < self.config.margin.floor_permille
                || pool.margin > self.config.margin.ceiling_permille
            {
                return Err("margin outside floor and ceiling");
            }
            if pool.updated > self.now {
                return Err("pool ahead of coordinator clock");
            }
            if crate::Axis::ALL.iter().any(|&a| {
                let b = pool.bucket(a);
                b.nominal != b.limit.map_or(0, |l| pool.nominal_cap(a, l))
            }) {
                return Err("nominal capacity differs from limit and margin");
            }
            if pool.exact_margin < self.config.margin.floor_permille.min(1000)
                || pool.exact_margin > 1000
            {
                return Err("the exact axes' margin outside its floor and 1000");
            }
            // Refused rather than clamped: a level or capacity above what the limit allows
            // would grant past the limit, and no run of the core writes one, so the state
            // was edited or corrupted and its other figures cannot be trusted either.
            let window = self.config.window_ms;
            for b in &pool.buckets {
                if b.limit.is_some_and(|l| l == 0 || l > crate::MAX_TOKENS) {
                    return Err("a limit outside 1..2^53");
                }
                if b.cap > b.nominal {
                    return Err("a bucket's capacity above its limit times the margin");
                }
                // The provider's own figure may raise a level above the capacity, never
                // above the limit.
                if let Some(l) = b.limit {
                    if b.level > crate::bucket::product(l.max(b.cap), window) {
                        return Err("a bucket's level above its limit");
                    }
                }
            }
            // A pause is at most `feedback.max_pause_ms` from when it was set.
            if pool.paused_until > self.now.plus(self.config.feedback.max_pause_ms) {
                return Err("a pool paused longer than feedback.max_pause_ms");
            }
            // Queue keys are unique by their sequence number: every one below the next.
            if pool.queue.in_order().iter().any(|(k, _)| k.seq >= self.seq) {
                return Err("a queued ticket's sequence number at or past the next one");
            }
        }
        let mut per_task: BTreeMap<crate::TaskId, u32> = BTreeMap::new();
        for e in self.leases.entries() {
            if let Some(t) = e.task {
                *per_task.entry(t).or_default() += 1;
            }
        }
        if &per_task != self.tasks.live() {
            return Err("the tasks' live leases differ from the lease table");
        }
        if !self.agents.is_consistent() {
            return Err("agent table");
        }
        for a in self.agents.values() {
            let (q, f) = per_agent.get(&a.id).copied().unwrap_or_default();
            if a.queued != q || a.in_flight != f || a.pools.len() != self.pools.len() {
                return Err("agent counts differ from lease table");
            }
        }
        if self.agents.len() > self.config.max_agents as usize
            || self.leases.live() > self.config.max_leases
        {
            return Err("tables beyond their configured bounds");
        }
        Ok(())
    }
}
