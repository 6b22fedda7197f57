#!/usr/bin/env node
// A measurement, not a demo: 30 agents on the official Anthropic SDK share one key through
// `tw.fetch()` against the mock provider, with the mix of call sizes that starved big calls
// before the call lifecycle moved into the core (issue 12): 120,000 input / 12,000 output
// tokens a minute, 90 requests a minute, 10 at once; every fourth call of each agent a
// 10-20k-token prompt with max_tokens 2000, the others 500-2,000 tokens with 300; half
// streamed. The fleet offers about 1.5x the input limit.
//
// Time runs `--speed` times faster than the wall clock for both the mock's buckets and
// tokenwarden's clock (default 10: 30 minutes of traffic in 3), so the figures are in
// provider minutes. After `--minutes` the agents stop starting calls and the calls in
// progress drain, for at most the longest bound a call can have (about 13 provider minutes
// with 30 agents).
//
//   node mixed.mjs                    # 30 agents, 30 minutes at 10x
//   node mixed.mjs --minutes 10 --speed 20
//
// Prints, per size class: calls, p50 / p95 / max wait against the bound the core documents
// (`Coordinator::request_lease`), calls still waiting after the drain, 429s at the agents and
// at the provider, Jain fairness of tokens served among the agents, and how far `queued`
// ETAs were exceeded. Exit code 1 if a 429 or an error reached an agent, a call waited past
// its bound, or one was still waiting after the drain.

import { parseArgs } from 'node:util'
import Anthropic from '@anthropic-ai/sdk'
import { createTokenwarden } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { MIXED_LIMITS, MODEL, fastClock, mixedKey, promptText, rng } from './fleet.mjs'

const { values: args } = parseArgs({
  options: {
    agents: { type: 'string', default: '30' },
    minutes: { type: 'string', default: '30' },
    speed: { type: 'string', default: '10' },
    seed: { type: 'string', default: '1' },
    quantum: { type: 'string' },
  },
})
const AGENTS = Number(args.agents)
const MINUTES = Number(args.minutes)
const SPEED = Number(args.speed)
const SEED = Number(args.seed)
for (const [name, v] of [['agents', AGENTS], ['minutes', MINUTES], ['speed', SPEED]]) {
  if (!(v > 0)) throw new Error(`--${name} must be a positive number`)
}

const LIMITS = MIXED_LIMITS
const MARGIN = 0.85
// A call's dominant share of the key (see `Coordinator::request_lease`), at most: its input
// (with 30 % for the estimate's error: the first estimates of a model are high), its max_tokens (the most output it can reserve) or
// one request, each against its limit.
const share = (input, maxTokens) => Math.max((input * 1.3) / LIMITS.input, maxTokens / LIMITS.output, 1 / LIMITS.requests)
// After the last call starts, the calls in progress drain until they all end, for at most
// the longest bound a call can have here: the biggest call behind every other agent's share
// and its biggest call (see `bound` below).
const BIGGEST = share(20_000, 2_000)
const DRAIN_MS = Math.ceil(((BIGGEST + (AGENTS - 1) * 2 * BIGGEST) * 60_000) / MARGIN)

// One clock for the provider and tokenwarden: provider milliseconds, SPEED per wall ms.
const { now, clock, sleep } = fastClock(SPEED)
const { provider, tw } = await mixedKey({ now, clock, seed: SEED, quantumPermille: args.quantum === undefined ? undefined : Number(args.quantum), startMockProvider, createTokenwarden, maxQueueWaitMs: 120_000 })

// ETAs: each queued ticket's promised time against its grant.
const promised = new Map()
const etaLate = []
const etaWait = [] // for each grant from the queue: [waited, promised wait]
tw.on('queued', (e) => promised.set(e.lease, Number(e.eta)))
tw.on('granted', (e) => {
  const eta = promised.get(e.lease)
  if (eta === undefined) return
  promised.delete(e.lease)
  etaLate.push(Math.max(0, now() - eta))
  etaWait.push([Number(e.waitedMs), eta - (now() - Number(e.waitedMs))])
})

const random = rng(SEED)
// Mean think time so the fleet offers ~1.5x the input limit: an agent's mean call is
// 0.25 x 15k + 0.75 x 1.25k = 4.7k tokens, and 30 agents x 4.7k / 1.5 / 120k a minute is
// one call per agent every ~47 s.
const THINK_MS = Math.round((AGENTS * 4_700 * 60_000) / (1.5 * LIMITS.input)) - 3_000
const records = []
const waiting = new Map()
let agentErrors = 0
let rateLimitedAtAgents = 0
let stopping = false

async function agent(i) {
  const name = `mixed-${i}`
  let sentAt = null
  const client = new Anthropic({
    apiKey: 'sk-mock',
    baseURL: provider.url,
    maxRetries: 0,
    fetch: tw.fetch({
      agent: name,
      role: 'worker',
      fetch: (input, init) => {
        sentAt = now()
        return globalThis.fetch(input, init)
      },
    }),
  })
  for (let n = 0; !stopping; n++) {
    await sleep(-Math.log(1 - random.next()) * THINK_MS)
    if (stopping) break
    const big = (n + i) % 4 === 0
    const input = big ? random.int(10_000, 20_000) : random.int(500, 2_000)
    const maxTokens = big ? 2_000 : 300
    const params = {
      model: MODEL,
      max_tokens: maxTokens,
      messages: [{ role: 'user', content: promptText(input, random, `${name} call ${n}`) }],
    }
    const started = now()
    const key = `${i}/${n}`
    waiting.set(key, started)
    sentAt = null
    try {
      const options = { headers: { 'x-mock-reply-tokens': String(Math.round(maxTokens * 0.4)) } }
      if (n % 2 === 0) await client.messages.stream(params, options).finalMessage()
      else await client.messages.create(params, options)
      records.push({ agent: i, big, size: input + maxTokens, share: share(input, maxTokens), waited: (sentAt ?? now()) - started })
    } catch (e) {
      if (e?.status === 429) rateLimitedAtAgents++
      else agentErrors++
      if (agentErrors + rateLimitedAtAgents <= 3) console.error(`${name}: ${e?.message ?? e}`)
    } finally {
      waiting.delete(key)
    }
  }
}

const runs = Array.from({ length: AGENTS }, (_, i) => agent(i))
await sleep(MINUTES * 60_000)
stopping = true
const drainStart = now()
await Promise.race([Promise.all(runs), sleep(DRAIN_MS)])
const stillWaiting = [...waiting.values()].map((s) => now() - s)
const drainMs = now() - drainStart

// The bound `Coordinator::request_lease` documents, for equal weights: a call of dominant
// share S waits at most (S + sum over the other agents of (S + their largest share)) x the
// window / the margin (shares as fractions of a limit; the margin at its start, the lowest
// it has with no 429).
const largest = new Array(AGENTS).fill(0)
for (const r of records) largest[r.agent] = Math.max(largest[r.agent], r.share)
const bound = (r) => {
  let others = 0
  for (let j = 0; j < AGENTS; j++) if (j !== r.agent) others += r.share + largest[j]
  return ((r.share + others) * 60_000) / MARGIN
}
const pct = (v, p) => {
  const s = [...v].sort((a, b) => a - b)
  return s.length === 0 ? 0 : s[Math.min(s.length - 1, Math.ceil((s.length * p) / 100) - 1)]
}
const sec = (ms) => `${(ms / 1000).toFixed(1)} s`
const served = new Array(AGENTS).fill(0)
for (const r of records) served[r.agent] += r.size
const sum = served.reduce((a, b) => a + b, 0)
const jain = (sum * sum) / (AGENTS * served.reduce((a, b) => a + b * b, 0))
const over = records.filter((r) => r.waited > bound(r))

console.log(`${AGENTS} agents, ${MINUTES} provider minutes at ${SPEED}x, seed ${SEED}; drain ${sec(drainMs)}`)
console.log('| calls | n | p50 wait | p95 wait | max wait | p95 wait per token | longest wait / its bound |')
console.log('|---|---:|---:|---:|---:|---:|---:|')
for (const big of [false, true]) {
  const c = records.filter((r) => r.big === big)
  const worst = Math.max(0, ...c.map((r) => r.waited / bound(r)))
  console.log(
    `| ${big ? 'big (10-20k)' : 'small (0.5-2k)'} | ${c.length} | ${sec(pct(c.map((r) => r.waited), 50))} | ${sec(pct(c.map((r) => r.waited), 95))} | ${sec(pct(c.map((r) => r.waited), 100))} | ${pct(c.map((r) => r.waited / r.size), 95).toFixed(2)} ms | ${(worst * 100).toFixed(0)}% |`,
  )
}
const stats = provider.stats()
console.log(`calls over their bound: ${over.length}; still waiting after the drain: ${stillWaiting.length}${stillWaiting.length ? ` (longest ${sec(Math.max(...stillWaiting))})` : ''}`)
console.log(`429s at the agents: ${rateLimitedAtAgents}; other errors at the agents: ${agentErrors}; 429s at the provider: ${stats.rejected429}; provider over a limit: ${stats.overLimit}`)
console.log(`Jain fairness of tokens served among the agents: ${jain.toFixed(3)}`)
console.log(`queued ETAs: ${etaLate.length} grants from the queue; late by p50 ${sec(pct(etaLate, 50))}, p95 ${sec(pct(etaLate, 95))}, max ${sec(pct(etaLate, 100))}; ${etaLate.filter((l) => l > 1000).length} more than 1 s late; waited / promised wait p50 ${pct(etaWait.map(([w, p]) => w / Math.max(1, p)), 50).toFixed(2)}`)

tw.close()
await provider.close()
process.exit(rateLimitedAtAgents + agentErrors + over.length + stillWaiting.length > 0 || stats.overLimit ? 1 : 0)
