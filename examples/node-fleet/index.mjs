#!/usr/bin/env node
// tokenwarden node-fleet: 20 agents share one API key through `tw.fetch()`, against a mock
// Anthropic provider started in this process, with a live terminal view and a summary.
//
//   node index.mjs                    # 20 agents, 3 turns each, about 30 s
//   node index.mjs --turns 5 --agents 12
//   node index.mjs --duration 60      # keep taking turns for 60 s
//   node index.mjs --inject-429 3     # the provider refuses 3 calls (another client on the key)
//   node index.mjs --quiet            # only the summary
//
// Exit code 0 when no 429 and no other error reached agent code and the provider never saw
// traffic above its limits; 1 otherwise; 130 when interrupted.

import { parseArgs } from 'node:util'
import { createTokenwarden } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { Fleet, MODEL } from './fleet.mjs'
import { Monitor } from './view.mjs'

const USAGE = `usage: node index.mjs [options]

  --agents N        agents in the fleet (default 20: 1 planner, 6 repair, 9 lint, 4 refactor)
  --turns N         model calls per agent (default 3)
  --duration S      keep taking turns for S seconds instead (with --turns: whichever ends first)
  --inject-429 N    six seconds in, make the provider refuse the next N calls with a 429, as if
                    another client had spent the quota: tokenwarden absorbs a few (agents see
                    none); a few hundred exhaust its retries and reach the agents (exit 1)
  --seed N          seed for prompt sizes and backoff jitter (default 1)
  --quiet           print only the summary
  --no-color        no ANSI colours (also: NO_COLOR=1)
  -h, --help        this text`

function fail(message) {
  process.stderr.write(`${message}\n\n${USAGE}\n`)
  process.exit(2)
}

function positiveInt(name, raw, { allowZero = false } = {}) {
  if (raw === undefined) return undefined
  const n = Number(raw)
  if (!Number.isInteger(n) || n < (allowZero ? 0 : 1)) fail(`--${name} wants a whole number${allowZero ? '' : ' > 0'}, got ${raw}`)
  return n
}

let args
try {
  args = parseArgs({
    options: {
      agents: { type: 'string' },
      turns: { type: 'string' },
      duration: { type: 'string' },
      'inject-429': { type: 'string' },
      seed: { type: 'string' },
      quiet: { type: 'boolean', short: 'q' },
      'no-color': { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
  }).values
} catch (err) {
  fail(err.message)
}
if (args.help) {
  process.stdout.write(`${USAGE}\n`)
  process.exit(0)
}

const agentCount = positiveInt('agents', args.agents) ?? 20
const durationS = args.duration === undefined ? null : Number(args.duration)
if (durationS !== null && !(durationS > 0)) fail(`--duration wants seconds > 0, got ${args.duration}`)
const turns = positiveInt('turns', args.turns) ?? (durationS === null ? 3 : Number.POSITIVE_INFINITY)
const inject429 = positiveInt('inject-429', args['inject-429'], { allowZero: true }) ?? 0
const seed = positiveInt('seed', args.seed, { allowZero: true }) ?? 1

// The provider's limits, scaled to the fleet so they bind (20 agents: 360k input tokens/min,
// 30k output tokens/min, 120 requests/min, 6 requests at once). tokenwarden is told the
// same limits; the mock enforces them like the real API (continuous buckets, 429s).
const scale = agentCount / 20
const limits = {
  inputTokensPerMinute: Math.max(60_000, Math.round(360_000 * scale)),
  outputTokensPerMinute: Math.max(8_000, Math.round(30_000 * scale)),
  requestsPerMinute: Math.max(20, Math.round(120 * scale)),
  concurrency: Math.max(2, Math.round(6 * scale)),
}

const mode = args.quiet ? 'quiet' : process.stdout.isTTY ? 'tty' : 'lines'
const color = mode === 'tty' && !args['no-color'] && !process.env.NO_COLOR

const mock = await startMockProvider({
  ...limits,
  chunkDelayMs: 50, // 20 deltas per stream: about a second of streaming
})

const tw = createTokenwarden({
  seed,
  config: {
    pools: [
      {
        name: MODEL,
        counting: 'anthropic',
        input_tokens_per_minute: limits.inputTokensPerMinute,
        output_tokens_per_minute: limits.outputTokensPerMinute,
        requests_per_minute: limits.requestsPerMinute,
        max_concurrent: limits.concurrency,
      },
    ],
  },
})

const controller = new AbortController()
const started = performance.now()
const fleet = new Fleet({
  tw,
  baseURL: mock.url,
  count: agentCount,
  turns,
  deadline: durationS === null ? null : started + durationS * 1000,
  seed,
})
const monitor = new Monitor({ tw, mock, fleet, limits, mode, out: process.stdout, color })

// Ctrl-C (or a CI timeout's SIGTERM): stop the agents, then print the summary as usual.
let interrupted = false
const interrupt = () => {
  interrupted = true
  controller.abort(new Error('interrupted'))
}
process.once('SIGINT', interrupt)
process.once('SIGTERM', interrupt)

let injectTimer = null
if (inject429 > 0) {
  injectTimer = setTimeout(() => mock.fail429(inject429, { retryAfterSeconds: 2 }), 6000)
  injectTimer.unref()
}

monitor.start()
await fleet.run(controller.signal)
const elapsedMs = performance.now() - started
clearTimeout(injectTimer)
monitor.stop()
const metrics = tw.metrics()
tw.close()
const stats = mock.stats()
await mock.close()

// ---- summary ----
const c = (code, s) => (color ? `\x1b[${code}m${s}\x1b[0m` : s)
let ok = 0
let streamed = 0
let calls = 0
let agent429 = 0
let otherErrors = 0
let withdrawn = 0
let cut = 0
for (const a of fleet.agents) {
  withdrawn += a.withdrawn
  cut += a.interrupted
  calls += a.calls
  ok += a.ok
  streamed += a.streamed
  agent429 += a.rateLimitedErrors
  otherErrors += a.otherErrors
}
const pool = metrics.pools[0]
const { p50, p95 } = monitor.waitPercentiles()
const sec = (ms) => `${(ms / 1000).toFixed(1)} s`
const num = (n) => Math.round(Number(n)).toLocaleString('en-US')
const good = agent429 === 0 && otherErrors === 0 && !stats.overLimit && !interrupted
const row = (label, text) => out.push(`  ${label.padEnd(16)}${text}`)

const out = ['', c('1', `summary${interrupted ? ' (interrupted)' : ''}`)]
const plan = Number.isFinite(turns) ? `${turns} turn${turns === 1 ? '' : 's'} each` : `turns for ${durationS} s`
row('agents', `${fleet.agents.length} (${plan}), model ${MODEL}`)
row('total time', sec(elapsedMs))
row(
  'calls made',
  `${calls}: ${ok} answered (${streamed} streamed), ${otherErrors + agent429} failed` +
    (withdrawn > 0 ? `, ${withdrawn} withdrawn from the queue at the deadline` : '') +
    (cut > 0 ? `, ${cut} cut short by the interrupt` : ''),
)
const byLimit = Object.entries(stats.byLimit)
  .filter(([, n]) => n > 0)
  .map(([k, n]) => `${k === 'forced' ? 'injected' : k} ${n}`)
  .join(', ')
row(
  '429s',
  `${agent429 === 0 ? c('32', '0') : c('31', String(agent429))} reached agent code; ` +
    `${stats.rejected429} at the provider` +
    (stats.rejected429 === 0
      ? ''
      : agent429 === 0
        ? ` (${byLimit}), all retried by tokenwarden`
        : ` (${byLimit}); tokenwarden gave up on ${agent429} calls after its last retry`),
)
row('queue', `${monitor.counts.fromQueue} of ${monitor.counts.granted} grants came from the queue; wait p50 ${sec(p50 ?? 0)}, p95 ${sec(p95 ?? 0)}`)
for (const [kind, n, avg, max] of monitor.waitsByKind()) {
  const role = fleet.agents.find((a) => a.spec.kind === kind).role
  out.push(`    ${`${kind} (${role})`.padEnd(20)}${String(n).padStart(4)} call${n === 1 ? '' : 's'}, waited avg ${sec(avg)}, longest ${sec(max)}`)
}
row(
  'margin',
  `${(pool.marginPermille / 10).toFixed(1)}% at the end` +
    (monitor.marginLow === null ? ' (never moved)' : `, lowest ${(monitor.marginLow / 10).toFixed(1)}%`),
)
// The provider's buckets start full and refill continuously (as the real API's do): over the
// run it could admit at most one full bucket plus the refill.
out.push('  provider counters vs limits ("allowed" = a full bucket + refill over the run)')
const axis = (label, used, limit, level, note = '') => {
  const allowed = limit + (limit * elapsedMs) / 60_000
  const left = level === null ? 'n/a' : `${num(level)} of ${num(limit)}`
  out.push(
    `    ${label.padEnd(14)}${num(used).padStart(9)} of ${num(allowed)} allowed (${Math.round((used / allowed) * 100)}%), lowest level ${left}${note}`,
  )
}
axis('input tokens', stats.inputTokens, limits.inputTokensPerMinute, stats.minLevel.inputTokens)
const debt = stats.minLevel.outputTokens !== null && stats.minLevel.outputTokens < 0
axis('output tokens', stats.outputTokens, limits.outputTokensPerMinute, stats.minLevel.outputTokens, debt ? ' (debt is allowed)' : '')
axis('requests', stats.admitted, limits.requestsPerMinute, stats.minLevel.requests)
out.push(`    ${'concurrency'.padEnd(14)}peak ${stats.peakInFlight} of ${limits.concurrency}`)
out.push(`    ${'overLimit'.padEnd(14)}${stats.overLimit ? c('31', 'true') : c('32', 'false')}`)
if (fleet.errors.length > 0) {
  out.push('  errors that reached agents:')
  for (const e of fleet.errors.slice(0, 5)) out.push(`    ${e.agent}: ${e.message.slice(0, 120)}`)
  if (fleet.errors.length > 5) out.push(`    … and ${fleet.errors.length - 5} more`)
}
const why = [
  interrupted && 'interrupted',
  agent429 > 0 && `${agent429} 429s reached agent code`,
  otherErrors > 0 && `${otherErrors} calls failed`,
  stats.overLimit && 'the provider saw traffic above its limits',
].filter(Boolean)
out.push(
  good
    ? c('32', '  OK: no 429 reached agent code and the provider never saw traffic above its limits')
    : c('31', `  FAILED: ${why.join('; ')}`),
)
process.stdout.write(`${out.join('\n')}\n`)

process.exitCode = interrupted ? 130 : good ? 0 : 1
// Nothing should be left running; make sure a stray keep-alive socket cannot hold the exit.
setTimeout(() => process.exit(process.exitCode), 2000).unref()
