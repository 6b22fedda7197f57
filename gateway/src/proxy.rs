//! The proxy's first step: from a proxied request — the path after `…/proxy`, its query
//! string and its headers — what is sent to the provider and what names the call, or why
//! the request is refused. A host reads the request, asks [`proxied_call`], and sends what
//! it answers; it decides none of it.
//!
//! - **The path** may name the call before the provider's path (for tools that can set
//!   only a base URL): `/agent/<a>/role/<r>/task/<t>/unblocks/<n>/v1/messages`, each key at
//!   most once, each value percent-decoded (as UTF-8) and 1 to 256 UTF-16 units long. What
//!   is left must be one of the provider's `/v1/…` routes.
//! - **The provider** is Anthropic for its paths (`/v1/messages…`) or its version header
//!   (`anthropic-version`), else OpenAI.
//! - **What is forwarded**: the provider's own headers (its key in `x-api-key` or
//!   `authorization`, `anthropic-*`, `openai-*`, `chatgpt-account-id`), the content headers
//!   and what identifies the client to the provider — its user agent and the SDKs' and
//!   agents' metadata (`x-stainless-*`, Claude Code's `x-app` and `x-claude-code-*`, Codex's
//!   `originator`, `version`, `session-id` / `session_id`, `thread-id` / `thread_id`,
//!   `x-client-request-id`, `x-openai-subagent` and `x-codex-*`) — nothing else (no
//!   cookies, no client addresses, none of ours). No header and no query parameter that
//!   holds a tokenwarden secret goes: one of the fleet's secrets in any ASCII letter case, an
//!   agent credential (`twa1.…`) or a lease handle (`tw1.…`, `tw2.…`), also when
//!   percent-encoded once or twice. The query string passes otherwise as it came (Claude
//!   Code sends `?beta=true`).
//! - **What names the call**, each from the path or else its header
//!   (`x-tokenwarden-agent`, `-role`, `-task`, `-unblocks`; and
//!   `x-tokenwarden-failure-signature`): a caller with an agent credential may name only
//!   its own agent (403); an agent name is 1 to 128 UTF-16 units; a role one of `planner`,
//!   `reviewer`, `worker`, `auto` (`auto` when none is named: the core's choice); a task an
//!   id or a name of 1 to 256 units; `unblocks` an integer to 2³² − 1; a failure signature
//!   a non-negative integer to 2⁵³ − 1.
//!
//! ```
//! use tokenwarden_core::Role;
//! use tokenwarden_gateway::proxy::{Incoming, proxied_call};
//!
//! let headers = [
//!     ("x-api-key", "sk-ant-…"),
//!     ("cookie", "session=1"),
//!     ("x-tokenwarden-token", "the-fleet-secret-0123456789"),
//! ];
//! let call = proxied_call(&Incoming {
//!     rest: "/agent/alice/role/worker/v1/messages",
//!     search: "?beta=true",
//!     headers: &headers,
//!     secrets: &["the-fleet-secret-0123456789"],
//!     credential: None,
//! })
//! .unwrap();
//! assert_eq!((call.provider, call.path.as_str(), call.query.as_str()), ("anthropic", "/v1/messages", "?beta=true"));
//! assert_eq!(call.headers, [0]); // the key only
//! assert_eq!((call.agent.as_deref(), call.role), (Some("alice"), Role::Worker));
//! ```

use alloc::borrow::{Cow, ToOwned};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde_json::Value;
use tokenwarden_core::Role;
use tokenwarden_provider::identity::identity;

use crate::Refusal;

fn refused(status: u16, code: &'static str, message: String, field: Option<&str>) -> Refusal {
    let r = Refusal::new(status, code, message);
    match field {
        Some(f) => r.with_field(f),
        None => r,
    }
}

fn invalid(message: String, field: &'static str) -> Refusal {
    refused(400, "invalid_argument", message, Some(field))
}

/// A proxied request as the host read it.
#[derive(Clone, Copy, Debug)]
pub struct Incoming<'a> {
    /// The URL path after `…/proxy` (still percent-encoded).
    pub rest: &'a str,
    /// The URL's query string, `?…` or empty.
    pub search: &'a str,
    /// Its headers, names in lower case (as the Fetch API's `Headers` give them).
    pub headers: &'a [(&'a str, &'a str)],
    /// The fleet's secrets: never forwarded, in a header or the query string.
    pub secrets: &'a [&'a str],
    /// The agent of the caller's agent credential, if it presented one.
    pub credential: Option<&'a str>,
}

/// What to send and what names the call (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxiedCall {
    /// `anthropic` or `openai`: the API the request speaks, whose error format answers it.
    pub provider: &'static str,
    /// The provider's path, `/v1/…`, still percent-encoded as it came.
    pub path: String,
    /// The query string to send, `?…` or empty.
    pub query: String,
    /// The headers to send: their places in [`Incoming::headers`], in the order they came.
    pub headers: Vec<usize>,
    /// The agent named (the credential's, or the path's or header's), if any.
    pub agent: Option<String>,
    /// Who the call is: by the client's session headers (Claude Code's, Codex's; under a
    /// named agent, a subagent is a child of it, `alice/<id>`), else the agent named, else
    /// [`UNNAMED_AGENT`].
    pub name: String,
    /// The root of the call's family when it is a subagent (by default a family shares one
    /// place in the fair order).
    pub family: Option<String>,
    /// The role named, [`Role::Auto`] (the core's choice) when none is.
    pub role: Role,
    /// The task named (an id or a name, as given), if any.
    pub task: Option<String>,
    /// The downstream tasks the call unblocks, if named.
    pub unblocks: Option<u32>,
    /// The failure signature the call carries, if any.
    pub failure_signature: Option<u64>,
}

/// Who a proxied call is when neither its path, its headers, a credential nor its
/// client's session names it.
pub const UNNAMED_AGENT: &str = "proxy";

/// The keys a proxy path may name before the provider's path.
const PATH_KEYS: [&str; 4] = ["agent", "role", "task", "unblocks"];

/// The largest integer a JavaScript number holds exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// Reads a proxied request (see the module doc).
pub fn proxied_call(req: &Incoming<'_>) -> Result<ProxiedCall, Refusal> {
    let (path, named) = split_path(req.rest)?;
    if !path.starts_with("/v1/") {
        return Err(refused(
            404,
            "not_found",
            "proxy mode forwards the provider's /v1/… routes (after optional /agent/<a>, /role/<r>, /task/<t>, /unblocks/<n> segments)".to_owned(),
            None,
        ));
    }
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    };
    let pick = |key: usize| -> Option<String> {
        named[key]
            .clone()
            .or_else(|| header(HEADER_OF[key]).map(ToOwned::to_owned))
    };
    let agent = pick(0);
    if let (Some(own), Some(other)) = (req.credential, agent.as_deref()) {
        if own != other {
            return Err(refused(
                403,
                "forbidden",
                format!("this credential is {own}'s: x-tokenwarden-agent may only name that agent"),
                None,
            ));
        }
    }
    let agent = req.credential.map(ToOwned::to_owned).or(agent);
    if agent
        .as_deref()
        .is_some_and(|a| !(1..=128).contains(&units(a)))
    {
        return Err(invalid(
            "the agent name must be 1 to 128 characters".to_owned(),
            "x-tokenwarden-agent",
        ));
    }
    // The core's names for its roles.
    let role = match pick(1) {
        None => Role::Auto,
        Some(r) => serde_json::from_value(Value::String(r)).map_err(|_| {
            invalid(
                "`x-tokenwarden-role` must be planner, reviewer, worker or auto".to_owned(),
                "x-tokenwarden-role",
            )
        })?,
    };
    let failure_signature = match header("x-tokenwarden-failure-signature") {
        None => None,
        Some(s) => Some(digits(s, 16).filter(|&n| n <= MAX_SAFE).ok_or_else(|| {
            invalid(
                "`x-tokenwarden-failure-signature` must be a non-negative integer".to_owned(),
                "x-tokenwarden-failure-signature",
            )
        })?),
    };
    let task = pick(2);
    if task
        .as_deref()
        .is_some_and(|t| !(1..=256).contains(&units(t)))
    {
        return Err(invalid(
            "`x-tokenwarden-task` must be a task id (a non-negative integer) or a name (1 to 256 characters)".to_owned(),
            "x-tokenwarden-task",
        ));
    }
    let unblocks = match pick(3) {
        None => None,
        Some(s) => Some(
            digits(&s, 10)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    invalid(
                        "`x-tokenwarden-unblocks` must be an integer from 0 to 4294967295"
                            .to_owned(),
                        "x-tokenwarden-unblocks",
                    )
                })?,
        ),
    };
    let secrets: Vec<String> = req
        .secrets
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let headers = req
        .headers
        .iter()
        .enumerate()
        .filter(|(_, (name, value))| forwarded(name) && !holds_secret(value, &secrets))
        .map(|(i, _)| i)
        .collect();
    let kept: Vec<&str> = req
        .search
        .strip_prefix('?')
        .unwrap_or(req.search)
        .split('&')
        .filter(|pair| !pair.is_empty() && !holds_secret(pair, &secrets))
        .collect();
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let session = identity(req.headers, agent.as_deref());
    let family = session.as_ref().and_then(|s| s.root.clone());
    let name = session
        .map(|s| s.name)
        .or_else(|| agent.clone())
        .unwrap_or_else(|| UNNAMED_AGENT.to_owned());
    Ok(ProxiedCall {
        provider: provider_of(&path, header("anthropic-version").is_some()),
        path,
        query,
        headers,
        agent,
        name,
        family,
        role,
        task,
        unblocks,
        failure_signature,
    })
}

/// How long a streamed proxied call may go without an answer (waiting in line, or for a 429
/// to clear) before its head is sent and SSE comments keep the connection alive, ms.
pub const KEEPALIVE_AFTER_MS: u64 = 1_000;
/// Between two keep-alive comments on a waiting stream, ms.
pub const KEEPALIVE_EVERY_MS: u64 = 2_000;

/// The SSE comment a waiting stream is sent every [`KEEPALIVE_EVERY_MS`]: still in line, or
/// sent and waiting for the provider's answer.
#[must_use]
pub fn keepalive_comment(sent: bool) -> &'static str {
    if sent {
        ": tokenwarden: sent, waiting for the provider\n\n"
    } else {
        ": tokenwarden: waiting for quota\n\n"
    }
}

/// What a client is answered for the provider's redirect (issue 43, N4): not the redirect —
/// a client following it would send its API key, and `x-tokenwarden-token` with the fleet's
/// secret, to wherever it points — but a 502 in `provider`'s error format naming where it
/// pointed (the origin of `location`, if it reads as a URL). Answers the status and body.
#[must_use]
pub fn redirect_answer(provider: &str, status: u16, location: Option<&str>) -> (u16, Value) {
    let to = location
        .and_then(origin_of)
        .unwrap_or_else(|| "elsewhere".to_owned());
    let message = format!(
        "the provider answered {status}, a redirect to {to}: tokenwarden does not hand it on (a client following it would send its key there)"
    );
    let tw = serde_json::json!({ "error": "upstream_redirect", "message": message });
    let body = tokenwarden_provider::errors::error_body(
        provider_of_name(provider),
        502,
        None,
        &message,
        &tw,
    );
    (502, body)
}

/// The provider of a proxied call by its name (`proxied_call`'s `provider`): Anthropic's
/// format for anything else.
fn provider_of_name(provider: &str) -> tokenwarden_provider::estimate::Provider {
    tokenwarden_provider::estimate::Provider::from_name(provider)
        .unwrap_or(tokenwarden_provider::estimate::Provider::Anthropic)
}

/// `scheme://host[:port]` of an absolute URL.
fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        return None;
    }
    Some(format!(
        "{}://{}",
        scheme.to_ascii_lowercase(),
        host.to_ascii_lowercase()
    ))
}

/// A streamed call answered before its outcome was known (kept alive) whose answer is not
/// a stream (an error, or JSON though a stream was asked): its error as one SSE event in
/// `provider`'s stream format, which the official SDKs raise as an API error — the
/// provider's own type and message where its body holds them, else its status and the
/// start of its body.
#[must_use]
pub fn answer_as_stream_error(provider: &str, status: u16, body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let err = parsed
        .as_ref()
        .and_then(|j| j.get("error"))
        .filter(|e| e.get("message").is_some_and(Value::is_string));
    let kind = err
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| tokenwarden_provider::errors::error_type(status));
    let message = match err.and_then(|e| e.get("message")).and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None if body.is_empty() => format!("the provider answered {status}"),
        None => {
            let text = String::from_utf8_lossy(body);
            let cut: String = text.chars().take(512).collect();
            format!("the provider answered {status}: {cut}")
        }
    };
    let tw = serde_json::json!({ "error": kind, "message": message });
    tokenwarden_provider::errors::error_event(
        provider_of_name(provider),
        status,
        Some(kind),
        &message,
        &tw,
    )
}

/// A kept-alive streamed call that ended without an answer: one SSE error event in
/// `provider`'s format, `code` tokenwarden's (`upstream_unreachable`, `upstream_timeout`, a
/// refusal's), with the status its stop has.
#[must_use]
pub fn failure_event(provider: &str, status: u16, code: &str, message: &str) -> String {
    let tw = serde_json::json!({ "error": code, "message": message });
    tokenwarden_provider::errors::error_event(
        provider_of_name(provider),
        status,
        None,
        &format!("tokenwarden: {message}"),
        &tw,
    )
}

/// The provider a proxied request speaks, for answering its errors in that provider's
/// format: `None` when its path cannot be read (answered in tokenwarden's own format).
#[must_use]
pub fn proxied_provider(rest: &str, anthropic_version: bool) -> Option<&'static str> {
    let (path, _) = split_path(rest).ok()?;
    Some(provider_of(&path, anthropic_version))
}

fn provider_of(path: &str, anthropic_version: bool) -> &'static str {
    if path.starts_with("/v1/messages") || anthropic_version {
        "anthropic"
    } else {
        "openai"
    }
}

/// The header each path key may come from instead.
const HEADER_OF: [&str; 4] = [
    "x-tokenwarden-agent",
    "x-tokenwarden-role",
    "x-tokenwarden-task",
    "x-tokenwarden-unblocks",
];

/// `/agent/a1/role/worker/v1/messages` → (`/v1/messages`, the values named per key).
fn split_path(rest: &str) -> Result<(String, [Option<String>; 4]), Refusal> {
    let parts: Vec<&str> = rest.split('/').collect();
    let mut named: [Option<String>; 4] = Default::default();
    let mut i = 1;
    while i + 1 < parts.len() {
        let Some(k) = PATH_KEYS.iter().position(|k| *k == parts[i]) else {
            break;
        };
        let key = PATH_KEYS[k];
        if named[k].is_some() {
            return Err(refused(
                400,
                "invalid_argument",
                format!("the proxy path names `{key}` twice"),
                None,
            ));
        }
        let value = percent_decode(parts[i + 1]).ok_or_else(|| {
            refused(
                400,
                "invalid_argument",
                format!("the proxy path's `{key}` is not valid percent-encoding"),
                None,
            )
        })?;
        if !(1..=256).contains(&units(&value)) {
            return Err(refused(
                400,
                "invalid_argument",
                format!("the proxy path's `{key}` must be 1 to 256 characters"),
                None,
            ));
        }
        named[k] = Some(value);
        i += 2;
    }
    Ok((format!("/{}", parts[i..].join("/")), named))
}

/// A string's length in UTF-16 units (what JavaScript counts as its characters).
fn units(s: &str) -> usize {
    s.encode_utf16().count()
}

/// `s` as an integer when it is 1 to `max` ASCII digits.
fn digits(s: &str, max: usize) -> Option<u64> {
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A hex digit's value.
fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Every `%XX` decoded, the bytes read as UTF-8; `None` for a `%` not followed by two hex
/// digits or bytes that are not UTF-8 (as `decodeURIComponent` refuses them).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = hex(*b.get(i + 1)?)?;
            let l = hex(*b.get(i + 2)?)?;
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Every well-formed `%XX` decoded to the character of that code (a byte as Latin-1, as a
/// header's value is read), stray `%`s left as they are.
fn latin1_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) {
                out.push(char::from(h << 4 | l));
                i += 3;
                continue;
            }
        }
        // Copy the whole character starting here.
        let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Whether a header this proxy forwards: see the module doc.
fn forwarded(name: &str) -> bool {
    const EXACT: [&str; 15] = [
        "content-type",
        "accept",
        "x-api-key",
        "authorization",
        "user-agent",
        "x-app",
        "originator",
        "version",
        "session-id",
        "session_id",
        "thread-id",
        "thread_id",
        "x-client-request-id",
        "x-openai-subagent",
        "chatgpt-account-id",
    ];
    const PREFIXES: [&str; 5] = [
        "anthropic-",
        "openai-",
        "x-stainless-",
        "x-claude-code-",
        "x-codex-",
    ];
    EXACT.contains(&name)
        || PREFIXES.iter().any(|p| {
            name.strip_prefix(p).is_some_and(|rest| {
                !rest.is_empty()
                    && rest
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
        })
}

/// Whether `value` holds one of `secrets` (in ASCII lower case) in any ASCII letter case,
/// or an agent credential or lease handle, as it is or percent-decoded once or twice.
fn holds_secret(value: &str, secrets: &[String]) -> bool {
    let mut form = Cow::Borrowed(value);
    for round in 0..3 {
        if round > 0 {
            // Nothing to decode (the common case): no other form.
            if !form.contains('%') {
                break;
            }
            let decoded = latin1_decode(&form);
            if decoded == *form {
                break;
            }
            form = Cow::Owned(decoded);
        }
        if has_handle(&form) {
            return true;
        }
        if !secrets.is_empty() {
            let lower = form.to_ascii_lowercase();
            if secrets.iter().any(|s| lower.contains(s.as_str())) {
                return true;
            }
        }
    }
    false
}

/// Whether `s` holds `tw1.`, `tw2.` or `twa1.` (any case) at its start or after a character
/// that is not a letter or digit, followed by at least one of `[A-Za-z0-9_-]` and a `.`:
/// the shape of a lease handle or an agent credential.
fn has_handle(s: &str) -> bool {
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    (0..b.len()).any(|i| {
        if !b[i].eq_ignore_ascii_case(&b't') || (i > 0 && b[i - 1].is_ascii_alphanumeric()) {
            return false;
        }
        let rest = &b[i..];
        if rest.len() < 3 || !rest[..2].eq_ignore_ascii_case(b"tw") {
            return false;
        }
        let after = if rest[2] == b'1' || rest[2] == b'2' {
            3
        } else if rest.len() > 3 && rest[2].eq_ignore_ascii_case(&b'a') && rest[3] == b'1' {
            4
        } else {
            return false;
        };
        if rest.get(after) != Some(&b'.') {
            return false;
        }
        let body = &rest[after + 1..];
        let n = body.iter().take_while(|&&c| word(c)).count();
        n > 0 && body.get(n) == Some(&b'.')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    const SECRET: &str = "Fleet-Secret-0123456789";

    fn call(rest: &str, search: &str, headers: &[(&str, &str)]) -> Result<ProxiedCall, Refusal> {
        call_as(rest, search, headers, None)
    }

    fn call_as(
        rest: &str,
        search: &str,
        headers: &[(&str, &str)],
        credential: Option<&str>,
    ) -> Result<ProxiedCall, Refusal> {
        proxied_call(&Incoming {
            rest,
            search,
            headers,
            secrets: &[SECRET, ""],
            credential,
        })
    }

    #[test]
    fn the_path_names_the_call_and_the_rest_is_the_provider_s() {
        let c = call(
            "/agent/a%20b/role/planner/task/fix-1/unblocks/3/v1/messages",
            "",
            &[],
        )
        .unwrap();
        assert_eq!(c.path, "/v1/messages");
        assert_eq!(c.agent.as_deref(), Some("a b"));
        assert_eq!(
            (c.role, c.task.as_deref(), c.unblocks),
            (Role::Planner, Some("fix-1"), Some(3))
        );
        assert_eq!(c.provider, "anthropic");
        // A key's segment after the provider's path is the provider's.
        let c = call("/v1/chat/completions/agent/x", "", &[]).unwrap();
        assert_eq!(
            (c.path.as_str(), c.agent, c.provider),
            ("/v1/chat/completions/agent/x", None, "openai")
        );
        // Headers name what the path does not; the path wins.
        let c = call(
            "/role/worker/v1/responses",
            "",
            &[
                ("x-tokenwarden-role", "reviewer"),
                ("x-tokenwarden-agent", "bob"),
                ("anthropic-version", "2023-06-01"),
            ],
        )
        .unwrap();
        assert_eq!(
            (c.role, c.agent.as_deref(), c.provider),
            (Role::Worker, Some("bob"), "anthropic")
        );
        assert_eq!(call("/v1/models", "", &[]).unwrap().role, Role::Auto);
    }

    #[test]
    fn a_bad_path_or_name_is_refused_naming_it() {
        let bad = |rest: &str, headers: &[(&str, &str)]| call(rest, "", headers).unwrap_err();
        assert_eq!(
            bad("/agent/a/agent/b/v1/messages", &[]).message,
            "the proxy path names `agent` twice"
        );
        assert_eq!(
            bad("/agent/%E0%A4/v1/messages", &[]).message,
            "the proxy path's `agent` is not valid percent-encoding"
        );
        assert_eq!(
            bad("/agent/%zz/v1/messages", &[]).message,
            "the proxy path's `agent` is not valid percent-encoding"
        );
        assert_eq!(
            bad("/agent//v1/messages", &[]).message,
            "the proxy path's `agent` must be 1 to 256 characters"
        );
        let r = bad("/agent/a/messages", &[]);
        assert_eq!((r.status, r.code), (404, "not_found"));
        for (header, value) in [
            ("x-tokenwarden-role", "boss"),
            ("x-tokenwarden-agent", ""),
            ("x-tokenwarden-failure-signature", "-1"),
            ("x-tokenwarden-failure-signature", "9007199254740992"),
            ("x-tokenwarden-unblocks", "4294967296"),
            ("x-tokenwarden-unblocks", "1e3"),
            ("x-tokenwarden-task", ""),
        ] {
            let r = bad("/v1/messages", &[(header, value)]);
            assert_eq!(
                (r.status, r.field.as_deref()),
                (400, Some(header)),
                "{header}: {value}"
            );
        }
        let long = "é".repeat(129);
        assert_eq!(
            bad("/v1/messages", &[("x-tokenwarden-agent", &long)])
                .field
                .as_deref(),
            Some("x-tokenwarden-agent")
        );
        assert_eq!(
            call(
                "/v1/messages",
                "",
                &[("x-tokenwarden-agent", &"é".repeat(128))]
            )
            .unwrap()
            .agent
            .map(|a| units(&a)),
            Some(128)
        );
        assert_eq!(
            call(
                "/v1/messages",
                "",
                &[("x-tokenwarden-failure-signature", "9007199254740991")]
            )
            .unwrap()
            .failure_signature,
            Some(MAX_SAFE)
        );
    }

    #[test]
    fn who_the_call_is_by_name_then_session_then_the_default() {
        let who = |rest: &str, headers: &[(&str, &str)]| {
            let c = call(rest, "", headers).unwrap();
            (c.name, c.family)
        };
        assert_eq!(who("/v1/messages", &[]), (UNNAMED_AGENT.to_owned(), None));
        assert_eq!(
            who("/agent/alice/v1/messages", &[]),
            ("alice".to_owned(), None)
        );
        let session = [("x-claude-code-session-id", "s1")];
        assert_eq!(who("/v1/messages", &session), ("s1".to_owned(), None));
        let sub = [
            ("x-claude-code-session-id", "s1"),
            ("x-claude-code-agent-id", "a7"),
        ];
        // A subagent: a child of its session, or of the agent named, in that family.
        assert_eq!(
            who("/v1/messages", &sub),
            ("s1/a7".to_owned(), Some("s1".to_owned()))
        );
        assert_eq!(
            who("/agent/alice/v1/messages", &sub),
            ("alice/a7".to_owned(), Some("alice".to_owned()))
        );
        // A credential's agent names the call as the path would.
        let c = call_as("/v1/messages", "", &sub, Some("bob")).unwrap();
        assert_eq!(
            (c.name.as_str(), c.family.as_deref()),
            ("bob/a7", Some("bob"))
        );
    }

    #[test]
    fn a_credential_names_only_its_own_agent() {
        let r = call_as("/agent/mallory/v1/messages", "", &[], Some("alice")).unwrap_err();
        assert_eq!((r.status, r.code), (403, "forbidden"));
        let r = call_as(
            "/v1/messages",
            "",
            &[("x-tokenwarden-agent", "mallory")],
            Some("alice"),
        )
        .unwrap_err();
        assert_eq!(r.status, 403);
        let c = call_as("/agent/alice/v1/messages", "", &[], Some("alice")).unwrap();
        assert_eq!(c.agent.as_deref(), Some("alice"));
        assert_eq!(
            call_as("/v1/messages", "", &[], Some("alice"))
                .unwrap()
                .agent
                .as_deref(),
            Some("alice")
        );
    }

    #[test]
    fn only_the_provider_s_and_the_client_s_headers_go_and_none_with_a_secret() {
        let sent = [
            ("content-type", "application/json"),
            ("x-api-key", "sk-ant-1"),
            ("anthropic-beta", "x"),
            ("anthropic-", "empty suffix"),
            ("x-stainless-os", "Linux"),
            ("x-claude-code-session-id", "s"),
            ("session_id", "s2"),
            ("cookie", "a=1"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-tokenwarden-token", SECRET),
            ("authorization", "Bearer fleet-secret-0123456789"),
            ("user-agent", "ua FLEET-SECRET-0123456789"),
            ("x-app", "cli%2520Fleet%252DSecret-0123456789"),
            ("x-stainless-lang", "twa1.alice.sig."),
            ("x-codex-x", "see TW2.f.q.1.sig"),
            ("openai-organization", "org-1"),
            ("originator", "stw1.a.b"),
        ];
        let c = call("/v1/messages", "", &sent).unwrap();
        let names: Vec<&str> = c.headers.iter().map(|&i| sent[i].0).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "x-api-key",
                "anthropic-beta",
                "x-stainless-os",
                "x-claude-code-session-id",
                "session_id",
                "openai-organization",
                "originator"
            ]
        );
    }

    #[test]
    fn the_query_goes_without_a_parameter_that_holds_a_secret() {
        assert_eq!(
            call("/v1/messages", "?beta=true", &[]).unwrap().query,
            "?beta=true"
        );
        assert_eq!(call("/v1/messages", "", &[]).unwrap().query, "");
        let q = call(
            "/v1/messages",
            &format!("?key={SECRET}&beta=true&&h=tw1.f.q.1.x&e=Fleet%2DSecret%2D0123456789"),
            &[],
        )
        .unwrap();
        assert_eq!(q.query, "?beta=true");
        assert_eq!(
            call("/v1/messages", "?key=fleet-secret-0123456789", &[])
                .unwrap()
                .query,
            ""
        );
    }

    #[test]
    fn the_provider_for_an_error_is_read_from_a_readable_path_only() {
        assert_eq!(
            proxied_provider("/agent/a/v1/messages", false),
            Some("anthropic")
        );
        assert_eq!(
            proxied_provider("/v1/chat/completions", false),
            Some("openai")
        );
        assert_eq!(
            proxied_provider("/v1/chat/completions", true),
            Some("anthropic")
        );
        assert_eq!(proxied_provider("/agent/%zz/v1/messages", false), None);
    }

    #[test]
    fn handles_are_found_where_javascript_s_pattern_finds_them() {
        for (s, yes) in [
            ("tw1.a.", true),
            ("x tw2.a-b_c.", true),
            ("TWA1.alice.", true),
            ("stw1.a.", false),
            ("tw1..", false),
            ("tw3.a.", false),
            ("tw1.a", false),
            ("-tw1.a.", true),
        ] {
            assert_eq!(has_handle(s), yes, "{s}");
        }
        assert_eq!(latin1_decode("%41%zz%"), "A%zz%");
        assert_eq!(latin1_decode("%E9"), "é");
        assert_eq!(percent_decode("%C3%A9"), Some("é".to_owned()));
        assert_eq!(
            vec![digits("0123", 4), digits("12345", 4), digits("", 4)],
            vec![Some(123), None, None]
        );
    }
}
