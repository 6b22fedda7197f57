// `tokenwarden serve` as users run it: the CLI starts the edge limiter on workerd (the npm
// package's binary) with its state on disk, and agents join by base URL alone — curl, and
// the official Python SDKs (anthropic, openai) from a virtualenv the test script creates —
// against the mock provider on 127.0.0.1. Needs WORKERD (the workerd binary) and
// TOKENWARDEN_PYTHON (a Python with both SDKs); the test script sets both.
import assert from 'node:assert/strict'
import { execFile, execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { freePort, serve, stop } from './support.mjs'

const run = promisify(execFile)
const cli = fileURLToPath(new URL('../../../bindings-node/bin/tokenwarden.mjs', import.meta.url))
const agentsPy = fileURLToPath(new URL('../../serve/agents.py', import.meta.url))
const PYTHON = process.env.TOKENWARDEN_PYTHON
const skip = !process.env.WORKERD ? 'set WORKERD to the workerd binary' : !PYTHON ? 'set TOKENWARDEN_PYTHON to a Python with anthropic and openai' : false
const SECRET = 'serve-ci-secret-0123456789'




describe('tokenwarden serve', { skip }, () => {
  let mock
  let data
  let config
  let port
  let server
  let origin
  const api = (quota, path, init = {}) =>
    fetch(`${origin}/v1/fleets/ci/quotas/${quota}${path}`, {
      ...init,
      headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json', ...init.headers },
    })

  before(async () => {
    mock = await startMockProvider({ inputTokensPerMinute: 60_000, outputTokensPerMinute: 20_000, requestsPerMinute: 600, concurrency: 8, replyTokens: 30, chunkDelayMs: 40 })
    data = mkdtempSync(join(tmpdir(), 'tokenwarden-serve-'))
    config = join(data, 'tokenwarden.json')
    const pool = { input_tokens_per_minute: 60_000, output_tokens_per_minute: 20_000, requests_per_minute: 600, max_concurrent: 8 }
    writeFileSync(
      config,
      JSON.stringify({
        fleets: {
          ci: {
            secret: SECRET,
            proxy_open: true,
            quotas: {
              anthropic: { upstream: mock.url, config: { pools: [{ name: 'claude-sonnet-4-6', ...pool }] } },
              // The same mock provider: its concurrency limit is shared with the quota above,
              // so some calls meet a 429 there, which the limiter waits out.
              openai: { upstream: mock.url, config: { pools: [{ name: 'gpt-5', counting: 'openai', tokens_per_minute: 80_000, requests_per_minute: 600, max_concurrent: 8 }] } },
              restart: { config: { pools: [{ name: 'claude-sonnet-4-6', ...pool }] } },
              // Gives up after two failed sends: the caller then gets the provider's 429.
              patience: { upstream: mock.url, config: { pools: [{ name: 'claude-sonnet-4-6', ...pool }], backoff: { max_attempts: 2 } } },
            },
          },
        },
      }),
    )
    port = await freePort()
    origin = `http://127.0.0.1:${port}`
    server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
  })

  after(async () => {
    if (server) await stop(server.child)
    await mock?.close()
    if (data) rmSync(data, { recursive: true, force: true })
  })

  test('it prints the base URL to use and the dashboard', () => {
    const out = server.out()
    assert.ok(out.includes(`ANTHROPIC_BASE_URL=${origin}/v1/fleets/ci/quotas/anthropic/agents/<agent>/<role>/anthropic`), out)
    assert.ok(out.includes(`${origin}/v1/fleets/ci/quotas/anthropic/dashboard`), out)
  })

  test('curl with only a base URL: JSON, and a stream whose first byte comes before its end', async () => {
    const url = `${origin}/v1/fleets/ci/quotas/anthropic/agents/curl-1/worker/anthropic/v1/messages`
    const body = (stream) => JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, stream, messages: [{ role: 'user', content: 'hello '.repeat(100) }] })
    const headers = ['-H', 'x-api-key: sk-test-curl', '-H', 'anthropic-version: 2023-06-01', '-H', 'content-type: application/json']
    const json = await run('curl', ['-sS', '-X', 'POST', url, ...headers, '-d', body(false)])
    assert.equal(JSON.parse(json.stdout).usage.output_tokens, 30)
    const timing = await run('curl', ['-sS', '-N', '-o', '/dev/null', '-w', '%{http_code} %{time_starttransfer} %{time_total}', '-X', 'POST', url, ...headers, '-d', body(true)])
    const [code, first, total] = timing.stdout.split(' ')
    assert.equal(code, '200')
    // 30 deltas 40 ms apart: the stream lasts over a second; unbuffered, its first byte
    // arrives long before the last.
    assert.ok(Number(total) - Number(first) > 0.8, `first byte at ${first} s, end at ${total} s`)
    const m = await (await api('anthropic', '/metrics')).json()
    assert.equal(m.liveLeases, 0, 'both calls settled')
  })

  test('20 Anthropic and 5 OpenAI agents on the Python SDKs: no 429 reaches them, every lease settled, limits held', { timeout: 180_000 }, async () => {
    mock.reset()
    const before = await (await api('anthropic', '/metrics')).json()
    const { stdout } = await run(PYTHON, [agentsPy, origin, 'ci', 'anthropic', 'openai', '20', '5', '3'], { timeout: 170_000 })
    const r = JSON.parse(stdout.trim().split('\n').at(-1))
    assert.deepEqual(r.errors, [], 'no error (no 429: the limiter waits those out) reached an agent')
    assert.equal(r.calls, 75)
    assert.ok(r.streamed >= 30, `${r.streamed} streamed`)
    const stats = mock.stats()
    assert.equal(stats.completed, 75)
    // Every OpenAI agent's third turn is a Responses call (streamed for even agents).
    assert.equal(mock.log.filter((e) => e.path === '/v1/responses' && e.status === 200).length, 5, 'the Responses calls reached the provider')
    assert.equal(stats.overLimit, false, 'the provider never let more through than its limits')
    const a = await (await api('anthropic', '/metrics')).json()
    const o = await (await api('openai', '/metrics')).json()
    assert.equal(a.liveLeases + o.liveLeases, 0, 'every lease ended')
    const settled = Number(a.pools[0].counters.settled) - Number(before.pools[0].counters.settled) + Number(o.pools[0].counters.settled)
    assert.equal(settled, 75 + stats.rejected429, 'every call settled (and any attempt a 429 ended)')
    console.log(`# python: 75 calls (${r.streamed} streamed), provider 429s ${stats.rejected429}, queued at the limiter ${Number(a.pools[0].counters.queued) + Number(o.pools[0].counters.queued)}`)
  })

  test('a 429 from upstream is waited out, not returned; a call that gives up gets it with the last Retry-After', { timeout: 60_000 }, async () => {
    const call = (quota, agent) =>
      fetch(`${origin}/v1/fleets/ci/quotas/${quota}/agents/${agent}/worker/anthropic/v1/messages`, {
        method: 'POST',
        headers: { 'x-api-key': 'sk-test-429', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 50, messages: [{ role: 'user', content: 'hello '.repeat(20) }] }),
      })
    const sent = () => mock.log.filter((e) => e.path === '/v1/messages')
    // Two 429s with Retry-After: 1, then the provider answers: the agent sees one 200.
    let before = sent().length
    mock.fail429(2, { retryAfterSeconds: 1 })
    const t0 = Date.now()
    const ok = await call('anthropic', 'patient-1')
    const waited = Date.now() - t0
    assert.equal(ok.status, 200, await ok.clone().text())
    assert.equal((await ok.json()).usage.output_tokens, 30)
    const tries = sent().slice(before)
    assert.deepEqual(tries.map((e) => e.status), [429, 429, 200], 'two 429s waited out, then the answer')
    assert.ok(waited >= 2000, `each Retry-After waited out (${waited} ms)`)
    // A quota that allows two failed sends: the third 429 is not tried; the caller gets the
    // provider's 429 with its Retry-After, and the lease is settled as nothing used.
    before = sent().length
    mock.fail429(5, { retryAfterSeconds: 3 })
    const gaveUp = await call('patience', 'impatient-1')
    assert.equal(gaveUp.status, 429)
    assert.equal(gaveUp.headers.get('retry-after'), '3')
    await gaveUp.text()
    assert.equal(sent().length - before, 2, 'two sends, then it gives up')
    mock.fail429(0)
    const m = await (await api('patience', '/metrics')).json()
    assert.equal(m.liveLeases, 0, 'the given-up call is settled')
  })

  test('a restart while calls are in flight: the cut calls are charged and end at once, not at their TTL', { timeout: 60_000 }, async () => {
    mock.reset()
    const url = (agent) => `${origin}/v1/fleets/ci/quotas/anthropic/agents/${agent}/worker/anthropic/v1/messages`
    const init = (stream) => ({
      method: 'POST',
      headers: { 'x-api-key': 'sk-test-restart', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, stream, messages: [{ role: 'user', content: 'hello '.repeat(50) }] }),
    })
    const before = await (await api('anthropic', '/metrics')).json()
    // Four streams (30 deltas 40 ms apart: over a second each) reach the provider.
    const cut = [1, 2, 3, 4].map((i) =>
      fetch(url(`cut-${i}`), init(true))
        .then((r) => r.text())
        .then(
          () => 'completed',
          () => 'cut',
        ),
    )
    for (let i = 0; i < 200 && mock.stats().inFlight < 4; i++) await new Promise((r) => setTimeout(r, 10))
    assert.equal(mock.stats().inFlight, 4, 'four calls in flight at the provider')
    // A proxied call's grant is written within 50 ms of its send (not awaited by the call).
    await new Promise((r) => setTimeout(r, 250))
    assert.equal(await stop(server.child), 0)
    assert.deepEqual(await Promise.all(cut), ['cut', 'cut', 'cut', 'cut'], 'the streams were cut by the stop')
    server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
    const m = await (await api('anthropic', '/metrics')).json()
    assert.equal(m.liveLeases, 0, 'the leases of the cut calls ended at the restart, not after their TTL')
    const settled = Number(m.pools[0].counters.settled) - Number(before.pools[0].counters.settled)
    assert.equal(settled, 4, 'each cut call settled, as a call cut short: charged its reservation')
    // The whole concurrency is free again: eight calls go straight through.
    const t0 = Date.now()
    const next = await Promise.all([1, 2, 3, 4, 5, 6, 7, 8].map(async (i) => (await fetch(url(`after-${i}`), init(false))).status))
    assert.deepEqual(next, [200, 200, 200, 200, 200, 200, 200, 200])
    assert.ok(Date.now() - t0 < 20_000, 'none waited for a TTL')
    assert.equal(mock.stats().overLimit, false)
  })

  test('a load run through two SIGKILLs of the limiter (native serve or workerd) admits nothing beyond the limits at the provider', { timeout: 120_000 }, async (t) => {
    mock.reset()
    const url = (agent) => `${origin}/v1/fleets/ci/quotas/anthropic/agents/${agent}/worker/anthropic/v1/messages`
    const init = (i) => ({
      method: 'POST',
      headers: { 'x-api-key': 'sk-test-kill', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 60, stream: i % 2 === 0, messages: [{ role: 'user', content: 'load '.repeat(400) }] }),
    })
    const outcomes = { ok: 0, failed: 0, other: 0 }
    let running = true
    const agent = async (n) => {
      for (let i = 0; running; i++) {
        try {
          const r = await fetch(url(`kill-${n}`), init(i))
          await r.text()
          if (r.status === 200) outcomes.ok++
          else outcomes.other++
        } catch {
          // cut by the kill, or refused while serve restarts
          outcomes.failed++
          await new Promise((res) => setTimeout(res, 200))
        }
      }
    }
    const agents = Array.from({ length: 12 }, (_, n) => agent(n))
    // The limiter the CLI started: native serve, or workerd (its one child either way).
    const workerdOf = (child) =>
      execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(child.pid)], { encoding: 'utf8' })
        .split('\n')
        .filter((l) => l.trim() !== '')
        .map((l) => Number(l.trim().split(/\s+/)[0]))[0]
    for (let round = 0; round < 2; round++) {
      await new Promise((res) => setTimeout(res, 6_000))
      const exited = new Promise((res) => server.child.once('exit', res))
      process.kill(workerdOf(server.child), 'SIGKILL')
      await exited
      server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
    }
    await new Promise((res) => setTimeout(res, 6_000))
    running = false
    await Promise.all(agents)
    const stats = mock.stats()
    assert.equal(stats.overLimit, false, `the provider's limits held: ${JSON.stringify(stats.minLevel)} peak in flight ${stats.peakInFlight}`)
    assert.ok(outcomes.ok > 24, `calls were served between the kills: ${JSON.stringify(outcomes)}`)
    t.diagnostic(`12 agents, 2 SIGKILLs: ${JSON.stringify(outcomes)}; at the provider ${stats.requests} requests, ${stats.rejected429} answered 429, peak in flight ${stats.peakInFlight} of 8`)
  })

  test('a restart keeps leases, tickets and debt; Ctrl-C stops it cleanly', { timeout: 60_000 }, async () => {
    // Fill the window: one big lease granted, the next request queued behind it.
    const lease = (agent, inputTokens) => api('restart', '/leases', { method: 'POST', body: JSON.stringify({ agent, pool: 'claude-sonnet-4-6', inputTokens, maxTokens: 100 }) })
    const g = await (await lease('restart-a', 45_000)).json()
    assert.equal(g.kind, 'grant')
    const q = await lease('restart-b', 20_000)
    assert.equal(q.status, 202)
    const ticket = (await q.json()).lease
    const beforeRestart = await (await api('restart', '/metrics')).json()
    assert.equal(await stop(server.child), 0, 'Ctrl-C: exit 0')
    server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
    const m = await (await api('restart', '/metrics')).json()
    assert.equal(m.liveLeases, 2, 'the lease and the ticket are still there')
    assert.equal(beforeRestart.liveLeases, 2)
    assert.equal(m.pools[0].queueDepth, 1)
    // Settled above its reservation: debt, kept like everything else.
    const s = await api('restart', `/leases/${g.lease}/settle`, { method: 'POST', body: JSON.stringify({ inputTokens: 50_000, outputTokens: 50 }) })
    assert.equal(s.status, 200)
    const granted = await (await api('restart', `/leases/${ticket}?wait=30000`)).json()
    assert.equal(granted.kind, 'grant', 'the ticket queued before the restart is granted after it')
    assert.equal((await api('restart', `/leases/${granted.lease}/settle`, { method: 'POST', body: JSON.stringify({ inputTokens: 20_000 }) })).status, 200)
    assert.equal((await (await api('restart', '/metrics')).json()).liveLeases, 0)
  })

  test('a fleet that takes proxied calls with no secret is refused on a non-loopback address', async () => {
    const r = await run(process.execPath, [cli, 'serve', '--config', config, '--host', '0.0.0.0', '--port', '0', '--data', join(data, 'other')]).catch((e) => e)
    assert.equal(r.code, 2)
    assert.match(r.stderr, /proxy_open.*loopback only/)
  })
})
