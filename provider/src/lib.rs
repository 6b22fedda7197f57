//! What tokenwarden knows of each provider's HTTP API, beside the core (`no_std`, no I/O):
//! which requests are model calls, how a provider's answer reports what a call used
//! ([`usage`]), who a call is by its client's session headers ([`mod@identity`]), and how
//! many tokens a text is in OpenAI's byte-pair encodings ([`bpe`]); what a request costs
//! ([`estimate`]), and how Anthropic's `count_tokens` is asked ([`count_tokens`]); how an
//! error is answered in each provider's format ([`errors`]); and one send from the request
//! to the lease's end for a host that passes the answer's bytes ([`send`]: the core's
//! exchange with the usage reader).
//!
//! A model call is leased before it is sent; any other request (token counting, model
//! lists, a batch, a stored response) passes through. The decision is made on the path as
//! the provider's router will read it, not as the client spelled it: a path that a router
//! normalizes to a model call's (`/v1/m%65ssages`, `/V1/Messages`, `/v1/messages;x`,
//! `/v1//messages/`, `/v1/x/../messages`) is a model call too, so no look-alike of one
//! passes unleased. The request is still forwarded as the client wrote it.
//!
//! ```
//! use tokenwarden_provider::{Api, model_call};
//!
//! assert_eq!(model_call("POST", "/v1/messages?beta=true"), Some(Api::AnthropicMessages));
//! assert_eq!(model_call("POST", "/v1/m%65ssages"), Some(Api::AnthropicMessages));
//! assert_eq!(model_call("POST", "/v1/messages/count_tokens"), None);
//! assert_eq!(model_call("GET", "/v1/responses/resp_123"), None);
//! ```
#![no_std]

extern crate alloc;

use alloc::vec::Vec;

pub mod bpe;
pub mod count_tokens;
pub mod errors;
pub mod estimate;
pub mod identity;
pub mod send;
pub mod usage;
pub use identity::{Identity, identity};
pub use usage::{Format, Usage, UsageReader};

/// A provider API whose calls are leased.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// Anthropic's Messages API: `POST …/messages`.
    AnthropicMessages,
    /// OpenAI's Chat Completions API: `POST …/chat/completions`.
    OpenaiChat,
    /// OpenAI's Responses API: `POST …/responses`.
    OpenaiResponses,
}

impl Api {
    /// Its name across the bindings: `anthropic_messages`, `openai_chat`,
    /// `openai_responses`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Api::AnthropicMessages => "anthropic_messages",
            Api::OpenaiChat => "openai_chat",
            Api::OpenaiResponses => "openai_responses",
        }
    }

    /// The provider whose error format, headers and counting the API follows:
    /// `anthropic` or `openai`.
    #[must_use]
    pub fn provider(self) -> &'static str {
        match self {
            Api::AnthropicMessages => "anthropic",
            Api::OpenaiChat | Api::OpenaiResponses => "openai",
        }
    }
}

/// The longest path looked at, in bytes. A longer one is a model call when its first
/// `MAX_PATH` bytes end like one (no provider serves a longer path).
pub const MAX_PATH: usize = 8 * 1024;

/// Which API a request is a model call of, or `None` (it passes through). `method` is the
/// HTTP method (a model call is a `POST`, in any case); `target` the request target: its
/// path, with or without the query string and fragment (both ignored).
///
/// The path is read as a router normalizes it: percent-escapes decoded, letters compared
/// without case, `;parameters` of a segment dropped, empty and `.` segments skipped, `..`
/// removing the segment before it. Then a path ending in `messages` is Anthropic's Messages
/// API (`…/messages/count_tokens` and `…/messages/batches` are not model calls), one ending
/// in `chat/completions` OpenAI's Chat Completions, one ending in `responses` OpenAI's
/// Responses API (its other routes, `…/responses/{id}`, `…/input_items`, `…/cancel`,
/// `…/input_tokens`, `…/compact`, are not).
#[must_use]
pub fn model_call(method: &str, target: &str) -> Option<Api> {
    if !method.eq_ignore_ascii_case("POST") {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or("");
    let path = &path.as_bytes()[..path.len().min(MAX_PATH)];
    let segments = segments(path);
    match segments.as_slice() {
        [.., last] if is(last, b"messages") => Some(Api::AnthropicMessages),
        [.., chat, last] if is(chat, b"chat") && is(last, b"completions") => Some(Api::OpenaiChat),
        [.., last] if is(last, b"responses") => Some(Api::OpenaiResponses),
        _ => None,
    }
}

/// Whether a normalized segment is `name` (ASCII, lowercase).
fn is(segment: &[u8], name: &[u8]) -> bool {
    segment.eq_ignore_ascii_case(name)
}

/// The path's segments as a router reads them (see [`model_call`]): decoded, without
/// parameters, empty or `.` segments, and with `..` applied.
fn segments(path: &[u8]) -> Vec<Vec<u8>> {
    let decoded = percent_decoded(path);
    let mut out: Vec<Vec<u8>> = Vec::new();
    // Decoding may make a `/` (`%2F`): split after it, as a router that decodes first does.
    for raw in decoded.split(|b| *b == b'/') {
        let segment = raw.split(|b| *b == b';').next().unwrap_or(&[]);
        match segment {
            b"" | b"." => {}
            b".." => {
                out.pop();
            }
            s => out.push(s.to_vec()),
        }
    }
    out
}

/// `path` with every `%XX` escape decoded, repeatedly while one is left (`%2565` is `%65`
/// after one pass and `e` after two: a router that decodes twice must not see a model call
/// this one missed). An escape that is not two hex digits stays as it is.
fn percent_decoded(path: &[u8]) -> Vec<u8> {
    let mut text = path.to_vec();
    loop {
        let mut out = Vec::with_capacity(text.len());
        let mut changed = false;
        let mut i = 0;
        while let Some(&b) = text.get(i) {
            if b == b'%' {
                if let (Some(h), Some(l)) = (
                    text.get(i + 1).and_then(|c| hex(*c)),
                    text.get(i + 2).and_then(|c| hex(*c)),
                ) {
                    out.push(h * 16 + l);
                    changed = true;
                    i += 3;
                    continue;
                }
            }
            out.push(b);
            i += 1;
        }
        if !changed {
            return out;
        }
        text = out;
    }
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_apis_and_what_passes_through() {
        let call = |p| model_call("POST", p);
        assert_eq!(call("/v1/messages"), Some(Api::AnthropicMessages));
        assert_eq!(call("/v1/messages?beta=true"), Some(Api::AnthropicMessages));
        assert_eq!(call("/proxy/v1/messages/"), Some(Api::AnthropicMessages));
        assert_eq!(call("/v1/chat/completions"), Some(Api::OpenaiChat));
        assert_eq!(call("/openai/v1/chat/completions"), Some(Api::OpenaiChat));
        assert_eq!(call("/v1/responses"), Some(Api::OpenaiResponses));
        for other in [
            "/v1/messages/count_tokens",
            "/v1/messages/batches",
            "/v1/models",
            "/v1/responses/resp_1",
            "/v1/responses/resp_1/cancel",
            "/v1/responses/input_tokens",
            "/v1/responses/compact",
            "/v1/responses/resp_1/input_items",
            "/v1/chat/completions/chatcmpl_1",
            "/v1/completions",
            "/v1/embeddings",
            "",
            "/",
        ] {
            assert_eq!(call(other), None, "{other}");
        }
        assert_eq!(model_call("GET", "/v1/messages"), None);
        assert_eq!(
            model_call("post", "/v1/messages"),
            Some(Api::AnthropicMessages)
        );
    }

    #[test]
    fn look_alikes_a_router_normalizes_are_model_calls() {
        for p in [
            "/v1/m%65ssages",
            "/v1/M%45SSAGES",
            "/V1/Messages",
            "/v1/messages;x",
            "/v1/messages;x=1/",
            "/v1//messages//",
            "/v1/./messages",
            "/v1/x/../messages",
            "/v1/messages/count_tokens/..",
            "/v1%2Fmessages",
            "/v1/m%2565ssages",
            "/v1/messages#frag",
        ] {
            assert_eq!(model_call("POST", p), Some(Api::AnthropicMessages), "{p}");
        }
        for p in [
            "/v1/chat%2Fcompletions",
            "/v1/Chat/Completions;v",
            "/v1/chat/./completions",
        ] {
            assert_eq!(model_call("POST", p), Some(Api::OpenaiChat), "{p}");
        }
        assert_eq!(
            model_call("POST", "/v1/r%65sponses/"),
            Some(Api::OpenaiResponses)
        );
        // A malformed escape is left as it is.
        assert_eq!(model_call("POST", "/v1/messages%zz"), None);
        assert_eq!(model_call("POST", "/v1/messages%"), None);
    }

    #[test]
    fn names() {
        assert_eq!(Api::AnthropicMessages.name(), "anthropic_messages");
        assert_eq!(Api::OpenaiChat.provider(), "openai");
        assert_eq!(Api::OpenaiResponses.name(), "openai_responses");
    }
}
