// The product's estimator for the fleet simulator (`examples/src/sim/bridge.rs`).
//
// The simulator generates request bodies and needs the shipped estimator's figures for
// them, not a copy of its rules: this program imports the built npm package
// (`bindings-node/dist`, the `tokenwarden` package: the driver with the native addon's
// tokenizer, which it registers on import) and runs its default estimator, `DefaultEstimator`
// (what `Tokenwarden` uses unless given another), with its clock set to the simulator's
// virtual time, and calls it the way the `fetch` wrapper does (driver/ts/fetch.ts):
//
// - each attempt of a call (the first ask, and each ask again after a refusal or a 429)
//   estimates the same parsed body object: `estimate({ provider, model, body })`, `model`
//   and `max_tokens` read by the driver's own `callShape`;
// - when the provider's usage arrives (as the core takes it: what the provider crate's
//   readers make of an answer), the estimator observes it exactly as `learn` in fetch.ts does:
//   `observe({ provider, model, body, estimate, actualInputTokens, usage })`, with the
//   same body and the same estimate object as the attempt that was sent.
//
// Protocol: one JSON object a line on stdin, one answer a line on stdout, in order.
//   {"op":"hello"}                                   -> {"ok":true,"node":..,"estimator":..}
//   {"op":"estimate","call":K,"now":MS,"provider":"anthropic","body":{..}}
//                                                    -> {"input_tokens":N,"cached_prefix_tokens":M,"cached_prefix_confirmed":0|1,"max_tokens":X}
//     (`body` only on a call's first estimate: later ones estimate the same object again)
//   {"op":"observe","call":K,"now":MS,"usage":{"input_tokens":..,"cache_creation_input_tokens":..,
//     "cache_read_input_tokens":..,"output_tokens":..}} -> {"ok":true}   (the call is then forgotten)
//   {"op":"forget","call":K}                          -> {"ok":true}   (a call that never settled)
// An error answers {"error":"..."} and the simulator stops with it.
//
//   node examples/estimator-bridge.mjs [path/to/bindings-node/dist/index.js]
import { createInterface } from 'node:readline'
import { pathToFileURL } from 'node:url'

const entry = process.argv[2] ?? new URL('../bindings-node/dist/index.js', import.meta.url).href
let driver
try {
  driver = await import(entry.startsWith('file:') ? entry : pathToFileURL(entry).href)
} catch (e) {
  process.stderr.write(`estimator-bridge: cannot import the built npm package (${entry}): ${e?.message ?? e}\nbuild it: npm ci (at the repository root), then cd driver && npm run build, then cd bindings-node && npm run build\n`)
  process.exit(3)
}
const { DefaultEstimator, callShape } = driver

// The simulator's virtual time, ms: set by every message that carries `now`.
let now = 0
const estimator = new DefaultEstimator({ now: () => now })
/** Calls estimated and not yet observed or forgotten: their body and last estimate. */
const calls = new Map()

async function handle(msg) {
  if (typeof msg.now === 'number') now = msg.now
  switch (msg.op) {
    case 'hello':
      return { ok: true, node: process.version, estimator: estimator.constructor.name }
    case 'estimate': {
      let c = calls.get(msg.call)
      if (msg.body !== undefined) {
        c = { provider: msg.provider, body: msg.body, estimate: null }
        calls.set(msg.call, c)
      }
      if (c === undefined) throw new Error(`estimate of call ${msg.call}: no body sent for it`)
      const shape = callShape(c.provider, c.body)
      c.model = shape.model
      // Awaited as the fetch wrapper does: the first call of a model may load the tokenizer.
      const e = await estimator.estimate({ provider: c.provider, model: shape.model, body: c.body })
      c.estimate = e
      return { input_tokens: e.inputTokens, cached_prefix_tokens: e.cachedPrefixTokens, cached_prefix_confirmed: e.cachedPrefixConfirmed === true ? 1 : 0, max_tokens: shape.maxTokens }
    }
    case 'observe': {
      const c = calls.get(msg.call)
      if (c === undefined || c.estimate === null) throw new Error(`observe of call ${msg.call}: never estimated`)
      calls.delete(msg.call)
      // The simulator sends the usage as the core takes it (uncached input, cache writes,
      // cache reads, output): what the provider crate's readers make of an answer.
      const u = msg.usage ?? {}
      const n = (k) => {
        const v = u[k]
        if (!Number.isSafeInteger(v) || v < 0) throw new Error(`observe of call ${msg.call}: usage.${k} must be a count, got ${JSON.stringify(v)}`)
        return v
      }
      // As fetch.ts's `learn` (its `actualInputTokens` is `promptTokens(usage)`, every
      // prompt token the usage counts: uncached, cache writes and cache reads).
      const observed = {
        inputTokens: n('input_tokens'),
        cacheReadInputTokens: n('cache_read_input_tokens'),
        cacheCreationInputTokens: n('cache_creation_input_tokens'),
        outputTokens: n('output_tokens'),
      }
      await estimator.observe?.({ provider: c.provider, model: c.model, body: c.body, estimate: c.estimate, actualInputTokens: observed.inputTokens + observed.cacheCreationInputTokens + observed.cacheReadInputTokens, usage: observed })
      return { ok: true }
    }
    case 'forget':
      calls.delete(msg.call)
      return { ok: true }
    default:
      throw new Error(`unknown op ${JSON.stringify(msg.op)}`)
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity })
// One message at a time, in order (an estimate may await the tokenizer's first load).
let chain = Promise.resolve()
lines.on('line', (line) => {
  if (line.length === 0) return
  chain = chain.then(async () => {
    let answer
    try {
      answer = await handle(JSON.parse(line))
    } catch (e) {
      answer = { error: String(e?.stack ?? e) }
    }
    // The simulator waits for each answer (a pipe's writes are synchronous on Linux).
    process.stdout.write(`${JSON.stringify(answer)}\n`)
  })
})
