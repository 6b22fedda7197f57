// The wasm build as an engine for the shared driver: the same `RegisterEngine` the Node
// addon's NativeEngine is, so `Driver`, `Tokenwarden` and the `fetch` wrapper from
// `tokenwarden-driver` run on it unchanged.
import { RegisterEngine, Tokenwarden, normalizeEngineError } from 'tokenwarden-driver'
import { WasmRegisters } from './registers.js'

/**
 * The wasm build's coordinator as an `Engine`: the shared `RegisterEngine` (hot calls through
 * a `Float64Array` register file, copied in and out of the coordinator's own in wasm memory:
 * `registers.js`; the rest as objects), plus `free()`.
 */
export class WasmEngine extends RegisterEngine {
  #c
  #registers
  /** @param {any} coordinator a `Coordinator` from the wasm module */
  constructor(coordinator) {
    const registers = new WasmRegisters(coordinator)
    super(registers)
    this.#c = coordinator
    this.#registers = registers
  }

  /**
   * Frees the wasm memory now (otherwise a FinalizationRegistry does it eventually). Any
   * later call throws.
   */
  free() {
    this.#registers.dispose()
    this.#c.free()
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
