/**
 * Input-token estimation before a call. The default learns each model's bytes per token
 * from settled usage and follows each provider's prompt-cache rules; plug in your own
 * (a real tokenizer, say) through {@link Estimator}.
 */
import type { Provider } from './providers.js'

/** What the estimator sees of a request. */
export interface EstimateInput {
  provider: Provider
  model: string
  /** The parsed JSON request body. */
  body: Record<string, unknown>
}

/** An estimate, in the coordinator's terms. */
export interface Estimate {
  /** Prompt tokens outside the cached prefix. */
  inputTokens: number
  /** Prompt tokens in the prefix the provider may serve from its prompt cache. */
  cachedPrefixTokens: number
}

/** What a call turned out to use, for learning. */
export interface Observation {
  provider: Provider
  model: string
  body: Record<string, unknown>
  estimate: Estimate
  /** Every prompt token the provider counted (cached or not). */
  actualInputTokens: number
}

/** Estimates input tokens; `observe` is called after each settled call with real usage. */
export interface Estimator {
  estimate(input: EstimateInput): Estimate
  observe?(observation: Observation): void
}

/** Options for {@link BytesPerTokenEstimator}. */
export interface BytesPerTokenOptions {
  /**
   * Bytes per token assumed for a model not seen yet. Low on purpose (English prose runs
   * near 4): an early over-estimate queues a little, an under-estimate risks a 429.
   */
  initialBytesPerToken?: number
  /** Weight of each new observation in the moving average (0..1). */
  learningRate?: number
  /** Estimates are divided by this extra safety factor's inverse (1.05 = 5% high). */
  safety?: number
}

const encoder = new TextEncoder()

/** UTF-8 length of a string. */
function bytes(s: string): number {
  // Fast path for ASCII, which most prompts mostly are.
  let n = s.length
  for (let i = 0; i < s.length; i++) {
    if (s.charCodeAt(i) > 0x7f) return encoder.encode(s).length
  }
  return n
}

/** Text bytes of a message `content` (a string or an array of blocks). */
function contentBytes(content: unknown): number {
  if (typeof content === 'string') return bytes(content)
  if (!Array.isArray(content)) return content === undefined || content === null ? 0 : bytes(JSON.stringify(content))
  let n = 0
  for (const block of content) n += blockBytes(block)
  return n
}

function blockBytes(block: unknown): number {
  if (typeof block === 'string') return bytes(block)
  if (block === null || typeof block !== 'object') return 0
  const b = block as Record<string, unknown>
  if (typeof b.text === 'string') return bytes(b.text)
  // Tool calls, tool results, images: count their JSON, a fair upper bound for text parts.
  if (b.type === 'tool_result' && b.content !== undefined) return contentBytes(b.content)
  if (b.type === 'image' || b.type === 'image_url' || b.type === 'document') return 1600 * 4
  return bytes(JSON.stringify(b))
}

function hasCacheControl(block: unknown): boolean {
  return block !== null && typeof block === 'object' && 'cache_control' in (block as object)
}

/**
 * Prompt bytes, split at the Anthropic prompt-cache breakpoint: everything up to and
 * including the last block marked `cache_control` (tools, then system, then messages) is
 * the cacheable prefix.
 */
export function promptBytes(provider: Provider, body: Record<string, unknown>): { prefix: number; rest: number } {
  let total = 0
  let prefix = 0
  const mark = (): void => {
    prefix = total
  }
  const tools = body.tools
  if (Array.isArray(tools)) {
    for (const t of tools) {
      total += bytes(JSON.stringify(t))
      if (hasCacheControl(t)) mark()
    }
  }
  const system = body.system
  if (typeof system === 'string') total += bytes(system)
  else if (Array.isArray(system)) {
    for (const block of system) {
      total += blockBytes(block)
      if (hasCacheControl(block)) mark()
    }
  }
  const messages = body.messages
  if (Array.isArray(messages)) {
    for (const m of messages) {
      if (m === null || typeof m !== 'object') continue
      const content = (m as Record<string, unknown>).content
      // A few bytes of framing per message (role, separators).
      total += 8
      if (Array.isArray(content)) {
        for (const block of content) {
          total += blockBytes(block)
          if (hasCacheControl(block)) mark()
        }
      } else {
        total += contentBytes(content)
        if (hasCacheControl(m)) mark()
      }
    }
  }
  if (provider !== 'anthropic') return { prefix: 0, rest: total }
  return { prefix, rest: total - prefix }
}

/**
 * The default estimator: tokens = bytes / (bytes per token), learned per model as a moving
 * average of what settled calls really counted. Under Anthropic counting the bytes up to
 * the last `cache_control` breakpoint are reported as the cached prefix (the coordinator
 * charges them only when the cache has probably expired); OpenAI charges cached prompt
 * tokens against its limit anyway, so everything is input there.
 */
export class BytesPerTokenEstimator implements Estimator {
  readonly #ratio = new Map<string, number>()
  readonly #initial: number
  readonly #rate: number
  readonly #safety: number

  constructor(options: BytesPerTokenOptions = {}) {
    this.#initial = options.initialBytesPerToken ?? 3
    this.#rate = options.learningRate ?? 0.3
    this.#safety = options.safety ?? 1.05
    if (!(this.#initial > 0)) throw new RangeError('initialBytesPerToken must be positive')
    if (!(this.#rate > 0 && this.#rate <= 1)) throw new RangeError('learningRate must be in (0, 1]')
    if (!(this.#safety >= 1)) throw new RangeError('safety must be at least 1')
  }

  /** The learned bytes per token for a model (the initial value until one settles). */
  bytesPerToken(provider: Provider, model: string): number {
    return this.#ratio.get(`${provider}:${model}`) ?? this.#initial
  }

  estimate({ provider, model, body }: EstimateInput): Estimate {
    const ratio = this.bytesPerToken(provider, model) / this.#safety
    const { prefix, rest } = promptBytes(provider, body)
    return { inputTokens: Math.ceil(rest / ratio), cachedPrefixTokens: Math.ceil(prefix / ratio) }
  }

  observe({ provider, model, body, actualInputTokens }: Observation): void {
    if (!(actualInputTokens > 0)) return
    const { prefix, rest } = promptBytes(provider, body)
    const seen = (prefix + rest) / actualInputTokens
    if (!(seen > 0) || !Number.isFinite(seen)) return
    const key = `${provider}:${model}`
    const old = this.#ratio.get(key)
    this.#ratio.set(key, old === undefined ? seen : old + this.#rate * (seen - old))
  }
}
