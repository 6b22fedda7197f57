// Bundlers (webpack, Vite, esbuild with a wasm plugin): the `bundler` build, which imports
// the .wasm as an ES module and is ready once imported.
import * as wasm from '../pkg/bundler/tokenwarden_wasm.js'
import { useTokenizers } from 'tokenwarden-driver'
import { enginesFor, fetchedRanks, tokenizersFor, tokenwardenFor } from './engine.js'

export * from 'tokenwarden-driver'
export { WasmEngine } from './engine.js'
/** Creates and restores engines backed by the wasm build. */
export const wasmEngines = enginesFor(wasm)
/** A `Tokenwarden` on the wasm engine. */
export const createTokenwarden = tokenwardenFor(wasmEngines, wasm.randomSeed)
/** The tokenizers the estimator counts with (the ranks fetched from `data/` beside this file, when first needed). */
export const wasmTokenizers = tokenizersFor(wasm, fetchedRanks)
useTokenizers(wasmTokenizers, false)
/** Ready once imported; here for symmetry with `web`. */
export async function init() {}
