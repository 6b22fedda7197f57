/**
 * A driver whose coordinator is the edge limiter (a Durable Object per quota, over HTTP):
 * the same `acquire` / `Lease` / `fetch()` API as the local driver, so a fleet spread over
 * many machines shares one owner of its quota. It is an engine over HTTP: every input (an
 * ask, a provider's answer, a settle, a renew, a cancel, a task) goes to the limiter as the
 * core's own input (`POST …/handle`, edge/API.md) and the limiter's core answers it; only
 * a queued ticket's long poll is a route of its own. When the limiter cannot be reached the
 * driver fails open to its local engine (the same configuration, enforced in this process,
 * with the core's backoff on 429s) and says so with a `fail_open` event; it goes back to the
 * limiter, with a `remote_restored` event, once a request to it succeeds again.
 */
import { type CallAsk, type HeadersLike, Lease, headerPairs } from './driver.js'
import type { Estimator } from './estimator.js'
import { AbortedError, LeaseRejectedError, TokenwardenError } from './errors.js'
import { Tokenwarden } from './tokenwarden.js'
import { type Clock, sleep } from './clock.js'
import { providerRules } from './rules.js'
import type { AcquireOptions } from './driver.js'
import { ENGINE_ERROR_CODES } from './abi.js'
import type { ErrorCode } from './errors.js'
import type {
  CallResponseResult,
  CallState,
  CallStep,
  Engine,
  EngineFactory,
  HeaderReport,
  Input,
  LeaseRequest,
  Output,
  Settlement,
  TaskOutcome,
  TaskSpec,
  TaskSummary,
  U64,
  Usage,
  Wait,
} from './types.js'

/** What a fallback must offer for tasks. */
type TaskOps = Pick<Tokenwarden, 'openTask' | 'taskFailed' | 'endTask'>

/** Options for {@link RemoteTokenwarden}. */
export interface RemoteOptions {
  /** The Worker's origin, e.g. `https://tokenwarden.example.workers.dev`. */
  url: string
  fleet: string
  quota: string
  /** The fleet's bearer secret. */
  secret: string
  /**
   * The engines (`nativeEngines`, `wasmEngines`): the local engine (the parser of provider
   * headers) is made from them with `config`, and, while the limiter is unreachable, a
   * fallback coordinator holding a share of the quota — every limit divided by the number
   * of processes the limiter last saw on it — so N processes failing open together admit
   * about the quota, never N times it.
   */
  engine: EngineFactory
  /** The quota's core configuration (as the limiter has it). */
  config: object
  /**
   * How many processes share the quota, for the fallback's share while the limiter has not
   * answered yet (1 to 4096). Without it a process that never reached the limiter leases
   * nothing locally (`limiter_unreachable`): it would not know its share. Once the limiter
   * answers, the count it reports is used.
   */
  processes?: number
  clock?: Clock
  estimator?: Estimator
  /** The `fetch` used to reach the limiter (default `globalThis.fetch`). */
  fetch?: typeof fetch
  /** Per-request timeout towards the limiter, ms (default 5000). */
  timeoutMs?: number
  /** Long-poll length for queued tickets, ms (default 25000; the limiter caps it at 30000). */
  pollMs?: number
  /** After a failure, how long to stay on the local engine before trying the limiter again, ms (default 5000). */
  retryRemoteMs?: number
}

class Unreachable extends Error {}

/** The limiter's lease id inside a handle (`tw1.<fleet>.<quota>.<id>.<mac>`), or -1. */
export function handleId(handle: string): number {
  const id = Number(handle.split('.')[3])
  return Number.isSafeInteger(id) ? id : -1
}

/** A lease held at the edge limiter. `settle` and `cancel` go to it; `report` parses locally and forwards. */
export class RemoteLease extends Lease {
  readonly #remote: RemoteTokenwarden
  /** The limiter's handle for this lease. */
  readonly handle: string
  #ended = false

  /** @internal */
  constructor(remote: RemoteTokenwarden, handle: string, agent: U64, pool: number, expiresAt: U64, waitedMs: number) {
    super(remote, handleId(handle), agent, pool, expiresAt, waitedMs)
    this.#remote = remote
    this.handle = handle
  }

  override get done(): boolean {
    return this.#ended
  }

  /** Settles at the limiter; resolves with its settlement. */
  override settle(usage: Usage): Promise<Settlement> {
    this.#ended = true
    return this.#remote.remoteSettle(this, usage)
  }

  override cancel(): void {
    this.#ended = true
    void this.#remote.remoteCancel(this)
  }

  /**
   * Renews at the limiter (`POST …/leases/<handle>/renew`, answered `200 { expiresAt }`);
   * resolves with the new expiry, on the limiter's clock. An ended lease rejects with
   * `unknown_lease`.
   */
  override renew(): Promise<U64> {
    if (this.#ended) return Promise.reject(new TokenwardenError('unknown_lease', 'the lease has ended'))
    return this.#remote.remoteRenew(this).then((at) => {
      this.renewed(at)
      return at
    })
  }

  override report(status: number, headers: HeadersLike): HeaderReport {
    return this.#remote.remoteReport(this, status, headers)
  }

  /**
   * The core's step for the response, decided by the limiter's core: the response goes to
   * it (which settles the lease there when it is not a success) and its step comes back.
   * The local engine decides only when the limiter cannot answer for the lease.
   */
  override respond(call: CallState, status: number, headers: HeadersLike): Promise<CallResponseResult> {
    // Ended when the limiter's core settled it (a response that is not a success), as its
    // answer says.
    return this.#remote.remoteRespond(this, call, status, headers).then((answer) => {
      if (answer.settled !== null) this.#ended = true
      return answer
    })
  }

  /** Settles at the limiter by the core's conservative rule; resolves with its settlement. */
  override interrupted(seen: Usage | null): Promise<Settlement> {
    this.#ended = true
    return this.#remote.remoteInterrupted(this, seen)
  }
}

/**
 * A `Tokenwarden` backed by the edge limiter (its `fetch()` and estimator are inherited):
 *
 * ```js
 * const tw = new RemoteTokenwarden({ url, fleet: 'fleet-a', quota: 'anthropic-main', secret,
 *                                    engine: nativeEngines, config })
 * const client = new Anthropic({ fetch: tw.fetch({ agent: 'planner' }), maxRetries: 0 })
 * tw.on('fail_open', (e) => console.warn(e.message))
 * ```
 */
export class RemoteTokenwarden extends Tokenwarden {
  readonly #o: Required<Omit<RemoteOptions, 'engine' | 'config' | 'processes' | 'clock' | 'estimator' | 'fetch'>> & { fetch: typeof fetch }
  #downSince: number | null = null
  /** This process, to the limiter: it counts the processes sharing the quota. */
  readonly #client = randomId()
  /** Processes the limiter last saw on the quota (this one included); `processes` or null until it answers. */
  #clients: number | null
  readonly #factory: { engines: EngineFactory; config: object }
  /** The fallback while failed open, when built as a share of the quota. */
  #fallback: ShareTokenwarden | null = null

  constructor(options: RemoteOptions) {
    if (!isFactory(options.engine as Engine | EngineFactory)) {
      throw new TypeError(
        'RemoteTokenwarden needs `engine` as engines (nativeEngines or wasmEngines) with `config`, not an engine instance: while the limiter is unreachable it leases from a share of the quota (1/N of every limit), never the whole quota in each process',
      )
    }
    if (options.config === undefined || options.config === null) throw new TypeError("RemoteTokenwarden needs `config`: the quota's core configuration")
    const p = options.processes
    if (p !== undefined && !(Number.isSafeInteger(p) && p >= 1 && p <= 4096)) throw new TypeError(`\`processes\` must be a whole number from 1 to 4096, got ${String(p)}`)
    super({
      engine: options.engine,
      config: options.config,
      ...(options.clock === undefined ? {} : { clock: options.clock }),
      ...(options.estimator === undefined ? {} : { estimator: options.estimator }),
    })
    this.#factory = { engines: options.engine, config: options.config }
    this.#clients = p ?? null
    this.#o = {
      url: options.url.replace(/\/+$/, ''),
      fleet: options.fleet,
      quota: options.quota,
      secret: options.secret,
      fetch: options.fetch ?? ((input, init) => globalThis.fetch(input, init)),
      timeoutMs: options.timeoutMs ?? 5000,
      pollMs: options.pollMs ?? 25_000,
      retryRemoteMs: options.retryRemoteMs ?? 5000,
    }
  }

  /** Whether leases currently come from the local engine (the limiter is unreachable). */
  get failedOpen(): boolean {
    return this.#downSince !== null
  }

  async #call(method: string, path: string, body?: unknown, timeoutMs = this.#o.timeoutMs, abort: AbortSignal | null = null): Promise<{ status: number; body: Record<string, unknown> }> {
    const url = `${this.#o.url}/v1/fleets/${encodeURIComponent(this.#o.fleet)}/quotas/${encodeURIComponent(this.#o.quota)}${path}`
    const started = this.clock.now()
    let res: Response
    let parsed: Record<string, unknown> | null
    for (;;) {
      try {
        res = await this.#o.fetch(url, {
          method,
          headers: { authorization: `Bearer ${this.#o.secret}`, 'content-type': 'application/json', 'x-tokenwarden-client': this.#client },
          body: body === undefined ? null : JSON.stringify(body),
          signal: abort === null ? AbortSignal.timeout(timeoutMs) : AbortSignal.any([AbortSignal.timeout(timeoutMs), abort]),
        })
      } catch (e) {
        if (abort?.aborted) throw new AbortedError(abort.reason)
        throw new Unreachable(`the edge limiter at ${this.#o.url} did not answer: ${(e as Error).message}`)
      }
      try {
        const j: unknown = await res.json()
        parsed = j !== null && typeof j === 'object' && !Array.isArray(j) ? (j as Record<string, unknown>) : null
      } catch {
        parsed = null
      }
      const code = typeof parsed?.error === 'string' ? parsed.error : null
      // Read it, report a refused secret, ask again while an owner moves, or fail open: the
      // gateway crate's rule, which knows the limiter's codes.
      const waited = Math.max(0, Math.floor(this.clock.now() - started))
      const verdict = JSON.parse(providerRules().limiterAnswer(res.status, code, res.headers.get('retry-after'), waited, Math.ceil(timeoutMs))) as {
        do: 'read' | 'refused' | 'retry' | 'unreachable'
        afterMs?: number
      }
      if (verdict.do === 'retry') {
        try {
          await sleep(this.clock, verdict.afterMs ?? 0, abort)
        } catch {
          throw new AbortedError(abort?.reason)
        }
        continue
      }
      if (verdict.do === 'refused') {
        // Misconfiguration, not an outage: do not fail open silently.
        throw new TokenwardenError('invalid_argument', `the edge limiter refused the fleet secret (${res.status}): ${String(parsed?.message ?? '')}`)
      }
      if (verdict.do === 'unreachable') throw new Unreachable(`the edge limiter answered ${res.status}${code === null ? '' : ` (${code})`}`)
      if (parsed === null) throw new Unreachable(`the edge limiter answered ${res.status} without JSON`)
      break
    }
    // The processes sharing the quota, within the core's bound on a share (`share`: 1 to 4096).
    if (typeof parsed.clients === 'number' && Number.isSafeInteger(parsed.clients) && parsed.clients >= 1 && parsed.clients <= 4096) this.#clients = parsed.clients
    if (this.#downSince !== null) {
      const downMs = this.clock.now() - this.#downSince
      this.#downSince = null
      this.emit('remote_restored', { downMs })
    }
    return { status: res.status, body: parsed }
  }

  #failOpen(e: Unreachable): void {
    if (this.#downSince !== null) return
    this.#downSince = this.clock.now()
    this.#why = e.message
    const n = this.#clients
    if (n === null) {
      this.emit('fail_open', {
        reason: 'unreachable',
        share: 0,
        message: `${e.message}; it has not answered yet, so how many processes share the quota is not known: nothing is leased here until it answers (give \`processes\` to lease 1/processes meanwhile)`,
      })
      return
    }
    if (this.#fallback === null || this.#fallback.share !== n) {
      this.#fallback?.close()
      this.#fallback = new ShareTokenwarden(this.#factory.engines, shareOf(this.#factory.config, n), this.clock, this.estimator, n)
    }
    const share = n === 1 ? 'the whole quota (the limiter saw no other process on it)' : `1/${n} of the quota (the limiter last saw ${n} processes on it)`
    this.emit('fail_open', { reason: 'unreachable', share: 1 / n, message: `${e.message}; leasing locally at ${share} until it answers again` })
  }

  /** Why the limiter was last unreachable. */
  #why = ''

  /** The coordinator while failed open: the share-sized fallback (none before the limiter ever answered). */
  #local(): Tokenwarden {
    if (this.#fallback === null) {
      throw new TokenwardenError(
        'limiter_unreachable',
        `${this.#why}; it has not answered yet, so this process's share of the quota is not known and nothing is leased here (give \`processes\` to lease 1/processes meanwhile)`,
      )
    }
    return this.#fallback
  }

  #remoteUsable(): boolean {
    return this.#downSince === null || this.clock.now() - this.#downSince >= this.#o.retryRemoteMs
  }

  override acquire(request: LeaseRequest, options?: AcquireOptions): Promise<Lease> {
    const local = (): Promise<Lease> => {
      try {
        return this.#local().acquire(request, options)
      } catch (e) {
        return Promise.reject(e)
      }
    }
    if (!this.#remoteUsable()) return local()
    return this.#remoteAcquire(request, options).catch((e: unknown) => {
      if (e instanceof Unreachable) {
        this.#failOpen(e)
        return local()
      }
      throw e
    })
  }

  /**
   * The call lifecycle at the limiter: its core decides (`call` goes with the ask, so its
   * give-up and checkpoint rules apply across asks); falls open to the local engine when
   * the limiter cannot be reached.
   */
  override callLease(call: CallState, request: LeaseRequest, options?: AcquireOptions): CallAsk | Promise<CallAsk> {
    const local = (): CallAsk | Promise<CallAsk> => this.#local().callLease(call, request, options)
    if (!this.#remoteUsable()) return local()
    return this.#remoteCallLease(call, request, options).catch((e: unknown) => {
      if (e instanceof Unreachable) {
        this.#failOpen(e)
        return local()
      }
      throw e
    })
  }

  override close(): void {
    this.#fallback?.close()
    super.close()
  }

  /**
   * Not over HTTP: the limiter's protocol is asynchronous (`acquire`, `callLease`, a lease's
   * `respond`, `settle`, … send each input to it). Throws, rather than apply the input to
   * the local engine behind the limiter's back.
   */
  override handle(input: Input): Output {
    throw new TokenwardenError(
      'invalid_argument',
      `RemoteTokenwarden.handle(${JSON.stringify(input?.op)}): the remote driver sends inputs to the edge limiter through its typed methods (acquire, callLease, a lease's respond, settle, renew, cancel, interrupted, the task methods); POST …/handle takes them over HTTP`,
    )
  }

  /** A limiter instant (Unix ms) on this driver's clock. */
  #onClock(at: U64 | null | undefined): number {
    return this.clock.now() + Math.max(0, Number(at ?? 0) - Date.now())
  }

  /**
   * One input of the core's host protocol at the limiter (`POST …/handle`): its output,
   * leases as the limiter's handles both ways. An error the limiter answers (a bad input,
   * an unknown lease) is thrown with its code; `Unreachable` when it cannot answer.
   */
  async #handle(input: Record<string, unknown>): Promise<WireOutput> {
    const r = await this.#call('POST', '/handle', input)
    if (r.status === 404 && r.body.error === 'not_found') {
      throw new TokenwardenError(
        'invalid_argument',
        `the edge limiter at ${this.#o.url} answered 404 for POST …/handle: ${String(r.body.message ?? '')} (no such fleet or quota, or a Worker older than this driver, which speaks the core's protocol there)`,
      )
    }
    if (r.status !== 200) {
      const code = typeof r.body.error === 'string' && (LIMITER_CODES as readonly string[]).includes(r.body.error) ? (r.body.error as ErrorCode) : 'invalid_argument'
      const field = typeof r.body.field === 'string' ? { field: r.body.field } : undefined
      throw new TokenwardenError(code, `the edge limiter answered ${r.status} (${String(r.body.error)}): ${String(r.body.message ?? '')}`, field)
    }
    if (typeof r.body.output !== 'string') throw new Unreachable(`unexpected answer from the edge limiter: ${JSON.stringify(r.body)}`)
    return r.body as WireOutput
  }

  /** A call step from the limiter's output: a wait's `until` on this driver's clock, a ticket by its id. */
  #step(out: WireOutput): CallStep {
    switch (out.output) {
      case 'send':
        return { kind: 'send', lease: handleId(out.lease), expiresAt: out.expiresAt }
      case 'wait':
        return { kind: 'wait', ...out.wait, until: this.#onClock(out.wait.until), expected: this.#onClock(out.wait.expected), ticket: out.wait.ticket === null ? null : handleId(out.wait.ticket) }
      case 'give_up':
        return { kind: 'give_up', ...out.giveUp }
      case 'deliver':
        return { kind: 'deliver' }
      default:
        throw new Unreachable(`unexpected answer from the edge limiter: ${out.output} is not a call step`)
    }
  }

  async #remoteCallLease(call: CallState, request: LeaseRequest, options?: AcquireOptions): Promise<CallAsk> {
    const signal = options?.signal ?? null
    if (signal?.aborted) throw new AbortedError(signal.reason)
    const out = await this.#handle({ op: 'call_lease', call, request: this.#wireRequest(request) })
    const step = this.#step(out)
    const { agent, pool } = request
    if (out.output === 'send') {
      const lease = new RemoteLease(this, out.lease, agent, pool, Number(out.expiresAt), 0)
      if (this.listening('granted')) this.emit('granted', { lease: lease.id, agent, pool, expiresAt: Number(out.expiresAt), waitedMs: 0 })
      return { call: out.call, step, lease: Promise.resolve(lease) }
    }
    if (out.output === 'wait' && out.wait.ticket !== null && step.kind === 'wait') {
      if (this.listening('queued')) {
        const now = this.clock.now()
        this.emit('queued', {
          lease: handleId(out.wait.ticket),
          agent,
          pool,
          eta: step.until,
          etaMs: Math.max(0, Number(step.until) - now),
          expectedMs: Math.max(0, Number(step.expected) - now),
          checkpoint: step.checkpoint,
        })
      }
      return { call: out.call, step, lease: this.#awaitTicket(out.wait.ticket, out.wait.until, request, signal, this.clock.now()) }
    }
    if (this.listening('rejected')) {
      if (step.kind === 'wait' && step.refusal !== null) this.emit('rejected', { agent, pool, reason: step.refusal, retryAt: step.until })
      if (step.kind === 'give_up' && step.refusal !== null) this.emit('rejected', { agent, pool, reason: step.refusal, retryAt: null })
    }
    return { call: (out as { call: CallState }).call, step, lease: null }
  }

  #wireRequest(request: LeaseRequest): Record<string, unknown> {
    const poolName = this.engine.pools[request.pool]
    if (poolName === undefined) throw new TokenwardenError('unknown_pool', `no pool ${request.pool}; pools: ${this.engine.pools.join(', ')}`)
    return { ...request, pool: poolName, agent: typeof request.agent === 'bigint' ? request.agent.toString() : request.agent }
  }

  /**
   * Long-polls a queued ticket at the limiter until it is granted. On abort the poll itself
   * is aborted (nothing keeps running, nor the process alive) and the ticket withdrawn.
   */
  async #awaitTicket(handle: string, eta: U64, request: LeaseRequest, signal: AbortSignal | null, start: number): Promise<Lease> {
    const withdraw = async (): Promise<never> => {
      await this.#handle({ op: 'cancel', lease: handle }).catch(() => {})
      throw new AbortedError(signal?.reason)
    }
    let r: { status: number; body: Record<string, unknown> } = { status: 202, body: {} }
    let promised = Number(eta)
    while (r.status === 202) {
      // The limiter answers a poll early with a promise it has revised.
      const revised = r.body.eta
      if ((typeof revised === 'number' || typeof revised === 'bigint') && Number(revised) !== promised) {
        promised = Number(revised)
        if (this.listening('revised')) this.emit('revised', { lease: handleId(handle), agent: request.agent, pool: request.pool, eta: this.#onClock(revised) })
      }
      if (signal?.aborted) return withdraw()
      try {
        r = await this.#call('GET', `/leases/${handle}?wait=${this.#o.pollMs}`, undefined, this.#o.pollMs + this.#o.timeoutMs, signal)
      } catch (e) {
        if (e instanceof AbortedError) return withdraw()
        throw e
      }
      if (r.status === 404) throw new TokenwardenError('unknown_lease', 'the queued ticket ended at the edge limiter')
    }
    if (r.body.kind !== 'grant') throw new Unreachable(`unexpected answer from the edge limiter: ${JSON.stringify(r.body)}`)
    const waited = this.clock.now() - start
    const lease = new RemoteLease(this, String(r.body.lease), request.agent, request.pool, Number(r.body.expiresAt), waited)
    if (this.listening('granted')) {
      this.emit('granted', { lease: lease.id, agent: request.agent, pool: request.pool, expiresAt: Number(r.body.expiresAt), waitedMs: waited })
    }
    return lease
  }

  async #remoteAcquire(request: LeaseRequest, options?: AcquireOptions): Promise<Lease> {
    const signal = options?.signal ?? null
    const out = await this.#handle({ op: 'request_lease', request: this.#wireRequest(request) })
    const start = this.clock.now()
    const { agent, pool } = request
    switch (out.output) {
      case 'granted': {
        const lease = new RemoteLease(this, out.lease, agent, pool, Number(out.expiresAt), 0)
        if (this.listening('granted')) this.emit('granted', { lease: lease.id, agent, pool, expiresAt: Number(out.expiresAt), waitedMs: 0 })
        return lease
      }
      case 'queued': {
        const eta = this.#onClock(out.eta)
        if (this.listening('queued')) this.emit('queued', { lease: handleId(out.lease), agent, pool, eta, etaMs: Math.max(0, eta - start) })
        return this.#awaitTicket(out.lease, out.eta, request, signal, start)
      }
      case 'refused':
      case 'never_fits': {
        const retryAt = out.output === 'refused' ? this.#onClock(out.retryAt) : null
        if (this.listening('rejected')) this.emit('rejected', { agent, pool, reason: out.reason, retryAt })
        throw new LeaseRejectedError(out.reason, retryAt, start)
      }
      default:
        throw new Unreachable(`unexpected answer from the edge limiter to request_lease: ${out.output}`)
    }
  }

  /** Tasks open at the limiter, by id: opened again locally if it cannot be reached. */
  readonly #tasks = new Map<string, TaskSpec>()

  /**
   * Tasks live at the limiter, with its figures; while it cannot be reached they go to the
   * local engine (opened there on first use), whose figures then cover them.
   */
  override async openTask(spec: TaskSpec): Promise<void> {
    const key = String(spec.task)
    try {
      if (!this.#remoteUsable()) throw new Unreachable('the edge limiter is failed open')
      await this.#handle({ op: 'open_task', task: { task: Number(spec.task), role: spec.role ?? 'worker', unblocks: spec.unblocks ?? 0 } })
    } catch (e) {
      if (!(e instanceof Unreachable)) throw e
      this.#failOpen(e)
      await this.#base().openTask(spec)
    }
    this.#tasks.set(key, spec)
    // Bounded like the core's table: the oldest open task is forgotten first.
    if (this.#tasks.size > 4096) this.#tasks.delete(this.#tasks.keys().next().value as string)
  }

  override async taskFailed(task: U64, signature: U64): Promise<number> {
    return this.#taskOp(
      task,
      { op: 'task_failed', task: Number(task), signature: Number(signature) },
      (tw) => tw.taskFailed(task, signature),
      (out) => Number((out as { inARow: number }).inARow),
    )
  }

  override async endTask(task: U64, outcome: TaskOutcome): Promise<TaskSummary> {
    const summary = await this.#taskOp(
      task,
      { op: 'end_task', task: Number(task), outcome },
      (tw) => tw.endTask(task, outcome),
      (out) => (out as { summary: TaskSummary }).summary,
    )
    this.#tasks.delete(String(task))
    return summary
  }

  /** The local coordinator's task operations while failed open: the share fallback's. */
  #base(): TaskOps {
    return this.#local()
  }

  /** A task input at the limiter (its output, `read`), or locally while it cannot be reached. */
  async #taskOp<T>(task: U64, input: Record<string, unknown>, local: (tw: TaskOps) => T | Promise<T>, read: (out: WireOutput) => T): Promise<T> {
    try {
      if (!this.#remoteUsable()) throw new Unreachable('the edge limiter is failed open')
      return read(await this.#handle(input))
    } catch (e) {
      if (!(e instanceof Unreachable)) throw e
      this.#failOpen(e)
      const tw = this.#base()
      const spec = this.#tasks.get(String(task))
      // The limiter held the task: open it here so the local engine can carry on with it.
      if (spec !== undefined) {
        try {
          await tw.openTask(spec)
        } catch {
          // Already open here, or the local table is full: the operation says which.
        }
      }
      return local(tw)
    }
  }

  /** @internal */
  async remoteSettle(lease: RemoteLease, usage: Usage): Promise<Settlement> {
    const out = await this.#handle({ op: 'settle', lease: lease.handle, usage })
    return this.#settled(lease, out)
  }

  /** The settlement in an output of `settle` or `call_interrupted`, announced. */
  #settled(lease: RemoteLease, out: WireOutput): Settlement {
    if (out.output !== 'settled') throw new Unreachable(`unexpected answer from the edge limiter to a settle: ${out.output}`)
    if (this.listening('settled')) this.emit('settled', { lease: lease.id, agent: lease.agent, pool: lease.pool, settlement: out.settlement })
    return out.settlement
  }

  /** @internal See {@link RemoteLease.renew}. */
  async remoteRenew(lease: RemoteLease): Promise<U64> {
    const out = await this.#handle({ op: 'renew', lease: lease.handle })
    if (out.output !== 'renewed') throw new Unreachable(`unexpected answer from the edge limiter to a renew: ${out.output}`)
    return out.expiresAt
  }

  /** @internal */
  async remoteCancel(lease: RemoteLease): Promise<void> {
    try {
      await this.#handle({ op: 'cancel', lease: lease.handle })
    } catch (e) {
      this.emit('remote_error', { operation: 'cancel', message: (e as Error).message })
    }
  }

  /**
   * @internal See {@link RemoteLease.respond}. One core decides a call's next step: while
   * the limiter answers, its own (the step it returns, a wait's `until` moved onto this
   * driver's clock, and the call state it kept); the local engine, the fallback while the
   * limiter is unreachable, then only takes the headers in (`report`: its pools stay in
   * step with the provider's). The local engine decides only when the limiter cannot
   * answer for the lease (it is unreachable, or no longer knows the lease), which is
   * reported as a `remote_error`.
   */
  async remoteRespond(lease: RemoteLease, call: CallState, status: number, headers: HeadersLike): Promise<CallResponseResult> {
    const pairs = headerPairs(headers)
    const poolName = this.engine.pools[lease.pool]
    let answer: CallResponseResult
    try {
      const out = await this.#handle({ op: 'call_response', call, pool: poolName, lease: lease.handle, status, headers: pairs })
      const r = out as { call: CallState; settled?: Settlement; report: HeaderReport }
      answer = { call: r.call, step: this.#step(out), settled: r.settled ?? null, report: r.report }
    } catch (e) {
      this.emit('remote_error', { operation: 'report', message: `${(e as Error).message}; the local engine decided` })
      return this.callResponse(call, lease.pool, null, status, pairs) as CallResponseResult
    }
    try {
      this.report(lease.pool, null, status, pairs)
    } catch (e) {
      // The limiter has the response and decided; the fallback missed one reading.
      this.emit('remote_error', { operation: 'report', message: `the local engine could not take the headers in: ${(e as Error).message}` })
    }
    return answer
  }

  /** @internal See {@link RemoteLease.interrupted}. */
  async remoteInterrupted(lease: RemoteLease, seen: Usage | null): Promise<Settlement> {
    const out = await this.#handle({ op: 'call_interrupted', lease: lease.handle, seen })
    return this.#settled(lease, out)
  }

  /** @internal Parses the headers locally (for the retry decision) and forwards them. */
  remoteReport(lease: RemoteLease, status: number, headers: HeadersLike): HeaderReport {
    const pairs = headerPairs(headers)
    const report = this.report(lease.pool, null, status, pairs)
    const poolName = this.engine.pools[lease.pool]
    void this.#handle({ op: 'response', pool: poolName, lease: lease.handle, status, headers: pairs }).catch((e: Error) => {
      this.emit('remote_error', { operation: 'report', message: e.message })
    })
    return report
  }
}

/**
 * An output of the limiter's core (`POST …/handle`): the core's `Output`, with leases as
 * the limiter's handles.
 */
type WireOutput =
  | { output: 'granted'; lease: string; expiresAt: U64 }
  | { output: 'queued'; lease: string; eta: U64 }
  | { output: 'send'; call: CallState; lease: string; expiresAt: U64 }
  | { output: 'wait'; call: CallState; wait: Omit<Wait, 'ticket'> & { ticket: string | null }; settled?: Settlement; report?: HeaderReport }
  | Exclude<Output, { output: 'granted' | 'queued' | 'send' | 'wait' }>

/** The error codes a limiter's answer keeps (any other is `invalid_argument`). */
const LIMITER_CODES = [...ENGINE_ERROR_CODES, 'rejected', 'closed'] as const

/** A random id for this process (not a secret: it only lets the limiter count processes). */
function randomId(): string {
  const bytes = new Uint8Array(12)
  crypto.getRandomValues(bytes)
  return Array.from(bytes, (b) => b.toString(36).padStart(2, '0'))
    .join('')
    .slice(0, 24)
}

function isFactory(e: Engine | EngineFactory): e is EngineFactory {
  return typeof (e as EngineFactory).create === 'function' && typeof (e as Engine).requestLease !== 'function'
}

/**
 * `config` for one of `n` processes splitting the key: the core's `share` (every limit, and
 * every figure the provider reports for the key, counts `1/n`; the core does the sums).
 */
export function shareOf(config: object, n: number): object {
  const c = typeof config === 'string' ? (JSON.parse(config) as Record<string, unknown>) : (config as Record<string, unknown>)
  return { ...c, share: n }
}

/** The fallback of a remote driver that failed open: a local coordinator for a share of the quota. */
class ShareTokenwarden extends Tokenwarden {
  readonly share: number
  constructor(engines: EngineFactory, config: object, clock: Clock, estimator: Estimator, share: number) {
    super({ engine: engines, config, clock, estimator })
    this.share = share
  }
}
