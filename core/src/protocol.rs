//! The host protocol: every input the coordinator takes as one value ([`Input`]), every
//! answer as one value ([`Output`]), and [`Coordinator::handle`] between them.
//!
//! A host that speaks this protocol needs no method per input: it decodes an [`Input`]
//! (JSON: `{"op": "call_lease", …}`), calls `handle`, encodes the [`Output`] (JSON:
//! `{"output": "send", …}`), and drives time with [`Coordinator::poll_timeout`],
//! `handle(now, &Input::Timeout {})` and [`Coordinator::poll_event`]. A new input is a new
//! variant here and a new arm in `handle`; every boundary that carries the JSON (the napi
//! addon's and the wasm build's `handle`, the conformance runners) takes it unchanged.
//!
//! The typed methods ([`Coordinator::request_lease`], [`Coordinator::call_lease`], …) are
//! the same decisions; `handle` calls them.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::AgentId;
use crate::call::{Call, GiveUp, LeaseStep, ResponseStep, Wait};
use crate::coordinator::Coordinator;
use crate::coordinator::feedback::Source;
use crate::decision::{Decision, RejectReason, Settlement};
use crate::error::LeaseError;
use crate::headers::{HeaderReport, parse_headers};
use crate::ids::LeaseId;
use crate::ids::PoolId;

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}
use crate::ids::TaskId;
use crate::request::{LeaseRequest, Usage};
use crate::tasks::{TaskOutcome, TaskSpec, TaskSummary};
use crate::time::Millis;

/// One input to the coordinator. Its JSON is tagged by `op`, with the fields named below;
/// unknown fields are refused (a misspelt optional field is an error, not a default).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Input {
    /// Before a model call: [`Coordinator::request_lease`].
    RequestLease {
        /// What the call asks for.
        request: LeaseRequest,
    },
    /// After it, with the provider's usage: [`Coordinator::settle`].
    Settle {
        /// The lease.
        lease: LeaseId,
        /// What the provider reported.
        usage: Usage,
    },
    /// A queued ticket no longer wanted, or a lease never used: [`Coordinator::cancel`].
    Cancel {
        /// The lease or ticket.
        lease: LeaseId,
    },
    /// A granted lease whose call still works: [`Coordinator::renew`].
    Renew {
        /// The lease.
        lease: LeaseId,
    },
    /// The provider's status and headers: [`parse_headers`] then
    /// [`Coordinator::handle_response`].
    Response {
        /// The pool the call went to.
        pool: PoolId,
        /// The lease it was sent under, if any.
        #[serde(default)]
        lease: Option<LeaseId>,
        /// The HTTP status.
        status: u16,
        /// The response headers, as name/value pairs.
        #[serde(default)]
        headers: Vec<(String, String)>,
        /// The host's wall clock (Unix ms), for headers that carry dates.
        #[serde(default)]
        unix_now_ms: Option<u64>,
        /// Reported by another process (a member of a shared limiter) rather than seen by
        /// this host: a 429 pauses the pool for at most `feedback.max_reported_pause_ms`.
        #[serde(default, skip_serializing_if = "is_false")]
        reported: bool,
    },
    /// Time passed: [`Coordinator::handle_timeout`].
    Timeout {},
    /// The call lifecycle's ask: [`Coordinator::call_lease`].
    CallLease {
        /// The call's state, as the previous step returned it (a new call: `{}`).
        #[serde(default)]
        call: Call,
        /// What the call asks for.
        request: LeaseRequest,
    },
    /// The call lifecycle's answer from the provider: [`parse_headers`] then
    /// [`Coordinator::call_response`].
    CallResponse {
        /// The call's state, as the previous step returned it.
        #[serde(default)]
        call: Call,
        /// The pool the call went to.
        pool: PoolId,
        /// The lease it was sent under, if any.
        #[serde(default)]
        lease: Option<LeaseId>,
        /// The HTTP status.
        status: u16,
        /// The response headers, as name/value pairs.
        #[serde(default)]
        headers: Vec<(String, String)>,
        /// The host's wall clock (Unix ms), for headers that carry dates.
        #[serde(default)]
        unix_now_ms: Option<u64>,
        /// As for `response`: reported by another process.
        #[serde(default, skip_serializing_if = "is_false")]
        reported: bool,
    },
    /// A call that ended without a usage report: [`Coordinator::call_interrupted`].
    CallInterrupted {
        /// The lease.
        lease: LeaseId,
        /// The usage seen before the end, if any.
        #[serde(default)]
        seen: Option<Usage>,
    },
    /// Opens a task: [`Coordinator::open_task`].
    OpenTask {
        /// The task.
        task: TaskSpec,
        /// Opened by a member of a shared limiter (an agent's own credential), not the
        /// operator: the member's agent. A new task only while fewer than three quarters of
        /// `max_tasks` are open, as a request naming one, and it is that agent's; an open
        /// task of another agent's (or the operator's) is `forbidden`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        member: Option<AgentId>,
    },
    /// A failure of an open task: [`Coordinator::task_failed`].
    TaskFailed {
        /// The task.
        task: TaskId,
        /// The failure's signature (a hash the host computes).
        signature: u64,
        /// Reported by a member of a shared limiter: its agent, which may fail only its
        /// own tasks (`forbidden`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        member: Option<AgentId>,
    },
    /// Ends an open task: [`Coordinator::end_task`].
    EndTask {
        /// The task.
        task: TaskId,
        /// How it ended.
        outcome: TaskOutcome,
        /// Ended by a member of a shared limiter: its agent, which may end only its own
        /// tasks (`forbidden`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        member: Option<AgentId>,
    },
    /// The host restarted: end every live lease and ticket not in `keep`, as calls that
    /// died with it: [`Coordinator::restarted`].
    Restarted {
        /// The leases and tickets the host still holds.
        #[serde(default)]
        keep: Vec<LeaseId>,
    },
    /// The operator holds a pool: no grant until `until` (a key being rotated, a provider
    /// incident, a spend alarm): [`Coordinator::hold`].
    Hold {
        /// The pool.
        pool: PoolId,
        /// Until when.
        until: Millis,
    },
}

/// The coordinator's answer to one [`Input`]. Its JSON is tagged by `output`. Each
/// transition is its own variant: a host matches on what to do, never on a field being
/// null.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "output", rename_all = "snake_case")]
#[must_use]
pub enum Output {
    /// `request_lease`: send now under `lease`; settle before `expires_at`.
    Granted {
        /// The lease.
        lease: LeaseId,
        /// When it is reaped.
        expires_at: Millis,
    },
    /// `request_lease`: in line; an [`Event::Granted`](crate::Event::Granted) follows.
    Queued {
        /// The ticket, which becomes the lease.
        lease: LeaseId,
        /// The grant is due by then if estimates hold.
        eta: Millis,
    },
    /// `request_lease`: not now; ask again at `retry_at` (the request keeps its place).
    Refused {
        /// Why.
        reason: RejectReason,
        /// When to ask again.
        retry_at: Millis,
    },
    /// `request_lease`: the request can never be served as asked.
    NeverFits {
        /// Why.
        reason: RejectReason,
    },
    /// `call_lease`: send now under `lease`.
    Send {
        /// The call's state for its next step.
        call: Call,
        /// The lease to settle (or report on).
        lease: LeaseId,
        /// When it is reaped.
        expires_at: Millis,
    },
    /// `call_lease` or `call_response`: wait (see [`Wait`]), then ask again or, with a
    /// ticket, send when it is granted.
    Wait {
        /// The call's state for its next step.
        call: Call,
        /// The wait.
        wait: Wait,
        /// `call_response`: the lease's settlement (the core settled it as nothing used).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        settled: Option<Settlement>,
        /// `call_response`: what the headers said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report: Option<HeaderReport>,
    },
    /// `call_lease` or `call_response`: stop and surface the failure.
    GiveUp {
        /// The call's state.
        call: Call,
        /// The failure.
        give_up: GiveUp,
        /// `call_response`: the lease's settlement (the core settled it as nothing used).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        settled: Option<Settlement>,
        /// `call_response`: what the headers said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report: Option<HeaderReport>,
    },
    /// `call_response`: hand the response to the agent. A success is the host's to settle
    /// (`settled` absent); anything else the core settled as nothing used.
    Deliver {
        /// The call's state.
        call: Call,
        /// The lease's settlement, when the core settled it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        settled: Option<Settlement>,
        /// What the headers said.
        report: HeaderReport,
    },
    /// `settle` or `call_interrupted`: what the lease had reserved and what it was charged.
    Settled {
        /// The settlement.
        settlement: Settlement,
    },
    /// `cancel`: withdrawn (a ticket) or refunded in full (an unused lease).
    Cancelled,
    /// `renew`: the lease's new expiry.
    Renewed {
        /// When it is reaped now.
        expires_at: Millis,
    },
    /// `response`: what the headers said (the pool is resynced, paused on a 429).
    Reported {
        /// The parsed headers.
        report: HeaderReport,
    },
    /// `timeout`: due work done; drain [`Coordinator::poll_event`].
    TimedOut,
    /// `open_task`: open.
    TaskOpened,
    /// `task_failed`: the identical failures in a row (0 for a new one).
    TaskFailed {
        /// Repeats in a row.
        in_a_row: u32,
    },
    /// `end_task`: the task's figures.
    TaskEnded {
        /// The figures.
        summary: TaskSummary,
    },
    /// `restarted`: the leases charged as interrupted calls and the tickets withdrawn.
    Ended {
        /// Granted leases, charged as calls that returned nothing.
        interrupted: Vec<LeaseId>,
        /// Queued tickets, withdrawn.
        withdrawn: Vec<LeaseId>,
    },
    /// `hold`: the pool grants nothing until `until` (the hold asked for, bounded by
    /// `feedback.max_pause_ms`, or a longer pause already in force).
    Held {
        /// The pool.
        pool: PoolId,
        /// When grants resume.
        until: Millis,
    },
}

/// A decision as the host protocol answers `request_lease`.
impl From<Decision> for Output {
    fn from(decision: Decision) -> Output {
        match decision {
            Decision::Grant { lease, expires_at } => Output::Granted { lease, expires_at },
            Decision::Queued { lease, eta } => Output::Queued { lease, eta },
            Decision::Reject { retry_at, reason } => Output::Refused { reason, retry_at },
            Decision::NeverFits { reason } => Output::NeverFits { reason },
        }
    }
}

impl Coordinator {
    /// The host protocol: applies one [`Input`] at `now` and answers its [`Output`].
    /// Drain [`Coordinator::poll_event`] after it, and wake at
    /// [`Coordinator::poll_timeout`] with [`Input::Timeout`].
    ///
    /// Errors are the typed methods' ([`LeaseError`]); an input that fails changes nothing.
    ///
    /// ```
    /// use tokenwarden_core::*;
    ///
    /// let config = Config::from_json(r#"{"pools": [{"name": "sonnet",
    ///     "input_tokens_per_minute": 40000, "output_tokens_per_minute": 8000}]}"#).unwrap();
    /// let mut coord = Coordinator::new(config, 42, Millis(0)).unwrap();
    /// let ask: Input = serde_json::from_str(r#"{"op": "call_lease", "call": {},
    ///     "request": {"agent": 1, "pool": 0, "input_tokens": 20000, "max_tokens": 1000}}"#).unwrap();
    /// let Output::Send { call, lease, .. } = coord.handle(Millis(0), &ask).unwrap() else {
    ///     panic!("it fits")
    /// };
    /// let answer = coord.handle(Millis(900), &Input::CallResponse {
    ///     call, pool: PoolId(0), lease: Some(lease), status: 200,
    ///     headers: vec![], unix_now_ms: None, reported: false,
    /// }).unwrap();
    /// assert!(matches!(answer, Output::Deliver { settled: None, .. }), "a success is the host's to settle");
    /// let usage = Usage { input_tokens: 19_000, output_tokens: 700, ..Usage::default() };
    /// let settled = coord.handle(Millis(1_000), &Input::Settle { lease, usage }).unwrap();
    /// assert_eq!(
    ///     serde_json::to_value(&settled).unwrap()["output"],
    ///     "settled",
    /// );
    /// ```
    pub fn handle(&mut self, now: Millis, input: &Input) -> Result<Output, LeaseError> {
        Ok(match input {
            Input::RequestLease { request } => Output::from(self.request_lease(now, request)?),
            Input::Settle { lease, usage } => Output::Settled {
                settlement: self.settle(now, *lease, usage)?,
            },
            Input::Cancel { lease } => {
                self.cancel(now, *lease)?;
                Output::Cancelled
            }
            Input::Renew { lease } => Output::Renewed {
                expires_at: self.renew(now, *lease)?,
            },
            Input::Response {
                pool,
                lease,
                status,
                headers,
                unix_now_ms,
                reported,
            } => {
                let report = report_of(headers, *unix_now_ms);
                let from = Source::of(*reported);
                self.response_from(now, (*pool, *lease), *status, &report, from)?;
                Output::Reported { report }
            }
            Input::Timeout {} => {
                self.handle_timeout(now);
                Output::TimedOut
            }
            Input::CallLease { call, request } => {
                let mut call = *call;
                match self.call_lease(now, &mut call, request)? {
                    LeaseStep::Send { lease, expires_at } => Output::Send {
                        call,
                        lease,
                        expires_at,
                    },
                    LeaseStep::Wait(wait) => Output::Wait {
                        call,
                        wait,
                        settled: None,
                        report: None,
                    },
                    LeaseStep::GiveUp(give_up) => Output::GiveUp {
                        call,
                        give_up,
                        settled: None,
                        report: None,
                    },
                }
            }
            Input::CallResponse {
                call,
                pool,
                lease,
                status,
                headers,
                unix_now_ms,
                reported,
            } => {
                let mut call = *call;
                let report = report_of(headers, *unix_now_ms);
                let from = Source::of(*reported);
                let answer = self.call_response_from(
                    now,
                    &mut call,
                    (*pool, *lease),
                    *status,
                    &report,
                    from,
                )?;
                let settled = answer.settled;
                match answer.step {
                    ResponseStep::Deliver => Output::Deliver {
                        call,
                        settled,
                        report,
                    },
                    ResponseStep::Wait(wait) => Output::Wait {
                        call,
                        wait,
                        settled,
                        report: Some(report),
                    },
                    ResponseStep::GiveUp(give_up) => Output::GiveUp {
                        call,
                        give_up,
                        settled,
                        report: Some(report),
                    },
                }
            }
            Input::CallInterrupted { lease, seen } => Output::Settled {
                settlement: self.call_interrupted(now, *lease, seen.as_ref())?,
            },
            Input::OpenTask { task, member } => {
                let by = match member {
                    Some(m) => crate::tasks::Opener::Member(*m),
                    None => crate::tasks::Opener::Operator,
                };
                self.open_task_by(now, task, by)?;
                Output::TaskOpened
            }
            Input::TaskFailed {
                task,
                signature,
                member,
            } => Output::TaskFailed {
                in_a_row: self.task_failed_by(now, *task, *signature, *member)?,
            },
            Input::EndTask {
                task,
                outcome,
                member,
            } => Output::TaskEnded {
                summary: self.end_task_by(now, *task, *outcome, *member)?,
            },
            Input::Restarted { keep } => {
                let (interrupted, withdrawn) = self.restarted(now, keep);
                Output::Ended {
                    interrupted,
                    withdrawn,
                }
            }
            Input::Hold { pool, until } => Output::Held {
                pool: *pool,
                until: self.hold(now, *pool, *until)?,
            },
        })
    }
}

fn report_of(headers: &[(String, String)], unix_now_ms: Option<u64>) -> HeaderReport {
    parse_headers(
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        unix_now_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::Input;

    fn refused(json: &str) -> alloc::string::String {
        match serde_json::from_str::<Input>(json) {
            Ok(input) => panic!("{json} was taken as {input:?}"),
            Err(e) => alloc::format!("{e}"),
        }
    }

    #[test]
    fn a_request_without_an_agent_is_refused() {
        let e = refused(r#"{"op":"request_lease","request":{"pool":0,"input_tokens":10}}"#);
        assert!(e.contains("missing field `agent`"), "{e}");
        let e = refused(r#"{"op":"call_lease","call":{},"request":{"max_tokens":10}}"#);
        assert!(e.contains("missing field `agent`"), "{e}");
        let ok: Input =
            serde_json::from_str(r#"{"op":"request_lease","request":{"agent":0}}"#).unwrap();
        assert!(matches!(ok, Input::RequestLease { request } if request.agent.0 == 0));
    }

    #[test]
    fn an_input_without_fields_refuses_extra_ones() {
        let e = refused(r#"{"op":"timeout","extra":1}"#);
        assert!(e.contains("unknown field `extra`"), "{e}");
        assert_eq!(
            serde_json::from_str::<Input>(r#"{"op":"timeout"}"#).unwrap(),
            Input::Timeout {}
        );
        assert_eq!(
            serde_json::to_string(&Input::Timeout {}).unwrap(),
            r#"{"op":"timeout"}"#
        );
    }
}
