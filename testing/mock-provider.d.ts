// Type declarations for ./provider.mjs, the mock LLM provider used by tests and examples.

/** Options of {@link startMockProvider}. Every limit is optional; absent = unlimited. */
export interface MockProviderOptions {
  /** Port on 127.0.0.1; default 0 (any free port). */
  port?: number;
  /** Requests per minute (a continuous token bucket of this capacity, starting full). */
  requestsPerMinute?: number;
  /** Input tokens per minute (Anthropic ITPM), charged on arrival. */
  inputTokensPerMinute?: number;
  /** Output tokens per minute (Anthropic OTPM), charged at completion; admits while > 0. */
  outputTokensPerMinute?: number;
  /**
   * Combined tokens per minute (OpenAI TPM): input + max tokens charged on arrival,
   * refunded to input + output tokens at completion.
   */
  tokensPerMinute?: number;
  /** Maximum requests in flight (admitted and not yet finished). */
  concurrency?: number;
  /** Reply length in tokens (= words) when the request has no x-mock-reply-tokens; default 50. */
  replyTokens?: number;
  /** Delay between streamed chunks, ms; default 5. */
  chunkDelayMs?: number;
  /** Delay after admission before responding, ms, when the request has no x-mock-delay-ms; default 0. */
  delayMs?: number;
  /** Most text deltas a stream carries (words are grouped into this many); default 20. */
  maxDeltas?: number;
  /** Clock for the buckets, in ms; default performance.now(). Inject one in unit tests. */
  now?: () => number;
  /** Called once per request when its outcome is final (never sees API keys). */
  onRequest?: (entry: MockLogEntry) => void;
  /** Keep each request's headers in its log entry (API keys included); default false. */
  recordHeaders?: boolean;
  /**
   * Tool-use turns (opt-in): an Anthropic Messages call that offers a tool named `name` and
   * holds fewer than `turns` (default 1) assistant messages is answered with one `tool_use`
   * of it (`input`, default `{}`; stop_reason `tool_use`), later ones with text — what an
   * agent such as Claude Code needs to run a tool and finish.
   */
  toolUse?: { name: string; input?: Record<string, unknown>; turns?: number };
  /**
   * Subagent fan-out (opt-in): an Anthropic Messages call from a session's main thread (no
   * `x-claude-code-agent-id` header: Claude Code sends it on a subagent's calls only) that
   * offers a tool named `name` (Claude Code's `Agent`) and holds no assistant message is
   * answered with `count` `tool_use` blocks of it at once, input `{ description: 'subtask i',
   * prompt, subagent_type: 'general-purpose', ...input }`. Every other call (the subagents',
   * the main thread's later ones) is answered as without it: by `toolUse`, else with text.
   */
  fanOut?: { name: string; count: number; input?: Record<string, unknown> };
  /**
   * 429s as seed 000's gateway sends them (opt-in): `retry-after: 60` (its window's length, an
   * upper bound, whatever the wait), `rate_limit_type` naming the limit
   * (`requests_per_minute`, `parallel_requests`, `input_tokens_per_minute`,
   * `output_tokens_per_minute`, `tokens_per_minute`) and `reset_at` (Unix seconds: when the
   * call would be admitted), besides the request id and `x-mock-limit`; none of the
   * provider's rate-limit headers. Other answers are unchanged.
   */
  gateway429?: boolean;
  /**
   * How prompt tokens are counted. `'bytes'` (default): ceil(UTF-8 bytes of the text / 4),
   * no prompt cache. `'bpe'`: a real BPE tokenizer (js-tiktoken; o200k_base for OpenAI
   * routes, cl100k_base as a stand-in for Claude, whose tokenizer is not public) over
   * everything the provider counts — tools, system, messages, tool calls and results,
   * thinking, Responses `instructions` and `input` items, images by each provider's size
   * rule, PDFs per page (text + the page as an image) — and the providers' prompt caches:
   * Anthropic's `cache_control` breakpoints (5m / 1h, 20-block lookback, 1,024-token
   * minimum) reported as cache reads and creations, OpenAI's automatic prefix cache as
   * `cached_tokens`. Anthropic's input limit is charged input + cache creation, OpenAI's
   * every prompt token. A request it cannot count (an image by URL, an unreadable PDF,
   * more than 4 breakpoints) is a 400. The rules in full: the header of mock-provider.mjs.
   * Starting the mock loads both tokenizers (a second or two, once per process).
   */
  counting?: 'bytes' | 'bpe';
}

/** What `x-mock-limit` says on a 429. */
export type MockLimitName =
  | 'requests'
  | 'input_tokens'
  | 'output_tokens'
  | 'tokens'
  | 'concurrency'
  | 'forced';

/** One request as recorded in {@link MockProvider.log}. */
export interface MockLogEntry {
  /** URL path without the query string. */
  path: string;
  /**
   * The request's headers as received (lowercase names), only with `recordHeaders: true`:
   * to check what a proxy forwards. (Otherwise no header, API keys included, is kept.)
   */
  headers?: Record<string, string | string[] | undefined>;
  /** True when the reply was tool_use blocks (the `toolUse` or `fanOut` option). */
  toolUse?: boolean;
  /** The body's `model`, or null. */
  model: string | null;
  /** Whether the request asked for a stream. */
  stream: boolean;
  /**
   * Input tokens by the counting rule (0 if the body was not understood): the figure charged
   * against the input limit. With `counting: 'bpe'` that is input + cache creation tokens for
   * Anthropic, every prompt token for OpenAI.
   */
  inputTokens: number;
  /** `counting: 'bpe'` only: every prompt token (uncached, cache creation, cache read). */
  promptTokens?: number;
  /** `counting: 'bpe'` only: prompt tokens served from the prompt cache. */
  cacheReadInputTokens?: number;
  /** `counting: 'bpe'` only: prompt tokens written to the cache (Anthropic). */
  cacheCreationInputTokens?: number;
  /** Output tokens produced and charged (0 until completion, and for errors). */
  outputTokens: number;
  /** HTTP status sent. */
  status: number;
  /** On a 429: which limit refused it. */
  limit?: MockLimitName;
}

/** Lowest level of each configured bucket (null when that limit is not configured). */
export interface MockBucketLevels {
  requests: number | null;
  inputTokens: number | null;
  outputTokens: number | null;
  tokens: number | null;
}

/** Counters returned by {@link MockProvider.stats}. */
export interface MockProviderStats {
  /** Generation requests (messages / chat completions) that reached the limiter. */
  requests: number;
  admitted: number;
  /** Admitted requests that finished (including those whose client went away). */
  completed: number;
  rejected429: number;
  /** Requests answered by destroying the socket (dropConnections). */
  dropped: number;
  byLimit: Record<MockLimitName, number>;
  /** Input tokens of admitted requests. */
  inputTokens: number;
  /** Output tokens charged at completion. */
  outputTokens: number;
  inFlight: number;
  peakInFlight: number;
  /**
   * Lowest level each bucket reached right after an admission (output: right after a
   * completion's charge; it may be negative, as debt). Starts at the capacity.
   */
  minLevel: MockBucketLevels;
  /** Current bucket levels. */
  levels: MockBucketLevels;
  /** peakInFlight > concurrency, or minLevel.requests / inputTokens / tokens < 0. */
  overLimit: boolean;
}

/** A running mock provider. */
export interface MockProvider {
  /** `http://127.0.0.1:PORT`: the Anthropic SDK's baseURL; the OpenAI SDK's is `${url}/v1`. */
  readonly url: string;
  readonly port: number;
  /** Every request, in arrival-decision order; cleared in place by reset(). */
  readonly log: MockLogEntry[];
  stats(): MockProviderStats;
  /** Zero the counters, clear the log and pending injected failures, refill every bucket. */
  reset(): void;
  /**
   * Make the next `n` generation requests 429 (`x-mock-limit: forced`) without touching the
   * buckets. `retryAfterSeconds` defaults to 1; null omits the retry-after header.
   */
  fail429(n: number, opts?: { retryAfterSeconds?: number | null }): void;
  /** Make the next `n` requests fail at the network level (socket destroyed, no response). */
  dropConnections(n: number): void;
  /** Stop listening and close every connection, keep-alive ones included. */
  close(): Promise<void>;
}

/** Start a mock provider listening on 127.0.0.1. */
export function startMockProvider(options?: MockProviderOptions): Promise<MockProvider>;

/** Input tokens of a request body by the documented rule (ceil(UTF-8 bytes / 4)). */
export function countInputTokens(body: { system?: unknown; messages?: unknown }): number;

/** A millisecond count rendered like Go's time.Duration (`120ms`, `1s`, `6m0s`). */
export function formatGoDuration(ms: number): string;
