// The subagents a proxied call's parent has live. Who a call is (its name, parent and
// family, from Claude Code's and Codex's session headers; API.md, "What clients send") is
// the provider crate's rule, asked through the engine (`tw.engine.callerIdentity`); this
// keeps, per quota, which children each parent was seen with.
//
// Bounded: at most MAX_PARENTS parents with children remembered (least recently seen
// forgotten first), each with at most MAX_CHILDREN, each child forgotten CHILD_LIVE_MS after
// its last call.

/** How long after its last call a subagent counts as live. */
export const CHILD_LIVE_MS = 60_000
/** Parents whose children are remembered, per quota. */
export const MAX_PARENTS = 1024
/** Children remembered per parent (the core counts `unblocks` up to 32 by default). */
export const MAX_CHILDREN = 32

/** Parents and their live children, as their calls show them (bounded, see above). */
export class Family {
  /** parent name → Map(child name → last seen, Unix ms), least recently seen first */
  #parents = new Map()

  /** Records a call of `identity` (`{ name, parent }`, from `engine.callerIdentity`) at `now`. */
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
