// Tasks through the npm package: `tw.task()` handles, failure signatures, and the four
// numbers in `metrics().tasks`, on the engine under test (native or wasm). The SDK part
// runs a small DAG of tasks through the official Anthropic SDK against the mock provider
// (Node >= 22, like the SDK suite).
import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { failureSignature, taskIdFor } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { createTokenwarden } from '../support/engine.mjs'

const major = Number(process.versions.node.split('.')[0])
const skip = major < 22 ? `the current @anthropic-ai/sdk needs Node >= 22 (this is ${process.version})` : false
const Anthropic = skip ? null : (await import('@anthropic-ai/sdk')).default

const config = { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: 30_000, output_tokens_per_minute: 10_000, requests_per_minute: 600, max_concurrent: 4 }] }

describe('failure signatures', () => {
  const diff = ['--- a/src/parse.js', '+++ b/src/parse.js', '@@ -10,3 +10,4 @@ function parse(s) {', '   const t = s.trim()', '-  return t', '+  return t.split("\\t")', ''].join('\n')

  test('the same test and change give the same signature, wherever the hunk sits', () => {
    const moved = diff.replace('@@ -10,3 +10,4 @@', '@@ -42,3 +42,4 @@').replace('   const t', '   const  t')
    assert.equal(failureSignature('parser handles tabs', diff), failureSignature('parser handles tabs', moved))
    assert.ok(Number.isSafeInteger(failureSignature('parser handles tabs', diff)))
  })

  test('another test or another change is another signature; content is not kept', () => {
    const s = failureSignature('parser handles tabs', diff)
    assert.notEqual(s, failureSignature('parser handles spaces', diff))
    assert.notEqual(s, failureSignature('parser handles tabs', diff.replace('split', 'splitAll')))
    assert.equal(typeof s, 'number')
  })

  test('task ids from names are stable 53-bit integers', () => {
    assert.equal(taskIdFor('fix-parser'), taskIdFor('fix-parser'))
    assert.notEqual(taskIdFor('fix-parser'), taskIdFor('fix-lexer'))
    assert.ok(Number.isSafeInteger(taskIdFor('fix-parser')))
    assert.equal(taskIdFor('1234'), 1234, 'a name of digits is that id')
    assert.notEqual(taskIdFor('12345678901234567890'), 12345678901234567890, 'beyond 2^53 it is a name')
  })
})

describe('task handles', () => {
  test('a task ends once; its figures are in metrics().tasks', async () => {
    const tw = createTokenwarden({ config })
    const t = tw.task({ id: 'review-1', role: 'reviewer', unblocks: 2 })
    assert.equal(t.id, taskIdFor('review-1'))
    assert.equal(await t.failed({ test: 't', diff: '+a' }), 0)
    assert.equal(await t.failed({ test: 't', diff: '+a' }), 1, 'the same failure again is a repeat')
    const summary = await t.done({ merged: false })
    assert.equal(summary.outcome, 'abandoned')
    assert.equal(summary.failures, 2)
    await assert.rejects(t.done(), (e) => e.code === 'unknown_task')
    await assert.rejects(t.failed(7), (e) => e.code === 'unknown_task')
    const m = tw.metrics().tasks
    assert.equal(m.open, 0)
    assert.equal(m.sinceStart.abandoned, 1)
    assert.equal(m.sinceStart.tokensPerMergedTask, null, 'nothing merged yet')
    tw.close()
  })

  test('bad input is refused with an error naming it, and changes nothing', () => {
    const tw = createTokenwarden({ config: { ...config, max_tasks: 1 } })
    assert.throws(() => tw.task({ id: null }), TypeError)
    assert.throws(() => tw.task({ id: 1, unblocks: -1 }), (e) => e.code === 'invalid_argument' && e.field === 'unblocks')
    assert.throws(() => tw.task({ id: 1, role: 'boss' }), (e) => e.code === 'invalid_argument' && e.field === 'role')
    tw.task({ id: 1 })
    assert.throws(() => tw.task({ id: 2 }), (e) => e.code === 'too_many_tasks')
    assert.throws(() => tw.endTask(1, 'won'), (e) => e.code === 'invalid_argument')
    assert.equal(tw.metrics().tasks.open, 1)
    tw.close()
  })
})

describe('tasks through the official Anthropic SDK', { skip }, () => {
  let mock
  before(async () => {
    mock = await startMockProvider({ inputTokensPerMinute: 30_000, outputTokensPerMinute: 10_000, requestsPerMinute: 600, concurrency: 4, replyTokens: 30, chunkDelayMs: 2 })
  })
  after(() => mock.close())

  test('a plan unblocking four workers; one worker fails the same way twice before it merges', async () => {
    const tw = createTokenwarden({ config })
    const ask = (client, n) =>
      client.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: `step ${n} ${'x'.repeat(3000)}` }] })

    const plan = tw.task({ id: 'plan', role: 'planner', unblocks: 4 })
    const planner = new Anthropic({ apiKey: 'sk-test', baseURL: mock.url, fetch: plan.fetch(), maxRetries: 0 })
    await ask(planner, 0)
    const planned = await plan.done({ merged: true })
    assert.equal(planned.calls, 1)
    assert.ok(Number(planned.tokens) > 700, `the plan was charged its tokens: ${planned.tokens}`)

    const summaries = await Promise.all(
      [0, 1, 2, 3].map(async (i) => {
        const t = tw.task({ id: `worker-${i}`, unblocks: i === 0 ? 1 : 0 })
        const client = new Anthropic({ apiKey: 'sk-test', baseURL: mock.url, fetch: t.fetch(), maxRetries: 0 })
        await ask(client, 1)
        if (i === 1) {
          for (const _ of [1, 2]) {
            await t.failed({ test: 'worker 1 test', diff: '+same broken line' })
            await ask(client, 2)
          }
        }
        return t.done({ merged: true })
      }),
    )
    assert.deepEqual(
      summaries.map((s) => s.calls),
      [1, 3, 1, 1],
    )
    assert.equal(summaries[1].repeats, 1, 'the second identical failure was a repeat')

    const m = tw.metrics().tasks.sinceStart
    assert.equal(m.merged, 5)
    const tokens = [planned, ...summaries].reduce((a, s) => a + Number(s.tokens), 0)
    assert.equal(Number(m.tokens), tokens)
    assert.equal(Number(m.tokensPerMergedTask), Math.floor(tokens / 5))
    assert.ok(m.taskTimeP50Ms !== null && m.taskTimeP95Ms !== null)
    assert.ok(Number(m.taskTimeP95Ms) >= Number(m.taskTimeP50Ms))
    assert.equal(Number(m.calls), 7)
    assert.equal(m.rateLimitedPermille, 0, 'no 429 from the provider')
    assert.ok(Number(m.criticalPathWaitMs) >= 0)
    assert.equal(mock.stats().completed, 7)
    tw.close()
  })
})
