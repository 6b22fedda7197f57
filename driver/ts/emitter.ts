/** A minimal typed event emitter that runs in Node, browsers and Workers alike. */
export class Emitter<Events extends object> {
  #listeners = new Map<keyof Events, Set<(payload: never) => void>>()

  /** Calls `fn` on every `name` event; returns a function that removes it. */
  on<K extends keyof Events>(name: K, fn: (payload: Events[K]) => void): () => void {
    let set = this.#listeners.get(name)
    if (set === undefined) {
      set = new Set()
      this.#listeners.set(name, set)
    }
    set.add(fn as (payload: never) => void)
    return () => this.off(name, fn)
  }

  /** Removes a listener added with `on`. */
  off<K extends keyof Events>(name: K, fn: (payload: Events[K]) => void): void {
    this.#listeners.get(name)?.delete(fn as (payload: never) => void)
  }

  /** Whether anyone listens for `name` (so callers can skip building payloads). */
  listening(name: keyof Events): boolean {
    const set = this.#listeners.get(name)
    return set !== undefined && set.size > 0
  }

  /** Calls the listeners; a listener that throws does not stop the others or the caller. */
  emit<K extends keyof Events>(name: K, payload: Events[K]): void {
    const set = this.#listeners.get(name)
    if (set === undefined) return
    for (const fn of set) {
      try {
        ;(fn as (payload: Events[K]) => void)(payload)
      } catch (err) {
        queueMicrotask(() => {
          throw err
        })
      }
    }
  }
}
