// A coordinator's metrics (the core's `Metrics`, camelCase keys, as `engine.metrics(now)`
// returns them) in the Prometheus text exposition format, version 0.0.4, for one quota of
// one fleet. Plain ECMAScript: runs in workerd, browsers and Node alike.
//
// Every sample carries `fleet` and `quota` labels; per-pool families add `pool`, per-axis
// ones `axis`, per-agent ones `agent` (the agent's name; at most MAX_AGENT_LABELS of them
// and `other`). Families are written in a fixed order, each as one group (HELP, TYPE, then
// its samples); a family with no sample (say `tokenwarden_limit` before any limit is known)
// is left out. No timestamps: the scraper stamps the samples.

/** @typedef {import('tokenwarden-wasm').U64} U64 */
/**
 * The edge's count of refusals and 429s per pool (`GET /metrics`'s `ceilings`): 429s by the
 * limit the provider named, refusals by `reason` or `reason:axis`.
 * @typedef {{ pools?: Array<{ pool: string | number, rateLimited?: Record<string, number>, rejected?: Record<string, number> }> }} Ceilings
 */

/** The `Content-Type` of {@link prometheusText}'s output. */
export const PROMETHEUS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8'

/** What each of the core's `PoolCounters` counts, by camelCase key. */
const COUNTER_HELP = {
  grantedNow: 'Leases granted without waiting.',
  grantedFromQueue: 'Leases granted from the queue.',
  queued: 'Requests that had to queue.',
  rejected: 'Requests rejected (any reason).',
  settled: 'Leases settled.',
  cancelled: 'Leases and tickets cancelled.',
  expired: 'Leases reaped unsettled (no refund).',
  rateLimited: '429 responses reported.',
  rateLimitedOnLease: '429 responses reported against a granted lease (each one cut the margin).',
  resyncs: 'Times a provider header lowered a bucket.',
  malformedHeaders: 'Provider headers that were recognised but malformed, and ignored.',
}

/**
 * Renders `metrics` as Prometheus text (exposition format 0.0.4).
 *
 * @param {import('tokenwarden-wasm').Metrics & { ceilings?: Ceilings }} metrics the coordinator's
 *   metrics, as `engine.metrics(now)` returns them (numbers; bigints are accepted too), with
 *   the edge's `ceilings` when it adds them
 * @param {{ fleet: string, quota: string }} labels the fleet and quota every sample is
 *   labelled with
 * @returns {string} the exposition, one `\n`-terminated line each
 */
export function prometheusText(metrics, labels) {
  const base = [
    ['fleet', String(labels?.fleet ?? '')],
    ['quota', String(labels?.quota ?? '')],
  ]
  const now = toNumber(metrics.now)
  const pools = metrics.pools ?? []
  const agents = metrics.agents ?? []
  const out = new Exposition()

  out.family('tokenwarden_live_leases', 'gauge', 'Leases and queued tickets alive.')
  out.sample('tokenwarden_live_leases', base, metrics.liveLeases)

  out.family('tokenwarden_agents', 'gauge', 'Agents known to the coordinator, by what they are doing now.')
  const byState = new Map(AGENT_STATES.map((state) => [state, 0]))
  for (const a of agents) {
    const state = String(a.activity?.state ?? 'unknown')
    byState.set(state, (byState.get(state) ?? 0) + 1)
  }
  for (const [state, n] of byState) out.sample('tokenwarden_agents', [...base, ['state', state]], n)

  out.family('tokenwarden_agents_alerting', 'gauge', 'Agents whose token estimates are off enough to raise the estimate-error alert.')
  out.sample('tokenwarden_agents_alerting', base, agents.filter((a) => a.alerting === true).length)

  // Per agent, by name: the MAX_AGENT_LABELS most active agents each under its own `agent`
  // label, the rest summed under agent="other", so the series stay bounded.
  out.family('tokenwarden_agent_in_flight', 'gauge', `Leases in flight, per agent (the ${MAX_AGENT_LABELS} most active by name, the rest as "other").`)
  out.family('tokenwarden_agent_queued', 'gauge', 'Tickets queued, per agent.')
  out.family('tokenwarden_agent_settled_total', 'counter', 'Leases settled, per agent.')
  out.family(
    'tokenwarden_agent_state',
    'gauge',
    'What each agent is doing now: 1 for its state, 0 for the others (for "other", how many agents are in each state). Waiting is queued, refused (until a retry time), rate_limited (waiting out a 429) or backing_off (an overload).',
  )
  out.family(
    'tokenwarden_agent_rate_limited',
    'gauge',
    'Agents waiting out a 429, by the limit the provider named or its headers showed spent (axis "unknown" when neither did): 1 per named agent, a count for "other".',
  )
  out.family(
    'tokenwarden_agent_wait_remaining_seconds',
    'gauge',
    'Seconds until a waiting agent is expected to go on: a refusal, 429 or overload wait until its end, a queued ticket until its expected grant (for "other", the longest).',
  )
  for (const [agent, f] of perAgent(agents)) {
    const l = [...base, ['agent', agent]]
    out.sample('tokenwarden_agent_in_flight', l, f.inFlight)
    out.sample('tokenwarden_agent_queued', l, f.queued)
    out.sample('tokenwarden_agent_settled_total', l, f.settled)
    for (const state of AGENT_STATES) out.sample('tokenwarden_agent_state', [...l, ['state', state]], f.states.get(state) ?? 0)
    for (const [axis, k] of f.rateLimitedAxes) out.sample('tokenwarden_agent_rate_limited', [...l, ['axis', axis]], k)
    if (f.waitUntil !== null) out.sample('tokenwarden_agent_wait_remaining_seconds', l, Math.max(0, f.waitUntil - now) / 1000)
  }

  // Families (an agent and the subagents whose calls name it), by the root's name: the
  // MAX_AGENT_LABELS busiest, the rest summed as "other".
  out.family('tokenwarden_family_members', 'gauge', `Agents in a family: its root and the subagents whose calls name it (the ${MAX_AGENT_LABELS} busiest families by root name, the rest as "other").`)
  out.family('tokenwarden_family_busy', 'gauge', 'Members of a family with a call queued or in flight: by default the family shares one place in the fair order, split among them.')
  for (const [family, f] of perFamily(agents)) {
    const l = [...base, ['family', family]]
    out.sample('tokenwarden_family_members', l, f.members)
    out.sample('tokenwarden_family_busy', l, f.busy)
  }

  out.family('tokenwarden_limit', 'gauge', "The provider's limit per rate window (tokens or requests, by axis), where known.")
  out.family('tokenwarden_capacity', 'gauge', 'Effective capacity per rate window (limit x margin x ramp), for axes with a known limit.')
  out.family('tokenwarden_available', 'gauge', 'Capacity available now, for axes with a known limit; negative is debt.')
  out.family('tokenwarden_used_last_minute', 'gauge', 'Usage in the last complete minute.')
  out.family('tokenwarden_used_last_minute_ratio', 'gauge', "Usage in the last complete minute against the provider's limit, for axes with a known limit.")
  out.family('tokenwarden_margin_ratio', 'gauge', 'Share of the provider limit the coordinator currently grants (1 = all of it).')
  out.family('tokenwarden_paused', 'gauge', '1 while grants are paused after a 429, else 0.')
  out.family(
    'tokenwarden_margin_at_floor_seconds',
    'gauge',
    'How long the margin has sat at its floor without rising (0 when it is not there); past margin.floor_alert_ms something outside the coordinator is using the key.',
  )
  out.family('tokenwarden_queue_depth', 'gauge', 'Tickets queued.')
  out.family('tokenwarden_in_flight', 'gauge', 'Leases in flight.')
  out.family('tokenwarden_max_concurrent', 'gauge', 'The concurrency limit, where known.')
  out.family('tokenwarden_queue_wait_seconds', 'gauge', 'Wait of leases granted from the queue, by quantile (within 12.5 %).')

  const counterKeys = []
  for (const pool of pools) {
    for (const key of Object.keys(pool.counters ?? {})) if (!counterKeys.includes(key)) counterKeys.push(key)
  }
  const counterName = (key) => `tokenwarden_${snakeCase(key)}_total`
  for (const key of counterKeys) {
    out.family(counterName(key), 'counter', COUNTER_HELP[key] ?? `The coordinator's ${key} counter.`)
  }

  // The ceilings hit (the edge's counters since its object started, beside the core's
  // metrics): 429s by the limit the provider named, refusals by reason and axis.
  out.family(
    'tokenwarden_rate_limited_by_axis_total',
    'counter',
    '429 responses reported, by the limit the provider said was exceeded (its rate_limit_type; "unknown" when it named none), since the quota\'s object started.',
  )
  out.family('tokenwarden_rejected_by_reason_total', 'counter', "Requests refused, by the core's reason (and the axis, for exceeds_capacity), since the quota's object started.")
  for (const c of metrics.ceilings?.pools ?? []) {
    const p = [...base, ['pool', String(c.pool)]]
    for (const [axis, k] of Object.entries(c.rateLimited ?? {})) out.sample('tokenwarden_rate_limited_by_axis_total', [...p, ['axis', axis]], k)
    for (const [key, k] of Object.entries(c.rejected ?? {})) {
      const [reason, axis] = String(key).split(':')
      out.sample('tokenwarden_rejected_by_reason_total', [...p, ['reason', reason], ...(axis === undefined ? [] : [['axis', axis]])], k)
    }
  }

  out.family('tokenwarden_fleet_agents_at_75_percent', 'gauge', 'Agents like the measured ones that fit at 75 % of the binding limit.')
  out.family('tokenwarden_fleet_agents_measured', 'gauge', 'Agents the fleet advice was measured on.')
  out.family('tokenwarden_fleet_per_agent_per_minute', 'gauge', "One active agent's demand per minute on the binding axis (served / the share of time not waiting on quota).")
  out.family('tokenwarden_fleet_served_per_agent_per_minute', 'gauge', "One active agent's usage per minute on the binding axis, as served.")
  out.family('tokenwarden_fleet_waiting_ratio', 'gauge', "The share of the measured agents' time spent waiting on quota.")

  // Tasks: seed 003's four numbers (429 rate, tokens per merged task, task time,
  // critical-path wait), since start and over the last complete minute.
  const tasks = metrics.tasks
  if (tasks) {
    out.family('tokenwarden_tasks_open', 'gauge', 'Tasks open now.')
    out.sample('tokenwarden_tasks_open', base, tasks.open)
    out.family('tokenwarden_tasks_ended_total', 'counter', 'Tasks ended, by outcome.')
    for (const outcome of ['merged', 'abandoned', 'failed']) {
      out.sample('tokenwarden_tasks_ended_total', [...base, ['outcome', outcome]], tasks.sinceStart?.[outcome] ?? 0)
    }
    out.family('tokenwarden_tasks_untracked_total', 'counter', 'Requests that named a task the full task table could not take.')
    out.sample('tokenwarden_tasks_untracked_total', base, tasks.untracked)
    out.family('tokenwarden_task_tokens_total', 'counter', 'Tokens charged to the tasks that ended.')
    out.sample('tokenwarden_task_tokens_total', base, tasks.sinceStart?.tokens ?? 0)
    out.family('tokenwarden_task_seconds', 'gauge', 'Wall time of the merged tasks since start, by quantile (within 3.2 %).')
    for (const [quantile, ms] of /** @type {Array<[string, U64 | null | undefined]>} */ ([
      ['0.5', tasks.sinceStart?.taskTimeP50Ms],
      ['0.95', tasks.sinceStart?.taskTimeP95Ms],
    ])) {
      if (ms !== null && ms !== undefined) out.sample('tokenwarden_task_seconds', [...base, ['quantile', quantile]], toNumber(ms) / 1000)
    }
    out.family(
      'tokenwarden_tokens_per_merged_task',
      'gauge',
      'Every token the provider counted for the ended tasks (every outcome; cache reads included) per merged task, since start and over the last complete minute.',
    )
    out.family(
      'tokenwarden_rate_limited_tokens_per_merged_task',
      'gauge',
      'The part of tokenwarden_tokens_per_merged_task that counts against the rate limits, since start and over the last complete minute.',
    )
    out.family('tokenwarden_task_seconds_mean', 'gauge', 'Mean wall time of the merged tasks, since start and over the last complete minute.')
    out.family(
      'tokenwarden_critical_path_wait_seconds',
      'gauge',
      'Time the ended tasks had a model call outstanding (ask to settle) times the tasks each unblocks (agent-seconds), since start and over the last complete minute.',
    )
    out.family('tokenwarden_quota_wait_seconds', 'gauge', 'Time the ended tasks waited on the quota, since start and over the last complete minute.')
    out.family('tokenwarden_rate_limited_ratio', 'gauge', '429 responses per call sent, since start and over the last complete minute.')
    for (const [span, f] of /** @type {Array<[string, import('tokenwarden-wasm').TaskFigures | undefined]>} */ ([
      ['since_start', tasks.sinceStart],
      ['last_minute', tasks.lastMinute],
    ])) {
      if (!f) continue
      const s = [...base, ['span', span]]
      if (f.tokensPerMergedTask !== null && f.tokensPerMergedTask !== undefined) out.sample('tokenwarden_tokens_per_merged_task', s, f.tokensPerMergedTask)
      if (f.rateLimitedTokensPerMergedTask !== null && f.rateLimitedTokensPerMergedTask !== undefined)
        out.sample('tokenwarden_rate_limited_tokens_per_merged_task', s, f.rateLimitedTokensPerMergedTask)
      if (f.taskTimeMeanMs !== null && f.taskTimeMeanMs !== undefined) out.sample('tokenwarden_task_seconds_mean', s, toNumber(f.taskTimeMeanMs) / 1000)
      out.sample('tokenwarden_critical_path_wait_seconds', s, toNumber(f.criticalPathWaitMs) / 1000)
      out.sample('tokenwarden_quota_wait_seconds', s, toNumber(f.quotaWaitMs) / 1000)
      if (f.rateLimitedPermille !== null && f.rateLimitedPermille !== undefined) out.sample('tokenwarden_rate_limited_ratio', s, toNumber(f.rateLimitedPermille) / 1000)
    }
  }

  for (const pool of pools) {
    const p = [...base, ['pool', String(pool.name)]]
    for (const axis of pool.axes ?? []) {
      const a = [...p, ['axis', String(axis.axis)]]
      const known = axis.limit !== null && axis.limit !== undefined
      if (known) {
        out.sample('tokenwarden_limit', a, axis.limit)
        out.sample('tokenwarden_capacity', a, axis.capacity)
        out.sample('tokenwarden_available', a, axis.available)
      }
      out.sample('tokenwarden_used_last_minute', a, axis.lastMinute)
      if (known) out.sample('tokenwarden_used_last_minute_ratio', a, toNumber(axis.lastMinutePermille) / 1000)
    }
    out.sample('tokenwarden_margin_ratio', p, toNumber(pool.marginPermille) / 1000)
    out.sample('tokenwarden_paused', p, toNumber(pool.pausedUntil) > now ? 1 : 0)
    const floorSince = pool.marginAtFloorSince
    out.sample('tokenwarden_margin_at_floor_seconds', p, floorSince === null || floorSince === undefined ? 0 : Math.max(0, now - toNumber(floorSince)) / 1000)
    out.sample('tokenwarden_queue_depth', p, pool.queueDepth)
    out.sample('tokenwarden_in_flight', p, pool.inFlight)
    if (pool.maxConcurrent !== null && pool.maxConcurrent !== undefined) {
      out.sample('tokenwarden_max_concurrent', p, pool.maxConcurrent)
    }
    for (const [quantile, ms] of /** @type {Array<[string, U64 | null | undefined]>} */ ([
      ['0.5', pool.queueWaitP50Ms],
      ['0.95', pool.queueWaitP95Ms],
    ])) {
      if (ms !== null && ms !== undefined) {
        out.sample('tokenwarden_queue_wait_seconds', [...p, ['quantile', quantile]], toNumber(ms) / 1000)
      }
    }
    for (const [key, value] of Object.entries(pool.counters ?? {})) out.sample(counterName(key), p, value)
    if (pool.fleet) {
      const f = [...p, ['axis', String(pool.fleet.axis)]]
      out.sample('tokenwarden_fleet_agents_at_75_percent', f, pool.fleet.agentsAt75Percent)
      out.sample('tokenwarden_fleet_agents_measured', f, pool.fleet.agentsMeasured)
      out.sample('tokenwarden_fleet_per_agent_per_minute', f, pool.fleet.perAgentPerMinute)
      out.sample('tokenwarden_fleet_served_per_agent_per_minute', f, pool.fleet.servedPerAgentPerMinute ?? pool.fleet.perAgentPerMinute)
      out.sample('tokenwarden_fleet_waiting_ratio', f, Number(pool.fleet.waitingPermille ?? 0) / 1000)
    }
  }
  return out.toString()
}

/** Agents labelled by name in the per-agent families; the rest are summed as `other`. */
export const MAX_AGENT_LABELS = 20

/**
 * Per family (an agent some other agent names as its `family`), by its root's name (or id):
 * members (the root, if known, and its subagents) and how many have a call queued or in
 * flight; the MAX_AGENT_LABELS busiest, then the rest summed as `other`.
 * @param {Array<Record<string, any>>} agents
 * @returns {Array<[string, { members: number, busy: number }]>}
 */
export function perFamily(agents) {
  const roots = new Map()
  for (const a of agents) {
    if (a.family === undefined || a.family === null) continue
    const id = String(a.family)
    if (!roots.has(id)) roots.set(id, { label: a.familyName ?? id, members: 0, busy: 0 })
  }
  for (const a of agents) {
    const f = roots.get(String(a.family ?? a.agent))
    if (f === undefined) continue
    f.members++
    if (toNumber(a.queued ?? 0) > 0 || toNumber(a.inFlight ?? 0) > 0) f.busy++
  }
  const sorted = [...roots.values()].sort((x, y) => y.busy - x.busy || y.members - x.members || (x.label < y.label ? -1 : x.label > y.label ? 1 : 0))
  /** @type {Array<[string, { members: number, busy: number }]>} */
  const out = sorted.slice(0, MAX_AGENT_LABELS).map((f) => [f.label, { members: f.members, busy: f.busy }])
  const rest = sorted.slice(MAX_AGENT_LABELS)
  if (rest.length > 0) out.push(['other', { members: rest.reduce((n, f) => n + f.members, 0), busy: rest.reduce((n, f) => n + f.busy, 0) }])
  return out
}

/** What an agent can be doing (the core's `activity.state`). */
export const AGENT_STATES = ['idle', 'in_flight', 'queued', 'refused', 'rate_limited', 'backing_off']
const WAITING = new Set(['queued', 'refused', 'rate_limited', 'backing_off'])

/** When an agent's wait is expected to end (Unix ms), or null. */
function waitUntilOf(activity) {
  const s = activity?.state
  const t = s === 'queued' ? activity.expectedGrant : s === 'refused' || s === 'rate_limited' || s === 'backing_off' ? activity.until : null
  return t === null || t === undefined ? null : toNumber(t)
}

/**
 * The per-agent figures by label: the MAX_AGENT_LABELS most active agents (most in flight
 * and queued, a waiting one counting as one queued, then most settled, then the most
 * recently seen), each by its name (its id where it has none), then `other` holding the sum
 * of the rest, if any (its states counted, its wait the longest).
 */
function perAgent(agents) {
  const ranked = agents
    .map((a) => {
      const state = AGENT_STATES.includes(a.activity?.state) ? a.activity.state : 'idle'
      const active = toNumber(a.inFlight) + Math.max(toNumber(a.queued), WAITING.has(state) ? 1 : 0)
      const axis = state === 'rate_limited' ? (typeof a.activity.axis === 'string' ? a.activity.axis : 'unknown') : null
      return {
        label: typeof a.name === 'string' && a.name !== '' ? a.name : String(a.agent),
        inFlight: toNumber(a.inFlight),
        queued: toNumber(a.queued),
        settled: toNumber(a.settled),
        lastSeen: toNumber(a.lastSeen),
        state,
        active,
        axis,
        waitUntil: waitUntilOf(a.activity),
      }
    })
    .sort((x, y) => y.active - x.active || y.settled - x.settled || y.lastSeen - x.lastSeen || (x.label < y.label ? -1 : x.label > y.label ? 1 : 0))
  const out = new Map()
  ranked.forEach((a, i) => {
    const label = i < MAX_AGENT_LABELS && !out.has(a.label) ? a.label : 'other'
    const f = out.get(label) ?? { inFlight: 0, queued: 0, settled: 0, states: new Map(), rateLimitedAxes: new Map(), waitUntil: null }
    f.inFlight += a.inFlight
    f.queued += a.queued
    f.settled += a.settled
    f.states.set(a.state, (f.states.get(a.state) ?? 0) + 1)
    if (a.axis !== null) f.rateLimitedAxes.set(a.axis, (f.rateLimitedAxes.get(a.axis) ?? 0) + 1)
    if (a.waitUntil !== null) f.waitUntil = Math.max(f.waitUntil ?? a.waitUntil, a.waitUntil)
    out.set(label, f)
  })
  // `other` last, whether or not an agent is named so.
  const other = out.get('other')
  if (other !== undefined) {
    out.delete('other')
    out.set('other', other)
  }
  return out
}

/** Families in declaration order, each with its samples; written out as one group each. */
class Exposition {
  /** @type {Map<string, { type: string, help: string, lines: string[] }>} */
  #families = new Map()

  /**
   * @param {string} name
   * @param {'gauge' | 'counter'} type
   * @param {string} help
   */
  family(name, type, help) {
    if (!this.#families.has(name)) this.#families.set(name, { type, help, lines: [] })
  }

  /**
   * @param {string} name a family declared with {@link family}
   * @param {ReadonlyArray<ReadonlyArray<string>>} labels name and value pairs
   * @param {number | bigint | null | undefined} value
   */
  sample(name, labels, value) {
    const family = this.#families.get(name)
    if (!family) throw new Error(`undeclared metric family ${name}`)
    const rendered = labels.map(([k, v]) => `${k}="${escapeLabelValue(v)}"`).join(',')
    family.lines.push(`${name}{${rendered}} ${formatValue(value)}`)
  }

  toString() {
    let text = ''
    for (const [name, f] of this.#families) {
      if (f.lines.length === 0) continue
      text += `# HELP ${name} ${escapeHelp(f.help)}\n# TYPE ${name} ${f.type}\n`
      for (const line of f.lines) text += `${line}\n`
    }
    return text
  }
}

/**
 * A label value as the text format wants it: backslash, double quote and line feed escaped.
 * @param {string} value
 */
export function escapeLabelValue(value) {
  return String(value).replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : `\\${c}`))
}

/** HELP text: backslash and line feed escaped. @param {string} text */
function escapeHelp(text) {
  return text.replace(/[\\\n]/g, (c) => (c === '\n' ? '\\n' : '\\\\'))
}

/** `grantedFromQueue` → `granted_from_queue`, restricted to a metric name's characters. */
function snakeCase(key) {
  return String(key)
    .replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)
    .replace(/[^a-zA-Z0-9_]/g, '_')
}

/** @param {number | bigint | null | undefined} v */
function toNumber(v) {
  return typeof v === 'bigint' ? Number(v) : Number(v ?? 0)
}

/** A sample value: integers exactly (bigints included), NaN and ±Inf in the format's spelling. */
function formatValue(v) {
  if (typeof v === 'bigint') return v.toString()
  const n = Number(v ?? 0)
  if (Number.isNaN(n)) return 'NaN'
  if (n === Infinity) return '+Inf'
  if (n === -Infinity) return '-Inf'
  return String(n)
}
