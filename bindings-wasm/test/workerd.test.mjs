// The wasm build in workerd (the open-source Workers runtime, through miniflare): the test
// Worker is bundled with esbuild (the .wasm stays a separate module, as Workers load it),
// then every conformance trace is replayed inside it and compared with native.
import assert from 'node:assert/strict'
import { readFileSync, readdirSync, rmSync } from 'node:fs'
import { after, before, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const here = (p) => fileURLToPath(new URL(p, import.meta.url))
const outdir = here('./.build/workerd/')
let mf

before(async () => {
  rmSync(outdir, { recursive: true, force: true })
  await buildWorker(outdir, { entry: here('./workerd/traces-worker.js'), name: 'traces-worker' })
  ;({ mf } = await startWorker({ outdir, name: 'traces-worker' }))
})

after(async () => {
  await mf?.dispose()
})

test('every trace replays identically through the workerd build', async () => {
  const dir = new URL('../../tests/traces/', import.meta.url)
  const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort()
  assert.ok(files.length >= 39)
  const failed = []
  for (const file of files) {
    const res = await mf.dispatchFetch('http://worker/replay', { method: 'POST', body: readFileSync(new URL(file, dir), 'utf8') })
    assert.equal(res.status, 200)
    const { error } = await res.json()
    if (error !== null) failed.push({ file, error })
  }
  assert.deepEqual(failed, [])
  console.log(`# workerd: ${files.length} traces identical to native`)
})

test('the shared driver runs on workerd timers', async () => {
  const res = await mf.dispatchFetch('http://worker/driver')
  const body = await res.json()
  assert.ok(body.waitedMs >= 20, `waited ${body.waitedMs} ms`)
  assert.equal(body.liveLeases, 0)
})

test('the tokenizer loads its ranks as data modules and counts as OpenAI does', async () => {
  const text = 'Hello, world! 日本語のテキスト fn main() {}'
  const res = await mf.dispatchFetch('http://worker/tokens', { method: 'POST', body: text })
  assert.equal(res.status, 200)
  const body = await res.json()
  // tiktoken's counts (the provider crate's tests check every text against it).
  assert.deepEqual({ o200k: body.o200k, cl100k: body.cl100k }, { o200k: 14, cl100k: 16 })
  // The default estimator counts the prompt with it: the text, the role, 3 per message
  // and 3 for the reply's priming (not the byte rule's guess).
  assert.deepEqual(body.estimate, { inputTokens: 14 + 1 + 3 + 3, cachedPrefixTokens: 0 })
})
