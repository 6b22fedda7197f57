//! Every conversion between JavaScript values and core types, and every error the addon
//! throws. `lib.rs` only calls into here.
//!
//! Numbers: JavaScript numbers are exact integers below 2^53, so every `u64` the core
//! returns crosses as a `number` when it is at most 2^53 − 1 and as a `bigint` above
//! (`U64`). Arguments accept either: a non-negative integer `number`, or a `bigint` in
//! `0..2^64`. Lease ids are always below 2^53, so they are plain numbers.
//!
//! Keys: objects built here use camelCase keys; enum tags keep the core's snake_case
//! spelling (`"exceeds_capacity"`, `"input_tokens"`), the same strings as in the trace
//! files. Serde-shaped outputs (metrics, header reports) are recased by `camel_keys`.

use napi::bindgen_prelude::{BigInt, Either, JsObjectValue};
use napi::{Env, JsError, JsRangeError, JsTypeError, JsValue, Status};
use napi_derive::napi;
use serde_json::{Map, Value};
use tokenwarden_core as core;

/// An unsigned 64-bit integer as JavaScript sees it: `number` up to 2^53 − 1, `bigint` above.
pub type U64 = Either<f64, BigInt>;

/// The largest integer a `number` holds exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// A `u64` for JavaScript: a `number` when exact, a `bigint` otherwise.
pub fn u64_to_js(v: u64) -> U64 {
    if v <= MAX_SAFE {
        #[allow(clippy::cast_precision_loss)] // exact: v < 2^53
        Either::A(v as f64)
    } else {
        Either::B(BigInt::from(v))
    }
}

/// A lease id for JavaScript (always below 2^53 by the core's construction).
#[allow(clippy::cast_precision_loss)] // exact: lease ids are below 2^53
pub fn lease_to_js(id: core::LeaseId) -> f64 {
    id.0 as f64
}

/// An error about to be thrown into JavaScript: its class, stable code, message and
/// optional offending field.
#[derive(Debug)]
pub struct Thrown {
    kind: ErrorKind,
    code: &'static str,
    message: String,
    field: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum ErrorKind {
    /// `Error`: the call was well formed but the state refuses it (unknown lease, …).
    Error,
    /// `RangeError`: a value out of range.
    Range,
    /// `TypeError`: a value of the wrong type.
    Type,
}

impl Thrown {
    /// A value outside its allowed range.
    pub fn range(code: &'static str, message: String) -> Thrown {
        Thrown {
            kind: ErrorKind::Range,
            code,
            message,
            field: None,
        }
    }

    /// A value of the wrong type.
    pub fn type_error(message: String) -> Thrown {
        Thrown {
            kind: ErrorKind::Type,
            code: "invalid_argument",
            message,
            field: None,
        }
    }

    /// Attaches the name of the offending field (`error.field` in JavaScript).
    pub fn with_field(mut self, field: impl Into<String>) -> Thrown {
        self.field = Some(field.into());
        self
    }

    /// Throws this error as a real JavaScript `Error`/`RangeError`/`TypeError` with `code`
    /// (and `field`) properties, and returns the marker napi-rs expects after a throw.
    pub fn throw(self, env: &Env) -> napi::Error {
        let base = napi::Error::new(self.code.to_owned(), self.message);
        let value = match self.kind {
            ErrorKind::Error => JsError::from(base).into_unknown(*env),
            ErrorKind::Range => JsRangeError::from(base).into_unknown(*env),
            ErrorKind::Type => JsTypeError::from(base).into_unknown(*env),
        };
        let thrown = value.coerce_to_object().and_then(|mut obj| {
            if let Some(field) = &self.field {
                obj.set_named_property("field", field.as_str())?;
            }
            env.throw(obj)
        });
        match thrown {
            Ok(()) => napi::Error::from_status(Status::PendingException),
            Err(e) => e,
        }
    }
}

/// A core `LeaseError` as the thrown error. `too_large` names the JavaScript field.
pub fn lease_error(e: core::LeaseError) -> Thrown {
    let message = e.to_string();
    match e {
        core::LeaseError::TooLarge { field } => {
            Thrown::range(e.code(), message).with_field(camel(field))
        }
        _ => Thrown {
            kind: ErrorKind::Error,
            code: e.code(),
            message,
            field: None,
        },
    }
}

/// A core `ConfigError` as the thrown error; `field` is the path in the configuration JSON.
pub fn config_error(e: &core::ConfigError) -> Thrown {
    let t = Thrown {
        kind: ErrorKind::Error,
        code: e.code(),
        message: e.to_string(),
        field: None,
    };
    if let core::ConfigError::Invalid { field, .. } = e {
        t.with_field(field.to_string())
    } else {
        t
    }
}

/// A core `RestoreError` as the thrown error.
pub fn restore_error(e: &core::RestoreError) -> Thrown {
    Thrown {
        kind: ErrorKind::Error,
        code: e.code(),
        message: e.to_string(),
        field: None,
    }
}

/// Reads an unsigned integer argument named `what`.
pub fn u64_arg(v: &U64, what: &str) -> Result<u64, Thrown> {
    match v {
        Either::A(n) => {
            // 2^64 as f64 is exact; anything at or above it does not fit.
            if n.is_finite() && n.fract() == 0.0 && *n >= 0.0 && *n < 18_446_744_073_709_551_616.0 {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked above
                Ok(*n as u64)
            } else {
                Err(Thrown::range(
                    "invalid_argument",
                    format!("`{what}` must be a non-negative integer below 2^64, got {n}"),
                )
                .with_field(what))
            }
        }
        Either::B(b) => {
            let (negative, value, lossless) = b.get_u64();
            if negative || !lossless {
                Err(Thrown::range(
                    "invalid_argument",
                    format!("`{what}` must be a bigint in 0..2^64"),
                )
                .with_field(what))
            } else {
                Ok(value)
            }
        }
    }
}

/// Reads a `u32` argument named `what` (pool ids, unblocks, HTTP status).
pub fn u32_arg(n: f64, what: &str) -> Result<u32, Thrown> {
    if n.is_finite() && n.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&n) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked above
        Ok(n as u32)
    } else {
        Err(Thrown::range(
            "invalid_argument",
            format!("`{what}` must be an integer in 0..2^32, got {n}"),
        )
        .with_field(what))
    }
}

/// A lease id argument: any non-negative integer; ids the core never issued are
/// `unknown_lease` there.
pub fn lease_arg(v: &U64) -> Result<core::LeaseId, Thrown> {
    u64_arg(v, "lease").map(core::LeaseId)
}

/// An agent's role in the task graph.
#[napi(string_enum = "lowercase")]
#[derive(Debug)]
pub enum Role {
    /// Plans work that unblocks others (weight 3 by default).
    Planner,
    /// Reviews (weight 2).
    Reviewer,
    /// A leaf worker (weight 1).
    Worker,
}

/// A request for capacity before one model call. Omitted fields take the core's defaults
/// (0, role `worker`, no failure signature).
#[napi(object, object_to_js = false)]
pub struct LeaseRequest {
    /// Who asks: an id the host chooses.
    pub agent: U64,
    /// Which pool (limit group), by index; see `Coordinator.poolId(name)`.
    pub pool: f64,
    /// Prompt tokens counted locally, excluding the cached prefix.
    pub input_tokens: Option<U64>,
    /// Tokens of the prompt covered by the agent's prompt cache.
    pub cached_prefix_tokens: Option<U64>,
    /// The call's `max_tokens`: the output reservation, refunded on settle.
    pub max_tokens: Option<U64>,
    /// The agent's role (default `worker`).
    pub role: Option<Role>,
    /// Downstream tasks waiting on this call.
    pub unblocks: Option<f64>,
    /// A hash of the agent's last failure; the same value twice in a row lowers its weight.
    pub failure_signature: Option<U64>,
}

fn opt_u64(v: Option<&U64>, what: &str) -> Result<u64, Thrown> {
    v.map_or(Ok(0), |v| u64_arg(v, what))
}

impl LeaseRequest {
    /// The core request, or the first invalid field.
    pub fn to_core(&self) -> Result<core::LeaseRequest, Thrown> {
        Ok(core::LeaseRequest {
            agent: core::AgentId(u64_arg(&self.agent, "agent")?),
            pool: core::PoolId(u32_arg(self.pool, "pool")?),
            input_tokens: opt_u64(self.input_tokens.as_ref(), "inputTokens")?,
            cached_prefix_tokens: opt_u64(
                self.cached_prefix_tokens.as_ref(),
                "cachedPrefixTokens",
            )?,
            max_tokens: opt_u64(self.max_tokens.as_ref(), "maxTokens")?,
            role: match self.role {
                Some(Role::Planner) => core::Role::Planner,
                Some(Role::Reviewer) => core::Role::Reviewer,
                Some(Role::Worker) | None => core::Role::Worker,
            },
            unblocks: self.unblocks.map_or(Ok(0), |n| u32_arg(n, "unblocks"))?,
            failure_signature: self
                .failure_signature
                .as_ref()
                .map(|v| u64_arg(v, "failureSignature"))
                .transpose()?,
        })
    }
}

/// What a call really used, as the provider reported it. Omitted fields are 0.
#[napi(object, object_to_js = false)]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: Option<U64>,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: Option<U64>,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: Option<U64>,
    /// Output tokens.
    pub output_tokens: Option<U64>,
}

impl Usage {
    /// The core usage, or the first invalid field.
    pub fn to_core(&self) -> Result<core::Usage, Thrown> {
        Ok(core::Usage {
            input_tokens: opt_u64(self.input_tokens.as_ref(), "inputTokens")?,
            cache_creation_input_tokens: opt_u64(
                self.cache_creation_input_tokens.as_ref(),
                "cacheCreationInputTokens",
            )?,
            cache_read_input_tokens: opt_u64(
                self.cache_read_input_tokens.as_ref(),
                "cacheReadInputTokens",
            )?,
            output_tokens: opt_u64(self.output_tokens.as_ref(), "outputTokens")?,
        })
    }
}

/// A rate-limited dimension of a pool.
#[napi(string_enum = "snake_case")]
#[derive(Debug)]
pub enum Axis {
    /// Input tokens per minute.
    InputTokens,
    /// Output tokens per minute.
    OutputTokens,
    /// Combined tokens per minute.
    Tokens,
    /// Requests per minute.
    Requests,
}

/// The axis's position in demand arrays (input, output, tokens, requests).
fn axis_index(a: core::Axis) -> u64 {
    match a {
        core::Axis::InputTokens => 0,
        core::Axis::OutputTokens => 1,
        core::Axis::Tokens => 2,
        core::Axis::Requests => 3,
    }
}

fn axis(a: core::Axis) -> Axis {
    match a {
        core::Axis::InputTokens => Axis::InputTokens,
        core::Axis::OutputTokens => Axis::OutputTokens,
        core::Axis::Tokens => Axis::Tokens,
        core::Axis::Requests => Axis::Requests,
    }
}

/// Why a request was rejected.
#[napi(
    discriminant = "kind",
    discriminant_case = "snake_case",
    object_from_js = false
)]
pub enum RejectReason {
    /// Needs more of `axis` than the pool hands out in a whole window: it would wait forever.
    ExceedsCapacity {
        /// The axis.
        axis: Axis,
    },
    /// The estimated wait is longer than `max_queue_wait_ms`.
    WaitTooLong,
    /// The pool's queue is full.
    QueueFull,
    /// `max_leases` leases and tickets are alive.
    TooManyLeases,
    /// `max_agents` agents are tracked and none is idle.
    TooManyAgents,
}

/// The answer to `requestLease`.
#[napi(
    discriminant = "kind",
    discriminant_case = "lowercase",
    object_from_js = false,
    use_nullable = true
)]
pub enum Decision {
    /// Send now; settle before `expiresAt` or the reservation is kept without refund.
    Grant {
        /// The lease to settle.
        lease: f64,
        /// When it is reaped.
        expires_at: U64,
    },
    /// In line: a `granted` event with this id follows.
    Queued {
        /// The ticket, which becomes the lease.
        lease: f64,
        /// Estimated grant time.
        eta: U64,
    },
    /// Not now: come back at `retryAt` (`null`: this request can never be served as asked).
    Reject {
        /// When a new request has a fair chance.
        retry_at: Option<U64>,
        /// Why.
        reason: RejectReason,
    },
}

impl From<core::Decision> for Decision {
    fn from(d: core::Decision) -> Decision {
        match d {
            core::Decision::Grant { lease, expires_at } => Decision::Grant {
                lease: lease_to_js(lease),
                expires_at: u64_to_js(expires_at.0),
            },
            core::Decision::Queued { lease, eta } => Decision::Queued {
                lease: lease_to_js(lease),
                eta: u64_to_js(eta.0),
            },
            core::Decision::Reject { retry_at, reason } => Decision::Reject {
                retry_at: retry_at.map(|t| u64_to_js(t.0)),
                reason: match reason {
                    core::RejectReason::ExceedsCapacity { axis: a } => {
                        RejectReason::ExceedsCapacity { axis: axis(a) }
                    }
                    core::RejectReason::WaitTooLong => RejectReason::WaitTooLong,
                    core::RejectReason::QueueFull => RejectReason::QueueFull,
                    core::RejectReason::TooManyLeases => RejectReason::TooManyLeases,
                    core::RejectReason::TooManyAgents => RejectReason::TooManyAgents,
                },
            },
        }
    }
}

/// What a lease had reserved and what it used, per axis, in the order input tokens,
/// output tokens, tokens, requests.
#[napi(object, object_from_js = false)]
pub struct Settlement {
    /// Reserved at grant.
    pub reserved: Vec<U64>,
    /// Used, by the pool's counting rules.
    pub used: Vec<U64>,
}

impl From<core::Settlement> for Settlement {
    fn from(s: core::Settlement) -> Settlement {
        Settlement {
            reserved: s.reserved.0.iter().map(|&v| u64_to_js(v)).collect(),
            used: s.used.0.iter().map(|&v| u64_to_js(v)).collect(),
        }
    }
}

/// Something that happened; drain with `pollEvent()` after every call.
#[napi(
    discriminant = "kind",
    discriminant_case = "snake_case",
    object_from_js = false
)]
pub enum Event {
    /// A queued ticket was granted: the agent may send now.
    Granted {
        /// The lease (same id as the ticket).
        lease: f64,
        /// Its agent.
        agent: U64,
        /// Its pool.
        pool: u32,
        /// When it is reaped.
        expires_at: U64,
        /// How long it waited, ms.
        waited_ms: U64,
    },
    /// A lease was not settled in time and was reaped with no refund.
    Expired {
        /// The lease.
        lease: f64,
        /// Its agent.
        agent: U64,
        /// Its pool.
        pool: u32,
    },
    /// The pool's margin moved.
    MarginChanged {
        /// The pool.
        pool: u32,
        /// Before, thousandths.
        from_permille: u32,
        /// After, thousandths.
        to_permille: u32,
    },
    /// A 429 paused new grants for the whole pool.
    Paused {
        /// The pool.
        pool: u32,
        /// Until when.
        until: U64,
    },
    /// An agent's input estimates keep missing by more than the alert threshold.
    EstimateAlert {
        /// The agent.
        agent: U64,
        /// Its moving-average input error, thousandths.
        error_permille: u32,
    },
}

impl From<core::Event> for Event {
    fn from(e: core::Event) -> Event {
        match e {
            core::Event::Granted {
                lease,
                agent,
                pool,
                expires_at,
                waited_ms,
            } => Event::Granted {
                lease: lease_to_js(lease),
                agent: u64_to_js(agent.0),
                pool: pool.0,
                expires_at: u64_to_js(expires_at.0),
                waited_ms: u64_to_js(waited_ms),
            },
            core::Event::Expired { lease, agent, pool } => Event::Expired {
                lease: lease_to_js(lease),
                agent: u64_to_js(agent.0),
                pool: pool.0,
            },
            core::Event::MarginChanged {
                pool,
                from_permille,
                to_permille,
            } => Event::MarginChanged {
                pool: pool.0,
                from_permille,
                to_permille,
            },
            core::Event::Paused { pool, until } => Event::Paused {
                pool: pool.0,
                until: u64_to_js(until.0),
            },
            core::Event::EstimateAlert {
                agent,
                error_permille,
            } => Event::EstimateAlert {
                agent: u64_to_js(agent.0),
                error_permille,
            },
        }
    }
}

/// One call's backoff state: failures so far and the last `Retry-After` seen.
#[napi(object, use_nullable = true)]
pub struct BackoffState {
    /// Failed attempts so far.
    pub failed: u32,
    /// The last `Retry-After`, ms.
    pub last_retry_after_ms: Option<U64>,
}

impl BackoffState {
    /// The core state.
    pub fn to_core(&self) -> Result<core::Backoff, Thrown> {
        Ok(core::Backoff {
            failed: self.failed,
            last_retry_after_ms: self
                .last_retry_after_ms
                .as_ref()
                .map(|v| u64_arg(v, "lastRetryAfterMs"))
                .transpose()?,
        })
    }

    /// From the core state.
    pub fn from_core(b: core::Backoff) -> BackoffState {
        BackoffState {
            failed: b.failed,
            last_retry_after_ms: b.last_retry_after_ms.map(u64_to_js),
        }
    }
}

/// What to do after a failed attempt.
#[napi(
    discriminant = "kind",
    discriminant_case = "snake_case",
    object_from_js = false,
    use_nullable = true
)]
pub enum BackoffStep {
    /// Try again after `delayMs`.
    Retry {
        /// How long to wait, ms.
        delay_ms: U64,
        /// This attempt's number (1 = first retry).
        attempt: u32,
    },
    /// Stop retrying and surface the failure.
    GiveUp {
        /// Attempts made.
        attempts: u32,
        /// The last `Retry-After` seen, ms.
        last_retry_after_ms: Option<U64>,
    },
}

impl From<core::BackoffStep> for BackoffStep {
    fn from(s: core::BackoffStep) -> BackoffStep {
        match s {
            core::BackoffStep::Retry { delay_ms, attempt } => BackoffStep::Retry {
                delay_ms: u64_to_js(delay_ms),
                attempt,
            },
            core::BackoffStep::GiveUp {
                attempts,
                last_retry_after_ms,
            } => BackoffStep::GiveUp {
                attempts,
                last_retry_after_ms: last_retry_after_ms.map(u64_to_js),
            },
        }
    }
}

/// The result of `backoff()`: the updated state and the step to take.
#[napi(object, object_from_js = false)]
pub struct BackoffResult {
    /// Pass this back on the next failure of the same call.
    pub state: BackoffState,
    /// What to do now.
    pub step: BackoffStep,
}

/// The fast path's register file: a `Float64Array` the JavaScript wrapper owns and the
/// addon reads arguments from and writes results to, so a hot call crosses the boundary
/// with no object to read or build (napi property access by name costs ~100 ns a field).
/// Every slot holds an exact integer below 2^53, or −1 for "none". Layouts, per call:
///
/// | call | arguments in | results out | returns |
/// |---|---|---|---|
/// | `requestLeaseIo` | now, agent, pool, input, cached, max, role (0 worker, 1 reviewer, 2 planner), unblocks, failure signature | lease, instant (expires at / eta / retry at), reason, axis | `DECISION_*` |
/// | `settleIo` | now, lease, input, cache creation, cache read, output | reserved ×4, used ×4 | 0 |
/// | `cancelIo` | now, lease | — | 0 |
/// | `handleTimeoutIo` | now | — | 0 |
/// | `pollEventIo` | — | the event's fields in declaration order | `EVENT_*`, or −1 |
///
/// A result with a value above 2^53 − 1 returns `WIDE` instead; `takeWide()` then hands
/// it over as an object with `bigint`s.
pub const IO_SLOTS: usize = 16;
/// The lease was granted.
pub const DECISION_GRANT: i32 = 0;
/// The request was queued.
pub const DECISION_QUEUED: i32 = 1;
/// The request was rejected.
pub const DECISION_REJECT: i32 = 2;
/// The result does not fit a `number`: fetch it with `takeWide()`.
pub const WIDE: i32 = 9;

fn fits(values: &[u64]) -> bool {
    values.iter().all(|&v| v <= MAX_SAFE)
}

#[allow(clippy::cast_precision_loss)] // exact: callers check `fits` first
fn put(io: &mut [f64], values: &[u64]) {
    for (slot, &v) in io.iter_mut().zip(values) {
        *slot = v as f64;
    }
}

/// A slot as a `u64` argument.
fn slot(io: &[f64], i: usize, what: &str) -> Result<u64, Thrown> {
    u64_arg(&Either::A(io[i]), what)
}

/// An optional slot: −1 is "none".
fn opt_slot(io: &[f64], i: usize, what: &str) -> Result<Option<u64>, Thrown> {
    if io[i] == -1.0 {
        Ok(None)
    } else {
        slot(io, i, what).map(Some)
    }
}

/// Reads `now` from slot 0.
pub fn io_now(io: &[f64]) -> Result<core::Millis, Thrown> {
    slot(io, 0, "now").map(core::Millis)
}

/// Reads `requestLeaseIo`'s arguments.
pub fn io_lease_request(io: &[f64]) -> Result<core::LeaseRequest, Thrown> {
    Ok(core::LeaseRequest {
        agent: core::AgentId(slot(io, 1, "agent")?),
        pool: core::PoolId(u32_arg(io[2], "pool")?),
        input_tokens: slot(io, 3, "inputTokens")?,
        cached_prefix_tokens: slot(io, 4, "cachedPrefixTokens")?,
        max_tokens: slot(io, 5, "maxTokens")?,
        role: match io[6] {
            0.0 => core::Role::Worker,
            1.0 => core::Role::Reviewer,
            2.0 => core::Role::Planner,
            other => {
                return Err(Thrown::range(
                    "invalid_argument",
                    format!("`role` must be planner, reviewer or worker (code {other})"),
                )
                .with_field("role"));
            }
        },
        unblocks: u32_arg(io[7], "unblocks")?,
        failure_signature: opt_slot(io, 8, "failureSignature")?,
    })
}

/// Writes a decision; `WIDE` when an instant does not fit a `number`.
pub fn io_decision(io: &mut [f64], d: &core::Decision) -> i32 {
    let none = u64::MAX; // written as −1 below
    let (code, lease, at, reason, axis_index) = match *d {
        core::Decision::Grant { lease, expires_at } => {
            (DECISION_GRANT, lease.0, expires_at.0, 0, 0)
        }
        core::Decision::Queued { lease, eta } => (DECISION_QUEUED, lease.0, eta.0, 0, 0),
        core::Decision::Reject { retry_at, reason } => {
            let (r, a) = match reason {
                core::RejectReason::ExceedsCapacity { axis: a } => (0, axis_index(a)),
                core::RejectReason::WaitTooLong => (1, 0),
                core::RejectReason::QueueFull => (2, 0),
                core::RejectReason::TooManyLeases => (3, 0),
                core::RejectReason::TooManyAgents => (4, 0),
            };
            (DECISION_REJECT, 0, retry_at.map_or(none, |t| t.0), r, a)
        }
    };
    if at != none && !fits(&[at]) {
        return WIDE;
    }
    put(io, &[lease, at, reason, axis_index]);
    if at == none {
        io[1] = -1.0;
    }
    code
}

/// Reads the lease id from slot 1 (`cancelIo`).
pub fn io_lease(io: &[f64]) -> Result<core::LeaseId, Thrown> {
    slot(io, 1, "lease").map(core::LeaseId)
}

/// Reads `settleIo`'s arguments.
pub fn io_settle(io: &[f64]) -> Result<(core::LeaseId, core::Usage), Thrown> {
    Ok((
        core::LeaseId(slot(io, 1, "lease")?),
        core::Usage {
            input_tokens: slot(io, 2, "inputTokens")?,
            cache_creation_input_tokens: slot(io, 3, "cacheCreationInputTokens")?,
            cache_read_input_tokens: slot(io, 4, "cacheReadInputTokens")?,
            output_tokens: slot(io, 5, "outputTokens")?,
        },
    ))
}

/// Writes a settlement; `WIDE` when an amount does not fit a `number`.
pub fn io_settlement(io: &mut [f64], s: &core::Settlement) -> i32 {
    if !fits(&s.reserved.0) || !fits(&s.used.0) {
        return WIDE;
    }
    put(io, &s.reserved.0);
    put(&mut io[4..], &s.used.0);
    0
}

/// Granted, expired, margin changed, paused, estimate alert: `pollEventIo`'s codes.
pub const EVENT_GRANTED: i32 = 0;

/// Writes an event; `WIDE` when a field does not fit a `number`.
pub fn io_event(io: &mut [f64], e: &core::Event) -> i32 {
    let (code, fields): (i32, [u64; 5]) = match *e {
        core::Event::Granted {
            lease,
            agent,
            pool,
            expires_at,
            waited_ms,
        } => (
            EVENT_GRANTED,
            [lease.0, agent.0, u64::from(pool.0), expires_at.0, waited_ms],
        ),
        core::Event::Expired { lease, agent, pool } => {
            (1, [lease.0, agent.0, u64::from(pool.0), 0, 0])
        }
        core::Event::MarginChanged {
            pool,
            from_permille,
            to_permille,
        } => (
            2,
            [
                u64::from(pool.0),
                u64::from(from_permille),
                u64::from(to_permille),
                0,
                0,
            ],
        ),
        core::Event::Paused { pool, until } => (3, [u64::from(pool.0), until.0, 0, 0, 0]),
        core::Event::EstimateAlert {
            agent,
            error_permille,
        } => (4, [agent.0, u64::from(error_permille), 0, 0, 0]),
    };
    if !fits(&fields) {
        return WIDE;
    }
    put(io, &fields);
    code
}

/// A result held back from the fast path because it needs `bigint`s.
#[derive(Debug, Clone, Copy)]
pub enum WideResult {
    /// From `requestLeaseIo`.
    Decision(core::Decision),
    /// From `settleIo`.
    Settlement(core::Settlement),
    /// From `pollEventIo`.
    Event(core::Event),
}

/// `snake_case` → `camelCase`.
pub fn camel(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut upper = false;
    for c in s.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A serde-shaped core value with its object keys recased to camelCase (string values,
/// such as enum tags, are left alone). Numbers keep their exact value; napi-rs turns
/// integers above 2^53 − 1 into `bigint`.
pub fn camel_keys(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut out = Map::with_capacity(map.len());
            for (k, v) in map {
                out.insert(camel(&k), camel_keys(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(camel_keys).collect()),
        other => other,
    }
}

/// Serializes a core value for JavaScript with camelCase keys.
pub fn to_js_value<T: serde::Serialize>(v: &T) -> Result<Value, Thrown> {
    serde_json::to_value(v).map(camel_keys).map_err(|e| Thrown {
        kind: ErrorKind::Error,
        code: "internal",
        message: e.to_string(),
        field: None,
    })
}

/// Whether every integer in `v` is exact as a JavaScript `number`.
fn all_safe(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_u64().is_none_or(|u| u <= MAX_SAFE),
        Value::Array(items) => items.iter().all(all_safe),
        Value::Object(map) => map.values().all(all_safe),
        _ => true,
    }
}

/// A core value for JavaScript as JSON text (camelCase keys) when `JSON.parse` reads it
/// exactly, else as an object with `bigint`s. Big objects cross much faster as one
/// string than property by property (a metrics object: ~60 µs as properties).
pub fn to_js_json<T: serde::Serialize>(v: &T) -> Result<Either<String, Value>, Thrown> {
    let value = to_js_value(v)?;
    if all_safe(&value) {
        Ok(Either::A(value.to_string()))
    } else {
        Ok(Either::B(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_recases_keys_only() {
        assert_eq!(camel("input_tokens_per_minute"), "inputTokensPerMinute");
        assert_eq!(camel("p50_ms"), "p50Ms");
        assert_eq!(camel("agent"), "agent");
        let v = serde_json::json!({"binding_axis": "input_tokens", "axes": [{"last_minute": 1}]});
        assert_eq!(
            camel_keys(v),
            serde_json::json!({"bindingAxis": "input_tokens", "axes": [{"lastMinute": 1}]})
        );
    }

    #[test]
    fn u64_args_accept_exact_integers_only() {
        assert_eq!(u64_arg(&Either::A(5.0), "x").ok(), Some(5));
        assert!(u64_arg(&Either::A(-1.0), "x").is_err());
        assert!(u64_arg(&Either::A(1.5), "x").is_err());
        assert!(u64_arg(&Either::A(f64::NAN), "x").is_err());
        assert!(u64_arg(&Either::A(18_446_744_073_709_551_616.0), "x").is_err());
        assert_eq!(
            u64_arg(&Either::B(BigInt::from(u64::MAX)), "x").ok(),
            Some(u64::MAX)
        );
        assert!(u64_arg(&Either::B(BigInt::from(-1i64)), "x").is_err());
        assert!(matches!(u64_to_js((1 << 53) - 1), Either::A(_)));
        assert!(matches!(u64_to_js(1 << 53), Either::B(_)));
    }
}
