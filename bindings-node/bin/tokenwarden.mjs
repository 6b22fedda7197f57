#!/usr/bin/env node
// `tokenwarden serve`: one local limiter for a fleet of CLI agents and programs in any
// language, which join it by changing their base URL. It runs native `tokenwarden serve`
// (the Rust binary of this platform's package, `tokenwarden-<platform>`: hyper on the
// tokio host, the same HTTP API as the edge Worker); with `--runtime workerd`, or on a
// platform without the binary, the edge limiter's Worker on self-hosted workerd (the npm
// package `workerd`, Cloudflare's open-source Workers runtime). State is on disk under
// --data, so a restart keeps every lease, ticket and debt.
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { lookup } from 'node:dns/promises'
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { createServer, isIP } from 'node:net'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const HELP = `usage: tokenwarden serve [--config tokenwarden.json] [--port 8787] [--host 127.0.0.1] [--data DIR] [--runtime native|workerd]
       tokenwarden plan FLEET.json [--json]
       tokenwarden --version

plan: sizes a fleet before it runs, with the core's arithmetic. FLEET.json is
  { "pool": { "name": "key", "input_tokens_per_minute": 400000, ... },
    "agents": [{ "name": "worker", "count": 20, "calls_per_minute_milli": 667,
                 "input_tokens_first": 2000, "input_tokens_last": 60000, "output_tokens": 1000,
                 "cached_permille": 0, "call_ms": 20000, "fan_out": 0 }],
    "headroom_permille": 750 }
  and the answer is each limit's late-session demand and share, the binding limit, how
  many agents of the same mix fit at the headroom, and how much turns stretch if too many.

Runs the limiter on this machine and prints the base URLs agents use:
  ANTHROPIC_BASE_URL=http://127.0.0.1:8787/v1/fleets/<fleet>/quotas/<quota>/agents/<agent>/<role>/anthropic
  OPENAI_BASE_URL=http://127.0.0.1:8787/v1/fleets/<fleet>/quotas/<quota>/agents/<agent>/<role>/openai

  --config FILE  fleets, quotas and upstreams ({ "fleets": { ... } }, the edge limiter's
                 TOKENWARDEN_FLEETS), checked before anything starts (exit 2 naming the
                 field); default: fleet "local" with quotas "anthropic" and "openai" on the
                 providers' APIs, limits learned from their headers
  --port N       default 8787; 0: a free port, printed in the banner (a port in use: exit 1)
  --host ADDR    default 127.0.0.1; a fleet with "proxy_open" is refused on any other
  --data DIR     state (leases, tickets, debt), the fleets with their secrets and the
                 generated workerd config, all owner-only (0700/0600); default ./.tokenwarden
  --runtime R    native (default where this platform's package has the binary: no
                 workerd needed) or workerd (the edge Worker on workerd: npm i workerd);
                 default from TOKENWARDEN_SERVE_RUNTIME
  --version      print the version and exit`

const here = dirname(fileURLToPath(import.meta.url))

/** Ends the run with one line on stderr: exit 2 for bad input (arguments, config), 1 for the machine. */
function fail(message, code = 2) {
  console.error(`tokenwarden: ${String(message).replace(/\s*\n\s*/g, ' ')}`)
  process.exit(code)
}

function version() {
  return JSON.parse(readFileSync(join(here, '..', 'package.json'), 'utf8')).version
}

function parseArgs(argv) {
  const [command, ...rest] = argv
  if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
    console.log(HELP)
    process.exit(0)
  }
  if (command === '--version') {
    console.log(`tokenwarden ${version()}`)
    process.exit(0)
  }
  if (command !== 'serve') fail(`unknown command ${JSON.stringify(command)} (try --help: serve, plan)`)
  const opts = { config: null, port: 8787, host: '127.0.0.1', data: '.tokenwarden', runtime: process.env.TOKENWARDEN_SERVE_RUNTIME || null, args: rest }
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
    } else if (flag === '--version') {
      console.log(`tokenwarden ${version()}`)
      process.exit(0)
    } else if (flag === '--config') opts.config = value()
    else if (flag === '--data') opts.data = value()
    else if (flag === '--host') opts.host = value()
    else if (flag === '--runtime') opts.runtime = value()
    else if (flag === '--port') {
      const v = value()
      if (!/^\d{1,5}$/.test(v) || Number(v) > 65535) fail(`--port must be a port number (0 to 65535), got ${JSON.stringify(v)}`)
      opts.port = Number(v)
    } else fail(`unknown option ${JSON.stringify(flag)} (try --help)`)
  }
  if (isIP(opts.host) === 0 && opts.host !== 'localhost') fail(`--host must be an IP address, got ${JSON.stringify(opts.host)}`)
  if (opts.runtime !== null && opts.runtime !== 'native' && opts.runtime !== 'workerd') fail(`--runtime must be native or workerd, got ${JSON.stringify(opts.runtime)}`)
  return opts
}

/** This machine's platform as the per-platform packages name it (`linux-x64-gnu`, …). */
function platformKey() {
  const libc = process.platform === 'linux' ? (process.report?.getReport?.()?.header?.glibcVersionRuntime ? '-gnu' : '-musl') : ''
  return `${process.platform}-${process.arch}${libc}`
}

/**
 * Native `tokenwarden serve`: $TOKENWARDEN_SERVE_BIN, else the binary beside this package
 * (a build from the repository: `tokenwarden-serve.<platform>`), else the one in this
 * platform's package (`tokenwarden-<platform>/tokenwarden-serve`); null when none is.
 */
function nativeBinary() {
  if (process.env.TOKENWARDEN_SERVE_BIN) return process.env.TOKENWARDEN_SERVE_BIN
  const key = platformKey()
  const local = join(here, '..', `tokenwarden-serve.${key}`)
  if (existsSync(local)) return local
  try {
    const pkg = createRequire(join(here, '..', 'package.json')).resolve(`tokenwarden-${key}/package.json`)
    const bin = join(dirname(pkg), 'tokenwarden-serve')
    if (existsSync(bin)) return bin
  } catch {
    // no package for this platform
  }
  return null
}

/**
 * Runs native serve with the arguments given (it checks them and the config itself, with
 * the same rules: the gateway crate's), its output and exit status passed through; Ctrl-C
 * and SIGTERM stop it (its state is written first).
 */
function serveNative(bin, args) {
  const child = spawn(bin, ['serve', ...args], { stdio: 'inherit' })
  child.on('error', (e) => fail(`cannot start ${bin}: ${e.message}`, 1))
  for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill(signal))
  child.on('exit', (code, signal) => process.exit(code ?? (signal === 'SIGINT' || signal === 'SIGTERM' ? 0 : 1)))
}

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost'])

/** Reads --config: `{ text, source }`, `source` naming the file in error messages. */
function readConfig(file) {
  try {
    return { text: readFileSync(file, 'utf8'), source: `--config ${file}` }
  } catch (e) {
    fail(`cannot read --config ${file}: ${e.message}`)
  }
}

/**
 * The default fleet `local`, its secret kept in `<data>/secret`: made on the first start
 * (0600); one that other users can read or change is refused, not fixed, since it may
 * already have been seen: the operator chmods it or deletes it for a new one.
 */
function defaultFleets(data) {
  const file = join(data, 'secret')
  let st = null
  try {
    st = statSync(file)
  } catch (e) {
    if (e.code !== 'ENOENT') fail(`cannot read ${file}: ${e.message}`, 1)
  }
  if (st === null) {
    try {
      writeFileSync(file, `${randomBytes(24).toString('base64url')}\n`, { mode: 0o600, flag: 'wx' })
      chmodSync(file, 0o600)
    } catch (e) {
      fail(`cannot write the fleet secret to ${file}: ${e.message}`, 1)
    }
  } else if (!st.isFile()) {
    fail(`${file} must be a file holding the fleet secret`)
  } else if ((st.mode & 0o077) !== 0) {
    const how = (st.mode & 0o044) !== 0 ? 'read' : 'changed'
    fail(`${file} can be ${how} by other users (mode ${octal(st.mode & 0o777)}), and it holds the fleet secret: chmod 600 ${file} (or delete it to have a new secret made)`)
  }
  let secret
  try {
    secret = readFileSync(file, 'utf8').trim()
  } catch (e) {
    fail(`cannot read ${file}: ${e.message}`, 1)
  }
  const fleets = {
    local: {
      secret,
      proxy_open: true,
      quotas: {
        anthropic: { upstream: 'https://api.anthropic.com', config: { pools: [{ name: 'default' }] } },
        openai: { upstream: 'https://api.openai.com', config: { pools: [{ name: 'default', counting: 'openai' }] } },
      },
    },
  }
  return { text: JSON.stringify({ fleets }), source: `the default fleet (its secret from ${file})`, builtIn: true }
}

const octal = (mode) => `0${mode.toString(8).padStart(3, '0')}`

/**
 * Checks the whole configuration before anything starts, as the limiter will read it, by
 * the gateway crate's rule on the file's own text (`checkFleets`: every key known, secrets,
 * upstreams, timeouts, each quota's core `config` as a coordinator would be created from
 * it), then each upstream's host resolving (not for the built-in default, whose hosts are
 * the providers': offline, the lease API still serves). Answers the fleets; exits 2 naming
 * the place.
 */
async function validate({ text, source, builtIn = false }) {
  let checkFleets
  try {
    ;({ checkFleets } = await import('../dist/index.js'))
  } catch (e) {
    fail(`cannot load the engine to check the config (${e.message}): this package was not built (npm run build)`, 1)
  }
  let fleets
  try {
    fleets = checkFleets(text, { serveFile: true })
  } catch (e) {
    fail(`${source}: ${e.message}`)
  }
  if (builtIn) return fleets
  const quotas = Object.entries(fleets).flatMap(([fleet, f]) => Object.entries(f.quotas).map(([quota, q]) => ({ at: `fleets.${fleet}.quotas.${quota}`, q })))
  const looked = await Promise.all(quotas.filter(({ q }) => q.upstream !== undefined).map(async ({ at, q }) => ({ at, q, error: await resolves(new URL(q.upstream).hostname) })))
  for (const { at, q, error } of looked) {
    if (error !== null) fail(`${source}: ${at}.upstream: ${new URL(q.upstream).hostname} (in ${q.upstream}) does not resolve (${error})`)
  }
  return fleets
}

/** null when `host` resolves (an IP address and loopback always do), else why not. */
async function resolves(host) {
  const name = host.replace(/^\[|\]$/g, '')
  if (isIP(name) !== 0 || LOOPBACK.has(name)) return null
  let timer
  const timeout = new Promise((r) => {
    timer = setTimeout(() => r('no answer in 10 s'), 10_000)
  })
  try {
    return await Promise.race([lookup(name).then(() => null, (e) => e.code ?? e.message), timeout])
  } finally {
    clearTimeout(timer)
  }
}

/**
 * Binds host:port for a moment, before workerd is started on it: a port in use is one clear
 * line (exit 1) instead of workerd's bind error, and port 0 becomes the free port the
 * system gave, which workerd then takes and the banner prints.
 */
async function reservePort(host, port) {
  const server = createServer()
  try {
    await new Promise((resolve, reject) => {
      server.once('error', reject)
      server.listen({ host, port, exclusive: true }, resolve)
    })
  } catch (e) {
    if (e.code === 'EADDRINUSE') fail(`port ${port} on ${host} is in use (EADDRINUSE); pick another with --port`, 1)
    if (e.code === 'EACCES') fail(`cannot listen on port ${port} on ${host} (EACCES: a port below 1024 needs privileges); pick another with --port`, 1)
    if (e.code === 'EADDRNOTAVAIL') fail(`cannot listen on ${host} (EADDRNOTAVAIL: not an address of this machine); pick another with --host`, 1)
    fail(`cannot listen on port ${port} on ${host} (${e.code ?? e.message})`, 1)
  }
  const got = server.address().port
  await new Promise((r) => server.close(r))
  return got
}

/** A directory only its owner can enter (0700), whatever the umask and whatever it was before. */
function privateDir(dir) {
  try {
    makeDirs(resolve(dir))
    chmodSync(dir, 0o700)
  } catch (e) {
    fail(`cannot make ${dir} a private directory (mkdir, chmod 700): ${e.message}`, 1)
  }
}

/**
 * `mkdir -p` one level at a time (owner-only): Node's recursive `mkdirSync` never returns
 * for a path under /proc (it retries the parent it cannot create), where this fails at once.
 */
function makeDirs(dir) {
  const parent = dirname(dir)
  if (existsSync(dir)) return
  if (parent !== dir) makeDirs(parent)
  mkdirSync(dir, { mode: 0o700 })
}

/**
 * Writes `text` to `file` as an owner-only file (0600): written to a new file beside it and
 * renamed over it, so a file that was there with a wider mode never holds the new text.
 */
function writePrivate(file, text) {
  const tmp = `${file}.${process.pid}.tmp`
  try {
    rmSync(tmp, { force: true })
    writeFileSync(tmp, text, { mode: 0o600, flag: 'wx' })
    chmodSync(tmp, 0o600)
    renameSync(tmp, file)
  } catch (e) {
    rmSync(tmp, { force: true })
    fail(`cannot write ${file}: ${e.message}`, 1)
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
  privateDir(workerDir)
  const modules = []
  // The Worker, its wasm and the tokenizer's ranks.
  for (const f of readdirSync(bundle)) {
    if (f === 'worker.js') modules.unshift(`(name = "worker.js", esModule = embed "worker/worker.js")`)
    else if (f.endsWith('.wasm')) modules.push(`(name = ${capnpString(f)}, wasm = embed ${capnpString(`worker/${f}`)})`)
    else if (f.endsWith('.bpe')) modules.push(`(name = ${capnpString(f)}, data = embed ${capnpString(`worker/${f}`)})`)
    else continue
    copyFileSync(join(bundle, f), join(workerDir, f))
    chmodSync(join(workerDir, f), 0o600)
  }
  writePrivate(join(data, 'fleets.json'), JSON.stringify(fleets))
  const storage = join(data, 'storage')
  privateDir(storage)
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
  # A young generation of 1 MiB a half instead of V8's 16: the Worker's requests allocate
  # little that lives, and a grown young generation is memory never given back (30,000
  # requests answered 401 grew a warm workerd by 80 MiB with the default, 10 MiB with this,
  # calls per second unchanged: tests/js/serve/bench.mjs, BENCHMARKS.md).
  v8Flags = ["--max-semi-space-size=1"],
);

const limiter :Workerd.Worker = (
  modules = [
    ${modules.join(',\n    ')},
  ],
  compatibilityDate = "2025-12-01",
  compatibilityFlags = ["enable_request_signal"],
  bindings = [
    (name = "TOKENWARDEN_FLEETS", text = embed "fleets.json"),
    (name = "TOKENWARDEN_WAIT_LOG", text = "1"),
    (name = "QUOTAS", durableObjectNamespace = "QuotaObject"),
  ],
  durableObjectNamespaces = [(className = "QuotaObject", uniqueKey = "tokenwarden-quota-v1")],
  durableObjectStorage = (localDisk = "storage"),
  globalOutbound = "upstream",
);
`
  const file = join(data, 'workerd.capnp')
  writePrivate(file, capnp)
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
  if (opts.runtime !== 'workerd') {
    const bin = nativeBinary()
    if (bin !== null) return serveNative(bin, opts.args.filter((a, i, all) => a !== '--runtime' && all[i - 1] !== '--runtime'))
    if (opts.runtime === 'native') fail(`native tokenwarden serve is not installed for ${platformKey()} (the package tokenwarden-${platformKey()} has no tokenwarden-serve): use --runtime workerd`, 1)
  }
  // Whatever workerd and this process create under the data directory (its storage among
  // them) is owner-only, whatever umask it was started with.
  process.umask(0o077)
  const data = resolve(opts.data)
  let loaded
  if (opts.config !== null) loaded = readConfig(opts.config)
  else {
    privateDir(data)
    loaded = defaultFleets(data)
  }
  const fleets = await validate(loaded)
  if (!LOOPBACK.has(opts.host)) {
    const open = Object.entries(fleets).filter(([, f]) => f?.proxy_open === true).map(([n]) => n)
    if (open.length > 0) fail(`fleet ${open.join(', ')} takes proxied calls with no secret (proxy_open): serve it on loopback only, not on ${opts.host}`)
  }
  const bin = workerdBinary()
  const port = await reservePort(opts.host, opts.port)
  privateDir(data)
  const config = writeConfig({ data, fleets, host: opts.host, port })
  const child = spawn(bin, ['serve', config, '--experimental'], { stdio: ['ignore', 'inherit', 'pipe'] })
  let stopping = false
  const origin = `http://${opts.host.includes(':') ? `[${opts.host}]` : opts.host}:${port}`
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (chunk) => {
    process.stderr.write(chunk)
  })
  child.on('error', (e) => fail(`cannot start workerd (${bin}): ${e.message}`, 1))
  // Ready once the socket answers: then the banner.
  void (async () => {
    for (let i = 0; child.exitCode === null && !stopping; i++) {
      try {
        const r = await fetch(`${origin}/healthz`)
        if (r.ok) {
          console.log(banner(fleets, origin))
          return
        }
      } catch {
        // not listening yet
      }
      if (i === 200) console.error(`tokenwarden serve: workerd (${config}) is not answering on ${origin} yet; still waiting`)
      await new Promise((r) => setTimeout(r, i < 200 ? 50 : 500))
    }
  })()
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

/** `tokenwarden plan FLEET.json [--json]`: the core's fleet sizing, printed. */
async function plan(args) {
  const json = args.includes('--json')
  const files = args.filter((a) => a !== '--json')
  for (const a of files) if (a.startsWith('-')) fail(`unknown option ${JSON.stringify(a)} for plan (try --help)`)
  if (files.length !== 1) fail('plan takes one fleet description file (try --help)')
  let text
  try {
    text = readFileSync(files[0], 'utf8')
  } catch (e) {
    fail(`cannot read ${files[0]}: ${e.message}`)
  }
  const { planFleet } = await import(pathToFileURL(join(here, '..', 'dist', 'index.js')).href)
  let p
  try {
    p = planFleet(text)
  } catch (e) {
    fail(`${files[0]}: ${e.message}`)
  }
  if (json) {
    console.log(JSON.stringify(p, null, 2))
    return
  }
  const described = JSON.parse(text)
  const headroom = (described.headroom_permille ?? 750) / 10
  const unit = (axis) => (axis === 'concurrent' ? 'in flight' : '/min')
  const lines = [`${p.agents} agents, late in their sessions:`]
  for (const a of p.axes) {
    lines.push(`  ${a.axis.padEnd(14)} ${String(a.demand).padStart(10)} ${unit(a.axis).padEnd(9)} of ${String(a.limit).padStart(9)}  ${(a.usedPermille / 10).toFixed(1).padStart(6)} %${a.axis === p.bindingAxis ? '  <- binds first' : ''}`)
  }
  lines.push(p.fits ? `fits within ${headroom} % of every limit` : `does not fit within ${headroom} % of every limit`)
  lines.push(`agents of this mix that fit at ${headroom} %: ${p.agentsThatFit ?? 'any number (the fleet uses no limited axis)'}`)
  if (p.turnStretchPermille > 1000) {
    lines.push(`over the limit: nobody gets a 429 through tokenwarden, but each turn takes ${(p.turnStretchPermille / 1000).toFixed(2)}x as long, waiting for quota`)
  }
  console.log(lines.join('\n'))
}

const argv = process.argv.slice(2)
if (argv[0] === 'plan') await plan(argv.slice(1))
else await serve(parseArgs(argv))
