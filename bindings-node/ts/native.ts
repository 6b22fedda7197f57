/**
 * The engine backed by the native addon (napi-rs over `tokenwarden-core`): a
 * {@link RegisterEngine} whose register file the addon keeps attached.
 */
import { createRequire } from 'node:module'
import type * as Binding from '../binding.js'
import { type EngineFactory, type ProviderRules, RegisterEngine, type RegisterBinding, TokenwardenError, type U64, configJson, normalizeEngineError } from 'tokenwarden-driver'

const require = createRequire(import.meta.url)

// The addon for this platform: next to the loader in a checkout, or from the optional
// per-platform package (`tokenwarden-linux-x64-gnu`, ...). Missing on a platform without a
// prebuilt binary, which is not an error until the native engine is asked for.
let binding: typeof Binding | null = null
let loadError: unknown = null
try {
  binding = require('../binding.cjs') as typeof Binding
} catch (e) {
  loadError = e
}

/** Why the native engine cannot load here, or `null` when it can. */
export function nativeLoadError(): Error | null {
  if (binding !== null) return null
  const why = loadError instanceof Error ? loadError.message.split('\n')[0] : String(loadError)
  return new TokenwardenError(
    'engine_unavailable',
    `no native engine for ${process.platform}-${process.arch} (${why}); the WebAssembly engine works everywhere: createTokenwarden({ engine: 'wasm', ... })`,
    { cause: loadError },
  )
}

function addon(): typeof Binding {
  if (binding === null) throw nativeLoadError()
  return binding
}

/** How many tokens `text` is in `encoding`, by the addon's tokenizer (the provider crate's). */
export function nativeCountTokens(encoding: 'o200k_base' | 'cl100k_base', text: string): number {
  try {
    return addon().countTokens(encoding, text)
  } catch (e) {
    throw normalizeEngineError(e, 'countTokens')
  }
}

/** The provider crate's rules in the addon (its estimator, request shapes, error formats). */
export const nativeProviderRules: ProviderRules = {
  create(options) {
    try {
      return new (addon().Estimator)(options)
    } catch (e) {
      throw normalizeEngineError(e, 'estimator')
    }
  },
  callShape(provider, body) {
    try {
      return addon().callShape(provider, body)
    } catch (e) {
      throw normalizeEngineError(e, 'callShape')
    }
  },
  promptBytes(provider, body) {
    try {
      return addon().promptBytes(provider, body)
    } catch (e) {
      throw normalizeEngineError(e, 'promptBytes')
    }
  },
  errorAnswer(provider, status, type, message, tokenwarden, stream) {
    try {
      return addon().errorAnswer(provider, status, type ?? null, message, tokenwarden, stream)
    } catch (e) {
      throw normalizeEngineError(e, 'errorAnswer')
    }
  },
  stopAnswer(stop, retryAfterMs) {
    try {
      return addon().stopAnswer(stop, retryAfterMs ?? undefined)
    } catch (e) {
      throw normalizeEngineError(e, 'stopAnswer')
    }
  },
  countTokensBody(body) {
    try {
      return addon().countTokensBody(body)
    } catch (e) {
      throw normalizeEngineError(e, 'countTokensBody')
    }
  },
  countTokensPause(status, retryAfter, unixNowMs, pauseMs) {
    try {
      return addon().countTokensPause(status, retryAfter, unixNowMs, pauseMs)
    } catch (e) {
      throw normalizeEngineError(e, 'countTokensPause')
    }
  },
  checkFleets(text, serveFile) {
    try {
      return addon().checkFleets(text, serveFile)
    } catch (e) {
      throw normalizeEngineError(e, 'checkFleets')
    }
  },
  proxiedCall(rest, search, headers, secrets, credential) {
    try {
      return addon().proxiedCall(rest, search, headers, secrets, credential ?? undefined)
    } catch (e) {
      throw normalizeEngineError(e, 'proxiedCall')
    }
  },
  proxiedProvider(rest, anthropicVersion) {
    return addon().proxiedProvider(rest, anthropicVersion) ?? null
  },
  limiterAnswer(status, code, retryAfter, waitedMs, timeoutMs) {
    try {
      return addon().limiterAnswer(status, code ?? undefined, retryAfter ?? undefined, waitedMs, timeoutMs)
    } catch (e) {
      throw normalizeEngineError(e, 'limiterAnswer')
    }
  },
  identity(kind, a, b) {
    try {
      return addon().identity(kind, a, b)
    } catch (e) {
      throw normalizeEngineError(e, 'identity')
    }
  },
}

/** The addon's coordinator as an {@link Engine}. */
export class NativeEngine extends RegisterEngine {
  /** Wraps an addon coordinator (use `nativeEngines.create` / `.restore`). */
  constructor(coordinator: Binding.Coordinator) {
    super(coordinator as unknown as RegisterBinding, (io) => coordinator.attachIo(io))
  }
}

/** Creates and restores {@link NativeEngine}s. */
export const nativeEngines: EngineFactory = {
  create(config: object | string, seed: U64, now: U64): NativeEngine {
    const json = configJson(config)
    const { Coordinator } = addon()
    try {
      return new NativeEngine(new Coordinator(json, seed, now))
    } catch (e) {
      throw normalizeEngineError(e, 'create')
    }
  },
  restore(snapshot: string): NativeEngine {
    const { Coordinator } = addon()
    try {
      return new NativeEngine(Coordinator.restore(snapshot))
    } catch (e) {
      throw normalizeEngineError(e, 'restore')
    }
  },
  planFleet(json: string): string {
    return addon().planFleet(json)
  },
}
