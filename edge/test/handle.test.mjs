// The core's host protocol over HTTP (`POST …/handle`, API.md): one input in, its output
// back, leases as signed handles both ways; what a member may send and what it may not.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const workerEntry = fileURLToPath(new URL('../src/worker.js', import.meta.url))
const outdir = fileURLToPath(new URL('../.build/handle/', import.meta.url))
const SECRET = 'handle-secret-0123456789abcdef'
const ADMIN = 'handle-admin-secret-0123456789'
const POOL = { name: 'sonnet', input_tokens_per_minute: 60_000, output_tokens_per_minute: 60_000, requests_per_minute: 1_000 }

let worker
let persist

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: workerEntry })
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-handle-'))
  const quotas = Object.fromEntries(['q', 'queue', 'limited', 'tasks', 'agents', 'bad', 'held', 'paused'].map((q) => [q, { config: { pools: [POOL] } }]))
  // One call at a time; leases reaped after 1 s unless renewed, and after 2 s however renewed.
  quotas.renewing = { config: { pools: [{ ...POOL, max_concurrent: 1 }], lease_ttl_ms: 1_000, max_lease_life_ms: 2_000 } }
  worker = await startWorker({ outdir, persist, fleets: { f: { secret: SECRET, admin_secret: ADMIN, quotas } } })
})

after(async () => {
  await worker?.mf.dispose()
  if (persist) rmSync(persist, { recursive: true, force: true })
})

/** POSTs one input to a quota's `/handle`; `{ status, body }`. */
async function handle(quota, input, secret = SECRET) {
  const res = await fetch(`${worker.base}/v1/fleets/f/quotas/${quota}/handle`, {
    method: 'POST',
    headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
    body: typeof input === 'string' ? input : JSON.stringify(input),
  })
  return { status: res.status, body: await res.json() }
}

const ask = (agent, inputTokens, maxTokens = 1_000) => ({ agent, pool: 'sonnet', inputTokens, maxTokens })
const HANDLE = /^tw\d\.f\.[a-z]+\.\d+\./

test('a call through the protocol: send under a handle, deliver, settle; the lease then names nothing', async () => {
  const sent = await handle('q', { op: 'call_lease', call: { failed: 0, refusals: 0, lastRetryAfterMs: null }, request: ask('planner', 2_000) })
  assert.equal(sent.status, 200, JSON.stringify(sent.body))
  assert.equal(sent.body.output, 'send')
  assert.match(sent.body.lease, HANDLE, 'the lease travels as a signed handle')
  assert.equal(sent.body.epoch, undefined, 'the epoch stays inside the handle')
  assert.ok(sent.body.clients >= 1)
  const delivered = await handle('q', { op: 'call_response', call: sent.body.call, pool: 'sonnet', lease: sent.body.lease, status: 200, headers: [] })
  assert.equal(delivered.body.output, 'deliver', JSON.stringify(delivered.body))
  assert.equal(delivered.body.settled, undefined, "a success is the caller's to settle")
  const settled = await handle('q', { op: 'settle', lease: sent.body.lease, usage: { inputTokens: 1_900, outputTokens: 300 } })
  assert.equal(settled.body.output, 'settled', JSON.stringify(settled.body))
  const used = settled.body.settlement.used.map(Number)
  assert.ok(used.includes(1_900) && used.includes(300), `charged what was used: ${used}`)
  const again = await handle('q', { op: 'settle', lease: sent.body.lease, usage: { inputTokens: 1 } })
  assert.equal(again.status, 404)
  assert.equal(again.body.error, 'unknown_lease')
})

test("a provider's 429 through the protocol: the limiter's core waits the call and settles the lease", async () => {
  const sent = await handle('limited', { op: 'call_lease', request: ask('worker', 1_000) })
  assert.equal(sent.body.output, 'send')
  const limited = await handle('limited', { op: 'call_response', call: sent.body.call, pool: 'sonnet', lease: sent.body.lease, status: 429, headers: [['retry-after', '7']] })
  assert.equal(limited.status, 200, JSON.stringify(limited.body))
  assert.equal(limited.body.output, 'wait')
  assert.equal(limited.body.wait.reason, 'rate_limited')
  assert.equal(limited.body.call.failed, 1)
  assert.ok(limited.body.settled !== undefined, 'the core settled the lease as nothing used')
  assert.equal(limited.body.report.retryAfterMs, 7_000)
  const cancel = await handle('limited', { op: 'cancel', lease: sent.body.lease })
  assert.equal(cancel.status, 404, 'the 429 ended the lease')
})

test("a plain report (the lease-level API) ends nothing: the lease stays its holder's to settle", async () => {
  const other = await handle('q', { op: 'request_lease', request: ask('worker', 1_000) })
  assert.equal(other.body.output, 'granted')
  const failed = await handle('q', { op: 'response', pool: 'sonnet', lease: other.body.lease, status: 500, headers: [] })
  assert.equal(failed.body.output, 'reported', JSON.stringify(failed.body))
  const after = await handle('q', { op: 'settle', lease: other.body.lease, usage: { inputTokens: 0 } })
  assert.equal(after.body.output, 'settled', JSON.stringify(after.body))
})

test('a queued ticket is a handle: it long-polls, and cancel ends it and its poll', async () => {
  // The pool's whole minute for one call, then a second that must queue.
  const first = await handle('queue', { op: 'request_lease', request: ask('a', 40_000, 10_000) })
  assert.equal(first.body.output, 'granted', JSON.stringify(first.body))
  const second = await handle('queue', { op: 'call_lease', request: ask('b', 40_000, 10_000) })
  assert.equal(second.body.output, 'wait', JSON.stringify(second.body))
  assert.equal(second.body.wait.reason, 'queued')
  assert.match(second.body.wait.ticket, HANDLE)
  const poll = fetch(`${worker.base}/v1/fleets/f/quotas/queue/leases/${second.body.wait.ticket}?wait=20000`, { headers: { authorization: `Bearer ${SECRET}` } })
  const cancelled = await handle('queue', { op: 'cancel', lease: second.body.wait.ticket })
  assert.equal(cancelled.body.output, 'cancelled')
  assert.equal((await poll).status, 404, 'the long poll ends with its ticket')
  const renewed = await handle('queue', { op: 'renew', lease: first.body.lease })
  assert.equal(renewed.body.output, 'renewed')
  assert.ok(Number(renewed.body.expiresAt) >= Number(first.body.expiresAt))
})

test('tasks through the protocol', async () => {
  const opened = await handle('tasks', { op: 'open_task', task: { task: 'fix-login', role: 'planner', unblocks: 2 } })
  assert.equal(opened.body.output, 'task_opened', JSON.stringify(opened.body))
  assert.equal((await handle('tasks', { op: 'task_failed', task: 'fix-login', signature: 42 })).body.inARow, 0)
  assert.equal((await handle('tasks', { op: 'task_failed', task: 'fix-login', signature: 42 })).body.inARow, 1)
  const ended = await handle('tasks', { op: 'end_task', task: 'fix-login', outcome: 'merged' })
  assert.equal(ended.body.output, 'task_ended')
  assert.equal(ended.body.summary.outcome, 'merged')
  assert.equal(Number(ended.body.summary.task) > 0, true, 'the task by the id its name stands for')
  assert.equal((await handle('tasks', { op: 'end_task', task: 'fix-login', outcome: 'merged' })).body.error, 'unknown_task')
})

test('an agent credential acts through the protocol for its own agent only', async () => {
  const mint = async (agent) => (await (await fetch(`${worker.base}/v1/fleets/f/agents/${agent}/credential`, { method: 'POST', headers: { authorization: `Bearer ${SECRET}` } })).json()).credential
  const alice = await mint('alice')
  const bob = await mint('bob')
  const mine = await handle('agents', { op: 'call_lease', request: { pool: 'sonnet', inputTokens: 100, maxTokens: 100 } }, alice)
  assert.equal(mine.body.output, 'send', JSON.stringify(mine.body))
  const asBob = await handle('agents', { op: 'call_lease', request: ask('bob', 100) }, alice)
  assert.equal(asBob.status, 403, 'alice leases only for alice')
  const theft = await handle('agents', { op: 'settle', lease: mine.body.lease, usage: { inputTokens: 1 } }, bob)
  assert.equal(theft.status, 403, "bob cannot settle alice's lease")
  const probe = await handle('agents', { op: 'renew', lease: mine.body.lease, extra: 1 }, bob)
  assert.equal(probe.status, 403, 'who may act is checked before the fields')
  const rest = await fetch(`${worker.base}/v1/fleets/f/quotas/agents/leases/${mine.body.lease}/renew`, {
    method: 'POST',
    headers: { authorization: `Bearer ${bob}`, 'content-type': 'application/json' },
    body: JSON.stringify({ extra: 1 }),
  })
  assert.equal(rest.status, 403, 'on the REST route too')
  assert.equal((await handle('agents', { op: 'settle', lease: mine.body.lease, usage: { inputTokens: 90 } }, alice)).body.output, 'settled')
})

test("what a member may not send: the operator's inputs, raw or forged lease ids, fields the object sets, bad JSON", async () => {
  for (const op of ['hold', 'restarted', 'timeout', 'nonsense']) {
    const r = await handle('bad', { op, pool: 0, until: 1e12 })
    assert.equal(r.status, 400, op)
    assert.equal(r.body.field, 'op')
    assert.match(r.body.message, /call_lease/, 'the message lists what a member may send')
  }
  const sent = await handle('bad', { op: 'call_lease', request: ask('x', 100) })
  const id = Number(sent.body.lease.split('.')[3])
  const raw = await handle('bad', { op: 'settle', lease: id, usage: { inputTokens: 1 } })
  assert.equal(raw.status, 400, 'a raw id is not a handle')
  assert.equal(raw.body.field, 'lease')
  const forged = await handle('bad', { op: 'settle', lease: sent.body.lease.replace(/.$/, (c) => (c === 'A' ? 'B' : 'A')), usage: { inputTokens: 1 } })
  assert.ok(forged.status === 404 || forged.status === 403, `a forged handle: ${forged.status}`)
  const dated = await handle('bad', { op: 'call_response', pool: 'sonnet', lease: sent.body.lease, status: 200, headers: [], unixNowMs: 0 })
  assert.equal(dated.status, 400)
  assert.equal(dated.body.field, 'unixNowMs')
  const reported = await handle('bad', { op: 'response', pool: 'sonnet', lease: sent.body.lease, status: 429, headers: [], reported: false })
  assert.equal(reported.status, 400, "a report is always a member's: `reported` is the object's to set")
  assert.equal((await handle('bad', '{not json')).status, 400)
  assert.equal((await handle('bad', '[1]')).status, 400)
  const nullCall = await fetch(`${worker.base}/v1/fleets/f/quotas/bad/leases`, {
    method: 'POST',
    headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
    body: JSON.stringify({ ...ask('x', 100), call: null }),
  })
  assert.equal(nullCall.status, 400, 'POST /leases: a null call is not a call')
  const unknownField = await handle('bad', { op: 'call_lease', request: { ...ask('x', 100), cached: 5 } })
  assert.equal(unknownField.status, 400)
  assert.equal(unknownField.body.field, 'cached')
  // Nothing was half-applied: the lease is still live and settles.
  assert.equal((await handle('bad', { op: 'settle', lease: sent.body.lease, usage: { inputTokens: 90 } })).body.output, 'settled')
})

test("the operator's hold: no grants from the pool until it ends, queued calls keep their places; only the admin secret holds", async () => {
  const hold = (body, secret = ADMIN) =>
    fetch(`${worker.base}/v1/fleets/f/quotas/held/admin/hold`, { method: 'POST', headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' }, body: JSON.stringify(body) })
  assert.equal((await hold({ pool: 'sonnet', forMs: 60_000 }, SECRET)).status, 401, 'the fleet secret cannot hold')
  assert.equal((await handle('held', { op: 'hold', pool: 0, until: 1e13 })).status, 400, 'nor send the input itself')
  const bad = await hold({ pool: 'sonnet', forMs: -1 })
  assert.equal(bad.status, 400)
  assert.equal((await bad.json()).field, 'forMs')
  const opus = await hold({ pool: 'opus', forMs: 1_000 })
  assert.equal(opus.status, 400, 'an unknown pool')
  assert.equal((await opus.json()).field, 'pool')
  assert.equal((await hold({ pool: 'sonnet', forMs: 1_000, extra: 1 })).status, 400)
  const before = await handle('held', { op: 'call_lease', request: ask('early', 100) })
  assert.equal(before.body.output, 'send')
  const res = await hold({ pool: 'sonnet', forMs: 60_000 })
  assert.equal(res.status, 200)
  const held = await res.json()
  assert.equal(held.held, true)
  assert.equal(held.pool, 'sonnet')
  const during = await handle('held', { op: 'call_lease', request: ask('late', 100) })
  assert.equal(during.body.output, 'wait', JSON.stringify(during.body))
  assert.equal(during.body.wait.reason, 'queued', 'in line for the end of the hold')
  assert.equal(during.body.wait.checkpoint, true, 'a wait that long: write the turn down first')
  assert.ok(Number(during.body.wait.until) >= held.until, 'nothing is granted before the hold ends')
  // A lease granted before the hold runs on.
  assert.equal((await handle('held', { op: 'settle', lease: before.body.lease, usage: { inputTokens: 90 } })).body.output, 'settled')
  const metrics = await (await fetch(`${worker.base}/v1/fleets/f/quotas/held/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()
  assert.equal(Number(metrics.pools[0].pausedUntil), held.until, 'the pool is paused until the hold ends')
  // Issue 43, N8: the next hold replaces it; forMs 0 lifts it, and the call in line is served.
  const shorter = await (await hold({ pool: 'sonnet', forMs: 5_000 })).json()
  assert.ok(shorter.until < held.until - 50_000, `shortened: ${shorter.until} against ${held.until}`)
  const lifted = await (await hold({ pool: 'sonnet', forMs: 0 })).json()
  assert.ok(lifted.until <= Date.now() + 1_000, `lifted: ${lifted.until}`)
  const after = await (await fetch(`${worker.base}/v1/fleets/f/quotas/held/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()
  assert.ok(Number(after.pools[0].pausedUntil) <= Date.now() + 1_000, 'no longer paused')
  assert.equal(after.pools[0].queueDepth, 0, 'the call in line was granted when the hold was lifted')
})

test('a member cannot keep the pool paused with its own lease: a lease pauses once (issue 43, N1)', async () => {
  const lease = await handle('paused', { op: 'request_lease', request: ask('mallory', 1_000) })
  assert.equal(lease.body.output, 'granted', JSON.stringify(lease.body))
  const tooMany = { op: 'response', pool: 'sonnet', lease: lease.body.lease, status: 429, headers: [['retry-after', '60']] }
  const pausedUntil = async () => Number((await (await fetch(`${worker.base}/v1/fleets/f/quotas/paused/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()).pools[0].pausedUntil)
  assert.equal((await handle('paused', tooMany)).status, 200)
  const first = await pausedUntil()
  assert.ok(first > Date.now() + 50_000, `paused for the retry-after: ${first}`)
  for (let i = 0; i < 5; i++) {
    await new Promise((r) => setTimeout(r, 20))
    const again = await handle('paused', tooMany)
    assert.equal(again.status, 200, JSON.stringify(again.body))
    assert.equal(await pausedUntil(), first, 'the same lease moves the pause no further')
  }
})

test("renewing holds a slot no longer than the lease's life: the caller in line is granted then (issue 43, N3)", async () => {
  const held = await handle('renewing', { op: 'request_lease', request: ask('mallory', 100, 100) })
  assert.equal(held.body.output, 'granted', JSON.stringify(held.body))
  const grantedAt = Number(held.body.expiresAt) - 1_000
  const queued = await handle('renewing', { op: 'call_lease', request: ask('victim', 100, 100) })
  assert.equal(queued.body.wait?.reason, 'queued', JSON.stringify(queued.body))
  // Long-polled until granted (a poll also ends when the ticket's promise is revised).
  const poll = (async () => {
    for (;;) {
      const r = await fetch(`${worker.base}/v1/fleets/f/quotas/renewing/leases/${queued.body.wait.ticket}?wait=20000`, { headers: { authorization: `Bearer ${SECRET}` } })
      const answer = { status: r.status, body: await r.json(), at: Date.now() }
      if (answer.status !== 202 || answer.at - grantedAt > 10_000) return answer
    }
  })()
  // Renewed every 200 ms for 4 s: the expiry stops at the grant + 2 s, the lease then ends.
  const expiries = []
  let gone = null
  for (let i = 0; i < 20 && gone === null; i++) {
    await new Promise((r) => setTimeout(r, 200))
    const r = await handle('renewing', { op: 'renew', lease: held.body.lease })
    if (r.body.output === 'renewed') expiries.push(Number(r.body.expiresAt))
    else gone = r.body
  }
  assert.ok(expiries.length >= 3, `renewed while it lived: ${expiries}`)
  assert.ok(Math.max(...expiries) <= grantedAt + 2_000, `never past its life: ${expiries.map((e) => e - grantedAt)} ms after the grant`)
  assert.equal(Math.max(...expiries), grantedAt + 2_000, 'renewed up to the end of its life')
  assert.equal(gone?.error, 'unknown_lease', `the lease ends at its life's end: ${JSON.stringify(gone)}`)
  const granted = await poll
  assert.equal(granted.status, 200, JSON.stringify(granted.body))
  assert.equal(granted.body.kind, 'grant')
  assert.ok(granted.at - grantedAt < 3_500, `the caller in line was granted ${granted.at - grantedAt} ms after the first grant`)
})

test('a number past what JSON holds exactly is refused naming its field, not read as null (issue 43, N7)', async () => {
  const lease = await handle('q', { op: 'request_lease', request: ask('numbers', 1_000) })
  assert.equal(lease.body.output, 'granted', JSON.stringify(lease.body))
  const text = `{"op":"settle","lease":${JSON.stringify(lease.body.lease)},"usage":{"inputTokens":1e400,"outputTokens":5}}`
  const r = await handle('q', text)
  assert.equal(r.status, 400, JSON.stringify(r.body))
  assert.equal(r.body.error, 'invalid_argument')
  assert.equal(r.body.field, 'inputTokens')
  // Nothing happened: the lease is still there to settle.
  const settled = await handle('q', { op: 'settle', lease: lease.body.lease, usage: { inputTokens: 900, outputTokens: 5 } })
  assert.equal(settled.body.output, 'settled', JSON.stringify(settled.body))
})
