// Native `tokenwarden serve` on several instances sharing one key (issue 44): one owner per
// quota elected in a real redis-server (Debian's; the test script installs it), started
// here on a free loopback port, three native serve processes (`--cluster`), the mock
// provider enforcing the key's limits, and agents spread over the instances. The owner is
// SIGKILLed under load, then Redis itself is stopped and started again. Needs the native
// binary (bindings-node/tokenwarden-serve.<platform> or TOKENWARDEN_SERVE_BIN).
import assert from 'node:assert/strict'
import { execFile, spawn } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { freePort, startRedis } from './support.mjs'

const run = promisify(execFile)
const platform = `${process.platform}-${process.arch}-gnu`
const BIN = process.env.TOKENWARDEN_SERVE_BIN ?? fileURLToPath(new URL(`../../../bindings-node/tokenwarden-serve.${platform}`, import.meta.url))
const SECRET = 'cluster-ci-secret-0123456789'
const TTL_MS = 1000
// The key's limits at the mock provider, and the pool's (the same).
const RPM = 120
const skip = process.env.TOKENWARDEN_SERVE_RUNTIME === 'workerd' ? 'a cluster is native serve only' : !existsSync(BIN) ? `no native serve at ${BIN} (npm run build:native-serve)` : false

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** One native serve instance of the cluster: `{ child, port, origin, out() }` once it printed its banner. */
function startInstance(config, redisPort, port, data) {
  return new Promise((resolve, reject) => {
    const child = spawn(BIN, ['serve', '--config', config, '--port', String(port), '--data', data, '--cluster', `redis://127.0.0.1:${redisPort}`], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, TOKENWARDEN_OWNER_TTL_MS: String(TTL_MS), TOKENWARDEN_WAIT_LOG: '0', TOKENWARDEN_THREADS: '1' },
    })
    let out = ''
    const seen = (d) => {
      out += d
      if (out.includes('Ctrl-C stops it')) resolve({ child, port, origin: `http://127.0.0.1:${port}`, out: () => out })
    }
    child.stdout.on('data', seen)
    child.stderr.on('data', seen)
    child.on('exit', (code) => reject(new Error(`serve exited (${code}) before it was ready: ${out}`)))
  })
}

/** Whom instance `i`'s output last names as the quota's owner (its own origin when it took it). */
function ownerSeenBy(i) {
  const lines = i.out().split('\n')
  for (let k = lines.length - 1; k >= 0; k--) {
    if (lines[k].includes('this instance owns the quota')) return i.origin
    const m = lines[k].match(/the quota's owner is (\S+)/)
    if (m) return m[1]
    if (lines[k].includes('no owner known')) return null
  }
  return undefined
}

describe('serve --cluster: three instances, one key, one owner elected in Redis', { skip }, () => {
  let mock
  let dir
  let config
  let redisPort
  let redis
  /** @type {{ child: import('node:child_process').ChildProcess, port: number, origin: string, out: () => string }[]} */
  let nodes = []

  const api = (node, path, init = {}) =>
    fetch(`${node.origin}/v1/fleets/team/quotas/anthropic${path}`, {
      ...init,
      headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json', ...init.headers },
    })
  /** One model call through `node`'s proxy as agent `agent`; its status. */
  const call = async (node, agent) => {
    const res = await fetch(`${node.origin}/v1/fleets/team/quotas/anthropic/agents/${agent}/worker/anthropic/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01', 'x-tokenwarden-token': SECRET },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 40, messages: [{ role: 'user', content: `hello from ${agent}` }] }),
    })
    await res.arrayBuffer()
    return res.status
  }
  const owner = () => nodes.find((n) => ownerSeenBy(n) === n.origin)

  before(async () => {
    mock = await startMockProvider({ requestsPerMinute: RPM, inputTokensPerMinute: 1_000_000, outputTokensPerMinute: 1_000_000, replyTokens: 20, delayMs: 100 })
    dir = mkdtempSync(join(tmpdir(), 'tokenwarden-cluster-'))
    config = join(dir, 'tokenwarden.json')
    writeFileSync(
      config,
      JSON.stringify({
        fleets: {
          team: {
            secret: SECRET,
            quotas: { anthropic: { upstream: mock.url, config: { pools: [{ name: 'claude-sonnet-4-6', requests_per_minute: RPM, input_tokens_per_minute: 1_000_000, output_tokens_per_minute: 1_000_000 }] } } },
          },
        },
      }),
    )
    redisPort = await freePort()
    redis = await startRedis(redisPort)
    for (let i = 0; i < 3; i++) nodes.push(await startInstance(config, redisPort, await freePort(), join(dir, `data-${i}`)))
  })

  after(async () => {
    for (const n of nodes) if (n.child.exitCode === null) n.child.kill('SIGKILL')
    redis?.kill('SIGKILL')
    await mock?.close()
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  test('one owner, the others forward to it: a fleet spread over the three gets no 429, every call settled once', async () => {
    const o = owner()
    assert.ok(o, nodes.map((n) => n.out()).join('\n---\n'))
    for (const n of nodes) assert.equal(ownerSeenBy(n), o.origin, n.out())
    // 30 agents, 3 calls each, round robin over the instances: 90 calls on a key of 120 a
    // minute (a full bucket of 120): within the limit, so all go; the count shows none lost.
    const started = Date.now()
    const statuses = await Promise.all(Array.from({ length: 30 }, (_, a) => (async () => {
      const out = []
      for (let k = 0; k < 3; k++) out.push(await call(nodes[(a + k) % 3], `agent-${a}`))
      return out
    })()))
    const wall = Date.now() - started
    assert.deepEqual([...new Set(statuses.flat())], [200])
    assert.equal(mock.stats().rejected429, 0)
    // Every instance answers the owner's metrics: the same 30 agents and 90 settles.
    const seen = await Promise.all(nodes.map(async (n) => (await api(n, '/metrics')).json()))
    for (const m of seen) {
      assert.equal(m.pools[0].counters.settled, 90, JSON.stringify(m.pools[0].counters))
      assert.equal(m.agents.filter((a) => /^agent-/.test(a.name ?? '')).length, 30)
    }
    console.log(`# 3 instances: 90 calls by 30 agents in ${wall} ms, 0 429s`)
  })

  test('SIGKILL the owner under load: a new owner decides leases within 2 owner leases, its settles land, nothing granted twice, no 429', { timeout: 60_000 }, async () => {
    const o = owner()
    const survivors = nodes.filter((n) => n !== o)
    // A lease granted (through a survivor, so by the owner) before the kill, settled after it.
    const held = await (await api(survivors[0], '/leases', { method: 'POST', body: JSON.stringify({ agent: 'held', pool: 0, inputTokens: 100, maxTokens: 10 }) })).json()
    assert.equal(held.kind, 'grant', JSON.stringify(held))
    // Load through the survivors while the owner dies: 8 agents asking far more than the
    // key's 2 calls a second, so the bucket is empty and calls wait in line at the owner.
    let stop = false
    const handles = new Set([held.lease])
    const load = Promise.all(
      Array.from({ length: 8 }, (_, a) =>
        (async () => {
          const codes = []
          while (!stop) codes.push(await call(survivors[a % 2], `load-${a}`).catch(() => 0))
          return codes
        })(),
      ),
    )
    await sleep(1500)
    const before429 = mock.stats().rejected429
    o.child.kill('SIGKILL')
    const killed = Date.now()
    nodes = survivors
    // The first lease decided after the kill, through a survivor, by whichever owns it now.
    let granted = null
    let refusals = 0
    while (Date.now() - killed < 10_000) {
      const r = await api(survivors[1], '/leases', { method: 'POST', body: JSON.stringify({ agent: 'probe', pool: 0, inputTokens: 10, maxTokens: 10 }) })
      const b = await r.json()
      // The owner decides again: a grant, or (the bucket empty) a place in line, which the
      // probe gives back.
      if ((r.status === 200 && b.kind === 'grant') || (r.status === 202 && b.kind === 'queued')) {
        granted = Date.now() - killed
        handles.add(b.lease)
        if (b.kind === 'grant') await api(survivors[1], `/leases/${b.lease}/settle`, { method: 'POST', body: JSON.stringify({ inputTokens: 10, outputTokens: 1 }) })
        else await api(survivors[1], `/leases/${b.lease}`, { method: 'DELETE' })
        break
      }
      refusals++
      await sleep(50)
    }
    stop = true
    const codes = (await load).flat()
    assert.ok(granted !== null, `no lease decided within 10 s of the kill (${refusals} answers refused)`)
    assert.ok(granted <= 2 * TTL_MS, `the first lease decided after the kill came at ${granted} ms (owner lease ${TTL_MS} ms)`)
    // The lease granted before the kill settles on the new owner (its state was saved before the grant was answered).
    const settled = await api(survivors[0], `/leases/${held.lease}/settle`, { method: 'POST', body: JSON.stringify({ inputTokens: 100, outputTokens: 10 }) })
    assert.equal(settled.status, 200, await settled.text())
    // Nothing granted twice: a new lease's handle is none given before.
    const again = await (await api(survivors[0], '/leases', { method: 'POST', body: JSON.stringify({ agent: 'after', pool: 0, inputTokens: 10, maxTokens: 10 }) })).json()
    assert.ok(again.kind === 'grant' || again.kind === 'queued', JSON.stringify(again))
    assert.ok(!handles.has(again.lease), 'a handle given twice')
    const s = mock.stats()
    assert.equal(s.rejected429 - before429, 0, 'no 429 over the fault')
    // Admitted beyond the key's limit over the fault: at most one owner lease's refill.
    const over = Math.max(0, -(s.minLevel.requests ?? 0))
    assert.ok(over <= (RPM / 60_000) * TTL_MS, `admitted ${over} requests beyond the limit`)
    assert.ok(owner(), 'a survivor owns the quota')
    const byStatus = {}
    for (const c of codes) byStatus[c] = (byStatus[c] ?? 0) + 1
    // What the load's calls were answered: 200, or (over the fault) 503 with a retry, or the
    // cut of a call in flight through the killed owner (0: the connection broke).
    for (const c of Object.keys(byStatus)) assert.ok(['200', '503', '502', '0'].includes(c), JSON.stringify(byStatus))
    console.log(`# owner killed: first lease decided after ${granted} ms (owner lease ${TTL_MS} ms; ${refusals} answers 503 meanwhile); the load's answers by status ${JSON.stringify(byStatus)}; ${over} beyond the limit; 0 429s`)
  })

  test('Redis stalls (SIGSTOP): the owner stops acting at its term\'s end, not when its calls time out; SIGCONT: one owner again', { timeout: 30_000 }, async () => {
    const o = owner()
    assert.ok(o)
    const mark = o.out().length
    redis.kill('SIGSTOP')
    const stalled = Date.now()
    while (Date.now() - stalled < 5 * TTL_MS && !o.out().slice(mark).includes('not renewed in time')) await sleep(20)
    const stopped = Date.now() - stalled
    redis.kill('SIGCONT')
    // Renewed at most a third of the lease before the stall, believed for 0.9 of it.
    assert.ok(stopped <= TTL_MS, `the owner acted ${stopped} ms into the stall (owner lease ${TTL_MS} ms): ${o.out()}`)
    assert.match(o.out(), /not renewed in time/)
    const back = Date.now() + 10 * TTL_MS
    while (Date.now() < back && !(owner() && nodes.every((n) => ownerSeenBy(n) === owner().origin))) await sleep(100)
    assert.ok(owner(), nodes.map((n) => n.out()).join('\n---\n'))
    assert.equal(await call(nodes[0], 'after-stall'), 200)
    console.log(`# Redis stalled: the owner stopped acting ${stopped} ms in (owner lease ${TTL_MS} ms)`)
  })

  test('a paused owner (SIGSTOP): a request a follower forwarded to it is answered 503 once another owns the quota; resumed, it grants nothing on its own and follows', { timeout: 30_000 }, async () => {
    const o = owner()
    const f = nodes.find((n) => n !== o)
    o.child.kill('SIGSTOP')
    const paused = Date.now()
    // Forwarded to the paused owner: no answer comes from it.
    const waiting = await api(f, '/leases', { method: 'POST', body: JSON.stringify({ agent: 'paused', pool: 0, inputTokens: 10, maxTokens: 10 }) })
    const gaveUp = Date.now() - paused
    const body = await waiting.json()
    assert.equal(waiting.status, 503, JSON.stringify(body))
    assert.equal(body.error, 'owner_moved')
    assert.ok(gaveUp <= 3 * TTL_MS, `the forwarded request waited ${gaveUp} ms`)
    assert.equal(ownerSeenBy(f), f.origin, f.out())
    const mark = o.out().length
    o.child.kill('SIGCONT')
    // Resumed, it believes nothing past its term: refused, or forwarded to the new owner,
    // which then knows the agent.
    const asked = await api(o, '/leases', { method: 'POST', body: JSON.stringify({ agent: 'resumed', pool: 0, inputTokens: 10, maxTokens: 10 }) })
    const answer = await asked.json()
    if (asked.status !== 503) {
      const m = await (await api(f, '/metrics')).json()
      assert.ok(m.agents.some((a) => a.name === 'resumed'), `answered ${asked.status} ${JSON.stringify(answer)} by the resumed instance itself`)
    }
    const deadline = Date.now() + 5 * TTL_MS
    while (Date.now() < deadline && ownerSeenBy(o) !== f.origin) await sleep(50)
    assert.equal(ownerSeenBy(o), f.origin, o.out().slice(mark))
    assert.match(o.out().slice(mark), /not renewed in time/)
    assert.doesNotMatch(o.out().slice(mark), /granting 1\/\d+ of the quota/)
    // Both beat again before the next test counts them.
    await sleep(TTL_MS)
    console.log(`# owner paused: a forwarded request answered 503 after ${gaveUp} ms; resumed, it answered ${asked.status} and follows the new owner`)
  })

  test('Redis stopped: each instance grants from 1/N of the quota (N from the heartbeats); Redis back: one owner again', { timeout: 60_000 }, async () => {
    redis.kill('SIGKILL')
    await new Promise((r) => redis.once('exit', r))
    // Within an owner lease or two every instance says so and grants on its own.
    const deadline = Date.now() + 5 * TTL_MS
    while (Date.now() < deadline && !nodes.every((n) => ownerSeenBy(n) === null)) await sleep(100)
    for (const n of nodes) {
      assert.equal(ownerSeenBy(n), null, n.out())
      assert.match(n.out(), /granting 1\/2 of the quota here/)
    }
    // Each grants from its own share: the limits halved.
    for (const n of nodes) {
      const m = await (await api(n, '/metrics')).json()
      const lease = await (await api(n, '/leases', { method: 'POST', body: JSON.stringify({ agent: 'alone', pool: 0, inputTokens: 10, maxTokens: 10 }) })).json()
      assert.equal(lease.kind, 'grant', JSON.stringify(lease))
      assert.equal(m.pools[0].axes.find((x) => x.axis === 'requests').limit, RPM / nodes.length)
    }
    redis = await startRedis(redisPort)
    const back = Date.now() + 10 * TTL_MS
    while (Date.now() < back && !(owner() && nodes.every((n) => ownerSeenBy(n) === owner().origin))) await sleep(100)
    const o = owner()
    assert.ok(o, nodes.map((n) => n.out()).join('\n---\n'))
    for (const n of nodes) assert.equal(ownerSeenBy(n), o.origin)
    assert.equal(await call(nodes[0], 'after-redis'), 200)
    assert.equal(await call(nodes[1], 'after-redis'), 200)
  })

  test('its command line: a cluster needs a config, --advertise a cluster, a Redis URL and an owner lease in range', async () => {
    const bad = async (args, env = {}) => {
      try {
        await run(BIN, ['serve', '--port', '0', '--data', join(dir, 'bad'), ...args], { env: { ...process.env, ...env } })
        return null
      } catch (e) {
        return { code: e.code, stderr: e.stderr }
      }
    }
    let r = await bad(['--cluster', `redis://127.0.0.1:${redisPort}`])
    assert.equal(r.code, 2)
    assert.match(r.stderr, /--cluster needs --config/)
    r = await bad(['--config', config, '--advertise', 'http://127.0.0.1:1'])
    assert.equal(r.code, 2)
    assert.match(r.stderr, /--advertise is for a cluster/)
    r = await bad(['--config', config, '--cluster', 'rediss://127.0.0.1:1'])
    assert.equal(r.code, 2)
    assert.match(r.stderr, /TLS/)
    r = await bad(['--config', config, '--cluster', `redis://127.0.0.1:${redisPort}`], { TOKENWARDEN_OWNER_TTL_MS: '5' })
    assert.equal(r.code, 2)
    assert.match(r.stderr, /TOKENWARDEN_OWNER_TTL_MS must be/)
    r = await bad(['--config', config, '--cluster', `redis://127.0.0.1:${redisPort}`, '--advertise', 'ftp://x'])
    assert.equal(r.code, 2)
    assert.match(r.stderr, /--advertise must be/)
  })
})
