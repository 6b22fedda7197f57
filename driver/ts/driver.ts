/**
 * The async driver: the API agents use. It owns the clock and one timer, turns the
 * engine's decisions into promises (`acquire()` resolves when a lease is granted), and
 * turns engine events into driver events. Written once against {@link Engine}: the addon,
 * the wasm build and a remote coordinator all plug in here.
 */
import { type Clock, systemClock } from './clock.js'
import { Emitter } from './emitter.js'
import { AbortedError, LeaseRejectedError, TokenwardenError, invalidArgument } from './errors.js'
import type {
  Axis,
  CallResponseResult,
  CallState,
  CallStep,
  Decision,
  Engine,
  HeaderReport,
  Input,
  LeaseRequest,
  MarginReason,
  Metrics,
  Output,
  RejectReason,
  Settlement,
  TaskOutcome,
  TaskSpec,
  TaskSummary,
  U64,
  Usage,
} from './types.js'

/** What the driver reports. Listen with `driver.on(name, fn)`. */
export interface DriverEvents {
  /** A lease was granted (at once, or after queueing: `waitedMs` > 0). */
  granted: { lease: number; agent: U64; pool: number; expiresAt: U64; waitedMs: number }
  /**
   * A request joined the queue. `eta` is its promise: it is granted by then (a `revised`
   * event may move it later before it passes); `etaMs` is that from now. Calls only:
   * `expectedMs` is the wait it is expected to have (what to tell a person), and
   * `checkpoint` says the wait may well be long enough that the agent should write its
   * turn down first.
   */
  queued: { lease: number; agent: U64; pool: number; eta: U64; etaMs: number; expectedMs?: number; checkpoint?: boolean }
  /**
   * A queued request's promise was replaced by a later one before it passed (a call used
   * more than it reserved, a 429, an agent joined, every concurrency slot still held): it
   * is granted by `eta`.
   */
  revised: { lease: number; agent: U64; pool: number; eta: U64 }
  /** A request was refused (the promise rejects with `LeaseRejectedError`). */
  rejected: { agent: U64; pool: number; reason: RejectReason; retryAt: U64 | null }
  /**
   * Someone is waiting before retrying: a visible "waiting on rate limit, retrying in N s"
   * (the `fetch` wrapper emits this before each wait; `message` is ready to print).
   */
  waiting: {
    agent: U64
    pool: number
    delayMs: number
    attempt: number
    cause: 'rate_limited' | 'rejected' | 'overloaded'
    /** The wait is long: checkpoint the turn before it (the core's `checkpoint`). */
    checkpoint: boolean
    message: string
  }
  /** A provider answered 429 (reported through `report`). */
  rate_limited: {
    pool: number
    lease: number | null
    status: number
    retryAfterMs: number | null
    /** The limit the provider said was exceeded (its `rate_limit_type`), if it said. */
    exceeded: HeaderReport['exceeded']
  }
  /** A lease was settled (`agent`/`pool` are null when settled by id). */
  settled: { lease: number; agent: U64 | null; pool: number | null; settlement: Settlement }
  /** A lease was not settled within its TTL and was reaped without refund. */
  expired: { lease: number; agent: U64; pool: number }
  /**
   * A pool's safety margin moved (AIMD: cut on 429s, raised by clean minutes, above its
   * start only while estimates and the provider's headers confirm the reserve is idle).
   */
  margin_changed: { pool: number; fromPermille: number; toPermille: number; reason: MarginReason }
  /** A 429 paused new grants for the whole pool until `until`. */
  paused: { pool: number; until: U64 }
  /** An agent's input estimates keep missing by more than the alert threshold. */
  estimate_alert: { agent: U64; errorPermille: number }
  /**
   * A pool's margin has sat at its floor for `margin.floor_alert_ms`: 429s keep coming
   * although the leases stay under the limits, so something outside the coordinator is
   * using this key. `axis` is the binding axis (or `null`); `message` is ready to print.
   */
  margin_at_floor: { pool: number; axis: Axis | null; marginPermille: number; since: U64; message: string }
  /**
   * Remote drivers: the edge limiter could not be reached; leasing locally until it can, at
   * `share` of the quota (1/N for N processes the limiter last saw, or 1).
   */
  fail_open: { reason: string; share: number; message: string }
  /** Remote drivers: the edge limiter answers again. */
  remote_restored: { downMs: number }
  /** Remote drivers: a background report or cancel to the limiter failed. */
  remote_error: { operation: string; message: string }
}

/** Options for {@link Driver}. */
export interface DriverOptions {
  /** Time and timers (default: the system clock). */
  clock?: Clock
}

/** Options for feeding a provider response back (`report`, `callResponse`). */
export interface ReportOptions {
  /**
   * Seen by another process that reported it (a member of a shared limiter), not by this
   * host: a 429 pauses the pool for at most `feedback.max_reported_pause_ms`.
   */
  reported?: boolean
}

/** Options for one `acquire`. */
export interface AcquireOptions {
  /** Withdraws the queued ticket and rejects with `AbortError` (code `aborted`). */
  signal?: AbortSignal | null
}

interface Waiter {
  agent: U64
  pool: number
  queuedAt: number
  resolve: (lease: Lease) => void
  reject: (err: unknown) => void
  signal: AbortSignal | null
  onAbort: (() => void) | null
}

/** A granted lease: send the call, then `settle` it with what the call used. */
export class Lease {
  readonly #driver: Driver
  /** The lease id. */
  readonly id: number
  /** Its agent. */
  readonly agent: U64
  /** Its pool. */
  readonly pool: number
  /** When the coordinator reaps it if unsettled (driver clock, ms); `renew` moves it. */
  get expiresAt(): U64 {
    return this.#expiresAt
  }
  #expiresAt: U64
  /** How long it waited in the queue, ms. */
  readonly waitedMs: number
  #done = false

  /** @internal */
  constructor(driver: Driver, id: number, agent: U64, pool: number, expiresAt: U64, waitedMs: number) {
    this.#driver = driver
    this.id = id
    this.agent = agent
    this.pool = pool
    this.#expiresAt = expiresAt
    this.waitedMs = waitedMs
  }

  /** Whether `settle` or `cancel` has been called. */
  get done(): boolean {
    return this.#done
  }

  /**
   * Reports what the call used; refunds the rest (or records debt). Once per lease. A local
   * lease answers at once; a lease from the edge limiter (`RemoteLease`) with a promise of
   * the settlement: `await lease.settle(usage)` works for both.
   */
  settle(usage: Usage): Settlement | Promise<Settlement> {
    const s = this.#driver.settleLease(this.id, usage, this.agent, this.pool)
    this.#done = true
    return s
  }

  /**
   * Keeps the lease (its reservation and concurrency slot) alive while its call still
   * works, such as a stream whose bytes still flow: its expiry moves to now + the
   * configuration's `lease_ttl_ms`, never past its grant + `max_lease_life_ms` (by default
   * an hour, or `lease_ttl_ms` if longer). Returns the new expiry (also in `expiresAt`). Call it
   * before `expiresAt`; a lease that is done or already expired throws `unknown_lease`, as
   * `settle` does. A lease from the edge limiter (`RemoteLease`) answers with a promise.
   */
  renew(): U64 | Promise<U64> {
    const at = this.#driver.renewLease(this.id)
    this.#expiresAt = at
    return at
  }

  /** @internal Records an expiry the limiter gave (`RemoteLease.renew`). */
  protected renewed(expiresAt: U64): void {
    this.#expiresAt = expiresAt
  }

  /** Returns the lease unused (the call was not sent). */
  cancel(): void {
    this.#driver.cancel(this.id)
    this.#done = true
  }

  /** Reports the provider's response (status and headers) for this lease's call. */
  report(status: number, headers: HeadersLike): HeaderReport {
    return this.#driver.report(this.pool, this.id, status, headers)
  }

  /**
   * The call lifecycle: reports the response for this lease's call and returns the core's
   * next step for it (`deliver`, `wait` then ask again, or `give_up`) with the call's new
   * state. The lease has ended when the core settled it (`settled`: a response that is not
   * a success, as nothing used): the core's answer says so, not the status.
   */
  respond(call: CallState, status: number, headers: HeadersLike): CallResponseResult | Promise<CallResponseResult> {
    const r = this.#driver.callResponse(call, this.pool, this.id, status, headers)
    const ended = (answer: CallResponseResult): CallResponseResult => {
      if (answer.settled !== null) this.#done = true
      return answer
    }
    return r instanceof Promise ? r.then(ended) : ended(r)
  }

  /**
   * The call ended without a usage report (the connection dropped, the agent aborted, a
   * stream broke): settles conservatively, by the core's rule, from what was `seen`.
   */
  interrupted(seen: Usage | null): Settlement | Promise<Settlement> {
    const s = this.#driver.callInterrupted(this.id, seen, this.agent, this.pool)
    this.#done = true
    return s
  }
}

/**
 * What {@link Driver.callLease} hands back: the call's new state, the core's step, and, for
 * `send` and a queued `wait`, the lease (a queued one resolves when it is granted).
 */
export interface CallAsk {
  call: CallState
  step: CallStep
  /**
   * The lease to send under: at once for `send`, on its grant for a queued `wait`; null for
   * a `wait` without a ticket (ask again at `step.until`, on the driver's clock) and `give_up`.
   */
  lease: Promise<Lease> | null
}

/** Response headers: a `Headers`, a plain object, or name/value pairs. */
export type HeadersLike = Headers | Record<string, string | string[] | undefined> | Iterable<[string, string]>

/** Headers as the name/value pairs engines take. */
export function headerPairs(headers: HeadersLike): Array<[string, string]> {
  const out: Array<[string, string]> = []
  if (typeof (headers as Headers).forEach === 'function' && typeof (headers as Headers).get === 'function') {
    ;(headers as Headers).forEach((value, name) => {
      out.push([name, value])
    })
    return out
  }
  if (Symbol.iterator in (headers as object)) {
    for (const [name, value] of headers as Iterable<[string, string]>) out.push([String(name), String(value)])
    return out
  }
  for (const [name, value] of Object.entries(headers as Record<string, string | string[] | undefined>)) {
    if (value === undefined) continue
    if (Array.isArray(value)) for (const v of value) out.push([name, v])
    else out.push([name, String(value)])
  }
  return out
}

/**
 * Leases capacity from an engine on behalf of agents.
 *
 * ```js
 * const lease = await driver.acquire({ agent: 1, pool: 0, inputTokens: 1200, maxTokens: 512 })
 * // ... call the model ...
 * lease.settle({ inputTokens: 1180, outputTokens: 230 })
 * ```
 */
/** How many agent names a driver remembers for its metrics (the most recently used). */
export const MAX_AGENT_NAMES = 4096

export class Driver extends Emitter<DriverEvents> {
  /** The engine this driver drives. */
  readonly engine: Engine
  /** The driver's clock. */
  readonly clock: Clock
  readonly #waiters = new Map<number, Waiter>()
  #timer: unknown = null
  #timerAt = Number.POSITIVE_INFINITY
  #timerAlive = false
  #closed = false
  /** Agent id → the name it was made from (`fetch({ agent: 'alice' })`), most recent last. */
  readonly #names = new Map<number, string>()

  constructor(engine: Engine, options: DriverOptions = {}) {
    super()
    this.engine = engine
    this.clock = options.clock ?? systemClock
  }

  /** The pool index for a name; throws `unknown_pool` naming the known pools. */
  pool(name: string): number {
    const id = this.engine.poolId(name)
    if (id === null) {
      throw new TokenwardenError('unknown_pool', `no pool named ${JSON.stringify(name)}; the configuration has ${this.engine.pools.map((p) => JSON.stringify(p)).join(', ')}`)
    }
    return id
  }

  /** Tickets waiting in the queue for this driver. */
  get waiting(): number {
    return this.#waiters.size
  }

  /**
   * Asks for capacity. Resolves with a {@link Lease} when granted (at once, or when the
   * queue reaches it); rejects with {@link LeaseRejectedError} (carrying `retryAt`) when
   * refused, with `AbortError` when `signal` aborts while queued, and with the engine's
   * coded error for bad input.
   */
  acquire(request: LeaseRequest, options?: AcquireOptions): Promise<Lease> {
    if (this.#closed) return Promise.reject(new TokenwardenError('closed', 'the driver is closed'))
    const signal = options?.signal ?? null
    if (signal?.aborted) return Promise.reject(new AbortedError(signal.reason))
    const now = this.clock.now()
    let d: Decision
    try {
      d = this.engine.requestLease(now, request)
    } catch (e) {
      return Promise.reject(e)
    }
    let result: Promise<Lease>
    switch (d.kind) {
      case 'grant': {
        const lease = new Lease(this, d.lease, request.agent, request.pool, d.expiresAt, 0)
        if (this.listening('granted')) {
          this.emit('granted', { lease: d.lease, agent: request.agent, pool: request.pool, expiresAt: d.expiresAt, waitedMs: 0 })
        }
        result = Promise.resolve(lease)
        break
      }
      case 'queued':
        result = this.#enqueue(d.lease, request, now, Number(d.eta), signal)
        break
      case 'reject':
      case 'never_fits': {
        const retryAt = d.kind === 'reject' ? d.retryAt : null
        if (this.listening('rejected')) {
          this.emit('rejected', { agent: request.agent, pool: request.pool, reason: d.reason, retryAt })
        }
        result = Promise.reject(new LeaseRejectedError(d.reason, retryAt, now))
        break
      }
    }
    this.#afterCall()
    return result
  }

  /**
   * Asks for capacity for one model call, by the core's call lifecycle: `send` (the lease
   * is ready), `wait` in the queue (the lease resolves on its grant; `AbortError` if
   * `signal` aborts first), `wait` until `step.until` and ask again (a refusal; the call keeps
   * its place in the fair order), or `give_up`. Pass `call` back to the call's next step.
   * Throws the engine's coded error for bad input.
   */
  callLease(call: CallState, request: LeaseRequest, options?: AcquireOptions): CallAsk | Promise<CallAsk> {
    if (this.#closed) throw new TokenwardenError('closed', 'the driver is closed')
    const signal = options?.signal ?? null
    if (signal?.aborted) throw new AbortedError(signal.reason)
    const now = this.clock.now()
    const r = this.engine.callLease(now, call, request)
    const step = r.step
    let lease: Promise<Lease> | null = null
    switch (step.kind) {
      case 'send': {
        lease = Promise.resolve(new Lease(this, step.lease, request.agent, request.pool, step.expiresAt, 0))
        if (this.listening('granted')) {
          this.emit('granted', { lease: step.lease, agent: request.agent, pool: request.pool, expiresAt: step.expiresAt, waitedMs: 0 })
        }
        break
      }
      case 'wait':
        if (step.ticket !== null) {
          lease = this.#enqueue(step.ticket, request, now, Number(step.until), signal, step)
        } else {
          if (this.listening('rejected') && step.refusal !== null) {
            this.emit('rejected', { agent: request.agent, pool: request.pool, reason: step.refusal, retryAt: step.until })
          }
        }
        break
      case 'give_up':
        if (this.listening('rejected') && step.refusal !== null) {
          this.emit('rejected', { agent: request.agent, pool: request.pool, reason: step.refusal, retryAt: null })
        }
        break
      case 'deliver':
        break
    }
    this.#afterCall()
    return { call: r.call, step, lease }
  }

  /**
   * The host protocol at the driver's clock: applies one input (the core's `Input`, as
   * {@link Engine.handle} takes it) and answers its `Output`, then delivers the events it
   * produced and re-arms the timer, as the typed methods do. Listeners hear what the typed
   * methods announce (`granted`, `queued`, `rejected`, `rate_limited`, `settled`). A ticket
   * queued this way has no promise: its grant comes as a `granted` event. A `response` or
   * `call_response` without `unixNowMs` is dated by the driver's clock. Throws the
   * engine's coded error for bad input; an input that fails changes nothing.
   */
  handle(input: Input): Output {
    if (this.#closed) throw new TokenwardenError('closed', 'the driver is closed')
    if (input === null || typeof input !== 'object' || Array.isArray(input)) {
      throw invalidArgument(`handle needs an input object ({ op: 'request_lease', … }), got ${input === null ? 'null' : Array.isArray(input) ? 'an array' : typeof input}`, 'input')
    }
    const now = this.clock.now()
    const dated = (input.op === 'response' || input.op === 'call_response') && input.unixNowMs == null ? { ...input, unixNowMs: this.clock.unixNow() } : input
    const out = this.engine.handle(now, dated)
    // A ticket this driver holds a promise for, withdrawn by the input: its waiter ends as
    // with `cancel()`.
    if (out.output === 'cancelled' && input.op === 'cancel') this.#withdrawn(input.lease, new AbortedError('cancelled'))
    if (out.output === 'ended') for (const id of out.withdrawn) this.#withdrawn(id, new AbortedError('the host restarted'))
    this.#announce(input, out, now)
    this.#afterCall()
    return out
  }

  /** Ends the waiter of a ticket that is gone, if this driver has one. */
  #withdrawn(id: number, error: Error): void {
    const w = this.#waiters.get(id)
    if (w === undefined) return
    this.#waiters.delete(id)
    this.#detach(w)
    w.reject(error)
  }

  /** The driver's events for an input applied through {@link handle}. */
  #announce(input: Input, out: Output, now: number): void {
    const asked = input.op === 'request_lease' || input.op === 'call_lease' ? input.request : null
    if (asked !== null) {
      const { agent, pool } = asked
      const refused = (reason: RejectReason, retryAt: U64 | null): void => {
        if (this.listening('rejected')) this.emit('rejected', { agent, pool, reason, retryAt })
      }
      const queued = (lease: number, eta: U64, call?: { expected: U64; checkpoint: boolean }): void => {
        if (!this.listening('queued')) return
        const e = { lease, agent, pool, eta: Number(eta), etaMs: Math.max(0, Number(eta) - now) }
        this.emit('queued', call === undefined ? e : { ...e, expectedMs: Math.max(0, Number(call.expected) - now), checkpoint: call.checkpoint })
      }
      switch (out.output) {
        case 'granted':
        case 'send':
          if (this.listening('granted')) this.emit('granted', { lease: out.lease, agent, pool, expiresAt: out.expiresAt, waitedMs: 0 })
          break
        case 'queued':
          queued(out.lease, out.eta)
          break
        case 'refused':
          refused(out.reason, out.retryAt)
          break
        case 'never_fits':
          refused(out.reason, null)
          break
        case 'wait':
          if (out.wait.ticket !== null) queued(out.wait.ticket, out.wait.until, out.wait)
          else if (out.wait.refusal !== null) refused(out.wait.refusal, out.wait.until)
          break
        case 'give_up':
          if (out.giveUp.refusal !== null) refused(out.giveUp.refusal, null)
          break
      }
      return
    }
    if (input.op === 'response' || input.op === 'call_response') {
      const lease = input.lease ?? null
      const report = 'report' in out ? out.report : undefined
      if (report !== undefined) this.#rateLimited(input.pool, lease, input.status, report)
      const settled = 'settled' in out ? out.settled : undefined
      if (settled !== undefined && lease !== null && this.listening('settled')) this.emit('settled', { lease, agent: null, pool: input.pool, settlement: settled })
      return
    }
    if (out.output === 'settled' && (input.op === 'settle' || input.op === 'call_interrupted') && this.listening('settled')) {
      this.emit('settled', { lease: input.lease, agent: null, pool: null, settlement: out.settlement })
    }
  }

  /** @internal The call lifecycle's response step (see {@link Lease.respond}). */
  callResponse(call: CallState, pool: number, lease: number | null, status: number, headers: HeadersLike, options?: ReportOptions): CallResponseResult | Promise<CallResponseResult> {
    const pairs = headerPairs(headers)
    const r = this.engine.callResponse(this.clock.now(), call, pool, lease, status, pairs, this.clock.unixNow(), options?.reported ?? false)
    this.#rateLimited(pool, lease, status, r.report)
    if (r.settled !== null && lease !== null && this.listening('settled')) {
      this.emit('settled', { lease, agent: null, pool, settlement: r.settled })
    }
    this.#afterCall()
    return r
  }

  /** @internal See {@link Lease.interrupted}. */
  callInterrupted(lease: number, seen: Usage | null, agent: U64 | null, pool: number | null): Settlement | Promise<Settlement> {
    const s = this.#ask({ op: 'call_interrupted', lease, seen }, 'settled').settlement
    if (this.listening('settled')) this.emit('settled', { lease, agent, pool, settlement: s })
    this.#afterCall()
    return s
  }

  #rateLimited(pool: number, lease: number | null, status: number, report: HeaderReport): void {
    if (status === 429 && this.listening('rate_limited')) {
      this.emit('rate_limited', {
        pool,
        lease,
        status,
        retryAfterMs: report.retryAfterMs === null ? null : Number(report.retryAfterMs),
        exceeded: report.exceeded,
      })
    }
  }

  #enqueue(id: number, request: LeaseRequest, now: number, eta: number, signal: AbortSignal | null, call?: { expected: U64; checkpoint: boolean }): Promise<Lease> {
    return new Promise<Lease>((resolve, reject) => {
      const waiter: Waiter = {
        agent: request.agent,
        pool: request.pool,
        queuedAt: now,
        resolve,
        reject,
        signal,
        onAbort: null,
      }
      if (signal !== null) {
        waiter.onAbort = () => {
          if (!this.#waiters.has(id)) return
          this.#waiters.delete(id)
          try {
            this.engine.cancel(this.clock.now(), id)
          } catch {
            // Granted in the same instant and already resolved: nothing to withdraw.
          }
          this.#afterCall()
          reject(new AbortedError(signal.reason))
        }
        signal.addEventListener('abort', waiter.onAbort, { once: true })
      }
      this.#waiters.set(id, waiter)
      if (this.listening('queued')) {
        const e = { lease: id, agent: request.agent, pool: request.pool, eta, etaMs: Math.max(0, eta - now) }
        this.emit('queued', call === undefined ? e : { ...e, expectedMs: Math.max(0, Number(call.expected) - now), checkpoint: call.checkpoint })
      }
    })
  }

  /** Settles a lease by id (see {@link Lease.settle}). */
  settle(lease: number, usage: Usage): Settlement {
    return this.settleLease(lease, usage, null, null)
  }

  /** @internal */
  settleLease(lease: number, usage: Usage, agent: U64 | null, pool: number | null): Settlement {
    const s = this.engine.settle(this.clock.now(), lease, usage)
    if (this.listening('settled')) this.emit('settled', { lease, agent, pool, settlement: s })
    this.#afterCall()
    return s
  }

  /**
   * The engine's output to `input` at the driver's clock, which must be `want`: the typed
   * methods below that have no fast path of their own are this over `Engine.handle`.
   */
  #ask<K extends Output['output']>(input: Input, want: K): Extract<Output, { output: K }> {
    const out = this.engine.handle(this.clock.now(), input)
    if (out.output !== want) throw new Error(`internal: the engine answered ${input.op} with ${out.output}, not ${want}`)
    return out as Extract<Output, { output: K }>
  }

  /** Renews a granted lease by id (see {@link Lease.renew}); returns its new expiry. */
  renew(lease: number): U64 {
    return this.renewLease(lease)
  }

  /** @internal */
  renewLease(lease: number): U64 {
    const at = this.#ask({ op: 'renew', lease }, 'renewed').expiresAt
    this.#afterCall()
    return at
  }

  /** Cancels a lease or queued ticket by id. */
  cancel(lease: number): void {
    this.engine.cancel(this.clock.now(), lease)
    this.#withdrawn(lease, new AbortedError('cancelled'))
    this.#afterCall()
  }

  /**
   * Reports a provider response: resyncs the pool from its rate-limit headers and, on a
   * 429, pauses the pool and (once per lease) cuts the margin. Emits `rate_limited`.
   */
  report(pool: number, lease: number | null, status: number, headers: HeadersLike, options?: ReportOptions): HeaderReport {
    const pairs = headerPairs(headers)
    const report = this.engine.handleResponse(this.clock.now(), pool, lease, status, pairs, this.clock.unixNow(), options?.reported ?? false)
    this.#rateLimited(pool, lease, status, report)
    this.#afterCall()
    return report
  }

  /**
   * Opens a task (or updates an open one's role and unblocks): calls naming it
   * (`request.task`) are weighted by it and charged to it. Opening is optional (a call
   * naming an unknown task opens it); throws `too_many_tasks` when the table is full.
   */
  openTask(spec: TaskSpec): void | Promise<void> {
    this.#ask({ op: 'open_task', task: spec }, 'task_opened')
  }

  /**
   * A failure of an open task, by signature (`failureSignature(testName, diff)`): the same
   * signature twice in a row halves the task's weight. Returns the identical failures in a
   * row. Throws `unknown_task` for a task that is not open.
   */
  taskFailed(task: U64, signature: U64): number | Promise<number> {
    return this.#ask({ op: 'task_failed', task, signature }, 'task_failed').inARow
  }

  /** Ends an open task; returns its figures. Throws `unknown_task` if it is not open. */
  endTask(task: U64, outcome: TaskOutcome): TaskSummary | Promise<TaskSummary> {
    return this.#ask({ op: 'end_task', task, outcome }, 'task_ended').summary
  }

  /**
   * Usage against each limit, the binding axis, queue, margin and each agent's state. An
   * agent made from a name (`fetch({ agent: 'alice' })`, a `family` name) has it beside its
   * id: `name`, and `familyName` for its family's root (`null` where no name is known).
   */
  metrics(): Metrics {
    const m = this.engine.metrics(this.clock.now())
    if (!Array.isArray(m?.agents)) return m
    const nameOf = (id: U64 | undefined, known: string | null | undefined): string | null => (id === undefined || id === null ? null : (this.#names.get(Number(id)) ?? known ?? null))
    m.agents = m.agents.map((a) => {
      const named = { ...a, name: nameOf(a.agent, a.name) }
      if (a.family !== undefined && a.family !== null) named.familyName = nameOf(a.family, a.familyName)
      return named
    })
    return m
  }

  /**
   * Remembers that agent `id` was made from `name`, for {@link Driver.metrics}: the most
   * recent {@link MAX_AGENT_NAMES} names are kept (a name used again moves to the end).
   */
  nameAgent(id: U64, name: string): void {
    const key = Number(id)
    this.#names.delete(key)
    this.#names.set(key, name)
    if (this.#names.size > MAX_AGENT_NAMES) {
      const oldest = this.#names.keys().next().value
      if (oldest !== undefined) this.#names.delete(oldest)
    }
  }

  /**
   * Wakes the engine now (`handleTimeout`), delivers what that produced, and re-arms the
   * timer. The driver's own timer does this; hosts whose timers do not survive (a Durable
   * Object's alarm after an eviction) call it from their own wake-up.
   */
  tick(): void {
    if (this.#closed) return
    this.engine.handleTimeout(this.clock.now())
    this.#afterCall()
  }

  /** When the engine next needs waking (the driver's clock), or `null`. */
  nextWake(): number | null {
    const t = this.engine.pollTimeout()
    return t === null ? null : Number(t)
  }

  /** Rejects every waiter with `closed` (their tickets are cancelled) and stops the timer. */
  close(): void {
    if (this.#closed) return
    this.#closed = true
    const now = this.clock.now()
    for (const [id, w] of this.#waiters) {
      try {
        this.engine.cancel(now, id)
      } catch {
        // Already gone.
      }
      this.#detach(w)
      w.reject(new TokenwardenError('closed', 'the driver was closed while this request was queued'))
    }
    this.#waiters.clear()
    this.#disarm()
  }

  /** Drains engine events, then re-arms the single timer. */
  #afterCall(): void {
    this.#drain()
    this.#arm()
  }

  #drain(): void {
    for (let e = this.engine.pollEvent(); e !== null; e = this.engine.pollEvent()) {
      switch (e.kind) {
        case 'granted': {
          const w = this.#waiters.get(e.lease)
          const waited = Number(e.waitedMs)
          if (w !== undefined) {
            this.#waiters.delete(e.lease)
            this.#detach(w)
            w.resolve(new Lease(this, e.lease, w.agent, w.pool, e.expiresAt, waited))
          }
          if (this.listening('granted')) {
            this.emit('granted', { lease: e.lease, agent: e.agent, pool: e.pool, expiresAt: e.expiresAt, waitedMs: waited })
          }
          break
        }
        case 'expired':
          this.emit('expired', { lease: e.lease, agent: e.agent, pool: e.pool })
          break
        case 'margin_changed':
          this.emit('margin_changed', { pool: e.pool, fromPermille: e.fromPermille, toPermille: e.toPermille, reason: e.reason })
          break
        case 'paused':
          this.emit('paused', { pool: e.pool, until: e.until })
          break
        case 'estimate_alert':
          this.emit('estimate_alert', { agent: e.agent, errorPermille: e.errorPermille })
          break
        case 'revised':
          this.emit('revised', { lease: e.lease, agent: e.agent, pool: e.pool, eta: e.eta })
          break
        case 'margin_at_floor': {
          const name = this.engine.pools[e.pool] ?? String(e.pool)
          const on = e.axis === null ? '' : ` (binding axis: ${e.axis})`
          this.emit('margin_at_floor', {
            pool: e.pool,
            axis: e.axis,
            marginPermille: e.marginPermille,
            since: e.since,
            message: `pool ${name}: the safety margin has sat at its floor (${e.marginPermille / 10} %)${on}: something outside the coordinator is using this key`,
          })
          break
        }
      }
    }
  }

  #detach(w: Waiter): void {
    if (w.signal !== null && w.onAbort !== null) w.signal.removeEventListener('abort', w.onAbort)
  }

  /**
   * One timer for everything: armed for the engine's `pollTimeout()`. A timer that would
   * fire too early is kept (firing early is harmless: `handleTimeout` does nothing yet and
   * the timer is re-armed), so the hot path rarely touches the timer at all.
   */
  #arm(): void {
    if (this.#closed) return
    const next = this.engine.pollTimeout()
    const alive = this.#waiters.size > 0
    if (next === null) {
      // Nothing to wake for: let a pending timer fire early and find nothing (cheaper than
      // clearing and re-creating one around every lease), but never keep the process alive.
      if (this.#timer !== null && alive !== this.#timerAlive) this.#keepAlive(alive)
      return
    }
    const at = Number(next)
    if (this.#timer !== null && this.#timerAt <= at) {
      if (alive !== this.#timerAlive) this.#keepAlive(alive)
      return
    }
    this.#disarm()
    const delay = Math.max(0, Math.min(at - this.clock.now(), 2_147_483_647))
    this.#timerAt = at
    this.#timer = this.clock.setTimer(() => this.#fire(), delay)
    this.#keepAlive(alive)
  }

  #keepAlive(alive: boolean): void {
    this.#timerAlive = alive
    this.clock.keepAlive?.(this.#timer, alive)
  }

  #disarm(): void {
    if (this.#timer !== null) this.clock.clearTimer(this.#timer)
    this.#timer = null
    this.#timerAt = Number.POSITIVE_INFINITY
  }

  #fire(): void {
    this.#timer = null
    this.#timerAt = Number.POSITIVE_INFINITY
    this.tick()
  }
}
