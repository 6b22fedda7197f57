/**
 * `tokenwarden` for Node.js: the shared driver and `fetch` wrapper on the native engine
 * where this platform has a prebuilt binary, on the WebAssembly engine otherwise.
 *
 * ```js
 * import { createTokenwarden } from 'tokenwarden'
 * const tw = createTokenwarden({ config: { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: 400000 }] } })
 * const client = new Anthropic({ fetch: tw.fetch(), maxRetries: 0 })
 * ```
 */
import { createRequire } from 'node:module'
import { NativeEngine, nativeCountTokens, nativeProviderRules, nativeEngines, nativeLoadError } from './native.js'
import { type CountText, type EngineFactory, type ProviderRules, type FleetPlan, type OpenAIEncoding, type Plan, Tokenwarden, TokenwardenError, type TokenwardenOptions, planFleetWith, useProviderRules } from 'tokenwarden-driver'

export * from 'tokenwarden-driver'
export { NativeEngine, nativeEngines, nativeLoadError }
export { Checkpoints } from './checkpoint.js'
export type { CheckpointOptions, Resumed, Turn } from './checkpoint.js'

/**
 * Which engine to run: `'native'` (the addon: a prebuilt binary for this platform),
 * `'wasm'` (the WebAssembly build, on every platform; the same decisions, a few times
 * slower per call) or `'auto'` (native where it loads, wasm otherwise).
 */
export type EngineChoice = 'auto' | 'native' | 'wasm'

/** Options for {@link createTokenwarden}: as for `Tokenwarden`, with the engine optional. */
export type CreateOptions = Omit<TokenwardenOptions, 'engine'> & { engine?: EngineFactory | EngineChoice }

const require = createRequire(import.meta.url)
let wasm: EngineFactory | null = null

/** The WebAssembly engine (`tokenwarden-wasm`), loaded the first time it is asked for. */
export function wasmEngines(): EngineFactory {
  wasm ??= wasmPackage().wasmEngines
  return wasm
}

/** The wasm package (`tokenwarden-wasm/nodejs`), loaded the first time it is needed. */
function wasmPackage(): { wasmEngines: EngineFactory; wasmProviderRules: ProviderRules; wasmTokenizers: (encoding: OpenAIEncoding) => CountText | Promise<CountText> } {
  return require('tokenwarden-wasm/nodejs')
}

/**
 * A counter of `encoding`'s tokens (the provider crate's tokenizer): the native addon's
 * where the engine chosen by default (see {@link engine}) is native, else the wasm build's
 * (its ranks read from its package).
 */
export function tokenizers(encoding: OpenAIEncoding): CountText | Promise<CountText> {
  if (engine().name === 'native') return (text: string) => nativeCountTokens(encoding, text)
  return wasmPackage().wasmTokenizers(encoding)
}

/**
 * The provider crate's rules the driver runs (its estimator, request shapes, error
 * formats): the native addon's where the engine chosen by default is native, else the wasm
 * build's.
 */
let chosen: ProviderRules | null = null
// Chosen once, at first use (every model call asks them): not `engine()` again per call.
const rules = (): ProviderRules => {
  chosen ??= engine().name === 'native' ? nativeProviderRules : wasmPackage().wasmProviderRules
  return chosen
}
useProviderRules({
  create: (options) => rules().create(options),
  callShape: (provider, body) => rules().callShape(provider, body),
  promptBytes: (provider, body) => rules().promptBytes(provider, body),
  errorAnswer: (provider, status, type, message, tokenwarden, stream) => rules().errorAnswer(provider, status, type, message, tokenwarden, stream),
  stopAnswer: (stop, retryAfterMs) => rules().stopAnswer(stop, retryAfterMs),
  countTokensBody: (body) => rules().countTokensBody(body),
  countTokensPause: (status, retryAfter, unixNowMs, pauseMs) => rules().countTokensPause(status, retryAfter, unixNowMs, pauseMs),
  checkFleets: (text, serveFile) => rules().checkFleets(text, serveFile),
  proxiedCall: (rest, search, headers, secrets, credential) => rules().proxiedCall(rest, search, headers, secrets, credential),
  proxiedProvider: (rest, anthropicVersion) => rules().proxiedProvider(rest, anthropicVersion),
  limiterAnswer: (status, code, retryAfter, waitedMs, timeoutMs) => rules().limiterAnswer(status, code, retryAfter, waitedMs, timeoutMs),
  identity: (kind, a, b) => rules().identity(kind, a, b),
})

/** The choice `'auto'` stands for: `TOKENWARDEN_ENGINE` if set, else `'auto'`. */
function defaultChoice(): EngineChoice {
  const env = process.env.TOKENWARDEN_ENGINE
  if (env === undefined || env === '') return 'auto'
  if (env === 'auto' || env === 'native' || env === 'wasm') return env
  throw new TokenwardenError('invalid_argument', `TOKENWARDEN_ENGINE must be auto, native or wasm, got ${JSON.stringify(env)}`, { field: 'TOKENWARDEN_ENGINE' })
}

/**
 * The engine a choice resolves to here, and why: `engine('auto')` is `'native'` where the
 * prebuilt addon loads on this platform and `'wasm'` otherwise. The default is
 * `TOKENWARDEN_ENGINE` (auto, native or wasm), else `'auto'`.
 */
export function engine(choice: EngineChoice = defaultChoice()): { name: 'native' | 'wasm'; reason: string } {
  if (choice === 'wasm') return { name: 'wasm', reason: 'asked for' }
  const missing = nativeLoadError()
  if (choice === 'native') {
    if (missing !== null) throw missing
    return { name: 'native', reason: 'asked for' }
  }
  if (choice !== 'auto') throw new TokenwardenError('invalid_argument', `engine must be auto, native, wasm or an engine factory, got ${JSON.stringify(choice)}`, { field: 'engine' })
  return missing === null
    ? { name: 'native', reason: `a prebuilt binary for ${process.platform}-${process.arch} loaded` }
    : { name: 'wasm', reason: missing.message }
}

/** The engine factory for a choice (see {@link engine}). */
export function engines(choice: EngineChoice = defaultChoice()): EngineFactory {
  return engine(choice).name === 'native' ? nativeEngines : wasmEngines()
}

/**
 * A {@link Tokenwarden} on the native engine where this platform has a prebuilt binary and
 * on the WebAssembly engine otherwise; `engine` forces either (or passes a factory).
 */
export function createTokenwarden(options: CreateOptions): Tokenwarden {
  const choice = options.engine ?? defaultChoice()
  const factory = typeof choice === 'string' ? engines(choice) : choice
  return new Tokenwarden({ ...options, engine: factory })
}

/**
 * Sizes a fleet before it runs, with the core's arithmetic: for a pool's limits and a
 * description of the agents (per kind: how many, calls a minute, input tokens of the first
 * and the last call of a session, output tokens, the cached share, call length, fan-out),
 * each limited axis's late-session demand and share of its limit, the binding axis, how many
 * agents of the same mix fit at the headroom (75 % by default) and how much each turn
 * stretches when the fleet is too big. `tokenwarden plan <fleet.json>` prints it.
 *
 * ```js
 * planFleet({ pool: { name: 'key', input_tokens_per_minute: 400000 }, agents: [{ name: 'worker', count: 20, calls_per_minute_milli: 667, input_tokens_first: 2000, input_tokens_last: 60000, output_tokens: 1000 }] })
 * ```
 */
export function planFleet(plan: FleetPlan | string, choice: EngineChoice = defaultChoice()): Plan {
  const factory = engines(choice)
  if (factory.planFleet === undefined) throw new TokenwardenError('engine_unavailable', 'this engine cannot size fleets')
  return planFleetWith((json) => (factory.planFleet as (json: string) => string)(json), plan)
}
