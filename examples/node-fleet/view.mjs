// What the fleet looks like from the outside: a monitor that listens to tokenwarden's events,
// reads `tw.metrics()` and the mock provider's counters, and draws either a live terminal view
// (a TTY: redrawn in place ~5×/s with ANSI escapes) or one compact status line a second.

import { agentIdFor } from 'tokenwarden'

// Each rate axis: its label, its index in a settlement's `used`, the limit's name, and the
// mock's bucket for it.
const AXES = [
  { axis: 'input_tokens', label: 'input tok/min', used: 0, limit: 'inputTokensPerMinute', level: 'inputTokens' },
  { axis: 'output_tokens', label: 'output tok/min', used: 1, limit: 'outputTokensPerMinute', level: 'outputTokens' },
  { axis: 'requests', label: 'requests/min', used: 3, limit: 'requestsPerMinute', level: 'requests' },
]
const WINDOW_MS = 60_000

/** Colours, or nothing when the output is not a terminal (or NO_COLOR is set). */
function palette(on) {
  const c = (code) => (on ? (s) => `\x1b[${code}m${s}\x1b[0m` : (s) => s)
  return {
    bold: c('1'),
    dim: c('2'),
    red: c('31'),
    green: c('32'),
    yellow: c('33'),
    blue: c('34'),
    magenta: c('35'),
    cyan: c('36'),
  }
}

/** 312400 → "312.4k". */
export function fmtK(n) {
  const v = Number(n)
  if (!Number.isFinite(v)) return '-'
  if (Math.abs(v) >= 1_000_000) return `${(v / 1_000_000).toFixed(2)}M`
  if (Math.abs(v) >= 10_000) return `${(v / 1000).toFixed(0)}k`
  if (Math.abs(v) >= 1000) return `${(v / 1000).toFixed(1)}k`
  return String(Math.round(v))
}

/** Seconds with one decimal. */
const secs = (ms) => `${(Math.max(0, ms) / 1000).toFixed(1)}s`

/** Visible length of a string with ANSI escapes. */
function visible(s) {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: ANSI escapes
  return s.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '').length
}

/** Cuts a string with ANSI escapes to `width` visible characters. */
function clip(s, width) {
  if (visible(s) <= width) return s
  let out = ''
  let n = 0
  for (let i = 0; i < s.length; i++) {
    if (s[i] === '\x1b') {
      const end = s.slice(i).search(/[A-Za-z]/)
      out += s.slice(i, i + end + 1)
      i += end
      continue
    }
    if (n >= width) continue
    out += s[i]
    n++
  }
  return `${out}\x1b[0m`
}

/** Pads a string with ANSI escapes to `width` visible characters. */
function pad(s, width) {
  const v = visible(s)
  return v >= width ? s : s + ' '.repeat(width - v)
}

/** Percentile of a sorted array. */
function percentile(sorted, p) {
  if (sorted.length === 0) return null
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]
}

export class Monitor {
  /**
   * @param {object} o
   * @param {import('tokenwarden').Tokenwarden} o.tw
   * @param {import('tokenwarden-testing/mock-provider').MockProvider} o.mock
   * @param {import('./fleet.mjs').Fleet} o.fleet
   * @param {{inputTokensPerMinute: number, outputTokensPerMinute: number, requestsPerMinute: number, concurrency: number}} o.limits
   * @param {'tty' | 'lines' | 'quiet'} o.mode
   * @param {NodeJS.WriteStream} o.out
   * @param {boolean} o.color
   */
  constructor({ tw, mock, fleet, limits, mode, out, color }) {
    this.tw = tw
    this.mock = mock
    this.fleet = fleet
    this.limits = limits
    this.mode = mode
    this.out = out
    this.c = palette(color)
    this.startedAt = tw.clock.now()
    this.byId = new Map(fleet.agents.map((a) => [agentIdFor(a.name), a]))
    this.settled = [] // { at, used: number[] } for the sliding minute
    this.waits = [] // ms each granted lease waited
    this.kindWaits = new Map() // agent kind → ms[]
    this.grantedAt = new Map() // agent id → driver ms
    this.queuedLeases = new Set() // tickets waiting in the queue
    this.waitingUntil = new Map() // agent id → { until, cause }
    this.counts = { granted: 0, fromQueue: 0, queued: 0, rejected: 0, waiting: 0, rateLimited: 0, expired: 0, alerts: 0 }
    this.marginLow = null
    this.recent = [] // notable events, newest last
    this.timer = null
    this.drawn = 0 // lines drawn last frame (TTY)
    this.subscribe()
  }

  now() {
    return this.tw.clock.now()
  }

  /** "12.3s" since the start. */
  stamp() {
    return `${((this.now() - this.startedAt) / 1000).toFixed(1)}s`
  }

  note(text) {
    this.recent.push(`${this.c.dim(this.stamp())} ${text}`)
    if (this.recent.length > 4) this.recent.shift()
  }

  nameOf(agent) {
    return this.byId.get(Number(agent))?.name ?? `agent ${agent}`
  }

  subscribe() {
    const { tw } = this
    tw.on('granted', (e) => {
      this.counts.granted++
      if (this.queuedLeases.delete(e.lease)) this.counts.fromQueue++
      this.waits.push(e.waitedMs)
      const kind = this.byId.get(Number(e.agent))?.spec.kind ?? 'other'
      if (!this.kindWaits.has(kind)) this.kindWaits.set(kind, [])
      this.kindWaits.get(kind).push(e.waitedMs)
      this.grantedAt.set(Number(e.agent), this.now())
    })
    tw.on('queued', (e) => {
      this.counts.queued++
      this.queuedLeases.add(e.lease)
    })
    tw.on('rejected', (e) => {
      this.counts.rejected++
      this.note(`${this.nameOf(e.agent)}: lease rejected (${e.reason.kind})`)
    })
    tw.on('waiting', (e) => {
      this.counts.waiting++
      this.waitingUntil.set(Number(e.agent), { until: this.now() + e.delayMs, cause: e.cause })
      this.note(`${this.nameOf(e.agent)}: ${e.message}`)
    })
    tw.on('rate_limited', (e) => {
      this.counts.rateLimited++
      const after = e.retryAfterMs === null ? '' : `, retry-after ${secs(e.retryAfterMs)}`
      this.note(this.c.red(`provider answered 429${after}`))
    })
    tw.on('settled', (e) => {
      const used = e.settlement.used.map(Number)
      this.settled.push({ at: this.now(), used })
    })
    tw.on('expired', (e) => {
      this.counts.expired++
      this.note(this.c.red(`${this.nameOf(e.agent)}: lease ${e.lease} expired unsettled`))
    })
    tw.on('margin_changed', (e) => {
      this.marginLow = Math.min(this.marginLow ?? e.fromPermille, e.toPermille)
      this.note(`margin ${(e.fromPermille / 10).toFixed(1)}% → ${(e.toPermille / 10).toFixed(1)}% (${e.reason.replace('_', ' ')})`)
    })
    tw.on('paused', (e) => {
      this.note(this.c.yellow(`pool paused for ${secs(Number(e.until) - this.now())} (new grants wait)`))
    })
    tw.on('estimate_alert', (e) => {
      this.counts.alerts++
      this.note(`${this.nameOf(e.agent)}: input estimates off by ${(e.errorPermille / 10).toFixed(0)}%`)
    })
  }

  /** Usage per axis over the last 60 s (input, output, tokens, requests), from settlements. */
  lastMinute() {
    const cutoff = this.now() - WINDOW_MS
    while (this.settled.length > 0 && this.settled[0].at < cutoff) this.settled.shift()
    const sum = [0, 0, 0, 0]
    for (const s of this.settled) for (let i = 0; i < 4; i++) sum[i] += s.used[i] ?? 0
    return sum
  }

  /** What each agent is doing now: `word` for the tallies, `text` (coloured) for the view. */
  agentState(agent, metricsById, now) {
    const { c } = this
    const id = agentIdFor(agent.name)
    if (agent.state === 'done') return { word: 'done', text: c.dim('done') }
    const w = this.waitingUntil.get(id)
    if (w !== undefined && w.until > now) {
      return { word: 'waiting', text: c.magenta(`waiting on rate limit ${secs(w.until - now)}`) }
    }
    if (agent.state === 'blocked') return { word: 'blocked', text: c.blue('blocked on planner') }
    if (agent.state === 'calling') {
      const activity = metricsById.get(id)?.activity
      if (activity?.state === 'queued') {
        return { word: 'queued', text: c.yellow(`queued ${secs(now - Number(activity.since))}`) }
      }
      if (activity?.state === 'in_flight') {
        const since = this.grantedAt.get(id) ?? now
        const how = agent.spec.call === 'json' ? '' : ' ≋'
        return { word: 'in_flight', text: c.green(`in flight ${secs(now - since)}${how}`) }
      }
    }
    return { word: 'idle', text: c.dim('idle') }
  }

  /** Filled/empty bar with a tick where the coordinator's capacity (limit × margin) ends. */
  bar(frac, width, markFrac) {
    const { c } = this
    const f = Math.max(0, Math.min(1, frac))
    const filled = Math.round(f * width)
    const mark = markFrac === null ? -1 : Math.min(width - 1, Math.round(markFrac * width))
    let s = ''
    for (let i = 0; i < width; i++) {
      if (i < filled) s += '█'
      else s += i === mark ? '┆' : '·'
    }
    const colour = frac >= 1 ? c.red : frac >= 0.85 ? c.yellow : c.green
    return `[${colour(s.slice(0, filled))}${c.dim(s.slice(filled))}]`
  }

  /** The lines of one frame. */
  frame(width, height) {
    const { c, tw, mock, fleet, limits } = this
    const m = tw.metrics()
    const pool = m.pools[0]
    const now = Number(m.now)
    const st = mock.stats()
    const metricsById = new Map(m.agents.map((a) => [Number(a.agent), a]))
    const minute = this.lastMinute()
    const lines = []

    const elapsed = secs(now - this.startedAt)
    const turns = Number.isFinite(fleet.turns) ? `${fleet.turns} turn${fleet.turns === 1 ? '' : 's'} each` : 'turns until the deadline'
    const left =
      fleet.deadline === null
        ? ''
        : fleet.stopping()
          ? c.dim(' (deadline passed)')
          : c.dim(` (deadline in ${secs(fleet.deadline - performance.now())})`)
    lines.push(
      `${c.bold('tokenwarden node-fleet')}  ${fleet.agents.length} agents on one key, ${turns}  ${c.dim(`mock at ${mock.url}`)}  ${c.bold(elapsed)}${left}`,
    )
    const paused = Number(pool.pausedUntil) > now ? c.yellow(`  paused ${secs(Number(pool.pausedUntil) - now)}`) : ''
    const binding = pool.bindingAxis ? `  binding: ${pool.bindingAxis}` : ''
    lines.push(
      `pool ${c.cyan(pool.name)}  margin ${c.bold(`${(pool.marginPermille / 10).toFixed(1)}%`)}  queue depth ${c.bold(String(pool.queueDepth))}  in flight ${pool.inFlight}/${pool.maxConcurrent ?? '∞'}${binding}${paused}`,
    )

    // Bars: how much of each provider bucket is spent right now (limit − what is left; the
    // buckets refill continuously), with a tick where tokenwarden's share (limit × margin) ends.
    const barWidth = Math.max(10, Math.min(40, width - 72))
    for (const a of AXES) {
      const axis = pool.axes.find((x) => x.axis === a.axis)
      const limit = limits[a.limit]
      const spent = limit - (st.levels[a.level] ?? limit)
      const mark = axis && Number(axis.limit) > 0 ? Number(axis.capacity) / Number(axis.limit) : null
      lines.push(
        `  ${a.label.padEnd(15)}${this.bar(spent / limit, barWidth, mark)} ${fmtK(spent).padStart(6)} / ${fmtK(limit).padEnd(5)} ${String(Math.round((spent / limit) * 100)).padStart(3)}%  ${c.dim(`sent in last 60 s ${fmtK(minute[a.used])}`)}`,
      )
    }
    const conc = Number(pool.inFlight)
    lines.push(
      `  ${'concurrency'.padEnd(15)}${this.bar(conc / limits.concurrency, barWidth, null)} ${String(conc).padStart(6)} / ${String(limits.concurrency).padEnd(5)} ${String(Math.round((conc / limits.concurrency) * 100)).padStart(3)}%  ${c.dim(`provider peak ${st.peakInFlight}`)}`,
    )
    const r429 = st.rejected429 > 0 ? c.red(String(st.rejected429)) : c.green('0')
    lines.push(
      `provider: ${st.admitted} calls admitted, 429s ${r429}, in flight ${st.inFlight}   ${c.dim('bars: bucket spent now; ┆ = limit × margin')}`,
    )

    // Agents, in one or two columns.
    const states = fleet.agents.map((a) => ({ agent: a, ...this.agentState(a, metricsById, now) }))
    const tally = { in_flight: 0, queued: 0, idle: 0, waiting: 0, blocked: 0, done: 0 }
    for (const s of states) tally[s.word]++
    let agent429 = 0
    let calls = 0
    for (const a of fleet.agents) {
      agent429 += a.rateLimitedErrors
      calls += a.ok
    }
    lines.push(
      `agents: ${c.green(`${tally.in_flight} in flight`)} · ${c.yellow(`${tally.queued} queued`)} · ${tally.idle} idle · ${c.magenta(`${tally.waiting} waiting`)} · ${c.blue(`${tally.blocked} blocked`)} · ${tally.done} done    calls ${calls}   429s seen by agents ${agent429 > 0 ? c.red(String(agent429)) : c.green('0')}`,
    )
    const colWidth = 60
    const columns = width >= colWidth * 2 + 2 ? 2 : 1
    const room = Math.max(1, height - lines.length - 6)
    const rows = Math.ceil(states.length / columns)
    const shown = Math.min(rows, room)
    const cell = (s) => {
      const a = s.agent
      // The turn it is on (or the last one, once done).
      const turn = a.state === 'calling' || a.state === 'blocked' ? a.turnsDone + 1 : a.turnsDone
      const total = Number.isFinite(fleet.turns) ? `${turn}/${fleet.turns}` : `${turn}`
      return pad(`  ${a.name.padEnd(11)}${c.dim(a.spec.kind.padEnd(9))}${pad(s.text, 28)}${c.dim('turn')} ${total}`, colWidth)
    }
    lines.push(c.dim('─'.repeat(Math.min(width - 1, colWidth * columns))))
    for (let r = 0; r < shown; r++) {
      let line = ''
      for (let col = 0; col < columns; col++) {
        const s = states[col * rows + r]
        if (s !== undefined) line += cell(s)
      }
      lines.push(line)
    }
    if (shown < rows) lines.push(c.dim(`  … ${(rows - shown) * columns} more agents (enlarge the terminal)`))
    lines.push(c.dim('─'.repeat(Math.min(width - 1, colWidth * columns))))
    const waits = [...this.waits].sort((x, y) => x - y)
    lines.push(
      `queue: ${this.counts.fromQueue} of ${this.counts.granted} grants came from the queue, wait p50 ${secs(percentile(waits, 50) ?? 0)} p95 ${secs(percentile(waits, 95) ?? 0)}  ·  retries ${this.counts.waiting}  ·  rejected ${this.counts.rejected}`,
    )
    for (const r of this.recent.slice(-3)) lines.push(`  ${r}`)
    return lines.map((l) => clip(l, width - 1))
  }

  /** One compact status line (non-TTY). */
  statusLine() {
    const { tw, mock, fleet, limits } = this
    const m = tw.metrics()
    const pool = m.pools[0]
    const now = Number(m.now)
    const metricsById = new Map(m.agents.map((a) => [Number(a.agent), a]))
    const tally = { in_flight: 0, queued: 0, idle: 0, waiting: 0, blocked: 0, done: 0 }
    for (const a of fleet.agents) tally[this.agentState(a, metricsById, now).word]++
    const st = mock.stats()
    const spent = (limit, level) => limit - (st.levels[level] ?? limit)
    let calls = 0
    let agent429 = 0
    for (const a of fleet.agents) {
      calls += a.ok
      agent429 += a.rateLimitedErrors
    }
    const t = `${Math.round((now - this.startedAt) / 1000)}s`.padStart(4)
    return (
      `[${t}] agents: ${tally.in_flight} in flight, ${tally.queued} queued, ${tally.idle} idle, ` +
      `${tally.waiting} waiting, ${tally.blocked} blocked, ${tally.done} done | ` +
      `spent: in ${fmtK(spent(limits.inputTokensPerMinute, 'inputTokens'))}/${fmtK(limits.inputTokensPerMinute)} ` +
      `out ${fmtK(spent(limits.outputTokensPerMinute, 'outputTokens'))}/${fmtK(limits.outputTokensPerMinute)} ` +
      `req ${Math.round(spent(limits.requestsPerMinute, 'requests'))}/${limits.requestsPerMinute} ` +
      `conc ${pool.inFlight}/${limits.concurrency} | ` +
      `queue ${pool.queueDepth} margin ${(pool.marginPermille / 10).toFixed(1)}% | ` +
      `calls ${calls} provider 429s ${st.rejected429} agent 429s ${agent429}`
    )
  }

  draw() {
    if (this.mode === 'tty') {
      const width = this.out.columns || 120
      const height = this.out.rows || 50
      const lines = this.frame(width, height)
      let s = this.drawn > 0 ? `\x1b[${this.drawn}F` : ''
      for (const l of lines) s += `${l}\x1b[K\n`
      s += '\x1b[J'
      this.out.write(s)
      this.drawn = lines.length
    } else if (this.mode === 'lines') {
      this.out.write(`${this.statusLine()}\n`)
    }
  }

  start() {
    if (this.mode === 'quiet') return
    if (this.mode === 'tty') this.out.write('\x1b[?25l') // hide the cursor while redrawing
    this.draw()
    this.timer = setInterval(() => this.draw(), this.mode === 'tty' ? 200 : 1000)
  }

  /** Draws the last frame and restores the cursor. */
  stop() {
    if (this.timer !== null) clearInterval(this.timer)
    this.timer = null
    if (this.mode === 'quiet') return
    this.draw()
    if (this.mode === 'tty') this.out.write('\x1b[?25h')
  }

  /** Queue waits by agent kind, in fleet order: [kind, calls, average ms, longest ms]. */
  waitsByKind() {
    const kinds = [...new Set(this.fleet.agents.map((a) => a.spec.kind))]
    return kinds
      .filter((k) => this.kindWaits.has(k))
      .map((k) => {
        const list = this.kindWaits.get(k)
        return [k, list.length, list.reduce((x, y) => x + y, 0) / list.length, Math.max(...list)]
      })
  }

  /** p50 / p95 of every grant's queue wait, ms. */
  waitPercentiles() {
    const waits = [...this.waits].sort((x, y) => x - y)
    return { p50: percentile(waits, 50), p95: percentile(waits, 95) }
  }
}
