//! A request's prompt as the provider caches it: blocks in cache order (tools, system,
//! messages), each with its text units by class, the tokens its images and documents cost,
//! the hash of the prompt up to it, and its cache lifetime when it is a breakpoint.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::RefCell;

use serde_json::{Map, Value};

use super::Provider;
use super::counter::Counter;
use super::lru::Lru;
use super::media;

/// Content classes, each with its own learned ratio per model: prose, code (or JSON, or
/// command output), CJK text, and a PDF's text.
pub(crate) const PROSE: usize = 0;
pub(crate) const CODE: usize = 1;
pub(crate) const CJK: usize = 2;
pub(crate) const DOC: usize = 3;
pub(crate) const CLASSES: usize = 4;

/// Anthropic's prompt-cache lifetimes: `ttl: "1h"` in `cache_control`, otherwise 5 minutes.
pub(crate) const TTL_5M: u64 = 5 * 60_000;
pub(crate) const TTL_1H: u64 = 60 * 60_000;

/// The tool-use system prompt Anthropic adds to a call with tools (docs, "Tool use",
/// pricing: the Claude 4 models and Sonnet 3.7): 346 tokens with `tool_choice` auto or
/// none, 313 with any or tool.
const TOOL_USE_AUTO: u64 = 346;
const TOOL_USE_FORCED: u64 = 313;

/// Strings longer than this (images, documents) are hashed by a sample, not whole.
pub(crate) const LONG: usize = 64 * 1024;

/// How text is measured before the learned ratios turn it into tokens: its UTF-8 bytes, or
/// a tokenizer's count standing in for the provider's (a proxy).
#[derive(Clone, Copy)]
pub(crate) enum Meter<'a> {
    /// UTF-8 bytes.
    Bytes,
    /// A tokenizer standing in for the provider's (runs cut at 256 characters).
    Proxy(&'a Counter),
    /// The provider's own tokenizer (OpenAI's), exactly.
    Exact(&'a Counter),
}

/// The longest run without whitespace the proxy tokenizes whole.
const PROXY_RUN: usize = 256;

impl Meter<'_> {
    fn units(self, s: &str) -> u64 {
        match self {
            Meter::Bytes => s.len() as u64,
            Meter::Proxy(c) => c.count_runs(s, PROXY_RUN),
            Meter::Exact(c) => c.count(s),
        }
    }

    fn id(self) -> u64 {
        match self {
            Meter::Bytes => 0,
            Meter::Proxy(c) => 1 + c.encoding() as u64,
            Meter::Exact(c) => 3 + c.encoding() as u64,
        }
    }
}

/// What a block costs: text units per class (priced at the learned ratios), and tokens
/// counted by a provider's rule (images, documents).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cost {
    pub(crate) units: [u64; CLASSES],
    pub(crate) tokens: u64,
}

impl Cost {
    fn add(&mut self, c: Cost) {
        for k in 0..CLASSES {
            self.units[k] = self.units[k].saturating_add(c.units[k]);
        }
        self.tokens = self.tokens.saturating_add(c.tokens);
    }

    fn tokens(tokens: u64) -> Cost {
        Cost {
            units: [0; CLASSES],
            tokens,
        }
    }

    /// Its text units summed, plus its tokens.
    pub(crate) fn total(&self) -> u64 {
        self.units.iter().sum::<u64>().saturating_add(self.tokens)
    }
}

/// What costing a prompt needs: the meter, and the memo of media costs (a file in a
/// conversation's history is read once).
pub(crate) struct Costing<'a> {
    pub(crate) meter: Meter<'a>,
    pub(crate) provider: Provider,
    pub(crate) media: &'a RefCell<Lru<u64, Option<Cost>>>,
}

/// The ASCII characters that count toward code: digits, brackets, operators, quotes.
const CODE_CHARS: u128 = {
    let set = b"0123456789{}[]()<>;:=_/\\|\"'`#*&%$@!^~+-";
    let mut m = 0u128;
    let mut i = 0;
    while i < set.len() {
        m |= 1u128 << set[i];
        i += 1;
    }
    m
};

/// A text's class, from one pass over (a sample of) its characters: CJK when a fifth of them
/// are CJK; code (or JSON, or command output) when a tenth are brackets, operators, quotes
/// or digits (prose has few; `.` and `,` do not count); else prose.
pub(crate) fn classify(s: &str) -> usize {
    let step = if s.len() > 8192 {
        s.len().div_ceil(8192)
    } else {
        1
    };
    if s.is_ascii() {
        // Every character a byte: the same sample, without decoding.
        let (mut n, mut sym) = (0usize, 0usize);
        for &b in s.as_bytes().iter().step_by(step) {
            n += 1;
            sym += usize::from(CODE_CHARS & (1u128 << (b & 127)) != 0);
        }
        return if n > 0 && sym * 10 >= n { CODE } else { PROSE };
    }
    let (mut n, mut cjk, mut sym) = (0usize, 0usize, 0usize);
    for c in s.chars().step_by(step) {
        n += 1;
        let u = c as u32;
        if c.is_ascii() {
            if CODE_CHARS & (1u128 << (u & 127)) != 0 {
                sym += 1;
            }
        } else if (0x3040..=0x30ff).contains(&u)
            || (0x3400..=0x9fff).contains(&u)
            || (0xac00..=0xd7af).contains(&u)
            || (0xf900..=0xfaff).contains(&u)
            || (0xff00..=0xffef).contains(&u)
        {
            cjk += 1;
        }
    }
    if n == 0 {
        PROSE
    } else if cjk * 5 >= n {
        CJK
    } else if sym * 10 >= n {
        CODE
    } else {
        PROSE
    }
}

impl Costing<'_> {
    /// A text's cost: its units in its class, or in `class` when given.
    pub(crate) fn text(&self, s: &str, class: Option<usize>) -> Cost {
        let mut c = Cost::default();
        if !s.is_empty() {
            c.units[class.unwrap_or_else(|| classify(s))] = self.meter.units(s);
        }
        c
    }

    /// Text units (and media tokens) of a message `content`: a string or an array of blocks.
    pub(crate) fn content(&self, content: Option<&Value>) -> Cost {
        match content {
            None | Some(Value::Null) => Cost::default(),
            Some(Value::String(s)) => self.text(s, None),
            Some(Value::Array(blocks)) => {
                let mut c = Cost::default();
                for b in blocks {
                    c.add(self.block(b));
                }
                c
            }
            Some(other) => self.text(&json(other), Some(CODE)),
        }
    }

    /// One block of a message (or of the system prompt, or a Responses API item).
    pub(crate) fn block(&self, block: &Value) -> Cost {
        let b = match block {
            Value::String(s) => return self.text(s, None),
            Value::Object(b) => b,
            _ => return Cost::default(),
        };
        if let Some(Value::String(t)) = b.get("text") {
            return self.text(t, None);
        }
        let ty = b.get("type").and_then(Value::as_str).unwrap_or("");
        let s = |k: &str| b.get(k).and_then(Value::as_str);
        match ty {
            // A thinking block is its thinking text: the signature is not prompt text.
            "thinking" => return self.text(s("thinking").unwrap_or(""), None),
            // A tool call is its name and input (its id and type are protocol).
            "tool_use" | "server_tool_use" if s("name").is_some() => {
                let mut c = self.text(s("name").unwrap_or(""), Some(CODE));
                let input = b.get("input").map_or_else(|| "{}".to_string(), json);
                c.add(self.text(&input, Some(CODE)));
                return c;
            }
            "redacted_thinking" => return self.text(s("data").unwrap_or(""), Some(CODE)),
            "tool_result" if b.contains_key("content") => return self.content(b.get("content")),
            "function_call_output" if b.get("output").is_some_and(|o| !o.is_string()) => {
                return self.content(b.get("output"));
            }
            "message" if b.contains_key("content") => return self.content(b.get("content")),
            _ => {}
        }
        if let Some(c) = self.media(b) {
            return c;
        }
        // Anything else: its JSON, a fair upper bound for text parts.
        self.text(&json(block), Some(CODE))
    }

    /// The cost of an image or document block, or `None` when the block is neither
    /// (memoized: a file in a history is read once).
    pub(crate) fn media(&self, b: &Map<String, Value>) -> Option<Cost> {
        let ty = b.get("type").and_then(Value::as_str)?;
        if !matches!(
            ty,
            "image" | "image_url" | "input_image" | "document" | "file" | "input_file"
        ) {
            return None;
        }
        let mut h = Hash::new();
        h.push(&self.meter.id().to_le_bytes());
        h.push(&[self.provider as u8]);
        feed_object(&mut h, b, false);
        let key = h.finish();
        if let Some(known) = self.media.borrow_mut().get(&key) {
            return *known;
        }
        let cost = self.read_media(ty, b);
        self.media.borrow_mut().insert(key, cost);
        cost
    }

    fn read_media(&self, ty: &str, b: &Map<String, Value>) -> Option<Cost> {
        let image = |size: Option<media::Size>, detail: Option<&Value>| {
            Cost::tokens(match self.provider {
                Provider::Openai => {
                    media::openai_image_tokens(size, detail.and_then(Value::as_str) == Some("low"))
                }
                Provider::Anthropic => media::anthropic_image_tokens(size),
            })
        };
        fn str_of<'v>(v: Option<&'v Value>, k: &str) -> Option<&'v str> {
            v.and_then(|v| v.get(k)).and_then(Value::as_str)
        }
        match ty {
            // Anthropic: { source: { type: 'base64', data } | { type: 'url' } | { type: 'file' } }.
            "image" => {
                let size = str_of(b.get("source"), "data")
                    .and_then(|d| media::image_size(&media::decode_base64(d, media::IMAGE_HEAD)));
                Some(image(size, None))
            }
            // OpenAI chat: { image_url: { url, detail } } (or a string).
            "image_url" => {
                let iu = b.get("image_url");
                let url = iu
                    .and_then(Value::as_str)
                    .or_else(|| str_of(iu, "url"))
                    .unwrap_or("");
                Some(image(
                    media::data_url_size(url),
                    iu.and_then(|v| v.get("detail")),
                ))
            }
            // OpenAI Responses: { image_url: 'data:…' | 'https://…', detail }.
            "input_image" => {
                let size = b
                    .get("image_url")
                    .and_then(Value::as_str)
                    .and_then(media::data_url_size);
                Some(image(size, b.get("detail")))
            }
            "document" => {
                let source = b.get("source");
                let sty = str_of(source, "type");
                if sty == Some("text") {
                    if let Some(d) = str_of(source, "data") {
                        return Some(self.text(d, None));
                    }
                }
                if sty == Some("content") {
                    return Some(self.content(source.and_then(|s| s.get("content"))));
                }
                if sty == Some("base64") {
                    if let Some(d) = str_of(source, "data") {
                        return Some(self.pdf(Some(d)));
                    }
                }
                // A URL or file id: the document is not in the request; a page at the least.
                Some(self.pdf(None))
            }
            // OpenAI: { file: { file_data: 'data:application/pdf;base64,…' } } or { file_data }.
            _ => {
                let f = if ty == "file" { b.get("file") } else { None };
                let data = f
                    .map_or_else(|| b.get("file_data"), |f| f.get("file_data"))
                    .and_then(Value::as_str);
                Some(self.pdf(data.map(|d| d.find(',').map_or(d, |i| &d[i + 1..]))))
            }
        }
    }

    /// A PDF: each page as an image by the provider's rule, plus its text in the document
    /// class: the text its content streams show when they are uncompressed, else a guess
    /// from the file's size (three bytes of text per compressed byte, at most
    /// `PDF_PAGE_TEXT_MAX` tokens a page).
    fn pdf(&self, b64: Option<&str>) -> Cost {
        let info = b64.map_or(
            media::PdfInfo {
                pages: 1,
                text: None,
                bytes: 0,
            },
            media::pdf_info,
        );
        let mut cost = Cost::tokens(
            info.pages
                .saturating_mul(media::pdf_page_image(self.provider)),
        );
        cost.units[DOC] = match (&info.text, self.meter) {
            (Some(t), m) => m.units(t),
            (None, m) => {
                let guess = info
                    .bytes
                    .saturating_mul(3)
                    .min(info.pages.saturating_mul(media::PDF_PAGE_TEXT_MAX * 3));
                // The proxy counts about 4 bytes of text a token.
                if matches!(m, Meter::Bytes) {
                    guess
                } else {
                    guess.div_ceil(4)
                }
            }
        };
        cost
    }
}

/// JSON text of a value (serde_json's compact form).
pub(crate) fn json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A digest of a long string: its length, its first and last 4 KB and every 61st byte.
pub(crate) fn digest(s: &str) -> String {
    let b = s.as_bytes();
    let mut h = Hash::new();
    h.push(&b[..4096.min(b.len())]);
    let mut i = 4096;
    while i + 4096 < b.len() {
        h.push(&b[i..=i]);
        i += 61;
    }
    h.push(&b[b.len().saturating_sub(4096)..]);
    format!("\u{0}{}:{:x}", b.len(), h.finish())
}

/// Folds a value's content into `h` part by part (each string, key, number and bracket a
/// push of its own: no JSON is written), long strings (images, documents) by their
/// [`digest`]; with `canonical`, the top-level `cache_control` left out (it moves from turn
/// to turn). Equal values fold alike; an object's keys in the map's order.
///
/// Every part is a one-byte tag of its own (each kind its own byte), then for the kinds that
/// carry one its content as the next push: `N`, `T`, `F`, `[`, `]`, `{`, `}` alone; `U`, `I`,
/// `D` (a number's eight bytes), `S` (a string), `H` (a long string's digest), `K` (a key)
/// with it — so two different values never fold as the same pushes.
fn feed(h: &mut Hash, v: &Value, canonical: bool) {
    match v {
        Value::Null => h.push(b"N"),
        Value::Bool(b) => h.push(if *b { b"T" } else { b"F" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                h.push(b"U");
                h.push(&u.to_le_bytes());
            } else if let Some(i) = n.as_i64() {
                h.push(b"I");
                h.push(&i.to_le_bytes());
            } else {
                h.push(b"D");
                h.push(&n.as_f64().unwrap_or(0.0).to_bits().to_le_bytes());
            }
        }
        Value::String(s) if s.len() > LONG => {
            h.push(b"H");
            h.push(digest(s).as_bytes());
        }
        Value::String(s) => {
            h.push(b"S");
            h.push(s.as_bytes());
        }
        Value::Array(a) => {
            h.push(b"[");
            for x in a {
                feed(h, x, false);
            }
            h.push(b"]");
        }
        Value::Object(o) => feed_object(h, o, canonical),
    }
}

/// [`feed`] of an object.
fn feed_object(h: &mut Hash, o: &Map<String, Value>, canonical: bool) {
    h.push(b"{");
    for (k, x) in o {
        if canonical && k == "cache_control" {
            continue;
        }
        h.push(b"K");
        h.push(k.as_bytes());
        feed(h, x, false);
    }
    h.push(b"}");
}

/// What a piece of the prompt adds to the prefix's hash.
enum Key<'v> {
    /// Words, each pushed as it is.
    Words(&'v [&'v str]),
    /// A block or item ([`feed`]; `canonical` for a block), after its message's role when
    /// it is the first; `stripped` when the provider takes it out (another prefix).
    Block {
        role: Option<&'v str>,
        value: &'v Value,
        canonical: bool,
        stripped: bool,
    },
}

/// A block's `cache_control`, if it has one (`null` is none; any other value is one).
fn cache_control(block: &Value) -> Option<&Value> {
    match block.get("cache_control") {
        None | Some(Value::Null) => None,
        Some(c) => Some(c),
    }
}

fn ttl_of(c: &Value) -> u64 {
    if c.get("ttl").and_then(Value::as_str) == Some("1h") {
        TTL_1H
    } else {
        TTL_5M
    }
}

/// A 64-bit hash of bytes (eight at a time), chained block after block, each block's length
/// folded in after it.
#[derive(Clone, Copy)]
pub(crate) struct Hash(u64);

impl Hash {
    pub(crate) fn new() -> Hash {
        Hash(0xcbf2_9ce4_8422_2325)
    }

    /// Folds `bytes` in, eight at a time (multiply and rotate, as the tokenizer's table
    /// hashes), then their length, so that block boundaries are part of the prefix.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        const M: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(M).rotate_left(29);
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut w = [0u8; 8];
            w[..tail.len()].copy_from_slice(tail);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(M).rotate_left(29);
        }
        self.0 = (h ^ bytes.len() as u64).wrapping_mul(M).rotate_left(29);
    }

    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// One block of the prompt in the provider's cache order.
#[derive(Clone, Debug)]
pub(crate) struct Piece {
    /// Text units per class up to and including this block.
    pub(crate) end: [u64; CLASSES],
    /// Tokens up to and including this block counted by a provider's rule.
    pub(crate) fixed: u64,
    /// The hash of the prompt up to and including this block (content, not `cache_control`).
    pub(crate) key: u64,
    /// This block's cache lifetime when it is a breakpoint, else 0.
    pub(crate) ttl_ms: u64,
}

/// A request's prompt as blocks, with its breakpoints.
#[derive(Clone, Debug, Default)]
pub(crate) struct Prompt {
    pub(crate) pieces: Vec<Piece>,
    /// Text units per class of the whole prompt.
    pub(crate) total: [u64; CLASSES],
    /// Tokens of its images and documents.
    pub(crate) fixed: u64,
    /// Index of the last breakpoint.
    pub(crate) last: Option<usize>,
}

fn is_thinking(b: &Value) -> bool {
    matches!(
        b.get("type").and_then(Value::as_str),
        Some("thinking" | "redacted_thinking")
    )
}

/// How many of the latest assistant messages with thinking keep it in the prompt (`None`:
/// all). Anthropic (docs, "Extended thinking" and "Context editing"): thinking blocks of
/// earlier turns are taken out of the prompt and not billed, except as kept by
/// `context_management`'s `clear_thinking_20251015` edit (`keep: "all"`, or `{type:
/// "thinking_turns", value: N}`; 1 when not given); without that edit the default depends
/// on the model: Claude Opus 4.5 and later, Sonnet 4.6 and later keep all; Opus 4.1, Sonnet
/// 4.5, every Haiku through 4.5 and the Claude 3 models keep the last assistant turn's only.
/// A model not known keeps all (newer models do; counting them errs high).
pub(crate) fn thinking_turns_kept(model: &str, body: &Value) -> Option<u64> {
    let edits = body
        .get("context_management")
        .and_then(|c| c.get("edits"))
        .and_then(Value::as_array);
    for e in edits.into_iter().flatten() {
        let Some(ty) = e.get("type").and_then(Value::as_str) else {
            continue;
        };
        if !ty.starts_with("clear_thinking") {
            continue;
        }
        return match e.get("keep") {
            Some(Value::String(k)) if k == "all" => None,
            Some(k @ Value::Object(_))
                if k.get("type").and_then(Value::as_str) == Some("thinking_turns") =>
            {
                Some(k.get("value").and_then(Value::as_u64).unwrap_or(1))
            }
            _ => Some(1),
        };
    }
    let m = model.to_ascii_lowercase();
    if m.contains("claude-3") || m.contains("claude-instant") || m.contains("claude-2") {
        return Some(1);
    }
    for family in ["opus", "sonnet", "haiku"] {
        let mut from = 0;
        while let Some(p) = m[from..].find(family) {
            let at = from + p + family.len();
            from = at;
            let rest = &m[at..];
            let Some(rest) = rest.strip_prefix('-') else {
                continue;
            };
            let major_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            if major_len == 0 {
                continue;
            }
            let major: u64 = rest[..major_len].parse().unwrap_or(0);
            let after = &rest[major_len..];
            let minor = after
                .strip_prefix('-')
                .map(|a| a.bytes().take_while(u8::is_ascii_digit).count())
                .filter(|&n| (1..=2).contains(&n))
                .map_or(0, |n| after[1..=n].parse().unwrap_or(0));
            let need = if family == "opus" { 5 } else { 6 };
            return if major > 4 || (major == 4 && minor >= need) {
                None
            } else {
                Some(1)
            };
        }
    }
    None
}

/// The prompt of `body` (of `provider`'s API, for `model`) as blocks, measured by `costing`.
pub(crate) fn analyze(costing: &Costing<'_>, model: &str, body: &Value) -> Prompt {
    let provider = costing.provider;
    let mut out = Prompt::default();
    let mut hash = Hash::new();
    hash.push(format!("{}\u{0}{model}", provider.name()).as_bytes());
    // A few bytes (tokens, with the proxy) of framing per message, with its first block.
    let framing_units: u64 = if matches!(costing.meter, Meter::Bytes) {
        8
    } else {
        3
    };
    let mut piece =
        |out: &mut Prompt, cost: Cost, framing: u64, key: Key<'_>, control: Option<&Value>| {
            for k in 0..CLASSES {
                out.total[k] = out.total[k].saturating_add(cost.units[k]);
            }
            out.total[PROSE] = out.total[PROSE].saturating_add(framing);
            out.fixed = out.fixed.saturating_add(cost.tokens);
            match key {
                Key::Words(words) => {
                    for w in words {
                        hash.push(b"W");
                        hash.push(w.as_bytes());
                    }
                }
                Key::Block {
                    role,
                    value,
                    canonical,
                    stripped,
                } => {
                    if let Some(r) = role {
                        hash.push(b"R");
                        hash.push(r.as_bytes());
                    }
                    feed(&mut hash, value, canonical);
                    if stripped {
                        hash.push(b"X");
                    }
                }
            }
            if control.is_some() {
                out.last = Some(out.pieces.len());
            }
            out.pieces.push(Piece {
                end: out.total,
                fixed: out.fixed,
                key: hash.finish(),
                ttl_ms: control.map_or(0, ttl_of),
            });
        };
    // A string is the same prompt as one text block holding it (Anthropic's cache hashes
    // the rendered prompt), so both hash as the block.
    let as_block = |text: &str| {
        let mut o = Map::new();
        o.insert("type".into(), Value::String("text".into()));
        o.insert("text".into(), Value::String(text.into()));
        Value::Object(o)
    };
    fn block(value: &Value) -> Key<'_> {
        Key::Block {
            role: None,
            value,
            canonical: true,
            stripped: false,
        }
    }
    if let Some(Value::Array(tools)) = body.get("tools") {
        if provider == Provider::Anthropic && !tools.is_empty() {
            let choice = body
                .get("tool_choice")
                .and_then(|c| c.get("type"))
                .and_then(Value::as_str);
            let forced = matches!(choice, Some("any" | "tool"));
            let (tokens, key) = if forced {
                (TOOL_USE_FORCED, "tforced")
            } else {
                (TOOL_USE_AUTO, "tauto")
            };
            piece(&mut out, Cost::tokens(tokens), 0, Key::Words(&[key]), None);
        }
        for t in tools {
            let cost = costing.text(&json(t), Some(CODE));
            piece(&mut out, cost, 0, block(t), cache_control(t));
        }
    }
    match body.get("system") {
        Some(Value::String(s)) => {
            let cost = costing.text(s, None);
            piece(&mut out, cost, 0, block(&as_block(s)), None);
        }
        Some(Value::Array(blocks)) => {
            for b in blocks {
                let cost = costing.block(b);
                piece(&mut out, cost, 0, block(b), cache_control(b));
            }
        }
        _ => {}
    }
    // The Responses API: `instructions`, then `input` (a string or a list of items).
    if let Some(Value::String(i)) = body.get("instructions") {
        let cost = costing.text(i, None);
        piece(&mut out, cost, 0, Key::Words(&["i", i]), None);
    }
    let from_input;
    let messages: &[Value] = match (body.get("messages"), body.get("input")) {
        (Some(Value::Array(m)), _) => m,
        (_, Some(Value::String(s))) => {
            let mut o = Map::new();
            o.insert("role".into(), Value::String("user".into()));
            o.insert("content".into(), Value::String(s.clone()));
            from_input = [Value::Object(o)];
            &from_input
        }
        (_, Some(Value::Array(items))) => items,
        _ => &[],
    };
    // Anthropic: which assistant messages' thinking is in the prompt (the latest `kept`).
    let mut thinking_from = 0;
    if provider == Provider::Anthropic {
        if let Some(kept) = thinking_turns_kept(model, body) {
            let mut seen = 0;
            thinking_from = messages.len();
            for (i, m) in messages.iter().enumerate().rev() {
                if seen >= kept {
                    break;
                }
                let has = m.get("role").and_then(Value::as_str) == Some("assistant")
                    && m.get("content")
                        .and_then(Value::as_array)
                        .is_some_and(|c| c.iter().any(is_thinking));
                if has {
                    seen += 1;
                    thinking_from = i;
                }
            }
        }
    }
    for (at, m) in messages.iter().enumerate() {
        let Value::Object(msg) = m else {
            continue;
        };
        // A Responses API item that is not a message (a function call, its output): one block.
        if !msg.contains_key("content") && !msg.contains_key("role") {
            let cost = costing.block(m);
            piece(&mut out, cost, framing_units, block(m), None);
            continue;
        }
        let role = format!(
            "r{}",
            match msg.get("role") {
                Some(Value::String(r)) => r.clone(),
                None => "undefined".into(),
                Some(other) => json(other),
            }
        );
        match msg.get("content") {
            Some(Value::Array(blocks)) => {
                let mut framing = framing_units;
                for (i, b) in blocks.iter().enumerate() {
                    // An earlier turn's thinking the provider takes out: no tokens, another prefix.
                    let stripped = at < thinking_from && is_thinking(b);
                    let key = Key::Block {
                        role: (i == 0).then_some(role.as_str()),
                        value: b,
                        canonical: true,
                        stripped,
                    };
                    let cost = if stripped {
                        Cost::default()
                    } else {
                        costing.block(b)
                    };
                    piece(&mut out, cost, framing, key, cache_control(b));
                    framing = 0;
                }
                if blocks.is_empty() {
                    piece(
                        &mut out,
                        Cost::default(),
                        framing,
                        Key::Words(&[&role]),
                        None,
                    );
                }
            }
            content => {
                let cost = costing.content(content);
                let text;
                let role_only = [role.as_str()];
                let key = match content {
                    Some(Value::String(s)) => {
                        text = as_block(s);
                        Key::Block {
                            role: Some(&role),
                            value: &text,
                            canonical: true,
                            stripped: false,
                        }
                    }
                    // Not a block: its whole value, `cache_control` and all.
                    Some(other) => Key::Block {
                        role: Some(&role),
                        value: other,
                        canonical: false,
                        stripped: false,
                    },
                    None => Key::Words(&role_only),
                };
                piece(&mut out, cost, framing_units, key, cache_control(m));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{Hash, feed};

    fn folded(v: &Value, canonical: bool) -> u64 {
        let mut h = Hash::new();
        feed(&mut h, v, canonical);
        h.finish()
    }

    #[test]
    fn values_fold_apart_unless_equal_and_a_block_s_cache_control_is_left_out() {
        // `false` then a key, against a float whose eight bytes spell that key: the tags
        // keep them apart.
        let f = f64::from_bits(0x4141_4141_4141_4141);
        let a = json!({ "a": false, "AAAAAAAA": "n" });
        let b = json!({ "a": f, "s": null });
        assert_ne!(folded(&a, true), folded(&b, true));
        assert_ne!(folded(&json!(["x"]), true), folded(&json!("x"), true));
        assert_ne!(
            folded(&json!({ "k": 1 }), true),
            folded(&json!({ "k": "1" }), true)
        );
        assert_ne!(folded(&json!(-1), true), folded(&json!(u64::MAX), true));
        // A block with its breakpoint and without it: the same prefix.
        let with =
            json!({ "type": "text", "text": "hi", "cache_control": { "type": "ephemeral" } });
        let without = json!({ "type": "text", "text": "hi" });
        assert_eq!(folded(&with, true), folded(&without, true));
        assert_ne!(folded(&with, false), folded(&without, false));
    }
}
