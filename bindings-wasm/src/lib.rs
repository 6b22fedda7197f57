//! `tokenwarden-core`'s `Coordinator` for JavaScript through wasm-bindgen: the engine for
//! browsers, Node.js and Cloudflare Workers.
//!
//! The class mirrors the Node addon's object API method for method (same names, same
//! shapes, same error codes), so the package's JavaScript driver and `fetch` wrapper run
//! on either engine unchanged. Each method converts its arguments, calls the core and
//! converts the result: the calling convention both bindings share is the crate
//! `tokenwarden-js-abi`, this build's own conversions (js-sys objects, `bigint`s, errors)
//! are in `convert.rs`. Nothing here reads a clock:
//! every call takes `now`, integer milliseconds on the caller's epoch.

pub mod convert;

use convert::{
    ArgError, Thrown, backoff_state, call_state, headers, lease_request, task_outcome, task_spec,
    to_js, u32_arg, u64_arg, u64_to_js, usage,
};
use tokenwarden_core as core;
use tokenwarden_js_abi::io::{self, WideResult};
use wasm_bindgen::prelude::*;

/// One provider's quota: buckets, leases, the weighted fair queue and the margin, driven by
/// the caller's clock. Call order: any input, then drain `pollEvent()`, then arm one timer
/// for `pollTimeout()` and call `handleTimeout(now)` when it fires.
#[wasm_bindgen]
pub struct Coordinator {
    inner: core::Coordinator,
    /// A register-file result that needs `bigint`s, until `takeWide()`.
    wide: Option<WideResult>,
    /// The register file the `…Io` calls read and write, in wasm memory: JavaScript reaches
    /// it through `registers()` (a view), so a call copies nothing through wasm-bindgen.
    regs: Box<[f64]>,
    /// The response calls' header text, written by JavaScript through `textBuffer()`.
    text: Vec<u8>,
}

impl Coordinator {
    fn with(inner: core::Coordinator) -> Coordinator {
        Coordinator {
            inner,
            wide: None,
            regs: vec![0.0; io::IO_SLOTS].into_boxed_slice(),
            text: Vec::new(),
        }
    }

    /// What both response calls start from: the response read from the register file and
    /// from the first `headers_len` bytes of the text buffer, with the parts they write.
    fn response_parts(&mut self, headers_len: usize) -> Result<ResponseParts<'_>, ArgError> {
        let Coordinator {
            inner,
            wide,
            regs,
            text,
        } = self;
        let r = io::io_response(regs, text_of(text, headers_len)?)?;
        Ok(ResponseParts {
            inner,
            wide,
            io: regs,
            r,
        })
    }
}

/// A response call's parts, borrowed from its [`Coordinator`].
struct ResponseParts<'a> {
    inner: &'a mut core::Coordinator,
    wide: &'a mut Option<WideResult>,
    io: &'a mut [f64],
    r: io::ResponseIo,
}

/// The first `len` bytes of the header text buffer, as text.
fn text_of(text: &[u8], len: usize) -> Result<&str, ArgError> {
    let bytes = text.get(..len).ok_or_else(|| {
        ArgError::range(
            "invalid_argument",
            format!(
                "headers: {len} bytes asked for, the text buffer holds {}",
                text.len()
            ),
        )
    })?;
    std::str::from_utf8(bytes)
        .map_err(|_| ArgError::range("invalid_argument", "headers: not UTF-8".into()))
}

fn now_arg(now: &JsValue) -> Result<core::Millis, ArgError> {
    u64_arg(now, "now").map(core::Millis)
}

fn lease_arg(lease: &JsValue) -> Result<core::LeaseId, ArgError> {
    u64_arg(lease, "lease").map(core::LeaseId)
}

/// A response's arguments, checked, with its headers parsed.
struct ResponseArgs {
    now: core::Millis,
    pool: core::PoolId,
    lease: Option<core::LeaseId>,
    status: u16,
    report: core::HeaderReport,
}

fn response_args(
    now: &JsValue,
    pool: &JsValue,
    lease: &JsValue,
    status: &JsValue,
    header_pairs: &JsValue,
    unix_now_ms: &JsValue,
) -> Result<ResponseArgs, ArgError> {
    let now = now_arg(now)?;
    let pool = core::PoolId(u32_arg(pool, "pool")?);
    let lease = if lease.is_null() || lease.is_undefined() {
        None
    } else {
        Some(lease_arg(lease)?)
    };
    let status = u16::try_from(u32_arg(status, "status")?).map_err(|_| {
        ArgError::range("invalid_argument", "`status` must be below 65536".into())
            .with_field("status")
    })?;
    let unix = if unix_now_ms.is_null() || unix_now_ms.is_undefined() {
        None
    } else {
        Some(u64_arg(unix_now_ms, "unixNowMs")?)
    };
    let pairs = headers(header_pairs)?;
    let report = core::parse_headers(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())), unix);
    Ok(ResponseArgs {
        now,
        pool,
        lease,
        status,
        report,
    })
}

/// A string argument, or a `TypeError` naming it.
fn text_arg(v: &JsValue, field: &str, what: &str) -> Result<String, ArgError> {
    v.as_string().ok_or_else(|| {
        ArgError::type_error(format!("`{field}` must be {what} (a string)")).with_field(field)
    })
}

#[wasm_bindgen]
impl Coordinator {
    /// A coordinator for the configuration (the core's JSON shape, as a string), with the
    /// PRNG seed and the current time. Throws `config_parse` or `invalid_config` (with
    /// `field`).
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_param_type = "string")] config_json: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] seed: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
    ) -> Result<Coordinator, Thrown> {
        let config_json = text_arg(&config_json, "config", "the configuration's JSON text")?;
        let seed = u64_arg(&seed, "seed")?;
        let now = now_arg(&now)?;
        let config = core::Config::from_json(&config_json).map_err(|e| ArgError::from(&e))?;
        let inner = core::Coordinator::new(config, seed, now).map_err(|e| ArgError::from(&e))?;
        Ok(Coordinator::with(inner))
    }

    /// A coordinator restored from `snapshot()`; it makes the same decisions as the one that
    /// wrote it. Throws `snapshot_version`, `snapshot_parse`, `snapshot_config` or
    /// `snapshot_corrupt`.
    pub fn restore(
        #[wasm_bindgen(unchecked_param_type = "string")] snapshot_json: JsValue,
    ) -> Result<Coordinator, Thrown> {
        // A `&str` parameter reads any other value as a pointer and a length (an object
        // traps with "memory access out of bounds"): take the value and check it.
        let snapshot_json = text_arg(&snapshot_json, "snapshot", "the snapshot's JSON text")?;
        core::Coordinator::restore_json(&snapshot_json)
            .map(Coordinator::with)
            .map_err(|e| ArgError::from(&e).into())
    }

    /// Asks for capacity before one model call.
    #[wasm_bindgen(js_name = requestLease, unchecked_return_type = "Decision")]
    pub fn request_lease(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "LeaseRequest")] request: JsValue,
    ) -> Result<JsValue, Thrown> {
        let now = now_arg(&now)?;
        let req = lease_request(&request)?;
        let d = self
            .inner
            .request_lease(now, &req)
            .map_err(ArgError::from)?;
        Ok(to_js(&d)?)
    }

    /// Reports what a granted lease really used; refunds the difference (or records debt).
    #[wasm_bindgen(unchecked_return_type = "Settlement")]
    pub fn settle(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] lease: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Usage")] usage_value: JsValue,
    ) -> Result<JsValue, Thrown> {
        let now = now_arg(&now)?;
        let lease = lease_arg(&lease)?;
        let u = usage(&usage_value)?;
        let s = self.inner.settle(now, lease, &u).map_err(ArgError::from)?;
        Ok(to_js(&s)?)
    }

    /// Withdraws a queued ticket, or returns an unused lease in full.
    pub fn cancel(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] lease: JsValue,
    ) -> Result<(), Thrown> {
        let now = now_arg(&now)?;
        let lease = lease_arg(&lease)?;
        Ok(self.inner.cancel(now, lease).map_err(ArgError::from)?)
    }

    /// Keeps a granted lease alive while its call still works (a stream whose bytes
    /// flow): its expiry moves to `now + leaseTtlMs` (never earlier); returns the new
    /// expiry. Throws `unknown_lease` for an ended or expired lease, `not_granted` for a
    /// queued ticket.
    #[wasm_bindgen(unchecked_return_type = "number | bigint")]
    pub fn renew(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] lease: JsValue,
    ) -> Result<JsValue, Thrown> {
        let now = now_arg(&now)?;
        let lease = lease_arg(&lease)?;
        let t = self.inner.renew(now, lease).map_err(ArgError::from)?;
        Ok(u64_to_js(t.0))
    }

    /// Feeds a provider response (status and `[name, value]` header pairs): parses the
    /// rate-limit headers with `unixNowMs` as the wall clock, resyncs the pool, pauses it
    /// on a 429, and returns what the headers said.
    #[wasm_bindgen(js_name = handleResponse, unchecked_return_type = "HeaderReport")]
    pub fn handle_response(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] pool: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint | null")] lease: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] status: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Array<[string, string]>")] header_pairs: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint | null")] unix_now_ms: JsValue,
    ) -> Result<JsValue, Thrown> {
        let r = response_args(&now, &pool, &lease, &status, &header_pairs, &unix_now_ms)?;
        self.inner
            .handle_response(r.now, r.pool, r.lease, r.status, &r.report)
            .map_err(ArgError::from)?;
        Ok(to_js(&r.report)?)
    }

    /// One call's next step after asking for capacity (the core's `call_lease`):
    /// `{ call, step }`; pass `call` back to the call's next step.
    #[wasm_bindgen(js_name = callLease, unchecked_return_type = "CallLeaseResult")]
    pub fn call_lease(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "CallState")] call: JsValue,
        #[wasm_bindgen(unchecked_param_type = "LeaseRequest")] request: JsValue,
    ) -> Result<JsValue, Thrown> {
        let now = now_arg(&now)?;
        let mut call = call_state(&call)?;
        let req = lease_request(&request)?;
        let step = self
            .inner
            .call_lease(now, &mut call, &req)
            .map_err(ArgError::from)?;
        Ok(to_js(&serde_json::json!({ "call": call, "step": step }))?)
    }

    /// One call's next step after a provider response (the core's `call_response`, the
    /// headers parsed as by `handleResponse`): `{ call, step, settled, report }` (`settled`:
    /// the settlement when the core settled the lease, a response that is not a success).
    #[wasm_bindgen(js_name = callResponse, unchecked_return_type = "CallResponseResult")]
    #[allow(clippy::too_many_arguments)] // the core call's arguments and the raw headers
    pub fn call_response(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "CallState")] call: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] pool: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint | null")] lease: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] status: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Array<[string, string]>")] header_pairs: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint | null")] unix_now_ms: JsValue,
    ) -> Result<JsValue, Thrown> {
        let mut call = call_state(&call)?;
        let r = response_args(&now, &pool, &lease, &status, &header_pairs, &unix_now_ms)?;
        let a = self
            .inner
            .call_response(r.now, &mut call, r.pool, r.lease, r.status, &r.report)
            .map_err(ArgError::from)?;
        Ok(to_js(&serde_json::json!({
            "call": call, "step": a.step, "settled": a.settled, "report": r.report
        }))?)
    }

    /// Settles conservatively a lease whose call ended without a usage report (the core's
    /// `call_interrupted`); `seen` is the usage seen before the end, or `null`.
    #[wasm_bindgen(js_name = callInterrupted, unchecked_return_type = "Settlement")]
    pub fn call_interrupted(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] lease: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Usage | null")] seen: JsValue,
    ) -> Result<JsValue, Thrown> {
        let now = now_arg(&now)?;
        let lease = lease_arg(&lease)?;
        let seen = if seen.is_null() || seen.is_undefined() {
            None
        } else {
            Some(usage(&seen)?)
        };
        let s = self
            .inner
            .call_interrupted(now, lease, seen.as_ref())
            .map_err(ArgError::from)?;
        Ok(to_js(&s)?)
    }

    /// Opens a task (or updates an open one's role and unblocks): requests naming it are
    /// weighted by it and charged to it. Throws `too_many_tasks` when `maxTasks` are open.
    #[wasm_bindgen(js_name = openTask)]
    pub fn open_task(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "TaskSpec")] spec: JsValue,
    ) -> Result<(), Thrown> {
        let now = now_arg(&now)?;
        let spec = task_spec(&spec)?;
        Ok(self.inner.open_task(now, &spec).map_err(ArgError::from)?)
    }

    /// A failure of an open task, by signature: the same signature twice in a row halves
    /// its weight. Returns the identical failures in a row.
    #[wasm_bindgen(js_name = taskFailed)]
    pub fn task_failed(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] task: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] signature: JsValue,
    ) -> Result<u32, Thrown> {
        let now = now_arg(&now)?;
        let task = core::TaskId(u64_arg(&task, "task")?);
        let signature = u64_arg(&signature, "signature")?;
        Ok(self
            .inner
            .task_failed(now, task, signature)
            .map_err(ArgError::from)?)
    }

    /// Ends an open task (`"merged"`, `"abandoned"` or `"failed"`); returns its figures.
    #[wasm_bindgen(js_name = endTask, unchecked_return_type = "TaskSummary")]
    pub fn end_task(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] task: JsValue,
        #[wasm_bindgen(unchecked_param_type = "TaskOutcome")] outcome: JsValue,
    ) -> Result<JsValue, Thrown> {
        let now = now_arg(&now)?;
        let task = core::TaskId(u64_arg(&task, "task")?);
        let outcome = task_outcome(&outcome)?;
        let s = self
            .inner
            .end_task(now, task, outcome)
            .map_err(ArgError::from)?;
        Ok(to_js(&s)?)
    }

    /// Advances time: reaps expired leases, grants queued tickets whose time has come,
    /// steps the margin.
    #[wasm_bindgen(js_name = handleTimeout)]
    pub fn handle_timeout(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
    ) -> Result<(), Thrown> {
        self.inner.handle_timeout(now_arg(&now)?);
        Ok(())
    }

    /// When `handleTimeout` next has work, or `null`.
    #[wasm_bindgen(js_name = pollTimeout, unchecked_return_type = "number | bigint | null")]
    pub fn poll_timeout(&self) -> JsValue {
        self.inner
            .poll_timeout()
            .map_or(JsValue::NULL, |t| u64_to_js(t.0))
    }

    /// The next event, or `null`. Drain after every call.
    #[wasm_bindgen(js_name = pollEvent, unchecked_return_type = "EngineEvent | null")]
    pub fn poll_event(&mut self) -> Result<JsValue, Thrown> {
        match self.inner.poll_event() {
            None => Ok(JsValue::NULL),
            Some(e) => Ok(to_js(&e)?),
        }
    }

    /// The next step after a failed attempt of one call, with the state to pass back.
    #[wasm_bindgen(unchecked_return_type = "BackoffResult")]
    pub fn backoff(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "BackoffState")] state: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number | bigint | null")] retry_after_ms: JsValue,
    ) -> Result<JsValue, Thrown> {
        let mut b = backoff_state(&state)?;
        let retry = if retry_after_ms.is_null() || retry_after_ms.is_undefined() {
            None
        } else {
            Some(u64_arg(&retry_after_ms, "retryAfterMs")?)
        };
        let step = self.inner.backoff(&mut b, retry);
        let out = js_sys::Object::new();
        // Defining properties on a fresh object cannot fail.
        let _ = js_sys::Reflect::set(&out, &"state".into(), &to_js(&b)?);
        let _ = js_sys::Reflect::set(&out, &"step".into(), &to_js(&step)?);
        Ok(out.into())
    }

    /// Usage against each limit per minute, the binding axis, queue, margin, agents.
    #[wasm_bindgen(unchecked_return_type = "Metrics")]
    pub fn metrics(
        &self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
    ) -> Result<JsValue, Thrown> {
        Ok(to_js(&self.inner.metrics(now_arg(&now)?))?)
    }

    /// The whole state as JSON; `Coordinator.restore` makes an identical coordinator.
    pub fn snapshot(&self) -> String {
        self.inner.snapshot_json()
    }

    /// The latest instant seen.
    #[wasm_bindgen(getter, unchecked_return_type = "number | bigint")]
    pub fn now(&self) -> JsValue {
        u64_to_js(self.inner.now().0)
    }

    /// The index of the pool with this name, or `undefined`.
    #[wasm_bindgen(js_name = poolId)]
    pub fn pool_id(&self, name: &str) -> Option<u32> {
        self.inner.pool_id(name).map(|p| p.0)
    }

    /// Pool names, by index.
    #[wasm_bindgen(getter)]
    pub fn pools(&self) -> Vec<String> {
        self.inner
            .config()
            .pools
            .iter()
            .map(|p| p.name.clone())
            .collect()
    }

    /// The coordinator's register file (layouts in `tokenwarden-js-abi`) as a view into
    /// wasm memory: the `…Io` calls read their arguments from it and leave their results in
    /// it. The view is valid until wasm memory grows (it then reads as empty: ask again).
    #[wasm_bindgen(js_name = registers)]
    #[allow(unsafe_code)]
    pub fn registers(&mut self) -> js_sys::Float64Array {
        // SAFETY: `regs` is never reallocated, and the view is only used from JavaScript
        // between calls, which do not touch `regs` while it is read.
        unsafe { js_sys::Float64Array::view_mut_raw(self.regs.as_mut_ptr(), self.regs.len()) }
    }

    /// The header text buffer, at least `capacity` bytes, as a view into wasm memory: write
    /// the response calls' `name\nvalue\n…` text into it (UTF-8), then pass its length.
    /// Valid until the next `textBuffer` call or until wasm memory grows.
    #[wasm_bindgen(js_name = textBuffer)]
    #[allow(unsafe_code)]
    pub fn text_buffer(&mut self, capacity: usize) -> js_sys::Uint8Array {
        if self.text.len() < capacity {
            self.text.resize(capacity, 0);
        }
        // SAFETY: as `registers`; `text` only moves in this method, which returns a new view.
        unsafe { js_sys::Uint8Array::view_mut_raw(self.text.as_mut_ptr(), self.text.len()) }
    }

    /// `requestLease` on the register file: returns 0 grant, 1 queued, 2 reject, 9 wide.
    /// The hot path of the shared driver.
    #[wasm_bindgen(js_name = requestLeaseIo)]
    pub fn request_lease_io(&mut self) -> Result<i32, Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        let io = &mut regs[..];
        let now = io::io_now(io)?;
        let req = io::io_lease_request(io)?;
        let d = inner.request_lease(now, &req).map_err(ArgError::from)?;
        io::io_after(io, inner);
        Ok(io::narrow(
            wide,
            io::io_decision(io, &d),
            WideResult::Decision(d),
        ))
    }

    /// `settle` on the register file: returns 0, or 9 wide.
    #[wasm_bindgen(js_name = settleIo)]
    pub fn settle_io(&mut self) -> Result<i32, Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        let io = &mut regs[..];
        let now = io::io_now(io)?;
        let (lease, u) = io::io_settle(io)?;
        let s = inner.settle(now, lease, &u).map_err(ArgError::from)?;
        io::io_after(io, inner);
        Ok(io::narrow(
            wide,
            io::io_settlement(io, &s),
            WideResult::Settlement(s),
        ))
    }

    /// `cancel` on the register file (now, lease).
    #[wasm_bindgen(js_name = cancelIo)]
    pub fn cancel_io(&mut self) -> Result<(), Thrown> {
        let Coordinator { inner, regs, .. } = self;
        let io = &mut regs[..];
        let now = io::io_now(io)?;
        inner
            .cancel(now, io::io_lease(io)?)
            .map_err(ArgError::from)?;
        io::io_after(io, inner);
        Ok(())
    }

    /// `handleTimeout` on the register file (now).
    #[wasm_bindgen(js_name = handleTimeoutIo)]
    pub fn handle_timeout_io(&mut self) -> Result<(), Thrown> {
        let Coordinator { inner, regs, .. } = self;
        let io = &mut regs[..];
        inner.handle_timeout(io::io_now(io)?);
        io::io_after(io, inner);
        Ok(())
    }

    /// `pollEvent` on the register file: the event's code, −1 for none, 9 wide.
    #[wasm_bindgen(js_name = pollEventIo)]
    pub fn poll_event_io(&mut self) -> Result<i32, Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        let io = &mut regs[..];
        let code = match inner.poll_event() {
            None => -1,
            Some(e) => io::narrow(wide, io::io_event(io, &e), WideResult::Event(e)),
        };
        io::io_after(io, inner);
        Ok(code)
    }

    /// `callLease` on the register file (the request in slots 0 to 9, the call in 10 to
    /// 12): a `STEP_*` code, or 9 wide (then `takeWideJson()`).
    #[wasm_bindgen(js_name = callLeaseIo)]
    pub fn call_lease_io(&mut self) -> Result<i32, Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        let io = &mut regs[..];
        let (now, req, mut call) = io::io_call_lease(io)?;
        let step = inner
            .call_lease(now, &mut call, &req)
            .map_err(ArgError::from)?;
        io::io_after(io, inner);
        Ok(io::narrow(
            wide,
            io::io_call_step(io, &call, &step),
            WideResult::CallLease(call, step),
        ))
    }

    /// `callResponse` on the register file, the headers the first `headers_len` bytes of
    /// the text buffer (`name\nvalue\n…`): a `STEP_*` code, or 9 wide (then
    /// `takeWideJson()`).
    #[wasm_bindgen(js_name = callResponseIo)]
    pub fn call_response_io(&mut self, headers_len: usize) -> Result<i32, Thrown> {
        let ResponseParts { inner, wide, io, r } = self.response_parts(headers_len)?;
        let mut call = io::io_response_call(io)?;
        let a = inner
            .call_response(r.now, &mut call, r.pool, r.lease, r.status, &r.report)
            .map_err(ArgError::from)?;
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
    }

    /// `handleResponse` on the register file, the headers the first `headers_len` bytes of
    /// the text buffer: 0, or 9 wide (then `takeWideJson()`).
    #[wasm_bindgen(js_name = handleResponseIo)]
    pub fn handle_response_io(&mut self, headers_len: usize) -> Result<i32, Thrown> {
        let ResponseParts { inner, wide, io, r } = self.response_parts(headers_len)?;
        inner
            .handle_response(r.now, r.pool, r.lease, r.status, &r.report)
            .map_err(ArgError::from)?;
        let code = if io::io_report(io, &r.report) {
            0
        } else {
            io::WIDE
        };
        io::io_after(io, inner);
        Ok(io::narrow(wide, code, WideResult::Report(r.report)))
    }

    /// A call or report result held back because it needs `bigint`s (as `callResponse`
    /// returns it), or `null`.
    #[wasm_bindgen(js_name = takeWideJson, unchecked_return_type = "Record<string, any> | null")]
    pub fn take_wide_json(&mut self) -> Result<JsValue, Thrown> {
        Ok(match self.wide.take().and_then(|w| w.json()) {
            None => JsValue::NULL,
            Some(v) => to_js(&v)?,
        })
    }

    /// The register-file result held back because it needs `bigint`s, or `null`.
    #[wasm_bindgen(js_name = takeWide, unchecked_return_type = "Decision | Settlement | EngineEvent | null")]
    pub fn take_wide(&mut self) -> Result<JsValue, Thrown> {
        Ok(match self.wide.take() {
            None => JsValue::NULL,
            Some(WideResult::Decision(d)) => to_js(&d)?,
            Some(WideResult::Settlement(s)) => to_js(&s)?,
            Some(WideResult::Event(e)) => to_js(&e)?,
            // A call or report result: `takeWideJson()`'s.
            Some(other) => {
                self.wide = Some(other);
                JsValue::NULL
            }
        })
    }

    /// Internal consistency check; throws `corrupt` naming the broken invariant.
    pub fn check(&self) -> Result<(), Thrown> {
        self.inner
            .check()
            .map_err(|why| ArgError::range("corrupt", format!("inconsistent state: {why}")).into())
    }
}

/// A random 53-bit seed from the platform's `crypto.getRandomValues` (getrandom's wasm JS
/// backend), for backoff jitter when the caller does not choose one.
#[wasm_bindgen(js_name = randomSeed)]
pub fn random_seed() -> Result<f64, Thrown> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|e| ArgError::range("internal", format!("no random source: {e}")))?;
    #[allow(clippy::cast_precision_loss)] // exact: masked to 53 bits
    Ok((u64::from_le_bytes(bytes) & MAX_SEED) as f64)
}

const MAX_SEED: u64 = (1 << 53) - 1;

/// Sizes a fleet before it runs: the core's `plan_fleet` on a fleet description (the core's
/// snake_case JSON: `{ pool, agents: [...], headroom_permille? }`), answered as camelCase
/// JSON (see the npm package's `planFleet`).
#[wasm_bindgen(js_name = planFleet)]
pub fn plan_fleet(json: &str) -> Result<String, Thrown> {
    tokenwarden_js_abi::plan_fleet(json).map_err(Thrown::from)
}
