// Who a proxied call is when nothing names it (no agent in the path, no
// `x-tokenwarden-agent`, no credential): the agent's own session headers. Claude Code sends
// `x-claude-code-session-id` on every call, `x-claude-code-agent-id` on a subagent's and
// `x-claude-code-parent-agent-id` on a nested subagent's (API.md, "What clients send");
// Codex sends `session_id` (or `session-id`); a Codex subagent's call also carries
// `x-openai-subagent` (its kind: `review`, `compact`, `collab_spawn`, …) and, for a spawned
// one, its own `thread-id` and `x-codex-parent-thread-id`. A session's main thread is named
// by the session id, a subagent by `<session>/<agent id>` (Codex: its thread id, else its
// kind); its parent is the main thread, or `<session>/<parent agent id>` when the call names
// one other than the main thread.
//
// Everything here is bounded: ids of at most 64 characters of [A-Za-z0-9._:-] (anything
// else is ignored, as if not sent), at most MAX_PARENTS parents with children remembered
// (least recently seen forgotten first), each with at most MAX_CHILDREN, each child
// forgotten CHILD_LIVE_MS after its last call.

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$/

/** How long after its last call a subagent counts as live. */
export const CHILD_LIVE_MS = 60_000
/** Parents whose children are remembered, per quota. */
export const MAX_PARENTS = 1024
/** Children remembered per parent (the core counts `unblocks` up to 32 by default). */
export const MAX_CHILDREN = 32

/** A header's value if it is a well-formed id, else null. */
function idFrom(headers, ...names) {
  for (const name of names) {
    const v = headers.get(name)
    if (v !== null) return ID.test(v) ? v : null
  }
  return null
}

/**
 * The agent a call's session headers name: `{ name, parent }` (`parent` null for a
 * session's main thread), or null when they name none.
 * @param {Headers} headers
 */
export function sessionIdentity(headers) {
  const claude = idFrom(headers, 'x-claude-code-session-id')
  if (claude !== null) {
    const agent = idFrom(headers, 'x-claude-code-agent-id')
    if (agent === null) return { name: claude, parent: null }
    return child(claude, agent, idFrom(headers, 'x-claude-code-parent-agent-id'))
  }
  const session = idFrom(headers, 'session_id', 'session-id')
  if (session === null) return null
  // Codex: a subagent by its own thread, else (review, compaction: the main thread's own
  // helpers) by its kind. A thread id equal to the session's is the main thread.
  const kind = idFrom(headers, 'x-openai-subagent')
  const thread = idFrom(headers, 'thread-id', 'thread_id')
  const agent = thread !== null && thread !== session ? thread : kind
  if (agent === null) return { name: session, parent: null }
  return child(session, agent, idFrom(headers, 'x-codex-parent-thread-id'))
}

/** Subagent `agent` of `session`, its parent `parent` (an agent id; the session's own id or none: the main thread). */
function child(session, agent, parent) {
  return { name: `${session}/${agent}`, parent: parent === null || parent === session ? session : `${session}/${parent}` }
}

/**
 * Who a proxied call is, and the family it belongs to: `{ name, parent, root }`, `root` the
 * name of the family's root (null for a root itself). Under a name the URL or a credential
 * gives (`base`: `alice`), a subagent the session headers show is `alice/<its id>`, a child
 * of `alice` (or of `alice/<parent id>` when nested): the named agent is the root of its
 * session's family, whatever the session id. With no name, the session's main thread is
 * the root (`<session>`) and its subagents `<session>/<id>`. Only the caller's own name is
 * extended: a member names its own subagents, never another's. Null when nothing names the
 * call.
 * @param {string | null} base
 * @param {{ name: string, parent: string | null } | null} session from {@link sessionIdentity}
 */
export function familyIdentity(base, session) {
  if (base === null) {
    if (session === null) return null
    return { ...session, root: session.parent === null ? null : session.name.slice(0, session.name.indexOf('/')) }
  }
  if (session === null || session.parent === null) return { name: base, parent: null, root: null }
  // The session part ends at the first '/': ids hold none.
  const own = (name) => name.slice(name.indexOf('/') + 1)
  const parent = session.parent.includes('/') ? `${base}/${own(session.parent)}` : base
  return { name: `${base}/${own(session.name)}`, parent, root: base }
}

/** Parents and their live children, as their calls show them (bounded, see above). */
export class Family {
  /** parent name → Map(child name → last seen, Unix ms), least recently seen first */
  #parents = new Map()

  /** Records a call of `identity` (from {@link sessionIdentity}) at `now`. */
  seen(identity, now) {
    if (identity?.parent == null) return
    let children = this.#parents.get(identity.parent)
    if (children === undefined) children = new Map()
    else this.#parents.delete(identity.parent)
    this.#parents.set(identity.parent, children)
    if (this.#parents.size > MAX_PARENTS) this.#parents.delete(this.#parents.keys().next().value)
    children.delete(identity.name)
    children.set(identity.name, now)
    if (children.size > MAX_CHILDREN) children.delete(children.keys().next().value)
  }

  /** How many children of `name` made a call in the last CHILD_LIVE_MS. */
  live(name, now) {
    const children = this.#parents.get(name)
    if (children === undefined) return 0
    for (const [child, at] of children) {
      if (now - at <= CHILD_LIVE_MS) break
      children.delete(child)
    }
    if (children.size === 0) this.#parents.delete(name)
    return children.size
  }
}
