// The fetch wrapper against a hostile or careless upstream: a real HTTP server in this file
// answers each shape (absurd or malformed usage, streams cut short, redirects to another
// origin, big bodies, stalls), and each test checks what the caller receives (byte for
// byte the upstream's body), how the lease was settled, and that no lease is left held.
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import http from 'node:http'
import { after, before, describe, test } from 'node:test'
import { createTokenwarden } from '../support/engine.mjs'

const POOL = { name: 'm1', input_tokens_per_minute: 1_000_000, output_tokens_per_minute: 100_000, max_concurrent: 10 }
const request = (extra = {}) => JSON.stringify({ model: 'm1', max_tokens: 100, messages: [{ role: 'user', content: 'x'.repeat(400) }], ...extra })
const sse = (event, data) => `event: ${event}\ndata: ${JSON.stringify({ type: event, ...data })}\n\n`
const delay = (ms) => new Promise((r) => setTimeout(r, ms))

/** A node:http server; `handler` answers every request (set it per test). */
async function server() {
  const s = {
    requests: [],
    handler: (req, res) => res.writeHead(500).end(),
  }
  s.http = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const r = { method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString(), at: performance.now(), closed: false }
      res.on('close', () => {
        r.closed = true
        r.finished = res.writableFinished
      })
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
before(async () => {
  upstream = await server()
  elsewhere = await server()
})
after(async () => {
  await upstream?.close()
  await elsewhere?.close()
})

function setup({ pools = [POOL], config = {}, options = {} } = {}) {
  const tw = createTokenwarden({ config: { pools, ...config } })
  const settled = []
  const errors = []
  const expired = []
  tw.on('settled', (e) => settled.push(e.settlement))
  tw.on('remote_error', (e) => errors.push(e))
  tw.on('expired', (e) => expired.push(e))
  const fetch = tw.fetch({ agent: 'tester', ...options })
  return { tw, fetch, settled, errors, expired }
}

const post = (fetch, path = '/v1/messages', body = request(), extra = {}) =>
  fetch(`${upstream.url}${path}`, { method: 'POST', headers: { 'x-api-key': 'sk-secret-key', 'content-type': 'application/json' }, body, ...extra })

/** Answers every request with this status, headers and body (written in one piece). */
const answer = (body, { status = 200, type = 'application/json', headers = {} } = {}) => {
  upstream.handler = (req, res) => res.writeHead(status, { 'content-type': type, ...headers }).end(body)
}

/** Waits for the settlement (a settle at the end of a body may follow the read by a tick). */
async function settlement(h, n = 1) {
  for (let i = 0; i < 100 && h.settled.length < n; i++) await delay(5)
  assert.equal(h.settled.length, n, `${n} settlement(s)`)
  return h.settled[n - 1]
}

describe('absurd usage in an upstream answer (issue 25, item 5)', () => {
  const cases = [
    ['Anthropic input_tokens 1e300', '/v1/messages', '{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":1e300,"output_tokens":7}}', 7],
    ['Anthropic input_tokens 2^64', '/v1/messages', '{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":18446744073709551616,"output_tokens":7}}', 7],
    ['OpenAI prompt_tokens 1e18', '/v1/chat/completions', '{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1000000000000000000,"completion_tokens":7}}', 7],
  ]
  for (const [name, path, body, output] of cases) {
    test(`${name}: the caller gets the answer unchanged; the lease is settled, clamped to one window`, async () => {
      const pools = path === '/v1/messages' ? [POOL] : [{ name: 'm1', counting: 'openai', tokens_per_minute: 1_000_000, max_concurrent: 10 }]
      const h = setup({ pools })
      answer(body)
      const res = await post(h.fetch, path)
      assert.equal(res.status, 200)
      assert.equal(await res.text(), body)
      const s = await settlement(h)
      // One window of the axis's limit: input (Anthropic) or tokens (OpenAI) at 1,000,000.
      assert.equal(path === '/v1/messages' ? s.used[0] : s.used[2], 1_000_000)
      assert.equal(s.used[1], output)
      assert.equal(h.tw.metrics().liveLeases, 0)
      assert.deepEqual(h.errors, [])
      h.tw.close()
    })
  }

  test('a streamed output_tokens of 2^60: the stream passes unchanged, settled at the output limit', async () => {
    const h = setup()
    const body =
      sse('message_start', { message: { id: 'm', usage: { input_tokens: 50, output_tokens: 1 } } }) +
      sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'hello' } }) +
      'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1152921504606846976}}\n\n' +
      sse('message_stop', {})
    answer(body, { type: 'text/event-stream' })
    const res = await post(h.fetch, '/v1/messages', request({ stream: true }))
    assert.equal(await res.text(), body)
    const s = await settlement(h)
    assert.deepEqual(s.used.slice(0, 2), [50, 100_000])
    assert.equal(h.tw.metrics().liveLeases, 0)
    h.tw.close()
  })

  test('a settle the engine refuses costs the caller nothing: the lease ends as interrupted, with an event', async () => {
    const h = setup()
    const settle = h.tw.engine.settle
    h.tw.engine.settle = () => {
      throw Object.assign(new Error('the engine refused this settle'), { code: 'internal' })
    }
    const body = '{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":90,"output_tokens":7}}'
    answer(body)
    const res = await post(h.fetch)
    assert.equal(await res.text(), body)
    const s = await settlement(h)
    h.tw.engine.settle = settle
    // Interrupted with nothing seen: the reservation's input, and all of max_tokens.
    assert.equal(s.used[1], 100)
    assert.equal(h.tw.metrics().liveLeases, 0)
    assert.equal(h.errors.length, 1)
    assert.match(h.errors[0].message, /the engine refused this settle; the call is charged as interrupted instead/)
    h.tw.close()
  })
})

describe('streams cut short and malformed usage (issue 25, item 6)', () => {
  const start = sse('message_start', { message: { id: 'm', usage: { input_tokens: 50, output_tokens: 1 } } })
  // 20,000 characters of text in 100 deltas.
  const text = Array.from({ length: 100 }, () => sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'y'.repeat(200) } })).join('')
  const ask = request({ stream: true, max_tokens: 20_000 })

  for (const [name, body] of [
    ['ends cleanly without message_delta', start + text],
    ['ends after an error event', start + text + sse('error', { error: { type: 'overloaded_error', message: 'Overloaded' } })],
    ['has its message_delta, then an error event', start + text + sse('message_delta', { usage: { output_tokens: 30 } }) + sse('error', { error: { type: 'api_error', message: 'x' } })],
  ]) {
    test(`an Anthropic stream that ${name} is charged as cut short: output seen + 16`, async () => {
      const h = setup()
      answer(body, { type: 'text/event-stream' })
      const res = await post(h.fetch, '/v1/messages', ask)
      assert.equal(await res.text(), body)
      const s = await settlement(h)
      // Input as message_start reported it; output 20,000 characters / 2 + 16.
      assert.deepEqual(s.used.slice(0, 2), [50, 10_016])
      assert.equal(h.tw.metrics().liveLeases, 0)
      h.tw.close()
    })
  }

  test('a complete Anthropic stream still settles from its usage, absent cache counts as 0', async () => {
    const h = setup()
    const body = start + text + sse('message_delta', { usage: { output_tokens: 4_321 } }) + sse('message_stop', {})
    answer(body, { type: 'text/event-stream' })
    const res = await post(h.fetch, '/v1/messages', ask)
    assert.equal(await res.text(), body)
    assert.deepEqual((await settlement(h)).used.slice(0, 2), [50, 4_321])
    h.tw.close()
  })

  test('an OpenAI stream whose usage chunk is malformed is charged as cut short, not as 0 tokens', async () => {
    const pools = [{ name: 'm1', counting: 'openai', tokens_per_minute: 1_000_000, max_concurrent: 10 }]
    const h = setup({ pools })
    const body =
      `data: ${JSON.stringify({ choices: [{ delta: { content: 'z'.repeat(2_000) } }], usage: null })}\n\n` +
      `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: '900', completion_tokens: -5 } })}\n\n` +
      'data: [DONE]\n\n'
    answer(body, { type: 'text/event-stream' })
    const res = await post(h.fetch, '/v1/chat/completions', JSON.stringify({ model: 'm1', stream: true, stream_options: { include_usage: true }, max_tokens: 5_000, messages: [{ role: 'user', content: 'hi' }] }))
    assert.equal(await res.text(), body)
    const s = await settlement(h)
    assert.equal(s.used[1], 1_016, 'output: 2,000 characters / 2 + 16')
    assert.ok(s.used[0] > 0, `input charged as reserved: ${s.used[0]}`)
    h.tw.close()
  })

  for (const [name, usage] of [
    ['strings', { input_tokens: '900', output_tokens: '7' }],
    ['negative numbers', { input_tokens: 900, output_tokens: -7 }],
    ['a malformed cache count', { input_tokens: 900, output_tokens: 7, cache_read_input_tokens: 'many' }],
  ]) {
    test(`a JSON body whose usage has ${name} is interrupted (the whole reservation), not settled with 0`, async () => {
      const h = setup()
      const body = JSON.stringify({ id: 'msg', type: 'message', content: [], usage })
      answer(body)
      const res = await post(h.fetch)
      assert.equal(await res.text(), body)
      const s = await settlement(h)
      assert.equal(s.used[0], s.reserved[0], 'input as reserved')
      assert.equal(s.used[1], 100, 'output: all of max_tokens')
      assert.equal(h.tw.metrics().liveLeases, 0)
      h.tw.close()
    })
  }
})

describe('upstream handling (issue 25, item 11)', () => {
  test('a redirect to another origin is handed back, not followed with the API key; nothing is charged', async () => {
    const h = setup()
    elsewhere.requests.length = 0
    elsewhere.handler = (req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"usage":{"input_tokens":1,"output_tokens":1}}')
    const body = '{"type":"error","error":{"type":"moved","message":"see elsewhere"}}'
    answer(body, { status: 307, headers: { location: `${elsewhere.url}/steal` } })
    const res = await post(h.fetch)
    assert.equal(res.status, 307)
    assert.equal(res.headers.get('location'), `${elsewhere.url}/steal`)
    assert.equal(await res.text(), body)
    assert.equal(elsewhere.requests.length, 0, 'the other origin got nothing (no x-api-key)')
    const s = await settlement(h)
    assert.deepEqual(s.used.slice(0, 3), [0, 0, 0], 'no tokens (the request counts)')
    assert.equal(h.tw.metrics().liveLeases, 0)
    h.tw.close()
  })

  test('a body that is not JSON on a model path is passed through unleased, and its redirect not followed either', async () => {
    const h = setup()
    elsewhere.requests.length = 0
    answer('moved', { status: 308, headers: { location: `${elsewhere.url}/steal` } })
    const res = await post(h.fetch, '/v1/messages', 'not json')
    assert.equal(res.status, 308)
    assert.equal(await res.text(), 'moved')
    assert.equal(elsewhere.requests.length, 0)
    h.tw.close()
  })

  test('a big JSON answer streams through as it arrives and settles from the usage at its end', async () => {
    const h = setup()
    const filler = 'w'.repeat(3 * 1024 * 1024)
    const head = `{"id":"msg_big","type":"message","content":[{"type":"text","text":"${filler}`
    const tail = '"}],"stop_reason":"end_turn","usage":{"input_tokens":321,"cache_read_input_tokens":5,"output_tokens":77}}'
    let release
    const released = new Promise((r) => (release = r))
    let ended = false
    upstream.handler = async (req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.write(head)
      // The rest only once the caller has the response (or, on code that buffers, after 3 s).
      await Promise.race([released, delay(3_000)])
      ended = true
      res.end(tail)
    }
    const res = await post(h.fetch)
    assert.equal(ended, false, 'the response reached the caller before the upstream body ended')
    assert.equal(h.settled.length, 0, 'not settled before the body ends')
    release()
    assert.equal(await res.text(), head + tail)
    const s = await settlement(h)
    assert.deepEqual(s.used.slice(0, 2), [321, 77])
    assert.equal(h.tw.metrics().liveLeases, 0)
    h.tw.close()
  })

  test('a 64 MiB JSON answer is not held in memory: the caller has it after about 1 MiB, usage found at its end', async () => {
    const h = setup()
    const piece = Buffer.alloc(64 * 1024, 'w')
    const head = Buffer.from('{"id":"msg_huge","type":"message","content":[{"type":"text","text":"')
    // Decoys near the end: a nested `usage` and one inside a string; the top-level one is last.
    const tail = Buffer.from(
      '"},{"type":"tool_use","id":"t","name":"n","input":{"usage":{"input_tokens":1,"output_tokens":1}}},' +
        '{"type":"text","text":"\\\"usage\\\":{\\\"input_tokens\\\":2,\\\"output_tokens\\\":2}"}],' +
        '"stop_reason":"end_turn","usage":{"input_tokens":321,"cache_read_input_tokens":5,"output_tokens":77},"stop_sequence":null}',
    )
    JSON.parse(`${head}${tail}`)
    const digest = createHash('sha256').update(head)
    upstream.handler = async (req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.write(head)
      for (let i = 0; i < 1024; i++) {
        if (!res.write(piece)) await new Promise((r) => res.once('drain', r))
      }
      res.end(tail)
    }
    for (let i = 0; i < 1024; i++) digest.update(piece)
    digest.update(tail)
    const heldBefore = process.memoryUsage()
    const res = await post(h.fetch)
    const heldAfter = process.memoryUsage()
    const grew = heldAfter.heapUsed + heldAfter.arrayBuffers - (heldBefore.heapUsed + heldBefore.arrayBuffers)
    assert.ok(grew < 32 * 1024 * 1024, `memory held when the caller got the response: +${(grew / 1048576).toFixed(1)} MiB`)
    const got = createHash('sha256')
    let length = 0
    for await (const chunk of res.body) {
      got.update(chunk)
      length += chunk.length
    }
    assert.equal(length, head.length + 64 * 1024 * 1024 + tail.length)
    assert.equal(got.digest('hex'), digest.digest('hex'), 'the body arrived byte for byte')
    assert.deepEqual((await settlement(h)).used.slice(0, 2), [321, 77])
    assert.equal(h.tw.metrics().liveLeases, 0)
    h.tw.close()
  })

  test('a big JSON answer whose reader cancels it is charged as interrupted', async () => {
    const h = setup()
    let release
    const released = new Promise((r) => (release = r))
    upstream.handler = async (req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      // Above the 1 MiB a JSON answer is read whole within: it streams through.
      res.write(`{"id":"m","content":[{"type":"text","text":"${'v'.repeat(1_500_000)}`)
      await Promise.race([released, delay(3_000)])
      res.end('"}],"usage":{"input_tokens":10,"output_tokens":7}}')
    }
    const res = await post(h.fetch)
    const reader = res.body.getReader()
    assert.equal((await reader.read()).done, false)
    await reader.cancel()
    release()
    const s = await settlement(h)
    assert.equal(s.used[1], 100, 'all of max_tokens')
    assert.equal(h.tw.metrics().liveLeases, 0)
    h.tw.close()
  })

  test('no response headers within timeouts.firstByteMs: upstream_timeout, the request aborted, the lease interrupted', async () => {
    const h = setup({ options: { timeouts: { firstByteMs: 200 } } })
    upstream.requests.length = 0
    upstream.handler = async (req, res) => {
      await delay(3_000)
      if (!res.destroyed) res.writeHead(200, { 'content-type': 'application/json' }).end('{"usage":{"input_tokens":1,"output_tokens":1}}')
    }
    await assert.rejects(post(h.fetch), (e) => e.code === 'upstream_timeout' && /no response headers in 200 ms/.test(e.message))
    const s = await settlement(h)
    assert.equal(s.used[1], 100)
    assert.equal(h.tw.metrics().liveLeases, 0)
    for (let i = 0; i < 100 && !upstream.requests[0]?.closed; i++) await delay(10)
    assert.equal(upstream.requests[0].closed, true, 'the upstream request was aborted')
    assert.equal(upstream.requests[0].finished, false)
    h.tw.close()
  })

  test('a body idle for timeouts.idleMs while read: upstream_timeout, the request aborted, interrupted from what was seen', async () => {
    const h = setup({ options: { timeouts: { idleMs: 200 } } })
    upstream.requests.length = 0
    const start = sse('message_start', { message: { id: 'm', usage: { input_tokens: 50, output_tokens: 1 } } }) + sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'q'.repeat(40) } })
    upstream.handler = async (req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(start)
      await delay(3_000)
      if (!res.destroyed) res.end(sse('message_delta', { usage: { output_tokens: 20 } }))
    }
    const res = await post(h.fetch, '/v1/messages', request({ stream: true }))
    // Not read for longer than idleMs: a caller that does not read is not an idle upstream.
    await delay(400)
    const reader = res.body.getReader()
    const decoder = new TextDecoder()
    let got = ''
    const failed = await (async () => {
      for (;;) {
        const chunk = await reader.read()
        if (chunk.done) return null
        got += decoder.decode(chunk.value, { stream: true })
      }
    })().catch((e) => e)
    assert.equal(got, start, 'what the upstream sent reached the caller')
    assert.ok(failed?.code === 'upstream_timeout' && /no more of the body in 200 ms/.test(failed.message), `the body failed with upstream_timeout: ${failed}`)
    const s = await settlement(h)
    assert.deepEqual(s.used.slice(0, 2), [50, 36], 'output: 40 characters / 2 + 16')
    assert.equal(h.tw.metrics().liveLeases, 0)
    for (let i = 0; i < 100 && !upstream.requests[0]?.closed; i++) await delay(10)
    assert.equal(upstream.requests[0].closed, true, 'the upstream request was aborted')
    h.tw.close()
  })

  test('a stream longer than the lease TTL keeps its slot while bytes flow: the next call waits for its end', async () => {
    // lease_ttl_ms 1000, one call at a time, a stream of 3 s.
    const h = setup({ pools: [{ ...POOL, max_concurrent: 1 }], config: { lease_ttl_ms: 1000 } })
    const other = h.tw.fetch({ agent: 'second' })
    upstream.requests.length = 0
    let streamEnded = null
    upstream.handler = async (req, res, r) => {
      if (upstream.requests.indexOf(r) > 0) {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"m2","content":[],"usage":{"input_tokens":10,"output_tokens":2}}')
        return
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse('message_start', { message: { id: 'm', usage: { input_tokens: 50, output_tokens: 1 } } }))
      for (let i = 0; i < 30; i++) {
        await delay(100)
        res.write(sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'abcd' } }))
      }
      res.write(sse('message_delta', { usage: { output_tokens: 60 } }))
      streamEnded = performance.now()
      res.end(sse('message_stop', {}))
    }
    const first = await post(h.fetch, '/v1/messages', request({ stream: true }))
    const firstText = first.text()
    await delay(500)
    const second = post(other)
    assert.match(await firstText, /message_stop/)
    assert.equal((await second).status, 200)
    assert.equal(upstream.requests.length, 2)
    assert.ok(streamEnded !== null && upstream.requests[1].at >= streamEnded, 'the second call was sent only after the stream ended')
    assert.deepEqual(h.expired, [], 'no lease was reaped')
    assert.deepEqual((await settlement(h, 2)).used.slice(0, 2), [10, 2])
    assert.deepEqual(h.settled[0].used.slice(0, 2), [50, 60], 'the stream settled from its usage')
    assert.equal(h.tw.metrics().liveLeases, 0)
    h.tw.close()
  })

  test('a non-streamed answer whose headers take longer than the lease TTL keeps its slot while the provider works', async () => {
    // lease_ttl_ms 1000, one call at a time, headers after 3 s.
    const h = setup({ pools: [{ ...POOL, max_concurrent: 1 }], config: { lease_ttl_ms: 1000 } })
    const other = h.tw.fetch({ agent: 'second' })
    upstream.requests.length = 0
    let firstAnswered = null
    upstream.handler = async (req, res, r) => {
      if (upstream.requests.indexOf(r) === 0) await delay(3_000)
      if (upstream.requests.indexOf(r) === 0) firstAnswered = performance.now()
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"m","content":[],"usage":{"input_tokens":10,"output_tokens":2}}')
    }
    const first = post(h.fetch)
    await delay(500)
    const second = post(other)
    assert.equal((await first).status, 200)
    assert.equal((await second).status, 200)
    assert.equal(upstream.requests.length, 2)
    assert.ok(firstAnswered !== null && upstream.requests[1].at >= firstAnswered, 'the second call was sent only after the first was answered')
    assert.deepEqual(h.expired, [], 'no lease was reaped')
    await settlement(h, 2)
    assert.equal(h.tw.metrics().liveLeases, 0)
    h.tw.close()
  })

  test('timeouts must be whole milliseconds (or Infinity): a clear error naming the field', () => {
    const tw = createTokenwarden({ config: { pools: [POOL] } })
    for (const bad of [{ idleMs: -1 }, { firstByteMs: 0 }, { firstByteMs: 1.5 }, { idleMs: '100' }, { idleMs: Number.NaN }]) {
      assert.throws(() => tw.fetch({ timeouts: bad }), (e) => e.code === 'invalid_argument' && e.field === `timeouts.${Object.keys(bad)[0]}`, JSON.stringify(bad))
    }
    assert.throws(() => tw.fetch({ timeouts: 5 }), (e) => e.code === 'invalid_argument' && e.field === 'timeouts')
    tw.fetch({ timeouts: { firstByteMs: Number.POSITIVE_INFINITY, idleMs: 1 } })
    tw.close()
  })
})
