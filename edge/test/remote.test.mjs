// The npm package's remote driver against the edge limiter under workerd: the same fetch
// wrapper leases through the Worker; when the Worker is down the driver fails open to its
// local engine with a `fail_open` event (no error reaches agent code), and goes back to the
// Worker with `remote_restored` once it answers again.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { RemoteTokenwarden, nativeEngines } from 'tokenwarden'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const workerEntry = fileURLToPath(new URL('../src/worker.js', import.meta.url))

const SECRET = 'remote-secret-0123456789abcdef'
const POOL = { name: 'claude-sonnet-4-6', input_tokens_per_minute: 200_000, output_tokens_per_minute: 40_000, requests_per_minute: 2_000, max_concurrent: 4 }
const outdir = fileURLToPath(new URL('../.build/remote/', import.meta.url))
let mock
let persist
let worker
let port

const fleets = { f: { secret: SECRET, quotas: { q: { config: { pools: [POOL] } } } } }

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: workerEntry })
  mock = await startMockProvider({ inputTokensPerMinute: 200_000, outputTokensPerMinute: 40_000, concurrency: 4, replyTokens: 20, chunkDelayMs: 1 })
  persist = mkdtempSync(join(tmpdir(), 'tokenwarden-remote-'))
  worker = await startWorker({ outdir, persist, fleets })
  port = Number(new URL(worker.base).port)
})

after(async () => {
  await worker?.mf.dispose()
  await mock?.close()
  if (persist) rmSync(persist, { recursive: true, force: true })
})

const edgeMetrics = async () =>
  (await (await fetch(`${worker.base}/v1/fleets/f/quotas/q/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()).pools[0].counters

async function fleet(tw, n, calls) {
  const errors = []
  await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const f = tw.fetch({ agent: `agent-${i}` })
      for (let c = 0; c < calls; c++) {
        try {
          const res = await f(`${mock.url}/v1/messages`, {
            method: 'POST',
            headers: { 'x-api-key': 'sk-ant-test', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 100, stream: c % 2 === 1, messages: [{ role: 'user', content: `agent ${i} call ${c} `.repeat(50) }] }),
          })
          if (res.status !== 200) errors.push(new Error(`status ${res.status}`))
          await res.text()
        } catch (e) {
          errors.push(e)
        }
      }
    }),
  )
  return errors
}

test('leases through the Worker, fails open when it is down, and comes back', async () => {
  const tw = new RemoteTokenwarden({
    url: worker.base,
    fleet: 'f',
    quota: 'q',
    secret: SECRET,
    engine: nativeEngines.create({ pools: [POOL] }, 1, Math.floor(performance.now())),
    timeoutMs: 1000,
    retryRemoteMs: 300,
  })
  const events = []
  for (const name of ['fail_open', 'remote_restored', 'remote_error', 'queued']) tw.on(name, (e) => events.push({ name, ...e }))

  // 1. Through the Worker: 8 agents, 2 calls each, concurrency 4 at the edge.
  assert.deepEqual(await fleet(tw, 8, 2), [])
  await new Promise((r) => setTimeout(r, 100)) // settles are sent as the responses end
  let counters = await edgeMetrics()
  assert.equal(Number(counters.settled), 16, 'the edge limiter settled every call')
  assert.ok(events.some((e) => e.name === 'queued'), 'some calls queued at the edge (its concurrency limit is 4)')
  assert.ok(!tw.failedOpen)

  // 2. The Worker goes down mid-run: calls go on, leased locally, with one fail_open event.
  await worker.mf.dispose()
  assert.deepEqual(await fleet(tw, 4, 2), [], 'no error reaches agent code')
  const open = events.filter((e) => e.name === 'fail_open')
  assert.equal(open.length, 1)
  assert.match(open[0].message, /did not answer.*leasing locally/)
  assert.ok(tw.failedOpen)
  assert.equal(Number(tw.engine.metrics(Math.floor(performance.now())).pools[0].counters.settled) >= 8, true, 'the local engine served them')

  // 3. The Worker is back (same storage): the next call after retryRemoteMs goes to it.
  worker = await startWorker({ outdir, persist, fleets, port })
  await new Promise((r) => setTimeout(r, 350))
  assert.deepEqual(await fleet(tw, 2, 1), [])
  await new Promise((r) => setTimeout(r, 100))
  assert.ok(events.some((e) => e.name === 'remote_restored'))
  assert.ok(!tw.failedOpen)
  counters = await edgeMetrics()
  assert.equal(Number(counters.settled), 18, 'the restarted Worker kept its counters and settled the new calls')
  assert.deepEqual(events.filter((e) => e.name === 'remote_error'), [])
  assert.equal(mock.stats().overLimit, false)
  tw.close()
})
