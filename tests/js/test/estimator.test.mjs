// The default estimator against the prompt cache as agents really use it (issue 26, item 2):
// rolling cache breakpoints (moved to the newest message each turn, as Claude Code and
// Anthropic's docs do), cache lifetimes, cold conversations. The sequences go through
// `tw.fetch` to a node:http upstream in this file that counts tokens by its own rule and
// answers with Anthropic's usage (cache read = the prefix an earlier call cached, cache
// write = the rest up to the last breakpoint); each check compares the lease's input
// reservation with what that upstream counted against the input limit (input + write).
//
// Then counting instead of guessing (issue 26, item 3): OpenAI prompts by the tokenizer,
// checked against js-tiktoken (an independent implementation, not the provider crate's
// tokenizer the estimator counts with) and OpenAI's published counts; asynchronous estimators through `tw.fetch`;
// Anthropic's `count_tokens` as an opt-in, against the mock provider.
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import http from 'node:http'
import { after, before, describe, test } from 'node:test'
import { Tiktoken } from 'js-tiktoken/lite'
import cl100kRanks from 'js-tiktoken/ranks/cl100k_base'
import o200kRanks from 'js-tiktoken/ranks/o200k_base'
import { BytesPerTokenEstimator, CountTokensEstimator, DefaultEstimator, promptBytes } from 'tokenwarden-driver'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'
import { createTokenwarden } from '../support/engine.mjs'

/** The default estimator's safety factor (`DefaultEstimatorOptions.safety`): estimates are this much high. */
const SAFETY = 1.02

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

describe('images and documents by the providers\' published rules', () => {
  const filler = (n) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 7919) & 0xff))
  const be32 = (v) => [(v >>> 24) & 0xff, (v >>> 16) & 0xff, (v >>> 8) & 0xff, v & 0xff]
  const png = (w, h) => Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52, ...be32(w), ...be32(h), 8, 6, 0, 0, 0]), filler(300_000)])
  const jpeg = (w, h) =>
    Buffer.concat([
      Buffer.from([0xff, 0xd8, 0xff, 0xe1, 0x10, 0x02]), // an EXIF segment of 4,098 bytes before the frame
      filler(4096),
      Buffer.from([0xff, 0xc0, 0, 17, 8, h >> 8, h & 0xff, w >> 8, w & 0xff, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]),
      filler(200_000),
    ])
  const gif = (w, h) => Buffer.concat([Buffer.from('GIF89a'), Buffer.from([w & 0xff, w >> 8, h & 0xff, h >> 8]), filler(50_000)])
  const webp = (w, h) => {
    const u24 = (v) => [v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff]
    return Buffer.concat([Buffer.from('RIFF'), Buffer.from([0, 0, 0, 0]), Buffer.from('WEBPVP8X'), Buffer.from([10, 0, 0, 0, 0, 0, 0, 0, ...u24(w - 1), ...u24(h - 1)]), filler(80_000)])
  }
  const text = { type: 'text', text: prose(50, 4_000) }
  const anthropic = (block) => ({ model: MODEL, max_tokens: 100, messages: [{ role: 'user', content: [text, block] }] })
  const extra = (provider, body, without) => {
    const e = new BytesPerTokenEstimator()
    return e.estimate({ provider, model: MODEL, body }).inputTokens - e.estimate({ provider, model: MODEL, body: without }).inputTokens
  }
  const plain = { model: MODEL, max_tokens: 100, messages: [{ role: 'user', content: [text] }] }
  const image = (buf, media_type) => ({ type: 'image', source: { type: 'base64', media_type, data: buf.toString('base64') } })

  test('Anthropic images cost width × height / 750 after scaling to 1568 px and ~1.19 MP', () => {
    assert.equal(extra('anthropic', anthropic(image(png(200, 100), 'image/png')), plain), 27, '200×100 PNG: 27 tokens')
    assert.equal(extra('anthropic', anthropic(image(gif(1000, 1000), 'image/gif')), plain), 1334, '1000×1000 GIF')
    assert.equal(extra('anthropic', anthropic(image(webp(800, 600), 'image/webp')), plain), 640, '800×600 WebP')
    assert.equal(extra('anthropic', anthropic(image(jpeg(4000, 3000), 'image/jpeg')), plain), 1590, '4000×3000 JPEG: scaled to the limit')
    assert.equal(extra('anthropic', anthropic({ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }), plain), 1590, 'a URL: the most')
    // A screenshot in a tool result, as Claude Code sends it.
    const shot = { model: MODEL, max_tokens: 100, messages: [{ role: 'user', content: [text, { type: 'tool_result', tool_use_id: 't', content: [image(png(1280, 800), 'image/png')] }] }] }
    assert.equal(extra('anthropic', shot, plain), Math.ceil((1280 * 800) / 750))
  })

  test('OpenAI images: 85 at low detail, else 170 per 512-px tile after 2048 and 768 scaling, plus 85', () => {
    const chat = (url, detail) => ({ model: 'gpt-4o', messages: [{ role: 'user', content: [text, { type: 'image_url', image_url: { url, ...(detail ? { detail } : {}) } }] }] })
    const chatPlain = { model: 'gpt-4o', messages: [{ role: 'user', content: [text] }] }
    const dataUrl = `data:image/png;base64,${png(1024, 1024).toString('base64')}`
    assert.equal(extra('openai', chat(dataUrl), chatPlain), 765, '1024×1024: 4 tiles')
    assert.equal(extra('openai', chat(dataUrl, 'low'), chatPlain), 85)
    assert.equal(extra('openai', chat(`data:image/jpeg;base64,${jpeg(4096, 2048).toString('base64')}`), chatPlain), 85 + 170 * 6, '4096×2048 → 1536×768: 6 tiles')
    assert.equal(extra('openai', chat('https://example.com/a.png'), chatPlain), 1445, 'a URL: the most (8 tiles)')
    const responses = { model: 'gpt-4o', input: [{ role: 'user', content: [{ type: 'input_text', text: text.text }, { type: 'input_image', image_url: dataUrl }] }] }
    const responsesPlain = { model: 'gpt-4o', input: [{ role: 'user', content: [{ type: 'input_text', text: text.text }] }] }
    assert.equal(extra('openai', responses, responsesPlain), 765, 'Responses input_image')
  })

  test('a PDF whose text cannot be read costs its pages (an image each, and up to 3,000 text tokens by its size), not its bytes', () => {
    const pages = 40
    const objects = Array.from({ length: pages }, (_, i) => `${i + 3} 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>\nendobj\n`).join('')
    const pdf = Buffer.concat([Buffer.from(`%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Count ${pages} /Kids [] >>\nendobj\n${objects}`), filler(4_000_000)])
    const doc = { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: pdf.toString('base64') } }
    // The text guessed at its most, 3,000 tokens a page (at the initial 3 bytes per token, 2 % high).
    assert.equal(extra('anthropic', anthropic(doc), plain), pages * 1590 + Math.ceil(pages * 3000 * SAFETY), '40 pages')
    // Page objects hidden in compressed object streams: one page per 50 KB of file.
    const opaque = { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: Buffer.concat([Buffer.from('%PDF-1.7\n'), filler(4_000_000)]).toString('base64') } }
    assert.equal(extra('anthropic', anthropic(opaque), plain), 81 * 1590 + Math.ceil(81 * 3000 * SAFETY), 'a 4 MB PDF of unreadable pages: 81')
    const chatFile = { model: 'gpt-4o', messages: [{ role: 'user', content: [text, { type: 'file', file: { filename: 'a.pdf', file_data: `data:application/pdf;base64,${pdf.toString('base64')}` } }] }] }
    assert.equal(extra('openai', chatFile, { model: 'gpt-4o', messages: [{ role: 'user', content: [text] }] }), pages * 765 + Math.ceil(pages * 3000 * SAFETY), 'OpenAI file_data: a page image is 4 tiles')
    const textDoc = { type: 'document', source: { type: 'text', media_type: 'text/plain', data: prose(60, 3_000) } }
    const e = new BytesPerTokenEstimator()
    assert.equal(e.estimate({ provider: 'anthropic', model: MODEL, body: anthropic(textDoc) }).inputTokens, Math.ceil((4_000 + 3_000 + 8) / (3 / SAFETY)), 'a text document is its text')
  })

  test('bytes per token are learned from the text alone (image tokens taken out of the count)', () => {
    const e = new BytesPerTokenEstimator()
    const body = anthropic(image(png(1280, 800), 'image/png'))
    const imageTokens = Math.ceil((1280 * 800) / 750)
    const estimate = e.estimate({ provider: 'anthropic', model: MODEL, body })
    e.observe({ provider: 'anthropic', model: MODEL, body, estimate, actualInputTokens: 1000 + imageTokens })
    assert.equal(e.bytesPerToken('anthropic', MODEL), (4_000 + 8) / 1000)
  })

  test('a Responses API call counts its instructions and input', () => {
    const e = new BytesPerTokenEstimator()
    const body = { model: 'gpt-4o', instructions: prose(70, 1_000), input: [{ role: 'user', content: [{ type: 'input_text', text: prose(71, 2_000) }] }, { type: 'function_call_output', call_id: 'c', output: prose(72, 1_000) }] }
    const got = e.estimate({ provider: 'openai', model: 'gpt-4o', body }).inputTokens
    assert.ok(got >= Math.ceil(4_000 / (3 / SAFETY)), `instructions and input counted: ${got}`)
    assert.ok(e.estimate({ provider: 'openai', model: 'gpt-4o', body: { model: 'gpt-4o', input: prose(73, 3_000) } }).inputTokens >= Math.ceil(1_000 * SAFETY), 'a string input')
  })
})

describe('tool definitions', () => {
  test('an Anthropic call with tools counts the tool-use system prompt (346 tokens, 313 when a tool is forced); OpenAI publishes none', () => {
    const e = new BytesPerTokenEstimator()
    const ratio = 3 / SAFETY
    const body = { model: MODEL, max_tokens: 100, tools: TOOLS, messages: [{ role: 'user', content: prose(80, 2_000) }] }
    const text = (b) => {
      const { prefix, rest } = promptBytes('anthropic', b)
      return Math.ceil((prefix + rest) / ratio)
    }
    assert.equal(e.estimate({ provider: 'anthropic', model: MODEL, body }).inputTokens, text(body) + 346)
    const forced = { ...body, tool_choice: { type: 'any' } }
    assert.equal(e.estimate({ provider: 'anthropic', model: MODEL, body: forced }).inputTokens, text(forced) + 313)
    const none = { ...body, tools: [] }
    assert.equal(e.estimate({ provider: 'anthropic', model: MODEL, body: none }).inputTokens, text(none), 'no tools, no tool-use prompt')
    assert.equal(e.estimate({ provider: 'openai', model: MODEL, body }).inputTokens, text(body))
  })
})

// ---- Counting instead of guessing (issue 26, item 3) ------------------------------------

/** js-tiktoken: the independent count (special-token strings as ordinary text, as the API takes them). */
const reference = { o200k_base: new Tiktoken(o200kRanks), cl100k_base: new Tiktoken(cl100kRanks) }
const tok = (encoding, text) => reference[encoding].encode(text, [], []).length

/**
 * OpenAI's published rule (Cookbook, "How to count tokens with tiktoken", sections 6 and 7),
 * restated here over js-tiktoken: 3 per message plus each field's tokens (+1 for a name),
 * 3 for the reply; per function 7 (o200k) or 10 (cl100k) + name:description, 3 if it has
 * properties, per property 3 + key:type:description, an enum −3 and 3 + tokens per value,
 * 12 after the functions.
 */
function cookbook(encoding, messages, tools = []) {
  let n = 3
  for (const m of messages) {
    n += 3
    for (const [k, v] of Object.entries(m)) n += tok(encoding, v) + (k === 'name' ? 1 : 0)
  }
  if (tools.length === 0) return n
  const noDot = (s) => (s.endsWith('.') ? s.slice(0, -1) : s)
  for (const { function: f } of tools) {
    n += (encoding === 'o200k_base' ? 7 : 10) + tok(encoding, `${f.name}:${noDot(f.description)}`)
    const props = Object.entries(f.parameters.properties)
    if (props.length > 0) n += 3
    for (const [key, p] of props) {
      n += 3
      if (p.enum) n += -3 + p.enum.reduce((a, item) => a + 3 + tok(encoding, item), 0)
      n += tok(encoding, `${key}:${p.type}:${noDot(p.description)}`)
    }
  }
  return n + 12
}

/** The cookbook's own examples, with the prompt tokens the OpenAI API answered for them (published in the notebook). */
const JARGON = [
  { role: 'system', content: 'You are a helpful, pattern-following assistant that translates corporate jargon into plain English.' },
  { role: 'system', name: 'example_user', content: 'New synergies will help drive top-line growth.' },
  { role: 'system', name: 'example_assistant', content: 'Things working well together will increase revenue.' },
  { role: 'system', name: 'example_user', content: "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage." },
  { role: 'system', name: 'example_assistant', content: "Let's talk later when we're less busy about how to do better." },
  { role: 'user', content: "This late pivot means we don't have time to boil the ocean for the client deliverable." },
]
const WEATHER_TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_current_weather',
      description: 'Get the current weather in a given location',
      parameters: {
        type: 'object',
        properties: {
          location: { type: 'string', description: 'The city and state, e.g. San Francisco, CA' },
          unit: { type: 'string', description: 'The unit of temperature to return', enum: ['celsius', 'fahrenheit'] },
        },
        required: ['location'],
      },
    },
  },
]
const WEATHER = [
  { role: 'system', content: 'You are a helpful assistant that can answer to questions about the weather.' },
  { role: 'user', content: "What's the weather like in San Francisco?" },
]

/** A coding agent's tools in the cookbook's shape: several functions, enums, long descriptions. */
const AGENT_TOOLS = Array.from({ length: 8 }, (_, i) => ({
  type: 'function',
  function: {
    name: `tool_${i}`,
    description: `${prose(500 + i, 600)}.`,
    parameters: {
      type: 'object',
      properties: {
        path: { type: 'string', description: prose(520 + i, 160) },
        mode: { type: 'string', description: 'How to open it.', enum: ['read', 'write', 'append', `mode_${i}`] },
        limit: { type: 'integer', description: prose(540 + i, 80) },
      },
      required: ['path'],
    },
  },
}))

const estimateOf = async (e, provider, body) => await e.estimate({ provider, model: body.model, body })

describe('OpenAI prompts counted with the tokenizer', () => {
  test("the cookbook's examples count what the OpenAI API answered: 124 and 129 tokens, 101 and 105 with a tool", async () => {
    const e = new DefaultEstimator()
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-4o', messages: JARGON })).inputTokens, 124)
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-4o-mini', messages: JARGON })).inputTokens, 124)
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-4', messages: JARGON })).inputTokens, 129)
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-3.5-turbo', messages: JARGON })).inputTokens, 129)
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-4o', messages: WEATHER, tools: WEATHER_TOOLS })).inputTokens, 101)
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-4', messages: WEATHER, tools: WEATHER_TOOLS })).inputTokens, 105)
    // The reference restatement agrees with the published figures too.
    assert.deepEqual([cookbook('o200k_base', JARGON), cookbook('cl100k_base', JARGON), cookbook('o200k_base', WEATHER, WEATHER_TOOLS), cookbook('cl100k_base', WEATHER, WEATHER_TOOLS)], [124, 129, 101, 105])
  })

  test('text no tokenizer should take whole (long runs without whitespace, over a MiB) is counted near the exact figure, in linear time', async () => {
    // Byte-pair merging is quadratic in a pre-token's length: a 600 KB run of base64 once
    // took minutes. Runs are cut at 1,024 characters (about a token more per cut) and past
    // a MiB the count is extrapolated from the first MiB.
    const e = new DefaultEstimator()
    const b64 = Buffer.from(Array.from({ length: 45_000 }, (_, i) => (i * 2654435761) % 256)).toString('base64')
    const body = { model: 'gpt-4o', messages: [{ role: 'user', content: b64 }] }
    const exact = cookbook('o200k_base', body.messages)
    const got = (await estimateOf(e, 'openai', body)).inputTokens
    assert.ok(Math.abs(got - exact) <= Math.ceil(b64.length / 1024) + 1, `${got} against ${exact} exact`)
    // 2.5 MiB of prose: exact for the first MiB, the rest at its rate (prose is uniform here).
    const prose = 'the quick brown fox jumps over the lazy dog. '.repeat(60_000)
    const big = await estimateOf(e, 'openai', { model: 'gpt-4o', messages: [{ role: 'user', content: prose }] })
    const rate = tok('o200k_base', prose.slice(0, 1 << 20)) / (1 << 20)
    assert.ok(Math.abs(big.inputTokens - rate * prose.length) / (rate * prose.length) < 0.01, `${big.inputTokens} against ~${Math.round(rate * prose.length)}`)
  })

  test('a coding-agent chat body with tools is within 2 % of the independent count (o200k and cl100k)', async () => {
    const e = new DefaultEstimator()
    const messages = [
      { role: 'system', content: prose(600, 9_000) },
      { role: 'user', name: 'dev', content: prose(601, 3_000) },
      { role: 'assistant', content: prose(602, 1_200) },
      { role: 'user', content: prose(603, 4_000) },
    ]
    const encodings = { 'gpt-4.1': 'o200k_base', 'gpt-5-codex': 'o200k_base', 'o4-mini': 'o200k_base', 'gpt-4-turbo': 'cl100k_base' }
    for (const [model, encoding] of Object.entries(encodings)) {
      const want = cookbook(encoding, messages, AGENT_TOOLS)
      const got = (await estimateOf(e, 'openai', { model, max_completion_tokens: 4096, messages, tools: AGENT_TOOLS })).inputTokens
      const error = Math.abs(got - want) / want
      assert.ok(error <= 0.02, `${model} (${encoding}): estimated ${got}, js-tiktoken by the cookbook's rule ${want} (${(error * 100).toFixed(2)} % off)`)
      assert.ok(want > 5_000, `a body of some size: ${want}`)
    }
    // Content parts count as their text.
    const parts = messages.map((m) => ({ role: m.role, content: [{ type: 'text', text: m.content }] }))
    const flat = messages.map(({ name, ...m }) => m)
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-4o', messages: parts })).inputTokens, cookbook('o200k_base', flat))
  })

  test('Japanese, kanji and emoji, where bytes / 4 is 20–50 % off, are within 2 %', async () => {
    const e = new DefaultEstimator()
    const bodies = {
      // Kana and kanji: o200k takes several characters a token, bytes / 4 over-counts.
      japanese: 'お誕生日おめでとうございます。今日は東京で新しいプロジェクトの打ち合わせがありました。\n'.repeat(40),
      // Kanji compounds: a token each or more, bytes / 4 under-counts.
      kanji: '東京都庁舎総合防災訓練実施計画書概要説明資料\n'.repeat(60),
      // Emoji with modifiers and joiners: several tokens each, bytes / 4 under-counts by half.
      emoji: '🎉👍🏽🚀🔥✅❌🤖🧪📦🐛 ship it 💯🙏🏻👩‍💻🧑🏽‍🔬🏳️‍🌈👨‍👩‍👧‍👦🫠🫶🏾\n'.repeat(40),
    }
    for (const [what, text] of Object.entries(bodies)) {
      const messages = [{ role: 'user', content: text }]
      const want = cookbook('o200k_base', messages)
      const got = (await estimateOf(e, 'openai', { model: 'gpt-4o', messages })).inputTokens
      assert.ok(Math.abs(got - want) / want <= 0.02, `${what}: estimated ${got}, js-tiktoken ${want}`)
      const byRule = Math.ceil(new TextEncoder().encode(text).length / 4)
      assert.ok(Math.abs(byRule - want) / want > 0.2, `${what}: bytes / 4 is far off here: ${byRule} for ${want}`)
      const cl = cookbook('cl100k_base', messages)
      const gotCl = (await estimateOf(e, 'openai', { model: 'gpt-4', messages })).inputTokens
      assert.ok(Math.abs(gotCl - cl) / cl <= 0.02, `${what}, cl100k: estimated ${gotCl}, js-tiktoken ${cl}`)
    }
  })

  test('a Responses API body: instructions and input items by the tokenizer', async () => {
    const e = new DefaultEstimator()
    const instructions = prose(610, 3_000)
    const question = prose(611, 2_000)
    const output = prose(612, 4_000)
    const body = {
      model: 'gpt-5',
      instructions,
      input: [
        { role: 'user', content: [{ type: 'input_text', text: question }] },
        { type: 'function_call', call_id: 'call_1', name: 'read_file', arguments: '{"path":"src/lexer.rs"}' },
        { type: 'function_call_output', call_id: 'call_1', output },
      ],
    }
    const want = tok('o200k_base', instructions) + tok('o200k_base', question) + tok('o200k_base', output)
    const got = (await estimateOf(e, 'openai', body)).inputTokens
    assert.ok(got >= want && got <= want * 1.02, `estimated ${got}, the text alone ${want}`)
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-5', input: question })).inputTokens, cookbook('o200k_base', [{ role: 'user', content: question }]))
  })

  test('a special-token string in a prompt is ordinary text', async () => {
    const e = new DefaultEstimator()
    const messages = [{ role: 'user', content: 'the tokenizer ends a document with <|endoftext|> and a chat turn with <|im_end|>; '.repeat(20) }]
    assert.equal((await estimateOf(e, 'openai', { model: 'gpt-4o', messages })).inputTokens, cookbook('o200k_base', messages))
  })

  test('each model its encoding: o200k_base but for GPT-4 and GPT-3.5; an unknown model o200k_base', async () => {
    // The estimate of one message is the cookbook's count with the model's encoding
    // (the two encodings count this text apart: 'わ' alone is one token in o200k_base only).
    const e = new DefaultEstimator()
    const messages = [{ role: 'user', content: 'わたしは東京で新しいプロジェクトを始めました。'.repeat(8) }]
    assert.notEqual(cookbook('o200k_base', messages), cookbook('cl100k_base', messages))
    const counted = async (model) => (await estimateOf(e, 'openai', { model, messages })).inputTokens
    for (const m of ['gpt-4o', 'gpt-4o-mini-2024-07-18', 'chatgpt-4o-latest', 'gpt-4.1', 'gpt-4.1-nano', 'gpt-4.5-preview', 'gpt-5', 'gpt-5.2-codex', 'o1', 'o3-mini', 'o4-mini', 'codex-mini-latest', 'gpt-oss-120b', 'ft:gpt-4o-mini:acme::x1', 'some-new-model']) {
      assert.equal(await counted(m), cookbook('o200k_base', messages), m)
    }
    for (const m of ['gpt-4', 'gpt-4-0613', 'gpt-4-turbo', 'gpt-4-32k', 'gpt-3.5-turbo', 'gpt-3.5-turbo-0125', 'gpt-35-turbo', 'ft:gpt-3.5-turbo:acme::x1', 'text-embedding-3-small']) {
      assert.equal(await counted(m), cookbook('cl100k_base', messages), m)
    }
  })

  test('the tokenizer off: the byte rule', async () => {
    const body = { model: 'gpt-4o', messages: JARGON }
    const off = (await estimateOf(new DefaultEstimator({ tokenizer: false }), 'openai', body)).inputTokens
    assert.equal(off, new BytesPerTokenEstimator().estimate({ provider: 'openai', model: 'gpt-4o', body }).inputTokens)
    assert.throws(() => new DefaultEstimator({ tokenizer: 'yes' }), /tokenizer must be true or false/)
  })
})

describe('a prefix known from the previous call', () => {
  test("the same prompt again is its settled count exactly; the next turn that count plus its new part", () => {
    const e = new BytesPerTokenEstimator()
    const first = conversation({ turns: 1 })
    const estimate = e.estimate({ provider: 'anthropic', model: MODEL, body: first })
    const usage = { inputTokens: 700, cacheReadInputTokens: 0, cacheCreationInputTokens: 8_000, outputTokens: 90 }
    e.observe({ provider: 'anthropic', model: MODEL, body: first, estimate, actualInputTokens: 8_700, usage })
    const again = e.estimate({ provider: 'anthropic', model: MODEL, body: conversation({ turns: 1 }) })
    assert.equal(again.inputTokens + again.cachedPrefixTokens, 8_700, 'the whole prompt, exactly')
    assert.equal(again.cachedPrefixTokens, 8_000, 'cache read + write of the previous call: the prefix up to its last breakpoint')
    // The next turn: the previous prompt (exact) and its new messages by the ratio.
    const next = conversation({ turns: 2 })
    const { prefix, rest } = promptBytes('anthropic', next)
    const { prefix: p1, rest: r1 } = promptBytes('anthropic', first)
    const ratio = e.bytesPerToken('anthropic', MODEL) / SAFETY
    const e2 = e.estimate({ provider: 'anthropic', model: MODEL, body: next })
    const newPart = Math.ceil((prefix + rest - p1 - r1) / ratio)
    assert.ok(Math.abs(e2.inputTokens + e2.cachedPrefixTokens - (8_700 + newPart)) <= 2, `${e2.inputTokens} + ${e2.cachedPrefixTokens} for 8,700 + ${newPart}`)
  })
})

describe('an OpenAI prefix known from the previous call', () => {
  test("what the provider counted beyond the tokenizer on a turn carries over to the conversation's next turn", async () => {
    const e = new DefaultEstimator()
    const messages = [{ role: 'system', content: prose(900, 4_000) }, { role: 'user', content: prose(901, 1_000) }]
    const body = { model: 'gpt-4o', messages }
    const first = await estimateOf(e, 'openai', body)
    assert.equal(first.inputTokens, cookbook('o200k_base', messages))
    e.observe({ provider: 'openai', model: 'gpt-4o', body, estimate: first, actualInputTokens: first.inputTokens + 40 })
    const more = [...messages, { role: 'assistant', content: prose(902, 600) }, { role: 'user', content: prose(903, 800) }]
    const next = await estimateOf(e, 'openai', { model: 'gpt-4o', messages: more })
    assert.equal(next.inputTokens, cookbook('o200k_base', more) + 40, 'the prefix as the provider counted it, the new part by the tokenizer')
    const other = await estimateOf(e, 'openai', { model: 'gpt-4o', messages: [{ role: 'user', content: prose(904, 1_000) }] })
    assert.equal(other.inputTokens, cookbook('o200k_base', [{ role: 'user', content: prose(904, 1_000) }]), 'another conversation carries nothing')
  })
})

describe('asynchronous estimators through tw.fetch (mock provider)', () => {
  let mock
  before(async () => {
    mock = await startMockProvider({ replyTokens: 7 })
  })
  after(async () => {
    await mock?.close()
  })
  const pools = [{ name: MODEL, input_tokens_per_minute: 4_000_000, output_tokens_per_minute: 2_000_000, max_concurrent: 4 }]
  const headers = { 'x-api-key': 'sk-ant-test', 'content-type': 'application/json', 'anthropic-version': '2023-06-01' }
  /** One Anthropic call through `tw.fetch`; resolves to its settlement and the events seen. */
  async function call(tw, body, fetch = tw.fetch({ agent: 'a' })) {
    const settled = []
    const errors = []
    const off1 = tw.on('settled', (e) => settled.push(e.settlement))
    const off2 = tw.on('remote_error', (e) => errors.push(e))
    try {
      const res = await fetch(`${mock.url}/v1/messages`, { method: 'POST', headers, body: JSON.stringify(body) })
      assert.equal(res.status, 200, await res.clone().text())
      const answer = await res.json()
      for (let i = 0; i < 100 && settled.length === 0; i++) await delay(5)
      return { settlement: settled[0], errors, answer }
    } finally {
      off1?.()
      off2?.()
    }
  }
  const simple = (text = prose(700, 4_000)) => ({ model: MODEL, max_tokens: 64, messages: [{ role: 'user', content: text }] })

  test('an estimator that answers a promise is awaited: the lease reserves its figure', async () => {
    const estimator = { estimate: () => delay(30).then(() => ({ inputTokens: 4_321, cachedPrefixTokens: 0 })) }
    const tw = createTokenwarden({ config: { pools }, estimator })
    const { settlement, errors } = await call(tw, simple())
    assert.equal(settlement.reserved[0], 4_321)
    assert.deepEqual(errors, [])
    tw.close()
  })

  test('an estimator that rejects, throws or answers no estimate costs the call nothing: the byte rule, and a remote_error event', async () => {
    const body = simple()
    // The wrapper's fallback is the byte rule itself (fetch.ts), not the default's tokenizer proxy.
    const byRule = new BytesPerTokenEstimator().estimate({ provider: 'anthropic', model: MODEL, body }).inputTokens
    for (const [what, estimate] of [
      ['rejects', () => Promise.reject(new Error('tokenizer service down'))],
      ['throws', () => {
        throw new Error('tokenizer crashed')
      }],
      ['answers NaN', () => ({ inputTokens: Number.NaN, cachedPrefixTokens: 0 })],
    ]) {
      const tw = createTokenwarden({ config: { pools }, estimator: { estimate } })
      const { settlement, errors } = await call(tw, body)
      assert.equal(settlement.reserved[0], byRule, `${what}: reserved by the byte rule`)
      assert.equal(errors.length, 1, `${what}: one remote_error event`)
      assert.equal(errors[0].operation, 'estimator')
      assert.match(errors[0].message, /byte rule instead/)
      tw.close()
    }
  })

  test('observe is given the whole usage (input, cache read, cache write, output) and may be asynchronous', async () => {
    const seen = []
    const estimator = {
      estimate: () => ({ inputTokens: 1_000, cachedPrefixTokens: 0 }),
      observe: async (o) => {
        seen.push(o)
        throw new Error('observer down')
      },
    }
    const tw = createTokenwarden({ config: { pools }, estimator })
    const { answer, errors } = await call(tw, simple())
    for (let i = 0; i < 50 && errors.length === 0; i++) await delay(5)
    assert.equal(seen.length, 1)
    const u = answer.usage
    assert.deepEqual(seen[0].usage, { inputTokens: u.input_tokens, cacheReadInputTokens: u.cache_read_input_tokens ?? 0, cacheCreationInputTokens: u.cache_creation_input_tokens ?? 0, outputTokens: u.output_tokens })
    assert.equal(seen[0].usage.outputTokens, 7)
    assert.equal(seen[0].actualInputTokens, u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0))
    assert.equal(errors.length, 1, 'the rejected observation is a remote_error event, not a failed call')
    assert.equal(errors[0].operation, 'estimator')
    tw.close()
  })

  test('the default estimator on an OpenAI call: the tokenizer, not the byte rule', async () => {
    const openaiPools = [{ name: 'gpt-4o', counting: 'openai', tokens_per_minute: 4_000_000, max_concurrent: 4 }]
    const tw = createTokenwarden({ config: { pools: openaiPools } })
    const settled = []
    tw.on('settled', (e) => settled.push(e.settlement))
    const messages = [{ role: 'system', content: prose(710, 6_000) }, { role: 'user', content: 'お誕生日おめでとう 🎉 '.repeat(50) }]
    const res = await tw.fetch({ agent: 'o' })(`${mock.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: 'Bearer sk-test', 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', max_tokens: 16, messages }) })
    assert.equal(res.status, 200)
    await res.text()
    for (let i = 0; i < 100 && settled.length === 0; i++) await delay(5)
    assert.equal(settled[0].reserved[0], cookbook('o200k_base', messages))
    tw.close()
  })
})

describe("Anthropic's count_tokens, opted in (mock provider)", () => {
  let mock
  before(async () => {
    mock = await startMockProvider({ replyTokens: 7 })
  })
  after(async () => {
    await mock?.close()
  })
  const counts = () => mock.log.filter((e) => e.path === '/v1/messages/count_tokens').length
  const turn = (system, n) => {
    const messages = [{ role: 'user', content: prose(800, 3_000) }]
    for (let t = 0; t < n; t++) messages.push({ role: 'assistant', content: prose(810 + t, 400) }, { role: 'user', content: prose(820 + t, 1_500) })
    return { model: MODEL, max_tokens: 64, system, tools: TOOLS.slice(0, 3), messages }
  }

  test("a conversation costs one count: the second turn's unchanged prefix is not counted again", async () => {
    mock.reset()
    const e = new CountTokensEstimator({ apiKey: 'sk-ant-test', baseURL: mock.url })
    const system = prose(830, 8_000)
    const first = await e.estimate({ provider: 'anthropic', model: MODEL, body: turn(system, 0) })
    assert.equal(counts(), 1)
    const counted = mock.log.find((l) => l.path === '/v1/messages/count_tokens').inputTokens
    assert.equal(first.inputTokens + first.cachedPrefixTokens, counted, "the first turn is the endpoint's count")
    // The same prompt again (a retry) and the next turn: no new count.
    await e.estimate({ provider: 'anthropic', model: MODEL, body: turn(system, 0) })
    const second = await e.estimate({ provider: 'anthropic', model: MODEL, body: turn(system, 1) })
    assert.equal(counts(), 1, 'no count for a prompt whose prefix is known')
    assert.ok(second.inputTokens > first.inputTokens, 'the new part is added by the byte rule')
    // Another conversation (another system prompt) is counted once more.
    await e.estimate({ provider: 'anthropic', model: MODEL, body: turn(prose(840, 8_000), 0) })
    assert.equal(counts(), 2)
    assert.deepEqual(e.countTokensRequests, { sent: 2, failed: 0 })
  })

  test('through tw.fetch: each turn reserves what the provider counts, with one count for the conversation', async () => {
    mock.reset()
    const pools = [{ name: MODEL, input_tokens_per_minute: 4_000_000, output_tokens_per_minute: 2_000_000, max_concurrent: 4 }]
    const tw = createTokenwarden({ config: { pools }, estimator: new DefaultEstimator({ countTokens: { apiKey: 'sk-ant-test', baseURL: mock.url } }) })
    const settled = []
    tw.on('settled', (e) => settled.push(e.settlement))
    const f = tw.fetch({ agent: 'c' })
    const system = prose(850, 8_000)
    for (let t = 0; t < 4; t++) {
      const res = await f(`${mock.url}/v1/messages`, { method: 'POST', headers: { 'x-api-key': 'sk-ant-test', 'content-type': 'application/json', 'anthropic-version': '2023-06-01' }, body: JSON.stringify(turn(system, t)) })
      assert.equal(res.status, 200)
      await res.text()
      for (let i = 0; i < 100 && settled.length === t; i++) await delay(5)
      const charged = mock.log.filter((l) => l.path === '/v1/messages').at(-1).inputTokens
      const reserved = settled[t].reserved[0]
      assert.ok(Math.abs(reserved - charged) / charged <= (t === 0 ? 0 : 0.05), `turn ${t}: reserved ${reserved}, the provider counted ${charged}`)
    }
    assert.equal(counts(), 1, 'one count_tokens request for the whole conversation')
    tw.close()
  })

  test('a failed count (5xx, 429, timeout, network) falls back to the byte rule at once and pauses counting', async () => {
    const body = turn(prose(860, 4_000), 0)
    const byRule = (await new DefaultEstimator().estimate({ provider: 'anthropic', model: MODEL, body })).inputTokens
    const failures = []
    const answer = (status, headers = {}) => async () => new Response('{"type":"error"}', { status, headers })
    for (const [what, fetch, status, paused] of [
      ['a 500', answer(500), 500, 10_000],
      ['a 429 with retry-after', answer(429, { 'retry-after': '7' }), 429, 7_000],
      ['a network error', async () => {
        throw new TypeError('fetch failed')
      }, null, 10_000],
    ]) {
      failures.length = 0
      const e = new DefaultEstimator({ countTokens: { apiKey: 'sk-ant-secret-key', fetch, onError: (f) => failures.push(f) } })
      const got = await e.estimate({ provider: 'anthropic', model: MODEL, body })
      assert.equal(got.inputTokens, byRule, `${what}: the estimate without count_tokens`)
      assert.equal(failures.length, 1)
      assert.equal(failures[0].status, status)
      assert.equal(failures[0].pausedMs, paused)
      assert.ok(!JSON.stringify(failures).includes('sk-ant-secret-key'), 'the key is never in a failure')
      // Paused: the next prompt is not counted, and its estimate is synchronous.
      const next = e.estimate({ provider: 'anthropic', model: MODEL, body: turn(prose(861, 4_000), 0) })
      assert.ok(!(next instanceof Promise), `${what}: no count while paused`)
      assert.deepEqual(e.countTokensRequests, { sent: 1, failed: 1 })
    }
    // A count that does not answer in time: the call goes on after timeoutMs.
    const hang = (_url, init) => new Promise((_, reject) => init.signal.addEventListener('abort', () => reject(new Error('aborted'))))
    const e = new DefaultEstimator({ countTokens: { apiKey: 'k', fetch: hang, timeoutMs: 150, onError: (f) => failures.push(f) } })
    const t0 = performance.now()
    const got = await e.estimate({ provider: 'anthropic', model: MODEL, body })
    const waited = performance.now() - t0
    assert.equal(got.inputTokens, byRule)
    assert.ok(waited >= 140 && waited < 1_000, `waited ${waited.toFixed(0)} ms for a 150 ms timeout`)
    assert.match(failures.at(-1).message, /longer than 150 ms/)
  })

  test('the count request: only the counted fields, the key in x-api-key, the base URL', async () => {
    const sent = []
    const fetch = async (url, init) => {
      sent.push({ url, headers: init.headers, body: JSON.parse(init.body) })
      return Response.json({ input_tokens: 1_234 })
    }
    const e = new DefaultEstimator({ countTokens: { apiKey: 'sk-ant-k', baseURL: 'https://gateway.example/anthropic/', fetch } })
    const body = { ...turn('sys', 0), stream: true, temperature: 0.2, metadata: { user_id: 'u' }, tool_choice: { type: 'auto' }, thinking: { type: 'enabled', budget_tokens: 2_000 } }
    const got = await e.estimate({ provider: 'anthropic', model: MODEL, body })
    assert.equal(got.inputTokens, 1_234)
    assert.equal(sent.length, 1)
    assert.equal(sent[0].url, 'https://gateway.example/anthropic/v1/messages/count_tokens')
    assert.deepEqual(Object.keys(sent[0].body).sort(), ['messages', 'model', 'system', 'thinking', 'tool_choice', 'tools'])
    assert.equal(sent[0].headers['x-api-key'], 'sk-ant-k')
    assert.equal(sent[0].headers['anthropic-version'], '2023-06-01')
    // OpenAI calls never reach count_tokens.
    await e.estimate({ provider: 'openai', model: 'gpt-4o', body: { model: 'gpt-4o', messages: JARGON } })
    assert.equal(sent.length, 1)
    // Bad options are named.
    assert.throws(() => new DefaultEstimator({ countTokens: {} }), /countTokens\.apiKey or `headers` is required/)
    assert.throws(() => new DefaultEstimator({ countTokens: { apiKey: 'k', baseURL: 'not a url' } }), /countTokens\.baseURL must be an absolute URL/)
    assert.throws(() => new DefaultEstimator({ countTokens: { apiKey: 'k', timeoutMs: 0 } }), /countTokens\.timeoutMs/)
  })
})

describe('the published types', () => {
  test('an asynchronous estimator, the whole usage and the new estimators type-check against the packed .d.ts', async () => {
    const { execFileSync } = await import('node:child_process')
    const { mkdtempSync, rmSync, writeFileSync, symlinkSync, mkdirSync } = await import('node:fs')
    const { tmpdir } = await import('node:os')
    const { join } = await import('node:path')
    const { fileURLToPath } = await import('node:url')
    const root = fileURLToPath(new URL('../../../', import.meta.url))
    const dir = mkdtempSync(join(tmpdir(), 'tw-types-'))
    try {
      mkdirSync(join(dir, 'node_modules'))
      symlinkSync(join(root, 'driver'), join(dir, 'node_modules', 'tokenwarden-driver'))
      writeFileSync(join(dir, 'package.json'), '{"type":"module"}')
      writeFileSync(
        join(dir, 'check.ts'),
        `import { CountTokensEstimator, DefaultEstimator, type Estimate, type Estimator, type Observation } from 'tokenwarden-driver'
const async: Estimator = { estimate: async () => ({ inputTokens: 1, cachedPrefixTokens: 0 }), observe: async (o: Observation) => { const n: number = o.usage?.cacheReadInputTokens ?? 0; void n } }
const sync: Estimator = { estimate: (): Estimate => ({ inputTokens: 1, cachedPrefixTokens: 0 }) }
const d: Estimator = new DefaultEstimator({ tokenizer: true, countTokens: { apiKey: 'k', timeoutMs: 500, onError: (f) => { const s: number | null = f.status; void s } } })
const c = new CountTokensEstimator({ headers: { authorization: 'Bearer x' } })
const r: Estimate | Promise<Estimate> = c.estimate({ provider: 'anthropic', model: 'm', body: {} })
// @ts-expect-error an estimate is not a bare number
const bad: Estimator = { estimate: async () => 5 }
void async; void sync; void d; void r; void bad
`,
      )
      writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions: { strict: true, noEmit: true, module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2022', lib: ['ES2022', 'DOM'], types: [], skipLibCheck: true }, files: ['check.ts'] }))
      execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(dir, 'tsconfig.json')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
    } catch (e) {
      assert.fail(`tsc: ${e.stdout ?? ''}${e.stderr ?? ''}${e.stdout === undefined ? e.message : ''}`)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('issue 26: estimates the provider would agree with', () => {
  const o200k = new Tiktoken(o200kRanks)
  const sig = 'QUJD'.repeat(80) // 320 base64 characters
  const observeExact = (e, body, actual, usage) => {
    const estimate = e.estimate({ provider: 'anthropic', model: MODEL, body })
    e.observe({ provider: 'anthropic', model: MODEL, body, estimate, actualInputTokens: actual, usage })
  }

  test('a string content and the same text as one text block are the same cached prefix', () => {
    const e = new BytesPerTokenEstimator({ now: () => 0 })
    const x = prose(2600, 6_000)
    const first = { model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'text', text: x, cache_control: { type: 'ephemeral' } }] }] }
    observeExact(e, first, 2_003, { inputTokens: 0, cacheReadInputTokens: 0, cacheCreationInputTokens: 2_003, outputTokens: 1 })
    const next = { model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: x }, { role: 'assistant', content: [{ type: 'text', text: 'ok', cache_control: { type: 'ephemeral' } }] }] }
    const got = e.estimate({ provider: 'anthropic', model: MODEL, body: next })
    assert.equal(got.cachedPrefixTokens, 2_003, 'the string is the block already cached')
    assert.ok(got.inputTokens <= 10, `only the new message is input: ${got.inputTokens}`)
    // The system prompt too: a string and one text block are one prefix.
    const sys = { model: MODEL, max_tokens: 10, system: x, messages: [{ role: 'user', content: [{ type: 'text', text: 'hi', cache_control: { type: 'ephemeral' } }] }] }
    observeExact(e, sys, 2_010, { inputTokens: 0, cacheReadInputTokens: 0, cacheCreationInputTokens: 2_010, outputTokens: 1 })
    const sysBlock = { ...sys, system: [{ type: 'text', text: x }] }
    assert.equal(e.estimate({ provider: 'anthropic', model: MODEL, body: sysBlock }).cachedPrefixTokens, 2_010)
  })

  test("a thinking block is its thinking text: the signature is not counted, and earlier turns' thinking is dropped where Anthropic drops it", () => {
    const e = new BytesPerTokenEstimator()
    const withThinking = (signature, model = MODEL, extra = {}) => ({
      model,
      max_tokens: 10,
      ...extra,
      messages: [
        { role: 'user', content: 'list the files' },
        { role: 'assistant', content: [{ type: 'thinking', thinking: 'I should run ls.', signature }, { type: 'tool_use', id: 'toolu_1', name: 'Bash', input: { command: 'ls' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'a.txt' }] },
      ],
    })
    const est = (b) => e.estimate({ provider: 'anthropic', model: b.model, body: b }).inputTokens
    assert.equal(est(withThinking(sig)), est(withThinking('')), 'the signature costs nothing')
    // Earlier turns: Sonnet 4.5 keeps only the last assistant turn's thinking (docs, "Context editing": the default).
    const older = (model, extra) => ({
      ...withThinking(sig, model, extra),
      messages: [...withThinking(sig).messages, { role: 'assistant', content: [{ type: 'thinking', thinking: prose(2601, 3_000), signature: sig }, { type: 'text', text: 'done' }] }, { role: 'user', content: 'thanks' }],
    })
    const thinkingBytes = prose(2601, 3_000).length
    const strippedOld = est(older('claude-sonnet-4-5'))
    const keptAll = est(older('claude-sonnet-4-5', { context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] } }))
    // Sonnet 4.5 drops the first assistant turn's thinking (16 bytes); keep: all counts it.
    assert.ok(Math.abs(keptAll - strippedOld - (16 * SAFETY) / 3) <= 1, `the earlier turn's thinking only: ${keptAll - strippedOld}`)
    // Opus 4.5 and later keep all by default: the 3,000-byte thinking of the last turn is counted either way.
    assert.equal(est(older('claude-opus-4-5')), keptAll)
    assert.ok(est(older('claude-opus-4-5')) >= Math.ceil(thinkingBytes / (3 / SAFETY)))
  })

  test("a PDF is its pages' images and its text, and what a document's text costs is learned", () => {
    const page = (seed) => prose(seed, 3_300).replace(/(.{1,90})(\s|$)/g, '$1\n').trim()
    const pdfOf = (texts) => {
      const objs = ['<< /Type /Catalog /Pages 2 0 R >>', `<< /Type /Pages /Kids [${texts.map((_, i) => `${3 + 2 * i} 0 R`).join(' ')}] /Count ${texts.length} /MediaBox [0 0 612 792] >>`]
      texts.forEach((t, i) => {
        const content = `BT /F1 10 Tf 12 TL 54 740 Td\n${t.split('\n').map((l) => `(${l.replace(/([()\\])/g, '\\$1')}) Tj T*`).join('\n')}\nET`
        objs.push(`<< /Type /Page /Parent 2 0 R /Contents ${4 + 2 * i} 0 R >>`, `<< /Length ${content.length} >>\nstream\n${content}\nendstream`)
      })
      return Buffer.from(`%PDF-1.4\n${objs.map((o, i) => `${i + 1} 0 obj\n${o}\nendobj\n`).join('')}%%EOF\n`, 'latin1')
    }
    // The provider's count, as the mock makes it: each page's text (4.2 bytes a token here) and a 1,600-token page image.
    const truth = (texts) => texts.reduce((n, t) => n + Math.round(t.length / 4.2) + 1_600, 0) + 12
    const ask = (texts) => ({ model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: pdfOf(texts).toString('base64') } }, { type: 'text', text: 'Summarize.' }] }] })
    const e = new BytesPerTokenEstimator()
    const two = [page(2610), page(2611)]
    const first = e.estimate({ provider: 'anthropic', model: MODEL, body: ask(two) })
    assert.ok(first.inputTokens < 2 * 4_590, `not 4,590 a page: ${first.inputTokens}`)
    e.observe({ provider: 'anthropic', model: MODEL, body: ask(two), estimate: first, actualInputTokens: truth(two) })
    assert.ok(e.ratios('anthropic', MODEL).document > 3.5, `the document ratio learned: ${e.ratios('anthropic', MODEL).document}`)
    const six = [2620, 2621, 2622, 2623, 2624, 2625].map(page)
    const next = e.estimate({ provider: 'anthropic', model: MODEL, body: ask(six) }).inputTokens
    assert.ok(Math.abs(next - truth(six)) / truth(six) <= 0.07, `the next PDF: ${next} for ${truth(six)}`)
  })

  test('prose, code and CJK text each have their own learned ratio', () => {
    const e = new BytesPerTokenEstimator()
    const code = (seed, n) => Array.from({ length: Math.ceil(n / 40) }, (_, i) => `  ${i + 1}\tconst v${seed}_${i} = f(x[${i}], {a: ${i}});`).join('\n').slice(0, n)
    const body = (text) => ({ model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: text }] })
    const p = prose(2630, 8_000)
    const c = code(1, 8_000)
    // The provider counts prose at 4.5 bytes a token and code at 2.5.
    observeExact(e, body(p), Math.round((p.length + 8) / 4.5))
    observeExact(e, body(c), Math.round((c.length + 8) / 2.5))
    const r = e.ratios('anthropic', MODEL)
    assert.ok(Math.abs(r.prose - 4.5) < 0.05 && Math.abs(r.code - 2.5) < 0.05, `prose ${r.prose}, code ${r.code}`)
    const p2 = prose(2631, 6_000)
    const c2 = code(2, 6_000)
    const within = (got, want) => Math.abs(got / SAFETY - want) / want <= 0.02
    assert.ok(within(e.estimate({ provider: 'anthropic', model: MODEL, body: body(p2) }).inputTokens, (p2.length + 8) / 4.5), 'new prose at the prose ratio')
    assert.ok(within(e.estimate({ provider: 'anthropic', model: MODEL, body: body(c2) }).inputTokens, (c2.length + 8) / 2.5), 'new code at the code ratio')
  })

  test('a long run without whitespace does not stall the proxy tokenizer (byte-pair merging is quadratic in a run)', async () => {
    const e = new DefaultEstimator()
    const body = { model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: 'x'.repeat(400_000) }] }
    const t0 = performance.now()
    const got = await e.estimate({ provider: 'anthropic', model: MODEL, body })
    assert.ok(performance.now() - t0 < 5_000, `${Math.round(performance.now() - t0)} ms`)
    assert.ok(got.inputTokens > 60_000, `above a 60k limit still: ${got.inputTokens}`)
  })

  test("the default counts an Anthropic prompt by o200k_base's tokens times a learned factor (1.2 before the first call)", async () => {
    const e = new DefaultEstimator()
    const text = prose(2640, 12_000)
    const body = { model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: text }] }
    const tokens = o200k.encode(text, 'all').length
    const first = await e.estimate({ provider: 'anthropic', model: MODEL, body })
    assert.equal(first.inputTokens, Math.ceil((tokens + 3) * 1.2 * SAFETY), 'the first call: 1.2 tokens per o200k token, 2 % high')
    // The provider counts 1.1 a token: learned from one call, the next prompt is within 1 %.
    e.observe({ provider: 'anthropic', model: MODEL, body, estimate: first, actualInputTokens: Math.round((tokens + 3) * 1.1) })
    const text2 = prose(2641, 9_000)
    const t2 = o200k.encode(text2, 'all').length
    const again = await e.estimate({ provider: 'anthropic', model: MODEL, body: { ...body, messages: [{ role: 'user', content: text2 }] } })
    assert.ok(Math.abs(again.inputTokens / SAFETY - (t2 + 3) * 1.1) / ((t2 + 3) * 1.1) <= 0.01, `${again.inputTokens} for ${(t2 + 3) * 1.1}`)
    assert.ok(Math.abs(e.bytesPerToken('anthropic', MODEL) - 1 / 1.1) < 0.01, 'o200k tokens per Claude token, learned')
    // Off: the byte rule, as before.
    const off = await new DefaultEstimator({ tokenizer: false }).estimate({ provider: 'anthropic', model: MODEL, body })
    assert.equal(off.inputTokens, Math.ceil((text.length + 8) / (3 / SAFETY)))
  })
})
