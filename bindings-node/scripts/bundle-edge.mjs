// Bundles the edge limiter's Worker (../edge/src/worker.js, on tokenwarden-wasm) into
// serve/ for `tokenwarden serve`: serve/worker.js and the .wasm and tokenizer ranks (.bpe)
// modules it imports, as
// workerd loads them. Run by `npm run build` (build:serve).
import { rmSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { build } from 'esbuild'

const here = (p) => fileURLToPath(new URL(p, import.meta.url))
const outdir = here('../serve/')
rmSync(outdir, { recursive: true, force: true })
const result = await build({
  entryPoints: { worker: here('../../edge/src/worker.js') },
  bundle: true,
  format: 'esm',
  platform: 'neutral',
  conditions: ['workerd', 'worker', 'browser'],
  outdir,
  loader: { '.wasm': 'copy', '.bpe': 'copy' },
  assetNames: '[name]-[hash]',
  // Minified: 300 → 176 KB, 76.7 → 53 KB gzipped, which keeps the whole bundle (with the
  // .wasm and the ranks) within 1.86 MB gzipped as the gateway's rules move from JavaScript
  // into the .wasm. (Nothing reads a function's name: every error class sets its own.)
  minify: true,
  metafile: true,
  logLevel: 'error',
})
const files = Object.keys(result.metafile.outputs).map((f) => f.split('/').pop())
console.log(`serve/: ${files.join(', ')}`)
