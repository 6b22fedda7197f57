//! # tokenwarden-core
//!
//! One owner of an LLM provider's quota for a fleet of agents that share one API key.
//! Agents *lease* capacity before each model call (input tokens, output tokens, requests,
//! a concurrency slot), *settle* what they really used afterwards, and wait in a weighted
//! fair queue instead of in a retry storm.
//!
//! ## The contract
//!
//! This crate is a deterministic state machine. It never reads a clock, never sleeps,
//! never does I/O and never draws ambient randomness: every entry point takes `now`
//! ([`Millis`], integer milliseconds on an epoch the host chooses), and the only randomness
//! is a PRNG seeded by the host and kept in the state. Every decision is integer
//! arithmetic, so native code, WebAssembly and every JavaScript engine make bit-identical
//! decisions from the same configuration, seed and inputs. Time that goes backwards is
//! clamped to the latest instant seen; it never panics.
//!
//! Bad input is an error value ([`LeaseError`], [`ConfigError`], [`RestoreError`]) and leaves
//! the state untouched. A *decision* is not an error: a request that cannot be served now
//! gets [`Decision::Queued`], [`Decision::Reject`] (with when to ask again) or
//! [`Decision::NeverFits`], with a reason.
//!
//! ## Inputs
//!
//! 1. [`Coordinator::request_lease`] — before a model call.
//! 2. [`Coordinator::settle`] — after it, with the provider's usage figures.
//! 3. [`Coordinator::cancel`] — a queued ticket no longer wanted, or a lease never used.
//!    [`Coordinator::renew`] — a granted lease whose call is still working (a stream whose
//!    bytes still flow) keeps its reservation and concurrency slot past `lease_ttl_ms`.
//! 4. [`Coordinator::handle_response`] — the provider's status and rate-limit headers
//!    (parsed by [`parse_headers`]); a 429 pauses the pool and cuts the margin.
//! 5. [`Coordinator::handle_timeout`] — time passed.
//!
//! Or, for one model call from its first ask to the answer the agent receives, the call
//! lifecycle ([`Call`]): [`Coordinator::call_lease`] asks and says send, wait (in the
//! queue, or until a refusal's time; `checkpoint` when the wait is long) or give up
//! ([`LeaseStep`]); [`Coordinator::call_response`] feeds the provider's answer back and says
//! deliver, wait and ask again, or give up ([`ResponseStep`]: retryable statuses,
//! `retry-after` against `reset_at`, jittered waits and give-up limits are all decided
//! here); [`Coordinator::call_interrupted`] charges a call that ended without a usage
//! report. [`Coordinator::hold`] is the operator's: no grant from a pool until a time.
//!
//! ## The host protocol
//!
//! Every input above is also one value, [`Input`], and every answer one value, [`Output`]
//! (one variant per transition: granted, queued, refused, never fits, send, wait, give up,
//! deliver, settled, …): [`Coordinator::handle`] takes the one and answers the other. Both
//! are serde types, so a host that is not Rust carries them as JSON (the napi addon's, the
//! wasm build's and the WebAssembly component's `handle`, the conformance traces), and a
//! new input reaches every host with no change to the boundaries. A host is then a loop:
//! handle an input, drain [`Coordinator::poll_event`], sleep until
//! [`Coordinator::poll_timeout`] and handle [`Input::Timeout`] (see *Run loop*).

//! ## Outputs
//!
//! 1. The [`Decision`] returned by `request_lease`.
//! 2. [`Coordinator::poll_event`] — grants of queued tickets, expiries, margin changes,
//!    pauses, estimate-error alerts. Drain it after every input.
//! 3. [`Coordinator::poll_timeout`] — when to call `handle_timeout` next.
//! 4. [`Coordinator::metrics`] and [`Coordinator::snapshot`].
//!
//! ## One limit, no leases
//!
//! [`TokenBucket`] is the coordinator's exact bucket arithmetic on its own: one limit per
//! window, `check(now, n)` answering `Ok` or [`Denied`] (with the instant the request
//! would fit), for callers who only need a rate limiter.
//!
//! ## Run loop
//!
//! Two agents' calls through the host protocol on a simulated clock: the first is sent at
//! once, the second waits in the fair queue and is sent when its grant comes.
//!
//! ```
//! use tokenwarden_core::*;
//!
//! let config = Config::from_json(r#"{
//!     "pools": [{ "name": "sonnet", "input_tokens_per_minute": 40000,
//!                 "output_tokens_per_minute": 8000, "requests_per_minute": 50,
//!                 "max_concurrent": 20 }]
//! }"#).unwrap();
//! let mut coord = Coordinator::new(config, /* seed from the OS */ 42, Millis(0)).unwrap();
//! let ask = |agent| Input::CallLease {
//!     call: Call::new(),
//!     request: LeaseRequest { agent: AgentId(agent), pool: PoolId(0),
//!                             input_tokens: 20_000, max_tokens: 1_000, ..Default::default() },
//! };
//!
//! // The first fits; the second waits: 85% of 40k is 34k.
//! let Output::Send { lease: first, .. } = coord.handle(Millis(0), &ask(1)).unwrap() else { panic!() };
//! let Output::Wait { wait, .. } = coord.handle(Millis(0), &ask(2)).unwrap() else { panic!() };
//! let (ticket, due) = (wait.ticket.expect("queued"), wait.until);
//!
//! // The first call used less than it reserved: the refund goes back at once.
//! let usage = Usage { input_tokens: 19_500, output_tokens: 300, ..Default::default() };
//! coord.handle(Millis(2_000), &Input::Settle { lease: first, usage }).unwrap();
//!
//! // The host's loop: drain events; sleep until poll_timeout; handle the timeout.
//! let mut now = Millis(2_000);
//! let granted = loop {
//!     if let Some(Event::Granted { lease, .. }) = coord.poll_event() { break lease; }
//!     now = coord.poll_timeout().expect("a queued ticket wants a wake-up");
//!     coord.handle(now, &Input::Timeout {}).unwrap();
//! };
//! assert_eq!(granted, ticket, "the ticket is the lease: send under it");
//! assert!(now <= due, "granted by its ETA, an upper bound");
//! ```
#![no_std]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![deny(clippy::float_arithmetic)]

extern crate alloc;
#[cfg(any(feature = "std", test))]
extern crate std;

// Where things are: `coordinator.rs` holds the state and the lease protocol (request,
// settle, cancel, time); `coordinator/` beside it provider feedback, snapshot/restore and
// the invariant checker. A pool's buckets, margin and pause are `pool.rs`; the fair queue
// `queue.rs`, its weights and virtual time `weight.rs`; the lease and agent tables
// `lease.rs` and `agents.rs`; the API's types `request.rs`, `decision.rs`, `ids.rs`;
// metrics types and their assembly `metrics.rs`; provider headers `headers/`.

mod agents;
mod bucket;
mod call;
mod config;
mod coordinator;
mod decision;
mod error;
mod exchange;
pub mod headers;
mod history;
mod ids;
mod lease;
mod metrics;
mod plan;
mod pool;
mod protocol;
mod queue;
mod request;
mod rng;
mod tasks;
mod time;
mod weight;

pub use bucket::{Axis, Demand, Denied, TokenBucket};
pub use call::{
    Call, CallResponse, CallStep, GiveUp, GiveUpReason, LeaseStep, ResponseStep, Wait, WaitReason,
};
pub use config::{
    AlertConfig, BackoffConfig, CallConfig, Config, Counting, Families, FeedbackConfig,
    MAX_DURATION_MS, MAX_TOKENS, MarginConfig, OutputReserveConfig, PoolConfig, SlowStartConfig,
    WeightConfig,
};
pub use coordinator::{Coordinator, Snapshot};
pub use decision::{Decision, Event, MarginReason, RejectReason, Settlement};
pub use error::{ConfigError, FieldPath, LeaseError, RestoreError};
pub use exchange::{Action, Answer, Exchange, HOLD_BYTES, Timeout, Timeouts};
pub use headers::{HeaderReport, parse_headers};
pub use ids::LeaseId;
pub use ids::{AgentId, PoolId, TaskId};
pub use metrics::{
    AgentActivity, AgentMetrics, AxisMetrics, FleetAdvice, MINUTE_MS, Metrics, MinuteStats,
    PoolCounters, PoolMetrics, TaskFigures, TaskMetrics,
};
pub use plan::{AgentKind, FleetPlan, Plan, PlanAxis, PlanError, plan_fleet, plan_fleet_json};
pub use protocol::{Input, Output};
pub use request::{LeaseRequest, Role, Usage};
pub use rng::Rng;
pub use tasks::{TaskOutcome, TaskSpec, TaskSummary};
pub use time::Millis;

/// The repository README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The crate README's example (the one crates.io shows), compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
