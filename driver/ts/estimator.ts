/**
 * Input-token estimation before a call. The default ({@link DefaultEstimator}) is the
 * provider crate's estimator (`tokenwarden-provider`'s `estimate` module), run by the engine
 * package in use: it counts an OpenAI prompt with the model's tokenizer, and an Anthropic
 * prompt with o200k_base as a proxy times each model's factors learned from settled usage
 * (or, opted in, by Anthropic's `count_tokens` endpoint), following each provider's
 * prompt-cache rules. Plug in your own through {@link Estimator}.
 */
import { type CountTokensOptions, CountTokensClient } from './counttokens.js'
import { invalidArgument } from './errors.js'
import type { Provider } from './providers.js'
import { type EstimatorCore, hasProviderRules, providerRules } from './rules.js'

/** What the estimator sees of a request. */
export interface EstimateInput {
  provider: Provider
  model: string
  /** The parsed JSON request body. */
  body: Record<string, unknown>
  /**
   * The body's JSON text as it is sent, when the caller has it (the `fetch` wrapper does):
   * the default estimator reads it rather than serializing `body` again.
   */
  text?: string
}

/** An estimate, in the coordinator's terms. */
export interface Estimate {
  /** Prompt tokens outside the cached prefix. */
  inputTokens: number
  /** Prompt tokens in the prefix the provider may serve from its prompt cache. */
  cachedPrefixTokens: number
  /**
   * The estimator saw the provider cache this very prefix (by content, for any agent) and
   * its lifetime has not run out: the coordinator then charges it as a cache read even on
   * an agent's first call. Leave it out when the cached part is only where the breakpoints
   * are; the coordinator then charges it as input unless this agent's own cache is warm.
   */
  cachedPrefixConfirmed?: boolean
}

/** A settled call's usage as the provider reported it, in tokens. */
export interface ObservedUsage {
  /** Uncached input (Anthropic: after the last cache breakpoint; OpenAI: the prompt less its cached part). */
  inputTokens: number
  /** Read from the prompt cache. */
  cacheReadInputTokens: number
  /** Written to the prompt cache (Anthropic). */
  cacheCreationInputTokens: number
  outputTokens: number
}

/** What a call turned out to use, for learning. */
export interface Observation {
  provider: Provider
  model: string
  body: Record<string, unknown>
  estimate: Estimate
  /** Every prompt token the provider counted (cached or not). */
  actualInputTokens: number
  /**
   * The whole usage (the `fetch` wrapper always gives it): with it the estimator knows the
   * prompt's prefixes exactly (Anthropic: cache read + cache write are the tokens up to the
   * last breakpoint). Optional for observations made by hand.
   */
  usage?: ObservedUsage
}

/**
 * Estimates input tokens; `observe` is called after each settled call with real usage.
 * Either may be asynchronous: the `fetch` wrapper awaits a promise (and only a promise:
 * a plain value costs no extra turn). An estimate that throws or rejects costs the caller
 * nothing: the call is estimated by the byte rule instead, with a `remote_error` event
 * (`operation: 'estimator'`); so is an `observe` that throws or rejects.
 */
export interface Estimator {
  estimate(input: EstimateInput): Estimate | Promise<Estimate>
  observe?(observation: Observation): void | Promise<void>
}

/** Counts the tokens of a text (special-token strings in it are ordinary text, as the API takes them). */
export type CountText = (text: string) => number

/** The byte-pair encodings of OpenAI's current models. */
export type OpenAIEncoding = 'o200k_base' | 'cl100k_base'

/** Options for {@link DefaultEstimator}. */
export interface BytesPerTokenOptions {
  /**
   * Bytes per token assumed for a model not seen yet (default 3). Low on purpose (English
   * prose runs near 4): an early over-estimate queues a little, an under-estimate risks a 429.
   */
  initialBytesPerToken?: number
  /**
   * With the tokenizer: Claude tokens per o200k_base token assumed for a model not seen yet
   * (default 1.2: Claude's tokenizers are reported to split text into 16–30 % more tokens
   * than o200k_base, prose the least and code the most).
   */
  initialTokensPerProxyToken?: number
  /** Weight of each new observation in the moving average (0..1]. */
  learningRate?: number
  /** Estimates are multiplied by this safety factor (default 1.02: 2 % high). */
  safety?: number
  /**
   * The estimator's clock, ms (default `Date.now`): when a remembered prompt prefix expires.
   * `estimate` is given no time, so the estimator keeps its own.
   */
  now?: () => number
  /** How many cached prompt prefixes are remembered, least recently used dropped first (default 4096). */
  cachedPrefixes?: number
  /**
   * A prefix below this many tokens is not remembered as cached (default 1024: Anthropic
   * caches nothing shorter, 2048 or 4096 on some models).
   */
  minCacheTokens?: number
}

/** Options for {@link DefaultEstimator}: those of the byte rule, and the two counters. */
export interface DefaultEstimatorOptions extends BytesPerTokenOptions {
  /**
   * Count with the tokenizers (default `true`): OpenAI prompts exactly with the model's
   * encoding (o200k_base, or cl100k_base for GPT-4 and GPT-3.5), Anthropic prompts with
   * o200k_base as a proxy for Claude's tokenizer. The engine package's tokenizer is given to
   * the estimator the first time it is needed (the wasm build loads its ranks then: that
   * estimate waits, 10–50 ms). Where it cannot be had, or with `false`, the byte rule.
   */
  tokenizer?: boolean
  /**
   * Count Anthropic prompts with Anthropic's `count_tokens` endpoint (opt-in): a prompt of
   * which no prefix is known yet is counted once (the estimate waits for it, at most
   * `timeoutMs`), and a later prompt that begins with one known (the next turn of the
   * conversation, or the same prompt again) is not: its new part goes by the estimator. A
   * failed count (timeout, network, 429, 5xx) falls back at once and pauses counting for a
   * while.
   */
  countTokens?: CountTokensOptions
}

const NUMBER_OPTIONS = ['initialBytesPerToken', 'initialTokensPerProxyToken', 'learningRate', 'safety', 'cachedPrefixes', 'minCacheTokens'] as const

/**
 * tokenwarden's default estimator (what `Tokenwarden` uses unless given another): the
 * provider crate's estimator (see the Rust crate's `estimate` module for its rules) through
 * the engine package in use.
 *
 * - **OpenAI**: the prompt is counted, not guessed: each text with the model's tokenizer,
 *   plus OpenAI's published per-message, reply and tool-definition overheads, images and
 *   files by the published rules; what the provider counted beyond that is carried over to
 *   the prompt's next turn.
 * - **Anthropic**: text units (o200k_base tokens, or UTF-8 bytes without the tokenizer)
 *   times a ratio learned per model and content class from settled usage; a prompt prefix
 *   a settled call showed is known exactly (a conversation's previous turn); the prompt
 *   cache followed as the provider keeps it (reads, writes and uncached input, each
 *   breakpoint's lifetime). With `countTokens`, the `count_tokens` endpoint for a prompt of
 *   which nothing is known yet.
 */
export class DefaultEstimator implements Estimator {
  readonly #options: string
  readonly #now: () => number
  readonly #tokenizer: boolean
  readonly #counter: CountTokensClient | null
  #made: EstimatorCore | null = null
  /** Each estimate's id in the core and the body text it read, for its observation. */
  readonly #asked = new WeakMap<Estimate, { id: number; text: string }>()
  /** Encodings whose tokenizer could not be had: estimated without it from then on. */
  readonly #missing = new Map<string, unknown>()
  /** Models whose tokenizer is in place (or could not be had): not asked about again. */
  readonly #ready = new Set<string>()

  constructor(options: DefaultEstimatorOptions = {}) {
    if (options === null || typeof options !== 'object') throw invalidArgument('the estimator options must be an object', 'options')
    for (const k of NUMBER_OPTIONS) {
      const v = options[k]
      if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v))) throw invalidArgument(`${k} must be a finite number, got ${String(v)}`, k)
    }
    if (options.tokenizer !== undefined && typeof options.tokenizer !== 'boolean') throw new TypeError('tokenizer must be true or false')
    if (options.now !== undefined && typeof options.now !== 'function') throw new TypeError('now must be a function returning milliseconds')
    if ('proxy' in options) throw invalidArgument('proxy is no longer an option: the estimator counts Anthropic prompts with o200k_base itself (tokenizer: true)', 'proxy')
    this.#tokenizer = options.tokenizer ?? true
    this.#now = options.now ?? Date.now
    const core: Record<string, unknown> = { tokenizer: this.#tokenizer }
    for (const k of NUMBER_OPTIONS) if (options[k] !== undefined) core[k] = options[k]
    this.#options = JSON.stringify(core)
    this.#counter = options.countTokens === undefined ? null : new CountTokensClient(options.countTokens)
    // Options out of range are refused now, not at the first estimate (when an engine
    // package is loaded; otherwise at the first estimate, with why).
    if (hasProviderRules()) this.#core()
  }

  #core(): EstimatorCore {
    this.#made ??= providerRules().create(this.#options)
    return this.#made
  }

  /** `count_tokens` requests sent, and how many failed (0 and 0 without `countTokens`). */
  get countTokensRequests(): { sent: number; failed: number } {
    return { sent: this.#counter?.sent ?? 0, failed: this.#counter?.failed ?? 0 }
  }

  /** How many prompt prefixes are remembered as cached. */
  get cachedPrefixCount(): number {
    return this.#core().cachedPrefixes()
  }

  /**
   * The learned units per token of a model's prose: bytes per token under the byte rule,
   * o200k_base tokens per Claude token with the tokenizer (the initial figure until a call
   * settles). Code, CJK and PDF text have their own ({@link ratios}).
   */
  bytesPerToken(provider: Provider, model: string): number {
    return Number(this.#core().ratios(provider, model)[0])
  }

  /** The learned units per token of a model by class. */
  ratios(provider: Provider, model: string): { prose: number; code: number; cjk: number; document: number } {
    const r = this.#core().ratios(provider, model)
    return { prose: Number(r[0]), code: Number(r[1]), cjk: Number(r[2]), document: Number(r[3]) }
  }

  /**
   * Whether some prefix of this request's prompt (or all of it) has a known token count:
   * from a settled call's usage or from {@link recordPromptTokens}. An estimate then counts
   * only the rest by the ratio.
   */
  knowsPrefixOf(input: EstimateInput): boolean {
    return this.#core().knowsPrefixOf(input.provider, input.model, textOf(input))
  }

  /**
   * Records an exact count of a request's whole prompt (Anthropic's `count_tokens`, say):
   * estimates of this prompt, and of every later prompt that begins with it, use it. The
   * model's ratios learn from it as from a settled call.
   */
  recordPromptTokens(input: EstimateInput, tokens: number): void {
    if (!(Number.isSafeInteger(tokens) && tokens >= 0)) throw new RangeError(`recordPromptTokens: tokens must be a non-negative integer, got ${tokens}`)
    this.#core().recordPromptTokens(input.provider, input.model, textOf(input), tokens)
  }

  estimate(input: EstimateInput): Estimate | Promise<Estimate> {
    const core = this.#core()
    const text = textOf(input)
    const model = `${input.provider}\u0000${input.model}`
    const need = this.#tokenizer && !this.#ready.has(model) ? core.needsTokenizer(input.provider, input.model) : null
    if (need == null || this.#missing.has(need)) {
      // Bounded: model names come from requests.
      if (this.#ready.size >= 4096) this.#ready.clear()
      this.#ready.add(model)
    }
    if (need != null && !this.#missing.has(need)) {
      let loading: void | Promise<void> | null = null
      try {
        loading = core.useTokenizer(need)
      } catch (e) {
        this.#missing.set(need, e)
      }
      if (loading instanceof Promise) {
        return loading.then(
          () => this.#counted(core, input, text),
          (e: unknown) => {
            this.#missing.set(need, e)
            return this.#counted(core, input, text)
          },
        )
      }
    }
    return this.#counted(core, input, text)
  }

  /** Through `count_tokens` when opted in and nothing of the prompt is known yet. */
  #counted(core: EstimatorCore, input: EstimateInput, text: string): Estimate | Promise<Estimate> {
    const counter = this.#counter
    if (input.provider === 'anthropic' && counter?.available() && !core.knowsPrefixOf(input.provider, input.model, text)) {
      return counter.count(input.body).then(
        (tokens) => {
          core.recordPromptTokens(input.provider, input.model, text, tokens)
          return this.#estimate(core, input, text)
        },
        () => this.#estimate(core, input, text),
      )
    }
    return this.#estimate(core, input, text)
  }

  #estimate(core: EstimatorCore, input: EstimateInput, text: string): Estimate {
    const r = JSON.parse(core.estimate(this.#now(), input.provider, input.model, text)) as { id: number; inputTokens: number; cachedPrefixTokens: number; cachedPrefixConfirmed: boolean }
    const estimate: Estimate = { inputTokens: r.inputTokens, cachedPrefixTokens: r.cachedPrefixTokens, ...(r.cachedPrefixConfirmed ? { cachedPrefixConfirmed: true } : {}) }
    this.#asked.set(estimate, { id: r.id, text })
    return estimate
  }

  observe({ provider, model, body, estimate, actualInputTokens, usage }: Observation): void {
    const core = this.#core()
    const asked = this.#asked.get(estimate)
    const used = usage === undefined ? null : JSON.stringify(usage)
    const now = this.#now()
    const actual = Number.isFinite(actualInputTokens) && actualInputTokens > 0 ? Math.floor(actualInputTokens) : 0
    if (asked !== undefined && core.observe(asked.id, now, provider, model, null, actual, used)) return
    core.observe(asked?.id ?? 0, now, provider, model, asked?.text ?? JSON.stringify(body), actual, used)
  }
}

/**
 * The byte rule alone: {@link DefaultEstimator} without the tokenizers (UTF-8 bytes times
 * the learned ratios, for both providers).
 */
export class BytesPerTokenEstimator extends DefaultEstimator {
  constructor(options: BytesPerTokenOptions = {}) {
    super({ ...options, tokenizer: false })
  }

  /** Synchronous: the byte rule loads nothing and asks no one. */
  override estimate(input: EstimateInput): Estimate {
    return super.estimate(input) as Estimate
  }
}

/**
 * The default estimator with Anthropic's `count_tokens` on: `new CountTokensEstimator({
 * apiKey })` is `new DefaultEstimator({ countTokens: { apiKey } })`.
 */
export class CountTokensEstimator extends DefaultEstimator {
  constructor(countTokens: CountTokensOptions, options: Omit<DefaultEstimatorOptions, 'countTokens'> = {}) {
    super({ ...options, countTokens })
  }
}

/** The body's JSON text: as sent when the caller gave it, else serialized. */
function textOf(input: EstimateInput): string {
  if (typeof input.text === 'string') return input.text
  if (input.body === null || typeof input.body !== 'object') throw invalidArgument('the estimate input needs the parsed request body (an object)', 'body')
  return JSON.stringify(input.body)
}

/**
 * Prompt bytes, split at the Anthropic prompt-cache breakpoint: everything up to and
 * including the last block marked `cache_control` (tools, then system, then messages) is
 * the cacheable prefix. (Cacheable, not cached: the estimator counts as a read only what an
 * earlier call cached.) A PDF's bytes are its text's.
 */
export function promptBytes(provider: Provider, body: Record<string, unknown> | string): { prefix: number; rest: number } {
  return JSON.parse(providerRules().promptBytes(provider, typeof body === 'string' ? body : JSON.stringify(body))) as { prefix: number; rest: number }
}
