// Types for every entry point of tokenwarden-wasm (web, nodejs, bundler, workerd): the
// shared driver from `tokenwarden-driver` plus the wasm engine.
import type { CountText, Engine, EngineFactory, ProviderRules, OpenAIEncoding, Tokenwarden, TokenwardenOptions } from 'tokenwarden-driver'

export * from 'tokenwarden-driver'

/** The wasm build's coordinator as an {@link Engine}. */
export declare class WasmEngine implements Engine {
  private constructor()
  readonly pools: readonly string[]
  poolId(name: string): number | null
  modelCall: Engine['modelCall']
  exchange: Engine['exchange']
  exchangeTimeouts: Engine['exchangeTimeouts']
  callerIdentity: Engine['callerIdentity']
  requestLease: Engine['requestLease']
  settle: Engine['settle']
  cancel: Engine['cancel']
  handleResponse: Engine['handleResponse']
  handleTimeout: Engine['handleTimeout']
  pollTimeout: Engine['pollTimeout']
  pollEvent: Engine['pollEvent']
  handle: Engine['handle']
  callLease: Engine['callLease']
  callResponse: Engine['callResponse']
  metrics: Engine['metrics']
  snapshot: Engine['snapshot']
  /** Internal consistency check; throws naming the broken invariant. */
  check(): void
  /** Frees the wasm memory now (otherwise a FinalizationRegistry does it eventually). */
  free(): void
}

/** Creates and restores engines backed by the wasm build. */
export declare const wasmEngines: EngineFactory & {
  create(config: object | string, seed: number | bigint, now: number | bigint): WasmEngine
  restore(snapshot: string): WasmEngine
  /** The core's fleet sizing on a fleet description's JSON text (camelCase JSON text back). */
  planFleet(json: string): string
}

/**
 * A counter of `encoding`'s tokens: the wasm build's tokenizer (the provider crate's
 * byte-pair tokenizer), built the first time the encoding is asked for from the package's
 * `data/<encoding>.bpe` (read from disk under Node, fetched beside the module in a browser
 * or bundle, a data module in a Worker): a promise while the ranks load.
 */
export declare function wasmTokenizers(encoding: OpenAIEncoding): CountText | Promise<CountText>

/**
 * The provider crate's rules in the wasm build, which the driver runs (its estimator,
 * request shapes, error formats): registered with the driver when the package is imported
 * (`useProviderRules`), unless another engine package registered its own first.
 */
export declare const wasmProviderRules: ProviderRules

/** Options for {@link createTokenwarden}: the engine defaults to the wasm build. */
export type CreateOptions = Omit<TokenwardenOptions, 'engine'> & Partial<Pick<TokenwardenOptions, 'engine'>>

/** A `Tokenwarden` on the wasm engine (a random seed unless you give one). */
export declare function createTokenwarden(options: CreateOptions): Tokenwarden

/**
 * Loads the .wasm. Required once before use in the `web` build (pass a URL, `Response`,
 * bytes or a compiled `WebAssembly.Module`, or nothing to fetch it next to the module);
 * a no-op elsewhere.
 */
export declare function init(input?: unknown): Promise<void>

/** Why the gateway refuses a member's request: the HTTP answer. */
export interface MemberRefusal {
  status: number
  error: string
  message: string
  field?: string
}

/**
 * The members of one quota, for a host of the HTTP API (the edge Worker's Durable Object;
 * the gateway crate's `members`): a member's request checked against who sends it (an agent
 * credential's name, or `undefined` for the fleet's secret), and the table of the leases and
 * tickets members hold. The host applies the checked input through its driver and hands the
 * output to `applied`; the driver's `granted`, `revised` and `expired` events go to the
 * methods of those names; `takeWakes()` says which long polls to answer now. Answers are
 * JSON text; a refusal is `{ refused: MemberRefusal }`, never a throw.
 */
export declare class MemberTable {
  /** `records`: what `records()` answered before a restart (`'[]'` for none). */
  constructor(pools: string[], records: string)
  /** The table replaced (the quota reset and started again). */
  restore(pools: string[], records: string): void
  /** Keys agent ids by the fleet's secret; `names`: `[[id, name], …]` stored before a restart. */
  key(secret: string, names: string): void
  /**
   * A member's request to `route` (`handle`, `lease`, `settle`, `cancel`, `interrupted`,
   * `renew`, `response`, `task`, `task-failed`, `task-done`) naming lease or task `id` in its
   * path (the segment, percent-decoded), with its body's JSON text: `{ input }` (the core's input, for
   * `Tokenwarden.handle`) or `{ refused }`.
   */
  route(route: string, id: string | undefined, who: string | undefined, body: string): string
  /** The output the input `route` last answered had (JSON text). */
  applied(output: string): void
  /** A long poll: `{ hold: ms }`, `{ status, body }` or `{ refused }`. */
  wait(lease: number, who: string | undefined, timeoutMs: number): string
  /** The operator's hold body at `now`: `{ input }` or `{ refused }`. */
  hold(body: string, now: number): string
  granted(lease: number, expiresAt: number, waitedMs: number): void
  revised(lease: number, eta: number, now: number): void
  expired(lease: number): void
  takeWakes(): Float64Array
  agentId(name: string): number
  nameOf(id: number): string | undefined
  /** `[[id, name | null], …]` to store since the last call. */
  takeNameWrites(): string
  /** A remote driver (`x-tokenwarden-client`) seen at `now`: how many share the quota (at least 1). */
  seen(client: string | undefined, now: number): number
  /** The metrics (JSON text) with the agents' names and the ceilings (JSON text), as JSON text. */
  namedMetrics(metrics: string, ceilings?: string): string
  /** `[[id, record], …]` to store. */
  records(): string
  /** Ends every record (a reset); how many there were. */
  clear(): number
  free(): void
}

/**
 * A quota's recent call events and the ceilings hit (the gateway crate's `timeline`: the
 * dashboard's 429-vs-turn overlay, the metrics' `ceilings`), told the driver's call events:
 * at most 4,096 events of the last 10 minutes, counters per pool. Instants are Unix ms.
 */
export declare class Timeline {
  constructor(now: number)
  /** A call starts: `lease` of `agent` granted in `pool` after `waitedMs` in line. */
  granted(t: number, lease: number, agent: number, pool: number, waitedMs: number): void
  /** A lease ended unsettled (expired). */
  forget(lease: number): void
  /** A refusal for `reason` (the core's, JSON text) until `retryAt`, or never. */
  rejected(t: number, agent: number, pool: number, reason: string, retryAt?: number): void
  /** A 429 reported for `lease`, with its `retry-after` and the limit the provider named. */
  rateLimited(t: number, pool: number, lease?: number, retryAfterMs?: number, exceeded?: string): void
  /** A proxied call's wait after a 429 (`rate_limited`) or an overload (`overloaded`). */
  waiting(t: number, agent: number, pool: number, delayMs: number, cause: string): void
  /** Forgets everything (a reset). */
  clear(now: number): void
  /** Events held. */
  readonly size: number
  /** `GET …/timeline`'s answer (JSON text): pools by the names in `pools` (JSON), agents by id as text. */
  view(now: number, pools: string): string
  /** The ceilings hit, by pool name (JSON text; `pools` a JSON array of names). */
  ceilings(pools: string): string
  free(): void
}

/**
 * The operator's wait lines (the gateway crate's `waitlog`: a wait over 3 s, its end, a
 * summary once a minute), told the driver's call events; each method answers the lines to
 * print. `metrics` (the driver's `metrics()` as JSON text) is read only where
 * `wantsMetrics` said a line needs it.
 */
export declare class WaitLog {
  constructor(now: number)
  wantsMetrics(now: number, waitMs: number): boolean
  queued(now: number, lease: number, name: string, pool: number, agent: number, eta: number, etaMs: number, checkpoint: boolean, metrics?: string): string[]
  granted(now: number, lease: number, waitedMs: number, metrics?: string): string[]
  waiting(now: number, name: string, pool: number, agent: number, delayMs: number, message: string, metrics?: string): string[]
  rateLimited(now: number, metrics?: string): string[]
  rejected(now: number, metrics?: string): string[]
  free(): void
}

/**
 * The gateway crate's rules for a host of the HTTP API (the edge Worker), one JSON text in
 * and out: `op` `route` (`{ method, path, query?, accept?, upgrade? }` → the route: `{ route:
 * 'health' }`, `{ route: 'credential', fleet, agent }` or `{ route: 'quota', fleet, quota,
 * kind, … }`), `authenticate` (`{ fleet: { secret, adminSecret?, proxyOpen }
 * | null, name, token?, authorization?, proxy?, credential? }` → `{ agent, open }`), `admin`
 * (`{ fleet, authorization? }` → `{}`), `credential` (`{ secret, fleet, agent }` →
 * `{ credential }`), `sign` (`{ secret, fleet, quota, lease, epoch }` → `{ handle }`),
 * `open` (`{ secret, fleet, quota, handle }` → `{ id, epoch }`), `name` (`{ kind, name }` →
 * `{}`: a fleet or quota name from a URL) and `prometheus` (`{ metrics, fleet, quota }` →
 * `{ text }`: `metrics` as `metrics(now)` returns them, with the edge's names and ceilings,
 * in Prometheus's text format; bigints as JSON integers, NaN and the infinities as the
 * strings `Number()` reads). A refusal is `{ refused: MemberRefusal }`, never a throw.
 */
export declare function gatewayRule(input: string): string
