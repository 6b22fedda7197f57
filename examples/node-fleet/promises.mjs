#!/usr/bin/env node
// A measurement, not a demo (issue 41): are the core's promises kept when calls use other
// than they reserved, are the expected waits right, are small calls served quickly, is the
// limit used? `--agents` agents (default 45: planners, reviewers and workers, weights
// 3 : 2 : 1) on the official Anthropic SDK share one key through `tw.fetch()` against the
// mock provider, each in a closed loop (think 0.5-2 s, then its next call), so the fleet
// wants more than the key gives. Every fourth call of an agent is big (10-20k input tokens,
// max_tokens 2000), the others small (500-2,000 tokens, max_tokens 300); each reply's output
// is drawn uniformly from 30-100 % of its max_tokens, so calls use more and less than the
// core reserves (a learned percentile of output); half are streamed. The key:
// `MIXED_LIMITS` (120,000 input / 12,000 output tokens a minute, 90 requests, 10 at once).
//
// Time runs `--speed` times faster than the wall clock for both the mock's buckets and
// tokenwarden's clock (default 10: 30 provider minutes in 3 wall minutes).
//
//   node promises.mjs                          # 45 agents, 30 minutes at 10x
//   node promises.mjs --agents 30 --json out.json
//
// Prints: grants after the promise in force (the queued `eta`, or the latest `revised`
// one; "late" beyond `--slack-ms`, default 100 provider ms = 10 wall ms of timer delay at
// 10x, and the worst), revisions; the expected wait (`expectedMs` of the queued event)
// against the actual, median |error| for waits under 30 s and at 30 s or more (waits of at
// least 1 s); long waits (>= 30 s) not flagged to checkpoint; small and big calls' waits from
// the ask to the send, p50 / p95; the binding axis's use at steady state; per role its share
// of the binding axis against its weight's, and Jain's index within the role over 15-minute
// windows; 429s. Every figure is for the reader (BENCHMARKS.md), not asserted; exit code 1
// if an error or a 429 reached an agent.
//
// A driver older than the `revised` event and `expectedMs` runs it too (those figures are
// then "n/a"): the small-call waits of an older commit's packages, measured the same way.

import { writeFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { createTokenwarden } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { MIXED_LIMITS, fastClock, loopAgent, mixedKey, rng } from './fleet.mjs'

const { values: args } = parseArgs({
  options: {
    agents: { type: 'string', default: '45' },
    minutes: { type: 'string', default: '30' },
    speed: { type: 'string', default: '10' },
    seed: { type: 'string', default: '1' },
    steady: { type: 'string', default: '5' },
    window: { type: 'string', default: '15' },
    'slack-ms': { type: 'string', default: '100' },
    json: { type: 'string' },
  },
})
const AGENTS = Number(args.agents)
const MINUTES = Number(args.minutes)
const SPEED = Number(args.speed)
const SEED = Number(args.seed)
const STEADY_FROM = Number(args.steady)
const WINDOW = Number(args.window)
const SLACK_MS = Number(args['slack-ms'])
for (const [name, v] of [['agents', AGENTS], ['minutes', MINUTES], ['speed', SPEED], ['window', WINDOW]]) {
  if (!(v > 0)) throw new Error(`--${name} must be a positive number`)
}
if (!(STEADY_FROM >= 0 && STEADY_FROM < MINUTES)) throw new Error('--steady must be a minute within the run')
if (!(SLACK_MS >= 0)) throw new Error('--slack-ms must be a number of milliseconds')

const LIMITS = MIXED_LIMITS
const ROLES = ['planner', 'reviewer', 'worker']
const WEIGHTS = { planner: 3, reviewer: 2, worker: 1 }
const MINUTE = 60_000

const { now, clock, sleep } = fastClock(SPEED)
const { provider, tw } = await mixedKey({ now, clock, seed: SEED, startMockProvider, createTokenwarden })

// Promises: each queued ticket's promise in force (its eta, then each revision), its
// expected wait, whether it was flagged to checkpoint; at its grant, against the grant.
const tickets = new Map()
const grants = []
let revisions = 0
let revisedEvents = false
tw.on('queued', (e) => tickets.set(e.lease, { at: now(), promise: Number(e.eta), expectedMs: e.expectedMs ?? null, checkpoint: e.checkpoint ?? null, revised: 0 }))
tw.on('revised', (e) => {
  revisedEvents = true
  revisions++
  const t = tickets.get(e.lease)
  if (t !== undefined) {
    t.promise = Number(e.eta)
    t.revised++
  }
})
tw.on('granted', (e) => {
  const t = tickets.get(e.lease)
  if (t === undefined) return
  tickets.delete(e.lease)
  grants.push({ ...t, grantedAt: now(), waited: Number(e.waitedMs) })
})

const random = rng(SEED)
const records = []
let stopping = false

const failures = { rateLimited: 0, errors: 0 }

function agent(i) {
  const role = ROLES[i % 3]
  return loopAgent({ i, role, name: `${role}-${Math.floor(i / 3)}`, tw, provider, now, sleep, random, reply: (maxTokens) => Math.round(maxTokens * (0.3 + 0.7 * random.next())), records, failures, running: () => !stopping })
}

const runs = Array.from({ length: AGENTS }, (_, i) => agent(i))
await sleep(MINUTES * MINUTE)
stopping = true
const metrics = tw.metrics()
await Promise.race([Promise.all(runs), sleep(15 * MINUTE)])

const mean = (v) => (v.length ? v.reduce((a, b) => a + b, 0) / v.length : 0)
const quantile = (v, q) => {
  if (v.length === 0) return null
  const s = [...v].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]
}
const jain = (x) => {
  const s = x.reduce((a, b) => a + b, 0)
  return x.length && s > 0 ? (s * s) / (x.length * x.reduce((a, b) => a + b * b, 0)) : 1
}

// Promises.
const lateness = grants.map((g) => g.grantedAt - g.promise)
const late = lateness.filter((d) => d > SLACK_MS)
const revisedTickets = grants.filter((g) => g.revised > 0).length

// Expected against actual, for waits of at least 1 s.
const errors = (lo, hi) =>
  grants
    .filter((g) => g.expectedMs !== null && g.waited >= Math.max(1_000, lo) && g.waited < hi)
    .map((g) => Math.abs(g.expectedMs - g.waited) / g.waited)
const short = errors(0, 30_000)
const long = errors(30_000, Infinity)
const unflagged = grants.filter((g) => g.checkpoint === false && g.waited >= 30_000).length
const longWaits = grants.filter((g) => g.waited >= 30_000).length

// Waits from the ask to the send, by size.
const waitsOf = (big) => records.filter((r) => r.big === big && r.sent >= STEADY_FROM * MINUTE).map((r) => r.sent - r.started)
const small = waitsOf(false)
const bigs = waitsOf(true)

// The binding axis per provider minute: what the provider counted at the instant each call
// was sent (input) and as it was produced (output, counted at the send here).
const perMinute = Array.from({ length: MINUTES }, () => ({ input: 0, output: 0, requests: 0 }))
for (const r of records) {
  const m = Math.floor(r.sent / MINUTE)
  if (m < MINUTES) {
    perMinute[m].input += r.input
    perMinute[m].output += r.output
    perMinute[m].requests += 1
  }
}
const use = perMinute.map((m) => ({ input: m.input / LIMITS.input, output: m.output / LIMITS.output, requests: m.requests / LIMITS.requests }))
const steady = use.slice(STEADY_FROM)
const binding = ['input', 'output', 'requests'].reduce((a, b) => (mean(steady.map((u) => u[b])) > mean(steady.map((u) => u[a])) ? b : a))
const steadyUse = mean(steady.map((u) => u[binding]))

// Per role: its share of the binding axis against its weight's, over the steady minutes;
// Jain's index within the role over each window of WINDOW minutes (the worst).
const inRange = (lo, hi) => records.filter((r) => r.sent >= lo * MINUTE && r.sent < hi * MINUTE)
const perAgent = (rs) => {
  const out = new Array(AGENTS).fill(0)
  for (const r of rs) out[r.agent] += r[binding]
  return out
}
const steadyUseByAgent = perAgent(inRange(STEADY_FROM, MINUTES))
const total = steadyUseByAgent.reduce((a, b) => a + b, 0)
const count = (role) => steadyUseByAgent.filter((_, i) => ROLES[i % 3] === role).length
const weightSum = ROLES.reduce((s, role) => s + WEIGHTS[role] * count(role), 0)
const windows = []
for (let from = STEADY_FROM; from + WINDOW <= MINUTES; from += WINDOW) windows.push([from, from + WINDOW])
if (windows.length === 0) windows.push([STEADY_FROM, MINUTES])
const roles = ROLES.map((role) => {
  const mine = (v) => v.filter((_, i) => ROLES[i % 3] === role)
  const share = mine(steadyUseByAgent).reduce((a, b) => a + b, 0) / total
  const want = (WEIGHTS[role] * count(role)) / weightSum
  const jains = windows.map(([lo, hi]) => jain(mine(perAgent(inRange(lo, hi)))))
  return { role, agents: count(role), share, want, off: share / want - 1, jain: Math.min(...jains), jains }
})
const stats = provider.stats()

const pct = (x) => (x === null || Number.isNaN(x) ? 'n/a' : `${(x * 100).toFixed(1)} %`)
const secs = (ms) => (ms === null ? 'n/a' : `${(ms / 1000).toFixed(1)} s`)
const median = (v) => quantile(v, 0.5)
console.log(`${AGENTS} agents, ${MINUTES} provider minutes at ${SPEED}x, seed ${SEED}; ${records.length} calls, ${grants.length} granted from the queue`)
console.log(
  `promises: ${late.length} granted more than ${SLACK_MS} ms after the promise in force (worst ${secs(Math.max(0, ...lateness))} after it); ${revisedEvents ? `${revisions} revisions, ${revisedTickets} tickets revised` : 'no revised events (an older driver)'}`,
)
console.log(
  `expected vs actual wait: under 30 s median |error| ${pct(median(short))} over ${short.length}; 30 s or more ${pct(median(long))} over ${long.length}; long waits not flagged to checkpoint: ${unflagged} of ${longWaits}`,
)
console.log(`waits from the ask to the send (minutes ${STEADY_FROM}-${MINUTES}): small calls p50 ${secs(median(small))}, p95 ${secs(quantile(small, 0.95))} (${small.length}); big calls p50 ${secs(median(bigs))}, p95 ${secs(quantile(bigs, 0.95))} (${bigs.length})`)
console.log(`binding axis: ${binding}; use per minute: ${use.map((u) => Math.round(u[binding] * 100)).join(' ')} %; steady state (minutes ${STEADY_FROM}-${MINUTES}) ${pct(steadyUse)}`)
console.log(`margin at the end ${metrics.pools[0].marginPermille / 10} %`)
console.log(`| role | agents | share of the binding axis | weight share | off by | Jain within the role (worst ${WINDOW}-min window) |`)
console.log('|---|---:|---:|---:|---:|---:|')
for (const r of roles) console.log(`| ${r.role} | ${r.agents} | ${pct(r.share)} | ${pct(r.want)} | ${(r.off * 100).toFixed(1)} % | ${r.jain.toFixed(3)} |`)
console.log(`429s at the agents: ${failures.rateLimited}; other errors at the agents: ${failures.errors}; 429s at the provider: ${stats.rejected429}; provider over a limit: ${stats.overLimit}`)
if (args.json) {
  writeFileSync(
    args.json,
    JSON.stringify(
      {
        agents: AGENTS,
        minutes: MINUTES,
        speed: SPEED,
        seed: SEED,
        calls: records.length,
        fromQueue: grants.length,
        late: late.length,
        worstLateMs: Math.max(0, ...lateness),
        revisions: revisedEvents ? revisions : null,
        expected: { short: median(short), shortN: short.length, long: median(long), longN: long.length, unflagged, longWaits },
        small: { p50: median(small), p95: quantile(small, 0.95), n: small.length },
        big: { p50: median(bigs), p95: quantile(bigs, 0.95), n: bigs.length },
        binding,
        use,
        steadyUse,
        roles,
        rateLimitedAtAgents: failures.rateLimited,
        agentErrors: failures.errors,
        provider429: stats.rejected429,
        overLimit: stats.overLimit,
      },
      null,
      1,
    ),
  )
}

tw.close()
await provider.close()
process.exit(failures.rateLimited + failures.errors > 0 ? 1 : 0)
