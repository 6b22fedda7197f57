// Bundlers (webpack, Vite, esbuild with a wasm plugin): the `bundler` build, which imports
// the .wasm as an ES module and is ready once imported.
import * as wasm from '../pkg/bundler/tokenwarden_wasm.js'
import { useProviderRules } from 'tokenwarden-driver'
import { enginesFor, fetchedRanks, providerRulesFor, tokenwardenFor } from './engine.js'

export * from 'tokenwarden-driver'
export { WasmEngine } from './engine.js'
/** The members of one quota, for a gateway's host (the gateway crate's rule; see index.d.ts). */
export const MemberTable = wasm.MemberTable
/** A quota's recent call events and ceilings, for a gateway's host (the gateway crate's timeline; see index.d.ts). */
export const Timeline = wasm.Timeline
/** The operator's wait lines (the gateway crate's wait log; see index.d.ts). */
export const WaitLog = wasm.WaitLog
/** The gateway crate's rules without state (routes, authentication), one JSON text in and out (see index.d.ts). */
export const gatewayRule = wasm.gatewayRule
/** Creates and restores engines backed by the wasm build. */
export const wasmEngines = enginesFor(wasm)
/** A `Tokenwarden` on the wasm engine. */
export const createTokenwarden = tokenwardenFor(wasmEngines, wasm.randomSeed)
/** The tokenizers (the ranks fetched from `data/` beside this file when first needed). */
const provider = providerRulesFor(wasm, fetchedRanks)
/** A counter of an encoding's tokens (the provider crate's tokenizer; a promise while its ranks load). */
export const wasmTokenizers = provider.counter
/** The provider crate's rules the driver runs (its estimator, request shapes, error formats; registered on import). */
export const wasmProviderRules = provider.rules
useProviderRules(wasmProviderRules, false)
/** Ready once imported; here for symmetry with `web`. */
export async function init() {}
