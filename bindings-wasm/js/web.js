// Browsers: the `web` build. Call `await init()` once (it fetches the .wasm next to the
// module, or takes a URL, Response, bytes or a compiled WebAssembly.Module).
import initWasm, * as wasm from '../pkg/web/tokenwarden_wasm.js'
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
/** The tokenizers (the ranks fetched from `data/` beside this file when first needed). */
const provider = providerRulesFor(wasm, fetchedRanks)
/** A counter of an encoding's tokens (the provider crate's tokenizer; a promise while its ranks load). */
export const wasmTokenizers = provider.counter
/** The provider crate's rules the driver runs (its estimator, request shapes, error formats; registered on import). */
export const wasmProviderRules = provider.rules
useProviderRules(wasmProviderRules, false)
/** Loads and instantiates the .wasm; resolves when engines can be created. */
export async function init(input) {
  await initWasm(input === undefined ? undefined : { module_or_path: input })
}
/** Creates and restores engines backed by the wasm build (after `init()`). */
export const wasmEngines = enginesFor(wasm)
/** A `Tokenwarden` on the wasm engine (after `init()`). */
export const createTokenwarden = tokenwardenFor(wasmEngines, wasm.randomSeed)
