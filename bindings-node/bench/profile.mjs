#!/usr/bin/env node
// Runs one benchmark case in a loop under the V8 CPU profiler and prints where the time
// goes (self time by function, and inclusive time of the package's own functions).
//
//   node bench/profile.mjs CASE [SECONDS]     CASE: seq | fleet | queued | handleResponse | metrics
//   node bench/profile.mjs seq 5 --save=/tmp/seq.cpuprofile   # also write the profile
//                                                             # (open in Chrome DevTools)
//
// Native frames (the addon's Rust code and napi's glue) show up as the JavaScript method
// that called them (e.g. `requestLeaseIo`) or as `(program)`; use `perf` for inside them
// (see bench/README.md).
import { writeFileSync } from 'node:fs'
import { Session } from 'node:inspector/promises'
import { Driver, nativeEngines } from '../dist/index.js'

const [what = 'seq', secondsArg = '3', ...rest] = process.argv.slice(2)
const seconds = Number(secondsArg)
const save = rest.find((a) => a.startsWith('--save='))?.slice('--save='.length)

const HUGE = 1_000_000_000_000
const config = (maxConcurrent) => ({
  max_agents: 4096,
  max_leases: 65_536,
  max_queue_depth: 65_536,
  pools: [
    {
      name: 'p',
      input_tokens_per_minute: HUGE,
      output_tokens_per_minute: HUGE,
      requests_per_minute: HUGE,
      max_concurrent: maxConcurrent,
    },
  ],
})
const usage = { inputTokens: 100, outputTokens: 10 }
const requests = Array.from({ length: 1000 }, (_, i) => ({ agent: i + 1, pool: 0, inputTokens: 100, maxTokens: 10 }))
const job = async () => {}
const twOp = async (d, req) => {
  const lease = await d.acquire(req)
  await job()
  lease.settle(usage)
}
const batch = (n, op) => {
  const ps = new Array(n)
  return () => {
    for (let i = 0; i < n; i++) ps[i] = op(i)
    return Promise.all(ps)
  }
}
const RESET = '2026-01-01T00:01:00Z'
const headers = [
  ['anthropic-ratelimit-input-tokens-limit', '1000000000000'],
  ['anthropic-ratelimit-input-tokens-remaining', '999999990000'],
  ['anthropic-ratelimit-input-tokens-reset', RESET],
  ['anthropic-ratelimit-output-tokens-limit', '1000000000000'],
  ['anthropic-ratelimit-output-tokens-remaining', '999999999000'],
  ['anthropic-ratelimit-output-tokens-reset', RESET],
]

let now = Math.floor(performance.now())
const cases = {
  seq: () => {
    const d = new Driver(nativeEngines.create(config(1_000_000), 1, now))
    return () => twOp(d, requests[0])
  },
  fleet: () => {
    const d = new Driver(nativeEngines.create(config(1_000_000), 1, now))
    return batch(1000, (i) => twOp(d, requests[i]))
  },
  queued: () => {
    const d = new Driver(nativeEngines.create(config(8), 1, now))
    return batch(64, (i) => twOp(d, requests[i]))
  },
  handleResponse: () => {
    const e = nativeEngines.create(config(1_000_000), 1, now)
    return () => e.handleResponse(++now, 0, null, 200, headers, 1_767_225_600_000)
  },
  metrics: () => {
    const e = nativeEngines.create(config(1_000_000), 1, now)
    for (let i = 0; i < 64; i++) e.settle(++now, e.requestLease(++now, requests[i % 8]).lease, usage)
    return () => e.metrics(++now)
  },
}
if (!(what in cases)) throw new Error(`unknown case ${what}; one of ${Object.keys(cases).join(', ')}`)
const step = cases[what]()

// Warm up (so the profile shows optimised code), then profile.
const until = (ms) => performance.now() + ms
for (const end = until(500); performance.now() < end; ) await step()
const session = new Session()
session.connect()
await session.post('Profiler.enable')
await session.post('Profiler.setSamplingInterval', { interval: 50 })
await session.post('Profiler.start')
let iterations = 0
for (const end = until(seconds * 1000); performance.now() < end; iterations++) await step()
const { profile } = await session.post('Profiler.stop')
session.disconnect()
if (save) writeFileSync(save, JSON.stringify(profile))

// Self time per node from the samples, then per function (name + location).
const byId = new Map(profile.nodes.map((n) => [n.id, n]))
const self = new Map()
for (let i = 0; i < profile.samples.length; i++) {
  const dt = profile.timeDeltas[i + 1] ?? 0
  self.set(profile.samples[i], (self.get(profile.samples[i]) ?? 0) + dt)
}
const parent = new Map()
for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
const label = (n) => {
  const f = n.callFrame
  const file = f.url ? f.url.replace(/^.*\/(node_modules\/[^/]+|dist|bench|mocha)\//, '$1/') : ''
  return `${f.functionName || '(anonymous)'}${file ? ` ${file}:${f.lineNumber + 1}` : ''}`
}
const selfBy = new Map()
const totalBy = new Map()
let total = 0
for (const [id, t] of self) {
  total += t
  const n = byId.get(id)
  selfBy.set(label(n), (selfBy.get(label(n)) ?? 0) + t)
  // Inclusive: every distinct function on the stack gets the sample once.
  const seen = new Set()
  for (let cur = id; cur !== undefined; cur = parent.get(cur)) {
    const l = label(byId.get(cur))
    if (!seen.has(l)) {
      seen.add(l)
      totalBy.set(l, (totalBy.get(l) ?? 0) + t)
    }
  }
}
const perIter = (t) => `${((t * 1000) / iterations).toFixed(0).padStart(6)} ns/iter`
const pct = (t) => `${((100 * t) / total).toFixed(1).padStart(5)} %`
console.log(`${what}: ${iterations} iterations in ${(total / 1e6).toFixed(2)} s sampled (${process.version})\n`)
console.log('Self time:')
for (const [l, t] of [...selfBy].sort((a, b) => b[1] - a[1]).slice(0, 25)) console.log(`  ${pct(t)} ${perIter(t)}  ${l}`)
console.log('\nInclusive time (package and bench functions):')
for (const [l, t] of [...totalBy].filter(([l]) => /dist\/|bench\//.test(l)).sort((a, b) => b[1] - a[1]).slice(0, 25)) {
  console.log(`  ${pct(t)} ${perIter(t)}  ${l}`)
}
