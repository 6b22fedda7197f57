// The Durable Object that owns one quota (one provider API key of one fleet): the wasm
// engine driven by the shared `Tokenwarden` driver, its state persisted in Durable Object
// storage, and an alarm for the engine's next wake-up.
//
// Persistence: after every change (an API call, or a driver event such as a grant from the
// queue, an expiry or a streamed proxy call settling) the coordinator's snapshot and the
// lease table are written, as many small values (store.js: long tables in chunks of 64
// entries, only the chunks that changed rewritten, none near the 128 KiB per-value limit).
// Writes in the same turn are coalesced, and the reply to a mutating call waits for them,
// so an evicted or restarted object loses no lease, ticket or debt. The alarm reaps expired leases and advances the queue;
// running it twice does nothing the second time (`handleTimeout` at a time already handled).
import {
  LEASE_REQUEST_FIELDS,
  LeaseRejectedError,
  ManualClock,
  Tokenwarden,
  USAGE_FIELDS,
  agentIdFor,
  errorTypeFor,
  newCall,
  providerErrorBody,
  providerErrorEvent,
  proxiedCall,
  proxiedProvider,
  stepOf,
  stopStatus,
  taskIdFor,
  wasmEngines,
} from 'tokenwarden-wasm'
import { HttpError, parseFleets } from './auth.js'
import { DEFAULT_MAX_PROXY_BODY_BYTES, drain, jsonObject, limitFrom, readText } from './body.js'
import { parseExact, readState, writeChanged } from './store.js'
import { Timeline } from './timeline.js'
import { WaitLog } from './waitlog.js'

const MAX_WAIT_MS = 30_000
/** Processes remembered per quota, and for how long after they were last seen. */
const MAX_CLIENTS = 1024
const CLIENT_TTL_MS = 60_000
/** A snapshot up to this size is stored whole, as text in the head value. */
const INLINE_SNAPSHOT_BYTES = 32 * 1024
/**
 * How long a change no reply waits for (a grant from the queue, a proxied call's settle,
 * an expiry) may gather with others before one storage write. A reply that waits for its
 * write (every mutating API call) has it started at once, with whatever else changed in
 * the meantime: group commit, so a lease answers in about one write, not one write plus a
 * gathering window.
 */
const BACKGROUND_FLUSH_MS = 50
/** How long a proxied call's grant may gather with others before its write (see #proxy). */
const SEND_FLUSH_MS = 50

/**
 * The clock of a Durable Object: Unix milliseconds and the runtime's timers. A waiting call
 * (a proxied call queued for refill, or waiting out a 429, or a long poll) holds its request
 * open, which keeps the object in memory, so its timer fires when its time comes. When no
 * request is open the object may be evicted with its timers; the alarm (set after every
 * change for the engine's next wake-up) survives that and reaps and grants then.
 *
 * Injected, for tests: where the Worker's environment sets `TOKENWARDEN_TEST_CLOCK=1`, the
 * operator's `POST …/admin/clock { advanceMs }` stops this object's time at the runtime's
 * and from then on moves it only by hand (a `ManualClock`: its timers fire as it passes
 * them), so a test of a wait asserts what happens at an instant, not within a wall-time
 * bound. Time given to the engine, the waits of calls and long polls, and the instants in
 * answers all come from here; the writes' batching timers and the alarm stay the runtime's.
 */
export class ObjectClock {
  /** @type {ManualClock | null} */
  #manual = null
  now() {
    return this.#manual === null ? Date.now() : this.#manual.now()
  }
  unixNow() {
    return this.#manual === null ? Date.now() : this.#manual.unixNow()
  }
  setTimer(fn, ms) {
    return this.#manual === null ? { real: setTimeout(fn, ms) } : { manual: this.#manual.setTimer(fn, ms) }
  }
  clearTimer(h) {
    if (h?.manual !== undefined) this.#manual?.clearTimer(h.manual)
    else clearTimeout(h?.real)
  }
  /** Whether a test moves this clock by hand. */
  get manual() {
    return this.#manual !== null
  }
  /** Stops time at the runtime's (the first time) and moves it `ms` forward; returns the new now. */
  async advance(ms) {
    if (this.#manual === null) {
      const t = Date.now()
      this.#manual = new ManualClock(t, t)
    }
    await this.#manual.advance(ms)
    return this.#manual.now()
  }
}

/** A fresh epoch for a quota's state: the time in base 36 and 32 random bits. */
function newEpoch() {
  return `${Date.now().toString(36)}${crypto.getRandomValues(new Uint32Array(1))[0].toString(36)}`
}

/** Agent ids remembered per object (names are bounded: 1 to 128 characters). */
const MAX_AGENT_IDS = 4096
/** Storage keys of the remembered names: `agent-name:<id>` → name (at most MAX_AGENT_IDS). */
const NAME_PREFIX = 'agent-name:'

/** The names stored by AgentIds: id → name. */
async function namesOf(storage) {
  const stored = await storage.list({ prefix: NAME_PREFIX, limit: MAX_AGENT_IDS })
  const names = new Map()
  for (const [key, name] of stored) {
    const id = Number(key.slice(NAME_PREFIX.length))
    if (Number.isSafeInteger(id) && typeof name === 'string') names.set(id, name)
  }
  return names
}
const MASK53 = (1n << 53n) - 1n

/**
 * Agent ids, keyed by the fleet's secret: the first 53 bits of HMAC-SHA-256(name). Two
 * names share an id only by a 2^-53 chance nobody can steer without the secret, unlike an
 * unkeyed hash, where a name with another agent's id is found in a fraction of a second.
 * Who may act on a lease is also checked by the full name (see #known).
 */
class AgentIds {
  /** @type {CryptoKey | null} */
  #key = null
  /** name → id and id → name, least recently used first (at most MAX_AGENT_IDS each) */
  #ids = new Map()
  #names = new Map()
  #storage

  /**
   * `names`: id → name as stored before a restart (see namesOf), so metrics, the dashboard
   * and the logs name agents at once rather than after each one's next call; `storage`,
   * where each id → name learned or forgotten is written (one key per agent, NAME_PREFIX).
   * Only the id → name side is seeded: a name's id is made again from the secret, which may
   * have changed.
   */
  constructor(secret, names = new Map(), storage = null) {
    this.secret = secret
    this.#storage = storage
    for (const [id, name] of names) if (this.#names.size < MAX_AGENT_IDS) this.#names.set(id, name)
  }

  async id(name) {
    const known = this.#ids.get(name)
    if (known !== undefined) {
      this.#remember(name, known)
      return known
    }
    this.#key ??= await crypto.subtle.importKey('raw', new TextEncoder().encode(`tokenwarden agent ids\u0000${this.secret}`), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign'])
    const mac = new DataView(await crypto.subtle.sign('HMAC', this.#key, new TextEncoder().encode(name)))
    const id = Number(mac.getBigUint64(0) & MASK53)
    this.#remember(name, id)
    return id
  }

  /** Moves `name` to the most recently used end, forgetting the least recently used past the bound. */
  #remember(name, id) {
    this.#ids.delete(name)
    this.#ids.set(name, id)
    if (this.#names.get(id) !== name) this.#store(id, name)
    this.#names.delete(id)
    this.#names.set(id, name)
    while (this.#ids.size > MAX_AGENT_IDS) {
      const [oldName, oldId] = this.#ids.entries().next().value
      this.#ids.delete(oldName)
      if (this.#names.get(oldId) === oldName) this.#forget(oldId)
    }
    while (this.#names.size > MAX_AGENT_IDS) this.#forget(this.#names.keys().next().value)
  }

  #forget(id) {
    this.#names.delete(id)
    this.#store(id, null)
  }

  /** Writes (not awaited: the object's output gate holds replies until it commits) one name. */
  #store(id, name) {
    if (this.#storage === null) return
    const key = `${NAME_PREFIX}${id}`
    ;(name === null ? this.#storage.delete(key) : this.#storage.put(key, name)).catch(() => {})
  }

  /** Writes every remembered name again (after a reset emptied storage). */
  storeAll() {
    for (const [id, name] of this.#names) this.#store(id, name)
  }

  /** The name an id was made from, if it is still remembered (a scan: for log lines only). */
  nameOf(id) {
    return this.#names.get(id) ?? null
  }
}

/** JSON text with bigints (instants near u64::MAX only) written as numbers. */
export function toJson(value) {
  return JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? Number(v) : v))
}

export function json(status, body, headers = {}) {
  return new Response(toJson(body), { status, headers: { 'content-type': 'application/json', ...headers } })
}

// The fields a lease request and a usage may carry: the engine's own lists (generated from
// the Rust side), so the HTTP API accepts exactly what the engine does.
/** @type {Set<string>} */
const FIELDS = new Set(LEASE_REQUEST_FIELDS)

/**
 * The core's inputs a member of the fleet may send (`POST …/handle`), with the fields each
 * takes besides `op`: the core's own (SCHEMA.md), less what the object sets itself.
 * @type {Record<string, string[]>}
 */
const MEMBER_INPUTS = {
  request_lease: ['request'],
  call_lease: ['call', 'request'],
  settle: ['lease', 'usage'],
  cancel: ['lease'],
  renew: ['lease'],
  response: ['pool', 'lease', 'status', 'headers'],
  call_response: ['call', 'pool', 'lease', 'status', 'headers'],
  call_interrupted: ['lease', 'seen'],
  open_task: ['task'],
  task_failed: ['task', 'signature'],
  end_task: ['task', 'outcome'],
}

/**
 * `b`, when it holds no field but `fields`; else 400 naming the first other one.
 * @param {Record<string, any>} b
 * @param {readonly string[]} fields
 * @param {string} where what `b` is, for the message
 */
function only(b, fields, where) {
  for (const k of Object.keys(b)) if (!fields.includes(k)) throw Object.assign(new HttpError(400, 'invalid_argument', `unknown field \`${k}\` in ${where}`), { field: k })
  return b
}

/** A usage object (`usage`, or `seen` of an interrupted call) with the engine's fields only. */
function checkUsage(usage, field) {
  if (usage === null || typeof usage !== 'object' || Array.isArray(usage)) throw Object.assign(new HttpError(400, 'invalid_argument', `\`${field}\` must be a usage object`), { field })
  only(usage, USAGE_FIELDS, `\`${field}\``)
}

/**
 * A task as a client names it: an integer id, or a name (1 to 256 characters) turned into
 * one the way the npm package's `tw.task({ id })` does (`taskIdFor`).
 */
export function taskId(task, field = 'task') {
  if (Number.isSafeInteger(task) && task >= 0) return task
  // A name of digits is that id (taskIdFor), so a path segment can carry either.
  if (typeof task === 'string' && task.length > 0 && task.length <= 256) return taskIdFor(task)
  throw Object.assign(new HttpError(400, 'invalid_argument', `\`${field}\` must be a task id (a non-negative integer) or a name (1 to 256 characters)`), { field })
}

/** A count of downstream tasks (`unblocks`): an integer from 0 to 2^32 − 1. */
function unblocksOf(v, field = 'unblocks') {
  const n = typeof v === 'string' && /^\d{1,10}$/.test(v) ? Number(v) : v
  if (!Number.isInteger(n) || n < 0 || n > 0xffffffff) throw Object.assign(new HttpError(400, 'invalid_argument', `\`${field}\` must be an integer from 0 to 4294967295`), { field })
  return n
}

const ROLES = ['planner', 'reviewer', 'worker', 'auto']
function roleOf(v, field = 'role') {
  if (v === undefined || v === null) return 'worker'
  if (!ROLES.includes(v)) throw Object.assign(new HttpError(400, 'invalid_argument', `\`${field}\` must be planner, reviewer, worker or auto`), { field })
  return v
}

/** A lease request's `agent`: a number (used as it is) or a name (1 to 128 characters). */
function checkAgent(agent) {
  if (Number.isSafeInteger(agent) && agent >= 0) return agent
  if (typeof agent === 'string' && agent.length > 0 && agent.length <= 128) return agent
  throw Object.assign(new HttpError(400, 'invalid_argument', '`agent` must be a non-negative integer or a name (1 to 128 characters)'), { field: 'agent' })
}

export class QuotaObject {
  constructor(ctx, env) {
    this.ctx = ctx
    this.env = env
    /** @type {Tokenwarden | null} */
    this.tw = null
    /** lease id → { state: 'queued' | 'granted', agent, pool, eta?, expiresAt?, waitedMs? } */
    this.leases = new Map()
    /** Remote drivers' process ids → when last seen (oldest first). */
    this.clients = new Map()
    /** lease id → callbacks waiting for its grant (long polls) */
    this.waiters = new Map()
    /** The next write, while one is due: { promise, resolve, at (Unix ms), timer }. */
    this.pending = null
    /** The write in flight, or null. */
    this.writing = null
    /** The alarm time last set (Unix ms), or null. */
    this.alarmAt = undefined
    /** What storage holds: key → text as last written (see store.js). */
    this.written = new Map()
    /** The last write's figures (pieces put, bytes), for tests and the load run. */
    this.lastWrite = null
    /**
     * The epoch of the state: drawn afresh when a coordinator starts from its
     * configuration (first use, or after a reset), kept across restores, and part of every
     * lease handle, so a handle from before a reset names no lease after it. A state
     * stored before epochs existed is of epoch `0`.
     */
    this.epoch = null
    /** @type {AgentIds | null} */
    this.agentIds = null
    /** Recent call events and the ceilings hit, in memory only (timeline.js). */
    this.timeline = new Timeline()
    /** The object's time and timers (see ObjectClock). */
    this.clock = new ObjectClock()
    /** Agent names stored before a restart, until AgentIds takes them (id → name). */
    this.storedNames = new Map()
    this.ctx.blockConcurrencyWhile(async () => {
      this.storedNames = await namesOf(this.ctx.storage)
      const saved = await readState(this.ctx.storage)
      if (saved === null) return
      this.written = saved.written
      const { snapshot, leases } = saved.value
      this.epoch = typeof saved.value.epoch === 'string' ? saved.value.epoch : '0'
      const tw = this.#start(wasmEngines.restore(typeof snapshot === 'string' ? snapshot : JSON.stringify(snapshot)), leases)
      // Proxied calls in flight when the object stopped died with it: nobody will settle
      // their leases or take their tickets. End them now (a granted one charged as the core
      // charges a call cut short, a ticket withdrawn) rather than let them hold capacity
      // until their TTL.
      // The core decides what each is charged: `restarted` ends every lease and ticket not
      // in the object's own records.
      const ended = tw.engine.handle(tw.clock.now(), { op: 'restarted', keep: leases.map(([id]) => id) })
      tw.tick()
      if (ended.output !== 'ended') throw new Error(`restarted answered ${ended.output}, not ended`)
      if (ended.interrupted.length + ended.withdrawn.length > 0) await this.#persistSoon()
    })
  }

  /**
   * The driver, creating the coordinator from the fleet's configuration on first use.
   * @returns {Tokenwarden}
   */
  #driver(fleet, quota) {
    if (this.tw !== null) return this.tw
    const fleets = parseFleets(this.env.TOKENWARDEN_FLEETS)
    const q = fleets[fleet]?.quotas?.[quota]
    if (q === undefined) throw new HttpError(404, 'not_found', 'no such quota')
    const seed = crypto.getRandomValues(new Uint32Array(1))[0]
    const tw = this.#start(wasmEngines.create(q.config, seed, this.clock.now()), [])
    this.epoch = newEpoch()
    return tw
  }

  /**
   * The driver on `engine`, with the lease records `leases` (`[id, record]` pairs).
   * @returns {Tokenwarden}
   */
  #start(engine, leases) {
    const tw = new Tokenwarden({ engine, clock: this.clock })
    this.tw = tw
    this.timeline.listen(tw)
    this.leases = new Map(leases)
    tw.on('granted', (e) => {
      const rec = this.leases.get(e.lease)
      if (rec !== undefined) {
        this.leases.set(e.lease, { ...rec, state: 'granted', expiresAt: e.expiresAt, waitedMs: e.waitedMs })
        for (const wake of this.waiters.get(e.lease) ?? []) wake()
        this.waiters.delete(e.lease)
      }
      this.#persistSoon(BACKGROUND_FLUSH_MS)
    })
    // A ticket's promise moved later. A poll waiting on it answers now with the new one when
    // the old one would pass before the poll ends; otherwise its next answer carries it (a
    // joining fleet revises many promises: no storm of answers).
    tw.on('revised', (e) => {
      const rec = this.leases.get(e.lease)
      if (rec !== undefined && rec.state === 'queued') {
        const passing = Number(rec.eta) <= this.clock.now() + MAX_WAIT_MS
        this.leases.set(e.lease, { ...rec, eta: e.eta })
        if (passing) {
          for (const wake of this.waiters.get(e.lease) ?? []) wake()
          this.waiters.delete(e.lease)
        }
      }
      this.#persistSoon(BACKGROUND_FLUSH_MS)
    })
    tw.on('expired', (e) => {
      this.leases.delete(e.lease)
      this.#persistSoon(BACKGROUND_FLUSH_MS)
    })
    for (const name of /** @type {const} */ (['paused', 'margin_changed', 'estimate_alert', 'settled'])) tw.on(name, () => this.#persistSoon(BACKGROUND_FLUSH_MS))
    // `tokenwarden serve` prints waits where its operator looks (its terminal).
    if (this.env?.TOKENWARDEN_WAIT_LOG === '1') new WaitLog(tw, (id) => this.agentIds?.nameOf(id) ?? `agent ${id}`)
    return tw
  }

  /**
   * Coalesced writes: every change made before the write starts shares it (and the alarm
   * moves only when the next wake-up changes). `delay` is how long this change may wait for
   * others: 0 for a mutating call, which awaits the write before it replies, so nothing
   * acknowledged is lost if the object is evicted (concurrent calls interleave while they
   * wait and share the write); BACKGROUND_FLUSH_MS for changes no reply waits for.
   */
  #persistSoon(delay = 0) {
    if (this.tw === null) return this.pending?.promise ?? Promise.resolve()
    const at = Date.now() + delay
    if (this.pending === null) {
      let resolve
      const promise = new Promise((r) => {
        resolve = r
      })
      this.pending = { promise, resolve, at: Infinity, timer: /** @type {ReturnType<typeof setTimeout> | undefined} */ (undefined) }
    }
    const p = this.pending
    if (at < p.at) {
      p.at = at
      clearTimeout(p.timer)
      p.timer = setTimeout(() => this.#startFlush(p), delay)
    }
    return p.promise
  }

  /**
   * One write at a time: a write that falls due while another is in flight starts when that
   * one ends, with everything changed by then, so under load the writes follow each other
   * back to back and each carries many changes.
   */
  #startFlush(p) {
    if (this.writing !== null) {
      const later = () => this.#startFlush(p)
      this.writing.then(later, later)
      return
    }
    const done = Promise.resolve(this.#flush(p))
    this.writing = done
    const clear = () => {
      if (this.writing === done) this.writing = null
    }
    done.then(clear, clear)
    p.resolve(done)
  }

  /** Writes what changed since the last write (the due write `p`). */
  #flush(p) {
    if (this.pending === p) this.pending = null
    // Reset in the meantime: nothing to write (the next change persists the new state).
    if (this.tw === null) return undefined
    // A small snapshot is stored as its text in the head; a large one is taken apart so
    // that its tables are chunked (parsing costs about 15 % of the throughput of small ones).
    const text = this.tw.engine.snapshot()
    const state = { snapshot: text.length <= INLINE_SNAPSHOT_BYTES ? text : parseExact(text), leases: [...this.leases], epoch: this.epoch }
    const w = writeChanged(this.ctx.storage, this.written, state)
    this.lastWrite = { put: w.put, deleted: w.deleted, bytes: w.bytes, pieces: this.written.size }
    const writes = [w.done]
    const wake = this.tw.nextWake()
    // Where a test moves time by hand, the engine's wake-ups are the test's to bring.
    const at = wake === null || this.clock.manual ? null : Math.max(wake, Date.now() + 1)
    if (at !== this.alarmAt) {
      this.alarmAt = at
      writes.push(at === null ? this.ctx.storage.deleteAlarm() : this.ctx.storage.setAlarm(at))
    }
    return Promise.all(writes)
  }

  async alarm() {
    this.alarmAt = undefined
    if (this.tw === null) return
    this.tw.tick()
    await this.#persistSoon()
  }

  async fetch(request) {
    const url = new URL(request.url)
    const fleet = request.headers.get('x-tw-fleet')
    const quota = request.headers.get('x-tw-quota')
    this.#seen(request.headers.get('x-tw-client'))
    try {
      const tw = this.#driver(fleet, quota)
      if (this.agentIds === null) {
        this.agentIds = new AgentIds(parseFleets(this.env.TOKENWARDEN_FLEETS)[fleet]?.secret ?? '', this.storedNames, this.ctx.storage)
        this.storedNames = new Map()
      }
      // Set by the Worker for an agent credential: the one agent this caller may act for.
      // Per request, never on `this`: calls interleave while they await.
      const name = request.headers.get('x-tw-agent')
      const who = name === null ? null : { id: await this.agentIds.id(name), name }
      const [, op, id] = url.pathname.split('/')
      const lease = id === undefined ? null : Number(id)
      // A handle names a lease of one epoch: one from before a reset names nothing now.
      const epoch = request.headers.get('x-tw-epoch')
      if (epoch !== null && epoch !== this.epoch) throw new HttpError(404, 'unknown_lease', 'no such lease: this handle is from before the quota was reset')
      const scope = { tw, who, fleet, quota }
      let response
      switch (`${request.method} ${op}`) {
        case 'POST handle':
          response = json(200, { ...(await this.#apply(scope, await body(request))), epoch: this.epoch, clients: this.#clientCount() })
          break
        case 'POST lease':
          response = await this.#lease(scope, await body(request))
          break
        case 'GET wait':
          response = await this.#wait(lease, Number(url.searchParams.get('timeout') ?? 0), who)
          break
        case 'POST settle': {
          const out = await this.#apply(scope, { op: 'settle', lease, usage: await body(request) })
          response = json(200, /** @type {{ settlement: unknown }} */ (out).settlement)
          break
        }
        case 'POST cancel':
          await this.#apply(scope, { op: 'cancel', lease })
          response = json(200, { cancelled: true })
          break
        case 'POST interrupted': {
          this.#known(lease, who)
          const b = only(await body(request), ['seen'], 'the body')
          const out = await this.#apply(scope, { op: 'call_interrupted', lease, seen: b.seen ?? null })
          response = json(200, /** @type {{ settlement: unknown }} */ (out).settlement)
          break
        }
        case 'POST renew': {
          this.#known(lease, who)
          only(await body(request), [], 'the body: renew takes none')
          const out = await this.#apply(scope, { op: 'renew', lease })
          response = json(200, { expiresAt: /** @type {{ expiresAt: number }} */ (out).expiresAt })
          break
        }
        case 'POST response': {
          // A member's report, through the call lifecycle (a fresh call when it sends none).
          const b = only(await body(request), ['pool', 'lease', 'status', 'headers', 'call'], 'the report')
          const out = await this.#apply(scope, { ...b, op: 'call_response' })
          const r = /** @type {{ call: unknown, settled?: unknown, report: unknown }} */ (/** @type {unknown} */ (out))
          response = json(200, { call: r.call, step: stepOf(out), settled: r.settled ?? null, report: r.report })
          break
        }
        case 'POST task': {
          // (#apply checks the task's fields.)
          const b = await body(request)
          await this.#apply(scope, { op: 'open_task', task: b })
          response = json(200, { task: taskId(b.task), open: true })
          break
        }
        case 'POST task-failed': {
          const b = await body(request)
          for (const k of Object.keys(b))
            if (k !== 'signature') throw new HttpError(400, 'invalid_argument', `unknown field \`${k}\` in the body: send \`signature\`, a hash of the failing test and the diff (failureSignature)`)
          const out = await this.#apply(scope, { op: 'task_failed', task: Number(id), signature: b.signature })
          response = json(200, { task: Number(id), repeats: /** @type {{ inARow: number }} */ (out).inARow })
          break
        }
        case 'POST task-done': {
          const b = only(await body(request), ['outcome', 'merged'], 'the body')
          if (b.merged !== undefined && typeof b.merged !== 'boolean') throw Object.assign(new HttpError(400, 'invalid_argument', '`merged` must be true or false'), { field: 'merged' })
          const out = await this.#apply(scope, { op: 'end_task', task: Number(id), outcome: b.outcome ?? (b.merged === false ? 'abandoned' : 'merged') })
          response = json(200, /** @type {{ summary: unknown }} */ (out).summary)
          break
        }
        case 'GET metrics':
          return json(200, this.#named(tw.metrics()))
        case 'GET timeline': {
          const pools = (tw.metrics().pools ?? []).map((p) => String(p.name))
          return json(
            200,
            this.timeline.view(this.clock.now(), (agent) => this.agentIds?.nameOf(agent) ?? null, pools),
          )
        }
        case 'POST reset':
          response = await this.#reset()
          break
        case 'POST clock':
          response = await this.#advanceClock(await body(request))
          break
        case 'POST hold':
          response = this.#hold(tw, await body(request))
          break
        case 'POST proxy':
        case 'GET proxy':
        case 'PUT proxy':
        case 'DELETE proxy':
        case 'PATCH proxy':
          try {
            return await this.#proxy(tw, request, url, who)
          } catch (e) {
            await drain(request)
            return errorResponse(e, proxiedProvider(url.pathname.slice('/proxy'.length), request.headers.has('anthropic-version')))
          }
        default:
          throw new HttpError(404, 'not_found', 'no such route')
      }
      await this.#persistSoon()
      return response
    } catch (e) {
      // Refused before the body was read (a proxied call's checks): read it, so the
      // client's kept-alive connection stays usable.
      await drain(request)
      return errorResponse(e)
    }
  }

  /**
   * Remembers a remote driver's process (bounded: at most MAX_CLIENTS, each forgotten a
   * minute after it was last seen), so lease answers can say how many processes share the
   * quota: their fallback while the limiter is unreachable is that share of it.
   */
  #seen(client) {
    const now = this.clock.now()
    if (client !== null) {
      this.clients.delete(client)
      this.clients.set(client, now)
      if (this.clients.size > MAX_CLIENTS) this.clients.delete(this.clients.keys().next().value)
    }
    for (const [c, at] of this.clients) {
      if (now - at <= CLIENT_TTL_MS) break
      this.clients.delete(c)
    }
  }

  /**
   * The metrics with each agent's name beside its id (`name`: the name the id was made from,
   * or null for a numeric agent or one not seen since the object started).
   */
  #named(metrics) {
    // A subagent's family by its root's name too (`familyName`).
    const nameOf = (id) => this.agentIds?.nameOf(Number(id)) ?? null
    if (Array.isArray(metrics?.agents))
      metrics.agents = metrics.agents.map((a) => ({ ...a, name: nameOf(a.agent), ...(a.family === undefined || a.family === null ? {} : { familyName: nameOf(a.family) }) }))
    // The ceilings hit since the object started: 429s by the provider's limit type,
    // refusals by reason (timeline.js).
    if (metrics !== null && typeof metrics === 'object') metrics.ceilings = this.timeline.ceilings((metrics.pools ?? []).map((p) => String(p.name)))
    return metrics
  }

  /** The agent-id table, made by `fetch` before any route runs. */
  #agentIds() {
    if (this.agentIds === null) throw new Error('the agent-id table is used before the first request made it')
    return this.agentIds
  }

  /** A live lease's record; 404 if there is none, 403 if `who` (an agent credential) is not its agent. */
  /**
   * @param {number | null} lease (null: the route named none, a 404)
   * @param {{ id: number, name: string | null } | null} who
   */
  #known(lease, who = null) {
    if (!Number.isSafeInteger(lease) || !this.leases.has(lease)) throw new HttpError(404, 'unknown_lease', 'no such lease: never issued, or already settled, cancelled or expired')
    const rec = this.leases.get(lease)
    // By the full name where the record has it (every lease taken for a named agent), not
    // only by the id.
    if (who !== null && (rec.agent !== who.id || (typeof rec.name === 'string' && rec.name !== who.name))) {
      throw new HttpError(403, 'forbidden', `this lease is another agent's: the credential of ${who.name} ends only its own leases`)
    }
    return rec
  }

  /**
   * The agent a request acts for, `{ id, name }` (`name` null for a numeric agent): an agent
   * credential's own, which the body may only repeat by name.
   */
  async #agentFor(given, who) {
    if (who === null) {
      const agent = checkAgent(given)
      return typeof agent === 'number' ? { id: agent, name: null } : { id: await this.#agentIds().id(agent), name: agent }
    }
    // A remote driver sends the number its fetch wrapper derives from the name
    // (`agentIdFor`): that number stands for the credential's own agent, nothing more.
    const same = given === undefined || given === null || given === who.name || given === who.id || (typeof given === 'number' && given === agentIdFor(who.name))
    if (!same) throw new HttpError(403, 'forbidden', `this credential is ${who.name}'s: it leases only for that agent`)
    return who
  }

  /**
   * `POST /leases`: a lease request, through the core's call lifecycle. A client that keeps
   * `call` (the state each answer returns) and sends it back with its next ask for the
   * same model call gets the core's whole policy (give-up after `call.max_refusals`,
   * `checkpoint`); one that does not is treated as a fresh call every time. The answer is
   * the core's output in this route's own shape (API.md): `grant`, `queued` or `reject`.
   */
  async #lease(scope, b) {
    const { call, ...request } = b
    const out = await this.#apply(scope, call === undefined ? { op: 'call_lease', request } : { op: 'call_lease', call, request })
    const step = stepOf(out)
    // Lease ids travel only as signed handles (`lease`), never raw in `step`.
    const { lease: _l, ticket: _t, ...shown } = /** @type {any} */ (step)
    const base = { call: /** @type {any} */ (out).call, step: shown, clients: this.#clientCount() }
    if (out.output === 'send') return json(200, { kind: 'grant', lease: out.lease, epoch: this.epoch, expiresAt: out.expiresAt, ...base })
    if (out.output === 'wait' && out.wait.ticket !== null) return json(202, { kind: 'queued', lease: out.wait.ticket, epoch: this.epoch, eta: out.wait.until, ...base })
    const retryAt = out.output === 'wait' ? out.wait.until : null
    const refusal = out.output === 'give_up' ? out.giveUp.refusal : out.output === 'wait' ? out.wait.refusal : null
    // An ask is refused or given up only for a reason (a give-up for failed sends follows a response).
    if (refusal === null) throw new Error(`internal: call_lease answered ${out.output} without a refusal`)
    const refused = new LeaseRejectedError(refusal, retryAt, this.clock.now(), out.output === 'give_up' ? out.giveUp.reason : null)
    return json(200, { kind: 'reject', retryable: refused.retryable, retryAt, retryAfterMs: refused.retryAfterMs, reason: refused.reason, message: refused.message, ...base })
  }

  /** Remote drivers seen in the last minute (at least 1: the caller). */
  #clientCount() {
    return Math.max(1, this.clients.size)
  }

  /**
   * One input of the core's host protocol from a member of the fleet (`POST …/handle`
   * sends it as it is; every other mutating route decodes its own shape into one): checked
   * against what the caller may do, applied through the driver, and the object's records
   * (the lease table, the long polls) brought up to date from the answer.
   * Leases are the object's ids here (the Worker opens and signs the handles); an agent
   * may be a name and a pool a name. The operator's inputs (`hold`, `restarted`,
   * `timeout`) are not a member's; `unixNowMs` and `reported` are the object's to set.
   * @param {{ tw: Tokenwarden, who: { id: number, name: string | null } | null, fleet: string | null, quota: string | null }} scope
   * @param {Record<string, any>} input
   * @returns {Promise<import('tokenwarden-wasm').Output>}
   */
  async #apply({ tw, who }, input) {
    const op = input.op
    const fields = typeof op === 'string' && Object.hasOwn(MEMBER_INPUTS, op) ? MEMBER_INPUTS[op] : null
    if (fields === null) {
      throw Object.assign(new HttpError(400, 'invalid_argument', `\`op\` must be one of ${Object.keys(MEMBER_INPUTS).join(', ')} (the core's inputs a member of the fleet sends; see API.md)`), {
        field: 'op',
      })
    }
    // The fields are checked after who may act: another agent's lease or task is 403 or 404
    // whatever the body holds.
    const checkFields = () => only(input, ['op', ...fields], `the ${op} input`)
    switch (op) {
      case 'request_lease':
      case 'call_lease': {
        checkFields()
        const given = input.request
        if (given === null || typeof given !== 'object' || Array.isArray(given))
          throw Object.assign(new HttpError(400, 'invalid_argument', '`request` must be a lease request object'), { field: 'request' })
        for (const k of Object.keys(given)) if (!FIELDS.has(k)) throw Object.assign(new HttpError(400, 'invalid_argument', `unknown field \`${k}\` in the lease request`), { field: k })
        const pool = typeof given.pool === 'string' ? tw.pool(given.pool) : (given.pool ?? 0)
        const agent = await this.#agentFor(given.agent, who)
        const request = { ...given, agent: agent.id, pool }
        // A family is named as an agent is. A credential's member may name only its own
        // agent (403 otherwise: naming another's family would divide that family's share),
        // which is a root: nothing to pass on.
        if (given.family === undefined || given.family === null) delete request.family
        else {
          const family = await this.#agentFor(given.family, who)
          if (who === null) request.family = family.id
          else delete request.family
        }
        if (given.task === undefined || given.task === null) delete request.task
        else request.task = taskId(given.task)
        const out = tw.handle(op === 'call_lease' ? { op, call: input.call === undefined ? newCall() : callState(input.call), request } : { op, request })
        const named = agent.name === null ? {} : { name: agent.name }
        if (out.output === 'send' || out.output === 'granted') {
          this.leases.set(out.lease, { state: 'granted', agent: agent.id, ...named, pool, expiresAt: out.expiresAt, waitedMs: 0 })
        } else if (out.output === 'queued' || (out.output === 'wait' && out.wait.ticket !== null)) {
          // The grant arrives as a `granted` event (handled in #start).
          const [ticket, eta] = out.output === 'queued' ? [out.lease, out.eta] : [/** @type {number} */ (out.wait.ticket), out.wait.until]
          this.leases.set(ticket, { state: 'queued', agent: agent.id, ...named, pool, eta })
        }
        return out
      }
      case 'settle':
      case 'call_interrupted': {
        this.#known(input.lease, who)
        checkFields()
        const usage = op === 'settle' ? input.usage : (input.seen ?? null)
        if (usage !== null || op === 'settle') checkUsage(usage, op === 'settle' ? 'usage' : 'seen')
        const out = tw.handle(op === 'settle' ? { op, lease: input.lease, usage } : { op, lease: input.lease, seen: usage })
        this.leases.delete(input.lease)
        return out
      }
      case 'cancel': {
        this.#known(input.lease, who)
        checkFields()
        const out = tw.handle({ op, lease: input.lease })
        this.leases.delete(input.lease)
        // A long poll on the ticket ends now (its lease is gone: 404), not at its timeout.
        for (const wake of this.waiters.get(input.lease) ?? []) wake()
        this.waiters.delete(input.lease)
        return out
      }
      case 'renew': {
        const rec = this.#known(input.lease, who)
        checkFields()
        const out = tw.handle({ op, lease: input.lease })
        if (out.output === 'renewed') this.leases.set(input.lease, { ...rec, expiresAt: out.expiresAt })
        return out
      }
      case 'response':
      case 'call_response': {
        checkFields()
        checkHeaderPairs(input.headers)
        if (!Number.isInteger(input.status) || input.status < 100 || input.status > 599)
          throw Object.assign(new HttpError(400, 'invalid_argument', '`status` must be an HTTP status (100 to 599)'), { field: 'status' })
        // Evidence about one call: the granted lease it was sent under, held by the reporter
        // (the Worker has checked the handle), in the lease's own pool.
        const lease = input.lease
        if (lease === null || lease === undefined)
          throw Object.assign(new HttpError(400, 'invalid_argument', '`lease` must be the handle of the granted lease whose call this response answers: a report is evidence about one call'), {
            field: 'lease',
          })
        const rec = this.#known(lease, who)
        if (rec.state !== 'granted')
          throw Object.assign(new HttpError(409, 'not_granted', 'this lease is a queued ticket: nothing was sent under it, so no response can answer it'), { field: 'lease' })
        const pool = input.pool === undefined || input.pool === null ? rec.pool : typeof input.pool === 'string' ? tw.pool(input.pool) : input.pool
        if (pool !== rec.pool) throw Object.assign(new HttpError(400, 'invalid_argument', '`pool` must be the pool of the lease the response answers'), { field: 'pool' })
        // A member's report of its own call: the core bounds the pause one report may cause
        // (`feedback.max_reported_pause_ms`, a minute by default).
        const reported = { pool, lease, status: input.status, headers: input.headers, reported: true }
        const out = tw.handle(op === 'call_response' ? { op, call: input.call === undefined ? newCall() : callState(input.call), ...reported } : { op, ...reported })
        // call_response: anything but a success the core settled as nothing used, and the
        // lease ended. A plain `response` only reports: the lease stays its holder's to settle.
        if ('settled' in out && out.settled !== undefined) this.leases.delete(lease)
        return out
      }
      case 'open_task': {
        checkFields()
        const b = input.task
        if (b === null || typeof b !== 'object' || Array.isArray(b))
          throw Object.assign(new HttpError(400, 'invalid_argument', '`task` must be a task object: { task, role?, unblocks? }'), { field: 'task' })
        only(b, ['task', 'role', 'unblocks'], 'the task')
        const spec = { task: taskId(b.task), role: roleOf(b.role), unblocks: b.unblocks === undefined ? 0 : unblocksOf(b.unblocks) }
        // An agent credential is a member: the core opens a new task for it only while
        // fewer than three quarters of `max_tasks` are open (the rest is the operator's),
        // and keeps whose task it is: a member acts only on its own agent's (403).
        return tw.handle({ op, task: spec, ...memberOf(who) })
      }
      case 'task_failed': {
        const task = taskId(input.task)
        checkFields()
        // A hash the client computed (failureSignature); never the test or diff itself.
        if (!Number.isSafeInteger(input.signature) || input.signature < 0)
          throw Object.assign(new HttpError(400, 'invalid_argument', '`signature` must be a non-negative integer (failureSignature(test, diff))'), { field: 'signature' })
        return tw.handle({ op, task, signature: input.signature, ...memberOf(who) })
      }
      case 'end_task': {
        const task = taskId(input.task)
        checkFields()
        if (!['merged', 'abandoned', 'failed'].includes(input.outcome))
          throw Object.assign(new HttpError(400, 'invalid_argument', '`outcome` must be merged, abandoned or failed'), { field: 'outcome' })
        return tw.handle({ op, task, outcome: input.outcome, ...memberOf(who) })
      }
    }
    throw new Error(`internal: no case for the input ${op}`)
  }

  /**
   * The operator's reset: the quota starts afresh from its configuration — every lease and
   * ticket ends (long polls answer 404), debt, pauses and learned limits are gone — and the
   * stored state is replaced.
   */
  async #reset() {
    const ended = this.leases.size
    this.tw?.close()
    this.tw = null
    this.leases = new Map()
    this.timeline.clear()
    for (const wakes of this.waiters.values()) for (const wake of wakes) wake()
    this.waiters.clear()
    await this.ctx.storage.deleteAlarm()
    await this.ctx.storage.deleteAll()
    // Names are identity, not quota state: the ones remembered are written again.
    this.agentIds?.storeAll()
    this.written = new Map()
    this.alarmAt = undefined
    return json(200, { reset: true, ended })
  }

  /**
   * The operator's hold (`POST …/admin/hold { pool?, forMs }`), the core's `hold` input: the
   * pool grants nothing for `forMs` (a key being rotated, a provider incident, a spend
   * alarm), bounded by `feedback.max_pause_ms`, never shortening a pause in force. Leases
   * already granted run on; queued calls keep their places and are granted after it.
   */
  #hold(tw, b) {
    only(b, ['pool', 'forMs'], 'the hold')
    const ms = b.forMs
    if (!Number.isInteger(ms) || ms < 0 || ms > 86_400_000)
      throw Object.assign(new HttpError(400, 'invalid_argument', '`forMs` must be an integer number of milliseconds from 0 to 86400000'), { field: 'forMs' })
    const pool = b.pool === undefined ? 0 : typeof b.pool === 'string' ? (tw.engine.poolId(b.pool) ?? -1) : b.pool
    if (!Number.isInteger(pool) || pool < 0 || pool >= tw.engine.pools.length) {
      throw Object.assign(new HttpError(400, 'unknown_pool', `\`pool\` must be a pool's name or index; the quota has ${tw.engine.pools.join(', ')}`), { field: 'pool' })
    }
    const out = tw.handle({ op: 'hold', pool, until: this.clock.now() + ms })
    if (out.output !== 'held') throw new Error(`internal: hold answered ${out.output}`)
    return json(200, { held: true, pool: tw.engine.pools[pool], until: out.until })
  }

  /** Tests only (`TOKENWARDEN_TEST_CLOCK=1`): moves the object's clock by hand (see ObjectClock). */
  async #advanceClock(b) {
    if (this.env?.TOKENWARDEN_TEST_CLOCK !== '1') throw new HttpError(404, 'not_found', 'no such route')
    only(b, ['advanceMs'], 'the body')
    const ms = b.advanceMs
    if (!Number.isInteger(ms) || ms < 0 || ms > 86_400_000)
      throw Object.assign(new HttpError(400, 'invalid_argument', '`advanceMs` must be an integer number of milliseconds from 0 to 86400000'), { field: 'advanceMs' })
    return json(200, { now: await this.clock.advance(ms) })
  }

  async #wait(lease, timeout, who) {
    const rec = this.#known(lease, who)
    if (rec.state === 'queued' && timeout > 0) {
      await new Promise((resolve) => {
        const list = this.waiters.get(lease) ?? []
        list.push(resolve)
        this.waiters.set(lease, list)
        this.clock.setTimer(resolve, Math.min(timeout, MAX_WAIT_MS))
      })
    }
    const now = this.leases.get(lease)
    if (now === undefined) throw new HttpError(404, 'unknown_lease', 'the ticket ended while waiting')
    return now.state === 'granted'
      ? json(200, { kind: 'grant', lease, epoch: this.epoch, expiresAt: now.expiresAt ?? null, waitedMs: now.waitedMs ?? 0 })
      : json(202, { kind: 'queued', lease, epoch: this.epoch, eta: now.eta })
  }

  /**
   * Proxy mode: lease, forward to the quota's upstream, stream the answer back, settle
   * from its usage — the shared `fetch` wrapper does all of it. The agent's API key
   * headers pass through untouched and are never stored or logged.
   */
  async #proxy(tw, request, url, who) {
    const fleets = parseFleets(this.env.TOKENWARDEN_FLEETS)
    const fleet = fleets[request.headers.get('x-tw-fleet')]
    const q = fleet?.quotas?.[request.headers.get('x-tw-quota')]
    if (q?.upstream === undefined) throw new HttpError(404, 'not_found', 'this quota has no upstream configured for proxy mode')
    // What is sent and what names the call, or why not: the gateway crate's rule (the path's
    // /agent, /role, /task, /unblocks or their headers; the headers and query parameters
    // forwarded, none holding a secret). Model calls are leased; any other route of the
    // provider's API (token counting, model lists) passes through unleased, with the
    // agent's own key.
    const read = proxiedCall(url.pathname.slice('/proxy'.length), url.search, request.headers, [fleet.secret, fleet.admin_secret], who?.name ?? null)
    if ('refused' in read) throw Object.assign(new HttpError(read.refused.status, read.refused.error, read.refused.message), read.refused.field === undefined ? {} : { field: read.refused.field })
    // No role named: `auto`, the core's (a planner for its subagents at work, which unblocks
    // them, else a worker), as every host leaves it.
    const { provider, path, role, task, unblocks, failureSignature: signature, agent: base } = read.call
    const headers = new Headers(read.call.headers)
    // The client's session headers: who the call is when nothing above names it, and under
    // a name, which of that agent's subagents (a child of it: `alice/<subagent id>`).
    const session = tw.engine.callerIdentity([...request.headers], base)
    const agentName = session?.name ?? base ?? 'proxy'
    const agent = who !== null && agentName === who.name ? who.id : await this.#agentIds().id(agentName)
    // The family's root: by default the family shares one place in the fair order.
    const family = session?.root == null ? null : who !== null && session.root === who.name ? who.id : await this.#agentIds().id(session.root)
    const upstream = new URL(q.upstream)
    upstream.pathname = upstream.pathname.replace(/\/$/, '') + path
    upstream.search = read.call.query
    let sent = false
    const gone = new AbortController()
    const f = tw.fetch({
      agent,
      ...(family === null ? {} : { family }),
      role,
      ...(task === null ? {} : { task: taskId(task, 'x-tokenwarden-task') }),
      ...(unblocks === null ? {} : { unblocks }),
      ...(signature === null ? {} : { failureSignature: signature }),
      ...(q.timeouts === undefined ? {} : { timeouts: q.timeouts }),
      // Sent under a lease just granted: written within SEND_FLUSH_MS (not awaited: the
      // call does not wait for the disk), so a restart soon after still knows what the call
      // holds and charges it. A redirect is handed back, never followed (it would carry the
      // agent's key to wherever it points); a failure to reach the provider is marked as
      // such, for a 502 in the provider's format.
      fetch: async (input, init) => {
        sent = true
        this.#persistSoon(SEND_FLUSH_MS).catch(() => {})
        try {
          return await fetch(input, { ...init, redirect: 'manual' })
        } catch (e) {
          if (init?.signal?.aborted) throw e
          throw Object.assign(new Error(`the provider could not be reached: ${e?.message ?? e}`), { upstream: true, cause: e })
        }
      },
    })
    const text = await readText(request, limitFrom(this.env, 'TOKENWARDEN_MAX_PROXY_BODY_BYTES', DEFAULT_MAX_PROXY_BODY_BYTES))
    // The request's signal aborts when the client goes away (Cloudflare, with the
    // `enable_request_signal` flag; workerd when the connection breaks): the wrapper then
    // withdraws a queued ticket, ends a wait and forwards nothing. `gone` is the same for a
    // streamed call whose client stopped reading the keep-alive (below).
    const signal = AbortSignal.any([request.signal, gone.signal])
    const method = request.method
    const answer = f(upstream.href, { method, headers, ...(method === 'GET' || method === 'HEAD' ? {} : { body: text }), signal }).then((res) => noRedirect(res, provider))
    if (!wantsStream(text)) return answer.catch((e) => upstreamFailure(e, provider))
    // A streamed call that has no answer within KEEPALIVE_AFTER_MS (waiting in line, or for a
    // 429 to clear) gets its response head now and SSE comments until the provider's stream
    // follows: the client sees a live connection, and a client that went away is noticed
    // when a write to it fails — the call is then withdrawn, not forwarded for nobody.
    const settled = answer.then(
      (res) => ({ res }),
      (err) => ({ err }),
    )
    let first = await Promise.race([settled, new Promise((r) => setTimeout(() => r(null), KEEPALIVE_AFTER_MS))])
    // Already with the provider: its own status and headers are what the client gets.
    if (first === null && sent) first = await settled
    if (first !== null) return first.err === undefined ? first.res : upstreamFailure(first.err, provider)
    return keptAlive(answer, provider, gone, () => sent)
  }
}

/** How long a streamed proxied call may go without an answer before its head is sent. */
const KEEPALIVE_AFTER_MS = 1_000
/** Between two keep-alive comments on a waiting stream. */
const KEEPALIVE_EVERY_MS = 2_000

/** Whether a provider request body asks for a stream (`"stream": true`). */
function wantsStream(text) {
  try {
    return JSON.parse(text)?.stream === true
  } catch {
    return false
  }
}

/**
 * A streamed proxied call answered before its outcome is known: `200 text/event-stream`
 * at once, then an SSE comment every KEEPALIVE_EVERY_MS while it waits, then the provider's
 * stream — or, if the call ends otherwise (the provider answers an error, the core gives up,
 * the provider cannot be reached), one SSE `error` event in the provider's format, which the
 * official SDKs raise as an API error with tokenwarden's reason. A cancelled body (the
 * client is gone: a write failed) aborts `gone`, which withdraws the call.
 */
function keptAlive(answer, provider, gone, sent) {
  const enc = new TextEncoder()
  let timer
  /** @type {ReadableStreamDefaultReader<Uint8Array> | null} */
  let upstreamBody = null
  const body = new ReadableStream({
    start(controller) {
      const ping = () => {
        try {
          controller.enqueue(enc.encode(`: tokenwarden: ${sent() ? 'sent, waiting for the provider' : 'waiting for quota'}\n\n`))
        } catch {
          clearInterval(timer)
        }
      }
      ping()
      timer = setInterval(ping, KEEPALIVE_EVERY_MS)
      const fail = (status, type, message) => {
        controller.enqueue(enc.encode(sseError(provider, status, type, message)))
        controller.close()
      }
      answer.then(
        async (res) => {
          clearInterval(timer)
          if (gone.signal.aborted) {
            // Gone just as the answer came: let the wrapper end the call (cut short).
            res.body?.cancel().catch(() => {})
            return
          }
          if (res.ok && (res.headers.get('content-type') ?? '').includes('text/event-stream') && res.body !== null) {
            const reader = res.body.getReader()
            upstreamBody = reader
            try {
              for (;;) {
                const { done, value } = await reader.read()
                if (done) break
                controller.enqueue(value)
              }
              controller.close()
            } catch (e) {
              if (!gone.signal.aborted) controller.error(e)
            }
            return
          }
          // An answer that is not a stream (an error, or JSON though a stream was asked):
          // its error in the provider's event format.
          const raw = await res.text().catch(() => '')
          const parsed = errorOf(raw)
          fail(res.status, parsed?.type ?? errorTypeFor(res.status), parsed?.message ?? `the provider answered ${res.status}${raw === '' ? '' : `: ${raw.slice(0, 512)}`}`)
        },
        (err) => {
          clearInterval(timer)
          if (gone.signal.aborted) return
          const e = failureOf(err)
          fail(e.status, e.type, e.message)
        },
      )
    },
    cancel() {
      clearInterval(timer)
      gone.abort(new Error('the client went away'))
      upstreamBody?.cancel().catch(() => {})
    },
  })
  return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-tokenwarden-kept-alive': '1' } })
}

/** The provider's error `{ type, message }` in an error body (either provider's format), or null. */
function errorOf(raw) {
  try {
    const j = JSON.parse(raw)
    const e = j?.error
    if (e !== null && typeof e === 'object' && typeof e.message === 'string') return { type: typeof e.type === 'string' ? e.type : null, message: e.message }
  } catch {
    // not JSON
  }
  return null
}

/** One SSE error event in the provider's stream format (the provider crate's rule). */
function sseError(provider, status, type, message, code) {
  return providerErrorEvent(provider, status, message, { error: code ?? type, message }, type)
}

/**
 * What a failed proxied call is answered: `{ status, type, message }`. The provider not
 * reached is 502, an upstream timeout 504; a refusal or another tokenwarden error is what
 * errorResponse makes of it.
 */
function failureOf(err) {
  if (err?.upstream === true || err?.code === 'upstream_timeout') {
    const { status } = stopStatus(err?.upstream === true ? 'unreachable' : 'timed_out', null)
    return { status, type: errorTypeFor(status), message: `tokenwarden: ${err.message}` }
  }
  const { status, body } = statusOf(err)
  return { status, type: errorTypeFor(status), message: `tokenwarden: ${body.message}` }
}

/**
 * A proxied call that failed without an answer from the provider: 502 (not reached) or 504
 * (timed out) in the provider's JSON error format; anything else goes to errorResponse.
 */
/**
 * A provider's redirect is not handed on (issue 43, N4): a client that follows it sends
 * what it sent here (its API key, and `x-tokenwarden-token` with the fleet's secret) to
 * wherever it points. The client gets a 502 in the provider's format naming where it
 * pointed, and no `Location`. (The wrapper did not follow it, and settled the lease as
 * nothing used.)
 * @param {Response} res
 * @param {import('tokenwarden-wasm').Provider} provider
 */
function noRedirect(res, provider) {
  if (res.status < 300 || res.status > 399 || res.status === 304) return res
  res.body?.cancel().catch(() => {})
  let where = 'elsewhere'
  try {
    where = new URL(res.headers.get('location') ?? '').origin
  } catch {}
  const message = `the provider answered ${res.status}, a redirect to ${where}: tokenwarden does not hand it on (a client following it would send its key there)`
  return json(502, providerErrorBody(provider, 502, message, { error: 'upstream_redirect', message }))
}

function upstreamFailure(err, provider) {
  if (err?.upstream !== true && err?.code !== 'upstream_timeout') throw err
  const { status, message } = failureOf(err)
  const code = err?.upstream === true ? 'upstream_unreachable' : 'upstream_timeout'
  return json(status, providerErrorBody(provider, status, message, { error: code, message: message.replace(/^tokenwarden: /, '') }))
}

/** A call's state as a client sent it back: `{ failed, refusals, lastRetryAfterMs }`, checked. */
function callState(c) {
  const bad = (field, why) => Object.assign(new HttpError(400, 'invalid_argument', `\`${field}\` ${why}`), { field })
  if (c === null || typeof c !== 'object' || Array.isArray(c)) throw bad('call', 'must be the `call` object an earlier answer returned')
  for (const k of Object.keys(c)) if (!['failed', 'refusals', 'lastRetryAfterMs'].includes(k)) throw bad(`call.${k}`, 'is not a field of a call')
  const count = (k) => {
    const v = c[k] ?? 0
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw bad(`call.${k}`, 'must be an integer from 0 to 4294967295')
    return v
  }
  const last = c.lastRetryAfterMs ?? null
  if (last !== null && (!Number.isSafeInteger(last) || last < 0)) throw bad('call.lastRetryAfterMs', 'must be null or milliseconds')
  return { failed: count('failed'), refusals: count('refusals'), lastRetryAfterMs: last }
}

/** At most this many header pairs in a report, each name and value at most 8 KiB. */
const MAX_HEADER_PAIRS = 256
const MAX_HEADER_BYTES = 8192

/** `headers` of a report: an array of [name, value] string pairs, bounded; 400 naming the bad entry. */
function checkHeaderPairs(headers) {
  const bad = (field, why) => Object.assign(new HttpError(400, 'invalid_argument', `\`${field}\` ${why}`), { field })
  if (!Array.isArray(headers)) throw bad('headers', 'must be an array of [name, value] pairs')
  if (headers.length > MAX_HEADER_PAIRS) throw bad('headers', `must hold at most ${MAX_HEADER_PAIRS} pairs`)
  headers.forEach((pair, i) => {
    if (!Array.isArray(pair) || pair.length !== 2 || typeof pair[0] !== 'string' || typeof pair[1] !== 'string') {
      throw bad(`headers[${i}]`, 'must be a [name, value] pair of strings')
    }
    if (pair[0].length > MAX_HEADER_BYTES || pair[1].length > MAX_HEADER_BYTES) throw bad(`headers[${i}]`, `must have a name and value of at most ${MAX_HEADER_BYTES} characters`)
  })
}

async function body(request) {
  return jsonObject(await request.text())
}

/**
 * The `member` of a task input: an agent credential's agent (the core lets a member act only
 * on its own agent's tasks), nothing for the fleet secret (the operator acts on any).
 * @param {{ id: number } | null} who
 */
function memberOf(who) {
  return who === null ? {} : { member: who.id }
}

const STATUS = {
  unknown_lease: 404,
  unknown_pool: 400,
  not_granted: 409,
  too_large: 400,
  invalid_argument: 400,
  unknown_task: 404,
  too_many_tasks: 409,
  forbidden: 403,
  aborted: 499,
}

/**
 * Errors as JSON: `{ error: code, message, field? }` with the right status. With a
 * `provider` (a proxied call), in that provider's own error format, which the official SDKs
 * parse and show (`{"type":"error","error":{"type":"rate_limit_error","message":…}}`,
 * `{"error":{"message":…,"type":…,"code":…}}`), tokenwarden's fields under `tokenwarden`; a
 * refusal a retry can cure also says `x-should-retry: true` beside its `retry-after`.
 */
/**
 * @param {unknown} e
 * @param {import('tokenwarden-wasm').Provider | null} provider
 */
export function errorResponse(e, provider = null) {
  const { status, body, headers } = statusOf(e)
  const { 'x-should-retry': retry, ...rest } = /** @type {Record<string, string>} */ (headers)
  if (provider === null) return json(status, body, rest)
  const wrapped = providerErrorBody(provider, status, `tokenwarden: ${body.message}`, body)
  return json(status, wrapped, { ...rest, 'x-should-retry': retry ?? 'false' })
}

/**
 * An error's status, tokenwarden body and headers. A refusal, a limiter that is shutting
 * down (a new one takes its place) and an upstream timeout are answered by the provider
 * crate's rule for a stopped call (status, `retry-after`, `x-should-retry`).
 */
function statusOf(e) {
  if (e instanceof HttpError) return { status: e.status, body: { error: e.code, message: e.message, ...(e.field === undefined ? {} : { field: e.field }) }, headers: {} }
  if (e instanceof LeaseRejectedError) {
    const body = { error: 'rejected', reason: e.reason, retryAt: e.retryAt, retryAfterMs: e.retryAfterMs, message: e.message }
    return { body, ...stopStatus('refused', e.retryable ? e.retryAfterMs : null) }
  }
  const code = e?.code
  if (code === 'closed') return { body: { error: code, message: e.message }, ...stopStatus('restarting', null) }
  if (code === 'upstream_timeout') return { body: { error: code, message: e.message }, ...stopStatus('timed_out', null) }
  if (typeof code === 'string' && Object.hasOwn(STATUS, code)) {
    return { status: STATUS[code], body: { error: code, message: e.message, ...(e.field === undefined ? {} : { field: e.field }) }, headers: {} }
  }
  return { status: 500, body: { error: 'internal', message: 'internal error' }, headers: {} }
}
