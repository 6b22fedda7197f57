//! The prompt tokens of an OpenAI request by the published rules: per message, the reply's
//! priming and tool definitions (the OpenAI Cookbook, "How to count tokens with tiktoken",
//! sections 6 and 7, whose figures match the API's), with the model's tokenizer.

use alloc::string::String;

use serde_json::{Map, Value};

use super::counter::Counter;
use super::prompt::{Costing, json};
use crate::bpe::Encoding;

/// Per message: 3 tokens, the tokens of each of its string fields, 1 more for a `name`;
/// and 3 for the reply's priming (`<|start|>assistant<|message|>`).
const TOKENS_PER_MESSAGE: u64 = 3;
const TOKENS_PER_NAME: u64 = 1;
const REPLY_PRIMING: u64 = 3;

/// Tool definitions (section 7): per function 7 tokens on o200k, 10 on cl100k, plus
/// `name:description` (a final `.` dropped); 3 if it has properties, then per property 3
/// plus `key:type:description`; an enum −3 plus 3 and its tokens per value; 12 once after
/// the functions.
struct ToolRule {
    func_init: u64,
    prop_init: u64,
    prop_key: u64,
    enum_item: u64,
    func_end: u64,
}

fn tool_rule(e: Encoding) -> ToolRule {
    ToolRule {
        func_init: match e {
            Encoding::O200kBase => 7,
            Encoding::Cl100kBase => 10,
        },
        prop_init: 3,
        prop_key: 3,
        enum_item: 3,
        func_end: 12,
    }
}
/// The enum's −3 (applied as a subtraction).
const ENUM_INIT_LESS: u64 = 3;

/// Counts a prompt's parts with one encoding; images and files by the published rules
/// (a PDF's text counted by the tokenizer).
pub(crate) struct PromptCounter<'a> {
    pub(crate) counter: &'a Counter,
    pub(crate) costing: Costing<'a>,
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => json(other),
    }
}

fn drop_dot(s: &str) -> &str {
    s.strip_suffix('.').unwrap_or(s)
}

/// The keys of `o` the rule does not cover, as an object (`None` when there are none).
fn rest(o: &Map<String, Value>, ruled: &[&str]) -> Option<Value> {
    let out: Map<String, Value> = o
        .iter()
        .filter(|(k, _)| !ruled.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!out.is_empty()).then_some(Value::Object(out))
}

/// A property's schema beyond the rule (nested `properties`, `items`, `anyOf`, a `$ref`, a
/// default…) is in the prompt too, in a form OpenAI does not publish: counted as its JSON
/// text, which errs high. The same for a schema's extras beyond `type`, `properties`,
/// `required` and `additionalProperties`.
const PROPERTY_RULED: &[&str] = &["type", "description", "enum"];
const SCHEMA_RULED: &[&str] = &["type", "properties", "required", "additionalProperties"];

impl PromptCounter<'_> {
    fn count(&self, s: &str) -> u64 {
        self.counter.count(s)
    }

    /// One function's definition: Chat Completions' `{type: "function", function: {…}}`,
    /// the Responses API's flat `{type: "function", name, …}`, or a legacy `functions` entry.
    fn function(&self, f: &Map<String, Value>) -> u64 {
        let r = tool_rule(self.counter.encoding());
        let mut n = r.func_init
            + self.count(&alloc::format!(
                "{}:{}",
                text(f.get("name")),
                drop_dot(&text(f.get("description")))
            ));
        let params = f.get("parameters").and_then(Value::as_object);
        let props = params
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object);
        if let Some(props) = props.filter(|p| !p.is_empty()) {
            n += r.prop_init;
            for (key, spec) in props {
                n += r.prop_key;
                let empty = Map::new();
                let p = spec.as_object().unwrap_or(&empty);
                if let Some(Value::Array(items)) = p.get("enum") {
                    n = n.saturating_sub(ENUM_INIT_LESS);
                    for item in items {
                        n += r.enum_item + self.count(&text(Some(item)));
                    }
                }
                n += self.count(&alloc::format!(
                    "{key}:{}:{}",
                    text(p.get("type")),
                    drop_dot(&text(p.get("description")))
                ));
                if let Some(extra) = rest(p, PROPERTY_RULED) {
                    n += self.count(&json(&extra));
                }
            }
        }
        if let Some(extra) = params.and_then(|p| rest(p, SCHEMA_RULED)) {
            n += self.count(&json(&extra));
        }
        n
    }

    /// The tokens of a request's tool definitions (`tools`, and the legacy `functions`):
    /// functions by the rule; another kind of tool (the Responses API's built-in tools, a
    /// custom tool's grammar) as its JSON text.
    fn tools(&self, body: &Value) -> u64 {
        let mut fns = alloc::vec::Vec::new();
        let mut other = 0;
        for t in body
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(o) = t.as_object() else {
                continue;
            };
            let is_fn = o.get("type").and_then(Value::as_str) == Some("function");
            match o.get("function").and_then(Value::as_object) {
                Some(f) if is_fn => fns.push(f),
                _ if is_fn => fns.push(o),
                _ => other += self.count(&json(t)),
            }
        }
        for f in body
            .get("functions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(o) = f.as_object() {
                fns.push(o);
            }
        }
        if fns.is_empty() {
            return other;
        }
        let mut n = other + tool_rule(self.counter.encoding()).func_end;
        for f in fns {
            n += self.function(f);
        }
        n
    }

    /// A content part or a Responses API content item.
    fn part(&self, part: &Value) -> u64 {
        match part {
            Value::String(s) => self.count(s),
            Value::Object(o) => {
                if let Some(Value::String(t)) = o.get("text") {
                    return self.count(t);
                }
                if let Some(Value::String(t)) = o.get("refusal") {
                    return self.count(t);
                }
                if let Some(c) = self.costing.media(o) {
                    return c.total();
                }
                self.count(&json(part))
            }
            _ => 0,
        }
    }

    fn content(&self, content: Option<&Value>) -> u64 {
        match content {
            Some(Value::String(s)) => self.count(s),
            Some(Value::Array(parts)) => parts.iter().map(|p| self.part(p)).sum(),
            None | Some(Value::Null) => 0,
            Some(other) => self.count(&json(other)),
        }
    }

    /// A tool call in the history: its function's JSON text (`{"name":…,"arguments":"…"}`),
    /// which errs high (OpenAI publishes no rule).
    fn tool_call(&self, call: &Value) -> u64 {
        let Some(c) = call.as_object() else {
            return 0;
        };
        let f = c
            .get("function")
            .and_then(Value::as_object)
            .or_else(|| c.get("custom").and_then(Value::as_object))
            .unwrap_or(c);
        let mut o = Map::new();
        if let Some(name) = f.get("name") {
            o.insert("name".into(), name.clone());
        }
        if let Some(args) = f.get("arguments").or_else(|| f.get("input")) {
            o.insert("arguments".into(), args.clone());
        }
        self.count(&json(&Value::Object(o)))
    }

    /// A Chat Completions message (or a Responses API message item), by the rule.
    fn message(&self, m: &Map<String, Value>) -> u64 {
        let mut n = TOKENS_PER_MESSAGE;
        for (key, value) in m {
            // A Responses API item's own bookkeeping is not prompt text.
            if (key == "type" && value.as_str() == Some("message"))
                || key == "id"
                || key == "status"
            {
                continue;
            }
            match (key.as_str(), value) {
                ("content", v) => n += self.content(Some(v)),
                ("tool_calls", Value::Array(calls)) => {
                    n += calls.iter().map(|c| self.tool_call(c)).sum::<u64>()
                }
                ("function_call", v @ Value::Object(_)) => n += self.tool_call(v),
                (k, Value::String(s)) => {
                    n += self.count(s) + if k == "name" { TOKENS_PER_NAME } else { 0 }
                }
                (_, Value::Null | Value::Bool(_)) => {}
                (_, v) => n += self.count(&json(v)),
            }
        }
        n
    }

    /// A Responses API input item that is not a message: a function call (its name and
    /// arguments' JSON), a tool's output (its text or parts), a reasoning item (its
    /// summary's text and its `encrypted_content` as text: the reasoning it stands for is
    /// input again, and OpenAI publishes no count for it, so this errs high), anything else
    /// as JSON. Each costs a message's overhead.
    fn item(&self, item: &Map<String, Value>) -> u64 {
        let v = Value::Object(item.clone());
        match item.get("type").and_then(Value::as_str) {
            Some("function_call" | "custom_tool_call") => TOKENS_PER_MESSAGE + self.tool_call(&v),
            Some("function_call_output" | "custom_tool_call_output" | "computer_call_output") => {
                TOKENS_PER_MESSAGE + self.content(item.get("output"))
            }
            Some("reasoning") => {
                let mut n = TOKENS_PER_MESSAGE;
                for s in item
                    .get("summary")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    n += self.part(s);
                }
                if let Some(Value::String(e)) = item.get("encrypted_content") {
                    n += self.count(e);
                }
                n
            }
            _ => {
                let mut shown = item.clone();
                shown.remove("id");
                shown.remove("status");
                TOKENS_PER_MESSAGE + self.count(&json(&Value::Object(shown)))
            }
        }
    }

    /// A JSON schema the reply must follow (`response_format`, or the Responses API's
    /// `text.format`): its JSON text (not published).
    fn format(&self, body: &Value) -> u64 {
        let f = body
            .get("response_format")
            .and_then(Value::as_object)
            .or_else(|| {
                body.get("text")
                    .and_then(|t| t.get("format"))
                    .and_then(Value::as_object)
            });
        let Some(f) = f else {
            return 0;
        };
        if f.get("type").and_then(Value::as_str) != Some("json_schema") {
            return 0;
        }
        let schema = f
            .get("json_schema")
            .filter(|s| s.is_object())
            .or_else(|| f.get("schema"))
            .cloned()
            .unwrap_or_else(|| Value::Object(f.clone()));
        self.count(&json(&schema))
    }

    /// The prompt tokens of an OpenAI request body: Chat Completions (`messages`, `tools`,
    /// `functions`) or the Responses API (`instructions` as a system message, then `input`:
    /// a string, or items), plus the reply's priming, tool definitions and a reply schema.
    pub(crate) fn prompt(&self, body: &Value) -> u64 {
        let mut n = REPLY_PRIMING + self.tools(body) + self.format(body);
        let message = |role: &str, content: &str| {
            let mut o = Map::new();
            o.insert("role".into(), Value::String(role.into()));
            o.insert("content".into(), Value::String(content.into()));
            o
        };
        if let Some(Value::Array(messages)) = body.get("messages") {
            for m in messages {
                if let Some(o) = m.as_object() {
                    n += self.message(o);
                }
            }
            return n;
        }
        if let Some(Value::String(i)) = body.get("instructions") {
            n += self.message(&message("system", i));
        }
        match body.get("input") {
            Some(Value::String(s)) => n += self.message(&message("user", s)),
            Some(Value::Array(items)) => {
                for item in items {
                    match item {
                        Value::String(s) => n += self.message(&message("user", s)),
                        Value::Object(o) => {
                            let is_message = o.contains_key("role")
                                && o.get("type").is_none_or(|t| t.as_str() == Some("message"));
                            n += if is_message {
                                self.message(o)
                            } else {
                                self.item(o)
                            };
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        n
    }
}
