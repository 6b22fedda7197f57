/**
 * Counting an OpenAI prompt with the model's own tokenizer: which encoding a model uses,
 * where the tokenizer comes from (the provider crate's byte-pair tokenizer, through the
 * engine package in use: see {@link useTokenizers}), and the published rules for what a
 * request adds around its text (per message, the reply priming, tool definitions).
 */

/** The byte-pair encodings of OpenAI's current models. */
export type OpenAIEncoding = 'o200k_base' | 'cl100k_base'

/** Counts the tokens of a text (special-token strings in it are ordinary text, as the API takes them). */
export type CountText = (text: string) => number

/**
 * The encoding of an OpenAI model, by its name as the API takes it: `cl100k_base` for
 * GPT-4 (`gpt-4`, `gpt-4-turbo`, `gpt-4-32k`, dated `gpt-4-…`), GPT-3.5 (`gpt-3.5-…`,
 * Azure's `gpt-35-…`) and the embedding models `text-embedding-ada-002` and
 * `text-embedding-3-*`; `o200k_base` for everything else: GPT-4o, GPT-4.1, GPT-4.5, GPT-5
 * and later, the o-series (`o1`, `o3`, `o4-mini`), the codex models, and any model not
 * known (new models have used o200k since GPT-4o). A fine-tuned model (`ft:<base>:…`) uses
 * its base model's; `gpt-oss` uses o200k_harmony, which counts ordinary text as o200k_base.
 */
export function openaiEncoding(model: string): OpenAIEncoding {
  let m = model.trim().toLowerCase()
  if (m.startsWith('ft:')) m = m.slice(3)
  // A provider prefix some gateways put before the model (`openai/gpt-4o`).
  const slash = m.lastIndexOf('/')
  if (slash >= 0) m = m.slice(slash + 1)
  if (/^gpt-4(-|$)/.test(m)) return 'cl100k_base'
  if (/^gpt-3\.5|^gpt-35/.test(m)) return 'cl100k_base'
  if (m === 'text-embedding-ada-002' || m.startsWith('text-embedding-3')) return 'cl100k_base'
  return 'o200k_base'
}

/**
 * Where an encoding's counter comes from: the engine package's tokenizer (the provider
 * crate's, in the native addon or the `.wasm`, its ranks loaded when first asked for).
 */
export type TokenizerSource = (encoding: OpenAIEncoding) => CountText | Promise<CountText>

let source: TokenizerSource | null = null

interface Loading {
  counter: CountText | null
  promise: Promise<CountText>
  error: unknown
}

const loading = new Map<OpenAIEncoding, Loading>()

/**
 * Sets where tokenizers come from. The engine packages call it when they are imported
 * (`tokenwarden`: the native addon's, else the wasm build's; `tokenwarden-wasm`: its own),
 * so a `DefaultEstimator` counts with the tokenizer that ships beside the engine. With
 * `replace` false, only when none is set yet (the wasm package's own, under the native
 * package that loaded it as its fallback). Counters already loaded stay; one that failed is
 * tried again from the new source.
 */
export function useTokenizers(s: TokenizerSource, replace = true): void {
  if (typeof s !== 'function') throw new TypeError('useTokenizers needs a function from an encoding to its counter')
  if (!replace && source !== null) return
  source = s
  for (const [encoding, l] of loading) if (l.counter === null) loading.delete(encoding)
}

/** The most text tokenized per string; beyond it the count is extrapolated (see {@link bounded}). */
const MAX_TOKENIZED = 1 << 20

/**
 * A counter whose cost is bounded whatever a caller sends: runs without whitespace longer
 * than `maxRun` characters are cut and counted apart (about a token more per cut; the
 * tokenizer itself merges a long run in O(n log n), so an OpenAI count cuts none, and only
 * the Anthropic proxy does, on purpose), and past `maxTokenized` characters (default
 * {@link MAX_TOKENIZED}) the rest is counted at the rate of the first part. Below both
 * bounds the count is the tokenizer's, exactly.
 */
export function bounded(count: CountText, maxRun = Number.POSITIVE_INFINITY, maxTokenized = MAX_TOKENIZED): CountText {
  const runs: CountText = (s) => {
    let run = 0
    let from = 0
    let n = 0
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i)
      if (c === 32 || c === 10 || c === 9 || c === 13) {
        run = 0
        continue
      }
      if (++run >= maxRun) {
        n += count(s.slice(from, i + 1))
        from = i + 1
        run = 0
      }
    }
    return from === 0 ? count(s) : n + (from < s.length ? count(s.slice(from)) : 0)
  }
  const whole = maxRun === Number.POSITIVE_INFINITY ? count : runs
  return (s) => {
    if (s.length <= maxTokenized) return whole(s)
    const head = whole(s.slice(0, maxTokenized))
    return Math.ceil((head * s.length) / maxTokenized)
  }
}

/**
 * The encoding's counter, loading it the first time (one load per process, shared by every
 * caller). Rejects when no tokenizer can be had (no engine package has registered its
 * tokenizers, or its ranks cannot be loaded): the failure is remembered, see
 * {@link tokenizerState}.
 */
export function loadTokenizer(encoding: OpenAIEncoding): Promise<CountText> {
  const known = loading.get(encoding)
  if (known !== undefined) return known.promise
  const entry: Loading = { counter: null, promise: Promise.resolve(null as unknown as CountText), error: undefined }
  const from = source
  entry.promise = (async () => {
    if (from === null) throw new Error("no tokenizer: import the engine package ('tokenwarden' or 'tokenwarden-wasm'), whose tokenizer the estimator counts with")
    return from(encoding)
  })().then(
    (count) => {
      if (typeof count !== 'function') throw new TypeError(`the ${encoding} tokenizer is not a counting function`)
      const counter: CountText = bounded(count)
      entry.counter = counter
      return counter
    },
    (e: unknown) => {
      entry.error = e
      throw e
    },
  )
  // The failure is the caller's to see; an unobserved one is not an unhandled rejection.
  entry.promise.catch(() => {})
  loading.set(encoding, entry)
  return entry.promise
}

/**
 * Where an encoding's tokenizer stands: `ready` with its counter (then counting is
 * synchronous), `loading`, `failed` with the error, or `unloaded`.
 */
export function tokenizerState(encoding: OpenAIEncoding): { state: 'ready'; counter: CountText } | { state: 'loading' | 'unloaded' } | { state: 'failed'; error: unknown } {
  const l = loading.get(encoding)
  if (l === undefined) return { state: 'unloaded' }
  if (l.counter !== null) return { state: 'ready', counter: l.counter }
  if (l.error !== undefined) return { state: 'failed', error: l.error }
  return { state: 'loading' }
}

// ---- What a request adds around its text ------------------------------------------------

/**
 * Per message, and for the reply, by OpenAI's published rule (the OpenAI Cookbook, "How to
 * count tokens with tiktoken", section 6, `num_tokens_from_messages`, for gpt-3.5-turbo,
 * gpt-4, gpt-4o and gpt-4o-mini): 3 tokens per message, the tokens of each of its string
 * fields (role, content, name), 1 more for a `name`, and 3 for the reply's priming
 * (`<|start|>assistant<|message|>`). The cookbook's figures match the API's (129 tokens on
 * cl100k, 124 on o200k for its example; tested).
 */
const TOKENS_PER_MESSAGE = 3
const TOKENS_PER_NAME = 1
const REPLY_PRIMING = 3

/**
 * Tool definitions, by the same cookbook's section 7 (`num_tokens_for_tools`): per function
 * 7 tokens on o200k (gpt-4o), 10 on cl100k (gpt-3.5, gpt-4), plus `name:description`
 * (a final `.` dropped); 3 if it has properties, then per property 3 plus
 * `key:type:description`; an enum −3 plus 3 and its tokens per value; 12 once after the
 * functions. Its figures match the API's (105 on cl100k, 101 on o200k; tested).
 */
const TOOLS = {
  o200k_base: { funcInit: 7, propInit: 3, propKey: 3, enumInit: -3, enumItem: 3, funcEnd: 12 },
  cl100k_base: { funcInit: 10, propInit: 3, propKey: 3, enumInit: -3, enumItem: 3, funcEnd: 12 },
} as const

type Obj = Record<string, unknown>
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v)
const json = (v: unknown): string => JSON.stringify(v) ?? ''

/** What a counter needs beyond text: the tokens of an image or a file block (by the provider's rule), or null when the block is neither. */
export type MediaTokens = (block: Obj) => number | null

/** Counts a prompt's parts with one encoding. */
export interface PromptCounter {
  encoding: OpenAIEncoding
  count: CountText
  media: MediaTokens
}

const dropDot = (s: string): string => (s.endsWith('.') ? s.slice(0, -1) : s)
const text = (v: unknown): string => (typeof v === 'string' ? v : v === undefined || v === null ? '' : json(v))

/**
 * The cookbook's rule covers a flat parameter list of typed, described properties. A
 * property's other schema (nested `properties`, `items`, `anyOf`, a `$ref`, a default…) is
 * in the prompt too, in a form OpenAI does not publish: it is counted as its JSON text,
 * which errs high. The same for a schema's top-level extras beyond `type`, `properties`,
 * `required` and `additionalProperties` (which the cookbook's figure shows cost nothing
 * apart).
 */
const PROPERTY_RULED = new Set(['type', 'description', 'enum'])
const SCHEMA_RULED = new Set(['type', 'properties', 'required', 'additionalProperties'])

function rest(o: Obj, ruled: Set<string>): Obj | null {
  let out: Obj | null = null
  for (const [k, v] of Object.entries(o)) {
    if (ruled.has(k)) continue
    out ??= {}
    out[k] = v
  }
  return out
}

/** One function's definition: Chat Completions' `{ type: 'function', function: {…} }`, the Responses API's flat `{ type: 'function', name, … }`, or a legacy `functions` entry. */
function functionTokens(c: PromptCounter, f: Obj): number {
  const r = TOOLS[c.encoding]
  let n = r.funcInit + c.count(`${text(f.name)}:${dropDot(text(f.description))}`)
  const params = isObj(f.parameters) ? f.parameters : null
  const props = params !== null && isObj(params.properties) ? params.properties : null
  if (props !== null && Object.keys(props).length > 0) {
    n += r.propInit
    for (const [key, spec] of Object.entries(props)) {
      n += r.propKey
      const p = isObj(spec) ? spec : {}
      if (Array.isArray(p.enum)) {
        n += r.enumInit
        for (const item of p.enum) n += r.enumItem + c.count(text(item))
      }
      n += c.count(`${key}:${text(p.type)}:${dropDot(text(p.description))}`)
      const extra = rest(p, PROPERTY_RULED)
      if (extra !== null) n += c.count(json(extra))
    }
  }
  if (params !== null) {
    const extra = rest(params, SCHEMA_RULED)
    if (extra !== null) n += c.count(json(extra))
  }
  return n
}

/**
 * The tokens of a request's tool definitions (`tools`, and the legacy `functions`): functions
 * by the cookbook's rule; another kind of tool (the Responses API's built-in tools, a custom
 * tool's grammar) as its JSON text, for which OpenAI publishes no count.
 */
export function toolTokens(c: PromptCounter, body: Obj): number {
  const fns: Obj[] = []
  let other = 0
  for (const t of Array.isArray(body.tools) ? body.tools : []) {
    if (!isObj(t)) continue
    if (t.type === 'function' && isObj(t.function)) fns.push(t.function)
    else if (t.type === 'function') fns.push(t)
    else other += c.count(json(t))
  }
  for (const f of Array.isArray(body.functions) ? body.functions : []) if (isObj(f)) fns.push(f)
  if (fns.length === 0) return other
  let n = other + TOOLS[c.encoding].funcEnd
  for (const f of fns) n += functionTokens(c, f)
  return n
}

/** A content part or a Responses API content item. */
function partTokens(c: PromptCounter, part: unknown): number {
  if (typeof part === 'string') return c.count(part)
  if (!isObj(part)) return 0
  if (typeof part.text === 'string') return c.count(part.text)
  if (typeof part.refusal === 'string') return c.count(part.refusal)
  const media = c.media(part)
  if (media !== null) return media
  return c.count(json(part))
}

function contentTokens(c: PromptCounter, content: unknown): number {
  if (typeof content === 'string') return c.count(content)
  if (Array.isArray(content)) {
    let n = 0
    for (const part of content) n += partTokens(c, part)
    return n
  }
  return content === undefined || content === null ? 0 : c.count(json(content))
}

/**
 * A tool call in the history: OpenAI publishes no rule, so its function's JSON text
 * (`{"name":…,"arguments":"…"}`, the arguments' quotes escaped), which errs high.
 */
function toolCallTokens(c: PromptCounter, call: unknown): number {
  if (!isObj(call)) return 0
  const f = isObj(call.function) ? call.function : isObj(call.custom) ? call.custom : call
  return c.count(json({ name: f.name, arguments: f.arguments ?? f.input }))
}

/** A Chat Completions message (or a Responses API message item), by the cookbook's rule. */
function messageTokens(c: PromptCounter, m: Obj): number {
  let n = TOKENS_PER_MESSAGE
  for (const [key, value] of Object.entries(m)) {
    // A Responses API item's own bookkeeping is not prompt text.
    if ((key === 'type' && value === 'message') || key === 'id' || key === 'status') continue
    if (key === 'content') n += contentTokens(c, value)
    else if (key === 'tool_calls' && Array.isArray(value)) for (const call of value) n += toolCallTokens(c, call)
    else if (key === 'function_call' && isObj(value)) n += toolCallTokens(c, value)
    else if (typeof value === 'string') n += c.count(value) + (key === 'name' ? TOKENS_PER_NAME : 0)
    else if (value !== undefined && value !== null && typeof value !== 'boolean') n += c.count(json(value))
  }
  return n
}

/**
 * A Responses API input item that is not a message: a function call (its name and
 * arguments' JSON), a tool's output (its text or parts), a reasoning item (its summary's
 * text, and its `encrypted_content` counted as text: the reasoning it stands for is input
 * again, and OpenAI publishes no count for it, so this errs high), anything else as JSON.
 * Each costs a message's overhead: OpenAI publishes no rule for items.
 */
function itemTokens(c: PromptCounter, item: Obj): number {
  switch (item.type) {
    case 'function_call':
    case 'custom_tool_call':
      return TOKENS_PER_MESSAGE + toolCallTokens(c, item)
    case 'function_call_output':
    case 'custom_tool_call_output':
    case 'computer_call_output':
      return TOKENS_PER_MESSAGE + contentTokens(c, item.output)
    case 'reasoning': {
      let n = TOKENS_PER_MESSAGE
      for (const s of Array.isArray(item.summary) ? item.summary : []) n += partTokens(c, s)
      if (typeof item.encrypted_content === 'string') n += c.count(item.encrypted_content)
      return n
    }
    default: {
      const { id: _id, status: _status, ...shown } = item
      return TOKENS_PER_MESSAGE + c.count(json(shown))
    }
  }
}

/** A JSON schema the reply must follow (`response_format` or the Responses API's `text.format`): its JSON text (not published). */
function formatTokens(c: PromptCounter, body: Obj): number {
  const f = isObj(body.response_format) ? body.response_format : isObj(body.text) && isObj(body.text.format) ? body.text.format : null
  if (f === null || f.type !== 'json_schema') return 0
  return c.count(json(isObj(f.json_schema) ? f.json_schema : (f.schema ?? f)))
}

/**
 * The prompt tokens of an OpenAI request body: Chat Completions (`messages`, `tools`,
 * `functions`) or the Responses API (`instructions` as a system message, then `input`: a
 * string, or items), plus the reply's priming, tool definitions and a reply schema.
 */
export function openaiPromptTokens(c: PromptCounter, body: Obj): number {
  let n = REPLY_PRIMING + toolTokens(c, body) + formatTokens(c, body)
  if (Array.isArray(body.messages)) {
    for (const m of body.messages) if (isObj(m)) n += messageTokens(c, m)
    return n
  }
  if (typeof body.instructions === 'string') n += messageTokens(c, { role: 'system', content: body.instructions })
  if (typeof body.input === 'string') n += messageTokens(c, { role: 'user', content: body.input })
  else if (Array.isArray(body.input)) {
    for (const item of body.input) {
      if (typeof item === 'string') n += messageTokens(c, { role: 'user', content: item })
      else if (isObj(item)) n += item.role !== undefined && (item.type === undefined || item.type === 'message') ? messageTokens(c, item) : itemTokens(c, item)
    }
  }
  return n
}
