// Node.js: the `nodejs` build (synchronous load of the .wasm next to it).
import { readFileSync } from 'node:fs'
import { useProviderRules } from 'tokenwarden-driver'
import wasm from '../pkg/nodejs/tokenwarden_wasm.js'
import { enginesFor, providerRulesFor, tokenwardenFor } from './engine.js'

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
/** The tokenizers (the ranks read from `data/` beside this file when first needed). */
const provider = providerRulesFor(wasm, (encoding) =>
  readFileSync(encoding === 'o200k_base' ? new URL('../data/o200k_base.bpe', import.meta.url) : new URL('../data/cl100k_base.bpe', import.meta.url)),
)
/** A counter of an encoding's tokens (the provider crate's tokenizer; a promise while its ranks load). */
export const wasmTokenizers = provider.counter
/** The provider crate's rules the driver runs (its estimator, request shapes, error formats; registered on import). */
export const wasmProviderRules = provider.rules
useProviderRules(wasmProviderRules, false)
/** The build is ready as soon as it is imported; here for symmetry with `web`. */
export async function init() {}
