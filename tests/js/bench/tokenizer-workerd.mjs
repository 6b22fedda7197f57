// The OpenAI tokenizer inside the edge limiter: the Worker's bundle size (raw and gzipped,
// as Cloudflare's 3 MB free / 10 MB paid limit counts it), workerd's start, and what the
// first proxied OpenAI call pays for loading the encoding in the Durable Object, against
// the mock provider.
//
//   cd tests/js && node bench/tokenizer-workerd.mjs
//   cd tests/js && node bench/tokenizer-workerd.mjs --prebuilt ../../bindings-node/serve/   # a bundle built before
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { gzipSync } from 'node:zlib'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'

const entry = fileURLToPath(new URL('../../../edge/src/worker.js', import.meta.url))
const outdir = `${mkdtempSync(join(tmpdir(), 'tw-bench-worker-'))}/`
const persist = mkdtempSync(join(tmpdir(), 'tw-bench-persist-'))
const SECRET = 'bench-fleet-secret-0123456789'
const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]

const { values: args } = parseArgs({ options: { prebuilt: { type: 'string' } } })
if (args.prebuilt === undefined) await buildWorker(outdir, { entry })
else cpSync(args.prebuilt, outdir, { recursive: true })
let raw = 0
let gz = 0
for (const f of readdirSync(outdir)) {
  const b = readFileSync(join(outdir, f))
  raw += b.length
  gz += gzipSync(b, { level: 9 }).length
  console.log(`${f}: ${(b.length / 1e6).toFixed(2)} MB, gzip ${(gzipSync(b, { level: 9 }).length / 1e6).toFixed(2)} MB`)
}
console.log(`bundle: ${(raw / 1e6).toFixed(2)} MB, gzip ${(gz / 1e6).toFixed(2)} MB`)

const mock = await startMockProvider({ replyTokens: 5 })
const t0 = performance.now()
const { mf, base } = await startWorker({
  outdir,
  persist,
  fleets: { f: { secret: SECRET, quotas: { openai: { config: { pools: [{ name: 'gpt-4o', counting: 'openai', tokens_per_minute: 100_000_000, requests_per_minute: 100_000, max_concurrent: 64 }] }, upstream: mock.url } } } },
})
const t1 = performance.now()
try {
  const quota = `${base}/v1/fleets/f/quotas/openai`
  const m0 = performance.now()
  await (await fetch(`${quota}/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })).json()
  const m1 = performance.now()
  const prose = readFileSync(fileURLToPath(new URL('../../../README.md', import.meta.url)), 'utf8').slice(0, 20_000)
  const call = async (i) => {
    const s = performance.now()
    const r = await fetch(`${quota}/proxy/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-test', 'x-tokenwarden-token': SECRET },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 16, messages: [{ role: 'system', content: prose }, { role: 'user', content: `question ${i}` }] }),
    })
    if (r.status !== 200) throw new Error(`call ${i}: ${r.status} ${await r.text()}`)
    await r.text()
    return performance.now() - s
  }
  const first = await call(0)
  const later = []
  for (let i = 1; i <= 20; i++) later.push(await call(i))
  console.log(`workerd ready ${(t1 - t0).toFixed(0)} ms; first request to the quota's object ${(m1 - m0).toFixed(0)} ms`)
  console.log(`proxied gpt-4o call with a 20 KB system prompt: first ${first.toFixed(0)} ms (loads o200k_base), then median ${median(later).toFixed(1)} ms over 20`)
} finally {
  await mf.dispose()
  await mock.close()
  rmSync(outdir, { recursive: true, force: true })
  rmSync(persist, { recursive: true, force: true })
}
