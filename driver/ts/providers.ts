/**
 * What the `fetch` wrapper knows about each provider's API: which requests are model
 * calls, where the model and `max_tokens` are, and where usage comes back (a JSON body or
 * a server-sent-event stream). Three APIs: Anthropic Messages, OpenAI Chat Completions and
 * the OpenAI Responses API (both `openai`: the usage and event shapes tell them apart).
 */
import type { Usage } from './types.js'

/** A provider API the wrapper understands. */
export type Provider = 'anthropic' | 'openai'

/** The fields of a request body the wrapper needs. */
export interface CallShape {
  model: string
  /** The output reservation. */
  maxTokens: number
  stream: boolean
}

/** Default output reservation when a request names none (OpenAI allows that). */
export const DEFAULT_MAX_TOKENS = 4096

/**
 * Reads model, max tokens and stream flag from a parsed request body. The output cap is
 * Anthropic's `max_tokens`; OpenAI's `max_output_tokens` (Responses), else
 * `max_completion_tokens` ?? `max_tokens` (Chat Completions).
 */
export function callShape(provider: Provider, body: Record<string, unknown>): CallShape {
  const model = typeof body.model === 'string' ? body.model : ''
  const raw = provider === 'anthropic' ? body.max_tokens : (body.max_output_tokens ?? body.max_completion_tokens ?? body.max_tokens)
  const maxTokens = typeof raw === 'number' && Number.isSafeInteger(raw) && raw >= 0 ? raw : DEFAULT_MAX_TOKENS
  return { model, maxTokens, stream: body.stream === true }
}

/** The largest token count a usage figure is taken as (2^53 - 1, the engines' limit). */
export const MAX_COUNT = Number.MAX_SAFE_INTEGER

/** A count read from a provider's usage: absent (or `null`), malformed, or a number. */
type Count = number | 'absent' | 'bad'

/**
 * A token count as a provider reported it: a finite number at least 0, floored and
 * clamped to {@link MAX_COUNT} (an absurd figure such as 1e300 or 2^64 is still a call
 * that ran; the core clamps a settle to one window of the axis's limit). A string, a
 * negative or non-finite number, or anything else is malformed: missing usage, never 0.
 */
function count(v: unknown): Count {
  if (v === undefined || v === null) return 'absent'
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) return 'bad'
  return Math.min(Math.floor(v), MAX_COUNT)
}

/** A required count: a number, else `null`. */
function required(v: unknown): number | null {
  const c = count(v)
  return typeof c === 'number' ? c : null
}

/** An optional count: a number, absent as `fallback`, malformed as `null`. */
function optional(v: unknown, fallback: number): number | null {
  const c = count(v)
  return c === 'absent' ? fallback : c === 'bad' ? null : c
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

/**
 * Usage from a complete (non-streamed) response body, or `null` when it has none or it is
 * malformed (a required count missing; a count that is a string, negative or not finite).
 */
export function usageFromBody(provider: Provider, json: unknown): Usage | null {
  if (!isObject(json)) return null
  const u = json.usage
  if (!isObject(u)) return null
  return provider === 'anthropic' ? anthropicUsage(u) : openaiUsage(u)
}

/** Anthropic's usage object: input and output counts required, cache counts 0 when absent. */
function anthropicUsage(u: Record<string, unknown>): Usage | null {
  const inputTokens = required(u.input_tokens)
  const outputTokens = required(u.output_tokens)
  const cacheCreationInputTokens = optional(u.cache_creation_input_tokens, 0)
  const cacheReadInputTokens = optional(u.cache_read_input_tokens, 0)
  if (inputTokens === null || outputTokens === null || cacheCreationInputTokens === null || cacheReadInputTokens === null) return null
  return { inputTokens, cacheCreationInputTokens, cacheReadInputTokens, outputTokens }
}

/**
 * OpenAI's usage object: Chat Completions' (`prompt_tokens`, `completion_tokens`,
 * `prompt_tokens_details.cached_tokens`) or, when it has no `prompt_tokens` but has
 * `input_tokens`, the Responses API's (`input_tokens`, `output_tokens`,
 * `input_tokens_details.cached_tokens`; its reasoning tokens are part of `output_tokens`).
 * Both counts are required. OpenAI reports cached tokens inside the prompt count: the core
 * wants them apart (uncached input, and cache reads).
 */
function openaiUsage(u: Record<string, unknown>): Usage | null {
  const responses = (u.prompt_tokens === undefined || u.prompt_tokens === null) && u.input_tokens !== undefined && u.input_tokens !== null
  const prompt = required(responses ? u.input_tokens : u.prompt_tokens)
  const completion = required(responses ? u.output_tokens : u.completion_tokens)
  const details = responses ? u.input_tokens_details : u.prompt_tokens_details
  if (details !== undefined && details !== null && !isObject(details)) return null
  const cachedCount = optional(isObject(details) ? details.cached_tokens : undefined, 0)
  if (prompt === null || completion === null || cachedCount === null) return null
  const cached = Math.min(prompt, cachedCount)
  return { inputTokens: prompt - cached, cacheReadInputTokens: cached, outputTokens: completion }
}

/** Every prompt token a usage counts (uncached, cache writes and cache reads). */
export function promptTokens(u: Usage): number {
  return Number(u.inputTokens ?? 0) + Number(u.cacheCreationInputTokens ?? 0) + Number(u.cacheReadInputTokens ?? 0)
}

/** The most of one server-sent event (or line) {@link SseUsage} holds: a longer one is skipped. */
const MAX_EVENT_CHARS = 1 << 20

/**
 * Follows a server-sent-event stream as it passes through and collects usage:
 * Anthropic's `message_start` (input and cache counts) and `message_delta` (cumulative
 * output), OpenAI's final chunk with `usage` (sent with `stream_options.include_usage`),
 * the Responses API's `response.completed`, `response.incomplete` or `response.failed`
 * (the `usage` of the response it carries). It also counts the characters of generated
 * text (and reasoning, tool arguments), for a fallback when no usage arrives.
 *
 * {@link complete} says whether the stream gave its final usage: Anthropic's
 * `message_delta` usage (input counts known from `message_start` or repeated there),
 * OpenAI's usage chunk, or a Responses stream's terminal event with its usage, and no
 * `error` event (a `response.failed` without usage counts as one). A stream that ends without it was cut short,
 * whatever its transport did: settle it with `lease.interrupted(seen)`, not with
 * {@link usage}. Memory is bounded: a line or event above 1 MiB is skipped (its
 * characters counted as text).
 */
export class SseUsage {
  readonly #provider: Provider
  readonly #decoder = new TextDecoder()
  #buffer = ''
  #skipLine = false
  #event = ''
  #data: string[] = []
  #dataChars = 0
  #final = false
  /** Usage reported so far, or `null`. */
  usage: Usage | null = null
  /** Whether the stream said it finished (`message_stop` / `[DONE]`). */
  finished = false
  /** Whether the stream reported an error (Anthropic's `error` event, an OpenAI `error` chunk). */
  errored = false
  /** Whether a usage figure was malformed (a string, negative or not finite): missing, not 0. */
  malformed = false
  /** Characters of generated text seen. */
  textBytes = 0

  constructor(provider: Provider) {
    this.#provider = provider
  }

  /** Whether the final usage arrived and no error followed: {@link usage} is what the call used. */
  get complete(): boolean {
    return this.#final && !this.errored && this.usage !== null
  }

  /** Feeds a chunk of the raw stream. */
  push(chunk: Uint8Array): void {
    this.#take(this.#decoder.decode(chunk, { stream: true }))
  }

  /** Ends the stream (dispatches a last event without a trailing blank line). */
  end(): void {
    this.#take(this.#decoder.decode())
    if (this.#buffer.length > 0 && !this.#skipLine) this.#line(this.#buffer)
    this.#buffer = ''
    this.#skipLine = false
    this.#line('')
  }

  #take(text: string): void {
    let start = 0
    for (;;) {
      const nl = text.indexOf('\n', start)
      if (nl === -1) break
      const piece = text.slice(start, nl)
      start = nl + 1
      if (this.#skipLine) {
        this.#skipLine = false
        this.textBytes += piece.length
        this.#buffer = ''
        continue
      }
      let line = this.#buffer + piece
      this.#buffer = ''
      if (line.endsWith('\r')) line = line.slice(0, -1)
      this.#line(line)
    }
    const rest = text.slice(start)
    if (this.#skipLine) {
      this.textBytes += rest.length
    } else if (this.#buffer.length + rest.length > MAX_EVENT_CHARS) {
      // A line this long is no usage report: skip to its end, counting it as text.
      this.textBytes += this.#buffer.length + rest.length
      this.#buffer = ''
      this.#skipLine = true
    } else {
      this.#buffer += rest
    }
  }

  #line(line: string): void {
    if (line === '') {
      if (this.#data.length > 0) this.#dispatch(this.#event, this.#data.join('\n'))
      this.#event = ''
      this.#data = []
      this.#dataChars = 0
      return
    }
    if (line.startsWith(':')) return
    const colon = line.indexOf(':')
    const name = colon === -1 ? line : line.slice(0, colon)
    let value = colon === -1 ? '' : line.slice(colon + 1)
    if (value.startsWith(' ')) value = value.slice(1)
    if (name === 'event') this.#event = value
    else if (name === 'data') {
      this.#dataChars += value.length
      if (this.#dataChars > MAX_EVENT_CHARS) {
        this.textBytes += this.#dataChars
        this.#data = []
        this.#dataChars = 0
        return
      }
      this.#data.push(value)
    }
  }

  #dispatch(event: string, data: string): void {
    if (data === '[DONE]') {
      this.finished = true
      return
    }
    let json: unknown
    try {
      json = JSON.parse(data)
    } catch {
      return
    }
    if (!isObject(json)) return
    if (this.#provider === 'anthropic') this.#anthropic(event || String(json.type ?? ''), json)
    else this.#openai(json)
  }

  #anthropic(event: string, json: Record<string, unknown>): void {
    if (event === 'message_start') {
      const message = json.message
      const u = isObject(message) ? message.usage : undefined
      if (!isObject(u)) return
      const start = anthropicUsage({ output_tokens: 0, ...u })
      if (start === null) this.malformed = true
      else this.usage = start
    } else if (event === 'message_delta') {
      const u = json.usage
      if (!isObject(u)) return
      const base = this.usage
      // Cumulative counts; newer API versions repeat the input counts here too.
      const outputTokens = required(u.output_tokens)
      const inputTokens = optional(u.input_tokens, base === null ? -1 : Number(base.inputTokens ?? 0))
      const cacheCreationInputTokens = optional(u.cache_creation_input_tokens, Number(base?.cacheCreationInputTokens ?? 0))
      const cacheReadInputTokens = optional(u.cache_read_input_tokens, Number(base?.cacheReadInputTokens ?? 0))
      if (outputTokens === null || inputTokens === null || cacheCreationInputTokens === null || cacheReadInputTokens === null) {
        this.malformed = true
        return
      }
      if (inputTokens < 0) {
        // No input count anywhere (message_start's was missing or malformed): not final.
        this.usage = { outputTokens }
        return
      }
      this.usage = { inputTokens, cacheCreationInputTokens, cacheReadInputTokens, outputTokens }
      this.#final = true
    } else if (event === 'content_block_delta') {
      const delta = json.delta
      if (!isObject(delta)) return
      const text = delta.text ?? delta.partial_json ?? delta.thinking
      if (typeof text === 'string') this.textBytes += text.length
    } else if (event === 'message_stop') {
      this.finished = true
    } else if (event === 'error') {
      this.errored = true
    }
  }

  #openai(json: Record<string, unknown>): void {
    // The Responses API's events say their type; Chat Completions chunks do not.
    if (typeof json.type === 'string') {
      this.#responses(json.type, json)
      return
    }
    if (json.error !== undefined && json.error !== null) this.errored = true
    const u = json.usage
    if (isObject(u)) {
      const usage = openaiUsage(u)
      if (usage === null) {
        this.malformed = true
      } else {
        this.usage = usage
        this.#final = true
      }
    } else if (u !== undefined && u !== null) {
      this.malformed = true
    }
    const choices = json.choices
    if (Array.isArray(choices)) {
      for (const c of choices) {
        const content = isObject(c) && isObject(c.delta) ? c.delta.content : undefined
        if (typeof content === 'string') this.textBytes += content.length
      }
    }
  }

  /**
   * One Responses API event: its terminal events carry the response with its usage
   * (`response.completed`; `response.incomplete` when `max_output_tokens` or a content
   * filter cut it short, still a full report; `response.failed`, a report when it has
   * usage); `error` ends the stream without one. Deltas of text, reasoning and tool
   * arguments count as text seen.
   */
  #responses(type: string, json: Record<string, unknown>): void {
    if (type === 'response.completed' || type === 'response.incomplete' || type === 'response.failed') {
      this.finished = true
      const response = json.response
      const u = isObject(response) ? response.usage : undefined
      if (isObject(u)) {
        const usage = openaiUsage(u)
        if (usage === null) {
          this.malformed = true
        } else {
          this.usage = usage
          this.#final = true
        }
      } else if (u !== undefined && u !== null) {
        this.malformed = true
      } else if (type === 'response.failed') {
        this.errored = true
      }
    } else if (type === 'error') {
      this.errored = true
    } else if (type.endsWith('.delta') && !type.includes('audio')) {
      const delta = json.delta
      if (typeof delta === 'string') this.textBytes += delta.length
    }
  }
}

/** Bodies up to this size are parsed whole for their usage. */
export const WHOLE_BODY_BYTES = 1 << 20
/** Of a larger body, only this much of its end is kept: the top-level `usage` is there. */
export const BODY_TAIL_BYTES = 64 << 10

/**
 * Collects a non-streamed JSON body's usage as it passes through, with bounded memory: a
 * body up to {@link WHOLE_BODY_BYTES} is parsed whole; of a larger one only the last
 * {@link BODY_TAIL_BYTES} are kept, and the top-level `usage` member is found there
 * (Anthropic and OpenAI both put it at the end, before at most a few short members).
 */
export class BodyUsage {
  readonly #provider: Provider
  #chunks: Uint8Array[] = []
  #held = 0
  /** Bytes seen in all. */
  total = 0

  constructor(provider: Provider) {
    this.#provider = provider
  }

  /** Feeds a chunk of the body. */
  push(chunk: Uint8Array): void {
    this.total += chunk.length
    // Copies (whoever reads the body may transfer its buffers), of at most the tail.
    if (this.total <= WHOLE_BODY_BYTES) {
      this.#chunks.push(chunk.slice())
      this.#held += chunk.length
      return
    }
    const keep = chunk.length > BODY_TAIL_BYTES ? chunk.slice(chunk.length - BODY_TAIL_BYTES) : chunk.slice()
    this.#chunks.push(keep)
    this.#held += keep.length
    while (this.#chunks.length > 1 && this.#held - this.#chunks[0]!.length >= BODY_TAIL_BYTES) {
      this.#held -= this.#chunks.shift()!.length
    }
  }

  /** The body's usage, once it has ended, or `null` when it has none or it is malformed. */
  usage(): Usage | null {
    const bytes = new Uint8Array(this.#held)
    let at = 0
    for (const c of this.#chunks) {
      bytes.set(c, at)
      at += c.length
    }
    const text = new TextDecoder().decode(bytes)
    if (this.total <= WHOLE_BODY_BYTES) {
      try {
        return usageFromBody(this.#provider, JSON.parse(text))
      } catch {
        return null
      }
    }
    const member = lastTopLevelMember(text, 'usage')
    if (member === null) return null
    try {
      return usageFromBody(this.#provider, { usage: JSON.parse(member) })
    } catch {
      return null
    }
  }
}

function isSpace(c: string | undefined): boolean {
  return c === ' ' || c === '\t' || c === '\n' || c === '\r'
}

/**
 * The JSON text of the value of the last top-level member `key` of the object that `text`
 * ends with, where `text` may be only the end of that object (it may start anywhere, even
 * inside a string): read backwards from the closing brace, which is sound because a quote
 * preceded by an even number of backslashes always delimits a string. `null` when the
 * member is not in `text` or `text` does not end with an object.
 */
export function lastTopLevelMember(text: string, key: string): string | null {
  let i = text.length - 1
  while (i >= 0 && isSpace(text[i])) i--
  if (text[i] !== '}') return null
  let depth = 0
  // Where the value of the member left of the cursor ends (the `,` or `}` after it).
  let valueEnd = i
  for (; i >= 0; i--) {
    const c = text[i]
    if (c === '"') {
      let k = i - 1
      for (; k >= 0; k--) {
        if (text[k] !== '"') continue
        let slashes = 0
        while (k - 1 - slashes >= 0 && text[k - 1 - slashes] === '\\') slashes++
        if (slashes % 2 === 0) break
      }
      if (k < 0) return null
      if (depth === 1) {
        let j = i + 1
        while (j < text.length && isSpace(text[j])) j++
        if (text[j] === ':') {
          let name: unknown
          try {
            name = JSON.parse(text.slice(k, i + 1))
          } catch {
            return null
          }
          if (name === key) return text.slice(j + 1, valueEnd).trim()
        }
      }
      i = k
    } else if (c === '}' || c === ']') {
      depth++
      if (depth === 1) valueEnd = i
    } else if (c === '{' || c === '[') {
      depth--
      if (depth === 0) return null
    } else if (c === ',' && depth === 1) {
      valueEnd = i
    }
  }
  return null
}

/** The provider's error type for an HTTP status (both providers use these names). */
export function errorTypeFor(status: number): string {
  switch (status) {
    case 400:
      return 'invalid_request_error'
    case 401:
      return 'authentication_error'
    case 403:
      return 'permission_error'
    case 404:
      return 'not_found_error'
    case 413:
      return 'request_too_large'
    case 426:
      return 'invalid_request_error'
    case 429:
      return 'rate_limit_error'
    case 504:
      return 'timeout_error'
    case 529:
      return 'overloaded_error'
    default:
      return 'api_error'
  }
}

/**
 * An error body in the provider's own format, which its official SDKs parse and show
 * (Anthropic `{"type":"error","error":{"type","message"}}`, OpenAI
 * `{"error":{"message","type","code"}}`), with tokenwarden's own fields under `tokenwarden`.
 */
export function providerErrorBody(provider: Provider, status: number, message: string, tokenwarden: { error: string } & Record<string, unknown>): Record<string, unknown> {
  const type = errorTypeFor(status)
  return provider === 'anthropic' ? { type: 'error', error: { type, message }, tokenwarden } : { error: { message, type, code: tokenwarden.error }, tokenwarden }
}
