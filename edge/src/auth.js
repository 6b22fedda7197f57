// Fleets, their bearer secrets, and unforgeable lease handles: the gateway crate's rules
// (`tokenwarden_gateway::auth`, through the wasm build's `gatewayRule`).
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

import { gatewayRule, checkFleets } from 'tokenwarden-wasm'

/**
 * The longest secret a caller may present, and a fleet may configure (the gateway crate's
 * `auth::MAX_SECRET_CHARS`). A longer bearer is refused (401) before any hashing: no work,
 * and nothing remembered, is proportional to what an unauthenticated caller sends.
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
 * One of the gateway crate's rules without state (`gatewayRule`, in the wasm build: the
 * routes, who a request is): its answer, or the refusal thrown as an HttpError.
 */
export function rule(input) {
  const read = JSON.parse(gatewayRule(JSON.stringify(input)))
  if ('refused' in read) throw new HttpError(read.refused.status, read.refused.error, read.refused.message)
  return read
}

/** A fleet's secrets as the rules take them; null for a fleet of no such name. */
function secretsOf(fleets, fleet) {
  const f = Object.hasOwn(fleets, fleet) ? fleets[fleet] : null
  return f === null ? null : { secret: f.secret, adminSecret: f.admin_secret ?? null, proxyOpen: f.proxy_open ?? false }
}

/**
 * Authenticates a request for `fleet`: 401 without a secret or with a wrong one (the same
 * answer for an unknown fleet, so fleet names cannot be probed). The secret is the fleet's
 * own (`x-tokenwarden-token`, or `Authorization: Bearer …` outside proxy mode, where
 * `Authorization` is the provider's), or an agent credential derived from it
 * (`agentCredential`), or `credential` given in its place (the path's): `{ fleet, agent,
 * open }`, `agent` the credential's agent name, or null for the fleet secret; `open` for a
 * proxied call the fleet takes with no secret (`proxy_open: true`). The gateway crate's
 * rule: constant-time comparisons, nothing kept of what a caller presents, a secret longer
 * than MAX_SECRET_CHARS refused before it is hashed.
 */
export async function authenticate(fleets, fleet, request, { proxy = false, credential = null } = {}) {
  const r = rule({
    op: 'authenticate',
    fleet: secretsOf(fleets, fleet),
    name: fleet,
    token: request.headers.get('x-tokenwarden-token'),
    authorization: request.headers.get('authorization'),
    proxy,
    credential,
  })
  return { fleet: fleets[fleet], agent: r.agent, open: r.open }
}

/**
 * An agent credential: `twa1.<fleet>.<agent>.<HMAC>`, derived from the fleet secret (so
 * nothing is stored, and changing the fleet secret revokes them all). Presented instead of
 * the fleet secret, it leases only for that agent and ends only that agent's leases.
 */
export async function agentCredential(secret, fleet, agent) {
  return rule({ op: 'credential', secret, fleet, agent }).credential
}

/**
 * Authenticates an operator for `fleet`'s admin routes: its `admin_secret` as
 * `Authorization: Bearer …`. 401 for anything else — the fleet's own secret included — and
 * for a fleet with no admin secret configured.
 */
export async function authenticateAdmin(fleets, fleet, request) {
  rule({ op: 'admin', fleet: secretsOf(fleets, fleet), authorization: request.headers.get('authorization') })
  return fleets[fleet]
}

/**
 * A lease handle: `tw2.<fleet>.<quota>.<lease id>.<epoch>.<mac>`, unforgeable without the
 * secret. The epoch names the quota's state since its last reset (the Durable Object draws a
 * new one at every reset), so a handle never names a lease of another epoch even when the
 * core, starting afresh, hands out the same id again.
 */
export async function signHandle(secret, fleet, quota, lease, epoch) {
  const r = JSON.parse(gatewayRule(JSON.stringify({ op: 'sign', secret, fleet, quota, lease, epoch })))
  if ('refused' in r) throw new Error(r.refused.message)
  return r.handle
}

/**
 * Checks a handle presented for (`fleet`, `quota`): 403 when it names another fleet or
 * quota (it is not yours), 404 when it is malformed or its MAC is wrong (no such lease).
 * Answers `{ id, epoch }`; a handle of the first format (`tw1.<fleet>.<quota>.<id>.<mac>`,
 * issued before epochs) is of epoch `0`, the epoch of a state stored before them.
 */
export async function openHandle(secret, fleet, quota, handle) {
  if (typeof handle !== 'string') throw new HttpError(404, 'unknown_lease', 'no such lease')
  return rule({ op: 'open', secret, fleet, quota, handle })
}
