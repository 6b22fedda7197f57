// The fetch wrapper's decisions, against a scripted `fetch` (no SDK, no network): what it
// leases, when it retries, how it settles, and its parsers.
import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { BytesPerTokenEstimator, promptBytes, proxiedCall, proxiedProvider, stopAnswer, stopStatus } from 'tokenwarden-driver'
import { pieces, readAnswer } from '../support/answer.mjs'
import { createTokenwarden, engines } from '../support/engine.mjs'

const encoder = new TextEncoder()
const anthropicOk = (usage = { input_tokens: 100, output_tokens: 20 }) =>
  new Response(JSON.stringify({ id: 'm', type: 'message', role: 'assistant', content: [], usage }), {
    status: 200,
    headers: { 'content-type': 'application/json' },
  })
const body = (extra = {}) => JSON.stringify({ model: 'm1', max_tokens: 100, messages: [{ role: 'user', content: 'x'.repeat(400) }], ...extra })

function harness(responses, pools = [{ name: 'm1', input_tokens_per_minute: 1_000_000, output_tokens_per_minute: 100_000, max_concurrent: 10 }]) {
  const tw = createTokenwarden({ config: { pools, backoff: { base_ms: 1, cap_ms: 5, max_attempts: 3, retry_after_jitter_ms: 1 } } })
  const sent = []
  const events = []
  for (const name of ['waiting', 'rate_limited', 'settled', 'granted']) tw.on(name, (e) => events.push({ name, ...e }))
  const fetch = tw.fetch({
    agent: 'tester',
    fetch: async (url, init) => {
      sent.push({ url: String(url), init })
      const next = responses.shift()
      if (next === undefined) throw new Error('no scripted response left')
      return typeof next === 'function' ? next() : next
    },
  })
  return { tw, fetch, sent, events }
}

const post = (fetch, path = 'https://api.example/v1/messages', b = body(), extra = {}) =>
  fetch(path, { method: 'POST', headers: { 'x-api-key': 'k', 'content-type': 'application/json' }, body: b, ...extra })

describe('fetch wrapper', () => {
  test('leases, forwards the body unchanged, settles from the JSON usage', async () => {
    const { tw, fetch, sent, events } = harness([anthropicOk({ input_tokens: 90, cache_read_input_tokens: 10, output_tokens: 7 })])
    const res = await post(fetch)
    assert.equal(res.status, 200)
    assert.equal((await res.json()).usage.output_tokens, 7)
    assert.equal(sent.length, 1)
    assert.equal(sent[0].init.body, body())
    const s = events.find((e) => e.name === 'settled').settlement
    assert.deepEqual(s.used.slice(0, 2), [90, 7])
    assert.equal(tw.metrics().liveLeases, 0)
    tw.close()
  })

  test("a look-alike of a model call's path is leased too (the provider's router reads it as one)", async () => {
    const paths = ['/v1/m%65ssages', '/V1/Messages', '/v1/messages;x', '/v1//messages/', '/v1/x/../messages', '/v1/m%2565ssages']
    const { tw, fetch, sent, events } = harness(paths.map(() => anthropicOk({ input_tokens: 90, output_tokens: 7 })))
    for (const p of paths) assert.equal((await post(fetch, `https://api.example${p}`)).status, 200, p)
    assert.equal(sent.length, paths.length)
    assert.equal(events.filter((e) => e.name === 'settled').length, paths.length, 'every one was leased and settled')
    tw.close()
  })

  test('requests that are not model calls pass through unleased', async () => {
    const { tw, fetch, events } = harness([new Response('{}'), new Response('{}')])
    await fetch('https://api.example/v1/models')
    await post(fetch, 'https://api.example/v1/messages/count_tokens')
    assert.equal(events.length, 0)
    tw.close()
  })

  test('a 429 is retried with backoff; x-should-retry: false is returned as is', async () => {
    const limited = (h = {}) => new Response('{"type":"error"}', { status: 429, headers: { 'retry-after': '0', ...h } })
    const first = harness([limited(), anthropicOk()])
    assert.equal((await post(first.fetch)).status, 200)
    assert.equal(first.events.filter((e) => e.name === 'waiting').length, 1)
    assert.match(first.events.find((e) => e.name === 'waiting').message, /^waiting on rate limit, retrying in/)
    first.tw.close()

    const second = harness([limited({ 'x-should-retry': 'false' })])
    const res = await post(second.fetch)
    assert.equal(res.status, 429)
    assert.equal(await res.text(), '{"type":"error"}')
    assert.equal(second.tw.metrics().liveLeases, 0)
    second.tw.close()
  })

  test('x-should-retry: true retries a 5xx; give-up hands the last 429 to the caller', async () => {
    const overloaded = () => new Response('{}', { status: 529, headers: { 'x-should-retry': 'true' } })
    const a = harness([overloaded, anthropicOk()])
    assert.equal((await post(a.fetch)).status, 200)
    a.tw.close()
    const limited = () => new Response('{"e":1}', { status: 429 })
    const b = harness([limited, limited, limited, limited])
    const res = await post(b.fetch)
    assert.equal(res.status, 429, 'after max_attempts the 429 reaches the caller')
    assert.equal(b.sent.length, 3)
    assert.equal(b.tw.metrics().liveLeases, 0)
    b.tw.close()
  })

  test('other errors are returned as they are and settle nothing', async () => {
    const { tw, fetch, events } = harness([new Response('{"error":"bad"}', { status: 400 })])
    const res = await post(fetch)
    assert.equal(res.status, 400)
    assert.deepEqual(events.find((e) => e.name === 'settled').settlement.used.slice(0, 2), [0, 0])
    tw.close()
  })

  test('an OpenAI stream without usage settles from the text it carried', async () => {
    const chunks = [
      `data: ${JSON.stringify({ choices: [{ delta: { content: 'hello world, '.repeat(10) } }] })}\n\n`,
      'data: [DONE]\n\n',
    ]
    const stream = () =>
      new Response(
        new ReadableStream({
          start(c) {
            for (const k of chunks) c.enqueue(encoder.encode(k))
            c.close()
          },
        }),
        { headers: { 'content-type': 'text/event-stream' } },
      )
    const { tw, fetch, events } = harness([stream], [{ name: 'gpt', counting: 'openai', tokens_per_minute: 1_000_000 }])
    const res = await post(fetch, 'https://api.example/v1/chat/completions', JSON.stringify({ model: 'gpt', stream: true, max_tokens: 500, messages: [{ role: 'user', content: 'hi' }] }))
    assert.equal(events.filter((e) => e.name === 'settled').length, 0, 'not settled before the stream is read')
    const text = await res.text()
    assert.ok(text.includes('[DONE]'))
    const used = events.find((e) => e.name === 'settled').settlement.used
    assert.ok(used[1] >= 60 && used[1] < 500, `output from 130 bytes of text: ${used[1]}`)
    tw.close()
  })

  test('a network error settles the whole reservation and rethrows', async () => {
    const { tw, fetch, events } = harness([() => Promise.reject(new TypeError('fetch failed'))])
    await assert.rejects(post(fetch), /fetch failed/)
    assert.equal(events.find((e) => e.name === 'settled').settlement.used[1], 100)
    tw.close()
  })

  test('a model with no pool is a clear 400 in the provider format when there are several pools (thrown with errorResponses: false)', async () => {
    const pools = [{ name: 'a', requests_per_minute: 10 }, { name: 'b', requests_per_minute: 10 }]
    const { tw, fetch, sent } = harness([], pools)
    const res = await post(fetch)
    assert.equal(res.status, 400)
    const b = await res.json()
    assert.equal(b.type, 'error')
    assert.equal(b.error.type, 'invalid_request_error')
    assert.match(b.error.message, /^tokenwarden: no pool for model "m1".*a, b/)
    assert.equal(b.tokenwarden.error, 'unknown_pool')
    assert.equal(sent.length, 0, 'nothing was sent')
    const throwing = tw.fetch({ agent: 'strict', errorResponses: false, fetch: async () => anthropicOk() })
    await assert.rejects(post(throwing), (e) => e.code === 'unknown_pool' && /"m1"/.test(e.message) && /a, b/.test(e.message))
    tw.close()
  })

  test("a call that can never fit is the provider's 400 (OpenAI's format for an OpenAI call)", async () => {
    // 4,000 bytes of prompt is well above a 1,000-token input limit, which the provider
    // refuses too; an OpenAI pool pre-charges max(max_tokens, input) against its TPM.
    const pools = [
      { name: 'm1', input_tokens_per_minute: 1_000, output_tokens_per_minute: 1_000, max_concurrent: 10 },
      { name: 'gpt', counting: 'openai', tokens_per_minute: 10_000, max_concurrent: 10 },
    ]
    const { tw, fetch, sent } = harness([], pools)
    const never = await post(fetch, 'https://api.example/v1/messages', body({ messages: [{ role: 'user', content: 'x '.repeat(2_000) }] }))
    assert.equal(never.status, 400)
    assert.equal(never.headers.get('x-should-retry'), 'false')
    const b = await never.json()
    assert.equal(b.error.type, 'invalid_request_error')
    assert.match(b.error.message, /^tokenwarden: lease rejected: .*can never be served as asked/)
    assert.deepEqual(b.tokenwarden.reason, { kind: 'exceeds_capacity', axis: 'input_tokens' })
    const o = await fetch('https://api.example/v1/chat/completions', { method: 'POST', headers: { authorization: 'Bearer k', 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt', max_tokens: 50_000, messages: [{ role: 'user', content: 'hi' }] }) })
    assert.equal(o.status, 400)
    const ob = await o.json()
    assert.equal(ob.error.code, 'rejected')
    assert.equal(ob.error.type, 'invalid_request_error')
    assert.deepEqual(ob.tokenwarden.reason, { kind: 'exceeds_capacity', axis: 'tokens' })
    assert.equal(sent.length, 0)
    tw.close()
  })

  test('a call after close() is a 503 the SDK does not retry', async () => {
    const { tw, fetch, sent } = harness([anthropicOk({ input_tokens: 10, output_tokens: 10 })])
    tw.close()
    const res = await post(fetch, 'https://api.example/v1/messages', body({}))
    assert.equal(res.status, 503)
    assert.equal(res.headers.get('x-should-retry'), 'false')
    assert.equal(res.headers.get('retry-after'), null)
    const b = await res.json()
    assert.equal(b.error.type, 'api_error')
    assert.equal(b.tokenwarden.error, 'closed')
    assert.equal(sent.length, 0)
  })

  test('max_tokens above the output limit is served under Anthropic counting (Claude Code sends 128000)', async () => {
    const { tw, fetch, sent } = harness(
      [anthropicOk({ input_tokens: 100, output_tokens: 300 }), anthropicOk({ input_tokens: 100, output_tokens: 200 })],
      [{ name: 'm1', input_tokens_per_minute: 100_000, output_tokens_per_minute: 8_000, max_concurrent: 10 }],
    )
    const settled = []
    tw.on('settled', (e) => settled.push(e))
    for (let i = 0; i < 2; i++) {
      const r = await post(fetch, 'https://api.example/v1/messages?beta=true', body({ max_tokens: 128_000 }))
      assert.equal(r.status, 200)
      await r.json()
    }
    assert.equal(sent.length, 2, 'both forwarded')
    const m = tw.metrics()
    assert.equal(m.pools[0].counters.settled, 2)
    assert.equal(m.pools[0].counters.rejected, 0)
    tw.close()
  })
})

describe('parsers and the estimator', () => {
  // The provider crate's usage readers, through the engine's exchange (`engine.exchange`).
  const engine = engines.create({ pools: [{ name: 'm1', input_tokens_per_minute: 1_000 }] }, 1, 0)
  const readStream = (api, text, step = text.length) => readAnswer(engine, api, true, pieces(encoder.encode(text), step))
  const readBody = (api, json) => readAnswer(engine, api, false, [typeof json === 'string' ? json : JSON.stringify(json)]).usage
  const MAX = Number.MAX_SAFE_INTEGER

  test('SSE usage: Anthropic message_start then message_delta, across chunk boundaries', () => {
    const text =
      'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":12,"cache_read_input_tokens":30,"output_tokens":1}}}\n\n' +
      'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"abcd"}}\n\n' +
      'event: message_delta\r\ndata: {"type":"message_delta","usage":{"output_tokens":42}}\r\n\r\n' +
      'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    assert.deepEqual(readStream('anthropic_messages', text, 7).usage, { inputTokens: 12, cacheCreationInputTokens: 0, cacheReadInputTokens: 30, outputTokens: 42 })
    // Cut short after the text: what it showed, its output half the text's characters.
    const cut = text.slice(0, text.indexOf('event: message_delta'))
    const r = readStream('anthropic_messages', cut, 5)
    assert.equal(r.usage, null)
    assert.deepEqual(r.seen, { inputTokens: 12, cacheCreationInputTokens: 0, cacheReadInputTokens: 30, outputTokens: 2 })
  })

  test('OpenAI usage separates cached prompt tokens', () => {
    assert.deepEqual(readBody('openai_chat', { usage: { prompt_tokens: 100, completion_tokens: 5, prompt_tokens_details: { cached_tokens: 60 } } }), {
      inputTokens: 40,
      cacheCreationInputTokens: 0,
      cacheReadInputTokens: 60,
      outputTokens: 5,
    })
    assert.equal(readBody('openai_chat', { nothing: 1 }), null)
    assert.equal(readBody('openai_chat', 'not json'), null)
    assert.throws(() => engine.exchange('gemini', 0, 0, engine.exchangeTimeouts()), (e) => e.code === 'invalid_argument' && e.field === 'api')
  })

  test('usage counts: absurd figures clamped to 2^53 - 1; strings, negatives and non-finite are missing usage, not 0', () => {
    const absurd = readAnswer(engine, 'anthropic_messages', false, ['{"usage":{"input_tokens":1e300,"output_tokens":18446744073709551616}}'])
    assert.deepEqual(absurd.usage, {
      inputTokens: MAX,
      cacheCreationInputTokens: 0,
      cacheReadInputTokens: 0,
      outputTokens: MAX,
    })
    assert.equal(absurd.learn, false, 'settled with, not learned from')
    assert.equal(readAnswer(engine, 'anthropic_messages', false, ['{"usage":{"input_tokens":5,"output_tokens":1}}']).learn, true)
    assert.deepEqual(readBody('openai_chat', { usage: { prompt_tokens: 1e18, completion_tokens: 3 } }), { inputTokens: MAX, cacheCreationInputTokens: 0, cacheReadInputTokens: 0, outputTokens: 3 })
    for (const usage of [
      { input_tokens: '5', output_tokens: 1 },
      { input_tokens: 5, output_tokens: -1 },
      { input_tokens: 5 },
      { input_tokens: 5, output_tokens: 1, cache_creation_input_tokens: '2' },
    ]) {
      assert.equal(readBody('anthropic_messages', { usage }), null, JSON.stringify(usage))
    }
    // JSON has no Infinity: a body that writes one is not JSON, so no usage.
    assert.equal(readBody('anthropic_messages', '{"usage":{"input_tokens":5,"output_tokens":Infinity}}'), null)
    assert.equal(readBody('openai_chat', { usage: { prompt_tokens: 5, completion_tokens: 1, prompt_tokens_details: { cached_tokens: -1 } } }), null)
    assert.equal(readBody('openai_chat', { usage: { prompt_tokens: 5, completion_tokens: 1, prompt_tokens_details: 'x' } }), null)
    // Absent or null optional counts are 0.
    assert.deepEqual(readBody('anthropic_messages', { usage: { input_tokens: 5, output_tokens: 1, cache_read_input_tokens: null } }), {
      inputTokens: 5,
      cacheCreationInputTokens: 0,
      cacheReadInputTokens: 0,
      outputTokens: 1,
    })
  })

  test('SSE usage is complete only with its final report and no error event', () => {
    const start = 'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":1}}}\n\n'
    const delta = 'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":42}}\n\n'
    const error = 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    const complete = (api, text) => readStream(api, text).usage !== null
    assert.equal(complete('anthropic_messages', start), false)
    assert.equal(complete('anthropic_messages', start + delta), true)
    assert.equal(complete('anthropic_messages', start + delta + error), false)
    assert.equal(complete('anthropic_messages', start + error), false)
    // A delta without any input count (message_start's was malformed) is not final either.
    const badStart = 'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":"12"}}}\n\n'
    assert.equal(complete('anthropic_messages', badStart + delta), false)
    assert.equal(complete('openai_chat', 'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\ndata: [DONE]\n\n'), true)
    assert.equal(complete('openai_chat', 'data: {"choices":[],"usage":{"prompt_tokens":"3","completion_tokens":4}}\n\ndata: [DONE]\n\n'), false)
    assert.equal(complete('openai_chat', 'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\ndata: [DONE]\n\n'), false)
  })

  test('SSE usage holds no line above 1 MiB: it is skipped and counted as text', () => {
    const huge = `data: ${'x'.repeat(3 * 1024 * 1024)}`
    const chunks = pieces(encoder.encode(huge), 65_536)
    chunks.push('\n\nevent: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":1}}}\n\n')
    const { seen } = readAnswer(engine, 'anthropic_messages', true, chunks, { end: false })
    assert.ok(seen.outputTokens >= (3 * 1024 * 1024) / 2, `counted as text: ${seen.outputTokens} tokens`)
    assert.equal(seen.inputTokens, 12, 'the next event is read')
  })

  test("a stopped call's status and retry advice are the provider crate's (stopAnswer)", () => {
    assert.deepEqual(stopStatus('refused', 2_001), { status: 429, headers: { 'retry-after': '3', 'x-should-retry': 'true' } })
    assert.equal(stopStatus('refused', 0).headers['retry-after'], '1', 'at least a second')
    assert.deepEqual(stopStatus('refused', null), { status: 400, headers: { 'x-should-retry': 'false' } })
    assert.deepEqual(stopStatus('gave_up', null), { status: 429, headers: { 'x-should-retry': 'false' } })
    assert.deepEqual(stopStatus('unknown_pool', null), { status: 400, headers: { 'x-should-retry': 'false' } })
    assert.deepEqual(stopStatus('closed', null), { status: 503, headers: { 'x-should-retry': 'false' } })
    assert.deepEqual(stopStatus('restarting', null), { status: 503, headers: { 'x-should-retry': 'true' } })
    // The provider's own failures: no advice, the SDK's rule by status.
    assert.deepEqual(stopStatus('unreachable', null), { status: 502, headers: {} })
    assert.deepEqual(stopStatus('timed_out', null), { status: 504, headers: {} })
    const a = stopAnswer('openai', 'refused', 1_500, 'tokenwarden: come back later', { error: 'rejected', message: 'come back later' })
    assert.equal(a.status, 429)
    assert.equal(a.body.error.type, 'rate_limit_error')
    assert.equal(a.body.error.code, 'rejected')
    assert.throws(() => stopStatus('later', null), (e) => e.code === 'invalid_argument' && e.field === 'stop')
  })

  test("the proxy's first step is the gateway crate's (proxiedCall): what is sent, what names the call, what is refused", () => {
    const secret = 'Fleet-Secret-0123456789'
    const headers = new Headers({ 'x-api-key': 'sk-1', cookie: 'a=1', 'x-tokenwarden-token': secret, 'x-app': 'cli', 'x-tokenwarden-unblocks': '2' })
    const read = proxiedCall('/agent/al%C3%AFce/role/planner/v1/messages', `?beta=true&key=${secret.toUpperCase()}`, headers, [secret, undefined])
    assert.deepEqual(read, {
      call: { provider: 'anthropic', path: '/v1/messages', query: '?beta=true', headers: [['x-api-key', 'sk-1'], ['x-app', 'cli']], name: 'alïce', family: null, role: 'planner', task: null, unblocks: 2, failureSignature: null },
    })
    // Who the call is: a Claude Code subagent under a named agent is its child, in its family;
    // with nothing naming it, `proxy`.
    const sub = [['x-claude-code-session-id', 's1'], ['x-claude-code-agent-id', 'a7']]
    assert.deepEqual(((c) => [c.name, c.family])(proxiedCall('/agent/alice/v1/messages', '', sub, []).call), ['alice/a7', 'alice'])
    assert.deepEqual(((c) => [c.name, c.family])(proxiedCall('/v1/messages', '', [], []).call), ['proxy', null])
    assert.deepEqual(proxiedCall('/v1/messages', '', [['x-tokenwarden-agent', 'bob']], [secret], 'alice'), {
      refused: { status: 403, error: 'forbidden', message: "this credential is alice's: x-tokenwarden-agent may only name that agent" },
    })
    assert.deepEqual(proxiedCall('/v1/chat/completions', '', [['x-tokenwarden-role', 'boss']], [secret]).refused, {
      status: 400,
      error: 'invalid_argument',
      message: '`x-tokenwarden-role` must be planner, reviewer, worker or auto',
      field: 'x-tokenwarden-role',
    })
    assert.equal(proxiedCall('/agent/a/messages', '', [], []).refused.status, 404)
    assert.equal(proxiedProvider('/v1/chat/completions', false), 'openai')
    assert.equal(proxiedProvider('/agent/%zz/v1/messages', true), null)
  })

  test('the cached prefix ends at the last cache_control block (Anthropic only)', () => {
    const b = {
      system: [{ type: 'text', text: 'S'.repeat(1000), cache_control: { type: 'ephemeral' } }],
      messages: [{ role: 'user', content: 'q'.repeat(200) }],
    }
    assert.deepEqual(promptBytes('anthropic', b), { prefix: 1000, rest: 208 })
    assert.deepEqual(promptBytes('openai', b), { prefix: 0, rest: 1208 })
  })

  test('the estimator starts high and learns bytes per token from settled usage', () => {
    const e = new BytesPerTokenEstimator()
    const b = { messages: [{ role: 'user', content: 'w'.repeat(3992) }] }
    const first = e.estimate({ provider: 'anthropic', model: 'm', body: b })
    assert.ok(first.inputTokens > 1000, `over-estimate before learning: ${first.inputTokens}`)
    for (let i = 0; i < 20; i++) e.observe({ provider: 'anthropic', model: 'm', body: b, estimate: first, actualInputTokens: 1000 })
    const later = e.estimate({ provider: 'anthropic', model: 'm', body: b })
    assert.ok(later.inputTokens >= 1000 && later.inputTokens <= 1060, `learned: ${later.inputTokens}`)
    assert.throws(() => new BytesPerTokenEstimator({ initialBytesPerToken: 0 }), RangeError)
  })
})
