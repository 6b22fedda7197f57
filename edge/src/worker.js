// The edge limiter's Worker: authenticates callers, turns lease handles into ids (and back),
// and routes each request to the Durable Object that owns the quota — one object per
// (fleet, quota), never one global object. See ../API.md for the HTTP API.
import { HttpError, agentCredential, authenticate, authenticateAdmin, openHandle, parseFleets, rule, signHandle } from './auth.js'
import { DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROXY_BODY_BYTES, drain, jsonObject, limitFrom, readText } from './body.js'
import { dashboardCsp, dashboardHtml } from './dashboard.js'
import { PROMETHEUS_CONTENT_TYPE, prometheusText } from './prometheus.js'
import { QuotaObject } from './quota.js'
import { errorResponse, json } from './reply.js'
import { proxiedProvider } from 'tokenwarden-wasm'

export { QuotaObject }

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

/**
 * The route of a request (the gateway crate's rule, `routes::route`): which of the HTTP
 * API's routes it is, or the refusal thrown (404 naming what is not there).
 */
function routeOf(request, url) {
  return rule({
    op: 'route',
    method: request.method,
    path: url.pathname,
    query: url.search,
    accept: request.headers.get('accept'),
    upgrade: request.headers.get('upgrade'),
  })
}

async function handle(request, env) {
  const url = new URL(request.url)
  const r = routeOf(request, url)
  if (r.route === 'health') return json(200, { ok: true, service: 'tokenwarden edge limiter' })
  if (r.route === 'credential') {
    // Minting needs the fleet secret itself: an agent credential cannot mint another.
    const auth = await authenticate(parseFleets(env.TOKENWARDEN_FLEETS), r.fleet, request)
    if (auth.agent !== null) throw new HttpError(403, 'forbidden', 'an agent credential cannot mint credentials: use the fleet secret')
    return json(200, { agent: r.agent, credential: await agentCredential(auth.fleet.secret, r.fleet, r.agent) })
  }
  const { fleet, quota, kind } = r
  const base = `/v1/fleets/${fleet}/quotas/${quota}`

  // The dashboard page carries no data and needs no secret: it asks for it and then
  // fetches the metrics with it.
  if (kind === 'dashboard') {
    return new Response(dashboardHtml({ fleet, quota, metricsPath: `${base}/metrics`, timelinePath: `${base}/timeline` }), {
      headers: { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store', 'x-frame-options': 'DENY', 'content-security-policy': dashboardCsp() },
    })
  }
  const fleets = parseFleets(env.TOKENWARDEN_FLEETS)
  if (kind === 'admin') {
    const f = await authenticateAdmin(fleets, fleet, request)
    if (!Object.hasOwn(f.quotas, quota)) throw new HttpError(404, 'not_found', 'no such quota in this fleet')
    if (r.admin === 'reset') return toObject(env, fleet, quota, '/reset', { method: 'POST' })
    // The core's hold: no grants from a pool for a while.
    if (r.admin === 'hold') return toObject(env, fleet, quota, '/hold', { method: 'POST', headers: { 'content-type': 'application/json' }, body: await readText(request, DEFAULT_MAX_BODY_BYTES) })
    // Tests only: the object's clock, moved by hand (quota.js, ObjectClock).
    if (r.admin === 'clock' && env.TOKENWARDEN_TEST_CLOCK === '1') {
      return toObject(env, fleet, quota, '/clock', { method: 'POST', headers: { 'content-type': 'application/json' }, body: await readText(request, DEFAULT_MAX_BODY_BYTES) })
    }
    throw new HttpError(404, 'not_found', 'no such admin route; see API.md')
  }
  const proxy = kind === 'proxy' || kind === 'proxy_upgrade'
  // An agent credential the base-URL form gave in place of the agent's name, unless the
  // caller sent a secret of its own.
  const credential = kind === 'proxy' && r.credential !== null && request.headers.get('x-tokenwarden-token') === null ? r.credential : null
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
  /** A lease's id and epoch from its handle (403 another quota's, 404 a forged one). */
  const opened = (handle) => openHandle(secret, fleet, quota, handle)

  switch (kind) {
    // The core's host protocol: one input in, its output back, leases as handles both ways.
    case 'handle': {
      const input = jsonObject(await text())
      /** @type {string | null} */
      let epoch = null
      if (typeof input.lease === 'string') ({ id: input.lease, epoch } = await opened(input.lease))
      else if (input.lease !== undefined && input.lease !== null) {
        throw Object.assign(new HttpError(400, 'invalid_argument', '`lease` must be a lease handle an earlier answer gave (tw2.…), not a number'), { field: 'lease' })
      }
      const res = await object('/handle', { method: 'POST', body: JSON.stringify(input) }, epoch)
      return res.status === 200 ? withHandle(res, secret, fleet, quota) : res
    }
    case 'lease':
      return withHandle(await object('/lease', { method: 'POST', body: await text() }), secret, fleet, quota)
    case 'wait': {
      const { id, epoch } = await opened(r.handle)
      return withHandle(await object(`/wait/${id}?timeout=${r.waitMs}`, {}, epoch), secret, fleet, quota)
    }
    case 'cancel': {
      const { id, epoch } = await opened(r.handle)
      return object(`/cancel/${id}`, { method: 'POST' }, epoch)
    }
    case 'on_lease': {
      const { id, epoch } = await opened(r.handle)
      return object(`/${r.verb}/${id}`, { method: 'POST', body: await text() }, epoch)
    }
    // Tasks: open (or update), a failed attempt, the end.
    case 'open_task':
      return object('/task', { method: 'POST', body: await text() })
    case 'on_task':
      // The task's id or name, as the path gives it: the object's member table reads it.
      return object(`/task-${r.done ? 'done' : 'failed'}/${encodeURIComponent(r.task)}`, { method: 'POST', body: await text() })
    case 'response': {
      const body = jsonObject(await text())
      // A report is evidence about one call: it names that call's lease by its handle (the
      // object refuses one without; see API.md). Anything but a handle names no lease.
      /** @type {string | null} */
      let epoch = null
      if (typeof body.lease === 'string') ({ id: body.lease, epoch } = await opened(body.lease))
      else body.lease = null
      return object('/response', { method: 'POST', body: JSON.stringify(body) }, epoch)
    }
    case 'metrics': {
      const res = await object('/metrics')
      if (!r.prometheus || res.status !== 200) return res
      return new Response(prometheusText(await res.json(), { fleet, quota }), { headers: { 'content-type': PROMETHEUS_CONTENT_TYPE } })
    }
    // The recent call events (call starts, waits, refusals, 429s) for the dashboard's overlay.
    case 'timeline':
      return object('/timeline')
    // A WebSocket (Codex asks for the Responses API over one before HTTP) is not proxied:
    // refused with 426, on which Codex falls back to HTTP streaming at once (after a 404 or
    // 403 it retries the upgrade five times with backoff first; see API.md).
    case 'proxy_upgrade':
      throw new HttpError(426, 'websocket_not_supported', 'tokenwarden proxies HTTP only: send the call as an HTTP request (the Responses API streams over server-sent events with "stream": true)')
    case 'proxy': {
      const max = limitFrom(env, 'TOKENWARDEN_MAX_PROXY_BODY_BYTES', DEFAULT_MAX_PROXY_BODY_BYTES)
      const declared = request.headers.get('content-length')
      if (declared !== null && Number(declared) > max) throw new HttpError(413, 'body_too_large', `the request body is larger than ${max} bytes`)
      return object(r.path + url.search, { method: request.method, headers: request.headers, body: request.body, signal: request.signal })
    }
  }
  throw new HttpError(404, 'not_found', 'no such route; see API.md')
}

/**
 * The provider a request speaks when it is a proxied call (its errors are answered in that
 * provider's format, which the SDKs show), else null.
 */
function providerOfRequest(request) {
  try {
    const r = routeOf(request, new URL(request.url))
    if (r.kind !== 'proxy' && r.kind !== 'proxy_upgrade') return null
    return proxiedProvider(r.path.slice('/proxy'.length), request.headers.has('anthropic-version'))
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
