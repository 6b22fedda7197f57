//! What the coordinator answers ([`Decision`], [`Settlement`]) and what it reports on its
//! own ([`Event`]).

use serde::{Deserialize, Serialize};

use crate::bucket::{Axis, Demand};
use crate::ids::LeaseId;
use crate::ids::{AgentId, PoolId};
use crate::time::Millis;

/// Why a request was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RejectReason {
    /// The request needs more of this axis than the pool hands out in a whole window: it
    /// would wait forever.
    ExceedsCapacity {
        /// The axis.
        axis: Axis,
    },
    /// The estimated wait is longer than `max_queue_wait_ms`.
    WaitTooLong,
    /// The pool's queue holds `max_queue_depth` tickets.
    QueueFull,
    /// `max_leases` leases and tickets are alive.
    TooManyLeases,
    /// `max_agents` agents are tracked and none is idle.
    TooManyAgents,
}

/// The answer to [`Coordinator::request_lease`](crate::Coordinator::request_lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[must_use]
pub enum Decision {
    /// Send now; settle before `expires_at` or the reservation is kept without refund.
    Grant {
        /// The lease to settle.
        lease: LeaseId,
        /// When it is reaped.
        expires_at: Millis,
    },
    /// In line: an [`Event::Granted`] with this id follows. Checkpoint before waiting.
    Queued {
        /// The ticket, which becomes the lease.
        lease: LeaseId,
        /// Estimated grant time (assumes estimates hold and no higher-priority arrivals).
        eta: Millis,
    },
    /// Not now. Come back at `retry_at` (the request keeps its place in the fair order
    /// until a window after it).
    Reject {
        /// When a new request has a fair chance.
        retry_at: Millis,
        /// Why.
        reason: RejectReason,
    },
    /// Never as asked: the request needs more than the pool allows in a window
    /// (`exceeds_capacity`). Asking again with the same figures is refused again.
    NeverFits {
        /// Why.
        reason: RejectReason,
    },
}

/// The answer to [`Coordinator::settle`](crate::Coordinator::settle): what the lease had reserved and what it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlement {
    /// Reserved at grant, per axis.
    pub reserved: Demand,
    /// Used, per axis, by the pool's counting rules.
    pub used: Demand,
}

/// Something that happened, for the host to act on or log. Drain with
/// [`Coordinator::poll_event`](crate::Coordinator::poll_event) after every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Event {
    /// A queued ticket was granted: the agent may send now.
    Granted {
        /// The lease (same id as the ticket).
        lease: LeaseId,
        /// Its agent.
        agent: AgentId,
        /// Its pool.
        pool: PoolId,
        /// When it is reaped.
        expires_at: Millis,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A queued ticket's promise was replaced by a later one, before it passed: something
    /// its bound does not assume happened (a call used more than it reserved, the
    /// provider's figures came in below the model, a 429 paused the pool or cut the
    /// margin, a capacity changed, an agent joined or asked with a higher weight, every
    /// concurrency slot was still held when the promise came). The ticket is granted by
    /// `eta` (see `Coordinator::request_lease`). A ticket has at most one such event waiting
    /// to be polled: revised again before the host polls, the event carries the promise in
    /// force when it is polled.
    Revised {
        /// The ticket.
        lease: LeaseId,
        /// Its agent.
        agent: AgentId,
        /// Its pool.
        pool: PoolId,
        /// The new promise.
        eta: Millis,
    },
    /// A lease was not settled in time and was reaped with no refund.
    Expired {
        /// The lease.
        lease: LeaseId,
        /// Its agent.
        agent: AgentId,
        /// Its pool.
        pool: PoolId,
    },
    /// The pool's margin moved.
    MarginChanged {
        /// The pool.
        pool: PoolId,
        /// Before, thousandths.
        from_permille: u32,
        /// After, thousandths.
        to_permille: u32,
        /// Why it moved.
        reason: MarginReason,
    },
    /// A 429, or an operator's [`hold`](crate::Coordinator::hold), paused new grants for the whole pool.
    Paused {
        /// The pool.
        pool: PoolId,
        /// Until when.
        until: Millis,
    },
    /// The pool's margin has sat at its floor (within `margin.floor_alert_band_permille`)
    /// for `margin.floor_alert_ms`: the provider keeps answering 429 although the leases
    /// stay under the limits, so something outside the coordinator is using this key.
    /// Raised once per stretch at the floor.
    MarginAtFloor {
        /// The pool.
        pool: PoolId,
        /// The axis with the highest usage against its limit over the last minutes, if any
        /// usage was seen.
        axis: Option<Axis>,
        /// The margin, thousandths.
        margin_permille: u32,
        /// Since when it has been at the floor.
        since: Millis,
    },
    /// The median input-estimate error of an agent's last `estimate_alert.samples` calls
    /// that completed with the provider's usage (see [`crate::Coordinator::settle`]; a
    /// refused, interrupted, cancelled or expired call is not one) has been above the
    /// threshold for `estimate_alert.consecutive` of them in a row. Raised once until the
    /// median falls back.
    EstimateAlert {
        /// The agent.
        agent: AgentId,
        /// The median input error it was raised on, thousandths.
        error_permille: u32,
    },
}

/// Why a pool's margin moved (see [`crate::MarginConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarginReason {
    /// A 429 against a granted lease: cut by `decrease_permille`.
    RateLimited,
    /// A clean interval (no 429) below the start: recovering towards it.
    Recovered,
    /// A clean interval above the start with the evidence that the reserve is idle: the
    /// pool's completed calls estimated within `confirm_error_permille` at the median and
    /// the provider's remaining-capacity headers agreeing with the model.
    Confirmed,
    /// The provider's remaining capacity was below the model's by more than
    /// `agree_tolerance_permille` of the limit: a margin above the start goes back to it.
    HeadersDisagreed,
}
