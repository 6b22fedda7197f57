/**
 * Input-token estimation before a call. The default ({@link DefaultEstimator}) counts an
 * OpenAI prompt with the model's tokenizer, and an Anthropic prompt by each model's bytes
 * per token learned from settled usage (or, opted in, by Anthropic's `count_tokens`
 * endpoint), following each provider's prompt-cache rules; plug in your own through
 * {@link Estimator}.
 */
import { type CountTokensOptions, CountTokensClient } from './counttokens.js'
import type { Provider } from './providers.js'
import { type CountText, type PromptCounter, loadTokenizer, openaiEncoding, openaiPromptTokens, tokenizerState } from './tokenize.js'

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

/** What a block costs: bytes counted at the learned ratio, and tokens counted by a provider's rule. */
interface Cost {
  bytes: number
  tokens: number
}

/** Text bytes (and media tokens) of a message `content` (a string or an array of blocks). */
function contentCost(provider: Provider, content: unknown): Cost {
  if (typeof content === 'string') return { bytes: bytes(content), tokens: 0 }
  if (!Array.isArray(content)) return { bytes: content === undefined || content === null ? 0 : bytes(JSON.stringify(content)), tokens: 0 }
  const c = { bytes: 0, tokens: 0 }
  for (const block of content) {
    const b = blockCost(provider, block)
    c.bytes += b.bytes
    c.tokens += b.tokens
  }
  return c
}

const textCost = (s: string): Cost => ({ bytes: bytes(s), tokens: 0 })
const tokensCost = (tokens: number): Cost => ({ bytes: 0, tokens })

function blockCost(provider: Provider, block: unknown): Cost {
  if (typeof block === 'string') return textCost(block)
  if (block === null || typeof block !== 'object') return { bytes: 0, tokens: 0 }
  const b = block as Record<string, unknown>
  if (typeof b.text === 'string') return textCost(b.text)
  // Tool results (Anthropic's content, the Responses API's output) may hold images too.
  if (b.type === 'tool_result' && b.content !== undefined) return contentCost(provider, b.content)
  if (b.type === 'function_call_output' && typeof b.output !== 'string' && b.output !== undefined) return contentCost(provider, b.output)
  if (b.type === 'message' && b.content !== undefined) return contentCost(provider, b.content)
  const media = mediaCost(provider, b)
  if (media !== null) return media
  // Tool calls and anything else: their JSON, a fair upper bound for text parts.
  return textCost(JSON.stringify(b))
}

// ---- Images and documents, by each provider's published rules ----------------------------

/**
 * Anthropic (docs, "Vision"): an image costs width × height / 750 tokens, after it is scaled
 * down (aspect kept) to at most 1568 px on its long edge and about 1.19 megapixels (1092²,
 * "~1,600 tokens"). An image whose size cannot be read costs that most: 1,590.
 */
function anthropicImageTokens(size: Size | null): number {
  if (size === null) return ANTHROPIC_IMAGE_MAX
  let { w, h } = size
  const long = Math.max(w, h)
  if (long > 1568) {
    w = (w * 1568) / long
    h = (h * 1568) / long
  }
  const area = w * h
  const scaled = area > 1092 * 1092 ? 1092 * 1092 : area
  return Math.max(1, Math.ceil(scaled / 750))
}
const ANTHROPIC_IMAGE_MAX = Math.ceil((1092 * 1092) / 750)

/**
 * OpenAI (docs, "Images and vision", the tile rule of GPT-4o, GPT-4.1 and the o-series):
 * `detail: 'low'` costs 85 tokens; otherwise the image is scaled to fit 2048 × 2048, then
 * its shortest side to 768 px, and costs 170 per 512-px tile plus 85. An image whose size
 * cannot be read costs the most a high-detail image can: 8 tiles, 1,445.
 */
function openaiImageTokens(size: Size | null, detail: unknown): number {
  if (detail === 'low') return 85
  if (size === null) return 85 + 170 * 8
  let { w, h } = size
  const fit = Math.min(1, 2048 / Math.max(w, h))
  w *= fit
  h *= fit
  const short = Math.min(w, h)
  if (short > 768) {
    w = (w * 768) / short
    h = (h * 768) / short
  }
  return 85 + 170 * Math.ceil(w / 512) * Math.ceil(h / 512)
}

/**
 * A PDF page, by Anthropic's published ranges (docs, "PDF support"): "1,500–3,000 tokens per
 * page" of text, plus the page as an image (a letter page at the image limit, 1,590). The top
 * of the text range is used: an estimate short of the provider's count is a 429.
 */
const PDF_PAGE_TOKENS = 3000 + ANTHROPIC_IMAGE_MAX

interface Size {
  w: number
  h: number
}

/** Media costs by provider, detail and digest of the data, so a file in a history is read once. */
const mediaCosts = new Map<string, Cost | null>()
const MEDIA_COSTS = 256

/** The cost of an image or document block, or null when the block is neither (memoized for large files). */
function mediaCost(provider: Provider, b: Record<string, unknown>): Cost | null {
  if (b.type !== 'image' && b.type !== 'image_url' && b.type !== 'input_image' && b.type !== 'document' && b.type !== 'file' && b.type !== 'input_file') return null
  const json = JSON.stringify(b, shorten)
  if (json.length > LONG) return readMedia(provider, b)
  const key = `${provider}\u0000${json}`
  const known = mediaCosts.get(key)
  if (known !== undefined) return known
  const cost = readMedia(provider, b)
  if (mediaCosts.size >= MEDIA_COSTS) mediaCosts.delete(mediaCosts.keys().next().value as string)
  mediaCosts.set(key, cost)
  return cost
}

function readMedia(provider: Provider, b: Record<string, unknown>): Cost | null {
  const image = (size: Size | null, detail?: unknown): Cost =>
    tokensCost(provider === 'openai' ? openaiImageTokens(size, detail) : anthropicImageTokens(size))
  if (b.type === 'image') {
    // Anthropic: { source: { type: 'base64', data } | { type: 'url' } | { type: 'file' } }.
    const source = b.source as Record<string, unknown> | undefined
    return image(typeof source?.data === 'string' ? imageSize(decodeBase64(source.data, IMAGE_HEAD)) : null)
  }
  if (b.type === 'image_url') {
    // OpenAI chat: { image_url: { url: 'data:…;base64,…' | 'https://…', detail } } (or a string).
    const iu = b.image_url
    const url = typeof iu === 'string' ? iu : typeof (iu as Record<string, unknown> | null)?.url === 'string' ? String((iu as Record<string, unknown>).url) : ''
    const detail = typeof iu === 'object' && iu !== null ? (iu as Record<string, unknown>).detail : undefined
    return image(dataUrlSize(url), detail)
  }
  if (b.type === 'input_image') {
    // OpenAI Responses: { image_url: 'data:…' | 'https://…', detail }.
    return image(typeof b.image_url === 'string' ? dataUrlSize(b.image_url) : null, b.detail)
  }
  if (b.type === 'document') {
    const source = b.source as Record<string, unknown> | undefined
    if (source?.type === 'text' && typeof source.data === 'string') return textCost(source.data)
    if (source?.type === 'content') return contentCost(provider, source.content)
    if (source?.type === 'base64' && typeof source.data === 'string') return tokensCost(pdfPages(source.data) * PDF_PAGE_TOKENS)
    // A URL or file id: the document is not in the request; one page at the least.
    return tokensCost(PDF_PAGE_TOKENS)
  }
  if (b.type === 'file' || b.type === 'input_file') {
    // OpenAI: { file: { file_data: 'data:application/pdf;base64,…' } } or { file_data } (Responses).
    const f = (b.type === 'file' ? b.file : b) as Record<string, unknown> | undefined
    const data = typeof f?.file_data === 'string' ? f.file_data : null
    return tokensCost(data === null ? PDF_PAGE_TOKENS : pdfPages(data.slice(data.indexOf(',') + 1)) * PDF_PAGE_TOKENS)
  }
  return null
}

/** How much of an image is decoded to find its size (a JPEG's size follows its metadata). */
const IMAGE_HEAD = 256 * 1024

function dataUrlSize(url: string): Size | null {
  if (!url.startsWith('data:')) return null
  return imageSize(decodeBase64(url.slice(url.indexOf(',') + 1), IMAGE_HEAD))
}

const B64 = (() => {
  const t = new Int16Array(128).fill(-1)
  const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
  for (let i = 0; i < abc.length; i++) t[abc.charCodeAt(i)] = i
  t['-'.charCodeAt(0)] = 62
  t['_'.charCodeAt(0)] = 63
  return t
})()

/** The first `limit` bytes of base64 text (whitespace and padding skipped; stops at anything else). */
function decodeBase64(s: string, limit: number): Uint8Array {
  const out = new Uint8Array(Math.min(limit, Math.floor((s.length * 3) / 4)))
  let n = 0
  let acc = 0
  let bits = 0
  for (let i = 0; i < s.length && n < out.length; i++) {
    const c = s.charCodeAt(i)
    const v = c < 128 ? (B64[c] as number) : -1
    if (v < 0) {
      if (c === 61 || c === 10 || c === 13 || c === 32) continue
      break
    }
    acc = (acc << 6) | v
    bits += 6
    if (bits >= 8) {
      bits -= 8
      out[n++] = (acc >> bits) & 0xff
    }
  }
  return out.subarray(0, n)
}

/** Width and height of a PNG, GIF, JPEG or WebP image from its first bytes, or null. */
function imageSize(d: Uint8Array): Size | null {
  const u16be = (i: number): number => ((d[i] as number) << 8) | (d[i + 1] as number)
  const u16le = (i: number): number => (d[i] as number) | ((d[i + 1] as number) << 8)
  const u32be = (i: number): number => u16be(i) * 65536 + u16be(i + 2)
  const ok = (s: Size): Size | null => (s.w > 0 && s.h > 0 ? s : null)
  if (d.length >= 24 && d[0] === 0x89 && d[1] === 0x50 && d[2] === 0x4e && d[3] === 0x47) return ok({ w: u32be(16), h: u32be(20) })
  if (d.length >= 10 && d[0] === 0x47 && d[1] === 0x49 && d[2] === 0x46) return ok({ w: u16le(6), h: u16le(8) })
  if (d.length >= 30 && d[0] === 0x52 && d[1] === 0x49 && d[2] === 0x46 && d[3] === 0x46 && d[8] === 0x57 && d[9] === 0x45 && d[10] === 0x42 && d[11] === 0x50) {
    const kind = String.fromCharCode(d[12] as number, d[13] as number, d[14] as number, d[15] as number)
    if (kind === 'VP8 ') return ok({ w: u16le(26) & 0x3fff, h: u16le(28) & 0x3fff })
    if (kind === 'VP8L') {
      const b = (i: number): number => d[21 + i] as number
      return ok({ w: 1 + (b(0) | ((b(1) & 0x3f) << 8)), h: 1 + ((b(1) >> 6) | (b(2) << 2) | ((b(3) & 0x0f) << 10)) })
    }
    if (kind === 'VP8X') {
      const u24 = (i: number): number => (d[i] as number) | ((d[i + 1] as number) << 8) | ((d[i + 2] as number) << 16)
      return ok({ w: 1 + u24(24), h: 1 + u24(27) })
    }
    return null
  }
  if (d.length >= 4 && d[0] === 0xff && d[1] === 0xd8) {
    // JPEG: walk the segments to the first start-of-frame (SOF0–SOF15 but DHT, JPG, DAC).
    let i = 2
    while (i + 9 < d.length) {
      if (d[i] !== 0xff) return null
      const marker = d[i + 1] as number
      if (marker === 0xff) {
        i++
        continue
      }
      if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) return ok({ w: u16be(i + 7), h: u16be(i + 5) })
      i += 2 + u16be(i + 2)
    }
  }
  return null
}

/**
 * A PDF's page count from its bytes: the page objects (`/Type /Page`) or the page tree's
 * largest `/Count`, whichever is more. When neither can be read (compressed object streams),
 * one page per 50 KB of file, at least one: a guess that errs high for text-heavy files.
 */
function pdfPages(b64: string): number {
  const data = decodeBase64(b64, Number.MAX_SAFE_INTEGER)
  // windows-1252 keeps every ASCII byte as it is, which is all the page markers are.
  const text = new TextDecoder('latin1').decode(data)
  let pages = 0
  for (const _ of text.matchAll(/\/Type\s*\/Page(?![a-zA-Z])/g)) pages++
  for (const m of text.matchAll(/\/Type\s*\/Pages\b[^>]*?\/Count\s+(\d+)|\/Count\s+(\d+)[^>]*?\/Type\s*\/Pages\b/g)) {
    pages = Math.max(pages, Number(m[1] ?? m[2]))
  }
  return pages > 0 ? pages : Math.max(1, Math.ceil(data.length / 50_000))
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

/** Strings longer than this (images, documents) are hashed by a sample, not char by char. */
const LONG = 64 * 1024

/**
 * A digest of a long string: its length, its first and last 4 KB and every 61st character
 * (base64 of two different files of one length differs nearly everywhere).
 */
function digest(s: string): string {
  let a = 0x811c9dc5
  let b = 0x2545f491
  const step = (c: number): void => {
    a = Math.imul(a ^ c, 0x01000193)
    b = Math.imul(b ^ c, 0x01000193) ^ (b >>> 15)
  }
  for (let i = 0; i < 4096; i++) step(s.charCodeAt(i))
  for (let i = 4096; i < s.length - 4096; i += 61) step(s.charCodeAt(i))
  for (let i = s.length - 4096; i < s.length; i++) step(s.charCodeAt(i))
  return `\u0000${s.length}:${(a >>> 0).toString(36)}.${(b >>> 0).toString(36)}`
}

const shorten = (_key: string, v: unknown): unknown => (typeof v === 'string' && v.length > LONG ? digest(v) : v)

/** A block's content without its `cache_control` (which moves from turn to turn); long strings digested. */
function canonical(block: unknown): string {
  if (block === null || typeof block !== 'object' || Array.isArray(block)) return JSON.stringify(block, shorten) ?? ''
  const { cache_control: _moved, ...rest } = block as Record<string, unknown>
  return JSON.stringify(rest, shorten)
}

/** One block of the prompt in the provider's cache order (tools, system, messages). */
interface Piece {
  /** Prompt bytes up to and including this block (text, counted at the learned ratio). */
  end: number
  /** Tokens up to and including this block counted by a provider's rule (images, documents). */
  fixed: number
  /** The hash of the prompt up to and including this block (content, not `cache_control`). */
  key: string
  /** This block's cache lifetime when it is a breakpoint, else 0. */
  ttlMs: number
}

/** A request's prompt as blocks, with its breakpoints. */
interface Prompt {
  pieces: Piece[]
  /** Text bytes of the whole prompt. */
  total: number
  /** Tokens of its images and documents. */
  fixed: number
  /** Index of the last breakpoint, or -1. */
  last: number
}

/**
 * The tool-use system prompt Anthropic adds to a call with tools (docs, "Tool use", pricing:
 * the Claude 4 models and Sonnet 3.7): 346 tokens with `tool_choice` auto or none, 313 with
 * any or tool. Older models add other amounts (Claude 3 Opus 530, Haiku 3.5 264); these are
 * used for every model.
 */
const TOOL_USE_AUTO = 346
const TOOL_USE_FORCED = 313

function analyze(provider: Provider, model: string, body: Record<string, unknown>): Prompt {
  const pieces: Piece[] = []
  const hash = new PrefixHash()
  hash.push(`${provider}\u0000${model}`)
  let total = 0
  let fixed = 0
  let last = -1
  const piece = (cost: Cost, extra: number, text: string, control: Record<string, unknown> | null): void => {
    total += cost.bytes + extra
    fixed += cost.tokens
    hash.push(text)
    if (control !== null) last = pieces.length
    pieces.push({ end: total, fixed, key: hash.key(), ttlMs: control === null ? 0 : ttlOf(control) })
  }
  const tools = body.tools
  if (Array.isArray(tools)) {
    if (provider === 'anthropic' && tools.length > 0) {
      // The system prompt Anthropic adds for tool use, by `tool_choice`.
      const choice = (body.tool_choice as Record<string, unknown> | undefined)?.type
      const forced = choice === 'any' || choice === 'tool'
      piece(tokensCost(forced ? TOOL_USE_FORCED : TOOL_USE_AUTO), 0, `t${forced ? 'forced' : 'auto'}`, null)
    }
    for (const t of tools) piece(textCost(JSON.stringify(t) ?? ''), 0, canonical(t), cacheControl(t))
  }
  const system = body.system
  if (typeof system === 'string') piece(textCost(system), 0, `s${system}`, null)
  else if (Array.isArray(system)) {
    for (const block of system) piece(blockCost(provider, block), 0, canonical(block), cacheControl(block))
  }
  // The Responses API: `instructions`, then `input` (a string or a list of items).
  if (typeof body.instructions === 'string') piece(textCost(body.instructions), 0, `i${body.instructions}`, null)
  const messages = Array.isArray(body.messages) ? body.messages : typeof body.input === 'string' ? [{ role: 'user', content: body.input }] : Array.isArray(body.input) ? body.input : []
  for (const m of messages) {
    if (m === null || typeof m !== 'object') continue
    const msg = m as Record<string, unknown>
    // A Responses API item that is not a message (a function call or its output) is one block.
    if (msg.content === undefined && msg.role === undefined) {
      piece(blockCost(provider, msg), 8, canonical(msg), null)
      continue
    }
    const content = msg.content
    // A few bytes of framing per message (role, separators), counted with its first block.
    let framing = 8
    const role = `r${String(msg.role)}`
    if (Array.isArray(content)) {
      content.forEach((block, i) => {
        piece(blockCost(provider, block), framing, i === 0 ? role + canonical(block) : canonical(block), cacheControl(block))
        framing = 0
      })
      if (content.length === 0) piece({ bytes: 0, tokens: 0 }, framing, role, null)
    } else {
      piece(contentCost(provider, content), framing, role + (JSON.stringify(content) ?? ''), cacheControl(m))
    }
  }
  return { pieces, total, fixed, last }
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

/** A prompt analyzed once per request body (the wrapper estimates one body again on a retry). */
interface Analyzed {
  provider: Provider
  model: string
  prompt: Prompt
}

/**
 * The byte rule: tokens = bytes / (bytes per token), learned per model as a moving average
 * of what settled calls really counted — except for what is known exactly: a prompt prefix
 * a settled call (or a count, see {@link BytesPerTokenEstimator.recordPromptTokens})
 * showed. A conversation's previous turn is such a prefix: its prompt tokens are the
 * previous call's usage (input + cache read + cache write), so only what is new since (the
 * reply now in the history, the new message) is estimated by the ratio.
 *
 * Under Anthropic counting it follows the prompt cache as the provider does: after each
 * settled call it remembers, by the hash of the prompt's content up to each `cache_control`
 * breakpoint (not by agent), how many prompt tokens that prefix held (exactly at the last
 * breakpoint: the call's cache read + cache write; at an earlier one, this call's own tokens
 * per byte) and until when it stays cached (its `ttl`, `5m` or `1h`, from the call; a read
 * renews it). A new call's prompt is then split as the provider counts it:
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
  /** Prompt tokens known exactly, by the content hash of the prefix they count, least recently used first. */
  readonly #known = new Map<string, number>()
  readonly #asked = new WeakMap<Estimate, Asked>()
  readonly #analyzed = new WeakMap<Record<string, unknown>, Analyzed>()

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

  #analyze(provider: Provider, model: string, body: Record<string, unknown>): Prompt {
    const a = this.#analyzed.get(body)
    if (a !== undefined && a.provider === provider && a.model === model) return a.prompt
    const prompt = analyze(provider, model, body)
    this.#analyzed.set(body, { provider, model, prompt })
    return prompt
  }

  /** The longest prefix of `prompt` whose tokens are known exactly: its piece and tokens, or null. */
  #knownPrefix(prompt: Prompt): { at: number; tokens: number } | null {
    for (let i = prompt.pieces.length - 1; i >= 0; i--) {
      const key = (prompt.pieces[i] as Piece).key
      const tokens = this.#known.get(key)
      if (tokens === undefined) continue
      this.#known.delete(key)
      this.#known.set(key, tokens)
      return { at: i, tokens }
    }
    return null
  }

  #know(key: string, tokens: number): void {
    this.#known.delete(key)
    this.#known.set(key, tokens)
    while (this.#known.size > this.#capacity) this.#known.delete(this.#known.keys().next().value as string)
  }

  #learn(provider: Provider, model: string, prompt: Prompt, tokens: number): void {
    const textTokens = tokens - prompt.fixed
    const seen = prompt.total / textTokens
    if (textTokens > 0 && seen > 0 && Number.isFinite(seen)) {
      const key = `${provider}:${model}`
      const old = this.#ratio.get(key)
      this.#ratio.set(key, old === undefined ? seen : old + this.#rate * (seen - old))
    }
  }

  /**
   * Whether some prefix of this request's prompt (or all of it) has a known token count:
   * from a settled call's usage or from {@link recordPromptTokens}. An estimate then counts
   * only the rest by the ratio.
   */
  knowsPrefixOf({ provider, model, body }: EstimateInput): boolean {
    const prompt = this.#analyze(provider, model, body)
    return prompt.pieces.some((p) => this.#known.has(p.key))
  }

  /**
   * Records an exact count of a request's whole prompt (Anthropic's `count_tokens`, say):
   * estimates of this prompt, and of every later prompt that begins with it, use it. The
   * model's bytes per token learn from it as from a settled call.
   */
  recordPromptTokens({ provider, model, body }: EstimateInput, tokens: number): void {
    if (!(Number.isSafeInteger(tokens) && tokens >= 0)) throw new RangeError(`recordPromptTokens: tokens must be a non-negative integer, got ${tokens}`)
    const prompt = this.#analyze(provider, model, body)
    const last = prompt.pieces[prompt.pieces.length - 1]
    if (last === undefined || tokens === 0) return
    this.#learn(provider, model, prompt, tokens)
    this.#know(last.key, tokens)
  }

  estimate({ provider, model, body }: EstimateInput): Estimate {
    const ratio = this.bytesPerToken(provider, model) / this.#safety
    const prompt = this.#analyze(provider, model, body)
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
    const upTo = read < 0 ? { end: 0, fixed: 0 } : (prompt.pieces[read] as Piece)
    let inputTokens = Math.ceil((prompt.total - upTo.end) / ratio) + prompt.fixed - upTo.fixed
    const known = this.#knownPrefix(prompt)
    if (known !== null && known.at >= read) {
      // Exact up to the known prefix, the ratio for what follows it; the cache read is part of the prefix.
      const p = prompt.pieces[known.at] as Piece
      const total = known.tokens + Math.ceil((prompt.total - p.end) / ratio) + prompt.fixed - p.fixed
      inputTokens = Math.max(0, total - cached)
    }
    const estimate = { inputTokens, cachedPrefixTokens: cached }
    this.#asked.set(estimate, { prompt, at, read })
    return estimate
  }

  observe({ provider, model, body, estimate, actualInputTokens, usage }: Observation): void {
    if (!(actualInputTokens > 0) || !Number.isFinite(actualInputTokens)) return
    const asked = this.#asked.get(estimate) ?? { prompt: this.#analyze(provider, model, body), at: this.#now(), read: -1 }
    const { pieces, total, fixed, last } = asked.prompt
    // The text's share: what the provider counted beyond the images' and documents' rule.
    const textTokens = actualInputTokens - fixed
    this.#learn(provider, model, asked.prompt, actualInputTokens)
    // The whole prompt is now known exactly, and so is the next turn's prefix.
    const whole = pieces[pieces.length - 1]
    if (whole !== undefined && Number.isSafeInteger(actualInputTokens)) this.#know(whole.key, actualInputTokens)
    if (provider !== 'anthropic') return
    // Anthropic's cache read + cache write are the tokens up to the last breakpoint, exactly
    // (its `input_tokens` are what follows): when the provider cached, that prefix is known.
    const toLast = usage === undefined ? 0 : Number(usage.cacheReadInputTokens) + Number(usage.cacheCreationInputTokens)
    const exactLast = last >= 0 && toLast > 0 && Number.isSafeInteger(toLast) && toLast <= actualInputTokens ? toLast : null
    // (A breakpoint on the prompt's last block: the whole prompt's count is the one to know.)
    if (exactLast !== null && last < pieces.length - 1) this.#know((pieces[last] as Piece).key, exactLast)
    // The provider cached the prompt up to each breakpoint (written, or read and renewed)
    // when it took the call in: this call's own tokens per byte place each earlier prefix's tokens.
    const remember = (i: number, ttlMs: number): void => {
      const p = pieces[i] as Piece
      const tokens =
        i === last && exactLast !== null
          ? exactLast
          : textTokens > 0 && total > 0
            ? p.fixed + Math.round((textTokens * p.end) / total)
            : Math.round((actualInputTokens * p.fixed) / Math.max(1, fixed))
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

// ---- The default: the tokenizer for OpenAI, the byte rule (or count_tokens) for Anthropic -----

/** Options for {@link DefaultEstimator}: those of the byte rule, and the two counters. */
export interface DefaultEstimatorOptions extends BytesPerTokenOptions {
  /**
   * Count OpenAI prompts with the model's tokenizer (default `true`): o200k_base or
   * cl100k_base by model (see `openaiEncoding`), from the `gpt-tokenizer` package, loaded
   * the first time an OpenAI call is estimated (that estimate waits for it, about 0.4 s;
   * the others are synchronous). Where it cannot be loaded, the byte rule.
   */
  tokenizer?: boolean
  /**
   * Count Anthropic prompts with Anthropic's `count_tokens` endpoint (opt-in): a prompt of
   * which no prefix is known yet is counted once (the estimate waits for it, at most
   * `timeoutMs`), and a later prompt that begins with one known (the next turn of the
   * conversation, or the same prompt again) is not: its new part goes by the byte rule. A
   * failed count (timeout, network, 429, 5xx) falls back to the byte rule at once and
   * pauses counting for a while.
   */
  countTokens?: CountTokensOptions
}

/** Strings at least this long have their counts remembered (shorter ones are cheaper to count again). */
const MEMO_MIN_CHARS = 256
/** The most characters of remembered strings per encoding (about 8 MB), least recently used dropped first. */
const MEMO_CHARS = 4 << 20

/** A counter that remembers the counts of long strings: a conversation's turns share most of their text. */
function memoized(count: CountText): CountText {
  const memo = new Map<string, number>()
  let chars = 0
  return (s) => {
    if (s.length < MEMO_MIN_CHARS) return count(s)
    const key = s.length > LONG ? digest(s) : s
    const known = memo.get(key)
    if (known !== undefined) {
      memo.delete(key)
      memo.set(key, known)
      return known
    }
    const n = count(s)
    memo.set(key, n)
    chars += key.length
    while (chars > MEMO_CHARS) {
      const oldest = memo.keys().next().value as string
      memo.delete(oldest)
      chars -= oldest.length
    }
    return n
  }
}

/** OpenAI image and file blocks by the published rules (the same as the byte rule's). */
const openaiMedia = (block: Record<string, unknown>): number | null => {
  const c = mediaCost('openai', block)
  return c === null ? null : c.tokens + Math.ceil(c.bytes / 4)
}

/**
 * tokenwarden's default estimator (what `Tokenwarden` uses unless given another):
 *
 * - **OpenAI**: the prompt is counted, not guessed: each text with the model's tokenizer
 *   (o200k_base, or cl100k_base for GPT-4 and GPT-3.5), plus OpenAI's published per-message,
 *   reply and tool-definition overheads (see `openaiPromptTokens`), images and files by the
 *   published rules. Counts of long strings are remembered, so a conversation's next turn
 *   tokenizes only its new messages.
 * - **Anthropic**: the byte rule of {@link BytesPerTokenEstimator} (bytes per token learned
 *   per model, prefixes known exactly from the previous turn's usage, the prompt cache as
 *   the provider keeps it), or, with `countTokens`, the `count_tokens` endpoint for a
 *   prompt of which nothing is known yet.
 */
export class DefaultEstimator implements Estimator {
  /** The byte rule this estimator falls back on (and uses for Anthropic): its learned ratios and known prefixes. */
  readonly bytes: BytesPerTokenEstimator
  readonly #tokenizer: boolean
  readonly #counter: CountTokensClient | null
  readonly #counters = new Map<string, PromptCounter>()
  /** Estimates made by the tokenizer: the count, and the hash of the whole prompt. */
  readonly #counted = new WeakMap<Estimate, { counted: number; key: string | null }>()
  /**
   * OpenAI: what the provider counted beyond the tokenizer's count (negative when less), by
   * the hash of the prompt it was for, least recently used first. A later prompt that begins
   * with that one (the conversation's next turn) carries it over: the prefix is then exact,
   * and only the new part is the tokenizer's (and the rule's) alone.
   */
  readonly #residuals = new Map<string, number>()
  readonly #capacity: number

  constructor(options: DefaultEstimatorOptions = {}) {
    this.bytes = new BytesPerTokenEstimator(options)
    this.#capacity = options.cachedPrefixes ?? 4096
    if (options.tokenizer !== undefined && typeof options.tokenizer !== 'boolean') throw new TypeError('tokenizer must be true or false')
    this.#tokenizer = options.tokenizer ?? true
    this.#counter = options.countTokens === undefined ? null : new CountTokensClient(options.countTokens)
  }

  /** `count_tokens` requests sent, and how many failed (0 and 0 without `countTokens`). */
  get countTokensRequests(): { sent: number; failed: number } {
    return { sent: this.#counter?.sent ?? 0, failed: this.#counter?.failed ?? 0 }
  }

  #promptCounter(encoding: PromptCounter['encoding'], count: CountText): PromptCounter {
    let c = this.#counters.get(encoding)
    if (c === undefined) {
      c = { encoding, count: memoized(count), media: openaiMedia }
      this.#counters.set(encoding, c)
    }
    return c
  }

  #counted_(c: PromptCounter, { model, body }: EstimateInput): Estimate {
    const counted = openaiPromptTokens(c, body)
    const { pieces } = analyze('openai', model, body)
    let residual = 0
    for (let i = pieces.length - 1; i >= 0; i--) {
      const key = (pieces[i] as Piece).key
      const r = this.#residuals.get(key)
      if (r === undefined) continue
      this.#residuals.delete(key)
      this.#residuals.set(key, r)
      residual = r
      break
    }
    const estimate = { inputTokens: Math.max(0, counted + residual), cachedPrefixTokens: 0 }
    this.#counted.set(estimate, { counted, key: pieces.length === 0 ? null : (pieces[pieces.length - 1] as Piece).key })
    return estimate
  }

  /** The learned bytes per token for a model (see {@link BytesPerTokenEstimator.bytesPerToken}). */
  bytesPerToken(provider: Provider, model: string): number {
    return this.bytes.bytesPerToken(provider, model)
  }

  /** How many prompt prefixes are remembered as cached. */
  get cachedPrefixCount(): number {
    return this.bytes.cachedPrefixCount
  }

  estimate(input: EstimateInput): Estimate | Promise<Estimate> {
    const bytes = this.bytes
    if (input.provider === 'openai' && this.#tokenizer) {
      const encoding = openaiEncoding(input.model)
      const t = tokenizerState(encoding)
      if (t.state === 'ready') return this.#counted_(this.#promptCounter(encoding, t.counter), input)
      if (t.state === 'failed') return bytes.estimate(input)
      return loadTokenizer(encoding).then(
        (count) => this.#counted_(this.#promptCounter(encoding, count), input),
        () => bytes.estimate(input),
      )
    }
    const counter = this.#counter
    if (input.provider === 'anthropic' && counter !== null && counter.available() && !bytes.knowsPrefixOf(input)) {
      return counter.count(input.body).then(
        (tokens) => {
          bytes.recordPromptTokens(input, tokens)
          return bytes.estimate(input)
        },
        () => bytes.estimate(input),
      )
    }
    return bytes.estimate(input)
  }

  observe(observation: Observation): void {
    const counted = this.#counted.get(observation.estimate)
    if (counted === undefined) {
      this.bytes.observe(observation)
      return
    }
    const actual = observation.actualInputTokens
    if (counted.key === null || !(Number.isSafeInteger(actual) && actual > 0)) return
    this.#residuals.delete(counted.key)
    this.#residuals.set(counted.key, actual - counted.counted)
    while (this.#residuals.size > this.#capacity) this.#residuals.delete(this.#residuals.keys().next().value as string)
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
