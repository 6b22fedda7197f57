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
