import type { Clock } from './clock.js'
import { Driver } from './driver.js'
import { DefaultEstimator, type Estimator } from './estimator.js'
import { type FetchOptions, createFetch, failureSignature, taskIdFor } from './fetch.js'
import { invalidArgument, normalizeEngineError } from './errors.js'
import type { Engine, EngineFactory, FleetPlan, Plan, Role, TaskOutcome, TaskSummary, U64 } from './types.js'

/** Options for {@link Tokenwarden}. */
export interface TokenwardenOptions {
  /**
   * The engine: an engine instance, or a factory that `config` is given to. In the `tokenwarden`
   * entry point this defaults to the native addon.
   */
  engine: Engine | EngineFactory
  /** The coordinator configuration (the core's JSON shape), when `engine` is a factory. */
  config?: object | string
  /** PRNG seed for backoff jitter (default: random). */
  seed?: U64
  /** Time and timers (default: the system clock). */
  clock?: Clock
  /**
   * Input-token estimator shared by every wrapped `fetch` (default: a `DefaultEstimator`, the
   * tokenizer for OpenAI and learned bytes per token for Anthropic).
   */
  estimator?: Estimator
}

function randomSeed(): number {
  const words = new Uint32Array(2)
  crypto.getRandomValues(words)
  return (words[0]! & 0x1fffff) * 2 ** 32 + words[1]!
}

function isFactory(e: Engine | EngineFactory): e is EngineFactory {
  return typeof (e as EngineFactory).create === 'function' && typeof (e as Engine).requestLease !== 'function'
}

/**
 * One owner of a provider's quota in this process: the {@link Driver} plus `fetch()`, which
 * makes a `fetch` for one agent's SDK client.
 *
 * ```js
 * const tw = createTokenwarden({ config })
 * const claude = new Anthropic({ fetch: tw.fetch({ agent: 'planner', role: 'planner' }), maxRetries: 0 })
 * ```
 */
export class Tokenwarden extends Driver {
  /** The estimator every wrapped `fetch` shares (it learns from all of them). */
  readonly estimator: Estimator
  #agents = 0

  constructor(options: TokenwardenOptions) {
    if (options === null || typeof options !== 'object') throw invalidArgument(`Tokenwarden needs an options object ({ engine, config }), got ${options === null ? 'null' : typeof options}`, 'options')
    const given = options.engine as unknown
    if (
      given === null ||
      (typeof given !== 'object' && typeof given !== 'function') ||
      (typeof (given as EngineFactory).create !== 'function' && typeof (given as Engine).requestLease !== 'function')
    ) {
      throw invalidArgument(
        `Tokenwarden needs \`engine\`: an engine or an engine factory, got ${given === null ? 'null' : typeof given} (in the \`tokenwarden\` package, createTokenwarden({ config }) picks the engine for you)`,
        'engine',
      )
    }
    const clock = options.clock
    let engine: Engine
    if (isFactory(options.engine)) {
      if (options.config === undefined) throw new TypeError('`config` is required when `engine` is a factory')
      const now = clock === undefined ? Math.floor(performance.now()) : clock.now()
      engine = options.engine.create(options.config, options.seed ?? randomSeed(), now)
    } else {
      engine = options.engine
    }
    super(engine, clock === undefined ? {} : { clock })
    this.estimator = options.estimator ?? new DefaultEstimator()
  }

  /**
   * A `fetch` for one agent's SDK client: `new Anthropic({ fetch: tw.fetch(), maxRetries: 0 })`.
   * Set `maxRetries: 0`: the wrapper retries 429s itself, in line with the rest of the fleet.
   */
  fetch(options: FetchOptions = {}): typeof fetch {
    return createFetch({ driver: this, estimator: this.estimator, nextAgent: () => ++this.#agents }, options)
  }

  /**
   * Opens a task and returns its handle: `task.fetch()` for the SDK client working on it,
   * `task.failed(signature)` after a failed attempt, `task.done({ merged })` at the end.
   * The task's figures (tokens, wall time, quota and critical-path wait) feed
   * `metrics().tasks`.
   *
   * ```js
   * const t = tw.task({ id: 'fix-parser', role: 'worker', unblocks: 3 })
   * const claude = new Anthropic({ fetch: t.fetch(), maxRetries: 0 })
   * // … a failing test: await t.failed({ test: 'parser handles tabs', diff })
   * await t.done({ merged: true })
   * ```
   */
  task(options: TaskOptions): Task {
    if (options === null || typeof options !== 'object') throw new TypeError('task() needs an options object: { id, role?, unblocks? }')
    const { id } = options
    if (typeof id !== 'string' && typeof id !== 'number' && typeof id !== 'bigint') {
      throw new TypeError(`task id must be a string or a number, got ${id === null ? 'null' : typeof id}`)
    }
    const task = typeof id === 'string' ? taskIdFor(id) : id
    const role = options.role ?? 'worker'
    const unblocks = options.unblocks ?? 0
    const opened = this.openTask({ task, role, unblocks })
    return new Task(this, task, typeof id === 'string' ? id : null, role, unblocks, opened)
  }
}

/** Options for {@link Tokenwarden.task}. */
export interface TaskOptions {
  /** The task's id: a name (hashed with `taskIdFor`) or an integer. */
  id: string | U64
  /** The role of the agent working on it (default `worker`). */
  role?: Role
  /** Downstream tasks waiting on it (default 0): raises its calls' weight. */
  unblocks?: number
}

/** A failure, as {@link Task.failed} takes it: a signature, or what to hash into one. */
export type TaskFailure = U64 | { test: string; diff?: string }

/** One task's handle (from {@link Tokenwarden.task}). */
export class Task {
  readonly #tw: Tokenwarden
  readonly #opened: void | Promise<void>
  /** The numeric task id the core knows it by. */
  readonly id: U64
  /** The name it was opened with, when it was a string. */
  readonly name: string | null
  readonly role: Role
  readonly unblocks: number

  constructor(tw: Tokenwarden, id: U64, name: string | null, role: Role, unblocks: number, opened: void | Promise<void>) {
    this.#tw = tw
    this.id = id
    this.name = name
    this.role = role
    this.unblocks = unblocks
    this.#opened = opened
    // An open that failed remotely surfaces on the task's next call; do not leave it unhandled.
    if (opened instanceof Promise) opened.catch(() => {})
  }

  /** A `fetch` for an SDK client working on this task (options as `tw.fetch`). */
  fetch(options: FetchOptions = {}): typeof fetch {
    return this.#tw.fetch({ role: this.role, unblocks: this.unblocks, ...options, task: this.id })
  }

  /**
   * A failed attempt (a failing test, a rejected diff). Pass a signature, or
   * `{ test, diff }` to hash into one (`failureSignature`). The same failure twice in a row
   * halves the task's weight down to the floor. Resolves to the identical failures in a row.
   */
  async failed(failure: TaskFailure): Promise<number> {
    const signature = typeof failure === 'object' && failure !== null ? failureSignature(failure.test, failure.diff) : failure
    await this.#opened
    return this.#tw.taskFailed(this.id, signature)
  }

  /** Ends the task: merged (default) or not (`{ merged: false }` is abandoned, or pass `outcome`). */
  async done(options: { merged?: boolean; outcome?: TaskOutcome } = {}): Promise<TaskSummary> {
    const outcome = options.outcome ?? (options.merged === false ? 'abandoned' : 'merged')
    await this.#opened
    return this.#tw.endTask(this.id, outcome)
  }
}

/**
 * Sizes a fleet before it runs, with the core's arithmetic (`plan_fleet`): each limited
 * axis's late-session demand and the share of its limit it takes, the axis that binds,
 * how many agents of the same mix fit at the headroom (75 % by default), and how much each
 * turn stretches when the fleet is too big. `planJson` is an engine's `planFleet` (the
 * npm packages pass theirs). Errors name the field (`invalid_argument`).
 */
export function planFleetWith(planJson: (json: string) => string, plan: FleetPlan | string): Plan {
  if (typeof plan !== 'string') {
    if (plan === null || typeof plan !== 'object') throw invalidArgument(`planFleet needs a fleet description ({ pool, agents }), got ${plan === null ? 'null' : typeof plan}`, 'plan')
    // JSON has no NaN or Infinity: `JSON.stringify` would write null, and a null limit is
    // an unknown one, so the limit would be dropped rather than refused.
    const bad = nonFinite(plan, '')
    if (bad !== null) throw invalidArgument(`\`${bad.path}\` must be a finite number, got ${bad.value}`, bad.path)
  }
  const text = typeof plan === 'string' ? plan : JSON.stringify(plan)
  try {
    return JSON.parse(planJson(text)) as Plan
  } catch (e) {
    throw normalizeEngineError(e, 'planFleet')
  }
}

/** The first number in `v` that JSON cannot hold (NaN, ±Infinity), with its path. */
function nonFinite(v: unknown, path: string): { path: string; value: number } | null {
  if (typeof v === 'number') return Number.isFinite(v) ? null : { path, value: v }
  if (v === null || typeof v !== 'object') return null
  for (const [k, x] of Array.isArray(v) ? v.map((x, i) => [String(i), x] as const) : Object.entries(v)) {
    const found = nonFinite(x, Array.isArray(v) ? `${path}[${k}]` : path === '' ? k : `${path}.${k}`)
    if (found !== null) return found
  }
  return null
}
