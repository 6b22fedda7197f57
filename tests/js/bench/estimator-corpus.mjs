// Estimate error on the corpus (tests/corpus): every sequence, turn by turn, through the
// product's `fetch` wrapper with its default estimator, against the mock provider counting
// with a real BPE tokenizer (`counting: 'bpe'`, js-tiktoken; the estimator shares nothing
// with it) and keeping the providers' prompt caches. The wrapper estimates, leases, sends
// and learns from the usage the mock reports, as shipped.
//
// Per pattern, cold turns (the provider read nothing from its prompt cache: a first turn, an
// expired cache) and warm turns apart: median and p95 of |estimate − actual| / actual, and
// the mean signed error (bias), where actual is what the provider charges against its input
// limit (Anthropic: input + cache creation tokens; OpenAI: every prompt token) and estimate
// the `inputTokens` the wrapper leased. Then the estimator's cost per call (µs), timed over
// many calls on the corpus's bodies.
//
//   cd tests/js && node bench/estimator-corpus.mjs [--json] [--bounds] [--turns] [--estimator <module>#<class>]
import { performance } from 'node:perf_hooks';
import { startMockProvider } from 'tokenwarden-testing/mock-provider';
import { PATTERNS, generateCorpus } from '../../corpus/generate.mjs';
import { createTokenwarden, engineName } from '../support/engine.mjs';

/** Goals of issue 26: median and p95 of the absolute input-estimate error. */
export const GOALS = { median: 0.05, p95: 0.15 };

const big = 1_000_000_000;
const POOLS = [
  { name: 'anthropic', input_tokens_per_minute: big, output_tokens_per_minute: big, requests_per_minute: big, max_concurrent: 8 },
  { name: 'openai', counting: 'openai', tokens_per_minute: big, requests_per_minute: big, max_concurrent: 8 },
];

/**
 * The class of the estimator a coordinator uses when given none (what every wrapped `fetch`
 * shares), read from a coordinator rather than named here: the measure follows the product.
 */
export function defaultEstimatorClass() {
  const probe = createTokenwarden({ config: { pools: POOLS } });
  try {
    return probe.estimator.constructor;
  } finally {
    probe.close();
  }
}

/** A pause between two sequences of one pattern (virtual ms): a fleet's sessions follow each other. */
const BETWEEN_SEQUENCES_MS = 60_000;

/** Nearest-rank quantile of sorted values. */
function quantile(sorted, q) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

/** Median, p95 and mean signed error of a list of signed relative errors. */
export function summarize(errors) {
  const abs = errors.map(Math.abs).sort((a, b) => a - b);
  return {
    n: errors.length,
    median: quantile(abs, 0.5),
    p95: quantile(abs, 0.95),
    bias: errors.length === 0 ? NaN : errors.reduce((s, e) => s + e, 0) / errors.length,
  };
}

/**
 * Run one pattern's sequences through a fresh coordinator, estimator and mock (nothing
 * learned from another pattern).
 * @returns {Promise<{turns: object[], bodies: {provider: string, model: string, body: object}[], estimator: BytesPerTokenEstimator}>}
 */
async function runPattern(seqs, Estimator) {
  let clock = 0;
  const mock = await startMockProvider({ counting: 'bpe', now: () => clock, replyTokens: 20, chunkDelayMs: 0, maxDeltas: 4 });
  // The default estimator with its default options, on the same virtual clock as the mock
  // (prompt caches expire by it).
  const Default = Estimator ?? defaultEstimatorClass();
  const estimator = new Default({ now: () => clock });
  /** The estimates the wrapper asked for, in order. */
  const asked = [];
  const recording = {
    estimate(input) {
      const e = estimator.estimate(input);
      asked.push(e);
      return e;
    },
    observe(o) {
      return estimator.observe?.(o);
    },
  };
  const tw = createTokenwarden({ config: { pools: POOLS }, estimator: recording });
  // An estimator that fails is replaced by the byte rule for that call: that is not the
  // estimator under measure, so it fails the run.
  const failures = [];
  tw.on('remote_error', (e) => failures.push(e));
  const turns = [];
  const bodies = [];
  try {
    for (const seq of seqs) {
      const fetch = tw.fetch({ agent: seq.name, pool: seq.provider });
      const start = clock;
      for (const [i, turn] of seq.turns.entries()) {
        clock = start + turn.atMs;
        const before = asked.length;
        const headers = { 'content-type': 'application/json', ...(seq.provider === 'anthropic' ? { 'x-api-key': 'k', 'anthropic-version': '2023-06-01' } : { authorization: 'Bearer k' }) };
        const res = await fetch(`${mock.url}${seq.path}`, { method: 'POST', headers, body: JSON.stringify(turn.body) });
        const text = await res.text();
        if (res.status !== 200) throw new Error(`${seq.name} turn ${i}: HTTP ${res.status}: ${text.slice(0, 300)}`);
        const entry = mock.log.at(-1);
        const estimate = await asked.at(-1);
        if (failures.length > 0) throw new Error(`${seq.name} turn ${i}: the estimator failed: ${JSON.stringify(failures)}`);
        if (asked.length !== before + 1) {
          throw new Error(`${seq.name} turn ${i}: the wrapper asked the estimator ${asked.length - before} times (a model call it did not lease?)`);
        }
        const actual = entry.inputTokens;
        turns.push({
          sequence: seq.name,
          turn: i,
          cold: entry.cacheReadInputTokens === 0,
          estimate: estimate.inputTokens,
          estimatedCached: estimate.cachedPrefixTokens,
          actual,
          cacheRead: entry.cacheReadInputTokens,
          error: (estimate.inputTokens - actual) / actual,
        });
        bodies.push({ provider: seq.provider, model: turn.body.model, body: turn.body });
      }
      clock += BETWEEN_SEQUENCES_MS;
    }
  } finally {
    tw.close();
    await mock.close();
  }
  return { turns, bodies, estimator, estimatorName: Default.name };
}

/** µs per `estimate` call over the bodies, on the estimator as the run left it (awaited if it answers a promise). */
async function costPerCall(estimator, bodies, minMs = 300) {
  for (const b of bodies) await estimator.estimate(b); // warm-up
  let calls = 0;
  const t0 = performance.now();
  let t = t0;
  while (t - t0 < minMs) {
    for (const b of bodies) {
      const e = estimator.estimate(b);
      if (e !== null && typeof e === 'object' && typeof e.then === 'function') await e;
    }
    calls += bodies.length;
    t = performance.now();
  }
  return ((t - t0) * 1000) / calls;
}

/**
 * Measure every pattern (or those named), with the coordinator's default estimator (or
 * another class taking the same options).
 * @param {{patterns?: string[], costMs?: number, estimatorClass?: new (o: object) => object}} [opts]
 */
export async function measureCorpus(opts = {}) {
  const corpus = generateCorpus();
  const patterns = opts.patterns ?? PATTERNS;
  const results = [];
  for (const pattern of patterns) {
    const seqs = corpus.filter((s) => s.pattern === pattern);
    if (seqs.length === 0) throw new Error(`no sequences for pattern ${pattern}; patterns: ${PATTERNS.join(', ')}`);
    const { turns, bodies, estimator, estimatorName } = await runPattern(seqs, opts.estimatorClass);
    results.push({
      pattern,
      estimator: estimatorName,
      sequences: seqs.length,
      cold: summarize(turns.filter((t) => t.cold).map((t) => t.error)),
      warm: summarize(turns.filter((t) => !t.cold).map((t) => t.error)),
      usPerCall: await costPerCall(estimator, bodies, opts.costMs ?? 300),
      turns,
    });
  }
  return results;
}

/**
 * The bounds the corpus test asserts: each goal where it is met, else the figure reached
 * today rounded up to the next half percentage point (a regression fails; nothing loosened).
 */
export function boundsOf(results) {
  const up = (x) => Math.ceil(x * 200 - 1e-9) / 200;
  const bound = (x, goal) => (x <= goal ? goal : up(x));
  const out = {};
  for (const r of results) {
    out[r.pattern] = {};
    for (const phase of ['cold', 'warm']) {
      const s = r[phase];
      out[r.pattern][phase] = { n: s.n, median: bound(s.median, GOALS.median), p95: bound(s.p95, GOALS.p95) };
    }
  }
  return out;
}

const pct = (x) => (Number.isNaN(x) ? '—' : `${(x * 100).toFixed(1)}%`);
const signed = (x) => (Number.isNaN(x) ? '—' : `${x >= 0 ? '+' : ''}${(x * 100).toFixed(1)}%`);
const met = (s) => (s.n === 0 ? '—' : s.median <= GOALS.median && s.p95 <= GOALS.p95 ? 'met' : 'not met');

/** The results as a Markdown table (the one BENCHMARKS.md carries). */
export function table(results) {
  const lines = ['| pattern | turns | cold n | cold median | cold p95 | cold bias | warm n | warm median | warm p95 | warm bias | µs/call | goals (cold / warm) |', '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|'];
  for (const r of results) {
    const { cold, warm } = r;
    lines.push(
      `| ${r.pattern} | ${cold.n + warm.n} | ${cold.n} | ${pct(cold.median)} | ${pct(cold.p95)} | ${signed(cold.bias)} | ${warm.n} | ${pct(warm.median)} | ${pct(warm.p95)} | ${signed(warm.bias)} | ${r.usPerCall.toFixed(1)} | ${met(cold)} / ${met(warm)} |`,
    );
  }
  return lines.join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  // --estimator <module>#<export>: measure another estimator class (an older build, say).
  const at = process.argv.indexOf('--estimator');
  let estimatorClass;
  if (at >= 0) {
    const [file, name] = String(process.argv[at + 1]).split('#');
    estimatorClass = (await import(new URL(file, `file://${process.cwd()}/`).href))[name];
    if (typeof estimatorClass !== 'function') throw new Error(`--estimator: ${process.argv[at + 1]} exports no class ${name}`);
  }
  const results = await measureCorpus({ estimatorClass });
  if (process.argv.includes('--json')) console.log(JSON.stringify(results, null, 2));
  else {
    console.log(`estimator: ${results[0]?.estimator}${estimatorClass ? '' : " (the coordinator's default)"}, engine: ${engineName}, node ${process.version}\n`);
    console.log(table(results));
    console.log(`\ngoals: median ≤ ${GOALS.median * 100}%, p95 ≤ ${GOALS.p95 * 100}% (absolute input-estimate error), cold and warm, per pattern`);
    if (process.argv.includes('--bounds')) console.log(`\nbounds for test/corpus.test.mjs:\n${JSON.stringify(boundsOf(results), null, 2)}`);
    if (process.argv.includes('--turns')) {
      for (const r of results) for (const t of r.turns) console.log(`${t.sequence} #${t.turn} ${t.cold ? 'cold' : 'warm'} est ${t.estimate} actual ${t.actual} read ${t.cacheRead} est-read ${t.estimatedCached} ${signed(t.error)}`);
    }
  }
}
