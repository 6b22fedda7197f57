// handleResponse (3 Anthropic headers) and metrics() per call through the NativeEngine:
//   cd bindings-node && node bench/report-and-metrics.mjs

import { nativeEngines } from '../dist/index.js'
const e = nativeEngines.create({ pools: [{ name: 'p', input_tokens_per_minute: 100000, output_tokens_per_minute: 20000, requests_per_minute: 1000 }] }, 1, 0)
const h = [['anthropic-ratelimit-input-tokens-limit','100000'],['anthropic-ratelimit-input-tokens-remaining','90000'],['anthropic-ratelimit-input-tokens-reset','2026-11-29T12:00:00Z']]
let t = performance.now()
for (let i = 0; i < 20000; i++) e.handleResponse(i, 0, null, 200, h, 1764417600000)
console.log('handleResponse', ((performance.now() - t) * 1000 / 20000).toFixed(2), 'µs')
t = performance.now()
for (let i = 0; i < 5000; i++) e.metrics(20000 + i)
console.log('metrics', ((performance.now() - t) * 1000 / 5000).toFixed(2), 'µs')
