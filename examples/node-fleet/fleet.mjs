// The fleet: who the agents are, what their prompts look like, and the loop each one runs
// (think → call the model through the official SDK → think …).
//
// Every agent has its own Anthropic client whose `fetch` is `tw.fetch({ agent, role, unblocks })`,
// so every model call leases capacity first, waits in the fair queue when the key is busy,
// and settles what it really used afterwards. The agents themselves know nothing about
// rate limits: their code is what it would be without tokenwarden (plus `maxRetries: 0`).

import Anthropic from '@anthropic-ai/sdk'
import { agentIdFor } from 'tokenwarden'

/** The model every agent calls; the pool is named after it. */
export const MODEL = 'claude-sonnet-4-6'

/**
 * Time `speed` times faster than the wall clock, for a measurement run: `now()` in
 * provider milliseconds (for the mock provider's buckets and tokenwarden alike), the
 * tokenwarden `clock` option on it (reset instants in headers stay on the wall clock), and
 * `sleep(ms)` in provider milliseconds.
 */
export function fastClock(speed) {
  const t0 = performance.now()
  const now = () => Math.floor((performance.now() - t0) * speed)
  const clock = {
    now,
    unixNow: () => Date.now(),
    setTimer: (fn, ms) => setTimeout(fn, Math.max(0, ms / speed)),
    clearTimer: (h) => clearTimeout(h),
    keepAlive: (h, alive) => (alive ? h.ref?.() : h.unref?.()),
  }
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms / speed))
  return { now, clock, sleep }
}

/** The key of the mixed-fleet measurements (`mixed.mjs`, `shares.mjs`), after the fleet that found starved big calls: input binds. */
export const MIXED_LIMITS = { input: 120_000, output: 12_000, requests: 90, concurrent: 10 }

/** The mock provider and a tokenwarden pool on `MIXED_LIMITS`, on a `fastClock`'s `now` and `clock`. */
export async function mixedKey({ now, clock, seed, startMockProvider, createTokenwarden, maxQueueWaitMs = 600_000, quantumPermille }) {
  const l = MIXED_LIMITS
  const provider = await startMockProvider({
    inputTokensPerMinute: l.input,
    outputTokensPerMinute: l.output,
    requestsPerMinute: l.requests,
    concurrency: l.concurrent,
    chunkDelayMs: 2,
    now,
  })
  const tw = createTokenwarden({
    config: {
      pools: [{ name: MODEL, input_tokens_per_minute: l.input, output_tokens_per_minute: l.output, requests_per_minute: l.requests, max_concurrent: l.concurrent }],
      max_queue_wait_ms: maxQueueWaitMs,
      ...(quantumPermille === undefined ? {} : { weights: { quantum_permille: quantumPermille } }),
    },
    seed,
    clock,
  })
  return { provider, tw }
}

/**
 * One agent of a measurement fleet (`shares.mjs`, `promises.mjs`) in a closed loop on the
 * official SDK through `tw.fetch()`: think 0.5-2 s, then its next call — every fourth big
 * (10-20k input tokens, max_tokens 2000), the others 500-2,000 tokens with max_tokens 300,
 * the reply `reply(maxTokens)` tokens, half streamed — until `running()` is false. Each
 * completed call is pushed to `records` (`agent`, `role`, `big`, `started`, `sent`, `done`,
 * `input`, `output`, provider ms); a 429 or another error that reaches it is counted in
 * `failures` (`rateLimited`, `errors`), the first three printed.
 */
export async function loopAgent({ i, role, name, tw, provider, now, sleep, random, reply, records, failures, running }) {
  let sentAt = null
  const client = new Anthropic({
    apiKey: 'sk-mock',
    baseURL: provider.url,
    maxRetries: 0,
    fetch: tw.fetch({
      agent: name,
      role,
      fetch: (input, init) => {
        sentAt = now()
        return globalThis.fetch(input, init)
      },
    }),
  })
  for (let n = 0; running(); n++) {
    await sleep(500 + random.next() * 1_500)
    if (!running()) break
    const big = (n + i) % 4 === 0
    const input = big ? random.int(10_000, 20_000) : random.int(500, 2_000)
    const maxTokens = big ? 2_000 : 300
    const params = { model: MODEL, max_tokens: maxTokens, messages: [{ role: 'user', content: promptText(input, random, `${name} call ${n}`) }] }
    const started = now()
    sentAt = null
    try {
      const options = { headers: { 'x-mock-reply-tokens': String(reply(maxTokens)) } }
      const message = n % 2 === 0 ? await client.messages.stream(params, options).finalMessage() : await client.messages.create(params, options)
      records.push({ agent: i, role, big, started, sent: sentAt ?? now(), done: now(), input: message.usage.input_tokens, output: message.usage.output_tokens })
    } catch (e) {
      if (e?.status === 429) failures.rateLimited++
      else failures.errors++
      if (failures.errors + failures.rateLimited <= 3) console.error(`${name}: ${e?.message ?? e}`)
    }
  }
}

/** A small seeded PRNG (xorshift32), so a seed replays the same prompt sizes. */
export function rng(seed) {
  let x = (seed >>> 0) || 0x9e3779b9
  const next = () => {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    return x / 0x1_0000_0000
  }
  return {
    next,
    /** An integer in [lo, hi]. */
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
  }
}

const LINES = [
  'export function parseConfig(input: string): Config {',
  '  const fields = input.split("\\n").map((line) => line.trim())',
  '  if (fields.length === 0) throw new Error("empty configuration")',
  '  for (const [key, value] of Object.entries(defaults)) merged[key] ??= value',
  '  return { ...merged, version: CURRENT_VERSION, source: path }',
  '}',
  '// FAIL src/config.test.ts > parseConfig > keeps unknown keys',
  '//   expected { retries: 3 } to deeply equal { retries: 3, extra: true }',
  'import { describe, expect, it } from "vitest"',
  '  it("rejects a negative timeout", () => expect(() => parse("-1")).toThrow())',
  'diff --git a/src/queue.ts b/src/queue.ts',
  '-    if (this.items.length > this.limit) return false',
  '+    if (this.items.length >= this.limit) return false',
  '  async flush(): Promise<void> { await Promise.all(this.pending.splice(0)) }',
  'error TS2345: Argument of type "string | undefined" is not assignable to "string".',
]

/**
 * Prompt text of about `tokens` tokens (the mock counts ceil(UTF-8 bytes / 4), as a rule of
 * thumb for English and code): source lines, test output and diffs, numbered so no two
 * prompts are alike.
 */
export function promptText(tokens, random, header) {
  const target = tokens * 4
  const parts = [header]
  let bytes = header.length
  let n = random.int(1, 9000)
  while (bytes < target) {
    const line = `${String(n++).padStart(5)}  ${LINES[random.int(0, LINES.length - 1)]}\n`
    parts.push(line)
    bytes += line.length
  }
  return parts.join('').slice(0, target)
}

/**
 * The fleet for `count` agents, after the design's "20 agents from one push": a planner
 * whose plan unblocks 6 repair agents, 4 refactor agents with large prompts, and lint-style
 * workers with small ones. With 20 agents: 1 planner, 6 repair, 9 lint, 4 refactor.
 *
 * - `kind` says what the agent does; `role` is what tokenwarden weighs (planner 3, worker 1).
 * - `prompt`: input tokens per turn [lo, hi]; `reply`: output tokens [lo, hi];
 *   `maxTokens`: the call's max_tokens (the output reservation, refunded on settle).
 * - `call`: how the SDK is used: 'stream' = `messages.stream()`, 'sse' = `messages.create({
 *   stream: true })` iterated, 'json' = a plain `messages.create()`.
 * - `think`: ms of local work (read, edit, run tests) between turns [lo, hi].
 */
export function fleetSpec(count) {
  const specs = []
  if (count < 1) return specs
  specs.push({
    name: 'planner',
    kind: 'planner',
    role: 'planner',
    prompt: [4000, 6000],
    reply: [300, 600],
    maxTokens: 1024,
    call: 'stream',
    think: [200, 600],
  })
  const rest = count - 1
  const refactor = Math.round(count / 5)
  const repair = Math.min(6, rest - refactor)
  const lint = rest - refactor - repair
  for (let i = 1; i <= repair; i++) {
    specs.push({
      name: `repair-${i}`,
      kind: 'repair',
      role: 'worker',
      prompt: [4000, 8000],
      reply: [200, 500],
      maxTokens: 1024,
      call: 'stream',
      think: [500, 2000],
      blockedOnPlanner: true,
    })
  }
  for (let i = 1; i <= lint; i++) {
    specs.push({
      name: `lint-${i}`,
      kind: 'lint',
      role: 'worker',
      prompt: [2000, 4000],
      reply: [100, 300],
      maxTokens: 512,
      call: 'json',
      think: [500, 2500],
    })
  }
  for (let i = 1; i <= refactor; i++) {
    specs.push({
      name: `refactor-${i}`,
      kind: 'refactor',
      role: 'worker',
      prompt: [18000, 22000],
      reply: [800, 1600],
      maxTokens: 2048,
      call: 'sse',
      think: [1000, 3000],
    })
  }
  return specs
}

/** Sleeps `ms`, or less if `signal` aborts. */
function pause(ms, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve()
    const done = () => {
      clearTimeout(timer)
      signal.removeEventListener('abort', done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    signal.addEventListener('abort', done, { once: true })
  })
}

/**
 * One agent: its spec, its SDK client, and what it has done so far. `state` is the agent's
 * own view ('starting', 'thinking', 'blocked', 'calling', 'done'); while 'calling', the
 * coordinator's metrics say whether the call is queued or in flight.
 */
export class Agent {
  constructor(spec, { tw, baseURL, seed, fleet }) {
    this.spec = spec
    this.name = spec.name
    this.role = spec.role
    this.fleet = fleet
    this.random = rng(seed)
    this.state = 'starting'
    this.turnsDone = 0
    this.calls = 0
    this.ok = 0
    this.rateLimitedErrors = 0
    this.otherErrors = 0
    this.lastError = null
    this.inputTokens = 0
    this.outputTokens = 0
    this.streamed = 0
    this.withdrawn = 0
    this.interrupted = 0
    this.call = null
    this.granted = false
    // The planner's calls unblock the repair agents that are waiting for its next plan.
    const unblocks = spec.kind === 'planner' ? () => fleet.blockedOnPlanner() : 0
    this.client = new Anthropic({
      apiKey: 'test-key',
      baseURL,
      fetch: tw.fetch({ agent: spec.name, role: spec.role, unblocks }),
      // tokenwarden retries a 429 itself, in line with the rest of the fleet.
      maxRetries: 0,
    })
  }

  /** Whether the agent has turns left. */
  wantsMore() {
    return this.turnsDone < this.fleet.turns && !this.fleet.stopping()
  }

  /** Runs turns until `fleet.turns` are done, the deadline passes, or `signal` aborts. */
  async run(signal) {
    const [lo, hi] = this.spec.think
    // Agents from one push start together, give or take a few hundred ms.
    this.state = 'thinking'
    await pause(this.random.int(0, 300), signal)
    while (this.wantsMore() && !signal.aborted) {
      if (this.spec.blockedOnPlanner) {
        this.state = 'blocked'
        await this.fleet.planReady(this.turnsDone + 1, signal)
        if (!this.wantsMore() || signal.aborted) break
      }
      this.state = 'calling'
      // A call withdrawn at the deadline (or cut by an interrupt) is not a turn taken.
      if (!(await this.turn(signal))) break
      this.turnsDone++
      if (this.spec.kind === 'planner') this.fleet.planned(this.turnsDone)
      if (!this.wantsMore()) break
      this.state = 'thinking'
      await pause(this.random.int(lo, hi), signal)
    }
    this.state = 'done'
    if (this.spec.kind === 'planner') this.fleet.planned(Number.POSITIVE_INFINITY)
  }

  /**
   * One model call, made the way an agent harness would make it. False when the call was
   * withdrawn at the deadline or cut short by an interrupt.
   */
  async turn(signal) {
    const { spec, random } = this
    const tokens = random.int(spec.prompt[0], spec.prompt[1])
    const reply = random.int(spec.reply[0], spec.reply[1])
    const system = `You are ${spec.name}, a ${spec.kind} agent in a CI fleet. Turn ${this.turnsDone + 1}.`
    const params = {
      model: MODEL,
      max_tokens: spec.maxTokens,
      system,
      messages: [
        {
          role: 'user',
          content: promptText(tokens - Math.ceil(system.length / 4), random, `Task for ${spec.name}:\n`),
        },
      ],
    }
    // This call's own abort: the deadline withdraws calls that are still queued.
    const call = new AbortController()
    this.call = call
    this.granted = false
    const options = {
      signal: AbortSignal.any([signal, call.signal]),
      // The mock's knobs: how long the reply is, and the time to first token.
      headers: { 'x-mock-reply-tokens': String(reply), 'x-mock-delay-ms': String(this.latency(reply)) },
    }
    this.calls++
    try {
      let usage
      if (spec.call === 'stream') {
        const stream = this.client.messages.stream(params, options)
        const message = await stream.finalMessage()
        usage = message.usage
        this.streamed++
      } else if (spec.call === 'sse') {
        const events = await this.client.messages.create({ ...params, stream: true }, options)
        usage = { input_tokens: 0, output_tokens: 0 }
        for await (const event of events) {
          if (event.type === 'message_start') usage.input_tokens = event.message.usage.input_tokens
          else if (event.type === 'message_delta') usage.output_tokens = event.usage.output_tokens
        }
        this.streamed++
      } else {
        const message = await this.client.messages.create(params, options)
        usage = message.usage
      }
      this.ok++
      this.inputTokens += usage.input_tokens
      this.outputTokens += usage.output_tokens
    } catch (err) {
      if (signal.aborted) {
        this.interrupted++
        return false
      }
      if (call.signal.aborted) {
        this.withdrawn++
        return false
      }
      if (err instanceof Anthropic.RateLimitError || err?.status === 429) this.rateLimitedErrors++
      else this.otherErrors++
      this.lastError = err?.message ?? String(err)
      this.fleet.onError(this, err)
    }
    return true
  }

  /** Time to first token the mock should take, ms: non-streamed replies take it all at once. */
  latency(reply) {
    const base = this.random.int(150, 400)
    return this.spec.call === 'json' ? base + reply * 3 : base
  }
}

/**
 * The fleet: the agents plus the planner → repair dependency and the stop condition.
 * `turns` may be Infinity (then `deadline` ends the run).
 */
export class Fleet {
  constructor({ tw, baseURL, count, turns, deadline, seed }) {
    this.turns = turns
    this.deadline = deadline
    this.errors = []
    this.planTurns = 0
    this.planWaiters = []
    this.agents = fleetSpec(count).map(
      (spec, i) => new Agent(spec, { tw, baseURL, seed: (seed * 7919 + i * 104729) >>> 0, fleet: this }),
    )
    const byId = new Map(this.agents.map((a) => [agentIdFor(a.name), a]))
    tw.on('granted', (e) => {
      const agent = byId.get(Number(e.agent))
      if (agent !== undefined) agent.granted = true
    })
  }

  stopping() {
    return this.deadline !== null && performance.now() >= this.deadline
  }

  /**
   * At the deadline: no agent starts another turn, and calls still waiting in the queue are
   * withdrawn (aborting the SDK call withdraws its ticket); calls in flight finish.
   */
  withdrawQueued() {
    for (const a of this.agents) {
      if (a.state === 'calling' && !a.granted && a.call !== null) a.call.abort(new Error('deadline'))
    }
  }

  /** Repair agents whose next turn waits for a plan the planner has not produced yet. */
  blockedOnPlanner() {
    let n = 0
    for (const a of this.agents) {
      if (a.spec.blockedOnPlanner && a.state !== 'done' && a.turnsDone + 1 > this.planTurns) n++
    }
    return n
  }

  /** Resolves once the planner has finished `turn` turns (or stopped, or `signal` aborts). */
  planReady(turn, signal) {
    if (this.planTurns >= turn || !this.agents.some((a) => a.spec.kind === 'planner')) return Promise.resolve()
    return new Promise((resolve) => {
      const waiter = { turn, resolve }
      this.planWaiters.push(waiter)
      signal.addEventListener('abort', () => resolve(), { once: true })
      // Duration runs: a planner that stops at the deadline releases nobody; time does.
      if (this.deadline !== null) setTimeout(resolve, Math.max(0, this.deadline - performance.now())).unref()
    })
  }

  planned(turns) {
    this.planTurns = turns
    this.planWaiters = this.planWaiters.filter((w) => {
      if (w.turn > turns) return true
      w.resolve()
      return false
    })
  }

  onError(agent, err) {
    this.errors.push({ agent: agent.name, status: err?.status ?? null, message: err?.message ?? String(err) })
  }

  async run(signal) {
    let timer = null
    if (this.deadline !== null) {
      timer = setTimeout(() => this.withdrawQueued(), Math.max(0, this.deadline - performance.now()))
    }
    try {
      await Promise.all(this.agents.map((a) => a.run(signal)))
    } finally {
      clearTimeout(timer)
    }
  }
}
