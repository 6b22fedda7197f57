/**
 * `tokenwarden` for Node.js: the shared driver and `fetch` wrapper on the native engine.
 *
 * ```js
 * import { createTokenwarden } from 'tokenwarden'
 * const tw = createTokenwarden({ config: { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: 400000 }] } })
 * const client = new Anthropic({ fetch: tw.fetch(), maxRetries: 0 })
 * ```
 */
import { NativeEngine, nativeEngines } from './native.js'
import { Tokenwarden, type TokenwardenOptions } from 'tokenwarden-driver'

export * from 'tokenwarden-driver'
export { NativeEngine, nativeEngines }

/** Options for {@link createTokenwarden}: as for `Tokenwarden`, with the engine optional. */
export type CreateOptions = Omit<TokenwardenOptions, 'engine'> & Partial<Pick<TokenwardenOptions, 'engine'>>

/** A {@link Tokenwarden} on the native engine (unless `engine` says otherwise). */
export function createTokenwarden(options: CreateOptions): Tokenwarden {
  return new Tokenwarden({ ...options, engine: options.engine ?? nativeEngines })
}
