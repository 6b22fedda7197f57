/**
 * Each provider's API as the hosts see it, every rule the provider crate's: the error
 * format, and where the model and `max_tokens` are in a request
 * (`callShape`, through the engine package's provider rules). Which requests are
 * model calls and how an answer reports its usage are the provider crate's
 * (`tokenwarden-provider`), asked through the engine (`engine.modelCall`,
 * `engine.exchange`, which also decides the lease's renewal and end).
 */
import { providerRules } from './rules.js'
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
 * through the engine package's provider rules): the output cap is Anthropic's `max_tokens`;
 * OpenAI's `max_output_tokens` (Responses), else `max_completion_tokens`, else `max_tokens`
 * (Chat Completions); 4,096 when none is a non-negative integer. The body is its JSON text,
 * or the parsed object.
 */
export function callShape(provider: Provider, body: Record<string, unknown> | string): CallShape {
  return JSON.parse(providerRules().callShape(provider, typeof body === 'string' ? body : JSON.stringify(body))) as CallShape
}

/** Why tokenwarden answers a model call itself (the provider crate's `Stop`). */
export type Stop = 'refused' | 'gave_up' | 'unknown_pool' | 'closed' | 'restarting' | 'unreachable' | 'timed_out'

/**
 * How tokenwarden answers a model call it stops, in `provider`'s format (the provider
 * crate's rule): the status, `retry-after` for a refusal that waiting cures, the
 * `x-should-retry` the official SDKs obey (left out for the provider's own failures), and
 * the error body with tokenwarden's `fields` under `tokenwarden`.
 */
export function stopAnswer(
  provider: Provider,
  stop: Stop,
  retryAfterMs: number | null,
  message: string,
  fields: { error: string } & Record<string, unknown>,
): { status: number; headers: Record<string, string>; body: Record<string, unknown> } {
  const { status, headers } = stopStatus(stop, retryAfterMs)
  return { status, headers, body: providerErrorBody(provider, status, message, fields) }
}

/** {@link stopAnswer}'s status and headers alone (`retry-after`, `x-should-retry`). */
export function stopStatus(stop: Stop, retryAfterMs: number | null): { status: number; headers: Record<string, string> } {
  const [status, retryAfter, shouldRetry] = providerRules().stopAnswer(stop, retryAfterMs) as [number, number, number]
  const headers: Record<string, string> = {}
  if (retryAfter >= 0) headers['retry-after'] = String(retryAfter)
  if (shouldRetry >= 0) headers['x-should-retry'] = shouldRetry === 1 ? 'true' : 'false'
  return { status, headers }
}

/** Every prompt token a usage counts (uncached, cache writes and cache reads). */
export function promptTokens(u: Usage): number {
  return Number(u.inputTokens ?? 0) + Number(u.cacheCreationInputTokens ?? 0) + Number(u.cacheReadInputTokens ?? 0)
}

/** The provider's error type for an HTTP status (the provider crate's rule). */
export function errorTypeFor(status: number): string {
  return (JSON.parse(providerRules().errorAnswer('anthropic', status, null, '', '{}', false)) as { error: { type: string } }).error.type
}

/**
 * An error body in the provider's own format, which its official SDKs parse and show
 * (Anthropic `{"type":"error","error":{"type","message"}}`, OpenAI
 * `{"error":{"message","type","code"}}`), with tokenwarden's own fields under `tokenwarden`:
 * the provider crate's rule. `type` is the status's unless given.
 */
export function providerErrorBody(provider: Provider, status: number, message: string, tokenwarden: { error: string } & Record<string, unknown>, type?: string): Record<string, unknown> {
  return JSON.parse(providerRules().errorAnswer(provider, status, type ?? null, message, JSON.stringify(tokenwarden), false)) as Record<string, unknown>
}

/** One error event in the provider's stream format (a call that fails after its stream began). */
export function providerErrorEvent(provider: Provider, status: number, message: string, tokenwarden: { error: string } & Record<string, unknown>, type?: string): string {
  return providerRules().errorAnswer(provider, status, type ?? null, message, JSON.stringify(tokenwarden), true)
}
