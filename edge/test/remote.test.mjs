// The npm package's remote driver against the edge limiter under workerd: the same fetch
// wrapper leases through the Worker; when the Worker is down the driver fails open to its
// local engine with a `fail_open` event (no error reaches agent code), and goes back to the
// Worker with `remote_restored` once it answers again.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { RemoteTokenwarden, nativeEngines } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const workerEntry = fileURLToPath(new URL('../src/worker.js', import.meta.url))

const SECRET = 'remote-secret-0123456789abcdef'
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 200_000, output_tokens_per_minute: 40_000, requests_per_minute: 2_000, max_concurrent: 4 }
const outdir = fileURLToPath(new URL('../.build/remote/', import.meta.url))
let mock
let persist
let worker
let port

// `strict` gives up on a call after one failed send; the drivers' local engines keep the
// default (six), so which core decided a call's next step shows.
const fleets = {
  f: {
    secret: SECRET,
    quotas: { q: { config: { pools: [POOL] } }, shared: { config: { pools: [POOL] } }, strict: { config: { pools: [POOL], backoff: { max_attempts: 1 } } } },
  },
}

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: workerEntry })
  mock = await startMockProvider({ inputTokensPerMinute: 200_000, outputTokensPerMinute: 40_000, concurrency: 4, replyTokens: 20, chunkDelayMs: 1 })
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-remote-'))
  worker = await startWorker({ outdir, persist, fleets })
  port = Number(new URL(worker.base).port)
})

after(async () => {
  await worker?.mf.dispose()
  await mock?.close()
  if (persist) rmSync(persist, { recursive: true, force: true })
})

const edgeMetrics = async () => (await (await fetch(`${worker.base}/v1/fleets/f/quotas/q/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()).pools[0].counters

async function fleet(tw, n, calls) {
  const errors = []
  await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const f = tw.fetch({ agent: `agent-${i}` })
      for (let c = 0; c < calls; c++) {
        try {
          const res = await f(`${mock.url}/v1/messages`, {
            method: 'POST',
            headers: { 'x-api-key': 'sk-ant-test', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, stream: c % 2 === 1, messages: [{ role: 'user', content: `agent ${i} call ${c} `.repeat(50) }] }),
          })
          if (res.status !== 200) errors.push(new Error(`status ${res.status}`))
          await res.text()
        } catch (e) {
          errors.push(e)
        }
      }
    }),
  )
  return errors
}

test('leases through the Worker, fails open when it is down, and comes back', async () => {
  const tw = new RemoteTokenwarden({
    url: worker.base,
    fleet: 'f',
    quota: 'q',
    secret: SECRET,
    engine: nativeEngines,
    config: { pools: [POOL] },
    timeoutMs: 1000,
    retryRemoteMs: 300,
  })
  const events = []
  for (const name of ['fail_open', 'remote_restored', 'remote_error', 'queued']) tw.on(name, (e) => events.push({ name, ...e }))

  // 1. Through the Worker: 8 agents, 2 calls each, concurrency 4 at the edge.
  assert.deepEqual(await fleet(tw, 8, 2), [])
  await new Promise((r) => setTimeout(r, 100)) // settles are sent as the responses end
  let counters = await edgeMetrics()
  assert.equal(Number(counters.settled), 16, 'the edge limiter settled every call')
  assert.ok(
    events.some((e) => e.name === 'queued'),
    'some calls queued at the edge (its concurrency limit is 4)',
  )
  assert.ok(!tw.failedOpen)

  // 2. The Worker goes down mid-run: calls go on, leased locally (at the whole quota: the
  // limiter saw this process alone), with one fail_open event.
  await worker.mf.dispose()
  const before = mock.stats().completed
  assert.deepEqual(await fleet(tw, 4, 2), [], 'no error reaches agent code')
  const open = events.filter((e) => e.name === 'fail_open')
  assert.equal(open.length, 1)
  assert.match(open[0].message, /did not answer.*leasing locally at the whole quota \(the limiter saw no other process/)
  assert.equal(open[0].share, 1)
  assert.ok(tw.failedOpen)
  assert.equal(mock.stats().completed - before, 8, 'the local share served them')

  // 3. The Worker is back (same storage): the next call after retryRemoteMs goes to it.
  worker = await startWorker({ outdir, persist, fleets, port })
  await new Promise((r) => setTimeout(r, 350))
  assert.deepEqual(await fleet(tw, 2, 1), [])
  await new Promise((r) => setTimeout(r, 100))
  assert.ok(events.some((e) => e.name === 'remote_restored'))
  assert.ok(!tw.failedOpen)
  counters = await edgeMetrics()
  assert.equal(Number(counters.settled), 18, 'the restarted Worker kept its counters and settled the new calls')
  assert.deepEqual(
    events.filter((e) => e.name === 'remote_error'),
    [],
  )
  assert.equal(mock.stats().overLimit, false)
  tw.close()
})

test('an aborted queued acquire stops its long poll at once; refusals emit rejected; events carry the lease ids', async () => {
  // Requests to the limiter in flight, counted through the driver's own fetch.
  let open = 0
  const counting = async (input, init) => {
    open++
    try {
      return await fetch(input, init)
    } finally {
      open--
    }
  }
  const tw = new RemoteTokenwarden({ url: worker.base, fleet: 'f', quota: 'q', secret: SECRET, engine: nativeEngines, config: { pools: [POOL] }, fetch: counting, pollMs: 20_000 })
  const events = []
  for (const name of ['queued', 'granted', 'rejected', 'settled']) tw.on(name, (e) => events.push({ name, ...e }))
  const held = []
  for (let i = 0; i < 4; i++) held.push(await tw.acquire({ agent: `holder-${i}`, pool: 0, inputTokens: 100, maxTokens: 10 }))
  assert.ok(
    held.every((l) => Number.isSafeInteger(l.id) && l.id >= 0),
    "a remote lease has the limiter's id",
  )

  const ac = new AbortController()
  const waiting = tw.acquire({ agent: 'waiter', pool: 0, inputTokens: 100, maxTokens: 10 }, { signal: ac.signal })
  await new Promise((r) => setTimeout(r, 200))
  assert.equal(open, 1, 'one long poll open')
  const abortedAt = performance.now()
  ac.abort()
  await assert.rejects(waiting, { code: 'aborted' })
  await new Promise((r) => setTimeout(r, 100))
  assert.equal(open, 0, 'the long poll was aborted with the acquire, not left running')
  assert.ok(performance.now() - abortedAt < 2000)
  const queued = events.find((e) => e.name === 'queued')
  assert.ok(queued.lease >= 0, `queued carries the ticket id, got ${queued.lease}`)

  // A request that can never fit: rejected, with the event.
  await assert.rejects(tw.acquire({ agent: 'huge', pool: 0, inputTokens: 10_000_000, maxTokens: 10 }), { code: 'rejected' })
  assert.deepEqual(
    events.filter((e) => e.name === 'rejected').map((e) => [e.reason.kind, e.retryAt]),
    [['exceeds_capacity', null]],
  )
  for (const l of held) {
    const s = await l.settle({ inputTokens: 100, outputTokens: 5 })
    assert.equal(Number(s.used[0]), 100, 'settle resolves with the settlement')
  }
  assert.deepEqual(
    events.filter((e) => e.name === 'settled').map((e) => e.lease),
    held.map((l) => l.id),
  )
  assert.ok(events.filter((e) => e.name === 'granted').every((e) => e.lease >= 0))
  tw.close()
})

test("a provider's answer is decided by the limiter's core while it answers, not by the local engine", async () => {
  const tw = new RemoteTokenwarden({ url: worker.base, fleet: 'f', quota: 'strict', secret: SECRET, engine: nativeEngines, config: { pools: [POOL] } })
  const errors = []
  tw.on('remote_error', (e) => errors.push(e))
  const sent = mock.log.length
  mock.fail429(1, { retryAfterSeconds: 1 })
  const res = await tw.fetch({ agent: 'strict-agent' })(`${mock.url}/v1/messages`, {
    method: 'POST',
    headers: { 'x-api-key': 'sk-ant-test', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 50, messages: [{ role: 'user', content: 'hello' }] }),
  })
  // The limiter's core gave up after the one failed send its quota allows: the 429 is the
  // caller's. (The local engine would have waited out the retry-after and sent again.)
  assert.equal(res.status, 429)
  await res.text()
  assert.equal(mock.log.length - sent, 1, 'sent once')
  assert.deepEqual(errors, [])
  const counters = (await (await fetch(`${worker.base}/v1/fleets/f/quotas/strict/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()).pools[0].counters
  assert.equal(Number(counters.settled), 1, 'the limiter settled the refused call (as nothing used)')
  tw.close()
})

test('the remote driver is an engine over HTTP: every input is one POST …/handle (long polls aside), and its local engine decides nothing while the limiter answers', async () => {
  const seen = []
  const recording = async (input, init) => {
    const url = new URL(String(input))
    seen.push({ method: init?.method ?? 'GET', path: url.pathname.replace(/^\/v1\/fleets\/f\/quotas\/q/, ''), op: typeof init?.body === 'string' ? JSON.parse(init.body).op : null })
    return fetch(input, init)
  }
  const tw = new RemoteTokenwarden({ url: worker.base, fleet: 'f', quota: 'q', secret: SECRET, engine: nativeEngines, config: { pools: [POOL] }, fetch: recording })
  const local = tw.engine
  const errors = []
  tw.on('remote_error', (e) => errors.push(e))
  assert.deepEqual(await fleet(tw, 2, 2), [])
  mock.fail429(1, { retryAfterSeconds: 0 })
  assert.deepEqual(await fleet(tw, 1, 1), [], "a 429 the limiter's core waits out")
  const l = await tw.acquire({ agent: 'plain', pool: 0, inputTokens: 100, maxTokens: 10 })
  assert.ok(Number(await l.renew()) > 0)
  await l.settle({ inputTokens: 90, outputTokens: 5 })
  ;(await tw.acquire({ agent: 'plain', pool: 0, inputTokens: 100, maxTokens: 10 })).cancel()
  await (await tw.acquire({ agent: 'plain', pool: 0, inputTokens: 100, maxTokens: 10 })).interrupted(null)
  await tw.openTask({ task: 77, role: 'planner', unblocks: 1 })
  assert.equal(await tw.taskFailed(77, 5), 0)
  assert.equal((await tw.endTask(77, 'merged')).outcome, 'merged')
  await new Promise((r) => setTimeout(r, 100))
  assert.deepEqual(errors, [])
  const other = seen.filter((r) => !(r.method === 'POST' && r.path === '/handle') && !(r.method === 'GET' && r.path.startsWith('/leases/')))
  assert.deepEqual(other, [], 'nothing but the protocol and long polls')
  const ops = new Set(seen.map((r) => r.op).filter((op) => op !== null))
  for (const op of ['call_lease', 'call_response', 'settle', 'request_lease', 'renew', 'cancel', 'call_interrupted', 'open_task', 'task_failed', 'end_task'])
    assert.ok(ops.has(op), `${op} went to the limiter`)
  // The local engine took the providers' headers in but granted nothing.
  const counters = local.metrics(0).pools[0].counters
  for (const k of ['grantedNow', 'grantedFromQueue', 'queued', 'rejected', 'settled']) assert.equal(Number(counters[k]), 0, `local ${k}`)
  assert.equal(Number(counters.rateLimited), 1, `the local engine saw the 429: ${JSON.stringify(counters)}`)
  tw.close()
})

test('failing open, each of N processes leases locally at 1/N of the quota, and says so', async () => {
  const make = () => new RemoteTokenwarden({ url: worker.base, fleet: 'f', quota: 'shared', secret: SECRET, engine: nativeEngines, config: { pools: [POOL] }, timeoutMs: 500, retryRemoteMs: 60_000 })
  const a = make()
  const b = make()
  const opened = []
  a.on('fail_open', (e) => opened.push(e))
  // Both lease through the limiter, which counts the two processes.
  // (a asks again after b: each answer carries the count as of that request.)
  for (const tw of [a, b, a]) await (await tw.acquire({ agent: 7, pool: 0, inputTokens: 100, maxTokens: 10 })).settle({ inputTokens: 100 })
  // The whole quota hands out 170k input tokens at once (200k at 85 %): 150k would fit it.
  await worker.mf.dispose()
  try {
    await assert.rejects(a.acquire({ agent: 7, pool: 0, inputTokens: 150_000, maxTokens: 10 }), (e) => e.code === 'rejected' && e.reason.kind === 'exceeds_capacity')
    assert.equal(opened.length, 1)
    assert.equal(opened[0].share, 0.5)
    assert.match(opened[0].message, /1\/2 of the quota \(the limiter last saw 2 processes/)
    // Half of it still serves what fits half.
    const l = await a.acquire({ agent: 7, pool: 0, inputTokens: 50_000, maxTokens: 10 })
    l.settle({ inputTokens: 50_000 })
  } finally {
    a.close()
    b.close()
    worker = await startWorker({ outdir, persist, fleets, port })
  }
})

test('a process that never reached the limiter leases nothing locally, unless told how many share the quota; an engine instance is refused', async () => {
  // Port 1 on loopback: nothing listens, the connection is refused at once.
  const down = { url: 'http://127.0.0.1:1', fleet: 'f', quota: 'q', secret: SECRET, engine: nativeEngines, config: { pools: [POOL] }, timeoutMs: 500 }
  const alone = new RemoteTokenwarden(down)
  const opened = []
  alone.on('fail_open', (e) => opened.push(e))
  await assert.rejects(alone.acquire({ agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 }), (e) => e.code === 'limiter_unreachable' && /processes/.test(e.message))
  assert.equal(opened.length, 1)
  assert.equal(opened[0].share, 0)
  alone.close()
  // Told: 1/4 of the quota, never the whole of it.
  const told = new RemoteTokenwarden({ ...down, processes: 4 })
  const shares = []
  told.on('fail_open', (e) => shares.push(e.share))
  const l = await told.acquire({ agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 })
  l.settle({ inputTokens: 100 })
  assert.deepEqual(shares, [0.25])
  // A quarter of the pool's input tokens cannot hold what half of them asks.
  const half = Math.floor(POOL.input_tokens_per_minute / 2)
  await assert.rejects(told.acquire({ agent: 1, pool: 0, inputTokens: half, maxTokens: 10 }), (e) => e.code === 'rejected')
  told.close()
  assert.throws(() => new RemoteTokenwarden({ ...down, engine: nativeEngines.create({ pools: [POOL] }, 1, 0) }), /`engine` as engines.*not an engine instance/)
  assert.throws(() => new RemoteTokenwarden({ ...down, processes: 0 }), /processes.*1 to 4096/)
})

test("a limiter that says its owner is moving is asked again, not failed open; a proxy's 5xx is an outage; a refused secret is an error", async () => {
  // A driver whose requests to the limiter go through `fetchThrough`, with its fail_open events.
  const through = (fetchThrough, options = {}) => {
    const tw = new RemoteTokenwarden({ url: worker.base, fleet: 'f', quota: 'q', secret: SECRET, engine: nativeEngines, config: { pools: [POOL] }, fetch: fetchThrough, ...options })
    const opened = []
    tw.on('fail_open', (e) => opened.push(e))
    return { tw, opened }
  }
  const answer = (status, body) => async () => new Response(typeof body === 'string' ? body : JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } })
  const lease = async (tw) => (await tw.acquire({ agent: 3, pool: 0, inputTokens: 100, maxTokens: 10 })).settle({ inputTokens: 100 })

  // The first answers come from a limiter whose quota is changing owner (serve's 503
  // `owner_moved` in a cluster), then the Worker answers.
  let moving = 2
  const asked = []
  const moved = through(
    async (url, init) => {
      asked.push(moving)
      if (moving === 0) return fetch(url, init)
      moving--
      return new Response(JSON.stringify({ error: 'owner_moved', message: 'retry' }), { status: 503, headers: { 'content-type': 'application/json', 'retry-after': '0.05' } })
    },
    { timeoutMs: 2_000 },
  )
  await lease(moved.tw)
  assert.deepEqual(moved.opened, [], 'no fail_open while the limiter said to ask again')
  assert.equal(moved.tw.failedOpen, false)
  assert.deepEqual(asked.slice(0, 3), [2, 1, 0], 'asked again twice, then answered by the Worker')
  moved.tw.close()

  // The same code for longer than the call's time: as good as unreachable (fails open).
  const stuck = through(answer(503, { error: 'owner_moved' }), { timeoutMs: 300, processes: 2 })
  await lease(stuck.tw)
  assert.equal(stuck.opened.length, 1)
  assert.match(stuck.opened[0].message, /answered 503 \(owner_moved\)/)
  stuck.tw.close()

  // A 502 from a proxy with no limiter behind it: an outage at once.
  const proxied = through(answer(502, 'Bad Gateway'), { processes: 2 })
  await lease(proxied.tw)
  assert.equal(proxied.opened.length, 1)
  assert.match(proxied.opened[0].message, /answered 502/)
  proxied.tw.close()

  // A refused secret, even without a JSON body, is a misconfiguration: an error, not a fail-open.
  const refused = through(answer(401, 'Unauthorized'), { processes: 2 })
  await assert.rejects(lease(refused.tw), (e) => e.code === 'invalid_argument' && /refused the fleet secret \(401\)/.test(e.message))
  assert.deepEqual(refused.opened, [])
  refused.tw.close()
})
