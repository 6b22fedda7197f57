// Proxy mode under workerd against a hostile upstream: a node:http server in this file
// answers absurd usage, malformed usage, streams cut short and a redirect to another
// origin. The client must get the provider's answer byte for byte, and the lease must be
// settled (by the core's rules) rather than left held until its TTL: /metrics shows it.
import assert from 'node:assert/strict'
import http from 'node:http'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const here = (p) => fileURLToPath(new URL(p, import.meta.url))
const outdir = here('../.build/upstream/')
const SECRET = 'upstream-fleet-secret-0123456789'
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 1_000_000, output_tokens_per_minute: 100_000, requests_per_minute: 10_000, max_concurrent: 4 }
const GPT = { name: 'gpt-5', counting: 'openai', tokens_per_minute: 1_000_000, requests_per_minute: 10_000, max_concurrent: 4 }
/** One quota per test, so its minute figures are that test's call alone. */
const QUOTAS = ['huge', 'huge64', 'gpt', 'stream60', 'nodelta', 'error', 'strings', 'redirect', 'gptstream', 'big']

/** A node:http server; `handler` answers every request. */
async function server() {
  const s = { requests: [], handler: (_req, res) => res.writeHead(500).end() }
  s.http = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const r = { url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString(), at: performance.now() }
      s.requests.push(r)
      s.handler(req, res, r)
    })
  })
  await new Promise((r) => s.http.listen(0, '127.0.0.1', r))
  s.url = `http://127.0.0.1:${s.http.address().port}`
  s.close = () => {
    s.http.closeAllConnections()
    return new Promise((r) => s.http.close(r))
  }
  return s
}

let upstream
let elsewhere
let persist
let mf
let base

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: here('../src/worker.js') })
  upstream = await server()
  elsewhere = await server()
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-upstream-'))
  const quotas = Object.fromEntries(QUOTAS.map((q) => [q, { config: { pools: [q.startsWith('gpt') ? GPT : POOL] }, upstream: upstream.url }]))
  // One call at a time, leases reaped after 1 s unless renewed.
  quotas.short = { config: { pools: [{ ...POOL, max_concurrent: 1 }], lease_ttl_ms: 1000 }, upstream: upstream.url }
  ;({ mf, base } = await startWorker({ outdir, persist, fleets: { up: { secret: SECRET, quotas } } }))
})

after(async () => {
  await mf?.dispose()
  await upstream?.close()
  await elsewhere?.close()
  if (persist) rmSync(persist, { recursive: true, force: true })
})

const headers = { 'x-tokenwarden-token': SECRET, 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' }
const ask = (extra = {}) => JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'hello '.repeat(50) }], ...extra })
// `redirect: 'manual'`: this client sees what the proxy answers, and follows nothing itself.
const proxy = (quota, path, body) => fetch(`${base}/v1/fleets/up/quotas/${quota}/proxy${path}`, { method: 'POST', headers, body, redirect: 'manual' })
const sse = (event, data) => `event: ${event}\ndata: ${JSON.stringify({ type: event, ...data })}\n\n`
const answer = (body, { status = 200, type = 'application/json', extra = {} } = {}) => {
  upstream.handler = (_req, res) => res.writeHead(status, { 'content-type': type, ...extra }).end(body)
}

/** The quota's metrics once its proxied call has settled (a stream settles as it ends). */
async function settled(quota) {
  let m
  for (let i = 0; i < 100; i++) {
    m = await (await fetch(`${base}/v1/fleets/up/quotas/${quota}/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()
    if (Number(m.pools[0].counters.settled) >= 1) break
    await new Promise((r) => setTimeout(r, 20))
  }
  assert.equal(Number(m.pools[0].counters.settled), 1, 'the call was settled')
  assert.equal(m.liveLeases, 0, 'no lease is left held')
  // What the call was charged: the sum of the pool's minutes (input, output, tokens, requests).
  const used = [0, 0, 0, 0]
  for (const minute of m.pools[0].minutes) for (const [i, v] of minute.used.entries()) used[i] += Number(v)
  return used
}

describe('absurd usage through the proxy (issue 25, item 5)', () => {
  for (const [quota, name, path, body] of [
    ['huge', 'input_tokens 1e300', '/v1/messages', '{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":1e300,"output_tokens":7}}'],
    ['huge64', 'input_tokens 2^64', '/v1/messages', '{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":18446744073709551616,"output_tokens":7}}'],
    ['gpt', 'OpenAI prompt_tokens 1e18', '/v1/chat/completions', '{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1000000000000000000,"completion_tokens":7}}'],
  ]) {
    test(`${name}: the client gets the provider's answer unchanged; the lease is settled, clamped to one window`, async () => {
      answer(body)
      const request = path === '/v1/messages' ? ask() : JSON.stringify({ model: 'gpt-5', max_completion_tokens: 100, messages: [{ role: 'user', content: 'hi' }] })
      const r = await proxy(quota, path, request)
      assert.equal(r.status, 200)
      assert.equal(await r.text(), body)
      const used = await settled(quota)
      if (path === '/v1/messages') assert.deepEqual(used.slice(0, 2), [1_000_000, 7])
      else assert.equal(used[2], 1_000_000)
    })
  }

  test('a streamed output_tokens of 2^60: the stream passes unchanged, settled at the output limit', async () => {
    const body =
      sse('message_start', { message: { id: 'm', usage: { input_tokens: 50, output_tokens: 1 } } }) +
      sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'hello' } }) +
      'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1152921504606846976}}\n\n' +
      sse('message_stop', {})
    answer(body, { type: 'text/event-stream' })
    const r = await proxy('stream60', '/v1/messages', ask({ stream: true }))
    assert.equal(r.status, 200)
    assert.equal(await r.text(), body)
    assert.deepEqual((await settled('stream60')).slice(0, 2), [50, 100_000])
  })
})

describe('streams cut short and malformed usage through the proxy (issue 25, item 6)', () => {
  const start = sse('message_start', { message: { id: 'm', usage: { input_tokens: 50, output_tokens: 1 } } })
  const text = Array.from({ length: 100 }, () => sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'y'.repeat(200) } })).join('')

  for (const [quota, name, body] of [
    ['nodelta', 'ends cleanly without message_delta', start + text],
    ['error', 'ends after an error event', start + text + sse('error', { error: { type: 'overloaded_error', message: 'Overloaded' } })],
  ]) {
    test(`an Anthropic stream that ${name} is charged as cut short (output seen + 16)`, async () => {
      answer(body, { type: 'text/event-stream' })
      const r = await proxy(quota, '/v1/messages', ask({ stream: true, max_tokens: 20_000 }))
      assert.equal(await r.text(), body)
      assert.deepEqual((await settled(quota)).slice(0, 2), [50, 10_016])
    })
  }

  test('an OpenAI stream whose usage chunk is malformed is charged as cut short, not as 0 tokens', async () => {
    const body =
      `data: ${JSON.stringify({ choices: [{ delta: { content: 'z'.repeat(2_000) } }], usage: null })}\n\n` +
      `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: -3, completion_tokens: '7' } })}\n\n` +
      'data: [DONE]\n\n'
    answer(body, { type: 'text/event-stream' })
    const r = await proxy(
      'gptstream',
      '/v1/chat/completions',
      JSON.stringify({ model: 'gpt-5', stream: true, stream_options: { include_usage: true }, max_completion_tokens: 5_000, messages: [{ role: 'user', content: 'hi' }] }),
    )
    assert.equal(await r.text(), body)
    assert.equal((await settled('gptstream'))[1], 1_016)
  })

  test('a JSON answer whose usage counts are strings is charged the whole reservation, not 0', async () => {
    const body = '{"id":"msg","type":"message","content":[],"usage":{"input_tokens":"900","output_tokens":"7"}}'
    answer(body)
    const r = await proxy('strings', '/v1/messages', ask())
    assert.equal(await r.text(), body)
    const used = await settled('strings')
    assert.equal(used[1], 100, 'all of max_tokens')
    assert.ok(used[0] > 0, `input as reserved: ${used[0]}`)
  })
})

describe('redirects through the proxy (issue 25, item 11; issue 43, N4)', () => {
  // The wrapper forwards with `redirect: 'manual'`; the proxy does not hand the redirect on
  // either: a client that followed it would send its key and the fleet secret there.
  test('a 307 to another origin is answered 502 without its Location; the API key goes nowhere else; nothing is charged', async () => {
    elsewhere.handler = (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"usage":{"input_tokens":1,"output_tokens":1}}')
    answer('{"type":"error","error":{"type":"moved","message":"see elsewhere"}}', { status: 307, extra: { location: `${elsewhere.url}/steal` } })
    const r = await proxy('redirect', '/v1/messages', ask())
    assert.equal(r.status, 502)
    assert.equal(r.headers.get('location'), null, 'no Location to follow')
    const body = await r.json()
    assert.equal(body.type, 'error', 'in the provider format')
    assert.equal(body.tokenwarden.error, 'upstream_redirect')
    assert.match(body.error.message, new RegExp(`a redirect to ${elsewhere.url.replace(/[.]/g, '\\.')}`))
    assert.equal(elsewhere.requests.length, 0, 'the other origin got no request (and no x-api-key)')
    assert.deepEqual((await settled('redirect')).slice(0, 2), [0, 0])
  })

  test('a client that follows redirects sends nothing to the other origin either', async () => {
    answer('{}', { status: 307, extra: { location: `${elsewhere.url}/steal` } })
    const r = await fetch(`${base}/v1/fleets/up/quotas/redirect/proxy/v1/messages`, { method: 'POST', headers, body: ask() })
    assert.equal(r.status, 502)
    await r.arrayBuffer()
    assert.equal(elsewhere.requests.length, 0, 'no x-tokenwarden-token, no x-api-key at the other origin')
  })
})

describe('long and big answers through the proxy (issue 25, item 11)', () => {
  test('a big JSON answer streams through to the client as it arrives and settles from the usage at its end', async () => {
    const head = `{"id":"msg_big","type":"message","content":[{"type":"text","text":"${'w'.repeat(3 * 1024 * 1024)}`
    const tail = '"}],"stop_reason":"end_turn","usage":{"input_tokens":321,"output_tokens":77}}'
    let release
    const released = new Promise((r) => (release = r))
    let ended = false
    upstream.handler = async (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.write(head)
      // The rest only once the client has the response (or, where the proxy buffers, after 3 s).
      await Promise.race([released, new Promise((r) => setTimeout(r, 3_000))])
      ended = true
      res.end(tail)
    }
    const r = await proxy('big', '/v1/messages', ask())
    assert.equal(ended, false, 'the response reached the client before the upstream body ended')
    release()
    const text = await r.text()
    assert.equal(text.length, head.length + tail.length)
    assert.ok(text === head + tail, 'the body arrived byte for byte')
    assert.deepEqual((await settled('big')).slice(0, 2), [321, 77])
  })

  test('a stream longer than the lease TTL keeps its slot while bytes flow: the next proxied call waits for its end', async () => {
    upstream.requests.length = 0
    let streamEnded = null
    upstream.handler = async (_req, res, r) => {
      if (upstream.requests.indexOf(r) > 0) {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"m2","content":[],"usage":{"input_tokens":10,"output_tokens":2}}')
        return
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse('message_start', { message: { id: 'm', usage: { input_tokens: 50, output_tokens: 1 } } }))
      for (let i = 0; i < 30; i++) {
        await new Promise((d) => setTimeout(d, 100))
        res.write(sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'abcd' } }))
      }
      res.write(sse('message_delta', { usage: { output_tokens: 60 } }))
      streamEnded = performance.now()
      res.end(sse('message_stop', {}))
    }
    const first = await proxy('short', '/v1/messages', ask({ stream: true }))
    const firstText = first.text()
    await new Promise((d) => setTimeout(d, 500))
    const second = proxy('short', '/v1/messages', ask())
    assert.match(await firstText, /message_stop/)
    const r = await second
    assert.equal(r.status, 200)
    await r.text()
    assert.equal(upstream.requests.length, 2)
    assert.ok(streamEnded !== null && upstream.requests[1].at >= streamEnded, 'the second call was forwarded only after the stream ended')
    let m
    for (let i = 0; i < 100; i++) {
      m = await (await fetch(`${base}/v1/fleets/up/quotas/short/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()
      if (Number(m.pools[0].counters.settled) >= 2) break
      await new Promise((d) => setTimeout(d, 20))
    }
    assert.equal(Number(m.pools[0].counters.settled), 2, 'both calls settled')
    assert.equal(Number(m.pools[0].counters.expired ?? 0), 0, 'no lease was reaped')
    assert.equal(m.liveLeases, 0)
  })
})
