// Cloudflare Workers / workerd: the `web` build initialised synchronously from the .wasm
// module the runtime imports (Workers compile `.wasm` imports ahead of time).
import { initSync } from '../pkg/web/tokenwarden_wasm.js'
import * as wasm from '../pkg/web/tokenwarden_wasm.js'
import module from '../pkg/web/tokenwarden_wasm_bg.wasm'
import { enginesFor, tokenwardenFor } from './engine.js'

initSync({ module })

export * from 'tokenwarden-driver'
export { WasmEngine } from './engine.js'
/** Creates and restores engines backed by the wasm build. */
export const wasmEngines = enginesFor(wasm)
/** A `Tokenwarden` on the wasm engine. */
export const createTokenwarden = tokenwardenFor(wasmEngines, wasm.randomSeed)
/** Already initialised; here for symmetry with `web`. */
export async function init() {}
