//! A provider's answer → what the call used: the usage of a JSON body or of a
//! server-sent-event stream, read incrementally as the answer passes through, with bounded
//! memory; and for a call cut short, what it showed before it broke.
//!
//! One reader per answer ([`UsageReader`]): [`push`](UsageReader::push) each piece of the
//! body as it arrives, [`end`](UsageReader::end) at its clean end, then
//! [`usage`](UsageReader::usage) is the usage the call reported in full, or `None` when
//! the answer did not report it (cut short, an error inside the stream, malformed counts):
//! the host then ends the lease by the core's rule for an interrupted call with
//! [`seen`](UsageReader::seen).

use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;
use serde_json::{Map, Value};

/// What a call used, as the core takes it (Anthropic's names; an OpenAI usage is given
/// with its cached tokens apart from the uncached input).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

impl From<Usage> for tokenwarden_core::Usage {
    fn from(u: Usage) -> tokenwarden_core::Usage {
        tokenwarden_core::Usage {
            input_tokens: u.input_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            output_tokens: u.output_tokens,
        }
    }
}

impl From<tokenwarden_core::Usage> for Usage {
    fn from(u: tokenwarden_core::Usage) -> Usage {
        Usage {
            input_tokens: u.input_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            output_tokens: u.output_tokens,
        }
    }
}

/// The largest count a usage figure is taken as: 2^53 − 1, the engines' limit (an absurd
/// figure is still a call that ran; the core clamps a settle to a window of the limit).
pub const MAX_COUNT: u64 = (1 << 53) - 1;

/// Bodies up to this size are parsed whole for their usage.
pub const WHOLE_BODY_BYTES: usize = 1 << 20;

/// Of a larger body only this much of its end is kept: the top-level `usage` is there
/// (Anthropic and OpenAI both put it at the end, before at most a few short members).
pub const BODY_TAIL_BYTES: usize = 64 << 10;

/// The most of one server-sent-event line, or of one event's data, a reader holds: a
/// longer one is skipped (counted as text).
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Whose answer format a reader follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Anthropic's Messages API.
    Anthropic,
    /// OpenAI's Chat Completions and Responses APIs (their events tell them apart).
    Openai,
}

impl From<crate::Api> for Format {
    fn from(api: crate::Api) -> Format {
        match api {
            crate::Api::AnthropicMessages => Format::Anthropic,
            crate::Api::OpenaiChat | crate::Api::OpenaiResponses => Format::Openai,
        }
    }
}

/// Reads one answer's usage as it passes through (see the module documentation).
#[derive(Debug)]
pub enum UsageReader {
    /// A JSON body.
    Body(BodyReader),
    /// A server-sent-event stream.
    Stream(StreamReader),
}

impl UsageReader {
    /// A reader for an answer in `format`, a stream (`text/event-stream`) or a JSON body.
    #[must_use]
    pub fn new(format: Format, stream: bool) -> UsageReader {
        if stream {
            UsageReader::Stream(StreamReader::new(format))
        } else {
            UsageReader::Body(BodyReader::new(format))
        }
    }

    /// Feeds the next piece of the answer's body.
    pub fn push(&mut self, chunk: &[u8]) {
        match self {
            UsageReader::Body(b) => b.push(chunk),
            UsageReader::Stream(s) => s.push(chunk),
        }
    }

    /// The body ended cleanly (a stream's last event without a trailing blank line is
    /// dispatched).
    pub fn end(&mut self) {
        match self {
            UsageReader::Body(b) => b.end(),
            UsageReader::Stream(s) => s.end(),
        }
    }

    /// After [`end`](UsageReader::end): the usage the call reported in full, or `None`.
    #[must_use]
    pub fn usage(&self) -> Option<Usage> {
        match self {
            UsageReader::Body(b) => b.usage,
            UsageReader::Stream(s) => s.complete().then_some(s.usage).flatten(),
        }
    }

    /// What a call cut short showed before it broke, for the core's rule for an
    /// interrupted call: a stream's reported usage with its output at least half the text
    /// it carried (rounded up: about two characters a token), or `None` (a JSON body shows
    /// nothing until it is whole).
    #[must_use]
    pub fn seen(&self) -> Option<Usage> {
        match self {
            UsageReader::Body(_) => None,
            UsageReader::Stream(s) => {
                let mut u = s.usage.unwrap_or_default();
                u.output_tokens = u.output_tokens.max(s.text_units.div_ceil(2)).min(MAX_COUNT);
                Some(u)
            }
        }
    }
}

/// A non-streamed JSON body's usage, with bounded memory: a body up to
/// [`WHOLE_BODY_BYTES`] is parsed whole; of a larger one only the last
/// [`BODY_TAIL_BYTES`] are kept, and the top-level `usage` member is found there.
#[derive(Debug)]
pub struct BodyReader {
    format: Format,
    held: VecDeque<u8>,
    total: usize,
    usage: Option<Usage>,
}

impl BodyReader {
    fn new(format: Format) -> BodyReader {
        BodyReader {
            format,
            held: VecDeque::new(),
            total: 0,
            usage: None,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total = self.total.saturating_add(chunk.len());
        if self.total <= WHOLE_BODY_BYTES {
            self.held.extend(chunk);
            return;
        }
        let keep = &chunk[chunk.len().saturating_sub(BODY_TAIL_BYTES)..];
        self.held.extend(keep);
        let excess = self.held.len().saturating_sub(BODY_TAIL_BYTES);
        self.held.drain(..excess);
    }

    fn end(&mut self) {
        let bytes = self.held.make_contiguous();
        self.usage = if self.total <= WHOLE_BODY_BYTES {
            // Only the top-level `usage` is built; the rest (the answer's text) is skipped.
            serde_json::from_slice::<fast::Body>(bytes)
                .ok()
                .and_then(|b| b.usage)
                .and_then(|u| usage_object(self.format, &u))
        } else {
            last_top_level_member(bytes, "usage")
                .and_then(|member| serde_json::from_slice::<Value>(member).ok())
                .and_then(|u| usage_object(self.format, &u))
        };
    }
}

/// The usage of a complete JSON answer (its top-level `usage`), or `None` when it has none
/// or it is malformed (a required count missing; a count that is a string, negative or
/// not a number).
#[must_use]
pub fn usage_of_body(format: Format, body: &Value) -> Option<Usage> {
    usage_object(format, body.as_object()?.get("usage")?)
}

fn usage_object(format: Format, u: &Value) -> Option<Usage> {
    let u = u.as_object()?;
    match format {
        Format::Anthropic => anthropic_usage(u, None),
        Format::Openai => openai_usage(u),
    }
}

/// A count as a provider reported it.
enum Count {
    Absent,
    Bad,
    Is(u64),
}

/// A token count: a number at least 0, floored and clamped to [`MAX_COUNT`]; `null` or
/// missing is absent; anything else (a string, a negative number) is malformed.
fn count(v: Option<&Value>) -> Count {
    match v {
        None | Some(Value::Null) => Count::Absent,
        Some(Value::Number(n)) => {
            if let Some(u) = n.as_u64() {
                Count::Is(u.min(MAX_COUNT))
            } else {
                match n.as_f64() {
                    // A float at least 0 (an integer past u64 arrives as one), floored.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    Some(f) if f >= 0.0 => Count::Is(if f >= MAX_COUNT as f64 {
                        MAX_COUNT
                    } else {
                        f as u64
                    }),
                    _ => Count::Bad,
                }
            }
        }
        Some(_) => Count::Bad,
    }
}

/// A required count.
fn required(v: Option<&Value>) -> Option<u64> {
    match count(v) {
        Count::Is(n) => Some(n),
        Count::Absent | Count::Bad => None,
    }
}

/// An optional count: absent as `fallback`, malformed as `None`.
fn optional(v: Option<&Value>, fallback: u64) -> Option<u64> {
    match count(v) {
        Count::Is(n) => Some(n),
        Count::Absent => Some(fallback),
        Count::Bad => None,
    }
}

/// Anthropic's usage object: input and output required (output as `output`'s value when
/// the object has none: `message_start` reports none yet), cache counts 0 when absent.
fn anthropic_usage(u: &Map<String, Value>, output: Option<u64>) -> Option<Usage> {
    let output_tokens = match (u.get("output_tokens"), output) {
        (None, Some(o)) => o,
        (v, _) => required(v)?,
    };
    Some(Usage {
        input_tokens: required(u.get("input_tokens"))?,
        cache_creation_input_tokens: optional(u.get("cache_creation_input_tokens"), 0)?,
        cache_read_input_tokens: optional(u.get("cache_read_input_tokens"), 0)?,
        output_tokens,
    })
}

/// OpenAI's usage object: Chat Completions' (`prompt_tokens`, `completion_tokens`,
/// `prompt_tokens_details.cached_tokens`) or, without `prompt_tokens` but with
/// `input_tokens`, the Responses API's (`input_tokens`, `output_tokens`,
/// `input_tokens_details.cached_tokens`; reasoning tokens are in `output_tokens`). Both
/// counts are required. The cached tokens are in the prompt count: taken apart here.
fn openai_usage(u: &Map<String, Value>) -> Option<Usage> {
    let given = |k: &str| u.get(k).is_some_and(|v| !v.is_null());
    let responses = !given("prompt_tokens") && given("input_tokens");
    let (p, c, d) = if responses {
        ("input_tokens", "output_tokens", "input_tokens_details")
    } else {
        (
            "prompt_tokens",
            "completion_tokens",
            "prompt_tokens_details",
        )
    };
    let prompt = required(u.get(p))?;
    let completion = required(u.get(c))?;
    let cached = match u.get(d) {
        None | Some(Value::Null) => 0,
        Some(Value::Object(details)) => optional(details.get("cached_tokens"), 0)?,
        Some(_) => return None,
    };
    let cached = cached.min(prompt);
    Some(Usage {
        input_tokens: prompt - cached,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: cached,
        output_tokens: completion,
    })
}

/// Follows a server-sent-event stream and collects its usage: Anthropic's
/// `message_start` (input and cache counts) and `message_delta` (cumulative output, and in
/// newer versions the input counts again), OpenAI's final chunk with `usage`
/// (`stream_options.include_usage`), the Responses API's `response.completed`,
/// `response.incomplete` or `response.failed` (the usage of the response it carries). It
/// counts the text generated (text, reasoning, tool arguments) in UTF-16 units, for a
/// call that ends without its usage. The stream is complete when its final usage arrived
/// and no error event came (a `response.failed` without usage is one).
#[derive(Debug)]
pub struct StreamReader {
    format: Format,
    /// The line being read (without its end).
    line: Vec<u8>,
    /// The rest of an over-long line is being skipped.
    skipping: bool,
    event: String,
    data: Vec<u8>,
    has_data: bool,
    final_usage: bool,
    usage: Option<Usage>,
    /// `usage` holds the input counts (from `message_start`, or a `message_delta` that
    /// repeated them); without them a `message_delta` is not final.
    input_known: bool,
    errored: bool,
    /// UTF-16 units of generated text seen (and of skipped lines).
    text_units: u64,
}

impl StreamReader {
    fn new(format: Format) -> StreamReader {
        StreamReader {
            format,
            line: Vec::new(),
            skipping: false,
            event: String::new(),
            data: Vec::new(),
            has_data: false,
            final_usage: false,
            usage: None,
            input_known: false,
            errored: false,
            text_units: 0,
        }
    }

    fn complete(&self) -> bool {
        self.final_usage && !self.errored && self.usage.is_some()
    }

    fn push(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let (piece, after) = rest.split_at(nl);
            rest = &after[1..];
            if self.skipping {
                self.skipping = false;
                self.text_units = self.text_units.saturating_add(utf16_units(piece));
                self.line.clear();
                continue;
            }
            let mut line = core::mem::take(&mut self.line);
            line.extend_from_slice(piece);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.line_done(&line);
            line.clear();
            self.line = line;
        }
        if self.skipping {
            self.text_units = self.text_units.saturating_add(utf16_units(rest));
        } else if self.line.len() + rest.len() > MAX_EVENT_BYTES {
            // A line this long is no usage report: skip to its end, counting it as text.
            let held = utf16_units(&self.line).saturating_add(utf16_units(rest));
            self.text_units = self.text_units.saturating_add(held);
            self.line.clear();
            self.skipping = true;
        } else {
            self.line.extend_from_slice(rest);
        }
    }

    fn end(&mut self) {
        if !self.line.is_empty() && !self.skipping {
            let line = core::mem::take(&mut self.line);
            self.line_done(&line);
        }
        self.line.clear();
        self.skipping = false;
        self.line_done(b"");
    }

    fn line_done(&mut self, line: &[u8]) {
        if line.is_empty() {
            if self.has_data {
                let data = core::mem::take(&mut self.data);
                self.dispatch(&data);
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(c) => (&line[..c], &line[c + 1..]),
            None => (line, &[][..]),
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        match name {
            b"event" => self.event = String::from_utf8_lossy(value).into_owned(),
            b"data" => {
                if self.data.len() + value.len() + 1 > MAX_EVENT_BYTES {
                    let held = utf16_units(&self.data).saturating_add(utf16_units(value));
                    self.text_units = self.text_units.saturating_add(held);
                    self.data.clear();
                    self.has_data = false;
                    return;
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, data: &[u8]) {
        if data == b"[DONE]" {
            return;
        }
        // Most events carry a piece of text and nothing else: read those without building
        // the whole event (see `fast`).
        if self.fast(data) {
            return;
        }
        let Ok(Value::Object(json)) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        match self.format {
            Format::Anthropic => {
                let event = if self.event.is_empty() {
                    json.get("type").and_then(Value::as_str).unwrap_or("")
                } else {
                    self.event.as_str()
                };
                let event = String::from(event);
                self.anthropic(&event, &json);
            }
            Format::Openai => self.openai(&json),
        }
    }

    /// An event that only carries text (Anthropic's `content_block_delta`, a Chat
    /// Completions chunk without usage or error, a Responses API `….delta` event), read
    /// into a typed skeleton that skips everything else without allocating: its text
    /// counted. `false` when the event is another kind or its shape is not the expected one
    /// (it is then read in full, as any event).
    fn fast(&mut self, data: &[u8]) -> bool {
        let units = match self.format {
            Format::Anthropic => {
                if self.event != "content_block_delta" {
                    return false;
                }
                let Ok(e) = serde_json::from_slice::<fast::AnthropicDelta<'_>>(data) else {
                    return false;
                };
                let Some(d) = e.delta else { return true };
                // The first of text, partial_json and thinking that is given.
                match d.text.or(d.partial_json).or(d.thinking) {
                    Some(fast::Text::Str(t)) => utf16_units(t.as_bytes()),
                    Some(fast::Text::Other(_)) | None => 0,
                }
            }
            Format::Openai => {
                let Ok(e) = serde_json::from_slice::<fast::OpenaiChunk<'_>>(data) else {
                    return false;
                };
                match e.kind {
                    Some(kind) => {
                        if !kind.ends_with(".delta") || kind.contains("audio") {
                            return false;
                        }
                        match e.delta {
                            Some(fast::Text::Str(t)) => utf16_units(t.as_bytes()),
                            Some(fast::Text::Other(_)) | None => 0,
                        }
                    }
                    None => {
                        if e.usage.is_some() || e.error.is_some() {
                            return false;
                        }
                        let mut n = 0u64;
                        for c in e.choices.iter().flatten() {
                            if let Some(fast::Text::Str(t)) =
                                c.delta.as_ref().and_then(|d| d.content.as_ref())
                            {
                                n = n.saturating_add(utf16_units(t.as_bytes()));
                            }
                        }
                        n
                    }
                }
            }
        };
        self.text_units = self.text_units.saturating_add(units);
        true
    }

    fn anthropic(&mut self, event: &str, json: &Map<String, Value>) {
        match event {
            "message_start" => {
                let Some(u) = json
                    .get("message")
                    .and_then(Value::as_object)
                    .and_then(|m| m.get("usage"))
                    .and_then(Value::as_object)
                else {
                    return;
                };
                if let Some(start) = anthropic_usage(u, Some(0)) {
                    self.usage = Some(start);
                    self.input_known = true;
                }
            }
            "message_delta" => {
                let Some(u) = json.get("usage").and_then(Value::as_object) else {
                    return;
                };
                // Cumulative counts; newer API versions repeat the input counts here too.
                let base = self.usage;
                let Some(output_tokens) = required(u.get("output_tokens")) else {
                    return;
                };
                let input = match (count(u.get("input_tokens")), base) {
                    (Count::Is(n), _) => Some(n),
                    (Count::Absent, Some(b)) if self.input_known => Some(b.input_tokens),
                    (Count::Absent, _) => None,
                    (Count::Bad, _) => return,
                };
                let b = base.unwrap_or_default();
                let (Some(creation), Some(read)) = (
                    optional(
                        u.get("cache_creation_input_tokens"),
                        b.cache_creation_input_tokens,
                    ),
                    optional(u.get("cache_read_input_tokens"), b.cache_read_input_tokens),
                ) else {
                    return;
                };
                match input {
                    Some(input_tokens) => {
                        self.usage = Some(Usage {
                            input_tokens,
                            cache_creation_input_tokens: creation,
                            cache_read_input_tokens: read,
                            output_tokens,
                        });
                        self.final_usage = true;
                        self.input_known = true;
                    }
                    // No input count anywhere (`message_start`'s missing or malformed):
                    // the output so far, not final.
                    None => {
                        self.usage = Some(Usage {
                            output_tokens,
                            ..Usage::default()
                        });
                    }
                }
            }
            "content_block_delta" => {
                let Some(delta) = json.get("delta").and_then(Value::as_object) else {
                    return;
                };
                let text = ["text", "partial_json", "thinking"]
                    .iter()
                    .find_map(|k| delta.get(*k).filter(|v| !v.is_null()));
                if let Some(Value::String(t)) = text {
                    self.text_units = self.text_units.saturating_add(utf16_units(t.as_bytes()));
                }
            }
            "error" => self.errored = true,
            _ => {}
        }
    }

    fn openai(&mut self, json: &Map<String, Value>) {
        // The Responses API's events say their type; Chat Completions chunks do not.
        if let Some(Value::String(t)) = json.get("type") {
            let t = t.clone();
            self.responses(&t, json);
            return;
        }
        if json.get("error").is_some_and(|e| !e.is_null()) {
            self.errored = true;
        }
        // A usage that is not an object, or has malformed counts, is no report.
        if let Some(usage) = json
            .get("usage")
            .and_then(Value::as_object)
            .and_then(openai_usage)
        {
            self.usage = Some(usage);
            self.final_usage = true;
        }
        if let Some(Value::Array(choices)) = json.get("choices") {
            for c in choices {
                if let Some(Value::String(content)) = c
                    .as_object()
                    .and_then(|c| c.get("delta"))
                    .and_then(Value::as_object)
                    .and_then(|d| d.get("content"))
                {
                    let units = utf16_units(content.as_bytes());
                    self.text_units = self.text_units.saturating_add(units);
                }
            }
        }
    }

    /// One Responses API event: its terminal events carry the response with its usage
    /// (`response.completed`; `response.incomplete`, cut short by `max_output_tokens` or a
    /// content filter, still a full report; `response.failed`, a report when it has
    /// usage); `error` ends the stream without one. Deltas of text, reasoning and tool
    /// arguments count as text seen.
    fn responses(&mut self, kind: &str, json: &Map<String, Value>) {
        match kind {
            "response.completed" | "response.incomplete" | "response.failed" => {
                let u = json
                    .get("response")
                    .and_then(Value::as_object)
                    .and_then(|r| r.get("usage"));
                match u {
                    Some(Value::Object(u)) => {
                        if let Some(usage) = openai_usage(u) {
                            self.usage = Some(usage);
                            self.final_usage = true;
                        }
                    }
                    None | Some(Value::Null) if kind == "response.failed" => self.errored = true,
                    _ => {}
                }
            }
            "error" => self.errored = true,
            k if k.ends_with(".delta") && !k.contains("audio") => {
                if let Some(Value::String(d)) = json.get("delta") {
                    self.text_units = self.text_units.saturating_add(utf16_units(d.as_bytes()));
                }
            }
            _ => {}
        }
    }
}

/// Typed skeletons of the events that only carry text (see `StreamReader::fast`): fields
/// not named are skipped without being built; a field of another shape than expected fails
/// the read, and the event is then read in full.
mod fast {
    use alloc::borrow::Cow;
    use alloc::vec::Vec;
    use serde::Deserialize;
    use serde::de::IgnoredAny;

    /// A piece of text: a string, or anything else (not counted).
    pub(super) enum Text<'a> {
        Str(Cow<'a, str>),
        Other(IgnoredAny),
    }

    impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(TextVisitor)
        }
    }

    /// A string as it is (borrowed where it has no escapes), anything else skipped.
    struct TextVisitor;

    impl<'de> serde::de::Visitor<'de> for TextVisitor {
        type Value = Text<'de>;

        fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
            Ok(Text::Str(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
            Ok(Text::Str(Cow::Owned(v.into())))
        }
        fn visit_bool<E>(self, _: bool) -> Result<Text<'de>, E> {
            Ok(Text::Other(IgnoredAny))
        }
        fn visit_i64<E>(self, _: i64) -> Result<Text<'de>, E> {
            Ok(Text::Other(IgnoredAny))
        }
        fn visit_u64<E>(self, _: u64) -> Result<Text<'de>, E> {
            Ok(Text::Other(IgnoredAny))
        }
        fn visit_f64<E>(self, _: f64) -> Result<Text<'de>, E> {
            Ok(Text::Other(IgnoredAny))
        }
        fn visit_unit<E>(self) -> Result<Text<'de>, E> {
            Ok(Text::Other(IgnoredAny))
        }
        fn visit_none<E>(self) -> Result<Text<'de>, E> {
            Ok(Text::Other(IgnoredAny))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Text<'de>, A::Error> {
            while a.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Text::Other(IgnoredAny))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Text<'de>, A::Error> {
            while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Text::Other(IgnoredAny))
        }
    }

    /// A whole JSON answer: its `usage`, if it is an object with one.
    #[derive(Deserialize)]
    pub(super) struct Body {
        pub(super) usage: Option<serde_json::Value>,
    }

    #[derive(Deserialize)]
    pub(super) struct AnthropicDelta<'a> {
        #[serde(borrow)]
        pub(super) delta: Option<TextDelta<'a>>,
    }

    #[derive(Deserialize)]
    pub(super) struct TextDelta<'a> {
        #[serde(borrow)]
        pub(super) text: Option<Text<'a>>,
        #[serde(borrow)]
        pub(super) partial_json: Option<Text<'a>>,
        #[serde(borrow)]
        pub(super) thinking: Option<Text<'a>>,
    }

    #[derive(Deserialize)]
    pub(super) struct OpenaiChunk<'a> {
        #[serde(rename = "type", borrow)]
        pub(super) kind: Option<Cow<'a, str>>,
        #[serde(borrow)]
        pub(super) delta: Option<Text<'a>>,
        pub(super) usage: Option<IgnoredAny>,
        pub(super) error: Option<IgnoredAny>,
        #[serde(borrow)]
        pub(super) choices: Option<Vec<Choice<'a>>>,
    }

    #[derive(Deserialize)]
    pub(super) struct Choice<'a> {
        #[serde(borrow)]
        pub(super) delta: Option<ChoiceDelta<'a>>,
    }

    #[derive(Deserialize)]
    pub(super) struct ChoiceDelta<'a> {
        #[serde(borrow)]
        pub(super) content: Option<Text<'a>>,
    }
}

/// The UTF-16 units of UTF-8 text (as JavaScript counts a string's length): one per
/// character, two for one outside the Basic Multilingual Plane. Bytes that are not valid
/// UTF-8 count as the replacement character each lead byte would decode to.
fn utf16_units(bytes: &[u8]) -> u64 {
    let mut n = 0u64;
    for &b in bytes {
        if b & 0xC0 != 0x80 {
            n += 1;
        }
        if b >= 0xF0 {
            n += 1;
        }
    }
    n
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// The JSON text of the value of the last top-level member `key` of the object `text` ends
/// with, where `text` may be only the end of that object (it may start anywhere, even
/// inside a string): read backwards from the closing brace, which is sound because a quote
/// preceded by an even number of backslashes always delimits a string. `None` when the
/// member is not in `text` or `text` does not end with an object.
#[must_use]
pub fn last_top_level_member<'a>(text: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let mut i = text.len();
    while i > 0 && is_space(text[i - 1]) {
        i -= 1;
    }
    if i == 0 || text[i - 1] != b'}' {
        return None;
    }
    let mut i = i - 1;
    let mut depth = 0usize;
    // Where the value of the member left of the cursor ends (the `,` or `}` after it).
    let mut value_end = i;
    loop {
        match text[i] {
            b'"' => {
                // The quote that opens this string: the nearest one before it not escaped.
                let mut k = i;
                let open = loop {
                    if k == 0 {
                        return None;
                    }
                    k -= 1;
                    if text[k] != b'"' {
                        continue;
                    }
                    let slashes = text[..k].iter().rev().take_while(|c| **c == b'\\').count();
                    if slashes % 2 == 0 {
                        break k;
                    }
                };
                if depth == 1 {
                    let mut j = i + 1;
                    while j < text.len() && is_space(text[j]) {
                        j += 1;
                    }
                    if text.get(j) == Some(&b':') {
                        let name: String = serde_json::from_slice(&text[open..=i]).ok()?;
                        if name == key {
                            return Some(trim(&text[j + 1..value_end]));
                        }
                    }
                }
                i = open;
            }
            b'}' | b']' => {
                depth += 1;
                if depth == 1 {
                    value_end = i;
                }
            }
            b'{' | b'[' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return None;
                }
            }
            b',' if depth == 1 => value_end = i,
            _ => {}
        }
        if i == 0 {
            return None;
        }
        i -= 1;
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_space(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !is_space(*last) {
            break;
        }
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;

    fn read(format: Format, stream: bool, chunks: &[&[u8]]) -> UsageReader {
        let mut r = UsageReader::new(format, stream);
        for c in chunks {
            r.push(c);
        }
        r.end();
        r
    }

    fn sse(events: &[(&str, &str)]) -> String {
        events
            .iter()
            .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
            .collect()
    }

    fn usage(input: u64, creation: u64, read: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            cache_creation_input_tokens: creation,
            cache_read_input_tokens: read,
            output_tokens: output,
        }
    }

    const START: &str = r#"{"type":"message_start","message":{"usage":{"input_tokens":90,"cache_read_input_tokens":10}}}"#;
    const DELTA: &str =
        r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"hello world!"}}"#;
    const END: &str = r#"{"type":"message_delta","usage":{"output_tokens":7}}"#;

    #[test]
    fn an_anthropic_stream_settles_from_its_last_usage() {
        let text = sse(&[
            ("message_start", START),
            ("content_block_delta", DELTA),
            ("message_delta", END),
            ("message_stop", "{}"),
        ]);
        // Split everywhere, a byte at a time: the same answer.
        let bytes = text.as_bytes();
        let whole = read(Format::Anthropic, true, &[bytes]);
        assert_eq!(whole.usage(), Some(usage(90, 0, 10, 7)));
        let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(
            read(Format::Anthropic, true, &pieces).usage(),
            whole.usage()
        );
        // Newer versions repeat the input counts in message_delta.
        let repeat = sse(&[
            ("message_start", START),
            (
                "message_delta",
                r#"{"usage":{"input_tokens":95,"cache_read_input_tokens":12,"output_tokens":8}}"#,
            ),
        ]);
        assert_eq!(
            read(Format::Anthropic, true, &[repeat.as_bytes()]).usage(),
            Some(usage(95, 0, 12, 8))
        );
    }

    #[test]
    fn a_stream_cut_short_or_with_an_error_has_no_usage_but_what_it_showed() {
        let cut = sse(&[("message_start", START), ("content_block_delta", DELTA)]);
        let r = read(Format::Anthropic, true, &[cut.as_bytes()]);
        assert_eq!(r.usage(), None);
        // "hello world!" is 12 characters: 6 tokens at two a token.
        assert_eq!(r.seen(), Some(usage(90, 0, 10, 6)));
        let errored = sse(&[
            ("message_start", START),
            ("message_delta", END),
            (
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
            ),
        ]);
        let r = read(Format::Anthropic, true, &[errored.as_bytes()]);
        assert_eq!(r.usage(), None);
        assert_eq!(r.seen(), Some(usage(90, 0, 10, 7)));
        // No input count anywhere: the delta's output is not final.
        let no_input = sse(&[("message_delta", END)]);
        let r = read(Format::Anthropic, true, &[no_input.as_bytes()]);
        assert_eq!(r.usage(), None);
        assert_eq!(r.seen(), Some(usage(0, 0, 0, 7)));
        let twice = sse(&[("message_delta", END), ("message_delta", END)]);
        assert_eq!(
            read(Format::Anthropic, true, &[twice.as_bytes()]).usage(),
            None
        );
    }

    #[test]
    fn openai_chat_and_responses_streams() {
        let chat = "data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n\
                    data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":60}}}\n\n\
                    data: [DONE]\n\n";
        assert_eq!(
            read(Format::Openai, true, &[chat.as_bytes()]).usage(),
            Some(usage(40, 0, 60, 5))
        );
        let malformed = "data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n\
                         data: {\"usage\":{\"prompt_tokens\":\"100\",\"completion_tokens\":5}}\n\n";
        let r = read(Format::Openai, true, &[malformed.as_bytes()]);
        assert_eq!(r.usage(), None);
        assert_eq!(r.seen(), Some(usage(0, 0, 0, 2)));
        let u = r#"{"input_tokens":120,"input_tokens_details":{"cached_tokens":100},"output_tokens":30}"#;
        for kind in [
            "response.completed",
            "response.incomplete",
            "response.failed",
        ] {
            let events = sse(&[
                (
                    "response.output_text.delta",
                    r#"{"type":"response.output_text.delta","delta":"xy"}"#,
                ),
                (
                    kind,
                    &format!(r#"{{"type":"{kind}","response":{{"usage":{u}}}}}"#),
                ),
            ]);
            assert_eq!(
                read(Format::Openai, true, &[events.as_bytes()]).usage(),
                Some(usage(20, 0, 100, 30)),
                "{kind}"
            );
        }
        let failed = sse(&[(
            "response.failed",
            r#"{"type":"response.failed","response":{"status":"failed"}}"#,
        )]);
        assert_eq!(
            read(Format::Openai, true, &[failed.as_bytes()]).usage(),
            None
        );
        let error = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n\
                     data: {\"error\":{\"message\":\"boom\"}}\n\n";
        assert_eq!(
            read(Format::Openai, true, &[error.as_bytes()]).usage(),
            None
        );
    }

    #[test]
    fn lines_end_with_crlf_or_at_the_end_and_characters_split_across_chunks() {
        let text = "event: message_start\r\ndata: ".to_string()
            + START
            + "\r\n\r\nevent: content_block_delta\r\ndata: {\"delta\":{\"text\":\"\u{e9}\u{1f600}\"}}\r\n\r\nevent: message_delta\r\ndata: "
            + END;
        let bytes = text.as_bytes();
        let r = read(Format::Anthropic, true, &[bytes]);
        assert_eq!(r.usage(), Some(usage(90, 0, 10, 7)));
        // é is one UTF-16 unit, 😀 two: three units, two tokens.
        let cut = &bytes[..bytes.len() - END.len() - 30];
        let pieces: Vec<&[u8]> = cut.chunks(3).collect();
        assert_eq!(
            read(Format::Anthropic, true, &pieces).seen(),
            Some(usage(90, 0, 10, 2))
        );
    }

    #[test]
    fn an_over_long_line_is_skipped_and_counted_as_text() {
        let long = "x".repeat(MAX_EVENT_BYTES + 10);
        let text = sse(&[("message_start", START)])
            + "data: "
            + &long
            + "\n\n"
            + &sse(&[("message_delta", END)]);
        let r = read(Format::Anthropic, true, &[text.as_bytes()]);
        assert_eq!(r.usage(), Some(usage(90, 0, 10, 7)));
        let r = read(
            Format::Anthropic,
            true,
            &[(sse(&[("message_start", START)]) + &long).as_bytes()],
        );
        assert!(r.seen().unwrap().output_tokens >= (MAX_EVENT_BYTES as u64) / 2);
    }

    #[test]
    fn a_json_body_whole_or_by_its_tail() {
        let body = br#"{"id":"m","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":90,"cache_read_input_tokens":10,"output_tokens":7}}"#;
        assert_eq!(
            read(Format::Anthropic, false, &[body]).usage(),
            Some(usage(90, 0, 10, 7))
        );
        assert_eq!(read(Format::Anthropic, false, &[body]).seen(), None);
        // A body of 3 MiB: only its tail is held, the usage is found there.
        let filler = "a\\\"b ".repeat(600_000);
        let big = format!(
            r#"{{"content":[{{"type":"text","text":"{filler}"}}],"usage":{{"prompt_tokens":500,"completion_tokens":9}},"x":"}}"}}"#
        );
        let mut r = UsageReader::new(Format::Openai, false);
        for c in big.as_bytes().chunks(16 * 1024) {
            r.push(c);
        }
        r.end();
        assert_eq!(r.usage(), Some(usage(500, 0, 0, 9)));
        if let UsageReader::Body(b) = &r {
            assert!(b.held.len() <= BODY_TAIL_BYTES);
        }
        let mut r = UsageReader::new(Format::Openai, false);
        r.push(&big.as_bytes()[..big.len() - 5]);
        r.end();
        assert_eq!(r.usage(), None, "cut short: no closing brace");
    }

    #[test]
    fn counts_clamped_or_malformed() {
        let body = |u: &str| {
            let v: Value = serde_json::from_str(&format!(r#"{{"usage":{u}}}"#)).unwrap();
            (
                usage_of_body(Format::Anthropic, &v),
                usage_of_body(Format::Openai, &v),
            )
        };
        assert_eq!(
            body(r#"{"input_tokens":1e300,"output_tokens":18446744073709551616}"#).0,
            Some(usage(MAX_COUNT, 0, 0, MAX_COUNT))
        );
        assert_eq!(
            body(r#"{"prompt_tokens":1000000000000000000,"completion_tokens":3}"#).1,
            Some(usage(MAX_COUNT, 0, 0, 3))
        );
        assert_eq!(
            body(r#"{"input_tokens":2.9,"output_tokens":1}"#).0,
            Some(usage(2, 0, 0, 1))
        );
        for bad in [
            r#"{"input_tokens":"5","output_tokens":1}"#,
            r#"{"input_tokens":-5,"output_tokens":1}"#,
            r#"{"input_tokens":5}"#,
            r#"{"input_tokens":5,"output_tokens":1,"cache_read_input_tokens":"x"}"#,
        ] {
            assert_eq!(body(bad).0, None, "{bad}");
        }
        assert_eq!(
            body(r#"{"input_tokens":5,"output_tokens":1,"cache_read_input_tokens":null}"#).0,
            Some(usage(5, 0, 0, 1))
        );
        assert_eq!(
            body(r#"{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":-1}}"#).1,
            None
        );
        assert_eq!(
            body(r#"{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":"x"}"#).1,
            None
        );
        assert_eq!(
            body(r#"{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}"#).1,
            Some(usage(0, 0, 5, 1)),
            "cached at most the prompt"
        );
    }

    #[test]
    fn the_last_top_level_member_from_any_tail() {
        let text = br#"{"a":{"usage":1},"usage":{"x":[1,"}"]},"b":"\"usage\":2"}"#;
        for start in 0..text.len() {
            let got = last_top_level_member(&text[start..], "usage");
            if start <= 17 {
                assert_eq!(got, Some(&br#"{"x":[1,"}"]}"#[..]), "from {start}");
            }
        }
        assert_eq!(last_top_level_member(b"{\"a\":1} ", "usage"), None);
        assert_eq!(last_top_level_member(b"[1]", "usage"), None);
        assert_eq!(last_top_level_member(b"", "usage"), None);
        assert_eq!(
            last_top_level_member(br#"{"us\u0061ge" : 5 }"#, "usage"),
            Some(&b"5"[..])
        );
    }
}
