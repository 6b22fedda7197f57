/**
 * The provider crate's rules as an engine package registers them with the driver: its
 * estimator, where a request keeps its model and output cap, each provider's error format,
 * and how Anthropic's `count_tokens` is asked. The driver's hosts call these; they keep no
 * such rule of their own.
 */
/**
 * The provider crate's estimator as an engine package exposes it (the napi addon's or the
 * wasm build's `Estimator`): bodies go in as JSON text, estimates come out as JSON text.
 */
export interface EstimatorCore {
  estimate(now: number, provider: string, model: string, body: string): string
  observe(id: number, now: number, provider: string, model: string, body: string | null | undefined, actual: number, usage: string | null | undefined): boolean
  forget(id: number): void
  knowsPrefixOf(provider: string, model: string, body: string): boolean
  recordPromptTokens(provider: string, model: string, body: string, tokens: number): void
  ratios(provider: string, model: string): ArrayLike<number>
  cachedPrefixes(): number
  needsTokenizer(provider: string, model: string): string | null | undefined
  /** Gives it `encoding`'s tokenizer (loading the ranks where the build does not hold them). */
  useTokenizer(encoding: string): void | Promise<void>
}

/**
 * The provider crate's rules as an engine package exposes them ({@link useProviderRules}):
 * the estimator, where a request body keeps its model and output cap, and each provider's
 * error format.
 */
export interface ProviderRules {
  /** An estimator from its options' camelCase JSON. */
  create(options: string): EstimatorCore
  /** `{"model","maxTokens","stream"}` of a body's JSON text. */
  callShape(provider: string, body: string): string
  /** `{"prefix","rest"}` of a body's JSON text. */
  promptBytes(provider: string, body: string): string
  /**
   * An error in the provider's format: its body (JSON text), or with `stream` one event of
   * its stream format; `type` null: the status's.
   */
  errorAnswer(provider: string, status: number, type: string | null | undefined, message: string, tokenwarden: string, stream: boolean): string
  /**
   * How tokenwarden answers a call it stops (`refused`, `gave_up`, `unknown_pool`,
   * `closed`, `restarting`, `unreachable`, `timed_out`; `retryAfterMs` a refusal's):
   * `[status, retry-after seconds or -1, x-should-retry 1 / 0 or -1 to leave it out]`.
   */
  stopAnswer(stop: string, retryAfterMs: number | null): number[]
  /** The `count_tokens` request for a Messages body's JSON text: the fields it counts. */
  countTokensBody(body: string): string
  /**
   * How long to stop counting after a failed `count_tokens` (ms): a 429 / 529's
   * `Retry-After`, else 30 s; any other failure `pauseMs`; at most 10 min.
   */
  countTokensPause(status: number | null, retryAfter: string | null, unixNowMs: number, pauseMs: number): number
  /**
   * The fleets configuration checked (the gateway crate's rule): the Worker's
   * `TOKENWARDEN_FLEETS` text, or with `serveFile` `tokenwarden serve --config`'s file.
   * Answers the fleets as JSON text; throws `invalid_config` naming the place as `field`.
   */
  checkFleets(text: string, serveFile: boolean): string
  /**
   * The proxy's first step for a proxied request (the gateway crate's rule): `rest` the
   * path after `…/proxy`, `search` its query, `headers` its header names and values in turn
   * joined by line feeds, `secrets` the fleet's, `credential` the caller's credential's
   * agent. Answers the JSON text of `{ call }` (its `headers` the places of the pairs to
   * send) or `{ refused }` (see `proxiedCall` in `gateway.ts`).
   */
  proxiedCall(rest: string, search: string, headers: string, secrets: string[], credential: string | null): string
  /** The provider a proxied request speaks, for its errors; null if its path cannot be read. */
  proxiedProvider(rest: string, anthropicVersion: boolean): string | null
  /**
   * What the remote driver does with an answer of the limiter (the gateway crate's rule):
   * its status, its JSON body's `error` code, its `Retry-After`, after `waitedMs` of asking
   * the same input again within `timeoutMs`. Answers the JSON text of `{ do: 'read' }`,
   * `{ do: 'refused' }` (the secret refused), `{ do: 'retry', afterMs }` (an owner moving:
   * ask again) or `{ do: 'unreachable' }` (lease locally at the process's share).
   */
  limiterAnswer(status: number, code: string | null, retryAfter: string | null, waitedMs: number, timeoutMs: number): string
  /**
   * An identity rule (the provider crate's): `task` (`a` a task's name: its id), `agent`
   * (`a` an agent's name: its 32-bit id) or `failure` (`a` a test's name, `b` a diff: the
   * failure signature).
   */
  identity(kind: 'task' | 'agent' | 'failure', a: string, b: string): number
}

let source: ProviderRules | null = null

/**
 * Sets where the provider crate's rules come from: the engine packages call it when they
 * are imported (`tokenwarden`: the native addon's, or the wasm build's where the addon does
 * not load; `tokenwarden-wasm`: its own), so the driver's estimators, request shapes and
 * error bodies are the provider crate's. With
 * `replace` false, only when none is set yet (the wasm package under the native package
 * that loaded it as its fallback).
 */
export function useProviderRules(s: ProviderRules, replace = true): void {
  if (s === null || typeof s !== 'object' || typeof s.create !== 'function')
    throw new TypeError(
      'useProviderRules needs { create, callShape, promptBytes, errorAnswer, stopAnswer, countTokensBody, countTokensPause, checkFleets, proxiedCall, proxiedProvider, limiterAnswer, identity } from an engine package',
    )
  if (!replace && source !== null) return
  source = s
}

/** The registered rules, or a clear error. */
export function providerRules(): ProviderRules {
  if (source === null) throw new Error("no provider rules: import an engine package ('tokenwarden' or 'tokenwarden-wasm'), whose provider crate the driver runs")
  return source
}

/** Whether an engine package has registered its rules yet. */
export function hasProviderRules(): boolean {
  return source !== null
}
