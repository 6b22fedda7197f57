// CPU per model call of the official Anthropic SDK through the fetch wrapper, for one or
// more builds of the `tokenwarden` package in one run (before/after a change), against the
// SDK with no wrapper: a scripted in-process `fetch` answers every call (a JSON answer, or
// a server-sent-event stream of 64 text deltas), so what is measured is the SDK's and the
// wrapper's own work. Each build runs in a process of its own, alternating; each process
// reports its median round, and the median over processes is given.
//
//   node bench/fetch-cpu.mjs [label=path/to/bindings-node/dist/index.js ...]
//
// With no argument it measures this checkout's package. Example (BENCHMARKS.md):
//   node bench/fetch-cpu.mjs before=/work/wt-before42/bindings-node/dist/index.js after=../../bindings-node/dist/index.js
import { execFileSync } from 'node:child_process'
import { fileURLToPath, pathToFileURL } from 'node:url'
import Anthropic from '@anthropic-ai/sdk'

const CALLS = Number(process.env.CALLS ?? 400)
const ROUNDS = Number(process.env.ROUNDS ?? 7)
const enc = new TextEncoder()

const jsonAnswer = JSON.stringify({
  id: 'msg_1',
  type: 'message',
  role: 'assistant',
  model: 'm1',
  content: [{ type: 'text', text: 'word '.repeat(300) }],
  stop_reason: 'end_turn',
  usage: { input_tokens: 900, cache_read_input_tokens: 100, output_tokens: 300 },
})
const sseAnswer = [
  `event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'm1', content: [], usage: { input_tokens: 900, cache_read_input_tokens: 100, output_tokens: 1 } } })}\n\n`,
  `event: content_block_start\ndata: ${JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } })}\n\n`,
  ...Array.from({ length: 64 }, () => `event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'word word word word ' } })}\n\n`),
  `event: content_block_stop\ndata: ${JSON.stringify({ type: 'content_block_stop', index: 0 })}\n\n`,
  `event: message_delta\ndata: ${JSON.stringify({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 300 } })}\n\n`,
  `event: message_stop\ndata: ${JSON.stringify({ type: 'message_stop' })}\n\n`,
]

/** The scripted provider: a JSON answer or an SSE stream in 8 pieces, at once. */
const provider = async (_url, init) => {
  const stream = JSON.parse(init.body).stream === true
  if (!stream) return new Response(jsonAnswer, { status: 200, headers: { 'content-type': 'application/json' } })
  const chunks = []
  for (let i = 0; i < sseAnswer.length; i += 9) chunks.push(enc.encode(sseAnswer.slice(i, i + 9).join('')))
  const body = new ReadableStream({
    pull(c) {
      const next = chunks.shift()
      if (next === undefined) c.close()
      else c.enqueue(next)
    },
  })
  return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } })
}

const params = { model: 'm1', max_tokens: 1024, messages: [{ role: 'user', content: 'hello '.repeat(500) }] }

async function run(client, stream) {
  for (let i = 0; i < CALLS; i++) {
    if (stream) {
      const s = client.messages.stream(params)
      await s.finalMessage()
    } else {
      await client.messages.create(params)
    }
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

/** In a child process: one build (or the SDK direct), one kind, the median round, µs. */
async function child(target, kind) {
  let client = new Anthropic({ apiKey: 'k', baseURL: 'http://x.invalid', maxRetries: 0, fetch: provider })
  let tw = null
  if (target !== 'direct') {
    const pkg = await import(pathToFileURL(target).href)
    tw = pkg.createTokenwarden({ engine: 'native', config: { pools: [{ name: 'm1', input_tokens_per_minute: 1e12, output_tokens_per_minute: 1e12, requests_per_minute: 1e12, max_concurrent: 1000 }] } })
    let settled = 0
    tw.on('settled', () => settled++)
    client = new Anthropic({ apiKey: 'k', baseURL: 'http://x.invalid', maxRetries: 0, fetch: tw.fetch({ agent: 'bench', fetch: provider }) })
    await run(client, kind === 'stream')
    if (settled !== CALLS) throw new Error(`${target}: ${settled} of ${CALLS} calls settled`)
  } else {
    await run(client, kind === 'stream')
  }
  const rounds = []
  for (let r = 0; r < ROUNDS; r++) {
    const before = process.cpuUsage()
    await run(client, kind === 'stream')
    const d = process.cpuUsage(before)
    rounds.push((d.user + d.system) / CALLS)
  }
  tw?.close()
  return median(rounds)
}

if (process.argv[2] === '--child') {
  console.log(JSON.stringify(await child(process.argv[3], process.argv[4])))
  process.exit(0)
}

const args = process.argv.slice(2)
const targets = [['sdk direct', 'direct'], ...(args.length > 0 ? args : [`this=${new URL('../../../bindings-node/dist/index.js', import.meta.url).pathname}`]).map((t) => t.split('='))]
const REPEATS = Number(process.env.REPEATS ?? 3)
const results = {}
for (const kind of ['json', 'stream']) {
  const per = Object.fromEntries(targets.map(([label]) => [label, []]))
  // Each build in a process of its own (no JIT state shared), alternating.
  for (let r = 0; r < REPEATS; r++) {
    for (const [label, path] of targets) {
      const out = execFileSync(process.execPath, [fileURLToPath(import.meta.url), '--child', path, kind], { encoding: 'utf8' })
      per[label].push(JSON.parse(out.trim().split('\n').pop()))
    }
  }
  results[kind] = Object.fromEntries(Object.entries(per).map(([k, v]) => [k, median(v)]))
}

console.log(`CPU per call, µs (median of ${REPEATS} processes each, each the median of ${ROUNDS} rounds of ${CALLS} calls; Node ${process.version})`)
for (const [kind, r] of Object.entries(results)) {
  const direct = r['sdk direct']
  const cells = Object.entries(r).map(([k, v]) => (k === 'sdk direct' ? `${k} ${v.toFixed(1)}` : `${k} ${v.toFixed(1)} (wrapper +${(v - direct).toFixed(1)})`))
  console.log(`  ${kind.padEnd(6)} ${cells.join(' | ')}`)
}
