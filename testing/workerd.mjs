// Development tooling for Workers built on tokenwarden-wasm: bundle a Worker with esbuild
// and run it under workerd (miniflare) on 127.0.0.1. Used by the wasm package's workerd
// suite, the edge limiter's tests and load run, and examples/edge-worker's local run.
import { spawn } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { build } from 'esbuild'
import { Miniflare } from 'miniflare'

/**
 * Bundles the Worker at `entry` (a file path) into `outdir/<name>.js`; the .wasm and the
 * tokenizer's ranks (`.bpe`) stay separate modules next to it, as Workers load them.
 */
export async function buildWorker(outdir, { entry, name = 'worker' }) {
  if (typeof entry !== 'string') throw new TypeError('buildWorker needs `entry`, the path of the Worker module')
  await build({
    entryPoints: { [name]: entry },
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    conditions: ['workerd', 'worker', 'browser'],
    outdir,
    loader: { '.wasm': 'copy', '.bpe': 'copy' },
    assetNames: '[name]-[hash]',
    logLevel: 'error',
  })
}

/**
 * Starts a bundled Worker on 127.0.0.1; resolves to `{ mf, base }`. With `fleets` it is the
 * edge limiter (its Durable Object class bound as QUOTAS, storage persisted in `persist`,
 * `bindings` as further environment variables).
 */
export async function startWorker({ outdir, name = 'worker', persist, fleets, port, bindings = {} }) {
  // The same API from native `tokenwarden serve` (the Rust binary TOKENWARDEN_SERVE_BIN),
  // for the edge suite run against both shells.
  if (fleets !== undefined && process.env.TOKENWARDEN_SERVE_BIN) return startNative({ persist, fleets, port, bindings })
  const edge =
    fleets === undefined
      ? {}
      : { durableObjects: { QUOTAS: 'QuotaObject' }, durableObjectsPersist: persist, bindings: { ...bindings, TOKENWARDEN_FLEETS: JSON.stringify(fleets) } }
  const mf = new Miniflare({
    modules: true,
    scriptPath: `${outdir}${name}.js`,
    modulesRoot: outdir,
    modulesRules: [
      { type: 'CompiledWasm', include: ['**/*.wasm'] },
      { type: 'Data', include: ['**/*.bpe'] },
    ],
    compatibilityDate: '2025-12-01',
    // As in edge/wrangler.toml: a request's signal aborts when its client goes away.
    compatibilityFlags: ['enable_request_signal'],
    host: '127.0.0.1',
    ...edge,
    ...(port === undefined ? {} : { port }),
  })
  const base = (await mf.ready).href.replace(/\/$/, '')
  return { mf, base }
}

/**
 * Starts native `tokenwarden serve` (the binary at TOKENWARDEN_SERVE_BIN) on 127.0.0.1 with
 * `fleets` as its --config and `persist` as its --data, `bindings` in its environment;
 * resolves to `{ mf, base }` as startWorker does (`mf.dispose()` stops it, SIGTERM).
 */
async function startNative({ persist, fleets, port, bindings }) {
  const data = persist ?? join(process.env.TMPDIR ?? '/tmp', `tw-native-${process.pid}-${Date.now()}`)
  mkdirSync(data, { recursive: true })
  const config = join(data, 'fleets.json')
  writeFileSync(config, JSON.stringify({ fleets }), { mode: 0o600 })
  const args = ['serve', '--config', config, '--data', data, '--port', String(port ?? 0)]
  const child = spawn(process.env.TOKENWARDEN_SERVE_BIN, args, { env: { ...process.env, ...bindings }, stdio: ['ignore', 'pipe', 'pipe'] })
  let err = ''
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (c) => {
    err += c
    if (process.env.TOKENWARDEN_SERVE_LOG) process.stderr.write(c)
  })
  const base = await new Promise((resolve, reject) => {
    let out = ''
    child.stdout.setEncoding('utf8')
    child.stdout.on('data', (c) => {
      out += c
      const m = /the limiter on (http:\/\/[^ \n]+)/.exec(out)
      if (m) resolve(m[1])
    })
    child.on('exit', (code) => reject(new Error(`tokenwarden serve exited ${code}: ${err.trim()}`)))
  })
  const exited = new Promise((r) => child.once('exit', r))
  const mf = {
    async dispose() {
      if (child.exitCode === null) child.kill('SIGTERM')
      await exited
    },
  }
  return { mf, base }
}
