// The same fleet on one native serve and on a cluster of three (issue 44: "decisions
// equivalent to one instance"): 24 agents calling back to back for `--seconds` on a key of
// `--rpm` requests a minute that the mock provider enforces, through one instance, then
// spread over three instances sharing one redis-server (agent i through instance i mod 3).
// Each run has a fresh mock (a full bucket). Prints, for each: calls served, the share of
// what the key allowed in the run (bucket + refill), Jain's fairness index over the agents'
// calls, 429s at the provider.
//
//   node tests/js/serve/cluster-fleet.mjs [--seconds 20] [--rpm 240]
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { freePort, startRedis } from './support.mjs'

const BIN = process.env.TOKENWARDEN_SERVE_BIN ?? fileURLToPath(new URL(`../../../bindings-node/tokenwarden-serve.${process.platform}-${process.arch}-gnu`, import.meta.url))
const arg = (name, d) => (process.argv.includes(name) ? Number(process.argv[process.argv.indexOf(name) + 1]) : d)
const SECONDS = arg('--seconds', 20)
const RPM = arg('--rpm', 240)
const AGENTS = 24
const SECRET = 'cluster-fleet-secret-0123456789'
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const dir = mkdtempSync(join(tmpdir(), 'tokenwarden-cluster-fleet-'))

function start(args, name) {
  return new Promise((resolve, reject) => {
    const port = args.port
    const child = spawn(BIN, ['serve', '--port', String(port), '--data', join(dir, name), ...args.rest], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, TOKENWARDEN_WAIT_LOG: '0' } })
    let out = ''
    const seen = (d) => {
      out += d
      if (out.includes('Ctrl-C stops it')) resolve({ child, origin: `http://127.0.0.1:${port}` })
    }
    child.stdout.on('data', seen)
    child.stderr.on('data', seen)
    child.on('exit', () => reject(new Error(out)))
  })
}

async function fleet(origins) {
  const mock = await startMockProvider({ requestsPerMinute: RPM, delayMs: 200, replyTokens: 20 })
  const config = join(dir, `c-${Math.random().toString(36).slice(2)}.json`)
  writeFileSync(config, JSON.stringify({ fleets: { f: { secret: SECRET, quotas: { q: { upstream: mock.url, config: { pools: [{ name: 'claude-sonnet-4-6', requests_per_minute: RPM }] } } } } } }))
  const nodes = await origins(config)
  const end = Date.now() + SECONDS * 1000
  const served = await Promise.all(
    Array.from({ length: AGENTS }, async (_, a) => {
      const node = nodes[a % nodes.length]
      let n = 0
      while (Date.now() < end) {
        const res = await fetch(`${node.origin}/v1/fleets/f/quotas/q/agents/agent-${a}/worker/anthropic/v1/messages`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01', 'x-tokenwarden-token': SECRET },
          body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 20, messages: [{ role: 'user', content: `agent ${a}` }] }),
        })
        await res.arrayBuffer()
        if (res.status === 200 && Date.now() <= end) n++
      }
      return n
    }),
  )
  for (const n of nodes) n.child.kill('SIGINT')
  const s = mock.stats()
  await mock.close()
  await sleep(300)
  const total = served.reduce((a, b) => a + b, 0)
  const jain = total ** 2 / (AGENTS * served.reduce((a, b) => a + b * b, 0))
  const allowed = RPM + (RPM / 60) * SECONDS
  return { total, use: total / allowed, jain, rejected429: s.rejected429, min: Math.min(...served), max: Math.max(...served) }
}

const line = (name, r) => `${name}: ${r.total} calls served (${(100 * r.use).toFixed(1)} % of the ${RPM + (RPM / 60) * SECONDS} the key allowed), Jain ${r.jain.toFixed(3)} (per agent ${r.min}..${r.max}), ${r.rejected429} 429s`

const one = await fleet(async (config) => [await start({ port: await freePort(), rest: ['--config', config] }, 'single')])
console.log(line('one instance', one))
const redisPort = await freePort()
const redis = await startRedis(redisPort)
const three = await fleet(async (config) => {
  const out = []
  for (let i = 0; i < 3; i++) out.push(await start({ port: await freePort(), rest: ['--config', config, '--cluster', `redis://127.0.0.1:${redisPort}`] }, `node-${i}`))
  return out
})
console.log(line('three instances', three))
redis.kill('SIGKILL')
rmSync(dir, { recursive: true, force: true })
