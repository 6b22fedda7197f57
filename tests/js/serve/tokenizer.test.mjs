// `tokenwarden serve` counts an OpenAI prompt with the provider crate's tokenizer: its Worker
// imports the ranks as data modules (bundled beside it in serve/, declared `data` in the
// workerd config it writes), and the estimate of a chat call is the provider's own count
// (the mock provider counting with an independent BPE, js-tiktoken). The byte rule it falls
// back on when no tokenizer loads would be about half again as high.
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { serveFleet } from './support.mjs'

const skip = process.env.WORKERD ? false : 'set WORKERD to the workerd binary'
const SECRET = 'tokenizer-secret-0123456789'
let mock
let served
let origin

before(async () => {
  if (skip) return
  mock = await startMockProvider({ counting: 'bpe', inputTokensPerMinute: 600_000, outputTokensPerMinute: 200_000, requestsPerMinute: 600, concurrency: 8, replyTokens: 30 })
  const pools = [{ name: 'gpt-5', counting: 'openai', tokens_per_minute: 80_000, requests_per_minute: 600, max_concurrent: 8 }]
  served = await serveFleet({ openai: { upstream: mock.url, config: { pools } } }, SECRET, 'tokenwarden-tokenizer-')
  origin = served.origin
})

after(async () => {
  await served?.close()
  await mock?.close()
})

test("an OpenAI call through serve is estimated by the tokenizer: the provider's own count", { skip }, async () => {
  const text = `${'The quick brown fox jumps over the lazy dog. '.repeat(40)}Tokenizers split text into pieces before merging bytes.`
  const r = await fetch(`${origin}/v1/fleets/ci/quotas/openai/agents/a1/worker/openai/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: 'Bearer sk-test', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-5', max_completion_tokens: 50, messages: [{ role: 'user', content: text }] }),
  })
  assert.equal(r.status, 200)
  const { usage } = await r.json()
  assert.equal(usage.prompt_tokens, 417, "the mock provider's count (o200k_base, OpenAI's message rule)")
  let agents = []
  for (let i = 0; i < 50 && agents.length === 0; i++) {
    const m = await (await fetch(`${origin}/v1/fleets/ci/quotas/openai/metrics`, { headers: { 'x-tokenwarden-token': SECRET } })).json()
    agents = m.agents.filter((a) => a.name === 'a1' && a.inputErrorPermille !== undefined && Number(m.pools[0].counters.settled) === 1)
    if (agents.length === 0) await new Promise((res) => setTimeout(res, 50))
  }
  assert.equal(agents.length, 1, 'the call settled')
  assert.equal(agents[0].inputBiasPermille, 0, 'estimated exactly as the provider counted')
})
