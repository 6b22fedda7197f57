#!/usr/bin/env node
// A measurement, not a demo (issue 29): is the fleet fair by what binds, and does it use the
// whole limit? 36 agents on the official Anthropic SDK share one key through `tw.fetch()`
// against the mock provider: 12 planners, 12 reviewers and 12 workers (weights 3 : 2 : 1),
// each in a closed loop (think 0.5-2 s, then its next call), so every role wants more than
// its share. Every fourth call of each agent is big (10-20k input tokens, max_tokens 2000),
// the others 500-2,000 tokens with max_tokens 300; replies are 40 % of max_tokens; half are
// streamed. The key: 120,000 input / 12,000 output tokens a minute, 90 requests a minute, 10
// at once (input binds: a mean call is ~4.7k input and ~290 output tokens).
//
// Time runs `--speed` times faster than the wall clock for both the mock's buckets and
// tokenwarden's clock (default 10: 30 provider minutes in 3 wall minutes).
//
//   node shares.mjs                        # 36 agents, 30 minutes at 10x
//   node shares.mjs --agents 45 --minutes 20 --json out.json
//
// Prints the binding axis's use per provider minute (the provider's counts at the instant
// each call was sent), the margin's moves, per role: its share of the binding axis against
// its weight's share and Jain's index over its agents' use of it; 429s at the agents and at
// the provider; the agents without a completed call in the first 3 minutes. Exit code 1 if a
// 429 or an error reached an agent or the provider saw traffic over a limit; the figures are
// for the reader (BENCHMARKS.md), not asserted.

import { writeFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { createTokenwarden } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { MIXED_LIMITS, fastClock, loopAgent, mixedKey, rng } from './fleet.mjs'

const { values: args } = parseArgs({
  options: {
    agents: { type: 'string', default: '36' },
    minutes: { type: 'string', default: '30' },
    speed: { type: 'string', default: '10' },
    seed: { type: 'string', default: '1' },
    quantum: { type: 'string' },
    steady: { type: 'string', default: '15' },
    json: { type: 'string' },
  },
})
const AGENTS = Number(args.agents)
const MINUTES = Number(args.minutes)
const SPEED = Number(args.speed)
const SEED = Number(args.seed)
const STEADY_FROM = Number(args.steady)
for (const [name, v] of [['agents', AGENTS], ['minutes', MINUTES], ['speed', SPEED]]) {
  if (!(v > 0)) throw new Error(`--${name} must be a positive number`)
}
if (!(STEADY_FROM >= 1 && STEADY_FROM < MINUTES)) throw new Error('--steady must be a minute within the run')

const LIMITS = MIXED_LIMITS
const ROLES = ['planner', 'reviewer', 'worker']
const WEIGHTS = { planner: 3, reviewer: 2, worker: 1 }
const MINUTE = 60_000

const { now, clock, sleep } = fastClock(SPEED)
const { provider, tw } = await mixedKey({ now, clock, seed: SEED, quantumPermille: args.quantum === undefined ? undefined : Number(args.quantum), startMockProvider, createTokenwarden })
const margins = []
tw.on('margin_changed', (e) => margins.push({ at: now(), from: e.fromPermille, to: e.toPermille, reason: e.reason }))

const random = rng(SEED)
const records = []
let stopping = false

const failures = { rateLimited: 0, errors: 0 }

function agent(i) {
  const role = ROLES[i % 3]
  return loopAgent({ i, role, name: `${role}-${Math.floor(i / 3)}`, tw, provider, now, sleep, random, reply: (maxTokens) => Math.round(maxTokens * 0.4), records, failures, running: () => !stopping })
}

const runs = Array.from({ length: AGENTS }, (_, i) => agent(i))
await sleep(MINUTES * MINUTE)
stopping = true
const metrics = tw.metrics()
await Promise.race([Promise.all(runs), sleep(10 * MINUTE)])

// The binding axis per provider minute: what the provider counted, at the instant each call
// was sent (Anthropic counts input on arrival).
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
const mean = (v) => (v.length ? v.reduce((a, b) => a + b, 0) / v.length : 0)
const steady = use.slice(STEADY_FROM)
const binding = ['input', 'output', 'requests'].reduce((a, b) => (mean(steady.map((u) => u[b])) > mean(steady.map((u) => u[a])) ? b : a))
const steadyUse = mean(steady.map((u) => u[binding]))

// Per role, over the steady minutes: share of the binding axis against the weight's share,
// and Jain's index over its agents.
const inSteady = records.filter((r) => r.sent >= STEADY_FROM * MINUTE && r.sent < MINUTES * MINUTE)
const byAgent = new Array(AGENTS).fill(0)
for (const r of inSteady) byAgent[r.agent] += r[binding]
const total = byAgent.reduce((a, b) => a + b, 0)
const weightSum = ROLES.reduce((s, role) => s + WEIGHTS[role] * Math.ceil((AGENTS - ROLES.indexOf(role)) / 3), 0)
const jain = (x) => {
  const s = x.reduce((a, b) => a + b, 0)
  return x.length ? (s * s) / (x.length * x.reduce((a, b) => a + b * b, 0)) : 1
}
const roles = ROLES.map((role) => {
  const mine = byAgent.filter((_, i) => ROLES[i % 3] === role)
  const share = mine.reduce((a, b) => a + b, 0) / total
  const want = (WEIGHTS[role] * mine.length) / weightSum
  return { role, agents: mine.length, share, want, off: share / want - 1, jain: jain(mine) }
})
const firstDone = new Array(AGENTS).fill(Infinity)
for (const r of records) firstDone[r.agent] = Math.min(firstDone[r.agent], r.done)
const late = firstDone.map((t, i) => [i, t]).filter(([, t]) => t > 3 * MINUTE)
const stats = provider.stats()

const pct = (x) => `${(x * 100).toFixed(1)} %`
console.log(`${AGENTS} agents (${ROLES.map((r) => `${roles.find((x) => x.role === r).agents} ${r}s`).join(', ')}), ${MINUTES} provider minutes at ${SPEED}x, seed ${SEED}; ${records.length} calls`)
console.log(`binding axis: ${binding}; use per minute: ${use.map((u) => Math.round(u[binding] * 100)).join(' ')} %`)
console.log(`steady state (minutes ${STEADY_FROM}-${MINUTES}): ${pct(steadyUse)} of the ${binding} limit`)
console.log(`margin: ${margins.map((m) => `${(m.at / MINUTE).toFixed(1)} min ${m.to / 10} % (${m.reason})`).join(', ') || 'never moved'}; at the end ${metrics.pools[0].marginPermille / 10} %, underestimate p50 ${metrics.pools[0].underestimateP50Permille / 10} %`)
console.log('| role | agents | share of the binding axis | weight share | off by | Jain within the role |')
console.log('|---|---:|---:|---:|---:|---:|')
for (const r of roles) console.log(`| ${r.role} | ${r.agents} | ${pct(r.share)} | ${pct(r.want)} | ${(r.off * 100).toFixed(1)} % | ${r.jain.toFixed(3)} |`)
console.log(`agents without a completed call in the first 3 minutes: ${late.length}${late.length ? ` (${late.map(([i, t]) => `${i}: ${Number.isFinite(t) ? (t / MINUTE).toFixed(1) + ' min' : 'never'}`).join(', ')})` : ''}`)
console.log(`429s at the agents: ${failures.rateLimited}; other errors at the agents: ${failures.errors}; 429s at the provider: ${stats.rejected429}; provider over a limit: ${stats.overLimit}`)
if (args.json) writeFileSync(args.json, JSON.stringify({ agents: AGENTS, minutes: MINUTES, speed: SPEED, seed: SEED, binding, use, steadyUse, margins, roles, late, records: records.length, rateLimitedAtAgents: failures.rateLimited, agentErrors: failures.errors, provider429: stats.rejected429, overLimit: stats.overLimit }, null, 1))

tw.close()
await provider.close()
process.exit(failures.rateLimited + failures.errors > 0 || stats.overLimit ? 1 : 0)
