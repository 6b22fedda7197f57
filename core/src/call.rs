//! One model call, from the first ask to the answer the agent receives, as values the core
//! decides and a host acts on.
//!
//! Which statuses are retried, how long to wait (`retry-after`, `reset_at`, backoff), when
//! to give up and what a failed call is charged are all decided here, so every host (the
//! fetch wrapper, the edge limiter, the simulator, a Rust host) behaves the same and the
//! conformance traces cover it.

use serde::{Deserialize, Serialize};

use crate::decision::{RejectReason, Settlement};
use crate::ids::LeaseId;
use crate::time::Millis;

/// What the core remembers about one call between its steps. The host keeps it (it is
/// small and `Copy`) and passes it to every step; start with [`Call::new`] (in JSON, `{}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Call {
    /// Sends that failed in a way worth retrying (429, overloaded).
    pub failed: u32,
    /// Refusals (a lease answered with a retry time) waited out.
    pub refusals: u32,
    /// The most recent `Retry-After` the provider sent, ms.
    pub last_retry_after_ms: Option<u64>,
}

impl Call {
    /// A call that has not been asked yet.
    #[must_use]
    pub fn new() -> Call {
        Call::default()
    }
}

/// What the host does after asking for capacity ([`Coordinator::call_lease`](crate::Coordinator::call_lease)).
///
/// A host's whole loop for one call:
///
/// ```text
/// let mut call = Call::new();
/// loop {
///     match coordinator.call_lease(now, &mut call, &request)? {
///         LeaseStep::Send { lease, .. } => {
///             let response = send(…);                    // network error: call_interrupted
///             match coordinator.call_response(now, &mut call, pool, Some(lease), status, &report)?.step {
///                 ResponseStep::Deliver => { /* settle from the body's usage; hand it over */ }
///                 ResponseStep::Wait { until, .. } => sleep_until(until),   // then ask again
///                 ResponseStep::GiveUp { .. } => { /* hand the error over, with last_retry_after_ms */ }
///             }
///         }
///         LeaseStep::Wait { until, ticket: Some(t), .. } => wait_for_grant(t),  // Event::Granted
///         LeaseStep::Wait { until, .. } => sleep_until(until),                  // then ask again
///         LeaseStep::GiveUp { .. } => fail,
///     }
/// }
/// ```
///
/// The same loop over the host protocol ([`Coordinator::handle`](crate::Coordinator::handle))
/// is [`Output::Send`](crate::Output::Send), [`Output::Wait`](crate::Output::Wait),
/// [`Output::GiveUp`](crate::Output::GiveUp) and [`Output::Deliver`](crate::Output::Deliver).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[must_use]
pub enum LeaseStep {
    /// Send the request now, under this lease.
    Send {
        /// The lease to settle (or report on).
        lease: LeaseId,
        /// When it is reaped.
        expires_at: Millis,
    },
    /// Wait (see [`Wait`]).
    Wait(Wait),
    /// Stop and surface the failure (see [`GiveUp`]).
    GiveUp(GiveUp),
}

/// What the host does with a provider's answer ([`Coordinator::call_response`](crate::Coordinator::call_response)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[must_use]
pub enum ResponseStep {
    /// The response is the answer: hand it to the agent. A success is settled by the host
    /// from the usage it reports; any other status (a refusal, or a failure not worth
    /// retrying) was settled by the core as nothing used.
    Deliver,
    /// Wait, then ask again (see [`Wait`]; never with a ticket).
    Wait(Wait),
    /// Stop and surface the failure (see [`GiveUp`]).
    GiveUp(GiveUp),
}

/// A wait: until `until`. With a `ticket` the call is in the queue: wait for its
/// [`Event::Granted`](crate::Event::Granted) (due by `until` if estimates hold), then send
/// under it. Without one, ask again ([`Coordinator::call_lease`](crate::Coordinator::call_lease))
/// at `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    /// When to ask again; for a ticket, its promise: it is granted by then (a later
    /// promise may replace it before it passes: [`Event::Revised`](crate::Event::Revised)).
    pub until: Millis,
    /// When the wait is expected to end: for a ticket, its expected grant
    /// ([`Coordinator::expected_grant`](crate::Coordinator::expected_grant)), at most
    /// `until`; otherwise `until`. What a host tells a person.
    pub expected: Millis,
    /// Why.
    pub reason: WaitReason,
    /// The queued ticket, which becomes the lease.
    pub ticket: Option<LeaseId>,
    /// The refusal, when `reason` is `refused`.
    pub refusal: Option<RejectReason>,
    /// Failed sends so far (0 while only queueing or refused).
    pub attempt: u32,
    /// The wait is long (at least `call.checkpoint_after_ms`, or the prompt cache's
    /// lifetime): the agent should write its turn down before waiting, so that it
    /// resumes without re-planning. For a queued call the wait judged is the one it may
    /// well have (the 90th percentile of the pool's learned waits against their refill
    /// time, at most `until`), so a wait that turns out long was flagged.
    pub checkpoint: bool,
}

/// A call that stops: the failure to surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiveUp {
    /// Why.
    pub reason: GiveUpReason,
    /// The refusal that ended it, for `never_fits` and `refusals`.
    pub refusal: Option<RejectReason>,
    /// Sends made that failed.
    pub attempts: u32,
    /// The last `Retry-After` the provider sent, ms: whether the fix is patience or a
    /// higher tier.
    pub last_retry_after_ms: Option<u64>,
}

/// Either step, as one value: what the bindings' shared encodings (the register file, the
/// WIT `call-step`) carry. Its JSON is the same as [`LeaseStep`]'s and [`ResponseStep`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[must_use]
pub enum CallStep {
    /// [`LeaseStep::Send`].
    Send {
        /// The lease to settle (or report on).
        lease: LeaseId,
        /// When it is reaped.
        expires_at: Millis,
    },
    /// [`LeaseStep::Wait`] or [`ResponseStep::Wait`].
    Wait(Wait),
    /// [`ResponseStep::Deliver`].
    Deliver,
    /// [`LeaseStep::GiveUp`] or [`ResponseStep::GiveUp`].
    GiveUp(GiveUp),
}

impl From<LeaseStep> for CallStep {
    fn from(step: LeaseStep) -> CallStep {
        match step {
            LeaseStep::Send { lease, expires_at } => CallStep::Send { lease, expires_at },
            LeaseStep::Wait(w) => CallStep::Wait(w),
            LeaseStep::GiveUp(g) => CallStep::GiveUp(g),
        }
    }
}

impl From<ResponseStep> for CallStep {
    fn from(step: ResponseStep) -> CallStep {
        match step {
            ResponseStep::Deliver => CallStep::Deliver,
            ResponseStep::Wait(w) => CallStep::Wait(w),
            ResponseStep::GiveUp(g) => CallStep::GiveUp(g),
        }
    }
}

/// What [`Coordinator::call_response`](crate::Coordinator::call_response) answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[must_use]
pub struct CallResponse {
    /// What to do next.
    pub step: ResponseStep,
    /// The lease's settlement, when the core settled it (a response that is not a success
    /// is settled as nothing used); `None` for a success, which the host settles.
    pub settled: Option<Settlement>,
}

/// Why a call waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// In the fair queue.
    Queued,
    /// Refused for now (queue full, wait too long, tables full); its place is kept.
    Refused,
    /// The provider answered 429.
    RateLimited,
    /// The provider answered a server error it says to retry (overloaded).
    Overloaded,
}

/// Why a call gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GiveUpReason {
    /// The request can never be served as asked (larger than the pool's capacity).
    NeverFits,
    /// `call.max_refusals` refusals in a row.
    Refusals,
    /// `backoff.max_attempts` failed sends.
    Attempts,
}
