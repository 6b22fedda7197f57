// The edge limiter's storage layout (src/store.js) at the configured maxima: every stored
// value far below Cloudflare's 128 KiB per value, the state read back digit for digit, and a
// change rewriting only the pieces it touched. On the wasm engine the Durable Object runs,
// with a Map standing in for Durable Object storage (the workerd suite tests the real one
// across a restart).
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { wasmEngines } from 'tokenwarden-wasm'
import { CHUNK, PREFIX, assemble, parseExact, pieces, readState, writeChanged } from '../src/store.js'

const LIMIT = 128 * 1024

/** Durable Object storage's calls that store.js makes, over a Map, counting what is written. */
class FakeStorage {
  map = new Map()
  calls = 0
  async put(entries) {
    const keys = Object.keys(entries)
    assert.ok(keys.length <= 128, `one put holds ${keys.length} keys (Cloudflare allows 128)`)
    this.calls++
    for (const k of keys) this.map.set(k, entries[k])
  }
  async delete(keys) {
    assert.ok(keys.length <= 128, `one delete names ${keys.length} keys (Cloudflare allows 128)`)
    this.calls++
    for (const k of keys) this.map.delete(k)
  }
  async list({ prefix }) {
    return new Map([...this.map].filter(([k]) => k.startsWith(prefix)))
  }
}

/** A quota at its maxima: 4,096 leases (a quarter queued) over 1,024 agents. */
function atMaxima() {
  const config = {
    pools: [{ name: 'p', input_tokens_per_minute: 1_000_000, output_tokens_per_minute: 1_000_000, requests_per_minute: 1_000_000 }],
    max_leases: 4096,
    max_agents: 1024,
    max_queue_depth: 4096,
    max_queue_wait_ms: 3_600_000,
  }
  const engine = wasmEngines.create(config, 7, 0)
  const leases = []
  for (let i = 0; i < 4096; i++) {
    const d = engine.requestLease(1 + i, { agent: i % 1024, pool: 0, inputTokens: 200 + (i % 7) * 100, maxTokens: 100, role: ['planner', 'reviewer', 'worker'][i % 3] })
    assert.notEqual(d.kind, 'reject', `request ${i}: ${JSON.stringify(d)}`)
    leases.push([d.lease, { state: d.kind === 'grant' ? 'granted' : 'queued', agent: i % 1024, pool: 0, expiresAt: d.expiresAt ?? null, eta: d.eta ?? null }])
  }
  return { engine, leases }
}

test('at the maxima every stored value stays far below 128 KiB, and the state reads back exactly', async () => {
  const { engine, leases } = atMaxima()
  const snapshot = engine.snapshot()
  const storage = new FakeStorage()
  const written = new Map()
  const w = writeChanged(storage, written, { snapshot: parseExact(snapshot), leases })
  await w.done
  const sizes = [...storage.map.values()].map((v) => v.length)
  const largest = Math.max(...sizes)
  const total = sizes.reduce((a, b) => a + b, 0)
  console.log(`# ${storage.map.size} values, ${total} bytes in all, largest ${largest} bytes (one value before: ${snapshot.length + JSON.stringify(leases).length} bytes)`)
  console.log(`# per lease ~${Math.round(total / 4096)} bytes with its agent's share; CHUNK ${CHUNK}`)
  assert.ok(largest < LIMIT / 2, `largest stored value ${largest} bytes`)

  const back = await readState(storage)
  assert.equal(JSON.stringify(back.value.snapshot), snapshot, 'the snapshot comes back digit for digit')
  assert.deepEqual(back.value.leases, leases)
  // And it restores into an engine that makes the same decisions.
  const restored = wasmEngines.restore(JSON.stringify(back.value.snapshot))
  assert.equal(restored.snapshot(), snapshot)
})

test('a settle rewrites only the head and the chunks it touched', async () => {
  const { engine, leases } = atMaxima()
  const storage = new FakeStorage()
  const written = new Map()
  await writeChanged(storage, written, { snapshot: parseExact(engine.snapshot()), leases }).done
  const granted = leases.find(([, r]) => r.state === 'granted')
  // At the instant of the last request: no refill in between, so the settle is one change
  // (a settle later would grant queued tickets as the bucket refills: many changes).
  engine.settle(4096, granted[0], { inputTokens: 250, outputTokens: 40 })
  const after = leases.filter(([id]) => id !== granted[0])
  const w = writeChanged(storage, written, { snapshot: parseExact(engine.snapshot()), leases: after })
  await w.done
  console.log(`# one settle at the maxima: ${w.put} values put (${w.bytes} bytes), ${w.deleted} deleted, of ${written.size}`)
  assert.ok(w.bytes < 150_000, `a settle wrote ${w.bytes} bytes`)
  assert.ok(w.put <= 12, `a settle rewrote ${w.put} of ${written.size} values`)
  const back = await readState(storage)
  assert.equal(JSON.stringify(back.value.snapshot), engine.snapshot())
  assert.deepEqual(back.value.leases, after)
})

test('integers above 2^53 survive, pieces that shrink are deleted, and a missing piece is an error', async () => {
  const value = { big: parseExact('340282366920938463463374607431768211455'), list: Array.from({ length: 3 * CHUNK + 5 }, (_, i) => ({ i })) }
  const storage = new FakeStorage()
  const written = new Map()
  await writeChanged(storage, written, value).done
  assert.equal(JSON.stringify((await readState(storage)).value.big), '340282366920938463463374607431768211455')
  await writeChanged(storage, written, { ...value, list: value.list.slice(0, 10) }).done
  assert.deepEqual([...storage.map.keys()].sort(), [PREFIX], 'the chunks of the longer list are gone')
  const p = pieces(value)
  const chunk = [...p.keys()].find((k) => k.startsWith(`${PREFIX}.list#`))
  p.delete(chunk)
  assert.throws(() => assemble((k) => p.get(k)), /stored state is incomplete: state\.list#\w+ is missing/)
})

test('the earlier one-value layout is still read', async () => {
  const { engine } = atMaxima()
  const storage = new FakeStorage()
  storage.map.set(PREFIX, { snapshot: engine.snapshot(), leases: [[1, { state: 'granted' }]] })
  const back = await readState(storage)
  assert.equal(back.value.snapshot, engine.snapshot())
  assert.deepEqual(back.value.leases, [[1, { state: 'granted' }]])
})
