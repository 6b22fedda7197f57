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

import { checkFleets } from 'tokenwarden-wasm'

const NAME = /^[A-Za-z0-9_-]{1,64}$/
const encoder = new TextEncoder()

/**
 * The longest secret a caller may present, and a fleet may configure. A longer bearer is
 * refused (401) before any hashing: no work, and nothing remembered, is proportional to
 * what an unauthenticated caller sends.
 */
export const MAX_SECRET_CHARS = 512

/** An HTTP error with a status and a stable code, rendered as JSON by the router. */
export class HttpError extends Error {
  /** The request field at fault, when there is one (answered as `field`). */
  /** @type {string | undefined} */
  field
  /**
   * @param {number} status the HTTP status to answer
   * @param {string} code the error code (`invalid_argument`, `not_found`, …)
   * @param {string} message what was wrong, for people
   */
  constructor(status, code, message) {
    super(message)
    this.status = status
    this.code = code
  }
}

/** @type {{ text: string | undefined | null, fleets: Record<string, import('tokenwarden-wasm').FleetConfig> | null }} */
let cached = { text: null, fleets: null }

/**
 * Parses and checks the fleets configuration (once per distinct text); throws naming what is wrong.
 * @param {string | undefined} text
 * @returns {Record<string, import('tokenwarden-wasm').FleetConfig>}
 */
export function parseFleets(text) {
  if (text === cached.text && cached.fleets !== null) return cached.fleets
  const fleets = parseFleetsUncached(text)
  cached = { text, fleets }
  return fleets
}

/**
 * The gateway crate's strict reading (`checkFleets`, in the wasm build): an unknown key, a
 * secret short or only spaces, an upstream not https (or http to a loopback host), a
 * timeout out of range, a core configuration the core refuses: an error naming the place.
 */
function parseFleetsUncached(text) {
  if (typeof text !== 'string' || text.length === 0) throw new Error('TOKENWARDEN_FLEETS is not set')
  try {
    return checkFleets(text)
  } catch (e) {
    throw new Error(`TOKENWARDEN_FLEETS: ${e instanceof Error ? e.message : String(e)}`)
  }
}

/**
 * SHA-256 digests of the configured secrets (the expected side of a comparison): keyed by
 * configuration only, so bounded by it. A presented secret is hashed and forgotten.
 */
const digests = new Map()

async function sha256(text) {
  return new Uint8Array(await crypto.subtle.digest('SHA-256', encoder.encode(text)))
}

async function configuredDigest(secret) {
  let d = digests.get(secret)
  if (d === undefined) {
    d = await sha256(secret)
    digests.set(secret, d)
  }
  return d
}

/**
 * What a secret for an unknown fleet, or an admin secret a fleet does not have, is
 * compared with: random per isolate, never equal to a presented secret's digest, so the
 * comparison takes the same time and remembers nothing about the caller.
 */
/** @type {Uint8Array | null} */
let nobody = null

/**
 * Compares a presented secret with a configured one (`null`: none configured) in constant
 * time, over their SHA-256 digests.
 */
export async function sameSecret(given, expected) {
  // (Random values may be drawn only inside a handler, not when the module loads.)
  nobody ??= crypto.getRandomValues(new Uint8Array(32))
  const [a, b] = await Promise.all([sha256(given), expected === null ? nobody : configuredDigest(expected)])
  let diff = expected === null ? 1 : 0
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i]
  return diff === 0
}

/** 401 for a presented secret longer than any the configuration can hold. */
function bounded(secret) {
  if (secret !== null && secret.length > MAX_SECRET_CHARS) {
    throw new HttpError(401, 'unauthorized', `the presented secret is longer than ${MAX_SECRET_CHARS} characters: no fleet secret or credential is`)
  }
  return secret
}

/**
 * The caller's secret: `x-tokenwarden-token`, or `Authorization: Bearer …` — except in proxy
 * mode, where `Authorization` belongs to the provider (OpenAI's key, Anthropic's OAuth
 * tokens) and the fleet secret comes only in `x-tokenwarden-token`.
 */
export function presentedSecret(request, { proxy = false } = {}) {
  const token = request.headers.get('x-tokenwarden-token')
  if (token) return bounded(token)
  if (proxy) return null
  return bearer(request)
}

/** The `Authorization: Bearer` value, bounded (401 past MAX_SECRET_CHARS), or null. */
function bearer(request) {
  const auth = request.headers.get('authorization') ?? ''
  if (auth.length > MAX_SECRET_CHARS + 16) bounded(auth)
  const m = /^Bearer\s+(.+)$/i.exec(auth)
  return m ? bounded(m[1].trim()) : null
}

/**
 * Authenticates a request for `fleet`: 401 without a secret or with a wrong one (the same
 * answer for an unknown fleet, so fleet names cannot be probed). The secret is the fleet's
 * own, or an agent credential derived from it (`agentCredential`): `{ fleet, agent }`,
 * `agent` the credential's agent name, or null for the fleet secret.
 */
export async function authenticate(fleets, fleet, request, { proxy = false, credential = null } = {}) {
  const secret = credential ?? presentedSecret(request, { proxy })
  const f0 = Object.hasOwn(fleets, fleet) ? fleets[fleet] : null
  // A fleet served on loopback for tools that can set only a base URL may take proxied
  // calls with no secret (`proxy_open: true`); everything else still needs it.
  if (proxy && secret === null && f0?.proxy_open === true) return { fleet: f0, agent: null, open: true }
  if (secret !== null && isCredential(secret)) return { fleet: f0, agent: await credentialAgent(f0, fleet, secret), open: false }
  if (proxy && secret === null && f0?.proxy_open === 'credential') {
    throw new HttpError(
      401,
      'unauthorized',
      'this fleet takes proxied calls without the fleet secret only from an agent credential: put it in place of the agent name (/agents/<credential>/<role>/…) or send it in x-tokenwarden-token',
    )
  }
  return { fleet: await authenticateFleet(f0, secret, proxy), agent: null, open: false }
}

/** Whether a presented secret is shaped as an agent credential. */
export function isCredential(secret) {
  return typeof secret === 'string' && secret.startsWith(`${CREDENTIAL}.`)
}

/**
 * The agent a credential names, once its MAC checks out for `fleet` (401 otherwise). An
 * unknown fleet is checked against a key of no fleet's, so the answer and its cost are the
 * same and nothing is remembered for it.
 */
async function credentialAgent(f0, fleet, secret) {
  const parts = secret.split('.')
  const agent = parts.length === 4 && parts[1] === fleet && NAME.test(parts[2]) ? parts[2] : null
  const expected = await credentialMac(f0?.secret ?? null, `${CREDENTIAL}.${fleet}.${agent ?? ''}`)
  let diff = (agent === null || f0 === null ? 1 : 0) | (expected.length ^ (parts[3] ?? '').length)
  for (let i = 0; i < expected.length; i++) diff |= expected.charCodeAt(i) ^ ((parts[3] ?? '').charCodeAt(i) | 0)
  if (diff !== 0) throw new HttpError(401, 'unauthorized', 'wrong agent credential for this fleet')
  return agent
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
  const ok = await sameSecret(secret, f0?.secret ?? null)
  if (!ok || f0 === null) throw new HttpError(401, 'unauthorized', 'wrong bearer secret for this fleet')
  return f0
}

/** The agent credentials' prefix and version. */
const CREDENTIAL = 'twa1'
/** HMAC keys by fleet secret (configured secrets only: bounded by the configuration). */
const credentialKeys = new Map()
/** The key a credential for an unknown fleet is checked with: random, no fleet's. */
/** @type {CryptoKey | null} */
let nobodyKey = null

async function credentialMac(secret, message) {
  let key = secret === null ? nobodyKey : credentialKeys.get(secret)
  if (key === undefined || key === null) {
    const raw = secret === null ? crypto.getRandomValues(new Uint8Array(32)) : encoder.encode(`tokenwarden agent credentials\u0000${secret}`)
    key = await crypto.subtle.importKey('raw', raw, { name: 'HMAC', hash: 'SHA-256' }, false, ['sign'])
    if (secret === null) nobodyKey = key
    else credentialKeys.set(secret, key)
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
  const given = bearer(request) ?? ''
  const f = Object.hasOwn(fleets, fleet) ? fleets[fleet] : null
  const expected = typeof f?.admin_secret === 'string' ? f.admin_secret : null
  const ok = await sameSecret(given, expected)
  if (!ok || expected === null) throw new HttpError(401, 'unauthorized', "admin routes need the fleet's admin secret: Authorization: Bearer <admin_secret>")
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

/**
 * A lease handle: `tw2.<fleet>.<quota>.<lease id>.<epoch>.<mac>`, unforgeable without the
 * secret. The epoch names the quota's state since its last reset (the Durable Object draws a
 * new one at every reset), so a handle never names a lease of another epoch even when the
 * core, starting afresh, hands out the same id again.
 */
export async function signHandle(secret, fleet, quota, lease, epoch) {
  if (!EPOCH.test(epoch)) throw new Error(`a lease epoch must match ${EPOCH}`)
  const body = `tw2.${fleet}.${quota}.${lease}.${epoch}`
  return `${body}.${await mac(secret, body)}`
}

const EPOCH = /^[0-9a-z]{1,24}$/

/**
 * Checks a handle presented for (`fleet`, `quota`): 403 when it names another fleet or
 * quota (it is not yours), 404 when it is malformed or its MAC is wrong (no such lease).
 * Answers `{ id, epoch }`; a handle of the first format (`tw1.<fleet>.<quota>.<id>.<mac>`,
 * issued before epochs) is of epoch `0`, the epoch of a state stored before them.
 */
export async function openHandle(secret, fleet, quota, handle) {
  const parts = typeof handle === 'string' && handle.length <= 256 ? handle.split('.') : []
  const v1 = parts.length === 5 && parts[0] === 'tw1'
  const v2 = parts.length === 6 && parts[0] === 'tw2' && EPOCH.test(parts[4])
  if (!(v1 || v2) || !/^\d{1,16}$/.test(parts[3])) {
    throw new HttpError(404, 'unknown_lease', 'no such lease')
  }
  if (parts[1] !== fleet || parts[2] !== quota) {
    throw new HttpError(403, 'forbidden', 'this lease belongs to another fleet or quota')
  }
  const given = parts[parts.length - 1]
  const expected = await mac(secret, parts.slice(0, -1).join('.'))
  let diff = expected.length ^ given.length
  for (let i = 0; i < expected.length; i++) diff |= expected.charCodeAt(i) ^ (given.charCodeAt(i) | 0)
  if (diff !== 0) throw new HttpError(404, 'unknown_lease', 'no such lease')
  return { id: Number(parts[3]), epoch: v1 ? '0' : parts[4] }
}

/** Checks a fleet or quota name from a URL. */
export function checkName(kind, name) {
  if (!NAME.test(name)) throw new HttpError(404, 'not_found', `no such ${kind}`)
  return name
}
