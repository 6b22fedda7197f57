import type { AXES, EVENTS, LEASE_REQUEST_FIELDS, REJECT_REASONS, ROLES, USAGE_FIELDS } from './abi.js'
/**
 * The types every engine shares: the addon (`NativeEngine`), the wasm build and a remote
 * coordinator all implement {@link Engine}, and the driver and `fetch` wrapper are written
 * once against it.
 *
 * Numbers: a `U64` is a `number` up to 2^53 - 1 and a `bigint` above. Arguments take
 * either; results are numbers unless the value needs a bigint (instants near u64::MAX).
 * Object keys are camelCase; enum tags keep the core's snake_case spelling
 * (`'exceeds_capacity'`, `'input_tokens'`), the same strings as in the trace files.
 */

/** An unsigned 64-bit integer: `number` up to 2^53 - 1, `bigint` above. */
export type U64 = number | bigint

/**
 * An agent's role in the task graph; it sets the base queue weight (3 / 2 / 1). `auto`: the
 * core decides — a planner while agents of its family (subagents naming it as their
 * `family`) were seen within a rate window, unblocking that many, else a worker.
 */
export type Role = 'planner' | 'reviewer' | 'worker' | 'auto'

/** A rate-limited dimension of a pool. */
export type Axis = 'input_tokens' | 'output_tokens' | 'tokens' | 'requests'

/** A request for capacity before one model call. */
export interface LeaseRequest {
  /** Who asks: an id you choose per agent. */
  agent: U64
  /** Which pool (limit group), by index; `engine.poolId(name)` finds it by name. */
  pool: number
  /** Prompt tokens counted locally, excluding the cached prefix. */
  inputTokens?: U64
  /** Tokens of the prompt covered by the agent's prompt cache. */
  cachedPrefixTokens?: U64
  /**
   * You know the cached prefix is in the provider's cache now (a call with this very
   * prefix, from any agent, was served from or written to it within its lifetime): it is
   * then charged as a cache read even on this agent's first call. Otherwise (default) the
   * prefix is charged as input whenever this agent's own last cache use has expired.
   */
  cachedPrefixConfirmed?: boolean
  /** The call's `max_tokens`: the output reservation, refunded on settle. */
  maxTokens?: U64
  /** The agent's role (default `worker`). */
  role?: Role
  /** Downstream tasks waiting on this call (raises its weight). */
  unblocks?: number
  /** A hash of the agent's last failure; the same value twice in a row lowers its weight. */
  failureSignature?: U64
  /**
   * The task the call is for (opened on first use). Its role, unblocks and failures then
   * set the weight, and it is charged the call's tokens and waits.
   */
  task?: U64
  /**
   * The agent whose family this one belongs to: the session that spawned it as a subagent
   * (absent: it is a family's root). By default a family shares one place in the fair
   * order, split among its members with calls in line (`weights.families`: `shared`, or
   * `flat` for one share per member); the metrics show each agent's family.
   */
  family?: U64
}

/** A task, as `engine.openTask` takes it. */
export interface TaskSpec {
  /** The task's id (an integer; `taskId(name)` hashes a string into one). */
  task: U64
  /** The role of the agent working on it (default `worker`). */
  role?: Role
  /** Downstream tasks waiting on it (default 0). */
  unblocks?: number
}

/** How a task ended. */
export type TaskOutcome = 'merged' | 'abandoned' | 'failed'

/** A task's figures when it ends. */
export interface TaskSummary {
  task: U64
  outcome: TaskOutcome
  /** Leases it took (each attempt of a model call is one). */
  calls: number
  /** Every token its settled leases used as the provider counted them: uncached input, cache writes, cache reads, output. */
  tokens: U64
  /** The part of `tokens` that counts against the pool's limits (cache reads do not, under Anthropic counting). */
  rateLimitedTokens: U64
  /** From its opening (or first call) to its end, ms. */
  wallMs: U64
  /** Time its calls waited on the quota (queued, refused, after a 429), ms. */
  quotaWaitMs: U64
  /** How long its model calls were outstanding (ask to settle: queue, retries and the call itself; overlapping calls once) × the tasks it unblocks: agent-time blocked behind it, ms. */
  criticalPathWaitMs: U64
  /** Failures reported. */
  failures: number
  /** Identical failures in a row (each halves the weight, by default). */
  repeats: number
}

/** Seed 003's four numbers over a span (since start, or the last complete minute). */
export interface TaskFigures {
  merged: number
  abandoned: number
  failed: number
  /** Every token charged to the tasks that ended (every outcome), cache reads included, and of their leases that settled after they ended. */
  tokens: U64
  /** The part of `tokens` that counts against the limits. */
  rateLimitedTokens: U64
  /** `tokens / merged`: failures and abandoned work included. */
  tokensPerMergedTask: U64 | null
  /** `rateLimitedTokens / merged`. */
  rateLimitedTokensPerMergedTask: U64 | null
  /** Merged tasks' wall time, ms: median and 95th percentile (since start only; within 3.2 %). */
  taskTimeP50Ms: U64 | null
  taskTimeP95Ms: U64 | null
  /** Merged tasks' mean wall time, ms. */
  taskTimeMeanMs: U64 | null
  /** Quota wait of the ended tasks, ms. */
  quotaWaitMs: U64
  /** Critical-path wait of the ended tasks, agent-ms. */
  criticalPathWaitMs: U64
  /** Leases granted (calls sent), across pools. */
  calls: U64
  /** 429 responses reported, across pools. */
  rateLimited: U64
  /** `rateLimited / calls`, thousandths. */
  rateLimitedPermille: number | null
}

/** `metrics().tasks`. */
export interface TaskMetrics {
  /** Tasks open now. */
  open: number
  /** Requests naming a task the full table could not take. */
  untracked: U64
  sinceStart: TaskFigures
  lastMinute: TaskFigures
  /** The last complete minute's number (`now / 60000 − 1`). */
  minute: U64
}

/** What a call really used, as the provider reported it. Omitted fields are 0. */
export interface Usage {
  /** Uncached input tokens. */
  inputTokens?: U64
  /** Input tokens written to the prompt cache. */
  cacheCreationInputTokens?: U64
  /** Input tokens read from the prompt cache. */
  cacheReadInputTokens?: U64
  /** Output tokens. */
  outputTokens?: U64
}

/** Why a request was rejected. */
export type RejectReason = { kind: 'exceeds_capacity'; axis: Axis } | { kind: 'wait_too_long' } | { kind: 'queue_full' } | { kind: 'too_many_leases' } | { kind: 'too_many_agents' }

/** The answer to `requestLease`. */
export type Decision =
  | { kind: 'grant'; lease: number; expiresAt: U64 }
  | { kind: 'queued'; lease: number; eta: U64 }
  /** Not now: ask again at `retryAt`. */
  | { kind: 'reject'; retryAt: U64; reason: RejectReason }
  /** Never as asked: more than the pool allows in a window (`exceeds_capacity`). */
  | { kind: 'never_fits'; reason: RejectReason }

/** Reserved and used amounts per axis: input tokens, output tokens, tokens, requests. */
export interface Settlement {
  reserved: U64[]
  used: U64[]
}

/**
 * Why a pool's margin moved: a 429 against a granted lease cut it (`rate_limited`), a clean
 * interval below the start raised it (`recovered`), a clean interval above the start with
 * estimates and the provider's headers confirming it raised it (`confirmed`), or the
 * provider's remaining capacity was below the model's (`headers_disagreed`).
 */
export type MarginReason = 'rate_limited' | 'recovered' | 'confirmed' | 'headers_disagreed'

/** Something the engine reports; drain with `pollEvent()` after every call. */
export type EngineEvent =
  | { kind: 'granted'; lease: number; agent: U64; pool: number; expiresAt: U64; waitedMs: U64 }
  | { kind: 'expired'; lease: number; agent: U64; pool: number }
  | { kind: 'margin_changed'; pool: number; fromPermille: number; toPermille: number; reason: MarginReason }
  | { kind: 'paused'; pool: number; until: U64 }
  | { kind: 'estimate_alert'; agent: U64; errorPermille: number }
  | { kind: 'margin_at_floor'; pool: number; axis: Axis | null; marginPermille: number; since: U64 }
  /**
   * A queued ticket's promise (its `eta`, a wait's `until`) was replaced by a later one
   * before it passed: something its bound does not assume happened (a call used more than
   * it reserved, a 429, an agent that joined, every concurrency slot still held). The
   * ticket is granted by `eta`.
   */
  | { kind: 'revised'; lease: number; agent: U64; pool: number; eta: U64 }

/**
 * One model call's state between its steps (the core's `Call`). Start with
 * {@link newCall}`()` and pass back the `call` each step returns.
 */
export interface CallState {
  /** Sends that failed in a way worth retrying (429, overloaded). */
  failed: number
  /** Refusals waited out. */
  refusals: number
  /** The last `Retry-After` the provider sent, ms. */
  lastRetryAfterMs: U64 | null
}

/** A call that has not been asked yet. */
export function newCall(): CallState {
  return { failed: 0, refusals: 0, lastRetryAfterMs: null }
}

/**
 * The call step an {@link Output} of `call_lease` or `call_response` stands for (`send`,
 * `wait`, `give_up`, `deliver`); throws for any other output.
 */
export function stepOf(out: Output): CallStep {
  switch (out.output) {
    case 'send':
      return { kind: 'send', lease: out.lease, expiresAt: out.expiresAt }
    case 'wait':
      return { kind: 'wait', ...out.wait }
    case 'give_up':
      return { kind: 'give_up', ...out.giveUp }
    case 'deliver':
      return { kind: 'deliver' }
    default:
      throw new Error(`not a call step: the output ${out.output}`)
  }
}

/** Why a call waits: in the queue, refused for now, after a 429, after an overload. */
export type WaitReason = 'queued' | 'refused' | 'rate_limited' | 'overloaded'

/** Why a call gives up. */
export type GiveUpReason = 'never_fits' | 'refusals' | 'attempts'

/**
 * What the host does next for a call (the core's `CallStep`): send under the lease; wait
 * until `until` (for the ticket's grant, or to ask again), checkpointing the turn first when
 * `checkpoint` says the wait is long; hand the response over; or give up.
 */
export type CallStep = { kind: 'send'; lease: number; expiresAt: U64 } | ({ kind: 'wait' } & Wait) | { kind: 'deliver' } | ({ kind: 'give_up' } & GiveUp)

/** `callLease()`'s answer. */
export interface CallLeaseResult {
  call: CallState
  step: CallStep
}

/** `callResponse()`'s answer, with what the headers said. */
export interface CallResponseResult {
  call: CallState
  step: CallStep
  /** The lease's settlement when the core settled it (a response that is not a success: nothing used). */
  settled: Settlement | null
  report: HeaderReport
}

/** A wait the core tells a call to make (the core's `Wait`): see {@link CallStep}. */
export interface Wait {
  /** When to ask again; for a ticket, its promise: it is granted by then (a `revised` event may move it later before it passes). */
  until: U64
  /** When the wait is expected to end (for a ticket, its expected grant, at most `until`): what to tell a person. */
  expected: U64
  reason: WaitReason
  ticket: number | null
  refusal: RejectReason | null
  attempt: number
  checkpoint: boolean
}

/** A call that stops (the core's `GiveUp`): see {@link CallStep}. */
export interface GiveUp {
  reason: GiveUpReason
  refusal: RejectReason | null
  attempts: number
  lastRetryAfterMs: U64 | null
}

/**
 * One input to the engine (the core's `Input`), for {@link Engine.handle}: every input the
 * core takes, as one value. The typed methods (`requestLease`, `callLease`, …) are the same
 * decisions.
 */
export type Input =
  | { op: 'request_lease'; request: LeaseRequest }
  | { op: 'settle'; lease: number; usage: Usage }
  | { op: 'cancel'; lease: number }
  | { op: 'renew'; lease: number }
  /** `reported`: seen by another process (a member of a shared limiter), not this host (see `feedback.max_reported_pause_ms`). */
  | { op: 'response'; pool: number; lease?: number | null; status: number; headers?: Array<[string, string]>; unixNowMs?: U64 | null; reported?: boolean }
  | { op: 'timeout' }
  | { op: 'call_lease'; call?: CallState; request: LeaseRequest }
  | {
      op: 'call_response'
      call?: CallState
      pool: number
      lease?: number | null
      status: number
      headers?: Array<[string, string]>
      unixNowMs?: U64 | null
      reported?: boolean
    }
  | { op: 'call_interrupted'; lease: number; seen?: Usage | null }
  /**
   * `member`: the agent of an agent's own credential at a shared limiter, not the operator:
   * a new task only below three quarters of `max_tasks`, and it is that agent's; an open
   * task of another agent's is `forbidden`.
   */
  | { op: 'open_task'; task: TaskSpec; member?: U64 }
  /** `member`: as for `open_task`; a member fails only its own agent's tasks. */
  | { op: 'task_failed'; task: U64; signature: U64; member?: U64 }
  /** `member`: as for `open_task`; a member ends only its own agent's tasks. */
  | { op: 'end_task'; task: U64; outcome: TaskOutcome; member?: U64 }
  | { op: 'restarted'; keep?: number[] }
  | { op: 'hold'; pool: number; until: U64 }

/**
 * The engine's answer to one {@link Input} (the core's `Output`): one variant per
 * transition, so a host matches on what to do, never on a field being null.
 */
export type Output =
  | { output: 'granted'; lease: number; expiresAt: U64 }
  | { output: 'queued'; lease: number; eta: U64 }
  | { output: 'refused'; reason: RejectReason; retryAt: U64 }
  | { output: 'never_fits'; reason: RejectReason }
  | { output: 'send'; call: CallState; lease: number; expiresAt: U64 }
  | { output: 'wait'; call: CallState; wait: Wait; settled?: Settlement; report?: HeaderReport }
  | { output: 'give_up'; call: CallState; giveUp: GiveUp; settled?: Settlement; report?: HeaderReport }
  | { output: 'deliver'; call: CallState; settled?: Settlement; report: HeaderReport }
  | { output: 'settled'; settlement: Settlement }
  | { output: 'cancelled' }
  | { output: 'renewed'; expiresAt: U64 }
  | { output: 'reported'; report: HeaderReport }
  | { output: 'timed_out' }
  | { output: 'task_opened' }
  | { output: 'task_failed'; inARow: number }
  | { output: 'task_ended'; summary: TaskSummary }
  | { output: 'ended'; interrupted: number[]; withdrawn: number[] }
  | { output: 'held'; pool: number; until: U64 }

/** What one response said about one axis. */
export interface AxisReport {
  limit: U64 | null
  remaining: U64 | null
  resetAfterMs: U64 | null
  granularity: U64
}

/** Everything rate-limit related in one response's headers. */
export interface HeaderReport {
  requests: AxisReport
  tokens: AxisReport
  inputTokens: AxisReport
  outputTokens: AxisReport
  concurrent: AxisReport
  retryAfterMs: U64 | null
  shouldRetry: boolean | null
  exceeded: 'requests' | 'tokens' | 'input_tokens' | 'output_tokens' | 'concurrent' | null
  resetAtMs: U64 | null
  recognised: number
  malformed: number
}

/** One axis of a pool in {@link Metrics}. */
export interface AxisMetrics {
  axis: Axis
  limit: U64 | null
  capacity: U64
  available: U64
  lastMinute: U64
  lastMinutePermille: number
}

/** One minute of a pool's history. */
export interface MinuteStats {
  minute: U64
  used: U64[]
  granted: number
  queued: number
  rejected: number
  rateLimited: number
  /** Time agents spent waiting on quota, ms (absent when none). */
  waitedMs?: U64
}

/** A pool in {@link Metrics}. */
export interface PoolMetrics {
  name: string
  axes: AxisMetrics[]
  bindingAxis: Axis | null
  marginPermille: number
  /** Why the margin last moved (`null` before it first did). */
  marginReason: MarginReason | null
  /**
   * The median input underestimate of the pool's latest completed calls (up to 16; an
   * estimate at or above what the provider counted is 0), thousandths: a climb of the
   * margin above its start needs it at or below `margin.confirm_error_permille`.
   */
  underestimateP50Permille: number | null
  /** The margin of the axes counted exactly (requests, calls in flight), thousandths: 1000 unless use outside the coordinator was seen. */
  exactMarginPermille: number
  /** When the provider's remaining-capacity headers last agreed with the model (`null`: never, or the last comparison disagreed). */
  headersAgreedAt: U64 | null
  /** Since when the margin has sat at its floor without rising (`null` when it is not there). */
  marginAtFloorSince: U64 | null
  pausedUntil: U64
  queueDepth: number
  inFlight: number
  maxConcurrent: U64 | null
  queueWaitP50Ms: U64 | null
  queueWaitP95Ms: U64 | null
  minutes: MinuteStats[]
  counters: Record<string, U64>
  /**
   * How many agents of the measured kind fit at 75% of the binding limit, from their demand
   * (`perAgentPerMinute`: served ÷ the share of their time not spent waiting on quota,
   * `waitingPermille`), weighted to the latest minutes.
   */
  fleet: { axis: Axis; perAgentPerMinute: U64; servedPerAgentPerMinute: U64; waitingPermille: number; agentsMeasured: number; agentsAt75Percent: U64 } | null
}

/** An agent in {@link Metrics}: what it is doing and how good its estimates are. */
export interface AgentMetrics {
  agent: U64
  /** The name the id was made from, where the driver (or the edge limiter) knows it; else `null`. */
  name?: string | null
  /** The root of its family, when it is another agent's subagent (absent for a root). */
  family?: U64
  /** The family root's name, as `name` (present with `family`). */
  familyName?: string | null
  /**
   * What it is doing: queued since an instant, in flight, or waiting with no ticket —
   * refused for now, waiting out a 429 (with the limit the provider named or showed spent,
   * when it did), or backing off an overload — until an instant; else idle.
   */
  activity:
    | { state: 'idle' | 'in_flight' }
    /** `expectedGrant`: when its first ticket in line is expected to be granted (the figure to show a person; the queued decision's `eta` is the bound). */
    | { state: 'queued'; since: U64; expectedGrant: U64 | null }
    | { state: 'refused' | 'backing_off'; until: U64 }
    | { state: 'rate_limited'; until: U64; axis: 'requests' | 'tokens' | 'input_tokens' | 'output_tokens' | 'concurrent' | null }
  inFlight: number
  queued: number
  settled: U64
  lastSeen: U64
  /** Moving average of |estimate − actual| / actual, thousandths, over calls that completed with the provider's usage. */
  inputErrorPermille: number
  outputErrorPermille: number
  /** The signed side of the same figures: positive when estimates are above what the provider counted. */
  inputBiasPermille: number
  outputBiasPermille: number
  alerting: boolean
  repeatFailures: number
}

/** The coordinator's metrics (the core's `Metrics`, camelCase keys). */
export interface Metrics {
  now: U64
  liveLeases: number
  pools: PoolMetrics[]
  agents: AgentMetrics[]
  tasks: TaskMetrics
}

/**
 * The low-level engine: the core coordinator behind one interface. Every method takes
 * `now` (integer milliseconds on the caller's clock) where the core does; none reads a
 * clock. Errors are thrown as `Error`s with a stable `code` (see `TokenwardenError`).
 */
/** A provider API whose calls are leased (see {@link Engine.modelCall}). */
export type ModelApi = 'anthropic_messages' | 'openai_chat' | 'openai_responses'

/** Who a call is ({@link Engine.callerIdentity}): its name, its parent's, its family's root. */
export interface CallerIdentity {
  name: string
  /** The agent that spawned it (`null` for a session's main thread or a named agent). */
  parent: string | null
  /** The root of its family (`null` for a root itself). */
  root: string | null
}

/**
 * What one send's machine asks its host to do ({@link Exchange.actions}): renew the lease;
 * settle it with `usage` (and, when `learn` and the settle was taken, let the estimator
 * learn from it); end it as interrupted with what the body showed (`seen`, `null` for
 * nothing); hand the answer over; abort the request for a timeout (the call then fails with
 * `upstream_timeout`).
 */
export type ExchangeAction =
  | { do: 'renew' }
  | { do: 'settle'; usage: Usage; learn: boolean }
  | { do: 'interrupted'; seen: Usage | null }
  | { do: 'deliver' }
  | { do: 'timed_out'; timeout: 'first_byte' | 'idle'; ms: number }

/** What the core made of an answer's head: settled by it, a success with no body, a JSON body, an event stream. */
export type ExchangeAnswer = 'settled' | 'empty' | 'json' | 'stream'

/**
 * One send of a model call ({@link Engine.exchange}): the core's machine for the lease's
 * renewal, the upstream timeouts, when the answer is handed over and how the lease ends,
 * with the provider crate's reader of the answer's usage. The host tells it what happened
 * (times on the driver's clock) and does what it says. Every event answers bits: 1, actions
 * wait ({@link Exchange.actions}); 2, the deadline moved ({@link Exchange.deadline}: arm
 * one timer for it and call {@link Exchange.timeout} when it fires).
 */
export interface Exchange {
  /** The head came: what the core made of it, and the time left on the lease. */
  answered(now: number, answer: ExchangeAnswer, leaseLeftMs: number): number
  /** The caller waits for the next piece of the body (the idle timeout runs). */
  reading(now: number): number
  /** A piece of the body came. */
  push(now: number, chunk: Uint8Array): number
  /** The body ended cleanly. */
  end(now: number): number
  /** The body broke or was cancelled. */
  broken(): number
  /** No answer came, or the core could not take it in. */
  failed(): number
  /** The timer fired. */
  timeout(now: number): number
  /** A renewal was answered: the time left on the lease. */
  renewed(now: number, leaseLeftMs: number): number
  /** A renewal was refused (`gone`: the lease is unknown). */
  renewRefused(gone: boolean): number
  /** A settle was refused (`gone`: the lease had ended). */
  settleRefused(gone: boolean): number
  /** An interrupted end was refused (`gone`: the lease had ended). */
  interruptedRefused(gone: boolean): number
  /** When to call `timeout` next, on the driver's clock; -1 for never. */
  deadline(): number
  /** The actions waiting, in order. */
  actions(): ExchangeAction[]
}

export interface Engine {
  /** Pool names, by index. */
  readonly pools: readonly string[]
  /** The index of the pool with this name, or `null`. */
  poolId(name: string): number | null
  /**
   * Which API a request is a model call of, or `null` (it passes through unleased): the
   * provider crate's rule (`tokenwarden-provider`), on the path as the provider's router
   * reads it, so a look-alike (`/v1/m%65ssages`, `/V1/Messages`, `/v1/messages;x`) is a
   * model call too. `target`: the request's path, query string allowed.
   */
  modelCall(method: string, target: string): ModelApi | null
  /**
   * One send of an `api` call, sent at `now` under a lease with `leaseLeftMs` to run, with
   * `timeouts` as {@link Engine.exchangeTimeouts} answers them (see {@link Exchange}).
   */
  exchange(api: ModelApi, now: number, leaseLeftMs: number, timeouts: readonly [number, number]): Exchange
  /**
   * The upstream timeouts from a host's options, checked (`timeouts.firstByteMs`,
   * `timeouts.idleMs`: whole milliseconds from 1 to 30 days, `Infinity` for none,
   * `undefined` for the default of 10 and 5 minutes): `[firstByteMs, idleMs]`.
   */
  exchangeTimeouts(firstByteMs: number | undefined, idleMs: number | undefined): [number, number]
  /**
   * Who a call is by its client's session headers (Claude Code's `x-claude-code-*`, Codex's
   * `session_id`, `thread-id`, `x-openai-subagent`) and the family it belongs to, under the
   * name `base` when the URL or a credential gives one (the provider crate's rule); `null`
   * when nothing names it.
   */
  callerIdentity(headers: Array<[string, string]>, base: string | null): CallerIdentity | null
  requestLease(now: U64, request: LeaseRequest): Decision
  settle(now: U64, lease: number, usage: Usage): Settlement
  cancel(now: U64, lease: number): void
  /**
   * Parses the headers (name/value pairs), resyncs the pool, pauses it on a 429. `reported`:
   * the response was seen by another process that reported it (a member of a shared
   * limiter), so a 429 pauses for at most `feedback.max_reported_pause_ms`.
   */
  handleResponse(now: U64, pool: number, lease: number | null, status: number, headers: Array<[string, string]>, unixNowMs: U64 | null, reported?: boolean): HeaderReport
  handleTimeout(now: U64): void
  pollTimeout(): U64 | null
  pollEvent(): EngineEvent | null
  /**
   * The host protocol: applies one input at `now` and answers its output. Every input the
   * core takes crosses here; the typed methods beside it are the register file's fast
   * paths for the inputs of every call (a lease, a settle, a response), and the driver
   * sends the rest (a renewal, an interrupted end, tasks) here.
   */
  handle(now: U64, input: Input): Output
  /** The call lifecycle: asks for capacity for `call` and says what to do next. */
  callLease(now: U64, call: CallState, request: LeaseRequest): CallLeaseResult
  /**
   * The call lifecycle: feeds a response back (as `handleResponse`) and says what to do
   * with it. A response that is not a success is settled here as nothing used.
   */
  callResponse(now: U64, call: CallState, pool: number, lease: number | null, status: number, headers: Array<[string, string]>, unixNowMs: U64 | null, reported?: boolean): CallResponseResult
  metrics(now: U64): Metrics
  /** The whole state as JSON, for `EngineFactory.restore`. */
  snapshot(): string
}

/** Makes engines: one per runtime (addon, wasm, …). */
export interface EngineFactory {
  /** A coordinator for `config` (the core's JSON shape, as an object or a JSON string). */
  create(config: object | string, seed: U64, now: U64): Engine
  /** A coordinator restored from `snapshot()`. */
  restore(snapshot: string): Engine
  /**
   * The core's fleet sizing on a fleet description's JSON text, answered as camelCase JSON
   * text (see {@link planFleet}).
   */
  planFleet?(json: string): string
}

/** One kind of agent in a fleet to size (the core's snake_case fields). */
export interface AgentKind {
  name: string
  count: number
  /** Model calls per minute per agent, thousandths (a turn every 90 s is 667). */
  calls_per_minute_milli: number
  input_tokens_first: number
  /** Input tokens of its last call: the context grown over a session. */
  input_tokens_last: number
  output_tokens: number
  /** Share of the input read from the prompt cache, thousandths (free under Anthropic counting). */
  cached_permille?: number
  /** How long a call takes, ms (default 20000). */
  call_ms?: number
  /** Subagents each agent runs alongside itself, alike (default 0). */
  fan_out?: number
}

/** A fleet to size: a pool's limits (the configuration's pool shape) and its agents. */
export interface FleetPlan {
  pool: object
  agents: AgentKind[]
  /** The share of each limit to plan to, thousandths (default 750). */
  headroom_permille?: number
}

/** The core's answer for a {@link FleetPlan}. */
export interface Plan {
  axes: { axis: 'input_tokens' | 'output_tokens' | 'tokens' | 'requests' | 'concurrent'; limit: number; demand: number; usedPermille: number }[]
  bindingAxis: string | null
  agents: number
  /** `null` when the fleet puts no demand on any limited axis (any number fits). */
  agentsThatFit: number | null
  fits: boolean
  /** How much longer each turn takes than the fleet's own pace, thousandths (1000: not at all). */
  turnStretchPermille: number
}

// Drift checks, at compile time: the hand-written shapes above say what the tables generated
// from the Rust side (`abi.ts`) say. `tsc` fails here when a field, role, axis, reason or
// event is added on one side only.
/** `true` when `A` and `B` are the same union. */
export type SameUnion<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
type Holds<T extends true> = T
export type AbiDriftChecks = [
  Holds<SameUnion<keyof LeaseRequest, (typeof LEASE_REQUEST_FIELDS)[number]>>,
  Holds<SameUnion<keyof Usage, (typeof USAGE_FIELDS)[number]>>,
  Holds<SameUnion<Role, (typeof ROLES)[number]>>,
  Holds<SameUnion<Axis, (typeof AXES)[number]>>,
  Holds<SameUnion<RejectReason['kind'], (typeof REJECT_REASONS)[number]>>,
  Holds<SameUnion<EngineEvent['kind'], (typeof EVENTS)[number]>>,
]
