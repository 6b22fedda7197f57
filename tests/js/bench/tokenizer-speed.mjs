// The estimator's tokenizer (the provider crate's byte-pair tokenizer, through the native
// addon and through the wasm build) against gpt-tokenizer, which it replaced: tokens per
// second counting 50 KB bodies of this repository's own sources (a different slice each
// time), the first count of each encoding (its table built from the ranks), and the same
// count from every one on every body (the script fails otherwise).
//
//   npm install --prefix /tmp/tokbench --no-save gpt-tokenizer@4.0.0
//   cd tests/js && node bench/tokenizer-speed.mjs [--from /tmp/tokbench/node_modules] [--runs 12]
//
// Without gpt-tokenizer installed it measures the two builds of the new one alone.
import { existsSync, readFileSync, readdirSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

const root = fileURLToPath(new URL('../../../', import.meta.url))
const { values: args } = parseArgs({
  options: {
    from: { type: 'string', default: '/tmp/tokbench/node_modules' },
    runs: { type: 'string', default: '12' },
  },
})
const runs = Number(args.runs)
if (!(Number.isInteger(runs) && runs >= 3)) throw new RangeError(`--runs must be an integer of at least 3, got ${args.runs}`)

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

const { tokenizers } = await import('tokenwarden')
const { wasmTokenizers } = await import('tokenwarden-wasm/nodejs')
const candidates = {
  'tokenwarden, native addon': (e) => (text) => tokenizers(e)(text),
  'tokenwarden, wasm': (e) => wasmTokenizers(e),
}
const gpt = join(resolve(args.from), 'gpt-tokenizer')
if (existsSync(join(gpt, 'package.json'))) {
  const ordinary = { disallowedSpecial: new Set() }
  const t0 = performance.now()
  const o = await import(pathToFileURL(join(gpt, 'esm/encoding/o200k_base.js')).href)
  const c = await import(pathToFileURL(join(gpt, 'esm/encoding/cl100k_base.js')).href)
  candidates['gpt-tokenizer 4.0.0 (before)'] = (e) => (text) => (e === 'o200k_base' ? o : c).countTokens(text, ordinary)
  console.log(`gpt-tokenizer: both encodings imported in ${(performance.now() - t0).toFixed(0)} ms (its "first count" below is after that)`)
} else {
  console.log(`gpt-tokenizer is not installed in ${args.from}: measuring tokenwarden's alone`)
}

const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
const texts = bodies()
const rows = []
const counts = {}
for (const [name, make] of Object.entries(candidates)) {
  const row = { name }
  for (const e of ['o200k_base', 'cl100k_base']) {
    const t0 = performance.now()
    const count = make(e)
    count('hello')
    row[`${e} first`] = performance.now() - t0
    const rates = []
    texts.forEach((t, i) => {
      const s = performance.now()
      const n = count(t)
      const secs = (performance.now() - s) / 1000
      const key = `${e}:${i}`
      counts[key] ??= n
      if (counts[key] !== n) throw new Error(`${name} counts body ${i} as ${n} ${e} tokens, another candidate ${counts[key]}`)
      if (i >= 2) rates.push(n / secs)
    })
    row[e] = median(rates)
  }
  rows.push(row)
}
const fmt = (n) => Math.round(n).toLocaleString('en-US')
console.log(`${texts.length - 2} timed bodies of 50 KB each, the same counts from every candidate`)
console.log('| tokenizer | o200k tokens/s | cl100k tokens/s | first o200k count (ranks → table) | first cl100k count |')
console.log('|---|---:|---:|---:|---:|')
for (const r of rows) console.log(`| ${r.name} | ${fmt(r.o200k_base)} | ${fmt(r.cl100k_base)} | ${r['o200k_base first'].toFixed(0)} ms | ${r['cl100k_base first'].toFixed(0)} ms |`)
