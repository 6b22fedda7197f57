/**
 * A `fetch` for the official SDKs: `new Anthropic({ fetch: tw.fetch(), maxRetries: 0 })`,
 * `new OpenAI({ fetch: tw.fetch(), maxRetries: 0 })`.
 *
 * For each model call it finds the provider, model and pool from the request, estimates
 * input tokens, reserves `max_tokens` of output, leases (waiting in the fair queue if need
 * be), forwards, resyncs from the response headers, and settles from the usage in the JSON
 * body or the SSE stream, when the stream ends (the lease holds its concurrency slot until
 * then). It is a loop over the core's call lifecycle: the core says when to send, how long
 * to wait (with a `waiting` event: "waiting on rate limit, retrying in N s"), which
 * responses to retry and when to give up; a call that ends without usage is charged by the
 * core's conservative rule. Other requests (token counting, model lists) pass through
 * untouched. API keys are never read, logged or put in
 * events or errors.
 */
import { sleep } from './clock.js'
import type { Driver, Lease } from './driver.js'
import { LeaseRejectedError, TokenwardenError } from './errors.js'
import type { Estimate, Estimator } from './estimator.js'
import {
  type Provider,
  SseUsage,
  callShape,
  detectProvider,
  promptTokens,
  usageFromBody,
} from './providers.js'
import { type CallStep, type Role, type U64, type Usage, newCall } from './types.js'

/** Options for one wrapped `fetch` (one agent). */
export interface FetchOptions {
  /** Which agent this client is: a number, or a name (hashed). Default: a fresh id. */
  agent?: U64 | string
  /** The agent's role in the task graph (default `worker`). */
  role?: Role
  /** Downstream tasks waiting on this agent's calls; a function is read at every call. */
  unblocks?: number | (() => number)
  /**
   * The task every call of this client is for (a number, or a name: hashed with
   * `taskIdFor`); its role, unblocks and failures then set the weight, and it is charged
   * the calls' tokens and waits. `tw.task()` sets it.
   */
  task?: U64 | string
  /**
   * The agent's last failure signature (`failureSignature(test, diff)`), sent with every
   * call (the agent-level rule: the same value twice in a row lowers the weight). With a
   * task, report failures with `task.failed()` instead.
   */
  failureSignature?: U64
  /**
   * The pool for a call: a pool name, a map from model name (or prefix ending in `*`) to
   * pool name, or a function. Default: the pool named like the model, else the only pool.
   */
  pool?: string | Record<string, string> | ((model: string, provider: Provider) => string)
  /** The `fetch` that really sends (default `globalThis.fetch`). */
  fetch?: typeof fetch
  /**
   * Called before a long wait: the core marks a wait `checkpoint` when it is longer than
   * `call.checkpoint_after_ms` (default 30 s, or the prompt cache's lifetime). Write the
   * turn down here (`Checkpoints.save` in the `tokenwarden` package: goal, step, decisions,
   * the prepared call, file hashes), so a process killed during the wait resumes without a
   * re-plan. Awaited before the wait; if it throws, the call is withdrawn (its ticket
   * cancelled) and the error is the call's.
   */
  onLongWait?: (wait: LongWait) => void | Promise<void>
}

/** What {@link FetchOptions.onLongWait} is told about the wait ahead. */
export interface LongWait {
  agent: U64
  pool: number
  /** Why: queued in the fair queue, refused for now, or waiting out a 429 / overload. */
  reason: 'queued' | 'refused' | 'rate_limited' | 'overloaded'
  /** The expected wait from now, ms (for `queued`, an upper bound: the core's ETA). */
  waitMs: number
  /** Until when, on the driver's clock. */
  until: number
  /** Failed sends so far. */
  attempt: number
}

/** What the wrapper needs from its owner. */
export interface FetchContext {
  driver: Driver
  estimator: Estimator
  /** A fresh agent id. */
  nextAgent(): number
}

const MASK53 = (1n << 53n) - 1n
const utf8 = new TextEncoder()

/** FNV-1a, 64 bits, folded to 53 (an exact `number`) over `parts` joined by NUL. */
function hash53(parts: readonly string[]): number {
  let h = 0xcbf29ce484222325n
  parts.forEach((part, i) => {
    if (i > 0) h = ((h ^ 0n) * 0x100000001b3n) & 0xffffffffffffffffn
    for (const b of utf8.encode(part)) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn
  })
  return Number((h ^ (h >> 53n)) & MASK53)
}

/**
 * A stable task id for a name: a name of digits that is an exact integer is that number
 * (`'1234'` is task 1234, so an issue number works as either), any other a 53-bit FNV-1a
 * hash (collisions are negligible).
 */
export function taskIdFor(name: string): number {
  if (/^\d{1,16}$/.test(name) && Number.isSafeInteger(Number(name))) return Number(name)
  return hash53([name])
}

/**
 * A failure signature: a hash of the failing test's name and the diff under test, never
 * their content. The diff counts by its changed lines only (`+`/`-` lines, trailing space
 * trimmed, file headers and hunk positions left out), so the same failure after an
 * unrelated edit moved the lines is still the same signature. Two identical signatures in
 * a row halve the task's weight (`task.failed(signature)`).
 */
export function failureSignature(testName: string, diff = ''): number {
  const changed = diff
    .split(/\r?\n/)
    .filter((l) => (l.startsWith('+') || l.startsWith('-')) && !l.startsWith('+++') && !l.startsWith('---'))
    .map((l) => l.trimEnd())
  return hash53([testName.trim(), ...changed])
}

/** FNV-1a, 32 bits: a stable agent id for a name. */
export function agentIdFor(name: string): number {
  let h = 0x811c9dc5
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i)
    h = Math.imul(h, 0x01000193) >>> 0
  }
  return h
}

function resolvePool(driver: Driver, spec: FetchOptions['pool'], model: string, provider: Provider): number {
  if (typeof spec === 'string') return driver.pool(spec)
  if (typeof spec === 'function') return driver.pool(spec(model, provider))
  if (spec !== undefined) {
    const exact = spec[model]
    if (exact !== undefined) return driver.pool(exact)
    for (const [key, name] of Object.entries(spec)) {
      if (key.endsWith('*') && model.startsWith(key.slice(0, -1))) return driver.pool(name)
    }
  }
  const byName = driver.engine.poolId(model)
  if (byName !== null) return byName
  if (driver.engine.pools.length === 1) return 0
  throw new TokenwardenError(
    'unknown_pool',
    `no pool for model ${JSON.stringify(model)}: name a pool after it or pass \`pool\` to fetch(); pools: ${driver.engine.pools.join(', ')}`,
  )
}

async function readBody(input: RequestInfo | URL, init: RequestInit | undefined): Promise<string | null> {
  const body = init?.body
  if (typeof body === 'string') return body
  if (body instanceof Uint8Array) return new TextDecoder().decode(body)
  if (body instanceof ArrayBuffer) return new TextDecoder().decode(new Uint8Array(body))
  if ((body === undefined || body === null) && input instanceof Request) return input.clone().text()
  return null
}

function isEventStream(res: Response): boolean {
  return (res.headers.get('content-type') ?? '').includes('text/event-stream')
}

/** Builds the wrapped `fetch`. Use `Tokenwarden.fetch()`, which supplies the context. */
export function createFetch(ctx: FetchContext, options: FetchOptions = {}): typeof fetch {
  const { driver, estimator } = ctx
  const agent: U64 =
    options.agent === undefined
      ? ctx.nextAgent()
      : typeof options.agent === 'string'
        ? agentIdFor(options.agent)
        : options.agent
  const task: U64 | undefined = typeof options.task === 'string' ? taskIdFor(options.task) : options.task

  const wrapped = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const send = options.fetch ?? globalThis.fetch
    const url = new URL(input instanceof Request ? input.url : String(input))
    const method = init?.method ?? (input instanceof Request ? input.method : 'GET')
    const provider = detectProvider(url, method)
    if (provider === null) return send(input, init)
    const text = await readBody(input, init)
    let body: Record<string, unknown>
    try {
      body = JSON.parse(text ?? '') as Record<string, unknown>
    } catch {
      // Not JSON: the provider will refuse it (400) without generating anything.
      return send(input, init)
    }
    if (body === null || typeof body !== 'object') return send(input, init)
    const shape = callShape(provider, body)
    const pool = resolvePool(driver, options.pool, shape.model, provider)
    const signal = init?.signal ?? (input instanceof Request ? input.signal : null)
    const forward: RequestInit = { ...init, method, body: text }
    if (input instanceof Request) {
      forward.headers = init?.headers ?? input.headers
      forward.signal = signal
    }
    let call = newCall()
    // With a long-wait hook, a signal of our own too: a hook that throws withdraws the call.
    const withdraw = options.onLongWait === undefined ? null : new AbortController()
    const callSignal = withdraw === null ? signal : signal === null ? withdraw.signal : AbortSignal.any([signal, withdraw.signal])
    const longWait = async (step: Extract<CallStep, { kind: 'wait' }>, lease: Promise<Lease> | null): Promise<void> => {
      if (!step.checkpoint || options.onLongWait === undefined) return
      const until = Number(step.until)
      try {
        await options.onLongWait({ agent, pool, reason: step.reason, waitMs: Math.max(0, until - driver.clock.now()), until, attempt: step.attempt })
      } catch (e) {
        withdraw?.abort(e)
        // Granted meanwhile: give it back unused.
        lease?.then((l) => l.cancel(), () => {})
        throw e
      }
    }

    // A loop that does what the core says: every retry, wait and give-up is its decision.
    for (;;) {
      const estimate = estimator.estimate({ provider, model: shape.model, body })
      const request = {
        agent,
        pool,
        inputTokens: estimate.inputTokens,
        cachedPrefixTokens: estimate.cachedPrefixTokens,
        maxTokens: shape.maxTokens,
        role: options.role ?? 'worker',
        unblocks: typeof options.unblocks === 'function' ? options.unblocks() : (options.unblocks ?? 0),
        ...(task === undefined ? {} : { task }),
        ...(options.failureSignature === undefined ? {} : { failureSignature: options.failureSignature }),
      }
      const ask = await driver.callLease(call, request, { signal: callSignal })
      call = ask.call
      const step = ask.step
      if (step.kind === 'give_up') {
        if (step.refusal === null) throw new TokenwardenError('rejected', `the call gave up (${step.reason})`)
        throw new LeaseRejectedError(step.refusal, null, driver.clock.now(), step.reason)
      }
      if (step.kind === 'wait') await longWait(step, ask.lease)
      if (ask.lease === null) {
        // Refused for now; the call keeps its place in the fair order until it asks again.
        if (step.kind === 'wait') await waitUntil(driver, agent, pool, step, 'rejected', Number(step.until), signal)
        continue
      }
      const lease = await ask.lease

      let res: Response
      try {
        res = await send(url.href, forward)
      } catch (err) {
        // Nothing came back: the provider may have processed all of it.
        interruptedQuietly(lease, null, driver)
        throw err
      }

      const answer = await lease.respond(call, res.status, res.headers)
      call = answer.call
      const next = answer.step
      if (next.kind === 'wait') {
        await res.body?.cancel().catch(() => {})
        await longWait(next, null)
        const cause = next.reason === 'overloaded' ? 'overloaded' : 'rate_limited'
        await waitUntil(driver, agent, pool, next, cause, Number(next.until), signal)
        continue
      }
      if (next.kind === 'give_up' || !res.ok) {
        // Handed over as the provider sent it (the SDK raises its own error, with the last
        // Retry-After in the headers); the core settled the lease as nothing used.
        return res
      }
      if (isEventStream(res) && res.body !== null) {
        return streamed(res, lease, driver, provider, (usage) => learn(estimator, provider, shape.model, body, estimate, usage))
      }
      let responseText: string
      try {
        responseText = await res.text()
      } catch (err) {
        interruptedQuietly(lease, null, driver)
        throw err
      }
      let usage: Usage | null = null
      try {
        usage = usageFromBody(provider, JSON.parse(responseText))
      } catch {
        usage = null
      }
      if (usage === null) {
        interruptedQuietly(lease, null, driver)
      } else {
        settleQuietly(lease, usage, driver)
        learn(estimator, provider, shape.model, body, estimate, usage)
      }
      return new Response(responseText, { status: res.status, statusText: res.statusText, headers: res.headers })
    }
  }
  return wrapped as typeof fetch
}

/** Says the call is waiting (a visible "waiting on rate limit, retrying in N s"), then waits. */
async function waitUntil(
  driver: Driver,
  agent: U64,
  pool: number,
  step: Extract<CallStep, { kind: 'wait' }>,
  cause: 'rate_limited' | 'rejected' | 'overloaded',
  until: number,
  signal: AbortSignal | null,
): Promise<void> {
  const delayMs = Math.max(0, until - driver.clock.now())
  const seconds = delayMs < 10_000 ? (delayMs / 1000).toFixed(1) : String(Math.round(delayMs / 1000))
  const message =
    cause === 'rejected'
      ? `waiting on rate limit, retrying in ${seconds} s (the queue is full or the wait too long; the call keeps its place)`
      : cause === 'overloaded'
        ? `waiting on an overloaded provider, retrying in ${seconds} s (attempt ${step.attempt})`
        : `waiting on rate limit, retrying in ${seconds} s (attempt ${step.attempt})`
  driver.emit('waiting', { agent, pool, delayMs, attempt: step.attempt, cause, checkpoint: step.checkpoint, message })
  await sleep(driver.clock, delayMs, signal)
}

function learn(
  estimator: Estimator,
  provider: Provider,
  model: string,
  body: Record<string, unknown>,
  estimate: Estimate,
  usage: Usage,
): void {
  estimator.observe?.({ provider, model, body, estimate, actualInputTokens: promptTokens(usage) })
}

/**
 * Settles, ignoring a lease that already ended (reaped after its TTL: the event said so).
 * A remote lease settles asynchronously; its failure is reported as a `remote_error` event.
 */
function settleQuietly(lease: Lease, usage: Usage, driver?: Driver): void {
  if (lease.done) return
  try {
    const s: unknown = lease.settle(usage)
    if (s instanceof Promise) {
      s.catch((e: Error & { code?: string }) => {
        if (e.code !== 'unknown_lease') driver?.emit('remote_error', { operation: 'settle', message: e.message })
      })
    }
  } catch (e) {
    if ((e as { code?: string }).code !== 'unknown_lease') throw e
  }
}

/**
 * Ends a lease whose usage is unknown by the core's conservative rule (`seen`: what the
 * stream had shown), ignoring a lease that already ended, as {@link settleQuietly} does.
 */
function interruptedQuietly(lease: Lease, seen: Usage | null, driver: Driver): void {
  if (lease.done) return
  try {
    const s: unknown = lease.interrupted(seen)
    if (s instanceof Promise) {
      s.catch((e: Error & { code?: string }) => {
        if (e.code !== 'unknown_lease') driver.emit('remote_error', { operation: 'settle', message: e.message })
      })
    }
  } catch (e) {
    if ((e as { code?: string }).code !== 'unknown_lease') throw e
  }
}

/** What a stream showed before it broke: its reported usage, output counted from the text seen. */
function seenSoFar(tracker: SseUsage): Usage {
  const reported = tracker.usage
  const output = Math.max(Number(reported?.outputTokens ?? 0), Math.ceil(tracker.textBytes / 2))
  return { ...(reported ?? {}), outputTokens: output }
}

/** Passes the stream through, reading usage on the way; settles when it ends. */
function streamed(res: Response, lease: Lease, driver: Driver, provider: Provider, onUsage: (usage: Usage) => void): Response {
  const tracker = new SseUsage(provider)
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  let finished = false
  const finish = (clean: boolean): void => {
    if (finished) return
    finished = true
    tracker.end()
    const usage = tracker.usage
    if (clean && usage !== null) {
      settleQuietly(lease, usage, driver)
      onUsage(usage)
    } else {
      interruptedQuietly(lease, seenSoFar(tracker), driver)
    }
  }
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      let chunk: ReadableStreamReadResult<Uint8Array>
      try {
        chunk = await reader.read()
      } catch (err) {
        finish(false)
        controller.error(err)
        return
      }
      if (chunk.done) {
        finish(true)
        controller.close()
        return
      }
      tracker.push(chunk.value)
      controller.enqueue(chunk.value)
    },
    cancel(reason) {
      finish(false)
      return reader.cancel(reason)
    },
  })
  return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers })
}
