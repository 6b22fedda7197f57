// The wasm build in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core): every conformance trace replayed through the `web` build, identical to
// native, and the shared driver running on real browser timers; then the browser example.
import assert from 'node:assert/strict'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { chromium } from 'playwright-core'
import { startStaticServer } from './static-server.mjs'

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium'
const skip = existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM} (scripts/test.sh installs Debian's chromium)`

let server
let browser
let profile

before(async () => {
  if (skip) return
  server = await startStaticServer()
  profile = mkdtempSync(join(tmpdir(), 'tokenwarden-chromium-'))
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync', '--disable-quic'],
  })
})

after(async () => {
  await browser?.close()
  await server?.close()
  if (profile) rmSync(profile, { recursive: true, force: true })
})

async function open(path) {
  const page = await browser.newPage()
  const errors = []
  page.on('pageerror', (e) => errors.push(String(e)))
  page.on('response', (r) => r.status() >= 400 && !r.url().endsWith('/favicon.ico') && errors.push(`${r.status()} ${r.url()}`))
  await page.goto(`${server.url}${path}`)
  return { page, errors }
}

test('every trace replays identically through the web build in Chromium', { skip }, async () => {
  const { page, errors } = await open('/bindings-wasm/test/browser/traces.html')
  await page.waitForFunction(() => window.__results !== undefined, null, { timeout: 60_000 })
  const r = await page.evaluate(() => window.__results)
  assert.equal(r.fatal, undefined, r.fatal)
  assert.deepEqual(errors, [])
  assert.ok(r.results.length >= 39, `${r.results.length} traces`)
  const failed = r.results.filter((x) => x.error !== null)
  assert.deepEqual(failed, [], 'every trace matches native')
  assert.ok(r.driver.waitedMs >= 40, `the second lease waited for the first to settle: ${r.driver.waitedMs} ms`)
  assert.equal(r.driver.liveLeases, 0)
  assert.deepEqual(r.tokens, { o200k: 14, cl100k: 16 }, 'the tokenizer counts as tiktoken does, its ranks fetched')
  console.log(`# chromium: ${r.results.length} traces identical to native; wasm init ${r.initMs.toFixed(1)} ms; ${r.userAgent.match(/Chrome\/[\d.]+/)?.[0]}`)
  await page.close()
})

test('the browser example runs a fleet on the wasm engine and shows its figures', { skip }, async () => {
  const { page, errors } = await open('/examples/browser/')
  await page.waitForFunction(() => window.__fleet?.done === true, null, { timeout: 60_000 })
  const fleet = await page.evaluate(() => window.__fleet)
  assert.deepEqual(errors, [])
  assert.equal(fleet.calls, fleet.expectedCalls)
  assert.equal(fleet.rateLimitedSeenByAgents, 0)
  assert.ok(fleet.queued > 0, 'the limits bound: some calls queued')
  const shown = await page.textContent('#calls')
  assert.equal(Number(shown), fleet.calls, 'the page shows the real call count')
  await page.close()
})
