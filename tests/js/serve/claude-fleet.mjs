// A fleet of Claude-Code-like agents through `tokenwarden serve` (issue 26, the fleet measure):
// 12 agents replay the corpus's claude-code sequences (tests/corpus, 4 sequences, 3 agents
// each) turn by turn as streamed `POST …/v1/messages?beta=true` with Claude Code's headers,
// against the mock provider in `counting: 'bpe'` (cl100k_base standing in for Claude, the
// Anthropic prompt cache, output counted as produced) with an input limit set so the fleet's
// demand is about twice it and 80,000 output tokens a minute; then the same fleet straight to
// the provider, retrying a 429 after its retry-after as the SDK does (at most 10 attempts).
//
//   cd tests/js && WORKERD=<workerd binary> node serve/claude-fleet.mjs [--mode serve|direct|both|wrapper]
//     [--agents 12] [--turns 8] [--duration 240 (no turn starts after it)] [--grace 60 (then
//     calls still unanswered are cut)] [--itpm N (default: half the steady demand)]
//     [--otpm 80000] [--rpm 10000] [--concurrency 100] [--margin PERMILLE (start = ceiling)]
//     [--warmup 1 (one call by another agent, then 60 s)] [--cli another/bin/tokenwarden.mjs]
//     [--wrapper-module M (--mode wrapper: M's createTokenwarden in-process)] [--json FILE]
//
// Direct mode: each agent retries a 429 after its retry-after, at most 10 attempts (Claude
// Code's SDK); a call that fails ends that agent's run. Wrapper mode: the same core through
// tw.fetch in this process, each settle's reservation against its use recorded.
//
// The provider: the mock behind a small front on loopback that gives each call a Claude
// Code-like answer — reply tokens log-uniform in [--reply-min 200, --reply-max 2000], drawn
// from a hash of the session id and the message count (the same in both modes), streamed
// over --ttft 1000 ms + reply / --rate 60 tokens per second — through the mock's
// x-mock-reply-tokens / x-mock-delay-ms (which serve does not forward: the front adds them
// after serve, as a provider's own behaviour). Think time between turns: uniform in
// [--think-min 0.5, --think-max 2] s. See BENCHMARKS.md, "Claude-Code-like fleet through serve".
import { spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import { createRequire } from 'node:module'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { generateCorpus } from '../../corpus/generate.mjs'
import { freePort } from './support.mjs'

const cli = fileURLToPath(new URL('../../../bindings-node/bin/tokenwarden.mjs', import.meta.url))
const SECRET = 'claude-fleet-secret-0123456789'
const MODEL = 'claude-opus-5-5' // the corpus bodies' model
const MAX_ATTEMPTS = 10 // Claude Code's SDK retries
const STREAM_DELTAS = 20 // the mock's default maxDeltas
const CHUNK_DELAY_MS = 25

export const DEFAULTS = {
  mode: 'both',
  agents: 12,
  turns: 8,
  duration: 240,
  itpm: 0, // 0: half the fleet's computed demand
  otpm: 80_000,
  rpm: 10_000,
  concurrency: 100,
  margin: 0, // 0: the core's default margin
  grace: 60, // s after --duration: calls still unanswered are cut (counted apart, not as failures)
  warmup: 0, // 1: one call by another agent first, then 60 s for the buckets to refill
  replyMin: 200,
  replyMax: 2000,
  rate: 60,
  ttft: 1000,
  thinkMin: 0.5,
  thinkMax: 2,
  json: null,
  cli: null, // another build's bin/tokenwarden.mjs (default: this repository's bindings-node)
  wrapperModule: 'tokenwarden-wasm', // --mode wrapper: the module whose createTokenwarden is used
  quiet: false,
}

/** A number in [0, 1) from a string (deterministic). */
function unit(s) {
  return createHash('sha256').update(s).digest().readUInt32BE(0) / 2 ** 32
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const quantile = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length ? s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] : null
}
const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null)

/** Reply tokens the provider gives a call: log-uniform in [min, max], by session and turn. */
export function replyTokens(o, session, messages) {
  return Math.round(o.replyMin * (o.replyMax / o.replyMin) ** unit(`${session}:${messages}`))
}
/** How long the provider takes over a call after admitting it, ms. */
const callMs = (o, reply) => o.ttft + (reply / o.rate) * 1000
const thinkMs = (o, name, turn) => (o.thinkMin + (o.thinkMax - o.thinkMin) * unit(`think:${name}:${turn}`)) * 1000

/**
 * The agents: agent i replays claude-code sequence i % 4; its name is in its first user
 * message (so its conversation, and its cache past the shared tools and system prompt, is its
 * own) and in metadata.user_id; system prompt and tools as the corpus has them (shared).
 */
export function fleetAgents(o, prefix = 'cc') {
  const seqs = generateCorpus().filter((s) => s.pattern === 'claude-code')
  return Array.from({ length: o.agents }, (_, i) => {
    const seq = seqs[i % seqs.length]
    const name = prefix === 'cc' ? `cc-${i + 1}` : prefix
    // A fixed session id per agent (UUID-shaped): the same replies in every run and mode.
    const h = createHash('sha256').update(`session:${name}`).digest('hex')
    const session = `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`
    const bodies = []
    for (let t = 0; t < o.turns; t++) {
      const round = Math.floor(t / seq.turns.length) // past the sequence's end: a new conversation
      const body = structuredClone(seq.turns[t % seq.turns.length].body)
      const first = body.messages[0].content[1]
      first.text = `[${name}${round ? ` #${round + 1}` : ''}] ${first.text}`
      body.metadata.user_id = JSON.stringify({ device_id: createHash('sha256').update(name).digest('hex'), session_id: session })
      bodies.push(JSON.stringify(body))
    }
    return { name, sequence: seq.name, session, bodies, path: seq.path }
  })
}

function claudeCodeHeaders(agent) {
  return {
    'content-type': 'application/json',
    accept: 'application/json',
    'x-api-key': 'sk-ant-fleet-measure',
    'anthropic-version': '2023-06-01',
    'anthropic-beta':
      'claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,advanced-tool-use-2025-11-20,effort-2025-11-24',
    'anthropic-dangerous-direct-browser-access': 'true',
    'x-app': 'cli',
    'user-agent': 'claude-cli/2.1.332 (external, sdk-cli)',
    'x-claude-code-session-id': agent.session,
    'x-stainless-lang': 'js',
    'x-stainless-package-version': '0.70.0',
    'x-stainless-runtime': 'node',
    'x-stainless-timeout': '600',
  }
}

/**
 * What the fleet asks of the input limit when nothing holds it back: each agent's bodies run
 * once through an unlimited mock in bpe mode, in order (the prompt cache as it will be: tools
 * and system shared, the rest per agent), for the tokens each call is charged (input + cache
 * creation); the pacing unthrottled is ttft + reply / rate + think per turn.
 */
export async function fleetDemand(o, agents) {
  const mock = await startMockProvider({ counting: 'bpe', replyTokens: 1, chunkDelayMs: 0 })
  try {
    const charged = []
    for (const a of agents) {
      const row = []
      for (const body of a.bodies) {
        const r = await fetch(`${mock.url}${a.path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'k', 'anthropic-version': '2023-06-01' }, body })
        await r.text()
        row.push(mock.log.at(-1).inputTokens)
      }
      charged.push(row)
    }
    let all = 0
    let steady = 0
    const perAgent = agents.map((a, i) => {
      const ms = a.bodies.map((b, t) => callMs(o, replyTokens(o, a.session, JSON.parse(b).messages.length)) + thinkMs(o, a.name, t))
      const tokens = charged[i].reduce((x, y) => x + y, 0)
      const total = ms.reduce((x, y) => x + y, 0)
      all += (tokens / total) * 60_000
      // Steady: without the first turn (the cold call that writes the cache).
      if (a.bodies.length > 1) steady += ((tokens - charged[i][0]) / (total - ms[0])) * 60_000
      return { tokens, ms: total }
    })
    const flat = charged.flat()
    return {
      perMinute: Math.round(all),
      steadyPerMinute: Math.round(steady),
      firstCallMean: Math.round(mean(charged.map((r) => r[0]))),
      laterCallMean: Math.round(mean(charged.flatMap((r) => r.slice(1)))),
      callMean: Math.round(mean(flat)),
      unthrottledTurnMs: Math.round(mean(perAgent.map((p) => p.ms / o.turns))),
      charged,
    }
  } finally {
    await mock.close()
  }
}


/**
 * The provider: the mock, behind a front that sets each generation call's reply length and
 * time and records when each call arrived; `calls` holds one entry per request the mock saw.
 */
export async function startProvider(o, clock) {
  const calls = []
  const byId = new Map()
  const mock = await startMockProvider({
    counting: 'bpe',
    inputTokensPerMinute: o.itpm,
    outputTokensPerMinute: o.otpm,
    requestsPerMinute: o.rpm,
    concurrency: o.concurrency,
    chunkDelayMs: CHUNK_DELAY_MS,
    recordHeaders: true,
    onRequest: (e) => {
      const c = byId.get(e.headers?.['x-fleet-call'])
      if (!c) return
      c.end = performance.now() - clock.t0
      c.status = e.status
      c.limit = e.limit ?? null
      c.inputTokens = e.inputTokens
      c.outputTokens = e.outputTokens
      c.cacheRead = e.cacheReadInputTokens ?? 0
      c.cacheCreation = e.cacheCreationInputTokens ?? 0
    },
  })
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 })
  let n = 0
  const front = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const body = Buffer.concat(chunks)
      const headers = { ...req.headers }
      delete headers.host
      delete headers['content-length']
      headers['content-length'] = String(body.length)
      const session = req.headers['x-claude-code-session-id'] ?? ''
      if (req.method === 'POST' && req.url.startsWith('/v1/messages') && !req.url.startsWith('/v1/messages/count_tokens')) {
        let messages = 0
        try {
          messages = JSON.parse(body).messages.length
        } catch {}
        const reply = replyTokens(o, session, messages)
        const id = String(++n)
        headers['x-mock-reply-tokens'] = String(reply)
        headers['x-mock-delay-ms'] = String(Math.max(0, Math.round(callMs(o, reply) - (STREAM_DELTAS + 1) * CHUNK_DELAY_MS)))
        headers['x-fleet-call'] = id
        const c = { id, session, messages, reply, arrive: performance.now() - clock.t0, end: null, status: null }
        calls.push(c)
        byId.set(id, c)
      }
      const up = http.request({ host: '127.0.0.1', port: mock.port, method: req.method, path: req.url, headers, agent }, (r) => {
        res.writeHead(r.statusCode, r.headers)
        r.pipe(res)
      })
      up.on('error', () => res.destroy())
      res.on('close', () => {
        if (!res.writableFinished) up.destroy()
      })
      up.end(body)
    })
  })
  await new Promise((r) => front.listen(0, '127.0.0.1', r))
  return {
    url: `http://127.0.0.1:${front.address().port}`,
    mock,
    calls,
    async close() {
      front.closeAllConnections?.()
      await new Promise((r) => front.close(r))
      agent.destroy()
      await mock.close()
    },
  }
}

function workerdBinary() {
  if (process.env.WORKERD) return process.env.WORKERD
  const req = createRequire(new URL('../../../testing/package.json', import.meta.url))
  return req('workerd').default
}

/** Starts `tokenwarden serve` on a free loopback port against `upstream`. */
export async function startServe(o, upstream) {
  const data = mkdtempSync(join(tmpdir(), 'tokenwarden-claude-fleet-'))
  const config = join(data, 'tokenwarden.json')
  const pool = { name: MODEL, input_tokens_per_minute: o.itpm, output_tokens_per_minute: o.otpm, requests_per_minute: o.rpm, max_concurrent: o.concurrency }
  const quotaConfig = { pools: [pool] }
  if (o.margin) quotaConfig.margin = { start_permille: o.margin, ceiling_permille: o.margin }
  writeFileSync(config, JSON.stringify({ fleets: { fleet: { secret: SECRET, proxy_open: true, quotas: { anthropic: { upstream, config: quotaConfig } } } } }))
  const port = await freePort()
  const child = spawn(process.execPath, [o.cli ?? cli, 'serve', '--config', config, '--port', String(port), '--data', join(data, 'state')], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, WORKERD: workerdBinary() },
  })
  let out = ''
  try {
    await new Promise((resolve, reject) => {
      child.stdout.on('data', (d) => {
        out += d
        if (out.includes('Ctrl-C stops it')) resolve()
      })
      child.stderr.on('data', (d) => {
        out += d
      })
      child.on('exit', (code) => reject(new Error(`serve exited (${code}) before it was ready: ${out}`)))
    })
  } catch (e) {
    rmSync(data, { recursive: true, force: true })
    throw e
  }
  child.removeAllListeners('exit')
  const origin = `http://127.0.0.1:${port}`
  return {
    origin,
    base: (agent) => `${origin}/v1/fleets/fleet/quotas/anthropic/agents/${agent}/worker/anthropic`,
    async metrics() {
      const r = await fetch(`${origin}/v1/fleets/fleet/quotas/anthropic/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })
      return r.json()
    },
    async close() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r))
        child.kill('SIGINT')
        const t = setTimeout(() => child.kill('SIGKILL'), 10_000)
        await exited
        clearTimeout(t)
      }
      rmSync(data, { recursive: true, force: true })
    },
  }
}

/** One streamed call, read to its end: { status, ok, ms, retryAfter, text }. */
async function send(url, headers, body, signal, f = fetch) {
  const r = await f(url, { method: 'POST', headers, body, signal })
  if (r.status !== 200) return { status: r.status, ok: false, retryAfter: Number(r.headers.get('retry-after') ?? 1), text: (await r.text()).slice(0, 300) }
  const reader = r.body.getReader()
  const dec = new TextDecoder()
  let tail = ''
  for (let c = await reader.read(); !c.done; c = await reader.read()) tail = (tail + dec.decode(c.value, { stream: true })).slice(-400)
  return { status: 200, ok: tail.includes('event: message_stop'), text: tail.slice(-200) }
}

/** The agents replay their turns; returns per-call records (agent side). */
async function runAgents(o, agents, baseOf, t0, fetchOf = () => fetch) {
  const records = []
  const deadline = o.duration * 1000
  const finished = []
  const cut = new AbortController()
  const cutTimer = setTimeout(() => cut.abort(), (o.duration + o.grace) * 1000 - (performance.now() - t0))
  await Promise.all(
    agents.map(async (a, i) => {
      const url = `${baseOf(a.name)}${a.path}`
      const headers = claudeCodeHeaders(a)
      const f = fetchOf(a.name, i)
      let t = 0
      for (; t < a.bodies.length && performance.now() - t0 < deadline; t++) {
        const rec = { agent: a.name, turn: t, messages: JSON.parse(a.bodies[t]).messages.length, start: performance.now() - t0, attempts: 0, seen429: 0, status: null, ok: false }
        for (;;) {
          rec.attempts++
          let res
          try {
            res = await send(url, { ...headers, 'x-stainless-retry-count': String(rec.attempts - 1) }, a.bodies[t], cut.signal, f)
          } catch (e) {
            res = { status: cut.signal.aborted ? 'cut' : 0, ok: false, text: String(e) }
          }
          if (res.status === 'cut') {
            rec.status = 'cut'
            break
          }
          rec.status = res.status
          rec.ok = res.ok
          if (res.status === 429 && rec.attempts < MAX_ATTEMPTS) {
            rec.seen429++
            await sleep(res.retryAfter * 1000)
            continue
          }
          if (res.status === 429) rec.seen429++
          if (!res.ok) rec.error = res.text
          break
        }
        rec.end = performance.now() - t0
        records.push(rec)
        if (rec.status === 'cut') break
        if (!rec.ok) break // an agent whose call failed stops (as Claude Code ends its turn)
        await sleep(thinkMs(o, a.name, t))
      }
      finished[i] = { agent: a.name, turns: records.filter((r) => r.agent === a.name && r.ok).length, at: performance.now() - t0 }
    }),
  )
  clearTimeout(cutTimer)
  return { records, finished }
}

/** Provider-side figures from the calls the mock saw. */
function providerFigures(o, calls, records, finished, wallMs, sessions) {
  const ok = calls.filter((c) => c.status === 200)
  const minutes = []
  for (let m = 0; m * 60_000 < wallMs; m++) {
    const inMin = ok.filter((c) => c.arrive >= m * 60_000 && c.arrive < (m + 1) * 60_000)
    const tokens = inMin.reduce((s, c) => s + c.inputTokens, 0)
    const span = Math.min(60_000, wallMs - m * 60_000)
    minutes.push({ minute: m + 1, inputTokens: tokens, outputTokens: inMin.reduce((s, c) => s + c.outputTokens, 0), calls: inMin.length, spanS: Math.round(span / 1000), shareOfLimit: tokens / o.itpm / (span / 60_000) })
  }
  // After the first minute, while every agent still has turns to play (the fleet's demand
  // holds): input charged per minute against the limit.
  const windowEnd = Math.min(...finished.map((f) => f.at))
  const inWindow = ok.filter((c) => c.arrive >= 60_000 && c.arrive < windowEnd)
  const windowMin = Math.max(0, windowEnd - 60_000) / 60_000
  const windowShare = windowMin > 0 ? inWindow.reduce((s, c) => s + c.inputTokens, 0) / o.itpm / windowMin : null
  // Concurrency at the provider: calls admitted and not yet finished, over time.
  const events = []
  for (const c of ok) {
    events.push([c.arrive, 1])
    events.push([c.end ?? wallMs, -1])
  }
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1])
  let cur = 0
  let peak = 0
  let area = 0
  let areaW = 0
  let last = 0
  let peakW = 0
  for (const [tm, d] of events) {
    area += cur * (tm - last)
    const a0 = Math.max(last, 60_000)
    const a1 = Math.min(tm, windowEnd)
    if (a1 > a0) areaW += cur * (a1 - a0)
    last = tm
    cur += d
    peak = Math.max(peak, cur)
    if (tm >= 60_000 && tm < windowEnd) peakW = Math.max(peakW, cur)
  }
  const outputs = ok.map((c) => c.outputTokens)
  const durations = ok.filter((c) => c.end).map((c) => c.end - c.arrive)
  // What the output limit allows: calls a minute it pays for (limit / mean output), each
  // holding a slot for the mean call time.
  const outputAllows = (o.otpm / mean(outputs)) * (mean(durations) / 60_000)
  // Queue wait: from the agent's send to the provider's arrival of that call's first try.
  const firstArrival = new Map()
  for (const c of calls) {
    const k = `${c.session}:${c.messages}`
    if (!firstArrival.has(k)) firstArrival.set(k, c.arrive)
  }
  return {
    providerRequests: calls.length,
    provider429: calls.filter((c) => c.status === 429).length,
    provider429ByLimit: Object.fromEntries(Object.entries(Object.groupBy(calls.filter((c) => c.status === 429), (c) => c.limit)).map(([k, v]) => [k, v.length])),
    provider200: ok.length,
    inputTokens: ok.reduce((s, c) => s + c.inputTokens, 0),
    outputTokens: outputs.reduce((s, x) => s + x, 0),
    cacheReadTokens: ok.reduce((s, c) => s + c.cacheRead, 0),
    minutes,
    window: { fromS: 60, toS: Math.round(windowEnd / 1000), shareOfLimit: windowShare, peakConcurrency: peakW, meanConcurrency: windowEnd > 60_000 ? areaW / (windowEnd - 60_000) : null },
    peakConcurrency: peak,
    meanConcurrency: area / wallMs,
    meanOutputPerCall: Math.round(mean(outputs)),
    p95OutputPerCall: quantile(outputs, 0.95),
    meanCallS: mean(durations) / 1000,
    outputAllowsConcurrency: outputAllows,
    queueWaitMs: (() => {
      const waits = records.map((r) => (firstArrival.get(`${sessions.get(r.agent)}:${r.messages}`) ?? r.end) - r.start)
      return { p50: Math.round(quantile(waits, 0.5)), p95: Math.round(quantile(waits, 0.95)), max: Math.round(Math.max(...waits)) }
    })(),
  }
}

function agentFigures(records, finished, wallMs) {
  const cut = records.filter((r) => r.status === 'cut')
  records = records.filter((r) => r.status !== 'cut')
  return {
    calls: records.length,
    cutAtEnd: cut.length,
    served: records.filter((r) => r.ok).length,
    failed: records.filter((r) => !r.ok).map((r) => ({ agent: r.agent, turn: r.turn, status: r.status, attempts: r.attempts, error: r.error })),
    refused400: records.filter((r) => r.status === 400).length,
    seen429: records.reduce((s, r) => s + r.seen429, 0),
    gaveUp429: records.filter((r) => r.status === 429).length,
    turnsPerAgent: finished.map((f) => f.turns),
    wallS: wallMs / 1000,
    lastAgentDoneS: Math.max(...finished.map((f) => f.at)) / 1000,
    firstAgentDoneS: Math.min(...finished.map((f) => f.at)) / 1000,
    callWallMs: { p50: Math.round(quantile(records.map((r) => r.end - r.start), 0.5)), p95: Math.round(quantile(records.map((r) => r.end - r.start), 0.95)) },
  }
}

/** One run: `mode` 'serve' (through tokenwarden serve) or 'direct' (to the provider). */
export async function runOnce(o, mode, agents) {
  const sessions = new Map(agents.map((a) => [a.name, a.session]))
  const clock = { t0: performance.now() }
  const provider = await startProvider(o, clock)
  let serve = null
  const samples = []
  let sampler = null
  try {
    if (mode === 'serve') serve = await startServe(o, provider.url)
    // --mode wrapper: the same coordinator in this process, through its fetch wrapper, each
    // settle recorded (what serve does not show: each call's reservation against its use).
    let tw = null
    const settles = []
    if (mode === 'wrapper') {
      const { createTokenwarden } = await import(o.wrapperModule)
      const pool = { name: MODEL, input_tokens_per_minute: o.itpm, output_tokens_per_minute: o.otpm, requests_per_minute: o.rpm, max_concurrent: o.concurrency }
      tw = createTokenwarden({ config: { pools: [pool], ...(o.margin ? { margin: { start_permille: o.margin, ceiling_permille: o.margin } } : {}) } })
      tw.on('settled', (e) => settles.push({ t: Math.round(performance.now() - clock.t0), agent: Number(e.agent), reserved: Number(e.settlement.reserved[0]), used: Number(e.settlement.used[0]), reservedOut: Number(e.settlement.reserved[1]), usedOut: Number(e.settlement.used[1]) }))
    }
    const wrapped = new Map()
    const fetchOf = (name, i) => {
      if (!tw) return fetch
      if (!wrapped.has(name)) wrapped.set(name, tw.fetch({ agent: i + 1 }))
      return wrapped.get(name)
    }
    if (o.warmup) {
      // Another agent's first call (its own conversation), then time for both limiters'
      // buckets to refill: the fleet starts on an estimator that has seen one settled call.
      const [w] = fleetAgents({ ...o, agents: 1, turns: 1 }, 'cc-warmup')
      const res = await send(`${serve ? serve.base(w.name) : provider.url}${w.path}`, claudeCodeHeaders(w), w.bodies[0])
      if (!res.ok) throw new Error(`the warm-up call failed: ${res.status} ${res.text}`)
      await sleep(60_000)
    }
    // The fleet's clock starts now (serve's start-up sent nothing to the provider: its
    // buckets are full).
    provider.calls.length = 0
    clock.t0 = performance.now()
    const tStart = clock.t0
    if (serve) {
      sampler = setInterval(async () => {
        try {
          const m = await serve.metrics()
          const p = m.pools[0]
          samples.push({
            t: Math.round(performance.now() - tStart),
            margin: p.marginPermille ?? p.margin_permille,
            inFlight: Number(p.inFlight ?? p.in_flight),
            queueDepth: p.queueDepth ?? p.queue_depth,
            binding: p.bindingAxis ?? p.binding_axis,
            axes: (p.axes ?? []).map((a) => ({ axis: a.axis, capacity: Number(a.capacity), available: Number(a.available) })),
          })
        } catch {}
      }, 2000)
    }
    const { records, finished } = await runAgents(o, agents, serve ? serve.base : () => provider.url, tStart, fetchOf)
    const wallMs = performance.now() - tStart
    clearInterval(sampler)
    sampler = null
    const result = { mode, provider: providerFigures(o, provider.calls, records, finished, wallMs, sessions), agents: agentFigures(records, finished, wallMs), mockStats: provider.mock.stats() }
    if (tw) {
      const m = tw.metrics()
      const byAgent = Object.groupBy(settles, (x) => x.agent)
      const err = (x) => (x.reserved - x.used) / x.used
      const nth = (k) => Object.values(byAgent).map((xs) => xs[k]).filter((x) => x && x.used > 0).map(err)
      const later = Object.values(byAgent).flatMap((xs) => xs.slice(2)).filter((x) => x.used > 0).map(err)
      result.wrapper = {
        settles,
        inputOverFirst: quantile(nth(0), 0.5),
        inputOverSecond: quantile(nth(1), 0.5),
        inputOverLater: quantile(later, 0.5),
        inputOverLaterP95: quantile(later, 0.95),
        agents: m.agents.map((a) => ({ agent: Number(a.agent), settled: Number(a.settled), inputErrorPermille: a.inputErrorPermille, inputBiasPermille: a.inputBiasPermille })),
      }
      tw.close()
    }
    if (serve) {
      const m = await serve.metrics()
      const p = m.pools[0]
      result.serve = {
        queueWaitP50Ms: p.queueWaitP50Ms ?? p.queue_wait_p50_ms,
        queueWaitP95Ms: p.queueWaitP95Ms ?? p.queue_wait_p95_ms,
        margin: p.marginPermille ?? p.margin_permille,
        marginReason: p.marginReason ?? null,
        underestimateP50Permille: p.underestimateP50Permille ?? null,
        headersAgreedAt: p.headersAgreedAt ?? null,
        margins: [...new Set(samples.map((s) => s.margin))],
        counters: p.counters,
        binding: samples.map((s) => s.binding),
        maxInFlight: Math.max(0, ...samples.map((s) => s.inFlight)),
        minOutputAvailable: Math.min(...samples.map((s) => s.axes.find((a) => a.axis === 'output_tokens' || a.axis === 'outputTokens')?.available ?? Infinity)),
        agents: (m.agents ?? []).map((a) => ({
          agent: a.agent,
          settled: Number(a.settled),
          inputErrorPermille: a.inputErrorPermille ?? a.input_error_permille,
          inputBiasPermille: a.inputBiasPermille ?? a.input_bias_permille,
          outputErrorPermille: a.outputErrorPermille ?? a.output_error_permille,
          outputBiasPermille: a.outputBiasPermille ?? a.output_bias_permille,
          alerting: a.alerting,
        })),
        samples,
        raw: m,
      }
    }
    return result
  } finally {
    if (sampler) clearInterval(sampler)
    await serve?.close()
    await provider.close()
  }
}

const pct = (x) => (x === null || x === undefined || Number.isNaN(x) ? 'n/a' : `${(x * 100).toFixed(1)} %`)

function report(o, demand, runs) {
  const lines = []
  lines.push(`fleet: ${o.agents} agents × ${o.turns} turns (claude-code corpus, 3 agents per sequence), think ${o.thinkMin}–${o.thinkMax} s, replies ${o.replyMin}–${o.replyMax} tokens (log-uniform) at ${o.rate} tok/s after ${o.ttft} ms`)
  if (o.warmup) lines.push('warm-up: one call by another agent, then 60 s, before the fleet starts')
  lines.push(`demand: ${demand.perMinute} input tokens/min over the run unthrottled (${demand.steadyPerMinute}/min after each agent's first call; first call ${demand.firstCallMean} charged, later ${demand.laterCallMean}; turn ${(demand.unthrottledTurnMs / 1000).toFixed(1)} s) → ITPM ${o.itpm} (${(demand.steadyPerMinute / o.itpm).toFixed(2)}× steady demand), OTPM ${o.otpm}, RPM ${o.rpm}, concurrency ${o.concurrency}${o.margin ? `, margin ${o.margin}‰` : ''}`)
  for (const r of runs) {
    const p = r.provider
    const a = r.agents
    lines.push(`-- ${r.mode}: wall ${a.wallS.toFixed(1)} s (agents done ${a.firstAgentDoneS.toFixed(0)}–${a.lastAgentDoneS.toFixed(0)} s), calls ${a.calls} (+ ${a.cutAtEnd} still unanswered at ${o.duration + o.grace} s, cut), served ${a.served}, failed ${a.failed.length} (400: ${a.refused400}, gave up on 429: ${a.gaveUp429}); turns/agent ${a.turnsPerAgent.join(',')}`)
    lines.push(`   provider: ${p.providerRequests} requests, ${p.provider429} 429s ${JSON.stringify(p.provider429ByLimit)}, 429s the agents saw ${a.seen429}; input ${p.inputTokens} charged (cache reads ${p.cacheReadTokens}), output ${p.outputTokens}`)
    lines.push(`   input per minute: ${p.minutes.map((m) => `m${m.minute} ${m.inputTokens} (${pct(m.shareOfLimit)}${m.spanS < 60 ? `, ${m.spanS} s` : ''})`).join('; ')}`)
    lines.push(`   after the first minute while all agents are active (${p.window.fromS}–${p.window.toS} s): ${pct(p.window.shareOfLimit)} of the input limit; concurrency peak ${p.window.peakConcurrency}, mean ${p.window.meanConcurrency?.toFixed(2)}`)
    lines.push(`   concurrency at the provider: peak ${p.peakConcurrency}, mean ${p.meanConcurrency.toFixed(2)} (max_concurrent ${o.concurrency}); output allows ${p.outputAllowsConcurrency.toFixed(1)} (${o.otpm}/min ÷ ${p.meanOutputPerCall} tokens/call × ${p.meanCallS.toFixed(1)} s/call); output p95 ${p.p95OutputPerCall}`)
    lines.push(`   wait before the provider (agent side): p50 ${p.queueWaitMs.p50} ms, p95 ${p.queueWaitMs.p95} ms, max ${p.queueWaitMs.max} ms; call wall p50 ${a.callWallMs.p50} ms, p95 ${a.callWallMs.p95} ms`)
    if (r.wrapper) lines.push(`   reservation over use (input, median): first call ${pct(r.wrapper.inputOverFirst)}, second ${pct(r.wrapper.inputOverSecond)}, later ${pct(r.wrapper.inputOverLater)} (p95 ${pct(r.wrapper.inputOverLaterP95)})`)
    if (r.serve) {
      const s = r.serve
      const errs = s.agents.map((x) => x.inputErrorPermille / 10)
      const bias = s.agents.map((x) => x.inputBiasPermille / 10)
      lines.push(`   serve: queue wait p50 ${s.queueWaitP50Ms} ms, p95 ${s.queueWaitP95Ms} ms; margin ${s.margins.join(' → ')}‰ (last moved: ${s.marginReason ?? 'never'}; pool underestimate p50 ${s.underestimateP50Permille ?? 'n/a'}‰, headers agreed at ${s.headersAgreedAt ?? 'never'}); binding ${[...new Set(s.binding)].join('/')}; in flight max ${s.maxInFlight}; output available min ${s.minOutputAvailable}; counters ${JSON.stringify(s.counters)}`)
      lines.push(`   estimate error (agents' input_error / bias, %): median ${quantile(errs, 0.5)} / ${quantile(bias, 0.5)}, range ${Math.min(...errs)}–${Math.max(...errs)} / ${Math.min(...bias)}–${Math.max(...bias)}; alerting ${s.agents.filter((x) => x.alerting).length}`)
    }
  }
  return lines.join('\n')
}

export async function main(argv) {
  const o = { ...DEFAULTS }
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase())
    if (!(k in o)) throw new Error(`unknown flag ${argv[i]}`)
    const v = argv[++i]
    o[k] = typeof DEFAULTS[k] === 'number' ? Number(v) : k === 'quiet' ? v === 'true' : v
  }
  const agents = fleetAgents(o)
  const demand = await fleetDemand(o, agents)
  if (!o.itpm) o.itpm = Math.round(demand.steadyPerMinute / 2 / 500) * 500
  const runs = []
  for (const mode of o.mode === 'both' ? ['serve', 'direct'] : [o.mode]) {
    if (!o.quiet) console.error(`# ${mode} run…`)
    runs.push(await runOnce(o, mode, agents))
  }
  const text = report(o, demand, runs)
  if (!o.quiet) console.log(text)
  if (o.json) writeFileSync(o.json, JSON.stringify({ options: o, demand: { ...demand, charged: undefined }, runs }, null, 1))
  return { options: o, demand, runs, text }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(e)
    process.exit(1)
  })
}
