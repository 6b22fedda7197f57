// A static file server for the browser tests and the browser example: serves the
// repository root on 127.0.0.1 (port 0 = any free port), plus `/tests/traces/index.json`,
// the list of trace files. Nothing else, and nothing outside the repository.
import { createServer } from 'node:http'
import { readFile, readdir } from 'node:fs/promises'
import { extname, join, normalize, sep } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.css': 'text/css',
  '.map': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
}

/** Starts the server; resolves to `{ url, close() }`. */
export async function startStaticServer({ port = 0 } = {}) {
  const server = createServer(async (req, res) => {
    try {
      const path = decodeURIComponent(new URL(req.url, 'http://x').pathname)
      if (path === '/tests/traces/index.json') {
        const files = (await readdir(join(ROOT, 'tests/traces'))).filter((f) => f.endsWith('.json')).sort()
        res.writeHead(200, { 'content-type': TYPES['.json'] })
        return res.end(JSON.stringify(files))
      }
      const file = normalize(join(ROOT, path.endsWith('/') ? `${path}index.html` : path))
      if (!file.startsWith(ROOT) || file.split(sep).includes('node_modules') || file.split(sep).includes('.git')) {
        res.writeHead(403)
        return res.end('forbidden')
      }
      const body = await readFile(file)
      res.writeHead(200, { 'content-type': TYPES[extname(file)] ?? 'application/octet-stream', 'cache-control': 'no-store' })
      res.end(body)
    } catch {
      res.writeHead(404, { 'content-type': 'text/plain' })
      res.end('not found')
    }
  })
  await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve))
  const { port: bound } = server.address()
  return {
    url: `http://127.0.0.1:${bound}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const port = Number(process.argv[2] ?? 8080)
  const s = await startStaticServer({ port })
  console.log(`serving the repository at ${s.url}/  (the browser example: ${s.url}/examples/browser/)`)
}
