/**
 * The operator's view of waiting, as lines of text: one for each wait longer than a few
 * seconds (who waits, on which pool and ceiling, for how long at most, how many are in
 * line), one when such a wait ends, and a short summary once a minute while anything
 * happens. `tokenwarden serve` turns it on (`TOKENWARDEN_WAIT_LOG=1`), so the lines appear
 * in the terminal serve runs in; a deployed Worker logs nothing unless configured so.
 *
 * It only listens to the engine's events and reads its metrics: it decides nothing.
 */

/** A wait shorter than this is not worth a line. */
export const LONG_WAIT_MS = 3_000
/** Between two summaries. */
export const SUMMARY_MS = 60_000
/** Waits remembered until they end (a ticket withdrawn without a grant is dropped last-in). */
const MAX_OPEN = 4_096

const seconds = (ms) => (ms < 10_000 ? (ms / 1000).toFixed(1) : String(Math.round(ms / 1000)))

const AXIS = { input_tokens: 'input tokens/min', output_tokens: 'output tokens/min', tokens: 'tokens/min', requests: 'requests/min', concurrent: 'parallel requests' }

/**
 * The ceiling a pool is held by now: the recent binding axis, else the gating axis with the
 * least room (as a share of its capacity), else concurrency when every slot is taken.
 */
export function ceilingOf(pool) {
  if (pool === undefined) return 'unknown'
  if (pool.maxConcurrent !== null && pool.maxConcurrent !== undefined && Number(pool.inFlight) >= Number(pool.maxConcurrent)) {
    return `concurrency (${pool.inFlight}/${pool.maxConcurrent} in flight)`
  }
  if (pool.bindingAxis) return AXIS[pool.bindingAxis] ?? pool.bindingAxis
  /** @type {{ axis: string, room: number } | null} */
  let worst = null
  for (const a of pool.axes ?? []) {
    if (a.limit === null || Number(a.capacity) <= 0) continue
    const room = Number(a.available) / Number(a.capacity)
    if (worst === null || room < worst.room) worst = { axis: a.axis, room }
  }
  return worst === null ? 'unknown' : (AXIS[worst.axis] ?? worst.axis)
}

export class WaitLog {
  #tw
  #nameOf
  #print
  #now
  /** lease → { agent, pool, since } for waits announced and not yet ended */
  #open = new Map()
  #minute = { start: 0, waits: 0, longest: 0, granted: 0, rateLimited: 0, refused: 0 }

  /**
   * @param {import('tokenwarden-wasm').Tokenwarden} tw the Tokenwarden driver (events and metrics)
   * @param {(agent: number) => string} nameOf an agent's name for an id
   * @param {(line: string) => void} print
   * @param {() => number} now Unix ms
   */
  constructor(tw, nameOf, print = (line) => console.log(line), now = Date.now) {
    this.#tw = tw
    // A name is the caller's (a header, a path segment): shown with its control characters
    // escaped, so no name can end a line and forge another (issue 43, N9).
    this.#nameOf = (agent) => printable(nameOf(agent))
    this.#print = print
    this.#now = now
    this.#minute.start = now()
    tw.on('queued', (e) => this.#queued(e))
    tw.on('granted', (e) => this.#granted(e))
    tw.on('waiting', (e) => this.#waiting(e))
    tw.on('rate_limited', () => {
      this.#minute.rateLimited++
      this.#tick()
    })
    tw.on('rejected', () => {
      this.#minute.refused++
      this.#tick()
    })
  }

  #pool(index) {
    try {
      return this.#tw.metrics().pools[index]
    } catch {
      return undefined
    }
  }

  /** The metrics of the pool and of the agent, read once. */
  #look(pool, agent) {
    try {
      const m = this.#tw.metrics()
      return { pool: m.pools[pool], agent: m.agents.find((a) => Number(a.agent) === agent) }
    } catch {
      return { pool: undefined, agent: undefined }
    }
  }

  #queued(e) {
    if (e.etaMs >= LONG_WAIT_MS) {
      const { pool, agent } = this.#look(e.pool, Number(e.agent))
      const name = this.#nameOf(Number(e.agent))
      if (this.#open.size >= MAX_OPEN) this.#open.delete(this.#open.keys().next().value)
      this.#open.set(e.lease, { name, since: this.#now() })
      const depth = pool?.queueDepth ?? '?'
      // The expected wait (the core's expected grant for the agent's first ticket in line)
      // and the bound (the decision's eta).
      const at = agent?.activity?.state === 'queued' ? agent.activity.expectedGrant : null
      const expected = at === null || at === undefined ? null : Math.max(0, Number(at) - Number(e.eta) + e.etaMs)
      this.#print(
        `tokenwarden: ${name} waits for quota on ${pool?.name ?? `pool ${e.pool}`} (ceiling: ${ceilingOf(pool)}), ` +
          `${expected === null ? '' : `expected ${seconds(expected)} s, `}at most ${seconds(e.etaMs)} s, ${depth} in line${e.checkpoint ? '; told to checkpoint its turn' : ''}`,
      )
    }
    this.#tick()
  }

  #granted(e) {
    this.#minute.granted++
    const waited = Number(e.waitedMs ?? 0)
    if (waited > 0) this.#minute.longest = Math.max(this.#minute.longest, waited)
    const open = this.#open.get(e.lease)
    if (open !== undefined) {
      this.#open.delete(e.lease)
      this.#minute.waits++
      this.#print(`tokenwarden: ${open.name} served after ${seconds(waited)} s in line`)
    } else if (waited >= LONG_WAIT_MS) {
      this.#minute.waits++
    }
    this.#tick()
  }

  #waiting(e) {
    if (e.delayMs >= LONG_WAIT_MS) {
      const { pool, agent } = this.#look(e.pool, Number(e.agent))
      this.#minute.waits++
      // The ceiling: the limit a 429 named or showed spent (the core's activity), else the
      // pool's.
      const axis = agent?.activity?.state === 'rate_limited' ? agent.activity.axis : null
      const ceiling = axis ? (AXIS[axis] ?? axis) : ceilingOf(pool)
      this.#print(`tokenwarden: ${this.#nameOf(Number(e.agent))} on ${pool?.name ?? `pool ${e.pool}`} (ceiling: ${ceiling}): ${e.message}`)
    }
    this.#tick()
  }

  /** The summary of the minute just past, once a minute passed since the last one. */
  #tick() {
    const now = this.#now()
    const m = this.#minute
    if (now - m.start < SUMMARY_MS) return
    const pools = (() => {
      try {
        return this.#tw.metrics().pools
      } catch {
        return []
      }
    })()
    const state = pools.map((p) => `${p.name}: margin ${Math.round(p.marginPermille / 10)} %, ${p.queueDepth} in line, ${p.inFlight} in flight, held by ${ceilingOf(p)}`).join('; ')
    this.#print(
      `tokenwarden: last ${Math.round((now - m.start) / 1000)} s: ${m.granted} calls granted, ${m.waits} waited over ${LONG_WAIT_MS / 1000} s` +
        (m.longest > 0 ? ` (longest ${seconds(m.longest)} s)` : '') +
        `, ${m.rateLimited} answered 429 by the provider, ${m.refused} refused` +
        (state === '' ? '' : ` — ${state}`),
    )
    this.#minute = { start: now, waits: 0, longest: 0, granted: 0, rateLimited: 0, refused: 0 }
  }
}

/**
 * `text` with every control character (C0, DEL, C1, the Unicode line and paragraph
 * separators) as a `\uXXXX` escape: one line, and no terminal escape sequence.
 * @param {string} text
 */
export function printable(text) {
  let out = ''
  for (const c of String(text)) {
    const n = c.codePointAt(0) ?? 0
    const control = n < 0x20 || (n >= 0x7f && n <= 0x9f) || n === 0x2028 || n === 0x2029
    out += control ? `\\u${n.toString(16).padStart(4, '0')}` : c
  }
  return out
}
