//! The Node.js addon behind the npm package `tokenwarden`: `tokenwarden-core`'s
//! `Coordinator` as a JavaScript class, one method per core call.
//!
//! Each method converts its arguments, calls the core and converts the result. The
//! JavaScript calling convention both bindings share (argument checks, error codes, key
//! recasing, register-file layouts) is the crate `tokenwarden-js-abi`; this addon's own
//! conversions (napi objects, `bigint`s, throwing) are in `convert.rs`; this file holds the
//! class, the attached register file and the calls. Bad input
//! throws a real `Error`/`RangeError`/`TypeError` with a stable `code` (the core's
//! `LeaseError::code()` and friends, or `invalid_argument`) and changes no state. Nothing
//! here reads a clock: every call takes `now`, integer milliseconds on an epoch the caller
//! chooses (the JavaScript driver uses `performance.now()`).
//!
//! Most users want the driver and `fetch` wrapper in the package's JavaScript layer; this
//! class is the low-level engine they drive.
// napi-rs's macros expand to `unsafe` FFI glue; this crate writes none of its own.
#![allow(unsafe_code)]

pub mod convert;

use convert::{
    BackoffResult, BackoffState, CallState, Decision, Event, LeaseRequest, Settlement, TaskOutcome,
    TaskSpec, Thrown, U64, Usage, WideResult, io, lease_arg, to_js_json, u32_arg, u64_arg,
    u64_to_js,
};
use napi::Env;
use napi::bindgen_prelude::{Either, Either3, Float64Array, Object, Unknown};
use napi_derive::napi;
use serde_json::Value;
use tokenwarden_core as core;

/// A response's arguments, checked, with its headers parsed.
struct ResponseArgs {
    now: core::Millis,
    pool: core::PoolId,
    lease: Option<core::LeaseId>,
    status: u16,
    report: core::HeaderReport,
}

fn response_args(
    now: &U64,
    pool: f64,
    lease: Option<&U64>,
    status: u32,
    headers: &[(String, String)],
    unix_now_ms: Option<&U64>,
) -> Result<ResponseArgs, Thrown> {
    let now = core::Millis(u64_arg(now, "now")?);
    let pool = core::PoolId(u32_arg(pool, "pool")?);
    let lease = lease.map(lease_arg).transpose()?;
    let status = u16::try_from(status).map_err(|_| {
        Thrown::range(
            "invalid_argument",
            format!("`status` must be below 65536, got {status}"),
        )
        .with_field("status")
    })?;
    let unix = unix_now_ms.map(|v| u64_arg(v, "unixNowMs")).transpose()?;
    let report = core::parse_headers(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())), unix);
    Ok(ResponseArgs {
        now,
        pool,
        lease,
        status,
        report,
    })
}

/// A lease request object, refused if it holds a key the engine does not read.
fn request_object(env: &Env, o: &Object<'_>) -> Result<LeaseRequest, Thrown> {
    convert::checked_object(env, o, &io::LEASE_REQUEST_FIELDS, "lease request")
}

/// A usage object, refused if it holds a key the engine does not read.
fn usage_object(env: &Env, o: &Object<'_>) -> Result<Usage, Thrown> {
    convert::checked_object(env, o, &io::USAGE_FIELDS, "usage")
}

/// Runs `f`, throwing its error (if any) into JavaScript.
fn js<T>(env: &Env, f: impl FnOnce() -> Result<T, Thrown>) -> napi::Result<T> {
    f().map_err(|e| convert::throw(e, env))
}

/// One provider's quota: buckets, leases, the weighted fair queue and the margin, driven by
/// the caller's clock. Call order: any input (`requestLease`, `settle`, `cancel`,
/// `handleResponse`, `handleTimeout`), then drain `pollEvent()`, then arm one timer for
/// `pollTimeout()` and call `handleTimeout(now)` when it fires.
#[napi]
pub struct Coordinator {
    inner: core::Coordinator,
    /// The fast path's register file (see `convert::IO_SLOTS`), once attached.
    io: Option<Float64Array>,
    /// A fast-path result that needs `bigint`s, until `takeWide()`.
    wide: Option<WideResult>,
}

#[napi]
impl Coordinator {
    /// A coordinator for the configuration (the core's JSON shape, as a string), with the
    /// PRNG seed and the current time. Throws `config_parse` or `invalid_config` (with
    /// `field`, e.g. `pools[1].input_tokens_per_minute`).
    #[napi(constructor)]
    pub fn new(env: Env, config_json: String, seed: U64, now: U64) -> napi::Result<Self> {
        js(&env, || {
            let seed = u64_arg(&seed, "seed")?;
            let now = u64_arg(&now, "now")?;
            let config = core::Config::from_json(&config_json).map_err(|e| Thrown::from(&e))?;
            let inner = core::Coordinator::new(config, seed, core::Millis(now))
                .map_err(|e| Thrown::from(&e))?;
            Ok(Coordinator {
                inner,
                io: None,
                wide: None,
            })
        })
    }

    /// A coordinator restored from `snapshot()`'s output; it makes the same decisions as the
    /// one that wrote it. Throws `snapshot_version`, `snapshot_parse`, `snapshot_config` or
    /// `snapshot_corrupt`.
    #[napi(factory)]
    pub fn restore(env: Env, snapshot_json: String) -> napi::Result<Self> {
        js(&env, || {
            core::Coordinator::restore_json(&snapshot_json)
                .map(|inner| Coordinator {
                    inner,
                    io: None,
                    wide: None,
                })
                .map_err(|e| Thrown::from(&e))
        })
    }

    /// Asks for capacity before one model call.
    #[napi]
    pub fn request_lease(
        &mut self,
        env: Env,
        now: U64,
        #[napi(ts_arg_type = "LeaseRequest")] request: Object<'_>,
    ) -> napi::Result<Decision> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let request: LeaseRequest = request_object(&env, &request)?;
            let req = request.to_core()?;
            self.inner
                .request_lease(now, &req)
                .map(Decision::from)
                .map_err(Thrown::from)
        })
    }

    /// Opens a task (or updates an open one's role and unblocks): requests naming it are
    /// weighted by it and charged to it. Throws `too_many_tasks` when `maxTasks` are open.
    #[napi]
    pub fn open_task(&mut self, env: Env, now: U64, spec: TaskSpec) -> napi::Result<()> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let spec = spec.to_core()?;
            self.inner.open_task(now, &spec).map_err(Thrown::from)
        })
    }

    /// A failure of an open task, by signature (a hash of the failing test and the diff):
    /// the same signature twice in a row halves its weight. Returns the repeats in a row.
    #[napi]
    pub fn task_failed(
        &mut self,
        env: Env,
        now: U64,
        task: U64,
        signature: U64,
    ) -> napi::Result<u32> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let task = core::TaskId(u64_arg(&task, "task")?);
            let signature = u64_arg(&signature, "signature")?;
            self.inner
                .task_failed(now, task, signature)
                .map_err(Thrown::from)
        })
    }

    /// Ends an open task; returns its figures (tokens, wall time, quota and critical-path
    /// wait) as JSON text, or an object with `bigint`s when a number needs one.
    #[napi(ts_return_type = "string | Record<string, any>")]
    pub fn end_task(
        &mut self,
        env: Env,
        now: U64,
        task: U64,
        outcome: TaskOutcome,
    ) -> napi::Result<Either<String, Value>> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let task = core::TaskId(u64_arg(&task, "task")?);
            let summary = self
                .inner
                .end_task(now, task, outcome.into())
                .map_err(Thrown::from)?;
            to_js_json(&summary)
        })
    }

    /// Reports what a granted lease really used; refunds the difference (or records debt).
    #[napi]
    pub fn settle(
        &mut self,
        env: Env,
        now: U64,
        lease: U64,
        #[napi(ts_arg_type = "Usage")] usage: Object<'_>,
    ) -> napi::Result<Settlement> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let lease = lease_arg(&lease)?;
            let usage: Usage = usage_object(&env, &usage)?;
            let usage = usage.to_core()?;
            self.inner
                .settle(now, lease, &usage)
                .map(Settlement::from)
                .map_err(Thrown::from)
        })
    }

    /// Withdraws a queued ticket, or returns an unused lease in full.
    #[napi]
    pub fn cancel(&mut self, env: Env, now: U64, lease: U64) -> napi::Result<()> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let lease = lease_arg(&lease)?;
            self.inner.cancel(now, lease).map_err(Thrown::from)
        })
    }

    /// Keeps a granted lease alive while its call still works (a stream whose bytes
    /// flow): its expiry moves to `now + leaseTtlMs` (never earlier); returns the new
    /// expiry. Throws `unknown_lease` for an ended or expired lease, `not_granted` for a
    /// queued ticket.
    #[napi]
    pub fn renew(&mut self, env: Env, now: U64, lease: U64) -> napi::Result<U64> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let lease = lease_arg(&lease)?;
            self.inner
                .renew(now, lease)
                .map(|t| u64_to_js(t.0))
                .map_err(Thrown::from)
        })
    }

    /// Feeds a provider response: its status and headers (name, value pairs). Parses the
    /// rate-limit headers (Anthropic, OpenAI, Azure, IETF, retry-after, gateway) with
    /// `unixNowMs` as the wall clock for absolute reset times, resyncs the pool, pauses it
    /// on a 429, and returns what the headers said (JSON text, or an object with `bigint`s
    /// when a number needs one).
    #[napi(ts_return_type = "string | Record<string, any>")]
    #[allow(clippy::too_many_arguments)] // the core call's arguments, the headers and `env`
    pub fn handle_response(
        &mut self,
        env: Env,
        now: U64,
        pool: f64,
        lease: Option<U64>,
        status: u32,
        headers: Vec<(String, String)>,
        unix_now_ms: Option<U64>,
    ) -> napi::Result<Either<String, Value>> {
        js(&env, || {
            let r = response_args(
                &now,
                pool,
                lease.as_ref(),
                status,
                &headers,
                unix_now_ms.as_ref(),
            )?;
            self.inner
                .handle_response(r.now, r.pool, r.lease, r.status, &r.report)
                .map_err(Thrown::from)?;
            to_js_json(&r.report)
        })
    }

    /// One call's next step after asking for capacity (the core's `call_lease`): `{ call,
    /// step }` as JSON text (or an object with `bigint`s), `step` one of `send` (with the
    /// lease), `wait` (until, reason, ticket, refusal, attempt, checkpoint) or `give_up`.
    /// Pass `call` back to the call's next step.
    #[napi(ts_return_type = "string | Record<string, any>")]
    pub fn call_lease(
        &mut self,
        env: Env,
        now: U64,
        call: CallState,
        #[napi(ts_arg_type = "LeaseRequest")] request: Object<'_>,
    ) -> napi::Result<Either<String, Value>> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let mut call = call.to_core()?;
            let request: LeaseRequest = request_object(&env, &request)?;
            let req = request.to_core()?;
            let step = self
                .inner
                .call_lease(now, &mut call, &req)
                .map_err(Thrown::from)?;
            to_js_json(&serde_json::json!({ "call": call, "step": step }))
        })
    }

    /// One call's next step after a provider response (the core's `call_response`, headers
    /// parsed as by `handleResponse`): `{ call, step, settled, report }`, `step` one of `deliver`,
    /// `wait` or `give_up`. A response that is not a success is settled here as nothing used.
    #[napi(ts_return_type = "string | Record<string, any>")]
    #[allow(clippy::too_many_arguments)] // the core call's arguments, the headers and `env`
    pub fn call_response(
        &mut self,
        env: Env,
        now: U64,
        call: CallState,
        pool: f64,
        lease: Option<U64>,
        status: u32,
        headers: Vec<(String, String)>,
        unix_now_ms: Option<U64>,
    ) -> napi::Result<Either<String, Value>> {
        js(&env, || {
            let mut call = call.to_core()?;
            let r = response_args(
                &now,
                pool,
                lease.as_ref(),
                status,
                &headers,
                unix_now_ms.as_ref(),
            )?;
            let a = self
                .inner
                .call_response(r.now, &mut call, r.pool, r.lease, r.status, &r.report)
                .map_err(Thrown::from)?;
            to_js_json(&serde_json::json!({
                "call": call, "step": a.step, "settled": a.settled, "report": r.report
            }))
        })
    }

    /// Settles conservatively a lease whose call ended without a usage report (the core's
    /// `call_interrupted`): `seen` is the usage seen before the end, or `null`.
    #[napi]
    pub fn call_interrupted(
        &mut self,
        env: Env,
        now: U64,
        lease: U64,
        #[napi(ts_arg_type = "Usage | undefined | null")] seen: Option<Object<'_>>,
    ) -> napi::Result<Settlement> {
        js(&env, || {
            let now = core::Millis(u64_arg(&now, "now")?);
            let lease = lease_arg(&lease)?;
            let seen = seen
                .as_ref()
                .map(|o| usage_object(&env, o).and_then(|u: Usage| u.to_core()))
                .transpose()?;
            self.inner
                .call_interrupted(now, lease, seen.as_ref())
                .map(Settlement::from)
                .map_err(Thrown::from)
        })
    }

    /// Advances time: reaps expired leases, grants queued tickets whose time has come,
    /// steps the margin.
    #[napi]
    pub fn handle_timeout(&mut self, env: Env, now: U64) -> napi::Result<()> {
        js(&env, || {
            self.inner
                .handle_timeout(core::Millis(u64_arg(&now, "now")?));
            Ok(())
        })
    }

    /// When `handleTimeout` next has work, or `null`.
    #[napi]
    pub fn poll_timeout(&self) -> Option<U64> {
        self.inner.poll_timeout().map(|t| u64_to_js(t.0))
    }

    /// The next event, or `null` when there is none. Drain after every call.
    #[napi]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.inner.poll_event().map(Event::from)
    }

    /// The next step after a failed attempt of one call (seeded full-jitter backoff, or
    /// `Retry-After` plus jitter), with the state to pass back on its next failure.
    #[napi]
    pub fn backoff(
        &mut self,
        env: Env,
        state: BackoffState,
        retry_after_ms: Option<U64>,
    ) -> napi::Result<BackoffResult> {
        js(&env, || {
            let mut b = state.to_core()?;
            let retry = retry_after_ms
                .as_ref()
                .map(|v| u64_arg(v, "retryAfterMs"))
                .transpose()?;
            let step = self.inner.backoff(&mut b, retry).into();
            Ok(BackoffResult {
                state: BackoffState::from_core(b),
                step,
            })
        })
    }

    /// Usage against each limit per minute, the binding axis, queue depth and waits, the
    /// margin, each agent's state, and fleet-sizing advice: JSON text (camelCase keys) when
    /// every number is below 2^53, else an object with `bigint`s.
    #[napi(ts_return_type = "string | Record<string, any>")]
    pub fn metrics(&self, env: Env, now: U64) -> napi::Result<Either<String, Value>> {
        js(&env, || {
            to_js_json(&self.inner.metrics(core::Millis(u64_arg(&now, "now")?)))
        })
    }

    /// The whole state as JSON; `Coordinator.restore` makes an identical coordinator.
    #[napi]
    pub fn snapshot(&self) -> String {
        self.inner.snapshot_json()
    }

    /// The latest instant seen.
    #[napi(getter)]
    pub fn now(&self) -> U64 {
        u64_to_js(self.inner.now().0)
    }

    /// The index of the pool with this name, or `null`.
    #[napi]
    pub fn pool_id(&self, name: String) -> Option<u32> {
        self.inner.pool_id(&name).map(|p| p.0)
    }

    /// Pool names, by index.
    #[napi(getter)]
    pub fn pools(&self) -> Vec<String> {
        self.inner
            .config()
            .pools
            .iter()
            .map(|p| p.name.clone())
            .collect()
    }

    /// The configuration as JSON (the shape the constructor takes).
    #[napi]
    pub fn config_json(&self, env: Env) -> napi::Result<String> {
        js(&env, || {
            serde_json::to_string(self.inner.config()).map_err(|e| {
                Thrown::range("internal", format!("configuration does not serialize: {e}"))
            })
        })
    }

    /// Attaches the fast path's register file: a `Float64Array` of at least 16 slots that
    /// the caller keeps private (the package's engine wrapper does this; see
    /// `convert::IO_SLOTS` for the layouts).
    #[napi]
    pub fn attach_io(&mut self, env: Env, io: Float64Array) -> napi::Result<()> {
        js(&env, || {
            io::check_len(&io)?;
            self.io = Some(io);
            Ok(())
        })
    }

    /// `requestLease` on the register file; returns 0 grant, 1 queued, 2 reject, 9 wide.
    #[napi]
    pub fn request_lease_io(&mut self, env: Env) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            let io = registers(io)?;
            let now = io::io_now(io)?;
            let req = io::io_lease_request(io)?;
            let d = inner.request_lease(now, &req).map_err(Thrown::from)?;
            io::io_after(io, inner);
            Ok(io::narrow(
                wide,
                io::io_decision(io, &d),
                WideResult::Decision(d),
            ))
        })
    }

    /// `settle` on the register file; returns 0, or 9 wide.
    #[napi]
    pub fn settle_io(&mut self, env: Env) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            let io = registers(io)?;
            let now = io::io_now(io)?;
            let (lease, usage) = io::io_settle(io)?;
            let s = inner.settle(now, lease, &usage).map_err(Thrown::from)?;
            io::io_after(io, inner);
            Ok(io::narrow(
                wide,
                io::io_settlement(io, &s),
                WideResult::Settlement(s),
            ))
        })
    }

    /// `cancel` on the register file (now, lease).
    #[napi]
    pub fn cancel_io(&mut self, env: Env) -> napi::Result<()> {
        let Coordinator { inner, io, .. } = self;
        js(&env, || {
            let io = registers(io)?;
            let now = io::io_now(io)?;
            inner.cancel(now, io::io_lease(io)?).map_err(Thrown::from)?;
            io::io_after(io, inner);
            Ok(())
        })
    }

    /// `handleTimeout` on the register file (now).
    #[napi]
    pub fn handle_timeout_io(&mut self, env: Env) -> napi::Result<()> {
        let Coordinator { inner, io, .. } = self;
        js(&env, || {
            let io = registers(io)?;
            inner.handle_timeout(io::io_now(io)?);
            io::io_after(io, inner);
            Ok(())
        })
    }

    /// `pollEvent` on the register file; returns the event's code, −1 for none, 9 wide.
    #[napi]
    pub fn poll_event_io(&mut self, env: Env) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            let io = registers(io)?;
            let code = match inner.poll_event() {
                None => -1,
                Some(e) => io::narrow(wide, io::io_event(io, &e), WideResult::Event(e)),
            };
            io::io_after(io, inner);
            Ok(code)
        })
    }

    /// `callLease` on the register file (the request in slots 0 to 9, the call in 10 to
    /// 12); returns a `STEP_*` code, or 9 wide (then `takeWideJson()`).
    #[napi]
    pub fn call_lease_io(&mut self, env: Env) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            let io = registers(io)?;
            let (now, req, mut call) = io::io_call_lease(io)?;
            let step = inner
                .call_lease(now, &mut call, &req)
                .map_err(Thrown::from)?;
            io::io_after(io, inner);
            Ok(io::narrow(
                wide,
                io::io_call_step(io, &call, &step),
                WideResult::CallLease(call, step),
            ))
        })
    }

    /// `callResponse` on the register file, the headers as one string (`name\nvalue\n…`;
    /// the first argument is the attached register file, unread: the wasm build's signature);
    /// returns a `STEP_*` code, or 9 wide (then `takeWideJson()`).
    #[napi]
    pub fn call_response_io(
        &mut self,
        env: Env,
        #[napi(ts_arg_type = "Float64Array")] _io: Unknown<'_>,
        headers: String,
    ) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            let io = registers(io)?;
            let r = io::io_response(io, &headers)?;
            let mut call = io::io_response_call(io)?;
            let a = inner
                .call_response(r.now, &mut call, r.pool, r.lease, r.status, &r.report)
                .map_err(Thrown::from)?;
            let mut code = io::io_call_step(io, &call, &a.step);
            if !io::io_settled(io, a.settled.as_ref()) || !io::io_report(io, &r.report) {
                code = io::WIDE;
            }
            io::io_after(io, inner);
            Ok(io::narrow(
                wide,
                code,
                WideResult::CallResponse(call, a, r.report),
            ))
        })
    }

    /// `handleResponse` on the register file, the headers as one string; returns 0, or 9
    /// wide (then `takeWideJson()`).
    #[napi]
    pub fn handle_response_io(
        &mut self,
        env: Env,
        #[napi(ts_arg_type = "Float64Array")] _io: Unknown<'_>,
        headers: String,
    ) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            let io = registers(io)?;
            let r = io::io_response(io, &headers)?;
            inner
                .handle_response(r.now, r.pool, r.lease, r.status, &r.report)
                .map_err(Thrown::from)?;
            let code = if io::io_report(io, &r.report) {
                0
            } else {
                io::WIDE
            };
            io::io_after(io, inner);
            Ok(io::narrow(wide, code, WideResult::Report(r.report)))
        })
    }

    /// A call or report result held back because it needs `bigint`s, as `callResponse`
    /// returns it (an object with `bigint`s), or `null`.
    #[napi(ts_return_type = "string | Record<string, any> | null")]
    pub fn take_wide_json(&mut self, env: Env) -> napi::Result<Option<Either<String, Value>>> {
        js(&env, || match self.wide.take().and_then(|w| w.json()) {
            None => Ok(None),
            Some(v) => to_js_json(&v).map(Some),
        })
    }

    /// The fast-path result held back because it needs `bigint`s, or `null`.
    #[napi]
    pub fn take_wide(&mut self) -> Option<Either3<Decision, Settlement, Event>> {
        match self.wide.take()? {
            WideResult::Decision(d) => Some(Either3::A(d.into())),
            WideResult::Settlement(s) => Some(Either3::B(s.into())),
            WideResult::Event(e) => Some(Either3::C(e.into())),
            // A call or report result: `takeWideJson()`'s.
            other => {
                self.wide = Some(other);
                None
            }
        }
    }

    /// Internal consistency check; throws `corrupt` naming the broken invariant.
    #[napi]
    pub fn check(&self, env: Env) -> napi::Result<()> {
        js(&env, || {
            self.inner
                .check()
                .map_err(|why| Thrown::range("corrupt", format!("inconsistent state: {why}")))
        })
    }
}

/// The attached register file.
fn registers(io: &mut Option<Float64Array>) -> Result<&mut [f64], Thrown> {
    let io = io.as_mut().ok_or_else(|| {
        Thrown::range(
            "invalid_argument",
            "no io buffer attached: call attachIo first".into(),
        )
    })?;
    // SAFETY: the buffer is kept alive by the reference `Float64Array` holds, JavaScript is
    // single-threaded and blocked in this call, and the slice does not outlive it.
    Ok(unsafe { io.as_mut() })
}

/// Sizes a fleet before it runs: the core's `plan_fleet` on a fleet description (the core's
/// snake_case JSON: `{ pool, agents: [...], headroom_permille? }`), answered as camelCase
/// JSON — every limited axis's late-session demand and share, the binding axis, the agents
/// that fit at the headroom, and how much the turns stretch when the fleet is too big.
#[napi(js_name = "planFleet")]
pub fn plan_fleet(env: Env, json: String) -> napi::Result<String> {
    js(&env, || tokenwarden_js_abi::plan_fleet(&json))
}
