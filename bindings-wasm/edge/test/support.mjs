// Builds the edge Worker with esbuild and runs it under workerd (miniflare) for the tests.
import { fileURLToPath } from 'node:url'
import { build } from 'esbuild'
import { Miniflare } from 'miniflare'

const here = (p) => fileURLToPath(new URL(p, import.meta.url))

/** Bundles `edge/src/worker.js` into `outdir` (the .wasm stays a separate module). */
export async function buildWorker(outdir) {
  await build({
    entryPoints: { worker: here('../src/worker.js') },
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    conditions: ['workerd', 'worker', 'browser'],
    outdir,
    loader: { '.wasm': 'copy' },
    assetNames: '[name]-[hash]',
    logLevel: 'error',
  })
}

/** Starts the bundled Worker on 127.0.0.1; resolves to `{ mf, base }`. */
export async function startWorker({ outdir, persist, fleets, port }) {
  const mf = new Miniflare({
    modules: true,
    scriptPath: `${outdir}worker.js`,
    modulesRoot: outdir,
    modulesRules: [{ type: 'CompiledWasm', include: ['**/*.wasm'] }],
    compatibilityDate: '2025-12-01',
    durableObjects: { QUOTAS: 'QuotaObject' },
    durableObjectsPersist: persist,
    bindings: { TOKENWARDEN_FLEETS: JSON.stringify(fleets) },
    host: '127.0.0.1',
    ...(port === undefined ? {} : { port }),
  })
  const base = (await mf.ready).href.replace(/\/$/, '')
  return { mf, base }
}
