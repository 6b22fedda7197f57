// A mock LLM provider for tests and examples: a local HTTP server (node:http only) that speaks
// enough of the Anthropic Messages API and the OpenAI Chat Completions API for the official
// SDKs to work against it, and that enforces configurable rate limits the way the real
// providers do (continuous token buckets, 429 + retry-after, rate-limit headers).
//
// Endpoints (the query string is ignored):
//   POST /v1/messages                 Anthropic Messages (also POST /messages)
//   POST /v1/messages/count_tokens    Anthropic token counting (also /messages/count_tokens)
//   POST /v1/chat/completions         OpenAI Chat Completions (also POST /chat/completions)
//   GET  /v1/models                   a list of one model, `mock-model`, in both providers' shapes
//   POST /v1/responses                OpenAI Responses (also POST /responses), JSON or SSE with
//                                     OpenAI's event sequence (response.created … response.completed,
//                                     or response.incomplete when max_output_tokens cuts it short)
// The Anthropic SDK takes baseURL `http://127.0.0.1:PORT`; the OpenAI SDK takes
// `http://127.0.0.1:PORT/v1`.
//
// Token counting (deterministic):
//   input tokens  = ceil(B / 4), where B is the UTF-8 byte length of the request's text: the
//                   concatenation, with no separator, of `system` (a string, or the `text` of
//                   each `{type:'text'}` block of an array) and then, in order, each message's
//                   `content` (a string, or the `text` of each `{type:'text'}` block of an
//                   array). Other blocks (images, tool_use, tool_result, ...) and other fields
//                   (roles, names, tools) count nothing. For /v1/responses the text is
//                   `instructions` and then `input` (a string, or each item's `content` — a
//                   string or the `text` of its input_text/output_text/text parts — and each
//                   function_call_output's string `output`). The `x-mock-cached-tokens` header
//                   (at most the input tokens) reports that many of them as cached
//                   (`input_tokens_details.cached_tokens`); cached tokens still count against
//                   the limits, as OpenAI counts them.
//   output tokens = min(max tokens, reply length). Max tokens is Anthropic `max_tokens`, or
//                   OpenAI `max_completion_tokens` ?? `max_tokens`, default 1024. Reply length
//                   is the `x-mock-reply-tokens` request header, else the `replyTokens`
//                   option (default 50). The reply text is that many words (one word = one
//                   token); a stream carries it in at most `maxDeltas` (default 20) deltas.
//                   For /v1/responses max tokens is `max_output_tokens`, and the
//                   `x-mock-reasoning-tokens` header adds that many reasoning tokens before the
//                   reply (part of output_tokens, `output_tokens_details.reasoning_tokens`); a
//                   reply cut by max_output_tokens is `status: "incomplete"`.
//
// Counting mode `counting: 'bpe'` (opt-in; the default, 'bytes', is the rule above). Prompt
// tokens come from a real BPE tokenizer (js-tiktoken, which the product's estimator does not
// use): o200k_base for OpenAI routes, and cl100k_base as a stand-in for Claude — Anthropic's
// tokenizer is not public, so no mock counts as Anthropic does. What is counted (the code is
// mock-counting.mjs):
//   Anthropic  tools: name + description + JSON of input_schema (a tool with
//              defer_loading: true counts nothing), plus the tool-use system prompt
//              Anthropic adds when tools are sent (346 tokens, 313 with tool_choice any/tool);
//              system (string or text blocks); per message 3 tokens of framing (Anthropic
//              publishes none: OpenAI's cookbook figure) and each block: text, thinking,
//              redacted_thinking's data, tool_use name + JSON of input, tool_result content
//              (text and images); any other block its JSON. Images (base64 only: the mock
//              fetches nothing, a URL is a 400): scaled to a long edge of at most 1568 px,
//              then w × h / 750, at most 1,600 tokens. PDFs (document, base64): per page the
//              tokens of the page's text (Tj/TJ in plain or Flate streams) plus the page
//              rendered at 150 dpi as an image by that rule (a US-letter page: 1,600).
//              Text and content documents: their text.
//   OpenAI     chat: per message 3 + role (+ 1 + name) + content parts + each tool call's
//              name and arguments; tools: the JSON of {name, description, parameters}; plus 3
//              priming the reply. Responses: the same for `instructions` (a developer
//              message) and each `input` item — messages, function_call (name + arguments),
//              function_call_output (its output), reasoning (summary text, and
//              encrypted_content as a token per 4 decoded bytes) — and function tools. Images: `detail: 'low'` 85, else fit
//              in 2048², short side down to 768, 85 + 170 per 512-px tile. PDF files: per
//              page its text plus the page at 150 dpi by the tile rule (high detail).
//   Prompt cache, Anthropic: each cache_control breakpoint (on a tool, a system block or a
//              message content block; ttl '5m' default or '1h'; more than 4 is a 400) caches
//              the prompt up to it (tools, system, messages; exact content, cache_control
//              itself ignored, a string content the same as one text block holding it)
//              when that prefix is at least 1,024 tokens. A later call that
//              finds an unexpired cached prefix at one of its breakpoints or up to 20 blocks
//              before one reports it as cache_read_input_tokens (and renews its TTL);
//              cache_creation_input_tokens is from there to its last breakpoint (split by TTL
//              in cache_creation), input_tokens what follows. Cached on admission only.
//   Prompt cache, OpenAI (automatic): the longest prefix of whole blocks (a tool, a message,
//              an input item) an earlier call sent, if at least 1,024 tokens, rounded down to
//              1,024 + a multiple of 128, is prompt_tokens_details.cached_tokens (Responses:
//              input_tokens_details.cached_tokens); kept 5 minutes after its last use.
//   Limits     Anthropic's input bucket (ITPM) is charged input + cache creation tokens (reads
//              are free); OpenAI's all prompt tokens, cached or not. The log entry's
//              inputTokens is that charged figure; it also gets promptTokens,
//              cacheReadInputTokens and cacheCreationInputTokens. count_tokens answers every
//              prompt token (no cache), by the same rule. The TTLs run on the `now` clock.
//
// Limits (all optional, per server instance, shared by every endpoint like one account):
//   requestsPerMinute, inputTokensPerMinute, outputTokensPerMinute, tokensPerMinute (combined,
//   OpenAI style) are continuous token buckets: capacity = the limit, refilled at limit/60000
//   per ms, starting full. On arrival a generation request is admitted only if
//     requests bucket >= 1, input bucket >= input tokens, output bucket > 0,
//     tokens bucket >= input tokens + max tokens, and in-flight < concurrency;
//   admission charges 1 request, the input tokens, and input + max tokens to the combined
//   bucket. At completion the output bucket is charged the output tokens (it may go into
//   debt) and the combined bucket is refunded max tokens - output tokens. Otherwise: 429
//   with `retry-after` (the wait, whole seconds) and the rate-limit headers, or with
//   `gateway429: true` as seed 000's gateway answers: `retry-after: 60`, `rate_limit_type`
//   and `reset_at` only.

import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { CountError, createBpeCounter } from './mock-counting.mjs';

const MINUTE_MS = 60_000;
const DEFAULT_MAX_TOKENS = 1024;
const MAX_BODY_BYTES = 32 * 1024 * 1024;

/** Bucket names in check order; also the `x-mock-limit` values. */
const BUCKETS = /** @type {const} */ (['requests', 'input_tokens', 'output_tokens', 'tokens']);

/** Keys of `stats().minLevel` for each bucket. @type {Record<string, string>} */
const MIN_KEY = {
  requests: 'requests',
  input_tokens: 'inputTokens',
  output_tokens: 'outputTokens',
  tokens: 'tokens',
};

/** Anthropic rate-limit header stem for each bucket. @type {Record<string, string>} */
const ANTHROPIC_HEADER = {
  requests: 'requests',
  input_tokens: 'input-tokens',
  output_tokens: 'output-tokens',
  tokens: 'tokens',
};

/** Seed 000's gateway's `rate_limit_type` for each limit (the names of its table). @type {Record<string, string>} */
const GATEWAY_LIMIT = {
  requests: 'requests_per_minute',
  input_tokens: 'input_tokens_per_minute',
  output_tokens: 'output_tokens_per_minute',
  tokens: 'tokens_per_minute',
  concurrency: 'parallel_requests',
};

/** Words the reply is made of (cycled). */
const WORDS = ['mock', 'reply', 'from', 'the', 'local', 'provider', 'with', 'some', 'plain', 'words'];

/**
 * @typedef {'anthropic' | 'openai'} Flavour
 * @typedef {{kind: 'messages' | 'count_tokens' | 'chat' | 'responses', flavour: Flavour}} Route
 */

/** @type {Map<string, Route>} */
const ROUTES = new Map([
  ['/v1/messages', { kind: 'messages', flavour: 'anthropic' }],
  ['/messages', { kind: 'messages', flavour: 'anthropic' }],
  ['/v1/messages/count_tokens', { kind: 'count_tokens', flavour: 'anthropic' }],
  ['/messages/count_tokens', { kind: 'count_tokens', flavour: 'anthropic' }],
  ['/v1/chat/completions', { kind: 'chat', flavour: 'openai' }],
  ['/chat/completions', { kind: 'chat', flavour: 'openai' }],
  ['/v1/responses', { kind: 'responses', flavour: 'openai' }],
  ['/responses', { kind: 'responses', flavour: 'openai' }],
]);

/**
 * A continuous token bucket. The level is kept in "token-milliseconds per minute" units
 * (tokens × 60000) so that with integer limits and an integer clock all arithmetic is exact.
 */
class Bucket {
  /**
   * @param {number} limit per-minute limit (= capacity)
   * @param {number} t current time, ms
   */
  constructor(limit, t) {
    this.limit = limit;
    this.capUnits = limit * MINUTE_MS;
    this.units = this.capUnits;
    this.last = t;
  }

  /** Refill up to time `t` (a clock that goes backwards refills nothing). @param {number} t */
  sync(t) {
    if (t > this.last) {
      this.units = Math.min(this.capUnits, this.units + (t - this.last) * this.limit);
      this.last = t;
    }
  }

  /** Current level in tokens (may be negative for the output bucket). */
  get level() {
    return this.units / MINUTE_MS;
  }

  /** @param {number} tokens */
  has(tokens) {
    return this.units >= tokens * MINUTE_MS;
  }

  /** @param {number} tokens */
  charge(tokens) {
    this.units -= tokens * MINUTE_MS;
  }

  /** @param {number} tokens */
  refund(tokens) {
    this.units = Math.min(this.capUnits, this.units + tokens * MINUTE_MS);
  }

  /** Milliseconds until the level reaches `tokens`. @param {number} tokens */
  msUntil(tokens) {
    return Math.max(0, (tokens * MINUTE_MS - this.units) / this.limit);
  }

  /** Milliseconds until the bucket is full. */
  msUntilFull() {
    return this.msUntil(this.limit);
  }

  /** Whole tokens left, never negative. */
  remaining() {
    return Math.max(0, Math.floor(this.units / MINUTE_MS));
  }

  refill() {
    this.units = this.capUnits;
  }
}

/**
 * A Go `time.Duration.String()`-style rendering of a millisecond count, as OpenAI's
 * `x-ratelimit-reset-*` headers use: `0s`, `120ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`.
 * @param {number} ms
 * @returns {string}
 */
export function formatGoDuration(ms) {
  const total = Math.ceil(ms);
  if (total <= 0) return '0s';
  if (total < 1000) return `${total}ms`;
  const h = Math.floor(total / 3_600_000);
  const m = Math.floor((total % 3_600_000) / 60_000);
  const msOfMinute = total % 60_000;
  const s = Math.floor(msOfMinute / 1000);
  const frac = msOfMinute % 1000;
  const secs = frac === 0 ? `${s}` : `${s}.${String(frac).padStart(3, '0').replace(/0+$/, '')}`;
  if (h > 0) return `${h}h${m}m${secs}s`;
  if (m > 0) return `${m}m${secs}s`;
  return `${secs}s`;
}

/**
 * The text of a `system` value or a message `content` value: a string, or the `text` of each
 * `{type: 'text'}` block of an array. Anything else contributes nothing.
 * @param {unknown} value
 * @returns {string}
 */
function textOf(value) {
  if (typeof value === 'string') return value;
  if (!Array.isArray(value)) return '';
  let out = '';
  for (const block of value) {
    if (block && typeof block === 'object' && block.type === 'text' && typeof block.text === 'string') {
      out += block.text;
    }
  }
  return out;
}

/**
 * Input tokens of a request body by the documented rule: ceil(UTF-8 bytes of the
 * concatenated `system` text and message contents / 4).
 * @param {{system?: unknown, messages?: unknown}} body
 * @returns {number}
 */
export function countInputTokens(body) {
  let text = textOf(body?.system);
  if (Array.isArray(body?.messages)) {
    for (const message of body.messages) {
      if (message && typeof message === 'object') text += textOf(message.content);
    }
  }
  return Math.ceil(Buffer.byteLength(text, 'utf8') / 4);
}

/**
 * Input tokens of a Responses API body: ceil(UTF-8 bytes of `instructions` and the text of
 * `input` / 4) (see the header comment).
 * @param {{instructions?: unknown, input?: unknown}} body
 * @returns {number}
 */
export function countResponsesInputTokens(body) {
  let text = typeof body?.instructions === 'string' ? body.instructions : '';
  const input = body?.input;
  if (typeof input === 'string') text += input;
  else if (Array.isArray(input)) {
    for (const item of input) {
      if (!item || typeof item !== 'object') continue;
      if (typeof item.content === 'string') text += item.content;
      else if (Array.isArray(item.content)) {
        for (const part of item.content) {
          if (part && typeof part === 'object' && ['input_text', 'output_text', 'text'].includes(part.type) && typeof part.text === 'string') {
            text += part.text;
          }
        }
      }
      if (item.type === 'function_call_output' && typeof item.output === 'string') text += item.output;
    }
  }
  return Math.ceil(Buffer.byteLength(text, 'utf8') / 4);
}

/**
 * The reply text (`tokens` words) split into at most `maxDeltas` consecutive pieces whose
 * concatenation is the whole text.
 * @param {number} tokens
 * @param {number} maxDeltas
 * @returns {{text: string, deltas: string[]}}
 */
function makeReply(tokens, maxDeltas) {
  const words = [];
  for (let i = 0; i < tokens; i++) words.push(WORDS[i % WORDS.length]);
  const text = words.join(' ');
  const n = Math.min(tokens, Math.max(1, maxDeltas));
  const deltas = [];
  let start = 0;
  for (let i = 0; i < n; i++) {
    const end = Math.round(((i + 1) * tokens) / n);
    const piece = words.slice(start, end).join(' ');
    deltas.push(start === 0 ? piece : ` ${piece}`);
    start = end;
  }
  return { text, deltas };
}

/** @param {string} prefix */
function makeId(prefix) {
  return prefix + randomBytes(12).toString('hex');
}

/** @param {number} ms */
function rfc3339In(ms) {
  const at = Math.ceil((Date.now() + ms) / 1000) * 1000;
  return new Date(at).toISOString().replace('.000Z', 'Z');
}

/**
 * Validate an optional numeric option: `undefined` when absent (or null).
 * @param {unknown} value
 * @param {string} name
 * @param {{integer?: boolean, positive?: boolean, min?: number}} [opts]
 * @returns {number | undefined}
 */
function optionalNumber(value, name, { integer = false, positive = false, min = 0 } = {}) {
  if (value === undefined || value === null) return undefined;
  const ok =
    typeof value === 'number' &&
    Number.isFinite(value) &&
    (positive ? value > 0 : value >= min) &&
    (!integer || Number.isInteger(value));
  if (!ok) {
    const what = `${integer ? 'an integer' : 'a number'} ${positive ? '> 0' : `>= ${min}`}`;
    throw new RangeError(`startMockProvider: ${name} must be ${what}, got ${String(value)}`);
  }
  return value;
}

/**
 * Parse a non-negative integer request header; `undefined` when absent, `null` when invalid.
 * @param {import('node:http').IncomingMessage} req
 * @param {string} name
 */
function intHeader(req, name) {
  const raw = req.headers[name];
  if (raw === undefined) return undefined;
  const s = Array.isArray(raw) ? raw[0] : raw;
  if (!/^\d+$/.test(s.trim())) return null;
  return Number(s.trim());
}

/**
 * @param {number} ms
 * @param {AbortSignal} signal
 * @returns {Promise<void>}
 */
function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}

/**
 * Start a mock provider on 127.0.0.1.
 * @param {import('./provider.d.ts').MockProviderOptions} [options]
 * @returns {Promise<import('./provider.d.ts').MockProvider>}
 */
export async function startMockProvider(options = {}) {
  const port = optionalNumber(options.port, 'port', { integer: true }) ?? 0;
  const replyTokens = optionalNumber(options.replyTokens, 'replyTokens', { integer: true }) ?? 50;
  const chunkDelayMs = optionalNumber(options.chunkDelayMs, 'chunkDelayMs') ?? 5;
  const delayMs = optionalNumber(options.delayMs, 'delayMs') ?? 0;
  const maxDeltas = optionalNumber(options.maxDeltas, 'maxDeltas', { integer: true, min: 1 }) ?? 20;
  const concurrency = optionalNumber(options.concurrency, 'concurrency', { integer: true, positive: true });
  const now = options.now ?? (() => performance.now());
  if (typeof now !== 'function') throw new TypeError('startMockProvider: now must be a function');
  const onRequest = options.onRequest;
  const recordHeaders = options.recordHeaders === true;
  // toolUse (opt-in): an Anthropic Messages call that offers a tool of this name and holds
  // fewer than `turns` (default 1) assistant messages is answered with a tool_use of it.
  const toolUse = options.toolUse ?? null;
  if (toolUse !== null && (typeof toolUse !== 'object' || typeof toolUse.name !== 'string' || toolUse.name === '')) {
    throw new TypeError('startMockProvider: toolUse must be { name, input?, turns? }');
  }
  const toolTurns = toolUse === null ? 0 : (optionalNumber(toolUse.turns, 'toolUse.turns', { integer: true }) ?? 1);
  // fanOut (opt-in): a session's main thread (a call without Claude Code's
  // `x-claude-code-agent-id`) that offers a tool of this name and holds no assistant
  // message is answered with `count` tool_use blocks of it at once, each starting a
  // subagent; every other call (the subagents', the main thread's later ones) is answered
  // as without it (toolUse, else text).
  const fanOut = options.fanOut ?? null;
  if (fanOut !== null && (typeof fanOut !== 'object' || typeof fanOut.name !== 'string' || fanOut.name === '')) {
    throw new TypeError('startMockProvider: fanOut must be { name, count, input? }');
  }
  const fanOutCount = fanOut === null ? 0 : optionalNumber(fanOut.count, 'fanOut.count', { integer: true, positive: true });
  if (fanOut !== null && fanOutCount === undefined) throw new TypeError('startMockProvider: fanOut.count is required');
  // gateway429 (opt-in): 429s as seed 000's gateway sends them (at the 429 below).
  const gateway429 = options.gateway429 === true;
  const counting = options.counting ?? 'bytes';
  if (counting !== 'bytes' && counting !== 'bpe') {
    throw new RangeError(`startMockProvider: counting must be 'bytes' or 'bpe', got ${String(counting)}`);
  }
  const bpe = counting === 'bpe' ? createBpeCounter(now) : null;
  await bpe?.ready();

  /** @type {Record<string, number | undefined>} */
  const limits = {
    requests: optionalNumber(options.requestsPerMinute, 'requestsPerMinute', { positive: true }),
    input_tokens: optionalNumber(options.inputTokensPerMinute, 'inputTokensPerMinute', { positive: true }),
    output_tokens: optionalNumber(options.outputTokensPerMinute, 'outputTokensPerMinute', { positive: true }),
    tokens: optionalNumber(options.tokensPerMinute, 'tokensPerMinute', { positive: true }),
  };
  const t0 = now();
  /** @type {Map<string, Bucket>} */
  const buckets = new Map();
  for (const name of BUCKETS) {
    const limit = limits[name];
    if (limit !== undefined) buckets.set(name, new Bucket(limit, t0));
  }

  let inFlight = 0;
  let pending429 = 0;
  /** @type {number | null} */
  let forcedRetryAfter = 1;
  let pendingDrops = 0;
  /** @type {import('./provider.d.ts').MockLogEntry[]} */
  const log = [];
  let counters = freshCounters();

  function freshCounters() {
    /** @type {Record<string, number | null>} */
    const minLevel = { requests: null, inputTokens: null, outputTokens: null, tokens: null };
    for (const [name, bucket] of buckets) minLevel[MIN_KEY[name]] = bucket.level;
    return {
      requests: 0,
      admitted: 0,
      completed: 0,
      rejected429: 0,
      dropped: 0,
      /** @type {Record<import('./provider.d.ts').MockLimitName, number>} */
      byLimit: { requests: 0, input_tokens: 0, output_tokens: 0, tokens: 0, concurrency: 0, forced: 0 },
      inputTokens: 0,
      outputTokens: 0,
      peakInFlight: inFlight,
      minLevel,
    };
  }

  /** @param {string} name */
  function noteLevel(name) {
    const bucket = buckets.get(name);
    if (!bucket) return;
    const key = MIN_KEY[name];
    const prev = counters.minLevel[key];
    if (prev === null || bucket.level < prev) counters.minLevel[key] = bucket.level;
  }

  function syncAll() {
    const t = now();
    for (const bucket of buckets.values()) bucket.sync(t);
  }

  /**
   * Rate-limit headers (for configured limits only) plus the request id.
   * @param {Flavour} flavour
   * @returns {Record<string, string>}
   */
  function rateHeaders(flavour) {
    syncAll();
    /** @type {Record<string, string>} */
    const headers = {};
    if (flavour === 'anthropic') {
      headers['request-id'] = makeId('req_mock_');
      for (const [name, bucket] of buckets) {
        const stem = `anthropic-ratelimit-${ANTHROPIC_HEADER[name]}`;
        headers[`${stem}-limit`] = String(bucket.limit);
        headers[`${stem}-remaining`] = String(bucket.remaining());
        headers[`${stem}-reset`] = rfc3339In(bucket.msUntilFull());
      }
    } else {
      headers['x-request-id'] = makeId('req_mock_');
      for (const [name, suffix] of /** @type {const} */ ([['requests', 'requests'], ['tokens', 'tokens']])) {
        const bucket = buckets.get(name);
        if (!bucket) continue;
        headers[`x-ratelimit-limit-${suffix}`] = String(bucket.limit);
        headers[`x-ratelimit-remaining-${suffix}`] = String(bucket.remaining());
        headers[`x-ratelimit-reset-${suffix}`] = formatGoDuration(bucket.msUntilFull());
      }
    }
    return headers;
  }

  /**
   * @param {Flavour} flavour
   * @param {number} status
   * @param {string} type Anthropic error type (mapped for OpenAI)
   * @param {string} message
   * @param {{openaiType?: string, code?: string | null}} [extra]
   */
  function errorBody(flavour, status, type, message, extra = {}) {
    if (flavour === 'anthropic') return { type: 'error', error: { type, message } };
    return {
      error: {
        message,
        type: extra.openaiType ?? 'invalid_request_error',
        param: null,
        code: extra.code ?? null,
      },
    };
  }

  /**
   * @param {import('node:http').ServerResponse} res
   * @param {number} status
   * @param {unknown} body
   * @param {Record<string, string>} headers
   */
  function sendJson(res, status, body, headers) {
    const payload = JSON.stringify(body);
    res.writeHead(status, {
      ...headers,
      'content-type': 'application/json',
      'content-length': String(Buffer.byteLength(payload)),
    });
    res.end(payload);
  }

  /** @param {import('./provider.d.ts').MockLogEntry} entry */
  function emit(entry) {
    if (onRequest) {
      try {
        onRequest(entry);
      } catch {
        // a listener's failure is not the provider's
      }
    }
  }

  /**
   * @param {import('node:http').IncomingMessage} req
   * @returns {Promise<Buffer | 'too-large'>}
   */
  function readBody(req) {
    return new Promise((resolve, reject) => {
      /** @type {Buffer[]} */
      const chunks = [];
      let size = 0;
      let tooLarge = false;
      req.on('data', (chunk) => {
        size += chunk.length;
        if (size > MAX_BODY_BYTES) tooLarge = true;
        else chunks.push(chunk);
      });
      req.on('end', () => resolve(tooLarge ? 'too-large' : Buffer.concat(chunks)));
      req.on('error', reject);
      req.on('close', () => {
        if (!req.complete) reject(new Error('client closed the request mid-upload'));
      });
    });
  }

  /**
   * @param {import('node:http').IncomingMessage} req
   * @param {import('node:http').ServerResponse} res
   */
  async function handle(req, res) {
    const path = (req.url ?? '/').split('?')[0];
    const route = req.method === 'POST' ? ROUTES.get(path) : undefined;
    const flavour = route?.flavour ?? (path.includes('chat/completions') || path.includes('responses') ? 'openai' : 'anthropic');
    /** @type {import('./provider.d.ts').MockLogEntry} */
    const entry = { path, model: null, stream: false, inputTokens: 0, outputTokens: 0, status: 0 };
    // Only on request (a proxy's tests check what it forwards): headers hold API keys.
    if (recordHeaders) entry.headers = { ...req.headers };

    /**
     * @param {number} status
     * @param {string} type
     * @param {string} message
     * @param {{openaiType?: string, code?: string | null}} [extra]
     */
    const fail = (status, type, message, extra) => {
      entry.status = status;
      log.push(entry);
      sendJson(res, status, errorBody(flavour, status, type, message, extra), rateHeaders(flavour));
      emit(entry);
    };

    let raw;
    try {
      raw = await readBody(req);
    } catch {
      return; // the client went away mid-upload
    }

    if (pendingDrops > 0) {
      pendingDrops--;
      counters.dropped++;
      req.socket.destroy();
      return;
    }

    if (!route && req.method === 'GET' && (path === '/v1/models' || path === '/models')) {
      // A model list in both providers' shapes (the SDKs' models.list()).
      entry.status = 200;
      log.push(entry);
      const model = { type: 'model', object: 'model', id: 'mock-model', display_name: 'Mock model', created_at: '2026-01-01T00:00:00Z', created: 1767225600, owned_by: 'mock' };
      sendJson(res, 200, { object: 'list', data: [model], has_more: false, first_id: model.id, last_id: model.id }, rateHeaders(flavour));
      emit(entry);
      return;
    }
    if (!route) {
      fail(404, 'not_found_error', `No route for ${req.method} ${path}`);
      return;
    }

    const apiKey = req.headers['x-api-key'];
    const auth = req.headers.authorization;
    if (!(typeof apiKey === 'string' && apiKey.trim()) && !(typeof auth === 'string' && auth.trim())) {
      fail(401, 'authentication_error', 'Missing API key: send an x-api-key or authorization header.', {
        code: 'invalid_api_key',
      });
      return;
    }

    if (raw === 'too-large') {
      fail(413, 'request_too_large', `Request body exceeds ${MAX_BODY_BYTES} bytes.`, {
        openaiType: 'invalid_request_error',
      });
      return;
    }

    /** @type {any} */
    let body;
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch (err) {
      fail(400, 'invalid_request_error', `Request body is not valid JSON: ${/** @type {Error} */ (err).message}`);
      return;
    }
    if (!body || typeof body !== 'object' || Array.isArray(body)) {
      fail(400, 'invalid_request_error', 'Request body must be a JSON object.');
      return;
    }
    entry.model = typeof body.model === 'string' ? body.model : null;
    entry.stream = route.kind !== 'count_tokens' && body.stream === true;
    if (route.kind === 'responses') {
      if (typeof body.input !== 'string' && !Array.isArray(body.input)) {
        fail(400, 'invalid_request_error', 'input: field required (a string or an array of input items).');
        return;
      }
    } else if (!Array.isArray(body.messages)) {
      fail(400, 'invalid_request_error', 'messages: field required (an array).');
      return;
    }
    const maxField =
      route.kind === 'responses'
        ? body.max_output_tokens
        : route.flavour === 'anthropic'
          ? body.max_tokens
          : (body.max_completion_tokens ?? body.max_tokens);
    if (maxField !== undefined && maxField !== null && !(Number.isInteger(maxField) && maxField >= 0)) {
      fail(400, 'invalid_request_error', 'max_tokens must be a non-negative integer.');
      return;
    }
    const maxTokens = maxField ?? DEFAULT_MAX_TOKENS;
    const replyHeader = intHeader(req, 'x-mock-reply-tokens');
    const delayHeader = intHeader(req, 'x-mock-delay-ms');
    if (replyHeader === null || delayHeader === null) {
      fail(400, 'invalid_request_error', 'x-mock-reply-tokens and x-mock-delay-ms must be non-negative integers.');
      return;
    }
    // counting: 'bpe': the tokenizer's counts and the prompt cache (see the header comment).
    let counted = null;
    if (bpe) {
      try {
        counted = await bpe.measure(route.kind, body);
      } catch (err) {
        if (!(err instanceof CountError)) throw err;
        fail(400, 'invalid_request_error', err.message);
        return;
      }
    }
    const promptUsage = counted?.usage ?? null;
    const inputTokens = promptUsage
      ? flavour === 'anthropic'
        ? promptUsage.input + promptUsage.cacheCreation
        : promptUsage.prompt
      : route.kind === 'responses'
        ? countResponsesInputTokens(body)
        : countInputTokens(body);
    entry.inputTokens = inputTokens;
    if (promptUsage) {
      entry.promptTokens = promptUsage.prompt;
      entry.cacheReadInputTokens = promptUsage.cacheRead;
      entry.cacheCreationInputTokens = promptUsage.cacheCreation;
    }
    // The prompt part of each usage object.
    const anthropicInput = promptUsage
      ? {
          input_tokens: promptUsage.input,
          cache_creation_input_tokens: promptUsage.cacheCreation,
          cache_read_input_tokens: promptUsage.cacheRead,
          cache_creation: {
            ephemeral_5m_input_tokens: promptUsage.cacheCreation5m,
            ephemeral_1h_input_tokens: promptUsage.cacheCreation1h,
          },
        }
      : { input_tokens: inputTokens, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
    const openaiCached = promptUsage ? promptUsage.cacheRead : 0;
    const cachedHeader = intHeader(req, 'x-mock-cached-tokens');
    const reasoningHeader = intHeader(req, 'x-mock-reasoning-tokens');
    if (cachedHeader === null || reasoningHeader === null) {
      fail(400, 'invalid_request_error', 'x-mock-cached-tokens and x-mock-reasoning-tokens must be non-negative integers.');
      return;
    }
    const cachedTokens = promptUsage ? promptUsage.cacheRead : Math.min(cachedHeader ?? 0, inputTokens);
    const reasoningWanted = route.kind === 'responses' ? (reasoningHeader ?? 0) : 0;

    if (route.kind === 'count_tokens') {
      entry.status = 200;
      log.push(entry);
      sendJson(res, 200, { input_tokens: inputTokens }, rateHeaders(flavour));
      emit(entry);
      return;
    }

    // ---- a generation request: admission ----
    counters.requests++;

    if (pending429 > 0) {
      pending429--;
      counters.rejected429++;
      counters.byLimit.forced++;
      entry.limit = 'forced';
      const headers = rateHeaders(flavour);
      headers['x-mock-limit'] = 'forced';
      if (forcedRetryAfter !== null) headers['retry-after'] = String(forcedRetryAfter);
      entry.status = 429;
      log.push(entry);
      sendJson(
        res,
        429,
        errorBody(flavour, 429, 'rate_limit_error', 'Rate limit exceeded (forced by fail429()).', {
          openaiType: 'requests',
          code: 'rate_limit_exceeded',
        }),
        headers,
      );
      emit(entry);
      return;
    }

    syncAll();
    const combinedNeed = inputTokens + maxTokens;
    /** @type {{limit: string, waitMs: number, message: string}[]} */
    const misses = [];
    const reqB = buckets.get('requests');
    const inB = buckets.get('input_tokens');
    const outB = buckets.get('output_tokens');
    const totB = buckets.get('tokens');
    if (reqB && !reqB.has(1)) {
      misses.push({ limit: 'requests', waitMs: reqB.msUntil(1), message: `requests per minute (limit ${reqB.limit})` });
    }
    if (inB && !inB.has(inputTokens)) {
      const never = inputTokens > inB.limit ? ' (the request alone exceeds the limit)' : '';
      misses.push({
        limit: 'input_tokens',
        waitMs: inB.msUntil(inputTokens),
        message: `input tokens per minute (limit ${inB.limit}, requested ${inputTokens})${never}`,
      });
    }
    if (outB && !(outB.units > 0)) {
      misses.push({
        limit: 'output_tokens',
        waitMs: outB.msUntil(0) + 1,
        message: `output tokens per minute (limit ${outB.limit})`,
      });
    }
    if (totB && !totB.has(combinedNeed)) {
      const never = combinedNeed > totB.limit ? ' (the request alone exceeds the limit)' : '';
      misses.push({
        limit: 'tokens',
        waitMs: totB.msUntil(combinedNeed),
        message: `tokens per minute (limit ${totB.limit}, requested ${combinedNeed})${never}`,
      });
    }
    if (concurrency !== undefined && inFlight >= concurrency) {
      misses.push({ limit: 'concurrency', waitMs: 1000, message: `concurrent requests (limit ${concurrency})` });
    }

    if (misses.length > 0) {
      const first = misses[0];
      const waitMs = Math.max(...misses.map((m) => m.waitMs));
      counters.rejected429++;
      const limitName = /** @type {import('./provider.d.ts').MockLimitName} */ (first.limit);
      counters.byLimit[limitName]++;
      entry.limit = limitName;
      // Seed 000's gateway: `retry-after` is its window's length whatever the wait (an upper
      // bound), `rate_limit_type` names the limit, `reset_at` (Unix seconds) is when the call
      // would be admitted; it describes its limits in no other header.
      const headers = gateway429
        ? {
            [flavour === 'anthropic' ? 'request-id' : 'x-request-id']: makeId('req_mock_'),
            'retry-after': '60',
            rate_limit_type: GATEWAY_LIMIT[first.limit],
            reset_at: String(Math.ceil((Date.now() + waitMs) / 1000)),
          }
        : { ...rateHeaders(flavour), 'retry-after': String(Math.max(1, Math.ceil(waitMs / 1000))) };
      headers['x-mock-limit'] = first.limit;
      const message =
        first.limit === 'concurrency'
          ? `Rate limit exceeded: too many concurrent requests (concurrency limit ${concurrency}).`
          : `Rate limit exceeded: ${misses.map((m) => m.message).join('; ')}.`;
      entry.status = 429;
      log.push(entry);
      sendJson(
        res,
        429,
        errorBody(flavour, 429, 'rate_limit_error', message, {
          openaiType: first.limit === 'requests' || first.limit === 'concurrency' ? 'requests' : 'tokens',
          code: 'rate_limit_exceeded',
        }),
        headers,
      );
      emit(entry);
      return;
    }

    reqB?.charge(1);
    inB?.charge(inputTokens);
    totB?.charge(combinedNeed);
    noteLevel('requests');
    noteLevel('input_tokens');
    noteLevel('tokens');
    counters.admitted++;
    counted?.commit();
    counters.inputTokens += inputTokens;
    inFlight++;
    if (inFlight > counters.peakInFlight) counters.peakInFlight = inFlight;
    entry.status = 200;
    log.push(entry);

    const wanted = (replyHeader ?? replyTokens) + reasoningWanted;
    const outputTokens = Math.min(maxTokens, wanted);
    const truncated = wanted > maxTokens;
    // Reasoning comes first and counts in the output; the reply is what is left of it.
    const reasoningTokens = Math.min(reasoningWanted, outputTokens);
    const reply = makeReply(outputTokens - reasoningTokens, maxDeltas);
    /** @param {string} name */
    const offers = (name) => route.kind === 'messages' && Array.isArray(body.tools) && body.tools.some((t) => t?.name === name);
    const turnsDone = route.kind === 'messages' ? body.messages.filter((m) => m?.role === 'assistant').length : 0;
    const mainThread = req.headers['x-claude-code-agent-id'] === undefined;
    /** The tool_use blocks of the answer (none: a text answer). */
    const tools =
      fanOut !== null && mainThread && turnsDone === 0 && offers(fanOut.name)
        ? Array.from({ length: fanOutCount }, (_, i) => ({
            type: 'tool_use',
            id: makeId('toolu_mock_'),
            name: fanOut.name,
            input: { description: `subtask ${i + 1}`, prompt: `Run \`echo subagent-${i + 1}-ok\` with the Bash tool and say what it printed.`, subagent_type: 'general-purpose', ...fanOut.input },
          }))
        : toolUse !== null && turnsDone < toolTurns && offers(toolUse.name)
          ? [{ type: 'tool_use', id: makeId('toolu_mock_'), name: toolUse.name, input: toolUse.input ?? {} }]
          : [];
    if (tools.length > 0) entry.toolUse = true;
    const stopReason = tools.length > 0 ? 'tool_use' : truncated ? 'max_tokens' : 'end_turn';
    const model = entry.model ?? 'mock-model';

    // Completion bookkeeping; runs exactly once (normal end or client abort).
    const countersAtAdmission = counters;
    let finished = false;
    /** @param {number} produced output tokens produced (charged) */
    const finish = (produced) => {
      if (finished) return;
      finished = true;
      inFlight--;
      syncAll();
      outB?.charge(produced);
      totB?.refund(maxTokens - produced);
      entry.outputTokens = produced;
      if (counters === countersAtAdmission) {
        noteLevel('output_tokens');
        counters.outputTokens += produced;
        counters.completed++;
      }
      emit(entry);
    };

    /**
     * The Responses API answer: the response object as JSON, or OpenAI's event stream
     * (response.created, response.in_progress, a reasoning item when reasoning tokens were
     * asked for, the message item with its output_text part and deltas, then
     * response.completed, or response.incomplete when max_output_tokens cut it short).
     */
    const respondResponses = async () => {
      const responseId = makeId('resp_mock_');
      const createdAt = Math.floor(Date.now() / 1000);
      const messageId = makeId('msg_mock_');
      const reasoningId = makeId('rs_mock_');
      const status = truncated ? 'incomplete' : 'completed';
      const usage = {
        input_tokens: inputTokens,
        input_tokens_details: { cached_tokens: cachedTokens },
        output_tokens: outputTokens,
        output_tokens_details: { reasoning_tokens: reasoningTokens },
        total_tokens: inputTokens + outputTokens,
      };
      const reasoningItem = { id: reasoningId, type: 'reasoning', summary: [] };
      /** @param {string} text @param {string} itemStatus */
      const messageItem = (text, itemStatus) => ({
        id: messageId,
        type: 'message',
        status: itemStatus,
        role: 'assistant',
        content: text === null ? [] : [{ type: 'output_text', text, annotations: [], logprobs: [] }],
      });
      const withReasoning = reasoningTokens > 0;
      /** @param {string} st @param {object[]} output @param {object | null} u */
      const responseObject = (st, output, u) => ({
        id: responseId,
        object: 'response',
        created_at: createdAt,
        status: st,
        background: false,
        error: null,
        incomplete_details: st === 'incomplete' ? { reason: 'max_output_tokens' } : null,
        instructions: typeof body.instructions === 'string' ? body.instructions : null,
        max_output_tokens: maxField ?? null,
        model,
        output,
        parallel_tool_calls: true,
        previous_response_id: typeof body.previous_response_id === 'string' ? body.previous_response_id : null,
        reasoning: { effort: body.reasoning?.effort ?? null, summary: null },
        service_tier: 'default',
        store: body.store !== false,
        temperature: 1,
        text: { format: { type: 'text' }, verbosity: 'medium' },
        tool_choice: 'auto',
        tools: [],
        top_p: 1,
        truncation: 'disabled',
        usage: u,
        user: null,
        metadata: {},
      });
      const itemStatus = truncated ? 'incomplete' : 'completed';
      const finalOutput = [...(withReasoning ? [reasoningItem] : []), messageItem(reply.text, itemStatus)];

      if (!entry.stream) {
        finish(outputTokens);
        sendJson(res, 200, responseObject(status, finalOutput, usage), rateHeaders(flavour));
        return;
      }

      res.writeHead(200, {
        ...rateHeaders(flavour),
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
      });
      let sequence = 0;
      /** @param {Record<string, unknown>} data */
      const send = (data) => {
        const event = { ...data, sequence_number: sequence++ };
        res.write(`event: ${data.type}\ndata: ${JSON.stringify(event)}\n\n`);
      };
      const pause = async () => {
        if (chunkDelayMs > 0) await sleep(chunkDelayMs, abort.signal);
      };
      send({ type: 'response.created', response: responseObject('in_progress', [], null) });
      send({ type: 'response.in_progress', response: responseObject('in_progress', [], null) });
      let index = 0;
      if (withReasoning) {
        send({ type: 'response.output_item.added', output_index: index, item: reasoningItem });
        await pause();
        if (abort.signal.aborted) return;
        produced += reasoningTokens;
        send({ type: 'response.output_item.done', output_index: index, item: reasoningItem });
        index++;
      }
      send({ type: 'response.output_item.added', output_index: index, item: messageItem(null, 'in_progress') });
      send({
        type: 'response.content_part.added',
        item_id: messageId,
        output_index: index,
        content_index: 0,
        part: { type: 'output_text', text: '', annotations: [], logprobs: [] },
      });
      for (let i = 0; i < reply.deltas.length; i++) {
        await pause();
        if (abort.signal.aborted) return;
        send({ type: 'response.output_text.delta', item_id: messageId, output_index: index, content_index: 0, delta: reply.deltas[i], logprobs: [] });
        produced += reply.deltas[i].trim() === '' ? 0 : reply.deltas[i].trim().split(' ').length;
      }
      await pause();
      if (abort.signal.aborted) return;
      send({ type: 'response.output_text.done', item_id: messageId, output_index: index, content_index: 0, text: reply.text, logprobs: [] });
      send({
        type: 'response.content_part.done',
        item_id: messageId,
        output_index: index,
        content_index: 0,
        part: { type: 'output_text', text: reply.text, annotations: [], logprobs: [] },
      });
      send({ type: 'response.output_item.done', output_index: index, item: messageItem(reply.text, itemStatus) });
      finish(outputTokens);
      send({ type: truncated ? 'response.incomplete' : 'response.completed', response: responseObject(status, finalOutput, usage) });
      res.end();
    };

    const abort = new AbortController();
    let produced = 0;
    const onClose = () => {
      abort.abort();
      finish(produced);
    };
    res.on('close', onClose);
    if (req.socket.destroyed) onClose(); // the client left before we got here

    const delay = delayHeader ?? delayMs;
    if (delay > 0) await sleep(delay, abort.signal);
    if (abort.signal.aborted) return;

    if (route.kind === 'responses') {
      await respondResponses();
      return;
    }

    if (!entry.stream) {
      finish(outputTokens);
      const headers = rateHeaders(flavour);
      const payload =
        flavour === 'anthropic'
          ? {
              id: makeId('msg_mock_'),
              type: 'message',
              role: 'assistant',
              model,
              content: tools.length > 0 ? tools : [{ type: 'text', text: reply.text }],
              stop_reason: stopReason,
              stop_sequence: null,
              usage: { ...anthropicInput, output_tokens: outputTokens },
            }
          : {
              id: makeId('chatcmpl-mock'),
              object: 'chat.completion',
              created: Math.floor(Date.now() / 1000),
              model,
              choices: [
                {
                  index: 0,
                  message: { role: 'assistant', content: reply.text, refusal: null },
                  finish_reason: truncated ? 'length' : 'stop',
                  logprobs: null,
                },
              ],
              usage: {
                prompt_tokens: inputTokens,
                completion_tokens: outputTokens,
                total_tokens: inputTokens + outputTokens,
                prompt_tokens_details: { cached_tokens: openaiCached },
                completion_tokens_details: { reasoning_tokens: 0 },
              },
              system_fingerprint: null,
            };
      sendJson(res, 200, payload, headers);
      return;
    }

    // ---- streaming ----
    res.writeHead(200, {
      ...rateHeaders(flavour),
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
    });
    const pause = async () => {
      if (chunkDelayMs > 0) await sleep(chunkDelayMs, abort.signal);
    };
    // output tokens carried by each delta (words in it)
    const deltaTokens = reply.deltas.map((d) => (d.trim() === '' ? 0 : d.trim().split(' ').length));

    if (flavour === 'anthropic') {
      /** @param {string} event @param {unknown} data */
      const send = (event, data) => res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
      send('message_start', {
        type: 'message_start',
        message: {
          id: makeId('msg_mock_'),
          type: 'message',
          role: 'assistant',
          model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: { ...anthropicInput, output_tokens: 1 },
        },
      });
      if (tools.length > 0) {
        // Each tool call in one input_json_delta, then the end of the turn.
        for (const [index, tool] of tools.entries()) {
          send('content_block_start', { type: 'content_block_start', index, content_block: { ...tool, input: {} } });
          send('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json: JSON.stringify(tool.input) } });
          await pause();
          if (abort.signal.aborted) return;
          send('content_block_stop', { type: 'content_block_stop', index });
        }
        finish(outputTokens);
        send('message_delta', { type: 'message_delta', delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: outputTokens } });
        send('message_stop', { type: 'message_stop' });
        res.end();
        return;
      }
      send('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
      send('ping', { type: 'ping' });
      for (let i = 0; i < reply.deltas.length; i++) {
        await pause();
        if (abort.signal.aborted) return;
        send('content_block_delta', {
          type: 'content_block_delta',
          index: 0,
          delta: { type: 'text_delta', text: reply.deltas[i] },
        });
        produced += deltaTokens[i];
      }
      await pause();
      if (abort.signal.aborted) return;
      send('content_block_stop', { type: 'content_block_stop', index: 0 });
      finish(outputTokens);
      send('message_delta', {
        type: 'message_delta',
        delta: { stop_reason: truncated ? 'max_tokens' : 'end_turn', stop_sequence: null },
        usage: { output_tokens: outputTokens },
      });
      send('message_stop', { type: 'message_stop' });
      res.end();
      return;
    }

    const includeUsage = body.stream_options?.include_usage === true;
    const id = makeId('chatcmpl-mock');
    const created = Math.floor(Date.now() / 1000);
    /** @param {object[]} choices @param {object | null} [usage] */
    const chunk = (choices, usage = null) => {
      /** @type {Record<string, unknown>} */
      const data = { id, object: 'chat.completion.chunk', created, model, system_fingerprint: null, choices };
      if (includeUsage) data.usage = usage;
      res.write(`data: ${JSON.stringify(data)}\n\n`);
    };
    chunk([{ index: 0, delta: { role: 'assistant', content: '', refusal: null }, logprobs: null, finish_reason: null }]);
    for (let i = 0; i < reply.deltas.length; i++) {
      await pause();
      if (abort.signal.aborted) return;
      chunk([{ index: 0, delta: { content: reply.deltas[i] }, logprobs: null, finish_reason: null }]);
      produced += deltaTokens[i];
    }
    await pause();
    if (abort.signal.aborted) return;
    finish(outputTokens);
    chunk([{ index: 0, delta: {}, logprobs: null, finish_reason: truncated ? 'length' : 'stop' }]);
    if (includeUsage) {
      chunk([], {
        prompt_tokens: inputTokens,
        completion_tokens: outputTokens,
        total_tokens: inputTokens + outputTokens,
        prompt_tokens_details: { cached_tokens: openaiCached },
        completion_tokens_details: { reasoning_tokens: 0 },
      });
    }
    res.write('data: [DONE]\n\n');
    res.end();
  }

  const server = http.createServer((req, res) => {
    handle(req, res).catch((err) => {
      // A bug in the mock: answer 500 if still possible, never crash the test process.
      if (!res.headersSent) {
        sendJson(res, 500, { type: 'error', error: { type: 'api_error', message: String(err?.message ?? err) } }, {});
      } else {
        res.destroy();
      }
    });
  });

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => {
      server.off('error', reject);
      resolve(undefined);
    });
  });
  const address = /** @type {import('node:net').AddressInfo} */ (server.address());
  let closing = /** @type {Promise<void> | null} */ (null);

  return {
    url: `http://127.0.0.1:${address.port}`,
    port: address.port,
    log,
    stats() {
      syncAll();
      const minLevel = { ...counters.minLevel };
      const overLimit =
        (concurrency !== undefined && counters.peakInFlight > concurrency) ||
        [minLevel.requests, minLevel.inputTokens, minLevel.tokens].some((v) => v !== null && v < 0);
      /** @type {Record<string, number | null>} */
      const levels = { requests: null, inputTokens: null, outputTokens: null, tokens: null };
      for (const [name, bucket] of buckets) levels[MIN_KEY[name]] = bucket.level;
      return {
        requests: counters.requests,
        admitted: counters.admitted,
        completed: counters.completed,
        rejected429: counters.rejected429,
        dropped: counters.dropped,
        byLimit: { ...counters.byLimit },
        inputTokens: counters.inputTokens,
        outputTokens: counters.outputTokens,
        inFlight,
        peakInFlight: counters.peakInFlight,
        minLevel: /** @type {any} */ (minLevel),
        levels: /** @type {any} */ (levels),
        overLimit,
      };
    },
    reset() {
      for (const bucket of buckets.values()) {
        bucket.sync(now());
        bucket.refill();
      }
      pending429 = 0;
      pendingDrops = 0;
      log.length = 0;
      counters = freshCounters();
    },
    fail429(n, opts = {}) {
      pending429 = optionalNumber(n, 'fail429(n)', { integer: true }) ?? 0;
      forcedRetryAfter =
        opts.retryAfterSeconds === null
          ? null
          : (optionalNumber(opts.retryAfterSeconds, 'retryAfterSeconds', { integer: true }) ?? 1);
    },
    dropConnections(n) {
      pendingDrops = optionalNumber(n, 'dropConnections(n)', { integer: true }) ?? 0;
    },
    close() {
      closing ??= new Promise((resolve) => {
        server.close(() => {
          // The destroyed sockets' responses settle their in-flight requests (counters) a
          // little later; wait for that, but never hang on it.
          const started = Date.now();
          const check = () => {
            if (inFlight === 0 || Date.now() - started > 1000) resolve();
            else setTimeout(check, 1);
          };
          check();
        });
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
