// The default estimator against the prompt cache as agents really use it (issue 26, item 2):
// rolling cache breakpoints (moved to the newest message each turn, as Claude Code and
// Anthropic's docs do), cache lifetimes, cold conversations. The sequences go through
// `tw.fetch` to a node:http upstream in this file that counts tokens by its own rule and
// answers with Anthropic's usage (cache read = the prefix an earlier call cached, cache
// write = the rest up to the last breakpoint); each check compares the lease's input
// reservation with what that upstream counted against the input limit (input + write).
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import http from 'node:http'
import { after, before, describe, test } from 'node:test'
import { BytesPerTokenEstimator } from 'tokenwarden-driver'
import { createTokenwarden } from '../support/engine.mjs'

const MODEL = 'claude-sonnet-4-6'
const delay = (ms) => new Promise((r) => setTimeout(r, ms))

/** Deterministic prose: words from a small generator, so bodies are text, not one repeated byte. */
function prose(seed, length) {
  const words = ['the', 'parser', 'returns', 'a', 'token', 'stream', 'for', 'each', 'file', 'with', 'tabs', 'and', 'spaces', 'function', 'test', 'fails', 'when', 'input', 'is', 'empty', 'error', 'handling', 'module', 'imports', 'config', 'value', 'index.ts', 'src/lexer.rs', '{', '}', '=>', 'const', 'let', '42', 'null']
  let x = seed * 2654435761 + 1
  let s = ''
  while (s.length < length) {
    x = (x * 1103515245 + 12345) % 2147483648
    s += words[x % words.length] + (x % 11 === 0 ? '.\n' : ' ')
  }
  return s.slice(0, length)
}

const TOOLS = Array.from({ length: 12 }, (_, i) => ({
  name: `tool_${i}`,
  description: prose(100 + i, 700),
  input_schema: { type: 'object', properties: { path: { type: 'string', description: prose(200 + i, 200) }, limit: { type: 'integer' } }, required: ['path'] },
}))

/**
 * A Claude-Code-like conversation: a dozen tools, a system prompt with a breakpoint, a first
 * user message, and `turns` rounds of an assistant tool call and its tool result; the second
 * breakpoint sits on the newest message's last block (rolling). `max_tokens` 128000, streamed.
 */
function conversation({ system = prose(1, 12_000), first = prose(2, 2_000), turns = 0 } = {}) {
  const messages = [{ role: 'user', content: [{ type: 'text', text: first }] }]
  for (let t = 0; t < turns; t++) {
    messages.push({ role: 'assistant', content: [{ type: 'text', text: prose(300 + t, 300) }, { type: 'tool_use', id: `toolu_${t}`, name: `tool_${t % 12}`, input: { path: `src/file_${t}.rs` } }] })
    messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: `toolu_${t}`, content: prose(400 + t, 2_600) }] })
  }
  const newest = messages[messages.length - 1].content
  newest[newest.length - 1] = { ...newest[newest.length - 1], cache_control: { type: 'ephemeral' } }
  return {
    model: MODEL,
    max_tokens: 128_000,
    stream: true,
    tools: TOOLS,
    system: [{ type: 'text', text: system, cache_control: { type: 'ephemeral' } }],
    messages,
  }
}

/** The upstream's own token rule: a block's JSON (without cache_control) at 4 characters a token, 4 per message. */
function blocksOf(body) {
  const strip = (b) => {
    if (b === null || typeof b !== 'object') return { text: b }
    const { cache_control, ...rest } = b
    return rest
  }
  const out = []
  for (const t of body.tools ?? []) out.push({ json: JSON.stringify(strip(t)), mark: 'cache_control' in t, extra: 0 })
  for (const s of typeof body.system === 'string' ? [{ type: 'text', text: body.system }] : (body.system ?? [])) out.push({ json: JSON.stringify(strip(s)), mark: 'cache_control' in s, extra: 0 })
  for (const m of body.messages ?? []) {
    const content = typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content
    content.forEach((b, i) => out.push({ json: (i === 0 ? m.role : '') + JSON.stringify(strip(b)), mark: 'cache_control' in b, extra: i === 0 ? 4 : 0 }))
  }
  return out
}

/** A node:http upstream with a prompt cache of its own; `counted[i]` is request i's input-limit count. */
async function upstream() {
  const u = { counted: [], usage: [], cache: new Set() }
  u.http = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString())
      const blocks = blocksOf(body)
      const keys = []
      const hash = createHash('sha256').update(body.model)
      const tokens = blocks.map((b) => {
        hash.update(b.json).update('\u0000')
        keys.push(hash.copy().digest('hex'))
        return Math.ceil(b.json.length / 4) + b.extra
      })
      let last = -1
      blocks.forEach((b, i) => {
        if (b.mark) last = i
      })
      let read = -1
      for (let i = last; i >= 0; i--) {
        if (u.cache.has(keys[i])) {
          read = i
          break
        }
      }
      const sum = (from, to) => tokens.slice(from, to).reduce((a, b) => a + b, 0)
      const usage = { input_tokens: sum(last + 1, tokens.length), cache_creation_input_tokens: sum(read + 1, last + 1), cache_read_input_tokens: sum(0, read + 1), output_tokens: 1 }
      blocks.forEach((b, i) => {
        if (b.mark) u.cache.add(keys[i])
      })
      u.usage.push(usage)
      u.counted.push(usage.input_tokens + usage.cache_creation_input_tokens)
      const sse = (event, data) => `event: ${event}\ndata: ${JSON.stringify({ type: event, ...data })}\n\n`
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end(
        sse('message_start', { message: { id: 'msg', type: 'message', role: 'assistant', model: body.model, content: [], usage } }) +
          sse('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }) +
          sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Reading the file.' } }) +
          sse('content_block_stop', { index: 0 }) +
          sse('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 40 } }) +
          sse('message_stop', {}),
      )
    })
  })
  await new Promise((r) => u.http.listen(0, '127.0.0.1', r))
  u.url = `http://127.0.0.1:${u.http.address().port}/v1/messages`
  u.close = () => {
    u.http.closeAllConnections()
    return new Promise((r) => u.http.close(r))
  }
  return u
}

let up
before(async () => {
  up = await upstream()
})
after(async () => {
  await up?.close()
})

function setup() {
  const pools = [{ name: MODEL, input_tokens_per_minute: 4_000_000, output_tokens_per_minute: 2_000_000, max_concurrent: 4 }]
  const tw = createTokenwarden({ config: { pools } })
  const settled = []
  tw.on('settled', (e) => settled.push(e.settlement))
  const fetch = tw.fetch({ agent: 'claude-code' })
  /** Sends one turn, reads the stream to its end, returns [reserved input, upstream's count]. */
  const turn = async (body) => {
    const n = settled.length
    const res = await fetch(up.url, { method: 'POST', headers: { 'x-api-key': 'k', 'content-type': 'application/json', 'anthropic-version': '2023-06-01' }, body: JSON.stringify(body) })
    assert.equal(res.status, 200)
    await res.text()
    for (let i = 0; i < 100 && settled.length === n; i++) await delay(5)
    assert.equal(settled.length, n + 1, 'settled')
    return { reserved: settled[n].reserved[0], counted: up.counted[up.counted.length - 1], usage: up.usage[up.usage.length - 1] }
  }
  return { tw, turn }
}

const within = (reserved, counted, what) => {
  const error = Math.abs(reserved - counted) / counted
  assert.ok(error <= 0.15, `${what}: reserved ${reserved} input tokens, the upstream counted ${counted} (${(error * 100).toFixed(1)} % off)`)
}

describe('rolling cache breakpoints through tw.fetch', () => {
  test('a warm turn reserves the cache write and what follows it, within 15 % of what the provider counts', async () => {
    const { tw, turn } = setup()
    const turns = []
    for (let t = 0; t <= 8; t++) {
      const body = conversation({ turns: t })
      const size = JSON.stringify(body).length
      turns.push({ t, size, ...(await turn(body)) })
    }
    assert.ok(turns[8].size > 45_000, `bodies grow to ~50 KB: ${turns[8].size}`)
    // Turn 0 is cold (everything a write, counted); from turn 1 on each reads the previous
    // turn's prefix and writes the new messages.
    assert.equal(turns[0].usage.cache_read_input_tokens, 0)
    for (const r of turns.slice(1)) {
      assert.ok(r.usage.cache_read_input_tokens > 5_000, `turn ${r.t} reads the cache`)
      assert.ok(r.counted > 500, `turn ${r.t} writes its new part: ${r.counted}`)
      within(r.reserved, r.counted, `warm turn ${r.t}`)
    }
    tw.close()
  })

  test('a cold conversation with breakpoints counts everything, even right after a warm one on the same agent', async () => {
    const { tw, turn } = setup()
    for (let t = 0; t <= 3; t++) await turn(conversation({ turns: t }))
    // Another system prompt: nothing of it is cached, so the whole prompt is a write.
    const cold = await turn(conversation({ system: prose(7, 12_000), first: prose(8, 2_000), turns: 2 }))
    assert.equal(cold.usage.cache_read_input_tokens, 0)
    within(cold.reserved, cold.counted, 'cold conversation')
    // The same system prompt and tools with another first message: the provider reads the
    // shared prefix (tools and system) and writes the rest; so does the estimate.
    const shared = await turn(conversation({ first: prose(9, 2_000), turns: 1 }))
    assert.ok(shared.usage.cache_read_input_tokens > 5_000, 'the shared prefix is read')
    within(shared.reserved, shared.counted, 'new conversation on a cached system prompt')
    tw.close()
  })
})

describe('BytesPerTokenEstimator and the prompt cache', () => {
  const est = (clock, options = {}) => new BytesPerTokenEstimator({ now: () => clock.t, ...options })
  /** Estimates `body`, then observes it as the provider counting `bytes / 4` tokens. */
  const call = (e, body) => {
    const estimate = e.estimate({ provider: 'anthropic', model: MODEL, body })
    const actualInputTokens = Math.round(JSON.stringify(body).length / 4)
    e.observe({ provider: 'anthropic', model: MODEL, body, estimate, actualInputTokens })
    return estimate
  }
  const next = (e, body) => e.estimate({ provider: 'anthropic', model: MODEL, body })

  test('a conversation never seen is all input, breakpoints or not', () => {
    const e = est({ t: 0 })
    const body = conversation({ turns: 3 })
    const cold = next(e, body)
    assert.equal(cold.cachedPrefixTokens, 0)
    const open = next(e, { ...body, system: body.system.map(({ cache_control, ...b }) => b), messages: body.messages.map((m) => ({ ...m, content: m.content.map(({ cache_control, ...b }) => b) })) })
    assert.equal(cold.inputTokens, open.inputTokens, 'the same as without any breakpoint')
  })

  test('the previous turn\'s prefix is a read, the new messages a write', () => {
    const e = est({ t: 0 })
    call(e, conversation({ turns: 2 }))
    const warm = next(e, conversation({ turns: 3 }))
    const whole = next(new BytesPerTokenEstimator(), conversation({ turns: 3 }))
    assert.ok(warm.cachedPrefixTokens > 5_000, `read: ${warm.cachedPrefixTokens}`)
    assert.ok(warm.inputTokens > 500 && warm.inputTokens < whole.inputTokens / 4, `written: ${warm.inputTokens} of ${whole.inputTokens}`)
  })

  test('a 5-minute prefix is cold after 5 minutes, a 1-hour one after an hour; a read renews it', () => {
    const clock = { t: 1_000_000 }
    const e = est(clock)
    call(e, conversation({ turns: 1 }))
    clock.t += 4 * 60_000
    assert.ok(next(e, conversation({ turns: 2 })).cachedPrefixTokens > 0, 'warm at 4 min')
    clock.t += 2 * 60_000
    assert.equal(next(e, conversation({ turns: 2 })).cachedPrefixTokens, 0, 'cold at 6 min')

    const hour = (turns) => {
      const body = conversation({ turns })
      body.system = body.system.map((b) => ({ ...b, cache_control: { type: 'ephemeral', ttl: '1h' } }))
      const newest = body.messages[body.messages.length - 1].content
      newest[newest.length - 1].cache_control = { type: 'ephemeral', ttl: '1h' }
      return body
    }
    const e1 = est(clock)
    call(e1, hour(1))
    clock.t += 50 * 60_000
    assert.ok(next(e1, hour(2)).cachedPrefixTokens > 0, 'warm at 50 min')
    clock.t += 11 * 60_000
    assert.equal(next(e1, hour(2)).cachedPrefixTokens, 0, 'cold at 61 min')

    const e2 = est(clock)
    call(e2, conversation({ turns: 1 }))
    clock.t += 4 * 60_000
    call(e2, conversation({ turns: 2 }))
    clock.t += 4 * 60_000
    assert.ok(next(e2, conversation({ turns: 3 })).cachedPrefixTokens > 0, 'warm 8 min after the first call: each call renews or writes')
  })

  test('remembered prefixes are bounded, least recently used dropped first', () => {
    const e = est({ t: 0 }, { cachedPrefixes: 4 })
    const other = (i) => conversation({ system: prose(1000 + i, 12_000), turns: 1 })
    for (let i = 0; i < 5; i++) call(e, other(i))
    assert.equal(e.cachedPrefixCount, 4)
    assert.equal(next(e, other(0)).cachedPrefixTokens, 0, 'the oldest conversation was dropped')
    assert.ok(next(e, other(4)).cachedPrefixTokens > 0, 'the newest is kept')
    assert.throws(() => new BytesPerTokenEstimator({ cachedPrefixes: 0 }), /cachedPrefixes must be a positive integer/)
    assert.throws(() => new BytesPerTokenEstimator({ now: 5 }), /now must be a function/)
  })

  test('a prefix further back than 20 blocks before every breakpoint is not counted as read', () => {
    const e = est({ t: 0 })
    const body = (n) => {
      const b = conversation({ turns: 0 })
      // One breakpoint only, on the newest message.
      b.system = b.system.map(({ cache_control, ...s }) => s)
      b.messages[0].content = b.messages[0].content.map(({ cache_control, ...c }) => c)
      for (let i = 0; i < n; i++) b.messages.push({ role: i % 2 ? 'user' : 'assistant', content: [{ type: 'text', text: prose(500 + i, 200) }] })
      const newest = b.messages[b.messages.length - 1].content
      newest[0] = { ...newest[0], cache_control: { type: 'ephemeral' } }
      return b
    }
    call(e, body(1))
    assert.ok(next(e, body(10)).cachedPrefixTokens > 0, '9 blocks later: read')
    assert.equal(next(e, body(30)).cachedPrefixTokens, 0, '29 blocks later: beyond the lookback')
  })

  test('a prefix below minCacheTokens is not remembered (the provider caches nothing that short)', () => {
    const e = est({ t: 0 })
    const small = (turns) => ({ model: MODEL, max_tokens: 100, messages: Array.from({ length: turns + 1 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: [{ type: 'text', text: prose(600 + i, 400), ...(i === turns ? { cache_control: { type: 'ephemeral' } } : {}) }] })) })
    call(e, small(2))
    assert.equal(next(e, small(4)).cachedPrefixTokens, 0)
  })
})
