import type { Clock } from './clock.js'
import { Driver } from './driver.js'
import { BytesPerTokenEstimator, type Estimator } from './estimator.js'
import { type FetchOptions, createFetch } from './fetch.js'
import type { Engine, EngineFactory, U64 } from './types.js'

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
  /** Input-token estimator shared by every wrapped `fetch` (default: learned bytes per token). */
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
    this.estimator = options.estimator ?? new BytesPerTokenEstimator()
  }

  /**
   * A `fetch` for one agent's SDK client: `new Anthropic({ fetch: tw.fetch(), maxRetries: 0 })`.
   * Set `maxRetries: 0`: the wrapper retries 429s itself, in line with the rest of the fleet.
   */
  fetch(options: FetchOptions = {}): typeof fetch {
    return createFetch({ driver: this, estimator: this.estimator, nextAgent: () => ++this.#agents }, options)
  }
}
