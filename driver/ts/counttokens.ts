/**
 * Anthropic's token counting endpoint (`POST /v1/messages/count_tokens`), as the opt-in
 * counter of {@link DefaultEstimator}: one request per prompt it has not seen, never in
 * the way of the model call for long (a timeout, then the byte rule), and quiet after a
 * failure (the endpoint has its own rate limit). This is its I/O; what it sends and how
 * long it stays quiet are the provider crate's rules (`count_tokens`).
 */
import { providerRules } from './rules.js'

/** Options for counting Anthropic prompts with `count_tokens`. */
export interface CountTokensOptions {
  /** The API key, sent as `x-api-key`. Or give `headers` (an `authorization` for a gateway, say). */
  apiKey?: string
  /** Headers sent with every count (over `content-type` and `anthropic-version: 2023-06-01`). */
  headers?: Record<string, string>
  /** The API's base URL (default `https://api.anthropic.com`); the count goes to `<baseURL>/v1/messages/count_tokens`. */
  baseURL?: string
  /** The `fetch` that sends it (default `globalThis.fetch`). */
  fetch?: typeof fetch
  /** How long a count may take before the call goes on by the byte rule, ms (default 2,000). */
  timeoutMs?: number
  /**
   * After a failed count, how long none is tried, ms (default 10,000): the calls meanwhile go
   * by the byte rule. A 429 or 529 waits its `retry-after` instead when it gives one (at most
   * 10 minutes), else 30 s.
   */
  pauseAfterFailureMs?: number
  /**
   * Told of each failed count (never with the key or the headers): the HTTP status (`null`
   * for a timeout or a network error), what failed, and how long counting now pauses.
   */
  onError?: (failure: CountTokensFailure) => void
}

/** A failed count, as {@link CountTokensOptions.onError} is told of it. */
export interface CountTokensFailure {
  status: number | null
  message: string
  pausedMs: number
}

const DEFAULT_TIMEOUT_MS = 2_000
/** Counting stops this long after a failure by default (the provider crate's `count_tokens::PAUSE_MS`). */
const DEFAULT_PAUSE_MS = 10_000
/** The longest timeout or pause the options may set (the provider crate's `count_tokens::MAX_PAUSE_MS`). */
const MAX_PAUSE_MS = 600_000

function optionError(field: string, what: string): TypeError {
  return Object.assign(new TypeError(`countTokens.${field} ${what}`), { code: 'invalid_argument', field: `countTokens.${field}` })
}

/** Sends counts; one in flight per distinct prompt. */
export class CountTokensClient {
  readonly #url: string
  readonly #headers: Record<string, string>
  readonly #fetch: typeof fetch | undefined
  readonly #timeoutMs: number
  readonly #pauseMs: number
  readonly #onError: ((f: CountTokensFailure) => void) | undefined
  readonly #inFlight = new Map<string, Promise<number>>()
  #pausedUntil = 0
  /** Counts sent, and how many failed (for tests and metrics). */
  sent = 0
  failed = 0

  constructor(options: CountTokensOptions) {
    if (options === null || typeof options !== 'object') throw optionError('', 'must be an object: { apiKey | headers, baseURL?, fetch?, timeoutMs? }')
    const { apiKey, headers, baseURL = 'https://api.anthropic.com', timeoutMs = DEFAULT_TIMEOUT_MS, pauseAfterFailureMs = DEFAULT_PAUSE_MS } = options
    if (apiKey !== undefined && (typeof apiKey !== 'string' || apiKey === '')) throw optionError('apiKey', 'must be a non-empty string')
    if (headers !== undefined && (headers === null || typeof headers !== 'object' || Object.values(headers).some((v) => typeof v !== 'string'))) {
      throw optionError('headers', 'must be an object of string values')
    }
    if (apiKey === undefined && (headers === undefined || Object.keys(headers).length === 0)) throw optionError('apiKey', 'or `headers` is required: count_tokens needs the API key')
    let base: URL
    try {
      base = new URL(baseURL)
    } catch {
      throw optionError('baseURL', `must be an absolute URL, got ${JSON.stringify(String(baseURL))}`)
    }
    if (base.protocol !== 'https:' && base.protocol !== 'http:') throw optionError('baseURL', `must be an http(s) URL, got ${base.protocol}`)
    if (!(Number.isInteger(timeoutMs) && timeoutMs >= 1 && timeoutMs <= MAX_PAUSE_MS))
      throw optionError('timeoutMs', `must be an integer number of milliseconds from 1 to ${MAX_PAUSE_MS}, got ${timeoutMs}`)
    if (!(Number.isInteger(pauseAfterFailureMs) && pauseAfterFailureMs >= 0 && pauseAfterFailureMs <= MAX_PAUSE_MS)) {
      throw optionError('pauseAfterFailureMs', `must be an integer number of milliseconds from 0 to ${MAX_PAUSE_MS}, got ${pauseAfterFailureMs}`)
    }
    if (options.fetch !== undefined && typeof options.fetch !== 'function') throw optionError('fetch', 'must be a function')
    if (options.onError !== undefined && typeof options.onError !== 'function') throw optionError('onError', 'must be a function')
    this.#url = `${base.href.replace(/\/+$/, '')}/v1/messages/count_tokens`
    this.#headers = { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', ...(apiKey === undefined ? {} : { 'x-api-key': apiKey }), ...headers }
    this.#fetch = options.fetch
    this.#timeoutMs = timeoutMs
    this.#pauseMs = pauseAfterFailureMs
    this.#onError = options.onError
  }

  /** Whether a count may be sent now (not within the pause after a failure). */
  available(now: number = Date.now()): boolean {
    return now >= this.#pausedUntil
  }

  /**
   * The prompt tokens of a Messages request body, as Anthropic counts them; rejects on a
   * timeout, a network error, an error status or a malformed answer (after pausing).
   */
  count(body: Record<string, unknown>): Promise<number> {
    // The fields count_tokens takes: the provider crate's rule.
    const text = providerRules().countTokensBody(JSON.stringify(body))
    const known = this.#inFlight.get(text)
    if (known !== undefined) return known
    const p = this.#send(text).finally(() => this.#inFlight.delete(text))
    this.#inFlight.set(text, p)
    return p
  }

  async #send(text: string): Promise<number> {
    this.sent++
    const abort = new AbortController()
    const timer = setTimeout(() => abort.abort(), this.#timeoutMs)
    let status: number | null = null
    let retryAfterValue: string | null = null
    try {
      const res = await (this.#fetch ?? globalThis.fetch)(this.#url, { method: 'POST', headers: this.#headers, body: text, signal: abort.signal })
      status = res.status
      if (!res.ok) {
        retryAfterValue = res.headers.get('retry-after')
        await res.body?.cancel().catch(() => {})
        throw new Error(`count_tokens answered ${res.status}`)
      }
      const answer = (await res.json()) as { input_tokens?: unknown } | null
      const n = answer?.input_tokens
      if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0) throw new Error('count_tokens answered without a valid `input_tokens`')
      return n
    } catch (e) {
      this.failed++
      const message = abort.signal.aborted ? `count_tokens took longer than ${this.#timeoutMs} ms` : e instanceof Error ? e.message : String(e)
      // How long to stop counting: the provider crate's rule (a 429 / 529's Retry-After, read
      // as the core reads the provider's; else the pause configured), at most 10 min.
      const pausedMs = providerRules().countTokensPause(status, retryAfterValue, Date.now(), this.#pauseMs)
      this.#pausedUntil = Math.max(this.#pausedUntil, Date.now() + pausedMs)
      try {
        this.#onError?.({ status, message, pausedMs })
      } catch {
        // The hook's own failure is not the call's.
      }
      throw new Error(message)
    } finally {
      clearTimeout(timer)
    }
  }
}
