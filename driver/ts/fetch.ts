/**
 * A `fetch` for the official SDKs: `new Anthropic({ fetch: tw.fetch(), maxRetries: 0 })`,
 * `new OpenAI({ fetch: tw.fetch(), maxRetries: 0 })`.
 *
 * For each model call it finds the provider, model and pool from the request, estimates
 * input tokens, reserves `max_tokens` of output, leases (waiting in the fair queue if need
 * be), forwards, resyncs from the response headers, and passes the body through as it
 * arrives, settling from the usage in it (the JSON body's or the SSE stream's) when it
 * ends; the lease holds its concurrency slot until then. It is a loop over the core's call
 * lifecycle: the core says when to send, how long to wait (with a `waiting` event:
 * "waiting on rate limit, retrying in N s"), which responses to retry and when to give
 * up; a call that ends without its usage (broken, cut short, timed out, malformed usage)
 * is charged by the core's conservative rule. A model call's redirect is handed back, never
 * followed. Other requests (token counting, model lists) pass through untouched. API keys
 * are never read, logged or put in events or errors.
 */
import { sleep } from './clock.js'
import type { Driver, Lease } from './driver.js'
import { LeaseRejectedError, TokenwardenError } from './errors.js'
import { BytesPerTokenEstimator, type Estimate, type EstimateInput, type Estimator } from './estimator.js'
import { type Provider, callShape, promptTokens, stopAnswer } from './providers.js'
import { providerRules } from './rules.js'
import { type CallStep, type Exchange, type ExchangeAction, type ModelApi, type Role, type U64, type Usage, newCall } from './types.js'

/** Options for one wrapped `fetch` (one agent). */
export interface FetchOptions {
  /** Which agent this client is: a number, or a name (hashed). Default: a fresh id. */
  agent?: U64 | string
  /**
   * The agent whose family this client's agent belongs to (a number, or a name, hashed as
   * `agent` is): the session that spawned it as a subagent. By default a family shares one
   * place in the fair order, split among its members with calls in line.
   */
  family?: U64 | string
  /**
   * The agent's role in the task graph (default `auto`: the core's choice, a planner while
   * its subagents are at work, else a worker).
   */
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
  /**
   * How a call tokenwarden refuses or gives up on reaches the caller. `true` (the default):
   * as a `Response` in the provider's own error format — `429` with `retry-after` for a
   * refusal a later retry can cure, `400` for a call that can never be served as asked or a
   * model with no pool, `503` once the driver is closed — so an SDK raises an API error that
   * shows tokenwarden's reason (a thrown error reaches its user as "Connection error.").
   * `false`: thrown (`LeaseRejectedError`, `TokenwardenError`), for code that calls the
   * wrapped `fetch` itself. An abort, a network error and an upstream timeout are thrown
   * either way.
   */
  errorResponses?: boolean
  /**
   * How long the provider may keep a call waiting, ms (see {@link UpstreamTimeouts}). On
   * expiry the request is aborted, the lease ends by the core's rule for an interrupted
   * call, and the call fails with a `TokenwardenError` of code `upstream_timeout`.
   */
  timeouts?: UpstreamTimeouts
}

/**
 * Upstream timeouts of a wrapped `fetch`, ms (whole milliseconds from 1 to 30 days);
 * `Infinity` turns one off. The defaults (the core's) are generous on purpose: a
 * non-streamed call to a large model sends nothing until the whole answer is ready, which
 * can take minutes, and the official SDKs wait 10 minutes for one.
 */
export interface UpstreamTimeouts {
  /** From sending until the response's headers arrive (default 600,000: 10 minutes). */
  firstByteMs?: number
  /** Between two pieces of the body, while the caller is reading it (default 300,000: 5 minutes). */
  idleMs?: number
}

/** The longest a timer is set for (a JavaScript timer's limit, about 24.8 days): a later deadline is reached in steps. */
const MAX_TIMER_MS = 2_147_483_647

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
  /**
   * The call this wait holds, as it will be sent: checkpoint `call.body` as the next call
   * and send it again on resume (`client.messages.create(saved.nextCall)`). Its headers
   * are not in it: the API key stays with the client.
   */
  call: HeldCall
}

/** A model call held in a wait (see {@link LongWait.call}). */
export interface HeldCall {
  provider: Provider
  model: string
  method: string
  /** The URL it goes to (as the SDK built it, query string included). */
  url: string
  /** The request body, parsed: a copy the hook may keep or change. */
  body: Record<string, unknown>
}

/** What the wrapper needs from its owner. */
export interface FetchContext {
  driver: Driver
  estimator: Estimator
  /** A fresh agent id. */
  nextAgent(): number
}

/**
 * A stable task id for a name: a name of digits that is an exact integer is that number
 * (`'1234'` is task 1234, so an issue number works as either), any other a 53-bit FNV-1a
 * hash (collisions are negligible). The provider crate's rule (`identity::task_id_for`), the
 * same in every host.
 */
export function taskIdFor(name: string): number {
  return providerRules().identity('task', name, '')
}

/**
 * A failure signature: a hash of the failing test's name and the diff under test, never
 * their content. The diff counts by its changed lines only (`+`/`-` lines, trailing space
 * trimmed, file headers and hunk positions left out), so the same failure after an
 * unrelated edit moved the lines is still the same signature. Two identical signatures in
 * a row halve the task's weight (`task.failed(signature)`). The provider crate's rule
 * (`identity::failure_signature`).
 */
export function failureSignature(testName: string, diff = ''): number {
  return providerRules().identity('failure', testName, diff)
}

/** FNV-1a, 32 bits: a stable agent id for a name (the provider crate's `identity::agent_id_for`). */
export function agentIdFor(name: string): number {
  return providerRules().identity('agent', name, '')
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
  throw new TokenwardenError('unknown_pool', `no pool for model ${JSON.stringify(model)}: name a pool after it or pass \`pool\` to fetch(); pools: ${driver.engine.pools.join(', ')}`)
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
  const named = (name: string): number => {
    const id = agentIdFor(name)
    driver.nameAgent(id, name)
    return id
  }
  const agent: U64 = options.agent === undefined ? ctx.nextAgent() : typeof options.agent === 'string' ? named(options.agent) : options.agent
  const family: U64 | undefined = typeof options.family === 'string' ? named(options.family) : options.family
  const task: U64 | undefined = typeof options.task === 'string' ? taskIdFor(options.task) : options.task
  if (options.timeouts !== undefined && (options.timeouts === null || typeof options.timeouts !== 'object')) {
    throw Object.assign(new TypeError('fetch(): `timeouts` must be an object: { firstByteMs?, idleMs? }'), { code: 'invalid_argument', field: 'timeouts' })
  }
  const timeouts = driver.engine.exchangeTimeouts(options.timeouts?.firstByteMs, options.timeouts?.idleMs)

  const call = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const send = options.fetch ?? globalThis.fetch
    const url = new URL(input instanceof Request ? input.url : String(input))
    const method = init?.method ?? (input instanceof Request ? input.method : 'GET')
    const api = driver.engine.modelCall(method, url.pathname)
    if (api === null) return send(input, init)
    const provider = providerOf(api)
    // A model call's redirect is handed back, never followed: it would take the API key to
    // wherever the Location points.
    const unleased = (): Promise<Response> => (input instanceof Request ? send(new Request(input, { ...init, redirect: 'manual' })) : send(input, { ...init, redirect: 'manual' }))
    const text = await readBody(input, init)
    let body: Record<string, unknown>
    try {
      body = JSON.parse(text ?? '') as Record<string, unknown>
    } catch {
      // Not JSON: the provider will refuse it (400) without generating anything.
      return unleased()
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) return unleased()
    const shape = callShape(provider, text ?? '')
    const pool = resolvePool(driver, options.pool, shape.model, provider)
    const signal = init?.signal ?? (input instanceof Request ? input.signal : null)
    const forward: RequestInit = { ...init, method, body: text, redirect: 'manual' }
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
        const held: HeldCall = { provider, model: shape.model, method, url: url.href, body: JSON.parse(text as string) as Record<string, unknown> }
        await options.onLongWait({ agent, pool, reason: step.reason, waitMs: Math.max(0, until - driver.clock.now()), until, attempt: step.attempt, call: held })
      } catch (e) {
        withdraw?.abort(e)
        // Granted meanwhile: give it back unused.
        lease?.then(
          (l) => l.cancel(),
          () => {},
        )
        throw e
      }
    }

    // A loop that does what the core says: every retry, wait and give-up is its decision.
    for (;;) {
      const estimated = estimateOf(driver, estimator, { provider, model: shape.model, body, ...(text === null ? {} : { text }) })
      const estimate = estimated instanceof Promise ? await estimated : estimated
      const request = {
        agent,
        pool,
        inputTokens: estimate.inputTokens,
        cachedPrefixTokens: estimate.cachedPrefixTokens,
        ...(estimate.cachedPrefixConfirmed === true ? { cachedPrefixConfirmed: true } : {}),
        maxTokens: shape.maxTokens,
        role: options.role ?? 'auto',
        unblocks: typeof options.unblocks === 'function' ? options.unblocks() : (options.unblocks ?? 0),
        ...(task === undefined ? {} : { task }),
        ...(options.failureSignature === undefined ? {} : { failureSignature: options.failureSignature }),
        ...(family === undefined ? {} : { family }),
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

      // This attempt's own signal: the caller's, and a timeout's abort of the request.
      const upstream = new AbortController()
      const sendSignal = signal === null ? upstream.signal : AbortSignal.any([signal, upstream.signal])
      // The rest of the call is the core's exchange: renewal, timeouts, the lease's end.
      const onUsage = (usage: Usage): void => learn(driver, estimator, provider, shape.model, body, estimate, usage)
      const run = new SendRun(driver.engine.exchange(api, driver.clock.now(), leaseLeft(lease, driver), timeouts), lease, driver, upstream, onUsage)
      let res: Response
      try {
        res = await run.until(send(url.href, { ...forward, signal: sendSignal }))
      } catch (err) {
        run.on(run.x.failed())
        throw err
      }

      let answer: Awaited<ReturnType<Lease['respond']>>
      try {
        answer = await lease.respond(call, res.status, res.headers)
      } catch (err) {
        // The core could not take the response in: the caller still gets the provider's answer.
        driver.emit('remote_error', { operation: 'response', message: messageOf(err) })
        run.on(run.x.failed())
        return res
      }
      call = answer.call
      const next = answer.step
      const now = driver.clock.now()
      if (next.kind === 'wait') {
        run.on(run.x.answered(now, 'settled', 0))
        await res.body?.cancel().catch(() => {})
        await longWait(next, null)
        const cause = next.reason === 'overloaded' ? 'overloaded' : 'rate_limited'
        await waitUntil(driver, agent, pool, next, cause, Number(next.until), signal)
        continue
      }
      if (next.kind === 'give_up' || !res.ok) {
        // Handed over as the provider sent it (the SDK raises its own error, with the last
        // Retry-After in the headers; a redirect is not followed); the core settled the lease
        // as nothing used.
        run.on(run.x.answered(now, 'settled', 0))
        return res
      }
      if (res.body === null) {
        run.on(run.x.answered(now, 'empty', 0))
        return res
      }
      return relay(res, run, isEventStream(res))
    }
  }
  const wrapped = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    try {
      return await call(input, init)
    } catch (e) {
      if (options.errorResponses === false) throw e
      const url = new URL(input instanceof Request ? input.url : String(input))
      const api = driver.engine.modelCall(init?.method ?? (input instanceof Request ? input.method : 'GET'), url.pathname)
      const answer = api === null ? null : refusalResponse(e, providerOf(api))
      if (answer === null) throw e
      return answer
    }
  }
  return wrapped as typeof fetch
}

/**
 * The provider whose format a model call's API follows. Which requests are model calls is
 * the engine's `modelCall`: the provider crate's rule on the path as the provider's router
 * reads it (a look-alike such as `/v1/m%65ssages` is leased too).
 */
function providerOf(api: ModelApi): Provider {
  return api === 'anthropic_messages' ? 'anthropic' : 'openai'
}

function messageOf(e: unknown): string {
  return e instanceof Error ? e.message : String(e)
}

/** The error a timed-out call fails with. */
function upstreamTimeout(what: string, ms: number): TokenwardenError {
  return new TokenwardenError('upstream_timeout', `the provider sent ${what} in ${ms} ms (fetch() timeouts); the request was aborted`)
}

/**
 * A refusal, a give-up or a limiter failure as the provider would answer it (see
 * {@link FetchOptions.errorResponses}), or `null` for an error that is not one (an abort, a
 * network error, an upstream timeout, an error of the caller's own hook).
 */
function refusalResponse(e: unknown, provider: Provider): Response | null {
  let answer: ReturnType<typeof stopAnswer>
  if (e instanceof LeaseRejectedError) {
    const fields = { error: 'rejected', reason: e.reason, retryAt: e.retryAt === null ? null : Number(e.retryAt), retryAfterMs: e.retryAfterMs, gaveUp: e.gaveUp, message: e.message }
    answer = stopAnswer(provider, 'refused', e.retryable ? e.retryAfterMs : null, `tokenwarden: ${e.message}`, fields)
  } else if (e instanceof TokenwardenError && ['rejected', 'closed', 'unknown_pool'].includes(e.code)) {
    const stop = e.code === 'rejected' ? 'gave_up' : (e.code as 'closed' | 'unknown_pool')
    answer = stopAnswer(provider, stop, null, `tokenwarden: ${e.message}`, { error: e.code, message: e.message })
  } else {
    return null
  }
  const headers = { 'content-type': 'application/json', 'x-tokenwarden-refusal': '1', ...answer.headers }
  return new Response(JSON.stringify(answer.body), { status: answer.status, headers })
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

/** The byte rule, for a call whose estimator failed. */
let fallbackEstimator: BytesPerTokenEstimator | null = null

const isThenable = (v: unknown): v is PromiseLike<unknown> => v !== null && typeof v === 'object' && typeof (v as { then?: unknown }).then === 'function'

/**
 * The estimator's estimate: a promise only when the estimator answered one (a synchronous
 * estimator costs no extra turn). One that throws, rejects or answers something that is
 * not an estimate costs the caller nothing: the call is estimated by the byte rule, and a
 * `remote_error` event (`operation: 'estimator'`) says why.
 */
function estimateOf(driver: Driver, estimator: Estimator, input: EstimateInput): Estimate | Promise<Estimate> {
  const fallback = (err: unknown): Estimate => {
    driver.emit('remote_error', { operation: 'estimator', message: `${messageOf(err)}; the call is estimated by the byte rule instead` })
    fallbackEstimator ??= new BytesPerTokenEstimator()
    return fallbackEstimator.estimate(input)
  }
  const checked = (e: Estimate): Estimate => {
    const { inputTokens, cachedPrefixTokens, cachedPrefixConfirmed } = (e ?? {}) as Partial<Estimate>
    if (
      Number.isSafeInteger(inputTokens) &&
      (inputTokens as number) >= 0 &&
      Number.isSafeInteger(cachedPrefixTokens) &&
      (cachedPrefixTokens as number) >= 0 &&
      (cachedPrefixConfirmed === undefined || typeof cachedPrefixConfirmed === 'boolean')
    )
      return e
    return fallback(
      new TypeError(`the estimate must be { inputTokens, cachedPrefixTokens } of non-negative integers (and an optional boolean cachedPrefixConfirmed), got ${JSON.stringify(e) ?? String(e)}`),
    )
  }
  let e: Estimate | Promise<Estimate>
  try {
    e = estimator.estimate(input)
  } catch (err) {
    return fallback(err)
  }
  return isThenable(e) ? Promise.resolve(e).then(checked, fallback) : checked(e)
}

function learn(driver: Driver, estimator: Estimator, provider: Provider, model: string, body: Record<string, unknown>, estimate: Estimate, usage: Usage): void {
  const n = (v: Usage[keyof Usage]): number => Number(v ?? 0)
  const observed = {
    inputTokens: n(usage.inputTokens),
    cacheReadInputTokens: n(usage.cacheReadInputTokens),
    cacheCreationInputTokens: n(usage.cacheCreationInputTokens),
    outputTokens: n(usage.outputTokens),
  }
  const r: unknown = estimator.observe?.({ provider, model, body, estimate, actualInputTokens: promptTokens(usage), usage: observed })
  // An observation that rejects costs the caller nothing either.
  if (isThenable(r)) r.then(undefined, (e: unknown) => driver.emit('remote_error', { operation: 'estimator', message: messageOf(e) }))
}

/** An engine's refusal that means the lease has already ended (reaped after its TTL, or settled). */
function gone(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code
  return code === 'unknown_lease' || code === 'not_granted'
}

/** The time left on a lease, ms (a lease from the edge limiter has its expiry on the limiter's clock: Unix ms). */
function leaseLeft(lease: Lease, driver: Driver): number {
  const remote = typeof (lease as { handle?: unknown }).handle === 'string'
  return Number(lease.expiresAt) - (remote ? driver.clock.unixNow() : driver.clock.now())
}

/** Bits of an exchange event's answer: actions wait; the deadline moved. */
const ACTIONS = 1
const TIMER = 2

/**
 * The host of one send's exchange ({@link Engine.exchange}): it tells the machine what
 * happened and does what it says — renews, settles or ends the lease as interrupted
 * (never throwing: a refusal is told back, and a `remote_error` event says what failed),
 * hands the answer over, aborts the request for a timeout — and keeps one timer at the
 * machine's deadline.
 */
class SendRun {
  #timer: unknown = null
  /** Rejects what the caller awaits (the head, a piece of the body) when a timeout passes. */
  #waiter: ((err: Error) => void) | null = null
  /** Whether the lease's end was asked before (a fallback after a refusal is asked even if the lease reads as done). */
  #ending = false
  /** The timeout's error, once one passed. */
  timedOut: Error | null = null
  /** Whether the machine said to hand the answer over. */
  delivered = false

  constructor(
    readonly x: Exchange,
    readonly lease: Lease,
    readonly driver: Driver,
    readonly upstream: AbortController,
    readonly learn: (usage: Usage) => void,
  ) {
    this.#arm()
  }

  /** Acts on an event's answer. */
  on(bits: number): void {
    if (bits & TIMER) this.#arm()
    if (bits & ACTIONS) for (const a of this.x.actions()) this.#act(a)
  }

  /** `p`, unless a timeout passes first (a response that still comes is discarded). */
  until<T>(p: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#waiter = reject
      p.then(
        (v) => {
          this.#waiter = null
          if (this.timedOut === null) resolve(v)
          else if (v instanceof Response) v.body?.cancel().catch(() => {})
        },
        (err: unknown) => {
          this.#waiter = null
          if (this.timedOut === null) reject(err)
        },
      )
    })
  }

  #arm(): void {
    const clock = this.driver.clock
    if (this.#timer !== null) clock.clearTimer(this.#timer)
    this.#timer = null
    const at = this.x.deadline()
    if (at < 0) return
    this.#timer = clock.setTimer(
      () => {
        this.#timer = null
        // Re-armed whatever the machine did: a deadline past the longest timer is reached in steps.
        this.on(this.x.timeout(clock.now()) | TIMER)
      },
      Math.min(Math.max(0, at - clock.now()), MAX_TIMER_MS),
    )
  }

  #act(a: ExchangeAction): void {
    switch (a.do) {
      case 'renew':
        this.#renew()
        return
      case 'settle':
        this.#settle(a.usage, a.learn)
        return
      case 'interrupted':
        this.#interrupted(a.seen)
        return
      case 'deliver':
        this.delivered = true
        return
      case 'timed_out': {
        const err = upstreamTimeout(a.timeout === 'first_byte' ? 'no response headers' : 'no more of the body', a.ms)
        this.timedOut = err
        this.upstream.abort(err)
        this.#waiter?.(err)
        this.#waiter = null
        return
      }
    }
  }

  #renew(): void {
    const failed = (e: unknown): void => {
      if (!gone(e)) this.driver.emit('remote_error', { operation: 'renew', message: messageOf(e) })
      this.on(this.x.renewRefused(gone(e)))
    }
    const renewed = (): void => this.on(this.x.renewed(this.driver.clock.now(), leaseLeft(this.lease, this.driver)))
    let r: U64 | Promise<U64>
    try {
      r = this.lease.renew()
    } catch (e) {
      failed(e)
      return
    }
    if (r instanceof Promise) r.then(renewed, failed)
    else renewed()
  }

  #settle(usage: Usage, learn: boolean): void {
    const first = !this.#ending
    this.#ending = true
    // A lease that already ended (reaped after its TTL: the `expired` event said so) is left alone.
    if (first && this.lease.done) return
    const failed = (e: unknown): void => {
      if (!gone(e)) this.driver.emit('remote_error', { operation: 'settle', message: `${messageOf(e)}; the call is charged as interrupted instead` })
      this.on(this.x.settleRefused(gone(e)))
    }
    let s: unknown
    try {
      s = this.lease.settle(usage)
    } catch (e) {
      failed(e)
      return
    }
    if (s instanceof Promise) s.catch(failed)
    if (!learn) return
    try {
      this.learn(usage)
    } catch (e) {
      // An estimator that throws costs the caller nothing either.
      this.driver.emit('remote_error', { operation: 'estimator', message: messageOf(e) })
    }
  }

  #interrupted(seen: Usage | null): void {
    const first = !this.#ending
    this.#ending = true
    if (first && this.lease.done) return
    const failed = (e: unknown): void => {
      if (!gone(e)) this.driver.emit('remote_error', { operation: 'interrupted', message: messageOf(e) })
      this.on(this.x.interruptedRefused(gone(e)))
    }
    try {
      const s: unknown = this.lease.interrupted(seen)
      if (s instanceof Promise) s.catch(failed)
    } catch (e) {
      failed(e)
    }
  }
}

/**
 * Passes the body through as the exchange says: a stream at once, a JSON answer once it
 * ended (or passed the hold), each piece told to the machine (its usage read, the lease
 * renewed) and the lease ended as it decides when the body ends, breaks, is cancelled by
 * the reader or is idle too long while read (the request is then aborted and the body
 * fails with `upstream_timeout`).
 */
async function relay(res: Response, run: SendRun, stream: boolean): Promise<Response> {
  const { x, driver } = run
  const clock = driver.clock
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  const init = { status: res.status, statusText: res.statusText, headers: res.headers }
  run.on(x.answered(clock.now(), stream ? 'stream' : 'json', leaseLeft(run.lease, driver)))
  // The next piece of the body, or `upstream_timeout` (the request aborted) after the idle timeout.
  const read = (): Promise<ReadableStreamReadResult<Uint8Array>> => {
    run.on(x.reading(clock.now()))
    const chunk = run.until(reader.read())
    chunk.catch((err: unknown) => {
      if (err === run.timedOut) reader.cancel(err).catch(() => {})
    })
    return chunk
  }

  const held: Uint8Array[] = []
  let heldBytes = 0
  while (!run.delivered) {
    let chunk: ReadableStreamReadResult<Uint8Array>
    try {
      chunk = await read()
    } catch (err) {
      run.on(x.broken())
      throw err
    }
    if (chunk.done) {
      run.on(x.end(clock.now()))
      const whole = new Uint8Array(heldBytes)
      let at = 0
      for (const c of held) {
        whole.set(c, at)
        at += c.length
      }
      return new Response(whole, init)
    }
    held.push(chunk.value)
    heldBytes += chunk.value.length
    run.on(x.push(clock.now(), chunk.value))
  }

  let ended = false
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const first = held.shift()
      if (first !== undefined) {
        controller.enqueue(first)
        return
      }
      let chunk: ReadableStreamReadResult<Uint8Array>
      try {
        chunk = await read()
      } catch (err) {
        ended = true
        run.on(x.broken())
        controller.error(err)
        return
      }
      if (ended) return
      if (chunk.done) {
        ended = true
        run.on(x.end(clock.now()))
        controller.close()
        return
      }
      run.on(x.push(clock.now(), chunk.value))
      controller.enqueue(chunk.value)
    },
    cancel(reason) {
      ended = true
      run.on(x.broken())
      return reader.cancel(reason)
    },
  })
  return new Response(body, init)
}
