#!/usr/bin/env node
// `tokenwarden serve`: the edge limiter's Worker on self-hosted workerd (the npm package
// `workerd`, Cloudflare's open-source Workers runtime), on this machine: one local limiter
// for a fleet of CLI agents and programs in any language, which join it by changing their
// base URL. Durable Object storage is on disk under --data, so a restart keeps every
// lease, ticket and debt.
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { isIP } from 'node:net'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const HELP = `usage: tokenwarden serve [--config tokenwarden.json] [--port 8787] [--host 127.0.0.1] [--data DIR]

Runs the edge limiter on workerd (npm i workerd) and prints the base URLs agents use:
  ANTHROPIC_BASE_URL=http://127.0.0.1:8787/v1/fleets/<fleet>/quotas/<quota>/agents/<agent>/<role>/anthropic
  OPENAI_BASE_URL=http://127.0.0.1:8787/v1/fleets/<fleet>/quotas/<quota>/agents/<agent>/<role>/openai

  --config FILE  fleets, quotas and upstreams ({ "fleets": { ... } }, the edge limiter's
                 TOKENWARDEN_FLEETS); default: fleet "local" with quotas "anthropic" and
                 "openai" on the providers' APIs, limits learned from their headers
  --port N       default 8787 (0: any free port)
  --host ADDR    default 127.0.0.1; a fleet with "proxy_open" is refused on any other
  --data DIR     state (leases, tickets, debt) and the generated workerd config; default ./.tokenwarden`

const here = dirname(fileURLToPath(import.meta.url))

function fail(message, code = 2) {
  console.error(`tokenwarden: ${message}`)
  process.exit(code)
}

function parseArgs(argv) {
  const [command, ...rest] = argv
  if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
    console.log(HELP)
    process.exit(0)
  }
  if (command !== 'serve') fail(`unknown command ${JSON.stringify(command)} (try --help)`)
  const opts = { config: null, port: 8787, host: '127.0.0.1', data: '.tokenwarden' }
  for (let i = 0; i < rest.length; i++) {
    const flag = rest[i]
    const value = () => {
      const v = rest[++i]
      if (v === undefined) fail(`${flag} needs a value`)
      return v
    }
    if (flag === '-h' || flag === '--help') {
      console.log(HELP)
      process.exit(0)
    } else if (flag === '--config') opts.config = value()
    else if (flag === '--data') opts.data = value()
    else if (flag === '--host') opts.host = value()
    else if (flag === '--port') {
      const v = value()
      if (!/^\d{1,5}$/.test(v) || Number(v) > 65535) fail(`--port must be a port number (0 to 65535), got ${JSON.stringify(v)}`)
      opts.port = Number(v)
    } else fail(`unknown option ${JSON.stringify(flag)} (try --help)`)
  }
  if (isIP(opts.host) === 0 && opts.host !== 'localhost') fail(`--host must be an IP address, got ${JSON.stringify(opts.host)}`)
  return opts
}

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost'])

/** The fleets to serve: the config file's, or the default local fleet (its secret kept in the data directory). */
function loadFleets(opts, data) {
  if (opts.config !== null) {
    let text
    try {
      text = readFileSync(opts.config, 'utf8')
    } catch (e) {
      fail(`cannot read --config ${opts.config}: ${e.message}`)
    }
    let parsed
    try {
      parsed = JSON.parse(text)
    } catch (e) {
      fail(`--config ${opts.config} is not JSON: ${e.message}`)
    }
    const fleets = parsed?.fleets
    if (fleets === null || typeof fleets !== 'object' || Array.isArray(fleets)) fail(`--config ${opts.config} must be { "fleets": { "<fleet>": { "secret", "quotas": { … } } } }`)
    return fleets
  }
  const secretFile = join(data, 'secret')
  if (!existsSync(secretFile)) writeFileSync(secretFile, `${randomBytes(24).toString('base64url')}\n`, { mode: 0o600 })
  const secret = readFileSync(secretFile, 'utf8').trim()
  return {
    local: {
      secret,
      proxy_open: true,
      quotas: {
        anthropic: { upstream: 'https://api.anthropic.com', config: { pools: [{ name: 'default' }] } },
        openai: { upstream: 'https://api.openai.com', config: { pools: [{ name: 'default', counting: 'openai' }] } },
      },
    },
  }
}

/** The `workerd` binary: $WORKERD, else the `workerd` npm package next to the project or to this package. */
function workerdBinary() {
  if (process.env.WORKERD) return process.env.WORKERD
  for (const from of [join(process.cwd(), 'package.json'), join(here, '..', 'package.json')]) {
    try {
      const pkg = createRequire(from)('workerd')
      return pkg.default ?? pkg
    } catch {
      // not installed there
    }
  }
  fail('tokenwarden serve runs the edge limiter on workerd, which is not installed: npm i workerd (or set WORKERD to its binary)', 1)
}

/** A capnp text literal (the values here are paths and names: no quotes or control characters). */
function capnpString(s) {
  if (/["\\\n\r\0]/.test(s)) fail(`cannot use ${JSON.stringify(s)} in the workerd config`)
  return `"${s}"`
}

function writeConfig({ data, fleets, host, port }) {
  const bundle = join(here, '..', 'serve')
  if (!existsSync(join(bundle, 'worker.js'))) fail(`the Worker bundle is missing (${bundle}): this package was not built (npm run build)`, 1)
  const workerDir = join(data, 'worker')
  rmSync(workerDir, { recursive: true, force: true })
  mkdirSync(workerDir, { recursive: true })
  const modules = []
  for (const f of readdirSync(bundle)) {
    copyFileSync(join(bundle, f), join(workerDir, f))
    if (f === 'worker.js') modules.unshift(`(name = "worker.js", esModule = embed "worker/worker.js")`)
    else if (f.endsWith('.wasm')) modules.push(`(name = ${capnpString(f)}, wasm = embed ${capnpString(`worker/${f}`)})`)
  }
  writeFileSync(join(data, 'fleets.json'), JSON.stringify(fleets), { mode: 0o600 })
  const storage = join(data, 'storage')
  mkdirSync(storage, { recursive: true })
  // Outbound calls go only where the operator's config points: the public internet, and
  // loopback when an upstream is on this machine (a local provider or a test's mock).
  const upstreams = Object.values(fleets).flatMap((f) => Object.values(f?.quotas ?? {}).map((q) => q?.upstream)).filter(Boolean)
  const local = upstreams.some((u) => {
    try {
      return LOOPBACK.has(new URL(u).hostname.replace(/^\[|\]$/g, ''))
    } catch {
      return false
    }
  })
  const allow = local ? '["public", "local"]' : '["public"]'
  const address = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`
  const capnp = `# Generated by tokenwarden serve; rewritten at every start.
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "limiter", worker = .limiter),
    (name = "storage", disk = (path = ${capnpString(storage)}, writable = true)),
    (name = "upstream", network = (allow = ${allow}, tlsOptions = (trustBrowserCas = true))),
  ],
  sockets = [(name = "http", address = ${capnpString(address)}, http = (), service = "limiter")],
);

const limiter :Workerd.Worker = (
  modules = [
    ${modules.join(',\n    ')},
  ],
  compatibilityDate = "2025-12-01",
  compatibilityFlags = ["enable_request_signal"],
  bindings = [
    (name = "TOKENWARDEN_FLEETS", text = embed "fleets.json"),
    (name = "QUOTAS", durableObjectNamespace = "QuotaObject"),
  ],
  durableObjectNamespaces = [(className = "QuotaObject", uniqueKey = "tokenwarden-quota-v1")],
  durableObjectStorage = (localDisk = "storage"),
  globalOutbound = "upstream",
);
`
  const file = join(data, 'workerd.capnp')
  writeFileSync(file, capnp)
  return file
}

function banner(fleets, origin) {
  const lines = [`tokenwarden serve: the edge limiter on ${origin}`]
  for (const [fleet, f] of Object.entries(fleets)) {
    for (const quota of Object.keys(f.quotas ?? {})) {
      const base = `${origin}/v1/fleets/${fleet}/quotas/${quota}`
      const provider = /openai/i.test(f.quotas[quota]?.upstream ?? '') || f.quotas[quota]?.config?.pools?.[0]?.counting === 'openai' ? 'openai' : 'anthropic'
      const env = provider === 'openai' ? 'OPENAI_BASE_URL' : 'ANTHROPIC_BASE_URL'
      lines.push(``, `fleet ${fleet}, quota ${quota}${f.proxy_open ? '' : ' (proxied calls need x-tokenwarden-token: the fleet secret)'}`)
      lines.push(`  ${env}=${base}/agents/<agent>/<role>/${provider}`)
      lines.push(`  dashboard: ${base}/dashboard   metrics: ${base}/metrics (Authorization: Bearer <fleet secret>)`)
    }
  }
  lines.push('', 'Ctrl-C stops it; leases, tickets and debt are kept on disk for the next start.')
  return lines.join('\n')
}

async function serve(opts) {
  const data = resolve(opts.data)
  mkdirSync(data, { recursive: true })
  const fleets = loadFleets(opts, data)
  if (!LOOPBACK.has(opts.host)) {
    const open = Object.entries(fleets).filter(([, f]) => f?.proxy_open === true).map(([n]) => n)
    if (open.length > 0) fail(`fleet ${open.join(', ')} takes proxied calls with no secret (proxy_open): serve it on loopback only, not on ${opts.host}`)
  }
  const bin = workerdBinary()
  const config = writeConfig({ data, fleets, host: opts.host, port: opts.port })
  const child = spawn(bin, ['serve', config, '--experimental'], { stdio: ['ignore', 'inherit', 'pipe'] })
  let printed = false
  const origin = `http://${opts.host.includes(':') ? `[${opts.host}]` : opts.host}:${opts.port}`
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (chunk) => {
    process.stderr.write(chunk)
  })
  child.on('error', (e) => fail(`cannot start workerd (${bin}): ${e.message}`, 1))
  // Ready once the socket answers.
  const ready = async () => {
    for (let i = 0; i < 200 && child.exitCode === null; i++) {
      try {
        const r = await fetch(`${origin}/healthz`)
        if (r.ok) return true
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 50))
    }
    return false
  }
  if (opts.port !== 0 && (await ready())) {
    console.log(banner(fleets, origin))
    printed = true
  }
  if (!printed && child.exitCode === null) console.log(`tokenwarden serve: workerd started (${config})`)
  let stopping = false
  const stop = (signal) => {
    if (stopping) return
    stopping = true
    child.kill(signal)
  }
  process.on('SIGINT', () => stop('SIGINT'))
  process.on('SIGTERM', () => stop('SIGTERM'))
  child.on('exit', (code, signal) => {
    if (stopping) {
      console.log('tokenwarden serve: stopped')
      process.exit(0)
    }
    fail(`workerd exited (${signal ?? `code ${code}`})`, 1)
  })
}

await serve(parseArgs(process.argv.slice(2)))
