//! Generated Anthropic Messages request bodies whose token counts are known exactly, and
//! the provider's prompt cache over them.
//!
//! The `estimator` scenario's agents work like Claude Code: every call sends the same dozen
//! tool definitions, a system prompt in two blocks (the part every session shares, marked
//! `cache_control`, then the session's environment), and a history that grows each turn by
//! the model's reply (some text and a `tool_use`) and a user message with the
//! `tool_result` (file contents, command output); the newest message's last block carries
//! the rolling `cache_control` breakpoint.
//!
//! **Exact counts.** Text is drawn from a vocabulary whose entries are one token each, so
//! the generator knows every piece's count; the provider counts by these rules:
//! - a text is its number of vocabulary entries. Three vocabularies, with realistic and
//!   different bytes per token: prose (words after a space, punctuation; 4.0 bytes a
//!   token), code (identifiers, operators, newlines with indentation; 3.6) and command
//!   output (paths, numbers, words; 3.3);
//! - a tool definition: 20 tokens + its description + per parameter 8 tokens + the
//!   parameter's description (the JSON structure around them is not text the estimator
//!   could see as such: it is what the estimator must learn);
//! - a `tool_use` block: 14 tokens (type, id, name) + per input field 3 tokens + its value;
//! - a `tool_result` block: 10 tokens + its content; a `text` block: its text;
//! - a message: 4 tokens of framing (role, separators);
//! - a call with tools: 346 tokens of Anthropic's tool-use system prompt (`tool_choice`
//!   auto), at the head of the prompt.
//!
//! **The prompt cache** ([`PromptCache`]), as Anthropic documents it, keyed by the content
//! of the prompt up to a block (for the model; not per agent: agents sharing a prefix share
//! its cache): a call writes the prefix up to each of its breakpoints (at least 1,024
//! tokens) with a five-minute lifetime, renewed by each read; it reads the longest prefix
//! cached at a block boundary at most 20 blocks before one of its breakpoints. Usage: cache
//! read = tokens up to the block read; cache write = from there to the last breakpoint;
//! input = after the last breakpoint. Reads are free of the input limit; writes and input
//! count against it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tokenwarden_core::Rng;

/// Prompt-cache lifetime (`cache_control: {type: ephemeral}`), ms.
pub const CACHE_TTL_MS: u64 = 300_000;
/// The least prefix Anthropic caches, tokens.
pub const MIN_CACHE_TOKENS: u64 = 1_024;
/// How many blocks before a breakpoint the provider looks for a cached prefix.
pub const LOOKBACK_BLOCKS: usize = 20;
/// Tokens of the tool-use system prompt a call with tools costs (`tool_choice` auto).
pub const TOOL_USE_TOKENS: u64 = 346;
/// Tokens of framing per message.
pub const MESSAGE_TOKENS: u64 = 4;

/// Which vocabulary a text is drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// English-like prose.
    Prose,
    /// Source code.
    Code,
    /// Command output: paths, numbers, short words.
    Output,
}

/// The vocabularies: every entry is one token.
#[derive(Clone, Debug)]
pub struct Vocab {
    words: Vec<String>,
    idents: Vec<String>,
}

const PUNCT: [&str; 8] = [".", ",", ":", "\n", "-", "(", ")", "'"];
const CODE_PUNCT: [&str; 16] = [
    "(", ")", "{", "}", ";", ".", ",", "::", " =", " ==", "->", "&", "<", ">", "[", "]",
];

impl Vocab {
    /// The same vocabulary for every run.
    pub fn new() -> Self {
        let mut rng = Rng::new(0x70C3_4A11);
        let letters = b"etaoinshrdlucmfwypvbgkjqxz";
        let word = |rng: &mut Rng, len: u64| -> String {
            (0..len)
                .map(|_| {
                    // Skewed to the common letters.
                    let i = rng.below_or_eq(25).min(rng.below_or_eq(25));
                    char::from(letters[i as usize])
                })
                .collect()
        };
        // Word lengths 1-6 letters, mean about 3.2: with the space before it, ~4.2 bytes.
        let lengths = [1u64, 2, 2, 3, 3, 3, 4, 4, 5, 6];
        let words = (0..3_000)
            .map(|k| word(&mut rng, lengths[k % lengths.len()]))
            .collect();
        let idents = (0..2_000)
            .map(|k| word(&mut rng, 2 + (k as u64 % 4)))
            .collect();
        Vocab { words, idents }
    }

    /// Appends `tokens` entries of `kind` to `out`.
    pub fn text(&self, rng: &mut Rng, kind: Kind, tokens: u64, out: &mut String) {
        let pick =
            |rng: &mut Rng, v: &[String]| -> usize { rng.below_or_eq(v.len() as u64 - 1) as usize };
        for _ in 0..tokens {
            let r = rng.below_or_eq(99);
            match kind {
                Kind::Prose => {
                    if r < 9 {
                        out.push_str(PUNCT[(r % 8) as usize]);
                    } else {
                        out.push(' ');
                        out.push_str(&self.words[pick(rng, &self.words)]);
                    }
                }
                Kind::Code => {
                    if r < 50 {
                        out.push_str(&self.idents[pick(rng, &self.idents)]);
                    } else if r < 65 {
                        out.push(' ');
                        out.push_str(&self.idents[pick(rng, &self.idents)]);
                    } else if r < 88 {
                        out.push_str(CODE_PUNCT[(r % 16) as usize]);
                    } else {
                        // A newline and its indentation are one token.
                        out.push('\n');
                        for _ in 0..(r % 4) {
                            out.push_str("    ");
                        }
                    }
                }
                Kind::Output => {
                    if r < 30 {
                        let _ = write!(out, "{}", rng.below_or_eq(999));
                    } else if r < 55 {
                        out.push('/');
                        out.push_str(&self.idents[pick(rng, &self.idents)]);
                    } else if r < 80 {
                        out.push(' ');
                        out.push_str(&self.words[pick(rng, &self.words)]);
                    } else {
                        out.push_str(PUNCT[(r % 8) as usize]);
                    }
                }
            }
        }
    }

    fn string(&self, rng: &mut Rng, kind: Kind, tokens: u64) -> String {
        let mut s = String::new();
        self.text(rng, kind, tokens, &mut s);
        s
    }
}

impl Default for Vocab {
    fn default() -> Self {
        Self::new()
    }
}

/// `s` as a JSON string.
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// One content block (or tool definition): its JSON without the closing brace, so a
/// `cache_control` can be added, its exact token count and the hash of its content.
#[derive(Clone, Debug)]
pub struct Block {
    open: String,
    /// Tokens the provider counts for it.
    pub tokens: u64,
    hash: u64,
}

impl Block {
    fn new(open: String, tokens: u64) -> Block {
        let hash = fnv(open.as_bytes());
        Block { open, tokens, hash }
    }

    fn text(s: &str, tokens: u64) -> Block {
        let mut open = String::from(r#"{"type":"text","text":"#);
        json_str(&mut open, s);
        Block::new(open, tokens)
    }

    fn render(&self, out: &mut String, breakpoint: bool) {
        out.push_str(&self.open);
        if breakpoint {
            out.push_str(r#","cache_control":{"type":"ephemeral"}"#);
        }
        out.push('}');
    }
}

/// A message of the history.
#[derive(Clone, Debug)]
pub struct Message {
    user: bool,
    blocks: Vec<Block>,
}

impl Message {
    /// Tokens of its blocks and framing.
    pub fn tokens(&self) -> u64 {
        MESSAGE_TOKENS + self.blocks.iter().map(|b| b.tokens).sum::<u64>()
    }
}

/// What every agent's calls share: the tool definitions and the system prompt's head.
#[derive(Clone, Debug)]
pub struct Preamble {
    tools: Vec<Block>,
    system_head: Block,
    /// Tokens of the tool-use system prompt, the tools and the system prompt's head.
    pub tokens: u64,
}

/// A tool definition: name, description tokens, parameters (name, description tokens).
type ToolDef = (&'static str, u64, &'static [(&'static str, u64)]);

/// Claude Code's tools.
const TOOLS: [ToolDef; 12] = [
    (
        "Task",
        900,
        &[("description", 20), ("prompt", 30), ("subagent_type", 25)],
    ),
    (
        "Bash",
        1_500,
        &[("command", 15), ("timeout", 20), ("description", 60)],
    ),
    ("Glob", 180, &[("pattern", 15), ("path", 40)]),
    (
        "Grep",
        420,
        &[
            ("pattern", 20),
            ("path", 25),
            ("glob", 30),
            ("output_mode", 60),
            ("-n", 15),
        ],
    ),
    ("LS", 90, &[("path", 20), ("ignore", 15)]),
    (
        "Read",
        430,
        &[("file_path", 15), ("offset", 25), ("limit", 25)],
    ),
    (
        "Edit",
        380,
        &[
            ("file_path", 15),
            ("old_string", 12),
            ("new_string", 15),
            ("replace_all", 15),
        ],
    ),
    ("MultiEdit", 650, &[("file_path", 15), ("edits", 60)]),
    ("Write", 260, &[("file_path", 15), ("content", 12)]),
    ("WebFetch", 350, &[("url", 10), ("prompt", 15)]),
    ("TodoWrite", 2_100, &[("todos", 40)]),
    ("WebSearch", 220, &[("query", 10), ("allowed_domains", 20)]),
];

impl Preamble {
    /// The tools and the shared system prompt (about 10k tokens), the same every run.
    pub fn new(vocab: &Vocab) -> Preamble {
        let mut rng = Rng::new(0xC1A0_DE00);
        let mut tokens = TOOL_USE_TOKENS;
        let tools: Vec<Block> = TOOLS
            .iter()
            .map(|(name, desc, params)| {
                let mut open = String::from(r#"{"name":"#);
                json_str(&mut open, name);
                open.push_str(r#","description":"#);
                json_str(&mut open, &vocab.string(&mut rng, Kind::Prose, *desc));
                open.push_str(r#","input_schema":{"type":"object","properties":{"#);
                let mut t = 20 + desc;
                for (k, (p, d)) in params.iter().enumerate() {
                    if k > 0 {
                        open.push(',');
                    }
                    json_str(&mut open, p);
                    open.push_str(r#":{"type":"string","description":"#);
                    json_str(&mut open, &vocab.string(&mut rng, Kind::Prose, *d));
                    open.push('}');
                    t += 8 + d;
                }
                open.push_str(r#"},"required":["#);
                json_str(&mut open, params[0].0);
                open.push_str("]}");
                tokens += t;
                Block::new(open, t)
            })
            .collect();
        let head = 2_800;
        let system_head = Block::text(&vocab.string(&mut rng, Kind::Prose, head), head);
        tokens += head;
        Preamble {
            tools,
            system_head,
            tokens,
        }
    }
}

/// One tool call the model makes and what its result holds.
#[derive(Clone, Copy, Debug)]
struct ToolCall {
    name: &'static str,
    /// Input fields: name, kind, tokens (lo, hi).
    input: &'static [(&'static str, Kind, u64, u64)],
    /// The result: kind, tokens (lo, hi).
    result: (Kind, u64, u64),
    /// Relative frequency.
    weight: u64,
}

const CALLS: [ToolCall; 9] = [
    ToolCall {
        name: "Read",
        input: &[("file_path", Kind::Output, 6, 14)],
        result: (Kind::Code, 400, 6_000),
        weight: 30,
    },
    ToolCall {
        name: "Bash",
        input: &[
            ("command", Kind::Output, 6, 30),
            ("description", Kind::Prose, 4, 12),
        ],
        result: (Kind::Output, 40, 4_000),
        weight: 22,
    },
    ToolCall {
        name: "Grep",
        input: &[
            ("pattern", Kind::Code, 2, 8),
            ("output_mode", Kind::Prose, 1, 2),
        ],
        result: (Kind::Output, 30, 900),
        weight: 12,
    },
    ToolCall {
        name: "Glob",
        input: &[("pattern", Kind::Output, 3, 8)],
        result: (Kind::Output, 20, 400),
        weight: 5,
    },
    ToolCall {
        name: "Edit",
        input: &[
            ("file_path", Kind::Output, 6, 14),
            ("old_string", Kind::Code, 10, 300),
            ("new_string", Kind::Code, 10, 500),
        ],
        result: (Kind::Code, 60, 400),
        weight: 18,
    },
    ToolCall {
        name: "Write",
        input: &[
            ("file_path", Kind::Output, 6, 14),
            ("content", Kind::Code, 200, 2_500),
        ],
        result: (Kind::Prose, 15, 30),
        weight: 4,
    },
    ToolCall {
        name: "TodoWrite",
        input: &[("todos", Kind::Prose, 60, 300)],
        result: (Kind::Prose, 40, 80),
        weight: 5,
    },
    ToolCall {
        name: "Task",
        input: &[
            ("description", Kind::Prose, 3, 8),
            ("prompt", Kind::Prose, 60, 400),
        ],
        result: (Kind::Prose, 300, 2_500),
        weight: 2,
    },
    ToolCall {
        name: "WebFetch",
        input: &[
            ("url", Kind::Output, 8, 20),
            ("prompt", Kind::Prose, 10, 40),
        ],
        result: (Kind::Prose, 400, 3_000),
        weight: 2,
    },
];

/// The model's reply to one call, and the results of its tool calls (the next user message).
#[derive(Clone, Debug)]
pub struct Reply {
    assistant: Message,
    results: Message,
    /// Output tokens: the reply's blocks.
    pub output: u64,
}

/// One agent's conversation.
#[derive(Clone, Debug)]
pub struct Conversation {
    env: Block,
    messages: Vec<Message>,
    /// Tokens of the messages.
    pub tokens: u64,
    tool_ids: u64,
    agent: usize,
}

/// A request ready to send: its body, and the provider's view of its prompt.
#[derive(Clone, Debug)]
pub struct Prompt {
    /// The JSON request body.
    pub body: String,
    /// Per block, in the provider's order (tools, system, messages): tokens up to and
    /// including it, and the hash of the prompt up to it.
    blocks: Vec<(u64, u64)>,
    /// Indices of the blocks marked `cache_control`.
    breakpoints: Vec<usize>,
    /// Every prompt token.
    pub total: u64,
}

fn uniform(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + rng.below_or_eq(hi.saturating_sub(lo))
}

impl Conversation {
    /// A new session of agent `agent`: its environment block and the task's first message
    /// (the request, and `context` tokens of pasted files and notes).
    pub fn new(vocab: &Vocab, rng: &mut Rng, agent: usize, task: u32, context: u64) -> Self {
        let env_tokens = uniform(rng, 250, 450);
        let mut env = format!("Working directory: /work/agent-{agent}/task-{task}\n");
        let env_head = 12;
        vocab.text(rng, Kind::Output, env_tokens - env_head, &mut env);
        let env = Block::text(&env, env_tokens);
        let mut c = Conversation {
            env,
            messages: Vec::new(),
            tokens: 0,
            tool_ids: 0,
            agent,
        };
        let ask = uniform(rng, 40, 400);
        let mut blocks = vec![Block::text(&vocab.string(rng, Kind::Prose, ask), ask)];
        if context > 0 {
            blocks.push(Block::text(
                &vocab.string(rng, Kind::Code, context),
                context,
            ));
        }
        c.push(Message { user: true, blocks });
        c
    }

    fn push(&mut self, m: Message) {
        self.tokens += m.tokens();
        self.messages.push(m);
    }

    /// Replaces the history with a summary of it, as an agent does near its context window.
    pub fn compact(&mut self, vocab: &Vocab, rng: &mut Rng) {
        let tokens = uniform(rng, 2_000, 4_000);
        self.messages.clear();
        self.tokens = 0;
        let text = vocab.string(rng, Kind::Prose, tokens);
        self.push(Message {
            user: true,
            blocks: vec![Block::text(&text, tokens)],
        });
    }

    /// The model's next reply: a few words (most of the time) and one or two tool calls.
    pub fn reply(&mut self, vocab: &Vocab, rng: &mut Rng) -> Reply {
        let mut blocks = Vec::new();
        if rng.below_or_eq(99) < 60 {
            let n = uniform(rng, 8, 150);
            blocks.push(Block::text(&vocab.string(rng, Kind::Prose, n), n));
        }
        let calls = if rng.below_or_eq(99) < 15 { 2 } else { 1 };
        let mut results = Vec::new();
        let total_weight: u64 = CALLS.iter().map(|c| c.weight).sum();
        for _ in 0..calls {
            let mut r = rng.below_or_eq(total_weight - 1);
            let call = CALLS
                .iter()
                .find(|c| {
                    if r < c.weight {
                        true
                    } else {
                        r -= c.weight;
                        false
                    }
                })
                .copied()
                .unwrap_or(CALLS[0]);
            self.tool_ids += 1;
            let id = format!(
                "toolu_{:02}{:06}{:016x}",
                self.agent % 100,
                self.tool_ids,
                fnv(&self.tool_ids.to_le_bytes())
            );
            let mut open = String::from(r#"{"type":"tool_use","id":"#);
            json_str(&mut open, &id);
            open.push_str(r#","name":"#);
            json_str(&mut open, call.name);
            open.push_str(r#","input":{"#);
            let mut tokens = 14;
            for (k, (field, kind, lo, hi)) in call.input.iter().enumerate() {
                if k > 0 {
                    open.push(',');
                }
                json_str(&mut open, field);
                open.push(':');
                let n = uniform(rng, *lo, *hi);
                json_str(&mut open, &vocab.string(rng, *kind, n));
                tokens += 3 + n;
            }
            open.push('}');
            blocks.push(Block::new(open, tokens));
            // Tool output sizes are skewed: most are small, a few large.
            let (kind, lo, hi) = call.result;
            let n = lo + (hi - lo) * rng.below_or_eq(1000) * rng.below_or_eq(1000) / 1_000_000;
            let mut open = String::from(r#"{"type":"tool_result","tool_use_id":"#);
            json_str(&mut open, &id);
            open.push_str(r#","content":"#);
            json_str(&mut open, &vocab.string(rng, kind, n));
            results.push(Block::new(open, 10 + n));
        }
        let output = blocks.iter().map(|b| b.tokens).sum();
        Reply {
            assistant: Message {
                user: false,
                blocks,
            },
            results: Message {
                user: true,
                blocks: results,
            },
            output,
        }
    }

    /// Appends a reply and its tool results to the history.
    pub fn append(&mut self, reply: Reply) {
        self.push(reply.assistant);
        self.push(reply.results);
    }

    /// The request for the next call: `model`, `max_tokens`, the preamble, this session's
    /// environment and history, breakpoints on the system prompt's head and on the newest
    /// message's last block.
    pub fn prompt(&self, pre: &Preamble, model: &str, max_tokens: u64) -> Prompt {
        let mut body = String::with_capacity(self.tokens as usize * 4 + 64 * 1024);
        body.push_str(r#"{"model":"#);
        json_str(&mut body, model);
        let _ = write!(
            body,
            r#","max_tokens":{max_tokens},"stream":true,"tools":["#
        );
        let mut blocks = Vec::new();
        let mut breakpoints = Vec::new();
        let mut key = fnv(model.as_bytes());
        let mut total = TOOL_USE_TOKENS;
        let mut add = |b: &Block, extra: u64, bp: bool, blocks: &mut Vec<(u64, u64)>| {
            total += b.tokens + extra;
            key = (key ^ b.hash)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(31)
                ^ b.hash;
            if bp {
                breakpoints.push(blocks.len());
            }
            blocks.push((total, key));
        };
        for (k, t) in pre.tools.iter().enumerate() {
            if k > 0 {
                body.push(',');
            }
            t.render(&mut body, false);
            add(t, 0, false, &mut blocks);
        }
        body.push_str(r#"],"system":["#);
        pre.system_head.render(&mut body, true);
        add(&pre.system_head, 0, true, &mut blocks);
        body.push(',');
        self.env.render(&mut body, false);
        add(&self.env, 0, false, &mut blocks);
        body.push_str(r#"],"messages":["#);
        let last = self.messages.len().saturating_sub(1);
        for (m, msg) in self.messages.iter().enumerate() {
            if m > 0 {
                body.push(',');
            }
            body.push_str(if msg.user {
                r#"{"role":"user","content":["#
            } else {
                r#"{"role":"assistant","content":["#
            });
            let last_block = msg.blocks.len().saturating_sub(1);
            for (k, b) in msg.blocks.iter().enumerate() {
                if k > 0 {
                    body.push(',');
                }
                let bp = m == last && k == last_block;
                b.render(&mut body, bp);
                add(b, if k == 0 { MESSAGE_TOKENS } else { 0 }, bp, &mut blocks);
            }
            body.push_str("]}");
        }
        body.push_str("]}");
        Prompt {
            body,
            blocks,
            breakpoints,
            total,
        }
    }
}

/// How the provider counts one call's prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Split {
    /// Read from the cache.
    pub read: u64,
    /// Written to the cache.
    pub write: u64,
    /// After the last breakpoint.
    pub uncached: u64,
}

/// The provider's prompt cache: prefix hash → when it expires.
#[derive(Clone, Debug, Default)]
pub struct PromptCache {
    entries: BTreeMap<u64, u64>,
}

impl PromptCache {
    /// How a call sent at `now` is counted.
    pub fn split(&self, now: u64, p: &Prompt) -> Split {
        let Some(&last) = p.breakpoints.iter().max() else {
            return Split {
                uncached: p.total,
                ..Split::default()
            };
        };
        let to_last = p.blocks[last].0;
        if to_last < MIN_CACHE_TOKENS {
            return Split {
                uncached: p.total,
                ..Split::default()
            };
        }
        let read = (0..=last)
            .rev()
            .find(|&i| {
                p.breakpoints
                    .iter()
                    .any(|&b| b >= i && b - i <= LOOKBACK_BLOCKS)
                    && self
                        .entries
                        .get(&p.blocks[i].1)
                        .is_some_and(|&until| now < until)
            })
            .map_or(0, |i| p.blocks[i].0);
        Split {
            read,
            write: to_last - read,
            uncached: p.total - to_last,
        }
    }

    /// The provider took the call in at `now`: it writes (or renews) the prefix at each
    /// breakpoint and renews the prefix it read.
    pub fn commit(&mut self, now: u64, p: &Prompt, split: &Split) {
        for &b in &p.breakpoints {
            if p.blocks[b].0 >= MIN_CACHE_TOKENS {
                self.entries.insert(p.blocks[b].1, now + CACHE_TTL_MS);
            }
        }
        if split.read > 0 {
            if let Some(&(_, key)) = p.blocks.iter().find(|(t, _)| *t == split.read) {
                self.entries.insert(key, now + CACHE_TTL_MS);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Vocab, Preamble, Rng) {
        let v = Vocab::new();
        let p = Preamble::new(&v);
        (v, p, Rng::new(7))
    }

    #[test]
    fn vocabularies_have_realistic_bytes_per_token() {
        let (v, _, mut rng) = setup();
        for (kind, lo, hi) in [
            (Kind::Prose, 3.6, 4.6),
            (Kind::Code, 3.0, 4.0),
            (Kind::Output, 2.7, 3.7),
        ] {
            let s = v.string(&mut rng, kind, 100_000);
            let ratio = s.len() as f64 / 100_000.0;
            assert!(
                (lo..=hi).contains(&ratio),
                "{kind:?}: {ratio:.2} bytes a token"
            );
        }
    }

    #[test]
    fn the_prompt_counts_every_block_and_the_body_is_json() {
        let (v, pre, mut rng) = setup();
        let mut c = Conversation::new(&v, &mut rng, 3, 0, 2_000);
        for _ in 0..5 {
            let r = c.reply(&v, &mut rng);
            c.append(r);
        }
        let p = c.prompt(&pre, "claude-sonnet-4-5", 128_000);
        assert_eq!(p.total, pre.tokens + c.env.tokens + c.tokens);
        assert_eq!(p.breakpoints.len(), 2);
        assert!(p.body.starts_with('{') && p.body.ends_with('}'));
        assert_eq!(p.body.matches("cache_control").count(), 2);
        assert!(p.body.contains(r#""max_tokens":128000"#));
    }

    #[test]
    fn a_rolling_breakpoint_reads_the_previous_turn_and_writes_the_new_part() {
        let (v, pre, mut rng) = setup();
        let mut cache = PromptCache::default();
        let mut c = Conversation::new(&v, &mut rng, 0, 0, 3_000);
        let p1 = c.prompt(&pre, "m", 1000);
        let s1 = cache.split(0, &p1);
        assert_eq!(
            s1,
            Split {
                read: 0,
                write: p1.total,
                uncached: 0
            }
        );
        cache.commit(0, &p1, &s1);
        let r = c.reply(&v, &mut rng);
        c.append(r);
        let p2 = c.prompt(&pre, "m", 1000);
        let s2 = cache.split(10_000, &p2);
        assert_eq!(s2.read, p1.total);
        assert_eq!(s2.write, p2.total - p1.total);
        cache.commit(10_000, &p2, &s2);
        // Another agent shares the tools and the system prompt's head, not the rest.
        let other = Conversation::new(&v, &mut rng, 1, 0, 3_000);
        let p3 = other.prompt(&pre, "m", 1000);
        assert_eq!(cache.split(20_000, &p3).read, pre.tokens);
        // Another model shares nothing.
        assert_eq!(cache.split(20_000, &other.prompt(&pre, "n", 1000)).read, 0);
        // Five minutes after the last use, all is gone.
        assert_eq!(cache.split(10_000 + CACHE_TTL_MS, &p2).read, 0);
    }
}
