// The mock provider's `counting: 'bpe'` mode: counts checked against js-tiktoken directly,
// the image and PDF rules, and the prompt caches (Anthropic's breakpoints, OpenAI's prefix).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { deflateSync } from 'node:zlib';
import { Tiktoken } from 'js-tiktoken/lite';
import cl100k from 'js-tiktoken/ranks/cl100k_base';
import o200k from 'js-tiktoken/ranks/o200k_base';
import { startMockProvider } from '../mock-provider.mjs';
import { anthropicImageTokens, openaiImageTokens, pdfPages } from '../mock-counting.mjs';

const claude = new Tiktoken(cl100k);
const gpt = new Tiktoken(o200k);
const c = (s) => claude.encode(s, 'all').length;
const g = (s) => gpt.encode(s, 'all').length;

/** The first bytes of a PNG of the given size (signature + IHDR): all the mock reads. */
function pngHead(w, h) {
  const b = Buffer.alloc(33);
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]).copy(b, 0);
  b.writeUInt32BE(13, 8);
  b.write('IHDR', 12, 'latin1');
  b.writeUInt32BE(w, 16);
  b.writeUInt32BE(h, 20);
  b[24] = 8;
  b[25] = 2;
  return b;
}
/** A JPEG's first segments: SOI, an APP0, then SOF0 with the size. */
function jpegHead(w, h) {
  const app0 = Buffer.from([0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00]);
  const sof = Buffer.from([0xff, 0xc0, 0x00, 0x11, 0x08, h >> 8, h & 0xff, w >> 8, w & 0xff, 0x03, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
  return Buffer.concat([Buffer.from([0xff, 0xd8]), app0, sof]);
}

/** A PDF with one page per text (US letter), the second page's stream Flate-compressed. */
function pdf(texts) {
  const objs = [];
  objs[1] = '<< /Type /Catalog /Pages 2 0 R >>';
  const kids = texts.map((_, i) => `${3 + 2 * i} 0 R`).join(' ');
  objs[2] = `<< /Type /Pages /Kids [${kids}] /Count ${texts.length} /MediaBox [0 0 612 792] >>`;
  const streams = {};
  texts.forEach((t, i) => {
    const lines = t.split('\n').map((l) => `(${l.replace(/([()\\])/g, '\\$1')}) Tj T*`).join('\n');
    const content = `BT /F1 11 Tf 72 720 Td 14 TL\n${lines}\nET`;
    objs[3 + 2 * i] = `<< /Type /Page /Parent 2 0 R /Contents ${4 + 2 * i} 0 R >>`;
    streams[4 + 2 * i] = i === 1 ? { dict: '/Filter /FlateDecode', data: deflateSync(Buffer.from(content, 'latin1')) } : { dict: '', data: Buffer.from(content, 'latin1') };
  });
  const parts = [Buffer.from('%PDF-1.4\n')];
  for (let n = 1; n <= 2 + 2 * texts.length; n++) {
    if (streams[n]) {
      const s = streams[n];
      parts.push(Buffer.from(`${n} 0 obj\n<< /Length ${s.data.length} ${s.dict} >>\nstream\n`), s.data, Buffer.from('\nendstream\nendobj\n'));
    } else {
      parts.push(Buffer.from(`${n} 0 obj\n${objs[n]}\nendobj\n`));
    }
  }
  parts.push(Buffer.from('trailer << /Root 1 0 R >>\n%%EOF\n'));
  return Buffer.concat(parts);
}

const words = (n, seed = 0) => Array.from({ length: n }, (_, i) => `word${(i * 7 + seed) % 101}`).join(' ');

describe("mock provider, counting: 'bpe'", () => {
  let t = 0;
  let mock;
  before(async () => {
    mock = await startMockProvider({ counting: 'bpe', now: () => t, inputTokensPerMinute: 10_000_000, chunkDelayMs: 0 });
  });
  after(() => mock.close());
  const post = async (path, body) => {
    const res = await fetch(mock.url + path, { method: 'POST', headers: { 'x-api-key': 'k', 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: res.status, json: await res.json() };
  };

  test('an unknown counting mode is refused by name', async () => {
    await assert.rejects(startMockProvider({ counting: 'words' }), /counting must be 'bytes' or 'bpe', got words/);
  });

  test('Anthropic: system, messages, tools and the tool-use prompt, tool_use and tool_result, thinking', async () => {
    const schema = { type: 'object', properties: { command: { type: 'string', description: 'the command' } }, required: ['command'] };
    const body = {
      model: 'claude-x',
      max_tokens: 10,
      system: [{ type: 'text', text: 'You are a careful agent.' }],
      tools: [
        { name: 'Bash', description: 'Run a shell command.', input_schema: schema },
        { name: 'Later', description: 'Deferred.', input_schema: schema, defer_loading: true },
      ],
      messages: [
        { role: 'user', content: 'List the files.' },
        { role: 'assistant', content: [{ type: 'thinking', thinking: 'I should run ls.', signature: 'sig' }, { type: 'tool_use', id: 'toolu_1', name: 'Bash', input: { command: 'ls -la' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'a.txt\nb.txt' }] }] },
      ],
    };
    const want =
      346 + c('Bash') + c('Run a shell command.') + c(JSON.stringify(schema)) +
      c('You are a careful agent.') +
      3 + c('List the files.') +
      3 + c('I should run ls.') + c('Bash') + c(JSON.stringify({ command: 'ls -la' })) +
      3 + c('a.txt\nb.txt');
    const r = await post('/v1/messages', body);
    assert.equal(r.status, 200);
    assert.deepEqual(r.json.usage, { input_tokens: want, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, cache_creation: { ephemeral_5m_input_tokens: 0, ephemeral_1h_input_tokens: 0 }, output_tokens: 10 });
    assert.deepEqual((await post('/v1/messages/count_tokens', body)).json, { input_tokens: want });
    const forced = await post('/v1/messages/count_tokens', { ...body, tool_choice: { type: 'any' } });
    assert.equal(forced.json.input_tokens, want - 346 + 313);
    // The default mode, on the same body, counts only the text blocks' bytes.
    const bytes = await startMockProvider();
    try {
      const res = await fetch(`${bytes.url}/v1/messages/count_tokens`, { method: 'POST', headers: { 'x-api-key': 'k' }, body: JSON.stringify(body) });
      const text = 'You are a careful agent.' + 'List the files.';
      assert.deepEqual(await res.json(), { input_tokens: Math.ceil(Buffer.byteLength(text) / 4) });
    } finally {
      await bytes.close();
    }
  });

  test('OpenAI chat (o200k_base): framing, names, tool calls and tools', async () => {
    const fn = { name: 'read_file', description: 'Read a file.', parameters: { type: 'object', properties: { path: { type: 'string' } } } };
    const body = {
      model: 'gpt-x',
      max_completion_tokens: 5,
      tools: [{ type: 'function', function: fn }],
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', name: 'ann', content: [{ type: 'text', text: 'Read main.rs' }] },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'read_file', arguments: '{"path":"main.rs"}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: 'fn main() {}' },
      ],
    };
    const want =
      g(JSON.stringify(fn)) +
      3 + g('system') + g('Be brief.') +
      3 + g('user') + 1 + g('ann') + g('Read main.rs') +
      3 + g('assistant') + g('read_file') + g('{"path":"main.rs"}') +
      3 + g('tool') + g('fn main() {}') + 3;
    const r = await post('/v1/chat/completions', body);
    assert.equal(r.status, 200);
    assert.equal(r.json.usage.prompt_tokens, want);
    assert.equal(r.json.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(mock.log.at(-1).inputTokens, want);
  });

  test('images by each provider rule; an image by URL or unreadable is a 400 naming it', () => {
    assert.equal(anthropicImageTokens(1000, 1000), 1334);
    assert.equal(anthropicImageTokens(800, 600), 640);
    assert.equal(anthropicImageTokens(3136, 1568), 1600); // long edge to 1568: 1568 x 784, over the cap
    assert.equal(anthropicImageTokens(200, 100), 27);
    assert.equal(openaiImageTokens(1024, 1024, 'high'), 765);
    assert.equal(openaiImageTokens(4096, 2048, 'auto'), 1105); // 2048 x 1024 -> 1536 x 768: 3 x 2 tiles
    assert.equal(openaiImageTokens(4096, 2048, 'low'), 85);
    assert.equal(openaiImageTokens(300, 200, undefined), 255);
  });

  test('images in requests: Anthropic PNG and JPEG, OpenAI data URLs, errors', async () => {
    const png = pngHead(1000, 1000).toString('base64');
    const jpg = jpegHead(800, 600).toString('base64');
    const r = await post('/v1/messages/count_tokens', {
      model: 'claude-x',
      messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } }, { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: jpg } }, { type: 'text', text: 'What is this?' }] }],
    });
    assert.equal(r.json.input_tokens, 3 + 1334 + 640 + c('What is this?'));
    const o = await post('/v1/chat/completions', {
      model: 'gpt-x',
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `data:image/png;base64,${pngHead(1024, 1024).toString('base64')}` } }, { type: 'image_url', image_url: { url: 'https://example.invalid/a.png', detail: 'low' } }] }],
    });
    assert.equal(o.json.usage.prompt_tokens, 3 + g('user') + 765 + 85 + 3);
    const url = await post('/v1/messages', { model: 'claude-x', max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.invalid/a.png' } }] }] });
    assert.equal(url.status, 400);
    assert.match(url.json.error.message, /messages\.0\.content\.0\.source: counting: 'bpe' counts only base64 images/);
    const junk = await post('/v1/messages', { model: 'claude-x', max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] });
    assert.equal(junk.status, 400);
    assert.match(junk.json.error.message, /could not read the image's size/);
  });

  test("PDFs: each page's text plus the page as an image (plain and Flate streams)", async () => {
    const texts = ['Quarterly report\nRevenue grew (a lot).', 'Second page: costs\nand a backslash \\ here.'];
    const data = pdf(texts);
    const pages = pdfPages(data);
    assert.deepEqual(pages.map((p) => [p.w, p.h]), [[612, 792], [612, 792]]);
    assert.deepEqual(pages.map((p) => p.text), texts.map((t) => `${t}\n`));
    const r = await post('/v1/messages/count_tokens', {
      model: 'claude-x',
      messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: data.toString('base64') } }] }],
    });
    assert.equal(r.json.input_tokens, 3 + c(`${texts[0]}\n`) + c(`${texts[1]}\n`) + 2 * 1600);
    const bad = await post('/v1/messages/count_tokens', { model: 'claude-x', messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'bm90IGEgcGRm' } }] }] });
    assert.equal(bad.status, 400);
    assert.match(bad.json.error.message, /not a PDF/);
  });

  test('Anthropic prompt cache: write, rolling read, 20-block lookback, TTLs, minimum, at most 4 breakpoints; ITPM skips reads', async () => {
    t = 1_000_000;
    const system = [{ type: 'text', text: words(1500), cache_control: { type: 'ephemeral' } }];
    const turn = (n, ttl) => {
      const messages = [];
      for (let i = 0; i < n; i++) {
        messages.push({ role: 'user', content: [{ type: 'text', text: `question ${i}: ${words(40, i)}` }] });
        messages.push({ role: 'assistant', content: [{ type: 'text', text: `answer ${i}` }] });
      }
      const lastBlock = messages.at(-1).content.at(-1);
      lastBlock.cache_control = ttl ? { type: 'ephemeral', ttl } : { type: 'ephemeral' };
      return { model: 'claude-cache', max_tokens: 1, system, messages };
    };
    const all = async (body) => (await post('/v1/messages/count_tokens', body)).json.input_tokens;
    const prefix0 = c(words(1500));

    const first = await post('/v1/messages', turn(1));
    const total1 = await all(turn(1));
    assert.deepEqual(first.json.usage.cache_read_input_tokens, 0);
    assert.equal(first.json.usage.cache_creation_input_tokens, total1);
    assert.equal(first.json.usage.input_tokens, 0);
    assert.deepEqual(first.json.usage.cache_creation, { ephemeral_5m_input_tokens: total1, ephemeral_1h_input_tokens: 0 });
    const charged = mock.log.at(-2);
    assert.equal(charged.inputTokens, total1);

    // The breakpoint moves to the newest message: the previous prefix is read, the rest written.
    t += 60_000;
    const second = await post('/v1/messages', turn(2));
    const total2 = await all(turn(2));
    assert.equal(second.json.usage.cache_read_input_tokens, total1);
    assert.equal(second.json.usage.cache_creation_input_tokens, total2 - total1);
    const entry = mock.log.at(-2);
    assert.deepEqual([entry.inputTokens, entry.promptTokens, entry.cacheReadInputTokens], [total2 - total1, total2, total1]);

    // Text after the last breakpoint is input.
    const tail = turn(2);
    tail.messages.push({ role: 'user', content: 'and one more thing' });
    const withTail = await post('/v1/messages', tail);
    assert.equal(withTail.json.usage.cache_read_input_tokens, total2);
    assert.equal(withTail.json.usage.input_tokens, 3 + c('and one more thing'));

    // 12 new turns = 24 blocks: the cached prefix is more than 20 blocks before the breakpoint.
    t += 60_000;
    const far = await post('/v1/messages', turn(14));
    assert.equal(far.json.usage.cache_read_input_tokens, prefix0, "beyond the lookback only the system breakpoint's own prefix is read");

    // The system breakpoint alone is still cached (read within 5 minutes of its last use).
    t += 4 * 60_000;
    const sysOnly = await post('/v1/messages', { model: 'claude-cache', max_tokens: 1, system, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(sysOnly.json.usage.cache_read_input_tokens, prefix0);
    assert.equal(sysOnly.json.usage.input_tokens, 3 + c('hi'));

    // Expired after 5 minutes unused; a 1h breakpoint outlives that.
    t += 5 * 60_000 + 1;
    const cold = await post('/v1/messages', turn(2));
    assert.equal(cold.json.usage.cache_read_input_tokens, 0);
    await post('/v1/messages', turn(3, '1h'));
    t += 30 * 60_000;
    const warm = await post('/v1/messages', turn(3, '1h'));
    assert.equal(warm.json.usage.cache_read_input_tokens, await all(turn(3)));
    assert.equal(warm.json.usage.cache_creation_input_tokens, 0);

    // Below 1,024 tokens nothing is cached.
    const small = { model: 'claude-cache', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text: words(50), cache_control: { type: 'ephemeral' } }] }] };
    await post('/v1/messages', small);
    const again = await post('/v1/messages', small);
    assert.equal(again.json.usage.cache_read_input_tokens, 0);
    assert.equal(again.json.usage.cache_creation_input_tokens, 0);
    assert.equal(again.json.usage.input_tokens, 3 + c(words(50)));

    const five = { model: 'claude-cache', max_tokens: 1, messages: [{ role: 'user', content: Array.from({ length: 5 }, (_, i) => ({ type: 'text', text: `b${i}`, cache_control: { type: 'ephemeral' } })) }] };
    const refused = await post('/v1/messages', five);
    assert.equal(refused.status, 400);
    assert.match(refused.json.error.message, /A maximum of 4 blocks with cache_control may be provided\. Found 5\./);
    const badTtl = await post('/v1/messages', { model: 'claude-cache', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text: 'x', cache_control: { type: 'ephemeral', ttl: '2h' } }] }] });
    assert.match(badTtl.json.error.message, /messages\.0\.content\.0\.cache_control\.ttl: must be '5m' or '1h', got "2h"/);
  });

  test('a string content is the same prompt as one text block (it stays cached when sent as a string)', async () => {
    t = 30_000_000;
    const env = words(1400, 3);
    const first = { model: 'claude-str', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text: env, cache_control: { type: 'ephemeral' } }] }] };
    const created = await post('/v1/messages', first);
    const prefix = 3 + c(env);
    assert.equal(created.json.usage.cache_creation_input_tokens, prefix);
    const next = { model: 'claude-str', max_tokens: 1, messages: [{ role: 'user', content: env }, { role: 'assistant', content: [{ type: 'text', text: 'ok', cache_control: { type: 'ephemeral' } }] }] };
    const read = await post('/v1/messages', next);
    assert.equal(read.json.usage.cache_read_input_tokens, prefix);
    assert.equal(read.json.usage.cache_creation_input_tokens, 3 + c('ok'));
  });

  test('a 429 caches nothing', async () => {
    t = 50_000_000;
    const limited = await startMockProvider({ counting: 'bpe', now: () => t, inputTokensPerMinute: 4000 });
    try {
      const body = { model: 'claude-429', max_tokens: 1, system: [{ type: 'text', text: words(1500), cache_control: { type: 'ephemeral' } }], messages: [{ role: 'user', content: 'hi' }] };
      const send = async () => {
        const res = await fetch(`${limited.url}/v1/messages`, { method: 'POST', headers: { 'x-api-key': 'k' }, body: JSON.stringify(body) });
        return { status: res.status, json: await res.json() };
      };
      // Another call takes most of the minute's input first.
      const other = await fetch(`${limited.url}/v1/messages`, { method: 'POST', headers: { 'x-api-key': 'k' }, body: JSON.stringify({ model: 'claude-429', max_tokens: 1, messages: [{ role: 'user', content: words(1200) }] }) });
      assert.equal(other.status, 200);
      assert.equal((await send()).status, 429, 'the whole prompt is charged as input + creation');
      t += 60_000;
      const ok = await send();
      assert.equal(ok.status, 200);
      assert.equal(ok.json.usage.cache_read_input_tokens, 0, 'the refused call cached nothing');
      t += 60_000;
      const read = await send();
      assert.equal(read.status, 200);
      assert.equal(read.json.usage.cache_read_input_tokens, c(words(1500)));
      assert.equal(limited.log.at(-1).inputTokens, read.json.usage.input_tokens, 'a read is not charged');
    } finally {
      await limited.close();
    }
  });

  test('OpenAI automatic prefix cache: 1,024 tokens and up in 128-token steps, charged in full; Responses too', async () => {
    t = 10_000_000;
    const system = { role: 'system', content: words(1200) };
    const body = (n) => ({ model: 'gpt-cache', messages: [system, ...Array.from({ length: n }, (_, i) => ({ role: 'user', content: `q${i} ${words(30, i)}` }))] });
    const first = await post('/v1/chat/completions', body(1));
    assert.equal(first.json.usage.prompt_tokens_details.cached_tokens, 0);
    const second = await post('/v1/chat/completions', body(2));
    const prefix = first.json.usage.prompt_tokens - 3; // the priming tokens are not part of a prefix
    assert.ok(prefix >= 1024);
    assert.equal(second.json.usage.prompt_tokens_details.cached_tokens, 1024 + Math.floor((prefix - 1024) / 128) * 128);
    assert.equal(mock.log.at(-1).inputTokens, second.json.usage.prompt_tokens, 'cached tokens are charged too');
    t += 5 * 60_000 + 1;
    assert.equal((await post('/v1/chat/completions', body(2))).json.usage.prompt_tokens_details.cached_tokens, 0, 'expired');

    const resp = (n) => ({
      model: 'gpt-cache',
      instructions: words(1100),
      input: [
        { role: 'user', content: [{ type: 'input_text', text: 'fix the test' }] },
        { type: 'reasoning', summary: [{ type: 'summary_text', text: 'look first' }], encrypted_content: 'gAAAAB' },
        { type: 'function_call', call_id: 'c1', name: 'shell', arguments: '{"cmd":"ls"}' },
        { type: 'function_call_output', call_id: 'c1', output: 'src\ntests' },
      ].slice(0, n),
      tools: [{ type: 'function', name: 'shell', description: 'Run.', parameters: { type: 'object' } }],
      stream: false,
      store: false,
    });
    const r1 = await post('/v1/responses', resp(1));
    const want =
      g(JSON.stringify({ name: 'shell', description: 'Run.', parameters: { type: 'object' } })) +
      3 + g('developer') + g(words(1100)) +
      3 + g('user') + g('fix the test') + 3;
    assert.equal(r1.json.usage.input_tokens, want);
    const r4 = await post('/v1/responses', resp(4));
    assert.equal(r4.json.usage.input_tokens, want + 3 + g('look first') + Math.ceil(Buffer.from('gAAAAB', 'base64').length / 4) + 3 + g('shell') + g('{"cmd":"ls"}') + 3 + g('src\ntests'));
    assert.equal(r4.json.usage.input_tokens_details.cached_tokens, 1024 + Math.floor((want - 3 - 1024) / 128) * 128);
  });
});
