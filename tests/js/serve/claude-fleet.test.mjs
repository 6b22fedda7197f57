// A short run of the Claude-Code-like fleet measure (claude-fleet.mjs; the full figures are
// in BENCHMARKS.md, "Claude-Code-like fleet through serve"): 12 agents replaying the corpus's
// claude-code sequences through `tokenwarden serve` against the mock provider in bpe mode,
// the input limit at half the fleet's demand and 80,000 output tokens a minute — where
// Claude Code's max_tokens 128000 was refused before the output reservation was learned.
// The input limit is 100,000 a minute, not the measure's half of the demand: there each
// agent's first call reserves the shared cached prefix again (BENCHMARKS.md says why) and
// the first calls take minutes; here they take under a minute.
// Needs workerd (WORKERD, else the testing package's own): nothing here is skipped.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { DEFAULTS, fleetAgents, fleetDemand, runOnce } from './claude-fleet.mjs'

test('12 Claude-Code-like agents through serve on an 80k output key: no 429 at the provider, every call served', { timeout: 200_000 }, async () => {
  const o = { ...DEFAULTS, agents: 12, turns: 2, duration: 90, grace: 60, itpm: 100_000 }
  const agents = fleetAgents(o)
  const demand = await fleetDemand(o, agents)
  const r = await runOnce(o, 'serve', agents)
  const a = r.agents
  const p = r.provider
  const failed = JSON.stringify(a.failed.slice(0, 3))
  assert.equal(a.refused400, 0, `no call refused with 400 on the 80k output key: ${failed}`)
  assert.equal(p.provider429, 0, `no 429 at the provider (${JSON.stringify(p.provider429ByLimit)})`)
  assert.equal(a.seen429, 0, 'no 429 reached an agent')
  assert.equal(a.failed.length, 0, `every call served: ${failed}`)
  assert.equal(a.cutAtEnd, 0, 'no call still unanswered when the run ended')
  assert.equal(a.served, a.calls)
  assert.equal(a.calls, 12 * 2, `every agent played its turns (${a.turnsPerAgent})`)
  assert.equal(p.provider200, a.calls, 'the provider answered each call once, with 200')
  assert.equal(r.mockStats.overLimit, false, 'the provider never let more through than its limits')
  console.log(`# claude fleet: ITPM ${o.itpm} (the fleet's demand ${demand.perMinute}/min), ${a.calls} calls in ${a.wallS.toFixed(0)} s, concurrency peak ${p.peakConcurrency}, serve queue wait p95 ${r.serve.queueWaitP95Ms} ms`)
})
