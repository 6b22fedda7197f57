// Proxy mode in the Durable Object: a provider request leased, forwarded to the quota's
// upstream and its answer streamed back, settled from its usage — the shared `fetch`
// wrapper (the core's call machine) does the call; this is its I/O: the request's body,
// the upstream fetch (redirects handed back, never followed), and a waiting stream's
// keep-alive. Which requests are model calls, what is forwarded, who the call is, and how
// a failure is answered are the gateway and provider crates' rules.
import { gatewayRule, proxiedCall, providerErrorBody, stopStatus, taskIdFor } from 'tokenwarden-wasm'
import { HttpError, parseFleets } from './auth.js'
import { DEFAULT_MAX_PROXY_BODY_BYTES, limitFrom, readText } from './body.js'
import { json, refusal, statusOf, toJson } from './reply.js'

/**
 * What the quota's object lends a proxied call.
 * @typedef {object} ProxyHost
 * @property {Record<string, any>} env the Worker's environment (fleets, body limits)
 * @property {(name: string) => number} agentId the id of agent `name`, its name remembered
 * @property {() => Promise<unknown>} sent a call is sent under a lease just granted: write it soon
 */

/**
 * Proxy mode: lease, forward to the quota's upstream, stream the answer back, settle
 * from its usage — the shared `fetch` wrapper does all of it. The agent's API key
 * headers pass through untouched and are never stored or logged.
 */
export async function proxy(tw, request, url, who, host) {
  const fleets = parseFleets(host.env.TOKENWARDEN_FLEETS)
  const fleet = fleets[request.headers.get('x-tw-fleet')]
  const q = fleet?.quotas?.[request.headers.get('x-tw-quota')]
  if (q?.upstream === undefined) throw new HttpError(404, 'not_found', 'this quota has no upstream configured for proxy mode')
  // What is sent and what names the call, or why not: the gateway crate's rule (the path's
  // /agent, /role, /task, /unblocks or their headers; the headers and query parameters
  // forwarded, none holding a secret). Model calls are leased; any other route of the
  // provider's API (token counting, model lists) passes through unleased, with the
  // agent's own key.
  const read = proxiedCall(url.pathname.slice('/proxy'.length), url.search, request.headers, [fleet.secret, fleet.admin_secret], who ?? null)
  if ('refused' in read) throw refusal(read.refused)
  // No role named: `auto`, the core's (a planner for its subagents at work, which unblocks
  // them, else a worker), as every host leaves it. Who the call is (`name`: by its client's session headers, else the agent named, else
  // `proxy`), and its family's root for a subagent (a family shares one place in the fair order).
  const { provider, path, role, task, unblocks, failureSignature: signature } = read.call
  const headers = new Headers(read.call.headers)
  const agent = host.agentId(read.call.name)
  const family = read.call.family === null ? null : host.agentId(read.call.family)
  const upstream = new URL(q.upstream)
  upstream.pathname = upstream.pathname.replace(/\/$/, '') + path
  upstream.search = read.call.query
  let sent = false
  const gone = new AbortController()
  const f = tw.fetch({
    agent,
    ...(family === null ? {} : { family }),
    role,
    ...(task === null ? {} : { task: taskIdFor(task) }),
    ...(unblocks === null ? {} : { unblocks }),
    ...(signature === null ? {} : { failureSignature: signature }),
    ...(q.timeouts === undefined ? {} : { timeouts: q.timeouts }),
    // Sent under a lease just granted: written soon (`host.sent`, not awaited: the
    // call does not wait for the disk), so a restart soon after still knows what the call
    // holds and charges it. A redirect is handed back, never followed (it would carry the
    // agent's key to wherever it points); a failure to reach the provider is marked as
    // such, for a 502 in the provider's format.
    fetch: async (input, init) => {
      sent = true
      host.sent().catch(() => {})
      try {
        return await fetch(input, { ...init, redirect: 'manual' })
      } catch (e) {
        if (init?.signal?.aborted) throw e
        throw Object.assign(new Error(`the provider could not be reached: ${e?.message ?? e}`), { upstream: true, cause: e })
      }
    },
  })
  const text = await readText(request, limitFrom(host.env, 'TOKENWARDEN_MAX_PROXY_BODY_BYTES', DEFAULT_MAX_PROXY_BODY_BYTES))
  // The request's signal aborts when the client goes away (Cloudflare, with the
  // `enable_request_signal` flag; workerd when the connection breaks): the wrapper then
  // withdraws a queued ticket, ends a wait and forwards nothing. `gone` is the same for a
  // streamed call whose client stopped reading the keep-alive (below).
  const signal = AbortSignal.any([request.signal, gone.signal])
  const method = request.method
  const answer = f(upstream.href, { method, headers, ...(method === 'GET' || method === 'HEAD' ? {} : { body: text }), signal }).then((res) => noRedirect(res, provider))
  if (!wantsStream(text)) return answer.catch((e) => upstreamFailure(e, provider))
  // A streamed call that has no answer within KEEPALIVE.afterMs (waiting in line, or for a
  // 429 to clear) gets its response head now and SSE comments until the provider's stream
  // follows: the client sees a live connection, and a client that went away is noticed
  // when a write to it fails — the call is then withdrawn, not forwarded for nobody.
  const settled = answer.then(
    (res) => ({ res }),
    (err) => ({ err }),
  )
  let first = await Promise.race([settled, new Promise((r) => setTimeout(() => r(null), KEEPALIVE.afterMs))])
  // Already with the provider: its own status and headers are what the client gets.
  if (first === null && sent) first = await settled
  if (first !== null) return first.err === undefined ? first.res : upstreamFailure(first.err, provider)
  return keptAlive(answer, provider, gone, () => sent)
}

/**
 * A waiting stream's keep-alive (the gateway crate's rule): its head after `afterMs`, then
 * an SSE comment every `everyMs`, `waiting` in line or `sent` to the provider.
 * @type {{ afterMs: number, everyMs: number, waiting: string, sent: string }}
 */
const KEEPALIVE = JSON.parse(gatewayRule('{"op":"keepalive"}'))

/** Whether a provider request body asks for a stream (`"stream": true`). */
function wantsStream(text) {
  try {
    return JSON.parse(text)?.stream === true
  } catch {
    return false
  }
}

/** One of the gateway crate's proxy rules (`redirect`, `streamError`, `failureEvent`). */
function proxyRule(input) {
  return JSON.parse(gatewayRule(toJson(input)))
}

/**
 * A streamed proxied call answered before its outcome is known: `200 text/event-stream`
 * at once, then an SSE comment every `KEEPALIVE.everyMs` while it waits, then the
 * provider's stream — or, if the call ends otherwise (the provider answers an error, the
 * core gives up, the provider cannot be reached), one SSE `error` event in the provider's
 * format, which the official SDKs raise as an API error with tokenwarden's reason. A
 * cancelled body (the client is gone: a write failed) aborts `gone`, which withdraws the call.
 */
function keptAlive(answer, provider, gone, sent) {
  const enc = new TextEncoder()
  let timer
  /** @type {ReadableStreamDefaultReader<Uint8Array> | null} */
  let upstreamBody = null
  const body = new ReadableStream({
    start(controller) {
      const ping = () => {
        try {
          controller.enqueue(enc.encode(sent() ? KEEPALIVE.sent : KEEPALIVE.waiting))
        } catch {
          clearInterval(timer)
        }
      }
      ping()
      timer = setInterval(ping, KEEPALIVE.everyMs)
      const end = (event) => {
        controller.enqueue(enc.encode(event))
        controller.close()
      }
      answer.then(
        async (res) => {
          clearInterval(timer)
          if (gone.signal.aborted) {
            // Gone just as the answer came: let the wrapper end the call (cut short).
            res.body?.cancel().catch(() => {})
            return
          }
          if (res.ok && (res.headers.get('content-type') ?? '').includes('text/event-stream') && res.body !== null) {
            const reader = res.body.getReader()
            upstreamBody = reader
            try {
              for (;;) {
                const { done, value } = await reader.read()
                if (done) break
                controller.enqueue(value)
              }
              controller.close()
            } catch (e) {
              if (!gone.signal.aborted) controller.error(e)
            }
            return
          }
          // An answer that is not a stream (an error, or JSON though a stream was asked):
          // its error in the provider's event format.
          const raw = await res.text().catch(() => '')
          end(proxyRule({ op: 'streamError', provider, status: res.status, body: raw }).event)
        },
        (err) => {
          clearInterval(timer)
          if (gone.signal.aborted) return
          const e = failureOf(err)
          end(proxyRule({ op: 'failureEvent', provider, status: e.status, code: e.code, message: e.message }).event)
        },
      )
    },
    cancel() {
      clearInterval(timer)
      gone.abort(new Error('the client went away'))
      upstreamBody?.cancel().catch(() => {})
    },
  })
  return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-tokenwarden-kept-alive': '1' } })
}

/**
 * What a failed proxied call is answered: `{ status, code, message }`. The provider not
 * reached is 502, an upstream timeout 504; a refusal or another tokenwarden error is what
 * errorResponse makes of it.
 */
function failureOf(err) {
  if (err?.upstream === true || err?.code === 'upstream_timeout') {
    const unreachable = err?.upstream === true
    const { status } = stopStatus(unreachable ? 'unreachable' : 'timed_out', null)
    return { status, code: unreachable ? 'upstream_unreachable' : 'upstream_timeout', message: String(err.message) }
  }
  const { status, body } = statusOf(err)
  return { status, code: String(body.error), message: String(body.message) }
}

/**
 * A provider's redirect is not handed on (issue 43, N4): a client that follows it sends
 * what it sent here (its API key, and `x-tokenwarden-token` with the fleet's secret) to
 * wherever it points. The client gets a 502 in the provider's format naming where it
 * pointed, and no `Location` (the gateway crate's rule). (The wrapper did not follow it,
 * and settled the lease as nothing used.)
 * @param {Response} res
 * @param {import('tokenwarden-wasm').Provider} provider
 */
function noRedirect(res, provider) {
  if (res.status < 300 || res.status > 399 || res.status === 304) return res
  res.body?.cancel().catch(() => {})
  const r = proxyRule({ op: 'redirect', provider, status: res.status, location: res.headers.get('location') ?? undefined })
  return json(r.status, r.body)
}

/**
 * A proxied call that failed without an answer from the provider: 502 (not reached) or 504
 * (timed out) in the provider's JSON error format; anything else goes to errorResponse.
 */
function upstreamFailure(err, provider) {
  if (err?.upstream !== true && err?.code !== 'upstream_timeout') throw err
  const { status, code, message } = failureOf(err)
  return json(status, providerErrorBody(provider, status, `tokenwarden: ${message}`, { error: code, message }))
}
