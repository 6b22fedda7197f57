// The engine under test reads the lease request and the usage by the field names of the
// generated convention (`abi.ts`, from the Rust crate tokenwarden-js-abi), on its object
// path as well as on the register file: a value only the object path takes (a bigint past
// 2^64, a role that does not exist) is refused naming that very field.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { LEASE_REQUEST_FIELDS, USAGE_FIELDS } from 'tokenwarden-driver'
import { createTokenwarden, engineName, engines } from '../support/engine.mjs'

const config = { pools: [{ name: 'p', input_tokens_per_minute: 100_000, output_tokens_per_minute: 100_000, requests_per_minute: 1_000 }] }
const TOO_BIG = 2n ** 64n

test(`every lease-request field is read by its name (${engineName})`, () => {
  const engine = engines.create(config, 1, 0)
  for (const field of LEASE_REQUEST_FIELDS) {
    const bad = field === 'role' ? 'admiral' : field === 'pool' || field === 'unblocks' ? 2 ** 40 : TOO_BIG
    assert.throws(
      () => engine.requestLease(0, { agent: 1, pool: 0, [field]: bad }),
      (e) => e.field === field && e.code === 'invalid_argument',
      `a bad \`${field}\` is refused naming it`,
    )
  }
  // And the good values of every field arrive: a planner unblocking 2 with a signature.
  const d = engine.requestLease(0, { agent: 7n, pool: 0, inputTokens: 10n, cachedPrefixTokens: 0, maxTokens: 5, role: 'planner', unblocks: 2, failureSignature: 3n })
  assert.equal(d.kind, 'grant')
  assert.equal(engine.metrics(0).agents[0].agent, 7)
})

test(`every usage field is read by its name (${engineName})`, () => {
  const engine = engines.create(config, 1, 0)
  const d = engine.requestLease(0, { agent: 1, pool: 0, inputTokens: 10, maxTokens: 5 })
  for (const field of USAGE_FIELDS) {
    assert.throws(
      () => engine.settle(1, d.lease, { [field]: TOO_BIG }),
      (e) => e.field === field && e.code === 'invalid_argument',
      `a bad \`${field}\` is refused naming it`,
    )
  }
  const s = engine.settle(1, d.lease, { inputTokens: 9n, cacheCreationInputTokens: 0, cacheReadInputTokens: 0, outputTokens: 4 })
  assert.deepEqual(s.used.slice(0, 2), [9, 4])
})

// The call lifecycle and handleResponse take the register file (the headers as one string)
// when every argument is an exact number; a bigint `now` sends the same call down the object
// path. Both must answer alike, call for call: grants, queueing, refusals, 429s with and
// without Retry-After, overloads, giving up, and a header report too wide for a `number`.
test(`the call lifecycle's register-file path answers as its object path (${engineName})`, () => {
  const tight = { pools: [{ name: 'p', input_tokens_per_minute: 10_000, output_tokens_per_minute: 5_000, requests_per_minute: 60 }], backoff: { max_attempts: 2 } }
  const fast = engines.create(tight, 7, 0)
  const slow = engines.create(tight, 7, 0)
  const both = (f) => {
    let a, b
    try {
      a = f(fast, (t) => t)
    } catch (e) {
      a = { threw: e.code, field: e.field }
    }
    try {
      b = f(slow, (t) => BigInt(t))
    } catch (e) {
      b = { threw: e.code, field: e.field }
    }
    assert.deepEqual(a, b)
    return a
  }
  const fresh = { failed: 0, refusals: 0, lastRetryAfterMs: null }
  const anthropic = [
    ['anthropic-ratelimit-input-tokens-limit', '10000'],
    ['anthropic-ratelimit-input-tokens-remaining', '8000'],
    ['anthropic-ratelimit-input-tokens-reset', '1970-01-01T00:01:00Z'],
    ['anthropic-ratelimit-requests-limit', '60'],
    ['anthropic-ratelimit-requests-remaining', '59'],
    ['request-id', 'req_1'],
  ]
  const ask = (t, req, call = fresh) => both((e, n) => e.callLease(n(t), call, { agent: 1, pool: 0, inputTokens: 2_000, maxTokens: 500, ...req }))
  const respond = (t, call, lease, status, headers) => both((e, n) => e.callResponse(n(t), call, 0, lease, status, headers, n(t)))

  const sent = ask(1_000, {})
  assert.equal(sent.step.kind, 'send')
  const ok = respond(1_100, sent.call, sent.step.lease, 200, anthropic)
  assert.equal(ok.step.kind, 'deliver')
  assert.equal(ok.settled, null)
  assert.equal(ok.report.inputTokens.limit, 10_000)
  both((e, n) => e.settle(n(1_200), sent.step.lease, { inputTokens: 2_000, outputTokens: 100 }))
  // Fill the minute, then a queued ticket and a refusal that waits.
  const leases = []
  for (let i = 0; i < 6; i++) leases.push(ask(1_300 + i, { agent: 2 + i }))
  assert.ok(leases.some((l) => l.step.kind === 'wait'), 'the minute fills: a call waits')
  const big = ask(1_400, { inputTokens: 20_000 })
  assert.equal(big.step.kind, 'give_up', 'bigger than the pool: never fits')
  assert.equal(big.step.refusal.kind, 'exceeds_capacity')
  // A 429 with Retry-After, an overload, then a second 429: giving up after max attempts.
  const first = leases.find((l) => l.step.kind === 'send')
  const limited = respond(2_000, first.call, first.step.lease, 429, [['retry-after', '7'], ['x-should-retry', 'true']])
  assert.equal(limited.step.kind, 'wait')
  assert.equal(limited.step.reason, 'rate_limited')
  assert.notEqual(limited.settled, null, 'a 429 is settled as nothing used')
  assert.equal(limited.report.retryAfterMs, 7_000)
  assert.equal(limited.report.shouldRetry, true)
  const overloaded = respond(2_050, fresh, null, 529, [['x-should-retry', 'true']])
  assert.equal(overloaded.step.kind, 'wait')
  assert.equal(overloaded.step.reason, 'overloaded')
  const again = respond(2_100, limited.call, null, 429, [])
  assert.equal(again.step.kind, 'give_up')
  assert.equal(again.step.lastRetryAfterMs, 7_000)
  // handleResponse on its own, with an axis named exceeded and an empty value.
  const report = both((e, n) => e.handleResponse(n(2_200), 0, null, 429, [['x-ratelimit-limit-requests', '60'], ['x-ratelimit-remaining-requests', '0'], ['x-empty', '']], n(2_200)))
  assert.equal(report.requests.remaining, 0)
  // A limit above 2^53 − 1 needs a bigint: the register file hands the result over whole.
  const wide = both((e, n) => e.handleResponse(n(2_300), 0, null, 200, [['anthropic-ratelimit-requests-limit', '90071992547409930']], n(2_300)))
  assert.equal(wide.requests.limit, 90071992547409930n)
  // A value holding a line feed cannot cross as the one string: the object path takes it.
  both((e, n) => e.handleResponse(n(2_400), 0, null, 200, [['retry-after', '1\n2']], n(2_400)))
  // Bad arguments are refused alike, naming the field.
  const bad = both((e, n) => e.callResponse(n(2_500), fresh, 0, null, 70_000, [], null))
  assert.equal(bad.threw, 'invalid_argument')
  assert.deepEqual(both((e) => JSON.parse(e.snapshot())), JSON.parse(fast.snapshot()))
})

// Each register-file call leaves the events waiting and `pollTimeout()` in the register
// file, so the wrapper answers `pollEvent()` (when nothing waits) and `pollTimeout()`
// without crossing again. One engine takes the register file (numbers), the other every
// call's object path (bigint times), which crosses for both: they must agree after every
// call, and a call on the object path must not leave the register file's stale answer.
test(`pollEvent and pollTimeout after a register-file call answer as the binding (${engineName})`, () => {
  const cfg = { pools: [{ name: 'p', input_tokens_per_minute: 6_000, output_tokens_per_minute: 6_000, requests_per_minute: 600, max_concurrent: 2 }], lease_ttl_ms: 5_000 }
  const fast = engines.create(cfg, 3, 0)
  const slow = engines.create(cfg, 3, 0)
  const plain = (v) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? Number(x) : x))))
  const drain = (e) => {
    const out = []
    for (let ev = e.pollEvent(); ev !== null; ev = e.pollEvent()) out.push(plain(ev))
    return out
  }
  let seen = 0
  const step = (f) => {
    const a = plain(f(fast, (t) => t))
    const b = plain(f(slow, (t) => BigInt(t)))
    assert.deepEqual(a, b)
    const ta = fast.pollTimeout()
    assert.equal(typeof ta === 'bigint' ? Number(ta) : ta, plain(slow.pollTimeout()))
    const [ea, eb] = [drain(fast), drain(slow)]
    assert.deepEqual(ea, eb)
    seen += ea.length
    return a
  }
  const ask = (t, agent, inputTokens = 1_000) => step((e, n) => e.requestLease(n(t), { agent, pool: 0, inputTokens, maxTokens: 500 }))
  const a = ask(10, 1)
  const b = ask(11, 2)
  const queued = ask(12, 3)
  assert.equal(a.kind, 'grant')
  assert.equal(queued.kind, 'queued', 'two slots: the third waits')
  // More than the pool allows in a window: never as asked, with no retry time on either path.
  const never = ask(13, 4, 200_000)
  assert.deepEqual(never, { kind: 'never_fits', reason: { kind: 'exceeds_capacity', axis: 'input_tokens' } })
  // The settle grants the ticket: a `granted` event waits in the register file's count.
  step((e, n) => e.settle(n(20), a.lease, { inputTokens: 900, outputTokens: 100 }))
  // A 429 pauses the pool (a `paused` event); the pause shows in pollTimeout.
  step((e, n) => e.handleResponse(n(30), 0, b.lease, 429, [['retry-after', '2']], n(30)))
  step((e, n) => e.cancel(n(40), b.lease))
  // Time passes: the ticket's lease expires unsettled (an `expired` event).
  step((e, n) => e.handleTimeout(n(6_000)))
  step((e, n) => e.handleTimeout(n(20_000)))
  assert.ok(seen >= 3, `events crossed: ${seen}`)
  // No lease is live; the next wake is the margin's climb back after the 429, a minute
  // away. Then a grant through the object path (a bigint time) on the register-file
  // engine: its expiry, sooner, must show, not the register file's earlier answer.
  assert.ok(fast.pollTimeout() > 50_000, `the margin's step: ${fast.pollTimeout()}`)
  const late = plain(fast.requestLease(20_001n, { agent: 4, pool: 0, inputTokens: 100, maxTokens: 10 }))
  assert.equal(late.kind, 'grant')
  const expires = fast.pollTimeout()
  assert.equal(typeof expires === 'bigint' ? Number(expires) : expires, late.expiresAt)
})

// The wasm engine reads and writes its register file and header text through views into
// wasm memory, which go stale when that memory grows (any coordinator of the module can
// grow it). Another coordinator growing it between and during this one's calls must not
// change an answer. (The native engine runs the same test.)
test(`answers hold while another coordinator grows the engine's memory (${engineName})`, () => {
  const roomy = { pools: [{ name: 'p', input_tokens_per_minute: 1e9, output_tokens_per_minute: 1e9, requests_per_minute: 1e9, max_concurrent: 1 }], max_queue_depth: 100_000, max_leases: 100_000, max_agents: 100_000 }
  const a = engines.create(config, 5, 0)
  const b = engines.create(roomy, 5, 0)
  const big = [['anthropic-ratelimit-input-tokens-limit', '100000'], ['x-filler', 'y'.repeat(5_000)]]
  let agent = 0
  for (let round = 1; round <= 8; round++) {
    // The other coordinator queues 4,000 tickets (about a megabyte of its state).
    for (let i = 0; i < 4_000; i++) b.requestLease(round, { agent: ++agent, pool: 0, inputTokens: 10, maxTokens: 1 })
    const d = a.requestLease(round * 1_000, { agent: round, pool: 0, inputTokens: 1_000 + round, maxTokens: 100 })
    assert.equal(d.kind, 'grant', `round ${round}`)
    const report = a.handleResponse(round * 1_000 + 1, 0, d.lease, 200, big, null)
    assert.equal(report.inputTokens.limit, 100_000)
    assert.equal(report.recognised, 1)
    const s = a.settle(round * 1_000 + 2, d.lease, { inputTokens: 1_000 + round, outputTokens: 50 })
    assert.deepEqual(s.used, [1_000 + round, 50, 1_050 + round, 1])
    assert.equal(a.pollEvent(), null)
  }
  assert.equal(b.metrics(9).pools[0].queueDepth, 8 * 4_000 - 1)
})

// A timeout past 2^53 − 1 cannot sit in the register file (-2 there): the wrapper asks the
// binding, which answers a bigint.
test(`pollTimeout past 2^53 - 1 after a register-file call is the binding's bigint (${engineName})`, () => {
  const e = engines.create({ ...config, lease_ttl_ms: 5_000 }, 9, 0)
  const late = 2n ** 53n
  const d = e.requestLease(late, { agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 })
  assert.equal(d.kind, 'grant')
  assert.equal(BigInt(d.expiresAt), late + 5_000n)
  // A register-file call (its `now` is behind and clamped): the timeout is still that lease's.
  const other = e.requestLease(7, { agent: 2, pool: 0, inputTokens: 100, maxTokens: 10 })
  assert.equal(other.kind, 'grant')
  assert.equal(e.pollTimeout(), late + 5_000n)
})

// After `free()` the wasm engine's views of the coordinator's memory are dropped, so a call
// asks the freed coordinator for a view first and throws before writing anything (that
// memory may be another coordinator's by then). This checks the throws and that other
// coordinators keep their state; whether a stray write would land somewhere visible
// depends on the allocator, so the guarantee itself is by construction (`registers.js`).
test(`a freed wasm engine's calls throw; other coordinators keep their state (${engineName})`, { skip: engineName !== 'wasm' }, () => {
  const keep = engines.create(config, 1, 0)
  keep.requestLease(1, { agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 })
  const before = keep.snapshot()
  for (let i = 0; i < 20; i++) {
    const gone = engines.create(config, 2, 0)
    gone.free()
    assert.throws(() => gone.requestLease(2, { agent: 3, pool: 0, inputTokens: 100, maxTokens: 10 }))
    assert.throws(() => gone.handleResponse(3, 0, null, 200, [['retry-after', '1']], null))
    assert.throws(() => gone.pollEvent())
    // Coordinators made after it may reuse its memory; they are unaffected.
    const next = engines.create(config, 3, 0)
    assert.equal(next.requestLease(4, { agent: 4, pool: 0, inputTokens: 100, maxTokens: 10 }).kind, 'grant')
  }
  assert.equal(keep.snapshot(), before)
})

// Issue 25 item 14: inputs the engines accepted silently or unsafely.
test(`a non-finite number anywhere in the config is refused naming its path (${engineName})`, () => {
  const cases = [
    [{ pools: [{ name: 'p', input_tokens_per_minute: NaN }] }, 'pools[0].input_tokens_per_minute', 'NaN'],
    [{ pools: [{ name: 'p', requests_per_minute: 10 }, { name: 'q', output_tokens_per_minute: Infinity }] }, 'pools[1].output_tokens_per_minute', 'Infinity'],
    [{ pools: [{ name: 'p' }], margin: { floor_permille: -Infinity } }, 'margin.floor_permille', '-Infinity'],
    [{ pools: [{ name: 'p' }], lease_ttl_ms: NaN }, 'lease_ttl_ms', 'NaN'],
  ]
  for (const [cfg, field, got] of cases) {
    assert.throws(
      () => engines.create(cfg, 1, 0),
      (e) => e.code === 'invalid_config' && e.field === field && e.message.includes(`${field} must be a finite number, got ${got}`),
      field,
    )
    assert.throws(() => createTokenwarden({ config: cfg }), (e) => e.code === 'invalid_config' && e.field === field)
  }
  // A NaN limit used to become "unknown" and grant anything: 5M + 5M tokens.
  assert.throws(() => engines.create({ pools: [{ name: 'p', input_tokens_per_minute: NaN, output_tokens_per_minute: 80_000 }] }, 1, 0))
})

test(`an unknown key in a usage or a lease request is refused naming it (${engineName})`, () => {
  const engine = engines.create(config, 1, 0)
  const d = engine.requestLease(0, { agent: 1, pool: 0, inputTokens: 1000, maxTokens: 100 })
  const before = engine.snapshot()
  // The provider's own snake_case usage used to be recorded as 0 used.
  assert.throws(
    () => engine.settle(1, d.lease, { input_tokens: 900, output_tokens: 40 }),
    (e) => e.code === 'invalid_argument' && e.field === 'input_tokens' && /did you mean `inputTokens`/.test(e.message),
  )
  assert.throws(() => engine.settle(1, d.lease, { inputTokens: 900, outputTokenz: 4 }), (e) => e.code === 'invalid_argument' && e.field === 'outputTokenz')
  assert.throws(() => engine.handle(1, { op: 'call_interrupted', lease: d.lease, seen: { output_tokens: 4 } }), (e) => e.field === 'output_tokens')
  // …and `acquire({ input_tokens })` reserved 0.
  assert.throws(
    () => engine.requestLease(1, { agent: 2, pool: 0, input_tokens: 5_000_000 }),
    (e) => e.code === 'invalid_argument' && e.field === 'input_tokens' && /did you mean `inputTokens`/.test(e.message),
  )
  assert.throws(() => engine.callLease(1, { failed: 0, refusals: 0, lastRetryAfterMs: null }, { agent: 2, pool: 0, max_tokens: 9 }), (e) => e.field === 'max_tokens')
  assert.throws(() => engine.handle(1, { op: 'open_task', task: { task: 1, un_blocks: 2 } }), (e) => e.field === 'un_blocks')
  assert.equal(engine.snapshot(), before, 'nothing changed')
  assert.deepEqual(engine.settle(1, d.lease, { inputTokens: 900, outputTokens: 40 }).used, [900, 40, 940, 1])
})

test(`a snapshot with a bucket level above its limit is refused (${engineName})`, () => {
  const engine = engines.create(config, 1, 0)
  engine.requestLease(0, { agent: 1, pool: 0, inputTokens: 1000, maxTokens: 100 })
  const snap = JSON.parse(engine.snapshot())
  const bucket = snap.state.pools[0].buckets[0]
  // The provider's remaining figure may raise a level above the capacity (its burst), up to the limit.
  bucket.level = bucket.limit * 60_000 + 1
  assert.throws(() => engines.restore(JSON.stringify(snap)), (e) => e.code === 'snapshot_corrupt' && /level above its limit/.test(e.message))
  bucket.level = bucket.limit * 60_000
  assert.ok(engines.restore(JSON.stringify(snap)))
})

test(`restore of something that is not JSON text is a clear TypeError (${engineName})`, () => {
  const engine = engines.create(config, 1, 0)
  for (const bad of [JSON.parse(engine.snapshot()), 42, null, undefined, [1]]) {
    assert.throws(() => engines.restore(bad), (e) => e instanceof TypeError && e.code === 'invalid_argument', String(bad))
  }
})

test(`every call on a freed wasm engine throws \`closed\` (${engineName})`, { skip: engineName !== 'wasm' }, () => {
  const gone = engines.create(config, 1, 0)
  const d = gone.requestLease(0, { agent: 1, pool: 0, inputTokens: 10, maxTokens: 10 })
  gone.free()
  gone.free()
  const calls = {
    poolId: () => gone.poolId('p'),
    requestLease: () => gone.requestLease(1, { agent: 1, pool: 0, inputTokens: 10, maxTokens: 10 }),
    settle: () => gone.settle(1, d.lease, { inputTokens: 1 }),
    cancel: () => gone.cancel(1, d.lease),
    handleResponse: () => gone.handleResponse(1, 0, null, 200, [], null),
    handleTimeout: () => gone.handleTimeout(1),
    pollTimeout: () => gone.pollTimeout(),
    pollEvent: () => gone.pollEvent(),
    handle: () => gone.handle(1, { op: 'timeout' }),
    callLease: () => gone.callLease(1, { failed: 0, refusals: 0, lastRetryAfterMs: null }, { agent: 1, pool: 0 }),
    metrics: () => gone.metrics(1),
    snapshot: () => gone.snapshot(),
    check: () => gone.check(),
  }
  for (const [name, call] of Object.entries(calls)) {
    assert.throws(call, (e) => e.code === 'closed' && /this engine was freed/.test(e.message) && !/null pointer/.test(e.message), name)
  }
})

test(`the addon's own class refuses unknown keys too (${engineName})`, { skip: engineName !== 'native' }, async () => {
  const { createRequire } = await import('node:module')
  const { Coordinator } = createRequire(import.meta.url)('tokenwarden/binding')
  const c = new Coordinator(JSON.stringify(config), 1, 0)
  const handle = (now, input) => {
    const out = c.handle(now, JSON.stringify(input))
    return typeof out === 'string' ? JSON.parse(out) : out
  }
  const d = handle(0, { op: 'request_lease', request: { agent: 1, pool: 0, inputTokens: 10 } })
  assert.equal(d.output, 'granted')
  const before = c.snapshot()
  assert.throws(() => handle(1, { op: 'settle', lease: d.lease, usage: { input_tokens: 5 } }), (e) => e.code === 'invalid_argument' && e.field === 'input_tokens' && /did you mean `inputTokens`/.test(e.message))
  assert.throws(() => handle(1, { op: 'request_lease', request: { agent: 1, pool: 0, max_tokens: 5 } }), (e) => e.field === 'max_tokens')
  assert.throws(() => handle(1, { op: 'call_lease', call: {}, request: { agent: 1, pool: 0, cached: 1 } }), (e) => e.field === 'cached' && /unknown field `cached`/.test(e.message))
  assert.throws(() => handle(1, { op: 'call_interrupted', lease: d.lease, seen: { output_tokens: 1 } }), (e) => e.field === 'output_tokens')
  assert.throws(() => handle(1, { op: 'fly' }), (e) => e instanceof RangeError && e.code === 'invalid_argument' && /unknown variant `fly`/.test(e.message))
  assert.throws(() => c.handle(1, 'not json'), (e) => e instanceof TypeError && /not JSON/.test(e.message))
  assert.equal(c.snapshot(), before)
})
