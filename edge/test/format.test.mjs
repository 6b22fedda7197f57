// The edge limiter's output formats: the Prometheus exposition of a coordinator's metrics
// (checked line by line against metrics from the real engine) and the dashboard page
// (self-contained, escaped, hash-CSP-ready). Run from the repository root:
//   node --test edge/test/format.test.mjs
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'
import vm from 'node:vm'
import { nativeEngines } from 'tokenwarden'
import { DASHBOARD_POLL_MS, dashboardAsset, dashboardCsp, dashboardHtml, escapeHtml, sha256Base64 } from '../src/dashboard.js'
import { PROMETHEUS_CONTENT_TYPE, escapeLabelValue, prometheusText } from '../src/prometheus.js'

const NOW = 62_000

/**
 * Two pools driven a little on the real engine: in minute 0 grants, a ticket queued and
 * granted from the queue, settlements; in minute 1 a 429 (Retry-After 30 s) that pauses
 * `sonnet` and cuts its margin, and a ticket still queued behind the pause.
 */
function scenario() {
  const engine = nativeEngines.create(
    {
      pools: [
        { name: 'sonnet', input_tokens_per_minute: 100_000, output_tokens_per_minute: 20_000, requests_per_minute: 1000, max_concurrent: 1 },
        { name: 'gpt-mini', tokens_per_minute: 200_000, requests_per_minute: 300 },
      ],
    },
    1,
    0,
  )
  const first = engine.requestLease(0, { agent: 1, pool: 0, inputTokens: 1000, maxTokens: 10 })
  assert.equal(first.kind, 'grant')
  const second = engine.requestLease(10, { agent: 2, pool: 0, inputTokens: 1000, maxTokens: 10 })
  assert.equal(second.kind, 'queued')
  engine.settle(50, first.lease, { inputTokens: 900, outputTokens: 5 })
  const other = engine.requestLease(100, { agent: 4, pool: 1, inputTokens: 3000, maxTokens: 500, task: 7 })
  assert.equal(other.kind, 'grant')
  engine.settle(200, other.lease, { inputTokens: 2800, outputTokens: 240 })
  engine.handle(300, { op: 'end_task', task: 7, outcome: 'merged' })
  engine.handleResponse(61_000, 0, second.lease, 429, [['retry-after', '30']], null)
  const third = engine.requestLease(61_500, { agent: 3, pool: 0, inputTokens: 1000, maxTokens: 10 })
  assert.equal(third.kind, 'queued')
  const metrics = engine.metrics(NOW)
  // The scenario is what the tests below rely on.
  const [sonnet, mini] = metrics.pools
  assert.ok(sonnet.pausedUntil > NOW && sonnet.queueDepth === 1 && sonnet.counters.rateLimited === 1)
  assert.ok(sonnet.queueWaitP50Ms !== null && mini.queueWaitP50Ms === null && mini.maxConcurrent === null)
  assert.ok(sonnet.axes.some((a) => a.limit === null) && sonnet.axes.some((a) => a.lastMinute > 0))
  return metrics
}

const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*'
const LABEL = '[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\\\\n]|\\\\[\\\\"n])*"'
const VALUE = '(?:[+-]?(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:[eE][+-]?\\d+)?|NaN|[+-]Inf)'
const HELP_LINE = new RegExp(`^# HELP (${NAME}) ((?:[^\\\\\\n]|\\\\[\\\\n])*)$`)
const TYPE_LINE = new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`)
const SAMPLE_LINE = new RegExp(`^(${NAME})(?:\\{((?:${LABEL})(?:,${LABEL})*,?)?\\})? (${VALUE})(?: -?\\d+)?$`)

/** Unescapes a label value of the text format. */
const unescapeLabel = (s) => s.replace(/\\([\\"n])/g, (_, c) => (c === 'n' ? '\n' : c))

/**
 * Parses an exposition strictly: every line must be HELP, TYPE or a sample; each family's
 * HELP and TYPE come once, before its samples, and its samples form one group.
 */
function parseExposition(text) {
  assert.ok(text.endsWith('\n'), 'the exposition ends with a line feed')
  const lines = text.slice(0, -1).split('\n')
  const types = new Map()
  const helps = new Map()
  const samples = []
  const closed = new Set()
  let current = null
  for (const line of lines) {
    const help = HELP_LINE.exec(line)
    const type = help ? null : TYPE_LINE.exec(line)
    const sample = help || type ? null : SAMPLE_LINE.exec(line)
    const m = help ?? type ?? sample
    if (help) {
      assert.ok(!helps.has(m[1]), `one HELP line for ${m[1]}`)
      helps.set(m[1], m[2])
      if (current !== m[1] && current !== null) closed.add(current)
      current = m[1]
    } else if (type) {
      assert.ok(!types.has(m[1]), `one TYPE line for ${m[1]}`)
      assert.ok(!closed.has(m[1]) && !samples.some((s) => s.name === m[1]), `TYPE of ${m[1]} before its samples`)
      types.set(m[1], m[2])
      if (current !== m[1] && current !== null) closed.add(current)
      current = m[1]
    } else if (sample) {
      const [, name, body = '', value] = m
      assert.equal(name, current, `sample ${name} in its family's group`)
      assert.ok(!closed.has(name), `the samples of ${name} form one group`)
      const labels = {}
      for (const [, k, v] of body.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
        assert.ok(!(k in labels), `label ${k} once in ${line}`)
        labels[k] = unescapeLabel(v)
      }
      samples.push({ name, labels, value: Number(value.replace('Inf', 'Infinity')), line })
    } else {
      assert.fail(`not a valid exposition line: ${JSON.stringify(line)}`)
    }
  }
  return { types, helps, samples }
}

/** The value of the one sample of `name` whose labels include `labels`; `undefined` if none. */
function sampleValue(parsed, name, labels) {
  const found = parsed.samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
  assert.ok(found.length <= 1, `at most one ${name} ${JSON.stringify(labels)}`)
  return found[0]?.value
}

test('every line of the exposition is HELP, TYPE or a well-formed sample; one TYPE per family', () => {
  const metrics = scenario()
  const text = prometheusText(metrics, { fleet: 'acme', quota: 'anthropic-main' })
  const parsed = parseExposition(text)
  assert.equal(PROMETHEUS_CONTENT_TYPE, 'text/plain; version=0.0.4; charset=utf-8')
  assert.ok(parsed.samples.length > 50, `${parsed.samples.length} samples`)
  const families = new Set(parsed.samples.map((s) => s.name))
  assert.deepEqual([...parsed.types.keys()].sort(), [...families].sort(), 'a TYPE line for every family with samples, and none without')
  assert.deepEqual([...parsed.helps.keys()].sort(), [...families].sort(), 'a HELP line for every family')
  for (const line of text.split('\n').filter((l) => l.startsWith('# TYPE '))) {
    assert.equal(text.split('\n').filter((l) => l === line).length, 1, line)
  }
  for (const s of parsed.samples) {
    assert.ok(s.name.startsWith('tokenwarden_'), s.name)
    assert.equal(s.labels.fleet, 'acme', s.line)
    assert.equal(s.labels.quota, 'anthropic-main', s.line)
    assert.ok(Number.isFinite(s.value), s.line)
  }
  const series = parsed.samples.map((s) => s.name + JSON.stringify(Object.entries(s.labels).sort()))
  assert.equal(new Set(series).size, series.length, 'no series twice')
})

test('counters are counter families named *_total, one per core counter; nothing else ends in _total', () => {
  const metrics = scenario()
  const parsed = parseExposition(prometheusText(metrics, { fleet: 'acme', quota: 'q' }))
  const counters = [...parsed.types].filter(([, t]) => t === 'counter').map(([n]) => n)
  for (const name of counters) assert.match(name, /^tokenwarden_[a-z0-9_]+_total$/)
  for (const [name, type] of parsed.types) if (name.endsWith('_total')) assert.equal(type, 'counter', name)
  const keys = Object.keys(metrics.pools[0].counters)
  const taskCounters = ['tokenwarden_tasks_ended_total', 'tokenwarden_tasks_untracked_total', 'tokenwarden_task_tokens_total']
  // and one per agent (by name): leases settled
  const agentCounters = metrics.agents.length > 0 ? ['tokenwarden_agent_settled_total'] : []
  assert.equal(counters.length, keys.length + taskCounters.length + agentCounters.length)
  for (const name of agentCounters) assert.ok(counters.includes(name), name)
  for (const name of taskCounters) assert.ok(counters.includes(name), name)
  assert.ok(counters.includes('tokenwarden_granted_from_queue_total'))
  assert.ok(counters.includes('tokenwarden_rate_limited_on_lease_total'))
  for (const pool of metrics.pools) {
    for (const [key, value] of Object.entries(pool.counters)) {
      const name = `tokenwarden_${key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)}_total`
      assert.equal(sampleValue(parsed, name, { pool: pool.name }), value, `${name} of ${pool.name}`)
    }
  }
  assert.equal(sampleValue(parsed, 'tokenwarden_rate_limited_total', { pool: 'sonnet' }), 1)
  assert.equal(sampleValue(parsed, 'tokenwarden_granted_from_queue_total', { pool: 'sonnet' }), 1)
})

test("the task figures are metrics().tasks': the four numbers, since start and for the last minute", () => {
  const metrics = scenario()
  const p = parseExposition(prometheusText(metrics, { fleet: 'acme', quota: 'main' }))
  const t = metrics.tasks
  assert.equal(t.sinceStart.merged, 1)
  assert.equal(sampleValue(p, 'tokenwarden_tasks_open', {}), 0)
  assert.equal(sampleValue(p, 'tokenwarden_tasks_ended_total', { outcome: 'merged' }), 1)
  assert.equal(sampleValue(p, 'tokenwarden_task_tokens_total', {}), 3040)
  assert.equal(sampleValue(p, 'tokenwarden_tokens_per_merged_task', { span: 'since_start' }), 3040)
  assert.equal(sampleValue(p, 'tokenwarden_task_seconds', { quantile: '0.5' }), Number(t.sinceStart.taskTimeP50Ms) / 1000)
  assert.equal(sampleValue(p, 'tokenwarden_rate_limited_ratio', { span: 'since_start' }), t.sinceStart.rateLimitedPermille / 1000)
  assert.equal(sampleValue(p, 'tokenwarden_critical_path_wait_seconds', { span: 'last_minute' }), 0)
})

test("the exposition's figures are the metrics' figures", () => {
  const metrics = scenario()
  const p = parseExposition(prometheusText(metrics, { fleet: 'acme', quota: 'main' }))
  assert.equal(sampleValue(p, 'tokenwarden_live_leases', {}), metrics.liveLeases)
  for (const state of ['idle', 'in_flight', 'queued']) {
    const n = metrics.agents.filter((a) => a.activity.state === state).length
    assert.equal(sampleValue(p, 'tokenwarden_agents', { state }), n, state)
  }
  assert.equal(sampleValue(p, 'tokenwarden_agents', { state: 'queued' }), 1, 'agent 3 waits behind the pause')
  for (const pool of metrics.pools) {
    const at = { pool: pool.name }
    for (const a of pool.axes) {
      const ax = { ...at, axis: a.axis }
      if (a.limit === null) {
        for (const name of ['tokenwarden_limit', 'tokenwarden_capacity', 'tokenwarden_available', 'tokenwarden_used_last_minute_ratio']) {
          assert.equal(sampleValue(p, name, ax), undefined, `no ${name} for ${pool.name} ${a.axis}: its limit is unknown`)
        }
      } else {
        assert.equal(sampleValue(p, 'tokenwarden_limit', ax), a.limit)
        assert.equal(sampleValue(p, 'tokenwarden_capacity', ax), a.capacity)
        assert.equal(sampleValue(p, 'tokenwarden_available', ax), a.available)
        assert.equal(sampleValue(p, 'tokenwarden_used_last_minute_ratio', ax), a.lastMinutePermille / 1000)
      }
      assert.equal(sampleValue(p, 'tokenwarden_used_last_minute', ax), a.lastMinute)
    }
    assert.equal(sampleValue(p, 'tokenwarden_margin_ratio', at), pool.marginPermille / 1000)
    assert.equal(sampleValue(p, 'tokenwarden_queue_depth', at), pool.queueDepth)
    assert.equal(sampleValue(p, 'tokenwarden_in_flight', at), pool.inFlight)
    assert.equal(sampleValue(p, 'tokenwarden_max_concurrent', at), pool.maxConcurrent ?? undefined)
    assert.equal(sampleValue(p, 'tokenwarden_paused', at), pool.pausedUntil > metrics.now ? 1 : 0)
    assert.equal(sampleValue(p, 'tokenwarden_queue_wait_seconds', { ...at, quantile: '0.5' }), pool.queueWaitP50Ms === null ? undefined : pool.queueWaitP50Ms / 1000)
    assert.equal(sampleValue(p, 'tokenwarden_queue_wait_seconds', { ...at, quantile: '0.95' }), pool.queueWaitP95Ms === null ? undefined : pool.queueWaitP95Ms / 1000)
    assert.equal(sampleValue(p, 'tokenwarden_fleet_agents_at_75_percent', at), pool.fleet?.agentsAt75Percent)
    if (pool.fleet) assert.equal(sampleValue(p, 'tokenwarden_fleet_agents_at_75_percent', { ...at, axis: pool.fleet.axis }), pool.fleet.agentsAt75Percent)
  }
  // The scenario's known figures, so the comparisons above are not all zeros.
  assert.equal(sampleValue(p, 'tokenwarden_paused', { pool: 'sonnet' }), 1)
  assert.equal(sampleValue(p, 'tokenwarden_paused', { pool: 'gpt-mini' }), 0)
  assert.equal(sampleValue(p, 'tokenwarden_margin_ratio', { pool: 'sonnet' }), 0.8, 'the 429 cut the margin from 850 to 800 permille')
  assert.equal(sampleValue(p, 'tokenwarden_used_last_minute', { pool: 'sonnet', axis: 'input_tokens' }), 900)
  assert.equal(sampleValue(p, 'tokenwarden_limit', { pool: 'gpt-mini', axis: 'tokens' }), 200_000)
  assert.equal(sampleValue(p, 'tokenwarden_max_concurrent', { pool: 'gpt-mini' }), undefined)
  assert.equal(sampleValue(p, 'tokenwarden_queue_wait_seconds', { pool: 'gpt-mini', quantile: '0.5' }), undefined)
  assert.ok(sampleValue(p, 'tokenwarden_fleet_agents_at_75_percent', { pool: 'sonnet' }) > 0)
})

test('label values escape backslash, double quote and line feed', () => {
  const metrics = scenario()
  const fleet = 'fl"eet'
  const quota = 'we"ird\\quota\nname'
  const text = prometheusText(metrics, { fleet, quota })
  assert.ok(text.includes('quota="we\\"ird\\\\quota\\nname"'), 'escaped in the text')
  assert.ok(text.includes('fleet="fl\\"eet"'))
  const parsed = parseExposition(text) // a raw line feed would break a line and fail the parse
  for (const s of parsed.samples) {
    assert.equal(s.labels.quota, quota)
    assert.equal(s.labels.fleet, fleet)
  }
  assert.equal(escapeLabelValue('a\\"b\n'), 'a\\\\\\"b\\n')
  // Pool names go through the same escaping.
  metrics.pools[0].name = 'so"n\\net\n'
  const again = parseExposition(prometheusText(metrics, { fleet: 'f', quota: 'q' }))
  assert.equal(sampleValue(again, 'tokenwarden_queue_depth', { pool: 'so"n\\net\n' }), metrics.pools[0].queueDepth)
})

test('bigints (instants near u64::MAX) and empty metrics render', () => {
  const text = prometheusText(
    {
      now: 5n,
      liveLeases: 0,
      agents: [],
      pools: [
        {
          name: 'p',
          axes: [{ axis: 'tokens', limit: 18446744073709551615n, capacity: 1n, available: -3, lastMinute: 0, lastMinutePermille: 0 }],
          bindingAxis: null,
          marginPermille: 1000,
          pausedUntil: 18446744073709551615n,
          queueDepth: 0,
          inFlight: 0,
          maxConcurrent: null,
          queueWaitP50Ms: null,
          queueWaitP95Ms: null,
          minutes: [],
          counters: { settled: 0 },
          fleet: null,
        },
      ],
    },
    { fleet: 'f', quota: 'q' },
  )
  const parsed = parseExposition(text)
  assert.ok(text.includes('tokenwarden_limit{fleet="f",quota="q",pool="p",axis="tokens"} 18446744073709551615\n'))
  assert.equal(sampleValue(parsed, 'tokenwarden_paused', { pool: 'p' }), 1)
  assert.equal(sampleValue(parsed, 'tokenwarden_available', { pool: 'p' }), -3, 'debt is negative')
  assert.equal(sampleValue(parsed, 'tokenwarden_agents', { state: 'idle' }), 0, 'every state is reported, 0 when no agent is in it')
  assert.equal(parsed.types.has('tokenwarden_queue_wait_seconds'), false, 'no family without samples')
  parseExposition(prometheusText({ now: 0, liveLeases: 0, pools: [], agents: [] }, { fleet: 'f', quota: 'q' }))
})

const HOSTILE = '<script>alert(1)</script>'

/** The text between `<tag>` and `</tag>` (the page has one of each). */
function inline(html, tag) {
  const open = `<${tag}>`
  const start = html.indexOf(open)
  assert.ok(start >= 0, `a <${tag}> element`)
  return html.slice(start + open.length, html.indexOf(`</${tag}>`, start))
}

test('the dashboard is one complete, self-contained HTML document', () => {
  const html = dashboardHtml({ fleet: 'acme', quota: 'main', metricsPath: '/v1/fleets/acme/quotas/main/metrics' })
  assert.match(html, /^<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">/)
  assert.match(html, /<\/body>\n<\/html>\n$/)
  for (const part of ['<head>', '</head>', '<body>', '</body>', '<title>', '<style>', '<script>']) {
    assert.equal(html.split(part).length, 2, `one ${part}`)
  }
  assert.equal((html.match(/<script/gi) ?? []).length, 1, 'one script element, inline')
  assert.doesNotMatch(html, /<script[^>]*\bsrc\s*=/i)
  assert.doesNotMatch(html, /<link[^>]*rel="?stylesheet/i)
  assert.doesNotMatch(inline(html, 'style'), /@import|url\(/i, 'no CSS fetches')
  assert.doesNotMatch(html, /<(?:iframe|img|object|embed)\b/i)
  const refs = [...html.matchAll(/\b(?:src|href|action|formaction)\s*=\s*"([^"]*)"/gi)].map((m) => m[1])
  assert.deepEqual(refs, ['data:,'], 'the only reference is the empty inline favicon')
  // The only absolute URL is the SVG namespace, an identifier the script never fetches.
  const urls = html.match(/(?:https?:)?\/\/[a-z0-9.-]+\.[a-z]{2,}[^\s'"<>]*/gi) ?? []
  assert.deepEqual([...new Set(urls)], ['http://www.w3.org/2000/svg'])
  assert.ok(html.includes('data-metrics-path="/v1/fleets/acme/quotas/main/metrics"'))
  assert.ok(html.includes(`data-interval-ms="${DASHBOARD_POLL_MS}"`) && DASHBOARD_POLL_MS === 2000)
  assert.ok(html.includes('<title>tokenwarden · acme / main</title>'))
  // The inline script is valid JavaScript.
  new vm.Script(inline(html, 'script'), { filename: 'dashboard-inline.js' })
})

test('the dashboard escapes hostile fleet, quota and path strings', () => {
  const quota = '"><img src=x onerror=alert(2)>'
  const html = dashboardHtml({ fleet: HOSTILE, quota, metricsPath: `/v1/fleets/x/quotas/"><script>alert(3)</script>/metrics` })
  assert.ok(!html.includes(HOSTILE), 'the fleet name is not markup')
  assert.ok(!html.includes('<img'), 'the quota name is not markup')
  assert.ok(!html.includes('<script>alert'), 'nor is the path')
  assert.equal((html.match(/<script/gi) ?? []).length, 1)
  assert.ok(html.includes(`<title>tokenwarden · ${escapeHtml(HOSTILE)} / ${escapeHtml(quota)}</title>`))
  assert.ok(html.includes('&#60;script&#62;alert(1)&#60;/script&#62;'))
  assert.ok(html.includes(`data-fleet="${escapeHtml(HOSTILE)}"`))
  assert.ok(html.includes('data-metrics-path="/v1/fleets/x/quotas/&#34;&#62;&#60;script&#62;alert(3)&#60;/script&#62;/metrics"'))
  assert.equal(escapeHtml(`&<>"'`), '&#38;&#60;&#62;&#34;&#39;')
})

test('the secret stays out of the URL and out of persistent storage', () => {
  const html = dashboardHtml({ fleet: 'acme', quota: 'main', metricsPath: '/v1/fleets/acme/quotas/main/metrics' })
  const input = html.match(/<input id="secret"[^>]*>/)?.[0]
  assert.ok(input, 'a secret input')
  assert.match(input, /type="password"/)
  assert.doesNotMatch(input, /\bname=/, 'a nameless input is never submitted with a form')
  assert.match(html, /<form id="secret-form" method="post"/)
  const script = inline(html, 'script')
  assert.match(script, /sessionStorage/)
  assert.doesNotMatch(script, /localStorage|document\.cookie|location\.(?:search|hash)\s*=|history\./)
  assert.match(script, /authorization: 'Bearer ' \+ key/)
  assert.match(script, /preventDefault\(\)/)
})

test('the inline script and style are the same for every quota, and dashboardCsp() hashes them', () => {
  const a = dashboardHtml({ fleet: 'acme', quota: 'main', metricsPath: '/v1/fleets/acme/quotas/main/metrics' })
  const b = dashboardHtml({ fleet: HOSTILE, quota: 'other', metricsPath: '/m' })
  assert.equal(inline(a, 'script'), inline(b, 'script'))
  assert.equal(inline(a, 'style'), inline(b, 'style'))
  const hash = (text) => `'sha256-${createHash('sha256').update(text, 'utf8').digest('base64')}'`
  const csp = dashboardCsp()
  assert.equal(typeof csp, 'string', 'synchronous: the Worker sets it as a header directly')
  assert.ok(csp.includes(`script-src ${hash(inline(a, 'script'))};`), csp)
  assert.ok(csp.includes(`style-src ${hash(inline(a, 'style'))};`), csp)
  assert.match(csp, /default-src 'none'/)
  assert.match(csp, /connect-src 'self'/)
  assert.match(csp, /frame-ancestors 'none'/)
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/)
})

test('the CSP hashes are SHA-256, base64, of the UTF-8 text', () => {
  const expected = (text) => createHash('sha256').update(text, 'utf8').digest('base64')
  assert.equal(sha256Base64(''), '47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=')
  assert.equal(sha256Base64('abc'), 'ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=')
  // Every padding case around the 64-byte block, and multi-byte characters.
  for (let n = 0; n <= 200; n++) {
    const text = 'x'.repeat(n)
    assert.equal(sha256Base64(text), expected(text), `${n} bytes`)
  }
  for (const text of ['· – … × é 漢字 🙂', `${'a'.repeat(55)}€`, '\u0000\n\r\t']) assert.equal(sha256Base64(text), expected(text), text)
})

test("native serve's copy of the dashboard is this page (serve/assets/, made by scripts/dashboard-asset.mjs)", () => {
  const { html, csp } = dashboardAsset()
  const asset = (name) => readFileSync(fileURLToPath(new URL(`../../serve/assets/${name}`, import.meta.url)), 'utf8')
  assert.equal(asset('dashboard.csp'), csp, 'run node edge/scripts/dashboard-asset.mjs')
  assert.ok(asset('dashboard.html') === html, 'serve/assets/dashboard.html differs from dashboardHtml: run node edge/scripts/dashboard-asset.mjs')
  // Filled in as serve fills it, it is the page dashboardHtml makes.
  const filled = html.replaceAll('{{fleet}}', escapeHtml('a"f')).replaceAll('{{quota}}', 'q').replaceAll('{{metricsPath}}', '/m').replaceAll('{{timelinePath}}', '/t')
  assert.equal(filled, dashboardHtml({ fleet: 'a"f', quota: 'q', metricsPath: '/m', timelinePath: '/t' }))
})
