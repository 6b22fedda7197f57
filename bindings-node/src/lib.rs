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

use convert::{Thrown, U64, WideResult, io, to_js_json, u64_arg, u64_to_js};
use napi::Env;
use napi::bindgen_prelude::{Either, Float64Array, Uint8Array, Unknown};
use napi_derive::napi;
use serde_json::Value;
use tokenwarden_core as core;

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

    /// The host protocol: applies one input at `now` and answers its output. The input is
    /// the core's `Input` as JSON text with camelCase keys (`{"op": "settle", "lease": 3,
    /// "usage": {"inputTokens": 900}}`; integers above 2^53 − 1 written out exactly); the
    /// output is the core's `Output`, JSON text with camelCase keys, or an object with
    /// `bigint`s when a number is above 2^53 − 1. Every input the core takes crosses here:
    /// a new one needs no change to this addon. Errors throw with the stable codes
    /// (`invalid_argument` naming the field for a malformed input); state is unchanged.
    #[napi(ts_return_type = "string | Record<string, any>")]
    pub fn handle(
        &mut self,
        env: Env,
        now: U64,
        input: String,
    ) -> napi::Result<Either<String, Value>> {
        js(&env, || {
            let now = u64_arg(&now, "now")?;
            to_js_json(&tokenwarden_js_abi::handle(&mut self.inner, now, &input)?)
        })
    }

    /// When `handle({op: "timeout"})` next has work, or `null`.
    #[napi]
    pub fn poll_timeout(&self) -> Option<U64> {
        self.inner.poll_timeout().map(|t| u64_to_js(t.0))
    }

    /// The next event (JSON text, camelCase keys; an object with `bigint`s when a number
    /// is above 2^53 − 1), or `null` when there is none. Drain after every call.
    #[napi(ts_return_type = "string | Record<string, any> | null")]
    pub fn poll_event(&mut self, env: Env) -> napi::Result<Option<Either<String, Value>>> {
        js(&env, || {
            self.inner.poll_event().map(|e| to_js_json(&e)).transpose()
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

    /// Which API a request is a model call of (`anthropic_messages`, `openai_chat`,
    /// `openai_responses`), or `null`: the provider crate's rule, on the path as the
    /// provider's router reads it (`target`: the path, query string allowed).
    #[napi]
    pub fn model_call(&self, method: String, target: String) -> Option<&'static str> {
        tokenwarden_js_abi::model_call(&method, &target)
    }

    /// Who a call is by its client's session headers (Claude Code's, Codex's) and its
    /// family, under the name `base` when one is given: `{name, parent, root}` as JSON text,
    /// or `null`. `headers`: `name\nvalue\n…`.
    #[napi]
    pub fn caller_identity(
        &self,
        env: Env,
        headers: String,
        base: Option<String>,
    ) -> napi::Result<String> {
        js(&env, || {
            tokenwarden_js_abi::caller_identity(&headers, base.as_deref())
        })
    }

    /// One send of an `api` call (as `modelCall` names it), sent at `now` under a lease
    /// with `leaseLeftMs` to run, with the timeouts `exchangeTimeouts` answers (see
    /// `Exchange`).
    #[napi]
    pub fn exchange(
        &self,
        env: Env,
        api: String,
        now: f64,
        lease_left_ms: f64,
        first_byte_ms: f64,
        idle_ms: f64,
    ) -> napi::Result<Exchange> {
        js(&env, || {
            tokenwarden_js_abi::exchange::Exchange::sent(
                &api,
                now,
                lease_left_ms,
                first_byte_ms,
                idle_ms,
            )
            .map(|inner| Exchange { inner })
        })
    }

    /// The upstream timeouts from a host's options (`undefined`: the default, `Infinity`:
    /// none): `[firstByteMs, idleMs]`, `Infinity` for none.
    #[napi]
    pub fn exchange_timeouts(
        &self,
        env: Env,
        first_byte_ms: Option<f64>,
        idle_ms: Option<f64>,
    ) -> napi::Result<Vec<f64>> {
        js(&env, || {
            tokenwarden_js_abi::exchange::timeouts(first_byte_ms, idle_ms).map(Vec::from)
        })
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
            io::run::request_lease((inner, registers(io)?, wide))
        })
    }

    /// `settle` on the register file; returns 0, or 9 wide.
    #[napi]
    pub fn settle_io(&mut self, env: Env) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || io::run::settle((inner, registers(io)?, wide)))
    }

    /// `cancel` on the register file (now, lease).
    #[napi]
    pub fn cancel_io(&mut self, env: Env) -> napi::Result<()> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || io::run::cancel((inner, registers(io)?, wide)))
    }

    /// `handleTimeout` on the register file (now).
    #[napi]
    pub fn handle_timeout_io(&mut self, env: Env) -> napi::Result<()> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            io::run::handle_timeout((inner, registers(io)?, wide))
        })
    }

    /// `pollEvent` on the register file; returns the event's code, −1 for none, 9 wide.
    #[napi]
    pub fn poll_event_io(&mut self, env: Env) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || {
            Ok(io::run::poll_event((inner, registers(io)?, wide)))
        })
    }

    /// `callLease` on the register file (the request in slots 0 to 9, the call in 10 to
    /// 12); returns a `STEP_*` code, or 9 wide (then `takeWide()`).
    #[napi]
    pub fn call_lease_io(&mut self, env: Env) -> napi::Result<i32> {
        let Coordinator { inner, io, wide } = self;
        js(&env, || io::run::call_lease((inner, registers(io)?, wide)))
    }

    /// `callResponse` on the register file, the headers as one string (`name\nvalue\n…`;
    /// the first argument is the attached register file, unread: the wasm build's signature);
    /// returns a `STEP_*` code, or 9 wide (then `takeWide()`).
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
            io::run::call_response((inner, io, wide), r)
        })
    }

    /// `handleResponse` on the register file, the headers as one string; returns 0, or 9
    /// wide (then `takeWide()`).
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
            io::run::handle_response((inner, io, wide), r)
        })
    }

    /// The register-file result held back because it needs `bigint`s (code 9), as an
    /// object with `bigint`s (JSON text when it has none), or `null`.
    #[napi(ts_return_type = "string | Record<string, any> | null")]
    pub fn take_wide(&mut self, env: Env) -> napi::Result<Option<Either<String, Value>>> {
        js(&env, || match self.wide.take() {
            None => Ok(None),
            Some(w) => to_js_json(&w.json()).map(Some),
        })
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

/// How many tokens `text` is in OpenAI's `encoding` (`o200k_base` or `cl100k_base`), by the
/// provider crate's byte-pair tokenizer (special-token strings count as ordinary text, as
/// the API takes them in a prompt). The ranks are in the addon; an encoding's table is
/// built the first time it counts.
#[napi(js_name = "countTokens")]
pub fn count_tokens(env: Env, encoding: String, text: String) -> napi::Result<u32> {
    js(&env, || {
        let bpe = native_tokenizer(&encoding)?;
        Ok(u32::try_from(bpe.count(&text)).unwrap_or(u32::MAX))
    })
}

/// The addon's tokenizer for `encoding`, built on first use.
fn native_tokenizer(
    encoding: &str,
) -> Result<std::sync::Arc<tokenwarden_provider::bpe::Bpe>, Thrown> {
    use std::sync::{Arc, OnceLock};
    use tokenwarden_provider::bpe::{self, Bpe, Encoding};
    type Built = Result<Arc<Bpe>, tokenwarden_js_abi::ArgError>;
    static O200K: OnceLock<Built> = OnceLock::new();
    static CL100K: OnceLock<Built> = OnceLock::new();
    let make = |name, ranks| tokenwarden_js_abi::tokenizer(name, ranks).map(Arc::new);
    let built = match tokenwarden_js_abi::encoding(encoding)? {
        Encoding::O200kBase => O200K.get_or_init(|| make("o200k_base", bpe::O200K_BASE)),
        Encoding::Cl100kBase => CL100K.get_or_init(|| make("cl100k_base", bpe::CL100K_BASE)),
    };
    Ok(built.as_ref().map_err(Clone::clone)?.clone())
}

/// The provider crate's estimator (`tokenwarden_provider::estimate`): request bodies (JSON
/// text) → the input tokens a lease reserves, learning from each settled call. The
/// driver's `DefaultEstimator` runs on it.
#[napi]
pub struct Estimator {
    inner: tokenwarden_provider::estimate::Estimator,
}

#[napi]
impl Estimator {
    /// An estimator from its options' camelCase JSON (`{}`: the defaults).
    #[napi(constructor)]
    pub fn new(env: Env, options: String) -> napi::Result<Estimator> {
        js(&env, || {
            Ok(Estimator {
                inner: tokenwarden_js_abi::estimator(&options)?,
            })
        })
    }

    /// `{"id","inputTokens","cachedPrefixTokens","cachedPrefixConfirmed"}` as JSON text.
    #[napi]
    pub fn estimate(
        &mut self,
        env: Env,
        now: f64,
        provider: String,
        model: String,
        body: String,
    ) -> napi::Result<String> {
        js(&env, || {
            tokenwarden_js_abi::estimate(&mut self.inner, now, &provider, &model, &body)
        })
    }

    /// Learns from a settled call; `false` when the estimate is no longer remembered and
    /// no body was given (call again with it).
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        env: Env,
        id: f64,
        now: f64,
        provider: String,
        model: String,
        body: Option<String>,
        actual: f64,
        usage: Option<String>,
    ) -> napi::Result<bool> {
        js(&env, || {
            tokenwarden_js_abi::observe(
                &mut self.inner,
                id,
                now,
                &provider,
                &model,
                body.as_deref(),
                actual,
                usage.as_deref(),
            )
        })
    }

    /// Forgets an estimate whose call will not settle.
    #[napi]
    pub fn forget(&mut self, id: f64) {
        if id.is_finite() && id >= 0.0 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            self.inner.forget(id as u64);
        }
    }

    /// Whether a prefix of this prompt has a known token count.
    #[napi(js_name = "knowsPrefixOf")]
    pub fn knows_prefix_of(
        &self,
        env: Env,
        provider: String,
        model: String,
        body: String,
    ) -> napi::Result<bool> {
        js(&env, || {
            tokenwarden_js_abi::knows_prefix_of(&self.inner, &provider, &model, &body)
        })
    }

    /// Records an exact count of a request's whole prompt.
    #[napi(js_name = "recordPromptTokens")]
    pub fn record_prompt_tokens(
        &mut self,
        env: Env,
        provider: String,
        model: String,
        body: String,
        tokens: f64,
    ) -> napi::Result<()> {
        js(&env, || {
            tokenwarden_js_abi::record_prompt_tokens(
                &mut self.inner,
                &provider,
                &model,
                &body,
                tokens,
            )
        })
    }

    /// Units per token by class (prose, code, CJK, document) of a model.
    #[napi]
    pub fn ratios(&self, env: Env, provider: String, model: String) -> napi::Result<Vec<f64>> {
        js(&env, || {
            tokenwarden_js_abi::ratios(&self.inner, &provider, &model)
        })
    }

    /// How many prompt prefixes are remembered as cached.
    #[napi(js_name = "cachedPrefixes")]
    pub fn cached_prefixes(&self) -> u32 {
        u32::try_from(self.inner.cached_prefixes()).unwrap_or(u32::MAX)
    }

    /// The encoding an estimate of this model needs and has not been given, or `null`.
    #[napi(js_name = "needsTokenizer")]
    pub fn needs_tokenizer(
        &self,
        env: Env,
        provider: String,
        model: String,
    ) -> napi::Result<Option<&'static str>> {
        js(&env, || {
            tokenwarden_js_abi::needs_tokenizer(&self.inner, &provider, &model)
        })
    }

    /// Counts with the addon's tokenizer for `encoding` from now on (its ranks are in the
    /// addon).
    #[napi(js_name = "useTokenizer")]
    pub fn use_tokenizer(&mut self, env: Env, encoding: String) -> napi::Result<()> {
        js(&env, || {
            self.inner.use_tokenizer(native_tokenizer(&encoding)?);
            Ok(())
        })
    }
}

/// Model, output reservation and stream flag of a request body's JSON text:
/// `{"model","maxTokens","stream"}` as JSON text.
#[napi(js_name = "callShape")]
pub fn call_shape(env: Env, provider: String, body: String) -> napi::Result<String> {
    js(&env, || tokenwarden_js_abi::call_shape(&provider, &body))
}

/// An error in the provider's format: its body (JSON text), or with `stream` one event of
/// its stream format. The type is the status's unless `type` names one; tokenwarden's
/// fields (a JSON object's text) go under `tokenwarden`.
#[napi(js_name = "errorAnswer")]
pub fn error_answer(
    env: Env,
    provider: String,
    status: f64,
    kind: Option<String>,
    message: String,
    tokenwarden: String,
    stream: bool,
) -> napi::Result<String> {
    js(&env, || {
        tokenwarden_js_abi::error_answer(
            &provider,
            status,
            kind.as_deref(),
            &message,
            &tokenwarden,
            stream,
        )
    })
}

/// How tokenwarden answers a call it stops (`refused`, `gave_up`, `unknown_pool`, `closed`,
/// `restarting`, `unreachable`, `timed_out`): `[status, retry-after s or -1,
/// x-should-retry 1 / 0 or -1]`.
#[napi(js_name = "stopAnswer")]
pub fn stop_answer(env: Env, stop: String, retry_after_ms: Option<f64>) -> napi::Result<Vec<f64>> {
    js(&env, || {
        tokenwarden_js_abi::stop_answer(&stop, retry_after_ms).map(Vec::from)
    })
}

/// The fleets configuration checked (the Worker's `TOKENWARDEN_FLEETS`, or with
/// `serveFile` `tokenwarden serve --config`'s file): the fleets as JSON text, or
/// `invalid_config` naming the place.
#[napi(js_name = "checkFleets")]
pub fn check_fleets(env: Env, text: String, serve_file: bool) -> napi::Result<String> {
    js(&env, || tokenwarden_js_abi::check_fleets(&text, serve_file))
}

/// The proxy's first step for a proxied request (the gateway crate's rule): JSON text of
/// `{ call }` or `{ refused }` (see `tokenwarden_js_abi::proxied_call`).
#[napi(js_name = "proxiedCall")]
pub fn proxied_call(
    env: Env,
    rest: String,
    search: String,
    headers: String,
    secrets: Vec<String>,
    credential: Option<String>,
) -> napi::Result<String> {
    js(&env, || {
        tokenwarden_js_abi::proxied_call(&rest, &search, &headers, &secrets, credential.as_deref())
    })
}

/// The provider a proxied request speaks, for its errors; null when its path cannot be
/// read.
#[napi(js_name = "proxiedProvider")]
#[must_use]
pub fn proxied_provider(rest: String, anthropic_version: bool) -> Option<String> {
    tokenwarden_js_abi::proxied_provider(&rest, anthropic_version)
}

/// An identity rule of the provider crate: `task` (a task's id for its name), `agent` (an
/// agent's unkeyed id for its name) or `failure` (the signature of test `a` and diff `b`).
#[napi(js_name = "identity")]
pub fn identity(env: Env, kind: String, a: String, b: String) -> napi::Result<f64> {
    js(&env, || {
        tokenwarden_js_abi::gateway::identity(&kind, &a, &b)
    })
}

/// The `count_tokens` request for a Messages body's JSON text: its counted fields.
#[napi(js_name = "countTokensBody")]
pub fn count_tokens_body(env: Env, body: String) -> napi::Result<String> {
    js(&env, || tokenwarden_js_abi::count_tokens_body(&body))
}

/// How long to stop counting after a failed `count_tokens` (ms).
#[napi(js_name = "countTokensPause")]
pub fn count_tokens_pause(
    env: Env,
    status: Option<f64>,
    retry_after: Option<String>,
    unix_now_ms: f64,
    pause_ms: f64,
) -> napi::Result<f64> {
    js(&env, || {
        tokenwarden_js_abi::count_tokens_pause(
            status,
            retry_after.as_deref(),
            unix_now_ms,
            pause_ms,
        )
    })
}

/// What the remote driver does with an answer of the limiter: `{"do":"read" | "refused" |
/// "retry" | "unreachable", "afterMs"?}` as JSON text.
#[napi(js_name = "limiterAnswer")]
pub fn limiter_answer(
    env: Env,
    status: f64,
    code: Option<String>,
    retry_after: Option<String>,
    waited_ms: f64,
    timeout_ms: f64,
) -> napi::Result<String> {
    js(&env, || {
        tokenwarden_js_abi::limiter_answer(
            status,
            code.as_deref(),
            retry_after.as_deref(),
            waited_ms,
            timeout_ms,
        )
    })
}

/// A prompt's UTF-8 bytes split at Anthropic's last cache breakpoint:
/// `{"prefix","rest"}` as JSON text.
#[napi(js_name = "promptBytes")]
pub fn prompt_bytes(env: Env, provider: String, body: String) -> napi::Result<String> {
    js(&env, || tokenwarden_js_abi::prompt_bytes(&provider, &body))
}

/// One send of a model call: the core's machine for renewal, timeouts, delivery and the
/// lease's end, with the provider crate's reader of the answer's usage. Events go in by code
/// (`EXCHANGE_EVENTS` in the driver's generated `abi.ts`), body pieces by `push`; each
/// answers bits: 1, actions wait (`actions()`); 2, the deadline moved (`deadline()`).
#[napi]
pub struct Exchange {
    inner: tokenwarden_js_abi::exchange::Exchange,
}

#[napi]
impl Exchange {
    /// Event `code` at `now`, with its `arg` (see `EXCHANGE_EVENTS`).
    #[napi]
    pub fn event(&mut self, env: Env, code: u32, now: f64, arg: f64) -> napi::Result<u32> {
        js(&env, || self.inner.event(code, now, arg))
    }

    /// A piece of the body came at `now`.
    #[napi]
    pub fn push(&mut self, env: Env, now: f64, chunk: Uint8Array) -> napi::Result<u32> {
        js(&env, || self.inner.push(now, &chunk))
    }

    /// When to send the `timeout` event next, on the host's clock; -1 for never.
    #[napi]
    pub fn deadline(&self) -> f64 {
        self.inner.deadline()
    }

    /// The actions waiting, as JSON text (an array; see the driver's `ExchangeAction`).
    #[napi]
    pub fn actions(&mut self) -> String {
        self.inner.actions()
    }
}
