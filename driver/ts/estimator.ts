/**
 * Input-token estimation before a call. The default ({@link DefaultEstimator}) counts an
 * OpenAI prompt with the model's tokenizer, and an Anthropic prompt with o200k_base as a
 * proxy times each model's factors learned from settled usage (or, opted in, by Anthropic's
 * `count_tokens` endpoint), following each provider's prompt-cache rules; plug in your own through
 * {@link Estimator}.
 */
import { type CountTokensOptions, CountTokensClient } from './counttokens.js'
import type { Provider } from './providers.js'
import { type CountText, type PromptCounter, bounded, loadTokenizer, openaiEncoding, openaiPromptTokens, tokenizerState } from './tokenize.js'

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

/** Options for {@link BytesPerTokenEstimator}. */
export interface BytesPerTokenOptions {
  /**
   * Bytes per token assumed for a model not seen yet. Low on purpose (English prose runs
   * near 4): an early over-estimate queues a little, an under-estimate risks a 429.
   */
  initialBytesPerToken?: number
  /**
   * Count text with this tokenizer as a proxy for the provider's (`DefaultEstimator` gives
   * o200k_base for Anthropic), instead of its bytes: the ratios learned are then provider
   * tokens per proxy token, and `initialBytesPerToken` is not used.
   */
  proxy?: CountText
  /**
   * With a `proxy`: provider tokens per proxy token assumed for a model not seen yet
   * (default 1.2: Claude's tokenizers are reported to split text into 16–30 % more tokens
   * than o200k_base, prose the least and code the most).
   */
  initialTokensPerProxyToken?: number
  /** Weight of each new observation in the moving average (0..1). */
  learningRate?: number
  /** Estimates are divided by this extra safety factor's inverse (default 1.02: 2 % high). */
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
  const n = s.length
  for (let i = 0; i < s.length; i++) {
    if (s.charCodeAt(i) > 0x7f) return encoder.encode(s).length
  }
  return n
}

/**
 * What the learned ratios price, by content class: each has its own ratio per model, since
 * tokenizers split them differently (dense code and command output run fewer bytes per
 * token than prose; CJK text runs about one token per character; a PDF's text is priced
 * apart, learned from calls with documents).
 */
const PROSE = 0
const CODE = 1
const CJK = 2
const DOC = 3
const CLASSES = 4

/**
 * How text is measured before the learned ratios turn it into tokens: its UTF-8 bytes, or
 * (`count`) a tokenizer's count standing in for the provider's (a proxy). `id` keys memoized
 * media costs.
 */
interface Meter {
  id: string
  count: CountText | null
}
const BYTE_METER: Meter = { id: 'b', count: null }

/** What a block costs: text units per class (priced at the learned ratios), and tokens counted by a provider's rule. */
interface Cost {
  units: number[]
  tokens: number
}

const noCost = (): Cost => ({ units: [0, 0, 0, 0], tokens: 0 })

function addCost(to: Cost, c: Cost): void {
  for (let k = 0; k < CLASSES; k++) (to.units[k] as number) += c.units[k] as number
  to.tokens += c.tokens
}

/**
 * A text's class, from one pass over (a sample of) its characters: CJK when a fifth of them
 * are CJK; code (or JSON, or command output) when a tenth are brackets, operators, quotes or
 * digits (prose has few; `.` and `,` do not count); else prose.
 */
function classify(s: string): number {
  const step = s.length > 8192 ? Math.ceil(s.length / 8192) : 1
  let n = 0
  let cjk = 0
  let sym = 0
  for (let i = 0; i < s.length; i += step) {
    const c = s.charCodeAt(i)
    n++
    if (c < 0x80) {
      if ((c >= 48 && c <= 57) || SYMBOL[c] === 1) sym++
    } else if ((c >= 0x3040 && c <= 0x30ff) || (c >= 0x3400 && c <= 0x9fff) || (c >= 0xac00 && c <= 0xd7af) || (c >= 0xf900 && c <= 0xfaff) || (c >= 0xff00 && c <= 0xffef)) cjk++
  }
  if (n === 0) return PROSE
  if (cjk * 5 >= n) return CJK
  return sym * 10 >= n ? CODE : PROSE
}
const SYMBOL = (() => {
  const t = new Uint8Array(128)
  for (const ch of '{}[]()<>;:=_/\\|"\'`#*&%$@!^~+-') t[ch.charCodeAt(0)] = 1
  return t
})()

/** A text's cost: its units (bytes, or the proxy's count) in its class, or in `as` when given. */
function textCost(meter: Meter, s: string, as?: number): Cost {
  const c = noCost()
  if (s.length === 0) return c
  ;(c.units as number[])[as ?? classify(s)] = meter.count === null ? bytes(s) : meter.count(s)
  return c
}
const tokensCost = (tokens: number): Cost => ({ units: [0, 0, 0, 0], tokens })

/** Text units (and media tokens) of a message `content` (a string or an array of blocks). */
function contentCost(meter: Meter, provider: Provider, content: unknown): Cost {
  if (typeof content === 'string') return textCost(meter, content)
  if (!Array.isArray(content)) return content === undefined || content === null ? noCost() : textCost(meter, JSON.stringify(content), CODE)
  const c = noCost()
  for (const block of content) addCost(c, blockCost(meter, provider, block))
  return c
}

function blockCost(meter: Meter, provider: Provider, block: unknown): Cost {
  if (typeof block === 'string') return textCost(meter, block)
  if (block === null || typeof block !== 'object') return noCost()
  const b = block as Record<string, unknown>
  if (typeof b.text === 'string') return textCost(meter, b.text)
  // A thinking block is its thinking text: the signature is not prompt text. (Whether an
  // earlier turn's thinking is in the prompt at all is decided in `analyze`.)
  if (b.type === 'thinking') return textCost(meter, typeof b.thinking === 'string' ? b.thinking : '')
  // A tool call is its name and input (its id and type, like a tool result's id, are protocol).
  if ((b.type === 'tool_use' || b.type === 'server_tool_use') && typeof b.name === 'string') {
    const c = textCost(meter, b.name, CODE)
    addCost(c, textCost(meter, JSON.stringify(b.input ?? {}), CODE))
    return c
  }
  if (b.type === 'redacted_thinking') return textCost(meter, typeof b.data === 'string' ? b.data : '', CODE)
  // Tool results (Anthropic's content, the Responses API's output) may hold images too.
  if (b.type === 'tool_result' && b.content !== undefined) return contentCost(meter, provider, b.content)
  if (b.type === 'function_call_output' && typeof b.output !== 'string' && b.output !== undefined) return contentCost(meter, provider, b.output)
  if (b.type === 'message' && b.content !== undefined) return contentCost(meter, provider, b.content)
  const media = mediaCost(meter, provider, b)
  if (media !== null) return media
  // Tool calls and anything else: their JSON, a fair upper bound for text parts.
  return textCost(meter, JSON.stringify(b), CODE)
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
  const scaled = Math.min(area, 1092 * 1092)
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
 * A PDF page as an image (Anthropic, docs "PDF support": each page is its extracted text plus
 * the page as an image). A letter or A4 page rendered at any usual resolution is scaled to
 * the image limit: Anthropic 1,590 tokens; OpenAI (the tile rule) 768 × 994 px, 4 tiles, 765.
 * The text is priced apart, by the learned document ratio.
 */
const PDF_PAGE_IMAGE = { anthropic: ANTHROPIC_IMAGE_MAX, openai: 85 + 170 * 4 } as const
/** The most text tokens a page is assumed to hold when its text cannot be read: the top of Anthropic's "1,500–3,000 tokens per page". */
const PDF_PAGE_TEXT_MAX = 3000

interface Size {
  w: number
  h: number
}

/** Media costs by meter, provider, detail and digest of the data, so a file in a history is read once. */
const mediaCosts = new Map<string, Cost | null>()
const MEDIA_COSTS = 256

/** The cost of an image or document block, or null when the block is neither (memoized for large files). */
function mediaCost(meter: Meter, provider: Provider, b: Record<string, unknown>): Cost | null {
  if (b.type !== 'image' && b.type !== 'image_url' && b.type !== 'input_image' && b.type !== 'document' && b.type !== 'file' && b.type !== 'input_file') return null
  const json = JSON.stringify(b, shorten)
  if (json.length > LONG && meter.count === null) return readMedia(meter, provider, b)
  const key = `${meter.id}\u0000${provider}\u0000${json}`
  const known = mediaCosts.get(key)
  if (known !== undefined) return known === null ? null : { units: [...known.units], tokens: known.tokens }
  const cost = readMedia(meter, provider, b)
  if (mediaCosts.size >= MEDIA_COSTS) mediaCosts.delete(mediaCosts.keys().next().value as string)
  mediaCosts.set(key, cost)
  return cost === null ? null : { units: [...cost.units], tokens: cost.tokens }
}

function readMedia(meter: Meter, provider: Provider, b: Record<string, unknown>): Cost | null {
  const image = (size: Size | null, detail?: unknown): Cost => tokensCost(provider === 'openai' ? openaiImageTokens(size, detail) : anthropicImageTokens(size))
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
    if (source?.type === 'text' && typeof source.data === 'string') return textCost(meter, source.data)
    if (source?.type === 'content') return contentCost(meter, provider, source.content)
    if (source?.type === 'base64' && typeof source.data === 'string') return pdfCost(meter, provider, source.data)
    // A URL or file id: the document is not in the request; one page at the least.
    return pdfCost(meter, provider, null)
  }
  if (b.type === 'file' || b.type === 'input_file') {
    // OpenAI: { file: { file_data: 'data:application/pdf;base64,…' } } or { file_data } (Responses).
    const f = (b.type === 'file' ? b.file : b) as Record<string, unknown> | undefined
    const data = typeof f?.file_data === 'string' ? f.file_data : null
    return pdfCost(meter, provider, data === null ? null : data.slice(data.indexOf(',') + 1))
  }
  return null
}

/**
 * A PDF: each page as an image by the provider's rule, plus its text in the document class
 * (priced by the learned document ratio): the text its content streams show when they are
 * uncompressed, else a guess from the file's size (three bytes of text per compressed byte,
 * at most {@link PDF_PAGE_TEXT_MAX} tokens a page).
 */
function pdfCost(meter: Meter, provider: Provider, b64: string | null): Cost {
  const info = b64 === null ? { pages: 1, text: null, bytes: 0 } : pdfInfo(b64)
  const cost = tokensCost(info.pages * PDF_PAGE_IMAGE[provider === 'openai' ? 'openai' : 'anthropic'])
  if (info.text !== null) {
    cost.units[DOC] = meter.count === null ? bytes(info.text) : meter.count(info.text)
  } else {
    // Text bytes guessed; the proxy counts about 4 bytes of text a token.
    const guess = Math.min(info.bytes * 3, info.pages * PDF_PAGE_TEXT_MAX * 3)
    cost.units[DOC] = meter.count === null ? guess : Math.ceil(guess / 4)
  }
  return cost
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
 * A PDF's page count and text from its bytes. Pages: the page objects (`/Type /Page`) or the
 * page tree's largest `/Count`, whichever is more; when neither can be read (compressed
 * object streams), one page per 50 KB of file, at least one. Text: the literal strings its
 * content streams show (`(…) Tj`, `[…] TJ`), one line each, when no stream is compressed
 * (a `/Filter`), else null.
 */
function pdfInfo(b64: string): { pages: number; text: string | null; bytes: number } {
  const data = decodeBase64(b64, Number.MAX_SAFE_INTEGER)
  // windows-1252 keeps every ASCII byte as it is, which is all the markers are.
  const src = new TextDecoder('latin1').decode(data)
  let pages = 0
  for (const _ of src.matchAll(/\/Type\s*\/Page(?![a-zA-Z])/g)) pages++
  for (const m of src.matchAll(/\/Type\s*\/Pages\b[^>]*?\/Count\s+(\d+)|\/Count\s+(\d+)[^>]*?\/Type\s*\/Pages\b/g)) {
    pages = Math.max(pages, Number(m[1] ?? m[2]))
  }
  if (pages === 0) pages = Math.max(1, Math.ceil(data.length / 50_000))
  let text: string | null = null
  if (!/\/Filter\b/.test(src)) {
    const lines: string[] = []
    let at = src.indexOf('stream')
    while (at >= 0) {
      const start = at + 6
      const end = src.indexOf('endstream', start)
      if (end < 0) break
      for (const m of src.slice(start, end).matchAll(/\((?:\\[\s\S]|[^\\)])*\)/g)) lines.push(m[0].slice(1, -1).replace(/\\([()\\])/g, '$1'))
      at = src.indexOf('stream', end + 9)
    }
    if (lines.length > 0) text = lines.join('\n')
  }
  return { pages, text, bytes: data.length }
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
  /** Text units per class up to and including this block (priced at the learned ratios). */
  end: number[]
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
  /** Text units per class of the whole prompt. */
  total: number[]
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

/**
 * How many of the latest assistant messages with thinking keep it in the prompt (Infinity:
 * all). Anthropic (docs, "Extended thinking" and "Context editing"): thinking blocks of
 * earlier turns are taken out of the prompt and not billed, except as kept by
 * `context_management`'s `clear_thinking_20251015` edit (`keep: 'all'`, or `{type:
 * 'thinking_turns', value: N}`; 1 when not given); without that edit the default depends on
 * the model: Claude Opus 4.5 and later, Sonnet 4.6 and later (and Mythos) keep all; Opus 4.1,
 * Sonnet 4.5, every Haiku through 4.5 and the Claude 3 models keep the last assistant turn's
 * only. A model not known keeps all (newer models do; counting them errs high).
 */
export function thinkingTurnsKept(model: string, body: Record<string, unknown>): number {
  const cm = body.context_management as Record<string, unknown> | undefined
  const edits = cm !== null && typeof cm === 'object' && Array.isArray(cm.edits) ? (cm.edits as unknown[]) : []
  for (const e of edits) {
    if (e === null || typeof e !== 'object') continue
    const edit = e as Record<string, unknown>
    if (typeof edit.type !== 'string' || !edit.type.startsWith('clear_thinking')) continue
    const keep = edit.keep as Record<string, unknown> | string | undefined
    if (keep === 'all') return Number.POSITIVE_INFINITY
    if (keep !== null && typeof keep === 'object' && keep.type === 'thinking_turns' && Number.isInteger(keep.value) && (keep.value as number) >= 0) return keep.value as number
    return 1
  }
  const m = model.toLowerCase()
  if (/claude-3|claude-instant|claude-2/.test(m)) return 1
  const family = /(opus|sonnet|haiku)-(\d+)(?:-(\d{1,2})(?!\d))?/.exec(m)
  if (family === null) return Number.POSITIVE_INFINITY
  const major = Number(family[2])
  const minor = family[3] === undefined ? 0 : Number(family[3])
  const from = family[1] === 'opus' ? 5 : family[1] === 'sonnet' ? 6 : 6
  return major > 4 || (major === 4 && minor >= from) ? Number.POSITIVE_INFINITY : 1
}

function analyze(provider: Provider, model: string, body: Record<string, unknown>, meter: Meter = BYTE_METER): Prompt {
  const pieces: Piece[] = []
  const hash = new PrefixHash()
  hash.push(`${provider}\u0000${model}`)
  const total = [0, 0, 0, 0]
  let fixed = 0
  let last = -1
  // A few bytes (tokens, with the proxy) of framing per message (role, separators), counted with its first block.
  const FRAMING = meter.count === null ? 8 : 3
  const piece = (cost: Cost, framing: number, text: string, control: Record<string, unknown> | null): void => {
    for (let k = 0; k < CLASSES; k++) (total[k] as number) += cost.units[k] as number
    ;(total[PROSE] as number) += framing
    fixed += cost.tokens
    hash.push(text)
    if (control !== null) last = pieces.length
    pieces.push({ end: [...total], fixed, key: hash.key(), ttlMs: control === null ? 0 : ttlOf(control) })
  }
  // A string is the same prompt as one text block holding it (Anthropic's cache hashes the
  // rendered prompt: Claude Code sends a message as a block on one call and as a string on
  // the next), so both hash as the block.
  const asBlock = (text: string): string => canonical({ type: 'text', text })
  const tools = body.tools
  if (Array.isArray(tools)) {
    if (provider === 'anthropic' && tools.length > 0) {
      // The system prompt Anthropic adds for tool use, by `tool_choice`.
      const choice = (body.tool_choice as Record<string, unknown> | undefined)?.type
      const forced = choice === 'any' || choice === 'tool'
      piece(tokensCost(forced ? TOOL_USE_FORCED : TOOL_USE_AUTO), 0, `t${forced ? 'forced' : 'auto'}`, null)
    }
    for (const t of tools) piece(textCost(meter, JSON.stringify(t) ?? '', CODE), 0, canonical(t), cacheControl(t))
  }
  const system = body.system
  if (typeof system === 'string') piece(textCost(meter, system), 0, asBlock(system), null)
  else if (Array.isArray(system)) {
    for (const block of system) piece(blockCost(meter, provider, block), 0, canonical(block), cacheControl(block))
  }
  // The Responses API: `instructions`, then `input` (a string or a list of items).
  if (typeof body.instructions === 'string') piece(textCost(meter, body.instructions), 0, `i${body.instructions}`, null)
  const messages = Array.isArray(body.messages) ? body.messages : typeof body.input === 'string' ? [{ role: 'user', content: body.input }] : Array.isArray(body.input) ? body.input : []
  // Anthropic: which assistant messages' thinking is in the prompt (the latest `kept` with any).
  let thinkingFrom = 0
  if (provider === 'anthropic') {
    const kept = thinkingTurnsKept(model, body)
    if (kept !== Number.POSITIVE_INFINITY) {
      let seen = 0
      thinkingFrom = messages.length
      for (let i = messages.length - 1; i >= 0 && seen < kept; i--) {
        const m = messages[i] as Record<string, unknown> | null
        if (m?.role === 'assistant' && Array.isArray(m.content) && m.content.some(isThinking)) {
          seen++
          thinkingFrom = i
        }
      }
    }
  }
  messages.forEach((m: unknown, at: number) => {
    if (m === null || typeof m !== 'object') return
    const msg = m as Record<string, unknown>
    // A Responses API item that is not a message (a function call or its output) is one block.
    if (msg.content === undefined && msg.role === undefined) {
      piece(blockCost(meter, provider, msg), FRAMING, canonical(msg), null)
      return
    }
    const content = msg.content
    let framing = FRAMING
    const role = `r${String(msg.role)}`
    if (Array.isArray(content)) {
      content.forEach((block, i) => {
        // An earlier turn's thinking the provider takes out: no tokens, and another prefix.
        const stripped = at < thinkingFrom && isThinking(block)
        const key = (i === 0 ? role : '') + canonical(block) + (stripped ? '\u0000stripped' : '')
        piece(stripped ? noCost() : blockCost(meter, provider, block), framing, key, cacheControl(block))
        framing = 0
      })
      if (content.length === 0) piece(noCost(), framing, role, null)
    } else {
      piece(contentCost(meter, provider, content), framing, role + (typeof content === 'string' ? asBlock(content) : (JSON.stringify(content) ?? '')), cacheControl(m))
    }
  })
  return { pieces, total, fixed, last }
}

const isThinking = (b: unknown): boolean => b !== null && typeof b === 'object' && ((b as Record<string, unknown>).type === 'thinking' || (b as Record<string, unknown>).type === 'redacted_thinking')

const sum = (u: number[]): number => (u[0] as number) + (u[1] as number) + (u[2] as number) + (u[3] as number)

/**
 * Prompt bytes, split at the Anthropic prompt-cache breakpoint: everything up to and
 * including the last block marked `cache_control` (tools, then system, then messages) is
 * the cacheable prefix. (Cacheable, not cached: {@link BytesPerTokenEstimator} counts as a
 * read only what an earlier call cached.) A PDF's bytes are its text's.
 */
export function promptBytes(provider: Provider, body: Record<string, unknown>): { prefix: number; rest: number } {
  const { pieces, total, last } = analyze(provider, '', body)
  if (provider !== 'anthropic') return { prefix: 0, rest: sum(total) }
  const prefix = last < 0 ? 0 : sum((pieces[last] as Piece).end)
  return { prefix, rest: sum(total) - prefix }
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
  /** The longest prefix whose tokens were known exactly (piece index and tokens), or null. */
  known: { at: number; tokens: number } | null
}

/** A prompt analyzed once per request body (the wrapper estimates one body again on a retry). */
interface Analyzed {
  provider: Provider
  model: string
  prompt: Prompt
}

/**
 * The byte rule: tokens = bytes / (bytes per token), learned per model and content class
 * (prose, code or JSON, CJK, a PDF's text: see `classify`) from what settled calls really
 * counted, each class's ratio corrected by its share of the error (the first observation of
 * a class sets it; later ones move it by `learningRate`), from the part of the prompt that
 * was not known exactly (a new turn's text alone, when its previous turn's count is known)
 * — except for what is known exactly: a prompt prefix
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
  /** Tokens per unit by class, and how much of each class has been seen (weight), per model. */
  readonly #ratio = new Map<string, { t: number[]; seen: number[] }>()
  readonly #initial: number
  readonly #rate: number
  readonly #safety: number
  readonly #now: () => number
  readonly #capacity: number
  readonly #minCache: number
  readonly #meter: Meter
  /** Cached prefixes by content hash, least recently used first. */
  readonly #cache = new Map<string, Cached>()
  /** Prompt tokens known exactly, by the content hash of the prefix they count, least recently used first. */
  readonly #known = new Map<string, number>()
  readonly #asked = new WeakMap<Estimate, Asked>()
  readonly #analyzed = new WeakMap<Record<string, unknown>, Analyzed>()

  constructor(options: BytesPerTokenOptions = {}) {
    const proxy = options.proxy
    if (proxy !== undefined && typeof proxy !== 'function') throw new TypeError('proxy must be a function counting the tokens of a text')
    this.#meter = proxy === undefined ? BYTE_METER : { id: 'p', count: proxy }
    // With a proxy the ratio is the provider's tokens per proxy token.
    this.#initial = proxy === undefined ? 1 / (options.initialBytesPerToken ?? 3) : (options.initialTokensPerProxyToken ?? 1.2)
    this.#rate = options.learningRate ?? 0.3
    this.#safety = options.safety ?? 1.02
    this.#now = options.now ?? Date.now
    this.#capacity = options.cachedPrefixes ?? 4096
    this.#minCache = options.minCacheTokens ?? 1024
    if (!(this.#initial > 0) || !Number.isFinite(this.#initial)) throw new RangeError(proxy === undefined ? 'initialBytesPerToken must be positive' : 'initialTokensPerProxyToken must be positive')
    if (!(this.#rate > 0 && this.#rate <= 1)) throw new RangeError('learningRate must be in (0, 1]')
    if (!(this.#safety >= 1)) throw new RangeError('safety must be at least 1')
    if (typeof this.#now !== 'function') throw new TypeError('now must be a function returning milliseconds')
    if (!(Number.isInteger(this.#capacity) && this.#capacity >= 1)) throw new RangeError('cachedPrefixes must be a positive integer')
    if (!(this.#minCache >= 0)) throw new RangeError('minCacheTokens must be zero or more')
  }

  /**
   * The learned bytes per token of prose for a model (the initial value until one settles);
   * code, CJK and PDF text have their own ({@link ratios}). With a `proxy`: the proxy's
   * tokens per provider token.
   */
  bytesPerToken(provider: Provider, model: string): number {
    return 1 / (this.#factors(provider, model)[PROSE] as number)
  }

  /** The learned ratios of a model by class (bytes, or proxy tokens, per token). */
  ratios(provider: Provider, model: string): { prose: number; code: number; cjk: number; document: number } {
    const t = this.#factors(provider, model)
    return { prose: 1 / (t[PROSE] as number), code: 1 / (t[CODE] as number), cjk: 1 / (t[CJK] as number), document: 1 / (t[DOC] as number) }
  }

  /** How many prompt prefixes are remembered as cached (at most `cachedPrefixes`). */
  get cachedPrefixCount(): number {
    return this.#cache.size
  }

  #factors(provider: Provider, model: string): number[] {
    return this.#ratio.get(`${provider}:${model}`)?.t ?? [this.#initial, this.#initial, this.#initial, this.#initial]
  }

  /** Tokens of text units at a model's ratios (no safety margin). */
  #tokens(t: number[], units: number[], from: number[] | null): number {
    let n = 0
    for (let k = 0; k < CLASSES; k++) n += ((units[k] as number) - (from === null ? 0 : (from[k] as number))) * (t[k] as number)
    return n
  }

  #analyze(provider: Provider, model: string, body: Record<string, unknown>): Prompt {
    const a = this.#analyzed.get(body)
    if (a !== undefined && a.provider === provider && a.model === model) return a.prompt
    const prompt = analyze(provider, model, body, this.#meter)
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

  /**
   * Learns from `tokens` counted for the text units `units` (beyond `from`, a known prefix):
   * each class's tokens per unit scaled toward what the count shows, by its share of the
   * estimate (all of it the first time a class is seen, else `learningRate` of it).
   */
  #learn(provider: Provider, model: string, units: number[], from: number[] | null, tokens: number, minTokens: number): void {
    const key = `${provider}:${model}`
    let r = this.#ratio.get(key)
    const t = r?.t ?? this.#factors(provider, model)
    const parts = [0, 0, 0, 0]
    let predicted = 0
    for (let k = 0; k < CLASSES; k++) {
      const p = ((units[k] as number) - (from === null ? 0 : (from[k] as number))) * (t[k] as number)
      parts[k] = Math.max(p, 0)
      predicted += parts[k] as number
    }
    if (!(tokens > 0 && predicted > 0 && predicted >= minTokens) || !Number.isFinite(tokens / predicted)) return
    // One call's scale is bounded: a count far off (a known prefix gone stale, say) moves a ratio by 4× at most.
    const scale = Math.min(4, Math.max(0.25, tokens / predicted))
    if (r === undefined) {
      r = { t: [...t], seen: [0, 0, 0, 0] }
      this.#ratio.set(key, r)
    }
    for (let k = 0; k < CLASSES; k++) {
      const w = (parts[k] as number) / predicted
      if (w === 0) continue
      const rate = w * ((r.seen[k] as number) < 1 ? 1 : this.#rate)
      ;(r.t[k] as number) *= 1 + rate * (scale - 1)
      ;(r.seen[k] as number) += w
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
    this.#learn(provider, model, prompt.total, null, tokens - prompt.fixed, 0)
    this.#know(last.key, tokens)
  }

  estimate({ provider, model, body }: EstimateInput): Estimate {
    const t = this.#factors(provider, model)
    const safety = this.#safety
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
    const upTo = read < 0 ? null : (prompt.pieces[read] as Piece)
    let inputTokens = Math.ceil(this.#tokens(t, prompt.total, upTo?.end ?? null) * safety) + prompt.fixed - (upTo?.fixed ?? 0)
    const known = this.#knownPrefix(prompt)
    if (known !== null && known.at >= read) {
      // Exact up to the known prefix, the ratio for what follows it; the cache read is part of the prefix.
      const p = prompt.pieces[known.at] as Piece
      const total = known.tokens + Math.ceil(this.#tokens(t, prompt.total, p.end) * safety) + prompt.fixed - p.fixed
      inputTokens = Math.max(0, total - cached)
    }
    // What is counted cached is a prefix a settled call showed cached, not yet expired.
    const estimate: Estimate = { inputTokens, cachedPrefixTokens: cached, ...(cached > 0 ? { cachedPrefixConfirmed: true } : {}) }
    this.#asked.set(estimate, { prompt, at, read, known: known !== null && known.at >= read ? known : null })
    return estimate
  }

  observe({ provider, model, body, estimate, actualInputTokens, usage }: Observation): void {
    if (!(actualInputTokens > 0) || !Number.isFinite(actualInputTokens)) return
    const asked = this.#asked.get(estimate) ?? { prompt: this.#analyze(provider, model, body), at: this.#now(), read: -1, known: null }
    const { pieces, total, fixed, last } = asked.prompt
    // The ratios before this observation places earlier prefixes (below).
    const t = [...this.#factors(provider, model)]
    // The text's share: what the provider counted beyond the images' and documents' rule.
    const textTokens = actualInputTokens - fixed
    // Learn from what was not known: the part after the known prefix (a new turn alone, a
    // few hundred tokens of small ones skipped: framing is most of them), or the whole prompt.
    const known = asked.known
    if (known !== null && known.at < pieces.length - 1) {
      const p = pieces[known.at] as Piece
      this.#learn(provider, model, total, p.end, actualInputTokens - known.tokens - (fixed - p.fixed), 200)
    } else if (known === null) {
      this.#learn(provider, model, total, null, textTokens, 0)
    }
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
    // when it took the call in: this call's own tokens per unit place each earlier prefix's tokens.
    const all = this.#tokens(t, total, null)
    const remember = (i: number, ttlMs: number): void => {
      const p = pieces[i] as Piece
      const tokens =
        i === last && exactLast !== null
          ? exactLast
          : textTokens > 0 && all > 0
            ? p.fixed + Math.round((textTokens * this.#tokens(t, p.end, null)) / all)
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
   * cl100k_base by model (see `openaiEncoding`), the provider crate's byte-pair tokenizer
   * from the engine package in use (`useTokenizers`: the native addon's, or the wasm
   * build's with its ranks loaded when first needed), made the first time an OpenAI call is
   * estimated (that estimate waits for it: 10–50 ms; the others are synchronous); and
   * Anthropic prompts with o200k_base as a proxy for Claude's tokenizer (made the same way
   * on the first Anthropic estimate). Where it cannot be had (no engine package imported),
   * or with `false`, the byte rule.
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

/**
 * The longest run without whitespace the proxy tokenizes whole (the tokenizer's own bound,
 * `bounded`, is wider: the OpenAI count stays exact on longer runs than the proxy needs).
 */
const MAX_RUN = 256

/** OpenAI image and file blocks by the published rules (the same as the byte rule's), a PDF's text counted by `count`. */
const openaiMedia =
  (meter: Meter) =>
  (block: Record<string, unknown>): number | null => {
    const c = mediaCost(meter, 'openai', block)
    return c === null ? null : c.tokens + sum(c.units)
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
  /** The byte rule this estimator falls back on (Anthropic without the tokenizer): its learned ratios and known prefixes. */
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
  readonly #options: DefaultEstimatorOptions
  /** Anthropic with the tokenizer: the byte rule's machinery counting o200k_base tokens as a proxy (made once it is loaded). */
  #proxy: BytesPerTokenEstimator | null = null
  /** Which of the two made an Anthropic estimate, for its observation. */
  readonly #by = new WeakMap<Estimate, BytesPerTokenEstimator>()

  constructor(options: DefaultEstimatorOptions = {}) {
    this.#options = options
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
      const counted = memoized(count)
      c = { encoding, count: counted, media: openaiMedia({ id: encoding, count: counted }) }
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

  /**
   * The estimator Anthropic calls go through: the byte rule counting o200k_base tokens as a
   * proxy once the tokenizer is loaded (its ratios are Claude tokens per o200k_base token),
   * or null (the tokenizer off, not loaded yet, or not loadable: then {@link bytes}).
   */
  get proxy(): BytesPerTokenEstimator | null {
    return this.#proxy
  }

  /** How many prompt prefixes are remembered as cached. */
  get cachedPrefixCount(): number {
    return this.bytes.cachedPrefixCount + (this.#proxy?.cachedPrefixCount ?? 0)
  }

  /** The Anthropic estimator counting with o200k_base as a proxy, made on first use. */
  #proxied(count: CountText): BytesPerTokenEstimator {
    if (this.#proxy === null) this.#proxy = new BytesPerTokenEstimator({ ...this.#options, proxy: bounded(this.#promptCounter('o200k_base', count).count, MAX_RUN, Infinity) })
    return this.#proxy
  }

  /** Anthropic, by the estimator given (the proxy or the byte rule), through `count_tokens` when opted in. */
  #anthropic(by: BytesPerTokenEstimator, input: EstimateInput): Estimate | Promise<Estimate> {
    const mark = (e: Estimate): Estimate => {
      this.#by.set(e, by)
      return e
    }
    const counter = this.#counter
    if (counter?.available() && !by.knowsPrefixOf(input)) {
      return counter.count(input.body).then(
        (tokens) => {
          by.recordPromptTokens(input, tokens)
          return mark(by.estimate(input))
        },
        () => mark(by.estimate(input)),
      )
    }
    return mark(by.estimate(input))
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
    if (input.provider === 'anthropic' && this.#tokenizer) {
      // Claude's tokenizer is not public: o200k_base's count stands in, times a learned factor.
      const t = tokenizerState('o200k_base')
      if (t.state === 'ready') return this.#anthropic(this.#proxied(t.counter), input)
      if (t.state !== 'failed') {
        return loadTokenizer('o200k_base').then(
          (count) => this.#anthropic(this.#proxied(count), input),
          () => this.#anthropic(bytes, input),
        )
      }
    }
    return this.#anthropic(bytes, input)
  }

  observe(observation: Observation): void {
    const counted = this.#counted.get(observation.estimate)
    if (counted === undefined) {
      const by = this.#by.get(observation.estimate) ?? (observation.provider === 'anthropic' && this.#proxy !== null ? this.#proxy : this.bytes)
      by.observe(observation)
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
