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
import { BytesPerTokenEstimator, promptBytes } from 'tokenwarden-driver'
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

  test('a PDF costs its pages (3,000 text tokens and one page image each), not its bytes', () => {
    const pages = 40
    const objects = Array.from({ length: pages }, (_, i) => `${i + 3} 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>\nendobj\n`).join('')
    const pdf = Buffer.concat([Buffer.from(`%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Count ${pages} /Kids [] >>\nendobj\n${objects}`), filler(4_000_000)])
    const doc = { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: pdf.toString('base64') } }
    assert.equal(extra('anthropic', anthropic(doc), plain), pages * 4590, '40 pages')
    // Page objects hidden in compressed object streams: one page per 50 KB of file.
    const opaque = { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: Buffer.concat([Buffer.from('%PDF-1.7\n'), filler(4_000_000)]).toString('base64') } }
    assert.equal(extra('anthropic', anthropic(opaque), plain), 81 * 4590, 'a 4 MB PDF of unreadable pages: 81')
    const chatFile = { model: 'gpt-4o', messages: [{ role: 'user', content: [text, { type: 'file', file: { filename: 'a.pdf', file_data: `data:application/pdf;base64,${pdf.toString('base64')}` } }] }] }
    assert.equal(extra('openai', chatFile, { model: 'gpt-4o', messages: [{ role: 'user', content: [text] }] }), pages * 4590, 'OpenAI file_data')
    const textDoc = { type: 'document', source: { type: 'text', media_type: 'text/plain', data: prose(60, 3_000) } }
    const e = new BytesPerTokenEstimator()
    assert.equal(e.estimate({ provider: 'anthropic', model: MODEL, body: anthropic(textDoc) }).inputTokens, Math.ceil((4_000 + 3_000 + 8) / (3 / 1.05)), 'a text document is its text')
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
    assert.ok(got >= Math.ceil(4_000 / (3 / 1.05)), `instructions and input counted: ${got}`)
    assert.ok(e.estimate({ provider: 'openai', model: 'gpt-4o', body: { model: 'gpt-4o', input: prose(73, 3_000) } }).inputTokens >= 1050, 'a string input')
  })
})

describe('tool definitions', () => {
  test('an Anthropic call with tools counts the tool-use system prompt (346 tokens, 313 when a tool is forced); OpenAI publishes none', () => {
    const e = new BytesPerTokenEstimator()
    const ratio = 3 / 1.05
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
