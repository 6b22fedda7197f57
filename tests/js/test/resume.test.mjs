// Resumable turns: the long-wait hook of the wrapped fetch (the core's `checkpoint`), and
// the checkpoint helper that writes a turn down and says on resume which files changed.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync, writeFileSync, readdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { Checkpoints } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { createTokenwarden } from '../support/engine.mjs'

const turn = (files) => ({ goal: 'fix the parser', step: 2, decisions: ['use a table'], nextCall: { model: 'm', max_tokens: 10, messages: [] }, files })

describe('Checkpoints', () => {
  let dir
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'tokenwarden-cp-'))
    writeFileSync(join(dir, 'a.txt'), 'alpha')
    writeFileSync(join(dir, 'b.txt'), 'beta')
  })
  after(() => rmSync(dir, { recursive: true, force: true }))

  test('resume says which files changed, which did not and which are gone', async () => {
    const cp = new Checkpoints(join(dir, 'cp'), { root: dir })
    assert.equal(await cp.resume('w1'), null, 'nothing saved yet')
    writeFileSync(join(dir, 'c.txt'), 'gamma')
    await cp.save('w1', turn(['a.txt', 'b.txt', 'c.txt']))
    writeFileSync(join(dir, 'b.txt'), 'beta, edited')
    rmSync(join(dir, 'c.txt'))
    const r = await cp.resume('w1')
    assert.deepEqual([r.changed, r.unchanged, r.missing], [['b.txt'], ['a.txt'], ['c.txt']])
    assert.deepEqual([r.goal, r.step, r.decisions, r.nextCall], ['fix the parser', 2, ['use a table'], turn([]).nextCall])
    assert.equal(r.cacheExpired, false)
    assert.ok(r.waitedMs >= 0 && r.savedAt <= Date.now())
    await cp.clear('w1')
    assert.equal(await cp.resume('w1'), null)
  })

  test('a wait past the prompt cache is flagged', async () => {
    const cp = new Checkpoints(join(dir, 'cp2'), { root: dir, promptCacheTtlMs: 0 })
    await cp.save('w', turn(['a.txt']))
    assert.equal((await cp.resume('w')).cacheExpired, true)
  })

  test('bad input is refused, names stay inside the directory, a corrupt file is an error', async () => {
    const cp = new Checkpoints(join(dir, 'cp3'), { root: dir })
    await assert.rejects(cp.save('w', turn(['../outside.txt'])), (e) => e.code === 'invalid_argument' && e.field === 'files')
    await assert.rejects(cp.save('w', turn(['nope.txt'])), (e) => e.code === 'invalid_argument')
    await assert.rejects(cp.save('', turn([])), TypeError)
    await assert.rejects(cp.save('w', { goal: 1 }), TypeError)
    await cp.save('../../evil', turn([]))
    assert.deepEqual(readdirSync(join(dir, 'cp3')), ['%2E%2E%2F%2E%2E%2Fevil.json'], 'one file, inside the directory')
    writeFileSync(join(dir, 'cp3', 'broken.json'), '{"version": 1, "agent"')
    await assert.rejects(cp.resume('broken'), (e) => e.code === 'checkpoint_corrupt')
    assert.throws(() => new Checkpoints(join(dir, 'x'), { promptCacheTtlMs: -1 }), RangeError)
  })
})

describe('the long-wait hook', () => {
  let mock
  before(async () => {
    mock = await startMockProvider({ inputTokensPerMinute: 6000, outputTokensPerMinute: 1_000_000, concurrency: 8, replyTokens: 10 })
  })
  after(() => mock.close())
  // 6,000 input tokens a minute, the mock's limit too (its remaining headers are followed):
  // after a 3,500-token call a second 3,000-token one waits ~20 s.
  const config = { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: 6000, output_tokens_per_minute: 100_000 }], call: { checkpoint_after_ms: 1000 } }
  const body = (n) => JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 10, messages: [{ role: 'user', content: 'x'.repeat(n) }] })
  const post = (f, n) => f(`${mock.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'k' }, body: body(n) })

  test('a queued wait longer than checkpoint_after_ms calls the hook first; a hook that throws withdraws the call', async () => {
    const tw = createTokenwarden({ config })
    const waits = []
    const f = tw.fetch({
      agent: 'hooked',
      onLongWait: (w) => {
        waits.push(w)
        throw new Error('killed for the test')
      },
    })
    assert.equal((await post(f, 14_000)).status, 200, 'the first call fits')
    await assert.rejects(post(f, 12_000), /killed for the test/)
    assert.equal(waits.length, 1)
    assert.equal(waits[0].reason, 'queued')
    assert.ok(waits[0].waitMs > 1000, `a long wait: ${waits[0].waitMs} ms`)
    // The hook is handed the call the wait holds, as it would be sent, without its headers.
    const held = waits[0].call
    assert.deepEqual(held.body, JSON.parse(body(12_000)))
    assert.equal(held.url, `${mock.url}/v1/messages`)
    assert.equal(held.method, 'POST')
    assert.equal(held.model, 'claude-sonnet-4-6')
    assert.equal(held.provider, 'anthropic')
    assert.ok(!JSON.stringify(held).includes('"k"'), 'no API key in it')
    const m = tw.metrics()
    assert.equal(m.liveLeases, 0, 'the ticket was withdrawn')
    assert.equal(m.pools[0].queueDepth, 0)
    assert.equal(mock.stats().completed, 1, 'nothing more was sent')
    tw.close()
  })

  test('a short wait does not call the hook', async () => {
    const tw = createTokenwarden({ config: { ...config, call: { checkpoint_after_ms: 600_000 } } })
    let called = 0
    const f = tw.fetch({ onLongWait: () => called++ })
    assert.equal((await post(f, 400)).status, 200)
    assert.equal(called, 0)
    tw.close()
  })
})
