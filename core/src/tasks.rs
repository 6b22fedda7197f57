//! Tasks: what a lease is spent on. A task has an id the host picks, a role and the number
//! of downstream tasks it unblocks (which set its queue weight), a failure history (the
//! same failure signature twice in a row halves the weight, down to the floor) and it ends
//! merged, abandoned or failed.
//!
//! The core charges each task what its leases used — every token the provider counted,
//! cache reads included, and beside it the part that counts against the rate limits — and
//! the time its calls spent waiting on the quota (queued, or between a refusal or a 429 and
//! the next ask). From those it derives the figures seed 003 judges a coordinator by:
//! tokens per merged task, task time (p50/p95), critical-path wait and, with the pools'
//! counters, the 429 rate.
//!
//! Critical-path wait is seed 003's "time blocked agents spent waiting on an upstream
//! agent's model call": a task that declares it unblocks `n` others holds them up for as
//! long as one of its model calls is outstanding — from the ask (its queue wait, a refusal
//! or a 429 waited out) through the call's own latency to its settle — so each such span,
//! counted once however many of its calls overlap, adds `span × n` agent-ms. A lease that
//! settles after its task ended is still charged: its tokens go to the ended tasks' totals. The table of open tasks is bounded ([`Config::max_tasks`](crate::Config)); an
//! ended task leaves it, its figures folded into the totals. Requests naming tasks the
//! host never opened can fill only three quarters of it, and a task idle for
//! [`Config::task_idle_ms`](crate::Config) is ended as abandoned when room is needed, so
//! callers naming junk tasks can neither lock the operator's explicit `open_task` out nor
//! hold the table forever.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::error::LeaseError;
use crate::ids::{AgentId, TaskId};
use crate::metrics::{MINUTE_MS, TaskFigures, TaskTimeHistogram};
use crate::request::Role;
use crate::time::Millis;

/// What [`Coordinator::open_task`](crate::Coordinator::open_task) is told about a task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskSpec {
    /// The task.
    pub task: TaskId,
    /// The role of the agent working on it; it sets the base weight of the task's calls.
    pub role: Role,
    /// Downstream tasks waiting on this one (the DAG's out-degree, or a count).
    pub unblocks: u32,
}

/// How a task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskOutcome {
    /// Its work landed.
    Merged,
    /// Given up on (superseded, cancelled, out of budget).
    Abandoned,
    /// Ended failing.
    Failed,
}

/// A task's figures when it ends ([`Coordinator::end_task`](crate::Coordinator::end_task)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// The task.
    pub task: TaskId,
    /// How it ended.
    pub outcome: TaskOutcome,
    /// Leases it took (each model call attempt is one).
    pub calls: u32,
    /// Tokens charged to it: every token its settled leases used as the provider
    /// reported them (uncached input, cache writes, cache reads, output), and the
    /// reservation of those reaped unsettled.
    pub tokens: u64,
    /// The part of `tokens` that counts against the pool's limits (under Anthropic
    /// counting cache reads do not; under OpenAI's every token does).
    #[serde(default)]
    pub rate_limited_tokens: u64,
    /// From the first time the core heard of it to its end, ms.
    pub wall_ms: u64,
    /// Time its calls spent waiting on the quota, ms.
    pub quota_wait_ms: u64,
    /// How long its model calls were outstanding (from an ask to its settle, overlapping
    /// calls counted once) × the tasks it unblocks, summed as the spans happened: the
    /// agent-time the tasks waiting on it spent blocked behind its model calls.
    pub critical_path_wait_ms: u64,
    /// Failures reported, and the current run of identical ones.
    pub failures: u32,
    /// Identical failures in a row (each halves the weight, by default).
    pub repeats: u32,
}

/// A lease's tokens as a task is charged them: every token the provider counted, and the
/// part of them that counts against the limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) total: u64,
    pub(crate) limited: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Task {
    pub(crate) id: TaskId,
    pub(crate) role: Role,
    pub(crate) unblocks: u32,
    pub(crate) opened_at: Millis,
    pub(crate) last_failure: Option<u64>,
    pub(crate) repeats: u32,
    pub(crate) failures: u32,
    pub(crate) calls: u32,
    pub(crate) tokens: u64,
    #[serde(default)]
    pub(crate) limited_tokens: u64,
    pub(crate) quota_wait_ms: u64,
    pub(crate) critical_path_wait_ms: u64,
    /// Set by a refusal or a 429 of one of its calls; the next ask ends the wait.
    pub(crate) waiting_since: Option<Millis>,
    /// Since when one of its model calls has been outstanding (a lease or ticket alive, or
    /// a wait after a refusal or a 429): the open span of its critical-path wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) busy_since: Option<Millis>,
    /// Its latest activity (opened, a lease asked for it, a failure); a task idle for
    /// `task_idle_ms` is ended as abandoned when the table needs room. Snapshots from
    /// before it count from `opened_at` (see [`Task::active_at`]).
    #[serde(default)]
    pub(crate) last_active: Millis,
    /// The agent whose task it is: the member that opened it, or the agent of the request
    /// that named it first; `None` for the operator's open (and snapshots from before).
    /// A member acts (updates, fails, ends) only on its own agent's tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<AgentId>,
}

/// Sums over the tasks that ended in a span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ended {
    pub(crate) minute: u64,
    pub(crate) merged: u64,
    pub(crate) abandoned: u64,
    pub(crate) failed: u64,
    pub(crate) tokens: u64,
    #[serde(default)]
    pub(crate) limited_tokens: u64,
    pub(crate) merged_time_ms: u64,
    pub(crate) quota_wait_ms: u64,
    pub(crate) critical_path_wait_ms: u64,
}

impl Ended {
    fn add(&mut self, s: &TaskSummary) {
        match s.outcome {
            TaskOutcome::Merged => {
                self.merged = self.merged.saturating_add(1);
                self.merged_time_ms = self.merged_time_ms.saturating_add(s.wall_ms);
            }
            TaskOutcome::Abandoned => self.abandoned = self.abandoned.saturating_add(1),
            TaskOutcome::Failed => self.failed = self.failed.saturating_add(1),
        }
        self.add_tokens(Tokens {
            total: s.tokens,
            limited: s.rate_limited_tokens,
        });
        self.quota_wait_ms = self.quota_wait_ms.saturating_add(s.quota_wait_ms);
        self.critical_path_wait_ms = self
            .critical_path_wait_ms
            .saturating_add(s.critical_path_wait_ms);
    }

    fn add_tokens(&mut self, t: Tokens) {
        self.tokens = self.tokens.saturating_add(t.total);
        self.limited_tokens = self.limited_tokens.saturating_add(t.limited);
    }

    pub(crate) fn figures(&self, calls: u64, rate_limited: u64) -> TaskFigures {
        let per_merged = |n: u64| (self.merged > 0).then(|| n / self.merged);
        TaskFigures {
            merged: self.merged,
            abandoned: self.abandoned,
            failed: self.failed,
            tokens: self.tokens,
            rate_limited_tokens: self.limited_tokens,
            tokens_per_merged_task: per_merged(self.tokens),
            rate_limited_tokens_per_merged_task: per_merged(self.limited_tokens),
            task_time_p50_ms: None,
            task_time_p95_ms: None,
            task_time_mean_ms: (self.merged > 0).then(|| self.merged_time_ms / self.merged),
            quota_wait_ms: self.quota_wait_ms,
            critical_path_wait_ms: self.critical_path_wait_ms,
            calls,
            rate_limited,
            rate_limited_permille: (calls > 0).then(|| {
                u32::try_from(u128::from(rate_limited) * 1000 / u128::from(calls))
                    .unwrap_or(u32::MAX)
            }),
        }
    }
}

/// The task table and the ended tasks' totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tasks {
    /// Open tasks, by id.
    open: Vec<Task>,
    pub(crate) untracked: u64,
    pub(crate) total: Ended,
    /// Wall times of the merged tasks, ms.
    pub(crate) times: TaskTimeHistogram,
    /// The two latest minutes with an ended task, by minute number.
    pub(crate) minutes: [Ended; 2],
    /// Per task id, its leases and tickets alive, open task or not (a task can end while
    /// its calls are out, and a new one take its id). Derived from the lease table: not
    /// stored, recounted when a snapshot is read back.
    #[serde(skip)]
    live: BTreeMap<TaskId, u32>,
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks {
            open: Vec::new(),
            untracked: 0,
            total: Ended::default(),
            times: TaskTimeHistogram::new(),
            minutes: [Ended::default(); 2],
            live: BTreeMap::new(),
        }
    }
}

impl Tasks {
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }

    fn find(&self, id: TaskId) -> Result<usize, usize> {
        self.open.binary_search_by_key(&id, |t| t.id)
    }

    pub(crate) fn get(&self, id: TaskId) -> Option<&Task> {
        self.find(id).ok().and_then(|i| self.open.get(i))
    }

    pub(crate) fn get_mut(&mut self, id: TaskId) -> Option<&mut Task> {
        let i = self.find(id).ok()?;
        self.open.get_mut(i)
    }

    /// How many open tasks a request naming an unknown task may open up to: three
    /// quarters of `max`, so an explicit open always has a quarter of the table.
    pub(crate) fn implicit_cap(max: u32) -> usize {
        (u64::from(max) * 3 / 4) as usize
    }

    /// The task, opened with `spec` if new, and marked active at `now`. The operator's open
    /// ([`Coordinator::open_task`](crate::Coordinator::open_task)) may fill the table to
    /// `max`; a member's (an agent's own credential at a shared limiter) and a request
    /// naming an unknown task open only below [`Tasks::implicit_cap`], so the operator
    /// always has a quarter of the table. An open (not a request) updates an open task's
    /// role and unblocks. When the table (or the share) is full, the least recently active
    /// task idle for at least `idle_ms` is ended as abandoned to make room: `TooManyTasks`
    /// when there is none to end. A new task is its opener's (a member's, or the agent of
    /// the request naming it; the operator's open owns nothing); a member's open of a task
    /// that is not its own is `Forbidden`. Nothing changes on an error.
    pub(crate) fn open(
        &mut self,
        spec: &TaskSpec,
        now: Millis,
        (max, idle_ms): (u32, u64),
        by: Opener,
    ) -> Result<&mut Task, LeaseError> {
        match self.find(spec.task) {
            Ok(i) => {
                let t = self.open.get_mut(i).ok_or(LeaseError::UnknownTask)?;
                if let Opener::Member(m) = by {
                    if t.owner != Some(m) {
                        return Err(LeaseError::Forbidden);
                    }
                }
                if !matches!(by, Opener::Request(_)) {
                    t.role = spec.role;
                    // An open span of critical-path wait is counted up to now at the old
                    // number of tasks waiting on it.
                    t.count_span(now);
                    t.unblocks = spec.unblocks;
                }
                t.last_active = t.last_active.max(now);
                Ok(t)
            }
            Err(mut i) => {
                let (cap, owner) = match by {
                    Opener::Operator => (max as usize, None),
                    Opener::Member(a) | Opener::Request(a) => (Tasks::implicit_cap(max), Some(a)),
                };
                if self.open.len() >= cap {
                    let idle = self
                        .least_recently_active(now, idle_ms)
                        .ok_or(LeaseError::TooManyTasks)?;
                    self.end(idle, TaskOutcome::Abandoned, now);
                    i = self.find(spec.task).err().ok_or(LeaseError::TooManyTasks)?;
                }
                self.open.insert(
                    i,
                    Task {
                        id: spec.task,
                        role: spec.role,
                        unblocks: spec.unblocks,
                        opened_at: now,
                        last_failure: None,
                        repeats: 0,
                        failures: 0,
                        calls: 0,
                        tokens: 0,
                        limited_tokens: 0,
                        quota_wait_ms: 0,
                        critical_path_wait_ms: 0,
                        waiting_since: None,
                        busy_since: None,
                        last_active: now,
                        owner,
                    },
                );
                // Calls still out under its id (a task that ended and is opened again)
                // hold up what it unblocks from now on.
                let live = self.live.contains_key(&spec.task);
                let t = self.open.get_mut(i).ok_or(LeaseError::UnknownTask)?;
                t.sync_busy(now, live);
                Ok(t)
            }
        }
    }

    /// The open task with the oldest activity, if it has been idle for at least
    /// `idle_ms` (the lowest id among equals).
    fn least_recently_active(&self, now: Millis, idle_ms: u64) -> Option<TaskId> {
        let mut oldest: Option<&Task> = None;
        for t in &self.open {
            if oldest.is_none_or(|o| t.active_at() < o.active_at()) {
                oldest = Some(t);
            }
        }
        oldest
            .filter(|t| now.since(t.active_at()) >= idle_ms)
            .map(|t| t.id)
    }

    /// Removes an open task and folds its figures into the totals.
    pub(crate) fn end(
        &mut self,
        id: TaskId,
        outcome: TaskOutcome,
        now: Millis,
    ) -> Option<TaskSummary> {
        let i = self.find(id).ok()?;
        let mut t = self.open.remove(i);
        if let Some(since) = t.waiting_since.take() {
            t.wait(now.since(since));
        }
        // Its calls still outstanding stop counting: the tasks it unblocked are no longer
        // waiting on it.
        t.sync_busy(now, false);
        let summary = TaskSummary {
            task: t.id,
            outcome,
            calls: t.calls,
            tokens: t.tokens,
            rate_limited_tokens: t.limited_tokens,
            wall_ms: now.since(t.opened_at),
            quota_wait_ms: t.quota_wait_ms,
            critical_path_wait_ms: t.critical_path_wait_ms,
            failures: t.failures,
            repeats: t.repeats,
        };
        self.total.add(&summary);
        if outcome == TaskOutcome::Merged {
            self.times.record(summary.wall_ms);
        }
        self.minute_mut(now).add(&summary);
        Some(summary)
    }

    /// The ended tasks of the minute of `now`, that minute's slot started afresh if it
    /// held an older one.
    fn minute_mut(&mut self, now: Millis) -> &mut Ended {
        let minute = now.0 / MINUTE_MS;
        let slot = &mut self.minutes[(minute % 2) as usize];
        if slot.minute != minute {
            *slot = Ended {
                minute,
                ..Ended::default()
            };
        }
        slot
    }

    /// A lease or ticket of `task` began at `now`: one of its calls is outstanding.
    pub(crate) fn lease_began(&mut self, task: TaskId, now: Millis) {
        let n = self.live.entry(task).or_insert(0);
        *n = n.saturating_add(1);
        if let Some(t) = self.get_mut(task) {
            t.sync_busy(now, true);
        }
    }

    /// A lease or ticket of `task` ended at `now` (settled, cancelled, reaped), having used
    /// `tokens`. A task that ended first is not there to charge: the tokens go to the ended
    /// tasks' totals, since start and in the minute of `now`, so no usage is lost.
    pub(crate) fn lease_ended(&mut self, task: TaskId, tokens: Tokens, now: Millis) {
        let live = match self.live.get_mut(&task) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            _ => {
                self.live.remove(&task);
                false
            }
        };
        if let Some(t) = self.get_mut(task) {
            t.tokens = t.tokens.saturating_add(tokens.total);
            t.limited_tokens = t.limited_tokens.saturating_add(tokens.limited);
            t.sync_busy(now, live);
            return;
        }
        self.total.add_tokens(tokens);
        self.minute_mut(now).add_tokens(tokens);
    }

    /// A refusal or a 429 of one of `task`'s calls at `now`: it waits on the quota until
    /// its next ask (a wait already open goes on).
    pub(crate) fn start_wait(&mut self, task: TaskId, now: Millis) {
        let live = self.live.contains_key(&task);
        if let Some(t) = self.get_mut(task) {
            t.waiting_since.get_or_insert(now);
            t.sync_busy(now, live);
        }
    }

    /// `task`'s call asks again at `now`: a wait begun by a refusal or a 429, if one is
    /// open, ends and is added to its quota wait.
    pub(crate) fn end_wait(&mut self, task: TaskId, now: Millis) {
        let live = self.live.contains_key(&task);
        if let Some(t) = self.get_mut(task) {
            if let Some(since) = t.waiting_since.take() {
                t.wait(now.since(since));
            }
            t.sync_busy(now, live);
        }
    }

    /// Sets the live leases and tickets per task (derived: a snapshot read back, or one
    /// written before they were kept, gets them from its lease table).
    pub(crate) fn set_live(&mut self, live: BTreeMap<TaskId, u32>) {
        self.live = live;
    }

    /// The live leases and tickets per task, for the invariant check.
    pub(crate) fn live(&self) -> &BTreeMap<TaskId, u32> {
        &self.live
    }

    /// The ended tasks of minute `minute`, if it is still kept.
    pub(crate) fn minute(&self, minute: u64) -> Ended {
        self.minutes
            .iter()
            .find(|m| m.minute == minute)
            .copied()
            .unwrap_or(Ended {
                minute,
                ..Ended::default()
            })
    }

    pub(crate) fn is_consistent(&self, max: u32) -> bool {
        self.open.len() <= max as usize
            && self.open.windows(2).all(|w| w[0].id < w[1].id)
            && self.times.is_consistent()
    }
}

impl Task {
    /// Its latest activity: `last_active`, or its opening for a task restored from a
    /// snapshot written before activity was kept.
    pub(crate) fn active_at(&self) -> Millis {
        self.last_active.max(self.opened_at)
    }

    /// Adds `ms` of quota wait.
    pub(crate) fn wait(&mut self, ms: u64) {
        self.quota_wait_ms = self.quota_wait_ms.saturating_add(ms);
    }

    /// Opens or closes the span during which one of its model calls is outstanding (`live`:
    /// a lease or ticket of it alive, or a wait open); a span that closes adds its length
    /// × the tasks it unblocks to its critical-path wait.
    fn sync_busy(&mut self, now: Millis, live: bool) {
        let busy = live || self.waiting_since.is_some();
        match (busy, self.busy_since) {
            (true, None) => self.busy_since = Some(now),
            (false, Some(_)) => {
                self.count_span(now);
                self.busy_since = None;
            }
            _ => {}
        }
    }

    /// Adds the open span's length up to `now` × the tasks it unblocks to its
    /// critical-path wait, and goes on counting from `now`.
    fn count_span(&mut self, now: Millis) {
        if let Some(since) = self.busy_since {
            self.busy_since = Some(now);
            let span = now.since(since).saturating_mul(u64::from(self.unblocks));
            self.critical_path_wait_ms = self.critical_path_wait_ms.saturating_add(span);
        }
    }

    /// A failure with this signature at `now`: the same one as the last counts as a
    /// repeat.
    pub(crate) fn failed(&mut self, signature: u64, now: Millis) -> u32 {
        self.last_active = self.last_active.max(now);
        self.failures = self.failures.saturating_add(1);
        if self.last_failure == Some(signature) {
            self.repeats = self.repeats.saturating_add(1);
        } else {
            self.last_failure = Some(signature);
            self.repeats = 0;
        }
        self.repeats
    }
}
/// Who opens a task (see [`Tasks::open`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opener {
    /// The operator: the whole table; the task is nobody's.
    Operator,
    /// A member of a shared limiter, for its own agent: three quarters of it; the task is
    /// that agent's, and an open task of another's is refused.
    Member(AgentId),
    /// A request naming a task nobody opened: three quarters of it, no update; the task is
    /// the request's agent's.
    Request(AgentId),
}
