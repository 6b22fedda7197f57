/**
 * What the `fetch` wrapper knows about each provider's API: which requests are model
 * calls, where the model and `max_tokens` are, and where usage comes back (a JSON body or
 * a server-sent-event stream).
 */
import type { Usage } from './types.js'

/** A provider API the wrapper understands. */
export type Provider = 'anthropic' | 'openai'

/** Which provider API a request URL is a model call of, or `null` (passed through). */
export function detectProvider(url: URL, method: string): Provider | null {
  if (method.toUpperCase() !== 'POST') return null
  const path = url.pathname.replace(/\/+$/, '')
  if (path.endsWith('/messages') && !path.endsWith('/count_tokens')) return 'anthropic'
  if (path.endsWith('/chat/completions')) return 'openai'
  return null
}

/** The fields of a request body the wrapper needs. */
export interface CallShape {
  model: string
  /** The output reservation. */
  maxTokens: number
  stream: boolean
}

/** Default output reservation when a request names none (OpenAI allows that). */
export const DEFAULT_MAX_TOKENS = 4096

/** Reads model, max tokens and stream flag from a parsed request body. */
export function callShape(provider: Provider, body: Record<string, unknown>): CallShape {
  const model = typeof body.model === 'string' ? body.model : ''
  const raw =
    provider === 'anthropic' ? body.max_tokens : (body.max_completion_tokens ?? body.max_tokens)
  const maxTokens =
    typeof raw === 'number' && Number.isSafeInteger(raw) && raw >= 0 ? raw : DEFAULT_MAX_TOKENS
  return { model, maxTokens, stream: body.stream === true }
}

function n(v: unknown): number {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? Math.floor(v) : 0
}

/** Usage from a complete (non-streamed) response body, or `null` when it has none. */
export function usageFromBody(provider: Provider, json: unknown): Usage | null {
  if (json === null || typeof json !== 'object') return null
  const u = (json as Record<string, unknown>).usage
  if (u === null || typeof u !== 'object') return null
  return provider === 'anthropic' ? anthropicUsage(u as Record<string, unknown>) : openaiUsage(u as Record<string, unknown>)
}

function anthropicUsage(u: Record<string, unknown>): Usage {
  return {
    inputTokens: n(u.input_tokens),
    cacheCreationInputTokens: n(u.cache_creation_input_tokens),
    cacheReadInputTokens: n(u.cache_read_input_tokens),
    outputTokens: n(u.output_tokens),
  }
}

/** OpenAI reports cached tokens inside `prompt_tokens`: the core wants them apart. */
function openaiUsage(u: Record<string, unknown>): Usage {
  const prompt = n(u.prompt_tokens)
  const details = u.prompt_tokens_details as Record<string, unknown> | null | undefined
  const cached = Math.min(prompt, n(details?.cached_tokens))
  return { inputTokens: prompt - cached, cacheReadInputTokens: cached, outputTokens: n(u.completion_tokens) }
}

/** Every prompt token a usage counts (uncached, cache writes and cache reads). */
export function promptTokens(u: Usage): number {
  return Number(u.inputTokens ?? 0) + Number(u.cacheCreationInputTokens ?? 0) + Number(u.cacheReadInputTokens ?? 0)
}

/**
 * Follows a server-sent-event stream as it passes through and collects usage:
 * Anthropic's `message_start` (input and cache counts) and `message_delta` (cumulative
 * output), OpenAI's final chunk with `usage` (sent with `stream_options.include_usage`).
 * It also counts the bytes of generated text, for a fallback when no usage arrives.
 */
export class SseUsage {
  readonly #provider: Provider
  readonly #decoder = new TextDecoder()
  #buffer = ''
  #event = ''
  #data: string[] = []
  /** Usage reported so far, or `null`. */
  usage: Usage | null = null
  /** Whether the stream said it finished (`message_stop` / `[DONE]`). */
  finished = false
  /** Bytes of generated text seen. */
  textBytes = 0

  constructor(provider: Provider) {
    this.#provider = provider
  }

  /** Feeds a chunk of the raw stream. */
  push(chunk: Uint8Array): void {
    this.#buffer += this.#decoder.decode(chunk, { stream: true })
    let start = 0
    for (;;) {
      const nl = this.#buffer.indexOf('\n', start)
      if (nl === -1) break
      let line = this.#buffer.slice(start, nl)
      if (line.endsWith('\r')) line = line.slice(0, -1)
      start = nl + 1
      this.#line(line)
    }
    this.#buffer = this.#buffer.slice(start)
  }

  /** Ends the stream (dispatches a last event without a trailing blank line). */
  end(): void {
    this.#buffer += this.#decoder.decode()
    if (this.#buffer.length > 0) this.#line(this.#buffer)
    this.#buffer = ''
    this.#line('')
  }

  #line(line: string): void {
    if (line === '') {
      if (this.#data.length > 0) this.#dispatch(this.#event, this.#data.join('\n'))
      this.#event = ''
      this.#data = []
      return
    }
    if (line.startsWith(':')) return
    const colon = line.indexOf(':')
    const name = colon === -1 ? line : line.slice(0, colon)
    let value = colon === -1 ? '' : line.slice(colon + 1)
    if (value.startsWith(' ')) value = value.slice(1)
    if (name === 'event') this.#event = value
    else if (name === 'data') this.#data.push(value)
  }

  #dispatch(event: string, data: string): void {
    if (data === '[DONE]') {
      this.finished = true
      return
    }
    let json: Record<string, unknown>
    try {
      json = JSON.parse(data) as Record<string, unknown>
    } catch {
      return
    }
    if (this.#provider === 'anthropic') this.#anthropic(event || String(json.type ?? ''), json)
    else this.#openai(json)
  }

  #anthropic(event: string, json: Record<string, unknown>): void {
    if (event === 'message_start') {
      const message = json.message as Record<string, unknown> | undefined
      const u = message?.usage
      if (u !== null && typeof u === 'object') this.usage = anthropicUsage(u as Record<string, unknown>)
    } else if (event === 'message_delta') {
      const u = json.usage as Record<string, unknown> | undefined
      if (u !== null && typeof u === 'object') {
        const base = this.usage ?? {}
        // Cumulative counts; newer API versions repeat the input counts here too.
        this.usage = {
          inputTokens: u.input_tokens !== undefined && u.input_tokens !== null ? n(u.input_tokens) : base.inputTokens ?? 0,
          cacheCreationInputTokens:
            u.cache_creation_input_tokens !== undefined && u.cache_creation_input_tokens !== null
              ? n(u.cache_creation_input_tokens)
              : base.cacheCreationInputTokens ?? 0,
          cacheReadInputTokens:
            u.cache_read_input_tokens !== undefined && u.cache_read_input_tokens !== null
              ? n(u.cache_read_input_tokens)
              : base.cacheReadInputTokens ?? 0,
          outputTokens: n(u.output_tokens),
        }
      }
    } else if (event === 'content_block_delta') {
      const delta = json.delta as Record<string, unknown> | undefined
      const text = delta?.text ?? delta?.partial_json ?? delta?.thinking
      if (typeof text === 'string') this.textBytes += text.length
    } else if (event === 'message_stop') {
      this.finished = true
    }
  }

  #openai(json: Record<string, unknown>): void {
    const u = json.usage
    if (u !== null && typeof u === 'object') this.usage = openaiUsage(u as Record<string, unknown>)
    const choices = json.choices
    if (Array.isArray(choices)) {
      for (const c of choices) {
        const content = (c as { delta?: { content?: unknown } } | null)?.delta?.content
        if (typeof content === 'string') this.textBytes += content.length
      }
    }
  }
}
