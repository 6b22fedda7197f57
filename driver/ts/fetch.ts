/**
 * A `fetch` for the official SDKs: `new Anthropic({ fetch: tw.fetch(), maxRetries: 0 })`,
 * `new OpenAI({ fetch: tw.fetch(), maxRetries: 0 })`.
 *
 * For each model call it finds the provider, model and pool from the request, estimates
 * input tokens, reserves `max_tokens` of output, leases (waiting in the fair queue if need
 * be), forwards, resyncs from the response headers, and settles from the usage in the JSON
 * body or the SSE stream, when the stream ends (the lease holds its concurrency slot until
 * then). A 429 is reported and only that call is retried, after the core's backoff, with a
 * `waiting` event ("waiting on rate limit, retrying in N s"). Other requests (token
 * counting, model lists) pass through untouched. API keys are never read, logged or put in
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
import type { BackoffState, Role, U64, Usage } from './types.js'

/** Options for one wrapped `fetch` (one agent). */
export interface FetchOptions {
  /** Which agent this client is: a number, or a name (hashed). Default: a fresh id. */
  agent?: U64 | string
  /** The agent's role in the task graph (default `worker`). */
  role?: Role
  /** Downstream tasks waiting on this agent's calls; a function is read at every call. */
  unblocks?: number | (() => number)
  /**
   * The pool for a call: a pool name, a map from model name (or prefix ending in `*`) to
   * pool name, or a function. Default: the pool named like the model, else the only pool.
   */
  pool?: string | Record<string, string> | ((model: string, provider: Provider) => string)
  /** The `fetch` that really sends (default `globalThis.fetch`). */
  fetch?: typeof fetch
  /** Most refusals (`LeaseRejectedError` with a retry time) to wait out per call (default 20). */
  maxRejections?: number
}

/** What the wrapper needs from its owner. */
export interface FetchContext {
  driver: Driver
  estimator: Estimator
  /** A fresh agent id. */
  nextAgent(): number
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
  const maxRejections = options.maxRejections ?? 20

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
    let backoff: BackoffState = { failed: 0, lastRetryAfterMs: null }
    let rejections = 0

    for (;;) {
      const estimate = estimator.estimate({ provider, model: shape.model, body })
      let lease: Lease
      try {
        lease = await driver.acquire(
          {
            agent,
            pool,
            inputTokens: estimate.inputTokens,
            cachedPrefixTokens: estimate.cachedPrefixTokens,
            maxTokens: shape.maxTokens,
            role: options.role ?? 'worker',
            unblocks: typeof options.unblocks === 'function' ? options.unblocks() : (options.unblocks ?? 0),
          },
          { signal },
        )
      } catch (e) {
        if (e instanceof LeaseRejectedError && e.retryAfterMs !== null && rejections < maxRejections) {
          rejections++
          const delay = Math.max(1, e.retryAfterMs)
          waiting(driver, agent, pool, delay, rejections, 'rejected')
          await sleep(driver.clock, delay, signal)
          continue
        }
        throw e
      }

      let res: Response
      try {
        res = await send(url.href, forward)
      } catch (err) {
        // Nothing came back: the provider may have processed all of it.
        settleQuietly(lease, conservative(estimate, null, shape.maxTokens), driver)
        throw err
      }

      const report = lease.report(res.status, res.headers)
      const retryable =
        (res.status === 429 && report.shouldRetry !== false) || (report.shouldRetry === true && res.status >= 500)
      if (retryable) {
        const errorText = await res.text().catch(() => '')
        // Refused before any generation: the request cost no tokens.
        settleQuietly(lease, {}, driver)
        const step = driver.backoff(backoff, report.retryAfterMs)
        backoff = step.state
        if (step.step.kind === 'give_up') {
          return new Response(errorText, { status: res.status, statusText: res.statusText, headers: res.headers })
        }
        const delay = Number(step.step.delayMs)
        waiting(driver, agent, pool, delay, step.step.attempt, 'rate_limited')
        await sleep(driver.clock, delay, signal)
        continue
      }
      if (!res.ok) {
        // A refusal (400, 401, 404, …) or a failure the provider says not to retry.
        settleQuietly(lease, {}, driver)
        return res
      }
      if (isEventStream(res) && res.body !== null) {
        return streamed(res, lease, driver, provider, estimate, shape.maxTokens, (usage) =>
          learn(estimator, provider, shape.model, body, estimate, usage),
        )
      }
      let responseText: string
      try {
        responseText = await res.text()
      } catch (err) {
        settleQuietly(lease, conservative(estimate, null, shape.maxTokens), driver)
        throw err
      }
      let usage: Usage | null = null
      try {
        usage = usageFromBody(provider, JSON.parse(responseText))
      } catch {
        usage = null
      }
      if (usage === null) {
        settleQuietly(lease, conservative(estimate, null, shape.maxTokens), driver)
      } else {
        settleQuietly(lease, usage, driver)
        learn(estimator, provider, shape.model, body, estimate, usage)
      }
      return new Response(responseText, { status: res.status, statusText: res.statusText, headers: res.headers })
    }
  }
  return wrapped as typeof fetch
}

function waiting(
  driver: Driver,
  agent: U64,
  pool: number,
  delayMs: number,
  attempt: number,
  cause: 'rate_limited' | 'rejected',
): void {
  const seconds = delayMs < 10_000 ? (delayMs / 1000).toFixed(1) : String(Math.round(delayMs / 1000))
  const message =
    cause === 'rate_limited'
      ? `waiting on rate limit, retrying in ${seconds} s (attempt ${attempt})`
      : `waiting on rate limit, retrying in ${seconds} s (the queue is full or the wait too long)`
  driver.emit('waiting', { agent, pool, delayMs, attempt, cause, message })
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
 * What to settle when the real usage is unknown: the input as estimated (counted as
 * uncached) or as reported, and the output seen so far in generous tokens, or the whole
 * `max_tokens` when nothing was seen.
 */
function conservative(estimate: Estimate, partial: SseUsage | null, maxTokens: number): Usage {
  const reported = partial?.usage ?? null
  const input = reported !== null ? promptTokens(reported) : estimate.inputTokens + estimate.cachedPrefixTokens
  let output = maxTokens
  if (partial !== null) {
    const seen = Math.max(Number(reported?.outputTokens ?? 0), Math.ceil(partial.textBytes / 2))
    output = Math.min(maxTokens, seen + 16)
  }
  return { inputTokens: input, outputTokens: output }
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

/** Passes the stream through, reading usage on the way; settles when it ends. */
function streamed(
  res: Response,
  lease: Lease,
  driver: Driver,
  provider: Provider,
  estimate: Estimate,
  maxTokens: number,
  onUsage: (usage: Usage) => void,
): Response {
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
      settleQuietly(lease, conservative(estimate, tracker, maxTokens), driver)
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
