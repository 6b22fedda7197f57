/**
 * What the `fetch` wrapper still knows about each provider's API itself: each provider's
 * error format. Where the model and `max_tokens` are in a request is the provider crate's
 * (`callShape`, through the engine package's estimators). Which requests are
 * model calls and how an answer reports its usage are the provider crate's
 * (`tokenwarden-provider`), asked through the engine (`engine.modelCall`,
 * `engine.usageReader`).
 */
import { estimators } from './estimator.js'
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

/**
 * Reads model, max tokens and stream flag from a request body (the provider crate's rule,
 * through the engine package's estimators): the output cap is Anthropic's `max_tokens`;
 * OpenAI's `max_output_tokens` (Responses), else `max_completion_tokens`, else `max_tokens`
 * (Chat Completions); 4,096 when none is a non-negative integer. The body is its JSON text,
 * or the parsed object.
 */
export function callShape(provider: Provider, body: Record<string, unknown> | string): CallShape {
  return JSON.parse(estimators().callShape(provider, typeof body === 'string' ? body : JSON.stringify(body))) as CallShape
}

/** The largest token count a usage figure is taken as (2^53 - 1, the engines' limit). */
export const MAX_COUNT = Number.MAX_SAFE_INTEGER

/** Every prompt token a usage counts (uncached, cache writes and cache reads). */
export function promptTokens(u: Usage): number {
  return Number(u.inputTokens ?? 0) + Number(u.cacheCreationInputTokens ?? 0) + Number(u.cacheReadInputTokens ?? 0)
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
