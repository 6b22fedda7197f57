//! Tasks (open, failed, ended) and the margin-at-floor watch.

use crate::decision::Event;
use crate::error::LeaseError;
use crate::ids::TaskId;
use crate::ids::{AgentId, PoolId};
use crate::metrics::MINUTE_MS;
use crate::metrics::{TaskFigures, TaskMetrics};
use crate::tasks::{Ended, Opener, TaskOutcome, TaskSpec, TaskSummary};
use crate::time::Millis;

use super::Coordinator;

impl Coordinator {
    /// Opens a task, or updates an open one's role and unblocks. Requests naming it
    /// ([`LeaseRequest::task`](crate::LeaseRequest::task)) are then weighted by the task
    /// (role × (1 + bonus × unblocks), halved per repeated identical failure down to the
    /// floor: [`Coordinator::task_failed`]) and charged to it. Opening is optional: a
    /// request naming an unknown task opens it, but only while fewer than three quarters
    /// of `max_tasks` are open (beyond, the request runs untracked), so an explicit open
    /// always has a quarter of the table, whatever callers name.
    ///
    /// When the table is full, the least recently active task idle for `task_idle_ms`
    /// (no open, lease request or failure naming it) is ended as abandoned, its figures
    /// folded into the totals like any ended task, to make room. `TooManyTasks` when
    /// `max_tasks` tasks are open, none of them idle, and this one is not among them
    /// (nothing changes then).
    pub fn open_task(&mut self, now: Millis, spec: &TaskSpec) -> Result<(), LeaseError> {
        self.open_task_by(now, spec, Opener::Operator)
    }

    /// [`Coordinator::open_task`] by `by`: a member of a shared limiter (an agent's own
    /// credential) opens a new task only while fewer than three quarters of `max_tasks`
    /// are open, as a request naming one does (the last quarter is the operator's), and
    /// updates only its own agent's (`Forbidden` otherwise).
    pub(crate) fn open_task_by(
        &mut self,
        now: Millis,
        spec: &TaskSpec,
        by: Opener,
    ) -> Result<(), LeaseError> {
        // The clock moves only if the open succeeds: a refusal changes nothing.
        let now = self.now.max(now);
        let bounds = (self.config.max_tasks, self.config.task_idle_ms);
        self.tasks.open(spec, now, bounds, by)?;
        self.clamp(now);
        Ok(())
    }

    /// A failure of an open task (a failing test, a rejected diff), named by a signature
    /// the host computes (a hash of the failing test's name and the diff): the same
    /// signature as the task's previous failure is a repeat, and each repeat in a row
    /// multiplies the task's weight by `weights.repeat_failure_decay` (½ by default) down
    /// to `weights.floor`. Returns the repeats in a row (0 for a new failure).
    pub fn task_failed(
        &mut self,
        now: Millis,
        task: TaskId,
        signature: u64,
    ) -> Result<u32, LeaseError> {
        self.task_failed_by(now, task, signature, None)
    }

    /// [`Coordinator::task_failed`] by `member` (an agent's own credential at a shared
    /// limiter, `None` for the operator): a member fails only its own agent's tasks.
    pub(crate) fn task_failed_by(
        &mut self,
        now: Millis,
        task: TaskId,
        signature: u64,
        member: Option<AgentId>,
    ) -> Result<u32, LeaseError> {
        self.may_act(task, member)?;
        let now = self.clamp(now);
        let t = self.tasks.get_mut(task).ok_or(LeaseError::UnknownTask)?;
        Ok(t.failed(signature, now))
    }

    /// Whether `member` may act on open task `task`: the operator (`None`) on any, a member
    /// on its own agent's. `UnknownTask` when it is not open.
    fn may_act(&self, task: TaskId, member: Option<AgentId>) -> Result<(), LeaseError> {
        let t = self.tasks.get(task).ok_or(LeaseError::UnknownTask)?;
        match member {
            Some(m) if t.owner != Some(m) => Err(LeaseError::Forbidden),
            _ => Ok(()),
        }
    }

    /// Ends an open task: its figures are returned and folded into
    /// [`Metrics::tasks`](crate::Metrics::tasks). Leases of it still alive are no longer
    /// charged to any task.
    pub fn end_task(
        &mut self,
        now: Millis,
        task: TaskId,
        outcome: TaskOutcome,
    ) -> Result<TaskSummary, LeaseError> {
        self.end_task_by(now, task, outcome, None)
    }

    /// [`Coordinator::end_task`] by `member` (`None`: the operator): a member ends only its
    /// own agent's tasks.
    pub(crate) fn end_task_by(
        &mut self,
        now: Millis,
        task: TaskId,
        outcome: TaskOutcome,
        member: Option<AgentId>,
    ) -> Result<TaskSummary, LeaseError> {
        self.may_act(task, member)?;
        let now = self.clamp(now);
        self.tasks
            .end(task, outcome, now)
            .ok_or(LeaseError::UnknownTask)
    }

    /// The task figures as of `now`.
    pub(super) fn task_metrics(&self, now: Millis) -> TaskMetrics {
        let minute = (now.0 / MINUTE_MS).saturating_sub(1);
        let (mut calls, mut limited, mut m_calls, mut m_limited) = (0u64, 0u64, 0u64, 0u64);
        for pool in &self.pools {
            let c = &pool.counters;
            calls = calls.saturating_add(c.granted_now.saturating_add(c.granted_from_queue));
            limited = limited.saturating_add(c.rate_limited);
            if let Some(m) = pool.minutes.iter().find(|m| m.minute == minute) {
                m_calls = m_calls.saturating_add(u64::from(m.granted));
                m_limited = m_limited.saturating_add(u64::from(m.rate_limited));
            }
        }
        let since_start = TaskFigures {
            task_time_p50_ms: self.tasks.times.percentile(500),
            task_time_p95_ms: self.tasks.times.percentile(950),
            ..self.tasks.total.figures(calls, limited)
        };
        let last: Ended = self.tasks.minute(minute);
        TaskMetrics {
            open: u32::try_from(self.tasks.len()).unwrap_or(u32::MAX),
            untracked: self.tasks.untracked,
            since_start,
            last_minute: last.figures(m_calls, m_limited),
            minute,
        }
    }

    /// Raises [`Event::MarginAtFloor`] for a pool whose margin has sat at its floor for
    /// `margin.floor_alert_ms` without rising, once per stretch.
    pub(super) fn watch_margins(&mut self, now: Millis) {
        let m = &self.config.margin;
        let near = m.floor_permille.saturating_add(m.floor_alert_band_permille);
        let after = m.floor_alert_ms;
        for (i, pool) in self.pools.iter_mut().enumerate() {
            let rose = pool.margin > pool.floor_level;
            pool.floor_level = pool.margin;
            if pool.margin > near || after == 0 {
                pool.floor_since = None;
                pool.floor_alerted = false;
                continue;
            }
            // Near the floor and 429s keep it there: a margin climbing back (no 429 for a
            // clean interval) is recovering, and its stretch starts again.
            if rose {
                pool.floor_since = Some(now);
                pool.floor_alerted = false;
            }
            let since = *pool.floor_since.get_or_insert(now);
            if !pool.floor_alerted && now.since(since) >= after {
                pool.floor_alerted = true;
                let axis = super::report::recent_binding_axis(pool, now);
                self.events.push_back(Event::MarginAtFloor {
                    pool: PoolId(u32::try_from(i).unwrap_or(u32::MAX)),
                    axis,
                    margin_permille: pool.margin,
                    since,
                });
            }
        }
    }

    /// When the next margin-at-floor alert is due, if one is.
    pub(super) fn next_floor_alert(&self) -> Option<Millis> {
        let after = self.config.margin.floor_alert_ms;
        if after == 0 {
            return None;
        }
        self.pools
            .iter()
            .filter(|p| !p.floor_alerted)
            .filter_map(|p| p.floor_since.map(|s| s.plus(after)))
            .min()
    }
}
