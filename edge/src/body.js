// Request bodies, read with a bound: a client cannot make the limiter buffer or parse more
// than the configured size (413 beyond it), and provider requests in proxy mode have a
// bound of their own (prompts can be large).
import { gatewayRule } from 'tokenwarden-wasm'
import { HttpError } from './auth.js'

/** The gateway crate's defaults: `body` and `proxyBody` bytes. */
const LIMITS = JSON.parse(gatewayRule('{"op":"limits"}'))
/** API bodies (leases, settles, reports): 64 KiB unless `TOKENWARDEN_MAX_BODY_BYTES` says. */
export const DEFAULT_MAX_BODY_BYTES = Number(LIMITS.body)
/** Proxied provider requests: 32 MiB (Anthropic's own request limit) unless `TOKENWARDEN_MAX_PROXY_BODY_BYTES` says. */
export const DEFAULT_MAX_PROXY_BODY_BYTES = Number(LIMITS.proxyBody)

/** The configured limit named `name` in `env`, or `fallback`; a bad value is an error naming it. */
export function limitFrom(env, name, fallback) {
  const v = env?.[name]
  if (v === undefined || v === null || v === '') return fallback
  const n = Number(v)
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`${name} must be a positive integer (bytes), got ${JSON.stringify(v)}`)
  return n
}

/** The body as text, refusing with 413 past `max` bytes (by `content-length`, then as it streams). */
export async function readText(request, max) {
  const declared = request.headers.get('content-length')
  if (declared !== null && Number(declared) > max) throw tooLarge(max)
  if (request.body === null) return ''
  const reader = request.body.getReader()
  const chunks = []
  let size = 0
  for (;;) {
    let next
    try {
      next = await reader.read()
    } catch (e) {
      // A body that breaks off or is malformed on the wire (a bad chunked encoding, a
      // client that went away): the client's mistake, not ours.
      throw new HttpError(400, 'invalid_body', `the request body could not be read: ${e?.message ?? e}`)
    }
    const { done, value } = next
    if (done) break
    size += value.byteLength
    if (size > max) {
      await reader.cancel().catch(() => {})
      throw tooLarge(max)
    }
    chunks.push(value)
  }
  const all = new Uint8Array(size)
  let at = 0
  for (const c of chunks) {
    all.set(c, at)
    at += c.byteLength
  }
  return new TextDecoder().decode(all)
}

/** What {@link drain} reads at most of a body nobody read before the answer. */
export const DRAIN_BYTES = 1024 * 1024

/**
 * Reads and discards what is left of a request's body, up to `max` bytes, so an answer
 * given without reading it (an error) leaves the kept-alive connection usable; a larger or
 * broken body is cancelled (the runtime then closes the connection after the answer).
 */
export async function drain(request, max = DRAIN_BYTES) {
  if (request.body === null || request.bodyUsed) return
  let reader
  try {
    reader = request.body.getReader()
  } catch {
    return
  }
  let size = 0
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) return
      size += value.byteLength
      if (size > max) break
    }
  } catch {
    // broken on the wire: nothing more to read
  }
  await reader.cancel().catch(() => {})
}

function tooLarge(max) {
  return new HttpError(413, 'body_too_large', `the request body is larger than ${max} bytes`)
}

/**
 * A JSON object request body. A number past what a double holds (`1e400`) is refused naming
 * its field, as the core's decoder refuses it: `JSON.parse` would read it as `Infinity`,
 * which the protocol's JSON text then carries as `null` (no limit, no value).
 * @param {string} raw
 * @returns {Record<string, any>}
 */
export function jsonObject(raw) {
  let body
  try {
    body = JSON.parse(raw, (key, value) => {
      if (typeof value === 'number' && !Number.isFinite(value)) {
        throw Object.assign(new HttpError(400, 'invalid_argument', `\`${key}\` is a number out of range`), { field: key })
      }
      return value
    })
  } catch (e) {
    if (e instanceof HttpError) throw e
    throw new HttpError(400, 'invalid_json', 'the request body is not JSON')
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw new HttpError(400, 'invalid_argument', 'the request body must be a JSON object')
  return body
}
