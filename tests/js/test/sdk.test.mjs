// The official SDKs (@anthropic-ai/sdk, openai) running fleets of agents through the fetch
// wrapper against the mock provider: no 429 reaches agent code, every call is settled, and
// the provider never lets more through than its limits. The current Anthropic SDK needs
// Node >= 22; on older Node this suite is skipped (the test script runs it on Node 24).
import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { createTokenwarden } from '../support/engine.mjs'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'

const major = Number(process.versions.node.split('.')[0])
const skip = major < 22 ? `the current @anthropic-ai/sdk needs Node >= 22 (this is ${process.version})` : false
const KEY = 'sk-test-SECRET-0123456789'

const Anthropic = skip ? null : (await import('@anthropic-ai/sdk')).default
const OpenAI = skip ? null : (await import('openai')).default

/** Everything a fleet run emitted, to check that no key leaks and to count waits. */
function record(tw) {
  const events = []
  for (const name of ['granted', 'queued', 'rejected', 'waiting', 'rate_limited', 'settled', 'expired', 'margin_changed', 'paused', 'estimate_alert']) {
    tw.on(name, (e) => events.push({ name, ...e }))
  }
  return events
}

const prompt = (agent, turn, bytes) => `agent ${agent} turn ${turn}: ${'lorem ipsum dolor sit amet '.repeat(Math.ceil(bytes / 27)).slice(0, bytes)}`

function assertClean(tw, mock, events, errors, calls) {
  assert.deepEqual(errors.map(String), [], 'no error reached agent code')
  const m = tw.metrics()
  assert.equal(m.liveLeases, 0, 'every lease ended')
  const c = m.pools.reduce(
    (acc, p) => ({ settled: acc.settled + Number(p.counters.settled), expired: acc.expired + Number(p.counters.expired) }),
    { settled: 0, expired: 0 },
  )
  const retries = events.filter((e) => e.name === 'waiting' && e.cause === 'rate_limited').length
  assert.equal(c.settled, calls + retries, 'every lease settled (calls plus 429-retried attempts)')
  assert.equal(c.expired, 0, 'none expired')
  const stats = mock.stats()
  assert.equal(stats.overLimit, false, `the provider stayed within its limits: ${JSON.stringify(stats.minLevel)}, peak ${stats.peakInFlight}`)
  assert.equal(stats.completed, calls, 'the provider completed every call')
  const text = JSON.stringify(events) + errors.map((e) => `${e.message} ${e.stack}`).join('')
  assert.ok(!text.includes(KEY) && !text.includes('SECRET'), 'the API key never appears in events or errors')
  return stats
}

describe('official SDKs through tw.fetch() against the mock provider', { skip }, () => {
  let mock
  before(async () => {
    mock = await startMockProvider({
      inputTokensPerMinute: 60_000,
      outputTokensPerMinute: 20_000,
      requestsPerMinute: 600,
      concurrency: 8,
      replyTokens: 40,
      chunkDelayMs: 4,
    })
  })
  after(() => mock.close())

  const config = (model) => ({
    pools: [
      { name: model, input_tokens_per_minute: 60_000, output_tokens_per_minute: 20_000, requests_per_minute: 600, max_concurrent: 8 },
    ],
  })

  test('24 Anthropic agents, streaming and not: no 429 reaches them, all settled, limits held', async () => {
    mock.reset()
    const tw = createTokenwarden({ config: config('claude-sonnet-4-6') })
    const events = record(tw)
    const errors = []
    let calls = 0
    const agent = async (i) => {
      const client = new Anthropic({ apiKey: KEY, baseURL: mock.url, fetch: tw.fetch({ agent: `a${i}`, role: i === 0 ? 'planner' : 'worker', unblocks: i === 0 ? 6 : 0 }), maxRetries: 0 })
      for (let turn = 0; turn < 3; turn++) {
        const params = { model: 'claude-sonnet-4-6', max_tokens: 200, messages: [{ role: 'user', content: prompt(i, turn, 2400 + 600 * (i % 4)) }] }
        try {
          if ((i + turn) % 3 === 0) {
            const final = await client.messages.stream(params).finalMessage()
            assert.equal(final.usage.output_tokens, 40)
          } else if ((i + turn) % 3 === 1) {
            const stream = await client.messages.create({ ...params, stream: true })
            let deltas = 0
            for await (const ev of stream) if (ev.type === 'content_block_delta') deltas++
            assert.ok(deltas > 0)
          } else {
            const msg = await client.messages.create(params)
            assert.equal(msg.usage.output_tokens, 40)
          }
          calls++
        } catch (e) {
          errors.push(e)
        }
      }
    }
    await Promise.all(Array.from({ length: 24 }, (_, i) => agent(i)))
    const stats = assertClean(tw, mock, events, errors, 72)
    assert.ok(events.some((e) => e.name === 'queued'), 'the limits bound: some calls queued')
    const used = tw.metrics().pools[0].minutes.at(-1).used
    console.log(`# anthropic: 72 calls, ${events.filter((e) => e.name === 'queued').length} queued, provider 429s ${stats.rejected429}, peak in flight ${stats.peakInFlight}/8, input tokens this minute ${used[0]} (limit 60000/min)`)
    tw.close()
  })

  test('20 OpenAI agents, streaming with include_usage and not', async () => {
    mock.reset()
    const tw = createTokenwarden({ config: { pools: [{ name: 'gpt-5', counting: 'openai', tokens_per_minute: 80_000, requests_per_minute: 600, max_concurrent: 8 }] } })
    const events = record(tw)
    const errors = []
    let calls = 0
    const agent = async (i) => {
      const client = new OpenAI({ apiKey: KEY, baseURL: `${mock.url}/v1`, fetch: tw.fetch({ agent: i + 1 }), maxRetries: 0 })
      for (let turn = 0; turn < 3; turn++) {
        const params = { model: 'gpt-5', max_completion_tokens: 200, messages: [{ role: 'user', content: prompt(i, turn, 2000) }] }
        try {
          if (turn % 2 === 0) {
            const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } })
            let usage = null
            for await (const chunk of stream) if (chunk.usage) usage = chunk.usage
            assert.equal(usage.completion_tokens, 40)
          } else {
            const res = await client.chat.completions.create(params)
            assert.equal(res.usage.completion_tokens, 40)
          }
          calls++
        } catch (e) {
          errors.push(e)
        }
      }
    }
    await Promise.all(Array.from({ length: 20 }, (_, i) => agent(i)))
    const stats = assertClean(tw, mock, events, errors, 60)
    console.log(`# openai: 60 calls, provider 429s ${stats.rejected429}, peak in flight ${stats.peakInFlight}/8`)
    tw.close()
  })

  test("a refusal reaches the SDK's user as an API error with tokenwarden's reason, not \"Connection error.\"", async () => {
    const tw = createTokenwarden({ config: config('claude-sonnet-4-6') })
    const client = new Anthropic({ apiKey: KEY, baseURL: mock.url, fetch: tw.fetch({ agent: 'too-big' }), maxRetries: 0 })
    // A prompt above the 60k input limit itself (the provider refuses it too): it can never
    // be served as asked. (A max_tokens above the output limit is served: see the fetch suite.)
    const err = await client.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 1_000, messages: [{ role: 'user', content: 'x'.repeat(400_000) }] }).then(
      () => null,
      (e) => e,
    )
    assert.ok(err !== null, 'refused')
    assert.equal(err.status, 400)
    assert.equal(err.name, 'BadRequestError')
    assert.match(err.message, /tokenwarden: lease rejected/)
    assert.doesNotMatch(err.message, /Connection error/)
    tw.close()
  })

  test('a 429 is retried after the core backoff, visibly, and never reaches the SDK', async () => {
    mock.reset()
    const tw = createTokenwarden({ config: config('claude-sonnet-4-6') })
    const events = record(tw)
    const client = new Anthropic({ apiKey: KEY, baseURL: mock.url, fetch: tw.fetch({ agent: 'retry' }), maxRetries: 0 })
    mock.fail429(2, { retryAfterSeconds: 1 })
    const started = performance.now()
    const msg = await client.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 50, messages: [{ role: 'user', content: 'hello' }] })
    const took = performance.now() - started
    assert.equal(msg.type, 'message')
    const waits = events.filter((e) => e.name === 'waiting')
    assert.equal(waits.length, 2)
    assert.match(waits[0].message, /^waiting on rate limit, retrying in \d+(\.\d)? s/)
    assert.ok(waits[0].delayMs >= 1000, `Retry-After honoured: ${waits[0].delayMs} ms`)
    assert.equal(events.filter((e) => e.name === 'rate_limited').length, 2)
    assert.ok(took >= 2000, `waited ${took} ms`)
    assert.equal(tw.metrics().liveLeases, 0)
    tw.close()
  })

  test('an abort while queued withdraws the ticket; the SDK sees its abort error', async () => {
    mock.reset()
    const tw = createTokenwarden({ config: { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: 60_000, max_concurrent: 1 }] } })
    const client = new Anthropic({ apiKey: KEY, baseURL: mock.url, fetch: tw.fetch({ agent: 'aborter' }), maxRetries: 0 })
    const params = { model: 'claude-sonnet-4-6', max_tokens: 50, messages: [{ role: 'user', content: 'x' }] }
    const first = await client.messages.create({ ...params, stream: true })
    const queuedEvents = []
    tw.on('queued', (e) => queuedEvents.push(e))
    const ac = new AbortController()
    const second = client.messages.create(params, { signal: ac.signal })
    await new Promise((r) => setTimeout(r, 20))
    assert.equal(queuedEvents.length, 1, 'the second call queued behind the open stream (slot held until the stream ends)')
    ac.abort()
    await assert.rejects(second, (e) => e.name === 'APIUserAbortError' || /abort/i.test(e.message))
    assert.equal(tw.metrics().pools[0].queueDepth, 0)
    for await (const _ of first) {
      // drain: the stream's end settles the first lease
    }
    assert.equal(tw.metrics().liveLeases, 0)
    tw.close()
  })

  test('an abort mid-stream and a dropped connection settle conservatively', async () => {
    mock.reset()
    const tw = createTokenwarden({ config: config('claude-sonnet-4-6') })
    const settledEvents = []
    tw.on('settled', (e) => settledEvents.push(e))
    const client = new Anthropic({ apiKey: KEY, baseURL: mock.url, fetch: tw.fetch({ agent: 'flaky' }), maxRetries: 0 })
    const params = { model: 'claude-sonnet-4-6', max_tokens: 300, messages: [{ role: 'user', content: prompt(0, 0, 4000) }] }
    const stream = await client.messages.create({ ...params, stream: true })
    for await (const ev of stream) {
      if (ev.type === 'content_block_delta') break // the SDK aborts the response
    }
    await new Promise((r) => setTimeout(r, 20))
    assert.equal(settledEvents.length, 1, 'settled when the consumer stopped')
    const partial = settledEvents[0].settlement.used
    assert.ok(partial[0] >= 1000, `input counted: ${partial[0]}`)
    assert.ok(partial[1] > 0 && partial[1] <= 300, `output counted from what was seen: ${partial[1]}`)
    mock.dropConnections(1)
    await assert.rejects(client.messages.create(params), (e) => e.name === 'APIConnectionError')
    assert.equal(settledEvents.length, 2)
    assert.equal(settledEvents[1].settlement.used[1], 300, 'nothing came back: the whole max_tokens is counted')
    assert.equal(tw.metrics().liveLeases, 0)
    tw.close()
  })
})
