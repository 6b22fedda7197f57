/**
 * A driver whose coordinator is the edge limiter (a Durable Object per quota, over HTTP):
 * the same `acquire` / `Lease` / `fetch()` API as the local driver, so a fleet spread over
 * many machines shares one owner of its quota. When the limiter cannot be reached the
 * driver fails open to its local engine (the same configuration, enforced in this process,
 * with the core's backoff on 429s) and says so with a `fail_open` event; it goes back to the
 * limiter, with a `remote_restored` event, once a request to it succeeds again.
 */
import { type CallAsk, type HeadersLike, Lease, headerPairs } from './driver.js'
import type { Estimator } from './estimator.js'
import { AbortedError, LeaseRejectedError, TokenwardenError } from './errors.js'
import { Tokenwarden } from './tokenwarden.js'
import type { Clock } from './clock.js'
import type { AcquireOptions } from './driver.js'
import type { CallResponseResult, CallState, CallStep, Engine, HeaderReport, LeaseRequest, RejectReason, Settlement, U64, Usage } from './types.js'


/** Options for {@link RemoteTokenwarden}. */
export interface RemoteOptions {
  /** The Worker's origin, e.g. `https://tokenwarden.example.workers.dev`. */
  url: string
  fleet: string
  quota: string
  /** The fleet's bearer secret. */
  secret: string
  /**
   * The local engine: the fallback coordinator while the limiter is unreachable, and the
   * parser of provider headers. Give it the quota's configuration.
   */
  engine: Engine
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

/** A lease held at the edge limiter. `settle` and `cancel` go to it; `report` parses locally and forwards. */
export class RemoteLease extends Lease {
  readonly #remote: RemoteTokenwarden
  /** The limiter's handle for this lease. */
  readonly handle: string
  #ended = false

  /** @internal */
  constructor(remote: RemoteTokenwarden, handle: string, agent: U64, pool: number, expiresAt: U64, waitedMs: number) {
    super(remote, -1, agent, pool, expiresAt, waitedMs)
    this.#remote = remote
    this.handle = handle
  }

  override get done(): boolean {
    return this.#ended
  }

  /** Settles at the limiter; resolves with its settlement. */
  override settle(usage: Usage): Settlement {
    this.#ended = true
    // The remote answer is asynchronous: callers `await` it (the fetch wrapper does).
    return this.#remote.remoteSettle(this, usage) as unknown as Settlement
  }

  override cancel(): void {
    this.#ended = true
    void this.#remote.remoteCancel(this)
  }

  override report(status: number, headers: HeadersLike): HeaderReport {
    return this.#remote.remoteReport(this, status, headers)
  }

  /**
   * The core's step for the response, decided by the local engine (the same core and
   * configuration) so the answer waits for no round trip; the report goes to the limiter,
   * whose core settles the lease there when the response is not a success.
   */
  override respond(call: CallState, status: number, headers: HeadersLike): CallResponseResult {
    if (status < 200 || status > 299) this.#ended = true
    return this.#remote.remoteRespond(this, call, status, headers)
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
 *                                    engine: nativeEngines.create(config, seed, 0) })
 * const client = new Anthropic({ fetch: tw.fetch({ agent: 'planner' }), maxRetries: 0 })
 * tw.on('fail_open', (e) => console.warn(e.message))
 * ```
 */
export class RemoteTokenwarden extends Tokenwarden {
  readonly #o: Required<Omit<RemoteOptions, 'engine' | 'clock' | 'estimator' | 'fetch'>> & { fetch: typeof fetch }
  #downSince: number | null = null

  constructor(options: RemoteOptions) {
    super({
      engine: options.engine,
      ...(options.clock === undefined ? {} : { clock: options.clock }),
      ...(options.estimator === undefined ? {} : { estimator: options.estimator }),
    })
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

  async #call(method: string, path: string, body?: unknown, timeoutMs = this.#o.timeoutMs): Promise<{ status: number; body: Record<string, unknown> }> {
    const url = `${this.#o.url}/v1/fleets/${encodeURIComponent(this.#o.fleet)}/quotas/${encodeURIComponent(this.#o.quota)}${path}`
    let res: Response
    try {
      res = await this.#o.fetch(url, {
        method,
        headers: { authorization: `Bearer ${this.#o.secret}`, 'content-type': 'application/json' },
        body: body === undefined ? null : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      })
    } catch (e) {
      throw new Unreachable(`the edge limiter at ${this.#o.url} did not answer: ${(e as Error).message}`)
    }
    if (res.status >= 500) throw new Unreachable(`the edge limiter answered ${res.status}`)
    let parsed: Record<string, unknown>
    try {
      parsed = (await res.json()) as Record<string, unknown>
    } catch {
      throw new Unreachable(`the edge limiter answered ${res.status} without JSON`)
    }
    if (res.status === 401 || res.status === 403) {
      // Misconfiguration, not an outage: do not fail open silently.
      throw new TokenwardenError('invalid_argument', `the edge limiter refused the fleet secret (${res.status}): ${String(parsed.message ?? '')}`)
    }
    if (this.#downSince !== null) {
      const downMs = this.clock.now() - this.#downSince
      this.#downSince = null
      this.emit('remote_restored', { downMs })
    }
    return { status: res.status, body: parsed }
  }

  #failOpen(e: Unreachable): void {
    if (this.#downSince === null) {
      this.#downSince = this.clock.now()
      this.emit('fail_open', { reason: 'unreachable', message: `${e.message}; leasing locally until it answers again` })
    }
  }

  #remoteUsable(): boolean {
    return this.#downSince === null || this.clock.now() - this.#downSince >= this.#o.retryRemoteMs
  }

  override acquire(request: LeaseRequest, options?: AcquireOptions): Promise<Lease> {
    if (!this.#remoteUsable()) return super.acquire(request, options)
    return this.#remoteAcquire(request, options).catch((e: unknown) => {
      if (e instanceof Unreachable) {
        this.#failOpen(e)
        return super.acquire(request, options)
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
    if (!this.#remoteUsable()) return super.callLease(call, request, options)
    return this.#remoteCallLease(call, request, options).catch((e: unknown) => {
      if (e instanceof Unreachable) {
        this.#failOpen(e)
        return super.callLease(call, request, options)
      }
      throw e
    })
  }

  /** A limiter instant (Unix ms) on this driver's clock. */
  #local(at: U64 | null | undefined): number {
    return this.clock.now() + Math.max(0, Number(at ?? 0) - Date.now())
  }

  async #remoteCallLease(call: CallState, request: LeaseRequest, options?: AcquireOptions): Promise<CallAsk> {
    const signal = options?.signal ?? null
    if (signal?.aborted) throw new AbortedError(signal.reason)
    const r = await this.#call('POST', '/leases', { ...this.#wireRequest(request), call })
    if (r.status === 400) throw new TokenwardenError((r.body.error as 'invalid_argument') ?? 'invalid_argument', String(r.body.message))
    const shown = r.body.step as Record<string, unknown> | undefined
    const next = r.body.call as CallState | undefined
    if (shown === undefined || next === undefined) throw new Unreachable(`unexpected answer from the edge limiter: ${JSON.stringify(r.body)}`)
    if (r.body.kind === 'grant') {
      const expiresAt = Number(r.body.expiresAt)
      const lease = new RemoteLease(this, String(r.body.lease), request.agent, request.pool, expiresAt, 0)
      if (this.listening('granted')) this.emit('granted', { lease: -1, agent: request.agent, pool: request.pool, expiresAt, waitedMs: 0 })
      return { call: next, step: { kind: 'send', lease: -1, expiresAt }, lease: Promise.resolve(lease), retryAt: null }
    }
    if (r.status === 202) {
      const until = this.#local(r.body.eta as number)
      const step = { ...shown, until, ticket: -1 } as CallStep
      const checkpoint = step.kind === 'wait' && step.checkpoint
      if (this.listening('queued')) {
        this.emit('queued', { lease: -1, agent: request.agent, pool: request.pool, eta: until, etaMs: Math.max(0, until - this.clock.now()), checkpoint })
      }
      const lease = this.#awaitTicket(String(r.body.lease), request, signal, this.clock.now())
      return { call: next, step, lease, retryAt: null }
    }
    const step = (shown.kind === 'wait' ? { ...shown, until: this.#local(shown.until as number), ticket: null } : shown) as CallStep
    if (this.listening('rejected')) {
      this.emit('rejected', { agent: request.agent, pool: request.pool, reason: r.body.reason as RejectReason, retryAt: step.kind === 'wait' ? step.until : null })
    }
    return { call: next, step, lease: null, retryAt: step.kind === 'wait' ? Number(step.until) : null }
  }

  #wireRequest(request: LeaseRequest): Record<string, unknown> {
    const poolName = this.engine.pools[request.pool]
    if (poolName === undefined) throw new TokenwardenError('unknown_pool', `no pool ${request.pool}; pools: ${this.engine.pools.join(', ')}`)
    return { ...request, pool: poolName, agent: typeof request.agent === 'bigint' ? request.agent.toString() : request.agent }
  }

  /** Long-polls a queued ticket at the limiter until it is granted; withdraws it on abort. */
  async #awaitTicket(handle: string, request: LeaseRequest, signal: AbortSignal | null, start: number): Promise<Lease> {
    let r: { status: number; body: Record<string, unknown> } = { status: 202, body: {} }
    while (r.status === 202) {
      if (signal?.aborted) {
        await this.#call('DELETE', `/leases/${handle}`).catch(() => {})
        throw new AbortedError(signal.reason)
      }
      const wait = this.#call('GET', `/leases/${handle}?wait=${this.#o.pollMs}`, undefined, this.#o.pollMs + this.#o.timeoutMs)
      if (signal === null) r = await wait
      else {
        try {
          r = await Promise.race([wait, abortable(signal)])
        } catch (e) {
          if (signal.aborted) {
            wait.catch(() => {})
            await this.#call('DELETE', `/leases/${handle}`).catch(() => {})
            throw new AbortedError(signal.reason)
          }
          throw e
        }
      }
      if (r.status === 404) throw new TokenwardenError('unknown_lease', 'the queued ticket ended at the edge limiter')
    }
    if (r.body.kind !== 'grant') throw new Unreachable(`unexpected answer from the edge limiter: ${JSON.stringify(r.body)}`)
    const waited = this.clock.now() - start
    const lease = new RemoteLease(this, String(r.body.lease), request.agent, request.pool, Number(r.body.expiresAt), waited)
    if (this.listening('granted')) {
      this.emit('granted', { lease: -1, agent: request.agent, pool: request.pool, expiresAt: Number(r.body.expiresAt), waitedMs: waited })
    }
    return lease
  }

  async #remoteAcquire(request: LeaseRequest, options?: AcquireOptions): Promise<Lease> {
    const signal = options?.signal ?? null
    const r = await this.#call('POST', '/leases', this.#wireRequest(request))
    if (r.status === 400) throw new TokenwardenError((r.body.error as 'invalid_argument') ?? 'invalid_argument', String(r.body.message))
    const start = this.clock.now()
    if (r.body.kind === 'reject') {
      throw new LeaseRejectedError(r.body.reason as RejectReason, (r.body.retryAt as number | null) ?? null, Date.now())
    }
    if (r.status === 202) {
      const eta = Number(r.body.eta)
      if (this.listening('queued')) {
        this.emit('queued', { lease: -1, agent: request.agent, pool: request.pool, eta, etaMs: Math.max(0, eta - Date.now()) })
      }
      return this.#awaitTicket(String(r.body.lease), request, signal, start)
    }
    if (r.body.kind !== 'grant') throw new Unreachable(`unexpected answer from the edge limiter: ${JSON.stringify(r.body)}`)
    const lease = new RemoteLease(this, String(r.body.lease), request.agent, request.pool, Number(r.body.expiresAt), 0)
    if (this.listening('granted')) {
      this.emit('granted', { lease: -1, agent: request.agent, pool: request.pool, expiresAt: Number(r.body.expiresAt), waitedMs: 0 })
    }
    return lease
  }

  /** @internal */
  async remoteSettle(lease: RemoteLease, usage: Usage): Promise<Settlement> {
    const r = await this.#call('POST', `/leases/${lease.handle}/settle`, usage)
    if (r.status !== 200) throw new TokenwardenError((r.body.error as 'unknown_lease') ?? 'unknown_lease', String(r.body.message))
    const s = r.body as unknown as Settlement
    if (this.listening('settled')) this.emit('settled', { lease: -1, agent: lease.agent, pool: lease.pool, settlement: s })
    return s
  }

  /** @internal */
  async remoteCancel(lease: RemoteLease): Promise<void> {
    try {
      await this.#call('DELETE', `/leases/${lease.handle}`)
    } catch (e) {
      this.emit('remote_error', { operation: 'cancel', message: (e as Error).message })
    }
  }

  /** @internal See {@link RemoteLease.respond}. */
  remoteRespond(lease: RemoteLease, call: CallState, status: number, headers: HeadersLike): CallResponseResult {
    const pairs = headerPairs(headers)
    const r = this.callResponse(call, lease.pool, null, status, pairs) as CallResponseResult
    const poolName = this.engine.pools[lease.pool]
    void this.#call('POST', '/responses', { pool: poolName, lease: lease.handle, status, headers: pairs }).catch((e: Error) => {
      this.emit('remote_error', { operation: 'report', message: e.message })
    })
    return r
  }

  /** @internal See {@link RemoteLease.interrupted}. */
  async remoteInterrupted(lease: RemoteLease, seen: Usage | null): Promise<Settlement> {
    const r = await this.#call('POST', `/leases/${lease.handle}/interrupted`, { seen })
    if (r.status !== 200) throw new TokenwardenError((r.body.error as 'unknown_lease') ?? 'unknown_lease', String(r.body.message))
    const s = r.body as unknown as Settlement
    if (this.listening('settled')) this.emit('settled', { lease: -1, agent: lease.agent, pool: lease.pool, settlement: s })
    return s
  }

  /** @internal Parses the headers locally (for the retry decision) and forwards them. */
  remoteReport(lease: RemoteLease, status: number, headers: HeadersLike): HeaderReport {
    const pairs = headerPairs(headers)
    const report = this.report(lease.pool, null, status, pairs)
    const poolName = this.engine.pools[lease.pool]
    void this.#call('POST', '/responses', { pool: poolName, lease: lease.handle, status, headers: pairs }).catch((e: Error) => {
      this.emit('remote_error', { operation: 'report', message: e.message })
    })
    return report
  }
}

function abortable(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    if (signal.aborted) reject(signal.reason)
    signal.addEventListener('abort', () => reject(signal.reason), { once: true })
  })
}
