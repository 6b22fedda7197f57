#!/usr/bin/env node
// Start the mock LLM provider from the command line:
//   node testing/mock-cli.mjs [--port N] [--rpm N] [--itpm N] [--otpm N] [--tpm N] [--concurrency N]
//                     [--reply-tokens N] [--chunk-delay-ms N] [--delay-ms N] [--verbose]
// Prints the URL on stdout; Ctrl-C stops it (and prints the counters on stderr).

import { parseArgs } from 'node:util';
import { startMockProvider } from './mock-provider.mjs';

const USAGE = `usage: node testing/mock-cli.mjs [options]
  --port N            port on 127.0.0.1 (default: any free port)
  --rpm N             requests per minute
  --itpm N            input tokens per minute (Anthropic)
  --otpm N            output tokens per minute (Anthropic)
  --tpm N             combined tokens per minute (OpenAI)
  --concurrency N     requests in flight at once
  --reply-tokens N    reply length in tokens (default 50)
  --chunk-delay-ms N  delay between streamed chunks (default 5)
  --delay-ms N        delay before each response (default 0)
  --verbose           print one line per request on stderr
  --help`;

/** @type {Record<string, keyof import('./provider.d.ts').MockProviderOptions>} */
const NUMERIC = {
  port: 'port',
  rpm: 'requestsPerMinute',
  itpm: 'inputTokensPerMinute',
  otpm: 'outputTokensPerMinute',
  tpm: 'tokensPerMinute',
  concurrency: 'concurrency',
  'reply-tokens': 'replyTokens',
  'chunk-delay-ms': 'chunkDelayMs',
  'delay-ms': 'delayMs',
};

/** @returns {never} */
function fail(/** @type {string} */ message) {
  process.stderr.write(`${message}\n${USAGE}\n`);
  process.exit(2);
}

/** @returns {never} */
function failWith(/** @type {unknown} */ err) {
  return fail(err instanceof Error ? err.message : String(err));
}

/** @type {Record<string, {type: 'string' | 'boolean'}>} */
const flags = { verbose: { type: 'boolean' }, help: { type: 'boolean' } };
for (const name of Object.keys(NUMERIC)) flags[name] = { type: 'string' };

const parsed = (() => {
  try {
    return parseArgs({ options: flags, strict: true });
  } catch (err) {
    return failWith(err);
  }
})();

if (parsed.values.help) {
  process.stdout.write(`${USAGE}\n`);
  process.exit(0);
}

/** @type {import('./provider.d.ts').MockProviderOptions} */
const options = {};
for (const [flag, key] of Object.entries(NUMERIC)) {
  const raw = parsed.values[flag];
  if (raw === undefined) continue;
  const value = Number(raw);
  if (typeof raw !== 'string' || raw.trim() === '' || !Number.isFinite(value)) fail(`--${flag}: not a number: ${raw}`);
  /** @type {any} */ (options)[key] = value;
}
if (parsed.values.verbose) {
  options.onRequest = (e) => {
    const limit = e.limit ? ` limit=${e.limit}` : '';
    process.stderr.write(
      `${e.status} ${e.path} model=${e.model} stream=${e.stream} in=${e.inputTokens} out=${e.outputTokens}${limit}\n`,
    );
  };
}

const provider = await startMockProvider(options).catch(failWith);

process.stdout.write(`${provider.url}\n`);
process.stderr.write(
  `mock provider listening: Anthropic baseURL ${provider.url}, OpenAI baseURL ${provider.url}/v1 (Ctrl-C stops)\n`,
);

let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  const { minLevel, levels, ...rest } = provider.stats();
  process.stderr.write(`${JSON.stringify({ ...rest, minLevel })}\n`);
  await provider.close();
  process.exit(0);
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
