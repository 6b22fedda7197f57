// The OpenAI Responses API through the edge limiter's proxy mode under workerd, against the
// mock provider behind a recording forwarder (which sees exactly what reaches the
// provider): `POST /v1/responses` leased and settled, streamed and not, through the
// official OpenAI SDK and the base-URL form; the query string and Codex's identity headers
// kept; the API's other routes passed through unleased; a refusal in OpenAI's error format;
// a WebSocket upgrade refused with 426 (on which Codex falls back to HTTP at once) and never
// forwarded.
import assert from 'node:assert/strict'
import http from 'node:http'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'

const here = (p) => fileURLToPath(new URL(p, import.meta.url))
const outdir = here('../.build/edge-responses/')
const SECRET = 'fleet-r-secret-0123456789'
const POOL = { name: 'gpt-5', counting: 'openai', tokens_per_minute: 200_000, requests_per_minute: 1_000, max_concurrent: 4 }
const major = Number(process.versions.node.split('.')[0])

let mock
let upstream
let seen
let persist
let mf
let base

/** A forwarder in front of the mock that records each request's method, URL and headers. */
async function recorder(target) {
  const server = http.createServer(async (req, res) => {
    const chunks = []
    for await (const c of req) chunks.push(c)
    seen.push({ method: req.method, url: req.url, headers: { ...req.headers } })
    const headers = { ...req.headers }
    delete headers.host
    delete headers['content-length']
    const r = await fetch(target + req.url, { method: req.method, headers, body: ['GET', 'HEAD'].includes(req.method) ? undefined : Buffer.concat(chunks) })
    const out = {}
    r.headers.forEach((v, k) => {
      if (k !== 'content-length' && k !== 'content-encoding' && k !== 'transfer-encoding') out[k] = v
    })
    res.writeHead(r.status, out)
    if (r.body === null) return res.end()
    for await (const c of r.body) res.write(c)
    res.end()
  })
  server.on('upgrade', (req, socket) => {
    seen.push({ method: req.method, url: req.url, headers: { ...req.headers }, upgrade: true })
    socket.destroy()
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  return { server, url: `http://127.0.0.1:${server.address().port}` }
}

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: here('../src/worker.js') })
  mock = await startMockProvider({ tokensPerMinute: 200_000, concurrency: 4, replyTokens: 30, chunkDelayMs: 2 })
  upstream = await recorder(mock.url)
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-edge-responses-'))
  const fleets = { 'fleet-r': { secret: SECRET, quotas: { openai: { config: { pools: [POOL] }, upstream: upstream.url } } } }
  ;({ mf, base } = await startWorker({ outdir, persist, fleets }))
})

after(async () => {
  await mf?.dispose()
  await mock?.close()
  upstream?.server.closeAllConnections()
  await new Promise((r) => (upstream ? upstream.server.close(r) : r()))
  if (persist) rmSync(persist, { recursive: true, force: true })
})

const quota = () => `${base}/v1/fleets/fleet-r/quotas/openai`
const metrics = async () => (await fetch(`${quota()}/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()
const settled = async () => Number((await metrics()).pools[0].counters.settled)
const json = { 'content-type': 'application/json', authorization: 'Bearer sk-test-openai', 'x-tokenwarden-token': SECRET }
const call = (extra = {}) => JSON.stringify({ model: 'gpt-5', input: 'hello '.repeat(100), max_output_tokens: 100, ...extra })
/** Waits for the settle that follows a stream's end (the object settles as the body ends). */
const idle = async () => {
  for (let i = 0; i < 50 && (await metrics()).liveLeases > 0; i++) await new Promise((r) => setTimeout(r, 20))
}

describe('the Responses API in proxy mode', () => {
  test('POST /v1/responses, JSON and streamed: leased, forwarded with its query string, settled from its usage', async () => {
    seen = []
    const before = await settled()
    const r = await fetch(`${quota()}/proxy/v1/responses?trace=on&x=1`, { method: 'POST', headers: json, body: call() })
    assert.equal(r.status, 200)
    const body = await r.json()
    assert.equal(body.object, 'response')
    assert.equal(body.usage.output_tokens, 30)
    assert.ok(r.headers.get('x-ratelimit-limit-tokens'), "the provider's headers pass through")
    const s = await fetch(`${quota()}/proxy/v1/responses`, { method: 'POST', headers: json, body: call({ stream: true }) })
    assert.equal(s.status, 200)
    assert.match(s.headers.get('content-type'), /event-stream/)
    const text = await s.text()
    assert.match(text, /event: response\.completed/)
    await idle()
    const m = await metrics()
    assert.equal(Number(m.pools[0].counters.settled), before + 2, 'both calls settled')
    assert.equal(m.liveLeases, 0)
    assert.deepEqual(
      seen.map((e) => `${e.method} ${e.url}`),
      ['POST /v1/responses?trace=on&x=1', 'POST /v1/responses'],
    )
  })

  test("the official SDK's responses.create and responses.stream through the base-URL form", { skip: major < 22 ? 'run with Node >= 22' : false }, async () => {
    const { default: OpenAI } = await import('openai')
    seen = []
    const before = await settled()
    const client = new OpenAI({ apiKey: 'sk-test-openai', baseURL: `${quota()}/agents/codex-1/worker/openai`, defaultHeaders: { 'x-tokenwarden-token': SECRET }, maxRetries: 0 })
    const params = { model: 'gpt-5', input: 'hello', max_output_tokens: 100 }
    const created = await client.responses.create(params)
    assert.equal(created.output_text.split(' ').length, 30)
    const streamed = await client.responses.stream(params).finalResponse()
    assert.equal(streamed.status, 'completed')
    assert.equal(streamed.usage.output_tokens, 30)
    await idle()
    assert.equal(await settled(), before + 2)
    assert.deepEqual(
      seen.map((e) => `${e.method} ${e.url}`),
      ['POST /v1/responses', 'POST /v1/responses'],
      'the /v1 of the base URL may be left out',
    )
  })

  test("Codex's identity headers reach the provider; tokenwarden's never do", async () => {
    seen = []
    const identity = {
      originator: 'codex_exec',
      'user-agent': 'codex_exec/0.171.0 (Debian 12.0.0; x86_64)',
      version: '0.171.0',
      'session-id': 'sess-1',
      session_id: 'sess-1',
      'thread-id': 'thr-1',
      'x-client-request-id': 'req-1',
      'x-codex-turn-metadata': '{"turn_id":"t1"}',
      'x-codex-beta-features': 'remote_compaction_v2',
      'x-openai-subagent': 'review',
      'chatgpt-account-id': 'acct-1',
      'openai-organization': 'org-1',
      'openai-project': 'proj-1',
      'openai-beta': 'responses=experimental',
    }
    const r = await fetch(`${quota()}/proxy/v1/responses`, { method: 'POST', headers: { ...json, ...identity, 'x-tokenwarden-agent': 'codex-2', cookie: 'a=b' }, body: call() })
    assert.equal(r.status, 200)
    await r.arrayBuffer()
    assert.equal(seen.length, 1)
    const got = seen[0].headers
    for (const [k, v] of Object.entries(identity)) assert.equal(got[k], v, `${k} forwarded`)
    assert.equal(got.authorization, 'Bearer sk-test-openai', "the agent's own key is forwarded")
    for (const k of Object.keys(got)) assert.doesNotMatch(k, /^x-tokenwarden-|^cookie$/, `${k} is not forwarded`)
    assert.ok(!JSON.stringify(got).includes(SECRET), 'the fleet secret never reaches the provider')
  })

  test('GET, DELETE, input_items and cancel of a response pass through unleased', async () => {
    seen = []
    const before = await metrics()
    const paths = [
      ['GET', '/v1/responses/resp_1?include=x'],
      ['GET', '/v1/responses/resp_1/input_items'],
      ['DELETE', '/v1/responses/resp_1'],
      ['POST', '/v1/responses/resp_1/cancel'],
    ]
    for (const [method, path] of paths) {
      const r = await fetch(`${quota()}/proxy${path}`, { method, headers: json, ...(method === 'POST' ? { body: '{}' } : {}) })
      assert.equal(r.status, 404, `${method} ${path}: the provider's own answer`)
      const err = await r.json()
      assert.equal(typeof err.error.message, 'string', 'in OpenAI format')
    }
    assert.deepEqual(
      seen.map((e) => `${e.method} ${e.url}`),
      paths.map(([m, p]) => `${m} ${p}`),
    )
    const after = await metrics()
    const granted = (m) => Number(m.pools[0].counters.grantedNow) + Number(m.pools[0].counters.grantedFromQueue)
    assert.equal(granted(after), granted(before), 'nothing leased')
  })

  test("a refusal answers in OpenAI's error format, streamed or not, and nothing is sent", async () => {
    seen = []
    for (const stream of [false, true]) {
      const r = await fetch(`${quota()}/proxy/v1/responses`, { method: 'POST', headers: json, body: call({ max_output_tokens: 250_000, stream }) })
      assert.equal(r.status, 400)
      const err = await r.json()
      assert.equal(err.error.type, 'invalid_request_error')
      assert.equal(err.error.code, 'rejected')
      assert.match(err.error.message, /^tokenwarden: lease rejected/)
      assert.equal(err.tokenwarden.retryAt, null)
      assert.equal(r.headers.get('x-should-retry'), 'false')
    }
    assert.equal(seen.length, 0)
  })

  test('a WebSocket upgrade is refused with 426 in OpenAI format and never forwarded', async () => {
    seen = []
    const answer = await new Promise((resolve, reject) => {
      const url = new URL(`${quota()}/agents/codex-3/worker/openai/v1/responses`)
      const req = http.request({
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        headers: {
          connection: 'Upgrade',
          upgrade: 'websocket',
          'sec-websocket-version': '13',
          'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==',
          authorization: 'Bearer sk-test-openai',
          'x-tokenwarden-token': SECRET,
          'openai-beta': 'responses_websockets=2026-02-06',
        },
      })
      req.on('upgrade', (res, socket) => {
        socket.destroy()
        reject(new Error(`upgraded: ${res.statusCode}`))
      })
      req.on('response', async (res) => {
        let body = ''
        for await (const c of res) body += c
        resolve({ status: res.statusCode, body, headers: res.headers })
      })
      req.on('error', reject)
      req.end()
    })
    assert.equal(answer.status, 426)
    const err = JSON.parse(answer.body)
    assert.equal(err.error.code, 'websocket_not_supported')
    assert.match(err.error.message, /^tokenwarden: .*HTTP/)
    assert.equal(answer.headers['x-should-retry'], 'false')
    assert.equal(seen.length, 0, 'nothing reached the provider')
  })
})
