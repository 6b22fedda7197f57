// The OpenAI Responses API (`POST /v1/responses`) through the fetch wrapper: detection,
// request shape and usage parsing (JSON and SSE: response.completed, response.incomplete,
// response.failed, cached and reasoning tokens), and the official OpenAI SDK's
// `responses.create` and `responses.stream` against the mock provider — each call leased,
// settled with exactly what the provider reported (or by the interrupted rule when the
// stream is cut short), and a refusal raised by the SDK as its API error with tokenwarden's
// reason. The openai SDK runs on Node >= 20; the test script runs this suite on Node 24.
import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import OpenAI from 'openai'
import { callShape } from 'tokenwarden-driver'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { pieces, readAnswer } from '../support/answer.mjs'
import { createTokenwarden, engines } from '../support/engine.mjs'

const KEY = 'sk-test-SECRET-responses'
const enc = new TextEncoder()

/** A stream of Responses events as the API sends them (`event:` and `data:` lines). */
function sse(events) {
  return events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join('')
}

const usage = { input_tokens: 120, input_tokens_details: { cached_tokens: 100 }, output_tokens: 30, output_tokens_details: { reasoning_tokens: 12 }, total_tokens: 150 }
const response = (status, u) => ({ id: 'resp_1', object: 'response', status, output: [], usage: u })

describe('Responses API: detection, shape and usage', () => {
  test('POST …/responses is an OpenAI model call whatever the query string; its other routes pass through', () => {
    const engine = engines.create({ pools: [{ name: 'gpt-5', counting: 'openai', tokens_per_minute: 100_000 }] }, 1, 0)
    const call = (s, method = 'POST') => engine.modelCall(method, new URL(s).pathname)
    assert.equal(call('https://api.openai.com/v1/responses'), 'openai_responses')
    assert.equal(call('https://api.openai.com/v1/responses?api-version=2025-04-01', 'post'), 'openai_responses')
    assert.equal(call('http://127.0.0.1:8787/v1/fleets/f/quotas/q/agents/a/worker/openai/responses/'), 'openai_responses')
    assert.equal(call('https://api.openai.com/v1/chat/completions'), 'openai_chat')
    assert.equal(call('https://api.openai.com/v1/responses/resp_1', 'GET'), null)
    assert.equal(call('https://api.openai.com/v1/responses/resp_1', 'DELETE'), null)
    assert.equal(call('https://api.openai.com/v1/responses/resp_1/input_items', 'GET'), null)
    assert.equal(call('https://api.openai.com/v1/responses/resp_1/cancel'), null)
    assert.equal(call('https://api.openai.com/v1/responses/input_tokens'), null)
    assert.equal(call('https://api.openai.com/v1/responses', 'GET'), null)
    assert.throws(() => engine.modelCall('POST', null), (e) => e.code === 'invalid_argument' && e.field === 'target')
  })

  test('max_output_tokens is the output reservation; stream and model are read', () => {
    assert.deepEqual(callShape('openai', { model: 'gpt-5', input: 'hi', max_output_tokens: 333, stream: true }), { model: 'gpt-5', maxTokens: 333, stream: true })
    assert.equal(callShape('openai', { model: 'gpt-5', input: 'hi' }).maxTokens, 4096, 'none given: the default reservation')
    assert.equal(callShape('openai', { model: 'gpt-5', input: 'hi', max_output_tokens: -1 }).maxTokens, 4096, 'malformed: the default')
  })

  // The provider crate's usage readers, through the engine's exchange (`engine.exchange`).
  const engine = engines.create({ pools: [{ name: 'gpt-5', counting: 'openai', tokens_per_minute: 100_000 }] }, 1, 0)
  const readBody = (json) => readAnswer(engine, 'openai_responses', false, [JSON.stringify(json)]).usage
  const usageOf = (input, read, output) => ({ inputTokens: input, cacheCreationInputTokens: 0, cacheReadInputTokens: read, outputTokens: output })

  test("a response object's usage: cached tokens taken out of the input, reasoning part of the output", () => {
    assert.deepEqual(readBody(response('completed', usage)), usageOf(20, 100, 30))
    assert.deepEqual(readBody(response('completed', { input_tokens: 7, output_tokens: 2 })), usageOf(7, 0, 2))
    // Malformed: missing, never 0.
    assert.equal(readBody(response('completed', { input_tokens: 7 })), null)
    assert.equal(readBody(response('completed', { input_tokens: '7', output_tokens: 2 })), null)
    assert.equal(readBody(response('completed', { input_tokens: 7, output_tokens: 2, input_tokens_details: 'x' })), null)
    assert.equal(readBody(response('in_progress', null)), null)
  })

  const events = (terminal, u) => [
    { type: 'response.created', sequence_number: 0, response: response('in_progress', null) },
    { type: 'response.in_progress', sequence_number: 1, response: response('in_progress', null) },
    { type: 'response.output_item.added', sequence_number: 2, output_index: 0, item: { id: 'msg_1', type: 'message', role: 'assistant', status: 'in_progress', content: [] } },
    { type: 'response.content_part.added', sequence_number: 3, item_id: 'msg_1', output_index: 0, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } },
    { type: 'response.output_text.delta', sequence_number: 4, item_id: 'msg_1', output_index: 0, content_index: 0, delta: 'hello there' },
    { type: 'response.output_text.done', sequence_number: 5, item_id: 'msg_1', output_index: 0, content_index: 0, text: 'hello there' },
    ...(terminal === null ? [] : [{ type: terminal, sequence_number: 6, response: response(terminal.slice('response.'.length), u) }]),
  ]
  const track = (text, split = 7) => readAnswer(engine, 'openai_responses', true, pieces(enc.encode(text), split))
  // 'hello there' is 11 characters: 6 tokens at two a token.
  const helloThere = Math.ceil('hello there'.length / 2)

  test('SSE: response.completed and response.incomplete carry the final usage', () => {
    for (const terminal of ['response.completed', 'response.incomplete']) {
      const t = track(sse(events(terminal, usage)))
      assert.deepEqual(t.usage, usageOf(20, 100, 30), terminal)
    }
  })

  test('SSE: a stream that ends without a terminal event, an error event, or response.failed without usage is not complete', () => {
    const cut = track(sse(events(null)))
    assert.equal(cut.usage, null)
    assert.deepEqual(cut.seen, usageOf(0, 0, helloThere), 'what was seen counts for the interrupted charge')
    const errored = track(sse([...events('response.completed', usage), { type: 'error', sequence_number: 7, code: 'server_error', message: 'boom', param: null }]))
    assert.equal(errored.usage, null)
    assert.deepEqual(errored.seen, usageOf(20, 100, 30), 'the usage it reported before the error is what it showed')
    const failed = track(sse(events('response.failed', null)))
    assert.equal(failed.usage, null)
    // A failed response that says what it used is settled with that.
    const failedWithUsage = track(sse(events('response.failed', { input_tokens: 50, output_tokens: 3 })))
    assert.deepEqual(failedWithUsage.usage, usageOf(50, 0, 3))
    // Malformed usage on the terminal event: missing, never 0.
    const malformed = track(sse(events('response.completed', { input_tokens: -1, output_tokens: 3 })))
    assert.equal(malformed.usage, null)
  })
})

describe('the OpenAI SDK’s Responses API through tw.fetch() against the mock provider', () => {
  let mock
  before(async () => {
    mock = await startMockProvider({ tokensPerMinute: 200_000, requestsPerMinute: 600, concurrency: 8, replyTokens: 40, chunkDelayMs: 2 })
  })
  after(() => mock.close())

  const pool = (counting) => ({ config: { pools: [{ name: 'gpt-5', counting, tokens_per_minute: 200_000, requests_per_minute: 600, max_concurrent: 8 }] } })
  const input = 'Summarise the change in one line. '.repeat(40)

  /** A client on a fresh coordinator, with every settlement recorded. */
  function setup(counting, extraHeaders = {}, options = {}) {
    const tw = createTokenwarden(pool(counting))
    const settled = []
    tw.on('settled', (e) => settled.push(e.settlement))
    const client = new OpenAI({ apiKey: KEY, baseURL: `${mock.url}/v1`, fetch: tw.fetch({ agent: 'codex-like', ...options }), maxRetries: 0, defaultHeaders: extraHeaders })
    return { tw, settled, client }
  }
  const used = (s) => s.used.map(Number)
  const reserved = (s) => s.reserved.map(Number)

  test('responses.create (JSON): leased with max_output_tokens reserved, settled with exactly the reported usage', async () => {
    mock.reset()
    const { tw, settled, client } = setup('openai', { 'x-mock-cached-tokens': '50', 'x-mock-reasoning-tokens': '8' })
    const r = await client.responses.create({ model: 'gpt-5', instructions: 'Be brief.', input, max_output_tokens: 300 })
    assert.equal(r.status, 'completed')
    assert.equal(r.output_text.split(' ').length, 40)
    assert.deepEqual(r.usage.input_tokens_details, { cached_tokens: 50 })
    assert.equal(r.usage.output_tokens, 48, '40 words and 8 reasoning tokens')
    assert.equal(settled.length, 1, 'settled by the time the SDK had the answer')
    const [entry] = mock.log
    assert.equal(entry.path, '/v1/responses')
    assert.equal(reserved(settled[0])[1], 300, 'max_output_tokens reserved as output')
    // OpenAI counting: cached tokens still count against the input and tokens limits.
    assert.deepEqual(used(settled[0]), [entry.inputTokens, 48, entry.inputTokens + 48, 1])
    assert.notEqual(reserved(settled[0])[0], entry.inputTokens, 'the estimate differs from the count, so a settle from the usage is told apart from the interrupted rule')
    assert.equal(tw.metrics().liveLeases, 0)
    tw.close()
  })

  test('cached tokens are reported apart: under Anthropic counting the cache reads leave the input axis', async () => {
    mock.reset()
    const { tw, settled, client } = setup('anthropic', { 'x-mock-cached-tokens': '60' })
    const r = await client.responses.create({ model: 'gpt-5', input, max_output_tokens: 100 })
    assert.equal(r.usage.input_tokens_details.cached_tokens, 60)
    assert.equal(used(settled[0])[0], r.usage.input_tokens - 60, 'input_tokens − cached_tokens as uncached input')
    assert.equal(used(settled[0])[1], 40)
    tw.close()
  })

  test('responses.stream (SSE): the stream passes through whole and settles from response.completed', async () => {
    mock.reset()
    const { tw, settled, client } = setup('openai', { 'x-mock-reasoning-tokens': '5' })
    const stream = client.responses.stream({ model: 'gpt-5', input, max_output_tokens: 200 })
    const types = []
    let text = ''
    stream.on('event', (e) => types.push(e.type))
    stream.on('response.output_text.delta', (e) => {
      text += e.delta
    })
    const final = await stream.finalResponse()
    assert.equal(final.status, 'completed')
    assert.equal(text, final.output_text)
    assert.deepEqual(
      [...new Set(types)],
      ['response.created', 'response.in_progress', 'response.output_item.added', 'response.output_item.done', 'response.content_part.added', 'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.completed'],
    )
    assert.equal(settled.length, 1)
    const [entry] = mock.log
    assert.equal(entry.stream, true)
    assert.deepEqual(used(settled[0]), [entry.inputTokens, 45, entry.inputTokens + 45, 1], 'reasoning tokens are part of the output')
    assert.equal(reserved(settled[0])[1], 200)
    assert.equal(tw.metrics().liveLeases, 0)
    tw.close()
  })

  test('max_output_tokens reached: response.incomplete is a full report, settled with its usage (streamed and not)', async () => {
    mock.reset()
    const { tw, settled, client } = setup('openai')
    const json = await client.responses.create({ model: 'gpt-5', input, max_output_tokens: 16 })
    assert.equal(json.status, 'incomplete')
    assert.deepEqual(json.incomplete_details, { reason: 'max_output_tokens' })
    const streamed = await client.responses.stream({ model: 'gpt-5', input, max_output_tokens: 16 }).finalResponse()
    assert.equal(streamed.status, 'incomplete')
    assert.equal(settled.length, 2)
    for (const [i, s] of settled.entries()) {
      assert.deepEqual(used(s), [mock.log[i].inputTokens, 16, mock.log[i].inputTokens + 16, 1])
    }
    tw.close()
  })

  test('a stream cut before response.completed is charged by the interrupted rule (input as reserved)', async () => {
    mock.reset()
    // What reaches the wrapper: the provider's stream, ended just before its terminal event.
    const cutting = async (url, init) => {
      const res = await fetch(url, init)
      const text = await res.text()
      const cut = text.slice(0, text.indexOf('event: response.completed'))
      return new Response(cut, { status: res.status, headers: res.headers })
    }
    const { tw, settled, client } = setup('openai', {}, { fetch: cutting })
    const stream = client.responses.stream({ model: 'gpt-5', input, max_output_tokens: 200 })
    await stream.done().catch(() => {})
    assert.equal(settled.length, 1)
    const s = settled[0]
    assert.equal(used(s)[0], reserved(s)[0], 'input charged as reserved: no usage report arrived')
    assert.notEqual(used(s)[0], mock.log[0].inputTokens)
    assert.ok(used(s)[1] > 0 && used(s)[1] <= 200, `output counted from the text seen: ${used(s)[1]}`)
    assert.equal(tw.metrics().liveLeases, 0)
    tw.close()
  })

  test("a refusal is an OpenAI-format error: the SDK raises its APIError with tokenwarden's reason", async () => {
    mock.reset()
    const { tw, client } = setup('openai')
    // More than the pool allows in a window: it can never be served as asked.
    for (const stream of [false, true]) {
      const err = await (stream
        ? client.responses.stream({ model: 'gpt-5', input: 'hi', max_output_tokens: 250_000 }).finalResponse()
        : client.responses.create({ model: 'gpt-5', input: 'hi', max_output_tokens: 250_000 })
      ).then(
        () => null,
        (e) => e,
      )
      assert.ok(err instanceof OpenAI.APIError, `an APIError (stream: ${stream}): ${err}`)
      assert.equal(err.status, 400)
      assert.ok(err instanceof OpenAI.BadRequestError, `a BadRequestError: ${err.constructor.name}`)
      assert.match(err.message, /tokenwarden: lease rejected/)
      assert.doesNotMatch(err.message, /Connection error/)
      assert.equal(err.code, 'rejected')
      assert.equal(err.type, 'invalid_request_error')
    }
    assert.equal(mock.log.length, 0, 'nothing reached the provider')
    tw.close()
  })

  test('the Responses API’s other routes pass through unleased, query string kept', async () => {
    mock.reset()
    const seen = []
    const spy = async (url, init) => {
      seen.push(`${init?.method ?? 'GET'} ${new URL(url).pathname}${new URL(url).search}`)
      return fetch(url, init)
    }
    const { tw, settled, client } = setup('openai', {}, { fetch: spy })
    await assert.rejects(client.responses.retrieve('resp_123'), (e) => e.status === 404)
    await assert.rejects(client.responses.cancel('resp_123'), (e) => e.status === 404)
    const r = await client.responses.create({ model: 'gpt-5', input: 'hi', max_output_tokens: 50 }, { query: { trace: 'on' } })
    assert.equal(r.status, 'completed')
    assert.deepEqual(seen, ['GET /v1/responses/resp_123', 'POST /v1/responses/resp_123/cancel', 'POST /v1/responses?trace=on'])
    assert.equal(settled.length, 1, 'only the model call was leased')
    assert.equal(Number(tw.metrics().pools[0].counters.grantedNow), 1)
    tw.close()
  })
})
