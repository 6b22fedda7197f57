// The async driver with a hand-moved clock, on the native engine (or the wasm build with
// TOKENWARDEN_ENGINE=wasm: the same suite must pass on both).
import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Driver, LeaseRejectedError, ManualClock, RemoteTokenwarden, Tokenwarden, TokenwardenError, newCall, planFleetWith } from 'tokenwarden-driver'
import { engines as nativeEngines } from '../support/engine.mjs'

const POOL = { name: 'sonnet', input_tokens_per_minute: 100_000, output_tokens_per_minute: 20_000, requests_per_minute: 1000, max_concurrent: 4 }

function setup(pool = POOL, extra = {}) {
  const clock = new ManualClock(0)
  const engine = nativeEngines.create({ pools: [pool], ...extra }, 7, 0)
  const driver = new Driver(engine, { clock })
  const events = []
  for (const name of ['granted', 'queued', 'rejected', 'rate_limited', 'settled', 'expired', 'margin_changed', 'paused', 'estimate_alert']) {
    driver.on(name, (e) => events.push({ name, ...e }))
  }
  return { clock, engine, driver, events }
}

const req = (agent, inputTokens, extra = {}) => ({ agent, pool: 0, inputTokens, maxTokens: 100, ...extra })
const settled = (p) => p.then((v) => ({ ok: v }), (e) => ({ err: e }))

describe('acquire', () => {
  test('a request within the margin is granted at once', async () => {
    const { driver, events } = setup()
    const lease = await driver.acquire(req(1, 1000))
    assert.equal(lease.agent, 1)
    assert.equal(lease.pool, 0)
    assert.equal(lease.waitedMs, 0)
    assert.equal(lease.expiresAt, 120_000)
    const s = lease.settle({ inputTokens: 900, outputTokens: 40 })
    assert.deepEqual(s, { reserved: [1000, 100, 1100, 1], used: [900, 40, 940, 1] })
    assert.ok(lease.done)
    assert.deepEqual(events.map((e) => e.name), ['granted', 'settled'])
  })

  test('a queued request resolves when the one timer reaches its refill, by its ETA', async () => {
    const { clock, driver, events } = setup()
    await driver.acquire(req(1, 85_000))
    const p = driver.acquire(req(2, 10_000))
    const queued = events.find((e) => e.name === 'queued')
    assert.ok(queued, 'a queued event')
    assert.equal(queued.agent, 2)
    // 10,000 input tokens refill at 85,000 a minute; the ETA (an upper bound) also leaves
    // room for what agent 1 could still be served ahead.
    const refill = Math.ceil((10_000 * 60_000) / 85_000)
    assert.ok(queued.etaMs >= refill && queued.etaMs <= 60_000, `eta ${queued.etaMs}`)
    assert.equal(clock.pending, 1, 'one timer')
    let done = false
    p.then(() => (done = true))
    await clock.advance(refill - 1)
    assert.equal(done, false, `not granted at ${clock.now()}`)
    await clock.advance(1)
    const lease = await p
    assert.equal(lease.waitedMs, refill)
    assert.ok(lease.waitedMs <= queued.etaMs)
    assert.equal(driver.waiting, 0)
  })

  test('many waiters share one timer', async () => {
    const { clock, driver } = setup({ ...POOL, max_concurrent: null })
    await driver.acquire(req(1, 85_000))
    const waits = []
    for (let a = 2; a < 30; a++) waits.push(driver.acquire(req(a, 2000)))
    assert.equal(driver.waiting, 28)
    assert.equal(clock.pending, 1)
    await clock.advance(60_000)
    const leases = await Promise.all(waits)
    assert.equal(leases.length, 28)
    assert.ok(clock.pending <= 1)
  })

  test('settling below the reservation grants a queued ticket in the same call', async () => {
    const { driver } = setup()
    const big = await driver.acquire(req(1, 85_000))
    const p = driver.acquire(req(2, 10_000))
    big.settle({ inputTokens: 1000, outputTokens: 10 })
    const lease = await p
    assert.equal(lease.waitedMs, 0)
  })

  test('a request that can never fit rejects as not retryable, with no retry time', async () => {
    const { driver, events } = setup()
    // Above the 100k input limit itself: the provider refuses such a call too. (90k, within
    // the limit but above the 85 % margin, is served from a full bucket.)
    const r = await settled(driver.acquire(req(1, 100_001)))
    assert.ok(r.err instanceof LeaseRejectedError)
    assert.equal(r.err.code, 'rejected')
    assert.equal(r.err.retryable, false)
    assert.equal(r.err.retryAt, null)
    assert.equal(r.err.retryAfterMs, null)
    assert.deepEqual(r.err.reason, { kind: 'exceeds_capacity', axis: 'input_tokens' })
    assert.match(r.err.message, /never be served/)
    assert.equal(events.at(-1).name, 'rejected')
  })

  test('max_tokens above the output limit is granted under Anthropic counting, its output reservation learned', async () => {
    const { driver } = setup()
    const first = await driver.acquire(req(1, 1000, { maxTokens: 128_000 }))
    const s1 = first.settle({ inputTokens: 1000, outputTokens: 900 })
    assert.equal(Number(s1.reserved[1]), 4096, 'before any call settled')
    const second = await driver.acquire(req(1, 1000, { maxTokens: 128_000 }))
    const s2 = second.settle({ inputTokens: 1000, outputTokens: 2500 })
    assert.equal(Number(s2.reserved[1]), 900, "the agent's own history")
    assert.equal(Number(s2.used[1]), 2500, "beyond the reservation: charged on settle")
  })

  test('a wait longer than max_queue_wait_ms rejects with the retry time', async () => {
    const { driver } = setup(POOL, { max_queue_wait_ms: 1000 })
    await driver.acquire(req(1, 85_000))
    const r = await settled(driver.acquire(req(2, 50_000)))
    assert.ok(r.err instanceof LeaseRejectedError)
    assert.equal(r.err.reason.kind, 'wait_too_long')
    assert.equal(r.err.retryable, true)
    assert.ok(typeof r.err.retryAt === 'number' && r.err.retryAt > 0)
    assert.equal(r.err.retryAfterMs, r.err.retryAt)
  })

  test('aborting while queued withdraws the ticket', async () => {
    const { clock, driver, engine } = setup()
    await driver.acquire(req(1, 85_000))
    const ac = new AbortController()
    const p = settled(driver.acquire(req(2, 10_000), { signal: ac.signal }))
    assert.equal(engine.metrics(0).pools[0].queueDepth, 1)
    ac.abort(new Error('user gave up'))
    const r = await p
    assert.equal(r.err.name, 'AbortError')
    assert.equal(r.err.code, 'aborted')
    assert.equal(engine.metrics(clock.now()).pools[0].queueDepth, 0)
    assert.equal(driver.waiting, 0)
    assert.equal(clock.pending <= 1, true)
  })

  test('an already aborted signal rejects without asking the engine', async () => {
    const { driver, engine } = setup()
    const r = await settled(driver.acquire(req(1, 10), { signal: AbortSignal.abort() }))
    assert.equal(r.err.code, 'aborted')
    assert.equal(engine.metrics(0).pools[0].counters.grantedNow, 0)
  })

  test('an unsettled lease expires with an event and cannot be settled later', async () => {
    const { clock, driver, events } = setup()
    const lease = await driver.acquire(req(1, 1000))
    await clock.advance(120_000)
    assert.ok(events.some((e) => e.name === 'expired' && e.lease === lease.id))
    assert.throws(() => lease.settle({ inputTokens: 1 }), { code: 'unknown_lease' })
  })

  test('a renewed lease keeps its one slot past its TTL; a done lease cannot be renewed', async () => {
    const { clock, driver, engine, events } = setup({ ...POOL, max_concurrent: 1 }, { lease_ttl_ms: 3000 })
    const lease = await driver.acquire(req(1, 10))
    assert.equal(lease.expiresAt, 3000)
    let second = null
    const p = driver.acquire(req(2, 10)).then((l) => (second = l))
    for (let t = 2000; t <= 10_000; t += 2000) {
      await clock.advance(2000)
      assert.equal(lease.renew(), t + 3000)
      assert.equal(lease.expiresAt, t + 3000)
    }
    await clock.advance(2000)
    assert.equal(second, null, 'the second call waits for the slot')
    assert.ok(!events.some((e) => e.name === 'expired'))
    assert.equal(engine.metrics(clock.now()).pools[0].inFlight, 1)
    lease.settle({ inputTokens: 10, outputTokens: 10 })
    await p
    assert.equal(second.agent, 2)
    assert.throws(() => lease.renew(), { code: 'unknown_lease' })
    // Unrenewed, the second lease expires at its TTL, and then cannot be renewed either.
    await clock.advance(3000)
    assert.ok(events.some((e) => e.name === 'expired' && e.lease === second.id))
    assert.throws(() => second.renew(), { code: 'unknown_lease' })
    assert.throws(() => engine.handle(clock.now(), { op: 'renew', lease: 12345 }), { code: 'unknown_lease' })
    assert.throws(() => engine.handle(clock.now(), { op: 'renew', lease: -1 }), { code: 'invalid_argument' })
  })

  test('renewing a queued ticket is not_granted', () => {
    const { engine } = setup({ ...POOL, max_concurrent: 1 })
    engine.requestLease(0, req(1, 10))
    const d = engine.requestLease(0, req(2, 10))
    assert.equal(d.kind, 'queued')
    assert.throws(() => engine.handle(1, { op: 'renew', lease: d.lease }), { code: 'not_granted' })
  })

  test('close rejects waiters with `closed` and later acquires too', async () => {
    const { clock, driver } = setup()
    await driver.acquire(req(1, 85_000))
    const p = settled(driver.acquire(req(2, 10_000)))
    driver.close()
    assert.equal((await p).err.code, 'closed')
    assert.equal((await settled(driver.acquire(req(3, 1)))).err.code, 'closed')
    assert.equal(clock.pending, 0)
  })
})

describe('responses and events', () => {
  test('a 429 pauses the pool, cuts the margin once, and emits rate_limited', async () => {
    const { driver, events } = setup()
    const lease = await driver.acquire(req(1, 1000))
    lease.report(200, { 'anthropic-ratelimit-input-tokens-limit': '100000', 'anthropic-ratelimit-input-tokens-remaining': '99000' })
    const report = lease.report(429, new Headers({ 'retry-after': '12' }))
    assert.equal(report.retryAfterMs, 12_000)
    const names = events.map((e) => e.name)
    assert.ok(names.includes('rate_limited'))
    assert.ok(names.includes('paused'))
    const cut = events.find((e) => e.name === 'margin_changed')
    assert.deepEqual([cut.fromPermille, cut.toPermille, cut.reason], [850, 800, 'rate_limited'])
  })

  test('header pairs, objects and Headers are all accepted', () => {
    const { driver } = setup()
    for (const h of [[['retry-after', '3']], { 'retry-after': '3' }, new Headers({ 'retry-after': '3' })]) {
      assert.equal(driver.report(0, null, 200, h).retryAfterMs, 3000)
    }
  })

  test('estimates that keep missing raise estimate_alert', async () => {
    const { driver, events } = setup()
    // The alert watches the median error of the last nine completed calls.
    for (let i = 0; i < 10; i++) {
      const lease = await driver.acquire(req(5, 3000))
      lease.settle({ inputTokens: 2000, outputTokens: 100 })
    }
    const alert = events.find((e) => e.name === 'estimate_alert')
    assert.ok(alert, 'an alert')
    assert.equal(alert.agent, 5)
  })

  test('metrics show usage, queue and each agent', async () => {
    const { driver } = setup()
    const lease = await driver.acquire(req(1, 1000))
    lease.settle({ inputTokens: 800, outputTokens: 20 })
    const m = driver.metrics()
    assert.equal(m.pools[0].name, 'sonnet')
    assert.equal(m.pools[0].marginPermille, 850)
    assert.deepEqual(m.pools[0].axes.map((a) => a.axis), ['input_tokens', 'output_tokens', 'tokens', 'requests'])
    assert.equal(m.agents[0].agent, 1)
    assert.equal(m.agents[0].activity.state, 'idle')
  })
})

describe('handle: the host protocol at the driver\'s clock', () => {
  test('inputs answer outputs, and listeners hear what the typed methods announce', async () => {
    const { clock, driver, events } = setup()
    const sent = driver.handle({ op: 'call_lease', request: req(1, 85_000) })
    assert.equal(sent.output, 'send')
    const waited = driver.handle({ op: 'call_lease', call: sent.call, request: req(2, 10_000) })
    assert.equal(waited.output, 'wait')
    assert.equal(waited.wait.reason, 'queued')
    assert.deepEqual(
      events.map((e) => [e.name, e.agent]),
      [
        ['granted', 1],
        ['queued', 2],
      ],
    )
    // The ticket has no promise: its grant comes as an event, when the driver's one timer fires.
    assert.equal(driver.waiting, 0)
    assert.equal(clock.pending, 1, 'the timer is armed for the refill')
    await clock.advance(Number(waited.wait.until))
    assert.deepEqual(events.at(-1).name, 'granted')
    assert.equal(events.at(-1).lease, waited.wait.ticket)
    const limited = driver.handle({ op: 'call_response', call: sent.call, pool: 0, lease: sent.lease, status: 429, headers: [['retry-after', '3']] })
    assert.equal(limited.output, 'wait')
    assert.equal(limited.wait.reason, 'rate_limited')
    const heard = events.filter((e) => e.name === 'rate_limited' || e.name === 'settled')
    assert.deepEqual(
      heard.map((e) => e.name),
      ['rate_limited', 'settled'],
    )
    assert.equal(heard[0].retryAfterMs, 3_000)
    assert.equal(heard[1].lease, sent.lease)
    const s = driver.handle({ op: 'settle', lease: waited.wait.ticket, usage: { inputTokens: 9_000, outputTokens: 10 } })
    assert.equal(s.output, 'settled')
    assert.deepEqual(events.at(-1), { name: 'settled', lease: waited.wait.ticket, agent: null, pool: null, settlement: s.settlement })
    const never = driver.handle({ op: 'request_lease', request: req(3, 10_000_000) })
    assert.equal(never.output, 'never_fits')
    assert.deepEqual(events.at(-1), { name: 'rejected', agent: 3, pool: 0, reason: never.reason, retryAt: null })
  })

  test('a bad input throws the engine\'s coded error, announces nothing, and a closed driver refuses', () => {
    const { driver, events } = setup()
    assert.throws(() => driver.handle({ op: 'settle', lease: 99, usage: {} }), { code: 'unknown_lease' })
    assert.deepEqual(events, [])
    driver.close()
    assert.throws(() => driver.handle({ op: 'timeout' }), { code: 'closed' })
  })

  test("a ticket withdrawn through handle ends the typed method's promise, as cancel() does", async () => {
    const { driver, events } = setup()
    await driver.acquire(req(1, 85_000))
    const first = settled(driver.acquire(req(2, 10_000)))
    assert.equal(driver.waiting, 1)
    const gone = driver.handle({ op: 'restarted', keep: [] })
    assert.equal(gone.output, 'ended')
    assert.deepEqual(gone.withdrawn, [events.find((e) => e.name === 'queued' && e.agent === 2).lease])
    assert.equal((await first).err?.code, 'aborted')
    assert.equal(driver.waiting, 0)
    const second = settled(driver.acquire(req(3, 80_000)))
    assert.equal(driver.waiting, 1)
    const ticket = events.find((e) => e.name === 'queued' && e.agent === 3).lease
    assert.equal(driver.handle({ op: 'cancel', lease: ticket }).output, 'cancelled')
    assert.equal((await second).err?.code, 'aborted')
    assert.equal(driver.waiting, 0)
  })
})

describe('bad input is a coded error and changes nothing', () => {
  const cases = [
    ['negative tokens', req(1, -5), RangeError, 'invalid_argument', 'inputTokens'],
    ['fractional tokens', req(1, 1.5), RangeError, 'invalid_argument', 'inputTokens'],
    ['tokens above 2^53 - 1', req(1, 2n ** 60n), RangeError, 'too_large', 'inputTokens'],
    ['unknown pool', { ...req(1, 10), pool: 9 }, Error, 'unknown_pool', undefined],
    ['unknown role', req(1, 10, { role: 'boss' }), RangeError, 'invalid_argument', 'role'],
    ['agent of the wrong type', { ...req(1, 10), agent: 'a' }, TypeError, 'invalid_argument', 'agent'],
    ['a missing request', undefined, TypeError, 'invalid_argument', 'request'],
  ]
  for (const [name, request, cls, code, field] of cases) {
    test(name, async () => {
      const { driver, engine } = setup()
      const before = engine.snapshot()
      const r = await settled(driver.acquire(request))
      assert.ok(r.err instanceof cls, `${r.err?.constructor?.name}: ${r.err?.message}`)
      assert.equal(r.err.code, code)
      assert.equal(r.err.field, field)
      assert.ok(r.err.message.length > 10)
      assert.equal(engine.snapshot(), before, 'state unchanged')
    })
  }

  test('settling twice, or a forged id, is unknown_lease', async () => {
    const { driver } = setup()
    const lease = await driver.acquire(req(1, 10))
    lease.settle({ inputTokens: 10 })
    assert.throws(() => lease.settle({ inputTokens: 10 }), { code: 'unknown_lease' })
    assert.throws(() => driver.settle(123456789, {}), { code: 'unknown_lease' })
    assert.throws(() => driver.settle(2 ** 60, {}), { code: 'unknown_lease' })
    assert.throws(() => driver.cancel(-1), { code: 'invalid_argument' })
  })

  test('an invalid configuration names the field', () => {
    assert.throws(() => nativeEngines.create({ pools: [{ name: 'a', requests_per_minute: 0 }] }, 1, 0), (e) => {
      assert.equal(e.code, 'invalid_config')
      assert.equal(e.field, 'pools[0].requests_per_minute')
      assert.match(e.message, /must be at least 1/)
      return true
    })
    assert.throws(() => nativeEngines.create('{"pools": [', 1, 0), { code: 'config_parse' })
    assert.throws(() => nativeEngines.create({ pools: [], bogus: 1 }, 1, 0), { code: 'config_parse' })
    assert.throws(() => nativeEngines.restore('{}'), (e) => e.code.startsWith('snapshot_'))
  })

  test('the driver names the pools it has', () => {
    const { driver } = setup()
    assert.equal(driver.pool('sonnet'), 0)
    assert.throws(() => driver.pool('opus'), (e) => e instanceof TokenwardenError && e.code === 'unknown_pool' && /"sonnet"/.test(e.message))
  })
})

test('a snapshot restores an engine that makes the same decisions', async () => {
  const { driver, engine } = setup()
  await driver.acquire(req(1, 85_000))
  const twin = nativeEngines.restore(engine.snapshot())
  const a = engine.requestLease(10, req(2, 5000))
  const b = twin.requestLease(10, req(2, 5000))
  assert.deepEqual(a, b)
  assert.equal(a.kind, 'queued')
})

// RemoteLease.renew against a stub limiter: the HTTP call it makes and what it does with
// the answer (the edge route itself is tested in the edge suite).
describe('RemoteLease.renew', () => {
  const REMOTE_CONFIG = { pools: [{ name: 'sonnet', requests_per_minute: 1000 }] }
  const HANDLE = 'tw1.f.q.4294967296.mac'

  function stub() {
    const calls = []
    const ended = new Set()
    const fetch = async (url, init) => {
      const path = new URL(url).pathname
      calls.push({ method: init.method, path, body: init.body === null ? null : JSON.parse(init.body) })
      const json = (status, body) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } })
      const input = calls.at(-1).body
      if (init.method !== 'POST' || !path.endsWith('/handle')) return json(404, { error: 'not_found', message: path })
      if (input.op === 'request_lease') return json(200, { output: 'granted', lease: HANDLE, expiresAt: 120_000 })
      if (input.op === 'renew') {
        return ended.has(input.lease) ? json(404, { error: 'unknown_lease', message: 'no such lease' }) : json(200, { output: 'renewed', expiresAt: 150_000 })
      }
      if (input.op === 'settle') {
        ended.add(input.lease)
        return json(200, { output: 'settled', settlement: { reserved: [1, 1, 2, 1], used: [1, 1, 2, 1] } })
      }
      return json(404, { error: 'not_found', message: path })
    }
    return { calls, fetch }
  }

  test('RemoteLease.renew posts the renew input with its handle and takes the limiter expiresAt', async () => {
    const { calls, fetch } = stub()
    const tw = new RemoteTokenwarden({ url: 'http://limiter.test', fleet: 'f', quota: 'q', secret: 's', engine: nativeEngines, config: REMOTE_CONFIG, clock: new ManualClock(0), fetch })
    const lease = await tw.acquire({ agent: 1, pool: 0, inputTokens: 1, maxTokens: 1 })
    assert.equal(lease.handle, HANDLE)
    assert.equal(lease.expiresAt, 120_000)
    assert.equal(await lease.renew(), 150_000)
    assert.equal(lease.expiresAt, 150_000)
    assert.deepEqual(calls.at(-1), { method: 'POST', path: '/v1/fleets/f/quotas/q/handle', body: { op: 'renew', lease: HANDLE } })
    await lease.settle({ inputTokens: 1, outputTokens: 1 })
    // Ended here: refused without a round trip.
    const n = calls.length
    await assert.rejects(lease.renew(), { code: 'unknown_lease' })
    assert.equal(calls.length, n)
    tw.close()
  })

  test('handle is not the remote driver\'s: it throws rather than act on the local engine', () => {
    const tw = new RemoteTokenwarden({ url: 'http://limiter.test', fleet: 'f', quota: 'q', secret: 's', engine: nativeEngines, config: REMOTE_CONFIG, clock: new ManualClock(0), fetch: stub().fetch })
    assert.throws(() => tw.handle({ op: 'request_lease', request: { agent: 1, pool: 0, inputTokens: 1, maxTokens: 1 } }), { code: 'invalid_argument', message: /typed methods/ })
    assert.equal(Number(tw.engine.metrics(0).pools[0].counters.grantedNow), 0)
    tw.close()
  })

  test('a renewal the limiter refuses rejects with its code', async () => {
    const { fetch } = stub()
    const tw = new RemoteTokenwarden({ url: 'http://limiter.test', fleet: 'f', quota: 'q', secret: 's', engine: nativeEngines, config: REMOTE_CONFIG, clock: new ManualClock(0), fetch })
    const lease = await tw.acquire({ agent: 1, pool: 0, inputTokens: 1, maxTokens: 1 })
    // Settled elsewhere (another process holding the handle): the limiter says so.
    const other = await tw.acquire({ agent: 1, pool: 0, inputTokens: 1, maxTokens: 1 })
    await other.settle({ inputTokens: 1, outputTokens: 1 })
    await assert.rejects(lease.renew(), { code: 'unknown_lease' })
    tw.close()
  })
})

describe("a newcomer's mistakes get errors that name them (issue 42, item 6)", () => {
  const ag = [{ name: 'w', count: 3, calls_per_minute_milli: 2000, input_tokens_first: 1000, input_tokens_last: 2000, output_tokens: 100 }]
  const plan = (pool) => planFleetWith((json) => nativeEngines.planFleet(json), { pool, agents: ag })
  const invalid = (field, pattern) => (e) => e.code === 'invalid_argument' && (field === null || e.field === field) && pattern.test(e.message)

  test('a lease that names no agent is refused, not granted as agent 0', async () => {
    const { driver } = setup()
    assert.throws(() => driver.handle({ op: 'request_lease', request: { pool: 0, inputTokens: 10, maxTokens: 10 } }), invalid(null, /missing field `agent`/))
    await assert.rejects(driver.acquire({ pool: 0, inputTokens: 10, maxTokens: 10 }), invalid(null, /missing field `agent`/))
    assert.equal(driver.metrics().liveLeases, 0)
    driver.close()
  })

  test('an input with a field it does not take is refused; handle(null) names what it needs', () => {
    const { driver } = setup()
    assert.throws(() => driver.handle({ op: 'timeout', extra: 1 }), invalid(null, /unknown field `extra`/))
    assert.equal(driver.handle({ op: 'timeout' }).output, 'timed_out')
    for (const bad of [null, undefined, 7, []]) assert.throws(() => driver.handle(bad), invalid('input', /handle needs an input object/))
    driver.close()
  })

  test("metrics name the agents a wrapped fetch was given by name, and their family's root", async () => {
    const tw = new Tokenwarden({ engine: nativeEngines, config: { pools: [POOL] }, seed: 1 })
    const usage = { input_tokens: 5, output_tokens: 5 }
    const send = async () => new Response(JSON.stringify({ usage }), { headers: { 'content-type': 'application/json' } })
    const f = tw.fetch({ agent: 'alice', family: 'lead', fetch: send })
    await f('https://api.example/v1/messages', { method: 'POST', body: JSON.stringify({ model: 'sonnet', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }) })
    await tw.acquire({ agent: 7, pool: 0, inputTokens: 10, maxTokens: 10 })
    const agents = tw.metrics().agents
    const alice = agents.find((a) => a.name === 'alice')
    assert.ok(alice, JSON.stringify(agents))
    assert.equal(alice.familyName, 'lead')
    assert.equal(agents.find((a) => a.agent === 7).name, null)
    tw.close()
  })

  test('new Tokenwarden without an engine says what it needs', () => {
    assert.throws(() => new Tokenwarden({ config: { pools: [POOL] } }), invalid('engine', /needs `engine`.*createTokenwarden/))
    assert.throws(() => new Tokenwarden(null), invalid('options', /options object/))
  })

  test('planFleet refuses a pool it cannot plan against, by field', () => {
    assert.equal(plan({ name: 'p', input_tokens_per_minute: 30_000 }).agentsThatFit, 6)
    assert.throws(() => plan({ name: 'p' }), invalid('pool', /has no limit to plan against/))
    assert.throws(() => plan({ name: 'p', requests_per_minute: 0 }), invalid('pool.requests_per_minute', /at least 1/))
    assert.throws(() => plan({ name: 'p', input_tokens_per_minute: 1000, requests_per_minute: Number.NaN }), invalid('pool.requests_per_minute', /finite number, got NaN/))
    assert.throws(() => plan({ name: 'p', input_tokens_per_minute: Number.POSITIVE_INFINITY }), invalid('pool.input_tokens_per_minute', /finite number, got Infinity/))
    // A fleet that uses no limited axis fits in any number.
    const any = planFleetWith((json) => nativeEngines.planFleet(json), { pool: { name: 'p', max_concurrent: 4 }, agents: [{ ...ag[0], call_ms: 0 }] })
    assert.equal(any.agentsThatFit, null)
    assert.equal(any.fits, true)
  })
})

describe("the provider crate's rules through the engine (issue 42)", () => {
  test('callerIdentity: Claude Code and Codex session headers, families under a name, bad input named', () => {
    const { driver } = setup()
    const e = driver.engine
    const claude = [
      ['x-claude-code-session-id', 's1'],
      ['x-claude-code-agent-id', 'a2'],
      ['x-claude-code-parent-agent-id', 'a1'],
    ]
    assert.deepEqual(e.callerIdentity(claude, null), { name: 's1/a2', parent: 's1/a1', root: 's1' })
    assert.deepEqual(e.callerIdentity(claude, 'alice'), { name: 'alice/a2', parent: 'alice/a1', root: 'alice' })
    assert.deepEqual(e.callerIdentity([['Session-Id', 'r'], ['x-openai-subagent', 'review']], null), { name: 'r/review', parent: 'r', root: 'r' })
    assert.deepEqual(e.callerIdentity([], 'bob'), { name: 'bob', parent: null, root: null })
    assert.equal(e.callerIdentity([['x-claude-code-session-id', '../etc']], null), null)
    assert.throws(() => e.callerIdentity([['a\nb', 'c']], null), (err) => err.code === 'invalid_argument' && err.field === 'headers')
    assert.throws(() => e.callerIdentity('x-claude-code-session-id: s1', null), (err) => err.code === 'invalid_argument' && err.field === 'headers')
    driver.close()
  })
})

describe("a lease ends when the core's answer says it settled it, not by the status (issue 42)", () => {
  test('an error answer the core settles ends the lease; a 200 leaves it to its settle', async () => {
    const { driver } = setup()
    const ask = async () => {
      const a = await driver.callLease(newCall(), { agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 })
      return { call: a.call, lease: await a.lease }
    }
    const first = await ask()
    const refused = await first.lease.respond(first.call, 400, [])
    assert.equal(refused.step.kind, 'deliver')
    assert.notEqual(refused.settled, null, 'the core settled it as nothing used')
    assert.equal(first.lease.done, true)
    const second = await ask()
    const ok = await second.lease.respond(second.call, 200, [])
    assert.equal(ok.settled, null)
    assert.equal(second.lease.done, false, 'still to be settled from its usage')
    second.lease.settle({ inputTokens: 100, outputTokens: 5 })
    assert.equal(second.lease.done, true)
    driver.close()
  })
})
