// Replays conformance traces (tests/traces, procedure in SCHEMA.md) through any engine
// factory with the JavaScript engine interface: the addon, the wasm build in Node, in
// Chromium or in workerd. No Node-only imports: this file also runs in browsers/Workers.
import { equal, stringify } from './json.mjs'

const MAX_DRIVE_STEPS = 1_000_000

// Keys whose snake_case spelling splits a number off a word, which camelCase loses.
const SNAKE_EXCEPTIONS = { agentsAt75Percent: 'agents_at_75_percent' }

/** `inputTokens` → `input_tokens`. */
export const snake = (k) => SNAKE_EXCEPTIONS[k] ?? k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)
/** `input_tokens` → `inputTokens`. */
export const camel = (k) => k.replace(/_([a-z0-9])/g, (_m, c) => c.toUpperCase())

/** Recases every object key (not string values: enum tags keep their spelling). */
export function recase(v, f) {
  if (Array.isArray(v)) return v.map((x) => recase(x, f))
  if (v !== null && typeof v === 'object') {
    const out = {}
    for (const [k, x] of Object.entries(v)) out[f(k)] = recase(x, f)
    return out
  }
  return v
}

/** An engine error as a record value, or rethrows what is not one. */
function errorRecord(e, { config = false } = {}) {
  const code = e?.code
  if (config && (code === 'config_parse' || code === 'invalid_config')) {
    return code === 'invalid_config' ? { error: code, field: e.field } : { error: code }
  }
  if (['unknown_pool', 'unknown_lease', 'not_granted', 'too_large', 'unknown_task', 'too_many_tasks', 'forbidden'].includes(code)) {
    return code === 'too_large' ? { error: code, field: snake(e.field) } : { error: code }
  }
  throw e
}

const result = (f) => {
  try {
    return f()
  } catch (e) {
    return errorRecord(e)
  }
}

/** Whether `want` is contained in `got` (the Rust runner's `subset`). */
function contains(want, got) {
  if (Array.isArray(want)) {
    if (!Array.isArray(got)) return false
    let i = 0
    return want.every((w) => {
      while (i < got.length) if (contains(w, got[i++])) return true
      return false
    })
  }
  if (want !== null && typeof want === 'object') {
    return got !== null && typeof got === 'object' && !Array.isArray(got) && Object.entries(want).every(([k, w]) => k in got && contains(w, got[k]))
  }
  return equal(want, got)
}

/** The part of `got` that `want` names (the Rust runner's `project`). */
function project(got, want) {
  if (Array.isArray(want) && Array.isArray(got)) {
    const out = []
    let i = 0
    for (const w of want) {
      while (i < got.length) {
        const g = got[i++]
        if (contains(w, g)) {
          out.push(project(g, w))
          break
        }
      }
    }
    return out
  }
  if (want !== null && typeof want === 'object' && !Array.isArray(want) && got !== null && typeof got === 'object' && !Array.isArray(got)) {
    const out = {}
    for (const [k, w] of Object.entries(want)) if (k in got) out[k] = project(got[k], w)
    return out
  }
  return got
}

/** A `metrics` record's result: whole when marked `whole` or unchecked, else what its `check` names. */
function metricsRecord(input, metrics) {
  return input.check !== undefined && input.whole !== true ? project(metrics, input.check) : metrics
}

/** A trace input as the host protocol's `Input` (camelCase): `at` and `check` left out, a call's name replaced by its state. */
function protocolInput(input, callState) {
  const { at: _at, check: _check, ...rest } = input
  const camelled = recase(rest, camel)
  if (rest.call !== undefined) camelled.call = callState(rest.call)
  return camelled
}

/**
 * A typed method's result (snake_case) as the `Output` the core's `handle` answers for the
 * same input (`core/src/protocol.rs`): the register file's fast paths are checked against
 * the traces' records, which are outputs.
 */
const TYPED = new Set(['request_lease', 'settle', 'cancel', 'response', 'timeout', 'call_lease', 'call_response'])

function outputOf(op, r) {
  if (r !== null && typeof r === 'object' && 'error' in r) return r
  const step = ({ kind, ...rest }) => {
    switch (kind) {
      case 'send':
        return { output: 'send', lease: rest.lease, expires_at: rest.expires_at }
      case 'wait':
        return { output: 'wait', wait: rest }
      case 'give_up':
        return { output: 'give_up', give_up: rest }
      default:
        return { output: 'deliver' }
    }
  }
  switch (op) {
    case 'request_lease': {
      const { kind, ...rest } = r
      const output = { grant: 'granted', queued: 'queued', reject: 'refused', never_fits: 'never_fits' }[kind]
      return { output, ...rest }
    }
    case 'settle':
      return { output: 'settled', settlement: r }
    case 'cancel':
      return { output: 'cancelled' }
    case 'timeout':
      return { output: 'timed_out' }
    case 'response':
      return { output: 'reported', report: r.report }
    case 'call_lease':
      return { call: r.call, ...step(r.step) }
    case 'call_response': {
      const out = { call: r.call, ...step(r.step), report: r.report }
      if (r.settled !== null) out.settled = r.settled
      return out
    }
    default:
      throw new Error(`no typed method for ${op}`)
  }
}

/**
 * Replays one parsed trace; returns its output records (snake_case, like `expected`).
 * With `protocol`, every input goes through the engine's `handle` (the host protocol);
 * otherwise through the typed methods (and `handle` for inputs they do not cover).
 */
export function replay(trace, factory, { protocol = false } = {}) {
  const start = trace.start ?? 0
  const out = []
  let engine
  try {
    engine = factory.create(stringify(trace.config), trace.seed, start)
  } catch (e) {
    out.push({ at: start, op: 'new', result: errorRecord(e, { config: true }) })
    return out
  }
  const drain = (at) => {
    const events = []
    for (let e = engine.pollEvent(); e !== null; e = engine.pollEvent()) {
      events.push({ at, event: recase(e, snake) })
    }
    return events
  }
  // Each named call's state: what its last step returned (SCHEMA.md).
  const calls = new Map()
  const callState = (name) => recase(calls.get(name) ?? { failed: 0, refusals: 0, last_retry_after_ms: null }, camel)
  for (const input of trace.inputs) {
    const at = input.at
    let steps = 0
    for (let t = engine.pollTimeout(); t !== null && BigInt(t) <= BigInt(at); t = engine.pollTimeout()) {
      if (++steps > MAX_DRIVE_STEPS) throw new Error(`pollTimeout does not progress at ${t}ms`)
      engine.handleTimeout(t)
      const events = drain(t)
      if (events.length > 0) out.push({ at: t, op: 'drive' }, ...events)
    }
    let r
    if (protocol && input.op !== 'metrics' && input.op !== 'snapshot_restore') {
      // Every input through `handle`, its output as the record's result.
      r = result(() => recase(engine.handle(at, protocolInput(input, callState)), snake))
      if (input.op.startsWith('call_') && r?.call !== undefined) calls.set(input.call, r.call)
      out.push({ at, op: input.op, result: r, next_timeout: engine.pollTimeout() })
      out.push(...drain(at))
      continue
    }
    switch (input.op) {
      case 'request_lease': {
        const req = { agent: 0, pool: 0, ...recase(input.request, camel) }
        r = result(() => recase(engine.requestLease(at, req), snake))
        break
      }
      case 'settle':
        r = result(() => recase(engine.settle(at, input.lease, recase(input.usage, camel)), snake))
        break
      case 'cancel':
        r = result(() => (engine.cancel(at, input.lease), null))
        break
      case 'response':
        r = result(() => ({
          report: recase(
            engine.handleResponse(at, input.pool, input.lease ?? null, input.status, input.headers, input.unix_now_ms ?? null, input.reported ?? false),
            snake,
          ),
        }))
        break
      case 'timeout':
        engine.handleTimeout(at)
        r = null
        break
      case 'call_lease': {
        const req = { agent: 0, pool: 0, ...recase(input.request, camel) }
        r = result(() => recase(engine.callLease(at, callState(input.call), req), snake))
        if (r?.call !== undefined) calls.set(input.call, r.call)
        break
      }
      case 'call_response':
        r = result(() =>
          recase(
            engine.callResponse(at, callState(input.call), input.pool, input.lease ?? null, input.status, input.headers, input.unix_now_ms ?? null, input.reported ?? false),
            snake,
          ),
        )
        if (r?.call !== undefined) calls.set(input.call, r.call)
        break
      case 'metrics':
        r = metricsRecord(input, recase(engine.metrics(at), snake))
        break
      case 'snapshot_restore':
        engine = factory.restore(engine.snapshot())
        r = null
        break
      default:
        // An input the engine has no typed method for: the host protocol.
        r = result(() => recase(engine.handle(at, protocolInput(input, callState)), snake))
    }
    if (TYPED.has(input.op)) r = outputOf(input.op, r)
    out.push({ at, op: input.op, result: r, next_timeout: engine.pollTimeout() })
    out.push(...drain(at))
  }
  return out
}

/** Replays a trace and compares with `expected`; returns null or the first difference. */
export function verify(trace, factory, options) {
  const got = replay(trace, factory, options)
  const want = trace.expected
  if (got.length !== want.length) {
    const first = got.findIndex((g, i) => !equal(g, want[i]))
    return `expected ${want.length} records, got ${got.length}; first difference at ${first}: expected ${stringify(want[first])}, got ${stringify(got[first])}`
  }
  for (let i = 0; i < got.length; i++) {
    if (!equal(got[i], want[i])) return `record ${i} differs:\n  expected ${stringify(want[i])}\n  got      ${stringify(got[i])}`
  }
  return null
}
