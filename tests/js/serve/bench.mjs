// What `tokenwarden serve` adds to a model call, measured against calling the mock provider
// directly, in the same run on the same machine (these machines are noisy: read the
// differences and ratios, not the absolute figures):
//
//   added latency per call, p50 and p99, at 1 and at 50 concurrent agents;
//   proxied calls per second sustained at 50 concurrent agents (state persisted on disk);
//   time to first streamed byte added, p50;
//   a request to the Worker alone, and an API lease + settle pair (where the time goes);
//   memory (RSS) of serve's workerd with 200 agents known, and its growth under 30,000
//   unauthenticated requests (each answered 401 without reaching a Durable Object).
//
//   WORKERD=<workerd binary> node tests/js/serve/bench.mjs [--calls N]
//
// Writes a markdown table to stdout (BENCHMARKS.md keeps the last one, with this command).
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { freePort } from './support.mjs'

const cli = fileURLToPath(new URL('../../../bindings-node/bin/tokenwarden.mjs', import.meta.url))
if (!process.env.WORKERD) {
  console.error('set WORKERD to the workerd binary (e.g. $(cd testing && node -p "require(\'workerd\').default"))')
  process.exit(2)
}
const arg = (name, d) => {
  const i = process.argv.indexOf(name)
  return i === -1 ? d : Number(process.argv[i + 1])
}
const CALLS = arg('--calls', 400)


const BIG = 1_000_000_000
const mock = await startMockProvider({ inputTokensPerMinute: BIG, outputTokensPerMinute: BIG, requestsPerMinute: BIG, concurrency: 10_000, replyTokens: 5, chunkDelayMs: 0 })
const data = mkdtempSync(join(tmpdir(), 'tokenwarden-serve-bench-'))
const config = join(data, 'tokenwarden.json')
writeFileSync(
  config,
  JSON.stringify({
    fleets: {
      bench: {
        secret: 'bench-secret-0123456789abcd',
        proxy_open: true,
        quotas: {
          anthropic: {
            upstream: mock.url,
            config: { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: BIG, output_tokens_per_minute: BIG, requests_per_minute: BIG }], max_agents: 1000 },
          },
        },
      },
    },
  }),
)
const port = await freePort()
const serve = spawn(process.execPath, [cli, 'serve', '--config', config, '--port', String(port), '--data', join(data, 'state')], { stdio: ['ignore', 'pipe', 'inherit'] })
await new Promise((resolve, reject) => {
  let out = ''
  serve.stdout.on('data', (d) => {
    out += d
    if (out.includes('Ctrl-C stops it')) resolve()
  })
  serve.on('exit', (c) => reject(new Error(`serve exited ${c}`)))
})
const origin = `http://127.0.0.1:${port}`
const proxied = (agent) => `${origin}/v1/fleets/bench/quotas/anthropic/agents/${agent}/worker/anthropic/v1/messages`
const direct = `${mock.url}/v1/messages`
const headers = { 'x-api-key': 'sk-bench', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' }
const body = (stream) => JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 50, stream, messages: [{ role: 'user', content: 'hello '.repeat(50) }] })

async function call(url, stream = false) {
  const t0 = performance.now()
  const r = await fetch(url, { method: 'POST', headers, body: body(stream) })
  if (!r.ok) throw new Error(`${url}: ${r.status} ${await r.text()}`)
  const reader = r.body.getReader()
  const first = await reader.read()
  const ttfb = performance.now() - t0
  if (!first.done) for (let c = await reader.read(); !c.done; c = await reader.read());
  return { ms: performance.now() - t0, ttfb }
}

/** `n` calls by `agents` concurrent agents (each sequential); latencies in ms. */
async function load(url, agents, n, stream = false) {
  const out = []
  let next = 0
  const t0 = performance.now()
  await Promise.all(
    Array.from({ length: agents }, async (_, a) => {
      while (next < n) {
        next++
        out.push(await call(typeof url === 'function' ? url(a) : url, stream))
      }
    }),
  )
  return { samples: out, seconds: (performance.now() - t0) / 1000 }
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.ceil((s.length * p) / 100) - 1)]
}
const ms = (x) => `${x.toFixed(2)} ms`

// Warm both paths (JIT, connections, the Durable Object's first load).
await load(direct, 4, 100)
await load((a) => proxied(`warm-${a}`), 4, 100)

const rows = []
for (const agents of [1, 50]) {
  const d = await load(direct, agents, CALLS)
  const p = await load((a) => proxied(`agent-${a}`), agents, CALLS)
  const lat = (r) => r.samples.map((s) => s.ms)
  rows.push([
    `added latency per call, ${agents} agent${agents > 1 ? 's' : ''} (p50 / p99)`,
    `${ms(pct(lat(p), 50) - pct(lat(d), 50))} / ${ms(pct(lat(p), 99) - pct(lat(d), 99))}`,
    `direct ${ms(pct(lat(d), 50))} / ${ms(pct(lat(d), 99))}, proxied ${ms(pct(lat(p), 50))} / ${ms(pct(lat(p), 99))}`,
  ])
  if (agents === 50) {
    rows.push([`proxied calls per second, 50 agents`, `${(CALLS / p.seconds).toFixed(0)} /s`, `direct ${(CALLS / d.seconds).toFixed(0)} /s (${CALLS} calls each)`])
  }
}
{
  const d = await load(direct, 1, CALLS / 2, true)
  const p = await load((a) => proxied(`stream-${a}`), 1, CALLS / 2, true)
  const t = (r) => r.samples.map((s) => s.ttfb)
  rows.push(['time to first streamed byte added (p50)', ms(pct(t(p), 50) - pct(t(d), 50)), `direct ${ms(pct(t(d), 50))}, proxied ${ms(pct(t(p), 50))}`])
}
{
  // Where the added time goes, one agent, sequential: a request that only reaches the
  // Worker, and an API lease + settle pair (two requests through the Durable Object, each
  // reply after its state is written to disk).
  const auth = { authorization: 'Bearer bench-secret-0123456789abcd', 'content-type': 'application/json' }
  const api = `${origin}/v1/fleets/bench/quotas/anthropic`
  const timed = async (f, n) => {
    const xs = []
    for (let i = 0; i < n; i++) {
      const t0 = performance.now()
      await f()
      xs.push(performance.now() - t0)
    }
    return xs
  }
  const healthz = await timed(async () => (await fetch(`${origin}/healthz`)).text(), CALLS / 2)
  const pairs = await timed(async () => {
    const lease = await (await fetch(`${api}/leases`, { method: 'POST', headers: auth, body: JSON.stringify({ agent: 'api-1', inputTokens: 100, maxTokens: 50 }) })).json()
    const r = await fetch(`${api}/leases/${lease.lease}/settle`, { method: 'POST', headers: auth, body: JSON.stringify({ inputTokens: 100, outputTokens: 5 }) })
    if (!r.ok) throw new Error(`settle: ${r.status} ${await r.text()}`)
    await r.text()
  }, CALLS / 4)
  rows.push(['a request to the Worker alone (GET /healthz), p50', ms(pct(healthz, 50)), 'workerd\'s own round trip, no Durable Object'])
  rows.push(['API lease + settle pair, 1 agent (p50)', ms(pct(pairs, 50)), 'two requests through the Durable Object, each answered after its write to disk'])
}
{
  // 200 distinct agents known to the quota, then the RSS of the workerd process.
  await load((a) => proxied(`many-${a}`), 200, 200)
  const kids = readFileSync(`/proc/${serve.pid}/task/${serve.pid}/children`, 'utf8').trim().split(/\s+/)
  const rssOf = (pid) => {
    try {
      return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1])
    } catch {
      return 0
    }
  }
  const rss = kids.map(rssOf).reduce((a, b) => a + b, 0)
  rows.push(['memory of serve (workerd RSS) with 200+ agents known', `${(rss / 1024).toFixed(0)} MiB`, `${kids.length} process`])
  // Hostile traffic: 30,000 requests with a wrong secret, 50 at a time.
  const hostile = `${origin}/v1/fleets/bench/quotas/anthropic/handle`
  for (let done = 0; done < 30_000; done += 50) {
    await Promise.all(
      Array.from({ length: 50 }, async (_, i) => {
        const r = await fetch(hostile, { method: 'POST', headers: { authorization: `Bearer wrong-${done + i}`, 'content-type': 'application/json' }, body: '{"op":"timeout"}' })
        if (r.status !== 401) throw new Error(`a wrong secret got ${r.status}`)
        await r.arrayBuffer()
      }),
    )
  }
  const after = kids.map(rssOf).reduce((a, b) => a + b, 0)
  rows.push(['memory of serve after 30,000 requests answered 401', `+${((after - rss) / 1024).toFixed(0)} MiB`, `${(after / 1024).toFixed(0)} MiB in all`])
}

console.log('| measure | figure | detail |\n|---|---:|---|')
for (const r of rows) console.log(`| ${r.join(' | ')} |`)
serve.kill('SIGINT')
await new Promise((r) => serve.on('exit', r))
await mock.close()
rmSync(data, { recursive: true, force: true })
