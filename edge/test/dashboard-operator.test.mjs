// What an operator sees (issue 28, items 1, 2, 5, 6): each agent's state (waiting —
// queued, refused, rate-limited, backing off — vs in flight vs idle) on the dashboard and in
// Prometheus; the ceiling named wherever a 429 or a refusal is reported; the 429-vs-turn
// overlay (the Durable Object's bounded timeline, GET …/timeline, charted per agent); and the
// first visit (how to sign in, where the secret is, "No agents yet" only when true). The
// dashboard runs in headless Chromium (Debian's /usr/bin/chromium, playwright-core) against
// the Worker under workerd; the last test drives a small fleet through proxy mode against a
// mock provider with tight limits and saves a screenshot (test/.build/dashboard-operator.png;
// with UPDATE_SCREENSHOT=1, over the committed docs/dashboard.png).
import assert from 'node:assert/strict'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { chromium } from 'playwright-core'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'
import { MAX_AGENT_LABELS, prometheusText } from '../src/prometheus.js'
import { TIMELINE_MAX_EVENTS, TIMELINE_WINDOW_MS, Timeline } from '../src/timeline.js'

const workerEntry = fileURLToPath(new URL('../src/worker.js', import.meta.url))
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium'
const noChromium = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM}`
const SECRET = 'operator-fleet-secret-0123456789'
const outdir = fileURLToPath(new URL('../.build/dashboard-operator/', import.meta.url))
const screenshot = fileURLToPath(new URL(process.env.UPDATE_SCREENSHOT ? '../../docs/dashboard.png' : '../.build/dashboard-operator.png', import.meta.url))
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 100_000, output_tokens_per_minute: 20_000, requests_per_minute: 1_000, max_concurrent: 3 }

let worker
let mock
let gateway
let persist
let browser
let profile

/**
 * A gateway in front of the mock provider that names the limit of each 429 it passes on
 * (`rate_limit_type`, as an LLM gateway does): the mock says which bucket ran dry in
 * `x-mock-limit`.
 */
async function startGateway(upstream) {
  const server = createServer(async (req, res) => {
    const chunks = []
    for await (const c of req) chunks.push(c)
    const headers = { ...req.headers }
    delete headers.host
    delete headers['content-length']
    try {
      const r = await fetch(upstream + req.url, { method: req.method, headers, body: chunks.length ? Buffer.concat(chunks) : undefined })
      const out = {}
      r.headers.forEach((v, k) => {
        if (k !== 'content-length' && k !== 'content-encoding' && k !== 'transfer-encoding') out[k] = v
      })
      if (r.status === 429) {
        const limit = r.headers.get('x-mock-limit')
        out.rate_limit_type = limit === 'forced' || limit === null ? 'input_tokens' : limit === 'concurrency' ? 'concurrent' : limit
      }
      const body = Buffer.from(await r.arrayBuffer())
      res.writeHead(r.status, out)
      res.end(body)
    } catch (e) {
      res.writeHead(502, { 'content-type': 'text/plain' })
      res.end(String(e))
    }
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) }
}

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: workerEntry })
  // Tight limits: about ten of the fleet's calls a minute fit the input limit.
  mock = await startMockProvider({ inputTokensPerMinute: 12_000, requestsPerMinute: 60, replyTokens: 20, delayMs: 1_200, chunkDelayMs: 5 })
  gateway = await startGateway(mock.url)
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-operator-'))
  worker = await startWorker({
    outdir,
    persist,
    fleets: {
      ops: {
        secret: SECRET,
        quotas: {
          api: { config: { pools: [POOL] } },
          empty: { config: { pools: [POOL] } },
          live: { config: { pools: [{ name: 'default' }] }, upstream: gateway.url },
        },
      },
      open: { secret: SECRET, proxy_open: true, quotas: { q: { config: { pools: [POOL] } } } },
    },
  })
  if (noChromium) return
  profile = mkdtempSync(join(tmpdir(), 'tokenwarden-chromium-'))
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync', '--disable-quic'],
  })
})

after(async () => {
  await browser?.close()
  await worker?.mf.dispose()
  await gateway?.close()
  await mock?.close()
  for (const d of [persist, profile]) if (d) rmSync(d, { recursive: true, force: true })
})

const quotaUrl = (quota, fleet = 'ops') => `${worker.base}/v1/fleets/${fleet}/quotas/${quota}`
function call(quota, path, body, secret = SECRET) {
  return fetch(`${quotaUrl(quota)}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { ...(secret === null ? {} : { authorization: `Bearer ${secret}` }), 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
}

/** Prometheus text → Map of `name{labels}` (labels sorted) → value. */
function samples(text) {
  const out = new Map()
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue
    const m = /^([a-z_]+)\{(.*)\} (\S+)$/.exec(line)
    assert.ok(m, line)
    const labels = [...m[2].matchAll(/([a-z_]+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]).filter(([k]) => k !== 'fleet' && k !== 'quota')
    labels.sort((a, b) => (a[0] < b[0] ? -1 : 1))
    out.set(`${m[1]}{${labels.map(([k, v]) => `${k}=${v}`).join(',')}}`, Number(m[3]))
  }
  return out
}

test('Prometheus: a state gauge per agent (bounded: the 20 most active by name, the rest as "other"), the 429 axis, the wait left, the ceilings hit', () => {
  const now = 1_000_000
  const agents = []
  // 25 busy agents w00..w24 (ranked before the idle ones, then by name), 10 idle with more
  // settled calls.
  for (let i = 0; i < 25; i++) {
    const activity =
      i === 0
        ? { state: 'rate_limited', until: now + 14_000, axis: 'input_tokens' }
        : i === 1
          ? { state: 'refused', until: now + 5_000 }
          : i === 2
            ? { state: 'backing_off', until: now + 2_000 }
            : i === 3
              ? { state: 'in_flight' }
              : i < 22
                ? { state: 'queued', since: now - 12_000, expectedGrant: now + 8_000 }
                : { state: 'rate_limited', until: now + 30_000, axis: null }
    agents.push({ agent: i, name: `w${String(i).padStart(2, '0')}`, activity, inFlight: i === 3 ? 1 : 0, queued: activity.state === 'queued' ? 1 : 0, settled: 0, lastSeen: now })
  }
  for (let i = 0; i < 10; i++) agents.push({ agent: 100 + i, name: `idle${i}`, activity: { state: 'idle' }, inFlight: 0, queued: 0, settled: 50, lastSeen: now })
  const ceilings = { since: 0, pools: [{ pool: 'p', rateLimited: { input_tokens: 3, unknown: 1 }, rejected: { 'exceeds_capacity:input_tokens': 2, queue_full: 1 } }] }
  const text = prometheusText({ now, liveLeases: 0, pools: [], agents, ceilings }, { fleet: 'f', quota: 'q' })
  const s = samples(text)
  assert.match(text, /^# TYPE tokenwarden_agent_state gauge$/m)
  assert.equal(s.get('tokenwarden_agent_state{agent=w00,state=rate_limited}'), 1)
  assert.equal(s.get('tokenwarden_agent_state{agent=w00,state=idle}'), 0, 'every state of a named agent, 0 for the others')
  assert.equal(s.get('tokenwarden_agent_state{agent=w01,state=refused}'), 1)
  assert.equal(s.get('tokenwarden_agent_state{agent=w02,state=backing_off}'), 1)
  assert.equal(s.get('tokenwarden_agent_state{agent=w03,state=in_flight}'), 1)
  assert.equal(s.get('tokenwarden_agent_state{agent=w05,state=queued}'), 1)
  assert.equal(s.get('tokenwarden_agent_rate_limited{agent=w00,axis=input_tokens}'), 1)
  assert.equal(s.get('tokenwarden_agent_wait_remaining_seconds{agent=w00}'), 14)
  assert.equal(s.get('tokenwarden_agent_wait_remaining_seconds{agent=w05}'), 8, 'a queued agent: until its expected grant')
  // Bounded: 20 names and "other", whatever the fleet's size; the idle agents rank last.
  const names = new Set([...s.keys()].filter((k) => k.startsWith('tokenwarden_agent_state{')).map((k) => /agent=([^,]+)/.exec(k)[1]))
  assert.equal(names.size, MAX_AGENT_LABELS + 1)
  assert.ok(names.has('other'))
  assert.ok(![...names].some((n) => n.startsWith('idle')), 'waiting agents rank before idle ones')
  assert.equal(s.get('tokenwarden_agent_state{agent=other,state=idle}'), 10)
  assert.equal(s.get('tokenwarden_agent_state{agent=other,state=rate_limited}'), 3, 'w22..w24')
  assert.equal(s.get('tokenwarden_agent_state{agent=other,state=queued}'), 2, 'w20, w21')
  assert.equal(s.get('tokenwarden_agent_rate_limited{agent=other,axis=unknown}'), 3)
  assert.equal(s.get('tokenwarden_agents{state=rate_limited}'), 4)
  assert.equal(s.get('tokenwarden_agents{state=backing_off}'), 1)
  // The ceilings.
  assert.equal(s.get('tokenwarden_rate_limited_by_axis_total{axis=input_tokens,pool=p}'), 3)
  assert.equal(s.get('tokenwarden_rate_limited_by_axis_total{axis=unknown,pool=p}'), 1)
  assert.equal(s.get('tokenwarden_rejected_by_reason_total{axis=input_tokens,pool=p,reason=exceeds_capacity}'), 2)
  assert.equal(s.get('tokenwarden_rejected_by_reason_total{pool=p,reason=queue_full}'), 1)
})

/** A stand-in for the driver's event emitter. */
function emitter() {
  const on = new Map()
  return {
    on: (name, fn) => on.set(name, [...(on.get(name) ?? []), fn]),
    emit: (name, e) => {
      for (const fn of on.get(name) ?? []) fn(e)
    },
  }
}

test('the timeline is a fixed-size ring of the last minutes: 429s name their agent (by the lease) and the limit', () => {
  const t = new Timeline()
  const tw = emitter()
  t.listen(tw)
  for (let i = 0; i < TIMELINE_MAX_EVENTS + 1000; i++) tw.emit('granted', { lease: i, agent: i % 7, pool: 0, expiresAt: 0, waitedMs: i % 3 === 0 ? 500 : 0 })
  tw.emit('rate_limited', { pool: 0, lease: TIMELINE_MAX_EVENTS + 999, status: 429, retryAfterMs: 14_000, exceeded: 'input_tokens' })
  tw.emit('rejected', { agent: 3, pool: 0, reason: { kind: 'exceeds_capacity', axis: 'input_tokens' }, retryAt: null })
  tw.emit('rejected', { agent: 4, pool: 0, reason: { kind: 'queue_full' }, retryAt: Date.now() + 3000 })
  tw.emit('waiting', { agent: 5, pool: 0, delayMs: 2000, attempt: 1, cause: 'rate_limited' })
  tw.emit('waiting', { agent: 5, pool: 0, delayMs: 2000, attempt: 1, cause: 'rejected' })
  assert.equal(t.size, TIMELINE_MAX_EVENTS, 'never more than the ring holds')
  const names = (id) => (id === 6 ? 'six' : null)
  const v = t.view(Date.now(), names, ['default'])
  assert.equal(v.events.length, TIMELINE_MAX_EVENTS)
  assert.equal(v.windowMs, TIMELINE_WINDOW_MS)
  const limited = v.events.find((e) => e.kind === 'rate_limited')
  assert.equal(limited.agent, String((TIMELINE_MAX_EVENTS + 999) % 7) === '6' ? 'six' : String((TIMELINE_MAX_EVENTS + 999) % 7))
  assert.equal(limited.exceeded, 'input_tokens')
  assert.equal(limited.pool, 'default')
  assert.deepEqual(
    v.events.filter((e) => e.kind === 'refused').map((e) => [e.agent, e.reason, e.axis]),
    [
      ['3', 'exceeds_capacity', 'input_tokens'],
      ['4', 'queue_full', null],
    ],
  )
  assert.equal(v.events.filter((e) => e.kind === 'backoff').length, 1, 'a wait after a refusal is the refusal, not a second event')
  assert.deepEqual(t.ceilings(['default']).pools, [{ pool: 'default', rateLimited: { input_tokens: 1 }, rejected: { 'exceeds_capacity:input_tokens': 1, queue_full: 1 } }])
  assert.equal(t.view(Date.now() + TIMELINE_WINDOW_MS + 1000, names, ['default']).events.length, 0, 'older than the window: left out')
  t.clear()
  assert.equal(t.size, 0)
})

/** Traffic on quota `api`: three in flight, two queued, a 429 (input tokens) on one, a refusal. */
async function traffic() {
  const live = []
  for (let i = 0; i < 5; i++) live.push(await (await call('api', '/leases', { agent: `a${i}`, pool: 0, inputTokens: 2000, maxTokens: 500 })).json())
  assert.deepEqual(
    live.map((d) => d.kind),
    ['grant', 'grant', 'grant', 'queued', 'queued'],
  )
  const r = await call('api', '/responses', {
    pool: 0,
    lease: live[0].lease,
    status: 429,
    headers: [
      ['retry-after', '30'],
      ['rate_limit_type', 'input_tokens'],
    ],
  })
  assert.equal(r.status, 200, await r.clone().text())
  const refused = await (await call('api', '/leases', { agent: 'a5', pool: 0, inputTokens: 500_000, maxTokens: 500 })).json()
  assert.equal(refused.kind, 'reject')
  assert.equal(refused.reason.kind, 'exceeds_capacity')
}

test('GET …/timeline: authenticated, the call starts, 429s and refusals by agent name; /metrics and Prometheus name the ceilings and the states', async () => {
  assert.equal((await call('api', '/timeline', undefined, null)).status, 401)
  assert.equal((await call('api', '/timeline', undefined, 'wrong-secret-wrong-secret')).status, 401)
  // A fleet that takes proxied calls without a secret still wants it for the timeline.
  assert.equal((await fetch(`${quotaUrl('q', 'open')}/timeline`)).status, 401)
  await traffic()
  const tl = await (await call('api', '/timeline')).json()
  assert.equal(tl.windowMs, TIMELINE_WINDOW_MS)
  const kinds = (k) => tl.events.filter((e) => e.kind === k)
  assert.deepEqual(
    kinds('send').map((e) => e.agent),
    ['a0', 'a1', 'a2'],
  )
  assert.deepEqual(
    kinds('rate_limited').map((e) => [e.agent, e.exceeded, e.retryAfterMs]),
    [['a0', 'input_tokens', 30_000]],
  )
  assert.deepEqual(
    kinds('refused').map((e) => [e.agent, e.reason, e.axis, e.until]),
    [['a5', 'exceeds_capacity', 'input_tokens', null]],
  )
  const metrics = await (await call('api', '/metrics')).json()
  assert.deepEqual(metrics.ceilings.pools, [{ pool: POOL.name, rateLimited: { input_tokens: 1 }, rejected: { 'exceeds_capacity:input_tokens': 1 } }])
  const a0 = metrics.agents.find((a) => a.name === 'a0')
  assert.equal(a0.activity.state, 'rate_limited')
  assert.equal(a0.activity.axis, 'input_tokens')
  const res = await fetch(`${quotaUrl('api')}/metrics?format=prometheus`, { headers: { authorization: `Bearer ${SECRET}` } })
  const s = samples(await res.text())
  assert.equal(s.get('tokenwarden_agent_state{agent=a0,state=rate_limited}'), 1)
  assert.equal(s.get('tokenwarden_agent_state{agent=a3,state=queued}'), 1)
  assert.equal(s.get('tokenwarden_agent_state{agent=a1,state=in_flight}'), 1)
  assert.equal(s.get('tokenwarden_agent_rate_limited{agent=a0,axis=input_tokens}'), 1)
  assert.equal(s.get(`tokenwarden_rate_limited_by_axis_total{axis=input_tokens,pool=${POOL.name}}`), 1)
  assert.equal(s.get(`tokenwarden_rejected_by_reason_total{axis=input_tokens,pool=${POOL.name},reason=exceeds_capacity}`), 1)
})

test('the dashboard: the first visit says how to sign in and where the secret is, then each agent waiting or not, the 429-vs-turn overlay and the ceilings', { skip: noChromium }, async () => {
  // (The traffic of the test above is on quota `api`: agents queued and rate-limited.)
  const page = await browser.newPage()
  const errors = []
  page.on('pageerror', (e) => errors.push(String(e)))
  await page.goto(`${quotaUrl('api')}/dashboard`)
  assert.equal(await page.getAttribute('#app', 'data-state'), 'locked')
  // Before sign-in: no "No agents yet" (there are agents: the page does not know yet), and
  // the way in.
  assert.equal(await page.isVisible('#agents-empty'), false, '"No agents yet" before sign-in, with agents queued')
  assert.equal(await page.isVisible('#agents-locked'), true)
  assert.equal(await page.isVisible('#signin-help'), true)
  const help = await page.textContent('#signin-help')
  for (const where of ['.tokenwarden/secret', '<data dir>/secret', '--config FILE', 'fleets.ops.secret', 'TOKENWARDEN_FLEETS']) assert.ok(help.includes(where), `the help names ${where}: ${help}`)
  await page.fill('#secret', SECRET)
  await page.click('#connect')
  await page.waitForSelector('#app[data-state="live"]', { timeout: 15_000 })
  await page.waitForSelector('#overlay[data-status="ok"] svg#timeline-chart')
  assert.equal(await page.isVisible('#signin-help'), false)
  assert.equal(await page.isVisible('#agents-empty'), false)

  // Item 1: each agent's state in words, times relative to now.
  const state = (name) => page.$eval(`tr.agent[data-agent-name="${name}"]`, (r) => ({ ...r.dataset, text: r.querySelector('td.state').textContent }))
  const a0 = await state('a0')
  assert.equal(a0.state, 'rate_limited')
  assert.equal(a0.axis, 'input_tokens')
  assert.match(a0.text, /^rate-limited \(input tokens\) for \d+ s more$/)
  const a3 = await state('a3')
  assert.equal(a3.state, 'queued')
  assert.match(a3.text, /^queued (<1|\d+) s(, expected (in ~\d+ s|now))?$/)
  assert.equal((await state('a1')).text, 'in flight')
  const summary = await page.$eval('#summary', (el) => ({ ...el.dataset }))
  assert.equal(Number(summary.agentsRateLimited), 1)
  assert.equal(Number(summary.agentsQueued), 2)

  // Item 5: the overlay — a row per agent, call starts, the open waits, the 429 in red with
  // its limit, the pool's 429s per minute on top.
  const rows = await page.$$eval('svg#timeline-chart g.tl-row', (gs) =>
    gs.map((g) => ({
      ...g.dataset,
      sends: g.querySelectorAll('rect.tl-send').length,
      limited: [...g.querySelectorAll('path.tl-429')].map((p) => p.dataset.exceeded),
      open: g.querySelectorAll('rect.tl-wait[data-kind="queued"][data-open="true"]').length,
      refused: g.querySelectorAll('rect.tl-wait[data-kind="refused"]').length,
    })),
  )
  const row = (name) => rows.find((r) => r.agentName === name)
  for (const n of ['a0', 'a1', 'a2']) assert.equal(row(n).sends, 1, n)
  assert.deepEqual(row('a0').limited, ['input_tokens'])
  assert.equal(row('a3').open, 1, 'a queued agent: its wait runs to now')
  assert.equal(row('a4').open, 1)
  assert.equal(row('a5').refused, 1)
  const minutes = await page.$$eval('svg#timeline-chart rect.tl-minute', (rs) => rs.map((r) => Number(r.dataset.rateLimited)))
  assert.equal(
    minutes.reduce((a, b) => a + b, 0),
    1,
  )

  // Item 2: the ceiling named in the event list and beside the pool.
  const events = await page.$$eval('tr.event', (rs) => rs.map((r) => ({ ...r.dataset, text: r.textContent })))
  const limited = events.find((e) => e.kind === 'rate_limited')
  assert.equal(limited.exceeded, 'input_tokens')
  assert.equal(limited.agentName, 'a0')
  assert.ok(limited.text.includes('input tokens limit exceeded'), limited.text)
  const refused = events.find((e) => e.kind === 'refused')
  assert.equal(refused.reason, 'exceeds_capacity')
  assert.ok(refused.text.includes('exceeds capacity (input tokens)'), refused.text)
  const ceilings = await page.$eval('section.pool .ceilings', (el) => ({ ...el.dataset, text: el.textContent }))
  assert.equal(ceilings.rateLimitedBy, 'input_tokens=1')
  assert.equal(ceilings.rejectedBy, 'exceeds_capacity:input_tokens=1')
  assert.deepEqual(errors, [])
  await page.close()

  // Item 6: "No agents yet" when it is true.
  const empty = await browser.newPage()
  await empty.goto(`${quotaUrl('empty')}/dashboard`)
  assert.equal(await empty.isVisible('#agents-empty'), false)
  await empty.fill('#secret', SECRET)
  await empty.click('#connect')
  await empty.waitForSelector('#app[data-state="live"]', { timeout: 15_000 })
  assert.equal(await empty.isVisible('#agents-empty'), true)
  assert.equal(await empty.isVisible('#agents-locked'), false)
  await empty.close()
})

test('a live fleet through proxy mode against tight limits: waits, 429s and call starts on the overlay (screenshot)', { skip: noChromium, timeout: 180_000 }, async () => {
  const AGENTS = ['planner', 'worker-1', 'worker-2', 'worker-3', 'worker-4', 'worker-5', 'reviewer']
  const stop = new AbortController()
  const filler = 'The parser drops the last token of a line when it ends with a comment. '.repeat(26)
  const outcomes = []
  const loop = async (agent, i) => {
    await new Promise((r) => setTimeout(r, i * 150))
    while (!stop.signal.aborted) {
      try {
        const res = await fetch(`${quotaUrl('live')}/proxy/v1/messages`, {
          method: 'POST',
          headers: { 'x-tokenwarden-token': SECRET, 'x-tokenwarden-agent': agent, 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: `${agent}: ${filler}` }] }),
          signal: stop.signal,
        })
        outcomes.push(res.status)
        await res.arrayBuffer()
      } catch {
        // stopped
      }
      await new Promise((r) => setTimeout(r, 300))
    }
  }
  const loops = AGENTS.map(loop)
  // The coordinator learns the limits from the first answers and keeps the fleet under them;
  // now and then someone outside it spends the key too, and the provider answers 429s
  // (naming the input-token limit, through the gateway).
  const outside = setInterval(() => mock.fail429(2, { retryAfterSeconds: 4 }), 6_000)
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
  const errors = []
  page.on('pageerror', (e) => errors.push(String(e)))
  await page.goto(`${quotaUrl('live')}/dashboard`)
  await page.fill('#secret', SECRET)
  await page.click('#connect')
  await page.waitForSelector('#app[data-state="live"]', { timeout: 15_000 })
  try {
    // Run until the fleet has queued, been refused or rate-limited, and 429s are on the chart.
    const deadline = Date.now() + 120_000
    let tl
    for (;;) {
      await new Promise((r) => setTimeout(r, 2_000))
      tl = await (await call('live', '/timeline')).json()
      const sends = new Set(tl.events.filter((e) => e.kind === 'send').map((e) => e.agent))
      const limited = tl.events.filter((e) => e.kind === 'rate_limited').length
      const waited = tl.events.filter((e) => (e.kind === 'send' && e.waitedMs > 0) || e.kind === 'refused' || e.kind === 'backoff').length
      const m = await (await call('live', '/metrics')).json()
      const waitingNow = m.agents.filter((a) => a.activity.state !== 'idle' && a.activity.state !== 'in_flight').length
      if ((sends.size >= 5 && limited >= 1 && waited >= 3 && waitingNow >= 2 && Date.now() > deadline - 75_000) || Date.now() > deadline) break
    }
    const count = (k) => tl.events.filter((e) => e.kind === k).length
    assert.ok(
      tl.events.some((e) => e.kind === 'rate_limited' && e.exceeded !== null),
      `a 429 naming its limit: ${count('send')} sends, ${count('rate_limited')} 429s, ${count('refused')} refusals, ${count('backoff')} backoffs; statuses ${outcomes.join()}`,
    )
    // The screenshot when the page shows agents in flight beside waiting ones.
    const until = Date.now() + 30_000
    while (Date.now() < until) {
      const d = await page.$eval('#summary', (el) => ({ ...el.dataset }))
      if (
        Number(d.agentsInFlight) >= 1 &&
        Number(d.agentsQueued) + Number(d.agentsRateLimited) + Number(d.agentsRefused) + Number(d.agentsBackingOff) >= 2 &&
        Number(d.agentsRateLimited) + Number(d.agentsBackingOff) >= 1
      )
        break
      await page.waitForTimeout(250)
    }
    const rows = await page.$$eval('svg#timeline-chart g.tl-row', (gs) => gs.map((g) => ({ name: g.dataset.agentName, sends: Number(g.dataset.sends) })))
    assert.ok(rows.length >= 5, JSON.stringify(rows))
    assert.ok(rows.filter((r) => r.sends > 0).length >= 5)
    assert.ok((await page.$$('svg#timeline-chart path.tl-429')).length >= 1)
    const states = await page.$$eval('tr.agent', (rs) => rs.map((r) => r.dataset.state))
    assert.ok(
      states.some((s) => s !== 'idle'),
      states.join(),
    )
    await page.screenshot({ path: screenshot, fullPage: true })
    assert.deepEqual(errors, [])
  } finally {
    clearInterval(outside)
    stop.abort()
    await Promise.allSettled(loops)
    await page.close()
  }
  assert.ok(outcomes.includes(200), outcomes.join())
})
