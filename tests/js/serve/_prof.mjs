import { startMockProvider } from 'tokenwarden-testing/mock-provider'
const BIG = 1e9
const mock = await startMockProvider({ port: 39111, inputTokensPerMinute: BIG, outputTokensPerMinute: BIG, requestsPerMinute: BIG, concurrency: 10000, replyTokens: 5, chunkDelayMs: 0 })
console.error('mock', mock.url)
const ws = new WebSocket('ws://127.0.0.1:39113/limiter')
await new Promise((r) => ws.addEventListener('open', r))
let id = 0; const waiting = new Map()
ws.addEventListener('message', (m) => { const d = JSON.parse(m.data); if (d.id && waiting.has(d.id)) { waiting.get(d.id)(d); waiting.delete(d.id) } })
const send = (method, params = {}) => new Promise((r) => { const i = ++id; waiting.set(i, r); ws.send(JSON.stringify({ id: i, method, params })) })
const headers = { 'x-api-key': 'sk-bench', 'anthropic-version': '2023-06-01', 'content-type': 'application/json' }
const body = JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 50, stream: process.argv[2] === 'stream', messages: [{ role: 'user', content: 'hello '.repeat(50) }] })
const url = (a) => `http://127.0.0.1:39112/v1/fleets/bench/quotas/anthropic/agents/a${a}/worker/anthropic/v1/messages`
async function load(n, agents) { let next = 0; await Promise.all(Array.from({ length: agents }, async (_, a) => { while (next++ < n) { const r = await fetch(url(a), { method: 'POST', headers, body }); await r.text(); if (!r.ok) throw new Error(r.status) } })) }
await load(300, 4)
await send('Profiler.enable'); await send('Profiler.setSamplingInterval', { interval: 100 }); await send('Profiler.start')
const t0 = performance.now(); await load(2000, Number(process.argv[3] ?? 1)); const secs = (performance.now() - t0) / 1000
const { result } = await send('Profiler.stop')
const p = result.profile
const byId = new Map(p.nodes.map((n) => [n.id, n]))
const self = new Map(); const counts = new Map()
p.samples.forEach((s, i) => counts.set(s, (counts.get(s) ?? 0) + (p.timeDeltas[i + 1] ?? 0)))
let total = 0
for (const [nid, c] of counts) { const n = byId.get(nid); const f = n.callFrame; const key = `${f.functionName || '(anon)'} ${f.url.split('/').pop()}:${f.lineNumber}`; self.set(key, (self.get(key) ?? 0) + c); total += c }
console.log(`calls/s ${(2000 / secs).toFixed(0)}  profiled ${(total/1000).toFixed(0)} ms, wall ${(secs*1000).toFixed(0)} ms; figures: us per call`)
for (const [k, c] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 40)) console.log((c / 2000).toFixed(1).padStart(7), k)
// inclusive time per function
const parent = new Map(); for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
const incl = new Map()
for (const [nid, c] of counts) { const seen = new Set(); for (let x = nid; x !== undefined; x = parent.get(x)) { const f = byId.get(x).callFrame; const key = `${f.functionName || '(anon)'} ${f.url.split('/').pop()}:${f.lineNumber}`; if (seen.has(key)) continue; seen.add(key); incl.set(key, (incl.get(key) ?? 0) + c) } }
console.log('--- inclusive')
for (const [k, c] of [...incl].sort((a, b) => b[1] - a[1]).slice(0, 45)) console.log((c / 2000).toFixed(1).padStart(7), k)
ws.close(); await mock.close(); process.exit(0)
