// The clock of the quota's Durable Object: the runtime's, or one a test moves by hand.
import { ManualClock } from 'tokenwarden-wasm'

/**
 * The clock of a Durable Object: Unix milliseconds and the runtime's timers. A waiting call
 * (a proxied call queued for refill, or waiting out a 429, or a long poll) holds its request
 * open, which keeps the object in memory, so its timer fires when its time comes. When no
 * request is open the object may be evicted with its timers; the alarm (set after every
 * change for the engine's next wake-up) survives that and reaps and grants then.
 *
 * Injected, for tests: where the Worker's environment sets `TOKENWARDEN_TEST_CLOCK=1`, the
 * operator's `POST …/admin/clock { advanceMs }` stops this object's time at the runtime's
 * and from then on moves it only by hand (a `ManualClock`: its timers fire as it passes
 * them), so a test of a wait asserts what happens at an instant, not within a wall-time
 * bound. Time given to the engine, the waits of calls and long polls, and the instants in
 * answers all come from here; the writes' batching timers and the alarm stay the runtime's.
 */
export class ObjectClock {
  /** @type {ManualClock | null} */
  #manual = null
  now() {
    return this.#manual === null ? Date.now() : this.#manual.now()
  }
  unixNow() {
    return this.#manual === null ? Date.now() : this.#manual.unixNow()
  }
  setTimer(fn, ms) {
    return this.#manual === null ? { real: setTimeout(fn, ms) } : { manual: this.#manual.setTimer(fn, ms) }
  }
  clearTimer(h) {
    if (h?.manual !== undefined) this.#manual?.clearTimer(h.manual)
    else clearTimeout(h?.real)
  }
  /** Whether a test moves this clock by hand. */
  get manual() {
    return this.#manual !== null
  }
  /** Stops time at the runtime's (the first time) and moves it `ms` forward; returns the new now. */
  async advance(ms) {
    if (this.#manual === null) {
      const t = Date.now()
      this.#manual = new ManualClock(t, t)
    }
    await this.#manual.advance(ms)
    return this.#manual.now()
  }
}
