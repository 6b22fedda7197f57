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
import { MemberTable, Tokenwarden, gatewayRule, proxiedProvider, wasmEngines } from 'tokenwarden-wasm'
import { HttpError, parseFleets } from './auth.js'
import { drain, jsonObject } from './body.js'
import { ObjectClock } from './clock.js'
import { proxy } from './proxy.js'
import { errorResponse, json, refusal, toJson } from './reply.js'
import { StateWrites, readState } from './store.js'
import { Timeline } from './timeline.js'
import { WaitLog } from './waitlog.js'

/**
 * How long a change no reply waits for (a grant from the queue, a proxied call's settle,
 * an expiry) may gather with others before one storage write. A reply that waits for its
 * write (every mutating API call) has it started at once, with whatever else changed in
 * the meantime: group commit, so a lease answers in about one write, not one write plus a
 * gathering window.
 */
const BACKGROUND_FLUSH_MS = 50
/** How long a proxied call's grant may gather with others before its write (proxy.js). */
const SEND_FLUSH_MS = 50

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
    /** The state's writes to storage and the alarm (store.js): where a test moves time by hand, the engine's wake-ups are the test's to bring. */
    this.writes = new StateWrites(this.ctx.storage, () =>
      this.tw === null
        ? null
        : { snapshot: this.tw.engine.snapshot(), leases: this.members === null ? [] : JSON.parse(this.members.records()), epoch: this.epoch, wake: this.clock.manual ? null : this.tw.nextWake() },
    )
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
      this.writes.written = saved.written
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

  /** A change to write within `delay` ms (StateWrites); resolves once written. */
  #persistSoon(delay = 0) {
    return this.writes.soon(delay)
  }

  async alarm() {
    this.writes.alarmAt = undefined
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
            return await proxy(tw, request, url, who, { env: this.env, agentId: (name) => this.#agentId(name), sent: () => this.#persistSoon(SEND_FLUSH_MS) })
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
    this.writes.cleared()
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
    const read = JSON.parse(gatewayRule(toJson({ op: 'clockAdvance', body: b })))
    if ('refused' in read) throw refusal(read.refused)
    return json(200, { now: await this.clock.advance(read.ms) })
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
}

async function body(request) {
  return jsonObject(await request.text())
}
