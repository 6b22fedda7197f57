// `tokenwarden serve` says in its terminal who waits, for what and how long (issue 27,
// item 5): a proxied call that must wait longer than a few seconds gets a line naming the
// agent, the pool and its ceiling, the longest it may wait and how many are in line, then
// a line when it is served; a minute after the first event, a summary of that minute.
// Needs WORKERD (the workerd binary); the test script sets it.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { freePort } from './support.mjs'

const cli = fileURLToPath(new URL('../../../bindings-node/bin/tokenwarden.mjs', import.meta.url))
const skip = !process.env.WORKERD ? 'set WORKERD to the workerd binary' : false


describe('serve prints waits where its operator looks', { skip }, () => {
  let mock
  let data
  let child
  let out = ''
  let base

  before(async () => {
    mock = await startMockProvider({ replyTokens: 20 })
    data = mkdtempSync(join(tmpdir(), 'tokenwarden-waitlog-'))
    const config = join(data, 'tokenwarden.json')
    // 6,000 input tokens a minute, 5,100 at the 85 % margin: a 4,000-token call leaves too
    // little for the next, which waits about 35 s for refill.
    const pool = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 6_000, output_tokens_per_minute: 100_000, requests_per_minute: 600 }
    writeFileSync(config, JSON.stringify({ fleets: { ci: { secret: 'waitlog-secret-0123456789', proxy_open: true, quotas: { q: { upstream: mock.url, config: { pools: [pool], max_queue_wait_ms: 120_000 } } } } } }))
    const port = await freePort()
    base = `http://127.0.0.1:${port}/v1/fleets/ci/quotas/q`
    child = spawn(process.execPath, [cli, 'serve', '--config', config, '--port', String(port), '--data', join(data, 'state')], { stdio: ['ignore', 'pipe', 'pipe'], env: process.env })
    child.stdout.on('data', (d) => {
      out += d
    })
    child.stderr.on('data', (d) => {
      out += d
    })
    await new Promise((resolve, reject) => {
      const t = setInterval(() => {
        if (out.includes('Ctrl-C stops it')) {
          clearInterval(t)
          resolve()
        }
      }, 50)
      child.on('exit', (code) => {
        clearInterval(t)
        reject(new Error(`serve exited (${code}): ${out}`))
      })
    })
  })

  after(async () => {
    if (child && child.exitCode === null) {
      child.removeAllListeners('exit')
      await new Promise((r) => {
        child.on('exit', r)
        child.kill('SIGINT')
      })
    }
    await mock?.close()
    if (data) rmSync(data, { recursive: true, force: true })
  })

  const call = (agent, bytes) =>
    fetch(`${base}/agents/${agent}/worker/anthropic/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': 'sk-ant-test', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'x'.repeat(bytes) }] }),
    })

  test('a long wait gets a line with the agent, pool, ceiling, bound and line; its end another; then a summary', { timeout: 150_000 }, async () => {
    const first = await call('alice', 12_000)
    assert.equal(first.status, 200)
    await first.json()
    const t0 = Date.now()
    const second = await call('bob', 12_000)
    assert.equal(second.status, 200)
    await second.json()
    const waited = Date.now() - t0
    assert.ok(waited > 3_000, `bob waited ${waited} ms`)
    const wait = out.split('\n').find((l) => l.startsWith('tokenwarden: bob waits for quota'))
    assert.ok(wait, `a wait line for bob in:\n${out}`)
    assert.match(wait, /^tokenwarden: bob waits for quota on claude-sonnet-4-6 \(ceiling: input tokens\/min\), expected \d+(\.\d)? s, at most \d+(\.\d)? s, 1 in line/)
    assert.ok(out.includes('tokenwarden: bob served after'), out)
    assert.ok(!out.includes('tokenwarden: alice waits'), 'alice did not wait')
    // The summary comes with the first event a minute after the first one.
    await new Promise((r) => setTimeout(r, Math.max(0, 61_000 - (Date.now() - t0))))
    const third = await call('carol', 100)
    await third.json()
    const summary = out.split('\n').find((l) => l.startsWith('tokenwarden: last '))
    assert.ok(summary, `a summary line in:\n${out}`)
    assert.match(summary, /calls granted, 1 waited over 3 s \(longest \d+(\.\d)? s\), 0 answered 429 by the provider, 0 refused — claude-sonnet-4-6: margin 85 %/)
  })
})
