// The wasm build as an engine for the shared driver: the same `RegisterEngine` the Node
// addon's NativeEngine is, so `Driver`, `Tokenwarden` and the `fetch` wrapper from
// `tokenwarden-driver` run on it unchanged.
import { RegisterEngine, Tokenwarden, TokenwardenError, configJson, invalidArgument, normalizeEngineError } from 'tokenwarden-driver'
import { WasmRegisters } from './registers.js'

/**
 * The wasm build's coordinator as an `Engine`: the shared `RegisterEngine` (hot calls through
 * a `Float64Array` register file, copied in and out of the coordinator's own in wasm memory:
 * `registers.js`; the rest as objects), plus `free()`.
 */
export class WasmEngine extends RegisterEngine {
  #c
  #registers
  /** @param {any} coordinator a `Coordinator` from the wasm module */
  constructor(coordinator) {
    const registers = new WasmRegisters(coordinator)
    super(registers)
    this.#c = coordinator
    this.#registers = registers
  }

  /**
   * Frees the wasm memory now (otherwise a FinalizationRegistry does it eventually). Any
   * later call throws a `TokenwardenError` with code `closed` ("this engine was freed");
   * `free()` again does nothing.
   */
  free() {
    if (this.#freed) return
    this.#freed = true
    this.#registers.dispose()
    this.#c.free()
    // Every method, own or inherited, now throws before it reaches the freed coordinator
    // (which would say only "null pointer passed to rust"), the answers kept in the
    // JavaScript register file (`pollTimeout`, `pollEvent`) included.
    for (let proto = Object.getPrototypeOf(this); proto !== null && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
      for (const name of Object.getOwnPropertyNames(proto)) {
        if (name === 'constructor' || name === 'free' || Object.hasOwn(this, name)) continue
        if (typeof Object.getOwnPropertyDescriptor(proto, name)?.value !== 'function') continue
        Object.defineProperty(this, name, { value: () => freed(name) })
      }
    }
  }

  #freed = false
}

function freed(name) {
  throw new TokenwardenError('closed', `this engine was freed: ${name}() cannot be called after free(); create or restore another`)
}

/** An `EngineFactory` over an initialised wasm module's exports. */
export function enginesFor(wasm) {
  return {
    create(config, seed, now) {
      try {
        const json = configJson(config)
        return new WasmEngine(new wasm.Coordinator(json, seed, now))
      } catch (e) {
        throw normalizeEngineError(e, 'create')
      }
    },
    restore(snapshot) {
      // wasm-bindgen reads a non-string as a string's pointer and length (it traps with
      // "memory access out of bounds"); the Rust side checks too, for direct callers.
      if (typeof snapshot !== 'string') {
        throw invalidArgument(`restore needs the snapshot's JSON text (a string), got ${snapshot === null ? 'null' : Array.isArray(snapshot) ? 'an array' : typeof snapshot}`, 'snapshot')
      }
      try {
        return new WasmEngine(wasm.Coordinator.restore(snapshot))
      } catch (e) {
        throw normalizeEngineError(e, 'restore')
      }
    },
    planFleet(json) {
      if (typeof json !== 'string') throw invalidArgument('planFleet needs the fleet description as JSON text (a string)', 'json')
      return wasm.planFleet(json)
    },
  }
}

/**
 * The wasm build's tokenizers and provider rules: `ranks(encoding)` loads an encoding's ranks
 * file (`data/<encoding>.bpe`, 0.7–1.6 MB: the bytes, or a promise of them) the first time
 * it is needed. `tokenizer(encoding)` is the wasm `Tokenizer` (or a promise of it);
 * `counter(encoding)` counts with it; `rules` is the provider crate's rules the driver runs
 * (`useProviderRules`: its estimator, handed the tokenizer when an estimate first needs it,
 * request shapes, error formats).
 */
export function providerRulesFor(wasm, ranks) {
  const loaded = new Map()
  const tokenizer = (encoding) => {
    if (encoding !== 'o200k_base' && encoding !== 'cl100k_base') throw invalidArgument(`encoding must be o200k_base or cl100k_base, got ${JSON.stringify(encoding)}`, 'encoding')
    const known = loaded.get(encoding)
    if (known !== undefined) return known
    const make = (bytes) => {
      try {
        const t = new wasm.Tokenizer(encoding, bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes))
        loaded.set(encoding, t)
        return t
      } catch (e) {
        throw normalizeEngineError(e, 'tokenizer')
      }
    }
    const bytes = ranks(encoding)
    if (!(bytes instanceof Promise)) return make(bytes)
    const pending = bytes.then(make)
    loaded.set(encoding, pending)
    // A failed load is tried again the next time it is asked for.
    pending.catch(() => loaded.delete(encoding))
    return pending
  }
  const counter = (encoding) => {
    const t = tokenizer(encoding)
    return t instanceof Promise ? t.then((tok) => (text) => tok.count(text)) : (text) => t.count(text)
  }
  const call = (op, f) => {
    try {
      return f()
    } catch (e) {
      throw normalizeEngineError(e, op)
    }
  }
  const rules = {
    create(options) {
      const e = call('estimator', () => new wasm.Estimator(options))
      return {
        estimate: (now, provider, model, body) => call('estimate', () => e.estimate(now, provider, model, body)),
        observe: (id, now, provider, model, body, actual, usage) => call('observe', () => e.observe(id, now, provider, model, body ?? undefined, actual, usage ?? undefined)),
        forget: (id) => e.forget(id),
        knowsPrefixOf: (provider, model, body) => call('knowsPrefixOf', () => e.knowsPrefixOf(provider, model, body)),
        recordPromptTokens: (provider, model, body, tokens) => call('recordPromptTokens', () => e.recordPromptTokens(provider, model, body, tokens)),
        ratios: (provider, model) => call('ratios', () => e.ratios(provider, model)),
        cachedPrefixes: () => e.cachedPrefixes(),
        needsTokenizer: (provider, model) => call('needsTokenizer', () => e.needsTokenizer(provider, model)) ?? null,
        useTokenizer(encoding) {
          const t = tokenizer(encoding)
          return t instanceof Promise ? t.then((tok) => e.useTokenizer(tok)) : e.useTokenizer(t)
        },
      }
    },
    callShape: (provider, body) => call('callShape', () => wasm.callShape(provider, body)),
    promptBytes: (provider, body) => call('promptBytes', () => wasm.promptBytes(provider, body)),
    errorAnswer: (provider, status, type, message, tokenwarden, stream) => call('errorAnswer', () => wasm.errorAnswer(provider, status, type ?? undefined, message, tokenwarden, stream)),
    stopAnswer: (stop, retryAfterMs) => call('stopAnswer', () => Array.from(wasm.stopAnswer(stop, retryAfterMs ?? undefined))),
    countTokensBody: (body) => call('countTokensBody', () => wasm.countTokensBody(body)),
    countTokensPause: (status, retryAfter, unixNowMs, pauseMs) => call('countTokensPause', () => wasm.countTokensPause(status ?? undefined, retryAfter ?? undefined, unixNowMs, pauseMs)),
    checkFleets: (text, serveFile) => call('checkFleets', () => wasm.checkFleets(text, serveFile)),
    proxiedCall: (rest, search, headers, secrets, credential) => call('proxiedCall', () => wasm.proxiedCall(rest, search, headers, secrets, credential ?? undefined)),
    proxiedProvider: (rest, anthropicVersion) => wasm.proxiedProvider(rest, anthropicVersion) ?? null,
    limiterAnswer: (status, code, retryAfter, waitedMs, timeoutMs) =>
      call('limiterAnswer', () => wasm.limiterAnswer(status, code ?? undefined, retryAfter ?? undefined, waitedMs, timeoutMs)),
    identity: (kind, a, b) => call('identity', () => wasm.identity(kind, a, b)),
  }
  return { tokenizer, counter, rules }
}

/**
 * The ranks of `encoding` fetched from `data/` beside this package's modules (browsers and
 * bundles, which serve or copy the package's files).
 */
export async function fetchedRanks(encoding) {
  const url = encoding === 'o200k_base' ? new URL('../data/o200k_base.bpe', import.meta.url) : new URL('../data/cl100k_base.bpe', import.meta.url)
  const r = await fetch(url)
  if (!r.ok) throw new Error(`the ${encoding} ranks could not be loaded: ${r.status} from ${url}`)
  return new Uint8Array(await r.arrayBuffer())
}

/** `createTokenwarden` for an engine factory: a `Tokenwarden` with a random seed by default. */
export function tokenwardenFor(engines, randomSeed) {
  return (options) => new Tokenwarden({ seed: randomSeed(), ...options, engine: options.engine ?? engines })
}
