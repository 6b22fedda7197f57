// The mock provider's `counting: 'bpe'` mode: prompt tokens counted with a real BPE
// tokenizer (js-tiktoken), and the providers' prompt caches. The rules are documented in
// the header comment of mock-provider.mjs; this module is their implementation.
//
// Tokenizers: o200k_base for OpenAI (the GPT-4o / GPT-4.1 / o-series / GPT-5 encoding), and
// cl100k_base as a stand-in for Claude: Anthropic's tokenizer is not public, so no test can
// count as Anthropic does; cl100k_base is a real BPE with different merges from o200k_base
// and from any bytes-per-token rule, which is what an estimate is measured against.
import { createHash } from 'node:crypto';
import { inflateSync } from 'node:zlib';
import { Tiktoken } from 'js-tiktoken/lite';

/** A request the mock cannot count: answered 400 with this message. */
export class CountError extends Error {}

/** @type {Map<string, Tiktoken>} */
const encoders = new Map();

/** The tokenizer of a flavour, loaded on first use (each takes a second or two). */
async function loadEncoder(/** @type {'anthropic' | 'openai'} */ flavour) {
  const name = flavour === 'openai' ? 'o200k_base' : 'cl100k_base';
  let enc = encoders.get(name);
  if (enc === undefined) {
    const ranks = flavour === 'openai' ? await import('js-tiktoken/ranks/o200k_base') : await import('js-tiktoken/ranks/cl100k_base');
    enc = new Tiktoken(ranks.default);
    encoders.set(name, enc);
  }
  return enc;
}

/** Strings at least this long have their token counts memoized (a history repeats them). */
const MEMO_MIN = 256;
const MEMO_MAX = 20_000;

/** Anthropic's tool-use system prompt (docs, "Tool use" pricing, Claude 4 models). */
const TOOL_USE_AUTO = 346;
const TOOL_USE_FORCED = 313;
/** Framing tokens per message (OpenAI's cookbook figure; Anthropic publishes none: the same is used). */
const PER_MESSAGE = 3;
/** Tokens priming the reply (OpenAI's cookbook). */
const REPLY_PRIMING = 3;
/** Prompt-cache rules. */
const MIN_CACHE_TOKENS = 1024;
const LOOKBACK_BLOCKS = 20;
const MAX_BREAKPOINTS = 4;
const TTL_5M = 5 * 60_000;
const TTL_1H = 60 * 60_000;
/** OpenAI keeps a prefix "5 to 10 minutes" after its last use: the mock keeps it 5. */
const OPENAI_CACHE_TTL = 5 * 60_000;
const OPENAI_CACHE_STEP = 128;
const CACHE_ENTRIES = 20_000;
/** Anthropic's image cap (docs, "Vision": images over ~1,600 tokens are scaled down). */
const ANTHROPIC_IMAGE_CAP = 1600;
/** PDF pages are rendered at this resolution before the image rule applies. */
const PDF_DPI = 150;

/**
 * @typedef {{tokens: number, key: string, ttlMs: number}} Block one cacheable unit: a tool, a
 *   system block, a message content block (a string content is one block)
 * @typedef {{input: number, cacheCreation: number, cacheRead: number, prompt: number,
 *   cacheCreation5m: number, cacheCreation1h: number}} PromptUsage
 */

/**
 * A counter for one mock provider instance: the tokenizers, and the prompt caches (one per
 * instance, like one account's).
 * @param {() => number} now the mock's clock, ms
 */
export function createBpeCounter(now) {
  /** @type {Map<string, number>} */
  const memo = new Map();
  /** Anthropic cache entries by prefix hash. @type {Map<string, {tokens: number, ttlMs: number, expiresAt: number}>} */
  const anthropicCache = new Map();
  /** OpenAI cache entries by prefix hash. @type {Map<string, {tokens: number, expiresAt: number}>} */
  const openaiCache = new Map();

  /** @param {Map<string, any>} cache @param {string} key @param {any} value */
  function put(cache, key, value) {
    cache.delete(key);
    cache.set(key, value);
    while (cache.size > CACHE_ENTRIES) cache.delete(/** @type {string} */ (cache.keys().next().value));
  }

  /**
   * Count a request body. Nothing is cached until `commit()` (called when the call is admitted).
   * @param {'messages' | 'count_tokens' | 'chat' | 'responses'} kind
   * @param {any} body
   * @returns {Promise<{usage: PromptUsage, commit: () => void}>}
   */
  async function measure(kind, body) {
    const flavour = kind === 'messages' || kind === 'count_tokens' ? 'anthropic' : 'openai';
    const enc = await loadEncoder(flavour);
    /** @param {unknown} s */
    const tok = (s) => {
      if (typeof s !== 'string' || s.length === 0) return 0;
      if (s.length < MEMO_MIN) return enc.encode(s, 'all').length;
      const key = `${flavour}\u0000${s}`;
      let n = memo.get(key);
      if (n === undefined) {
        n = enc.encode(s, 'all').length;
        if (memo.size >= MEMO_MAX) memo.delete(/** @type {string} */ (memo.keys().next().value));
        memo.set(key, n);
      }
      return n;
    };
    const model = typeof body.model === 'string' ? body.model : '';
    const blocks =
      kind === 'chat' ? chatBlocks(body, tok) : kind === 'responses' ? responsesBlocks(body, tok) : anthropicBlocks(body, tok);
    const at = now();
    // Chained prefix hashes: blocks[i].key becomes the hash of the prompt up to block i.
    let h = createHash('sha256').update(`${kind === 'count_tokens' ? 'messages' : kind}\u0000${model}`).digest('hex');
    const ends = [];
    let total = 0;
    for (const b of blocks) {
      h = createHash('sha256').update(h).update(b.key).digest('hex');
      b.key = h;
      total += b.tokens;
      ends.push(total);
    }
    const prompt = total + (flavour === 'openai' ? REPLY_PRIMING : 0);
    /** @type {PromptUsage} */
    const usage = { input: prompt, cacheCreation: 0, cacheRead: 0, prompt, cacheCreation5m: 0, cacheCreation1h: 0 };
    if (kind === 'count_tokens') return { usage, commit() {} };

    if (flavour === 'openai') {
      // Automatic caching: the longest remembered prefix (whole blocks) of 1024+ tokens, in
      // 128-token steps; every prefix of this prompt is remembered for the next call.
      let read = 0;
      for (let i = blocks.length - 1; i >= 0; i--) {
        const hit = openaiCache.get(blocks[i].key);
        if (hit !== undefined && hit.expiresAt > at) {
          read = hit.tokens;
          break;
        }
      }
      const cached = read >= MIN_CACHE_TOKENS ? MIN_CACHE_TOKENS + Math.floor((read - MIN_CACHE_TOKENS) / OPENAI_CACHE_STEP) * OPENAI_CACHE_STEP : 0;
      usage.cacheRead = cached;
      usage.input = prompt - cached;
      return {
        usage,
        commit() {
          blocks.forEach((b, i) => {
            if (ends[i] >= MIN_CACHE_TOKENS) put(openaiCache, b.key, { tokens: ends[i], expiresAt: at + OPENAI_CACHE_TTL });
          });
        },
      };
    }

    // Anthropic: explicit breakpoints.
    const breakpoints = [];
    blocks.forEach((b, i) => {
      if (b.ttlMs > 0) breakpoints.push(i);
    });
    if (breakpoints.length > MAX_BREAKPOINTS) {
      throw new CountError(`A maximum of ${MAX_BREAKPOINTS} blocks with cache_control may be provided. Found ${breakpoints.length}.`);
    }
    if (breakpoints.length === 0) return { usage, commit() {} };
    const last = /** @type {number} */ (breakpoints[breakpoints.length - 1]);
    // The longest unexpired cached prefix ending at a breakpoint or within 20 blocks before one.
    let readAt = -1;
    for (let i = last; i >= 0 && readAt < 0; i--) {
      const inWindow = breakpoints.some((b) => b >= i && b - i <= LOOKBACK_BLOCKS);
      if (!inWindow) continue;
      const hit = anthropicCache.get(blocks[i].key);
      if (hit !== undefined && hit.expiresAt > at) readAt = i;
    }
    const readTokens = readAt < 0 ? 0 : ends[readAt];
    const prefix = ends[last];
    if (prefix >= MIN_CACHE_TOKENS) {
      usage.cacheRead = readTokens;
      usage.cacheCreation = prefix - readTokens;
      usage.input = prompt - prefix;
      // The creation split by lifetime: each stretch takes the TTL of the breakpoint ending it.
      let from = readTokens;
      for (const b of breakpoints) {
        if (ends[b] <= from) continue;
        if (blocks[b].ttlMs === TTL_1H) usage.cacheCreation1h += ends[b] - from;
        else usage.cacheCreation5m += ends[b] - from;
        from = ends[b];
      }
    }
    return {
      usage,
      commit() {
        if (readAt >= 0) {
          const hit = anthropicCache.get(blocks[readAt].key);
          if (hit !== undefined) put(anthropicCache, blocks[readAt].key, { ...hit, expiresAt: at + hit.ttlMs });
        }
        for (const b of breakpoints) {
          if (ends[b] >= MIN_CACHE_TOKENS) put(anthropicCache, blocks[b].key, { tokens: ends[b], ttlMs: blocks[b].ttlMs, expiresAt: at + blocks[b].ttlMs });
        }
      },
    };
  }

  /** Load both tokenizers now (each takes a second or two the first time in a process). */
  async function ready() {
    await loadEncoder('anthropic');
    await loadEncoder('openai');
  }

  return { measure, ready };
}

/** A block's content for hashing: its JSON without `cache_control` (which moves from turn to turn). */
function canonical(/** @type {unknown} */ value) {
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    const { cache_control: _moved, ...rest } = /** @type {Record<string, unknown>} */ (value);
    return JSON.stringify(rest);
  }
  return JSON.stringify(value) ?? '';
}

/** The TTL a block's `cache_control` asks for, 0 for none; a malformed one is a CountError. */
function ttlOf(/** @type {any} */ block, /** @type {string} */ where) {
  if (!block || typeof block !== 'object' || block.cache_control === undefined || block.cache_control === null) return 0;
  const c = block.cache_control;
  if (typeof c !== 'object' || c.type !== 'ephemeral') throw new CountError(`${where}.cache_control: type must be 'ephemeral'`);
  if (c.ttl === undefined || c.ttl === '5m') return TTL_5M;
  if (c.ttl === '1h') return TTL_1H;
  throw new CountError(`${where}.cache_control.ttl: must be '5m' or '1h', got ${JSON.stringify(c.ttl)}`);
}

// ---- Anthropic Messages ------------------------------------------------------------------

/** @param {any} body @param {(s: unknown) => number} tok @returns {Block[]} */
function anthropicBlocks(body, tok) {
  /** @type {Block[]} */
  const blocks = [];
  const tools = Array.isArray(body.tools) ? body.tools : [];
  const loaded = tools.filter((t) => !(t && t.defer_loading === true));
  tools.forEach((t, i) => {
    const where = `tools.${i}`;
    if (!t || typeof t !== 'object') throw new CountError(`${where}: must be an object`);
    // A deferred tool (tool search) is not in the prompt until it is found.
    let tokens = 0;
    if (t.defer_loading !== true) {
      tokens = t.input_schema !== undefined ? tok(t.name) + tok(t.description) + tok(JSON.stringify(t.input_schema)) : tok(canonical(t));
    }
    let key = canonical(t);
    if (i === 0 && loaded.length > 0) {
      // The tool-use system prompt Anthropic adds, counted with the first tool.
      const choice = body.tool_choice?.type;
      const forced = choice === 'any' || choice === 'tool';
      tokens += forced ? TOOL_USE_FORCED : TOOL_USE_AUTO;
      key = `${forced ? 'forced' : 'auto'}\u0000${key}`;
    }
    blocks.push({ tokens, key, ttlMs: ttlOf(t, where) });
  });
  // A string is the same prompt as one text block holding it (Claude Code sends a message
  // as blocks on one turn and as a string on the next): it hashes the same.
  if (typeof body.system === 'string') blocks.push({ tokens: tok(body.system), key: canonical({ type: 'text', text: body.system }), ttlMs: 0 });
  else if (Array.isArray(body.system)) {
    body.system.forEach((/** @type {any} */ b, /** @type {number} */ i) => {
      blocks.push({ tokens: anthropicBlockTokens(b, tok, `system.${i}`), key: canonical(b), ttlMs: ttlOf(b, `system.${i}`) });
    });
  } else if (body.system !== undefined && body.system !== null) throw new CountError('system: must be a string or an array of text blocks');
  body.messages.forEach((/** @type {any} */ m, /** @type {number} */ i) => {
    const where = `messages.${i}`;
    if (!m || typeof m !== 'object') throw new CountError(`${where}: must be an object`);
    const framing = PER_MESSAGE;
    if (typeof m.content === 'string') {
      blocks.push({ tokens: framing + tok(m.content), key: `r${m.role}\u0000${canonical({ type: 'text', text: m.content })}`, ttlMs: 0 });
    } else if (Array.isArray(m.content)) {
      if (m.content.length === 0) blocks.push({ tokens: framing, key: `r${m.role}`, ttlMs: 0 });
      m.content.forEach((/** @type {any} */ b, /** @type {number} */ j) => {
        const tokens = (j === 0 ? framing : 0) + anthropicBlockTokens(b, tok, `${where}.content.${j}`);
        blocks.push({ tokens, key: (j === 0 ? `r${m.role}\u0000` : '') + canonical(b), ttlMs: ttlOf(b, `${where}.content.${j}`) });
      });
    } else throw new CountError(`${where}.content: must be a string or an array of blocks`);
  });
  return blocks;
}

/** @param {any} b @param {(s: unknown) => number} tok @param {string} where @returns {number} */
function anthropicBlockTokens(b, tok, where) {
  if (typeof b === 'string') return tok(b);
  if (!b || typeof b !== 'object') throw new CountError(`${where}: must be a content block`);
  switch (b.type) {
    case 'text':
      return tok(b.text);
    case 'thinking':
      return tok(b.thinking);
    case 'redacted_thinking':
      return tok(b.data);
    case 'tool_use':
    case 'server_tool_use':
      return tok(b.name) + tok(JSON.stringify(b.input ?? {}));
    case 'tool_result':
      if (b.content === undefined || b.content === null) return 0;
      if (typeof b.content === 'string') return tok(b.content);
      if (!Array.isArray(b.content)) throw new CountError(`${where}.content: must be a string or an array of blocks`);
      return b.content.reduce((/** @type {number} */ n, /** @type {any} */ c, /** @type {number} */ k) => n + anthropicBlockTokens(c, tok, `${where}.content.${k}`), 0);
    case 'image': {
      const size = sourceImageSize(b.source, `${where}.source`);
      return anthropicImageTokens(size.w, size.h);
    }
    case 'document':
      return documentTokens(b.source, tok, `${where}.source`);
    default:
      return tok(canonical(b));
  }
}

/** @param {any} source @param {string} where */
function sourceImageSize(source, where) {
  if (!source || typeof source !== 'object') throw new CountError(`${where}: required`);
  if (source.type !== 'base64' || typeof source.data !== 'string') {
    throw new CountError(`${where}: counting: 'bpe' counts only base64 images (got source type ${JSON.stringify(source.type)}; the mock fetches nothing)`);
  }
  return imageSize(Buffer.from(source.data.slice(0, 96 * 1024), 'base64'), where);
}

/**
 * Anthropic (docs, "Vision"): scaled (aspect kept) to at most 1568 px on the long edge and
 * at most 1,600 tokens (1.2 megapixels), then width × height / 750.
 */
export function anthropicImageTokens(/** @type {number} */ w, /** @type {number} */ h) {
  const long = Math.max(w, h);
  if (long > 1568) {
    w = (w * 1568) / long;
    h = (h * 1568) / long;
  }
  return Math.max(1, Math.min(ANTHROPIC_IMAGE_CAP, Math.ceil((w * h) / 750)));
}

/**
 * OpenAI (docs, "Images and vision", GPT-4o / GPT-4.1 / o-series): `detail: 'low'` is 85;
 * otherwise fit in 2048 × 2048, scale the short side down to 768, then 85 + 170 per 512-px tile.
 */
export function openaiImageTokens(/** @type {number} */ w, /** @type {number} */ h, /** @type {unknown} */ detail) {
  if (detail === 'low') return 85;
  const fit = Math.min(1, 2048 / Math.max(w, h));
  w *= fit;
  h *= fit;
  const short = Math.min(w, h);
  if (short > 768) {
    w = (w * 768) / short;
    h = (h * 768) / short;
  }
  return 85 + 170 * Math.ceil(w / 512) * Math.ceil(h / 512);
}

/** @param {any} source @param {(s: unknown) => number} tok @param {string} where */
function documentTokens(source, tok, where) {
  if (!source || typeof source !== 'object') throw new CountError(`${where}: required`);
  if (source.type === 'text') return tok(source.data);
  if (source.type === 'content') {
    if (!Array.isArray(source.content)) throw new CountError(`${where}.content: must be an array of blocks`);
    return source.content.reduce((/** @type {number} */ n, /** @type {any} */ c, /** @type {number} */ k) => n + anthropicBlockTokens(c, tok, `${where}.content.${k}`), 0);
  }
  if (source.type === 'base64' && typeof source.data === 'string') {
    return pdfPages(Buffer.from(source.data, 'base64'), where).reduce(
      (n, p) => n + tok(p.text) + anthropicImageTokens((p.w * PDF_DPI) / 72, (p.h * PDF_DPI) / 72),
      0,
    );
  }
  throw new CountError(`${where}: counting: 'bpe' counts only base64, text or content documents (got source type ${JSON.stringify(source.type)})`);
}

// ---- OpenAI Chat Completions and Responses ---------------------------------------------------

/** @param {any} body @param {(s: unknown) => number} tok @returns {Block[]} */
function chatBlocks(body, tok) {
  /** @type {Block[]} */
  const blocks = openaiToolBlocks(body.tools, tok, (t) => t?.function);
  body.messages.forEach((/** @type {any} */ m, /** @type {number} */ i) => {
    const where = `messages.${i}`;
    if (!m || typeof m !== 'object') throw new CountError(`${where}: must be an object`);
    let tokens = PER_MESSAGE + tok(m.role) + (typeof m.name === 'string' ? 1 + tok(m.name) : 0);
    if (typeof m.content === 'string') tokens += tok(m.content);
    else if (Array.isArray(m.content)) {
      m.content.forEach((/** @type {any} */ p, /** @type {number} */ j) => {
        tokens += openaiPartTokens(p, tok, `${where}.content.${j}`);
      });
    } else if (m.content !== undefined && m.content !== null) throw new CountError(`${where}.content: must be a string, an array of parts or null`);
    if (Array.isArray(m.tool_calls)) {
      for (const c of m.tool_calls) tokens += tok(c?.function?.name) + tok(c?.function?.arguments);
    }
    blocks.push({ tokens, key: canonical(m), ttlMs: 0 });
  });
  return blocks;
}

/** @param {any} body @param {(s: unknown) => number} tok @returns {Block[]} */
function responsesBlocks(body, tok) {
  /** @type {Block[]} */
  const blocks = openaiToolBlocks(body.tools, tok, (t) => (t?.type === 'function' ? t : null));
  if (typeof body.instructions === 'string') {
    blocks.push({ tokens: PER_MESSAGE + tok('developer') + tok(body.instructions), key: `i${body.instructions}`, ttlMs: 0 });
  } else if (body.instructions !== undefined && body.instructions !== null) throw new CountError('instructions: must be a string');
  const items = typeof body.input === 'string' ? [{ role: 'user', content: body.input }] : body.input;
  if (!Array.isArray(items)) throw new CountError('input: field required (a string or an array of items)');
  items.forEach((/** @type {any} */ it, /** @type {number} */ i) => {
    const where = `input.${i}`;
    if (!it || typeof it !== 'object') throw new CountError(`${where}: must be an object`);
    let tokens = PER_MESSAGE;
    if (it.type === 'function_call') tokens += tok(it.name) + tok(it.arguments);
    else if (it.type === 'function_call_output') {
      if (typeof it.output === 'string') tokens += tok(it.output);
      else if (Array.isArray(it.output)) it.output.forEach((/** @type {any} */ p, /** @type {number} */ j) => (tokens += openaiPartTokens(p, tok, `${where}.output.${j}`)));
    } else if (it.type === 'reasoning') {
      for (const s of Array.isArray(it.summary) ? it.summary : []) tokens += tok(s?.text);
      // The reasoning it carries back counts as input; OpenAI publishes no size rule, and the
      // ciphertext's size is the only sign of it: a token per 4 bytes of it.
      if (typeof it.encrypted_content === 'string') tokens += Math.ceil(Buffer.from(it.encrypted_content, 'base64').length / 4);
    } else if (it.type === 'message' || (it.type === undefined && it.role !== undefined)) {
      tokens += tok(it.role);
      if (typeof it.content === 'string') tokens += tok(it.content);
      else if (Array.isArray(it.content)) it.content.forEach((/** @type {any} */ p, /** @type {number} */ j) => (tokens += openaiPartTokens(p, tok, `${where}.content.${j}`)));
      else throw new CountError(`${where}.content: must be a string or an array of parts`);
    } else tokens += tok(canonical(it));
    blocks.push({ tokens, key: canonical(it), ttlMs: 0 });
  });
  return blocks;
}

/** @param {unknown} tools @param {(s: unknown) => number} tok @param {(t: any) => any} fn */
function openaiToolBlocks(tools, tok, fn) {
  if (tools === undefined || tools === null) return [];
  if (!Array.isArray(tools)) throw new CountError('tools: must be an array');
  return tools.map((t) => {
    const f = fn(t);
    const tokens = f ? tok(JSON.stringify({ name: f.name, description: f.description, parameters: f.parameters })) : tok(canonical(t));
    return { tokens, key: canonical(t), ttlMs: 0 };
  });
}

/** A content part of an OpenAI message (chat or Responses). */
function openaiPartTokens(/** @type {any} */ p, /** @type {(s: unknown) => number} */ tok, /** @type {string} */ where) {
  if (typeof p === 'string') return tok(p);
  if (!p || typeof p !== 'object') throw new CountError(`${where}: must be a content part`);
  switch (p.type) {
    case 'text':
    case 'input_text':
    case 'output_text':
    case 'refusal':
      return tok(p.text ?? p.refusal);
    case 'image_url':
    case 'input_image': {
      const url = p.type === 'image_url' ? (typeof p.image_url === 'string' ? p.image_url : p.image_url?.url) : p.image_url;
      const detail = p.type === 'image_url' ? p.image_url?.detail : p.detail;
      if (detail === 'low') return 85;
      const size = imageSize(dataUrlBytes(url, where, 96 * 1024), where);
      return openaiImageTokens(size.w, size.h, detail);
    }
    case 'file':
    case 'input_file': {
      const data = p.type === 'file' ? p.file?.file_data : p.file_data;
      // OpenAI puts a PDF in the prompt as each page's extracted text plus an image of the page.
      return pdfPages(dataUrlBytes(data, where, Infinity), where).reduce(
        (n, pg) => n + tok(pg.text) + openaiImageTokens((pg.w * PDF_DPI) / 72, (pg.h * PDF_DPI) / 72, 'high'),
        0,
      );
    }
    default:
      return tok(canonical(p));
  }
}

function dataUrlBytes(/** @type {unknown} */ url, /** @type {string} */ where, /** @type {number} */ limit) {
  if (typeof url !== 'string' || !url.startsWith('data:') || !url.includes(',')) {
    throw new CountError(`${where}: counting: 'bpe' counts only data: URLs (the mock fetches nothing)`);
  }
  const b64 = url.slice(url.indexOf(',') + 1);
  return Buffer.from(Number.isFinite(limit) ? b64.slice(0, limit) : b64, 'base64');
}

// ---- Media headers -----------------------------------------------------------------------

/** Width and height of a PNG, JPEG, GIF or WebP image from its first bytes. */
export function imageSize(/** @type {Buffer} */ d, /** @type {string} */ where = 'image') {
  const bad = () => new CountError(`${where}: could not read the image's size (not a PNG, JPEG, GIF or WebP)`);
  const ok = (/** @type {number} */ w, /** @type {number} */ h) => {
    if (!(w > 0 && h > 0)) throw bad();
    return { w, h };
  };
  if (d.length >= 24 && d.readUInt32BE(0) === 0x89504e47) return ok(d.readUInt32BE(16), d.readUInt32BE(20));
  if (d.length >= 10 && d.toString('latin1', 0, 3) === 'GIF') return ok(d.readUInt16LE(6), d.readUInt16LE(8));
  if (d.length >= 30 && d.toString('latin1', 0, 4) === 'RIFF' && d.toString('latin1', 8, 12) === 'WEBP') {
    const kind = d.toString('latin1', 12, 16);
    if (kind === 'VP8 ') return ok(d.readUInt16LE(26) & 0x3fff, d.readUInt16LE(28) & 0x3fff);
    if (kind === 'VP8L') {
      const bits = d.readUInt32LE(21);
      return ok((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1);
    }
    if (kind === 'VP8X') return ok(d.readUIntLE(24, 3) + 1, d.readUIntLE(27, 3) + 1);
    throw bad();
  }
  if (d.length >= 4 && d[0] === 0xff && d[1] === 0xd8) {
    let i = 2;
    while (i + 9 < d.length) {
      if (d[i] !== 0xff) throw bad();
      const marker = d[i + 1];
      if (marker === 0xff) {
        i++;
        continue;
      }
      if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) return ok(d.readUInt16BE(i + 7), d.readUInt16BE(i + 5));
      i += 2 + d.readUInt16BE(i + 2);
    }
  }
  throw bad();
}

/**
 * The pages of a PDF, in page-tree order: each page's MediaBox (points; inherited, default
 * US letter) and the text its content streams show (`Tj`, `TJ`, `'`, `"`; streams plain or
 * FlateDecode; literal strings taken as Latin-1). Object streams and cross-reference streams
 * are not read: such a PDF is a CountError.
 * @param {Buffer} data
 * @param {string} where
 * @returns {{w: number, h: number, text: string}[]}
 */
export function pdfPages(data, where = 'document') {
  const src = data.toString('latin1');
  if (!src.startsWith('%PDF-')) throw new CountError(`${where}: not a PDF (no %PDF- header)`);
  /** @type {Map<number, {dict: string, stream: Buffer | null}>} */
  const objects = new Map();
  for (const m of src.matchAll(/(\d+)\s+\d+\s+obj\b/g)) {
    const start = /** @type {number} */ (m.index) + m[0].length;
    const end = src.indexOf('endobj', start);
    if (end < 0) break;
    const text = src.slice(start, end);
    const s = text.search(/\bstream\r?\n/);
    let stream = null;
    let dict = text;
    if (s >= 0) {
      dict = text.slice(0, s);
      const bodyStart = start + s + (text.slice(s).startsWith('stream\r\n') ? 8 : 7);
      const len = /\/Length\s+(\d+)(?!\s+\d+\s+R)/.exec(dict);
      const bodyEnd = len ? bodyStart + Number(len[1]) : src.indexOf('endstream', bodyStart);
      stream = data.subarray(bodyStart, bodyEnd);
      if (/\/FlateDecode/.test(dict)) {
        try {
          stream = inflateSync(stream);
        } catch {
          throw new CountError(`${where}: a FlateDecode stream does not inflate`);
        }
      }
    }
    objects.set(Number(m[1]), { dict, stream });
  }
  const ref = (/** @type {string} */ dict, /** @type {string} */ name) => {
    const r = new RegExp(`/${name}\\s+(\\d+)\\s+\\d+\\s+R`).exec(dict);
    return r ? Number(r[1]) : null;
  };
  const box = (/** @type {string} */ dict) => {
    const b = /\/MediaBox\s*\[\s*(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s*\]/.exec(dict);
    return b ? { w: Number(b[3]) - Number(b[1]), h: Number(b[4]) - Number(b[2]) } : null;
  };
  const catalog = [...objects.values()].find((o) => /\/Type\s*\/Catalog\b/.test(o.dict));
  const root = catalog ? ref(catalog.dict, 'Pages') : null;
  /** @type {{w: number, h: number, text: string}[]} */
  const pages = [];
  const seen = new Set();
  const walk = (/** @type {number} */ id, /** @type {{w: number, h: number}} */ inherited) => {
    if (seen.has(id)) throw new CountError(`${where}: the page tree has a cycle`);
    seen.add(id);
    const o = objects.get(id);
    if (!o) throw new CountError(`${where}: the page tree names object ${id}, which is missing`);
    const size = box(o.dict) ?? inherited;
    if (/\/Type\s*\/Pages\b/.test(o.dict)) {
      const kids = /\/Kids\s*\[([^\]]*)\]/.exec(o.dict);
      for (const k of (kids ? kids[1] : '').matchAll(/(\d+)\s+\d+\s+R/g)) walk(Number(k[1]), size);
      return;
    }
    const contents = /\/Contents\s*(\[[^\]]*\]|\d+\s+\d+\s+R)/.exec(o.dict);
    let text = '';
    for (const c of (contents ? contents[1] : '').matchAll(/(\d+)\s+\d+\s+R/g)) {
      const content = objects.get(Number(c[1]));
      if (!content) throw new CountError(`${where}: a page names content object ${c[1]}, which is missing`);
      if (content.stream) text += shownText(content.stream.toString('latin1'));
    }
    pages.push({ w: size.w, h: size.h, text });
  };
  if (root === null) throw new CountError(`${where}: no page tree found (no /Catalog with /Pages; object and cross-reference streams are not read)`);
  walk(root, { w: 612, h: 792 });
  if (pages.length === 0) throw new CountError(`${where}: the PDF has no pages`);
  return pages;
}

/** The text a content stream shows, a newline at each line move or text object end. */
function shownText(/** @type {string} */ s) {
  let out = '';
  const re = /\((?:\\[\s\S]|[^\\)])*\)|\[(?:\((?:\\[\s\S]|[^\\)])*\)|[^\]])*\]\s*TJ|(?<![A-Za-z])(?:Td|TD|T\*|ET)(?![A-Za-z])|'|"/g;
  for (const m of s.matchAll(re)) {
    const t = m[0];
    if (t.startsWith('[')) {
      for (const part of t.matchAll(/\((?:\\[\s\S]|[^\\)])*\)/g)) out += literal(part[0]);
    } else if (t.startsWith('(')) {
      out += literal(t);
    } else if (t !== '"' && t !== "'") {
      if (!out.endsWith('\n') && out.length > 0) out += '\n';
    }
  }
  return out;
}

/** A PDF literal string's characters (escapes resolved). */
function literal(/** @type {string} */ t) {
  return t
    .slice(1, -1)
    .replace(/\\([nrtbf()\\]|[0-7]{1,3}|\r?\n)/g, (_, e) => {
      const map = /** @type {Record<string, string>} */ ({ n: '\n', r: '\r', t: '\t', b: '\b', f: '\f', '(': '(', ')': ')', '\\': '\\' });
      if (e in map) return map[e];
      if (/^[0-7]/.test(e)) return String.fromCharCode(parseInt(e, 8));
      return '';
    });
}
