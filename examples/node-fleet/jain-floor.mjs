#!/usr/bin/env node
// What Jain's index within a role over a 15-minute window can be, at best, in the fleet
// `promises.mjs` measures: a bound on the figure, not a measurement of tokenwarden. No
// tokenwarden code runs here: an ideal fair queue with perfect knowledge serves `--agents`
// agents of one weight in closed loops (every fourth call big: max_tokens 2,000, else 300;
// each call's output drawn uniformly from 30-100 % of it, as the mock provider draws it),
// always granting the waiting agent that has been served the least output so far, at a rate
// of `--rate` output tokens a minute (the role's share of the key: 15 workers of weight 1
// among 15 planners of 3 and 15 reviewers of 2 get a sixth of 12,000 at the 97 % margin).
// Output is counted at the grant, in the minute it is granted, as `promises.mjs` counts it;
// Jain's index over the agents' output in each window of `--window` minutes from minute
// `--steady`, the worst window per seed, over `--seeds` seeds.
//
//   node jain-floor.mjs                # 15 agents, 1,940 tokens a minute, 20 seeds
//
// Calls are whole: an agent's output in a window moves by a big call's 600-2,000 tokens
// whatever the order, against a mean of about 1,900 per agent per window, so even this
// queue cannot hold every window near 1.
import { parseArgs } from 'node:util'

const { values: args } = parseArgs({
  options: {
    agents: { type: 'string', default: '15' },
    rate: { type: 'string', default: '1940' },
    minutes: { type: 'string', default: '30' },
    steady: { type: 'string', default: '5' },
    window: { type: 'string', default: '15' },
    seeds: { type: 'string', default: '20' },
  },
})
const [N, RATE, MINUTES, STEADY, WINDOW, SEEDS] = ['agents', 'rate', 'minutes', 'steady', 'window', 'seeds'].map((k) => Number(args[k]))
for (const [k, v] of Object.entries({ agents: N, rate: RATE, minutes: MINUTES, window: WINDOW, seeds: SEEDS })) {
  if (!(Number.isInteger(v) && v > 0)) throw new Error(`--${k} must be a positive integer`)
}
if (!(Number.isInteger(STEADY) && STEADY >= 0 && STEADY + WINDOW <= MINUTES)) throw new Error('--steady and --window must fit in --minutes')

/** A small seeded generator (mulberry32), uniform in [0, 1). */
function random(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const jain = (x) => {
  const s = x.reduce((a, b) => a + b, 0)
  return s > 0 ? (s * s) / (x.length * x.reduce((a, b) => a + b * b, 0)) : 1
}

/** The worst window's Jain index for one seed. Time in minutes. */
function worstWindow(seed) {
  const next = random(seed)
  const served = new Array(N).fill(0)
  const calls = new Array(N).fill(0)
  // When each agent asks next: a think of 0.5-2 s after its previous call's answer.
  const ready = Array.from({ length: N }, () => next() / 60)
  const grants = []
  let t = 0
  while (t < MINUTES) {
    const waiting = ready.map((at, i) => [at, i]).filter(([at]) => at <= t)
    if (waiting.length === 0) {
      t = Math.min(...ready)
      continue
    }
    const i = waiting.reduce((best, [, k]) => (served[k] < served[best] ? k : best), waiting[0][1])
    const big = calls[i] % 4 === 3
    const output = (big ? 2000 : 300) * (0.3 + 0.7 * next())
    grants.push({ t, i, output })
    served[i] += output
    calls[i] += 1
    // The capacity this call's output takes, then the agent's next ask after its answer
    // (streamed at the mock's pace, a few seconds) and a think.
    t += output / RATE
    ready[i] = t + (big ? 5 : 1) / 60 + (0.5 + 1.5 * next()) / 60
  }
  let worst = 1
  for (let from = STEADY; from + WINDOW <= MINUTES; from += WINDOW) {
    const v = new Array(N).fill(0)
    for (const g of grants) if (g.t >= from && g.t < from + WINDOW) v[g.i] += g.output
    worst = Math.min(worst, jain(v))
  }
  return worst
}

const worst = Array.from({ length: SEEDS }, (_, s) => worstWindow(s + 1)).sort((a, b) => a - b)
const at = (q) => worst[Math.min(worst.length - 1, Math.floor(q * worst.length))].toFixed(3)
console.log(`an ideal fair queue, ${N} agents of one weight, ${RATE} output tokens a minute, ${WINDOW}-minute windows from minute ${STEADY}, ${SEEDS} seeds:`)
console.log(`worst-window Jain: min ${at(0)}, median ${at(0.5)}, max ${at(1)}; seeds at or above 0.95: ${worst.filter((j) => j >= 0.95).length} of ${SEEDS}`)
