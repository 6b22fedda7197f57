// Every conformance trace in tests/traces replayed through the native addon, compared
// record by record with the native Rust core's `expected` output.
import assert from 'node:assert/strict'
import { readFileSync, readdirSync } from 'node:fs'
import { test } from 'node:test'
import { nativeEngines } from '../dist/index.js'
import { parse } from './support/json.mjs'
import { verify } from './support/replay.mjs'

const dir = new URL('../../tests/traces/', import.meta.url)
const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort()

test('the trace directory is there', () => {
  assert.ok(files.length >= 39, `found ${files.length} traces`)
})

for (const file of files) {
  test(`trace ${file}`, () => {
    const trace = parse(readFileSync(new URL(file, dir), 'utf8'))
    assert.equal(verify(trace, nativeEngines), null)
  })
}
