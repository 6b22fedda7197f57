/**
 * The operator's view of waiting, as lines of text: one for each wait longer than a few
 * seconds (who waits, on which pool and ceiling, for how long at most, how many are in
 * line), one when such a wait ends, and a short summary once a minute while anything
 * happens. `tokenwarden serve` on workerd turns it on (`TOKENWARDEN_WAIT_LOG=1`), so the
 * lines appear in the terminal serve runs in; a deployed Worker logs nothing unless
 * configured so.
 *
 * The lines are the gateway crate's wait log (in wasm, the same one native serve prints):
 * this listens to the driver's events, hands them over with the metrics where a line reads
 * them, and prints what it answers. It decides nothing.
 */
import { WaitLog as Lines, gatewayRule } from 'tokenwarden-wasm'

const num = (v) => (typeof v === 'bigint' ? Number(v) : Number(v ?? 0))
/** JSON text with bigints written as numbers. */
const text = (value) => JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? Number(v) : v))

/**
 * The ceiling a pool (its metrics) is held by now: every concurrency slot taken, else the
 * recent binding axis, else the gating axis with the least room; `unknown` without one.
 * @param {Record<string, unknown> | undefined} pool
 */
export function ceilingOf(pool) {
  return JSON.parse(gatewayRule(text({ op: 'ceiling', ...(pool === undefined ? {} : { pool }) }))).text
}

/**
 * `text` with every control character (C0, DEL, C1, the Unicode line and paragraph
 * separators) as a `\uXXXX` escape: one line, and no terminal escape sequence.
 * @param {string} value
 */
export function printable(value) {
  return JSON.parse(gatewayRule(text({ op: 'printable', text: String(value) }))).text
}

export class WaitLog {
  /**
   * @param {import('tokenwarden-wasm').Tokenwarden} tw the Tokenwarden driver (events and metrics)
   * @param {(agent: number) => string} nameOf an agent's name for an id
   * @param {(line: string) => void} print
   * @param {() => number} now Unix ms
   */
  constructor(tw, nameOf, print = (line) => console.log(line), now = Date.now) {
    const lines = new Lines(now())
    /** The metrics as JSON text, where a line at `t` about a wait of `waitMs` reads them. */
    const metrics = (t, waitMs = 0) => {
      if (!lines.wantsMetrics(t, waitMs)) return undefined
      try {
        return text(tw.metrics())
      } catch {
        return undefined
      }
    }
    const out = (ls) => {
      for (const l of ls) print(l)
    }
    // A name is the caller's (a header, a path segment): the wait log escapes its control
    // characters, so no name can end a line and forge another (issue 43, N9).
    const name = (agent) => String(nameOf(num(agent)))
    tw.on('queued', (e) => {
      const t = now()
      out(lines.queued(t, num(e.lease), name(e.agent), num(e.pool), num(e.agent), num(e.eta), num(e.etaMs), e.checkpoint === true, metrics(t, num(e.etaMs))))
    })
    tw.on('granted', (e) => {
      const t = now()
      out(lines.granted(t, num(e.lease), num(e.waitedMs), metrics(t)))
    })
    tw.on('waiting', (e) => {
      const t = now()
      out(lines.waiting(t, name(e.agent), num(e.pool), num(e.agent), num(e.delayMs), String(e.message), metrics(t, num(e.delayMs))))
    })
    tw.on('rate_limited', () => {
      const t = now()
      out(lines.rateLimited(t, metrics(t)))
    })
    tw.on('rejected', () => {
      const t = now()
      out(lines.rejected(t, metrics(t)))
    })
  }
}
