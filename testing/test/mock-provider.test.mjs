// Tests of the mock LLM provider (testing/mock-provider.mjs) through raw fetch.
// Run: node --test testing/test/mock-provider.test.mjs

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { startMockProvider, countInputTokens, formatGoDuration } from '../mock-provider.mjs';

const KEY = 'sk-test-secret-never-logged';

/**
 * POST a JSON body (or a raw string) with an API key unless `headers` overrides it.
 * @param {string} url
 * @param {unknown} body
 * @param {Record<string, string>} [headers]
 */
function post(url, body, headers = {}) {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

/** Parse an SSE body into `{event, data}` records (data JSON-parsed unless `[DONE]`). */
function parseSSE(/** @type {string} */ text) {
  assert.ok(text.endsWith('\n\n'), 'an SSE body ends with a blank line');
  return text
    .split('\n\n')
    .filter((block) => block.length > 0)
    .map((block) => {
      /** @type {{event: string | null, data: any}} */
      const rec = { event: null, data: null };
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) rec.event = line.slice(7);
        else if (line.startsWith('data: ')) rec.data = line.slice(6) === '[DONE]' ? '[DONE]' : JSON.parse(line.slice(6));
        else assert.fail(`unexpected SSE line: ${JSON.stringify(line)}`);
      }
      return rec;
    });
}

/** Run `fn` with a provider, closing it afterwards. */
async function withProvider(/** @type {any} */ options, /** @type {(p: any) => Promise<void>} */ fn) {
  const provider = await startMockProvider({ chunkDelayMs: 1, ...options });
  try {
    await fn(provider);
  } finally {
    await provider.close();
  }
}

/** A fake clock for the buckets. */
function fakeClock() {
  const clock = { t: 0, now: () => clock.t };
  return clock;
}

async function until(/** @type {() => boolean} */ cond, timeoutMs = 2000) {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > timeoutMs) assert.fail('timed out waiting for a condition');
    await new Promise((r) => setTimeout(r, 2));
  }
}

const anthropicBody = (extra = {}) => ({
  model: 'claude-test',
  max_tokens: 1000,
  messages: [{ role: 'user', content: 'hello world!' }], // 12 bytes -> 3 tokens
  ...extra,
});

const openaiBody = (extra = {}) => ({
  model: 'gpt-test',
  messages: [
    { role: 'system', content: 'abcd' },
    { role: 'user', content: [{ type: 'text', text: 'efgh' }] },
  ], // 8 bytes -> 2 tokens
  ...extra,
});

describe('counting rule', () => {
  test('ceil(UTF-8 bytes / 4) of system + message text', () => {
    assert.equal(countInputTokens({ messages: [] }), 0);
    assert.equal(countInputTokens({ messages: [{ role: 'user', content: 'a' }] }), 1);
    assert.equal(countInputTokens({ messages: [{ role: 'user', content: 'abcd' }] }), 1);
    assert.equal(countInputTokens({ messages: [{ role: 'user', content: 'abcde' }] }), 2);
    // 'é' is 2 bytes, '€' is 3: 'é€abc' = 8 bytes
    assert.equal(countInputTokens({ messages: [{ role: 'user', content: 'é€abc' }] }), 2);
    // system string + system blocks + content blocks; non-text blocks count nothing
    assert.equal(
      countInputTokens({
        system: [{ type: 'text', text: 'ab' }, { type: 'text', text: 'cd' }],
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'efgh' },
              { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'x'.repeat(1000) } },
            ],
          },
          { role: 'assistant', content: 'i' },
        ],
      }),
      3, // 9 bytes
    );
    assert.equal(countInputTokens({ system: 'abcdefgh', messages: [] }), 2);
  });

  test('count_tokens endpoint uses the same rule', async () => {
    await withProvider({}, async (p) => {
      const res = await post(`${p.url}/v1/messages/count_tokens`, { model: 'm', system: 'abcd', messages: [{ role: 'user', content: 'abcde' }] });
      assert.equal(res.status, 200);
      assert.deepEqual(await res.json(), { input_tokens: 3 });
      assert.equal(p.stats().requests, 0, 'count_tokens is not a generation request');
    });
  });

  test('formatGoDuration renders like Go', () => {
    assert.equal(formatGoDuration(0), '0s');
    assert.equal(formatGoDuration(120), '120ms');
    assert.equal(formatGoDuration(119.2), '120ms');
    assert.equal(formatGoDuration(1000), '1s');
    assert.equal(formatGoDuration(1500), '1.5s');
    assert.equal(formatGoDuration(59_999), '59.999s');
    assert.equal(formatGoDuration(360_000), '6m0s');
    assert.equal(formatGoDuration(61_250), '1m1.25s');
    assert.equal(formatGoDuration(3_600_000), '1h0m0s');
  });
});

describe('Anthropic Messages', () => {
  test('non-streaming response shape and usage', async () => {
    await withProvider({ replyTokens: 7 }, async (p) => {
      const res = await post(`${p.url}/v1/messages`, anthropicBody({ system: 'abcd' }));
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /^application\/json/);
      assert.match(res.headers.get('request-id') ?? '', /^req_/);
      const msg = await res.json();
      assert.match(msg.id, /^msg_/);
      assert.equal(msg.type, 'message');
      assert.equal(msg.role, 'assistant');
      assert.equal(msg.model, 'claude-test');
      assert.equal(msg.content.length, 1);
      assert.equal(msg.content[0].type, 'text');
      assert.equal(msg.content[0].text.split(' ').length, 7);
      assert.equal(msg.stop_reason, 'end_turn');
      assert.equal(msg.stop_sequence, null);
      assert.deepEqual(msg.usage, {
        input_tokens: 4, // 'abcd' + 'hello world!' = 16 bytes
        output_tokens: 7,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 0,
      });
      const s = p.stats();
      assert.equal(s.admitted, 1);
      assert.equal(s.completed, 1);
      assert.equal(s.inputTokens, 4);
      assert.equal(s.outputTokens, 7);
      assert.equal(s.inFlight, 0);
      assert.deepEqual(p.log, [
        { path: '/v1/messages', model: 'claude-test', stream: false, inputTokens: 4, outputTokens: 7, status: 200 },
      ]);
    });
  });

  test('max_tokens caps the reply (stop_reason max_tokens); x-mock-reply-tokens overrides', async () => {
    await withProvider({}, async (p) => {
      let msg = await (await post(`${p.url}/v1/messages`, anthropicBody({ max_tokens: 5 }))).json();
      assert.equal(msg.stop_reason, 'max_tokens');
      assert.equal(msg.usage.output_tokens, 5);
      msg = await (await post(`${p.url}/v1/messages`, anthropicBody(), { 'x-mock-reply-tokens': '3' })).json();
      assert.equal(msg.stop_reason, 'end_turn');
      assert.equal(msg.usage.output_tokens, 3);
      assert.equal(msg.content[0].text.split(' ').length, 3);
      // the /messages alias (baseURL ending in /v1)
      const res = await post(`${p.url}/messages`, anthropicBody());
      assert.equal(res.status, 200);
      assert.equal((await res.json()).usage.output_tokens, 50);
    });
  });

  test('streaming: the real event sequence, at most 20 deltas', async () => {
    await withProvider({}, async (p) => {
      const res = await post(`${p.url}/v1/messages`, anthropicBody({ stream: true }));
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
      const events = parseSSE(await res.text());
      const names = events.map((e) => e.event);
      assert.deepEqual(names.slice(0, 3), ['message_start', 'content_block_start', 'ping']);
      assert.deepEqual(names.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
      const deltas = events.filter((e) => e.event === 'content_block_delta');
      assert.equal(deltas.length, 20, '50 words in 20 deltas');
      assert.equal(names.length, 3 + 20 + 3);
      for (const e of events) assert.equal(e.data.type, e.event, 'data.type matches the event name');

      const start = events[0].data.message;
      assert.equal(start.role, 'assistant');
      assert.deepEqual(start.content, []);
      assert.equal(start.stop_reason, null);
      assert.equal(start.usage.input_tokens, 3);
      assert.equal(start.usage.output_tokens, 1);
      assert.deepEqual(events[1].data.content_block, { type: 'text', text: '' });
      const text = deltas.map((e) => {
        assert.equal(e.data.delta.type, 'text_delta');
        return e.data.delta.text;
      }).join('');
      assert.equal(text.split(' ').length, 50);
      assert.ok(!text.includes('  '));
      const md = events.at(-2)?.data;
      assert.equal(md.delta.stop_reason, 'end_turn');
      assert.equal(md.usage.output_tokens, 50);
      assert.equal(p.stats().outputTokens, 50);
      assert.equal(p.log[0].stream, true);
    });
  });

  test('streaming a short reply has one delta per word', async () => {
    await withProvider({ replyTokens: 4 }, async (p) => {
      const events = parseSSE(await (await post(`${p.url}/v1/messages`, anthropicBody({ stream: true }))).text());
      const deltas = events.filter((e) => e.event === 'content_block_delta').map((e) => e.data.delta.text);
      assert.deepEqual(deltas.length, 4);
      assert.equal(deltas.join('').split(' ').length, 4);
    });
  });

  test('streams take real time (chunkDelayMs)', async () => {
    await withProvider({ chunkDelayMs: 10, replyTokens: 5 }, async (p) => {
      const start = performance.now();
      await (await post(`${p.url}/v1/messages`, anthropicBody({ stream: true }))).text();
      assert.ok(performance.now() - start >= 50, '6 pauses of 10 ms');
    });
  });
});

describe('OpenAI Chat Completions', () => {
  test('non-streaming response shape and usage', async () => {
    await withProvider({ replyTokens: 6 }, async (p) => {
      const res = await post(`${p.url}/v1/chat/completions`, openaiBody(), { 'x-api-key': '', authorization: `Bearer ${KEY}` });
      assert.equal(res.status, 200);
      assert.match(res.headers.get('x-request-id') ?? '', /^req_/);
      const c = await res.json();
      assert.match(c.id, /^chatcmpl-/);
      assert.equal(c.object, 'chat.completion');
      assert.equal(typeof c.created, 'number');
      assert.equal(c.model, 'gpt-test');
      assert.equal(c.choices.length, 1);
      assert.equal(c.choices[0].index, 0);
      assert.equal(c.choices[0].message.role, 'assistant');
      assert.equal(c.choices[0].message.refusal, null);
      assert.equal(c.choices[0].message.content.split(' ').length, 6);
      assert.equal(c.choices[0].finish_reason, 'stop');
      assert.equal(c.choices[0].logprobs, null);
      assert.equal(c.usage.prompt_tokens, 2);
      assert.equal(c.usage.completion_tokens, 6);
      assert.equal(c.usage.total_tokens, 8);
      assert.deepEqual(c.usage.prompt_tokens_details, { cached_tokens: 0 });
    });
  });

  test('max_completion_tokens wins over max_tokens; finish_reason length', async () => {
    await withProvider({}, async (p) => {
      let c = await (await post(`${p.url}/v1/chat/completions`, openaiBody({ max_tokens: 3 }))).json();
      assert.equal(c.usage.completion_tokens, 3);
      assert.equal(c.choices[0].finish_reason, 'length');
      c = await (await post(`${p.url}/v1/chat/completions`, openaiBody({ max_tokens: 3, max_completion_tokens: 4 }))).json();
      assert.equal(c.usage.completion_tokens, 4);
      c = await (await post(`${p.url}/chat/completions`, openaiBody())).json();
      assert.equal(c.usage.completion_tokens, 50);
      assert.equal(c.choices[0].finish_reason, 'stop');
    });
  });

  test('streaming with include_usage: usage null on chunks, final usage chunk, [DONE]', async () => {
    await withProvider({}, async (p) => {
      const res = await post(`${p.url}/v1/chat/completions`, openaiBody({ stream: true, stream_options: { include_usage: true } }));
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
      const recs = parseSSE(await res.text());
      assert.ok(recs.every((r) => r.event === null), 'no event: lines');
      assert.equal(recs.at(-1)?.data, '[DONE]');
      const chunks = recs.slice(0, -1).map((r) => r.data);
      const id = chunks[0].id;
      for (const c of chunks) {
        assert.equal(c.object, 'chat.completion.chunk');
        assert.equal(c.id, id);
        assert.ok('usage' in c);
      }
      const last = chunks.at(-1);
      assert.deepEqual(last.choices, []);
      assert.deepEqual(
        { p: last.usage.prompt_tokens, c: last.usage.completion_tokens, t: last.usage.total_tokens },
        { p: 2, c: 50, t: 52 },
      );
      const body = chunks.slice(0, -1);
      assert.ok(body.every((c) => c.usage === null));
      assert.equal(body[0].choices[0].delta.role, 'assistant');
      assert.equal(body.at(-1).choices[0].finish_reason, 'stop');
      const contentChunks = body.slice(1, -1);
      assert.equal(contentChunks.length, 20);
      const text = body.map((c) => c.choices[0].delta.content ?? '').join('');
      assert.equal(text.split(' ').length, 50);
    });
  });

  test('streaming without include_usage has no usage field', async () => {
    await withProvider({ replyTokens: 2 }, async (p) => {
      const recs = parseSSE(await (await post(`${p.url}/v1/chat/completions`, openaiBody({ stream: true }))).text());
      assert.equal(recs.at(-1)?.data, '[DONE]');
      const chunks = recs.slice(0, -1).map((r) => r.data);
      assert.equal(chunks.length, 1 + 2 + 1);
      assert.ok(chunks.every((c) => !('usage' in c) && c.choices.length === 1));
    });
  });
});

describe('rate-limit headers', () => {
  test('Anthropic headers for configured limits only, consistent with usage', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, requestsPerMinute: 50, inputTokensPerMinute: 1000, outputTokensPerMinute: 500, replyTokens: 20 }, async (p) => {
      const before = Date.now();
      const res = await post(`${p.url}/v1/messages`, anthropicBody());
      assert.equal(res.status, 200);
      const h = res.headers;
      assert.equal(h.get('anthropic-ratelimit-requests-limit'), '50');
      assert.equal(h.get('anthropic-ratelimit-requests-remaining'), '49');
      assert.equal(h.get('anthropic-ratelimit-input-tokens-limit'), '1000');
      assert.equal(h.get('anthropic-ratelimit-input-tokens-remaining'), '997');
      assert.equal(h.get('anthropic-ratelimit-output-tokens-limit'), '500');
      assert.equal(h.get('anthropic-ratelimit-output-tokens-remaining'), '480');
      assert.equal(h.get('anthropic-ratelimit-tokens-limit'), null, 'tokensPerMinute is not configured');
      assert.equal(h.get('x-ratelimit-limit-requests'), null);
      assert.equal(h.get('retry-after'), null);
      for (const name of ['requests', 'input-tokens', 'output-tokens']) {
        const reset = h.get(`anthropic-ratelimit-${name}-reset`) ?? '';
        assert.match(reset, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
        const at = Date.parse(reset);
        // refilling 1 request at 50/min takes 1.2 s; 3 input tokens 180 ms; 20 output 2.4 s
        assert.ok(at >= before && at <= Date.now() + 4000, `${name} reset ${reset}`);
      }
      // a provider with no limits sends no rate-limit headers
      await withProvider({}, async (q) => {
        const r = await post(`${q.url}/v1/messages`, anthropicBody());
        assert.ok(![...r.headers.keys()].some((k) => k.includes('ratelimit')));
        assert.ok(r.headers.get('request-id'));
      });
    });
  });

  test('OpenAI headers: Go-style reset, combined tokens refunded to input + output', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, requestsPerMinute: 60, tokensPerMinute: 6000, replyTokens: 10 }, async (p) => {
      const res = await post(`${p.url}/v1/chat/completions`, openaiBody({ max_tokens: 100 }));
      assert.equal(res.status, 200);
      const h = res.headers;
      assert.equal(h.get('x-ratelimit-limit-requests'), '60');
      assert.equal(h.get('x-ratelimit-remaining-requests'), '59');
      assert.equal(h.get('x-ratelimit-reset-requests'), '1s');
      assert.equal(h.get('x-ratelimit-limit-tokens'), '6000');
      assert.equal(h.get('x-ratelimit-remaining-tokens'), '5988', '2 input + 10 output');
      assert.equal(h.get('x-ratelimit-reset-tokens'), '120ms');
      assert.equal(h.get('anthropic-ratelimit-requests-limit'), null);
      // streaming: headers are sent at admission, before the refund
      const sres = await post(`${p.url}/v1/chat/completions`, openaiBody({ max_tokens: 100, stream: true }));
      assert.equal(sres.headers.get('x-ratelimit-remaining-tokens'), '5886', '5988 - (2 + 100)');
      assert.equal(sres.headers.get('x-ratelimit-remaining-requests'), '58');
      assert.equal(sres.headers.get('x-ratelimit-reset-requests'), '2s');
      await sres.text();
      assert.equal(p.stats().levels.tokens, 5976);
    });
  });
});

describe('limit enforcement (injected clock)', () => {
  test('requests per minute: 429 with retry-after; admitted after waiting it', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, requestsPerMinute: 2 }, async (p) => {
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      const res = await post(`${p.url}/v1/messages`, anthropicBody());
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('retry-after'), '30');
      assert.equal(res.headers.get('x-mock-limit'), 'requests');
      assert.equal(res.headers.get('anthropic-ratelimit-requests-remaining'), '0');
      const body = await res.json();
      assert.equal(body.type, 'error');
      assert.equal(body.error.type, 'rate_limit_error');
      assert.equal(typeof body.error.message, 'string');
      clock.t += 29_999;
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 429);
      clock.t += 1;
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      const s = p.stats();
      assert.equal(s.requests, 5);
      assert.equal(s.admitted, 3);
      assert.equal(s.rejected429, 2);
      assert.equal(s.byLimit.requests, 2);
      assert.equal(s.minLevel.requests, 0);
      assert.equal(s.overLimit, false);
      assert.deepEqual(p.log.map((/** @type {any} */ e) => e.status), [200, 200, 429, 429, 200]);
      assert.equal(p.log[2].limit, 'requests');
    });
  });

  test('input tokens per minute', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, inputTokensPerMinute: 100 }, async (p) => {
      const big = anthropicBody({ messages: [{ role: 'user', content: 'x'.repeat(320) }] }); // 80 tokens
      assert.equal((await post(`${p.url}/v1/messages`, big)).status, 200);
      let res = await post(`${p.url}/v1/messages`, big);
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('x-mock-limit'), 'input_tokens');
      // missing 60 tokens at 100/min -> 36 s
      assert.equal(res.headers.get('retry-after'), '36');
      assert.equal(res.headers.get('anthropic-ratelimit-input-tokens-remaining'), '20');
      assert.equal((await res.json()).error.type, 'rate_limit_error');
      // a small request still fits
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200); // 3 tokens
      clock.t += 36_000;
      res = await post(`${p.url}/v1/messages`, big);
      assert.equal(res.status, 429, 'the small one used 3 more tokens');
      assert.equal(res.headers.get('retry-after'), '2');
      clock.t += 2_000;
      assert.equal((await post(`${p.url}/v1/messages`, big)).status, 200);
      const s = p.stats();
      assert.equal(s.byLimit.input_tokens, 2);
      assert.equal(s.inputTokens, 163);
      assert.ok(s.minLevel.inputTokens >= 0);
      assert.equal(s.overLimit, false);
    });
  });

  test('output tokens per minute: charged at completion, may go into debt', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, outputTokensPerMinute: 100, replyTokens: 150 }, async (p) => {
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      assert.equal(p.stats().minLevel.outputTokens, -50);
      const res = await post(`${p.url}/v1/messages`, anthropicBody());
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('x-mock-limit'), 'output_tokens');
      assert.equal(res.headers.get('anthropic-ratelimit-output-tokens-remaining'), '0', 'never negative');
      const retry = Number(res.headers.get('retry-after'));
      assert.ok(retry >= 30 && retry <= 31, `retry-after ${retry}`);
      clock.t += 30_000;
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 429, 'level 0 is not > 0');
      clock.t = retry * 1000;
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      const s = p.stats();
      assert.equal(s.byLimit.output_tokens, 2);
      assert.equal(s.overLimit, false, 'output debt is not over the limit');
    });
  });

  test('combined tokens per minute (OpenAI): input + max tokens on arrival, OpenAI error JSON', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, tokensPerMinute: 1000, replyTokens: 10 }, async (p) => {
      const url = `${p.url}/v1/chat/completions`;
      // a request that alone exceeds the limit
      let res = await post(url, openaiBody({ max_tokens: 2000 }));
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('x-mock-limit'), 'tokens');
      const err = await res.json();
      assert.deepEqual(Object.keys(err), ['error']);
      assert.equal(err.error.type, 'tokens');
      assert.equal(err.error.code, 'rate_limit_exceeded');
      assert.equal(err.error.param, null);
      assert.equal(typeof err.error.message, 'string');
      // 2 + 498 = 500 reserved per request; each refunds 488 at completion
      // hold two in flight with the delay header so the reservation is visible
      const slow = { 'x-mock-delay-ms': '150' };
      const a = post(url, openaiBody({ max_tokens: 498 }), slow);
      const b = post(url, openaiBody({ max_tokens: 498 }), slow);
      await until(() => p.stats().inFlight === 2);
      res = await post(url, openaiBody({ max_tokens: 1 }));
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('x-mock-limit'), 'tokens');
      assert.equal(res.headers.get('x-ratelimit-remaining-tokens'), '0');
      assert.equal(res.headers.get('retry-after'), '1'); // 3 tokens at 1000/min: 180 ms
      assert.equal((await res.json()).error.type, 'tokens');
      assert.equal((await a).status, 200);
      assert.equal((await b).status, 200);
      assert.equal(p.stats().levels.tokens, 1000 - 2 * 12);
      assert.equal(p.stats().minLevel.tokens, 0);
      assert.equal(p.stats().overLimit, false);
    });
  });

  test('OpenAI requests limit uses type "requests"', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, requestsPerMinute: 1 }, async (p) => {
      assert.equal((await post(`${p.url}/v1/chat/completions`, openaiBody())).status, 200);
      const res = await post(`${p.url}/v1/chat/completions`, openaiBody());
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('retry-after'), '60');
      assert.equal(res.headers.get('x-ratelimit-reset-requests'), '1m0s');
      assert.equal((await res.json()).error.type, 'requests');
    });
  });

  test('concurrency limit (x-mock-delay-ms holds requests in flight)', async () => {
    await withProvider({ concurrency: 2 }, async (p) => {
      const slow = { 'x-mock-delay-ms': '200' };
      const a = post(`${p.url}/v1/messages`, anthropicBody(), slow);
      const b = post(`${p.url}/v1/messages`, anthropicBody({ stream: true }), slow);
      await until(() => p.stats().inFlight === 2);
      let res = await post(`${p.url}/v1/messages`, anthropicBody());
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('x-mock-limit'), 'concurrency');
      assert.ok(Number(res.headers.get('retry-after')) >= 1);
      const body = await res.json();
      assert.equal(body.error.type, 'rate_limit_error');
      assert.match(body.error.message, /concurren/i);
      res = await post(`${p.url}/v1/chat/completions`, openaiBody());
      assert.equal(res.status, 429);
      assert.equal((await res.json()).error.code, 'rate_limit_exceeded');
      assert.equal((await a).status, 200);
      await (await b).text();
      assert.equal(p.stats().inFlight, 0);
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      const s = p.stats();
      assert.equal(s.peakInFlight, 2);
      assert.equal(s.byLimit.concurrency, 2);
      assert.equal(s.overLimit, false);
    });
  });

  test('a client that aborts a stream frees its slot and is charged what was produced', async () => {
    await withProvider({ concurrency: 1, chunkDelayMs: 20, replyTokens: 20 }, async (p) => {
      const ac = new AbortController();
      const res = await fetch(`${p.url}/v1/messages`, {
        method: 'POST',
        headers: { 'x-api-key': KEY },
        body: JSON.stringify(anthropicBody({ stream: true })),
        signal: ac.signal,
      });
      const reader = /** @type {ReadableStreamDefaultReader} */ (res.body?.getReader());
      await reader.read();
      ac.abort();
      await until(() => p.stats().inFlight === 0);
      const s = p.stats();
      assert.equal(s.completed, 1);
      assert.ok(s.outputTokens < 20, `charged ${s.outputTokens}`);
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
    });
  });
});

describe('stats, log, reset', () => {
  test('minLevel, overLimit, reset()', async () => {
    const clock = fakeClock();
    await withProvider(
      { now: clock.now, requestsPerMinute: 3, inputTokensPerMinute: 10, outputTokensPerMinute: 1000, tokensPerMinute: 5000, replyTokens: 5 },
      async (p) => {
        let s = p.stats();
        assert.deepEqual(s.minLevel, { requests: 3, inputTokens: 10, outputTokens: 1000, tokens: 5000 });
        for (let i = 0; i < 4; i++) await post(`${p.url}/v1/messages`, anthropicBody({ max_tokens: 100 }));
        s = p.stats();
        assert.equal(s.admitted, 3);
        assert.equal(s.rejected429, 1);
        assert.deepEqual(s.minLevel, { requests: 0, inputTokens: 1, outputTokens: 985, tokens: 4881 });
        // tokens: each admission reserves 3 + 100, each completion refunds 100 - 5: 5000 - 103 + 95 - 103 + 95 - 103
        assert.equal(s.overLimit, false);
        assert.equal(s.inputTokens, 9);
        assert.equal(s.outputTokens, 15);
        p.reset();
        s = p.stats();
        assert.equal(s.requests, 0);
        assert.equal(s.admitted, 0);
        assert.equal(s.rejected429, 0);
        assert.equal(s.outputTokens, 0);
        assert.equal(s.peakInFlight, 0);
        assert.deepEqual(s.byLimit, { requests: 0, input_tokens: 0, output_tokens: 0, tokens: 0, concurrency: 0, forced: 0 });
        assert.deepEqual(s.minLevel, { requests: 3, inputTokens: 10, outputTokens: 1000, tokens: 5000 });
        assert.equal(p.log.length, 0, 'log cleared in place');
        assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200, 'buckets refilled');
        assert.equal(p.log.length, 1);
      },
    );
  });

  test('unconfigured limits have null levels', async () => {
    await withProvider({}, async (p) => {
      await post(`${p.url}/v1/messages`, anthropicBody());
      const s = p.stats();
      assert.deepEqual(s.minLevel, { requests: null, inputTokens: null, outputTokens: null, tokens: null });
      assert.equal(s.overLimit, false);
    });
  });
});

describe('errors and injected failures', () => {
  test('401 without an API key, in each flavour; keys never logged', async () => {
    /** @type {any[]} */
    const seen = [];
    await withProvider({ onRequest: (/** @type {any} */ e) => seen.push(e) }, async (p) => {
      let res = await post(`${p.url}/v1/messages`, anthropicBody(), { 'x-api-key': '' });
      assert.equal(res.status, 401);
      let body = await res.json();
      assert.equal(body.type, 'error');
      assert.equal(body.error.type, 'authentication_error');
      res = await post(`${p.url}/v1/chat/completions`, openaiBody(), { 'x-api-key': '' });
      assert.equal(res.status, 401);
      body = await res.json();
      assert.equal(body.error.code, 'invalid_api_key');
      assert.equal(typeof body.error.message, 'string');
      // with keys: x-api-key and Bearer
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      assert.equal(
        (await post(`${p.url}/v1/chat/completions`, openaiBody(), { 'x-api-key': '', authorization: `Bearer ${KEY}` })).status,
        200,
      );
      assert.deepEqual(p.log.map((/** @type {any} */ e) => e.status), [401, 401, 200, 200]);
      assert.equal(p.stats().requests, 2, 'unauthenticated requests never reach the limiter');
      const dump = JSON.stringify(p.log) + JSON.stringify(seen) + JSON.stringify(p.stats());
      assert.ok(!dump.includes(KEY));
      assert.ok(!dump.includes('Bearer'));
      assert.equal(seen.length, 4);
    });
  });

  test('404 for unknown paths and methods', async () => {
    await withProvider({}, async (p) => {
      let res = await post(`${p.url}/v1/nope`, anthropicBody());
      assert.equal(res.status, 404);
      assert.equal((await res.json()).error.type, 'not_found_error');
      res = await fetch(`${p.url}/v1/messages`);
      assert.equal(res.status, 404);
      assert.match(res.headers.get('content-type') ?? '', /json/);
      await res.json();
      res = await post(`${p.url}/v1/chat/completions/x`, openaiBody());
      assert.equal(res.status, 404);
      assert.equal(typeof (await res.json()).error.message, 'string');
    });
  });

  test('400 for bad JSON, a missing messages array, bad x-mock headers', async () => {
    await withProvider({}, async (p) => {
      let res = await post(`${p.url}/v1/messages`, '{"model": ');
      assert.equal(res.status, 400);
      assert.equal((await res.json()).error.type, 'invalid_request_error');
      res = await post(`${p.url}/v1/chat/completions`, 'not json');
      assert.equal(res.status, 400);
      assert.equal((await res.json()).error.type, 'invalid_request_error');
      res = await post(`${p.url}/v1/messages`, { model: 'm', max_tokens: 5 });
      assert.equal(res.status, 400);
      await res.json();
      res = await post(`${p.url}/v1/messages`, '[1,2]');
      assert.equal(res.status, 400);
      await res.json();
      res = await post(`${p.url}/v1/messages`, anthropicBody(), { 'x-mock-reply-tokens': 'many' });
      assert.equal(res.status, 400);
      await res.json();
      assert.equal(p.stats().requests, 0);
    });
  });

  test('fail429(n) forces 429s without touching the buckets', async () => {
    const clock = fakeClock();
    await withProvider({ now: clock.now, requestsPerMinute: 10 }, async (p) => {
      p.fail429(2, { retryAfterSeconds: 7 });
      for (let i = 0; i < 2; i++) {
        const res = await post(`${p.url}/v1/messages`, anthropicBody());
        assert.equal(res.status, 429);
        assert.equal(res.headers.get('retry-after'), '7');
        assert.equal(res.headers.get('x-mock-limit'), 'forced');
        assert.equal(res.headers.get('anthropic-ratelimit-requests-remaining'), '10');
        assert.equal((await res.json()).error.type, 'rate_limit_error');
      }
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      p.fail429(1, { retryAfterSeconds: null });
      const res = await post(`${p.url}/v1/chat/completions`, openaiBody());
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('retry-after'), null);
      assert.equal((await res.json()).error.code, 'rate_limit_exceeded');
      p.fail429(1);
      const r2 = await post(`${p.url}/v1/messages`, anthropicBody());
      assert.equal(r2.headers.get('retry-after'), '1');
      await r2.text();
      const s = p.stats();
      assert.equal(s.byLimit.forced, 4);
      assert.equal(s.rejected429, 4);
      assert.equal(s.admitted, 1);
    });
  });

  test('dropConnections(n) fails requests at the network level', async () => {
    await withProvider({}, async (p) => {
      p.dropConnections(2);
      await assert.rejects(post(`${p.url}/v1/messages`, anthropicBody()), TypeError);
      await assert.rejects(post(`${p.url}/v1/chat/completions`, openaiBody()), TypeError);
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      const s = p.stats();
      assert.equal(s.dropped, 2);
      assert.equal(s.admitted, 1);
      assert.equal(p.log.length, 1);
    });
  });

  test('options are validated', async () => {
    await assert.rejects(startMockProvider({ requestsPerMinute: 0 }), RangeError);
    await assert.rejects(startMockProvider({ concurrency: 1.5 }), RangeError);
    await assert.rejects(startMockProvider({ inputTokensPerMinute: -1 }), RangeError);
  });
});

describe('toolUse and the model list', () => {
  test('the first turn of a conversation that offers the tool is a tool_use (JSON and streamed), the next text', async () => {
    const p = await startMockProvider({ toolUse: { name: 'Bash', input: { command: 'echo hi' } }, chunkDelayMs: 0 });
    try {
      const call = (messages, stream = false) =>
        fetch(`${p.url}/v1/messages`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-api-key': KEY },
          body: JSON.stringify({ model: 'm', max_tokens: 64, stream, tools: [{ name: 'Bash', input_schema: { type: 'object' } }], messages }),
        });
      const first = await (await call([{ role: 'user', content: 'go' }])).json();
      assert.equal(first.stop_reason, 'tool_use');
      assert.deepEqual(first.content.map((b) => [b.type, b.name, b.input]), [['tool_use', 'Bash', { command: 'echo hi' }]]);
      const sse = await (await call([{ role: 'user', content: 'go' }], true)).text();
      assert.match(sse, /"type":"tool_use"/);
      assert.match(sse, /"partial_json":"\{\\"command\\":\\"echo hi\\"\}"/);
      assert.match(sse, /"stop_reason":"tool_use"/);
      const turn = [{ role: 'user', content: 'go' }, { role: 'assistant', content: first.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: first.content[0].id, content: 'hi' }] }];
      const second = await (await call(turn)).json();
      assert.equal(second.stop_reason, 'end_turn');
      assert.equal(second.content[0].type, 'text');
      assert.deepEqual(p.log.map((e) => e.toolUse === true), [true, true, false]);
      const models = await (await fetch(`${p.url}/v1/models`, { headers: { 'x-api-key': KEY } })).json();
      assert.deepEqual(models.data.map((m) => m.id), ['mock-model']);
    } finally {
      await p.close();
    }
  });
});

describe('fanOut and gateway429', () => {
  test("a session's first call fans out into parallel tool_use blocks; a subagent's call and later turns do not", async () => {
    const p = await startMockProvider({ fanOut: { name: 'Agent', count: 3 }, toolUse: { name: 'Bash', input: { command: 'echo hi' } }, chunkDelayMs: 0 });
    try {
      const call = (messages, headers = {}) =>
        fetch(`${p.url}/v1/messages`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-api-key': KEY, ...headers },
          body: JSON.stringify({ model: 'm', max_tokens: 64, tools: [{ name: 'Agent', input_schema: { type: 'object' } }, { name: 'Bash', input_schema: { type: 'object' } }], messages }),
        }).then((r) => r.json());
      const main = await call([{ role: 'user', content: 'go' }], { 'x-claude-code-session-id': 's1' });
      assert.equal(main.stop_reason, 'tool_use');
      assert.deepEqual(main.content.map((b) => [b.name, b.input.subagent_type]), [['Agent', 'general-purpose'], ['Agent', 'general-purpose'], ['Agent', 'general-purpose']]);
      assert.equal(new Set(main.content.map((b) => b.id)).size, 3, 'each subagent its own tool_use id');
      // A subagent (its own agent id) gets the ordinary tool turn, then text.
      const sub = await call([{ role: 'user', content: 'subtask' }], { 'x-claude-code-session-id': 's1', 'x-claude-code-agent-id': 'a1' });
      assert.deepEqual(sub.content.map((b) => b.name), ['Bash']);
      const later = await call([{ role: 'user', content: 'go' }, { role: 'assistant', content: main.content }, { role: 'user', content: 'results' }], { 'x-claude-code-session-id': 's1' });
      assert.equal(later.content[0].type, 'text');
    } finally {
      await p.close();
    }
  });

  test("with gateway429 a 429 carries seed 000's headers only: retry-after 60, rate_limit_type, reset_at", async () => {
    const p = await startMockProvider({ requestsPerMinute: 1, gateway429: true, chunkDelayMs: 0 });
    try {
      assert.equal((await post(`${p.url}/v1/messages`, anthropicBody())).status, 200);
      const t0 = Math.floor(Date.now() / 1000);
      const r = await post(`${p.url}/v1/messages`, anthropicBody());
      assert.equal(r.status, 429);
      assert.equal(r.headers.get('retry-after'), '60');
      assert.equal(r.headers.get('rate_limit_type'), 'requests_per_minute');
      const reset = Number(r.headers.get('reset_at'));
      assert.ok(reset >= t0 + 1 && reset <= t0 + 61, `reset_at ${reset} against ${t0}`);
      assert.equal(r.headers.get('anthropic-ratelimit-requests-remaining'), null);
    } finally {
      await p.close();
    }
  });
});
