// OpenAI tokenizers for the estimator, side by side: size on disk, bundled size (what a
// Worker or a page would carry for o200k_base + cl100k_base, minified, and gzipped as
// Cloudflare measures its limit), load time (import + the first count, in a fresh process),
// speed (tokens per second counting 50 KB bodies of this repository's own sources, a
// different slice each time so no cache of a previous body helps) and memory after load.
// Every candidate must count the same tokens as the others on every body (special-token
// strings as ordinary text, as the API takes them): the script fails otherwise.
//
//   npm install --prefix /tmp/tokbench --no-save gpt-tokenizer@4.0.0 tiktoken@1.0.22 js-tiktoken@1.0.21
//   cd tests/js && node bench/tokenizers.mjs --from /tmp/tokbench/node_modules
//
// js-tiktoken is measured for reference only: the mock provider counts with it, and the
// estimator must not share the mock's code.
import { execFileSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { gzipSync } from 'node:zlib'

const root = fileURLToPath(new URL('../../../', import.meta.url))
const { values: args } = parseArgs({
  options: {
    from: { type: 'string', default: '/tmp/tokbench/node_modules' },
    child: { type: 'string' },
    bodies: { type: 'string' },
    runs: { type: 'string', default: '12' },
  },
})
const from = resolve(args.from)
const runs = Number(args.runs)
if (!(Number.isInteger(runs) && runs >= 3)) throw new RangeError(`--runs must be an integer of at least 3, got ${args.runs}`)

/** How each candidate is loaded and counts: `load()` returns { o200k(text), cl100k(text) }. */
const CANDIDATES = {
  'gpt-tokenizer': {
    pkg: 'gpt-tokenizer',
    entry: `import { countTokens as o } from 'gpt-tokenizer/encoding/o200k_base'\nimport { countTokens as c } from 'gpt-tokenizer/encoding/cl100k_base'\nconst ordinary = { disallowedSpecial: new Set() }\nexport const o200k = (t) => o(t, ordinary)\nexport const cl100k = (t) => c(t, ordinary)\n`,
  },
  'tiktoken (wasm, ranks inside the .wasm)': {
    pkg: 'tiktoken',
    entry: `import { get_encoding } from 'tiktoken'\nconst o = get_encoding('o200k_base')\nconst c = get_encoding('cl100k_base')\nexport const o200k = (t) => o.encode_ordinary(t).length\nexport const cl100k = (t) => c.encode_ordinary(t).length\n`,
    // Node loads its CommonJS build, which reads the .wasm from its own folder.
    nodeEntry: `import { createRequire } from 'node:module'\nconst { get_encoding } = createRequire(import.meta.url)('tiktoken')\nconst o = get_encoding('o200k_base')\nconst c = get_encoding('cl100k_base')\nexport const o200k = (t) => o.encode_ordinary(t).length\nexport const cl100k = (t) => c.encode_ordinary(t).length\n`,
  },
  'tiktoken/lite (wasm, ranks as JSON)': {
    pkg: 'tiktoken',
    entry: `import { Tiktoken } from 'tiktoken/lite'\nimport ob from 'tiktoken/encoders/o200k_base.json' with { type: 'json' }\nimport cb from 'tiktoken/encoders/cl100k_base.json' with { type: 'json' }\nconst o = new Tiktoken(ob.bpe_ranks, ob.special_tokens, ob.pat_str)\nconst c = new Tiktoken(cb.bpe_ranks, cb.special_tokens, cb.pat_str)\nexport const o200k = (t) => o.encode_ordinary(t).length\nexport const cl100k = (t) => c.encode_ordinary(t).length\n`,
    nodeEntry: `import { createRequire } from 'node:module'\nconst require = createRequire(import.meta.url)\nconst { Tiktoken } = require('tiktoken/lite')\nconst ob = require('tiktoken/encoders/o200k_base.json')\nconst cb = require('tiktoken/encoders/cl100k_base.json')\nconst o = new Tiktoken(ob.bpe_ranks, ob.special_tokens, ob.pat_str)\nconst c = new Tiktoken(cb.bpe_ranks, cb.special_tokens, cb.pat_str)\nexport const o200k = (t) => o.encode_ordinary(t).length\nexport const cl100k = (t) => c.encode_ordinary(t).length\n`,
  },
  'js-tiktoken (reference only)': {
    pkg: 'js-tiktoken',
    entry: `import { Tiktoken } from 'js-tiktoken/lite'\nimport ob from 'js-tiktoken/ranks/o200k_base'\nimport cb from 'js-tiktoken/ranks/cl100k_base'\nconst o = new Tiktoken(ob)\nconst c = new Tiktoken(cb)\nexport const o200k = (t) => o.encode(t, [], []).length\nexport const cl100k = (t) => c.encode(t, [], []).length\n`,
  },
}

/** 50 KB bodies: slices of this repository's sources (code, comments, prose), each different. */
function bodies() {
  const files = []
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name)
      if (e.isDirectory()) walk(p)
      else if (/\.(ts|rs|md|js|mjs)$/.test(e.name)) files.push(p)
    }
  }
  for (const d of ['driver/ts', 'core/src', 'docs', 'edge/src', 'testing/test']) walk(join(root, d))
  const corpus = files.sort().map((f) => readFileSync(f, 'utf8')).join('\n')
  const size = 50 * 1024
  const out = []
  for (let i = 0; out.length < runs + 2 && (i + 1) * size <= corpus.length; i++) out.push(corpus.slice(i * size, (i + 1) * size))
  if (out.length < runs + 2) throw new Error(`the corpus has only ${corpus.length} characters: too few for ${runs + 2} bodies of 50 KB`)
  return out
}

function du(path) {
  const st = statSync(path)
  if (!st.isDirectory()) return st.size
  let n = 0
  for (const e of readdirSync(path)) n += du(join(path, e))
  return n
}

const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
const mb = (n) => `${(n / 1024 / 1024).toFixed(2)} MB`

// A child: load one bundled candidate, then time it. Prints one JSON line.
if (args.child !== undefined) {
  const t0 = performance.now()
  const m = await import(pathToFileURL(args.child).href)
  const first = m.o200k('hello') + m.cl100k('hello')
  const loadMs = performance.now() - t0
  void first
  const rss = process.memoryUsage().rss
  // The parent's bodies: every candidate counts the very same text (the sources may change meanwhile).
  const texts = JSON.parse(readFileSync(args.bodies, 'utf8'))
  const counts = { o200k: [], cl100k: [] }
  const secs = { o200k: [], cl100k: [] }
  for (const enc of ['o200k', 'cl100k']) {
    // The first two bodies warm the JIT up; the others are timed.
    texts.forEach((t, i) => {
      const s = performance.now()
      const n = m[enc](t)
      const e = performance.now()
      counts[enc].push(n)
      if (i >= 2) secs[enc].push({ n, s: (e - s) / 1000 })
    })
  }
  const rate = (xs) => median(xs.map((x) => x.n / x.s))
  console.log(JSON.stringify({ loadMs, rssMb: rss / 1024 / 1024, counts, o200kPerSec: rate(secs.o200k), cl100kPerSec: rate(secs.cl100k), msPerBody: median(secs.o200k.map((x) => x.s * 1000)) }))
  process.exit(0)
}

const esbuild = await import(pathToFileURL(createRequire(join(root, 'testing/x.js')).resolve('esbuild')).href)
const work = mkdtempSync(join(tmpdir(), 'tokbench-'))
const bodiesFile = join(work, 'bodies.json')
writeFileSync(bodiesFile, JSON.stringify(bodies()))
const results = []
try {
  for (const [name, c] of Object.entries(CANDIDATES)) {
    const pkgDir = join(from, c.pkg)
    if (!existsSync(join(pkgDir, 'package.json'))) {
      console.log(`skip ${name}: ${c.pkg} is not installed in ${from}`)
      continue
    }
    const { version, license } = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'))
    const dir = mkdtempSync(join(work, 'c-'))
    writeFileSync(join(dir, 'entry.mjs'), c.entry)
    // Bundled for a Worker or a page: minified ESM, a .wasm kept as its own file.
    const built = await esbuild.build({
      entryPoints: [join(dir, 'entry.mjs')],
      bundle: true,
      minify: true,
      format: 'esm',
      platform: 'neutral',
      conditions: ['workerd', 'worker', 'browser'],
      mainFields: ['module', 'main'],
      outdir: join(dir, 'out'),
      loader: { '.wasm': 'copy' },
      nodePaths: [from],
      metafile: true,
      logLevel: 'error',
    })
    let raw = 0
    let gz = 0
    for (const f of Object.keys(built.metafile.outputs)) {
      const bytes = readFileSync(resolve(f))
      raw += bytes.length
      gz += gzipSync(bytes, { level: 9 }).length
    }
    // Timed in a fresh Node process, from a module beside the packages (so it imports them
    // as an application would: bare names resolved from that node_modules).
    let timing
    try {
      const child = near(c.nodeEntry ?? c.entry)
      timing = JSON.parse(execFileSync(process.execPath, [fileURLToPath(import.meta.url), '--from', from, '--runs', String(runs), '--bodies', bodiesFile, '--child', child], { encoding: 'utf8', maxBuffer: 1 << 24 }).trim().split('\n').pop())
    } catch (e) {
      console.log(`skip timing ${name}: ${e.message.split('\n')[0]}`)
      continue
    }
    results.push({ name, version, license, disk: du(pkgDir), raw, gz, ...timing })
  }
} finally {
  rmSync(work, { recursive: true, force: true })
}

/** A module written beside `from` (removed at exit). */
function near(source) {
  const p = join(resolve(from, '..'), `.tokbench-${process.pid}-${results.length}.mjs`)
  writeFileSync(p, source)
  process.on('exit', () => rmSync(p, { force: true }))
  return p
}

// Every candidate must count alike; the first is the yardstick.
const [first, ...others] = results
for (const r of others) {
  for (const enc of ['o200k', 'cl100k']) {
    if (JSON.stringify(r.counts[enc]) !== JSON.stringify(first.counts[enc])) throw new Error(`${r.name} counts ${enc} differently from ${first.name}: ${r.counts[enc]} vs ${first.counts[enc]}`)
  }
}
console.log(`50 KB bodies: ${first.counts.o200k.length} (${runs} timed), o200k_base ${median(first.counts.o200k)} tokens each (median), cl100k_base ${median(first.counts.cl100k)}; Node ${process.version}`)
console.log('| library | version | licence | on disk | bundle (o200k + cl100k, min) | gzip | load + first count | o200k tokens/s | cl100k tokens/s | ms per 50 KB (o200k) | RSS after load |')
console.log('|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|')
for (const r of results) {
  console.log(
    `| ${r.name} | ${r.version} | ${r.license} | ${mb(r.disk)} | ${mb(r.raw)} | ${mb(r.gz)} | ${r.loadMs.toFixed(0)} ms | ${Math.round(r.o200kPerSec).toLocaleString('en-US')} | ${Math.round(r.cl100kPerSec).toLocaleString('en-US')} | ${r.msPerBody.toFixed(1)} | ${r.rssMb.toFixed(0)} MB |`,
  )
}
