// The edge limiter's dashboard in headless Chromium (Debian's /usr/bin/chromium driven by
// playwright-core), against the Worker under workerd: the page asks for the fleet secret,
// then shows the quota's live figures; the test reads them from the page and compares them
// with the metrics API, and saves a screenshot (test/.build/edge-dashboard.png; with
// UPDATE_SCREENSHOT=1, over the committed docs/edge-dashboard.png).
import assert from 'node:assert/strict'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { chromium } from 'playwright-core'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const workerEntry = fileURLToPath(new URL('../src/worker.js', import.meta.url))

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium'
const skip = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM}`
const SECRET = 'dashboard-secret-0123456789'
const outdir = fileURLToPath(new URL('../.build/dashboard/', import.meta.url))
const screenshot = fileURLToPath(new URL(process.env.UPDATE_SCREENSHOT ? '../../docs/edge-dashboard.png' : '../.build/edge-dashboard.png', import.meta.url))
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 100_000, output_tokens_per_minute: 20_000, requests_per_minute: 1_000, max_concurrent: 3 }
const ADMIN = 'dashboard-admin-0123456789'
const BURST_POOL = { name: 'claude-haiku-4-5', input_tokens_per_minute: 10_000, requests_per_minute: 1_000 }

let worker
let persist
let browser
let profile

before(async () => {
  if (skip) return
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: workerEntry })
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-dash-'))
  worker = await startWorker({
    outdir,
    persist,
    fleets: { ops: { secret: SECRET, admin_secret: ADMIN, quotas: { anthropic: { config: { pools: [POOL] } }, burst: { config: { pools: [BURST_POOL] } } } } },
    // The second test moves the `burst` quota's clock by hand (POST …/admin/clock).
    bindings: { TOKENWARDEN_TEST_CLOCK: '1' },
  })
  profile = mkdtempSync(join(tmpdir(), 'tokenwarden-chromium-'))
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1200, height: 900 },
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync', '--disable-quic'],
  })
})

after(async () => {
  await browser?.close()
  await worker?.mf.dispose()
  for (const d of [persist, profile]) if (d) rmSync(d, { recursive: true, force: true })
})

test('the dashboard shows the live figures of the quota', { skip }, async () => {
  const q = `${worker.base}/v1/fleets/ops/quotas/anthropic`
  const call = (path, body) =>
    fetch(`${q}${path}`, {
      method: body === undefined ? 'GET' : 'POST',
      headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
  // Some traffic: settled calls, three granted, two queued, and a 429 on one of the granted
  // (which ends that lease, settled as nothing used: two stay in flight).
  // Each of those four is a task, merged.
  for (let i = 0; i < 4; i++) {
    const d = await (await call('/leases', { agent: `done-${i}`, pool: 0, inputTokens: 4000, maxTokens: 500, task: `task-${i}`, unblocks: i })).json()
    await call(`/leases/${d.lease}/settle`, { inputTokens: 3800, outputTokens: 300 })
    await call(`/tasks/task-${i}/done`, { merged: true })
  }
  const live = []
  for (let i = 0; i < 5; i++) live.push(await (await call('/leases', { agent: `agent-${i}`, pool: 0, inputTokens: 2000, maxTokens: 500, role: i === 0 ? 'planner' : 'worker' })).json())
  assert.deepEqual(
    live.map((d) => d.kind),
    ['grant', 'grant', 'grant', 'queued', 'queued'],
  )
  await call('/responses', { pool: 0, lease: live[0].lease, status: 429, headers: [['retry-after', '30']] })
  const metrics = await (await call('/metrics')).json()

  const page = await browser.newPage()
  const errors = []
  page.on('pageerror', (e) => errors.push(String(e)))
  await page.goto(`${q}/dashboard`)
  assert.equal(await page.getAttribute('#app', 'data-state'), 'locked', 'no data before the secret')
  await page.fill('#secret', SECRET)
  await page.click('#connect')
  await page.waitForSelector('#app[data-state="live"]', { timeout: 15_000 })
  await page.waitForSelector('section.pool[data-pool]')

  const pool = metrics.pools[0]
  const shown = await page.$eval('section.pool', (el) => ({ ...el.dataset }))
  assert.equal(Number(shown.queueDepth), pool.queueDepth)
  assert.equal(Number(shown.queueDepth), 2)
  assert.equal(Number(shown.inFlight), 2)
  assert.equal(Number(shown.marginPermille), pool.marginPermille)
  assert.equal(shown.paused, 'true')
  assert.ok(shown.rateLimitedMinutes.split(',').length >= 1, 'the 429 is marked')
  const input = await page.$eval('.axis[data-axis="input_tokens"]', (el) => ({ ...el.dataset }))
  assert.equal(Number(input.limit), 100_000)
  assert.equal(Number(await page.getAttribute('#agents', 'data-agents')), metrics.agents.length)
  const states = await page.$$eval('tr.agent', (rows) => rows.map((r) => r.dataset.state))
  assert.equal(states.filter((s) => s === 'queued').length, 2)
  assert.equal(states.filter((s) => s === 'in_flight').length, 2)
  // Agents by name, not by id: the name in the first cell and in data-agent-name.
  const rows = await page.$$eval('tr.agent', (rows) => rows.map((r) => ({ name: r.dataset.agentName, shown: r.cells[0].textContent })))
  assert.deepEqual(rows.map((r) => r.name).sort(), metrics.agents.map((a) => a.name).sort())
  assert.ok(
    rows.some((r) => r.shown === 'done-0'),
    JSON.stringify(rows),
  )
  for (const r of rows) assert.equal(r.shown, r.name)
  const tasks = await page.$eval('#tasks', (el) => ({ ...el.dataset, hidden: el.hidden }))
  assert.equal(tasks.hidden, false)
  assert.equal(Number(tasks.merged), 4)
  assert.equal(Number(tasks.tokensPerMergedTask), metrics.tasks.sinceStart.tokensPerMergedTask)
  assert.equal(Number(tasks.tokensPerMergedTask), 4100)
  assert.equal(Number(tasks.rateLimitedPermille), metrics.tasks.sinceStart.rateLimitedPermille)
  assert.ok((await page.$eval('tr[data-figure="tokens"]', (el) => el.textContent)).includes('4,100') || (await page.$eval('tr[data-figure="tokens"]', (el) => el.textContent)).includes('4100'))
  assert.deepEqual(errors, [])
  await page.screenshot({ path: screenshot, fullPage: true })

  // A wrong secret is refused visibly.
  const other = await browser.newPage()
  await other.goto(`${q}/dashboard`)
  await other.evaluate(() => sessionStorage.clear())
  await other.fill('#secret', 'wrong-secret-wrong-secret')
  await other.click('#connect')
  await other.waitForSelector('#error[data-status="401"]', { timeout: 15_000 })
  await other.close()
  await page.close()
})

test('the minute bars read true: the running minute is named as such, a minute above the limit shows its burst apart', { skip }, async () => {
  const q = `${worker.base}/v1/fleets/ops/quotas/burst`
  const call = (path, body, secret = SECRET) =>
    fetch(`${q}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    })
  const advance = async (ms) => {
    const r = await call('/admin/clock', { advanceMs: ms }, ADMIN)
    assert.equal(r.status, 200, await r.clone().text())
    return (await r.json()).now
  }
  // One second into a minute (m0) of the quota's own clock, stopped from here on.
  const now = await advance(0)
  const m0 = Math.floor((await advance(60_000 - (now % 60_000) + 1_000)) / 60_000)
  // 12,000 input tokens in m0 against a limit of 10,000: 8,000 at once, 4,000 more from the
  // refill 30 s later (the bucket's burst and half a minute's refill).
  for (const [agent, tokens] of [
    ['big', 8_000],
    ['later', 4_000],
  ]) {
    const a = await (await call('/leases', { agent, pool: 0, inputTokens: tokens, maxTokens: 10 })).json()
    assert.equal(a.kind, 'grant', JSON.stringify(a))
    assert.equal((await call(`/leases/${a.lease}/settle`, { inputTokens: tokens, outputTokens: 5 })).status, 200)
    if (agent === 'big') await advance(30_000)
  }
  // The next minute (m1, running): 1,000 so far.
  await advance(30_000)
  const b = await (await call('/leases', { agent: 'small', pool: 0, inputTokens: 1_000, maxTokens: 10 })).json()
  assert.equal((await call(`/leases/${b.lease}/settle`, { inputTokens: 1_000, outputTokens: 5 })).status, 200)

  const page = await browser.newPage()
  const errors = []
  page.on('pageerror', (e) => errors.push(String(e)))
  await page.goto(`${q}/dashboard`)
  await page.fill('#secret', SECRET)
  await page.click('#connect')
  await page.waitForSelector('#app[data-state="live"]', { timeout: 15_000 })
  await page.waitForSelector('.axis[data-axis="input_tokens"] svg.chart')
  const axis = '.axis[data-axis="input_tokens"]'
  const heading = await page.$eval(`${axis} small.minutes`, (el) => el.textContent)
  assert.match(heading, /^this minute so far 1,000 · last complete minute 12,000 \/ 10,000 \(120\.0 %\) — above the limit: a burst from a full bucket/, heading)
  const bars = await page.$$eval(`${axis} rect.bar`, (els) => els.map((e) => ({ minute: Number(e.dataset.minute), used: Number(e.dataset.used), current: e.classList.contains('current') })))
  assert.deepEqual(
    bars.filter((x) => x.used > 0),
    [
      { minute: m0, used: 12_000, current: false },
      { minute: m0 + 1, used: 1_000, current: true },
    ],
  )
  // The 2,000 above the limit are a segment of their own, said to be the burst in its title.
  const burst = await page.$$eval(`${axis} rect.burst`, (els) => els.map((e) => ({ minute: Number(e.dataset.minute), above: Number(e.dataset.above), title: e.textContent })))
  assert.equal(burst.length, 1)
  assert.equal(burst[0].minute, m0)
  assert.equal(burst[0].above, 2_000)
  assert.match(burst[0].title, /2,000 above it: a burst from a full bucket/)
  // The solid bar stops at the limit line.
  const [barTop, limitY] = await page.$eval(axis, (el) => [
    Number(el.querySelector('rect.bar:not(.current)[data-used="12000"]').getAttribute('y')),
    Number(el.querySelector('line.limit').getAttribute('y1')),
  ])
  assert.ok(Math.abs(barTop - limitY) < 0.5, `bar top ${barTop}, limit at ${limitY}`)
  assert.deepEqual(errors, [])
  await page.close()
})
