/**
 * The engine backed by the native addon (napi-rs over `tokenwarden-core`): a
 * {@link RegisterEngine} whose register file the addon keeps attached.
 */
import { createRequire } from 'node:module'
import type * as Binding from '../binding.js'
import { type EngineFactory, type LeaseRequest, RegisterEngine, type RegisterBinding, type SameUnion, type U64, type Usage, normalizeEngineError } from 'tokenwarden-driver'

const require = createRequire(import.meta.url)
const binding = require('../binding.cjs') as typeof Binding

/** The addon's coordinator as an {@link Engine}. */
export class NativeEngine extends RegisterEngine {
  /** Wraps an addon coordinator (use `nativeEngines.create` / `.restore`). */
  constructor(coordinator: Binding.Coordinator) {
    super(coordinator as unknown as RegisterBinding, (io) => coordinator.attachIo(io))
  }
}

/** Creates and restores {@link NativeEngine}s. */
export const nativeEngines: EngineFactory = {
  create(config: object | string, seed: U64, now: U64): NativeEngine {
    const json = typeof config === 'string' ? config : JSON.stringify(config)
    try {
      return new NativeEngine(new binding.Coordinator(json, seed, now))
    } catch (e) {
      throw normalizeEngineError(e, 'create')
    }
  },
  restore(snapshot: string): NativeEngine {
    try {
      return new NativeEngine(binding.Coordinator.restore(snapshot))
    } catch (e) {
      throw normalizeEngineError(e, 'restore')
    }
  },
}

// Drift check, at compile time: the addon's napi-generated argument types (binding.d.ts, from
// convert.rs) have the driver's fields, which are checked against the Rust tables in turn.
type Holds<T extends true> = T
export type BindingDriftChecks = [
  Holds<SameUnion<keyof Binding.LeaseRequest, keyof LeaseRequest>>,
  Holds<SameUnion<keyof Binding.Usage, keyof Usage>>,
]
