// Agent identity in proxy mode (issue 27, item 4): a call that names no agent in its path,
// `x-tokenwarden-agent` or credential is named by the client's session headers (Claude
// Code's `x-claude-code-session-id`, `-agent-id`, `-parent-agent-id`; Codex's `session_id`),
// a subagent is a child of its parent and the parent's calls unblock its live children;
// the path still wins. Names, not ids, in `/metrics`, on the dashboard's rows and as the
// bounded `agent` label of the Prometheus text. Under workerd against the mock provider.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { MAX_AGENT_LABELS, prometheusText } from '../src/prometheus.js'

const outdir = fileURLToPath(new URL('../.build/identity/', import.meta.url))
const SECRET = 'identity-fleet-secret-0123456789'
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 1_000_000, output_tokens_per_minute: 1_000_000, requests_per_minute: 10_000 }
const SESSION = '1ca5bc7e-1c41-48bb-b8d0-5c60b4233726'

let mock
let persist
let mf
let base

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: fileURLToPath(new URL('../src/worker.js', import.meta.url)) })
  mock = await startMockProvider({ replyTokens: 5, recordHeaders: true })
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-identity-'))
  const quota = (pool) => ({ config: { pools: [pool] }, upstream: mock.url })
  ;({ mf, base } = await startWorker({
    outdir,
    persist,
    fleets: { local: { secret: SECRET, proxy_open: true, quotas: { names: quota(POOL), order: quota({ ...POOL, max_concurrent: 1 }), codex: quota(POOL), codexsub: quota(POOL) } } },
  }))
})

after(async () => {
  await mf?.dispose()
  await mock?.close()
  if (persist) rmSync(persist, { recursive: true, force: true })
})

const q = (quota) => `${base}/v1/fleets/local/quotas/${quota}`
const metrics = async (quota) => (await fetch(`${q(quota)}/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()
const names = async (quota) => (await metrics(quota)).agents.map((a) => a.name).sort()

/** One Messages call as Claude Code sends it, with its session headers. */
async function claudeCall(url, headers = {}, tag = '') {
  const res = await fetch(`${url}/v1/messages?beta=true`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'dummy', 'x-app': 'cli', 'user-agent': `claude-cli/2.1.332 (external, sdk-cli)${tag}`, ...headers },
    body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: 'hello' }] }),
  })
  assert.equal(res.status, 200, await res.clone().text())
  return res.json()
}

test('a shared base URL: the main thread is named by its session, a subagent by session/agent-id, a nested one too', async () => {
  const url = `${q('names')}/proxy`
  await claudeCall(url, { 'x-claude-code-session-id': SESSION })
  await claudeCall(url, { 'x-claude-code-session-id': SESSION, 'x-claude-code-agent-id': 'a80286169ea6822be' })
  await claudeCall(url, { 'x-claude-code-session-id': SESSION, 'x-claude-code-agent-id': 'aef319ebfc088e0d6', 'x-claude-code-parent-agent-id': 'a80286169ea6822be' })
  // The path (and x-tokenwarden-agent) still wins over the session headers; a subagent's
  // call under a named URL is that agent's child (`alice/<agent id>`).
  await claudeCall(`${q('names')}/agents/alice/worker/anthropic`, { 'x-claude-code-session-id': SESSION, 'x-claude-code-agent-id': 'a0000000000000001' })
  await claudeCall(url, { 'x-claude-code-session-id': SESSION, 'x-tokenwarden-agent': 'bob' })
  // No session header, or one that is not an id (too long, or other characters): the shared name.
  await claudeCall(url)
  await claudeCall(url, { 'x-claude-code-session-id': 'x'.repeat(65) })
  await claudeCall(url, { 'x-claude-code-session-id': 'a b' })
  const m = await metrics('names')
  assert.deepEqual(m.agents.map((a) => a.name).sort(), ['alice/a0000000000000001', 'bob', 'proxy', SESSION, `${SESSION}/a80286169ea6822be`, `${SESSION}/aef319ebfc088e0d6`].sort())
  // Each name stands beside its id; a subagent's family (its session's root, a nested one's
  // too: one family per session) beside it, by id and name.
  for (const a of m.agents) assert.equal(typeof a.agent, 'number')
  const byName = new Map(m.agents.map((a) => [a.name, a]))
  const root = byName.get(SESSION)
  assert.equal(root.family, undefined, 'the main thread is a root')
  for (const sub of [`${SESSION}/a80286169ea6822be`, `${SESSION}/aef319ebfc088e0d6`]) {
    assert.equal(byName.get(sub).family, root.agent, sub)
    assert.equal(byName.get(sub).familyName, SESSION, sub)
  }
  assert.equal(byName.get('alice/a0000000000000001').familyName, 'alice')
  assert.equal(byName.get('bob').family, undefined)
  // The session headers still reach the provider.
  assert.ok(mock.log.some((e) => e.headers?.['x-claude-code-agent-id'] === 'aef319ebfc088e0d6' && e.headers?.['x-claude-code-parent-agent-id'] === 'a80286169ea6822be'))
})

test("Codex's session_id (or session-id) header names its agent", async () => {
  await claudeCall(`${q('codex')}/proxy`, { session_id: '019a7c5e-codex-session' })
  await claudeCall(`${q('codex')}/proxy`, { 'session-id': '019a7c5e-other' })
  assert.deepEqual(await names('codex'), ['019a7c5e-codex-session', '019a7c5e-other'])
})

test("a Codex subagent (x-openai-subagent, its own thread-id) is its session's child", async () => {
  const url = `${q('codexsub')}/proxy`
  const root = '019a7c5e-root-thread'
  // The main thread (its thread id is the session's), a spawned subagent, a review.
  await claudeCall(url, { 'session-id': root, 'thread-id': root })
  await claudeCall(url, { 'session-id': root, 'thread-id': '019a7c5e-child-a', 'x-codex-parent-thread-id': root, 'x-openai-subagent': 'collab_spawn' })
  await claudeCall(url, { 'session-id': root, 'x-openai-subagent': 'review' })
  assert.deepEqual(await names('codexsub'), [root, `${root}/019a7c5e-child-a`, `${root}/review`])
})

test('a parent with a live subagent is served ahead of a plain worker queued before it (its calls unblock the child)', async () => {
  const url = `${q('order')}/proxy`
  const parent = 'b2f0c9a4-0000-4000-8000-000000000001'
  // The subagent's call makes the main thread its parent.
  await claudeCall(url, { 'x-claude-code-session-id': parent, 'x-claude-code-agent-id': 'a1111111111111111' })
  // The one concurrency slot held through the API, then a worker queued, then the parent.
  const held = await (
    await fetch(`${q('order')}/leases`, {
      method: 'POST',
      headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
      body: JSON.stringify({ agent: 'holder', pool: 0, inputTokens: 10, maxTokens: 10 }),
    })
  ).json()
  assert.equal(held.kind, 'grant')
  const from = mock.log.length
  const worker = claudeCall(`${q('order')}/agents/plain/worker/anthropic`, {}, ' worker')
  await new Promise((r) => setTimeout(r, 300))
  const main = claudeCall(url, { 'x-claude-code-session-id': parent }, ' parent')
  await new Promise((r) => setTimeout(r, 300))
  assert.equal(mock.log.length, from, 'both wait for the slot')
  const settled = await fetch(`${q('order')}/leases/${held.lease}/settle`, {
    method: 'POST',
    headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
    body: JSON.stringify({ inputTokens: 10, outputTokens: 10 }),
  })
  assert.equal(settled.status, 200)
  await Promise.all([worker, main])
  const order = mock.log.slice(from).map((e) => (e.headers?.['user-agent'] ?? '').split(' ').pop())
  assert.deepEqual(order, ['parent', 'worker'], "the parent (the core's auto role: a planner unblocking its child) goes first")
  const m = await metrics('order')
  assert.equal(m.liveLeases, 0)
})

// The naming rules themselves (Claude Code's and Codex's headers, families under a name)
// are the provider crate's, tested there (`provider/src/identity.rs`); the proxy asks them
// through the engine, which the workerd tests in this file go through.
test('Prometheus: per-agent families by name, escaped, at most MAX_AGENT_LABELS labelled and the rest as other', () => {
  const agent = (i, name, extra = {}) => ({ agent: 1000 + i, name, activity: { state: 'idle' }, queued: 0, inFlight: 0, settled: i, lastSeen: i, alerting: false, ...extra })
  const agents = Array.from({ length: MAX_AGENT_LABELS + 5 }, (_, i) => agent(i, `bot-${i}`))
  agents.push(agent(100, 'we"ird\\name\n', { inFlight: 2, activity: { state: 'in_flight' } }))
  agents.push(agent(101, null, { queued: 1, activity: { state: 'queued', since: 0 } }))
  const text = prometheusText({ now: 0, liveLeases: 3, pools: [], agents }, { fleet: 'local', quota: 'anthropic' })
  const lines = text.split('\n').filter((l) => l.startsWith('tokenwarden_agent_settled_total{'))
  assert.equal(lines.length, MAX_AGENT_LABELS + 1)
  // The busiest first: in flight, then queued (an agent without a name by its id), then by settled.
  assert.equal(lines[0], 'tokenwarden_agent_settled_total{fleet="local",quota="anthropic",agent="we\\"ird\\\\name\\n"} 100')
  assert.equal(lines[1], 'tokenwarden_agent_settled_total{fleet="local",quota="anthropic",agent="1101"} 101')
  assert.equal(lines[2], `tokenwarden_agent_settled_total{fleet="local",quota="anthropic",agent="bot-${MAX_AGENT_LABELS + 4}"} ${MAX_AGENT_LABELS + 4}`)
  // The 7 least active (settled 0 to 6) summed.
  assert.equal(lines.at(-1), 'tokenwarden_agent_settled_total{fleet="local",quota="anthropic",agent="other"} 21')
  assert.match(text, /^tokenwarden_agent_in_flight\{fleet="local",quota="anthropic",agent="we\\"ird\\\\name\\n"\} 2$/m)
  assert.match(text, /^tokenwarden_agent_queued\{fleet="local",quota="anthropic",agent="1101"\} 1$/m)
  assert.match(text, /^# TYPE tokenwarden_agent_settled_total counter$/m)
})

test('Prometheus from the Worker: the agents by name', async () => {
  const text = await (await fetch(`${q('names')}/metrics?format=prometheus`, { headers: { authorization: `Bearer ${SECRET}` } })).text()
  assert.match(text, new RegExp(`^tokenwarden_agent_settled_total\\{fleet="local",quota="names",agent="${SESSION}/a80286169ea6822be"\\} 1$`, 'm'))
  assert.match(text, /^tokenwarden_agent_settled_total\{fleet="local",quota="names",agent="alice\/a0000000000000001"\} 1$/m)
  // The session's family: its main thread and two subagents; alice's: one subagent (alice
  // never called on its own).
  assert.match(text, new RegExp(`^tokenwarden_family_members\\{fleet="local",quota="names",family="${SESSION}"\\} 3$`, 'm'))
  assert.match(text, /^tokenwarden_family_members\{fleet="local",quota="names",family="alice"\} 1$/m)
  assert.match(text, /^tokenwarden_family_busy\{fleet="local",quota="names",family="alice"\} 0$/m)
})
