// Development tooling for Workers built on tokenwarden-wasm: bundle a Worker with esbuild
// and run it under workerd (miniflare) on 127.0.0.1. Used by the wasm package's workerd
// suite, the edge limiter's tests and load run, and examples/edge-worker's local run.
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
