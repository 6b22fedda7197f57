// The estimate corpus: request sequences shaped as agents send them, generated
// deterministically (a seeded PRNG, no clock, no randomness of the machine). Nothing large
// is committed: `manifest.json` holds each sequence's turn count, body sizes and a digest of
// its bodies, and `node tests/corpus/generate.mjs --check` (or the corpus test) proves the
// generator still produces exactly that. See README.md for the shapes and where they come
// from (a capture of what Claude Code really sends).
//
//   node tests/corpus/generate.mjs            print a summary
//   node tests/corpus/generate.mjs --write    rewrite manifest.json
//   node tests/corpus/generate.mjs --check    exit 1 if the corpus differs from manifest.json
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { deflateSync } from 'node:zlib';

/**
 * @typedef {{atMs: number, body: Record<string, any>}} Turn a request and when it is sent
 *   (virtual ms from the start of the sequence)
 * @typedef {{pattern: string, name: string, provider: 'anthropic' | 'openai', path: string,
 *   turns: Turn[]}} Sequence
 */

/** The patterns, in report order. */
export const PATTERNS = ['claude-code', 'openai-chat-tools', 'responses-codex', 'pdf', 'images', 'cjk-code'];

// ---- deterministic material ---------------------------------------------------------------

/** mulberry32: a small seeded PRNG. */
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  const pick = (xs) => xs[Math.floor(next() * xs.length)];
  return { next, int, pick };
}

const WORDS = (
  'the a of to and in is it that for on with as be this by are or from at not when use your you can each if ' +
  'file command tool output test run change code path working directory user request task before after only ' +
  'prefer always never must should may result error value function module build check read write edit search ' +
  'pattern line number content parameter option default return argument list string object field instead ' +
  'make sure keep first then unless explicitly asked avoid important note example context session agent ' +
  'repository branch commit message review plan step current existing new update remove add replace match ' +
  'configuration permission sandboxed asynchronous background subagent worktree hooks frontmatter idempotent ' +
  'non-interactive explicitly proactively concise verbose markdown JSON YAML regex absolute relative UTF-8 ' +
  'e.g. i.e. etc. 120000ms 2x 4-space CLAUDE.md AGENTS.md package.json Cargo.toml pre-commit CI/CD PR #123 ' +
  'deprecated fallback timeout stdout stderr exit-code lint formatter type-check monorepo refactor'
).split(' ');

const SPANS = ['`git status`', '`npm test`', '`cargo build --release`', '`ls -la`', '`rg TODO`', '`--no-verify`', '`file_path`', '`old_string`', '`run_in_background: true`', '`/tmp/scratch`', '`src/**/*.ts`', '`timeout`'];

/** English-like instruction prose of about `bytes` bytes. */
function prose(r, bytes) {
  let out = '';
  while (out.length < bytes) {
    const n = r.int(8, 22);
    const ws = [];
    for (let i = 0; i < n; i++) ws.push(r.pick(WORDS));
    let s = ws.join(' ');
    s = s[0].toUpperCase() + s.slice(1);
    if (r.next() < 0.15) s = `- ${s}`;
    if (r.next() < 0.1) s = `IMPORTANT: ${s}`;
    if (r.next() < 0.6) s += ` (${r.pick(SPANS)})`;
    if (r.next() < 0.3) s += ` in \`${r.pick(IDENTS)}${r.pick(['_', '/', '.', '::'])}${r.pick(IDENTS)}${r.int(0, 99)}\``;
    if (r.next() < 0.25) s += `, ${r.pick(['for example', 'unless', 'so that', 'which means'])} ${r.pick(SPANS)} ${r.pick(WORDS)} ${r.pick(WORDS)}`;
    if (r.next() < 0.1) s += `: "${r.pick(WORDS)}-${r.pick(WORDS)}"`;
    out += s + (r.next() < 0.2 ? '.\n\n' : r.next() < 0.1 ? ';\n' : '. ');
  }
  return out.slice(0, bytes);
}

const IDENTS = ['config', 'lease', 'pool', 'bucket', 'request', 'handler', 'state', 'queue', 'weight', 'agent', 'token', 'limit', 'usage', 'cache', 'prefix', 'estimate', 'settle', 'retry', 'clock', 'metrics'];

/** Source code of about `bytes` bytes in one of a few languages. */
function code(r, bytes, lang = r.pick(['ts', 'rust', 'py'])) {
  let out = '';
  while (out.length < bytes) {
    const a = r.pick(IDENTS);
    const b = r.pick(IDENTS);
    const n = r.int(0, 9999);
    if (lang === 'ts') {
      out += `export function ${a}${b[0].toUpperCase()}${b.slice(1)}(${a}: ${r.pick(['number', 'string', 'Record<string, unknown>'])}, opts: { ${b}?: number } = {}): number {\n  const limit = opts.${b} ?? ${n}\n  if (${a} === undefined) throw new TypeError('${a} is required')\n  // ${prose(r, 50).replace(/\n/g, ' ')}\n  return Math.min(limit, ${r.int(1, 512)}) * ${r.int(2, 9)}\n}\n\n`;
    } else if (lang === 'rust') {
      out += `/// ${prose(r, 60).replace(/\n/g, ' ')}\npub fn ${a}_${b}(&mut self, ${a}: u64) -> Result<u64, Error> {\n    let ${b} = self.${a}.get(&${a}).copied().unwrap_or(${n});\n    if ${b} > self.limit {\n        return Err(Error::OverLimit { ${a}, ${b} });\n    }\n    Ok(${b}.saturating_mul(${r.int(2, 9)}))\n}\n\n`;
    } else {
      out += `def ${a}_${b}(${a}, ${b}=${n}):\n    """${prose(r, 50).replace(/\n/g, ' ')}"""\n    if ${a} is None:\n        raise ValueError("${a} is required")\n    return min(${b}, ${r.int(1, 512)}) * ${r.int(2, 9)}\n\n`;
    }
  }
  return out.slice(0, bytes);
}

/** Command output: test logs, listings, diffs. */
function commandOutput(r, bytes) {
  const kind = r.pick(['test', 'ls', 'diff', 'grep', 'build']);
  let out = '';
  let i = 0;
  while (out.length < bytes) {
    i++;
    const f = `${r.pick(['src', 'core/src', 'driver/ts', 'tests'])}/${r.pick(IDENTS)}.${r.pick(['rs', 'ts', 'py'])}`;
    if (kind === 'test') out += `test ${r.pick(IDENTS)}::${r.pick(IDENTS)}_${r.pick(IDENTS)} ... ${r.next() < 0.93 ? 'ok' : 'FAILED'}\n`;
    else if (kind === 'ls') out += `-rw-r--r--  1 dev dev ${String(r.int(120, 99999)).padStart(6)} Dec  ${r.int(1, 9)} 1${r.int(0, 9)}:${r.int(10, 59)} ${r.pick(IDENTS)}_${i}.${r.pick(['rs', 'ts', 'md', 'json'])}\n`;
    else if (kind === 'diff') out += `@@ -${i * 10},7 +${i * 10},8 @@\n-    let ${r.pick(IDENTS)} = ${r.int(0, 99)};\n+    let ${r.pick(IDENTS)} = ${r.int(0, 99)}.max(1);\n     ${code(r, 60, 'rust').split('\n')[0]}\n`;
    else if (kind === 'grep') out += `${f}:${r.int(1, 900)}:    ${code(r, 70).split('\n')[0]}\n`;
    else out += `   Compiling ${r.pick(IDENTS)}-${r.pick(IDENTS)} v0.${r.int(1, 9)}.${r.int(0, 20)}\n${r.next() < 0.1 ? `warning: unused variable: \`${r.pick(IDENTS)}\`\n  --> ${f}:${r.int(1, 400)}:9\n` : ''}`;
  }
  return out.slice(0, bytes);
}

const CJK = [
  '请先阅读配置文件，然后检查每个代理的速率限制。',
  '这个函数在缓存过期之前返回估计的令牌数量。',
  '测试失败的原因是队列中的权重没有更新。',
  'ファイルを読み込んでから、テストを実行してください。',
  'キャッシュの有効期限が切れると、入力トークンがすべて課金されます。',
  'エージェントは同じキーを共有しているため、制限に達しやすい。',
  '이 요청은 캐시된 접두사를 읽고 나머지를 기록합니다.',
  '모든 에이전트가 같은 시간에 모델을 호출합니다.',
];

function cjk(r, bytes) {
  let out = '';
  while (Buffer.byteLength(out) < bytes) out += r.pick(CJK) + (r.next() < 0.2 ? '\n' : '');
  return out;
}

/** A JSON-schema property of a given kind, with a description. */
function prop(r, type, extra = {}) {
  return { description: prose(r, r.int(40, 140)).replace(/\n/g, ' ').trim(), type, ...extra };
}

/** A tool with a description and schema of about the given sizes (Anthropic shape). */
function anthropicTool(r, name, descBytes, props) {
  const properties = {};
  for (const [k, type, extra] of props) properties[k] = prop(r, type, extra);
  return {
    name,
    description: prose(r, descBytes),
    input_schema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      properties,
      required: props.filter((p) => p[3]).map((p) => p[0]),
      additionalProperties: false,
    },
  };
}

// ---- media ---------------------------------------------------------------------------------

const CRC = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();
function crc32(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = CRC[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function chunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, 'latin1'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}

/** A valid PNG (8-bit greyscale, a gradient with bands) of the given size. */
export function png(w, h, seed = 1) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 0; // greyscale
  const raw = Buffer.alloc((w + 1) * h);
  for (let y = 0; y < h; y++) {
    const row = y * (w + 1);
    raw[row] = 0; // filter: none
    for (let x = 0; x < w; x++) raw[row + 1 + x] = ((x >> 4) + (y >> 5) * seed) & 0xff;
  }
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

/**
 * A JPEG's structure with the given size: SOI, JFIF APP0, a quantisation table, SOF0, a
 * Huffman table, SOS with a little scan data, EOI (enough for every size reader; its pixels
 * are not meant to be decoded).
 */
export function jpeg(w, h) {
  const seg = (marker, data) => Buffer.concat([Buffer.from([0xff, marker, (data.length + 2) >> 8, (data.length + 2) & 0xff]), data]);
  const app0 = seg(0xe0, Buffer.from([0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x01, 0x00, 0x00, 0x48, 0x00, 0x48, 0x00, 0x00]));
  const dqt = seg(0xdb, Buffer.concat([Buffer.from([0x00]), Buffer.alloc(64, 1)]));
  const sof = seg(0xc0, Buffer.from([0x08, h >> 8, h & 0xff, w >> 8, w & 0xff, 0x01, 0x01, 0x11, 0x00]));
  const dht = seg(0xc4, Buffer.concat([Buffer.from([0x00]), Buffer.from([0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Buffer.from([0])]));
  const sos = seg(0xda, Buffer.from([0x01, 0x01, 0x00, 0x00, 0x3f, 0x00]));
  return Buffer.concat([Buffer.from([0xff, 0xd8]), app0, dqt, sof, dht, sos, Buffer.alloc(256, 0), Buffer.from([0xff, 0xd9])]);
}

/** A valid multi-page PDF (US letter, Helvetica), one text per page, with an xref table. */
export function pdf(pages) {
  const objs = [];
  const n = pages.length;
  objs.push('<< /Type /Catalog /Pages 2 0 R >>');
  objs.push(`<< /Type /Pages /Kids [${pages.map((_, i) => `${4 + 2 * i} 0 R`).join(' ')}] /Count ${n} /MediaBox [0 0 612 792] >>`);
  objs.push('<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>');
  pages.forEach((text) => {
    const id = 4 + objs.length - 3;
    const lines = text.split('\n').map((l) => `(${l.replace(/([()\\])/g, '\\$1')}) Tj T*`);
    const content = `BT /F1 10 Tf 12 TL 54 740 Td\n${lines.join('\n')}\nET`;
    objs.push(`<< /Type /Page /Parent 2 0 R /Resources << /Font << /F1 3 0 R >> >> /Contents ${id + 1} 0 R >>`);
    objs.push(`<< /Length ${Buffer.byteLength(content, 'latin1')} >>\nstream\n${content}\nendstream`);
  });
  let out = '%PDF-1.4\n';
  const offsets = [];
  objs.forEach((o, i) => {
    offsets.push(Buffer.byteLength(out, 'latin1'));
    out += `${i + 1} 0 obj\n${o}\nendobj\n`;
  });
  const xref = Buffer.byteLength(out, 'latin1');
  out += `xref\n0 ${objs.length + 1}\n0000000000 65535 f \n${offsets.map((o) => `${String(o).padStart(10, '0')} 00000 n \n`).join('')}`;
  out += `trailer\n<< /Size ${objs.length + 1} /Root 1 0 R >>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(out, 'latin1');
}

/** Dense text for a PDF page: lines of at most 95 characters, ~3 KB. */
function pageText(r, bytes) {
  const words = prose(r, bytes).replace(/\n+/g, ' ').split(' ');
  const lines = [];
  let line = '';
  for (const w of words) {
    if ((line + ' ' + w).length > 95) {
      lines.push(line);
      line = w;
    } else line = line ? `${line} ${w}` : w;
  }
  if (line) lines.push(line);
  return lines.slice(0, 60).join('\n');
}

// ---- (a) Claude-Code-like ------------------------------------------------------------------

/** The tool list, modelled on the capture: 12 tools, ~31 KB, one deferred, none cached. */
function claudeTools(r) {
  return [
    anthropicTool(r, 'Agent', 4300, [['description', 'string', {}, true], ['prompt', 'string', {}, true], ['subagent_type', 'string'], ['model', 'string', { enum: ['sonnet', 'opus', 'haiku'] }], ['run_in_background', 'boolean']]),
    anthropicTool(r, 'Bash', 3000, [['command', 'string', {}, true], ['timeout', 'number'], ['description', 'string'], ['run_in_background', 'boolean']]),
    anthropicTool(r, 'Edit', 360, [['file_path', 'string', {}, true], ['old_string', 'string', {}, true], ['new_string', 'string', {}, true], ['replace_all', 'boolean', { default: false }]]),
    anthropicTool(r, 'Glob', 600, [['pattern', 'string', {}, true], ['path', 'string']]),
    anthropicTool(r, 'Grep', 1400, [['pattern', 'string', {}, true], ['path', 'string'], ['glob', 'string'], ['output_mode', 'string', { enum: ['content', 'files_with_matches', 'count'] }], ['-n', 'boolean'], ['head_limit', 'number']]),
    anthropicTool(r, 'Read', 790, [['file_path', 'string', {}, true], ['offset', 'number'], ['limit', 'number'], ['pages', 'string']]),
    anthropicTool(r, 'Write', 240, [['file_path', 'string', {}, true], ['content', 'string', {}, true]]),
    anthropicTool(r, 'TodoWrite', 2600, [['todos', 'array', { items: { type: 'object', properties: { content: { type: 'string' }, status: { type: 'string', enum: ['pending', 'in_progress', 'completed'] } }, required: ['content', 'status'] } }, true]]),
    anthropicTool(r, 'WebFetch', 900, [['url', 'string', { format: 'uri' }, true], ['prompt', 'string', {}, true]]),
    anthropicTool(r, 'ScheduleWakeup', 4000, [['delaySeconds', 'number'], ['reason', 'string'], ['prompt', 'string']]),
    anthropicTool(r, 'Workflow', 4700, [['script', 'string'], ['name', 'string'], ['args', 'object', { additionalProperties: { type: 'string' } }], ['resumeFromRunId', 'string']]),
    anthropicTool(r, 'ToolSearch', 950, [['query', 'string', {}, true], ['max_results', 'number']]),
    { name: 'DeferredToolPlaceholder', description: 'Reserved placeholder that keeps deferred tool loading active; never call this tool.', input_schema: { type: 'object', properties: {} }, defer_loading: true },
  ];
}

function claudeSession(seed, turns, pauseAt) {
  const r = rng(seed);
  const tools = claudeTools(rng(7)); // one tool list for the whole fleet
  const system = [
    { type: 'text', text: 'x-agent-billing-header: cc_version=2.1.332.407; cc_entrypoint=sdk-cli;' },
    { type: 'text', text: 'You are a coding agent, built on an agent SDK.', cache_control: { type: 'ephemeral' } },
    { type: 'text', text: `\n${prose(rng(8), 7000)}`, cache_control: { type: 'ephemeral' } },
  ];
  const env = `# Environment\nYou have been invoked in the following environment:\n - Primary working directory: /work/repo-${seed}\n - Is a git repository: true\n - Platform: linux\n${prose(r, 9100)}`;
  const messages = [
    { role: 'user', content: [{ type: 'text', text: `<system-reminder>\n${prose(r, 560)}\n</system-reminder>\n` }, { type: 'text', text: prose(r, r.int(60, 400)) }] },
    { role: 'system', content: [{ type: 'text', text: env }] },
  ];
  const body = () => ({
    model: 'claude-opus-5-5',
    messages: structuredClone(messages),
    system,
    tools,
    metadata: { user_id: `{"device_id":"${createHash('sha256').update(String(seed)).digest('hex')}","session_id":"s-${seed}"}` },
    max_tokens: 128000,
    thinking: { type: 'adaptive', display: 'omitted' },
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
    output_config: { effort: 'medium' },
    stream: true,
  });
  /** The rolling breakpoint: on the last block of the newest message, nowhere else in messages. */
  const roll = (b) => {
    for (const m of b.messages) {
      if (Array.isArray(m.content)) for (const blk of m.content) delete blk.cache_control;
    }
    const last = b.messages.at(-1);
    if (typeof last.content === 'string') last.content = [{ type: 'text', text: last.content }];
    last.content.at(-1).cache_control = { type: 'ephemeral' };
    return b;
  };
  const out = [];
  let at = 0;
  for (let t = 0; t < turns; t++) {
    out.push({ atMs: at, body: roll(body()) });
    // After the first call the environment message is sent as a string (as in the capture).
    if (t === 0) messages[1] = { role: 'system', content: env };
    // The model's turn: sometimes a thought, always a tool call; then its result.
    const id = `toolu_${seed}_${t}`;
    const tool = r.pick(['Bash', 'Read', 'Read', 'Grep', 'Edit', 'Bash', 'Glob', 'TodoWrite']);
    const content = [];
    if (r.next() < 0.5) content.push({ type: 'thinking', thinking: prose(r, r.int(200, 900)), signature: Buffer.from(prose(r, 240)).toString('base64') });
    if (r.next() < 0.4) content.push({ type: 'text', text: prose(r, r.int(40, 300)) });
    let input;
    let result;
    if (tool === 'Bash') {
      input = { command: r.pick(['cargo test -p core 2>&1 | tail -40', 'npm test', 'git diff --stat', 'ls -la src', 'rg -n "fn settle" core/src']), description: prose(r, 40).trim() };
      result = commandOutput(r, r.int(400, 6000));
    } else if (tool === 'Read') {
      input = { file_path: `/work/repo-${seed}/src/${r.pick(IDENTS)}.${r.pick(['ts', 'rs', 'py'])}` };
      const src = code(r, r.int(1500, 9000));
      result = src.split('\n').map((l, i) => `${String(i + 1).padStart(6)}\t${l}`).join('\n');
    } else if (tool === 'Grep') {
      input = { pattern: r.pick(IDENTS), path: 'src', output_mode: 'content', '-n': true };
      result = commandOutput(r, r.int(300, 2500));
    } else if (tool === 'Edit') {
      const old = code(r, r.int(80, 400));
      input = { file_path: `/work/repo-${seed}/src/${r.pick(IDENTS)}.ts`, old_string: old, new_string: old.replace(/\d+/, String(r.int(1, 99))) };
      result = `The file /work/repo-${seed}/src/${r.pick(IDENTS)}.ts has been updated. Here's the result of running \`cat -n\` on a snippet of the edited file:\n${code(r, r.int(300, 1200))}`;
    } else if (tool === 'Glob') {
      input = { pattern: '**/*.ts' };
      result = Array.from({ length: r.int(5, 40) }, () => `/work/repo-${seed}/src/${r.pick(IDENTS)}/${r.pick(IDENTS)}.ts`).join('\n');
    } else {
      input = { todos: Array.from({ length: r.int(2, 6) }, () => ({ content: prose(r, 50).trim(), status: r.pick(['pending', 'in_progress', 'completed']) })) };
      result = 'Todos have been modified successfully. Ensure that you continue to use the todo list to track your progress.';
    }
    content.push({ type: 'tool_use', id, name: tool, input });
    messages.push({ role: 'assistant', content });
    const userContent = [{ tool_use_id: id, type: 'tool_result', content: result, is_error: false }];
    if (r.next() < 0.15) userContent.push({ type: 'text', text: `<system-reminder>\n${prose(r, 300)}\n</system-reminder>` });
    messages.push({ role: 'user', content: userContent });
    at += t + 1 === pauseAt ? 6 * 60_000 : r.int(4_000, 45_000);
  }
  return out;
}

// ---- (b) OpenAI chat with tools -------------------------------------------------------------

function openaiFunction(r, name, descBytes, props) {
  const properties = {};
  for (const [k, type] of props) properties[k] = prop(r, type);
  return { type: 'function', function: { name, description: prose(r, descBytes), parameters: { type: 'object', properties, required: [props[0][0]], additionalProperties: false } } };
}

function openaiChatSession(seed, turns, pauseAt) {
  const r = rng(seed);
  const tr = rng(11);
  const tools = [
    openaiFunction(tr, 'read_file', 500, [['path', 'string'], ['start_line', 'integer'], ['end_line', 'integer']]),
    openaiFunction(tr, 'write_file', 400, [['path', 'string'], ['content', 'string']]),
    openaiFunction(tr, 'run_command', 900, [['command', 'string'], ['timeout_ms', 'integer']]),
    openaiFunction(tr, 'search_code', 600, [['query', 'string'], ['glob', 'string']]),
    openaiFunction(tr, 'list_directory', 300, [['path', 'string']]),
    openaiFunction(tr, 'apply_diff', 800, [['path', 'string'], ['diff', 'string']]),
  ];
  const messages = [
    { role: 'system', content: prose(rng(12), 3500) },
    { role: 'user', content: prose(r, r.int(100, 600)) },
  ];
  const out = [];
  let at = 0;
  for (let t = 0; t < turns; t++) {
    out.push({ atMs: at, body: { model: 'gpt-4.1', messages: structuredClone(messages), tools, tool_choice: 'auto', stream: true, stream_options: { include_usage: true }, max_completion_tokens: 8192 } });
    const calls = Array.from({ length: r.next() < 0.25 ? 2 : 1 }, (_, k) => {
      const name = r.pick(['read_file', 'run_command', 'search_code', 'list_directory', 'apply_diff']);
      const args = name === 'read_file' ? { path: `src/${r.pick(IDENTS)}.py` } : name === 'run_command' ? { command: r.pick(['pytest -q', 'git status', 'make lint']) } : name === 'apply_diff' ? { path: `src/${r.pick(IDENTS)}.py`, diff: commandOutput(r, r.int(200, 800)) } : { query: r.pick(IDENTS), path: '.' };
      return { id: `call_${seed}_${t}_${k}`, type: 'function', function: { name, arguments: JSON.stringify(args) } };
    });
    messages.push({ role: 'assistant', content: r.next() < 0.3 ? prose(r, r.int(40, 250)) : null, tool_calls: calls });
    for (const c of calls) {
      const name = c.function.name;
      const content = name === 'read_file' ? code(r, r.int(800, 7000), 'py') : name === 'apply_diff' ? 'Applied.' : commandOutput(r, r.int(200, 4000));
      messages.push({ role: 'tool', tool_call_id: c.id, content });
    }
    if (r.next() < 0.2) messages.push({ role: 'user', content: prose(r, r.int(50, 300)) });
    at += t + 1 === pauseAt ? 11 * 60_000 : r.int(3_000, 30_000);
  }
  return out;
}

// ---- (c) Responses API, Codex-like ---------------------------------------------------------

function responsesSession(seed, turns, pauseAt) {
  const r = rng(seed);
  const tr = rng(21);
  const fn = (name, descBytes, parameters) => ({ type: 'function', name, description: prose(tr, descBytes), strict: false, parameters });
  const tools = [
    fn('shell', 700, { type: 'object', properties: { command: { type: 'array', items: { type: 'string' }, description: 'The command to execute' }, workdir: { type: 'string' }, timeout_ms: { type: 'number' } }, required: ['command'], additionalProperties: false }),
    fn('apply_patch', 2400, { type: 'object', properties: { input: { type: 'string', description: 'The entire contents of the apply_patch command' } }, required: ['input'], additionalProperties: false }),
    fn('update_plan', 500, { type: 'object', properties: { explanation: { type: 'string' }, plan: { type: 'array', items: { type: 'object', properties: { step: { type: 'string' }, status: { type: 'string' } }, required: ['step', 'status'] } } }, required: ['plan'], additionalProperties: false }),
    fn('view_image', 200, { type: 'object', properties: { path: { type: 'string' } }, required: ['path'], additionalProperties: false }),
  ];
  const instructions = prose(rng(22), 11000);
  const input = [
    { type: 'message', role: 'developer', content: [{ type: 'input_text', text: `<permissions instructions>\n${prose(r, 1200)}\n</permissions instructions>` }] },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: `# AGENTS.md instructions for /work/repo-${seed}\n\n<INSTRUCTIONS>\n${prose(r, 2500)}\n</INSTRUCTIONS>` }, { type: 'input_text', text: `<environment_context>\n  <cwd>/work/repo-${seed}</cwd>\n  <shell>bash</shell>\n</environment_context>` }] },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: prose(r, r.int(80, 500)) }] },
  ];
  const out = [];
  let at = 0;
  for (let t = 0; t < turns; t++) {
    out.push({
      atMs: at,
      body: { model: 'gpt-5-codex', instructions, input: structuredClone(input), tools, tool_choice: 'auto', parallel_tool_calls: false, reasoning: { effort: 'medium', summary: 'auto' }, store: false, stream: true, include: ['reasoning.encrypted_content'], prompt_cache_key: `session-${seed}` },
    });
    input.push({ type: 'reasoning', summary: r.next() < 0.6 ? [{ type: 'summary_text', text: `**${prose(r, 30).trim()}**\n\n${prose(r, r.int(80, 400))}` }] : [], content: null, encrypted_content: Buffer.from(prose(r, r.int(600, 2400))).toString('base64') });
    const patch = r.next() < 0.25;
    const call = `call_${seed}_${t}`;
    const args = patch
      ? { input: `*** Begin Patch\n*** Update File: src/${r.pick(IDENTS)}.rs\n@@\n${commandOutput(r, r.int(300, 1500))}\n*** End Patch` }
      : { command: ['bash', '-lc', r.pick(['cargo test 2>&1 | tail -30', 'rg -n settle src', 'sed -n 1,200p src/lib.rs', 'git status --short'])], workdir: `/work/repo-${seed}` };
    input.push({ type: 'function_call', name: patch ? 'apply_patch' : 'shell', arguments: JSON.stringify(args), call_id: call });
    const outText = patch ? 'Success. Updated the following files:\nM src/lib.rs\n' : r.next() < 0.5 ? code(r, r.int(1000, 8000), 'rust') : commandOutput(r, r.int(300, 5000));
    input.push({ type: 'function_call_output', call_id: call, output: JSON.stringify({ output: outText, metadata: { exit_code: 0, duration_seconds: Number((r.next() * 3).toFixed(1)) } }) });
    at += t + 1 === pauseAt ? 12 * 60_000 : r.int(3_000, 40_000);
  }
  return out;
}

// ---- (d) a PDF document ---------------------------------------------------------------------

function pdfSession(seed, pages, followUps) {
  const r = rng(seed);
  const doc = pdf(Array.from({ length: pages }, () => pageText(r, 3300)));
  const messages = [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: doc.toString('base64') } }, { type: 'text', text: prose(r, 200) }] }];
  const out = [];
  let at = 0;
  for (let t = 0; t <= followUps; t++) {
    const body = { model: 'claude-sonnet-4-5', max_tokens: 4096, system: [{ type: 'text', text: prose(rng(31), 1500) }], messages: structuredClone(messages) };
    const last = body.messages.at(-1).content;
    last[last.length - 1].cache_control = { type: 'ephemeral' };
    out.push({ atMs: at, body });
    messages.push({ role: 'assistant', content: [{ type: 'text', text: prose(r, r.int(300, 1500)) }] });
    messages.push({ role: 'user', content: [{ type: 'text', text: prose(r, r.int(50, 300)) }] });
    at += r.int(10_000, 90_000);
  }
  return out;
}

// ---- (e) images -----------------------------------------------------------------------------

const SIZES = [[1440, 900], [1920, 1080], [800, 600], [200, 200], [3024, 4032], [1280, 720]];

function anthropicImageSession(seed, turns) {
  const r = rng(seed);
  const messages = [];
  const out = [];
  let at = 0;
  for (let t = 0; t < turns; t++) {
    const [w, h] = SIZES[(seed + t) % SIZES.length];
    const jpg = t % 2 === 1;
    const data = (jpg ? jpeg(w, h) : png(w, h, seed + t)).toString('base64');
    messages.push({ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: jpg ? 'image/jpeg' : 'image/png', data } }, { type: 'text', text: prose(r, r.int(60, 300)) }] });
    const body = { model: 'claude-sonnet-4-5', max_tokens: 2048, system: prose(rng(41), 1200), messages: structuredClone(messages) };
    body.messages.at(-1).content.at(-1).cache_control = { type: 'ephemeral' };
    out.push({ atMs: at, body });
    messages.push({ role: 'assistant', content: [{ type: 'text', text: prose(r, r.int(200, 900)) }] });
    at += r.int(5_000, 60_000);
  }
  return out;
}

function openaiImageSession(seed, turns) {
  const r = rng(seed);
  const messages = [{ role: 'system', content: prose(rng(42), 1200) }];
  const out = [];
  let at = 0;
  for (let t = 0; t < turns; t++) {
    const [w, h] = SIZES[(seed + t) % SIZES.length];
    const jpg = t % 2 === 0;
    const detail = ['auto', 'high', 'low'][t % 3];
    const url = `data:${jpg ? 'image/jpeg' : 'image/png'};base64,${(jpg ? jpeg(w, h) : png(w, h, seed + t)).toString('base64')}`;
    messages.push({ role: 'user', content: [{ type: 'text', text: prose(r, r.int(60, 300)) }, { type: 'image_url', image_url: { url, detail } }] });
    out.push({ atMs: at, body: { model: 'gpt-4o', messages: structuredClone(messages), max_tokens: 2048, stream: true, stream_options: { include_usage: true } } });
    messages.push({ role: 'assistant', content: prose(r, r.int(200, 900)) });
    at += r.int(5_000, 60_000);
  }
  return out;
}

// ---- (f) CJK and code-heavy -----------------------------------------------------------------

function cjkCodeSession(seed, provider, turns) {
  const r = rng(seed);
  const sys = `${prose(rng(51), 600)}\n${cjk(rng(52), 1500)}`;
  const messages = [];
  const out = [];
  let at = 0;
  for (let t = 0; t < turns; t++) {
    const text = t % 3 === 0 ? cjk(r, r.int(600, 3000)) : t % 3 === 1 ? code(r, r.int(1500, 6000)) : `${cjk(r, r.int(300, 1200))}\n\`\`\`ts\n${code(r, r.int(800, 3000), 'ts')}\n\`\`\``;
    messages.push({ role: 'user', content: text });
    if (provider === 'anthropic') {
      const body = { model: 'claude-sonnet-4-5', max_tokens: 8192, system: [{ type: 'text', text: sys, cache_control: { type: 'ephemeral' } }], messages: structuredClone(messages) };
      const last = body.messages.at(-1);
      last.content = [{ type: 'text', text: last.content, cache_control: { type: 'ephemeral' } }];
      out.push({ atMs: at, body });
    } else {
      out.push({ atMs: at, body: { model: 'gpt-4.1', messages: [{ role: 'system', content: sys }, ...structuredClone(messages)], max_completion_tokens: 8192 } });
    }
    messages.push({ role: 'assistant', content: t % 2 === 0 ? cjk(r, r.int(300, 1500)) : code(r, r.int(500, 2500)) });
    at += r.int(5_000, 60_000);
  }
  return out;
}

// ---- the corpus -----------------------------------------------------------------------------

/** Every sequence, in a fixed order. @returns {Sequence[]} */
export function generateCorpus() {
  /** @type {Sequence[]} */
  const seqs = [];
  const add = (pattern, name, provider, path, turns) => seqs.push({ pattern, name, provider, path, turns });
  for (const [seed, pause] of [[101, 12], [102, 0], [103, 17], [104, 8]]) add('claude-code', `claude-code-${seed}`, 'anthropic', '/v1/messages?beta=true', claudeSession(seed, 24, pause));
  for (const [seed, pause] of [[201, 10], [202, 0], [203, 14]]) add('openai-chat-tools', `openai-chat-${seed}`, 'openai', '/v1/chat/completions', openaiChatSession(seed, 20, pause));
  for (const [seed, pause] of [[301, 9], [302, 0], [303, 15]]) add('responses-codex', `responses-${seed}`, 'openai', '/v1/responses', responsesSession(seed, 20, pause));
  for (const [seed, pages] of [[401, 2], [402, 6], [403, 12]]) add('pdf', `pdf-${seed}-${pages}p`, 'anthropic', '/v1/messages', pdfSession(seed, pages, 4));
  for (const seed of [501, 502]) add('images', `images-anthropic-${seed}`, 'anthropic', '/v1/messages', anthropicImageSession(seed, 6));
  for (const seed of [511, 512]) add('images', `images-openai-${seed}`, 'openai', '/v1/chat/completions', openaiImageSession(seed, 6));
  add('cjk-code', 'cjk-code-anthropic-601', 'anthropic', '/v1/messages', cjkCodeSession(601, 'anthropic', 12));
  add('cjk-code', 'cjk-code-openai-602', 'openai', '/v1/chat/completions', cjkCodeSession(602, 'openai', 12));
  return seqs;
}

/** The manifest of a corpus: per sequence its turns, first and last body size, a digest. */
export function manifestOf(seqs) {
  return {
    note: 'Generated by tests/corpus/generate.mjs; `node tests/corpus/generate.mjs --check` verifies it.',
    sequences: seqs.map((s) => {
      const h = createHash('sha256');
      const sizes = s.turns.map((t) => {
        const json = JSON.stringify(t.body);
        h.update(`${t.atMs}\n${json}\n`);
        return Buffer.byteLength(json);
      });
      return { name: s.name, pattern: s.pattern, provider: s.provider, path: s.path, turns: s.turns.length, firstBodyBytes: sizes[0], lastBodyBytes: sizes.at(-1), sha256: h.digest('hex') };
    }),
  };
}

export const MANIFEST_PATH = new URL('./manifest.json', import.meta.url);

if (import.meta.url === `file://${process.argv[1]}`) {
  const manifest = manifestOf(generateCorpus());
  const mode = process.argv[2];
  if (mode === '--write') {
    writeFileSync(MANIFEST_PATH, `${JSON.stringify(manifest, null, 2)}\n`);
    console.log(`wrote ${manifest.sequences.length} sequences to tests/corpus/manifest.json`);
  } else if (mode === '--check') {
    const want = JSON.parse(readFileSync(MANIFEST_PATH, 'utf8'));
    const same = JSON.stringify(want) === JSON.stringify(manifest);
    console.log(same ? 'corpus matches manifest.json' : 'corpus differs from manifest.json');
    process.exit(same ? 0 : 1);
  } else {
    for (const s of manifest.sequences) console.log(`${s.name.padEnd(28)} ${String(s.turns).padStart(3)} turns  first ${s.firstBodyBytes} B  last ${s.lastBodyBytes} B`);
  }
}
