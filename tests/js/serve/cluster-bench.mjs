// What a call through a non-owner instance of a cluster adds, beside the same call to the
// owner (issue 44: ≤ 2× the owner's added latency). One redis-server, two native serve
// instances (`--cluster`), the mock provider with no limits and no delay, all on loopback;
// serial calls, p50 and p99 of each route, and the provider reached directly for the floor.
//
//   node tests/js/serve/cluster-bench.mjs [--calls 2000]
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { freePort, startRedis } from './support.mjs'

const BIN = process.env.TOKENWARDEN_SERVE_BIN ?? fileURLToPath(new URL(`../../../bindings-node/tokenwarden-serve.${process.platform}-${process.arch}-gnu`, import.meta.url))
const calls = Number(process.argv[process.argv.indexOf('--calls') + 1] || 2000)
const SECRET = 'cluster-bench-secret-0123456789'
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const mock = await startMockProvider({ replyTokens: 5 })
const dir = mkdtempSync(join(tmpdir(), 'tokenwarden-cluster-bench-'))
const config = join(dir, 'c.json')
writeFileSync(config, JSON.stringify({ fleets: { b: { secret: SECRET, quotas: { q: { upstream: mock.url, config: { pools: [{ name: 'claude-sonnet-4-6', requests_per_minute: 1_000_000 }] } } } } } }))
const redisPort = await freePort()
const redis = await startRedis(redisPort)
const nodes = []
for (let i = 0; i < 2; i++) {
  const port = await freePort()
  const child = spawn(BIN, ['serve', '--config', config, '--port', String(port), '--data', join(dir, `d${i}`), '--cluster', `redis://127.0.0.1:${redisPort}`], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, TOKENWARDEN_WAIT_LOG: '0' } })
  let out = ''
  await new Promise((resolve, reject) => {
    const seen = (d) => {
      out += d
      if (out.includes('Ctrl-C stops it')) resolve()
    }
    child.stdout.on('data', seen)
    child.stderr.on('data', seen)
    child.on('exit', () => reject(new Error(out)))
  })
  nodes.push({ child, origin: `http://127.0.0.1:${port}`, owner: out.includes('this instance owns the quota') })
}
const owner = nodes.find((n) => n.owner)
const follower = nodes.find((n) => !n.owner)
const body = JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] })
const headers = { 'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01', 'x-tokenwarden-token': SECRET }
const routes = {
  direct: `${mock.url}/v1/messages`,
  owner: `${owner.origin}/v1/fleets/b/quotas/q/agents/a/worker/anthropic/v1/messages`,
  follower: `${follower.origin}/v1/fleets/b/quotas/q/agents/a/worker/anthropic/v1/messages`,
}
const q = (xs, p) => xs.toSorted((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))]
const times = { direct: [], owner: [], follower: [] }
// Interleaved, so that the machine's noise falls on all three alike.
for (let i = 0; i < 200 + calls; i++) {
  for (const [name, url] of Object.entries(routes)) {
    const t = performance.now()
    const res = await fetch(url, { method: 'POST', headers, body })
    await res.arrayBuffer()
    if (res.status !== 200) throw new Error(`${name}: ${res.status}`)
    if (i >= 200) times[name].push(performance.now() - t)
  }
}
const d50 = q(times.direct, 0.5)
const d99 = q(times.direct, 0.99)
const line = (name) => `${name}: p50 ${q(times[name], 0.5).toFixed(3)} ms (+${(q(times[name], 0.5) - d50).toFixed(3)}), p99 ${q(times[name], 0.99).toFixed(3)} ms (+${(q(times[name], 0.99) - d99).toFixed(3)})`
console.log(`${calls} serial calls each, interleaved; the provider direct: p50 ${d50.toFixed(3)} ms, p99 ${d99.toFixed(3)} ms`)
console.log(line('owner'))
console.log(line('follower'))
const ratio = (q(times.follower, 0.5) - d50) / (q(times.owner, 0.5) - d50)
console.log(`added latency through a non-owner / through the owner, p50: ${ratio.toFixed(2)}x (goal <= 2x)`)
for (const n of nodes) n.child.kill('SIGINT')
redis.kill('SIGKILL')
await mock.close()
await sleep(300)
rmSync(dir, { recursive: true, force: true })
