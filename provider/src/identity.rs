//! Who a call is when nothing else names it: the agent's own session headers, as Claude
//! Code and Codex send them, and the family a subagent belongs to.
//!
//! Claude Code sends `x-claude-code-session-id` on every call, `x-claude-code-agent-id` on
//! a subagent's and `x-claude-code-parent-agent-id` on a nested subagent's; Codex sends
//! `session_id` (or `session-id`), and a subagent's call also carries `x-openai-subagent`
//! (its kind: `review`, `compact`, `collab_spawn`, …) and, for a spawned one, its own
//! `thread-id` and `x-codex-parent-thread-id`. A session's main thread is named by the
//! session id, a subagent `<session>/<agent id>` (Codex: its thread id, else its kind); its
//! parent is the main thread, or `<session>/<parent agent id>` when the call names one other
//! than the main thread. An id is 1 to 64 characters of `[A-Za-z0-9._:-]` starting with a
//! letter or digit; anything else is ignored, as if not sent.

use alloc::format;
use alloc::string::String;

/// Who a call is: its name, its parent's (`None` for a session's main thread or a named
/// agent), and its family's root (`None` for a root itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The agent's name.
    pub name: String,
    /// The agent that spawned it.
    pub parent: Option<String>,
    /// The root of its family.
    pub root: Option<String>,
}

/// The longest id taken from a header.
pub const MAX_ID: usize = 64;

/// A header's value if it is a well-formed id (`headers` as name/value pairs, names in any
/// case; a header sent twice is its values joined by `, `, which is no id).
fn id_from<'a>(headers: &'a [(&str, &str)], names: &[&str]) -> Option<&'a str> {
    for name in names {
        let mut values = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v);
        if let Some(first) = values.next() {
            if values.next().is_some() {
                return None;
            }
            return is_id(first).then_some(first);
        }
    }
    None
}

fn is_id(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// The agent a call's session headers name: `(name, parent)`, or `None`.
fn session(headers: &[(&str, &str)]) -> Option<(String, Option<String>)> {
    if let Some(claude) = id_from(headers, &["x-claude-code-session-id"]) {
        return Some(match id_from(headers, &["x-claude-code-agent-id"]) {
            None => (claude.into(), None),
            Some(agent) => child(
                claude,
                agent,
                id_from(headers, &["x-claude-code-parent-agent-id"]),
            ),
        });
    }
    let session = id_from(headers, &["session_id", "session-id"])?;
    // Codex: a subagent by its own thread, else (review, compaction: the main thread's own
    // helpers) by its kind. A thread id equal to the session's is the main thread.
    let kind = id_from(headers, &["x-openai-subagent"]);
    let thread = id_from(headers, &["thread-id", "thread_id"]);
    let agent = thread.filter(|t| *t != session).or(kind);
    Some(match agent {
        None => (session.into(), None),
        Some(agent) => child(
            session,
            agent,
            id_from(headers, &["x-codex-parent-thread-id"]),
        ),
    })
}

/// Subagent `agent` of `session`, its parent `parent` (an agent id; the session's own id or
/// none: the main thread).
fn child(session: &str, agent: &str, parent: Option<&str>) -> (String, Option<String>) {
    let parent = match parent {
        None => String::from(session),
        Some(p) if p == session => String::from(session),
        Some(p) => format!("{session}/{p}"),
    };
    (format!("{session}/{agent}"), Some(parent))
}

/// Who a call is, and the family it belongs to. Under a name the URL or a credential gives
/// (`base`: `alice`), a subagent the session headers show is `alice/<its id>`, a child of
/// `alice` (or of `alice/<parent id>` when nested): the named agent is the root of its
/// session's family, whatever the session id. With no name, the session's main thread is
/// the root (`<session>`) and its subagents `<session>/<id>`. Only the caller's own name is
/// extended: a member names its own subagents, never another's. `None` when nothing names
/// the call.
#[must_use]
pub fn identity(headers: &[(&str, &str)], base: Option<&str>) -> Option<Identity> {
    let session = session(headers);
    let Some(base) = base else {
        let (name, parent) = session?;
        let root = parent
            .is_some()
            .then(|| String::from(name.split('/').next().unwrap_or(&name)));
        return Some(Identity { name, parent, root });
    };
    let own = |name: &str| String::from(name.split_once('/').map_or(name, |(_, id)| id));
    match session {
        Some((name, Some(parent))) => {
            let parent = if parent.contains('/') {
                format!("{base}/{}", own(&parent))
            } else {
                String::from(base)
            };
            Some(Identity {
                name: format!("{base}/{}", own(&name)),
                parent: Some(parent),
                root: Some(String::from(base)),
            })
        }
        _ => Some(Identity {
            name: String::from(base),
            parent: None,
            root: None,
        }),
    }
}

/// A stable task id for a task's name, as every host reads it (the npm package's
/// `taskIdFor`, the HTTP API's `task`): a name of 1 to 16 digits that is an exact integer
/// below 2^53 is that number (`"1234"` is task 1234, so an issue number works as either),
/// any other its 53-bit FNV-1a hash (collisions are negligible).
#[must_use]
pub fn task_id_for(name: &str) -> u64 {
    if (1..=16).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = name.parse::<u64>() {
            if n < 1 << 53 {
                return n;
            }
        }
    }
    hash53(&[name])
}

/// A failure signature: a hash of the failing test's name and the diff under test, never
/// their content, as every host computes it (the npm package's `failureSignature`). The diff
/// counts by its changed lines only (`+`/`-` lines, trailing whitespace trimmed, the `+++` /
/// `---` file headers and hunk positions left out), so the same failure after an unrelated
/// edit moved the lines is still the same signature.
#[must_use]
pub fn failure_signature(test: &str, diff: &str) -> u64 {
    let mut parts = alloc::vec![test.trim()];
    for line in diff.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if (line.starts_with('+') || line.starts_with('-'))
            && !line.starts_with("+++")
            && !line.starts_with("---")
        {
            parts.push(line.trim_end());
        }
    }
    hash53(&parts)
}

/// FNV-1a over 32 bits of a name's UTF-16 code units: a stable agent id for a name where no
/// keyed id is made (the npm fetch wrapper's `agentIdFor`, which a remote driver sends for
/// its credential's agent).
#[must_use]
pub fn agent_id_for(name: &str) -> u64 {
    let mut h: u32 = 0x811c_9dc5;
    for unit in name.encode_utf16() {
        h ^= u32::from(unit);
        h = h.wrapping_mul(0x0100_0193);
    }
    u64::from(h)
}

/// FNV-1a over 64 bits of `parts` joined by NUL, folded to 53 bits (an exact JavaScript
/// `number`).
#[must_use]
pub fn hash53(parts: &[&str]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h = h.wrapping_mul(PRIME);
        }
        for b in part.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(PRIME);
        }
    }
    (h ^ (h >> 53)) & ((1 << 53) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn who(headers: &[(&str, &str)]) -> Option<(String, Option<String>)> {
        identity(headers, None).map(|i| (i.name, i.parent))
    }

    fn pair(name: &str, parent: Option<&str>) -> Option<(String, Option<String>)> {
        Some((name.to_string(), parent.map(ToString::to_string)))
    }

    #[test]
    fn claude_code_sessions_and_subagents() {
        assert_eq!(who(&[]), None);
        assert_eq!(who(&[("x-claude-code-session-id", "s1")]), pair("s1", None));
        assert_eq!(
            who(&[
                ("X-Claude-Code-Session-Id", "s1"),
                ("x-claude-code-agent-id", "a1")
            ]),
            pair("s1/a1", Some("s1"))
        );
        assert_eq!(
            who(&[
                ("x-claude-code-session-id", "s1"),
                ("x-claude-code-agent-id", "a2"),
                ("x-claude-code-parent-agent-id", "a1")
            ]),
            pair("s1/a2", Some("s1/a1"))
        );
        // A malformed parent id: the child of the main thread.
        assert_eq!(
            who(&[
                ("x-claude-code-session-id", "s1"),
                ("x-claude-code-agent-id", "a2"),
                ("x-claude-code-parent-agent-id", "../x")
            ]),
            pair("s1/a2", Some("s1"))
        );
        assert_eq!(who(&[("x-claude-code-session-id", "/etc")]), None);
        let long = "x".repeat(64);
        assert_eq!(who(&[("session_id", &long)]), pair(&long, None));
        assert_eq!(who(&[("session_id", &"x".repeat(65))]), None);
        // Sent twice: no id.
        assert_eq!(
            who(&[
                ("x-claude-code-session-id", "a"),
                ("x-claude-code-session-id", "b")
            ]),
            None
        );
    }

    #[test]
    fn codex_threads_and_helpers() {
        assert_eq!(
            who(&[("session-id", "r"), ("thread-id", "r")]),
            pair("r", None)
        );
        assert_eq!(
            who(&[
                ("session-id", "r"),
                ("thread-id", "c"),
                ("x-codex-parent-thread-id", "r"),
                ("x-openai-subagent", "collab_spawn")
            ]),
            pair("r/c", Some("r"))
        );
        assert_eq!(
            who(&[
                ("session-id", "r"),
                ("thread-id", "d"),
                ("x-codex-parent-thread-id", "c")
            ]),
            pair("r/d", Some("r/c"))
        );
        assert_eq!(
            who(&[("session_id", "r"), ("x-openai-subagent", "compact")]),
            pair("r/compact", Some("r"))
        );
        assert_eq!(
            who(&[("session_id", "r"), ("x-openai-subagent", "no spaces")]),
            pair("r", None)
        );
    }

    #[test]
    fn families_with_and_without_a_name() {
        let id = |name: &str, parent: Option<&str>, root: Option<&str>| Identity {
            name: name.into(),
            parent: parent.map(Into::into),
            root: root.map(Into::into),
        };
        let main = [("x-claude-code-session-id", "s1")];
        let sub = [
            ("x-claude-code-session-id", "s1"),
            ("x-claude-code-agent-id", "a1"),
        ];
        let nested = [
            ("x-claude-code-session-id", "s1"),
            ("x-claude-code-agent-id", "a2"),
            ("x-claude-code-parent-agent-id", "a1"),
        ];
        assert_eq!(identity(&[], None), None);
        assert_eq!(identity(&main, None), Some(id("s1", None, None)));
        assert_eq!(
            identity(&nested, None),
            Some(id("s1/a2", Some("s1/a1"), Some("s1")))
        );
        assert_eq!(identity(&[], Some("alice")), Some(id("alice", None, None)));
        assert_eq!(
            identity(&main, Some("alice")),
            Some(id("alice", None, None))
        );
        assert_eq!(
            identity(&sub, Some("alice")),
            Some(id("alice/a1", Some("alice"), Some("alice")))
        );
        assert_eq!(
            identity(&nested, Some("alice")),
            Some(id("alice/a2", Some("alice/a1"), Some("alice")))
        );
    }

    #[test]
    fn task_ids_are_the_npm_packages() {
        // The npm package's `taskIdFor` on the same names.
        assert_eq!(super::task_id_for("fix-login"), 358_998_486_657_506);
        assert_eq!(super::task_id_for("1234"), 1234);
        assert_eq!(
            super::task_id_for("12345678901234567"),
            1_081_579_699_434_711
        );
        assert_eq!(super::task_id_for(""), 5_239_054_864_098_682);
        assert_eq!(super::task_id_for("é/ü"), 6_826_924_348_688_416);
    }

    #[test]
    fn signatures_and_agent_ids_are_the_npm_packages() {
        // The npm package's `failureSignature` and `agentIdFor` on the same input.
        let diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old line   \n+new line\n context";
        assert_eq!(
            super::failure_signature("test_login", diff),
            3_724_216_958_274_593
        );
        assert_eq!(super::failure_signature("  t  ", ""), 1_100_939_805_198_296);
        assert_eq!(
            super::failure_signature("t", "+a\r\n-b"),
            7_271_479_482_522_099
        );
        assert_eq!(super::agent_id_for("alice"), 2_267_157_479);
        assert_eq!(super::agent_id_for("é😀"), 1_154_239_905);
    }
}
