// The wasm build as an engine for the shared driver: the same interface the Node addon's
// NativeEngine implements (see tokenwarden's `Engine` type), so `Driver`, `Tokenwarden`
// and the `fetch` wrapper from `tokenwarden/driver` run on it unchanged.
import { Tokenwarden, normalizeEngineError } from 'tokenwarden/driver'

/** Wraps a wasm-bindgen `Coordinator` as an `Engine`. */
export class WasmEngine {
  #c
  /** @param {any} coordinator a `Coordinator` from the wasm module */
  constructor(coordinator) {
    this.#c = coordinator
    this.pools = Object.freeze(coordinator.pools)
  }

  poolId(name) {
    return this.#c.poolId(name) ?? null
  }

  requestLease(now, request) {
    return this.#call(() => this.#c.requestLease(now, request), 'requestLease')
  }

  settle(now, lease, usage) {
    return this.#call(() => this.#c.settle(now, lease, usage), 'settle')
  }

  cancel(now, lease) {
    this.#call(() => this.#c.cancel(now, lease), 'cancel')
  }

  handleResponse(now, pool, lease, status, headers, unixNowMs) {
    return this.#call(() => this.#c.handleResponse(now, pool, lease ?? null, status, headers, unixNowMs ?? null), 'handleResponse')
  }

  handleTimeout(now) {
    this.#call(() => this.#c.handleTimeout(now), 'handleTimeout')
  }

  pollTimeout() {
    return this.#c.pollTimeout()
  }

  pollEvent() {
    return this.#c.pollEvent()
  }

  backoff(state, retryAfterMs) {
    return this.#call(() => this.#c.backoff(state, retryAfterMs ?? null), 'backoff')
  }

  metrics(now) {
    return this.#call(() => this.#c.metrics(now), 'metrics')
  }

  snapshot() {
    return this.#c.snapshot()
  }

  /** Internal consistency check; throws naming the broken invariant. */
  check() {
    this.#c.check()
  }

  /** Frees the wasm memory now (otherwise a FinalizationRegistry does it eventually). */
  free() {
    this.#c.free()
  }

  #call(f, what) {
    try {
      return f()
    } catch (e) {
      throw normalizeEngineError(e, what)
    }
  }
}

/** An `EngineFactory` over an initialised wasm module's exports. */
export function enginesFor(wasm) {
  return {
    create(config, seed, now) {
      try {
        const json = typeof config === 'string' ? config : JSON.stringify(config)
        return new WasmEngine(new wasm.Coordinator(json, seed, now))
      } catch (e) {
        throw normalizeEngineError(e, 'create')
      }
    },
    restore(snapshot) {
      try {
        return new WasmEngine(wasm.Coordinator.restore(snapshot))
      } catch (e) {
        throw normalizeEngineError(e, 'restore')
      }
    },
  }
}

/** `createTokenwarden` for an engine factory: a `Tokenwarden` with a random seed by default. */
export function tokenwardenFor(engines, randomSeed) {
  return (options) => new Tokenwarden({ seed: randomSeed(), ...options, engine: options.engine ?? engines })
}
