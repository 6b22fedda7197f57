// The edge limiter's Worker: authenticates callers, turns lease handles into ids (and back),
// and routes each request to the Durable Object that owns the quota — one object per
// (fleet, quota), never one global object. See ../API.md for the HTTP API.
import { HttpError, agentCredential, authenticate, authenticateAdmin, checkName, isCredential, openHandle, parseFleets, signHandle } from './auth.js'
import { DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROXY_BODY_BYTES, drain, jsonObject, limitFrom, readText } from './body.js'
import { dashboardCsp, dashboardHtml } from './dashboard.js'
import { PROMETHEUS_CONTENT_TYPE, prometheusText } from './prometheus.js'
import { QuotaObject, errorResponse, json } from './quota.js'
import { proxiedProvider } from 'tokenwarden-wasm'

export { QuotaObject }

const ROUTE = /^\/v1\/fleets\/([^/]+)\/quotas\/([^/]+)(\/.*)?$/
const CREDENTIAL_ROUTE = /^\/v1\/fleets\/([^/]+)\/agents\/([^/]+)\/credential$/

/**
 * Forwards an internal request to the quota's Durable Object. The `x-tw-*` headers are set
 * here only (a client's own are dropped): the fleet, the quota and, for an agent
 * credential, the one agent the caller may act for.
 * @param {any} env the Worker's bindings
 * @param {string} fleet
 * @param {string} quota
 * @param {string} path the object's route
 * @param {RequestInit} [init]
 * @param {{ agent?: string | null, client?: string | null, epoch?: string | null }} [who] the
 *   agent a credential names, the remote driver's client id, a handle's epoch
 */
async function toObject(env, fleet, quota, path, init = {}, { agent = null, client = null, epoch = null } = {}) {
  const id = env.QUOTAS.idFromName(`${fleet}/${quota}`)
  const headers = new Headers(init.headers)
  for (const name of [...headers.keys()]) if (name.startsWith('x-tw-')) headers.delete(name)
  headers.set('x-tw-fleet', fleet)
  headers.set('x-tw-quota', quota)
  if (agent !== null) headers.set('x-tw-agent', agent)
  if (client !== null) headers.set('x-tw-client', client)
  if (epoch !== null) headers.set('x-tw-epoch', epoch)
  // A redirect in the object's answer (a provider's 3xx in proxy mode) is the client's to see.
  return env.QUOTAS.get(id).fetch(`https://quota${path}`, { ...init, headers, redirect: 'manual' })
}

/**
 * Replaces the lease ids in an answer by their signed handles (the object says its epoch):
 * `lease`, and a wait's `ticket` (an output of `POST …/handle`).
 */
async function withHandle(res, secret, fleet, quota) {
  const body = await res.json()
  if (typeof body.epoch === 'string') {
    if (typeof body.lease === 'number') body.lease = await signHandle(secret, fleet, quota, body.lease, body.epoch)
    if (typeof body.wait?.ticket === 'number') body.wait.ticket = await signHandle(secret, fleet, quota, body.wait.ticket, body.epoch)
  }
  delete body.epoch
  return json(res.status, body)
}

/** A path segment, percent-decoded; a malformed escape is a 404, like any unknown name. */
function decoded(segment) {
  try {
    return decodeURIComponent(segment)
  } catch {
    throw new HttpError(404, 'not_found', 'no such route: malformed percent-encoding in the path')
  }
}

const ROLES = new Set(['planner', 'reviewer', 'worker', 'auto'])

/**
 * `/agents/a1/worker/task/fix/anthropic/v1/messages` → `/proxy/agent/a1/role/worker/task/fix/v1/messages`;
 * `/agents/a1/worker/openai/chat/completions` → `…/v1/chat/completions` (the OpenAI SDKs'
 * base URL usually ends in `/v1`, which may be left out here); `null` for any other path.
 * Segments stay percent-encoded; proxy mode decodes and checks them.
 */
function agentPath(rest) {
  const p = rest.split('/')
  if (p[1] !== 'agents' || p.length < 5) return null
  // An agent credential in place of the name: the call is that agent's, authenticated.
  const credential = isCredential(p[2]) ? p[2] : null
  if (credential !== null) p[2] = credential.split('.')[2] ?? ''
  const role = p[3]
  if (!ROLES.has(role)) throw new HttpError(404, 'not_found', `no such route: the role in /agents/<agent>/<role>/… must be planner, reviewer, worker or auto, got ${JSON.stringify(role)}`)
  let i = 4
  const extra = []
  while ((p[i] === 'task' || p[i] === 'unblocks') && i + 1 < p.length) {
    extra.push(p[i], p[i + 1])
    i += 2
  }
  const provider = p[i]
  let tail = `/${p.slice(i + 1).join('/')}`
  if (provider === 'openai' && !tail.startsWith('/v1/')) tail = `/v1${tail}`
  if (provider !== 'anthropic' && provider !== 'openai') {
    throw new HttpError(404, 'not_found', 'no such route: /agents/<agent>/<role>/[task/<t>/][unblocks/<n>/] must be followed by anthropic or openai')
  }
  return { path: ['/proxy/agent', p[2], 'role', role, ...extra].join('/') + tail, credential }
}

async function handle(request, env) {
  const url = new URL(request.url)
  if (url.pathname === '/' || url.pathname === '/healthz') return json(200, { ok: true, service: 'tokenwarden edge limiter' })
  const c = CREDENTIAL_ROUTE.exec(url.pathname)
  if (c !== null && request.method === 'POST') {
    // Minting needs the fleet secret itself: an agent credential cannot mint another.
    const fleet = checkName('fleet', decoded(c[1]))
    const agent = decoded(c[2])
    const auth = await authenticate(parseFleets(env.TOKENWARDEN_FLEETS), fleet, request)
    if (auth.agent !== null) throw new HttpError(403, 'forbidden', 'an agent credential cannot mint credentials: use the fleet secret')
    return json(200, { agent, credential: await agentCredential(auth.fleet.secret, fleet, agent) })
  }
  const m = ROUTE.exec(url.pathname)
  if (m === null) throw new HttpError(404, 'not_found', 'no such route; see API.md')
  const fleet = checkName('fleet', decoded(m[1]))
  const quota = checkName('quota', decoded(m[2]))
  let rest = m[3] ?? '/'
  const base = `/v1/fleets/${fleet}/quotas/${quota}`

  // The dashboard page carries no data and needs no secret: it asks for it and then
  // fetches the metrics with it.
  if (request.method === 'GET' && rest === '/dashboard') {
    return new Response(dashboardHtml({ fleet, quota, metricsPath: `${base}/metrics`, timelinePath: `${base}/timeline` }), {
      headers: { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store', 'x-frame-options': 'DENY', 'content-security-policy': dashboardCsp() },
    })
  }

  // The base-URL form for tools that can set nothing else:
  // `/agents/<agent>/<role>[/task/<t>][/unblocks/<n>]/<anthropic|openai>/…` is proxy mode
  // with the agent, role and task in the path.
  const viaAgentPath = agentPath(rest)
  if (viaAgentPath !== null) rest = viaAgentPath.path
  const parts = rest.split('/').filter(Boolean)
  const proxy = parts[0] === 'proxy' && request.method !== 'OPTIONS' && request.method !== 'HEAD'
  const fleets = parseFleets(env.TOKENWARDEN_FLEETS)
  if (parts[0] === 'admin') {
    const f = await authenticateAdmin(fleets, fleet, request)
    if (!Object.hasOwn(f.quotas, quota)) throw new HttpError(404, 'not_found', 'no such quota in this fleet')
    if (request.method === 'POST' && rest === '/admin/reset') return toObject(env, fleet, quota, '/reset', { method: 'POST' })
    // The core's hold: no grants from a pool for a while.
    if (request.method === 'POST' && rest === '/admin/hold') {
      return toObject(env, fleet, quota, '/hold', { method: 'POST', headers: { 'content-type': 'application/json' }, body: await readText(request, DEFAULT_MAX_BODY_BYTES) })
    }
    // Tests only: the object's clock, moved by hand (quota.js, ObjectClock).
    if (request.method === 'POST' && rest === '/admin/clock' && env.TOKENWARDEN_TEST_CLOCK === '1') {
      return toObject(env, fleet, quota, '/clock', { method: 'POST', headers: { 'content-type': 'application/json' }, body: await readText(request, DEFAULT_MAX_BODY_BYTES) })
    }
    throw new HttpError(404, 'not_found', 'no such admin route; see API.md')
  }
  const credential = proxy && viaAgentPath?.credential !== null && request.headers.get('x-tokenwarden-token') === null ? (viaAgentPath?.credential ?? null) : null
  const { fleet: f, agent, open } = await authenticate(fleets, fleet, request, { proxy, credential })
  // A remote driver names its process, so the limiter can tell how many share the quota
  // (only an authenticated caller is counted: a secretless one cannot inflate the count).
  const named = open ? null : request.headers.get('x-tokenwarden-client')
  const client = named !== null && /^[A-Za-z0-9_-]{1,64}$/.test(named) ? named : null
  /** @type {(path: string, init?: RequestInit, epoch?: string | null) => Promise<Response>} */
  const object = (path, init = {}, epoch = null) => toObject(env, fleet, quota, path, init, { agent, client, epoch })
  if (!Object.hasOwn(f.quotas, quota)) throw new HttpError(404, 'not_found', 'no such quota in this fleet')
  const secret = f.secret
  const maxBody = limitFrom(env, 'TOKENWARDEN_MAX_BODY_BYTES', DEFAULT_MAX_BODY_BYTES)
  const text = () => readText(request, maxBody)

  // The core's host protocol: one input in, its output back, leases as handles both ways.
  if (request.method === 'POST' && rest === '/handle') {
    const input = jsonObject(await text())
    /** @type {string | null} */
    let epoch = null
    if (typeof input.lease === 'string') ({ id: input.lease, epoch } = await openHandle(secret, fleet, quota, input.lease))
    else if (input.lease !== undefined && input.lease !== null) {
      throw Object.assign(new HttpError(400, 'invalid_argument', '`lease` must be a lease handle an earlier answer gave (tw2.…), not a number'), { field: 'lease' })
    }
    const res = await object('/handle', { method: 'POST', body: JSON.stringify(input) }, epoch)
    return res.status === 200 ? withHandle(res, secret, fleet, quota) : res
  }
  if (request.method === 'POST' && rest === '/leases') {
    const res = await object('/lease', { method: 'POST', body: await text() })
    return withHandle(res, secret, fleet, quota)
  }
  if (parts[0] === 'leases' && parts.length >= 2) {
    const { id: lease, epoch } = await openHandle(secret, fleet, quota, parts[1])
    if (request.method === 'GET' && parts.length === 2) {
      const timeout = url.searchParams.get('wait') ?? '0'
      if (!/^\d{1,6}$/.test(timeout)) throw new HttpError(400, 'invalid_argument', '`wait` must be milliseconds (0 to 30000)')
      const res = await object(`/wait/${lease}?timeout=${timeout}`, {}, epoch)
      return withHandle(res, secret, fleet, quota)
    }
    if (request.method === 'DELETE' && parts.length === 2) {
      return object(`/cancel/${lease}`, { method: 'POST' }, epoch)
    }
    if (request.method === 'POST' && parts.length === 3 && ['settle', 'interrupted', 'renew'].includes(parts[2])) {
      return object(`/${parts[2]}/${lease}`, { method: 'POST', body: await text() }, epoch)
    }
  }
  // Tasks: open (or update), a failed attempt, the end.
  if (request.method === 'POST' && rest === '/tasks') {
    return object('/task', { method: 'POST', body: await text() })
  }
  if (request.method === 'POST' && parts[0] === 'tasks' && parts.length === 3 && (parts[2] === 'failed' || parts[2] === 'done')) {
    // The task's id or name, as the path gives it: the object's member table reads it.
    return object(`/task-${parts[2]}/${encodeURIComponent(decoded(parts[1]))}`, { method: 'POST', body: await text() })
  }
  if (request.method === 'POST' && rest === '/responses') {
    const body = jsonObject(await text())
    // A report is evidence about one call: it names that call's lease by its handle (the
    // object refuses one without; see API.md). Anything but a handle names no lease.
    /** @type {string | null} */
    let epoch = null
    if (typeof body.lease === 'string') ({ id: body.lease, epoch } = await openHandle(secret, fleet, quota, body.lease))
    else body.lease = null
    return object('/response', { method: 'POST', body: JSON.stringify(body) }, epoch)
  }
  if (request.method === 'GET' && rest === '/metrics') {
    const res = await object('/metrics')
    const wantsText = url.searchParams.get('format') === 'prometheus' || (request.headers.get('accept') ?? '').includes('text/plain')
    if (!wantsText || res.status !== 200) return res
    return new Response(prometheusText(await res.json(), { fleet, quota }), { headers: { 'content-type': PROMETHEUS_CONTENT_TYPE } })
  }
  // The recent call events (call starts, waits, refusals, 429s) for the dashboard's overlay.
  if (request.method === 'GET' && rest === '/timeline') return object('/timeline')
  if (proxy) {
    // A WebSocket (Codex asks for the Responses API over one before HTTP) is not proxied:
    // refused with 426, on which Codex falls back to HTTP streaming at once (after a 404 or
    // 403 it retries the upgrade five times with backoff first; see API.md).
    if ((request.headers.get('upgrade') ?? '').toLowerCase() === 'websocket') {
      throw new HttpError(426, 'websocket_not_supported', 'tokenwarden proxies HTTP only: send the call as an HTTP request (the Responses API streams over server-sent events with "stream": true)')
    }
    const max = limitFrom(env, 'TOKENWARDEN_MAX_PROXY_BODY_BYTES', DEFAULT_MAX_PROXY_BODY_BYTES)
    const declared = request.headers.get('content-length')
    if (declared !== null && Number(declared) > max) throw new HttpError(413, 'body_too_large', `the request body is larger than ${max} bytes`)
    return object(rest + url.search, { method: request.method, headers: request.headers, body: request.body, signal: request.signal })
  }
  throw new HttpError(404, 'not_found', 'no such route; see API.md')
}

/**
 * The provider a request speaks when it is a proxied call (its errors are answered in that
 * provider's format, which the SDKs show), else null.
 */
function providerOfRequest(request) {
  try {
    const url = new URL(request.url)
    const m = ROUTE.exec(url.pathname)
    if (m === null) return null
    let rest = m[3] ?? '/'
    const viaAgentPath = agentPath(rest)
    if (viaAgentPath !== null) rest = viaAgentPath.path
    if (!rest.startsWith('/proxy/')) return null
    return proxiedProvider(rest.slice('/proxy'.length), request.headers.has('anthropic-version'))
  } catch {
    return null
  }
}

export default {
  async fetch(request, env) {
    try {
      const res = await handle(request, env)
      // A route that takes no body (a reset, a mint, a DELETE) answers after reading any
      // sent anyway, so the connection stays usable.
      await drain(request)
      return res
    } catch (e) {
      // An answer given before the body was read: read it first (up to a bound), so the
      // connection stays usable for the client's next request.
      await drain(request)
      return errorResponse(e, providerOfRequest(request))
    }
  },
}
