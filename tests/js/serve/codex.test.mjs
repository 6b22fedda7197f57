// Real Codex CLI through `tokenwarden serve` (issue 27, item 1; issue 43's ×6): six headless
// `codex exec` processes at once (@openai/codex, pinned in package.json; its native binary comes in the
// per-platform package), each with its own HOME and CODEX_HOME, against the mock provider's
// Responses API. Codex speaks only `POST <base>/responses` (streamed); where WebSockets are
// on (the built-in OpenAI provider, or a custom one with `supports_websockets = true`) it
// first asks for the Responses WebSocket, which serve refuses with 426 — Codex then falls
// back to HTTP streaming at once (one attempt, no "Reconnecting…" retries). Four of the six
// take that path. Each exec must exit 0 with the mock's reply; the provider must have seen
// only `/v1/responses` calls, each answered 200 (no 429: the mock's concurrency is the
// quota's, so a call the limiter let through early would meet one), every one leased and
// settled, the agents by name in /metrics. Needs WORKERD (the test script sets it); skips,
// loudly, when @openai/codex is not installed or cannot run here.
import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { codexCli, freePort, runCodexExec, serve, stop } from './support.mjs'

const SECRET = 'serve-codex-secret-0123456789'
const MODEL = 'gpt-5-mock'
const AGENTS = 6
const REPLY = 'mock reply from the local provider with some plain words mock reply'

const codex = process.env.WORKERD ? codexCli() : { js: null }
const runCodex = (dir, baseUrl, options) => runCodexExec(codex.js, dir, baseUrl, { model: MODEL, ...options })
const skip = !process.env.WORKERD ? 'set WORKERD to the workerd binary' : codex.js === null ? codex.why : false
if (codex.js === null && process.env.WORKERD) console.error(`\n*** SKIPPED: the Codex CLI test: ${skip} ***\n`)

describe(`Codex CLI × ${AGENTS} through tokenwarden serve`, { skip }, () => {
  let mock
  let data
  let server
  let origin
  const quota = () => `${origin}/v1/fleets/ci/quotas/openai`
  const metrics = async () => {
    const res = await fetch(`${quota()}/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })
    assert.equal(res.status, 200)
    return res.json()
  }

  before(async () => {
    // Two calls at a time at the provider, as the quota says: more at once is a 429.
    mock = await startMockProvider({ concurrency: 2, tokensPerMinute: 4_000_000, replyTokens: 12, chunkDelayMs: 40, recordHeaders: true })
    data = mkdtempSync(join(tmpdir(), 'tokenwarden-codex-'))
    const config = join(data, 'tokenwarden.json')
    const pool = { name: MODEL, counting: 'openai', tokens_per_minute: 4_000_000, requests_per_minute: 1_000, max_concurrent: 2 }
    writeFileSync(config, JSON.stringify({ fleets: { ci: { secret: SECRET, proxy_open: true, quotas: { openai: { upstream: mock.url, config: { pools: [pool] } } } } } }))
    const port = await freePort()
    origin = `http://127.0.0.1:${port}`
    server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
  })

  after(async () => {
    if (server) await stop(server.child)
    await mock?.close()
    if (data) rmSync(data, { recursive: true, force: true })
  })

  test(`${AGENTS} headless codex exec in parallel: each completes, the WebSocket refused and HTTP used at once, only leased /v1/responses calls, 0 429s, every lease settled`, { timeout: 150_000 }, async () => {
    const kinds = Array.from({ length: AGENTS }, (_, i) => [{ provider: 'custom', websockets: true }, { provider: 'builtin' }, { provider: 'custom', websockets: false }][i % 3])
    const runs = await Promise.all(
      kinds.map((kind, i) => {
        const dir = join(data, `agent-${i}`)
        mkdirSync(dir)
        return runCodex(dir, `${quota()}/agents/codex-${i}/worker/openai/v1`, { ...kind, key: `sk-dummy-codex-${i}` })
      }),
    )
    for (const [i, r] of runs.entries()) {
      const log = `agent ${i} (${JSON.stringify(kinds[i])}) exited ${r.code ?? r.signal} after ${Math.round(r.ms)} ms:\n${r.stdout}\n${r.stderr.slice(-3000)}`
      assert.equal(r.code, 0, log)
      assert.equal(r.stdout.trim(), REPLY, `agent ${i} printed the provider's reply`)
      const attempts = r.stderr.match(/failed to connect to Responses WebSocket/g)?.length ?? 0
      // One refused upgrade and straight to HTTP: never the five "Reconnecting…" retries a
      // 404 or 403 to the upgrade costs (about 6.6 s).
      assert.equal(attempts, kinds[i].provider === 'builtin' || kinds[i].websockets ? 1 : 0, `agent ${i}: WebSocket attempts\n${log}`)
      assert.doesNotMatch(r.stderr, /Reconnecting/, log)
    }
    // What reached the provider: only the Responses API, streamed, each admitted (no 429),
    // with Codex's identity headers and each agent's own key.
    assert.ok(mock.log.length >= AGENTS)
    for (const e of mock.log) {
      assert.equal(e.path, '/v1/responses')
      assert.equal(e.status, 200)
      assert.equal(e.stream, true)
      assert.equal(e.model, MODEL)
      assert.match(e.headers.originator, /^codex_/)
      assert.ok(e.headers['session-id'] && e.headers['x-codex-turn-metadata'], 'the session and turn headers are forwarded')
      assert.equal(e.headers.upgrade, undefined)
    }
    assert.deepEqual([...new Set(mock.log.map((e) => e.headers.authorization))].sort(), runs.map((_, i) => `Bearer sk-dummy-codex-${i}`).sort())
    assert.equal(mock.stats().rejected429, 0, 'no call met a 429 at the provider')
    assert.ok(mock.stats().peakInFlight <= 2)

    // Every call leased and settled, by agent.
    let m = await metrics()
    for (let i = 0; i < 50 && m.liveLeases !== 0; i++) {
      await new Promise((r) => setTimeout(r, 100))
      m = await metrics()
    }
    assert.equal(m.liveLeases, 0)
    assert.equal(Number(m.pools[0].counters.settled), mock.log.length, 'one settled lease per call the provider saw')
    assert.deepEqual(m.agents.map((a) => a.name).sort(), kinds.map((_, i) => `codex-${i}`).sort())
    for (const a of m.agents) assert.ok(Number(a.settled) >= 1, `${a.name} settled ${a.settled}`)
    console.log(`# codex ${codex.version}: ${mock.log.length} calls, runs ${runs.map((r) => Math.round(r.ms)).join(' / ')} ms, peak in flight ${mock.stats().peakInFlight}/2`)
  })
})
