// Runs the edge limiter locally under workerd (miniflare), with a mock provider as the
// upstream of one quota, and prints the URLs to try. Ctrl-C stops both.
//
//   cd examples/edge-worker && node local.mjs [--port 8787]
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'
import { startMockProvider } from '../../bindings-node/mock/provider.mjs'

// esbuild and miniflare are the wasm package's dev dependencies (npm ci in bindings-wasm).
const require = createRequire(new URL('../../bindings-wasm/package.json', import.meta.url))
const { build } = require('esbuild')
const { Miniflare } = require('miniflare')

const port = Number(process.argv[process.argv.indexOf('--port') + 1] || 8787)
const here = (p) => fileURLToPath(new URL(p, import.meta.url))
const outdir = join(mkdtempSync(join(tmpdir(), 'tokenwarden-edge-build-')), '/')
await build({
  entryPoints: { worker: here('./src/index.js') },
  bundle: true,
  format: 'esm',
  platform: 'neutral',
  conditions: ['workerd', 'worker', 'browser'],
  outdir,
  loader: { '.wasm': 'copy' },
  assetNames: '[name]-[hash]',
  logLevel: 'error',
})
const mock = await startMockProvider({ inputTokensPerMinute: 120_000, outputTokensPerMinute: 30_000, requestsPerMinute: 600, concurrency: 8 })
const secret = 'local-demo-secret-0123456789'
const fleets = {
  demo: {
    secret,
    quotas: {
      anthropic: {
        config: { pools: [{ name: 'claude-sonnet-4-6', input_tokens_per_minute: 120_000, output_tokens_per_minute: 30_000, requests_per_minute: 600, max_concurrent: 8 }] },
        upstream: mock.url,
      },
    },
  },
}
const mf = new Miniflare({
  modules: true,
  scriptPath: `${outdir}worker.js`,
  modulesRoot: outdir,
  modulesRules: [{ type: 'CompiledWasm', include: ['**/*.wasm'] }],
  compatibilityDate: '2025-12-01',
  durableObjects: { QUOTAS: 'QuotaObject' },
  durableObjectsPersist: mkdtempSync(join(tmpdir(), 'tokenwarden-edge-state-')),
  bindings: { TOKENWARDEN_FLEETS: JSON.stringify(fleets) },
  host: '127.0.0.1',
  port,
})
const url = (await mf.ready).href.replace(/\/$/, '')
const q = `${url}/v1/fleets/demo/quotas/anthropic`
console.log(`edge limiter on ${url} (workerd), upstream: mock provider on ${mock.url}
  dashboard   ${q}/dashboard        (secret: ${secret})
  lease       curl -s -X POST -H 'authorization: Bearer ${secret}' -H 'content-type: application/json' \\
                -d '{"agent":"me","pool":"claude-sonnet-4-6","inputTokens":1000,"maxTokens":100}' ${q}/leases
  metrics     curl -s -H 'authorization: Bearer ${secret}' '${q}/metrics?format=prometheus'
  proxy       new Anthropic({ baseURL: '${q}/proxy', apiKey: 'any', defaultHeaders: { 'x-tokenwarden-token': '${secret}' }, maxRetries: 0 })`)
const stop = async () => {
  await mf.dispose()
  await mock.close()
  process.exit(0)
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
