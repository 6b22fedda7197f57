// What a hostile or careless caller can do to the edge limiter, under workerd (miniflare):
// memory on unauthenticated input, agents told apart by their full name, handles across a
// reset, what a report may do, malformed bodies and kept-alive connections, secrets in
// forwarded headers, a secretless fleet, an upstream that cannot be reached, and a streamed
// proxied call whose client gives up while it waits. Each test here failed on the limiter
// before these rules (API.md, "What one member can do to the quota").
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'

const here = (p) => fileURLToPath(new URL(p, import.meta.url))
const outdir = here('../.build/hostile/')
const SECRET = 'hostile-fleet-secret-0123456789'
const ADMIN = 'hostile-admin-secret-0123456789'
const OPEN_SECRET = 'open-fleet-secret-0123456789ab'
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 100_000, output_tokens_per_minute: 20_000, requests_per_minute: 1_000, max_concurrent: 4 }
// 6,000 input tokens a minute: a second call of ~300 tokens waits for refill behind a 5,000-token lease.
const SLOW = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 6_000, output_tokens_per_minute: 100_000, requests_per_minute: 1_000 }

let mock
/** An upstream that accepts a connection and drops it once the request arrives. */
let dropper
/** An upstream that records each request and answers it 200 with a small JSON body. */
let echo
const echoed = []
let persist
let mf
let base

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: here('../src/worker.js') })
  mock = await startMockProvider({ inputTokensPerMinute: 10_000_000, outputTokensPerMinute: 10_000_000, concurrency: 64, replyTokens: 30, chunkDelayMs: 2, recordHeaders: true })
  dropper = net.createServer((socket) => socket.once('data', () => socket.destroy()))
  await new Promise((r) => dropper.listen(0, '127.0.0.1', r))
  echo = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      echoed.push({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString() })
      if (req.url.includes('slow-overload')) {
        // A provider that takes 1.5 s to say it is overloaded.
        setTimeout(() => res.writeHead(529, { 'content-type': 'application/json', 'request-id': 'req-1' }).end('{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'), 1_500)
        return
      }
      res.writeHead(200, { 'content-type': 'application/json', 'x-provider-header': 'kept' }).end(req.url.includes('count_tokens') ? '{"input_tokens":42}' : '{"data":[{"id":"claude-sonnet-4-6"}]}')
    })
  })
  await new Promise((r) => echo.listen(0, '127.0.0.1', r))
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-hostile-'))
  const fleets = {
    f: {
      secret: SECRET,
      admin_secret: ADMIN,
      quotas: {
        main: { config: { pools: [POOL] }, upstream: mock.url },
        // Its own object, so the estimator it sizes calls with has learned nothing from the
        // other tests' odd bodies (the mock counts only text, by bytes).
        neverfits: { config: { pools: [POOL] }, upstream: mock.url },
        reports: { config: { pools: [POOL] } },
        tasks: { config: { pools: [POOL], max_tasks: 8 } },
        reset: { config: { pools: [POOL] } },
        slow: { config: { pools: [SLOW] }, upstream: mock.url },
        slow2: { config: { pools: [SLOW] }, upstream: mock.url },
        slow3: { config: { pools: [SLOW] }, upstream: mock.url },
        nowhere: { config: { pools: [POOL] }, upstream: 'http://127.0.0.1:1' },
        echo: { config: { pools: [POOL] }, upstream: `http://127.0.0.1:${echo.address().port}` },
        dropping: { config: { pools: [POOL] }, upstream: `http://127.0.0.1:${dropper.address().port}` },
      },
    },
    noadmin: { secret: 'noadmin-secret-0123456789', quotas: { main: { config: { pools: [POOL] } } } },
    open: { secret: OPEN_SECRET, proxy_open: true, quotas: { main: { config: { pools: [POOL] }, upstream: mock.url }, tasks: { config: { pools: [POOL], max_tasks: 64 }, upstream: mock.url } } },
    bound: { secret: 'bound-fleet-secret-0123456789', proxy_open: 'credential', quotas: { main: { config: { pools: [POOL] }, upstream: mock.url } } },
  }
  ;({ mf, base } = await startWorker({ outdir, persist, fleets }))
})

after(async () => {
  await mf?.dispose()
  await mock?.close()
  await new Promise((r) => (dropper ? dropper.close(r) : r()))
  echo?.closeAllConnections()
  await new Promise((r) => (echo ? echo.close(r) : r()))
  if (persist) rmSync(persist, { recursive: true, force: true })
})

const api = (path, { secret = SECRET, fleet = 'f', quota = 'main', ...init } = {}) =>
  fetch(`${base}/v1/fleets/${fleet}/quotas/${quota}${path}`, {
    ...init,
    headers: { ...(secret === null ? {} : { authorization: `Bearer ${secret}` }), 'content-type': 'application/json', ...init.headers },
  })
const post = (path, body, opts = {}) => api(path, { method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body), ...opts })
const lease = (body, opts) => post('/leases', { agent: 'a1', pool: 'claude-sonnet-4-6', inputTokens: 1000, maxTokens: 100, ...body }, opts)
const metrics = async (opts) => (await api('/metrics', opts)).json()
const credential = async (agent, { fleet = 'f', secret = SECRET } = {}) =>
  (await (await fetch(`${base}/v1/fleets/${fleet}/agents/${agent}/credential`, { method: 'POST', headers: { authorization: `Bearer ${secret}` } })).json()).credential
const messages = (extra = {}) => JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'hello '.repeat(200) }], ...extra })
const anthropicHeaders = { 'x-api-key': 'sk-ant-test-key', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' }

/**
 * The limiter's resident memory, MiB: the workerd runtime miniflare started for this file,
 * or native `tokenwarden serve` where TOKENWARDEN_SERVE_BIN runs the suite against it.
 */
function limiterRss() {
  const native = process.env.TOKENWARDEN_SERVE_BIN
  const pids = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(process.pid)], { encoding: 'utf8' })
    .split('\n')
    .filter((l) => (native ? l.includes(native) : l.includes('workerd')))
    .map((l) => Number(l.trim().split(/\s+/)[0]))
  assert.equal(pids.length, 1, `one ${native ? 'tokenwarden serve' : 'workerd'} child`)
  const status = readFileSync(`/proc/${pids[0]}/status`, 'utf8')
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)[1]) / 1024
}

/** Runs `n` requests made by `make(i)`, `width` at a time; answers the statuses seen. */
async function flood(n, width, make) {
  const statuses = new Map()
  let next = 0
  const worker = async () => {
    for (let i = next++; i < n; i = next++) {
      const [url, init] = make(i)
      let status
      try {
        const r = await fetch(url, init)
        status = r.status
        await r.arrayBuffer()
      } catch (e) {
        status = `fetch failed: ${e.cause?.code ?? e.message}`
      }
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
    }
  }
  await Promise.all(Array.from({ length: width }, worker))
  return statuses
}

const randomText = (n, seed) => {
  let s = seed >>> 0 || 1
  let out = ''
  const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
  while (out.length < n) {
    s ^= s << 13
    s ^= s >>> 17
    s ^= s << 5
    out += abc[(s >>> 0) % 64]
  }
  return out
}

describe('memory on unauthenticated input', () => {
  // The heap the limiter keeps is measured exactly in test/auth.test.mjs (Node, after a
  // forced GC); here the same shapes go through workerd, where every one must be a 401, and
  // the runtime's resident memory is reported (it grows with large request headers even on
  // /healthz, which reads none: garbage the isolate collects under its memory limit).
  test('10,000 hostile requests (60 kB bearers, unknown fleets, admin probes, forged credentials) are all 401', { timeout: 300_000 }, async (t) => {
    const shapes = [
      // A random 60 kB bearer for an unknown fleet.
      (i) => [`${base}/v1/fleets/nofleet/quotas/x/metrics`, { headers: { authorization: `Bearer ${randomText(60_000, i + 1)}` } }],
      // The admin route of a fleet that has no admin secret, a new bearer each time.
      (i) => [`${base}/v1/fleets/noadmin/quotas/main/admin/reset`, { method: 'POST', headers: { authorization: `Bearer ${randomText(300, i + 7)}` } }],
      // An agent credential naming a random fleet.
      (i) => [`${base}/v1/fleets/${randomText(40, i + 3)}/quotas/x/metrics`, { headers: { authorization: `Bearer twa1.${randomText(40, i + 3)}.y.${randomText(43, i)}` } }],
      // A wrong secret of a known fleet, in the token header.
      (i) => [`${base}/v1/fleets/f/quotas/main/leases`, { method: 'POST', headers: { 'x-tokenwarden-token': randomText(200, i + 11) }, body: '{}' }],
    ]
    const before = limiterRss()
    const statuses = await flood(10_000, 16, (i) => shapes[i % shapes.length](i))
    assert.deepEqual([...statuses.keys()], [401], `every hostile request is a 401: ${JSON.stringify([...statuses])}`)
    t.diagnostic(`${process.env.TOKENWARDEN_SERVE_BIN ? 'tokenwarden serve' : 'workerd'} resident memory ${before.toFixed(0)} -> ${limiterRss().toFixed(0)} MiB`)
  })

  test('an oversized bearer is refused before any work, naming the bound', async () => {
    const r = await api('/metrics', { secret: 'x'.repeat(513) })
    assert.equal(r.status, 401)
    assert.match((await r.json()).message, /longer than 512 characters/)
    const t = await api('/metrics', { secret: null, headers: { 'x-tokenwarden-token': 'y'.repeat(2_000) } })
    assert.equal(t.status, 401)
    assert.match((await t.json()).message, /longer than 512 characters/)
  })
})

describe('agents are told apart by their full name', () => {
  // 'w-X-MF1M' has alice's 32-bit FNV-1a id (2267157479): under the old ids its credential
  // acted on alice's leases.
  test("a name with alice's 32-bit hash cannot long-poll, cancel, settle or report on her leases", async () => {
    const alice = await credential('alice')
    const mallory = await credential('w-X-MF1M')
    const held = await (await lease({ agent: 'alice', inputTokens: 1_000 }, { secret: alice })).json()
    assert.equal(held.kind, 'grant', JSON.stringify(held))
    for (const [method, path, body] of [
      ['GET', `/leases/${held.lease}?wait=0`],
      ['POST', `/leases/${held.lease}/settle`, {}],
      ['POST', `/leases/${held.lease}/interrupted`, {}],
      ['POST', '/responses', { lease: held.lease, status: 200, headers: [] }],
      ['DELETE', `/leases/${held.lease}`],
    ]) {
      const r = await api(path, { method, secret: mallory, ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
      assert.equal(r.status, 403, `${method} ${path} by another agent`)
    }
    // Leasing as itself, it is another agent to the core.
    const own = await (await lease({ agent: 'w-X-MF1M' }, { secret: mallory })).json()
    assert.equal(own.kind, 'grant')
    const m = await metrics()
    assert.equal(m.agents.length, 2, 'two agents, not one')
    assert.equal((await post(`/leases/${held.lease}/settle`, { inputTokens: 10, outputTokens: 1 }, { secret: alice })).status, 200, 'alice still settles her own')
    assert.equal((await post(`/leases/${own.lease}/settle`, { inputTokens: 10, outputTokens: 1 }, { secret: mallory })).status, 200)
  })

  test("a credential's lease may name its agent by the number a remote driver derives from the name, and no other number", async () => {
    const { agentIdFor } = await import('tokenwarden-wasm')
    const bob = await credential('bob')
    const ok = await (await lease({ agent: agentIdFor('bob') }, { secret: bob })).json()
    assert.equal(ok.kind, 'grant')
    assert.equal((await lease({ agent: agentIdFor('bob') + 1 }, { secret: bob })).status, 403)
    assert.equal((await post(`/leases/${ok.lease}/settle`, { inputTokens: 1 }, { secret: bob })).status, 200)
  })

  test('in proxy mode a credential may name only its own agent, by the full name', async () => {
    const mallory = await credential('w-X-MF1M')
    const r = await fetch(`${base}/v1/fleets/f/quotas/main/proxy/v1/messages`, {
      method: 'POST',
      headers: { ...anthropicHeaders, 'x-tokenwarden-token': mallory, 'x-tokenwarden-agent': 'alice' },
      body: messages(),
    })
    assert.equal(r.status, 403)
    await r.arrayBuffer()
  })
})

describe('tasks and agent credentials', () => {
  const quota = 'tasks'
  test("a credential fails, ends or re-weights only its own agent's tasks, and opens new ones only below three quarters of max_tasks", async () => {
    const alice = await credential('alice')
    const mallory = await credential('mallory')
    assert.equal((await post('/tasks', { task: 'alice-1', role: 'planner', unblocks: 4 }, { quota, secret: alice })).status, 200)
    assert.equal((await post('/tasks', { task: 'ops-1' }, { quota })).status, 200, "the operator's")
    for (const [path, b] of [
      ['/tasks', { task: 'alice-1', role: 'worker' }],
      ['/tasks/alice-1/failed', { signature: 1 }],
      ['/tasks/alice-1/done', {}],
      ['/tasks/ops-1/done', {}],
    ]) {
      const r = await post(path, b, { quota, secret: mallory })
      assert.equal(r.status, 403, `${path} by mallory`)
      await r.arrayBuffer()
    }
    // Anyone may lease for any task; the owner ends hers.
    const l = await (await lease({ agent: 'mallory', task: 'alice-1' }, { quota, secret: mallory })).json()
    assert.equal(l.kind, 'grant')
    assert.equal((await post(`/leases/${l.lease}/settle`, { inputTokens: 10 }, { quota, secret: mallory })).status, 200)
    assert.equal((await post('/tasks/alice-1/failed', { signature: 1 }, { quota, secret: alice })).status, 200)
    // Issue 43, N2: whose task it is lives with the task in the core's bounded table, so no
    // flood of leases naming junk tasks frees alice's for mallory to claim.
    for (let i = 0; i < 40; i++) {
      const junk = await lease({ agent: 'mallory', task: `junk-${i}` }, { quota, secret: mallory })
      const j = await junk.json()
      if (j.kind === 'grant') await (await post(`/leases/${j.lease}/settle`, { inputTokens: 10 }, { quota, secret: mallory })).arrayBuffer()
    }
    const claimed = await lease({ agent: 'mallory', task: 'alice-1' }, { quota, secret: mallory })
    const c = await claimed.json()
    if (c.kind === 'grant') await (await post(`/leases/${c.lease}/settle`, { inputTokens: 10 }, { quota, secret: mallory })).arrayBuffer()
    for (const path of ['/tasks/alice-1/failed', '/tasks/alice-1/done']) {
      const r = await post(path, path.endsWith('failed') ? { signature: 2 } : {}, { quota, secret: mallory })
      assert.equal(r.status, 403, `${path} by mallory after the flood`)
      await r.arrayBuffer()
    }
    // The junk is mallory's own (a request's task is its agent's): she ends what was opened.
    const ended = []
    for (let i = 0; i < 40; i++) ended.push((await post(`/tasks/junk-${i}/done`, {}, { quota, secret: mallory })).status)
    assert.ok(ended.includes(200) && ended.every((s) => s === 200 || s === 404), `${ended}`)
    assert.equal((await post('/tasks/alice-1/done', {}, { quota, secret: alice })).status, 200)
    // max_tasks 8: a credential opens up to 6 (three quarters), the operator the rest.
    const opened = []
    for (let i = 0; i < 8; i++) opened.push((await post('/tasks', { task: `m-${i}` }, { quota, secret: mallory })).status)
    assert.deepEqual(opened, [200, 200, 200, 200, 200, 409, 409, 409], 'ops-1 and five of mallory: six open')
    assert.equal((await post('/tasks', { task: 'ops-2' }, { quota })).status, 200, 'the operator still has room')
    assert.equal((await post('/admin/reset', {}, { quota, secret: ADMIN })).status, 200)
    // The tests' hand-moved clock exists only where TOKENWARDEN_TEST_CLOCK=1 (not here).
    assert.equal((await post('/admin/clock', { advanceMs: 60_000 }, { quota, secret: ADMIN })).status, 404)
  })
})

describe('lease handles never repeat', () => {
  test('after an admin reset the new leases have new handles, and an old handle ends nothing', async () => {
    const quota = 'reset'
    const old = await (await lease({}, { quota })).json()
    assert.equal(old.kind, 'grant')
    assert.match(old.lease, /^tw2\.f\.reset\.\d+\.[0-9a-z]+\.[A-Za-z0-9_-]{27}$/)
    assert.equal((await post(`/leases/${old.lease}/settle`, { inputTokens: 10 }, { quota })).status, 200)
    const held = await (await lease({}, { quota })).json()
    assert.equal((await post('/admin/reset', {}, { quota, secret: ADMIN })).status, 200)
    const fresh = await (await lease({}, { quota })).json()
    const fresh2 = await (await lease({}, { quota })).json()
    assert.notEqual(fresh.lease, old.lease)
    assert.notEqual(fresh2.lease, held.lease)
    assert.equal(fresh.lease.split('.')[3], old.lease.split('.')[3], 'the core hands out the same id again after a reset')
    for (const h of [old.lease, held.lease]) {
      const r = await post(`/leases/${h}/settle`, { inputTokens: 10 }, { quota })
      assert.equal(r.status, 404, 'a handle from before the reset names no lease')
      assert.match((await r.json()).message, /before the quota was reset/)
    }
    assert.equal((await metrics({ quota })).liveLeases, 2, 'the new leases are untouched')
  })
})

describe('what a report may do', () => {
  const quota = 'reports'
  test('a report names a granted lease its reporter holds; a 429 pauses for at most a minute; a ticket cannot be reported on', async () => {
    const agent = await credential('reporter')
    // No lease: refused, and nothing paused.
    const none = await post('/responses', { pool: 'claude-sonnet-4-6', status: 429, headers: [['retry-after', '300']] }, { quota, secret: agent })
    assert.equal(none.status, 400)
    assert.equal((await none.json()).field, 'lease')
    let m = await metrics({ quota })
    assert.ok(Number(m.pools[0].pausedUntil ?? 0) <= Date.now(), 'not paused')
    // Another agent's lease: 403.
    const other = await (await lease({ agent: 'someone-else' }, { quota })).json()
    assert.equal((await post('/responses', { lease: other.lease, status: 429, headers: [['retry-after', '300']] }, { quota, secret: agent })).status, 403)
    // A ticket (queued, nothing sent): 409.
    const fill = []
    for (let i = 0; i < 3; i++) fill.push(await (await lease({ agent: 'reporter' }, { quota, secret: agent })).json())
    const ticket = await (await lease({ agent: 'reporter' }, { quota, secret: agent })).json()
    assert.equal(ticket.kind, 'queued')
    const t = await post('/responses', { lease: ticket.lease, status: 429, headers: [['retry-after', '300']] }, { quota, secret: agent })
    assert.equal(t.status, 409)
    // Its own granted lease: the reported 429 pauses the quota for at most a minute (the
    // core's feedback.max_reported_pause_ms), and ends the lease.
    const r = await post('/responses', { lease: fill[0].lease, status: 429, headers: [['retry-after', '300']] }, { quota, secret: agent })
    assert.equal(r.status, 200)
    m = await metrics({ quota })
    const paused = Number(m.pools[0].pausedUntil) - Number(m.now)
    assert.ok(paused > 30_000 && paused <= 60_000, `paused for ${paused} more ms`)
    assert.equal(
      (await post('/responses', { lease: fill[0].lease, status: 429, headers: [['retry-after', '300']] }, { quota, secret: agent })).status,
      404,
      'the report ended the lease: one pause per lease',
    )
    assert.equal((await post('/admin/reset', {}, { quota, secret: ADMIN })).status, 200)
  })
})

/** Sends raw bytes on one kept-alive connection; answers the responses' status lines in order. */
async function rawExchange(requests, { expect = requests.length } = {}) {
  const { hostname, port } = new URL(base)
  const socket = net.connect(Number(port), hostname)
  await new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject))
  let seen = ''
  const statuses = []
  let closedEarly = null
  socket.on('error', (e) => {
    closedEarly = e.code
  })
  const done = new Promise((resolve) => {
    socket.on('data', (d) => {
      seen += d.toString('latin1')
      const found = seen.match(/HTTP\/1\.1 (\d{3})/g) ?? []
      statuses.splice(0, statuses.length, ...found.map((s) => Number(s.slice(9))))
      if (statuses.length >= expect) resolve()
    })
    socket.on('close', resolve)
  })
  for (const r of requests) {
    socket.write(r)
    await new Promise((res) => setTimeout(res, 100))
  }
  await Promise.race([done, new Promise((r) => setTimeout(r, 5_000))])
  socket.destroy()
  return { statuses, closedEarly, text: seen }
}

describe('malformed bodies and kept-alive connections', () => {
  const host = () => new URL(base).host
  test('a malformed chunked body is a 400, for the API and for a proxied call of an open fleet', async () => {
    const bad = (path, token) =>
      `POST ${path} HTTP/1.1\r\nhost: ${host()}\r\ncontent-type: application/json\r\n${token === null ? '' : `x-tokenwarden-token: ${token}\r\n`}transfer-encoding: chunked\r\n\r\nzz\r\n{"agent":1}\r\n0\r\n\r\n`
    for (const [path, token] of [
      ['/v1/fleets/f/quotas/main/leases', SECRET],
      ['/v1/fleets/open/quotas/main/agents/a1/worker/anthropic/v1/messages', null],
    ]) {
      const { statuses, text } = await rawExchange([bad(path, token)], { expect: 1 })
      assert.ok(statuses.length >= 1, `an answer for ${path}: ${text.slice(0, 200)}`)
      assert.ok(statuses[0] >= 400 && statuses[0] < 500, `${path}: ${statuses[0]} ${text.slice(0, 300)}`)
    }
  })

  test('an error answered before the body was read leaves the connection usable for the next request', async () => {
    const body = JSON.stringify({ agent: 'a1', pool: 0, inputTokens: 1, pad: 'x'.repeat(20_000) })
    const wrong = `POST /v1/fleets/f/quotas/main/leases HTTP/1.1\r\nhost: ${host()}\r\nauthorization: Bearer wrong-secret-0000000000\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
    const health = `GET /healthz HTTP/1.1\r\nhost: ${host()}\r\n\r\n`
    const { statuses, closedEarly } = await rawExchange([wrong, health, wrong, health])
    assert.deepEqual(statuses, [401, 200, 401, 200], `answers on one connection (error: ${closedEarly})`)
    // A route that takes no body, answered 200 with one sent anyway: the same.
    const mint = `POST /v1/fleets/f/agents/kept/credential HTTP/1.1\r\nhost: ${host()}\r\nauthorization: Bearer ${SECRET}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
    const again = await rawExchange([mint, health, mint, health])
    assert.deepEqual(again.statuses, [200, 200, 200, 200], `a mint with a body, then /healthz (error: ${again.closedEarly})`)
  })
})

describe('secrets never reach the provider', () => {
  test('the admin secret, an agent credential, and the fleet secret upper-cased or percent-encoded are not forwarded', async () => {
    const agent = await credential('sender')
    const before = mock.log.length
    const r = await fetch(`${base}/v1/fleets/f/quotas/main/proxy/v1/messages`, {
      method: 'POST',
      headers: {
        ...anthropicHeaders,
        'x-tokenwarden-token': agent,
        'anthropic-admin': ADMIN,
        'anthropic-upper': SECRET.toUpperCase(),
        'anthropic-encoded': encodeURIComponent(`${SECRET}/`).replace(/-/g, '%2D'),
        'openai-credential': agent,
        'anthropic-stray': `100% ${encodeURIComponent(SECRET)}`,
        'anthropic-twice': encodeURIComponent(encodeURIComponent(SECRET)),
        'anthropic-shouting': agent.toUpperCase(),
        'anthropic-beta': 'prompt-caching-2024-07-31',
      },
      body: messages(),
    })
    assert.equal(r.status, 200)
    await r.arrayBuffer()
    assert.equal(mock.log.length, before + 1)
    const sent = mock.log.at(-1).headers
    assert.equal(sent['anthropic-beta'], 'prompt-caching-2024-07-31', 'the provider headers pass')
    for (const name of ['anthropic-admin', 'anthropic-upper', 'anthropic-encoded', 'openai-credential', 'anthropic-stray', 'anthropic-twice', 'anthropic-shouting'])
      assert.equal(sent[name], undefined, `${name} is not forwarded`)
    // A credential in Authorization on an open fleet (where Authorization is the provider's).
    const cred = await credential('o1', { fleet: 'open', secret: OPEN_SECRET })
    const o = await fetch(`${base}/v1/fleets/open/quotas/main/agents/o1/worker/anthropic/v1/messages`, {
      method: 'POST',
      headers: { ...anthropicHeaders, authorization: `Bearer ${cred}` },
      body: messages(),
    })
    assert.equal(o.status, 200)
    await o.arrayBuffer()
    assert.equal(mock.log.at(-1).headers.authorization, undefined, 'a credential in Authorization is not forwarded')
  })
})

describe('a fleet without a secret for proxied calls (proxy_open)', () => {
  test('secretless callers are not counted as clients', async () => {
    await flood(50, 5, (i) => [
      `${base}/v1/fleets/open/quotas/main/agents/c${i}/worker/anthropic/v1/messages`,
      { method: 'POST', headers: { ...anthropicHeaders, 'x-tokenwarden-client': `proc-${i}` }, body: messages() },
    ])
    const l = await (await lease({ agent: 'counted' }, { fleet: 'open', secret: OPEN_SECRET, headers: { 'x-tokenwarden-client': 'real-one' } })).json()
    assert.equal(l.clients, 1, 'only the authenticated remote driver is counted')
  })

  test('proxy_open "credential": a secretless call must carry an agent credential in the path, and acts as its agent', async () => {
    const plain = await fetch(`${base}/v1/fleets/bound/quotas/main/agents/alice/worker/anthropic/v1/messages`, { method: 'POST', headers: anthropicHeaders, body: messages() })
    assert.equal(plain.status, 401)
    assert.match((await plain.json()).error.message, /agent credential/)
    const cred = await credential('alice', { fleet: 'bound', secret: 'bound-fleet-secret-0123456789' })
    const ok = await fetch(`${base}/v1/fleets/bound/quotas/main/agents/${cred}/worker/anthropic/v1/messages`, { method: 'POST', headers: anthropicHeaders, body: messages() })
    assert.equal(ok.status, 200)
    await ok.arrayBuffer()
    const forged = `${cred.slice(0, -4)}AAAA`
    const bad = await fetch(`${base}/v1/fleets/bound/quotas/main/agents/${forged}/worker/anthropic/v1/messages`, { method: 'POST', headers: anthropicHeaders, body: messages() })
    assert.equal(bad.status, 401)
    await bad.arrayBuffer()
    const m = await metrics({ fleet: 'bound', secret: 'bound-fleet-secret-0123456789' })
    assert.equal(m.agents.length, 1)
    assert.equal(mock.log.at(-1).headers['x-tokenwarden-token'], undefined)
  })
})

describe('an upstream that cannot be reached', () => {
  test("is a 502 in the provider's error format, not a 500, and the lease is ended", async () => {
    const r = await fetch(`${base}/v1/fleets/f/quotas/nowhere/proxy/v1/messages`, { method: 'POST', headers: { ...anthropicHeaders, 'x-tokenwarden-token': SECRET }, body: messages() })
    assert.equal(r.status, 502)
    const b = await r.json()
    assert.equal(b.type, 'error')
    assert.equal(b.error.type, 'api_error')
    assert.match(b.error.message, /could not be reached/)
    const o = await fetch(`${base}/v1/fleets/f/quotas/nowhere/proxy/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer sk-test', 'content-type': 'application/json', 'x-tokenwarden-token': SECRET },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', messages: [{ role: 'user', content: 'hi' }] }),
    })
    assert.equal(o.status, 502)
    assert.equal((await o.json()).error.code, 'upstream_unreachable')
    const m = await metrics({ quota: 'nowhere' })
    assert.equal(m.liveLeases, 0, 'no lease left held')
  })
})

describe("the provider's other routes and what agents send", () => {
  test('token counting and model lists pass through unleased, with the query string and the provider key; the key is never taken for a tokenwarden secret', async () => {
    const openBase = `${base}/v1/fleets/open/quotas/main/agents/cc-1/worker/anthropic`
    const fBase = `${base}/v1/fleets/f/quotas/echo/proxy`
    echoed.length = 0
    // count_tokens through the secret-holding proxy, and a model list with the provider's key in Authorization.
    const count = await fetch(`${fBase}/v1/messages/count_tokens?beta=true`, { method: 'POST', headers: { ...anthropicHeaders, 'x-tokenwarden-token': SECRET }, body: messages() })
    assert.equal(count.status, 200)
    assert.deepEqual(await count.json(), { input_tokens: 42 })
    const models = await fetch(`${fBase}/v1/models?limit=5`, { headers: { authorization: 'Bearer sk-provider-key', 'x-tokenwarden-token': SECRET } })
    assert.equal(models.status, 200)
    assert.equal(models.headers.get('x-provider-header'), 'kept', "the provider's response headers pass")
    await models.arrayBuffer()
    assert.deepEqual(
      echoed.map((r) => [r.method, r.url]),
      [
        ['POST', '/v1/messages/count_tokens?beta=true'],
        ['GET', '/v1/models?limit=5'],
      ],
    )
    assert.equal(echoed[1].headers.authorization, 'Bearer sk-provider-key')
    const m = await metrics({ quota: 'echo' })
    assert.equal(Number(m.pools[0].counters.granted ?? 0), 0, 'nothing was leased')
    // On the secretless base-URL form, a GET with the provider key in Authorization is not a 401.
    const open = await fetch(`${openBase}/v1/models`, { headers: { authorization: 'Bearer sk-provider-key' } })
    assert.notEqual(open.status, 401)
    await open.arrayBuffer()
  })

  test("a model call's query string and the client's identity headers reach the provider", async () => {
    echoed.length = 0
    const r = await fetch(`${base}/v1/fleets/f/quotas/echo/proxy/v1/messages?beta=true`, {
      method: 'POST',
      headers: {
        ...anthropicHeaders,
        'x-tokenwarden-token': SECRET,
        'user-agent': 'claude-cli/2.1.332 (external, cli)',
        'x-app': 'cli',
        'x-stainless-retry-count': '0',
        'x-claude-code-session-id': 's-1',
        originator: 'codex_cli_rs',
        'session-id': 'codex-1',
        'x-codex-beta-features': 'x',
        cookie: 'c=1',
      },
      body: messages(),
    })
    assert.equal(r.status, 200)
    await r.arrayBuffer()
    const sent = echoed.at(-1)
    assert.equal(sent.url, '/v1/messages?beta=true')
    for (const [name, value] of [
      ['user-agent', 'claude-cli/2.1.332 (external, cli)'],
      ['x-app', 'cli'],
      ['x-stainless-retry-count', '0'],
      ['x-claude-code-session-id', 's-1'],
      ['originator', 'codex_cli_rs'],
      ['session-id', 'codex-1'],
      ['x-codex-beta-features', 'x'],
    ]) {
      assert.equal(sent.headers[name], value, `${name} is forwarded`)
    }
    assert.equal(sent.headers.cookie, undefined)
    assert.equal(sent.headers['x-tokenwarden-token'], undefined)
  })

  test('a secret in the query string is not forwarded: the parameter is dropped, the rest passes (issue 43, N5)', async () => {
    for (const [query, want] of [
      [`?beta=true&key=${SECRET}`, '?beta=true'],
      [`?key=${encodeURIComponent(SECRET)}&beta=true`, '?beta=true'],
      [`?key=${encodeURIComponent(encodeURIComponent(SECRET))}`, ''],
      [`?${SECRET.toUpperCase()}`, ''],
      ['?beta=true', '?beta=true'],
    ]) {
      echoed.length = 0
      const r = await fetch(`${base}/v1/fleets/f/quotas/echo/proxy/v1/messages${query}`, {
        method: 'POST',
        headers: { ...anthropicHeaders, 'x-tokenwarden-token': SECRET },
        body: messages(),
      })
      assert.equal(r.status, 200, query)
      await r.arrayBuffer()
      assert.equal(echoed.at(-1).url, `/v1/messages${want}`, query)
      assert.ok(!echoed.at(-1).url.toLowerCase().includes(SECRET.toLowerCase().slice(0, 12)), 'no part of the secret upstream')
    }
  })

  test("a streamed call already with the provider gets the provider's own status and headers, even when they take over a second", async () => {
    const r = await fetch(`${base}/v1/fleets/f/quotas/echo/proxy/v1/messages?slow-overload=1`, {
      method: 'POST',
      headers: { ...anthropicHeaders, 'x-tokenwarden-token': SECRET },
      body: messages({ stream: true }),
    })
    assert.equal(r.status, 529, 'not a 200 keep-alive stream')
    assert.equal(r.headers.get('request-id'), 'req-1')
    assert.equal(r.headers.get('x-tokenwarden-kept-alive'), null)
    assert.equal((await r.json()).error.type, 'overloaded_error')
  })

  test("a refusal in proxy mode is in OpenAI's error format for an OpenAI call (edge.test.mjs checks Anthropic's)", async () => {
    const r = await fetch(`${base}/v1/fleets/f/quotas/neverfits/proxy/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer sk-test', 'content-type': 'application/json', 'x-tokenwarden-token': SECRET },
      // A prompt above the pool's input limit itself (the provider refuses it too; a large
      // max_tokens alone is not refused under Anthropic counting).
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'lorem ipsum dolor sit amet '.repeat(40_000) }] }),
    })
    assert.equal(r.status, 400)
    const b = await r.json()
    assert.equal(b.error.type, 'invalid_request_error')
    assert.equal(b.error.code, 'rejected')
    assert.match(b.error.message, /^tokenwarden: lease rejected/)
    assert.equal(b.tokenwarden.retryAt, null)
    assert.equal(r.headers.get('x-should-retry'), 'false')
  })
})

describe('an upstream that drops the connection', () => {
  test("is a 502 in the provider's error format, and the lease is ended", async () => {
    const r = await fetch(`${base}/v1/fleets/f/quotas/dropping/proxy/v1/messages`, { method: 'POST', headers: { ...anthropicHeaders, 'x-tokenwarden-token': SECRET }, body: messages() })
    assert.equal(r.status, 502)
    const b = await r.json()
    assert.equal(b.error.type, 'api_error')
    assert.match(b.error.message, /could not be reached/)
    assert.equal((await metrics({ quota: 'dropping' })).liveLeases, 0)
  })
})

describe('a streamed proxied call whose client gives up while it waits', () => {
  // The whole 6,000-token limit, granted from the full bucket (5,100 at the margin): the
  // bucket is 900 in debt, so a small call waits about 12 s for refill — longer than the
  // client takes to go and the limiter to notice (a write fails within 2 s) plus the 5 s
  // the tests then watch for a forward.
  const held = async (quota) => {
    const l = await (await lease({ inputTokens: 6_000, maxTokens: 1 }, { quota })).json()
    assert.equal(l.kind, 'grant')
    return l
  }
  const depth = async (quota) => (await metrics({ quota })).pools[0].queueDepth
  const until = async (fn, ms) => {
    for (const end = Date.now() + ms; Date.now() < end; ) {
      if (await fn()) return true
      await new Promise((r) => setTimeout(r, 50))
    }
    return fn()
  }

  test('an aborted Node fetch: the ticket is withdrawn and nothing is forwarded', { timeout: 60_000 }, async () => {
    const quota = 'slow'
    await held(quota)
    const before = mock.log.length
    const ac = new AbortController()
    const r = await fetch(`${base}/v1/fleets/f/quotas/${quota}/proxy/v1/messages`, {
      method: 'POST',
      headers: { ...anthropicHeaders, 'x-tokenwarden-token': SECRET },
      body: messages({ stream: true }),
      signal: ac.signal,
    })
    // The head comes while the call waits in line: a live stream of keep-alive comments.
    assert.equal(r.status, 200)
    assert.equal(r.headers.get('x-tokenwarden-kept-alive'), '1')
    const reader = r.body.getReader()
    const { value } = await reader.read()
    assert.match(Buffer.from(value).toString(), /^: tokenwarden: waiting for quota/)
    assert.equal(await depth(quota), 1, 'queued behind the held lease')
    ac.abort()
    assert.ok(await until(async () => (await depth(quota)) === 0, 15_000), 'the ticket was withdrawn once a write to the gone client failed')
    await new Promise((res) => setTimeout(res, 5_000))
    assert.equal(mock.log.length, before, 'nothing was forwarded')
    assert.equal((await metrics({ quota })).liveLeases, 1, 'only the held lease is live')
  })

  test('the official Anthropic SDK aborted while its stream waits: withdrawn, nothing forwarded', {
    timeout: 60_000,
    skip: Number(process.versions.node.split('.')[0]) < 22 ? 'the current @anthropic-ai/sdk needs Node >= 22' : false,
  }, async () => {
    const { default: Anthropic } = await import('@anthropic-ai/sdk')
    const quota = 'slow2'
    await held(quota)
    const before = mock.log.length
    // The SDK's own timeout covers the time to the response head, which now comes at once;
    // an AbortSignal (a user's Ctrl-C, an orchestrator's deadline) is how a streamed call is
    // given up.
    const client = new Anthropic({ apiKey: 'sk-ant-test-key', baseURL: `${base}/v1/fleets/f/quotas/${quota}/proxy`, defaultHeaders: { 'x-tokenwarden-token': SECRET }, maxRetries: 0 })
    const ac = new AbortController()
    const stream = client.messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'hello '.repeat(200) }] }, { signal: ac.signal })
    setTimeout(() => ac.abort(), 1_500)
    await assert.rejects(stream.finalMessage(), (e) => /abort/i.test(`${e.name} ${e.message}`))
    assert.ok(await until(async () => (await depth(quota)) === 0, 15_000), 'the ticket was withdrawn')
    await new Promise((res) => setTimeout(res, 5_000))
    assert.equal(mock.log.length, before, 'nothing was forwarded')
  })

  test('a client that waits gets the provider stream after the keep-alive comments, through the official SDK', {
    timeout: 60_000,
    skip: Number(process.versions.node.split('.')[0]) < 22 ? 'the current @anthropic-ai/sdk needs Node >= 22' : false,
  }, async () => {
    const { default: Anthropic } = await import('@anthropic-ai/sdk')
    const quota = 'slow3'
    await held(quota)
    const client = new Anthropic({ apiKey: 'sk-ant-test-key', baseURL: `${base}/v1/fleets/f/quotas/${quota}/proxy`, defaultHeaders: { 'x-tokenwarden-token': SECRET }, maxRetries: 0 })
    const t0 = Date.now()
    const msg = await client.messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 100, messages: [{ role: 'user', content: 'hello '.repeat(200) }] }).finalMessage()
    assert.ok(msg.content.length > 0)
    assert.ok(Date.now() - t0 >= 1_000, 'it waited for refill')
    assert.equal(Number((await metrics({ quota })).pools[0].counters.grantedFromQueue), 1, 'queued, then granted')
    assert.ok(await until(async () => (await metrics({ quota })).liveLeases === 1, 5_000), 'settled when the stream ended')
  })
})
