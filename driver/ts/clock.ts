/** Where the driver gets time and timers; inject a fake one in tests. */
export interface Clock {
  /** Monotonic milliseconds (an integer), on any epoch: the `now` engines are given. */
  now(): number
  /** Wall-clock Unix milliseconds, for absolute reset instants in provider headers. */
  unixNow(): number
  /** Calls `fn` after `ms` milliseconds; returns a handle for `clearTimer`. */
  setTimer(fn: () => void, ms: number): unknown
  clearTimer(handle: unknown): void
  /**
   * Whether a pending timer keeps the process alive (Node's `ref`/`unref`); the driver
   * keeps it alive only while someone waits on it. Optional.
   */
  keepAlive?(handle: unknown, alive: boolean): void
}

/** The real clock: `performance.now()` (floored), `Date.now()`, `setTimeout`. */
export const systemClock: Clock = {
  now: () => Math.floor(performance.now()),
  unixNow: () => Date.now(),
  setTimer: (fn, ms) => setTimeout(fn, ms),
  clearTimer: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
  keepAlive(h, alive) {
    const t = h as { ref?: () => void; unref?: () => void }
    if (alive) t.ref?.()
    else t.unref?.()
  },
}

/** A clock you move by hand: timers fire during `advance`, in order. For tests. */
export class ManualClock implements Clock {
  #now: number
  #unixOffset: number
  #timers = new Map<number, { at: number; fn: () => void }>()
  #next = 1

  constructor(start = 0, unixStart = 1_767_225_600_000) {
    this.#now = start
    this.#unixOffset = unixStart - start
  }

  now(): number {
    return this.#now
  }

  unixNow(): number {
    return this.#now + this.#unixOffset
  }

  setTimer(fn: () => void, ms: number): unknown {
    const id = this.#next++
    this.#timers.set(id, { at: this.#now + Math.max(0, ms), fn })
    return id
  }

  clearTimer(handle: unknown): void {
    this.#timers.delete(handle as number)
  }

  /** Pending timers. */
  get pending(): number {
    return this.#timers.size
  }

  /** Moves time forward by `ms`, firing due timers in time order (and their microtasks). */
  async advance(ms: number): Promise<void> {
    const end = this.#now + ms
    for (;;) {
      let first: [number, { at: number; fn: () => void }] | undefined
      for (const entry of this.#timers) {
        if (entry[1].at <= end && (first === undefined || entry[1].at < first[1].at)) first = entry
      }
      if (first === undefined) break
      this.#timers.delete(first[0])
      this.#now = Math.max(this.#now, first[1].at)
      first[1].fn()
      await flush()
    }
    this.#now = end
    await flush()
  }
}

/** Lets pending promise callbacks run. */
async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await Promise.resolve()
}

/** Waits `ms` on `clock`; rejects with the signal's reason when `signal` aborts. */
export function sleep(clock: Clock, ms: number, signal?: AbortSignal | null): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const onAbort = (): void => {
      clock.clearTimer(handle)
      reject(signal?.reason)
    }
    const handle = clock.setTimer(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}
