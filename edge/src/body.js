// Request bodies, read with a bound: a client cannot make the limiter buffer or parse more
// than the configured size (413 beyond it), and provider requests in proxy mode have a
// bound of their own (prompts can be large).
import { HttpError } from './auth.js'

/** API bodies (leases, settles, reports): 64 KiB unless `TOKENWARDEN_MAX_BODY_BYTES` says. */
export const DEFAULT_MAX_BODY_BYTES = 64 * 1024
/** Proxied provider requests: 32 MiB (Anthropic's own request limit) unless `TOKENWARDEN_MAX_PROXY_BODY_BYTES` says. */
export const DEFAULT_MAX_PROXY_BODY_BYTES = 32 * 1024 * 1024

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
    const { done, value } = await reader.read()
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

function tooLarge(max) {
  return new HttpError(413, 'body_too_large', `the request body is larger than ${max} bytes`)
}
