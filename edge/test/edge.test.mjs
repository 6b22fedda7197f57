// The edge limiter under workerd (miniflare): the HTTP API, authentication and fleet
// isolation, validation, persistence across a restart of the runtime in the middle of a
// run, Prometheus metrics, and proxy mode against the mock provider (with the official
// Anthropic SDK pointed at the Worker when Node >= 22).
import assert from 'node:assert/strict'
import net from 'node:net'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'

const workerEntry = fileURLToPath(new URL('../src/worker.js', import.meta.url))

const here = (p) => fileURLToPath(new URL(p, import.meta.url))
const outdir = here('../.build/edge/')
const SECRET_A = 'fleet-a-secret-0123456789'
/** The proxy body limit these tests configure (the default is 32 MiB). */
const PROXY_LIMIT = 1024 * 1024
const SECRET_B = 'fleet-b-secret-9876543210'
const ADMIN_A = 'fleet-a-admin-secret-000000'
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 100_000, output_tokens_per_minute: 20_000, requests_per_minute: 1_000, max_concurrent: 2 }
// 6,000 input tokens a minute (5,100 handed out at the 85 % margin): 85 a second.
const SLOW = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 6_000, output_tokens_per_minute: 100_000, requests_per_minute: 1_000 }

let mock
let persist
let mf
let base

function fleets() {
  return JSON.stringify({
    'fleet-a': {
      secret: SECRET_A,
      admin_secret: ADMIN_A,
      quotas: {
        main: { config: { pools: [POOL] }, upstream: mock.url },
        other: { config: { pools: [POOL] } },
        limited: { config: { pools: [POOL] } },
        short: { config: { pools: [POOL], lease_ttl_ms: 1000 } },
        locked: { config: { pools: [POOL] } },
        big: { config: { pools: [{ ...POOL, input_tokens_per_minute: 100_000_000, output_tokens_per_minute: 100_000_000, requests_per_minute: 1_000_000, max_concurrent: null }] } },
        retry: { config: { pools: [POOL] }, upstream: mock.url },
        slow: { config: { pools: [SLOW] }, upstream: mock.url },
        neverfits: { config: { pools: [POOL] }, upstream: mock.url },
        clocked: { config: { pools: [POOL] } },
        longwait: { config: { pools: [POOL] }, upstream: mock.url },
        gone: { config: { pools: [SLOW] }, upstream: mock.url },
        openai: { config: { pools: [{ name: 'gpt-5', counting: 'openai', tokens_per_minute: 200_000, requests_per_minute: 1_000, max_concurrent: 2 }] }, upstream: mock.url },
      },
    },
    'fleet-b': { secret: SECRET_B, quotas: { main: { config: { pools: [POOL] } } } },
  })
}

async function start() {
  ;({ mf, base } = await startWorker({ outdir, persist, fleets: JSON.parse(fleets()), bindings: { TOKENWARDEN_MAX_PROXY_BODY_BYTES: String(PROXY_LIMIT), TOKENWARDEN_TEST_CLOCK: '1' } }))
}

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: workerEntry })
  mock = await startMockProvider({ inputTokensPerMinute: 100_000, outputTokensPerMinute: 20_000, concurrency: 4, replyTokens: 30, chunkDelayMs: 2, recordHeaders: true })
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-edge-'))
  await start()
})

after(async () => {
  await mf?.dispose()
  await mock?.close()
  if (persist) rmSync(persist, { recursive: true, force: true })
})

const api = (path, { secret = SECRET_A, fleet = 'fleet-a', quota = 'main', ...init } = {}) =>
  fetch(`${base}/v1/fleets/${fleet}/quotas/${quota}${path}`, {
    ...init,
    headers: { ...(secret === null ? {} : { authorization: `Bearer ${secret}` }), 'content-type': 'application/json', ...init.headers },
  })
const post = (path, body, opts = {}) => api(path, { method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body), ...opts })
const lease = (body, opts) => post('/leases', { agent: 'a1', pool: 'claude-sonnet-4-6', inputTokens: 1000, maxTokens: 100, ...body }, opts)
/**
 * Moves a quota's clock by hand (the Worker runs with TOKENWARDEN_TEST_CLOCK=1): the first
 * call stops the object's time, which from then on passes only here, its timers firing as
 * it goes. Returns the object's new now.
 */
async function advance(quota, ms) {
  const r = await post('/admin/clock', { advanceMs: ms }, { quota, secret: ADMIN_A })
  assert.equal(r.status, 200, await r.clone().text())
  return (await r.json()).now
}
/** Real time, for a request to reach the object and for what it sets going to settle. */
const settle = (ms = 100) => new Promise((r) => setTimeout(r, ms))
/** Resolves once `cond()` holds (polled in real time; the test's own timeout bounds it). */
async function until(cond) {
  while (!(await cond())) await settle(20)
}
/** Whether a promise has settled by now. */
async function isSettled(p) {
  let done = false
  p.then(
    () => (done = true),
    () => (done = true),
  )
  await settle()
  return done
}

describe('the HTTP API', () => {
  test('grant, settle, and the handle is spent afterwards', async () => {
    const r = await lease({})
    assert.equal(r.status, 200)
    const d = await r.json()
    assert.equal(d.kind, 'grant')
    assert.match(d.lease, /^tw2\.fleet-a\.main\.\d+\.[0-9a-z]+\.[A-Za-z0-9_-]{27}$/)
    assert.ok(d.expiresAt > Date.now() - 5000)
    const s = await post(`/leases/${d.lease}/settle`, { inputTokens: 900, outputTokens: 40 })
    assert.equal(s.status, 200)
    assert.deepEqual((await s.json()).used, [900, 40, 940, 1])
    const again = await post(`/leases/${d.lease}/settle`, { inputTokens: 900 })
    assert.equal(again.status, 404)
    assert.equal((await again.json()).error, 'unknown_lease')
  })

  test('a queued ticket is granted to a long poll when a slot frees', async () => {
    const a = await (await lease({ agent: 'q1' })).json()
    const b = await (await lease({ agent: 'q2' })).json()
    const c = await lease({ agent: 'q3' })
    assert.equal(c.status, 202)
    const ticket = await c.json()
    assert.equal(ticket.kind, 'queued')
    const poll = api(`/leases/${ticket.lease}?wait=5000`)
    await new Promise((r) => setTimeout(r, 100))
    await post(`/leases/${a.lease}/settle`, { inputTokens: 1000, outputTokens: 10 })
    const granted = await poll
    assert.equal(granted.status, 200)
    const g = await granted.json()
    assert.equal(g.kind, 'grant')
    assert.equal(g.lease, ticket.lease)
    assert.ok(g.waitedMs >= 50, `waited ${g.waitedMs} ms`)
    for (const l of [b.lease, g.lease]) assert.equal((await api(`/leases/${l}`, { method: 'DELETE' })).status, 200)
  })

  test('cancelling a queued ticket ends its long poll at once (404), not at its timeout', async () => {
    // The quota's time stands still: the poll's 20 s timeout never comes, so only the
    // cancel can end it.
    const quota = 'clocked'
    await advance(quota, 0)
    const a = await (await lease({ agent: 'c1' }, { quota })).json()
    const b = await (await lease({ agent: 'c2' }, { quota })).json()
    const ticket = await (await lease({ agent: 'c3' }, { quota })).json()
    assert.equal(ticket.kind, 'queued')
    const poll = api(`/leases/${ticket.lease}?wait=20000`, { quota })
    assert.equal(await isSettled(poll), false, 'the long poll waits')
    assert.equal((await api(`/leases/${ticket.lease}`, { method: 'DELETE', quota })).status, 200)
    const ended = await poll
    assert.equal(ended.status, 404)
    for (const l of [a.lease, b.lease]) assert.equal((await api(`/leases/${l}`, { method: 'DELETE', quota })).status, 200)
    // And a long poll does end at its timeout, on the object's clock: still queued (202).
    const c = await (await lease({ agent: 'c4' }, { quota })).json()
    const d = await (await lease({ agent: 'c5' }, { quota })).json()
    const t2 = await (await lease({ agent: 'c6' }, { quota })).json()
    const timed = api(`/leases/${t2.lease}?wait=5000`, { quota })
    await settle()
    await advance(quota, 4_999)
    assert.equal(await isSettled(timed), false, '1 ms before its timeout')
    await advance(quota, 1)
    assert.equal((await timed).status, 202)
    for (const l of [c.lease, d.lease, t2.lease]) assert.equal((await api(`/leases/${l}`, { method: 'DELETE', quota })).status, 200)
  })

  test("the clock route is the operator's, and checks its body", async () => {
    assert.equal((await post('/admin/clock', { advanceMs: 1 }, { quota: 'clocked' })).status, 401, 'not with the fleet secret')
    const bad = await post('/admin/clock', { advanceMs: -1 }, { quota: 'clocked', secret: ADMIN_A })
    assert.equal(bad.status, 400)
    assert.equal((await bad.json()).field, 'advanceMs')
    const unknown = await post('/admin/clock', { advanceMs: 1, by: 2 }, { quota: 'clocked', secret: ADMIN_A })
    assert.equal((await unknown.json()).field, 'by')
  })

  test('a request that can never fit is a rejection with no retry time', async () => {
    // Above the 100k input limit itself (95k, within the limit, would wait for a full bucket).
    const d = await (await lease({ inputTokens: 100_001 })).json()
    assert.equal(d.kind, 'reject')
    assert.equal(d.retryable, false)
    assert.equal(d.retryAt, null)
    assert.deepEqual(d.reason, { kind: 'exceeds_capacity', axis: 'input_tokens' })
  })

  test('provider headers and 429s are reported; metrics as JSON and Prometheus text', async () => {
    // Its own quota: the 429 pauses the whole pool for two seconds.
    const quota = 'limited'
    const d = await (await lease({ agent: 'r1' }, { quota })).json()
    const r = await post('/responses', { pool: 'claude-sonnet-4-6', lease: d.lease, status: 429, headers: [['retry-after', '2']] }, { quota })
    assert.equal(r.status, 200)
    assert.equal((await r.json()).report.retryAfterMs, 2000)
    await post(`/leases/${d.lease}/settle`, {}, { quota })
    const m = await (await api('/metrics', { quota })).json()
    const pool = m.pools[0]
    assert.equal(pool.name, 'claude-sonnet-4-6')
    assert.ok(pool.pausedUntil > m.now, 'the pool is paused')
    assert.ok(Number(pool.counters.rateLimited) >= 1)
    const text = await (await api('/metrics?format=prometheus', { quota })).text()
    assert.match(text, /^# TYPE tokenwarden_rate_limited_total counter$/m)
    assert.match(text, /tokenwarden_rate_limited_total\{[^}]*fleet="fleet-a"[^}]*\} [1-9]/)
  })
})

describe('security', () => {
  test('401 without a secret or with a wrong one; the same for an unknown fleet', async () => {
    assert.equal((await lease({}, { secret: null })).status, 401)
    assert.equal((await lease({}, { secret: 'wrong-wrong-wrong-wrong' })).status, 401)
    assert.equal((await lease({}, { fleet: 'fleet-z' })).status, 401)
    assert.equal((await lease({}, { secret: SECRET_B })).status, 401, "fleet-b's secret does not open fleet-a")
    assert.equal((await lease({}, { quota: 'nope' })).status, 404)
  })

  test("403 for another fleet's lease, 404 for forged or malformed handles", async () => {
    const d = await (await lease({ agent: 's1' }, { fleet: 'fleet-b', secret: SECRET_B })).json()
    assert.equal(d.kind, 'grant')
    const theirs = await post(`/leases/${d.lease}/settle`, {})
    assert.equal(theirs.status, 403, "fleet-a cannot settle fleet-b's lease")
    const renamed = await post(`/leases/${d.lease.replace('fleet-b.main', 'fleet-a.main')}/settle`, {})
    assert.equal(renamed.status, 404, "relabelling fleet-b's handle as fleet-a's breaks its MAC")
    const mine = await (await lease({ agent: 's2' })).json()
    const forged = mine.lease.replace(/\.(\d+)\./, (_m, id) => `.${Number(id) + 1}.`)
    assert.equal((await post(`/leases/${forged}/settle`, {})).status, 404)
    assert.equal((await post('/leases/not-a-handle/settle', {})).status, 404)
    assert.equal((await post(`/leases/${mine.lease}/settle`, {}, { fleet: 'fleet-b', secret: SECRET_B })).status, 403)
    assert.equal((await post(`/leases/${d.lease}/settle`, {}, { fleet: 'fleet-b', secret: SECRET_B })).status, 200)
    assert.equal((await post(`/leases/${mine.lease}/settle`, {})).status, 200)
  })

  test('bad bodies are 400 with an error that names the problem', async () => {
    const cases = [
      [await post('/leases', '{nope'), 'invalid_json'],
      [await lease({ colour: 'red' }), 'invalid_argument', /colour/],
      [await lease({ inputTokens: -1 }), 'invalid_argument', /inputTokens/],
      [await lease({ inputTokens: 2 ** 60 }), 'too_large'],
      [await lease({ pool: 'gpt-9' }), 'unknown_pool', /claude-sonnet-4-6/],
      [await lease({ role: 'boss' }), 'invalid_argument', /role/],
      [await post('/responses', { pool: 0, status: 200, headers: 'x' }), 'invalid_argument', /headers/],
    ]
    for (const [res, code, message] of cases) {
      assert.equal(res.status, 400, code)
      const body = await res.json()
      assert.equal(body.error, code)
      if (message) assert.match(body.message, message)
    }
  })
})

describe('per-agent credentials', () => {
  test('an agent credential leases only for its agent and ends only its own leases', async () => {
    const mint = (agent, secret = SECRET_A, fleet = 'fleet-a') => fetch(`${base}/v1/fleets/${fleet}/agents/${agent}/credential`, { method: 'POST', headers: { authorization: `Bearer ${secret}` } })
    const minted = await mint('alice')
    assert.equal(minted.status, 200)
    const { credential } = await minted.json()
    assert.match(credential, /^twa1\.fleet-a\.alice\.[A-Za-z0-9_-]{43}$/)
    assert.equal((await mint('bob', credential)).status, 403, 'a credential cannot mint another')
    assert.equal((await mint('bob', 'wrong-secret-000000000')).status, 401)
    assert.equal((await mint('bad name!')).status, 400)

    const mine = await (await lease({ agent: undefined }, { secret: credential })).json()
    assert.equal(mine.kind, 'grant', 'no agent in the body: the credential names it')
    const again = await lease({ agent: 'alice' }, { secret: credential })
    assert.equal(again.status, 200, "the body may repeat the credential's agent")
    assert.equal((await post(`/leases/${(await again.json()).lease}/settle`, {}, { secret: credential })).status, 200)
    const other = await lease({ agent: 'bob' }, { secret: credential })
    assert.equal(other.status, 403)
    assert.match((await other.json()).message, /alice/)

    // Bob's lease, taken with the fleet secret: alice's credential cannot end it.
    const bobs = await (await lease({ agent: 'bob' })).json()
    for (const res of [
      await post(`/leases/${bobs.lease}/settle`, {}, { secret: credential }),
      await api(`/leases/${bobs.lease}`, { method: 'DELETE', secret: credential }),
      await api(`/leases/${bobs.lease}?wait=0`, { secret: credential }),
      await post(`/leases/${bobs.lease}/interrupted`, { seen: null }, { secret: credential }),
      await post('/responses', { pool: 0, lease: bobs.lease, status: 200, headers: [] }, { secret: credential }),
    ]) {
      assert.equal(res.status, 403, "another agent's lease is forbidden")
      assert.equal((await res.json()).error, 'forbidden')
    }
    assert.equal((await post(`/leases/${mine.lease}/settle`, { inputTokens: 900 }, { secret: credential })).status, 200)
    assert.equal((await post(`/leases/${bobs.lease}/settle`, {})).status, 200, 'the fleet secret still can')

    // Forged: another agent's name under alice's MAC, or alice's credential for another fleet.
    const forged = credential.replace('.alice.', '.bob.')
    assert.equal((await lease({ agent: 'bob' }, { secret: forged })).status, 401)
    assert.equal((await lease({ agent: 'alice' }, { secret: credential, fleet: 'fleet-b' })).status, 401)
    // A client cannot smuggle the Worker's internal header to act for someone else.
    const smuggled = await post('/leases', { agent: 'bob', pool: 0, inputTokens: 10 }, { secret: credential, headers: { 'x-tw-agent': 'bob' } })
    assert.equal(smuggled.status, 403)
  })
})

describe('persistence', () => {
  test('a restart of the runtime mid-run loses no lease, ticket or debt', async () => {
    const quota = 'other'
    const l1 = await (await lease({ agent: 'p1', inputTokens: 60_000 }, { quota })).json()
    const l2 = await (await lease({ agent: 'p2', inputTokens: 1000 }, { quota })).json()
    const t3 = await lease({ agent: 'p3', inputTokens: 1000 }, { quota })
    assert.equal(t3.status, 202)
    const ticket = await t3.json()
    // Debt: l2 used far more than it reserved.
    const settling = Date.now()
    await post(`/leases/${l2.lease}/settle`, { inputTokens: 20_000, outputTokens: 10 }, { quota })
    const before = await (await api('/metrics', { quota })).json()
    // A reading's level is as of the object's last change (the settle), which came at most
    // this long before the reading's `now`.
    const settleToReading = Date.now() - settling

    await mf.dispose()
    await start()

    const after = await (await api('/metrics', { quota })).json()
    assert.deepEqual(after.pools[0].counters, before.pools[0].counters, 'counters survive')
    // Agents keep their names (metrics, dashboard, Prometheus) before they call again.
    assert.deepEqual(after.agents.map((a) => a.name).sort(), ['p1', 'p2', 'p3'])
    assert.equal(after.liveLeases, before.liveLeases, 'leases and tickets survive')
    // The debt survives: no more input capacity than the refill (85,000 a minute) over the
    // time from the settle to the second reading: between the two readings on the object's
    // own clock (the restart takes what it takes; no wall-time bound), plus the time from
    // the settle to the first reading (its level is the settle's). The debt is 19,000.
    const refill = Math.ceil(((Number(after.now) - Number(before.now) + settleToReading) * 85_000) / 60_000) + 20
    assert.ok(Number(before.pools[0].axes[0].available) + refill < 85_000, 'read before the bucket could refill: the check can tell')
    assert.ok(
      Number(after.pools[0].axes[0].available) <= Number(before.pools[0].axes[0].available) + refill,
      `the debt survives: ${JSON.stringify([before.pools[0].axes[0].available, after.pools[0].axes[0].available, refill])}`,
    )
    // The ticket is still queued and is granted when l1 settles after the restart.
    const poll = api(`/leases/${ticket.lease}?wait=5000`, { quota })
    await new Promise((r) => setTimeout(r, 100))
    assert.equal((await post(`/leases/${l1.lease}/settle`, { inputTokens: 60_000, outputTokens: 10 }, { quota })).status, 200)
    const g = await (await poll).json()
    assert.equal(g.kind, 'grant')
    assert.equal((await post(`/leases/${g.lease}/settle`, { inputTokens: 1000 }, { quota })).status, 200)
  })
})

describe('persistence of a large state', () => {
  test('400 leases of 400 agents (a snapshot stored in chunks) survive a restart, and each settles once', async () => {
    const quota = 'big'
    const handles = []
    for (let b = 0; b < 8; b++) {
      const batch = await Promise.all(Array.from({ length: 50 }, (_, i) => lease({ agent: `bulk-${b * 50 + i}`, inputTokens: 500 }, { quota }).then((r) => r.json())))
      for (const d of batch) {
        assert.equal(d.kind, 'grant', JSON.stringify(d))
        handles.push(d.lease)
      }
    }
    const before = await (await api('/metrics', { quota })).json()
    assert.equal(before.liveLeases, 400)

    await mf.dispose()
    await start()

    const after = await (await api('/metrics', { quota })).json()
    assert.equal(after.liveLeases, 400, 'every lease survives')
    assert.deepEqual(after.pools[0].counters, before.pools[0].counters)
    assert.equal(after.agents.length, before.agents.length)
    const settled = await Promise.all(handles.map((h) => post(`/leases/${h}/settle`, { inputTokens: 400, outputTokens: 10 }, { quota }).then((r) => r.status)))
    assert.deepEqual([...new Set(settled)], [200])
    assert.equal((await post(`/leases/${handles[0]}/settle`, {}, { quota })).status, 404, 'and only once')
    assert.equal((await (await api('/metrics', { quota })).json()).liveLeases, 0)
  })
})

describe('the alarm', () => {
  test('the alarm reaps expired leases and grants the queued ticket (the object keeps no timers)', async () => {
    const quota = 'short'
    const held = []
    for (let i = 0; i < 2; i++) held.push(await (await lease({ agent: `h${i}` }, { quota })).json())
    const ticket = await (await lease({ agent: 'h2' }, { quota })).json()
    assert.equal(ticket.kind, 'queued')
    const first = await (await api('/metrics', { quota })).json()
    assert.equal(Number(first.pools[0].counters.expired), 0, 'nothing reaped yet')
    await new Promise((r) => setTimeout(r, 1600))
    const m = await (await api('/metrics', { quota })).json()
    assert.equal(Number(m.pools[0].counters.expired), 2, 'both leases were reaped by the alarm')
    assert.equal(Number(m.pools[0].counters.grantedFromQueue), 1, 'the ticket was granted by the alarm')
    const settle = await post(`/leases/${held[0].lease}/settle`, {}, { quota })
    assert.equal(settle.status, 404, 'an expired lease cannot be settled')
  })
})

describe('no client input gets a 500', () => {
  test('a bounded randomized walk of 3,000 requests over methods, paths, bodies and headers finds no 500', { timeout: 300_000 }, async () => {
    // A small seeded PRNG, so a failure names a reproducible case.
    let state = 0x2545f491
    const rnd = (n) => {
      state ^= state << 13
      state ^= state >>> 17
      state ^= state << 5
      return (state >>> 0) % n
    }
    const pick = (xs) => xs[rnd(xs.length)]
    const deep = (d) => (d === 0 ? 1 : [deep(d - 1)])
    const values = () => [null, 0, -1, 1.5, 2 ** 64, 'x', '', true, [], {}, [null], [[1, 2]], [['a', null]], { a: 1 }, deep(200), 'a'.repeat(5000), Number.MAX_SAFE_INTEGER]
    const segments = [
      'leases',
      'proxy',
      'metrics',
      'dashboard',
      'responses',
      'settle',
      'cancel',
      'renew',
      'interrupted',
      'tasks',
      'done',
      'failed',
      'admin',
      'reset',
      'agents',
      'worker',
      'anthropic',
      'openai',
      'chat',
      'completions',
      'v1',
      'messages',
      '%E0%A4%A',
      '%',
      '%zz',
      '..',
      '.',
      '',
      'tw1.fleet-a.main.1.abc',
      'tw2.fleet-a.main.1.zz.abc',
      'twa1.fleet-a.x.abc',
      'a'.repeat(300),
      '%00',
      '%2F',
    ]
    const fields = [
      'agent',
      'pool',
      'inputTokens',
      'maxTokens',
      'role',
      'unblocks',
      'failureSignature',
      'status',
      'headers',
      'lease',
      'model',
      'messages',
      'max_tokens',
      'stream',
      'cachedPrefixTokens',
      'outputTokens',
    ]
    const failures = []
    for (let i = 0; i < 3_000; i++) {
      const method = pick(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD'])
      const depth = 1 + rnd(4)
      const tail = Array.from({ length: depth }, () => pick(segments)).join('/')
      const path = pick([
        `/v1/fleets/fleet-a/quotas/main/${tail}`,
        `/v1/fleets/${pick(segments)}/quotas/${pick(segments)}/${tail}`,
        `/${tail}`,
        `/v1/fleets/fleet-a/quotas/main/proxy/v1/messages`,
        '/v1/fleets/fleet-a/quotas/main/leases',
        '/v1/fleets/fleet-a/quotas/main/responses',
      ])
      const body = {}
      for (let k = rnd(5); k > 0; k--) body[pick(fields)] = pick(values())
      const text = pick([JSON.stringify(body), JSON.stringify(pick(values())), '{', 'not json', ''])
      const headers = { 'content-type': pick(['application/json', 'text/plain', '']) }
      if (rnd(4) !== 0) headers['x-tokenwarden-token'] = SECRET_A
      if (rnd(3) === 0) headers.authorization = pick([`Bearer ${SECRET_A}`, 'Bearer wrong', 'Basic x', ''])
      if (rnd(4) === 0) headers['x-tokenwarden-role'] = pick(['admiral', 'planner', ''])
      const init = { method, headers }
      if (method !== 'GET' && method !== 'HEAD') init.body = text
      let status
      try {
        const r = await fetch(`${base}${path}`, init)
        status = r.status
        await r.arrayBuffer()
      } catch (e) {
        status = `fetch failed: ${e.message}`
      }
      if (typeof status !== 'number' || status >= 500) failures.push(`${method} ${path} ${text.slice(0, 80)} -> ${status}`)
    }
    assert.deepEqual(failures, [], 'every client mistake gets a 4xx')
  })
})

describe('client mistakes are 4xx naming what was wrong', () => {
  test('a malformed percent-encoding in the path is a 404, before auth', async () => {
    const r = await fetch(`${base}/v1/fleets/%E0%A4%A/quotas/main/leases`, { method: 'POST', body: '{}' })
    assert.equal(r.status, 404)
    assert.equal((await r.json()).error, 'not_found')
  })

  test('POST /responses with headers that are not string pairs is a 400 naming the entry', async () => {
    const deep = JSON.parse('['.repeat(500) + ']'.repeat(500))
    for (const [headers, field] of [
      [[null], 'headers[0]'],
      [[['a', null]], 'headers[0]'],
      [[['ok', 'v'], [deep]], 'headers[1]'],
      [[[1, 2]], 'headers[0]'],
      ['x', 'headers'],
      [Array.from({ length: 300 }, () => ['a', 'b']), 'headers'],
    ]) {
      const r = await post('/responses', { pool: 0, status: 200, headers })
      assert.equal(r.status, 400, JSON.stringify(headers).slice(0, 40))
      const b = await r.json()
      assert.equal(b.error, 'invalid_argument')
      assert.equal(b.field, field)
    }
  })

  test('bodies are bounded: 413 above 64 KiB for the API and above the configured limit in proxy mode', async () => {
    const big = await post('/leases', JSON.stringify({ agent: 'a1', pool: 0, pad: 'x'.repeat(100 * 1024) }))
    assert.equal(big.status, 413)
    assert.equal((await big.json()).error, 'body_too_large')
    const report = await post('/responses', JSON.stringify({ pool: 0, status: 200, headers: [['x', 'y'.repeat(70 * 1024)]] }))
    assert.equal(report.status, 413)
    const proxied = (content) =>
      fetch(`${base}/v1/fleets/fleet-a/quotas/main/proxy/v1/messages`, {
        method: 'POST',
        headers: { 'x-tokenwarden-token': SECRET_A, 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 10, messages: [{ role: 'user', content }] }),
      })
    const before = mock.log.length
    const huge = await proxied('x'.repeat(PROXY_LIMIT + 1))
    assert.equal(huge.status, 413)
    assert.equal(mock.log.length, before, 'nothing was forwarded')
    // A large prompt under the proxy's own limit (well above the API's) goes through.
    const large = await proxied('word '.repeat(40_000))
    assert.equal(large.status, 200)
    await large.json()
  })

  test('a proxied call that can never fit is a 400 `rejected`, not a 500', async () => {
    const r = await fetch(`${base}/v1/fleets/fleet-a/quotas/neverfits/proxy/v1/messages`, {
      method: 'POST',
      headers: { 'x-tokenwarden-token': SECRET_A, 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      // A prompt above the 100k input limit (the provider refuses it too). A max_tokens above
      // the output limit is not refused under Anthropic counting: see the test below.
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 1_000, messages: [{ role: 'user', content: 'lorem ipsum dolor sit amet '.repeat(30_000) }] }),
    })
    assert.equal(r.status, 400)
    const b = await r.json()
    assert.equal(b.error.type, 'invalid_request_error')
    assert.match(b.error.message, /^tokenwarden: lease rejected/)
    assert.equal(b.tokenwarden.error, 'rejected')
    assert.deepEqual(b.tokenwarden.reason, { kind: 'exceeds_capacity', axis: 'input_tokens' })
    assert.equal(b.tokenwarden.retryAt, null)
    assert.equal(r.headers.get('x-should-retry'), 'false')
  })

  test("a proxied call with Claude Code's max_tokens 128000 on a 20k output limit is served", async () => {
    for (let i = 0; i < 2; i++) {
      const r = await fetch(`${base}/v1/fleets/fleet-a/quotas/main/proxy/v1/messages?beta=true`, {
        method: 'POST',
        headers: { 'x-tokenwarden-token': SECRET_A, 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 128_000, messages: [{ role: 'user', content: 'hi' }] }),
      })
      assert.equal(r.status, 200, `call ${i}: ${r.status}`)
      const b = await r.json()
      assert.ok(b.usage.output_tokens > 0)
    }
  })
})

describe('no member can lock a quota for good', () => {
  const quota = 'locked'
  test('hostile reports and settles are bounded, and the operator resets the quota with the admin secret', async () => {
    const l = await (await lease({ inputTokens: 1_000 }, { quota })).json()
    assert.equal(l.kind, 'grant')
    const victim = await (await lease({ inputTokens: 1_000 }, { quota })).json()
    assert.equal(victim.kind, 'grant')
    // A limit of 1 with nothing remaining and a reset far away: the limit moves only to a
    // quarter of the configured 100,000.
    await post(
      '/responses',
      {
        pool: 0,
        lease: l.lease,
        status: 200,
        headers: [
          ['anthropic-ratelimit-input-tokens-limit', '1'],
          ['anthropic-ratelimit-input-tokens-remaining', '0'],
          ['anthropic-ratelimit-input-tokens-reset', '2999-01-01T00:00:00Z'],
        ],
      },
      { quota },
    )
    let m = await (await api('/metrics', { quota })).json()
    assert.equal(Number(m.pools[0].axes[0].limit), 25_000)
    // A 429 with a day-long retry-after, on a lease of the reporter's, pauses the quota for
    // at most a reported 429's minute (feedback.max_reported_pause_ms; and ends that lease,
    // settled as nothing used).
    await post('/responses', { pool: 0, lease: victim.lease, status: 429, headers: [['retry-after', '86400']] }, { quota })
    m = await (await api('/metrics', { quota })).json()
    const paused = Number(m.pools[0].pausedUntil) - Number(m.now)
    assert.ok(paused > 30_000 && paused <= 60_000, `paused for ${paused} more ms`)
    // A settle of 2^53 - 1 input tokens is clamped to one window of the limit.
    const s = await (await post(`/leases/${l.lease}/settle`, { inputTokens: 9007199254740991, outputTokens: 1 }, { quota })).json()
    assert.equal(Number(s.used[0]), 25_000)
    // A member cannot reset; the operator can, and the quota starts afresh from its config.
    assert.equal((await post('/admin/reset', {}, { quota })).status, 401, 'the fleet secret is not the admin secret')
    assert.equal((await post('/admin/reset', {}, { quota, secret: ADMIN_A })).status, 200)
    m = await (await api('/metrics', { quota })).json()
    assert.equal(Number(m.pools[0].axes[0].limit), 100_000)
    assert.equal(Number(m.pools[0].pausedUntil) <= Date.now(), true, 'no pause')
    assert.equal((await (await lease({ inputTokens: 50_000 }, { quota })).json()).kind, 'grant')
  })
})

describe('proxy mode', () => {
  const proxyBase = () => `${base}/v1/fleets/fleet-a/quotas/main/proxy`
  const headers = { 'x-tokenwarden-token': SECRET_A, 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' }
  const body = (extra = {}) => JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'hello '.repeat(200) }], ...extra })

  test('a JSON call is leased, forwarded and settled from its usage', async () => {
    const settledBefore = Number((await (await api('/metrics')).json()).pools[0].counters.settled)
    const r = await fetch(`${proxyBase()}/v1/messages`, { method: 'POST', headers, body: body() })
    assert.equal(r.status, 200)
    const msg = await r.json()
    assert.equal(msg.usage.output_tokens, 30)
    assert.ok(r.headers.get('anthropic-ratelimit-input-tokens-limit'), 'provider headers pass through')
    const m = await (await api('/metrics')).json()
    assert.equal(Number(m.pools[0].counters.settled), settledBefore + 1)
    assert.equal(mock.log.at(-1).status, 200)
  })

  test('a streamed call passes through and settles when the stream ends', async () => {
    const r = await fetch(`${proxyBase()}/v1/messages`, { method: 'POST', headers, body: body({ stream: true }) })
    assert.equal(r.status, 200)
    assert.match(r.headers.get('content-type'), /event-stream/)
    const text = await r.text()
    assert.match(text, /event: message_stop/)
    await new Promise((res) => setTimeout(res, 50))
    const m = await (await api('/metrics')).json()
    assert.equal(m.liveLeases, 0, 'settled at the end of the stream')
  })

  test('OpenAI chat completions, streamed with include_usage and not, through the official SDK', {
    skip: Number(process.versions.node.split('.')[0]) < 22 ? 'run with Node >= 22' : false,
  }, async () => {
    const { default: OpenAI } = await import('openai')
    const client = new OpenAI({ apiKey: 'sk-test-openai', baseURL: `${base}/v1/fleets/fleet-a/quotas/openai/proxy/v1`, defaultHeaders: { 'x-tokenwarden-token': SECRET_A }, maxRetries: 0 })
    const params = { model: 'gpt-5', max_completion_tokens: 100, messages: [{ role: 'user', content: 'hello' }] }
    const results = await Promise.all(
      Array.from({ length: 5 }, async (_, i) => {
        if (i % 2 === 0) return (await client.chat.completions.create(params)).usage.completion_tokens
        const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } })
        let usage = null
        for await (const chunk of stream) if (chunk.usage) usage = chunk.usage
        return usage.completion_tokens
      }),
    )
    assert.deepEqual(results, [30, 30, 30, 30, 30])
    await new Promise((r) => setTimeout(r, 50))
    const m = await (await api('/metrics', { quota: 'openai' })).json()
    assert.equal(Number(m.pools[0].counters.settled), 5)
    assert.equal(m.liveLeases, 0)
  })

  test('a proxied call that meets a 429 with retry-after: 2 is sent again once it clears (2 s, plus at most the 1 s jitter), and answered 200', { timeout: 30_000 }, async () => {
    const url = `${base}/v1/fleets/fleet-a/quotas/retry/proxy/v1/messages`
    await advance('retry', 0)
    const before = mock.log.length
    mock.fail429(1, { retryAfterSeconds: 2 })
    const answer = fetch(url, { method: 'POST', headers, body: body() })
    await until(() => mock.log.length > before)
    await advance('retry', 1_999)
    assert.equal(await isSettled(answer), false, 'not before the retry-after')
    assert.equal(mock.log.length, before + 1, 'nothing sent again yet')
    await advance('retry', 1_001)
    const r = await answer
    assert.equal(r.status, 200, 'the 429 is waited out, not returned')
    assert.equal((await r.json()).usage.output_tokens, 30)
    assert.deepEqual(
      mock.log.slice(before).map((e) => e.status),
      [429, 200],
    )
    const m = await (await api('/metrics', { quota: 'retry' })).json()
    assert.equal(m.liveLeases, 0)
  })

  test("a 429 the limiter saw itself pauses the quota for the provider's retry-after, beyond a member report's minute", { timeout: 30_000 }, async () => {
    const quota = 'longwait'
    await advance(quota, 0)
    const before = mock.log.length
    mock.fail429(1, { retryAfterSeconds: 120 })
    const answer = fetch(`${base}/v1/fleets/fleet-a/quotas/${quota}/proxy/v1/messages`, { method: 'POST', headers, body: body() })
    await until(() => mock.log.length > before)
    await settle()
    const m = await (await api('/metrics', { quota })).json()
    const paused = Number(m.pools[0].pausedUntil) - Number(m.now)
    assert.ok(paused > 119_000 && paused <= 120_000, `paused for ${paused} more ms`)
    await advance(quota, 119_000)
    assert.equal(await isSettled(answer), false, 'not before the retry-after')
    await advance(quota, 2_000)
    const r = await answer
    assert.equal(r.status, 200)
    await r.json()
    assert.equal(mock.log.length - before, 2, 'sent again once the pause was over')
  })

  test('a proxied call that must wait for refill is answered when the refill allows', { timeout: 30_000 }, async () => {
    const quota = 'slow'
    // Take almost all of the 5,100 tokens, so the proxied call (~300 input tokens) queues.
    await advance(quota, 0)
    const held = await (await lease({ inputTokens: 5_000, maxTokens: 1 }, { quota })).json()
    assert.equal(held.kind, 'grant')
    const before = mock.log.length
    const answer = fetch(`${base}/v1/fleets/fleet-a/quotas/${quota}/proxy/v1/messages`, { method: 'POST', headers, body: body() })
    await until(async () => Number((await (await api('/metrics', { quota })).json()).pools[0].queueDepth) === 1)
    // About 300 input tokens with 100 left, at 85 a second: over 2 s of refill.
    await advance(quota, 1_000)
    assert.equal(await isSettled(answer), false, 'not after 1 s of refill')
    assert.equal(mock.log.length, before, 'nothing forwarded while it waits')
    await advance(quota, 10_000)
    const r = await answer
    assert.equal(r.status, 200)
    await r.json()
    const m = await (await api('/metrics', { quota })).json()
    assert.equal(Number(m.pools[0].counters.grantedFromQueue), 1, 'it was queued, then granted')
  })

  test('a queued proxied call whose client disconnects is withdrawn: nothing stays queued, nothing is forwarded', { timeout: 30_000 }, async () => {
    const quota = 'gone'
    const held = await (await lease({ inputTokens: 5_000, maxTokens: 1 }, { quota })).json()
    assert.equal(held.kind, 'grant')
    const before = mock.log.length
    const { hostname, port } = new URL(base)
    const text = body()
    const socket = net.connect(Number(port), hostname)
    await new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject))
    socket.on('error', () => {})
    const head = Object.entries({ ...headers, host: `${hostname}:${port}`, 'content-length': Buffer.byteLength(text) })
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join('')
    socket.write(`POST /v1/fleets/fleet-a/quotas/${quota}/proxy/v1/messages HTTP/1.1\r\n${head}\r\n${text}`)
    const depth = async () => (await (await api('/metrics', { quota })).json()).pools[0].queueDepth
    for (let i = 0; i < 100 && (await depth()) === 0; i++) await new Promise((r) => setTimeout(r, 20))
    assert.equal(await depth(), 1, 'the proxied call is queued behind the held lease')
    // The client goes away: its process died, or the network between (a reset connection).
    socket.resetAndDestroy()
    let left = 1
    for (let i = 0; i < 100 && left !== 0; i++) {
      await new Promise((r) => setTimeout(r, 20))
      left = await depth()
    }
    assert.equal(left, 0, 'the ticket was withdrawn')
    // Long enough for the ~300 tokens to have been granted and forwarded (85 a second).
    await new Promise((r) => setTimeout(r, 5_000))
    assert.equal(mock.log.length, before, 'nothing was forwarded to the provider')
    const m = await (await api('/metrics', { quota })).json()
    assert.equal(Number(m.pools[0].counters.grantedFromQueue), 0, 'never granted')
    assert.equal(m.liveLeases, 1, 'only the held lease is live')
  })

  test('the fleet secret never reaches the provider: proxy mode takes it only in x-tokenwarden-token and forwards an allow-list of headers', async () => {
    // The secret in Authorization (where OpenAI's key goes) is refused, not forwarded.
    const before = mock.log.length
    const viaAuth = await fetch(`${proxyBase()}/v1/messages`, {
      method: 'POST',
      headers: { authorization: `Bearer ${SECRET_A}`, 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: body(),
    })
    assert.equal(viaAuth.status, 401)
    // In the provider's error format, which the SDKs show: tokenwarden's reason in its message.
    const refused = await viaAuth.json()
    assert.equal(refused.type, 'error')
    assert.equal(refused.error.type, 'authentication_error')
    assert.match(refused.error.message, /^tokenwarden: .*x-tokenwarden-token/)
    assert.equal(refused.tokenwarden.error, 'unauthorized')
    assert.equal(mock.log.length, before, 'nothing was forwarded')
    // With the token header, only the provider's headers and the client's identity go through.
    const r = await fetch(`${proxyBase()}/v1/messages?beta=true`, {
      method: 'POST',
      headers: {
        ...headers,
        'anthropic-beta': 'prompt-caching-2024-07-31',
        cookie: 'session=agent-cookie',
        'user-agent': 'claude-cli/2.1.332 (external, cli)',
        'x-app': 'cli',
        'x-stainless-lang': 'js',
        'x-claude-code-session-id': 'sess-1',
        'x-forwarded-for': '10.1.2.3',
        'x-echo': SECRET_A,
      },
      body: body(),
    })
    assert.equal(r.status, 200)
    await r.json()
    const sent = mock.log.at(-1).headers
    assert.equal(sent['x-api-key'], 'sk-ant-test-key', 'the provider key passes through')
    assert.equal(sent['anthropic-version'], '2023-06-01')
    assert.equal(sent['anthropic-beta'], 'prompt-caching-2024-07-31')
    assert.equal(sent['user-agent'], 'claude-cli/2.1.332 (external, cli)', 'the client identity passes through')
    assert.equal(sent['x-app'], 'cli')
    assert.equal(sent['x-stainless-lang'], 'js')
    assert.equal(sent['x-claude-code-session-id'], 'sess-1')
    for (const name of ['x-tokenwarden-token', 'cookie', 'x-forwarded-for', 'x-echo', 'x-tokenwarden-agent']) assert.equal(sent[name], undefined, `${name} is not forwarded`)
    for (const [name, value] of Object.entries(sent)) assert.ok(!String(value).includes(SECRET_A), `the secret is not in ${name}`)
  })

  test('401 without the fleet token, even with an API key', async () => {
    const { 'x-tokenwarden-token': _, ...noToken } = headers
    const r = await fetch(`${proxyBase()}/v1/messages`, { method: 'POST', headers: noToken, body: body() })
    assert.equal(r.status, 401)
  })

  test('the official Anthropic SDK works with its base URL pointed at the Worker', {
    skip: Number(process.versions.node.split('.')[0]) < 22 ? 'the current @anthropic-ai/sdk needs Node >= 22' : false,
  }, async () => {
    const { default: Anthropic } = await import('@anthropic-ai/sdk')
    const client = new Anthropic({ apiKey: 'sk-ant-test-key', baseURL: proxyBase(), defaultHeaders: { 'x-tokenwarden-token': SECRET_A, 'x-tokenwarden-agent': 'sdk-agent' }, maxRetries: 0 })
    const calls = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        i % 2 === 0
          ? client.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: `hi ${i}` }] })
          : client.messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: `hi ${i}` }] }).finalMessage(),
      ),
    )
    assert.equal(calls.length, 6)
    for (const c of calls) assert.equal(c.usage.output_tokens, 30)
    const m = await (await api('/metrics')).json()
    assert.equal(m.liveLeases, 0)
    assert.equal(mock.stats().overLimit, false)
  })
})

describe('tasks', () => {
  const proxyBase = () => `${base}/v1/fleets/fleet-a/quotas/main/proxy`
  const headers = { 'x-tokenwarden-token': SECRET_A, 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' }
  const body = () => JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'hello '.repeat(200) }] })

  test('open, lease for the task, a failed attempt twice, done: the summary and the four numbers', async () => {
    const before = (await (await api('/metrics')).json()).tasks.sinceStart
    assert.equal((await post('/tasks', { task: 'edge-t1', role: 'reviewer', unblocks: 2 })).status, 200)
    const d = await (await lease({ agent: 'edge-t1-agent', task: 'edge-t1' })).json()
    assert.equal(d.kind, 'grant')
    assert.equal((await post(`/leases/${d.lease}/settle`, { inputTokens: 700, outputTokens: 30 })).status, 200)
    const f1 = await (await post('/tasks/edge-t1/failed', { signature: 1234 })).json()
    const f2 = await (await post('/tasks/edge-t1/failed', { signature: 1234 })).json()
    assert.deepEqual([f1.repeats, f2.repeats], [0, 1])
    const done = await post('/tasks/edge-t1/done', { merged: true })
    assert.equal(done.status, 200)
    const s = await done.json()
    assert.equal(s.outcome, 'merged')
    assert.equal(s.tokens, 730)
    assert.equal(s.calls, 1)
    assert.equal(s.repeats, 1)
    const again = await post('/tasks/edge-t1/done', { merged: true })
    assert.equal(again.status, 404)
    assert.equal((await again.json()).error, 'unknown_task')
    const m = (await (await api('/metrics')).json()).tasks.sinceStart
    assert.equal(m.merged, before.merged + 1)
    assert.equal(m.tokens, before.tokens + 730)
    assert.ok(m.tokensPerMergedTask > 0 && m.taskTimeP50Ms !== null && m.rateLimitedPermille !== null)
    const text = await (await api('/metrics', { headers: { accept: 'text/plain' } })).text()
    for (const family of [
      'tokenwarden_tasks_open',
      'tokenwarden_tasks_ended_total{fleet="fleet-a",quota="main",outcome="merged"}',
      'tokenwarden_tokens_per_merged_task{fleet="fleet-a",quota="main",span="since_start"}',
      'tokenwarden_task_seconds{fleet="fleet-a",quota="main",quantile="0.95"}',
      'tokenwarden_critical_path_wait_seconds',
      'tokenwarden_rate_limited_ratio',
    ]) {
      assert.ok(text.includes(family), `Prometheus text has ${family}`)
    }
  })

  test('bad task input is a 400 naming the field; an unknown task is a 404', async () => {
    const cases = [
      [post('/tasks', { task: -1 }), 400, 'task'],
      [post('/tasks', { task: 'x', role: 'boss' }), 400, 'role'],
      [post('/tasks', { task: 'x', unblocks: 1.5 }), 400, 'unblocks'],
      [post('/tasks', { task: 'x', extra: 1 }), 400, undefined],
      [post('/tasks/x/failed', { signature: 'abc' }), 400, 'signature'],
      [post('/tasks/x/failed', { test: 'name', diff: 'secret code' }), 400, undefined],
      [post('/tasks/never-opened/failed', { signature: 1 }), 404, undefined],
      [post('/tasks/never-opened/done', { outcome: 'won' }), 400, 'outcome'],
      [post('/leases', { agent: 'a1', pool: 'claude-sonnet-4-6', task: { id: 1 } }), 400, 'task'],
    ]
    for (const [res, status, field] of cases) {
      const r = await res
      const b = await r.json()
      assert.equal(r.status, status, JSON.stringify(b))
      if (field !== undefined) assert.equal(b.field, field, JSON.stringify(b))
    }
  })

  test('proxy mode takes agent, role, task and unblocks from the path (a base URL is all a tool sets)', async () => {
    const url = `${proxyBase()}/agent/cli-7/role/planner/task/${encodeURIComponent('fix parser')}/unblocks/3/v1/messages`
    const r = await fetch(url, { method: 'POST', headers, body: body() })
    assert.equal(r.status, 200, await r.clone().text())
    const m = await (await api('/metrics')).json()
    assert.ok(m.agents.some((a) => a.agent > 0 && a.settled >= 1))
    const s = await (await post(`/tasks/${encodeURIComponent('fix parser')}/done`, { outcome: 'abandoned' })).json()
    assert.equal(s.outcome, 'abandoned')
    assert.equal(s.calls, 1, 'the proxied call was charged to the task the path named')
    assert.ok(s.tokens > 0)
    // And from headers, for tools that can set them.
    const h = await fetch(`${proxyBase()}/v1/messages`, { method: 'POST', headers: { ...headers, 'x-tokenwarden-task': 'hdr-task', 'x-tokenwarden-unblocks': '1' }, body: body() })
    assert.equal(h.status, 200)
    const hs = await (await post('/tasks/hdr-task/done', {})).json()
    assert.equal(hs.calls, 1)
    const bad = await fetch(`${proxyBase()}/task/a/task/b/v1/messages`, { method: 'POST', headers, body: body() })
    assert.equal(bad.status, 400)
  })

  test('the remote driver runs tasks at the limiter', async () => {
    const { RemoteTokenwarden, wasmEngines } = await import('tokenwarden-wasm')
    const tw = new RemoteTokenwarden({ url: base, fleet: 'fleet-a', quota: 'main', secret: SECRET_A, engine: wasmEngines, config: { pools: [POOL] } })
    const t = tw.task({ id: 'remote-task', unblocks: 1 })
    const l = await tw.acquire({ agent: 5, pool: 0, inputTokens: 500, maxTokens: 50, task: t.id })
    await l.settle({ inputTokens: 500, outputTokens: 20 })
    assert.equal(await t.failed({ test: 'remote test', diff: '+x' }), 0)
    const s = await t.done()
    assert.equal(s.tokens, 520)
    assert.equal(s.calls, 1)
    assert.equal(tw.failedOpen, false)
    tw.close()
  })
})
