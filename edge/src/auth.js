// Fleets, their bearer secrets, and unforgeable lease handles.
//
// A fleet is a tenant with its own secret; each fleet has named quotas (one per provider
// API key), each owned by its own Durable Object. The configuration is one JSON secret
// (`TOKENWARDEN_FLEETS`):
//
//   { "fleet-a": { "secret": "…", "quotas": { "anthropic-main": { "config": {…core config…},
//                                                                  "upstream": "https://api.anthropic.com" } } } }
//
// API keys are not part of it: in proxy mode the agent's own key passes through to the
// upstream and is never stored or logged.

const NAME = /^[A-Za-z0-9_-]{1,64}$/
const encoder = new TextEncoder()

/** An HTTP error with a status and a stable code, rendered as JSON by the router. */
export class HttpError extends Error {
  constructor(status, code, message) {
    super(message)
    this.status = status
    this.code = code
  }
}

let cached = { text: null, fleets: null }

/** Parses and checks the fleets configuration (once per distinct text); throws naming what is wrong. */
export function parseFleets(text) {
  if (text === cached.text) return cached.fleets
  const fleets = parseFleetsUncached(text)
  cached = { text, fleets }
  return fleets
}

function parseFleetsUncached(text) {
  if (typeof text !== 'string' || text.length === 0) throw new Error('TOKENWARDEN_FLEETS is not set')
  let fleets
  try {
    fleets = JSON.parse(text)
  } catch (e) {
    throw new Error(`TOKENWARDEN_FLEETS is not JSON: ${e.message}`)
  }
  if (fleets === null || typeof fleets !== 'object' || Array.isArray(fleets)) throw new Error('TOKENWARDEN_FLEETS must be an object of fleets')
  for (const [name, fleet] of Object.entries(fleets)) {
    if (!NAME.test(name)) throw new Error(`fleet name ${JSON.stringify(name)} must match ${NAME}`)
    if (typeof fleet?.secret !== 'string' || fleet.secret.length < 16) throw new Error(`fleets.${name}.secret must be a string of at least 16 characters`)
    if (fleet.admin_secret !== undefined && (typeof fleet.admin_secret !== 'string' || fleet.admin_secret.length < 16 || fleet.admin_secret === fleet.secret)) {
      throw new Error(`fleets.${name}.admin_secret must be a string of at least 16 characters, other than the fleet's secret`)
    }
    if (fleet.proxy_open !== undefined && typeof fleet.proxy_open !== 'boolean') throw new Error(`fleets.${name}.proxy_open must be true or false`)
    if (fleet.quotas === null || typeof fleet.quotas !== 'object') throw new Error(`fleets.${name}.quotas must be an object`)
    for (const [q, quota] of Object.entries(fleet.quotas)) {
      if (!NAME.test(q)) throw new Error(`quota name ${JSON.stringify(q)} in fleet ${name} must match ${NAME}`)
      if (quota?.config === null || typeof quota?.config !== 'object') throw new Error(`fleets.${name}.quotas.${q}.config must be the core configuration object`)
      if (quota.upstream !== undefined) {
        let u
        try {
          u = new URL(quota.upstream)
        } catch {
          throw new Error(`fleets.${name}.quotas.${q}.upstream is not a URL`)
        }
        if (u.protocol !== 'https:' && u.hostname !== '127.0.0.1' && u.hostname !== 'localhost') {
          throw new Error(`fleets.${name}.quotas.${q}.upstream must be https (or loopback for tests)`)
        }
      }
    }
  }
  return fleets
}

const digests = new Map()

async function sha256(text, cache = false) {
  if (cache && digests.has(text)) return digests.get(text)
  const d = new Uint8Array(await crypto.subtle.digest('SHA-256', encoder.encode(text)))
  if (cache) digests.set(text, d)
  return d
}

/** Compares two secrets in constant time (over their SHA-256 digests). */
export async function sameSecret(given, expected) {
  const [a, b] = await Promise.all([sha256(given), sha256(expected, true)])
  let diff = 0
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i]
  return diff === 0
}

/**
 * The caller's secret: `x-tokenwarden-token`, or `Authorization: Bearer …` — except in proxy
 * mode, where `Authorization` belongs to the provider (OpenAI's key, Anthropic's OAuth
 * tokens) and the fleet secret comes only in `x-tokenwarden-token`.
 */
export function presentedSecret(request, { proxy = false } = {}) {
  const token = request.headers.get('x-tokenwarden-token')
  if (token) return token
  if (proxy) return null
  const auth = request.headers.get('authorization') ?? ''
  const m = /^Bearer\s+(.+)$/i.exec(auth)
  return m ? m[1].trim() : null
}

/**
 * Authenticates a request for `fleet`: 401 without a secret or with a wrong one (the same
 * answer for an unknown fleet, so fleet names cannot be probed). The secret is the fleet's
 * own, or an agent credential derived from it (`agentCredential`): `{ fleet, agent }`,
 * `agent` the credential's agent name, or null for the fleet secret.
 */
export async function authenticate(fleets, fleet, request, { proxy = false } = {}) {
  const secret = presentedSecret(request, { proxy })
  const f0 = Object.hasOwn(fleets, fleet) ? fleets[fleet] : null
  // A fleet served on loopback for tools that can set only a base URL may take proxied
  // calls with no secret (`proxy_open`); everything else still needs it.
  if (proxy && secret === null && f0?.proxy_open === true) return { fleet: f0, agent: null }
  if (secret !== null && secret.startsWith(`${CREDENTIAL}.`)) {
    const parts = secret.split('.')
    const agent = parts.length === 4 && parts[1] === fleet && NAME.test(parts[2]) ? parts[2] : null
    const expected = await credentialMac(f0?.secret ?? `no fleet ${fleet}`, `${CREDENTIAL}.${fleet}.${agent ?? ''}`)
    let diff = (agent === null || f0 === null ? 1 : 0) | (expected.length ^ (parts[3] ?? '').length)
    for (let i = 0; i < expected.length; i++) diff |= expected.charCodeAt(i) ^ ((parts[3] ?? '').charCodeAt(i) | 0)
    if (diff !== 0) throw new HttpError(401, 'unauthorized', 'wrong agent credential for this fleet')
    return { fleet: f0, agent }
  }
  return { fleet: await authenticateFleet(f0, secret, proxy), agent: null }
}

async function authenticateFleet(f0, secret, proxy) {
  if (secret === null) {
    throw new HttpError(
      401,
      'unauthorized',
      proxy
        ? 'missing fleet secret: in proxy mode send it in x-tokenwarden-token (Authorization carries the provider key and is forwarded)'
        : 'missing bearer secret: send Authorization: Bearer <fleet secret>',
    )
  }
  const ok = await sameSecret(secret, f0?.secret ?? `no fleet ${secret}x`)
  if (!ok || f0 === null) throw new HttpError(401, 'unauthorized', 'wrong bearer secret for this fleet')
  return f0
}

/** The agent credentials' prefix and version. */
const CREDENTIAL = 'twa1'
const credentialKeys = new Map()

async function credentialMac(secret, message) {
  let key = credentialKeys.get(secret)
  if (key === undefined) {
    key = await crypto.subtle.importKey('raw', encoder.encode(`tokenwarden agent credentials\u0000${secret}`), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign'])
    credentialKeys.set(secret, key)
  }
  return b64url(new Uint8Array(await crypto.subtle.sign('HMAC', key, encoder.encode(message))))
}

/**
 * An agent credential: `twa1.<fleet>.<agent>.<HMAC>`, derived from the fleet secret (so
 * nothing is stored, and changing the fleet secret revokes them all). Presented instead of
 * the fleet secret, it leases only for that agent and ends only that agent's leases.
 */
export async function agentCredential(secret, fleet, agent) {
  if (!NAME.test(agent)) throw new HttpError(400, 'invalid_argument', `an agent name for a credential must match ${NAME}`)
  const body = `${CREDENTIAL}.${fleet}.${agent}`
  return `${body}.${await credentialMac(secret, body)}`
}

/**
 * Authenticates an operator for `fleet`'s admin routes: its `admin_secret` as
 * `Authorization: Bearer …`. 401 for anything else — the fleet's own secret included — and
 * for a fleet with no admin secret configured.
 */
export async function authenticateAdmin(fleets, fleet, request) {
  const m = /^Bearer\s+(.+)$/i.exec(request.headers.get('authorization') ?? '')
  const given = m ? m[1].trim() : ''
  const f = Object.hasOwn(fleets, fleet) ? fleets[fleet] : null
  const expected = typeof f?.admin_secret === 'string' ? f.admin_secret : null
  const ok = await sameSecret(given, expected ?? `no admin secret for ${fleet} ${given}x`)
  if (!ok || expected === null) throw new HttpError(401, 'unauthorized', 'admin routes need the fleet\'s admin secret: Authorization: Bearer <admin_secret>')
  return f
}

function b64url(bytes) {
  let s = ''
  for (const b of bytes) s += String.fromCharCode(b)
  return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')
}

const keys = new Map()

async function mac(secret, message) {
  let key = keys.get(secret)
  if (key === undefined) {
    key = await crypto.subtle.importKey('raw', encoder.encode(`tokenwarden lease handles\u0000${secret}`), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign'])
    keys.set(secret, key)
  }
  return b64url(new Uint8Array(await crypto.subtle.sign('HMAC', key, encoder.encode(message)))).slice(0, 27)
}

/** A lease handle: `tw1.<fleet>.<quota>.<lease id>.<mac>`, unforgeable without the secret. */
export async function signHandle(secret, fleet, quota, lease) {
  const body = `tw1.${fleet}.${quota}.${lease}`
  return `${body}.${await mac(secret, body)}`
}

/**
 * Checks a handle presented for (`fleet`, `quota`): 403 when it names another fleet or
 * quota (it is not yours), 404 when it is malformed or its MAC is wrong (no such lease).
 */
export async function openHandle(secret, fleet, quota, handle) {
  const parts = typeof handle === 'string' ? handle.split('.') : []
  if (parts.length !== 5 || parts[0] !== 'tw1' || !/^\d{1,16}$/.test(parts[3])) {
    throw new HttpError(404, 'unknown_lease', 'no such lease')
  }
  if (parts[1] !== fleet || parts[2] !== quota) {
    throw new HttpError(403, 'forbidden', 'this lease belongs to another fleet or quota')
  }
  const expected = await mac(secret, parts.slice(0, 4).join('.'))
  let diff = expected.length ^ parts[4].length
  for (let i = 0; i < expected.length; i++) diff |= expected.charCodeAt(i) ^ (parts[4].charCodeAt(i) | 0)
  if (diff !== 0) throw new HttpError(404, 'unknown_lease', 'no such lease')
  return Number(parts[3])
}

/** Checks a fleet or quota name from a URL. */
export function checkName(kind, name) {
  if (!NAME.test(name)) throw new HttpError(404, 'not_found', `no such ${kind}`)
  return name
}
