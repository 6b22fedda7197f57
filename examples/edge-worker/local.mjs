// Runs the edge limiter locally under workerd (miniflare), with a mock provider as the
// upstream of one quota, and prints the URLs to try. Ctrl-C stops both.
//
//   cd examples/edge-worker && node local.mjs [--port 8787]
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { buildWorker, startWorker } from 'tokenwarden-testing/workerd'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'

const at = process.argv.indexOf('--port')
const port = at === -1 ? 8787 : Number(process.argv[at + 1])
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`--port takes a port number (0 to 65535; 0: any free one), got ${JSON.stringify(process.argv[at + 1] ?? '')}`)
  process.exit(2)
}
const outdir = join(mkdtempSync(join(tmpdir(), 'tokenwarden-edge-build-')), '/')
await buildWorker(outdir, { entry: fileURLToPath(new URL('./src/index.js', import.meta.url)) })
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
const { mf, base: url } = await startWorker({ outdir, persist: mkdtempSync(join(tmpdir(), 'tokenwarden-edge-state-')), fleets, port })
const q = `${url}/v1/fleets/demo/quotas/anthropic`
console.log(`edge limiter on ${url} (workerd), upstream: mock provider on ${mock.url}
  dashboard   ${q}/dashboard        (secret: ${secret})
  lease       curl -s -X POST -H 'authorization: Bearer ${secret}' -H 'content-type: application/json' \\
                -d '{"agent":"me","pool":"claude-sonnet-4-6","inputTokens":1000,"maxTokens":100}' ${q}/leases
  protocol    curl -s -X POST -H 'authorization: Bearer ${secret}' -H 'content-type: application/json' \\
                -d '{"op":"call_lease","request":{"agent":"me","pool":"claude-sonnet-4-6","inputTokens":1000,"maxTokens":100}}' ${q}/handle
  metrics     curl -s -H 'authorization: Bearer ${secret}' '${q}/metrics?format=prometheus'
  proxy       new Anthropic({ baseURL: '${q}/proxy', apiKey: 'any', defaultHeaders: { 'x-tokenwarden-token': '${secret}' }, maxRetries: 0 })`)
const stop = async () => {
  await mf.dispose()
  await mock.close()
  process.exit(0)
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
