// The live dashboard of one quota of one fleet: a self-contained HTML page (inline CSS and
// script, no external resource) that holds no data itself. It asks for the fleet's bearer
// secret, keeps it in sessionStorage only, polls the quota's metrics endpoint with it every
// 2 s and renders the JSON it gets (the coordinator's `Metrics`, camelCase keys).
//
// The inline script and style never change (the fleet, quota and metrics path reach the
// script through `data-*` attributes), so the page runs under a hash-based Content Security
// Policy: serve it with `dashboardCsp()` as the `Content-Security-Policy` header.
//
// For tests, everything shown is also in `data-*` attributes with the raw figures:
//   #app              data-state (locked | loading | live | error), data-polls, data-fleet,
//                     data-quota, data-metrics-path, data-stale
//   #error            data-status (HTTP status, or "network"), visible only on failure
//   #summary          data-now, data-live-leases, data-pools, data-agents, data-agents-idle,
//                     data-agents-in-flight, data-agents-queued, data-agents-alerting
//   section.pool      id pool-<index>, data-pool, data-margin-permille, data-queue-depth,
//                     data-in-flight, data-max-concurrent, data-paused, data-paused-until,
//                     data-queue-wait-p50-ms, data-queue-wait-p95-ms, data-binding-axis,
//                     data-rate-limited-minutes (comma-separated minute numbers),
//                     data-rate-limited (429s over those minutes)
//   .axis             id pool-<index>-<axis>, data-pool, data-axis, data-limit, data-capacity,
//                     data-available, data-used (last complete minute), data-used-permille,
//                     data-used-current-minute
//     svg.chart       rect.bar (data-minute, data-used; up to the limit), rect.burst (data-minute,
//                     data-above: the part of a minute above the limit), line.limit (data-limit),
//                     line.capacity, .rl-marker (data-minute, data-rate-limited)
//   tr.counter        data-counter (camelCase key), data-value
//   .fleet-advice     data-axis, data-per-agent-per-minute, data-agents-measured,
//                     data-agents-at-75-percent
//   #agents           data-agents (count); tr.agent: data-agent (id), data-agent-name, data-state,
//                     data-family (the root's id, on a family's root and its members),
//                     data-family-name (a member's root), data-family-members and
//                     data-family-busy (on a family's root); a root's members follow it
//                     (idle | in_flight | queued | refused | rate_limited | backing_off),
//                     data-queued-since, data-queued-ms, data-expected-grant, data-until,
//                     data-wait-remaining-ms, data-axis (a 429's limit), data-in-flight,
//                     data-queued, data-settled, data-input-error-permille,
//                     data-output-error-permille, data-alerting, data-repeat-failures,
//                     data-last-seen; td.state the state in words, times relative to now
//   #agents-empty     visible only when the live metrics have no agent; #signin-help only
//                     while locked (how to sign in, where the fleet secret is)
//   .ceilings         per pool: data-rate-limited-by (axis=n,…), data-rejected-by (reason=n,…)
//   #overlay          the 429-vs-turn chart from the timeline endpoint: data-status (ok, or the
//                     HTTP status / "network"), data-events, data-from, data-to, data-rows;
//                     svg#timeline-chart: g.tl-row (data-agent-name, data-sends, data-429s,
//                     data-waits), in it rect.tl-send (data-t), rect.tl-wait (data-kind queued |
//                     refused | backoff, data-from, data-to, data-open), path.tl-429 (data-t,
//                     data-exceeded); rect.tl-minute (data-minute, data-rate-limited)
//   #events           recent 429s and refusals, newest first: tr.event data-kind (rate_limited
//                     | refused), data-t, data-agent-name, data-exceeded, data-reason, data-axis
// An attribute whose figure is unknown (null) is left out.

const STYLE = `
:root { color-scheme: light dark; --fg: #1b1f24; --muted: #5b6470; --bg: #f6f7f9; --card: #fff;
  --line: #d7dbe0; --bar: #3b82f6; --bar-now: #93c5fd; --limit: #1b1f24; --cap: #d97706;
  --bad: #dc2626; --ok: #15803d; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6e8eb; --muted: #9aa4b1; --bg: #111418;
  --card: #1a1e24; --line: #2c323a; --bar: #60a5fa; --bar-now: #1e3a5f; --limit: #e6e8eb;
  --cap: #f59e0b; --bad: #f87171; --ok: #4ade80; } }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); }
main { max-width: 1200px; margin: 0 auto; padding: 16px; }
h1 { font-size: 20px; margin: 0 0 4px; overflow-wrap: anywhere; }
h2 { font-size: 16px; margin: 0 0 8px; overflow-wrap: anywhere; }
h3 { font-size: 13px; margin: 0; font-weight: 600; }
.muted, small { color: var(--muted); font-weight: normal; }
#status { margin: 0 0 8px; color: var(--muted); }
#error { margin: 0 0 8px; padding: 6px 10px; border-radius: 6px; color: #fff; background: var(--bad); }
[hidden] { display: none !important; }
form#secret-form { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 8px 0 16px; }
input, button { font: inherit; padding: 5px 10px; border-radius: 6px; border: 1px solid var(--line);
  background: var(--card); color: var(--fg); }
input { min-width: 260px; }
button { cursor: pointer; }
#toolbar { margin: 0 0 12px; }
#summary { display: flex; gap: 16px; flex-wrap: wrap; margin: 0 0 12px; }
#summary span b { font-variant-numeric: tabular-nums; }
.pool, .agents-card, .tasks-card { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 12px 14px; margin: 0 0 14px; }
.badge { display: inline-block; font-size: 12px; padding: 1px 8px; border-radius: 10px;
  border: 1px solid var(--line); margin-left: 6px; font-weight: 600; vertical-align: 2px; }
.badge.bad { background: var(--bad); border-color: var(--bad); color: #fff; }
.badge.ok { color: var(--ok); }
dl.stats { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 8px;
  margin: 0 0 10px; }
dl.stats div { border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; }
dt { color: var(--muted); font-size: 12px; }
dd { margin: 0; font-size: 16px; font-variant-numeric: tabular-nums; }
meter { width: 100%; height: 8px; }
.axes { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 10px;
  margin: 0 0 10px; }
.axis { border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; }
.axis.ungated { opacity: .7; }
svg.chart { display: block; width: 100%; height: auto; margin-top: 4px; }
svg.chart .bar { fill: var(--bar); }
svg.chart .bar.current { fill: var(--bar-now); }
svg.chart .bar.rl { fill: var(--bad); }
svg.chart .burst { fill: var(--bar); fill-opacity: .35; stroke: var(--bar); stroke-dasharray: 2 2; }
svg.chart .rl-marker { fill: var(--bad); }
svg.chart .limit { stroke: var(--limit); stroke-width: 1.5; }
svg.chart .capacity { stroke: var(--cap); stroke-width: 1; stroke-dasharray: 4 3; }
svg.chart .frame { stroke: var(--line); stroke-width: 1; }
svg.chart text { fill: var(--muted); font-size: 10px; }
svg.chart text.limit-label { fill: var(--limit); }
.row { display: flex; gap: 14px; flex-wrap: wrap; align-items: flex-start; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 3px 10px 3px 0; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { color: var(--muted); font-weight: 600; font-size: 12px; }
table.counters th { color: var(--fg); font-weight: normal; font-size: 13px; }
tr.agent.alerting td { color: var(--bad); }
tr.agent[data-state="queued"] td.state { color: var(--cap); font-weight: 600; }
tr.agent[data-state="rate_limited"] td.state, tr.agent[data-state="refused"] td.state,
  tr.agent[data-state="backing_off"] td.state { color: var(--bad); font-weight: 600; }
tr.agent[data-state="in_flight"] td.state { color: var(--ok); }
.help { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px;
  margin: 0 0 14px; max-width: 820px; }
.help p { margin: 0 0 6px; }
.help ul { margin: 0 0 6px; padding-left: 20px; }
code { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--bg);
  padding: 0 3px; border-radius: 3px; overflow-wrap: anywhere; }
.ceilings { margin: 0 0 10px; }
.overlay-card { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 12px 14px; margin: 0 0 14px; }
.legend { display: flex; gap: 14px; flex-wrap: wrap; margin: 0 0 6px; font-size: 12px; color: var(--muted); }
.legend i { display: inline-block; width: 14px; height: 9px; margin-right: 4px; vertical-align: 0; border-radius: 2px; }
.legend i.k-send { background: #1d4ed8; width: 3px; }
.legend i.k-queued { background: var(--cap); opacity: .55; }
.legend i.k-refused { background: #a855f7; opacity: .55; }
.legend i.k-backoff { background: var(--bad); opacity: .3; }
.legend i.k-429 { background: var(--bad); width: 9px; }
svg.timeline { display: block; width: 100%; height: auto; }
svg.timeline text { fill: var(--muted); font-size: 11px; }
svg.timeline text.row-label { fill: var(--fg); }
svg.timeline .grid { stroke: var(--line); stroke-width: 1; }
svg.timeline .row-bg { fill: var(--bg); }
svg.timeline .tl-send { fill: #1d4ed8; }
svg.timeline .tl-wait[data-kind="queued"] { fill: var(--cap); opacity: .55; }
svg.timeline .tl-wait[data-kind="refused"] { fill: #a855f7; opacity: .55; }
svg.timeline .tl-wait[data-kind="backoff"] { fill: var(--bad); opacity: .3; }
svg.timeline .tl-retry { stroke: var(--bad); stroke-width: 1; stroke-dasharray: 2 2; }
svg.timeline .tl-429 { fill: var(--bad); }
svg.timeline .tl-minute { fill: var(--bad); }
svg.timeline .tl-minute-label { fill: var(--bad); font-weight: 600; }
svg.timeline .now { stroke: var(--fg); stroke-width: 1; stroke-dasharray: 3 3; }
table.events td.what { white-space: normal; }
.fleet-advice { margin: 0; max-width: 520px; }
.scroll { overflow-x: auto; }
`

// Runs in the browser. Static: it reads its settings from #app's data-* attributes.
const SCRIPT = `
(() => {
  'use strict'
  const AXES = ['input_tokens', 'output_tokens', 'tokens', 'requests']
  // Why the margin last moved (the core's MarginReason), as the page says it.
  const MARGIN_REASONS = {
    rate_limited: 'cut by a 429',
    recovered: 'recovering after a 429',
    confirmed: "raised: estimates and the provider's headers agree",
    headers_disagreed: 'back to its start: the provider showed less room than the model',
  }
  const SVG = 'http://www.w3.org/2000/svg'
  const MINUTE = 60000
  const MAX_AGENT_ROWS = 1000
  const $ = (id) => document.getElementById(id)
  const app = $('app')
  const fleet = app.dataset.fleet || ''
  const path = app.dataset.metricsPath || ''
  const timelinePath = app.dataset.timelinePath || ''
  const interval = Number(app.dataset.intervalMs) || 2000
  const storageKey = 'tokenwarden.dashboard.secret:' + fleet
  const form = $('secret-form')
  const input = $('secret')
  const toolbar = $('toolbar')
  const errorLine = $('error')
  const statusLine = $('status')
  let url = null
  try { url = new URL(path, location.href) } catch (e) { url = null }
  let timelineUrl = null
  try { timelineUrl = timelinePath ? new URL(timelinePath, location.href) : null } catch (e) { timelineUrl = null }
  if (timelineUrl && timelineUrl.origin !== location.origin) timelineUrl = null
  let generation = 0
  let timer = null
  let polls = 0

  const store = {
    get() { try { return sessionStorage.getItem(storageKey) || '' } catch (e) { return '' } },
    set(v) { try { sessionStorage.setItem(storageKey, v) } catch (e) { /* storage off: this page only */ } },
    clear() { try { sessionStorage.removeItem(storageKey) } catch (e) { /* nothing kept */ } },
  }
  let memorySecret = ''
  const secret = () => store.get() || memorySecret

  // DOM helpers: text goes in as text nodes, attributes through setAttribute, so nothing
  // from the metrics is ever parsed as markup.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag)
    return fill(node, attrs, children)
  }
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag)
    return fill(node, attrs, children)
  }
  function fill(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue
      node.setAttribute(k, String(v))
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue
      node.append(typeof c === 'object' ? c : document.createTextNode(String(c)))
    }
    return node
  }
  const n = (v) => (v === null || v === undefined ? null : Number(v))
  const nf = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 })
  const int = (v) => (v === null || v === undefined ? '–' : nf.format(Number(v)))
  const pct = (permille) => (Number(permille) / 10).toFixed(1) + ' %'
  function dur(ms) {
    if (ms === null || ms === undefined) return '–'
    ms = Number(ms)
    if (ms < 1000) return Math.round(ms) + ' ms'
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s'
    const s = Math.round(ms / 1000)
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s'
    return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min'
  }
  const pad = (x) => String(x).padStart(2, '0')
  function clock(ms) {
    const d = new Date(Number(ms))
    return pad(d.getHours()) + ':' + pad(d.getMinutes())
  }
  function clockSeconds(ms) {
    const d = new Date(Number(ms))
    return clock(ms) + ':' + pad(d.getSeconds())
  }
  function short(v) {
    v = Number(v)
    if (Math.abs(v) >= 1e9) return +(v / 1e9).toFixed(1) + 'G'
    if (Math.abs(v) >= 1e6) return +(v / 1e6).toFixed(1) + 'M'
    if (Math.abs(v) >= 1e4) return +(v / 1e3).toFixed(1) + 'k'
    return String(Math.round(v))
  }
  const words = (key) => key.replace(/[A-Z]/g, (c) => ' ' + c.toLowerCase()).replace(/_/g, ' ')

  function showError(text, status) {
    errorLine.textContent = text
    errorLine.setAttribute('data-status', String(status))
    errorLine.hidden = false
  }
  function clearError() {
    errorLine.hidden = true
    errorLine.textContent = ''
    errorLine.removeAttribute('data-status')
  }
  function setState(state) { app.setAttribute('data-state', state) }

  function lock() {
    generation++
    clearTimeout(timer)
    // Nothing read with a secret stays on screen once it is gone.
    polls = 0
    app.removeAttribute('data-polls')
    app.removeAttribute('data-stale')
    const summary = $('summary')
    summary.replaceChildren()
    for (const a of [...summary.attributes]) if (a.name.startsWith('data-')) summary.removeAttribute(a.name)
    $('pools').replaceChildren()
    $('agents-body').replaceChildren()
    $('agents').setAttribute('data-agents', '0')
    // Nothing is known about the agents before sign-in: no "No agents yet".
    $('agents-empty').hidden = true
    $('agents-locked').hidden = false
    $('signin-help').hidden = false
    clearOverlay()
    form.hidden = false
    toolbar.hidden = true
    setState('locked')
    statusLine.textContent = 'Enter the fleet secret to load live metrics.'
    input.focus()
  }
  function start() {
    generation++
    clearTimeout(timer)
    form.hidden = true
    toolbar.hidden = false
    $('signin-help').hidden = true
    $('agents-locked').hidden = true
    setState('loading')
    statusLine.textContent = 'Loading metrics…'
    poll(generation)
  }

  async function poll(gen) {
    const key = secret()
    if (!key) return lock()
    const abort = new AbortController()
    const timeout = setTimeout(() => abort.abort(), 10000)
    try {
      const res = await fetch(url, {
        method: 'GET',
        headers: { authorization: 'Bearer ' + key, accept: 'application/json' },
        cache: 'no-store',
        credentials: 'omit',
        referrerPolicy: 'no-referrer',
        signal: abort.signal,
      })
      if (gen !== generation) return
      if (res.status === 401) {
        store.clear()
        memorySecret = ''
        lock()
        showError('wrong secret: the metrics endpoint answered 401. Enter the fleet secret again.', 401)
        return
      }
      if (!res.ok) {
        let detail = ''
        try { detail = (await res.text()).slice(0, 200) } catch (e) { detail = '' }
        const what = res.status === 403 ? 'forbidden' : res.status === 404 ? 'no such fleet or quota' : 'metrics request failed'
        throw Object.assign(new Error(what + ' (HTTP ' + res.status + ')' + (detail ? ': ' + detail : '')), { status: res.status })
      }
      const body = await res.json()
      const metrics = body && Array.isArray(body.pools) ? body : body && body.metrics
      if (!metrics || !Array.isArray(metrics.pools)) throw Object.assign(new Error('the metrics endpoint answered an unexpected shape'), { status: 'format' })
      if (gen !== generation) return
      const tl = await fetchTimeline(key)
      if (gen !== generation) return
      render(metrics, tl)
      clearError()
      app.removeAttribute('data-stale')
    } catch (e) {
      if (gen !== generation) return
      const status = e && e.status ? e.status : 'network'
      const text = status === 'network' ? 'metrics fetch failed: ' + (e && e.name === 'AbortError' ? 'timed out' : (e && e.message) || String(e)) : e.message
      showError(text, status)
      if (polls > 0) app.setAttribute('data-stale', 'true')
      else setState('error')
    } finally {
      clearTimeout(timeout)
    }
    if (gen === generation) timer = setTimeout(() => poll(gen), interval)
  }

  // The recent call events (GET …/timeline): { status, body } — a failure here leaves the
  // metrics on screen and says so in the overlay.
  async function fetchTimeline(key) {
    if (!timelineUrl) return { status: 'none', body: null }
    const abort = new AbortController()
    const timeout = setTimeout(() => abort.abort(), 10000)
    try {
      const res = await fetch(timelineUrl, {
        method: 'GET',
        headers: { authorization: 'Bearer ' + key, accept: 'application/json' },
        cache: 'no-store',
        credentials: 'omit',
        referrerPolicy: 'no-referrer',
        signal: abort.signal,
      })
      if (!res.ok) return { status: String(res.status), body: null }
      const body = await res.json()
      if (!body || !Array.isArray(body.events)) return { status: 'format', body: null }
      return { status: 'ok', body }
    } catch (e) {
      return { status: 'network', body: null }
    } finally {
      clearTimeout(timeout)
    }
  }

  function render(m, tl) {
    const now = n(m.now) || 0
    const agents = Array.isArray(m.agents) ? m.agents : []
    const count = { idle: 0, in_flight: 0, queued: 0, refused: 0, rate_limited: 0, backing_off: 0 }
    for (const a of agents) {
      const s = a && a.activity && a.activity.state
      count[s] = (count[s] || 0) + 1
    }
    const alerting = agents.filter((a) => a.alerting === true).length
    const summary = $('summary')
    summary.replaceChildren()
    fill(summary, {
      'data-now': now,
      'data-live-leases': n(m.liveLeases),
      'data-pools': m.pools.length,
      'data-agents': agents.length,
      'data-agents-idle': count.idle,
      'data-agents-in-flight': count.in_flight,
      'data-agents-queued': count.queued,
      'data-agents-refused': count.refused,
      'data-agents-rate-limited': count.rate_limited,
      'data-agents-backing-off': count.backing_off,
      'data-agents-alerting': alerting,
    }, [
      el('span', { id: 'live-leases' }, 'Live leases ', el('b', {}, int(m.liveLeases))),
      el('span', {}, 'Agents ', el('b', {}, int(agents.length)), ' (', int(count.in_flight), ' in flight, ',
        el('b', {}, int(count.queued + count.refused + count.rate_limited + count.backing_off)), ' waiting: ',
        int(count.queued), ' queued, ', int(count.rate_limited), ' rate-limited, ', int(count.refused), ' refused, ', int(count.backing_off), ' backing off; ',
        int(count.idle), ' idle)'),
      alerting ? el('span', { class: 'alerting' }, 'Estimate alerts ', el('b', {}, int(alerting))) : null,
      el('span', { class: 'muted' }, 'Metrics at ', clockSeconds(now)),
    ])
    renderTasks(m.tasks)
    const ceilings = m.ceilings && Array.isArray(m.ceilings.pools) ? m.ceilings.pools : []
    $('pools').replaceChildren(...m.pools.map((p, i) => renderPool(p, i, now, ceilings.find((c) => c && c.pool === p.name) || null)))
    const events = tl && tl.body ? tl.body.events : []
    renderAgents(agents, now, events)
    renderOverlay(m, agents, tl)
    renderEvents(events)
    polls++
    app.setAttribute('data-polls', String(polls))
    setState('live')
    statusLine.textContent = 'Live: refreshed every ' + interval / 1000 + ' s; last update ' + clockSeconds(Date.now()) + '.'
  }

  // Seed 003's four numbers: 429 rate, tokens per merged task, task time (p50/p95 since
  // start, mean per minute) and critical-path wait; since start and the last minute.
  function renderTasks(t) {
    const box = $('tasks')
    if (!t) {
      box.hidden = true
      return
    }
    box.hidden = false
    const s = t.sinceStart || {}
    const l = t.lastMinute || {}
    const rate = (f) => (f.rateLimitedPermille === null || f.rateLimitedPermille === undefined ? '–' : pct(f.rateLimitedPermille))
    const tokens = (f) => (f.tokensPerMergedTask === null || f.tokensPerMergedTask === undefined ? '–' : int(f.tokensPerMergedTask) + ' (' + int(f.rateLimitedTokensPerMergedTask) + ')')
    const row = (label, a, b, key) => el('tr', { 'data-figure': key }, el('th', { scope: 'row' }, label), el('td', {}, a), el('td', {}, b))
    fill(box, {
      'data-open': n(t.open),
      'data-merged': n(s.merged),
      'data-tokens-per-merged-task': n(s.tokensPerMergedTask),
      'data-rate-limited-tokens-per-merged-task': n(s.rateLimitedTokensPerMergedTask),
      'data-task-time-p50-ms': n(s.taskTimeP50Ms),
      'data-task-time-p95-ms': n(s.taskTimeP95Ms),
      'data-critical-path-wait-ms': n(s.criticalPathWaitMs),
      'data-rate-limited-permille': n(s.rateLimitedPermille),
    }, [])
    $('tasks-body').replaceChildren(
      row('429 rate', rate(s), rate(l), 'rate'),
      row('Tokens per merged task (against the limits)', tokens(s), tokens(l), 'tokens'),
      row('Task time', s.taskTimeP50Ms === null || s.taskTimeP50Ms === undefined ? '–' : 'p50 ' + dur(s.taskTimeP50Ms) + ', p95 ' + dur(s.taskTimeP95Ms), l.taskTimeMeanMs === null || l.taskTimeMeanMs === undefined ? '–' : 'mean ' + dur(l.taskTimeMeanMs), 'time'),
      row('Critical-path wait', dur(s.criticalPathWaitMs), dur(l.criticalPathWaitMs), 'critical'),
      row('Tasks ended', int(s.merged) + ' merged, ' + int(s.abandoned) + ' abandoned, ' + int(s.failed) + ' failed', int(l.merged) + ' merged, ' + int(l.abandoned) + ' abandoned, ' + int(l.failed) + ' failed', 'ended'),
    )
    $('tasks-open').textContent = int(t.open) + ' open' + (Number(t.untracked) > 0 ? ', ' + int(t.untracked) + ' requests untracked (task table full)' : '')
  }

  function renderPool(p, index, now, ceiling) {
    const id = 'pool-' + index
    const minutes = Array.isArray(p.minutes) ? p.minutes : []
    const limited = minutes.filter((x) => Number(x.rateLimited) > 0)
    const pausedUntil = n(p.pausedUntil) || 0
    const paused = pausedUntil > now
    const maxConcurrent = n(p.maxConcurrent)
    const counters = p.counters || {}
    const section = el('section', {
      class: 'pool' + (paused ? ' paused' : ''),
      id,
      'data-pool': p.name,
      'data-margin-permille': n(p.marginPermille),
      'data-queue-depth': n(p.queueDepth),
      'data-in-flight': n(p.inFlight),
      'data-max-concurrent': maxConcurrent,
      'data-paused': paused ? 'true' : 'false',
      'data-paused-until': pausedUntil,
      'data-queue-wait-p50-ms': n(p.queueWaitP50Ms),
      'data-queue-wait-p95-ms': n(p.queueWaitP95Ms),
      'data-binding-axis': p.bindingAxis,
      'data-rate-limited-minutes': limited.map((x) => Number(x.minute)).join(','),
      'data-rate-limited': limited.reduce((s, x) => s + Number(x.rateLimited), 0),
      'data-margin-at-floor-since': n(p.marginAtFloorSince),
    })
    // The margin stuck at its floor: 429s keep coming although the leases stay under the
    // limits, so something outside the coordinator is using the key.
    const floorSince = n(p.marginAtFloorSince)
    section.append(el('h2', {},
      'Pool ', el('span', { class: 'pool-name' }, p.name),
      paused ? el('span', { class: 'badge bad paused-badge' }, 'paused ' + dur(pausedUntil - now)) : el('span', { class: 'badge ok' }, 'granting'),
      p.bindingAxis ? el('span', { class: 'badge' }, 'binding: ' + p.bindingAxis) : null,
      floorSince !== null ? el('span', { class: 'badge bad floor-badge', title: 'the margin has sat at its floor: something outside the coordinator may be using this key' }, 'margin at floor ' + dur(now - floorSince)) : null,
    ))
    const stat = (name, label, ...value) => el('div', { 'data-stat': name }, el('dt', {}, label), el('dd', { id: id + '-' + name }, ...value))
    section.append(el('dl', { class: 'stats' },
      stat('queue-depth', 'Queue depth', int(p.queueDepth)),
      stat('in-flight', 'In flight / max concurrent', int(p.inFlight), ' / ', maxConcurrent === null ? 'unknown' : int(maxConcurrent),
        maxConcurrent ? el('meter', { min: 0, max: maxConcurrent, value: Math.min(Number(p.inFlight), maxConcurrent), 'aria-label': 'in flight' }) : null),
      stat('margin', 'Margin (share of limit granted)', pct(p.marginPermille), p.marginReason ? el('span', { class: 'why', 'data-margin-reason': p.marginReason }, ' — ' + (MARGIN_REASONS[p.marginReason] ?? p.marginReason)) : null),
      stat('paused', 'Paused', paused ? 'until ' + clockSeconds(pausedUntil) + ' (' + dur(pausedUntil - now) + ')' : 'no'),
      stat('queue-wait', 'Queue wait p50 / p95', dur(n(p.queueWaitP50Ms)), ' / ', dur(n(p.queueWaitP95Ms))),
      stat('rate-limited', '429s in the kept minutes', int(limited.reduce((s, x) => s + Number(x.rateLimited), 0))),
    ))
    // The ceilings hit: 429s by the limit the provider named, refusals by reason and axis.
    const rl = ceiling && ceiling.rateLimited ? Object.entries(ceiling.rateLimited) : []
    const rj = ceiling && ceiling.rejected ? Object.entries(ceiling.rejected) : []
    const list = (entries, word) => entries.length === 0 ? 'none' : entries.sort((a, b) => b[1] - a[1]).map(([k, v]) => int(v) + ' × ' + word(k)).join(', ')
    section.append(el('p', {
      class: 'ceilings',
      'data-rate-limited-by': rl.map(([k, v]) => k + '=' + v).join(','),
      'data-rejected-by': rj.map(([k, v]) => k + '=' + v).join(','),
    }, el('b', {}, 'Ceilings hit'), el('small', {}, ' (since the limiter started)'), ': 429s ', list(rl, (k) => k === 'unknown' ? 'limit not named' : words(k)),
      ' · refusals ', list(rj, refusalWords)))
    const axes = Array.isArray(p.axes) ? p.axes : []
    section.append(el('div', { class: 'axes' }, axes.map((a) => renderAxis(p, a, id, minutes, now))))
    const counterRows = Object.keys(counters).map((k) =>
      el('tr', { class: 'counter', 'data-counter': k, 'data-value': n(counters[k]) }, el('th', {}, words(k)), el('td', {}, int(counters[k]))))
    const f = p.fleet
    const advice = f
      ? el('p', {
          class: 'fleet-advice',
          'data-axis': f.axis,
          'data-per-agent-per-minute': n(f.perAgentPerMinute),
          'data-agents-measured': n(f.agentsMeasured),
          'data-agents-at-75-percent': n(f.agentsAt75Percent),
        }, 'About ', el('b', {}, int(f.agentsAt75Percent)), ' agents like the ', int(f.agentsMeasured),
          ' measured fit at 75 % of the ', f.axis, ' limit (each wants ', int(f.perAgentPerMinute), ' ', f.axis, ' a minute: served ', int(f.servedPerAgentPerMinute ?? f.perAgentPerMinute), ', waiting ', int(Math.round(Number(f.waitingPermille ?? 0) / 10)), ' % of the time).')
      : el('p', { class: 'fleet-advice muted' }, 'No fleet advice yet: it needs settled usage in complete minutes against a known limit.')
    section.append(el('div', { class: 'row' },
      el('div', {}, el('h3', {}, 'Counters since start'), el('table', { class: 'counters' }, el('tbody', {}, counterRows))),
      el('div', {}, el('h3', {}, 'Fleet advice'), advice),
    ))
    return section
  }

  function renderAxis(p, a, poolId, minutes, now) {
    const axisIndex = AXES.indexOf(a.axis)
    const limit = n(a.limit)
    const gated = limit !== null
    const current = Math.floor(now / MINUTE)
    const currentStats = minutes.find((x) => Number(x.minute) === current)
    const usedNow = currentStats && axisIndex >= 0 ? Number(currentStats.used[axisIndex]) : 0
    const box = el('div', {
      class: 'axis' + (gated ? '' : ' ungated'),
      id: poolId + '-' + a.axis,
      'data-pool': p.name,
      'data-axis': a.axis,
      'data-limit': limit,
      'data-capacity': gated ? n(a.capacity) : null,
      'data-available': gated ? n(a.available) : null,
      'data-used': n(a.lastMinute),
      'data-used-permille': gated ? n(a.lastMinutePermille) : null,
      'data-used-current-minute': usedNow,
    })
    // The running minute and the last complete one, each named: a bar drawn for this minute
    // is never read against the last one's figure.
    const burst = gated && Number(a.lastMinutePermille) > 1000 ? ' — above the limit: a burst from a full bucket, which the provider allows' : ''
    box.append(el('h3', {}, a.axis, ' ',
      el('small', { class: 'minutes' }, gated
        ? 'this minute so far ' + int(usedNow) + ' · last complete minute ' + int(a.lastMinute) + ' / ' + int(limit) + ' (' + pct(a.lastMinutePermille) + ')' + burst + ' · capacity ' + int(a.capacity) + ' · available ' + int(a.available)
        : 'limit unknown · this minute so far ' + int(usedNow) + ' · last complete minute ' + int(a.lastMinute))))
    box.append(chart(minutes, axisIndex, limit, gated ? n(a.capacity) : null, current, p.name + ' ' + a.axis))
    return box
  }

  // Usage per minute as bars, the limit as a line (the capacity, limit × margin, dashed),
  // minutes with a 429 in red with a marker on top. The last bar is the current minute.
  function chart(minutes, axisIndex, limit, capacity, current, label) {
    const W = 600, H = 150, left = 6, right = 56, top = 14, bottom = 18
    const plotW = W - left - right, plotH = H - top - bottom
    const first = minutes.length ? Math.min(Number(minutes[0].minute), current) : current
    const span = Math.max(15, Math.min(60, current - first + 1))
    const start = current - span + 1
    const byMinute = new Map(minutes.map((x) => [Number(x.minute), x]))
    let peak = 0
    for (let k = start; k <= current; k++) {
      const x = byMinute.get(k)
      if (x && axisIndex >= 0) peak = Math.max(peak, Number(x.used[axisIndex]))
    }
    const yMax = Math.max(peak, limit || 0, 1) * 1.1
    const y = (v) => top + plotH - (Math.max(0, v) / yMax) * plotH
    const slot = plotW / span
    const root = svg('svg', { class: 'chart', viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': label + ': usage per minute' })
    root.append(svg('line', { class: 'frame', x1: left, x2: left + plotW, y1: top + plotH, y2: top + plotH }))
    for (let k = start; k <= current; k++) {
      const x = byMinute.get(k)
      const used = x && axisIndex >= 0 ? Number(x.used[axisIndex]) : 0
      const rl = x ? Number(x.rateLimited) : 0
      const bx = left + (k - start) * slot
      const cls = 'bar' + (k === current ? ' current' : '') + (rl > 0 ? ' rl' : '')
      // Up to the limit a solid bar; above it, a pale segment: the provider's bucket starts
      // full and refills a limit a minute, so a minute may use up to twice the limit with no
      // 429 (a 429 is red, with its marker).
      const below = limit ? Math.min(used, limit) : used
      const above = limit ? Math.max(0, used - limit) : 0
      const h = Math.max(below > 0 ? 1 : 0, top + plotH - y(below))
      const bx0 = (bx + slot * 0.1).toFixed(2), bw = (slot * 0.8).toFixed(2)
      const bar = svg('rect', { class: cls, x: bx0, width: bw, y: (top + plotH - h).toFixed(2), height: h.toFixed(2), 'data-minute': k, 'data-used': used })
      const tip = clock(k * MINUTE) + (k === current ? ' (this minute, so far)' : '') + ': ' + int(used) + (limit ? ' (' + pct(Math.round((used * 1000) / limit)) + ' of the limit)' : '') +
        (above > 0 ? ', ' + int(above) + ' above it: a burst from a full bucket, which the provider allows' : '') +
        (x ? ' · ' + x.granted + ' granted, ' + x.queued + ' queued, ' + x.rejected + ' rejected' : '') + (rl > 0 ? ' · ' + rl + ' × 429' : '')
      bar.append(svg('title', {}, tip))
      root.append(bar)
      if (above > 0) {
        const ha = top + plotH - y(used) - h
        const seg = svg('rect', { class: 'burst', x: bx0, width: bw, y: y(used).toFixed(2), height: Math.max(1, ha).toFixed(2), 'data-minute': k, 'data-above': above })
        seg.append(svg('title', {}, tip))
        root.append(seg)
      }
      if (rl > 0) {
        const cx = bx + slot / 2
        const marker = svg('path', { class: 'rl-marker', d: 'M' + (cx - 4).toFixed(2) + ' ' + (top - 11) + 'h8l-4 8z', 'data-minute': k, 'data-rate-limited': rl })
        marker.append(svg('title', {}, clock(k * MINUTE) + ': ' + rl + ' × 429'))
        root.append(marker)
      }
    }
    if (capacity !== null && capacity > 0) {
      root.append(svg('line', { class: 'capacity', x1: left, x2: left + plotW, y1: y(capacity).toFixed(2), y2: y(capacity).toFixed(2), 'data-capacity': capacity }))
    }
    if (limit !== null) {
      const ly = y(limit).toFixed(2)
      root.append(svg('line', { class: 'limit', x1: left, x2: left + plotW, y1: ly, y2: ly, 'data-limit': limit }))
      root.append(svg('text', { class: 'limit-label', x: left + plotW + 4, y: (Number(ly) + 3).toFixed(2) }, 'limit ' + short(limit)))
    }
    root.append(svg('text', { x: left, y: H - 4 }, clock(start * MINUTE)))
    root.append(svg('text', { x: left + plotW, y: H - 4, 'text-anchor': 'end' }, clock(current * MINUTE)))
    root.append(svg('text', { x: left + plotW + 4, y: top + plotH }, '0'))
    return root
  }

  // "exceeds_capacity:input_tokens" → "exceeds capacity (input tokens)"
  function refusalWords(key) {
    const [reason, axis] = String(key).split(':')
    return words(reason) + (axis ? ' (' + words(axis) + ')' : '')
  }
  // A wait's length in whole seconds (minutes past 90 s), as a person reads it.
  function secs(ms) {
    ms = Math.max(0, Number(ms))
    if (ms < 1000) return '<1 s'
    if (ms < 90000) return Math.round(ms / 1000) + ' s'
    return dur(ms)
  }
  // What an agent is doing, in words, its times relative to the metrics' now.
  function stateText(act, now, refusal) {
    const s = act.state
    if (s === 'in_flight') return 'in flight'
    if (s === 'idle') return 'idle'
    if (s === 'queued') {
      const g = n(act.expectedGrant)
      return 'queued ' + secs(now - n(act.since)) + (g === null ? '' : g - now >= 1000 ? ', expected in ~' + secs(g - now) : ', expected now')
    }
    const left = act.until === null || act.until === undefined ? null : Math.max(0, n(act.until) - now)
    const more = left === null ? '' : ' for ' + secs(left) + ' more'
    if (s === 'rate_limited') return 'rate-limited' + (act.axis ? ' (' + words(act.axis) + ')' : '') + more
    if (s === 'refused') return 'refused' + (refusal ? ' (' + refusalWords(refusal) + ')' : '') + more
    if (s === 'backing_off') return 'backing off (overloaded)' + more
    return String(s || 'unknown')
  }

  function renderAgents(agents, now, events) {
    const table = $('agents')
    table.setAttribute('data-agents', String(agents.length))
    // The reason of each agent's latest refusal, from the timeline (the metrics' activity
    // says only until when).
    const lastRefusal = new Map()
    for (const e of events) if (e.kind === 'refused' && e.agent !== null) lastRefusal.set(e.agent, e.reason + (e.axis ? ':' + e.axis : ''))
    // Families together: each root, then the subagents whose calls name it (indented), the
    // root's row saying how many members the family has and how many are busy.
    const key = (a) => String(a.family ?? a.agent)
    const groups = new Map()
    for (const a of agents) {
      const g = groups.get(key(a)) ?? []
      g.push(a)
      groups.set(key(a), g)
    }
    const ordered = []
    for (const g of groups.values()) ordered.push(...g.filter((a) => a.family == null), ...g.filter((a) => a.family != null))
    const family = new Map()
    for (const [k, g] of groups) {
      if (g.some((a) => a.family != null)) family.set(k, { members: g.length, busy: g.filter((a) => n(a.queued) > 0 || n(a.inFlight) > 0).length })
    }
    const rows = ordered.slice(0, MAX_AGENT_ROWS).map((a) => {
      const act = a.activity || {}
      const own = typeof a.name === 'string' && a.name !== '' ? a.name : String(a.agent)
      const fam = a.family == null ? family.get(String(a.agent)) : null
      const label = a.family != null ? '\u2514 ' + own : fam ? own + ' (family of ' + fam.members + ', ' + fam.busy + ' busy)' : own
      const since = act.state === 'queued' ? n(act.since) : null
      const expected = act.state === 'queued' ? n(act.expectedGrant) : null
      const until = act.state === 'refused' || act.state === 'rate_limited' || act.state === 'backing_off' ? n(act.until) : null
      const end = until !== null ? until : expected
      return el('tr', {
        class: 'agent' + (a.alerting ? ' alerting' : ''),
        'data-agent': String(a.agent),
        'data-agent-name': typeof a.name === 'string' ? a.name : null,
        'data-family': a.family == null ? (fam ? String(a.agent) : null) : String(a.family),
        'data-family-name': a.family == null ? null : typeof a.familyName === 'string' ? a.familyName : null,
        'data-family-members': fam ? fam.members : null,
        'data-family-busy': fam ? fam.busy : null,
        'data-state': act.state,
        'data-queued-since': since,
        'data-queued-ms': since === null ? null : Math.max(0, now - since),
        'data-expected-grant': expected,
        'data-until': until,
        'data-wait-remaining-ms': end === null ? null : Math.max(0, end - now),
        'data-axis': act.state === 'rate_limited' ? act.axis || null : null,
        'data-in-flight': n(a.inFlight),
        'data-queued': n(a.queued),
        'data-settled': n(a.settled),
        'data-input-error-permille': n(a.inputErrorPermille),
        'data-output-error-permille': n(a.outputErrorPermille),
        'data-alerting': a.alerting ? 'true' : 'false',
        'data-repeat-failures': n(a.repeatFailures),
        'data-last-seen': n(a.lastSeen),
      },
        el('td', { title: 'id ' + String(a.agent) }, label),
        el('td', { class: 'state' }, stateText(act, now, act.state === 'refused' ? lastRefusal.get(own) : null)),
        el('td', {}, int(a.inFlight)),
        el('td', {}, int(a.queued)),
        el('td', {}, int(a.settled)),
        el('td', {}, pct(a.inputErrorPermille)),
        el('td', {}, pct(a.outputErrorPermille)),
        el('td', {}, a.alerting ? 'yes' : 'no'),
        el('td', {}, dur(Math.max(0, now - Number(a.lastSeen))) + ' ago'),
      )
    })
    $('agents-body').replaceChildren(...rows)
    const more = $('agents-more')
    more.hidden = agents.length <= MAX_AGENT_ROWS
    more.textContent = agents.length > MAX_AGENT_ROWS ? '… and ' + (agents.length - MAX_AGENT_ROWS) + ' more agents not shown.' : ''
    $('agents-empty').hidden = agents.length > 0
  }

  function clearOverlay() {
    const box = $('overlay')
    for (const a of [...box.attributes]) if (a.name.startsWith('data-')) box.removeAttribute(a.name)
    box.hidden = true
    $('overlay-chart').replaceChildren()
    $('overlay-note').textContent = ''
    $('events').hidden = true
    $('events-body').replaceChildren()
  }

  // Seed 003's test on the live fleet: per agent, call starts (blue ticks), waits (queued
  // amber, refused purple, backing off after a 429 light red) and 429s (red), over the last
  // minutes, with the pools' 429s per minute on top. Waves of 429s that line up with waves
  // of call starts come from the work, not from the retries.
  const MAX_ROWS = 20
  function renderOverlay(m, agents, tl) {
    const box = $('overlay')
    box.hidden = false
    box.setAttribute('data-status', tl.status)
    const note = $('overlay-note')
    if (!tl.body) {
      $('overlay-chart').replaceChildren()
      note.textContent = tl.status === 'none' ? '' : 'The timeline could not be loaded (' + (tl.status === 'network' ? 'network error' : 'HTTP ' + tl.status) + '); the figures above are live.'
      return
    }
    const events = tl.body.events
    const to = Math.max(n(tl.body.now) || 0, n(m.now) || 0)
    const earliest = events.length ? Math.min(...events.map((e) => n(e.t) - (n(e.waitedMs) || 0))) : to
    const windowMs = n(tl.body.windowMs) || 600000
    // At least a minute, at most the kept window; a fleet that just started fills the width.
    const span = Math.min(windowMs, Math.max(MINUTE, Math.ceil(((to - earliest) * 1.1 + 5000) / 15000) * 15000))
    const from = to - span
    // Rows: the agents with the most events (and those waiting or in flight now), at most
    // MAX_ROWS, the rest in one "other" row.
    const score = new Map()
    const bump = (k, v) => score.set(k, (score.get(k) || 0) + v)
    for (const e of events) if (e.agent !== null && n(e.t) >= from) bump(e.agent, e.kind === 'rate_limited' ? 3 : 1)
    const labelOf = (a) => (typeof a.name === 'string' && a.name !== '' ? a.name : String(a.agent))
    for (const a of agents) {
      const st = a.activity && a.activity.state
      if (st && st !== 'idle') bump(labelOf(a), 0.5)
    }
    const ranked = [...score.keys()].sort((x, y) => score.get(y) - score.get(x) || (x < y ? -1 : 1))
    const named = ranked.slice(0, MAX_ROWS)
    const rest = new Set(ranked.slice(MAX_ROWS))
    const rowKeys = rest.size ? [...named, '\\u0000other'] : named
    const rowOf = (agent) => (agent === null ? null : rest.has(agent) ? '\\u0000other' : named.includes(agent) ? agent : null)
    box.setAttribute('data-events', String(events.length))
    box.setAttribute('data-from', String(from))
    box.setAttribute('data-to', String(to))
    box.setAttribute('data-rows', String(rowKeys.length))
    if (rowKeys.length === 0) {
      $('overlay-chart').replaceChildren()
      note.textContent = 'No calls in the last ' + Math.round(windowMs / MINUTE) + ' minutes yet: call starts, waits and 429s show here as they happen.'
      return
    }
    note.textContent = ''
    const W = 1100, labelW = 150, right = 12, top = 46, rowH = 18, bottom = 22
    const plotW = W - labelW - right
    const H = top + rowKeys.length * rowH + bottom
    const x = (t) => labelW + ((Math.min(Math.max(t, from), to) - from) / span) * plotW
    const root = svg('svg', { id: 'timeline-chart', class: 'timeline', viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': '429s, waits and call starts per agent over the last ' + Math.round(span / MINUTE) + ' minutes' })
    // Minute grid and the pools' 429s per minute (all pools) on top.
    const perMinute = new Map()
    for (const p of m.pools) for (const mm of (Array.isArray(p.minutes) ? p.minutes : [])) perMinute.set(Number(mm.minute), (perMinute.get(Number(mm.minute)) || 0) + Number(mm.rateLimited || 0))
    const firstMinute = Math.floor(from / MINUTE)
    const lastMinute = Math.floor(to / MINUTE)
    let peak = 1
    for (let k = firstMinute; k <= lastMinute; k++) peak = Math.max(peak, perMinute.get(k) || 0)
    root.append(svg('text', { x: 4, y: 14 }, '429s per minute'))
    const labelEvery = Math.max(1, Math.ceil((lastMinute - firstMinute + 1) / 12))
    for (let k = firstMinute; k <= lastMinute; k++) {
      const x0 = x(k * MINUTE), x1 = x((k + 1) * MINUTE)
      if (k * MINUTE >= from) {
        root.append(svg('line', { class: 'grid', x1: x0.toFixed(1), x2: x0.toFixed(1), y1: 4, y2: H - bottom }))
        // Minute labels, none under the "now" label at the right end.
        if ((k - firstMinute) % labelEvery === 0 && x(to) - x0 > 110) root.append(svg('text', { x: (x0 + 2).toFixed(1), y: H - 6 }, clock(k * MINUTE)))
      }
      const rl = perMinute.get(k) || 0
      if (rl > 0) {
        const h = Math.max(2, (rl / peak) * 24)
        const bar = svg('rect', { class: 'tl-minute', x: (x0 + 1).toFixed(1), width: Math.max(1, x1 - x0 - 2).toFixed(1), y: (top - 8 - h).toFixed(1), height: h.toFixed(1), 'data-minute': k, 'data-rate-limited': rl })
        bar.append(svg('title', {}, clock(k * MINUTE) + ': ' + rl + ' × 429'))
        root.append(bar)
        root.append(svg('text', { class: 'tl-minute-label', x: (x0 + 3).toFixed(1), y: (top - 10 - h).toFixed(1) }, String(rl)))
      }
    }
    const rows = new Map()
    rowKeys.forEach((key, i) => {
      const y = top + i * rowH
      const g = svg('g', { class: 'tl-row', 'data-agent-name': key === '\\u0000other' ? null : key, 'data-other': key === '\\u0000other' ? String(rest.size) : null })
      if (i % 2 === 0) g.append(svg('rect', { class: 'row-bg', x: labelW, y, width: plotW, height: rowH }))
      const label = key === '\\u0000other' ? 'other (' + rest.size + ' agents)' : key.length > 22 ? key.slice(0, 21) + '…' : key
      const text = svg('text', { class: 'row-label', x: 4, y: y + 13 }, label)
      text.append(svg('title', {}, key === '\\u0000other' ? rest.size + ' more agents' : key))
      g.append(text)
      rows.set(key, { g, y, sends: 0, limited: 0, waits: 0 })
    })
    const span_ = (r, kind, a, b, open, tip) => {
      if (b <= from || a >= to) return
      const x0 = x(a), x1 = Math.max(x(b), x0 + 1.5)
      const rect = svg('rect', { class: 'tl-wait', 'data-kind': kind, 'data-from': Math.round(a), 'data-to': Math.round(b), 'data-open': open ? 'true' : null, x: x0.toFixed(1), width: (x1 - x0).toFixed(1), y: r.y + 3, height: rowH - 6 })
      rect.append(svg('title', {}, tip))
      r.g.append(rect)
      r.waits++
    }
    const marks = []
    for (const e of events) {
      const r = rows.get(rowOf(e.agent))
      if (!r) continue
      const t = n(e.t)
      const who = e.agent + ' ' + clockSeconds(t)
      if (e.kind === 'send') {
        const waited = n(e.waitedMs) || 0
        if (waited > 0) span_(r, 'queued', t - waited, t, false, who + ': queued ' + secs(waited) + ' for this grant')
        if (t >= from) {
          const tick = svg('rect', { class: 'tl-send', 'data-t': t, x: (x(t) - 1.25).toFixed(1), width: 2.5, y: r.y + 1, height: rowH - 2 })
          tick.append(svg('title', {}, who + ': call started' + (waited > 0 ? ' after ' + secs(waited) + ' in the queue' : '')))
          marks.push([r, tick])
          r.sends++
        }
      } else if (e.kind === 'refused') {
        const until = n(e.until)
        span_(r, 'refused', t, until === null ? t + 1000 : Math.min(until, to), until !== null && until > to, who + ': refused (' + refusalWords(e.reason + (e.axis ? ':' + e.axis : '')) + ')' + (until === null ? '' : ', asks again at ' + clockSeconds(until)))
      } else if (e.kind === 'backoff') {
        const until = n(e.until)
        span_(r, 'backoff', t, Math.min(until, to), until > to, who + ': waiting out a ' + (e.cause === 'overloaded' ? 'provider overload' : '429') + ' until ' + clockSeconds(until))
      } else if (e.kind === 'rate_limited' && t >= from) {
        const cx = x(t)
        if (e.until !== null && e.until !== undefined) r.g.append(svg('line', { class: 'tl-retry', x1: cx.toFixed(1), x2: x(n(e.until)).toFixed(1), y1: r.y + rowH / 2, y2: r.y + rowH / 2 }))
        const mark = svg('path', { class: 'tl-429', 'data-t': t, 'data-exceeded': e.exceeded || null, d: 'M' + (cx - 4.5).toFixed(1) + ' ' + (r.y + rowH - 3) + 'h9l-4.5 -' + (rowH - 6) + 'z' })
        mark.append(svg('title', {}, who + ': 429' + (e.exceeded ? ' (the provider: ' + words(e.exceeded) + ' exceeded)' : ' (no limit named)') + (e.retryAfterMs === null || e.retryAfterMs === undefined ? '' : ', retry after ' + secs(e.retryAfterMs))))
        marks.push([r, mark])
        r.limited++
      }
    }
    // Open waits the metrics show now (queued since, not yet granted).
    for (const a of agents) {
      const act = a.activity || {}
      const r = rows.get(rowOf(labelOf(a)))
      if (!r || act.state !== 'queued') continue
      span_(r, 'queued', n(act.since), to, true, labelOf(a) + ': queued since ' + clockSeconds(n(act.since)))
    }
    // Ticks and 429s over the spans.
    for (const [r, node] of marks) r.g.append(node)
    for (const r of rows.values()) {
      r.g.setAttribute('data-sends', String(r.sends))
      r.g.setAttribute('data-429s', String(r.limited))
      r.g.setAttribute('data-waits', String(r.waits))
      root.append(r.g)
    }
    root.append(svg('line', { class: 'now', x1: x(to).toFixed(1), x2: x(to).toFixed(1), y1: 4, y2: H - bottom }))
    root.append(svg('text', { x: (x(to) - 2).toFixed(1), y: H - 6, 'text-anchor': 'end' }, 'now ' + clockSeconds(to)))
    $('overlay-chart').replaceChildren(root)
  }

  // The recent 429s and refusals, newest first, each naming its ceiling.
  const MAX_EVENT_ROWS = 40
  function renderEvents(events) {
    const list = events.filter((e) => e.kind === 'rate_limited' || e.kind === 'refused').slice(-MAX_EVENT_ROWS).reverse()
    $('events').hidden = list.length === 0
    $('events-body').replaceChildren(...list.map((e) => {
      const t = n(e.t)
      const what = e.kind === 'rate_limited'
        ? '429 from the provider: ' + (e.exceeded ? words(e.exceeded) + ' limit exceeded' : 'no limit named') + (e.retryAfterMs === null || e.retryAfterMs === undefined ? '' : ', retry after ' + secs(e.retryAfterMs))
        : 'refused by tokenwarden: ' + refusalWords(e.reason + (e.axis ? ':' + e.axis : '')) + (e.until === null || e.until === undefined ? ' (gives up)' : ', asks again at ' + clockSeconds(n(e.until)))
      return el('tr', { class: 'event', 'data-kind': e.kind, 'data-t': t, 'data-agent-name': e.agent, 'data-exceeded': e.kind === 'rate_limited' ? e.exceeded || 'unknown' : null, 'data-reason': e.reason || null, 'data-axis': e.axis || null },
        el('td', {}, clockSeconds(t)), el('td', {}, e.agent === null ? '–' : e.agent), el('td', {}, e.pool), el('td', { class: 'what' }, what))
    }))
  }

  form.addEventListener('submit', (e) => {
    e.preventDefault()
    const value = input.value.trim()
    input.value = ''
    if (!value) return
    memorySecret = value
    store.set(value)
    clearError()
    start()
  })
  $('forget').addEventListener('click', () => {
    store.clear()
    memorySecret = ''
    clearError()
    lock()
  })

  if (!url || url.origin !== location.origin) {
    form.hidden = true
    setState('error')
    showError('the metrics path is not on this origin; refusing to send the secret there', 'config')
  } else if (secret()) {
    start()
  } else {
    lock()
  }
})()
`

/** How often the page polls the metrics endpoint, ms. */
export const DASHBOARD_POLL_MS = 2000

/**
 * The dashboard page for one quota of one fleet.
 *
 * @param {{ fleet: string, quota: string, metricsPath: string, timelinePath?: string }} options
 *   `metricsPath` is the quota's metrics endpoint (answering the coordinator's `Metrics` as
 *   JSON to a `GET` with `Authorization: Bearer <secret>`), on the page's origin, e.g.
 *   `/v1/fleets/<fleet>/quotas/<quota>/metrics`; `timelinePath` its recent call events
 *   (`…/timeline`), for the 429-vs-turn overlay (default: beside the metrics path)
 * @returns {string} a complete HTML document; serve it as `text/html; charset=utf-8`
 *   with `dashboardCsp()` as its Content Security Policy
 */
export function dashboardHtml({ fleet, quota, metricsPath, timelinePath }) {
  const f = escapeHtml(fleet)
  const q = escapeHtml(quota)
  const timeline = timelinePath ?? String(metricsPath).replace(/\/metrics$/, '/timeline')
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<meta name="robots" content="noindex, nofollow">
<title>tokenwarden · ${f} / ${q}</title>
<link rel="icon" href="data:,">
<style>${STYLE}</style>
</head>
<body>
<main id="app" data-state="locked" data-fleet="${f}" data-quota="${q}" data-metrics-path="${escapeHtml(metricsPath)}" data-timeline-path="${escapeHtml(timeline)}" data-interval-ms="${DASHBOARD_POLL_MS}">
<header>
<h1>tokenwarden <span class="muted">fleet</span> <span id="fleet-name">${f}</span> <span class="muted">quota</span> <span id="quota-name">${q}</span></h1>
<p id="status" role="status" aria-live="polite">This page needs JavaScript to load the live metrics.</p>
<p id="error" role="alert" hidden></p>
</header>
<form id="secret-form" method="post" autocomplete="off" hidden>
<label for="secret">Fleet secret</label>
<input id="secret" type="password" autocomplete="off" spellcheck="false" autocapitalize="off" placeholder="bearer secret of this fleet">
<button id="connect" type="submit">Show metrics</button>
<span class="muted">Kept in this tab's session storage only.</span>
</form>
<section id="signin-help" class="help" hidden>
<p><b>Sign in</b> with the secret of fleet <code>${f}</code>: the bearer secret its agents and the metrics endpoint use (<code>Authorization: Bearer &lt;fleet secret&gt;</code>). Where it is:</p>
<ul>
<li><code>tokenwarden serve</code> with no <code>--config</code>: in the data directory's <code>secret</code> file, <code>&lt;data dir&gt;/secret</code> — by default <code>.tokenwarden/secret</code> in the directory serve was started in (<code>cat .tokenwarden/secret</code>; with <code>--data DIR</code>, <code>DIR/secret</code>).</li>
<li><code>tokenwarden serve --config FILE</code>: the fleet's <code>"secret"</code> in FILE (<code>fleets.${f}.secret</code>; serve keeps a copy in <code>&lt;data dir&gt;/fleets.json</code>).</li>
<li>A deployed Worker: the fleet's <code>secret</code> in its <code>TOKENWARDEN_FLEETS</code> variable (<code>{"${f}": {"secret": …}}</code>, set with <code>wrangler secret put TOKENWARDEN_FLEETS</code>).</li>
</ul>
<p class="muted">The secret is sent only to this origin's metrics and timeline endpoints and is forgotten when the tab closes.</p>
</section>
<div id="toolbar" hidden><button id="forget" type="button">Forget secret</button></div>
<section id="summary"></section>
<section id="tasks" class="tasks-card" hidden>
<h2>Tasks <span id="tasks-open" class="muted"></span></h2>
<table id="tasks-table">
<thead><tr><th scope="col"></th><th scope="col">Since start</th><th scope="col">Last minute</th></tr></thead>
<tbody id="tasks-body"></tbody>
</table>
</section>
<div id="pools"></div>
<section id="overlay" class="overlay-card" hidden>
<h2>429s against call starts, per agent <small>(last minutes; seed 003's test)</small></h2>
<div class="legend"><span><i class="k-send"></i>call start</span><span><i class="k-queued"></i>queued</span><span><i class="k-refused"></i>refused</span><span><i class="k-backoff"></i>waiting out a 429</span><span><i class="k-429"></i>429</span></div>
<p class="muted" id="overlay-how">If the red marks come in waves that line up with waves of call starts (the work), not with the ends of waits (the retries), the load itself trips the limit: no backoff setting fixes that, fewer agents or a larger limit does.</p>
<div id="overlay-chart" class="scroll"></div>
<p id="overlay-note" class="muted"></p>
</section>
<section id="events" class="agents-card" hidden>
<h2>Recent 429s and refusals <small>(the ceiling each hit)</small></h2>
<div class="scroll">
<table class="events">
<thead><tr><th>time</th><th>agent</th><th>pool</th><th>what</th></tr></thead>
<tbody id="events-body"></tbody>
</table>
</div>
</section>
<section class="agents-card">
<h2>Agents</h2>
<div class="scroll">
<table id="agents">
<thead><tr><th>agent</th><th>state</th><th>in flight</th><th>queued</th><th>settled</th><th>input estimate error</th><th>output estimate error</th><th>alert</th><th>last seen</th></tr></thead>
<tbody id="agents-body"></tbody>
</table>
</div>
<p id="agents-empty" class="muted" hidden>No agents yet.</p>
<p id="agents-locked" class="muted">Sign in with the fleet secret to see the agents.</p>
<p id="agents-more" class="muted" hidden></p>
</section>
</main>
<script>${SCRIPT}</script>
</body>
</html>
`
}

/**
 * The page with placeholders for a host that fills them in itself (native `tokenwarden
 * serve`, from serve/assets/: see scripts/dashboard-asset.mjs): `{{fleet}}`, `{{quota}}`,
 * `{{metricsPath}}` and `{{timelinePath}}`, each standing for the value as `escapeHtml`
 * writes it; and the page's Content Security Policy.
 * @returns {{ html: string, csp: string }}
 */
export function dashboardAsset() {
  const html = dashboardHtml({ fleet: '{{fleet}}', quota: '{{quota}}', metricsPath: '{{metricsPath}}', timelinePath: '{{timelinePath}}' })
  return { html, csp: dashboardCsp() }
}

/** @type {string | undefined} */
let csp

/**
 * A Content Security Policy for {@link dashboardHtml}'s page: nothing but its own inline
 * script and style (by hash) and `fetch`es to its own origin; no framing, no form posts.
 * Synchronous (the hashes are computed once, in plain JavaScript).
 *
 * @returns {string} the `Content-Security-Policy` header value (the same for every fleet
 *   and quota)
 */
export function dashboardCsp() {
  csp ??=
    `default-src 'none'; script-src 'sha256-${sha256Base64(SCRIPT)}'; style-src 'sha256-${sha256Base64(STYLE)}'; ` +
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
  return csp
}

/** The first 32 bits of the fractional part of `x`. */
const frac32 = (x) => Math.floor((x - Math.floor(x)) * 2 ** 32) >>> 0
const PRIMES = []
for (let p = 2; PRIMES.length < 64; p++) if (PRIMES.every((q) => p % q !== 0)) PRIMES.push(p)
/** SHA-256 round constants and initial hash (FIPS 180-4, 4.2.2 and 5.3.3). */
const K = Uint32Array.from(PRIMES, (p) => frac32(Math.cbrt(p)))
const H0 = Uint32Array.from(PRIMES.slice(0, 8), (p) => frac32(Math.sqrt(p)))

/**
 * SHA-256 of `text` (as UTF-8), base64: what a CSP hash source holds. Synchronous, so the
 * Worker can set the header without awaiting `crypto.subtle`.
 * @param {string} text
 */
export function sha256Base64(text) {
  const bytes = new TextEncoder().encode(text)
  const words = new Uint32Array(((bytes.length + 9 + 63) >>> 6) << 4)
  for (let i = 0; i < bytes.length; i++) words[i >>> 2] |= bytes[i] << (24 - (i & 3) * 8)
  words[bytes.length >>> 2] |= 0x80 << (24 - (bytes.length & 3) * 8)
  const bits = bytes.length * 8
  words[words.length - 2] = Math.floor(bits / 2 ** 32)
  words[words.length - 1] = bits >>> 0
  const h = Uint32Array.from(H0)
  const w = new Uint32Array(64)
  const rotr = (x, n) => (x >>> n) | (x << (32 - n))
  for (let block = 0; block < words.length; block += 16) {
    for (let t = 0; t < 16; t++) w[t] = words[block + t]
    for (let t = 16; t < 64; t++) {
      const s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >>> 3)
      const s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >>> 10)
      w[t] = w[t - 16] + s0 + w[t - 7] + s1
    }
    let [a, b, c, d, e, f, g, k] = h
    for (let t = 0; t < 64; t++) {
      const t1 = (k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t]) | 0
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0
      k = g
      g = f
      f = e
      e = (d + t1) | 0
      d = c
      c = b
      b = a
      a = (t1 + t2) | 0
    }
    h[0] += a
    h[1] += b
    h[2] += c
    h[3] += d
    h[4] += e
    h[5] += f
    h[6] += g
    h[7] += k
  }
  let binary = ''
  for (const word of h) binary += String.fromCharCode(word >>> 24, (word >>> 16) & 255, (word >>> 8) & 255, word & 255)
  return btoa(binary)
}

/**
 * Text made safe for HTML element content and double- or single-quoted attribute values.
 * @param {unknown} value
 */
export function escapeHtml(value) {
  return String(value ?? '').replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`)
}
