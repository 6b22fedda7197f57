// Every conformance trace in tests/traces replayed through the native addon (or the wasm
// build with TOKENWARDEN_ENGINE=wasm), by the typed methods and then by `handle`, compared
// record by record with the native Rust core's `expected` output.
import assert from 'node:assert/strict'
import { readFileSync, readdirSync } from 'node:fs'
import { test } from 'node:test'
import { parse } from '../support/json.mjs'
import { engineName, engines } from '../support/engine.mjs'
import { verify } from '../support/replay.mjs'

const dir = new URL('../../traces/', import.meta.url)
const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort()

test('the trace directory is there', () => {
  assert.ok(files.length >= 39, `found ${files.length} traces`)
})

for (const file of files) {
  test(`trace ${file} (${engineName})`, () => {
    const trace = parse(readFileSync(new URL(file, dir), 'utf8'))
    assert.equal(verify(trace, engines), null)
    // The same records with every input through the host protocol (`engine.handle`).
    assert.equal(verify(trace, engines, { protocol: true }), null, 'through handle')
  })
}
