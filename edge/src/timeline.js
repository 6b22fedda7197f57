// A quota's recent call events, for the dashboard's 429-vs-turn overlay and the ceilings
// named in the metrics and Prometheus: the gateway crate's timeline (in wasm, the same one
// native `tokenwarden serve` keeps), told the driver's call events. Kept in the Durable
// Object's memory only (a restart starts an empty ring); whatever a caller sends, the ring
// holds at most TIMELINE_MAX_EVENTS small records and the counters a fixed set of keys per
// pool. Only calls the Worker let through to the object are recorded.
import { Timeline as Ring } from 'tokenwarden-wasm'

/** How far back the timeline goes, ms (the gateway crate's `timeline::WINDOW_MS`). */
export const TIMELINE_WINDOW_MS = 10 * 60_000
/** Events kept at most (`timeline::MAX_EVENTS`). */
export const TIMELINE_MAX_EVENTS = 4096

const num = (v) => (typeof v === 'bigint' ? Number(v) : Number(v ?? 0))
const orNull = (v) => (v === null || v === undefined ? undefined : num(v))

export class Timeline {
  #ring = new Ring(Date.now())

  /** Listens to a driver's events (a fresh driver after a reset: listen again). */
  listen(tw) {
    tw.on('granted', (e) => this.#ring.granted(Date.now(), num(e.lease), num(e.agent), num(e.pool), num(e.waitedMs)))
    tw.on('expired', (e) => this.#ring.forget(num(e.lease)))
    tw.on('rejected', (e) => this.#ring.rejected(Date.now(), num(e.agent), num(e.pool), JSON.stringify(e.reason ?? null), orNull(e.retryAt)))
    tw.on('rate_limited', (e) => this.#ring.rateLimited(Date.now(), num(e.pool), orNull(e.lease), orNull(e.retryAfterMs), typeof e.exceeded === 'string' ? e.exceeded : undefined))
    // The fetch wrapper's waits (proxy mode): after a 429 or an overload (a wait after a
    // refusal is the `rejected` event).
    tw.on('waiting', (e) => this.#ring.waiting(Date.now(), num(e.agent), num(e.pool), Math.max(0, num(e.delayMs)), String(e.cause)))
  }

  /** Forgets everything (the quota was reset). */
  clear() {
    this.#ring.clear(Date.now())
  }

  /** How many events the ring holds now. */
  get size() {
    return this.#ring.size
  }

  /**
   * The events of the last TIMELINE_WINDOW_MS, oldest first, with agents by name (their id
   * as text where no name is known) and pools by name: what `GET …/timeline` answers.
   * @param {number} now Unix ms
   * @param {(id: number) => string | null} nameOf
   * @param {string[]} pools pool names by index
   */
  view(now, nameOf, pools) {
    const v = JSON.parse(this.#ring.view(now, JSON.stringify(pools)))
    for (const e of v.events) if (e.agent !== null) e.agent = nameOf(Number(e.agent)) ?? e.agent
    return v
  }

  /**
   * The counters by pool name: `{ since, pools: [{ pool, rateLimited: { <axis>: n },
   * rejected: { <reason>[:<axis>]: n } }] }` (pools with no 429 and no refusal left out).
   * @param {string[]} pools
   */
  ceilings(pools) {
    return JSON.parse(this.#ring.ceilings(JSON.stringify(pools)))
  }
}
