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
use serde_json::Value;
use tokenwarden_core as core;
/// The register-file layouts and the result held back when it needs `bigint`s.
pub use tokenwarden_js_abi::io::{self, WideResult};
use tokenwarden_js_abi::{
    MAX_SAFE, all_safe, camel_value, u32_from_f64, u64_from_bigint, u64_from_f64,
};

/// An unsigned 64-bit integer as JavaScript sees it: `number` up to 2^53 − 1, `bigint` above.
pub type U64 = Either<f64, BigInt>;

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

/// An error about to be thrown into JavaScript (shared with the wasm build).
pub use tokenwarden_js_abi::ArgError as Thrown;
use tokenwarden_js_abi::ErrorKind;

/// Throws `t` as a real JavaScript `Error`/`RangeError`/`TypeError` with `code` (and
/// `field`) properties, and returns the marker napi-rs expects after a throw.
pub fn throw(t: Thrown, env: &Env) -> napi::Error {
    let base = napi::Error::new(t.code.to_owned(), t.message);
    let value = match t.kind {
        ErrorKind::Error => JsError::from(base).into_unknown(*env),
        ErrorKind::Range => JsRangeError::from(base).into_unknown(*env),
        ErrorKind::Type => JsTypeError::from(base).into_unknown(*env),
    };
    let thrown = value.coerce_to_object().and_then(|mut obj| {
        if let Some(field) = &t.field {
            obj.set_named_property("field", field.as_str())?;
        }
        env.throw(obj)
    });
    match thrown {
        Ok(()) => napi::Error::from_status(Status::PendingException),
        Err(e) => e,
    }
}

/// Reads an unsigned integer argument named `what`.
pub fn u64_arg(v: &U64, what: &str) -> Result<u64, Thrown> {
    match v {
        Either::A(n) => u64_from_f64(*n, what),
        Either::B(b) => {
            let (negative, value, lossless) = b.get_u64();
            u64_from_bigint(negative, value, lossless, what)
        }
    }
}

/// Reads a `u32` argument named `what` (pool ids, unblocks, HTTP status).
pub fn u32_arg(n: f64, what: &str) -> Result<u32, Thrown> {
    u32_from_f64(n, what)
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
    /// The host saw the provider cache this very prefix within its lifetime: charged as a
    /// cache read even on this agent's first call (default false).
    pub cached_prefix_confirmed: Option<bool>,
    /// The call's `max_tokens`: the output reservation, refunded on settle.
    pub max_tokens: Option<U64>,
    /// The agent's role (default `worker`).
    pub role: Option<Role>,
    /// Downstream tasks waiting on this call.
    pub unblocks: Option<f64>,
    /// A hash of the agent's last failure; the same value twice in a row lowers its weight.
    pub failure_signature: Option<U64>,
    /// The task the call is for (opened on first use); its role, unblocks and failures
    /// then set the weight, and it is charged the call's tokens and waits.
    pub task: Option<U64>,
}

fn opt_u64(v: Option<&U64>, what: &str) -> Result<u64, Thrown> {
    v.map_or(Ok(0), |v| u64_arg(v, what))
}

/// `T` (a napi object type) from a JavaScript object whose every key is one of `fields`:
/// napi's derived conversion ignores any other key, which would then be silently dropped
/// (`settle({ input_tokens })` recorded as 0 used). The error names the key (see
/// [`tokenwarden_js_abi::unknown_key`]).
pub fn checked_object<T: napi::bindgen_prelude::FromNapiValue>(
    env: &Env,
    o: &napi::bindgen_prelude::Object<'_>,
    fields: &[&str],
    what: &str,
) -> Result<T, Thrown> {
    let keys = napi::bindgen_prelude::Object::keys(o)
        .map_err(|e| Thrown::type_error(format!("the {what} must be an object: {e}")))?;
    for key in keys {
        if let Some(e) = tokenwarden_js_abi::unknown_key(&key, fields, what) {
            return Err(e);
        }
    }
    // SAFETY: the value is the live object napi-rs just handed this call, in its env.
    unsafe { T::from_napi_value(env.raw(), o.raw()) }
        .map_err(|e| Thrown::type_error(format!("invalid {what}: {e}")))
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
            cached_prefix_confirmed: self.cached_prefix_confirmed.unwrap_or(false),
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
            task: self
                .task
                .as_ref()
                .map(|v| u64_arg(v, "task").map(core::TaskId))
                .transpose()?,
        })
    }
}

/// A task: `Coordinator.openTask(now, spec)`.
#[napi(object, object_to_js = false)]
pub struct TaskSpec {
    /// The task's id, chosen by the host.
    pub task: U64,
    /// The role of the agent working on it (default `worker`).
    pub role: Option<Role>,
    /// Downstream tasks waiting on it (default 0).
    pub unblocks: Option<f64>,
}

impl TaskSpec {
    /// The core spec, or the first invalid field.
    pub fn to_core(&self) -> Result<core::TaskSpec, Thrown> {
        Ok(core::TaskSpec {
            task: core::TaskId(u64_arg(&self.task, "task")?),
            role: match self.role {
                Some(Role::Planner) => core::Role::Planner,
                Some(Role::Reviewer) => core::Role::Reviewer,
                Some(Role::Worker) | None => core::Role::Worker,
            },
            unblocks: self.unblocks.map_or(Ok(0), |n| u32_arg(n, "unblocks"))?,
        })
    }
}

/// How a task ended.
#[napi(string_enum = "lowercase")]
#[derive(Debug)]
pub enum TaskOutcome {
    /// Its work landed.
    Merged,
    /// Given up on.
    Abandoned,
    /// Ended failing.
    Failed,
}

impl From<TaskOutcome> for core::TaskOutcome {
    fn from(o: TaskOutcome) -> core::TaskOutcome {
        match o {
            TaskOutcome::Merged => core::TaskOutcome::Merged,
            TaskOutcome::Abandoned => core::TaskOutcome::Abandoned,
            TaskOutcome::Failed => core::TaskOutcome::Failed,
        }
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

fn axis(a: core::Axis) -> Axis {
    match a {
        core::Axis::InputTokens => Axis::InputTokens,
        core::Axis::OutputTokens => Axis::OutputTokens,
        core::Axis::Tokens => Axis::Tokens,
        core::Axis::Requests => Axis::Requests,
    }
}

/// Why a pool's margin moved.
#[napi(string_enum = "snake_case")]
#[derive(Debug)]
pub enum MarginReason {
    /// A 429 against a granted lease.
    RateLimited,
    /// A clean interval below the start.
    Recovered,
    /// A clean interval above the start, with estimates and headers confirming it.
    Confirmed,
    /// The provider's remaining capacity was below the model's.
    HeadersDisagreed,
}

impl From<core::MarginReason> for MarginReason {
    fn from(r: core::MarginReason) -> MarginReason {
        match r {
            core::MarginReason::RateLimited => MarginReason::RateLimited,
            core::MarginReason::Recovered => MarginReason::Recovered,
            core::MarginReason::Confirmed => MarginReason::Confirmed,
            core::MarginReason::HeadersDisagreed => MarginReason::HeadersDisagreed,
        }
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
        /// Why: `rate_limited`, `recovered`, `confirmed` or `headers_disagreed`.
        reason: MarginReason,
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
    /// The margin has sat at its floor for `margin.floor_alert_ms`: something outside the
    /// coordinator is using the key.
    MarginAtFloor {
        /// The pool.
        pool: u32,
        /// The binding axis over the last minutes, if usage named one.
        axis: Option<Axis>,
        /// The margin, thousandths.
        margin_permille: u32,
        /// Since when.
        since: U64,
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
                reason,
            } => Event::MarginChanged {
                pool: pool.0,
                from_permille,
                to_permille,
                reason: reason.into(),
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
            core::Event::MarginAtFloor {
                pool,
                axis: a,
                margin_permille,
                since,
            } => Event::MarginAtFloor {
                pool: pool.0,
                axis: a.map(axis),
                margin_permille,
                since: u64_to_js(since.0),
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

/// One model call's state between its steps: failed sends, refusals waited out, and the
/// last `Retry-After` seen. Start with `{ failed: 0, refusals: 0, lastRetryAfterMs: null }`
/// and pass back what each step returns.
#[napi(object, use_nullable = true)]
pub struct CallState {
    /// Sends that failed in a way worth retrying.
    pub failed: u32,
    /// Refusals waited out.
    pub refusals: u32,
    /// The last `Retry-After`, ms.
    pub last_retry_after_ms: Option<U64>,
}

impl CallState {
    /// The core state.
    pub fn to_core(&self) -> Result<core::Call, Thrown> {
        Ok(core::Call {
            failed: self.failed,
            refusals: self.refusals,
            last_retry_after_ms: self
                .last_retry_after_ms
                .as_ref()
                .map(|v| u64_arg(v, "lastRetryAfterMs"))
                .transpose()?,
        })
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

/// Serializes a core value for JavaScript with camelCase keys.
pub fn to_js_value<T: serde::Serialize>(v: &T) -> Result<Value, Thrown> {
    camel_value(v)
}

/// A core value for JavaScript as JSON text (camelCase keys) when `JSON.parse` reads it
/// exactly, else as an object with `bigint`s. Big objects cross much faster as one
/// string than property by property (a metrics object: ~60 µs as properties).
pub fn to_js_json<T: serde::Serialize>(v: &T) -> Result<Either<String, Value>, Thrown> {
    if let Some(text) = tokenwarden_js_abi::camel_json(v) {
        return Ok(Either::A(text));
    }
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
