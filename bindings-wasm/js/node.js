// Node.js: the `nodejs` build (synchronous load of the .wasm next to it).
import wasm from '../pkg/nodejs/tokenwarden_wasm.js'
import { enginesFor, tokenwardenFor } from './engine.js'

export * from 'tokenwarden-driver'
export { WasmEngine } from './engine.js'
/** Creates and restores engines backed by the wasm build. */
export const wasmEngines = enginesFor(wasm)
/** A `Tokenwarden` on the wasm engine. */
export const createTokenwarden = tokenwardenFor(wasmEngines, wasm.randomSeed)
/** The build is ready as soon as it is imported; here for symmetry with `web`. */
export async function init() {}
