// Answers of the Worker and its Durable Object: JSON bodies, tokenwarden's errors, and the
// same errors in a provider's format for a proxied call (the official SDKs parse and show
// them). The statuses and retry headers of a stopped call are the provider crate's rule.
import { LeaseRejectedError, gatewayRule, providerErrorBody, stopStatus } from 'tokenwarden-wasm'
import { HttpError } from './auth.js'

/** JSON text with bigints (instants near u64::MAX only) written as numbers. */
export function toJson(value) {
  return JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? Number(v) : v))
}

/** `status` with `body` as JSON. */
export function json(status, body, headers = {}) {
  return new Response(toJson(body), { status, headers: { 'content-type': 'application/json', ...headers } })
}

/** A refusal of the gateway crate's member table, as the error the routes throw. */
export function refusal(r) {
  return Object.assign(new HttpError(r.status, r.error, r.message), r.field === undefined ? {} : { field: r.field })
}

/**
 * Errors as JSON: `{ error: code, message, field? }` with the right status. With a
 * `provider` (a proxied call), in that provider's own error format, which the official SDKs
 * parse and show (`{"type":"error","error":{"type":"rate_limit_error","message":…}}`,
 * `{"error":{"message":…,"type":…,"code":…}}`), tokenwarden's fields under `tokenwarden`; a
 * refusal a retry can cure also says `x-should-retry: true` beside its `retry-after`.
 * @param {unknown} e
 * @param {import('tokenwarden-wasm').Provider | null} provider
 */
export function errorResponse(e, provider = null) {
  const { status, body, headers } = statusOf(e)
  const { 'x-should-retry': retry, ...rest } = /** @type {Record<string, string>} */ (headers)
  if (provider === null) return json(status, body, rest)
  const wrapped = providerErrorBody(provider, status, `tokenwarden: ${body.message}`, body)
  return json(status, wrapped, { ...rest, 'x-should-retry': retry ?? 'false' })
}

/**
 * An error's status, tokenwarden body and headers. A refusal, a limiter that is shutting
 * down (a new one takes its place) and an upstream timeout are answered by the provider
 * crate's rule for a stopped call (status, `retry-after`, `x-should-retry`).
 */
export function statusOf(e) {
  if (e instanceof HttpError) return { status: e.status, body: { error: e.code, message: e.message, ...(e.field === undefined ? {} : { field: e.field }) }, headers: {} }
  if (e instanceof LeaseRejectedError) {
    const body = { error: 'rejected', reason: e.reason, retryAt: e.retryAt, retryAfterMs: e.retryAfterMs, message: e.message }
    return { body, ...stopStatus('refused', e.retryable ? e.retryAfterMs : null) }
  }
  const code = e?.code
  if (code === 'closed') return { body: { error: code, message: e.message }, ...stopStatus('restarting', null) }
  if (code === 'upstream_timeout') return { body: { error: code, message: e.message }, ...stopStatus('timed_out', null) }
  // An engine error's code: its status is the gateway crate's (400, 403, 404, 409, 499).
  const status = typeof code === 'string' ? JSON.parse(gatewayRule(toJson({ op: 'status', code }))).status : null
  if (status !== null) return { status, body: { error: code, message: e.message, ...(e.field === undefined ? {} : { field: e.field }) }, headers: {} }
  return { status: 500, body: { error: 'internal', message: 'internal error' }, headers: {} }
}
