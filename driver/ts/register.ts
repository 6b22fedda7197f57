/**
 * An {@link Engine} over a binding's coordinator with a register file: the hot calls
 * (`requestLease`, `settle`, `cancel`, `handleTimeout`, `pollEvent`, and the call
 * lifecycle's `callLease`, `callResponse` and `handleResponse`, whose headers cross as one
 * string) pass their numbers through a private `Float64Array` (layouts and codes in `abi.ts`, generated from the Rust crate
 * `tokenwarden-js-abi`) instead
 * of objects, which cost ~100 ns a property to cross into native code or wasm. Values that
 * do not fit a `number` exactly (bigints) take the binding's object methods. The addon and
 * the wasm build both implement the binding side, so both engines share this code.
 */
import {
  AXES,
  DECISION_GRANT,
  DECISION_NEVER,
  DECISION_QUEUED,
  EVENTS,
  EXCHANGE_EVENTS,
  GIVE_UP_REASONS,
  IO_SLOTS,
  LEASE_REQUEST_FIELDS,
  MARGIN_REASONS,
  RATE_AXES,
  REJECT_REASONS,
  ROLES,
  SLOT_AFTER_EVENTS,
  SLOT_AFTER_TIMEOUT,
  SLOT_ARG_CALL,
  SLOT_ARG_LEASE,
  SLOT_ARG_NOW,
  SLOT_ARG_REQUEST,
  SLOT_ARG_USAGE,
  SLOT_CALL_ATTEMPTS,
  SLOT_CALL_CHECKPOINT,
  SLOT_CALL_EXPECTED,
  SLOT_CALL_FAILED,
  SLOT_CALL_GIVE_UP_RETRY_AFTER_MS,
  SLOT_CALL_INSTANT,
  SLOT_CALL_LAST_RETRY_AFTER_MS,
  SLOT_CALL_LEASE,
  SLOT_CALL_REASON,
  SLOT_CALL_REFUSAL,
  SLOT_CALL_REFUSAL_AXIS,
  SLOT_CALL_REFUSALS,
  SLOT_CALL_RESERVED,
  SLOT_CALL_SETTLED,
  SLOT_CALL_USED,
  SLOT_DECISION_AXIS,
  SLOT_DECISION_INSTANT,
  SLOT_DECISION_LEASE,
  SLOT_DECISION_REASON,
  SLOT_RATE_AXIS_GRANULARITY,
  SLOT_RATE_AXIS_LIMIT,
  SLOT_RATE_AXIS_REMAINING,
  SLOT_RATE_AXIS_RESET_AFTER_MS,
  SLOT_RATE_AXIS_WIDTH,
  SLOT_REPORT_AXES,
  SLOT_REPORT_EXCEEDED,
  SLOT_REPORT_MALFORMED,
  SLOT_REPORT_RECOGNISED,
  SLOT_REPORT_RESET_AT_MS,
  SLOT_REPORT_RETRY_AFTER_MS,
  SLOT_REPORT_SHOULD_RETRY,
  SLOT_RESPONSE_CALL,
  SLOT_RESPONSE_LEASE,
  SLOT_RESPONSE_NOW,
  SLOT_RESPONSE_POOL,
  SLOT_RESPONSE_STATUS,
  SLOT_RESPONSE_UNIX_NOW_MS,
  SLOT_SETTLEMENT_RESERVED,
  SLOT_SETTLEMENT_USED,
  STEP_DELIVER,
  STEP_SEND,
  STEP_WAIT,
  USAGE_FIELDS,
  WAIT_REASONS,
  WIDE,
} from './abi.js'
import { invalidArgument, normalizeEngineError } from './errors.js'
import { stepOf } from './types.js'
import type {
  Exchange,
  ExchangeAction,
  Axis,
  AxisReport,
  CallLeaseResult,
  CallResponseResult,
  CallState,
  CallStep,
  CallerIdentity,
  Decision,
  Engine,
  EngineEvent,
  HeaderReport,
  Input,
  Output,
  LeaseRequest,
  MarginReason,
  Metrics,
  ModelApi,
  RejectReason,
  Settlement,
  U64,
  Usage,
} from './types.js'

/** A binding's exchange: events by code (`EXCHANGE_EVENTS`), its actions as JSON text. */
interface BindingExchange {
  event(code: number, now: number, arg: number): number
  push(now: number, chunk: Uint8Array): number
  deadline(): number
  actions(): string
}

/** An exchange event's code. */
const EVENT = Object.fromEntries(EXCHANGE_EVENTS.map((name, i) => [name, i])) as Record<(typeof EXCHANGE_EVENTS)[number], number>

/** What a binding's coordinator class offers (the addon's and the wasm build's). */
export interface RegisterBinding {
  readonly pools: string[]
  poolId(name: string): number | null | undefined
  modelCall(method: string, target: string): string | null | undefined
  exchange(api: string, now: number, leaseLeftMs: number, firstByteMs: number, idleMs: number): BindingExchange
  exchangeTimeouts(firstByteMs: number | undefined, idleMs: number | undefined): number[]
  callerIdentity(headers: string, base: string | null | undefined): string
  /** The register-file calls; the addon reads its attached buffer and ignores `io`. */
  requestLeaseIo(io: Float64Array): number
  settleIo(io: Float64Array): number
  cancelIo(io: Float64Array): void
  handleTimeoutIo(io: Float64Array): void
  pollEventIo(io: Float64Array): number
  callLeaseIo(io: Float64Array): number
  callResponseIo(io: Float64Array, headers: string): number
  handleResponseIo(io: Float64Array, headers: string): number
  /** The register-file result held back because it needs `bigint`s (code 9): JSON text or an object. */
  takeWide(): unknown
  /** The host protocol: an `Input` as JSON text (camelCase keys), its `Output` back as JSON text or an object. */
  handle(now: U64, input: string): unknown
  pollTimeout(): U64 | null
  /** The next event as JSON text or an object, or `null`. */
  pollEvent(): unknown
  metrics(now: U64): unknown
  snapshot(): string
  check(): void
}

const ROLE_CODES: Readonly<Record<string, number>> = Object.fromEntries(ROLES.map((r, i) => [r, i]))
const MAX = Number.MAX_SAFE_INTEGER
// The event codes `pollEvent` decodes below, in the order `abi.ts` gives them.
const [EV_GRANTED, EV_EXPIRED, EV_MARGIN, EV_PAUSED, EV_ALERT, EV_FLOOR, EV_REVISED] = EVENTS.map((_, i) => i)

/** A `number` argument the register file carries exactly (else: the object path). */
function exact(v: unknown): v is number {
  return typeof v === 'number' && v >= 0 && v <= MAX && Number.isInteger(v)
}

/** An optional numeric field: undefined/null is 0; `NaN` marks "not exact". */
function field(v: U64 | undefined | null): number {
  if (v === undefined || v === null) return 0
  return exact(v) ? v : Number.NaN
}

const NUMERIC_REQUEST_FIELDS = LEASE_REQUEST_FIELDS.filter((f) => f !== 'role' && f !== 'cachedPrefixConfirmed')
const REQUEST_KEYS: ReadonlySet<string> = new Set(LEASE_REQUEST_FIELDS)
const USAGE_KEYS: ReadonlySet<string> = new Set(USAGE_FIELDS)

/**
 * Refuses a key the engine does not read: ignored, the provider's own snake_case usage
 * (`input_tokens`) would be recorded as 0 used, and `acquire({ input_tokens })` would
 * reserve 0. Both engines share this check (their fast paths never see the object).
 */
function checkKeys(obj: object, allowed: ReadonlySet<string>, what: string): void {
  for (const k in obj) {
    if (!allowed.has(k)) throw unknownKey(k, allowed, what)
  }
}

function unknownKey(k: string, allowed: ReadonlySet<string>, what: string): TypeError {
  const camel = k.replace(/_([a-z0-9])/g, (_m, c: string) => c.toUpperCase())
  const hint = camel !== k && allowed.has(camel) ? `; did you mean \`${camel}\`? (fields are camelCase)` : `; the fields are ${[...allowed].join(', ')}`
  return invalidArgument(`unknown field \`${k}\` in the ${what}${hint}`, k)
}

/**
 * napi-rs's own type checks say only `InvalidArg`; name the field as the wasm engine does.
 * (Only on the slow path: the fast path has already seen numbers.)
 */
function checkNumeric(obj: object, fields: readonly string[]): void {
  for (const f of fields) {
    const v = (obj as Record<string, unknown>)[f]
    if (v !== undefined && v !== null && typeof v !== 'number' && typeof v !== 'bigint') {
      throw invalidArgument(`\`${f}\` must be a number or a bigint, got ${typeof v}`, f)
    }
  }
}

/** Header pairs as one string (`name\nvalue\n…`), or null for anything else (the object path checks it). */
function headerText(headers: unknown): string | null {
  if (!Array.isArray(headers)) return null
  let text = ''
  for (const pair of headers as unknown[]) {
    if (!Array.isArray(pair) || pair.length !== 2) return null
    const [name, value] = pair as [unknown, unknown]
    if (typeof name !== 'string' || typeof value !== 'string' || name.includes('\n') || value.includes('\n')) return null
    text += `${name}\n${value}\n`
  }
  return text
}

const optional = (v: number): number | null => (v === -1 ? null : v)

/** Results cross as JSON text unless a number needs a bigint (then as an object). */
function fromJson(v: unknown): unknown {
  return typeof v === 'string' ? JSON.parse(v) : v
}

/**
 * An input as JSON text, `bigint`s written out exactly (`JSON.stringify` refuses them).
 * `undefined` members are left out, as `JSON.stringify` does.
 */
export function toJson(v: unknown): string {
  if (typeof v === 'bigint') return v.toString()
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null'
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? 'null' : toJson(x))).join(',')}]`
  const parts: string[] = []
  for (const [k, x] of Object.entries(v)) if (x !== undefined) parts.push(`${JSON.stringify(k)}:${toJson(x)}`)
  return `{${parts.join(',')}}`
}

/** The header report's axes, by their place in `RATE_AXES`. */
const A_REQUESTS = RATE_AXES.indexOf('requests')
const A_TOKENS = RATE_AXES.indexOf('tokens')
const A_INPUT = RATE_AXES.indexOf('input_tokens')
const A_OUTPUT = RATE_AXES.indexOf('output_tokens')
const A_CONCURRENT = RATE_AXES.indexOf('concurrent')

/** Four slots from `at`: an amount per axis. */
function fourFrom(io: Float64Array, at: number): [number, number, number, number] {
  return [io[at]!, io[at + 1]!, io[at + 2]!, io[at + 3]!]
}

/** The slot of a field in a block that starts at `base` and holds `fields` in that order. */
function fieldSlot<F extends string>(base: number, fields: readonly F[], name: F): number {
  return base + fields.indexOf(name)
}
const requestSlot = (name: (typeof LEASE_REQUEST_FIELDS)[number]): number => fieldSlot(SLOT_ARG_REQUEST, LEASE_REQUEST_FIELDS, name)
const R_AGENT = requestSlot('agent')
const R_POOL = requestSlot('pool')
const R_INPUT = requestSlot('inputTokens')
const R_CACHED = requestSlot('cachedPrefixTokens')
const R_MAX = requestSlot('maxTokens')
const R_ROLE = requestSlot('role')
const R_UNBLOCKS = requestSlot('unblocks')
const R_FAILURE = requestSlot('failureSignature')
const R_TASK = requestSlot('task')
const R_CONFIRMED = requestSlot('cachedPrefixConfirmed')
const R_FAMILY = requestSlot('family')
const usageSlot = (name: (typeof USAGE_FIELDS)[number]): number => fieldSlot(SLOT_ARG_USAGE, USAGE_FIELDS, name)
const U_INPUT = usageSlot('inputTokens')
const U_CREATION = usageSlot('cacheCreationInputTokens')
const U_READ = usageSlot('cacheReadInputTokens')
const U_OUTPUT = usageSlot('outputTokens')

/** A decision from an output of `request_lease`. */
function decisionOf(out: Output): Decision {
  switch (out.output) {
    case 'granted':
      return { kind: 'grant', lease: out.lease, expiresAt: out.expiresAt }
    case 'queued':
      return { kind: 'queued', lease: out.lease, eta: out.eta }
    case 'refused':
      return { kind: 'reject', retryAt: out.retryAt, reason: out.reason }
    case 'never_fits':
      return { kind: 'never_fits', reason: out.reason }
    default:
      throw new Error(`internal: not a decision: ${out.output}`)
  }
}

/** The settlement in a settle's output. */
function settledOf(out: Output): Settlement {
  return (out as { settlement: Settlement }).settlement
}

/** A rejection's reason from its code and axis code. */
function rejectReason(code: number, axis: number): RejectReason {
  const reason: RejectReason['kind'] = REJECT_REASONS[code]!
  return reason === 'exceeds_capacity' ? { kind: reason, axis: AXES[axis]! as Axis } : ({ kind: reason } as RejectReason)
}

/**
 * The configuration as the JSON text an engine's `create` takes. A number that is not
 * finite (`NaN`, `Infinity`) is refused with an error naming its path (`JSON.stringify`
 * would write `null`, which the core reads as "limit unknown": a `NaN` limit would then
 * gate nothing). Both engines' factories call this.
 */
export function configJson(config: object | string): string {
  if (typeof config === 'string') return config
  if (config === null || typeof config !== 'object') {
    throw invalidArgument(`the configuration must be an object or JSON text, got ${config === null ? 'null' : typeof config}`, 'config')
  }
  checkFinite(config, '')
  return JSON.stringify(config)
}

function checkFinite(v: unknown, path: string): void {
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) {
      const err = new Error(`invalid config: ${path} must be a finite number, got ${v}`) as Error & { code: string; field: string }
      err.code = 'invalid_config'
      err.field = path
      throw err
    }
  } else if (Array.isArray(v)) {
    for (const [i, x] of v.entries()) checkFinite(x, `${path}[${i}]`)
  } else if (v !== null && typeof v === 'object') {
    for (const [k, x] of Object.entries(v)) checkFinite(x, path === '' ? k : `${path}.${k}`)
  }
}

/** An {@link Engine} over a {@link RegisterBinding}. */
export class RegisterEngine implements Engine {
  readonly #c: RegisterBinding
  readonly #io = new Float64Array(IO_SLOTS)
  /**
   * Whether `EVENTS_SLOT` and `TIMEOUT_SLOT` hold the coordinator's state: true after a
   * register-file call returned, false from the start of any other call that may change
   * it. `pollEvent` with nothing waiting and `pollTimeout` then answer without crossing.
   */
  #after = false
  readonly pools: readonly string[]

  /**
   * Wraps a binding's coordinator; `attach` hands the register file to a binding that keeps
   * it (the addon), once.
   */
  constructor(coordinator: RegisterBinding, attach?: (io: Float64Array) => void) {
    this.#c = coordinator
    attach?.(this.#io)
    this.pools = Object.freeze([...coordinator.pools])
  }

  poolId(name: string): number | null {
    return this.#c.poolId(name) ?? null
  }

  modelCall(method: string, target: string): ModelApi | null {
    if (typeof method !== 'string') throw invalidArgument(`modelCall needs the method as a string, got ${typeof method}`, 'method')
    if (typeof target !== 'string') throw invalidArgument(`modelCall needs the request target (a path) as a string, got ${typeof target}`, 'target')
    return (this.#c.modelCall(method, target) ?? null) as ModelApi | null
  }

  callerIdentity(headers: Array<[string, string]>, base: string | null): CallerIdentity | null {
    const text = headerText(headers)
    if (text === null) throw invalidArgument('callerIdentity needs the headers as [name, value] pairs of strings without line feeds', 'headers')
    if (base !== null && typeof base !== 'string') throw invalidArgument(`callerIdentity needs \`base\` as a string or null, got ${typeof base}`, 'base')
    let out: string
    try {
      out = this.#c.callerIdentity(text, base ?? undefined)
    } catch (e) {
      throw normalizeEngineError(e, 'callerIdentity')
    }
    return JSON.parse(out) as CallerIdentity | null
  }

  exchange(api: ModelApi, now: number, leaseLeftMs: number, timeouts: readonly [number, number]): Exchange {
    if (!Array.isArray(timeouts) || timeouts.length !== 2) throw invalidArgument('exchange needs `timeouts` as [firstByteMs, idleMs] (from exchangeTimeouts)', 'timeouts')
    let x: BindingExchange
    try {
      x = this.#c.exchange(api, now, leaseLeftMs, timeouts[0], timeouts[1])
    } catch (e) {
      throw normalizeEngineError(e, 'exchange')
    }
    return {
      answered: (now, answer, leaseLeftMs) => {
        const code = EVENT[answer]
        if (code === undefined || code > EVENT.stream) throw invalidArgument(`answered needs \`answer\` as settled, empty, json or stream, got ${String(answer)}`, 'answer')
        return x.event(code, now, leaseLeftMs)
      },
      reading: (now) => x.event(EVENT.reading, now, 0),
      push: (now, chunk) => x.push(now, chunk),
      end: (now) => x.event(EVENT.end, now, 0),
      broken: () => x.event(EVENT.broken, 0, 0),
      failed: () => x.event(EVENT.failed, 0, 0),
      timeout: (now) => x.event(EVENT.timeout, now, 0),
      renewed: (now, leaseLeftMs) => x.event(EVENT.renewed, now, leaseLeftMs),
      renewRefused: (gone) => x.event(EVENT.renew_refused, 0, gone ? 1 : 0),
      settleRefused: (gone) => x.event(EVENT.settle_refused, 0, gone ? 1 : 0),
      interruptedRefused: (gone) => x.event(EVENT.interrupted_refused, 0, gone ? 1 : 0),
      deadline: () => x.deadline(),
      actions: () => JSON.parse(x.actions()) as ExchangeAction[],
    }
  }

  exchangeTimeouts(firstByteMs: number | undefined, idleMs: number | undefined): [number, number] {
    for (const [name, v] of [
      ['firstByteMs', firstByteMs],
      ['idleMs', idleMs],
    ] as const) {
      if (v !== undefined && typeof v !== 'number') throw invalidArgument(`\`timeouts.${name}\` must be a number of milliseconds or Infinity, got ${typeof v}`, `timeouts.${name}`)
    }
    try {
      return this.#c.exchangeTimeouts(firstByteMs, idleMs) as [number, number]
    } catch (e) {
      throw normalizeEngineError(e, 'exchangeTimeouts')
    }
  }

  requestLease(now: U64, r: LeaseRequest): Decision {
    if (r === null || typeof r !== 'object') throw invalidArgument(`requestLease needs a request object, got ${r === null ? 'null' : typeof r}`, 'request')
    const io = this.#io
    if (!this.#request(now, r)) {
      // Bigints, out-of-range or mistyped values: the object path checks and reports them.
      checkNumeric(r, NUMERIC_REQUEST_FIELDS)
      const confirmed = (r as { cachedPrefixConfirmed?: unknown }).cachedPrefixConfirmed
      if (confirmed !== undefined && typeof confirmed !== 'boolean') {
        throw invalidArgument(`\`cachedPrefixConfirmed\` must be a boolean, got ${typeof confirmed}`, 'cachedPrefixConfirmed')
      }
      return decisionOf(this.#handle(now, { op: 'request_lease', request: r }, 'requestLease'))
    }
    let kind: number
    try {
      this.#after = false
      kind = this.#c.requestLeaseIo(io)
      this.#after = true
    } catch (e) {
      throw normalizeEngineError(e, 'requestLease')
    }
    if (kind === DECISION_GRANT) return { kind: 'grant', lease: io[SLOT_DECISION_LEASE]!, expiresAt: io[SLOT_DECISION_INSTANT]! }
    if (kind === DECISION_QUEUED) return { kind: 'queued', lease: io[SLOT_DECISION_LEASE]!, eta: io[SLOT_DECISION_INSTANT]! }
    if (kind === WIDE) return fromJson(this.#c.takeWide()) as Decision
    const reason = rejectReason(io[SLOT_DECISION_REASON]!, io[SLOT_DECISION_AXIS]!)
    if (kind === DECISION_NEVER) return { kind: 'never_fits', reason }
    return { kind: 'reject', retryAt: io[SLOT_DECISION_INSTANT]!, reason }
  }

  /** Writes `now` and a lease request (`SLOT_ARG_REQUEST` on); false when one needs the object path. */
  #request(now: U64, r: LeaseRequest): boolean {
    checkKeys(r, REQUEST_KEYS, 'lease request')
    const io = this.#io
    const role = r.role === undefined ? 0 : ROLE_CODES[r.role]
    io[SLOT_ARG_NOW] = exact(now) ? now : Number.NaN
    io[R_AGENT] = exact(r.agent) ? r.agent : Number.NaN
    io[R_POOL] = r.pool
    io[R_INPUT] = field(r.inputTokens)
    io[R_CACHED] = field(r.cachedPrefixTokens)
    io[R_MAX] = field(r.maxTokens)
    io[R_ROLE] = role ?? Number.NaN
    io[R_UNBLOCKS] = r.unblocks ?? 0
    io[R_FAILURE] = r.failureSignature === undefined || r.failureSignature === null ? -1 : field(r.failureSignature)
    io[R_TASK] = r.task === undefined || r.task === null ? -1 : field(r.task)
    io[R_FAMILY] = r.family === undefined || r.family === null ? -1 : field(r.family)
    const confirmed = r.cachedPrefixConfirmed
    io[R_CONFIRMED] = confirmed === true ? 1 : confirmed === false || confirmed === undefined ? 0 : Number.NaN
    return !(
      io[SLOT_ARG_NOW] !== io[SLOT_ARG_NOW] ||
      io[R_AGENT] !== io[R_AGENT] ||
      io[R_INPUT] !== io[R_INPUT] ||
      io[R_CACHED] !== io[R_CACHED] ||
      io[R_MAX] !== io[R_MAX] ||
      io[R_FAILURE] !== io[R_FAILURE] ||
      io[R_TASK] !== io[R_TASK] ||
      io[R_FAMILY] !== io[R_FAMILY] ||
      io[R_CONFIRMED] !== io[R_CONFIRMED] ||
      typeof r.pool !== 'number'
    )
  }

  /** Writes a call's state from `at` on, laid out as in the results (`SLOT_CALL_FAILED` on); false when it needs the object path. */
  #call(call: CallState, at: number): boolean {
    if (call === null || typeof call !== 'object') return false
    const last = call.lastRetryAfterMs
    const io = this.#io
    const f = at + SLOT_CALL_FAILED
    const r = at + SLOT_CALL_REFUSALS
    const l = at + SLOT_CALL_LAST_RETRY_AFTER_MS
    io[f] = exact(call.failed) ? call.failed : Number.NaN
    io[r] = exact(call.refusals) ? call.refusals : Number.NaN
    io[l] = last === undefined || last === null ? -1 : field(last)
    return io[f] === io[f] && io[r] === io[r] && io[l] === io[l]
  }

  /** The call and its step from the result slots (`SLOT_CALL_*`). */
  #stepOut(code: number): { call: CallState; step: CallStep } {
    const io = this.#io
    const call: CallState = { failed: io[SLOT_CALL_FAILED]!, refusals: io[SLOT_CALL_REFUSALS]!, lastRetryAfterMs: optional(io[SLOT_CALL_LAST_RETRY_AFTER_MS]!) }
    const refusal = io[SLOT_CALL_REFUSAL] === -1 ? null : rejectReason(io[SLOT_CALL_REFUSAL]!, io[SLOT_CALL_REFUSAL_AXIS]!)
    let step: CallStep
    if (code === STEP_SEND) step = { kind: 'send', lease: io[SLOT_CALL_LEASE]!, expiresAt: io[SLOT_CALL_INSTANT]! }
    else if (code === STEP_WAIT) {
      step = {
        kind: 'wait',
        until: io[SLOT_CALL_INSTANT]!,
        expected: io[SLOT_CALL_EXPECTED]!,
        reason: WAIT_REASONS[io[SLOT_CALL_REASON]!]!,
        ticket: optional(io[SLOT_CALL_LEASE]!),
        refusal,
        attempt: io[SLOT_CALL_ATTEMPTS]!,
        checkpoint: io[SLOT_CALL_CHECKPOINT] === 1,
      }
    } else if (code === STEP_DELIVER) step = { kind: 'deliver' }
    else {
      step = {
        kind: 'give_up',
        reason: GIVE_UP_REASONS[io[SLOT_CALL_REASON]!]!,
        refusal,
        attempts: io[SLOT_CALL_ATTEMPTS]!,
        lastRetryAfterMs: optional(io[SLOT_CALL_GIVE_UP_RETRY_AFTER_MS]!),
      }
    }
    return { call, step }
  }

  /** The header report from its slots (`SLOT_REPORT_*`, then `SLOT_RATE_AXIS_*` per axis of `RATE_AXES`). */
  #reportOut(): HeaderReport {
    const io = this.#io
    const axis = (i: number): AxisReport => {
      const b = SLOT_REPORT_AXES + SLOT_RATE_AXIS_WIDTH * i
      return {
        limit: optional(io[b + SLOT_RATE_AXIS_LIMIT]!),
        remaining: optional(io[b + SLOT_RATE_AXIS_REMAINING]!),
        resetAfterMs: optional(io[b + SLOT_RATE_AXIS_RESET_AFTER_MS]!),
        granularity: io[b + SLOT_RATE_AXIS_GRANULARITY]!,
      }
    }
    const should = io[SLOT_REPORT_SHOULD_RETRY]!
    const exceeded = io[SLOT_REPORT_EXCEEDED]!
    return {
      requests: axis(A_REQUESTS),
      tokens: axis(A_TOKENS),
      inputTokens: axis(A_INPUT),
      outputTokens: axis(A_OUTPUT),
      concurrent: axis(A_CONCURRENT),
      retryAfterMs: optional(io[SLOT_REPORT_RETRY_AFTER_MS]!),
      shouldRetry: should === -1 ? null : should === 1,
      exceeded: exceeded === -1 ? null : (RATE_AXES[exceeded]! as HeaderReport['exceeded']),
      resetAtMs: optional(io[SLOT_REPORT_RESET_AT_MS]!),
      recognised: io[SLOT_REPORT_RECOGNISED]!,
      malformed: io[SLOT_REPORT_MALFORMED]!,
    }
  }

  /** Writes the response calls' arguments (`SLOT_RESPONSE_*`, without the call); false for the object path. */
  #response(now: U64, pool: number, lease: number | null, status: number, unixNowMs: U64 | null): boolean {
    const io = this.#io
    io[SLOT_RESPONSE_NOW] = exact(now) ? now : Number.NaN
    io[SLOT_RESPONSE_POOL] = exact(pool) ? pool : Number.NaN
    io[SLOT_RESPONSE_LEASE] = lease === null || lease === undefined ? -1 : exact(lease) ? lease : Number.NaN
    io[SLOT_RESPONSE_STATUS] = exact(status) ? status : Number.NaN
    io[SLOT_RESPONSE_UNIX_NOW_MS] = unixNowMs === null || unixNowMs === undefined ? -1 : exact(unixNowMs) ? unixNowMs : Number.NaN
    return (
      io[SLOT_RESPONSE_NOW] === io[SLOT_RESPONSE_NOW] &&
      io[SLOT_RESPONSE_POOL] === io[SLOT_RESPONSE_POOL] &&
      io[SLOT_RESPONSE_LEASE] === io[SLOT_RESPONSE_LEASE] &&
      io[SLOT_RESPONSE_STATUS] === io[SLOT_RESPONSE_STATUS] &&
      io[SLOT_RESPONSE_UNIX_NOW_MS] === io[SLOT_RESPONSE_UNIX_NOW_MS]
    )
  }

  settle(now: U64, lease: number, u: Usage): Settlement {
    if (u === null || typeof u !== 'object') throw invalidArgument(`settle needs a usage object, got ${u === null ? 'null' : typeof u}`, 'usage')
    checkKeys(u, USAGE_KEYS, 'usage')
    // (`lease` is a number for real leases; a bigint can only be a forged id.)
    const io = this.#io
    io[SLOT_ARG_NOW] = exact(now) ? now : Number.NaN
    io[SLOT_ARG_LEASE] = exact(lease) ? lease : Number.NaN
    io[U_INPUT] = field(u.inputTokens)
    io[U_CREATION] = field(u.cacheCreationInputTokens)
    io[U_READ] = field(u.cacheReadInputTokens)
    io[U_OUTPUT] = field(u.outputTokens)
    if (
      io[SLOT_ARG_NOW] !== io[SLOT_ARG_NOW] ||
      io[SLOT_ARG_LEASE] !== io[SLOT_ARG_LEASE] ||
      io[U_INPUT] !== io[U_INPUT] ||
      io[U_CREATION] !== io[U_CREATION] ||
      io[U_READ] !== io[U_READ] ||
      io[U_OUTPUT] !== io[U_OUTPUT]
    ) {
      checkNumeric(u, USAGE_FIELDS)
      return settledOf(this.#handle(now, { op: 'settle', lease, usage: u }, 'settle'))
    }
    let code: number
    try {
      this.#after = false
      code = this.#c.settleIo(io)
      this.#after = true
    } catch (e) {
      throw normalizeEngineError(e, 'settle')
    }
    if (code === WIDE) return fromJson(this.#c.takeWide()) as Settlement
    return { reserved: fourFrom(io, SLOT_SETTLEMENT_RESERVED), used: fourFrom(io, SLOT_SETTLEMENT_USED) }
  }

  cancel(now: U64, lease: number): void {
    if (!exact(now) || !exact(lease)) {
      this.#handle(now, { op: 'cancel', lease }, 'cancel')
      return
    }
    this.#io[SLOT_ARG_NOW] = now
    this.#io[SLOT_ARG_LEASE] = lease
    try {
      this.#after = false
      this.#c.cancelIo(this.#io)
      this.#after = true
    } catch (e) {
      throw normalizeEngineError(e, 'cancel')
    }
  }

  handleResponse(now: U64, pool: number, lease: number | null, status: number, headers: Array<[string, string]>, unixNowMs: U64 | null, reported = false): HeaderReport {
    // A reported response takes the protocol (the register file carries no `reported`).
    const text = reported === true ? null : headerText(headers)
    if (text === null || !this.#response(now, pool, lease, status, unixNowMs)) {
      const out = this.#handle(now, { op: 'response', pool, lease, status, headers, unixNowMs, ...(reported === false ? {} : { reported }) }, 'handleResponse')
      return (out as { report: HeaderReport }).report
    }
    let code: number
    try {
      this.#after = false
      code = this.#c.handleResponseIo(this.#io, text)
      this.#after = true
    } catch (e) {
      throw normalizeEngineError(e, 'handleResponse')
    }
    return code === WIDE ? (fromJson(this.#c.takeWide()) as HeaderReport) : this.#reportOut()
  }

  handleTimeout(now: U64): void {
    if (!exact(now)) {
      this.#handle(now, { op: 'timeout' }, 'handleTimeout')
      return
    }
    this.#io[SLOT_ARG_NOW] = now
    this.#after = false
    try {
      this.#c.handleTimeoutIo(this.#io)
    } catch (e) {
      throw normalizeEngineError(e, 'handleTimeout')
    }
    this.#after = true
  }

  pollTimeout(): U64 | null {
    if (this.#after) {
      const t = this.#io[SLOT_AFTER_TIMEOUT]!
      if (t === -1) return null
      if (t >= 0) return t
      // -2: beyond 2^53 - 1, a bigint the binding gives.
    }
    return this.#c.pollTimeout()
  }

  pollEvent(): EngineEvent | null {
    const io = this.#io
    if (this.#after && io[SLOT_AFTER_EVENTS] === 0) return null
    this.#after = false
    const code = this.#c.pollEventIo(io)
    this.#after = true
    switch (code) {
      case -1:
        return null
      case EV_GRANTED:
        return { kind: 'granted', lease: io[0]!, agent: io[1]!, pool: io[2]!, expiresAt: io[3]!, waitedMs: io[4]! }
      case EV_EXPIRED:
        return { kind: 'expired', lease: io[0]!, agent: io[1]!, pool: io[2]! }
      case EV_MARGIN:
        return { kind: 'margin_changed', pool: io[0]!, fromPermille: io[1]!, toPermille: io[2]!, reason: MARGIN_REASONS[io[3]!] as MarginReason }
      case EV_PAUSED:
        return { kind: 'paused', pool: io[0]!, until: io[1]! }
      case EV_ALERT:
        return { kind: 'estimate_alert', agent: io[0]!, errorPermille: io[1]! }
      case EV_FLOOR:
        return { kind: 'margin_at_floor', pool: io[0]!, axis: (AXES[io[1]!] as Axis | undefined) ?? null, marginPermille: io[2]!, since: io[3]! }
      case EV_REVISED:
        return { kind: 'revised', lease: io[0]!, agent: io[1]!, pool: io[2]!, eta: io[3]! }
      default:
        return fromJson(this.#c.takeWide()) as EngineEvent
    }
  }

  handle(now: U64, input: Input): Output {
    if (input === null || typeof input !== 'object') throw invalidArgument(`handle needs an input object, got ${input === null ? 'null' : typeof input}`, 'input')
    return this.#handle(now, input, 'handle')
  }

  /** The host protocol through the binding: every input without a register-file path. */
  #handle(now: U64, input: Input, what: string): Output {
    return fromJson(this.#slow(() => this.#c.handle(now, toJson(input)), what)) as Output
  }

  callLease(now: U64, call: CallState, request: LeaseRequest): CallLeaseResult {
    if (request === null || typeof request !== 'object' || !this.#request(now, request) || !this.#call(call, SLOT_ARG_CALL)) {
      const out = this.#handle(now, { op: 'call_lease', call, request }, 'callLease') as Output & { call: CallState }
      return { call: out.call, step: stepOf(out) }
    }
    let code: number
    try {
      this.#after = false
      code = this.#c.callLeaseIo(this.#io)
      this.#after = true
    } catch (e) {
      throw normalizeEngineError(e, 'callLease')
    }
    return code === WIDE ? (fromJson(this.#c.takeWide()) as CallLeaseResult) : this.#stepOut(code)
  }

  callResponse(now: U64, call: CallState, pool: number, lease: number | null, status: number, headers: Array<[string, string]>, unixNowMs: U64 | null, reported = false): CallResponseResult {
    const text = reported === true ? null : headerText(headers)
    if (text === null || !this.#response(now, pool, lease, status, unixNowMs) || !this.#call(call, SLOT_RESPONSE_CALL)) {
      const input = { op: 'call_response', call, pool, lease, status, headers, unixNowMs, ...(reported === false ? {} : { reported }) } as const
      const out = this.#handle(now, input, 'callResponse') as Output & {
        call: CallState
        settled?: Settlement
        report: HeaderReport
      }
      return { call: out.call, step: stepOf(out), settled: out.settled ?? null, report: out.report }
    }
    let code: number
    try {
      this.#after = false
      code = this.#c.callResponseIo(this.#io, text)
      this.#after = true
    } catch (e) {
      throw normalizeEngineError(e, 'callResponse')
    }
    if (code === WIDE) return fromJson(this.#c.takeWide()) as CallResponseResult
    const io = this.#io
    const { call: next, step } = this.#stepOut(code)
    const settled: Settlement | null = io[SLOT_CALL_SETTLED] === 1 ? { reserved: fourFrom(io, SLOT_CALL_RESERVED), used: fourFrom(io, SLOT_CALL_USED) } : null
    return { call: next, step, settled, report: this.#reportOut() }
  }

  metrics(now: U64): Metrics {
    return fromJson(this.#slow(() => this.#c.metrics(now), 'metrics')) as Metrics
  }

  snapshot(): string {
    return this.#c.snapshot()
  }

  /** Internal consistency check; throws naming the broken invariant. */
  check(): void {
    this.#c.check()
  }

  #slow<T>(f: () => T, what: string): T {
    this.#after = false
    try {
      return f()
    } catch (e) {
      throw normalizeEngineError(e, what)
    }
  }
}
