// Real Claude Code through `tokenwarden serve` (issue 27, items 4 and 6; issue 43's ×12): twelve
// headless `claude -p` processes at once (the @anthropic-ai/claude-code native binary, pinned in
// package.json), each with its own HOME, against the mock provider, which answers each
// conversation's first call with a tool_use of Bash and the next with text. Six name
// themselves by base URL (`/agents/cc-<i>/worker/anthropic`), six share the `/proxy` base
// URL and are named by their session header (`--session-id`). Each must exit 0 having run
// the tool, with no 429 reaching it (the mock's concurrency is the quota's, so a call the
// limiter let through early would meet one), every lease settled and the names in
// `/metrics`. Then the Anthropic SDK's countTokens and models.list through serve. Needs
// WORKERD (the test script sets it); skips, loudly, only if the binary cannot run here.
import assert from 'node:assert/strict'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import Anthropic from '@anthropic-ai/sdk'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { claudeBinary, freePort, runClaude, serve, stop } from './support.mjs'

const SECRET = 'serve-claude-code-secret-0123456789'
const AGENTS = 12
/** The first NAMED name themselves by base URL; the rest share `/proxy`, named by session. */
const NAMED = 6


const claude = process.env.WORKERD ? claudeBinary() : { bin: null }
const skip = !process.env.WORKERD ? 'set WORKERD to the workerd binary' : claude.bin === null ? `Claude Code cannot run on this platform (${claude.why})` : false
if (claude.bin === null && process.env.WORKERD) console.error(`\n*** SKIPPED: the Claude Code test: ${skip} ***\n`)





describe(`Claude Code × ${AGENTS} through tokenwarden serve`, { skip }, () => {
  let mock
  let data
  let server
  let origin
  const quota = () => `${origin}/v1/fleets/ci/quotas/anthropic`
  const metrics = async (format = '') => {
    const res = await fetch(`${quota()}/metrics${format}`, { headers: { authorization: `Bearer ${SECRET}` } })
    assert.equal(res.status, 200)
    return format === '' ? res.json() : res.text()
  }

  before(async () => {
    // Two calls at a time at the provider, as the quota says: more at once is a 429.
    mock = await startMockProvider({
      concurrency: 2,
      inputTokensPerMinute: 2_000_000,
      replyTokens: 12,
      chunkDelayMs: 20,
      recordHeaders: true,
      toolUse: { name: 'Bash', input: { command: 'echo tool-ran-ok > tool-ran.txt && cat tool-ran.txt', description: 'write and show the marker' } },
    })
    data = mkdtempSync(join(tmpdir(), 'tokenwarden-claude-code-'))
    const config = join(data, 'tokenwarden.json')
    const pool = { name: 'claude-opus-5-5', input_tokens_per_minute: 2_000_000, output_tokens_per_minute: 4_000_000, requests_per_minute: 1_000, max_concurrent: 2 }
    writeFileSync(config, JSON.stringify({ fleets: { ci: { secret: SECRET, proxy_open: true, quotas: { anthropic: { upstream: mock.url, config: { pools: [pool] } } } } } }))
    const port = await freePort()
    origin = `http://127.0.0.1:${port}`
    server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
  })

  after(async () => {
    if (server) await stop(server.child)
    await mock?.close()
    if (data) rmSync(data, { recursive: true, force: true })
  })

  test(`${AGENTS} headless claude -p in parallel: each runs Bash and finishes, 0 429s, every lease settled, names in /metrics`, { timeout: 150_000 }, async () => {
    const sessions = Array.from({ length: AGENTS - NAMED }, (_, i) => `5e55a0a0-0000-4000-8000-${String(i + 1).padStart(12, '0')}`)
    const named = Array.from({ length: NAMED }, (_, i) => `cc-${i}`)
    const runs = await Promise.all(
      Array.from({ length: AGENTS }, (_, i) => {
        const dir = join(data, `agent-${i}`)
        mkdirSync(dir)
        // NAMED by base URL, the rest on the shared one, named by their session.
        return i < NAMED ? runClaude(claude.bin, dir, `${quota()}/agents/cc-${i}/worker/anthropic`) : runClaude(claude.bin, dir, `${quota()}/proxy`, { extra: ['--session-id', sessions[i - NAMED]] })
      }),
    )
    for (const [i, r] of runs.entries()) {
      assert.equal(r.code, 0, `agent ${i} exited ${r.code ?? r.signal}: ${r.stdout}\n${r.stderr.slice(-2000)}`)
      assert.ok(r.stdout.trim().length > 0, `agent ${i} printed its answer`)
      assert.ok(existsSync(join(r.work, 'tool-ran.txt')), `agent ${i} ran the Bash tool`)
      assert.equal(readFileSync(join(r.work, 'tool-ran.txt'), 'utf8').trim(), 'tool-ran-ok')
    }
    // What reached the provider: every call admitted (none answered 429), and per Claude
    // Code process (its session header) a tool_use turn and a later call.
    const messages = mock.log.filter((e) => e.path === '/v1/messages')
    assert.equal(mock.stats().rejected429, 0, 'no call met a 429 at the provider')
    assert.ok(messages.every((e) => e.status === 200))
    const bySession = Map.groupBy(messages, (e) => e.headers['x-claude-code-session-id'])
    assert.equal(bySession.size, AGENTS)
    for (const [session, calls] of bySession) {
      assert.ok(calls.length >= 2, `session ${session}: ${calls.length} calls`)
      assert.ok(calls.some((e) => e.toolUse === true), `session ${session} got its tool_use`)
    }
    for (const s of sessions) assert.ok(bySession.has(s), `--session-id ${s} is the session header`)
    assert.ok(mock.stats().peakInFlight <= 2)

    // Every lease settled; the agents by name.
    let m = await metrics()
    for (let i = 0; i < 50 && m.liveLeases !== 0; i++) {
      await new Promise((r) => setTimeout(r, 100))
      m = await metrics()
    }
    assert.equal(m.liveLeases, 0)
    assert.deepEqual(m.agents.map((a) => a.name).sort(), [...named, ...sessions].sort())
    const settled = m.agents.reduce((n, a) => n + Number(a.settled), 0)
    assert.equal(settled, messages.length, 'one settled lease per call')
    const text = await metrics('?format=prometheus')
    for (const name of [...named, ...sessions]) assert.match(text, new RegExp(`^tokenwarden_agent_settled_total\\{fleet="ci",quota="anthropic",agent="${name}"\\} [1-9]`, 'm'))
  })

  test('the Anthropic SDK: messages.countTokens and models.list pass through serve', async () => {
    const client = new Anthropic({ baseURL: `${quota()}/agents/sdk/worker/anthropic`, apiKey: 'sk-ant-dummy', maxRetries: 0 })
    const counted = await client.messages.countTokens({ model: 'claude-opus-5-5', messages: [{ role: 'user', content: 'x'.repeat(400) }] })
    assert.equal(counted.input_tokens, 100)
    const models = []
    for await (const model of client.models.list()) models.push(model.id)
    assert.deepEqual(models, ['mock-model'])
    // Neither is a model call: no lease.
    const m = await metrics()
    assert.equal(m.liveLeases, 0)
    assert.ok(!m.agents.some((a) => a.name === 'sdk'), 'no lease was taken for them')
    assert.ok(mock.log.some((e) => e.path === '/v1/models' && e.status === 200))
  })
})
