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

function cacheControl(block: unknown): Record<string, unknown> | null {
  if (block === null || typeof block !== 'object') return null
  const c = (block as Record<string, unknown>).cache_control
  return c !== null && typeof c === 'object' ? (c as Record<string, unknown>) : c === undefined ? null : {}
}

/** Anthropic's prompt-cache lifetimes: `ttl: '1h'` in `cache_control`, otherwise 5 minutes. */
const TTL_5M = 5 * 60_000
const TTL_1H = 60 * 60_000

function ttlOf(c: Record<string, unknown>): number {
  return c.ttl === '1h' ? TTL_1H : TTL_5M
}

/**
 * How far before a breakpoint Anthropic looks for an earlier cached prefix: "up to about
 * 20 blocks before your explicit breakpoint" (prompt-caching docs). A remembered prefix
 * further back is not counted as a read.
 */
const LOOKBACK_BLOCKS = 20

/** A prefix within this long of its expiry is counted cold: the call may still wait in the queue. */
const EXPIRY_MARGIN_MS = 30_000

/** Two 32-bit FNV-1a lanes over UTF-16 code units, chained block after block. */
class PrefixHash {
  a = 0x811c9dc5
  b = 0x01000193 ^ 0x5bd1e995
  push(s: string): void {
    let a = this.a
    let b = this.b
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i)
      a = Math.imul(a ^ c, 0x01000193)
      b = Math.imul(b ^ c, 0x01000193) ^ (b >>> 15)
    }
    // A separator, so that block boundaries are part of the prefix.
    this.a = Math.imul(a ^ 0x1f, 0x01000193)
    this.b = Math.imul(b ^ 0x1e, 0x01000193)
  }
  key(): string {
    return `${(this.a >>> 0).toString(36)}.${(this.b >>> 0).toString(36)}`
  }
}

/** A block's content without its `cache_control` (which moves from turn to turn). */
function canonical(block: unknown): string {
  if (block === null || typeof block !== 'object' || Array.isArray(block)) return JSON.stringify(block) ?? ''
  const { cache_control: _moved, ...rest } = block as Record<string, unknown>
  return JSON.stringify(rest)
}

/** One block of the prompt in the provider's cache order (tools, system, messages). */
interface Piece {
  /** Prompt bytes up to and including this block. */
  end: number
  /** The hash of the prompt up to and including this block (content, not `cache_control`). */
  key: string
  /** This block's cache lifetime when it is a breakpoint, else 0. */
  ttlMs: number
}

/** A request's prompt as blocks, with its breakpoints. */
interface Prompt {
  pieces: Piece[]
  total: number
  /** Index of the last breakpoint, or -1. */
  last: number
}

function analyze(provider: Provider, model: string, body: Record<string, unknown>): Prompt {
  const pieces: Piece[] = []
  const hash = new PrefixHash()
  hash.push(`${provider}\u0000${model}`)
  let total = 0
  let last = -1
  const piece = (n: number, text: string, control: Record<string, unknown> | null): void => {
    total += n
    hash.push(text)
    if (control !== null) last = pieces.length
    pieces.push({ end: total, key: hash.key(), ttlMs: control === null ? 0 : ttlOf(control) })
  }
  const tools = body.tools
  if (Array.isArray(tools)) {
    for (const t of tools) piece(bytes(JSON.stringify(t) ?? ''), canonical(t), cacheControl(t))
  }
  const system = body.system
  if (typeof system === 'string') piece(bytes(system), `s${system}`, null)
  else if (Array.isArray(system)) {
    for (const block of system) piece(blockBytes(block), canonical(block), cacheControl(block))
  }
  const messages = body.messages
  if (Array.isArray(messages)) {
    for (const m of messages) {
      if (m === null || typeof m !== 'object') continue
      const msg = m as Record<string, unknown>
      const content = msg.content
      // A few bytes of framing per message (role, separators), counted with its first block.
      let framing = 8
      const role = `r${String(msg.role)}`
      if (Array.isArray(content)) {
        content.forEach((block, i) => {
          piece(blockBytes(block) + framing, i === 0 ? role + canonical(block) : canonical(block), cacheControl(block))
          framing = 0
        })
        if (content.length === 0) piece(framing, role, null)
      } else {
        piece(contentBytes(content) + framing, role + (JSON.stringify(content) ?? ''), cacheControl(m))
      }
    }
  }
  return { pieces, total, last }
}

/**
 * Prompt bytes, split at the Anthropic prompt-cache breakpoint: everything up to and
 * including the last block marked `cache_control` (tools, then system, then messages) is
 * the cacheable prefix. (Cacheable, not cached: {@link BytesPerTokenEstimator} counts as a
 * read only what an earlier call cached.)
 */
export function promptBytes(provider: Provider, body: Record<string, unknown>): { prefix: number; rest: number } {
  const { pieces, total, last } = analyze(provider, '', body)
  if (provider !== 'anthropic') return { prefix: 0, rest: total }
  const prefix = last < 0 ? 0 : (pieces[last] as Piece).end
  return { prefix, rest: total - prefix }
}

/** A prompt prefix the provider has cached, as an earlier call showed. */
interface Cached {
  /** Prompt tokens up to the end of the prefix. */
  tokens: number
  /** The cache lifetime its breakpoint asked for. */
  ttlMs: number
  /** When it expires unless used again (the estimator's clock). */
  expiresAt: number
}

/** What an estimate saw, kept for its observation. */
interface Asked {
  prompt: Prompt
  /** The estimator's clock at the estimate. */
  at: number
  /** The piece index of the prefix counted as a cache read, or -1. */
  read: number
}

/**
 * The default estimator: tokens = bytes / (bytes per token), learned per model as a moving
 * average of what settled calls really counted.
 *
 * Under Anthropic counting it follows the prompt cache as the provider does: after each
 * settled call it remembers, by the hash of the prompt's content up to each `cache_control`
 * breakpoint (not by agent), how many prompt tokens that prefix held (this call's own
 * tokens per byte) and until when it stays cached (its `ttl`, `5m` or `1h`, from the call;
 * a read renews it). A new call's prompt is then split as the provider counts it:
 *
 * - up to the longest remembered, unexpired prefix at or before its last breakpoint (within
 *   Anthropic's 20-block lookback of a breakpoint): a cache **read**, `cachedPrefixTokens`;
 * - from there to the last breakpoint: a cache **write**, which counts against the input
 *   limit like uncached input, so it is `inputTokens`;
 * - after the last breakpoint: uncached, `inputTokens`.
 *
 * A conversation the estimator has not seen (or whose prefix expired) is therefore all
 * `inputTokens`, breakpoints or not. A rolling breakpoint (moved to the newest message each
 * turn) reads the previous turn's prefix and writes only what is new. OpenAI charges cached
 * prompt tokens against its limit anyway, so everything is input there.
 */
export class BytesPerTokenEstimator implements Estimator {
  readonly #ratio = new Map<string, number>()
  readonly #initial: number
  readonly #rate: number
  readonly #safety: number
  readonly #now: () => number
  readonly #capacity: number
  readonly #minCache: number
  /** Cached prefixes by content hash, least recently used first. */
  readonly #cache = new Map<string, Cached>()
  readonly #asked = new WeakMap<Estimate, Asked>()

  constructor(options: BytesPerTokenOptions = {}) {
    this.#initial = options.initialBytesPerToken ?? 3
    this.#rate = options.learningRate ?? 0.3
    this.#safety = options.safety ?? 1.05
    this.#now = options.now ?? Date.now
    this.#capacity = options.cachedPrefixes ?? 4096
    this.#minCache = options.minCacheTokens ?? 1024
    if (!(this.#initial > 0)) throw new RangeError('initialBytesPerToken must be positive')
    if (!(this.#rate > 0 && this.#rate <= 1)) throw new RangeError('learningRate must be in (0, 1]')
    if (!(this.#safety >= 1)) throw new RangeError('safety must be at least 1')
    if (typeof this.#now !== 'function') throw new TypeError('now must be a function returning milliseconds')
    if (!(Number.isInteger(this.#capacity) && this.#capacity >= 1)) throw new RangeError('cachedPrefixes must be a positive integer')
    if (!(this.#minCache >= 0)) throw new RangeError('minCacheTokens must be zero or more')
  }

  /** The learned bytes per token for a model (the initial value until one settles). */
  bytesPerToken(provider: Provider, model: string): number {
    return this.#ratio.get(`${provider}:${model}`) ?? this.#initial
  }

  /** How many prompt prefixes are remembered as cached (at most `cachedPrefixes`). */
  get cachedPrefixCount(): number {
    return this.#cache.size
  }

  estimate({ provider, model, body }: EstimateInput): Estimate {
    const ratio = this.bytesPerToken(provider, model) / this.#safety
    const prompt = analyze(provider, model, body)
    const at = this.#now()
    let read = -1
    let cached = 0
    if (provider === 'anthropic' && prompt.last >= 0) {
      // The breakpoint at or after each block (for the lookback), scanning back from the last.
      let breakpoint = prompt.last
      for (let i = prompt.last; i >= 0; i--) {
        const p = prompt.pieces[i] as Piece
        if (p.ttlMs > 0) breakpoint = i
        if (breakpoint - i >= LOOKBACK_BLOCKS) continue
        const hit = this.#cache.get(p.key)
        if (hit === undefined || hit.expiresAt - EXPIRY_MARGIN_MS <= at) continue
        read = i
        cached = hit.tokens
        break
      }
    }
    const readBytes = read < 0 ? 0 : (prompt.pieces[read] as Piece).end
    const estimate = { inputTokens: Math.ceil((prompt.total - readBytes) / ratio), cachedPrefixTokens: cached }
    this.#asked.set(estimate, { prompt, at, read })
    return estimate
  }

  observe({ provider, model, body, estimate, actualInputTokens }: Observation): void {
    if (!(actualInputTokens > 0) || !Number.isFinite(actualInputTokens)) return
    const asked = this.#asked.get(estimate) ?? { prompt: analyze(provider, model, body), at: this.#now(), read: -1 }
    const { pieces, total } = asked.prompt
    const seen = total / actualInputTokens
    if (!(seen > 0) || !Number.isFinite(seen)) return
    const key = `${provider}:${model}`
    const old = this.#ratio.get(key)
    this.#ratio.set(key, old === undefined ? seen : old + this.#rate * (seen - old))
    if (provider !== 'anthropic') return
    // The provider cached the prompt up to each breakpoint (written, or read and renewed)
    // when it took the call in: this call's own tokens per byte place each prefix's tokens.
    const remember = (i: number, ttlMs: number): void => {
      const p = pieces[i] as Piece
      const tokens = Math.round((actualInputTokens * p.end) / total)
      if (tokens < this.#minCache) return
      this.#cache.delete(p.key)
      this.#cache.set(p.key, { tokens, ttlMs, expiresAt: asked.at + ttlMs })
      while (this.#cache.size > this.#capacity) this.#cache.delete(this.#cache.keys().next().value as string)
    }
    if (asked.read >= 0) {
      const hit = this.#cache.get((pieces[asked.read] as Piece).key)
      if (hit !== undefined) remember(asked.read, hit.ttlMs)
    }
    pieces.forEach((p, i) => {
      if (p.ttlMs > 0) remember(i, p.ttlMs)
    })
  }
}
