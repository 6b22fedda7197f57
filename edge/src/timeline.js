// A quota's recent call events, for the dashboard's 429-vs-turn overlay (seed 003's test:
// do the 429 waves line up with the work or with the retries?) and the ceilings named in
// Prometheus. Kept in the Durable Object's memory only (a restart starts an empty ring):
//
// - a ring of at most TIMELINE_MAX_EVENTS events, of the last TIMELINE_WINDOW_MS: call
//   starts (`send`, a grant: the call goes to the provider now; `waitedMs` the time it
//   queued first), refusals (`refused` until a time, the core's reason and axis), 429s
//   (`rate_limited`, the provider's own limit type in `exceeded`) and the waits a proxied
//   call sits out after a 429 or an overload (`backoff` until a time);
// - counters since the object started: 429s by the limit the provider named, refusals by
//   reason (and axis, for `exceeds_capacity`), per pool.
//
// Everything here comes from the driver's events, so only calls the Worker let through to
// the object are recorded: authenticated ones and the proxied calls of a fleet that takes
// them without a secret (`proxy_open`). Whatever a caller sends, the ring holds at most
// TIMELINE_MAX_EVENTS small records and the counters a fixed set of keys per pool.

/** How far back the timeline goes, ms. */
export const TIMELINE_WINDOW_MS = 10 * 60_000
/** Events kept at most (the oldest are overwritten). */
export const TIMELINE_MAX_EVENTS = 4096
/** Granted leases remembered for naming the agent of a 429 (the event names only the lease). */
const MAX_LEASE_AGENTS = 4096

/** The limit types a provider names (the core's `exceeded`), and `unknown` for none. */
export const RATE_LIMIT_AXES = ['requests', 'tokens', 'input_tokens', 'output_tokens', 'concurrent', 'unknown']
/** The core's refusal kinds. */
export const REFUSAL_REASONS = ['exceeds_capacity', 'wait_too_long', 'queue_full', 'too_many_leases', 'too_many_agents']
const AXES = ['input_tokens', 'output_tokens', 'tokens', 'requests']

export class Timeline {
  /** @type {Array<{ t: number, agent: number | null, pool: number | string, [field: string]: unknown } | undefined>} */
  #ring = new Array(TIMELINE_MAX_EVENTS)
  #next = 0
  #size = 0
  /** lease → agent, of granted leases (least recently granted first) */
  #leaseAgent = new Map()
  /** pool index → { rateLimited: Map<axis, n>, rejected: Map<reason key, n> } */
  #ceilings = new Map()
  /** When the counters started (Unix ms). */
  since = Date.now()

  /** Listens to a driver's events (a fresh driver after a reset: listen again). */
  listen(tw) {
    tw.on('granted', (e) => {
      const agent = num(e.agent)
      this.#leaseAgent.delete(e.lease)
      this.#leaseAgent.set(e.lease, agent)
      if (this.#leaseAgent.size > MAX_LEASE_AGENTS) this.#leaseAgent.delete(this.#leaseAgent.keys().next().value)
      this.#push({ t: Date.now(), kind: 'send', agent, pool: poolOf(e.pool), waitedMs: num(e.waitedMs) })
    })
    const forget = (e) => this.#leaseAgent.delete(e.lease)
    tw.on('expired', forget)
    tw.on('rejected', (e) => {
      const reason = typeof e.reason?.kind === 'string' && REFUSAL_REASONS.includes(e.reason.kind) ? e.reason.kind : 'other'
      const axis = reason === 'exceeds_capacity' && AXES.includes(e.reason.axis) ? e.reason.axis : null
      this.#count(poolOf(e.pool), 'rejected', axis === null ? reason : `${reason}:${axis}`)
      this.#push({ t: Date.now(), kind: 'refused', agent: num(e.agent), pool: poolOf(e.pool), until: e.retryAt === null || e.retryAt === undefined ? null : num(e.retryAt), reason, axis })
    })
    tw.on('rate_limited', (e) => {
      const exceeded = RATE_LIMIT_AXES.includes(e.exceeded) ? e.exceeded : null
      this.#count(poolOf(e.pool), 'rateLimited', exceeded ?? 'unknown')
      const agent = e.lease === null || e.lease === undefined ? null : (this.#leaseAgent.get(e.lease) ?? null)
      const t = Date.now()
      const retryAfterMs = e.retryAfterMs === null || e.retryAfterMs === undefined ? null : num(e.retryAfterMs)
      this.#push({ t, kind: 'rate_limited', agent, pool: poolOf(e.pool), exceeded, retryAfterMs, until: retryAfterMs === null ? null : t + retryAfterMs })
    })
    // The fetch wrapper's waits (proxy mode): after a 429 or an overload. Its waits after a
    // refusal are the `rejected` events above.
    tw.on('waiting', (e) => {
      if (e.cause !== 'rate_limited' && e.cause !== 'overloaded') return
      const t = Date.now()
      this.#push({ t, kind: 'backoff', agent: num(e.agent), pool: poolOf(e.pool), until: t + Math.max(0, num(e.delayMs)), cause: e.cause })
    })
  }

  /** Forgets everything (the quota was reset). */
  clear() {
    this.#ring = new Array(TIMELINE_MAX_EVENTS)
    this.#next = 0
    this.#size = 0
    this.#leaseAgent.clear()
    this.#ceilings.clear()
    this.since = Date.now()
  }

  #push(event) {
    this.#ring[this.#next] = event
    this.#next = (this.#next + 1) % TIMELINE_MAX_EVENTS
    this.#size = Math.min(this.#size + 1, TIMELINE_MAX_EVENTS)
  }

  #count(pool, what, key) {
    let c = this.#ceilings.get(pool)
    if (c === undefined) {
      c = { rateLimited: new Map(), rejected: new Map() }
      this.#ceilings.set(pool, c)
    }
    c[what].set(key, (c[what].get(key) ?? 0) + 1)
  }

  /** How many events the ring holds now. */
  get size() {
    return this.#size
  }

  /**
   * The events of the last TIMELINE_WINDOW_MS, oldest first, with agents by name (their id
   * as text where no name is known) and pools by name: what `GET …/timeline` answers.
   *
   * @param {number} now Unix ms
   * @param {(id: number) => string | null} nameOf
   * @param {string[]} pools pool names by index
   */
  view(now, nameOf, pools) {
    const from = now - TIMELINE_WINDOW_MS
    const events = []
    for (let i = 0; i < this.#size; i++) {
      const e = this.#ring[(this.#next - this.#size + i + TIMELINE_MAX_EVENTS) % TIMELINE_MAX_EVENTS]
      if (e === undefined || e.t < from) continue
      const { agent, pool, ...rest } = e
      events.push({ ...rest, agent: agent === null ? null : (nameOf(agent) ?? String(agent)), pool: typeof pool === 'string' ? pool : (pools[pool] ?? String(pool)) })
    }
    return { now, from, windowMs: TIMELINE_WINDOW_MS, maxEvents: TIMELINE_MAX_EVENTS, events }
  }

  /**
   * The counters by pool name: `{ since, pools: [{ pool, rateLimited: { <axis>: n },
   * rejected: { <reason>[:<axis>]: n } }] }` (pools with no 429 and no refusal left out).
   */
  ceilings(pools) {
    const out = []
    for (const [pool, c] of this.#ceilings) {
      out.push({ pool: typeof pool === 'string' ? pool : (pools[pool] ?? String(pool)), rateLimited: Object.fromEntries(c.rateLimited), rejected: Object.fromEntries(c.rejected) })
    }
    return { since: this.since, pools: out }
  }
}

/** A pool as an event names it: its index, or its name as given. */
function poolOf(v) {
  return typeof v === 'string' ? v : num(v)
}

function num(v) {
  return typeof v === 'bigint' ? Number(v) : Number(v ?? 0)
}
