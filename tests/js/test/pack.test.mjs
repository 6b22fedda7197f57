// What each npm package ships: `npm pack --dry-run` lists exactly what a user needs (the
// built code, its types, the README), never sources, tests, benchmarks or test
// infrastructure such as the mock provider.
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { test } from 'node:test'

const root = fileURLToPath(new URL('../../../', import.meta.url))

/** The files `npm pack` would put in the tarball of the package in `dir`. */
function packed(dir) {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], {
    cwd: `${root}${dir}`,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  return JSON.parse(out)[0].files.map((f) => f.path).sort()
}

/**
 * Every packed file matches one of `allowed`, and every file in `required` is packed.
 * Names the stray and the missing files when not.
 */
function check(dir, { allowed, required }) {
  const files = packed(dir)
  const stray = files.filter((f) => !allowed.some((re) => re.test(f)))
  assert.deepEqual(stray, [], `${dir} would ship files a user does not need: ${stray.join(', ')}`)
  const missing = required.filter((f) => !files.includes(f))
  assert.deepEqual(missing, [], `${dir} would not ship: ${missing.join(', ')}`)
}

const common = [/^package\.json$/, /^README\.md$/]

test('tokenwarden-driver ships its compiled layer and types only', () => {
  check('driver', {
    allowed: [...common, /^dist\/[a-z]+\.(js|d\.ts)$/],
    required: ['package.json', 'README.md', 'dist/index.js', 'dist/index.d.ts', 'dist/driver.js', 'dist/fetch.js', 'dist/register.js', 'dist/remote.js'],
  })
})

test('tokenwarden ships the addon, its generated loader and types, the engine glue, and serve (the CLI and the edge limiter bundled)', () => {
  check('bindings-node', {
    allowed: [...common, /^binding\.(cjs|d\.ts)$/, /^tokenwarden\.[a-z0-9-]+\.node$/, /^dist\/(index|native|driver|checkpoint)\.(js|d\.ts)$/, /^bin\/tokenwarden\.mjs$/, /^serve\/worker\.js$/, /^serve\/tokenwarden_wasm_bg-[A-Z0-9]+\.wasm$/, /^serve\/(o200k|cl100k)_base-[A-Z0-9]+\.bpe$/],
    required: ['package.json', 'README.md', 'binding.cjs', 'binding.d.ts', 'dist/index.js', 'dist/index.d.ts', 'dist/native.js', 'dist/driver.js', 'dist/checkpoint.js', 'bin/tokenwarden.mjs', 'serve/worker.js'],
  })
  // serve's Worker imports the tokenizer's ranks as data modules (names hashed by the bundler).
  const files = packed('bindings-node')
  for (const e of ['o200k_base', 'cl100k_base']) assert.ok(files.some((f) => f.startsWith(`serve/${e}-`) && f.endsWith('.bpe')), `serve ships ${e}'s ranks`)
})

test('tokenwarden-wasm ships its entry points, the three wasm-bindgen builds and the tokenizer ranks', () => {
  const builds = ['web', 'nodejs', 'bundler']
  check('bindings-wasm', {
    allowed: [
      ...common,
      /^js\/(bundler|engine|node|registers|web|workerd)\.js$/,
      /^js\/index\.d\.ts$/,
      /^pkg\/(web|nodejs|bundler)\/tokenwarden_wasm(_bg)?\.(js|d\.ts|wasm|wasm\.d\.ts)$/,
      /^pkg\/nodejs\/package\.json$/,
      /^data\/(o200k|cl100k)_base\.bpe$/,
    ],
    required: [
      'package.json',
      'README.md',
      'data/o200k_base.bpe',
      'data/cl100k_base.bpe',
      'js/index.d.ts',
      'js/workerd.js',
      'js/engine.js',
      'js/registers.js',
      'pkg/nodejs/package.json',
      ...builds.flatMap((b) => [`pkg/${b}/tokenwarden_wasm.js`, `pkg/${b}/tokenwarden_wasm_bg.wasm`]),
    ],
  })
})
