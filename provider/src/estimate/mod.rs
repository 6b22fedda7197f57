//! Input-token estimates before a call: the request body → what the lease reserves.
//!
//! - **OpenAI**: the prompt is counted, not guessed: each text with the model's tokenizer
//!   ([`crate::bpe`]: o200k_base, or cl100k_base for GPT-4 and GPT-3.5) plus OpenAI's
//!   published per-message, reply and tool-definition overheads, images and files by the
//!   published rules; what the provider counted beyond that for a prompt is carried over to
//!   the prompt's next turn (its prefix is then exact).
//! - **Anthropic** (no public tokenizer): the **byte rule**: text units (UTF-8 bytes, or
//!   o200k_base tokens as a proxy once that tokenizer is given) times a ratio learned per
//!   model and content class (prose, code, CJK, a PDF's text) from what settled calls
//!   counted (under the proxy, prose, code and a PDF's text start from and move with the
//!   model's learned figure until each is seen in full: one tokenizer against another
//!   differs little between them); a prompt prefix a settled call showed is known exactly (a conversation's
//!   previous turn), so only what is new since is estimated; and the prompt cache followed
//!   as the provider keeps it: after each call the prefix up to each `cache_control`
//!   breakpoint is remembered by content (not by agent) with its lifetime (`ttl`, 5 minutes
//!   or 1 hour), and a later call's prompt is split into a cache **read** (the longest
//!   remembered, unexpired prefix within Anthropic's 20-block lookback of a breakpoint),
//!   a cache write and uncached input (both `input_tokens`).
//!
//! One [`Estimator`] per quota: [`Estimator::estimate`] before each attempt of a call,
//! [`Estimator::observe`] with the call's usage when it settles. Deterministic: its clock is
//! the caller's, its tables bounded and ordered.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::fmt;

use serde_json::Value;

use crate::Usage;
use crate::bpe::{Bpe, Encoding};

mod counter;
mod lru;
mod media;
mod openai;
mod prompt;

use counter::Counter;
use lru::Lru;
use prompt::{CLASSES, Cost, Costing, Meter, Prompt};

/// Whose rules a request is counted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provider {
    /// Anthropic's Messages API.
    Anthropic,
    /// OpenAI's Chat Completions and Responses APIs.
    Openai,
}

impl Provider {
    /// `anthropic` or `openai`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::Openai => "openai",
        }
    }

    /// The provider named `name` (as [`Provider::name`] spells it).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Provider> {
        match name {
            "anthropic" => Some(Provider::Anthropic),
            "openai" => Some(Provider::Openai),
            _ => None,
        }
    }
}

/// How an [`Estimator`] starts and learns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Bytes per token assumed for a model not seen yet (default 3: low on purpose, English
    /// prose runs near 4; an early over-estimate queues a little, an under-estimate risks a
    /// 429).
    pub initial_bytes_per_token: f64,
    /// With the proxy tokenizer: provider tokens per proxy token for a model not seen yet
    /// (default 1.2: Claude's tokenizers split text into 16–30 % more tokens than
    /// o200k_base, prose the least and code the most).
    pub initial_tokens_per_proxy_token: f64,
    /// Weight of each new observation in the moving average, in (0, 1] (default 0.3).
    pub learning_rate: f64,
    /// Estimates are multiplied by this safety factor, at least 1 (default 1.02).
    pub safety: f64,
    /// How many cached prompt prefixes (and known prompt counts) are remembered, least
    /// recently used forgotten first (default 4096).
    pub cached_prefixes: usize,
    /// A prefix below this many tokens is not remembered as cached (default 1024: Anthropic
    /// caches nothing shorter).
    pub min_cache_tokens: u64,
    /// Count with the tokenizers given ([`Estimator::use_tokenizer`]; default true): OpenAI
    /// exactly, Anthropic with o200k_base as a proxy. False: the byte rule for both.
    pub tokenizer: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            initial_bytes_per_token: 3.0,
            initial_tokens_per_proxy_token: 1.2,
            learning_rate: 0.3,
            safety: 1.02,
            cached_prefixes: 4096,
            min_cache_tokens: 1024,
            tokenizer: true,
        }
    }
}

/// An option out of its range: which, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionsError {
    /// The option, as the bindings name it (`initialBytesPerToken`, …).
    pub field: &'static str,
    /// What it must be.
    pub message: &'static str,
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.message)
    }
}

impl core::error::Error for OptionsError {}

impl Options {
    /// Whether every option is in its range.
    ///
    /// # Errors
    ///
    /// The first option that is not, by name.
    pub fn check(&self) -> Result<(), OptionsError> {
        let bad = |field, message| Err(OptionsError { field, message });
        let positive = |x: f64| x > 0.0 && x.is_finite();
        if !positive(self.initial_bytes_per_token) {
            return bad("initialBytesPerToken", "must be a positive number");
        }
        if !positive(self.initial_tokens_per_proxy_token) {
            return bad("initialTokensPerProxyToken", "must be a positive number");
        }
        if !(self.learning_rate > 0.0 && self.learning_rate <= 1.0) {
            return bad("learningRate", "must be in (0, 1]");
        }
        if !(self.safety >= 1.0 && self.safety.is_finite()) {
            return bad("safety", "must be a number of at least 1");
        }
        if self.cached_prefixes == 0 {
            return bad("cachedPrefixes", "must be a positive integer");
        }
        Ok(())
    }
}

/// An estimate, in the coordinator's terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Prompt tokens outside the cached prefix.
    pub input_tokens: u64,
    /// Prompt tokens in the prefix the provider may serve from its prompt cache.
    pub cached_prefix_tokens: u64,
    /// The estimator saw the provider cache this very prefix (by content, for any agent)
    /// and its lifetime has not run out: the coordinator charges it as a cache read even on
    /// an agent's first call.
    pub cached_prefix_confirmed: bool,
}

/// How far before a breakpoint Anthropic looks for an earlier cached prefix: "up to about
/// 20 blocks before your explicit breakpoint".
const LOOKBACK_BLOCKS: usize = 20;

/// A prefix within this long of its expiry is counted cold: the call may still wait.
const EXPIRY_MARGIN_MS: u64 = 30_000;

/// Models whose ratios are remembered, least recently used forgotten first.
const MODELS: usize = 1024;

/// Estimates remembered for their observation (one per attempt of a call in flight).
const ASKED: usize = 65_536;

/// A model's learned ratios: tokens per unit by class, and how much of each class it has
/// seen.
#[derive(Clone, Copy, Debug)]
struct Ratio {
    t: [f64; CLASSES],
    seen: [f64; CLASSES],
}

impl Ratio {
    /// The ratios to count with: a class this model has not shown yet takes `prior`, or
    /// with `shared` (the proxy tokenizer's rule) the mean of the [`LATIN`] classes it has
    /// shown, weighted by how much of each it has seen. Under the proxy the ratio is one
    /// tokenizer's count against another's, which moves little between prose, code and a
    /// document's text, so the model's own learned figure is a better first guess for them
    /// than the figure for any model. Not for CJK, where vocabularies differ most (on the
    /// corpus cl100k_base counts 0.99–1.06 × o200k_base for those three, 1.12–1.30 for
    /// CJK), and not under the byte rule, where bytes per token differ several times.
    fn factors(&self, prior: f64, shared: bool) -> [f64; CLASSES] {
        let seen: f64 = LATIN.iter().map(|&k| self.seen[k]).sum();
        let fill = if shared && seen > 0.0 {
            LATIN.iter().map(|&k| self.t[k] * self.seen[k]).sum::<f64>() / seen
        } else {
            prior
        };
        let mut t = self.t;
        for (k, x) in t.iter_mut().enumerate() {
            if self.seen[k] <= 0.0 {
                *x = if LATIN.contains(&k) { fill } else { prior };
            }
        }
        t
    }
}

/// The classes whose proxy ratios go together ([`Ratio::factors`]): prose, code, a PDF's
/// text.
const LATIN: [usize; 3] = [prompt::PROSE, prompt::CODE, prompt::DOC];

/// A prompt prefix the provider has cached, as an earlier call showed.
#[derive(Clone, Copy, Debug)]
struct Cached {
    tokens: u64,
    ttl_ms: u64,
    expires_at: u64,
}

/// The byte rule over one meter (bytes, or the proxy tokenizer): learned ratios, known
/// prefixes, the prompt cache.
struct ByteRule {
    initial: f64,
    /// Whether a class not seen yet takes the model's other classes' figure
    /// ([`Ratio::factors`]): the proxy tokenizer's rule.
    shared: bool,
    ratios: Lru<u64, Ratio>,
    cache: Lru<u64, Cached>,
    known: Lru<u64, u64>,
}

/// What an estimate saw, kept for its observation.
struct Asked {
    provider: Provider,
    by: By,
    at: u64,
}

enum By {
    /// The byte rule (`proxy`: over the proxy tokenizer): the prompt, the piece read from
    /// the cache, the longest prefix known exactly (piece and tokens).
    Rule {
        proxy: bool,
        model_key: u64,
        prompt: Prompt,
        read: Option<usize>,
        known: Option<(usize, u64)>,
    },
    /// The tokenizer's count, and the hash of the whole prompt.
    Counted { counted: u64, key: Option<u64> },
}

fn model_key(provider: Provider, model: &str) -> u64 {
    let mut h = prompt::Hash::new();
    h.push(provider.name().as_bytes());
    h.push(model.as_bytes());
    h.finish()
}

/// ⌈x⌉ of a non-negative figure as a count.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn ceil(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let c = libm_ceil(x);
    if c >= 9.0e15 {
        9_007_199_254_740_991
    } else {
        c as u64
    }
}

/// `f64::ceil` without `std`.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
fn libm_ceil(x: f64) -> f64 {
    if x.abs() >= 4_503_599_627_370_496.0 {
        return x;
    }
    let t = x as i64 as f64;
    if t < x { t + 1.0 } else { t }
}

/// Round half away from zero, as `Math.round` for non-negative figures.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn round(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    ceil(x - 0.5)
}

#[allow(clippy::cast_precision_loss)]
fn f(x: u64) -> f64 {
    x as f64
}

impl ByteRule {
    fn new(initial: f64, shared: bool, capacity: usize) -> ByteRule {
        ByteRule {
            initial,
            shared,
            ratios: Lru::new(MODELS),
            cache: Lru::new(capacity),
            known: Lru::new(capacity),
        }
    }

    fn factors(&self, key: u64) -> [f64; CLASSES] {
        self.ratios.peek(&key).map_or([self.initial; CLASSES], |r| {
            r.factors(self.initial, self.shared)
        })
    }

    /// Tokens of text units at ratios `t` beyond `from` (no safety margin).
    fn tokens(t: &[f64; CLASSES], units: &[u64; CLASSES], from: Option<&[u64; CLASSES]>) -> f64 {
        (0..CLASSES)
            .map(|k| f(units[k].saturating_sub(from.map_or(0, |x| x[k]))) * t[k])
            .sum()
    }

    /// The longest prefix of `prompt` whose tokens are known exactly.
    fn known_prefix(&mut self, prompt: &Prompt) -> Option<(usize, u64)> {
        for (i, p) in prompt.pieces.iter().enumerate().rev() {
            if let Some(&tokens) = self.known.get(&p.key) {
                return Some((i, tokens));
            }
        }
        None
    }

    /// Learns from `tokens` counted for the text units `units` (beyond `from`, a known
    /// prefix): each class's ratio scaled toward what the count shows, by its share of the
    /// estimate (all of it until the class has been seen in full, else `rate` of it); under
    /// the proxy, a [`LATIN`] class not yet seen in full takes the LATIN classes' share.
    #[allow(clippy::too_many_arguments)]
    fn learn(
        &mut self,
        key: u64,
        rate: f64,
        units: &[u64; CLASSES],
        from: Option<&[u64; CLASSES]>,
        tokens: f64,
        min_tokens: f64,
    ) {
        let current = self.ratios.peek(&key).copied();
        let t = self.factors(key);
        let mut parts = [0.0; CLASSES];
        let mut predicted = 0.0;
        for k in 0..CLASSES {
            let p = f(units[k].saturating_sub(from.map_or(0, |x| x[k]))) * t[k];
            parts[k] = p.max(0.0);
            predicted += parts[k];
        }
        if !(tokens > 0.0
            && predicted > 0.0
            && predicted >= min_tokens
            && (tokens / predicted).is_finite())
        {
            return;
        }
        // One call's scale is bounded: a count far off moves a ratio by 4× at most.
        let scale = (tokens / predicted).clamp(0.25, 4.0);
        // A class seen for the first time moves from the figure it was counted at.
        let mut r = Ratio {
            t,
            seen: current.map_or([0.0; CLASSES], |r| r.seen),
        };
        // Under the proxy, a LATIN class not yet seen in full takes the LATIN classes'
        // share of the correction: the question beside a PDF moves with the document's.
        let latin: f64 = LATIN.iter().map(|&k| parts[k]).sum::<f64>() / predicted;
        for (k, part) in parts.iter().enumerate() {
            let w = part / predicted;
            if w == 0.0 {
                continue;
            }
            let step = if r.seen[k] >= 1.0 {
                w * rate
            } else if self.shared && LATIN.contains(&k) {
                latin
            } else {
                w
            };
            r.t[k] *= 1.0 + step * (scale - 1.0);
            r.seen[k] += w;
        }
        self.ratios.insert(key, r);
    }
}

/// tokenwarden's estimator (see the module doc). Give it the tokenizers with
/// [`Estimator::use_tokenizer`]; without them both providers go by the byte rule.
pub struct Estimator {
    options: Options,
    bytes: ByteRule,
    /// The byte rule over o200k_base as a proxy (Anthropic), once that tokenizer is given.
    proxy: Option<ByteRule>,
    counters: BTreeMap<Encoding, Counter>,
    /// OpenAI: what the provider counted beyond the tokenizer's count, by the hash of the
    /// prompt it was for.
    residuals: Lru<u64, i64>,
    media: RefCell<Lru<u64, Option<Cost>>>,
    asked: Lru<u64, Asked>,
    next: u64,
    /// The latest bodies estimated from their text, with what was made of them: a call
    /// asked again (after a refusal, a 429, a wait) is not parsed or analyzed again.
    recent: VecDeque<Recent>,
}

/// A body estimated from its text, and what its estimates made of it.
struct Recent {
    text: String,
    parsed: Parsed,
}

/// A request body parsed once for its estimates (see [`Estimator::estimate_parsed`]): a
/// host that keeps it for the life of a call does not parse or analyze the body again when
/// the call is asked again (after a wait, a refusal, a 429).
pub struct Parsed {
    body: Value,
    memo: Memo,
}

impl fmt::Debug for Parsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parsed").finish_non_exhaustive()
    }
}

impl Parsed {
    /// `text` parsed.
    ///
    /// # Errors
    ///
    /// The text is not a JSON object (`Err` with why).
    pub fn new(text: &str) -> Result<Parsed, String> {
        match serde_json::from_str::<Value>(text) {
            Ok(body @ Value::Object(_)) => Ok(Parsed {
                body,
                memo: Memo::default(),
            }),
            Ok(_) => Err("the request body must be a JSON object".into()),
            Err(e) => Err(alloc::format!("the request body is not JSON: {e}")),
        }
    }

    /// The body (a JSON object).
    #[must_use]
    pub fn body(&self) -> &Value {
        &self.body
    }
}

/// What estimates of one body made of it, for the next estimate of the same body: its
/// prompts analyzed (per meter and model) and its OpenAI counts (per encoding).
#[derive(Default)]
struct Memo {
    prompts: Vec<(bool, u64, Prompt)>,
    counted: Vec<(Encoding, u64)>,
}

/// How many bodies are remembered with their text, and the longest remembered.
const RECENT: usize = 4;
const RECENT_BYTES: usize = 1 << 20;

impl fmt::Debug for Estimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Estimator")
            .field("options", &self.options)
            .field("tokenizers", &self.counters.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Media costs remembered (a file in a conversation's history is read once).
const MEDIA_COSTS: usize = 256;

impl Estimator {
    /// An estimator with `options`.
    ///
    /// # Errors
    ///
    /// An option out of its range ([`Options::check`]).
    pub fn new(options: Options) -> Result<Estimator, OptionsError> {
        options.check()?;
        Ok(Estimator {
            options,
            bytes: ByteRule::new(
                1.0 / options.initial_bytes_per_token,
                false,
                options.cached_prefixes,
            ),
            proxy: None,
            counters: BTreeMap::new(),
            residuals: Lru::new(options.cached_prefixes),
            media: RefCell::new(Lru::new(MEDIA_COSTS)),
            asked: Lru::new(ASKED),
            next: 1,
            recent: VecDeque::new(),
        })
    }

    /// Counts with `bpe` from now on: OpenAI models of its encoding exactly, and (for
    /// o200k_base) Anthropic prompts with it as a proxy for Claude's tokenizer.
    pub fn use_tokenizer(&mut self, bpe: Arc<Bpe>) {
        let e = bpe.encoding();
        self.counters.insert(e, Counter::new(bpe));
        if e == Encoding::O200kBase && self.proxy.is_none() {
            self.proxy = Some(ByteRule::new(
                self.options.initial_tokens_per_proxy_token,
                true,
                self.options.cached_prefixes,
            ));
        }
    }

    /// Whether it counts with `encoding`'s tokenizer.
    #[must_use]
    pub fn has_tokenizer(&self, encoding: Encoding) -> bool {
        self.counters.contains_key(&encoding)
    }

    /// Which tokenizer an estimate of `provider`'s `model` needs, if it needs one it has
    /// not been given (the host loads it, then estimates).
    #[must_use]
    pub fn needs_tokenizer(&self, provider: Provider, model: &str) -> Option<Encoding> {
        if !self.options.tokenizer {
            return None;
        }
        let e = match provider {
            Provider::Openai => Encoding::for_model(model),
            Provider::Anthropic => Encoding::O200kBase,
        };
        (!self.has_tokenizer(e)).then_some(e)
    }

    fn anthropic_proxy(&self) -> bool {
        self.options.tokenizer && self.proxy.is_some()
    }

    fn rule(&mut self, proxy: bool) -> &mut ByteRule {
        match (proxy, self.proxy.as_mut()) {
            (true, Some(p)) => p,
            _ => &mut self.bytes,
        }
    }

    fn analyze(&self, proxy: bool, provider: Provider, model: &str, body: &Value) -> Prompt {
        let meter = match (proxy, self.counters.get(&Encoding::O200kBase)) {
            (true, Some(c)) => Meter::Proxy(c),
            _ => Meter::Bytes,
        };
        let costing = Costing {
            meter,
            provider,
            media: &self.media,
        };
        prompt::analyze(&costing, model, body)
    }

    /// The estimate of a request: `body` is the parsed JSON body of `provider`'s API for
    /// `model`, `now` the caller's clock (ms; when a remembered prefix expires). Returns the
    /// estimate and its id, for [`Estimator::observe`].
    pub fn estimate(
        &mut self,
        now: u64,
        provider: Provider,
        model: &str,
        body: &Value,
    ) -> (u64, Estimate) {
        self.estimate_with(now, provider, model, body, &mut Memo::default())
    }

    /// [`Estimator::estimate`] of a body given as its JSON text: the latest few bodies (up to
    /// 1 MB each) are remembered with what was made of them, so a call asked again (the
    /// same text: after a refusal, a 429, a wait) is not parsed or analyzed again.
    ///
    /// # Errors
    ///
    /// The text is not a JSON object (`Err` with why).
    pub fn estimate_text(
        &mut self,
        now: u64,
        provider: Provider,
        model: &str,
        text: &str,
    ) -> Result<(u64, Estimate), String> {
        let mut recent = match self.recent.iter().position(|r| r.text == text) {
            Some(i) => self.recent.remove(i).unwrap_or_else(|| unreachable!()),
            None => Recent {
                text: String::new(),
                parsed: Parsed::new(text)?,
            },
        };
        let out = self.estimate_parsed(now, provider, model, &mut recent.parsed);
        if text.len() <= RECENT_BYTES {
            if recent.text.is_empty() {
                recent.text = text.into();
            }
            self.recent.push_back(recent);
            while self.recent.len() > RECENT {
                self.recent.pop_front();
            }
        }
        Ok(out)
    }

    /// [`Estimator::estimate`] of a body its caller parsed once ([`Parsed::new`]) and keeps
    /// while it asks again: what was made of it is kept in `parsed`.
    pub fn estimate_parsed(
        &mut self,
        now: u64,
        provider: Provider,
        model: &str,
        parsed: &mut Parsed,
    ) -> (u64, Estimate) {
        self.estimate_with(now, provider, model, &parsed.body, &mut parsed.memo)
    }

    fn estimate_with(
        &mut self,
        now: u64,
        provider: Provider,
        model: &str,
        body: &Value,
        memo: &mut Memo,
    ) -> (u64, Estimate) {
        let id = self.next;
        self.next += 1;
        let (asked, estimate) = match provider {
            Provider::Openai
                if self.options.tokenizer && self.has_tokenizer(Encoding::for_model(model)) =>
            {
                self.counted(model, body, memo)
            }
            _ => {
                let proxy = provider == Provider::Anthropic && self.anthropic_proxy();
                self.by_rule(proxy, now, provider, model, body, memo)
            }
        };
        self.asked.insert(
            id,
            Asked {
                provider,
                by: asked,
                at: now,
            },
        );
        (id, estimate)
    }

    /// The prompt of `body` for `model` by the meter `proxy` says, from `memo` when an
    /// earlier estimate of the same body made it.
    fn prompt_memo(
        &self,
        proxy: bool,
        provider: Provider,
        model: &str,
        body: &Value,
        memo: &mut Memo,
    ) -> Prompt {
        let key = model_key(provider, model);
        if let Some((_, _, p)) = memo
            .prompts
            .iter()
            .find(|(x, k, _)| *x == proxy && *k == key)
        {
            return p.clone();
        }
        let p = self.analyze(proxy, provider, model, body);
        memo.prompts.push((proxy, key, p.clone()));
        p
    }

    fn counted(&mut self, model: &str, body: &Value, memo: &mut Memo) -> (By, Estimate) {
        let e = Encoding::for_model(model);
        let counted = match (
            memo.counted.iter().find(|(x, _)| *x == e),
            self.counters.get(&e),
        ) {
            (Some(&(_, n)), _) => n,
            (None, Some(c)) => {
                let n = openai::PromptCounter {
                    counter: c,
                    costing: Costing {
                        meter: Meter::Exact(c),
                        provider: Provider::Openai,
                        media: &self.media,
                    },
                }
                .prompt(body);
                memo.counted.push((e, n));
                n
            }
            (None, None) => 0,
        };
        let prompt = self.prompt_memo(false, Provider::Openai, model, body, memo);
        let mut residual = 0i64;
        for p in prompt.pieces.iter().rev() {
            if let Some(&r) = self.residuals.get(&p.key) {
                residual = r;
                break;
            }
        }
        let input = i128::from(counted) + i128::from(residual);
        let estimate = Estimate {
            input_tokens: u64::try_from(input.max(0)).unwrap_or(u64::MAX),
            cached_prefix_tokens: 0,
            cached_prefix_confirmed: false,
        };
        let key = prompt.pieces.last().map(|p| p.key);
        (By::Counted { counted, key }, estimate)
    }

    fn by_rule(
        &mut self,
        proxy: bool,
        now: u64,
        provider: Provider,
        model: &str,
        body: &Value,
        memo: &mut Memo,
    ) -> (By, Estimate) {
        let prompt = self.prompt_memo(proxy, provider, model, body, memo);
        let key = model_key(provider, model);
        let safety = self.options.safety;
        let rule = self.rule(proxy);
        let t = rule.factors(key);
        let (mut read, mut cached) = (None, 0);
        if let (Provider::Anthropic, Some(last)) = (provider, prompt.last) {
            // The breakpoint at or after each block (for the lookback), scanning back.
            let mut breakpoint = last;
            for i in (0..=last).rev() {
                let p = &prompt.pieces[i];
                if p.ttl_ms > 0 {
                    breakpoint = i;
                }
                if breakpoint - i >= LOOKBACK_BLOCKS {
                    continue;
                }
                match rule.cache.peek(&p.key) {
                    Some(hit) if hit.expires_at.saturating_sub(EXPIRY_MARGIN_MS) > now => {
                        read = Some(i);
                        cached = hit.tokens;
                        break;
                    }
                    _ => {}
                }
            }
        }
        let up_to = read.map(|i| &prompt.pieces[i]);
        let mut input = ceil(ByteRule::tokens(&t, &prompt.total, up_to.map(|p| &p.end)) * safety)
            .saturating_add(prompt.fixed - up_to.map_or(0, |p| p.fixed));
        let known = rule
            .known_prefix(&prompt)
            .filter(|&(at, _)| read.is_none_or(|r| at >= r));
        if let Some((at, tokens)) = known {
            // Exact up to the known prefix, the ratio for what follows; the cache read is
            // part of the prefix.
            let p = &prompt.pieces[at];
            let total = tokens
                .saturating_add(ceil(
                    ByteRule::tokens(&t, &prompt.total, Some(&p.end)) * safety,
                ))
                .saturating_add(prompt.fixed - p.fixed);
            input = total.saturating_sub(cached);
        }
        let estimate = Estimate {
            input_tokens: input,
            cached_prefix_tokens: cached,
            cached_prefix_confirmed: cached > 0,
        };
        (
            By::Rule {
                proxy,
                model_key: key,
                prompt,
                read,
                known,
            },
            estimate,
        )
    }

    /// Learns from a settled call: `id` its estimate's, `actual_input` every prompt token
    /// the provider counted (cached or not), `usage` the whole usage (with it, Anthropic's
    /// cache read + cache write are the tokens up to the last breakpoint, exactly). An id
    /// no longer remembered (an estimate never observed for a long time) is analyzed again
    /// from `body` to learn from; without `body` it is then `false` (nothing learned: call
    /// again with it), else `true`.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        id: u64,
        now: u64,
        provider: Provider,
        model: &str,
        body: Option<&Value>,
        actual_input: u64,
        usage: Option<&Usage>,
    ) -> bool {
        let asked = match self.asked.remove(&id) {
            Some(a) => a,
            None => {
                let Some(body) = body else {
                    return false;
                };
                let proxy = provider == Provider::Anthropic && self.anthropic_proxy();
                let prompt = self.analyze(proxy, provider, model, body);
                Asked {
                    provider,
                    by: By::Rule {
                        proxy,
                        model_key: model_key(provider, model),
                        prompt,
                        read: None,
                        known: None,
                    },
                    at: now,
                }
            }
        };
        if actual_input == 0 {
            return true;
        }
        match asked.by {
            By::Counted { counted, key } => {
                if let Some(key) = key {
                    let r =
                        i64::try_from(i128::from(actual_input) - i128::from(counted)).unwrap_or(0);
                    self.residuals.insert(key, r);
                }
            }
            By::Rule {
                proxy,
                model_key: key,
                prompt,
                read,
                known,
            } => self.observe_rule(
                proxy,
                key,
                asked.provider,
                asked.at,
                &prompt,
                read,
                known,
                actual_input,
                usage,
            ),
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn observe_rule(
        &mut self,
        proxy: bool,
        key: u64,
        provider: Provider,
        at: u64,
        prompt: &Prompt,
        read: Option<usize>,
        known: Option<(usize, u64)>,
        actual: u64,
        usage: Option<&Usage>,
    ) {
        let (rate, min_cache) = (self.options.learning_rate, self.options.min_cache_tokens);
        let rule = self.rule(proxy);
        let pieces = &prompt.pieces;
        // The ratios before this observation place earlier prefixes (below).
        let t = rule.factors(key);
        // The text's share: what the provider counted beyond the images' and documents' rule.
        let text_tokens = f(actual) - f(prompt.fixed);
        match known {
            Some((k, tokens)) if k + 1 < pieces.len() => {
                let p = &pieces[k];
                let beyond = f(actual) - f(tokens) - f(prompt.fixed - p.fixed);
                rule.learn(key, rate, &prompt.total, Some(&p.end), beyond, 200.0);
            }
            Some(_) => {}
            None => rule.learn(key, rate, &prompt.total, None, text_tokens, 0.0),
        }
        // The whole prompt is now known exactly, and so is the next turn's prefix.
        if let Some(whole) = pieces.last() {
            rule.known.insert(whole.key, actual);
        }
        if provider != Provider::Anthropic {
            return;
        }
        let to_last = usage.map_or(0, |u| {
            u.cache_read_input_tokens
                .saturating_add(u.cache_creation_input_tokens)
        });
        let exact_last = prompt
            .last
            .filter(|_| to_last > 0 && to_last <= actual)
            .map(|_| to_last);
        if let (Some(exact), Some(last)) = (exact_last, prompt.last) {
            if last + 1 < pieces.len() {
                rule.known.insert(pieces[last].key, exact);
            }
        }
        // The provider cached the prompt up to each breakpoint (written, or read and renewed)
        // when it took the call in: this call's own tokens per unit place each prefix.
        let all = ByteRule::tokens(&t, &prompt.total, None);
        let remember = |rule: &mut ByteRule, i: usize, ttl_ms: u64| {
            let p = &pieces[i];
            let tokens = match exact_last {
                Some(exact) if Some(i) == prompt.last => exact,
                _ if text_tokens > 0.0 && all > 0.0 => {
                    p.fixed + round(text_tokens * ByteRule::tokens(&t, &p.end, None) / all)
                }
                _ => round(f(actual) * f(p.fixed) / f(prompt.fixed.max(1))),
            };
            if tokens < min_cache {
                return;
            }
            rule.cache.insert(
                p.key,
                Cached {
                    tokens,
                    ttl_ms,
                    expires_at: at.saturating_add(ttl_ms),
                },
            );
        };
        if let Some(r) = read {
            if let Some(ttl) = rule.cache.peek(&pieces[r].key).map(|h| h.ttl_ms) {
                remember(rule, r, ttl);
            }
        }
        for (i, p) in pieces.iter().enumerate() {
            if p.ttl_ms > 0 {
                remember(rule, i, p.ttl_ms);
            }
        }
    }

    /// Forgets an estimate that will not be observed (its call never settled).
    pub fn forget(&mut self, id: u64) {
        self.asked.remove(&id);
    }

    /// Whether some prefix of this Anthropic request's prompt (or all of it) has a known
    /// token count, from a settled call's usage or [`Estimator::record_prompt_tokens`].
    #[must_use]
    pub fn knows_prefix_of(&self, provider: Provider, model: &str, body: &Value) -> bool {
        let proxy = provider == Provider::Anthropic && self.anthropic_proxy();
        let prompt = self.analyze(proxy, provider, model, body);
        let rule = if proxy {
            self.proxy.as_ref().unwrap_or(&self.bytes)
        } else {
            &self.bytes
        };
        prompt.pieces.iter().any(|p| rule.known.contains(&p.key))
    }

    /// Records an exact count of a request's whole prompt (Anthropic's `count_tokens`):
    /// estimates of this prompt, and of every later prompt that begins with it, use it, and
    /// the model's ratios learn from it as from a settled call.
    pub fn record_prompt_tokens(
        &mut self,
        provider: Provider,
        model: &str,
        body: &Value,
        tokens: u64,
    ) {
        let proxy = provider == Provider::Anthropic && self.anthropic_proxy();
        let prompt = self.analyze(proxy, provider, model, body);
        let Some(last) = prompt.pieces.last() else {
            return;
        };
        if tokens == 0 {
            return;
        }
        let rate = self.options.learning_rate;
        let key = model_key(provider, model);
        let rule = self.rule(proxy);
        rule.learn(
            key,
            rate,
            &prompt.total,
            None,
            f(tokens) - f(prompt.fixed),
            0.0,
        );
        rule.known.insert(last.key, tokens);
    }

    /// The learned units per token of `provider`'s `model` by class (prose, code, CJK, a
    /// PDF's text): bytes per token under the byte rule, proxy tokens per provider token
    /// with the proxy (the initial figure until a call settles; with the proxy, a class the
    /// model has not shown yet at the mean of the classes it has).
    #[must_use]
    pub fn ratios(&self, provider: Provider, model: &str) -> [f64; CLASSES] {
        let proxy = provider == Provider::Anthropic && self.anthropic_proxy();
        let rule = if proxy {
            self.proxy.as_ref().unwrap_or(&self.bytes)
        } else {
            &self.bytes
        };
        rule.factors(model_key(provider, model)).map(|t| 1.0 / t)
    }

    /// How many prompt prefixes are remembered as cached.
    #[must_use]
    pub fn cached_prefixes(&self) -> usize {
        self.bytes.cache.len() + self.proxy.as_ref().map_or(0, |p| p.cache.len())
    }
}

/// A request's prompt in UTF-8 bytes (a PDF's, its text's), split at the Anthropic
/// prompt-cache breakpoint: everything up to and including the last block marked
/// `cache_control` (tools, then system, then messages) is the cacheable prefix, the rest
/// follows it (OpenAI: no prefix). Cacheable, not cached: an estimate counts as a read only
/// what an earlier call cached.
#[must_use]
pub fn prompt_bytes(provider: Provider, body: &Value) -> (u64, u64) {
    let media = RefCell::new(Lru::new(MEDIA_COSTS));
    let costing = Costing {
        meter: Meter::Bytes,
        provider,
        media: &media,
    };
    let p = prompt::analyze(&costing, "", body);
    let total: u64 = p.total.iter().sum();
    let prefix = match (provider, p.last) {
        (Provider::Anthropic, Some(last)) => p.pieces[last].end.iter().sum(),
        _ => 0,
    };
    (prefix, total - prefix)
}

/// Every prompt token a usage counts (uncached, cache writes and cache reads).
#[must_use]
pub fn prompt_tokens(u: &Usage) -> u64 {
    u.input_tokens
        .saturating_add(u.cache_creation_input_tokens)
        .saturating_add(u.cache_read_input_tokens)
}

/// The fields of a request body the call needs besides its prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallShape {
    /// The model named.
    pub model: String,
    /// The output reservation: Anthropic's `max_tokens`; OpenAI's `max_output_tokens`
    /// (Responses), else `max_completion_tokens`, else `max_tokens` (Chat Completions);
    /// [`DEFAULT_MAX_TOKENS`] when none is a non-negative integer.
    pub max_tokens: u64,
    /// Whether the answer is a stream.
    pub stream: bool,
}

/// The output reservation when a request names none (OpenAI allows that).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Model, output reservation and stream flag of a parsed request body.
#[must_use]
pub fn call_shape(provider: Provider, body: &Value) -> CallShape {
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .into();
    let raw = match provider {
        Provider::Anthropic => body.get("max_tokens"),
        Provider::Openai => body
            .get("max_output_tokens")
            .filter(|v| !v.is_null())
            .or_else(|| body.get("max_completion_tokens").filter(|v| !v.is_null()))
            .or_else(|| body.get("max_tokens")),
    };
    let max_tokens = raw
        .and_then(Value::as_u64)
        .filter(|&n| n <= crate::usage::MAX_COUNT)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    CallShape {
        model,
        max_tokens,
        stream: body.get("stream").and_then(Value::as_bool) == Some(true),
    }
}
