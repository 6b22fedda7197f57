// Cloudflare Workers / workerd: the `web` build initialised synchronously from the .wasm
// module the runtime imports (Workers compile `.wasm` imports ahead of time).
import { initSync } from '../pkg/web/tokenwarden_wasm.js'
import * as wasm from '../pkg/web/tokenwarden_wasm.js'
import module from '../pkg/web/tokenwarden_wasm_bg.wasm'
import { useProviderRules } from 'tokenwarden-driver'
import { enginesFor, providerRulesFor, tokenwardenFor } from './engine.js'

initSync({ module })

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
/**
 * The tokenizers: the ranks are data modules of the Worker
 * (`data/*.bpe`; a bundler copies them, and the runtime's module rules load `.bpe` as
 * `Data`), imported when first needed.
 */
const provider = providerRulesFor(wasm, async (encoding) =>
  (encoding === 'o200k_base' ? await import('../data/o200k_base.bpe') : await import('../data/cl100k_base.bpe')).default,
)
/** A counter of an encoding's tokens (the provider crate's tokenizer; a promise while its ranks load). */
export const wasmTokenizers = provider.counter
/** The provider crate's rules the driver runs (its estimator, request shapes, error formats; registered on import). */
export const wasmProviderRules = provider.rules
useProviderRules(wasmProviderRules, false)
/** Already initialised; here for symmetry with `web`. */
export async function init() {}
