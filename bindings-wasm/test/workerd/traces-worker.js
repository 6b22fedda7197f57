// A Worker that replays conformance traces through the `workerd` build of tokenwarden-wasm:
// POST a trace file's text to /replay and get `{ error }` back (`null` when it matches).
import { DefaultEstimator, createTokenwarden, wasmEngines, wasmTokenizers } from '../../js/workerd.js'
import { parse } from '../../../tests/js/support/json.mjs'
import { verify } from '../../../tests/js/support/replay.mjs'

export default {
  async fetch(request) {
    const url = new URL(request.url)
    if (url.pathname === '/replay' && request.method === 'POST') {
      const trace = parse(await request.text())
      let error
      try {
        error = verify(trace, wasmEngines)
      } catch (e) {
        error = String(e?.stack ?? e)
      }
      return Response.json({ name: trace.name, error })
    }
    if (url.pathname === '/driver') {
      // The shared driver on workerd's timers: the second acquire queues behind the first.
      const tw = createTokenwarden({ config: { pools: [{ name: 'p', input_tokens_per_minute: 60000, max_concurrent: 1 }] } })
      const first = await tw.acquire({ agent: 1, pool: 0, inputTokens: 100, maxTokens: 10 })
      const second = tw.acquire({ agent: 2, pool: 0, inputTokens: 100, maxTokens: 10 })
      setTimeout(() => first.settle({ inputTokens: 100, outputTokens: 5 }), 30)
      const lease = await second
      lease.settle({})
      const body = { waitedMs: lease.waitedMs, liveLeases: tw.metrics().liveLeases }
      tw.close()
      return Response.json(body)
    }
    if (url.pathname === '/tokens' && request.method === 'POST') {
      // The tokenizer as the Worker loads it (its ranks a data module), and the default
      // estimator counting an OpenAI prompt with it.
      const text = await request.text()
      const o200k = (await wasmTokenizers('o200k_base'))(text)
      const cl100k = (await wasmTokenizers('cl100k_base'))(text)
      const estimate = await new DefaultEstimator().estimate({ provider: 'openai', model: 'gpt-4o', body: { model: 'gpt-4o', messages: [{ role: 'user', content: text }] } })
      return Response.json({ o200k, cl100k, estimate })
    }
    return new Response('not found', { status: 404 })
  },
}
