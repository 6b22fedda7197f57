//! `tokenwarden-core`'s `Coordinator` for JavaScript through wasm-bindgen: the engine for
//! browsers, Node.js and Cloudflare Workers.
//!
//! The class mirrors the Node addon method for method (same names, same shapes, same error
//! codes), so the package's JavaScript driver and `fetch` wrapper run on either engine
//! unchanged: every input crosses as the core's `Input` through `handle`, the hot ones
//! also through the register file. The calling convention both bindings share is the crate
//! `tokenwarden-js-abi`, this build's own conversions (js-sys objects, `bigint`s, errors)
//! are in `convert.rs`. Nothing here reads a clock:
//! every call takes `now`, integer milliseconds on the caller's epoch.

pub mod convert;

use convert::{ArgError, Thrown, to_js, u64_arg, u64_to_js};
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

    /// The host protocol: applies one input at `now` and answers its output. The input is
    /// the core's `Input` as JSON text with camelCase keys (`{"op": "settle", "lease": 3,
    /// "usage": {"inputTokens": 900}}`; integers above 2^53 − 1 written out exactly); the
    /// output is the core's `Output` as an object with camelCase keys (`bigint`s above
    /// 2^53 − 1). Every input the core takes crosses here: a new one needs no change to
    /// this build. Errors throw with the stable codes; state is unchanged.
    #[wasm_bindgen(unchecked_return_type = "Record<string, any>")]
    pub fn handle(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "number | bigint")] now: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] input: JsValue,
    ) -> Result<JsValue, Thrown> {
        let now = u64_arg(&now, "now")?;
        let input = text_arg(&input, "input", "the input's JSON text")?;
        Ok(to_js(&tokenwarden_js_abi::handle(
            &mut self.inner,
            now,
            &input,
        )?)?)
    }

    /// When `handle({op: 'timeout'})` next has work, or `null`.
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

    /// Which API a request is a model call of (`anthropic_messages`, `openai_chat`,
    /// `openai_responses`), or `undefined`: the provider crate's rule, on the path as the
    /// provider's router reads it (`target`: the path, query string allowed).
    #[wasm_bindgen(js_name = modelCall)]
    pub fn model_call(&self, method: &str, target: &str) -> Option<String> {
        tokenwarden_js_abi::model_call(method, target).map(String::from)
    }

    /// Who a call is by its client's session headers (Claude Code's, Codex's) and its
    /// family, under the name `base` when one is given: `{name, parent, root}` as JSON text,
    /// or `null`. `headers`: `name\nvalue\n…`.
    #[wasm_bindgen(js_name = callerIdentity)]
    pub fn caller_identity(&self, headers: &str, base: Option<String>) -> Result<String, Thrown> {
        tokenwarden_js_abi::caller_identity(headers, base.as_deref()).map_err(Thrown::from)
    }

    /// One send of an `api` call (as `modelCall` names it), sent at `now` under a lease
    /// with `leaseLeftMs` to run, with the timeouts `exchangeTimeouts` answers (see
    /// `Exchange`).
    pub fn exchange(
        &self,
        api: &str,
        now: f64,
        lease_left_ms: f64,
        first_byte_ms: f64,
        idle_ms: f64,
    ) -> Result<Exchange, Thrown> {
        tokenwarden_js_abi::exchange::Exchange::sent(
            api,
            now,
            lease_left_ms,
            first_byte_ms,
            idle_ms,
        )
        .map(|inner| Exchange { inner })
        .map_err(Thrown::from)
    }

    /// The upstream timeouts from a host's options (`undefined`: the default, `Infinity`:
    /// none): `[firstByteMs, idleMs]`, `Infinity` for none.
    #[wasm_bindgen(js_name = exchangeTimeouts)]
    pub fn exchange_timeouts(
        &self,
        first_byte_ms: Option<f64>,
        idle_ms: Option<f64>,
    ) -> Result<Vec<f64>, Thrown> {
        tokenwarden_js_abi::exchange::timeouts(first_byte_ms, idle_ms)
            .map(Vec::from)
            .map_err(Thrown::from)
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
        Ok(io::run::request_lease((inner, &mut regs[..], wide))?)
    }

    /// `settle` on the register file: returns 0, or 9 wide.
    #[wasm_bindgen(js_name = settleIo)]
    pub fn settle_io(&mut self) -> Result<i32, Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        Ok(io::run::settle((inner, &mut regs[..], wide))?)
    }

    /// `cancel` on the register file (now, lease).
    #[wasm_bindgen(js_name = cancelIo)]
    pub fn cancel_io(&mut self) -> Result<(), Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        Ok(io::run::cancel((inner, &mut regs[..], wide))?)
    }

    /// `handleTimeout` on the register file (now).
    #[wasm_bindgen(js_name = handleTimeoutIo)]
    pub fn handle_timeout_io(&mut self) -> Result<(), Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        Ok(io::run::handle_timeout((inner, &mut regs[..], wide))?)
    }

    /// `pollEvent` on the register file: the event's code, −1 for none, 9 wide.
    #[wasm_bindgen(js_name = pollEventIo)]
    pub fn poll_event_io(&mut self) -> Result<i32, Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        Ok(io::run::poll_event((inner, &mut regs[..], wide)))
    }

    /// `callLease` on the register file (the request in slots 0 to 9, the call in 10 to
    /// 12): a `STEP_*` code, or 9 wide (then `takeWide()`).
    #[wasm_bindgen(js_name = callLeaseIo)]
    pub fn call_lease_io(&mut self) -> Result<i32, Thrown> {
        let Coordinator {
            inner, wide, regs, ..
        } = self;
        Ok(io::run::call_lease((inner, &mut regs[..], wide))?)
    }

    /// `callResponse` on the register file, the headers the first `headers_len` bytes of
    /// the text buffer (`name\nvalue\n…`): a `STEP_*` code, or 9 wide (then
    /// `takeWide()`).
    #[wasm_bindgen(js_name = callResponseIo)]
    pub fn call_response_io(&mut self, headers_len: usize) -> Result<i32, Thrown> {
        let ResponseParts { inner, wide, io, r } = self.response_parts(headers_len)?;
        Ok(io::run::call_response((inner, io, wide), r)?)
    }

    /// `handleResponse` on the register file, the headers the first `headers_len` bytes of
    /// the text buffer: 0, or 9 wide (then `takeWide()`).
    #[wasm_bindgen(js_name = handleResponseIo)]
    pub fn handle_response_io(&mut self, headers_len: usize) -> Result<i32, Thrown> {
        let ResponseParts { inner, wide, io, r } = self.response_parts(headers_len)?;
        Ok(io::run::handle_response((inner, io, wide), r)?)
    }

    /// The register-file result held back because it needs `bigint`s (code 9), as an
    /// object, or `null`.
    #[wasm_bindgen(js_name = takeWide, unchecked_return_type = "Record<string, any> | null")]
    pub fn take_wide(&mut self) -> Result<JsValue, Thrown> {
        Ok(match self.wide.take() {
            None => JsValue::NULL,
            Some(w) => to_js(&w.json())?,
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

/// Counts tokens as one of OpenAI's encodings does (the provider crate's byte-pair
/// tokenizer), from that encoding's ranks file (`data/<encoding>.bpe` in this package,
/// loaded by the host when first needed: the ranks are not in the `.wasm`).
#[wasm_bindgen]
pub struct Tokenizer {
    inner: std::sync::Arc<tokenwarden_js_abi::provider::bpe::Bpe>,
}

#[wasm_bindgen]
impl Tokenizer {
    /// The tokenizer for `encoding` (`o200k_base` or `cl100k_base`) from its ranks file's
    /// bytes.
    #[wasm_bindgen(constructor)]
    pub fn new(encoding: &str, ranks: &[u8]) -> Result<Tokenizer, Thrown> {
        Ok(Tokenizer {
            inner: std::sync::Arc::new(tokenwarden_js_abi::tokenizer(encoding, ranks)?),
        })
    }

    /// How many tokens `text` is (special-token strings count as ordinary text).
    pub fn count(&self, text: &str) -> u32 {
        u32::try_from(self.inner.count(text)).unwrap_or(u32::MAX)
    }

    /// Its encoding: `o200k_base` or `cl100k_base`.
    pub fn encoding(&self) -> String {
        self.inner.encoding().name().into()
    }
}

/// The provider crate's estimator (`tokenwarden_provider::estimate`): request bodies (JSON
/// text) → the input tokens a lease reserves, learning from each settled call. The
/// driver's `DefaultEstimator` runs on it.
#[wasm_bindgen]
pub struct Estimator {
    inner: tokenwarden_js_abi::provider::estimate::Estimator,
}

#[wasm_bindgen]
impl Estimator {
    /// An estimator from its options' camelCase JSON (`{}`: the defaults).
    #[wasm_bindgen(constructor)]
    pub fn new(options: &str) -> Result<Estimator, Thrown> {
        Ok(Estimator {
            inner: tokenwarden_js_abi::estimator(options)?,
        })
    }

    /// `{"id","inputTokens","cachedPrefixTokens","cachedPrefixConfirmed"}` as JSON text.
    pub fn estimate(
        &mut self,
        now: f64,
        provider: &str,
        model: &str,
        body: &str,
    ) -> Result<String, Thrown> {
        Ok(tokenwarden_js_abi::estimate(
            &mut self.inner,
            now,
            provider,
            model,
            body,
        )?)
    }

    /// Learns from a settled call; `false` when the estimate is no longer remembered and
    /// no body was given (call again with it).
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        id: f64,
        now: f64,
        provider: &str,
        model: &str,
        body: Option<String>,
        actual: f64,
        usage: Option<String>,
    ) -> Result<bool, Thrown> {
        Ok(tokenwarden_js_abi::observe(
            &mut self.inner,
            id,
            now,
            provider,
            model,
            body.as_deref(),
            actual,
            usage.as_deref(),
        )?)
    }

    /// Forgets an estimate whose call will not settle.
    pub fn forget(&mut self, id: f64) {
        if id.is_finite() && id >= 0.0 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            self.inner.forget(id as u64);
        }
    }

    /// Whether a prefix of this prompt has a known token count.
    #[wasm_bindgen(js_name = knowsPrefixOf)]
    pub fn knows_prefix_of(&self, provider: &str, model: &str, body: &str) -> Result<bool, Thrown> {
        Ok(tokenwarden_js_abi::knows_prefix_of(
            &self.inner,
            provider,
            model,
            body,
        )?)
    }

    /// Records an exact count of a request's whole prompt.
    #[wasm_bindgen(js_name = recordPromptTokens)]
    pub fn record_prompt_tokens(
        &mut self,
        provider: &str,
        model: &str,
        body: &str,
        tokens: f64,
    ) -> Result<(), Thrown> {
        Ok(tokenwarden_js_abi::record_prompt_tokens(
            &mut self.inner,
            provider,
            model,
            body,
            tokens,
        )?)
    }

    /// Units per token by class (prose, code, CJK, document) of a model.
    pub fn ratios(&self, provider: &str, model: &str) -> Result<Vec<f64>, Thrown> {
        Ok(tokenwarden_js_abi::ratios(&self.inner, provider, model)?)
    }

    /// How many prompt prefixes are remembered as cached.
    #[wasm_bindgen(js_name = cachedPrefixes)]
    pub fn cached_prefixes(&self) -> u32 {
        u32::try_from(self.inner.cached_prefixes()).unwrap_or(u32::MAX)
    }

    /// The encoding an estimate of this model needs and has not been given, or `undefined`.
    #[wasm_bindgen(js_name = needsTokenizer)]
    pub fn needs_tokenizer(&self, provider: &str, model: &str) -> Result<Option<String>, Thrown> {
        Ok(tokenwarden_js_abi::needs_tokenizer(&self.inner, provider, model)?.map(String::from))
    }

    /// Counts with `tokenizer` from now on.
    #[wasm_bindgen(js_name = useTokenizer)]
    pub fn use_tokenizer(&mut self, tokenizer: &Tokenizer) {
        self.inner.use_tokenizer(tokenizer.inner.clone());
    }
}

/// Model, output reservation and stream flag of a request body's JSON text:
/// `{"model","maxTokens","stream"}` as JSON text.
#[wasm_bindgen(js_name = callShape)]
pub fn call_shape(provider: &str, body: &str) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::call_shape(provider, body)?)
}

/// An error in the provider's format: its body (JSON text), or with `stream` one event of
/// its stream format. The type is the status's unless `type` names one; tokenwarden's
/// fields (a JSON object's text) go under `tokenwarden`.
#[wasm_bindgen(js_name = errorAnswer)]
pub fn error_answer(
    provider: &str,
    status: f64,
    kind: Option<String>,
    message: &str,
    tokenwarden: &str,
    stream: bool,
) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::error_answer(
        provider,
        status,
        kind.as_deref(),
        message,
        tokenwarden,
        stream,
    )?)
}

/// How tokenwarden answers a call it stops (`refused`, `gave_up`, `unknown_pool`, `closed`,
/// `restarting`, `unreachable`, `timed_out`): `[status, retry-after s or -1,
/// x-should-retry 1 / 0 or -1]`.
#[wasm_bindgen(js_name = stopAnswer)]
pub fn stop_answer(stop: &str, retry_after_ms: Option<f64>) -> Result<Vec<f64>, Thrown> {
    Ok(tokenwarden_js_abi::stop_answer(stop, retry_after_ms).map(Vec::from)?)
}

/// The fleets configuration checked (the Worker's `TOKENWARDEN_FLEETS`, or with
/// `serve_file` `tokenwarden serve --config`'s file): the fleets as JSON text, or
/// `invalid_config` naming the place.
#[wasm_bindgen(js_name = checkFleets)]
pub fn check_fleets(text: &str, serve_file: bool) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::check_fleets(text, serve_file)?)
}

/// The proxy's first step for a proxied request (the gateway crate's rule): JSON text of
/// `{ call }` or `{ refused }` (see `tokenwarden_js_abi::proxied_call`).
#[wasm_bindgen(js_name = proxiedCall)]
pub fn proxied_call(
    rest: &str,
    search: &str,
    headers: &str,
    secrets: Vec<String>,
    credential: Option<String>,
) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::proxied_call(
        rest,
        search,
        headers,
        &secrets,
        credential.as_deref(),
    )?)
}

/// The provider a proxied request speaks, for its errors; undefined when its path cannot
/// be read.
#[wasm_bindgen(js_name = proxiedProvider)]
#[must_use]
pub fn proxied_provider(rest: &str, anthropic_version: bool) -> Option<String> {
    tokenwarden_js_abi::proxied_provider(rest, anthropic_version)
}

/// The `count_tokens` request for a Messages body's JSON text: its counted fields.
#[wasm_bindgen(js_name = countTokensBody)]
pub fn count_tokens_body(body: &str) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::count_tokens_body(body)?)
}

/// How long to stop counting after a failed `count_tokens` (ms).
#[wasm_bindgen(js_name = countTokensPause)]
pub fn count_tokens_pause(
    status: Option<f64>,
    retry_after: Option<String>,
    unix_now_ms: f64,
    pause_ms: f64,
) -> Result<f64, Thrown> {
    Ok(tokenwarden_js_abi::count_tokens_pause(
        status,
        retry_after.as_deref(),
        unix_now_ms,
        pause_ms,
    )?)
}

/// What the remote driver does with an answer of the limiter: `{"do":"read" | "refused" |
/// "retry" | "unreachable", "afterMs"?}` as JSON text.
#[wasm_bindgen(js_name = limiterAnswer)]
pub fn limiter_answer(
    status: f64,
    code: Option<String>,
    retry_after: Option<String>,
    waited_ms: f64,
    timeout_ms: f64,
) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::limiter_answer(
        status,
        code.as_deref(),
        retry_after.as_deref(),
        waited_ms,
        timeout_ms,
    )?)
}

/// A prompt's UTF-8 bytes split at Anthropic's last cache breakpoint:
/// `{"prefix","rest"}` as JSON text.
#[wasm_bindgen(js_name = promptBytes)]
pub fn prompt_bytes(provider: &str, body: &str) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::prompt_bytes(provider, body)?)
}

/// One send of a model call: the core's machine for renewal, timeouts, delivery and the
/// lease's end, with the provider crate's reader of the answer's usage. Events go in by code
/// (`EXCHANGE_EVENTS` in the driver's generated `abi.ts`), body pieces by `push`; each
/// answers bits: 1, actions wait (`actions()`); 2, the deadline moved (`deadline()`).
#[wasm_bindgen]
pub struct Exchange {
    inner: tokenwarden_js_abi::exchange::Exchange,
}

#[wasm_bindgen]
impl Exchange {
    /// Event `code` at `now`, with its `arg` (see `EXCHANGE_EVENTS`).
    pub fn event(&mut self, code: u32, now: f64, arg: f64) -> Result<u32, Thrown> {
        self.inner.event(code, now, arg).map_err(Thrown::from)
    }

    /// A piece of the body came at `now`.
    pub fn push(&mut self, now: f64, chunk: &[u8]) -> Result<u32, Thrown> {
        self.inner.push(now, chunk).map_err(Thrown::from)
    }

    /// When to send the `timeout` event next, on the host's clock; -1 for never.
    pub fn deadline(&self) -> f64 {
        self.inner.deadline()
    }

    /// The actions waiting, as JSON text (an array; see the driver's `ExchangeAction`).
    pub fn actions(&mut self) -> String {
        self.inner.actions()
    }
}

/// The members of one quota (the gateway crate's rule, for the edge Worker's Durable
/// Object): a member's input checked against who sends it, and the table of the leases and
/// tickets members hold, kept from the outputs and events the host hands it. Answers that
/// can be refused are JSON text holding `refused` (an HTTP answer), never a throw.
#[wasm_bindgen(js_name = MemberTable)]
pub struct MemberTable {
    inner: tokenwarden_js_abi::members::MemberTable,
}

#[wasm_bindgen(js_class = MemberTable)]
impl MemberTable {
    /// The members of a quota with its pools by name and the lease table stored
    /// (`records()` JSON); `key()` keys agent ids once the fleet is known.
    #[wasm_bindgen(constructor)]
    pub fn new(pools: Vec<String>, records: &str) -> Result<MemberTable, Thrown> {
        Ok(MemberTable {
            inner: tokenwarden_js_abi::members::MemberTable::new(pools, records)?,
        })
    }

    /// The table replaced by `records` (JSON), with the quota's pools.
    pub fn restore(&mut self, pools: Vec<String>, records: &str) -> Result<(), Thrown> {
        Ok(self.inner.restore(pools, records)?)
    }

    /// Keys agent ids by the fleet's secret, with the names stored (`[[id, name], …]` JSON).
    pub fn key(&mut self, secret: &str, names: &str) -> Result<(), Thrown> {
        Ok(self.inner.key(secret, names)?)
    }

    /// A member's request to `route` (`handle`, `lease`, `settle`, …) naming lease or task
    /// `id` in its path (the segment's text), with its body (JSON text), from agent credential `who` or the fleet
    /// secret (`undefined`): `{"input"}` (the core's, camelCase) or `{"refused"}`, as JSON
    /// text.
    pub fn route(
        &mut self,
        route: &str,
        id: Option<String>,
        who: Option<String>,
        body: &str,
    ) -> Result<String, Thrown> {
        Ok(self
            .inner
            .route(route, id.as_deref(), who.as_deref(), body)?)
    }

    /// The output (JSON text) the input `route` last answered had: the table kept.
    pub fn applied(&mut self, output: &str) -> Result<(), Thrown> {
        Ok(self.inner.applied(output)?)
    }

    /// A long poll on `lease` with `timeoutMs` left: `{"hold"}`, `{"status","body"}` or
    /// `{"refused"}` as JSON text.
    pub fn wait(
        &mut self,
        lease: f64,
        who: Option<String>,
        timeout_ms: f64,
    ) -> Result<String, Thrown> {
        Ok(self.inner.wait(lease, who.as_deref(), timeout_ms)?)
    }

    /// The operator's hold body (JSON text) at `now`: `{"input"}` or `{"refused"}`.
    pub fn hold(&self, body: &str, now: f64) -> Result<String, Thrown> {
        Ok(self.inner.hold(body, now)?)
    }

    /// A member's ticket granted from the line.
    pub fn granted(&mut self, lease: f64, expires_at: f64, waited_ms: f64) -> Result<(), Thrown> {
        Ok(self.inner.granted(lease, expires_at, waited_ms)?)
    }

    /// A ticket's promise revised to `eta` at `now`.
    pub fn revised(&mut self, lease: f64, eta: f64, now: f64) -> Result<(), Thrown> {
        Ok(self.inner.revised(lease, eta, now)?)
    }

    /// A lease expired.
    pub fn expired(&mut self, lease: f64) -> Result<(), Thrown> {
        Ok(self.inner.expired(lease)?)
    }

    /// The long polls to answer now (lease ids).
    #[wasm_bindgen(js_name = takeWakes)]
    pub fn take_wakes(&mut self) -> Vec<f64> {
        self.inner.take_wakes()
    }

    /// The id of agent `name` (keyed by the fleet's secret).
    #[wasm_bindgen(js_name = agentId)]
    pub fn agent_id(&mut self, name: &str) -> Result<f64, Thrown> {
        Ok(self.inner.agent_id(name)?)
    }

    /// The name agent `id` was made from, if remembered.
    #[wasm_bindgen(js_name = nameOf)]
    pub fn name_of(&self, id: f64) -> Option<String> {
        self.inner.name_of(id)
    }

    /// Remembers remote driver `client` (`x-tokenwarden-client`) seen at `now`: how many
    /// processes share the quota (at least 1).
    pub fn seen(&mut self, client: Option<String>, now: f64) -> f64 {
        self.inner.seen(client.as_deref(), now)
    }

    /// The metrics (JSON text) with each agent's name (and a subagent's family's) and the
    /// ceilings (JSON text) when given.
    #[wasm_bindgen(js_name = namedMetrics)]
    pub fn named_metrics(&self, metrics: &str, ceilings: Option<String>) -> Result<String, Thrown> {
        Ok(self.inner.named_metrics(metrics, ceilings.as_deref())?)
    }

    /// The names to store since the last call: `[[id, name or null], …]` JSON.
    #[wasm_bindgen(js_name = takeNameWrites)]
    pub fn take_name_writes(&mut self) -> String {
        self.inner.take_name_writes()
    }

    /// The lease table to store: `[[id, record], …]` JSON.
    pub fn records(&self) -> String {
        self.inner.records()
    }

    /// Ends every record (a reset); answers how many there were.
    pub fn clear(&mut self) -> f64 {
        self.inner.clear()
    }
}

/// A quota's recent call events and the ceilings hit (the gateway crate's timeline, for
/// the edge Worker's dashboard overlay and metrics): told the driver's call events, it
/// answers `GET …/timeline` and the metrics' `ceilings` as JSON text.
#[wasm_bindgen(js_name = Timeline)]
pub struct Timeline {
    inner: tokenwarden_js_abi::timeline::Timeline,
}

#[wasm_bindgen(js_class = Timeline)]
impl Timeline {
    /// An empty timeline whose counters start at `now` (Unix ms).
    #[wasm_bindgen(constructor)]
    pub fn new(now: f64) -> Timeline {
        Timeline {
            inner: tokenwarden_js_abi::timeline::Timeline::new(now),
        }
    }

    /// A call starts at `t`: `lease` of `agent` granted in `pool` after `waitedMs` in line.
    pub fn granted(&mut self, t: f64, lease: f64, agent: f64, pool: f64, waited_ms: f64) {
        self.inner.granted(t, lease, agent, pool, waited_ms);
    }

    /// A lease ended unsettled (expired).
    pub fn forget(&mut self, lease: f64) {
        self.inner.forget(lease);
    }

    /// `agent` refused at `t` in `pool` for `reason` (JSON text) until `retryAt` (or never).
    pub fn rejected(&mut self, t: f64, agent: f64, pool: f64, reason: &str, retry_at: Option<f64>) {
        self.inner.rejected(t, agent, pool, reason, retry_at);
    }

    /// A 429 reported at `t` in `pool` for `lease`, with its `retry-after` and the limit
    /// the provider named.
    #[wasm_bindgen(js_name = rateLimited)]
    pub fn rate_limited(
        &mut self,
        t: f64,
        pool: f64,
        lease: Option<f64>,
        retry_after_ms: Option<f64>,
        exceeded: Option<String>,
    ) {
        self.inner
            .rate_limited(t, pool, lease, retry_after_ms, exceeded.as_deref());
    }

    /// A proxied call of `agent` waits `delayMs` from `t` after a 429 (`rate_limited`) or an
    /// overload (`overloaded`).
    pub fn waiting(&mut self, t: f64, agent: f64, pool: f64, delay_ms: f64, cause: &str) {
        self.inner.waiting(t, agent, pool, delay_ms, cause);
    }

    /// Forgets everything (a reset); the counters start again at `now`.
    pub fn clear(&mut self, now: f64) {
        self.inner.clear(now);
    }

    /// Events held.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> usize {
        self.inner.size()
    }

    /// `GET …/timeline`'s answer at `now` (JSON text): pools by `pools` (a JSON array of
    /// names), agents by id as text (for the host to name).
    pub fn view(&self, now: f64, pools: &str) -> String {
        self.inner.view(now, pools)
    }

    /// The ceilings hit, by pool name (JSON text; `pools` a JSON array of names).
    pub fn ceilings(&self, pools: &str) -> String {
        self.inner.ceilings(pools)
    }
}

/// The operator's wait lines (the gateway crate's wait log, for `tokenwarden serve` on
/// workerd): told the driver's call events, it answers the lines to print. A method's
/// `metrics` (JSON text) is read only where `wantsMetrics` said a line needs them.
#[wasm_bindgen(js_name = WaitLog)]
pub struct WaitLog {
    inner: tokenwarden_js_abi::waitlog::WaitLog,
}

#[wasm_bindgen(js_class = WaitLog)]
impl WaitLog {
    /// A log whose first minute starts at `now` (Unix ms).
    #[wasm_bindgen(constructor)]
    pub fn new(now: f64) -> WaitLog {
        WaitLog {
            inner: tokenwarden_js_abi::waitlog::WaitLog::new(now),
        }
    }

    /// Whether a line at `now` about a wait of `waitMs` (0: no wait) reads the metrics.
    #[wasm_bindgen(js_name = wantsMetrics)]
    pub fn wants_metrics(&self, now: f64, wait_ms: f64) -> bool {
        self.inner.wants_metrics(now, wait_ms)
    }

    /// A ticket queued: the lines to print.
    #[allow(clippy::too_many_arguments)]
    pub fn queued(
        &mut self,
        now: f64,
        lease: f64,
        name: &str,
        pool: f64,
        agent: f64,
        eta: f64,
        eta_ms: f64,
        checkpoint: bool,
        metrics: Option<String>,
    ) -> Vec<String> {
        self.inner.queued(
            now,
            lease,
            name,
            pool,
            agent,
            eta,
            eta_ms,
            checkpoint,
            metrics.as_deref(),
        )
    }

    /// A lease granted after `waitedMs` in line.
    pub fn granted(
        &mut self,
        now: f64,
        lease: f64,
        waited_ms: f64,
        metrics: Option<String>,
    ) -> Vec<String> {
        self.inner
            .granted(now, lease, waited_ms, metrics.as_deref())
    }

    /// A call waits `delayMs` after a 429 or an overload (`message`: what it says of it).
    #[allow(clippy::too_many_arguments)]
    pub fn waiting(
        &mut self,
        now: f64,
        name: &str,
        pool: f64,
        agent: f64,
        delay_ms: f64,
        message: &str,
        metrics: Option<String>,
    ) -> Vec<String> {
        self.inner.waiting(
            now,
            name,
            pool,
            agent,
            delay_ms,
            message,
            metrics.as_deref(),
        )
    }

    /// A 429 reported.
    #[wasm_bindgen(js_name = rateLimited)]
    pub fn rate_limited(&mut self, now: f64, metrics: Option<String>) -> Vec<String> {
        self.inner.rate_limited(now, metrics.as_deref())
    }

    /// A refusal.
    pub fn rejected(&mut self, now: f64, metrics: Option<String>) -> Vec<String> {
        self.inner.rejected(now, metrics.as_deref())
    }
}

/// The gateway's rules without state (the routes; fleet secrets, agent credentials, the
/// admin secret, lease handles), one JSON text in and out (see `tokenwarden_js_abi::gateway::gateway_rule`).
#[wasm_bindgen(js_name = gatewayRule)]
pub fn gateway_rule(input: &str) -> Result<String, Thrown> {
    Ok(tokenwarden_js_abi::gateway::gateway_rule(input)?)
}

/// An identity rule of the provider crate: `task` (a task's id for its name), `agent` (an
/// agent's unkeyed id for its name) or `failure` (the signature of test `a` and diff `b`).
#[wasm_bindgen]
pub fn identity(kind: &str, a: &str, b: &str) -> Result<f64, Thrown> {
    Ok(tokenwarden_js_abi::gateway::identity(kind, a, b)?)
}
