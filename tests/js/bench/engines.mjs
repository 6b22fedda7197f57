// The wasm engine against the native addon, in one run: start-up (compile + instantiate
// the .wasm, create a coordinator) and the per-call cost of acquire+settle, both through
// the low-level engine and through the async driver.
//
//   cd tests/js && node bench/engines.mjs
import { readFileSync } from 'node:fs'
import { bench, group, run, summary } from 'mitata'

// Start-up: import the nodejs build (read + compile + instantiate the .wasm) and the addon,
// each once, before anything else has warmed up.
const t0 = performance.now()
const { wasmEngines } = await import('tokenwarden-wasm')
const t1 = performance.now()
const { Driver, nativeEngines } = await import('tokenwarden')
const t2 = performance.now()
console.log(`start-up: import the wasm build ${(t1 - t0).toFixed(2)} ms (incl. the shared driver), the native package ${(t2 - t1).toFixed(2)} ms`)

const config = { pools: [{ name: 'p', input_tokens_per_minute: 1_000_000_000_000, output_tokens_per_minute: 1_000_000_000_000, requests_per_minute: 1_000_000_000_000, max_concurrent: 1_000_000 }] }
const request = { agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 }
const usage = { inputTokens: 100, outputTokens: 5 }

// Start-up, measured directly (a one-off cost, not a loop).
const bytes = readFileSync(new URL('../../../bindings-wasm/pkg/nodejs/tokenwarden_wasm_bg.wasm', import.meta.url))
const startups = []
for (let i = 0; i < 20; i++) {
  const t0 = performance.now()
  const module = new WebAssembly.Module(bytes)
  const t1 = performance.now()
  startups.push({ compile: t1 - t0 })
  void module
}
const median = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1]
console.log(`wasm: ${bytes.length} bytes; WebAssembly.Module compile median ${median(startups.map((s) => s.compile)).toFixed(2)} ms (20 runs)`)
{
  const t0 = performance.now()
  const e = wasmEngines.create(config, 1, 0)
  const t1 = performance.now()
  const n = nativeEngines.create(config, 1, 0)
  const t2 = performance.now()
  console.log(`first coordinator: wasm ${(t1 - t0).toFixed(3)} ms, native ${(t2 - t1).toFixed(3)} ms`)
  void e, n
}

for (const [name, engines] of [['native addon', nativeEngines], ['wasm', wasmEngines]]) {
  const engine = engines.create(config, 1, 0)
  const driver = new Driver(engines.create(config, 1, 0))
  let now = 0
  summary(() => {
    group(name, () => {
      bench(`${name}: engine.requestLease + settle`, () => {
        const d = engine.requestLease(now, request)
        engine.settle(now, d.lease, usage)
      })
      bench(`${name}: engine.requestLease + cancel`, () => {
        const d = engine.requestLease(now, request)
        engine.cancel(now, d.lease)
      })
      bench(`${name}: driver acquire + settle`, async () => {
        const lease = await driver.acquire(request)
        lease.settle(usage)
      })
      bench(`${name}: engine.pollTimeout`, () => engine.pollTimeout())
    })
  })
  now++
}

await run()
