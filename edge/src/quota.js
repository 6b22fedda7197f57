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
import { LeaseRejectedError, ManualClock, MemberTable, Tokenwarden, gatewayRule, providerErrorBody, proxiedCall, proxiedProvider, stopStatus, taskIdFor, wasmEngines } from 'tokenwarden-wasm'
import { HttpError, parseFleets } from './auth.js'
import { DEFAULT_MAX_PROXY_BODY_BYTES, drain, jsonObject, limitFrom, readText } from './body.js'
import { parseExact, readState, writeChanged } from './store.js'
import { Timeline } from './timeline.js'
import { WaitLog } from './waitlog.js'

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

/** The agent names stored (the member table's writes): id → name. */
async function namesOf(storage) {
  const stored = await storage.list({ prefix: NAME_PREFIX, limit: MAX_AGENT_IDS })
  const names = new Map()
  for (const [key, name] of stored) {
    const id = Number(key.slice(NAME_PREFIX.length))
    if (Number.isSafeInteger(id) && typeof name === 'string') names.set(id, name)
  }
  return names
}
/** JSON text with bigints (instants near u64::MAX only) written as numbers. */
export function toJson(value) {
  return JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? Number(v) : v))
}

export function json(status, body, headers = {}) {
  return new Response(toJson(body), { status, headers: { 'content-type': 'application/json', ...headers } })
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

/** A refusal of the gateway crate's member table, as the error the routes throw. */
function refusal(r) {
  return Object.assign(new HttpError(r.status, r.error, r.message), r.field === undefined ? {} : { field: r.field })
}

export class QuotaObject {
  constructor(ctx, env) {
    this.ctx = ctx
    this.env = env
    /** @type {Tokenwarden | null} */
    this.tw = null
    /**
     * The members' leases and tickets and the agent names (the gateway crate's member
     * table, in wasm): who may act on what, and what a long poll answers.
     * @type {import('tokenwarden-wasm').MemberTable | null}
     */
    this.members = null
    /** Whether the member table's agent ids are keyed by the fleet's secret yet. */
    this.keyed = false
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
    /** Recent call events and the ceilings hit, in memory only (timeline.js). */
    this.timeline = new Timeline()
    /** The object's time and timers (see ObjectClock). */
    this.clock = new ObjectClock()
    /** Agent names stored before a restart, until the member table is keyed (id → name). */
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
    const records = toJson(leases)
    if (this.members === null) this.members = new MemberTable([...engine.pools], records)
    else this.members.restore([...engine.pools], records)
    const members = this.members
    // The member table keeps its records from the driver's events; the long polls it says
    // are due answer now (a grant, an ended ticket, a promise moved past one about to come).
    tw.on('granted', (e) => {
      members.granted(Number(e.lease), Number(e.expiresAt), Number(e.waitedMs))
      this.#wake()
      this.#persistSoon(BACKGROUND_FLUSH_MS)
    })
    tw.on('revised', (e) => {
      members.revised(Number(e.lease), Number(e.eta), this.clock.now())
      this.#wake()
      this.#persistSoon(BACKGROUND_FLUSH_MS)
    })
    tw.on('expired', (e) => {
      members.expired(Number(e.lease))
      this.#wake()
      this.#persistSoon(BACKGROUND_FLUSH_MS)
    })
    for (const name of /** @type {const} */ (['paused', 'margin_changed', 'estimate_alert', 'settled'])) tw.on(name, () => this.#persistSoon(BACKGROUND_FLUSH_MS))
    // `tokenwarden serve` prints waits where its operator looks (its terminal).
    if (this.env?.TOKENWARDEN_WAIT_LOG === '1') new WaitLog(tw, (id) => this.#nameOf(id) ?? `agent ${id}`)
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
    const state = { snapshot: text.length <= INLINE_SNAPSHOT_BYTES ? text : parseExact(text), leases: this.members === null ? [] : JSON.parse(this.members.records()), epoch: this.epoch }
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
    try {
      const tw = this.#driver(fleet, quota)
      const members = /** @type {import('tokenwarden-wasm').MemberTable} */ (this.members)
      if (!this.keyed) {
        members.key(parseFleets(this.env.TOKENWARDEN_FLEETS)[fleet]?.secret ?? '', toJson([...this.storedNames]))
        this.keyed = true
        this.storedNames = new Map()
      }
      // Remote drivers seen in the last minute (the member table's count, at least 1): their
      // fallback while the limiter is unreachable is that share of the quota.
      const clients = members.seen(request.headers.get('x-tw-client') ?? undefined, this.clock.now())
      // Set by the Worker for an agent credential: the one agent this caller may act for.
      // Per request, never on `this`: calls interleave while they await.
      const name = request.headers.get('x-tw-agent')
      const who = name ?? undefined
      const [, op, id] = url.pathname.split('/')
      const lease = id === undefined ? null : Number(id)
      // A handle names a lease of one epoch: one from before a reset names nothing now.
      const epoch = request.headers.get('x-tw-epoch')
      if (epoch !== null && epoch !== this.epoch) throw new HttpError(404, 'unknown_lease', 'no such lease: this handle is from before the quota was reset')
      let response
      /**
       * The member route `route` applied with the request's body (or `b`): the core's input and output.
       * @param {string} route
       * @param {unknown} [b]
       */
      const member = async (route, b) => this.#member(tw, route, id === undefined ? undefined : decodeURIComponent(id), who, b ?? (await body(request)))
      /**
       * What member route `route` answers for its output (the gateway crate's shapes; a
       * lease as the object's id, for the Worker to sign).
       * @param {string} route
       * @param {{ input: unknown, out: unknown }} applied
       */
      const answered = (route, { input, out }) => {
        const a = JSON.parse(gatewayRule(toJson({ op: 'answer', route, input, output: out, now: this.clock.now(), clients: clients })))
        return json(a.status, route === 'lease' && a.body.lease !== undefined ? { ...a.body, epoch: this.epoch } : a.body)
      }
      switch (`${request.method} ${op}`) {
        case 'POST handle':
          response = json(200, { ...(await member('handle')).out, epoch: this.epoch, clients: clients })
          break
        case 'GET wait':
          response = await this.#wait(lease, Number(url.searchParams.get('timeout') ?? 0), who)
          break
        case 'POST cancel':
          // (A cancel has no body.)
          response = answered('cancel', await member('cancel', {}))
          break
        case 'POST lease':
        case 'POST settle':
        case 'POST interrupted':
        case 'POST renew':
        case 'POST response':
        case 'POST task':
        case 'POST task-failed':
        case 'POST task-done':
          response = answered(op, await member(op))
          break
        case 'GET metrics':
          return json(200, this.#named(tw.metrics()))
        case 'GET timeline': {
          const pools = (tw.metrics().pools ?? []).map((p) => String(p.name))
          return json(
            200,
            this.timeline.view(this.clock.now(), (agent) => this.#nameOf(agent), pools),
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
   * The metrics with each agent's name beside its id (`name`: the name the id was made from,
   * or null for a numeric agent or one not seen since the object started; a subagent's
   * family by its root's name, `familyName`) and the ceilings hit since the object started
   * (429s by the provider's limit type, refusals by reason: the timeline's): the member
   * table's rule.
   */
  #named(metrics) {
    const members = /** @type {import('tokenwarden-wasm').MemberTable} */ (this.members)
    const ceilings = this.timeline.ceilings((metrics?.pools ?? []).map((p) => String(p.name)))
    return JSON.parse(members.namedMetrics(toJson(metrics), toJson(ceilings)))
  }

  /** The name agent `id` was made from, if the member table remembers it. */
  #nameOf(id) {
    return this.keyed ? (this.members?.nameOf(Number(id)) ?? null) : null
  }

  /** The id of agent `name` (keyed by the fleet's secret), its name stored. */
  #agentId(name) {
    const id = /** @type {import('tokenwarden-wasm').MemberTable} */ (this.members).agentId(name)
    this.#storeNames()
    return id
  }

  /**
   * Writes (not awaited: the object's output gate holds replies until it commits) the agent
   * names the member table learned or forgot, one key per agent (NAME_PREFIX).
   */
  #storeNames() {
    const writes = JSON.parse(/** @type {import('tokenwarden-wasm').MemberTable} */ (this.members).takeNameWrites())
    for (const [id, name] of writes) {
      const key = `${NAME_PREFIX}${id}`
      ;(name === null ? this.ctx.storage.delete(key) : this.ctx.storage.put(key, name)).catch(() => {})
    }
  }

  /** Answers the long polls the member table says are due. */
  #wake() {
    if (this.members === null) return
    for (const id of this.members.takeWakes()) {
      for (const wake of this.waiters.get(id) ?? []) wake()
      this.waiters.delete(id)
    }
  }

  /**
   * A member's request to `route` of the HTTP API (`handle`, or a per-verb route that is a
   * shape of it), naming lease or task `id`, from agent credential `who` (its name) or the
   * fleet's secret: checked by the gateway crate's member table (who may act, then the
   * fields), applied through the driver, and the table kept from the answer. Leases are the
   * object's ids here (the Worker opens and signs the handles).
   * @param {Tokenwarden} tw
   * @param {string} route
   * @param {string | undefined} id the path's lease or task (its id, or a task's name)
   * @param {string | undefined} who
   * @param {unknown} b the request's body
   * @returns {{ input: any, out: import('tokenwarden-wasm').Output }}
   */
  #member(tw, route, id, who, b) {
    const members = /** @type {import('tokenwarden-wasm').MemberTable} */ (this.members)
    const read = JSON.parse(members.route(route, id, who, toJson(b)))
    this.#storeNames()
    if ('refused' in read) throw refusal(read.refused)
    const out = tw.handle(read.input)
    members.applied(toJson(out))
    this.#wake()
    return { input: read.input, out }
  }

  /**
   * The operator's reset: the quota starts afresh from its configuration — every lease and
   * ticket ends (long polls answer 404), debt, pauses and learned limits are gone — and the
   * stored state is replaced.
   */
  async #reset() {
    this.tw?.close()
    this.tw = null
    // Every record ends (their long polls answer 404); the names are identity, not quota
    // state: the table writes the ones it remembers again, after storage is emptied.
    const ended = this.members?.clear() ?? 0
    this.timeline.clear()
    for (const wakes of this.waiters.values()) for (const wake of wakes) wake()
    this.waiters.clear()
    await this.ctx.storage.deleteAlarm()
    await this.ctx.storage.deleteAll()
    if (this.keyed) this.#storeNames()
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
    const read = JSON.parse(/** @type {import('tokenwarden-wasm').MemberTable} */ (this.members).hold(toJson(b), this.clock.now()))
    if ('refused' in read) throw refusal(read.refused)
    const out = tw.handle(read.input)
    if (out.output !== 'held') throw new Error(`internal: hold answered ${out.output}`)
    return json(200, { held: true, pool: tw.engine.pools[out.pool], until: out.until })
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

  /**
   * A long poll on a ticket: held while it is queued (at most 30 s, the member
   * table's rule), answered as soon as the table says it is due (granted, ended, its promise
   * moved).
   */
  async #wait(lease, timeout, who) {
    const members = /** @type {import('tokenwarden-wasm').MemberTable} */ (this.members)
    let read = JSON.parse(members.wait(lease ?? Number.NaN, who, timeout))
    if ('hold' in read) {
      await new Promise((resolve) => {
        const list = this.waiters.get(lease) ?? []
        list.push(resolve)
        this.waiters.set(lease, list)
        this.clock.setTimer(resolve, read.hold)
      })
      read = JSON.parse(members.wait(lease ?? Number.NaN, who, 0))
      if (read.refused?.status === 404) throw new HttpError(404, 'unknown_lease', 'the ticket ended while waiting')
    }
    if ('refused' in read) throw refusal(read.refused)
    const { kind, ...rest } = read.body
    return json(read.status, { kind, lease, epoch: this.epoch, ...rest })
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
    const read = proxiedCall(url.pathname.slice('/proxy'.length), url.search, request.headers, [fleet.secret, fleet.admin_secret], who ?? null)
    if ('refused' in read) throw Object.assign(new HttpError(read.refused.status, read.refused.error, read.refused.message), read.refused.field === undefined ? {} : { field: read.refused.field })
    // No role named: `auto`, the core's (a planner for its subagents at work, which unblocks
    // them, else a worker), as every host leaves it.
    const { provider, path, role, task, unblocks, failureSignature: signature, agent: base } = read.call
    const headers = new Headers(read.call.headers)
    // The client's session headers: who the call is when nothing above names it, and under
    // a name, which of that agent's subagents (a child of it: `alice/<subagent id>`).
    const session = tw.engine.callerIdentity([...request.headers], base)
    const agentName = session?.name ?? base ?? 'proxy'
    const agent = this.#agentId(agentName)
    // The family's root: by default the family shares one place in the fair order.
    const family = session?.root == null ? null : this.#agentId(session.root)
    const upstream = new URL(q.upstream)
    upstream.pathname = upstream.pathname.replace(/\/$/, '') + path
    upstream.search = read.call.query
    let sent = false
    const gone = new AbortController()
    const f = tw.fetch({
      agent,
      ...(family === null ? {} : { family }),
      role,
      ...(task === null ? {} : { task: taskIdFor(task) }),
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
    // A streamed call that has no answer within KEEPALIVE.afterMs (waiting in line, or for a
    // 429 to clear) gets its response head now and SSE comments until the provider's stream
    // follows: the client sees a live connection, and a client that went away is noticed
    // when a write to it fails — the call is then withdrawn, not forwarded for nobody.
    const settled = answer.then(
      (res) => ({ res }),
      (err) => ({ err }),
    )
    let first = await Promise.race([settled, new Promise((r) => setTimeout(() => r(null), KEEPALIVE.afterMs))])
    // Already with the provider: its own status and headers are what the client gets.
    if (first === null && sent) first = await settled
    if (first !== null) return first.err === undefined ? first.res : upstreamFailure(first.err, provider)
    return keptAlive(answer, provider, gone, () => sent)
  }
}

/**
 * A waiting stream's keep-alive (the gateway crate's rule): its head after `afterMs`, then
 * an SSE comment every `everyMs`, `waiting` in line or `sent` to the provider.
 * @type {{ afterMs: number, everyMs: number, waiting: string, sent: string }}
 */
const KEEPALIVE = JSON.parse(gatewayRule('{"op":"keepalive"}'))

/** Whether a provider request body asks for a stream (`"stream": true`). */
function wantsStream(text) {
  try {
    return JSON.parse(text)?.stream === true
  } catch {
    return false
  }
}

/** One of the gateway crate's proxy rules (`redirect`, `streamError`, `failureEvent`). */
function proxyRule(input) {
  return JSON.parse(gatewayRule(toJson(input)))
}

/**
 * A streamed proxied call answered before its outcome is known: `200 text/event-stream`
 * at once, then an SSE comment every `KEEPALIVE.everyMs` while it waits, then the
 * provider's stream — or, if the call ends otherwise (the provider answers an error, the
 * core gives up, the provider cannot be reached), one SSE `error` event in the provider's
 * format, which the official SDKs raise as an API error with tokenwarden's reason. A
 * cancelled body (the client is gone: a write failed) aborts `gone`, which withdraws the call.
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
          controller.enqueue(enc.encode(sent() ? KEEPALIVE.sent : KEEPALIVE.waiting))
        } catch {
          clearInterval(timer)
        }
      }
      ping()
      timer = setInterval(ping, KEEPALIVE.everyMs)
      const end = (event) => {
        controller.enqueue(enc.encode(event))
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
          end(proxyRule({ op: 'streamError', provider, status: res.status, body: raw }).event)
        },
        (err) => {
          clearInterval(timer)
          if (gone.signal.aborted) return
          const e = failureOf(err)
          end(proxyRule({ op: 'failureEvent', provider, status: e.status, code: e.code, message: e.message }).event)
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

/**
 * What a failed proxied call is answered: `{ status, code, message }`. The provider not
 * reached is 502, an upstream timeout 504; a refusal or another tokenwarden error is what
 * errorResponse makes of it.
 */
function failureOf(err) {
  if (err?.upstream === true || err?.code === 'upstream_timeout') {
    const unreachable = err?.upstream === true
    const { status } = stopStatus(unreachable ? 'unreachable' : 'timed_out', null)
    return { status, code: unreachable ? 'upstream_unreachable' : 'upstream_timeout', message: String(err.message) }
  }
  const { status, body } = statusOf(err)
  return { status, code: String(body.error), message: String(body.message) }
}

/**
 * A provider's redirect is not handed on (issue 43, N4): a client that follows it sends
 * what it sent here (its API key, and `x-tokenwarden-token` with the fleet's secret) to
 * wherever it points. The client gets a 502 in the provider's format naming where it
 * pointed, and no `Location` (the gateway crate's rule). (The wrapper did not follow it,
 * and settled the lease as nothing used.)
 * @param {Response} res
 * @param {import('tokenwarden-wasm').Provider} provider
 */
function noRedirect(res, provider) {
  if (res.status < 300 || res.status > 399 || res.status === 304) return res
  res.body?.cancel().catch(() => {})
  const r = proxyRule({ op: 'redirect', provider, status: res.status, location: res.headers.get('location') ?? undefined })
  return json(r.status, r.body)
}

/**
 * A proxied call that failed without an answer from the provider: 502 (not reached) or 504
 * (timed out) in the provider's JSON error format; anything else goes to errorResponse.
 */
function upstreamFailure(err, provider) {
  if (err?.upstream !== true && err?.code !== 'upstream_timeout') throw err
  const { status, code, message } = failureOf(err)
  return json(status, providerErrorBody(provider, status, `tokenwarden: ${message}`, { error: code, message }))
}

async function body(request) {
  return jsonObject(await request.text())
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
