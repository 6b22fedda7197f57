// Load run of the edge limiter on local workerd (miniflare) with Durable Object persistence
// on: lease+settle pairs per second sustained for 30 s, then a correctness check under
// concurrent load against tight limits (nothing admitted beyond them).
//
//   cd edge && node bench/load.mjs [--seconds 30] [--clients 16]
import { mkdtempSync, rmSync } from 'node:fs'
import http from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const arg = (name, d) => (process.argv.includes(name) ? Number(process.argv[process.argv.indexOf(name) + 1]) : d)
const SECONDS = arg('--seconds', 30)
const CLIENTS = arg('--clients', 16)
const SECRET = 'load-secret-0123456789abcdef'
const outdir = fileURLToPath(new URL('../.build/load/', import.meta.url))
const persist = mkdtempSync(join(tmpdir(), 'tokenwarden-load-'))
const BIG = 1_000_000_000
const TIGHT = { name: 'p', input_tokens_per_minute: 120_000, output_tokens_per_minute: 60_000, requests_per_minute: 100_000, max_concurrent: 8 }

await buildWorker(outdir, { entry: fileURLToPath(new URL('../src/worker.js', import.meta.url)) })
const { mf, base } = await startWorker({
  outdir,
  persist,
  fleets: {
    load: {
      secret: SECRET,
      quotas: {
        wide: { config: { pools: [{ name: 'p', input_tokens_per_minute: BIG, output_tokens_per_minute: BIG, requests_per_minute: BIG, max_concurrent: 100_000 }] } },
        tight: { config: { pools: [TIGHT], max_queue_wait_ms: 600_000, max_queue_depth: 10_000 } },
      },
    },
  },
})
const headers = { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' }
// node:http with keep-alive: the client must not be the bottleneck on a 2-core machine
// (undici's fetch costs about three times the CPU per request here).
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 })
const origin = new URL(base)
const call = (quota, path, body, method = 'POST') =>
  new Promise((resolve, reject) => {
    const text = body === undefined ? undefined : JSON.stringify(body)
    const req = http.request(
      {
        agent,
        host: origin.hostname,
        port: origin.port,
        method,
        path: `/v1/fleets/load/quotas/${quota}${path}`,
        headers: { ...headers, ...(text === undefined ? {} : { 'content-length': Buffer.byteLength(text) }) },
      },
      (res) => {
        let data = ''
        res.setEncoding('utf8')
        res.on('data', (c) => (data += c))
        res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(data) }))
      },
    )
    req.on('error', reject)
    if (text !== undefined) req.write(text)
    req.end()
  })

// Phase 1: throughput.
let pairs = 0
let errors = 0
const end = performance.now() + SECONDS * 1000
const perSecond = []
let lastMark = performance.now()
let lastPairs = 0
const ticker = setInterval(() => {
  const now = performance.now()
  perSecond.push(((pairs - lastPairs) * 1000) / (now - lastMark))
  lastMark = now
  lastPairs = pairs
}, 1000)
async function client(i) {
  while (performance.now() < end) {
    const d = await call('wide', '/leases', { agent: `c${i}`, pool: 0, inputTokens: 100, maxTokens: 50 })
    if (d.status !== 200 || d.body.kind !== 'grant') {
      errors++
      continue
    }
    const s = await call('wide', `/leases/${d.body.lease}/settle`, { inputTokens: 100, outputTokens: 20 })
    if (s.status === 200) pairs++
    else errors++
  }
}
const t0 = performance.now()
await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i)))
const elapsed = (performance.now() - t0) / 1000
clearInterval(ticker)
const sorted = [...perSecond].sort((a, b) => a - b)
console.log(
  `throughput: ${pairs} lease+settle pairs in ${elapsed.toFixed(1)} s = ${(pairs / elapsed).toFixed(0)} pairs/s with ${CLIENTS} clients (persistence on); per-second min ${sorted[0]?.toFixed(0)}, median ${sorted[sorted.length >> 1]?.toFixed(0)}; errors ${errors}`,
)

// Phase 2: correctness under concurrent load against tight limits.
const CHECK_S = 10
const checkEnd = performance.now() + CHECK_S * 1000
let inFlight = 0
let peak = 0
const grants = [] // [time ms, input tokens]
let granted = 0
async function hammer(i) {
  while (performance.now() < checkEnd) {
    const tokens = 500 + ((i * 7919) % 1500)
    let d = await call('tight', '/leases', { agent: `h${i}`, pool: 0, inputTokens: tokens, maxTokens: 100 })
    if (d.body.kind === 'reject') {
      await new Promise((r) => setTimeout(r, Math.min(1000, d.body.retryAfterMs ?? 200)))
      continue
    }
    while (d.status === 202) {
      d = await call('tight', `/leases/${d.body.lease}?wait=2000`, undefined, 'GET')
      if (d.status === 404) break
    }
    if (d.status !== 200) continue
    inFlight++
    peak = Math.max(peak, inFlight)
    granted++
    // The server's grant time: the lease expires lease_ttl_ms (120 s) after it.
    grants.push([d.body.expiresAt - 120_000, tokens])
    await new Promise((r) => setTimeout(r, 5 + (i % 20)))
    inFlight-- // counted down before the settle is sent: an upper bound on the server's count
    await call('tight', `/leases/${d.body.lease}/settle`, { inputTokens: tokens, outputTokens: 100 })
  }
}
await Promise.all(Array.from({ length: 64 }, (_, i) => hammer(i)))
// Tokens admitted in any window [a, b] must be at most capacity + refill over (b - a),
// with capacity = limit × margin (85%) and refill = limit × margin per minute.
const capacity = TIGHT.input_tokens_per_minute * 0.85
const rate = capacity / 60_000
let worst = Number.NEGATIVE_INFINITY
let minPrefix = 0
let sum = 0
grants.sort((a, b) => a[0] - b[0])
const t00 = grants[0]?.[0] ?? 0
for (const [t, tokens] of grants) {
  // excess(window ending here) = sum(tokens in window) - rate × span; track the max.
  const before = sum - rate * (t - t00)
  minPrefix = Math.min(minPrefix, before)
  sum += tokens
  worst = Math.max(worst, sum - rate * (t - t00) - minPrefix)
}
const metrics = (await call('tight', '/metrics', undefined, 'GET')).body
console.log(
  `correctness: ${granted} grants in ${CHECK_S} s by 64 clients; peak in flight ${peak} (limit ${TIGHT.max_concurrent}); worst window ${worst.toFixed(0)} input tokens against a bucket of ${capacity.toFixed(0)} (+ refill over the window); server counters ${JSON.stringify(metrics.pools[0].counters)}`,
)
const ok = peak <= TIGHT.max_concurrent && worst <= capacity + 1
console.log(ok ? 'OK: nothing was admitted beyond the limits' : 'FAILED: admissions beyond the limits')
agent.destroy()
await mf.dispose()
rmSync(persist, { recursive: true, force: true })
process.exit(ok && errors === 0 ? 0 : 1)
