// handleResponse (3 and 6 Anthropic headers), one call's lifecycle (callLease, callResponse,
// settle) and metrics() per call, through the addon's engine and the wasm engine in one run:
//   cd bindings-node && node bench/report-and-metrics.mjs
// (a plain loop after a warm-up; these machines are noisy: compare the rows of one run).

import { wasmEngines } from 'tokenwarden-wasm'
import { nativeEngines } from '../dist/index.js'

const config = { pools: [{ name: 'p', input_tokens_per_minute: 1e9, output_tokens_per_minute: 1e9, requests_per_minute: 1e9 }] }
const h3 = [
  ['anthropic-ratelimit-input-tokens-limit', '1000000000'],
  ['anthropic-ratelimit-input-tokens-remaining', '900000000'],
  ['anthropic-ratelimit-input-tokens-reset', '2026-11-29T12:00:00Z'],
]
const h6 = [
  ...h3,
  ['anthropic-ratelimit-output-tokens-limit', '1000000000'],
  ['anthropic-ratelimit-output-tokens-remaining', '900000000'],
  ['anthropic-ratelimit-output-tokens-reset', '2026-11-29T12:00:00Z'],
]
const UNIX = 1764417600000
const fresh = () => ({ failed: 0, refusals: 0, lastRetryAfterMs: null })

function perCall(n, f) {
  for (let i = 0; i < Math.min(n, 2000); i++) f(i)
  const t = performance.now()
  for (let i = 0; i < n; i++) f(i)
  return ((performance.now() - t) * 1000) / n
}

const rows = []
for (const [name, engines] of [['addon', nativeEngines], ['wasm', wasmEngines]]) {
  const e = engines.create(config, 1, 0)
  let now = 0
  const hr3 = perCall(20000, () => e.handleResponse(++now, 0, null, 200, h3, UNIX))
  const hr6 = perCall(20000, () => e.handleResponse(++now, 0, null, 200, h6, UNIX))
  const cycle = perCall(20000, (i) => {
    const a = e.callLease(++now, fresh(), { agent: 1 + (i % 8), pool: 0, inputTokens: 100, maxTokens: 50 })
    if (a.step.kind !== 'send') throw new Error(`not granted: ${JSON.stringify(a.step)}`)
    e.callResponse(++now, a.call, 0, a.step.lease, 200, h6, UNIX)
    e.settle(++now, a.step.lease, { inputTokens: 100, outputTokens: 5 })
  })
  const metrics = perCall(5000, () => e.metrics(++now))
  rows.push([name, hr3, hr6, cycle, metrics])
}
console.log('| engine | handleResponse, 3 headers | handleResponse, 6 headers | callLease + callResponse (6 headers) + settle | metrics() (1 pool, 8 agents) |')
console.log('|---|---:|---:|---:|---:|')
for (const [name, ...xs] of rows) console.log(`| ${name} | ${xs.map((x) => `${x.toFixed(2)} µs`).join(' | ')} |`)
