// The wait lines `tokenwarden serve` prints (edge/src/waitlog.js), on a stand-in engine:
// what each line says, and when the summary comes. (tests/js/serve/waitlog.test.mjs checks
// them through a real serve.)
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { WaitLog, ceilingOf, printable } from '../src/waitlog.js'

function setup(metrics) {
  const handlers = {}
  const tw = { on: (name, f) => (handlers[name] = f), metrics: () => metrics }
  const lines = []
  let now = 1_000_000
  new WaitLog(
    tw,
    (id) => (id === 7 ? 'bob' : id === 9 ? 'eve\ntokenwarden: operator says \u001b[2Jall clear' : `agent ${id}`),
    (l) => lines.push(l),
    () => now,
  )
  return { handlers, lines, advance: (ms) => (now += ms) }
}

const pool = { name: 'sonnet', axes: [{ axis: 'input_tokens', limit: 100, capacity: 85, available: 2 }], bindingAxis: null, queueDepth: 3, inFlight: 1, maxConcurrent: null, marginPermille: 850 }

test('a 429 wait names the limit the provider named or showed spent; a short wait says nothing', () => {
  const { handlers, lines } = setup({ pools: [pool], agents: [{ agent: 7, activity: { state: 'rate_limited', until: 0, axis: 'output_tokens' } }] })
  handlers.waiting({ agent: 7, pool: 0, delayMs: 2_000, message: 'short' })
  assert.deepEqual(lines, [])
  handlers.waiting({ agent: 7, pool: 0, delayMs: 5_000, message: 'waiting on rate limit, retrying in 5.0 s (attempt 1)' })
  assert.deepEqual(lines, ['tokenwarden: bob on sonnet (ceiling: output tokens/min): waiting on rate limit, retrying in 5.0 s (attempt 1)'])
})

test('a queued wait gives the expected wait and the bound; its end is a line; a minute later a summary', () => {
  const { handlers, lines, advance } = setup({ pools: [pool], agents: [{ agent: 7, activity: { state: 'queued', since: 0, expectedGrant: 1_008_000 } }] })
  handlers.queued({ lease: 1, agent: 7, pool: 0, eta: 1_040_000, etaMs: 40_000 })
  assert.equal(lines[0], 'tokenwarden: bob waits for quota on sonnet (ceiling: input tokens/min), expected 8.0 s, at most 40 s, 3 in line')
  advance(9_000)
  handlers.granted({ lease: 1, agent: 7, pool: 0, waitedMs: 9_000 })
  assert.equal(lines[1], 'tokenwarden: bob served after 9.0 s in line')
  handlers.rate_limited({})
  advance(52_000)
  handlers.granted({ lease: 2, agent: 8, pool: 0, waitedMs: 0 })
  assert.match(
    lines[2],
    /^tokenwarden: last 61 s: 2 calls granted, 1 waited over 3 s \(longest 9\.0 s\), 1 answered 429 by the provider, 0 refused — sonnet: margin 85 %, 3 in line, 1 in flight, held by input tokens\/min$/,
  )
  assert.equal(lines.length, 3)
})

test('the ceiling of a pool: concurrency when every slot is taken, else the binding axis, else the least room', () => {
  assert.equal(ceilingOf({ ...pool, maxConcurrent: 2, inFlight: 2 }), 'concurrency (2/2 in flight)')
  assert.equal(ceilingOf({ ...pool, bindingAxis: 'requests' }), 'requests/min')
  assert.equal(ceilingOf(pool), 'input tokens/min')
  assert.equal(ceilingOf(undefined), 'unknown')
})

test('a name with a line feed or an escape forges no line: it is shown escaped (issue 43, N9)', () => {
  const { handlers, lines } = setup({ pools: [pool], agents: [] })
  handlers.queued({ lease: 1, agent: 9, pool: 0, eta: 1_040_000, etaMs: 40_000 })
  assert.equal(lines.length, 1)
  assert.ok(!lines[0].includes('\n') && !lines[0].includes('\u001b'), lines[0])
  assert.match(lines[0], /^tokenwarden: eve\\u000atokenwarden: operator says \\u001b\[2Jall clear waits for quota/)
  assert.equal(printable('a\u2028b\u0085c\u007f'), 'a\\u2028b\\u0085c\\u007f')
  assert.equal(printable('plain name/sub-1'), 'plain name/sub-1')
})
