// What the serve suites and measurements share: a free loopback port, `tokenwarden serve`
// started and stopped as its users do (Ctrl-C), and headless Claude Code runs.
import { execFile, execFileSync, spawn } from 'node:child_process'
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** The CLI of the npm package, as `npx tokenwarden` runs it. */
export const cli = fileURLToPath(new URL('../../../bindings-node/bin/tokenwarden.mjs', import.meta.url))

/**
 * Whether `tokenwarden serve` runs native serve here (the default where the binary is
 * built: bindings-node/tokenwarden-serve.<platform> or TOKENWARDEN_SERVE_BIN) rather than
 * the edge Worker on workerd (TOKENWARDEN_SERVE_RUNTIME=workerd).
 */
export const nativeServe =
  process.env.TOKENWARDEN_SERVE_RUNTIME !== 'workerd' &&
  (Boolean(process.env.TOKENWARDEN_SERVE_BIN) ||
    readdirSync(fileURLToPath(new URL('../../../bindings-node/', import.meta.url))).some((f) => f.startsWith('tokenwarden-serve.')))

/** A TCP port free on 127.0.0.1 right now. */
export async function freePort() {
  const s = createServer()
  await new Promise((r) => s.listen(0, '127.0.0.1', r))
  const { port } = s.address()
  await new Promise((r) => s.close(r))
  return port
}

/**
 * Starts `tokenwarden serve` (`bin`: another CLI to run, e.g. a copy's); resolves once it
 * printed its base URLs with `{ child, out }`, `out()` what it printed so far (stdout and
 * stderr), rejects if it exits before.
 */
export function serve(args, { bin = cli, env = process.env } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bin, 'serve', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env })
    let out = ''
    child.stdout.on('data', (d) => {
      out += d
      if (out.includes('Ctrl-C stops it')) resolve({ child, out: () => out })
    })
    child.stderr.on('data', (d) => {
      out += d
    })
    child.on('exit', (code) => reject(new Error(`serve exited (${code}) before it was ready: ${out}`)))
  })
}

/**
 * `tokenwarden serve` for one fleet (`ci`, secret `secret`, proxy mode open) with `quotas`
 * (the config's `quotas` object), in a temporary data directory on a free port: resolves to
 * `{ origin, server, close() }`; `close()` stops it (Ctrl-C) and removes the directory.
 */
export async function serveFleet(quotas, secret, prefix = 'tokenwarden-serve-') {
  const data = mkdtempSync(join(tmpdir(), prefix))
  const config = join(data, 'tokenwarden.json')
  writeFileSync(config, JSON.stringify({ fleets: { ci: { secret, proxy_open: true, quotas } } }))
  const port = await freePort()
  try {
    const server = await serve(['--config', config, '--port', String(port), '--data', join(data, 'state')])
    return {
      origin: `http://127.0.0.1:${port}`,
      server,
      async close() {
        await stop(server.child)
        rmSync(data, { recursive: true, force: true })
      },
    }
  } catch (e) {
    rmSync(data, { recursive: true, force: true })
    throw e
  }
}

/**
 * CPU seconds (user + system) used so far by process `pid` and its live descendants (Linux
 * `/proc`; null elsewhere): what serve's CLI and its workerd have cost.
 */
export function cpuSeconds(pid) {
  let entries
  try {
    entries = readdirSync('/proc').filter((d) => /^\d+$/.test(d))
  } catch {
    return null
  }
  const ticks = 100 // USER_HZ on Linux
  const stats = new Map()
  for (const d of entries) {
    try {
      // pid (comm) state ppid … utime stime: fields after the command's closing parenthesis.
      const raw = readFileSync(`/proc/${d}/stat`, 'utf8')
      const f = raw.slice(raw.lastIndexOf(')') + 2).split(' ')
      stats.set(Number(d), { ppid: Number(f[1]), cpu: Number(f[11]) + Number(f[12]) })
    } catch {}
  }
  let total = 0
  const todo = [pid]
  while (todo.length > 0) {
    const p = todo.pop()
    total += stats.get(p)?.cpu ?? 0
    for (const [c, s] of stats) if (s.ppid === p) todo.push(c)
  }
  return total / ticks
}

/** Stops a child as Ctrl-C does; resolves with its exit code. */
export function stop(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve(child.exitCode)
    child.removeAllListeners('exit')
    child.on('exit', (code) => resolve(code))
    child.kill('SIGINT')
  })
}

/** The native Claude Code binary of this platform's package, or `{ bin: null, why }`. */
export function claudeBinary() {
  const require = createRequire(import.meta.url)
  const tried = []
  for (const suffix of ['', '-musl']) {
    const pkg = `@anthropic-ai/claude-code-${process.platform}-${process.arch}${suffix}`
    try {
      const bin = join(dirname(require.resolve(`${pkg}/package.json`)), process.platform === 'win32' ? 'claude.exe' : 'claude')
      const version = execFileSync(bin, ['--version'], { encoding: 'utf8', timeout: 30_000, env: { PATH: process.env.PATH, HOME: tmpdir() } })
      return { bin, version: version.trim() }
    } catch (e) {
      tried.push(`${pkg}: ${String(e?.message ?? e).split('\n')[0]}`)
    }
  }
  return { bin: null, why: tried.join('; ') }
}

/**
 * One headless `claude -p` run with the Bash tool allowed: its own HOME and working
 * directory under `dir`, nothing of this process's environment but PATH. Resolves with its
 * exit, output and working directory (killed after `timeoutMs`).
 */
export function runClaude(bin, dir, baseUrl, { extra = [], prompt = 'Run the shell command the task needs, then say what it printed.', timeoutMs = 120_000 } = {}) {
  const home = join(dir, 'home')
  const work = join(dir, 'work')
  mkdirSync(home, { recursive: true })
  mkdirSync(work, { recursive: true })
  const env = { PATH: process.env.PATH, HOME: home, TMPDIR: dir, ANTHROPIC_BASE_URL: baseUrl, ANTHROPIC_API_KEY: 'sk-ant-dummy', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' }
  return runChild(bin, ['-p', prompt, '--allowedTools', 'Bash', ...extra], { cwd: work, env, timeoutMs }).then((r) => ({ ...r, work }))
}

/** The @openai/codex launcher and its version, or null with why it cannot run. */
export function codexCli() {
  const require = createRequire(import.meta.url)
  let js
  try {
    js = join(require.resolve('@openai/codex/package.json'), '..', 'bin', 'codex.js')
  } catch {
    return { js: null, why: '@openai/codex is not installed (npm ci at the repository root installs it)' }
  }
  try {
    const version = execFileSync(process.execPath, [js, '--version'], { encoding: 'utf8', timeout: 30_000, env: { PATH: process.env.PATH, HOME: tmpdir() } })
    return { js, version: version.trim() }
  } catch (e) {
    return { js: null, why: `@openai/codex cannot run on this platform: ${String(e?.message ?? e).split('\n')[0]}` }
  }
}

/**
 * One `codex exec` (`js`: the launcher from codexCli()) of `prompt` with `model`: its own
 * HOME and CODEX_HOME, nothing of this process's environment but PATH. `provider`: `custom` (a model provider of its own, `wire_api = "responses"`, the key
 * in an env var; `websockets` sets its `supports_websockets`) or `builtin` (the built-in
 * OpenAI provider with `openai_base_url` and CODEX_API_KEY, WebSockets on by default).
 */
export function runCodexExec(js, dir, baseUrl, { model, provider, websockets = false, key, prompt = 'Say hello in one line.', timeoutMs = 120_000 }) {
  const home = join(dir, 'home')
  const codexHome = join(home, '.codex')
  const work = join(dir, 'work')
  mkdirSync(codexHome, { recursive: true })
  mkdirSync(work, { recursive: true })
  const config =
    provider === 'builtin'
      ? `model = "${model}"\nopenai_base_url = "${baseUrl}"\n`
      : `model = "${model}"\nmodel_provider = "tw"\n\n[model_providers.tw]\nname = "tokenwarden"\nbase_url = "${baseUrl}"\nenv_key = "TW_OPENAI_KEY"\nwire_api = "responses"\nsupports_websockets = ${websockets}\n`
  writeFileSync(join(codexHome, 'config.toml'), config)
  const env = { PATH: process.env.PATH, HOME: home, CODEX_HOME: codexHome, TMPDIR: dir, ...(provider === 'builtin' ? { CODEX_API_KEY: key } : { TW_OPENAI_KEY: key }) }
  return runChild(process.execPath, [js, 'exec', '--skip-git-repo-check', prompt], { cwd: work, env, timeoutMs })
}

/**
 * Runs a program to its exit (killed after `timeoutMs`); resolves with its exit code or
 * signal, what it printed and how long it ran.
 */
function runChild(cmd, args, { cwd, env, timeoutMs }) {
  return new Promise((resolve) => {
    const started = performance.now()
    const child = spawn(cmd, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d) => {
      stdout += d
    })
    child.stderr.on('data', (d) => {
      stderr += d
    })
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr, ms: performance.now() - started })
    })
  })
}

/**
 * redis-server (`TOKENWARDEN_REDIS_SERVER` for another, e.g. valkey-server) on loopback port
 * `port`, without persistence; resolves with its child once it answers PING (redis-cli).
 */
export async function startRedis(port) {
  const bin = process.env.TOKENWARDEN_REDIS_SERVER ?? 'redis-server'
  const child = spawn(bin, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' })
  child.on('error', () => {})
  for (let i = 0; i < 200; i++) {
    const pong = await new Promise((resolve) => execFile('redis-cli', ['-p', String(port), 'ping'], (err, out) => resolve(!err && out.trim() === 'PONG')))
    if (pong) return child
    await new Promise((r) => setTimeout(r, 25))
  }
  child.kill('SIGKILL')
  throw new Error(`${bin} did not answer on 127.0.0.1:${port} (install it: apt-get install redis-server; scripts/test.sh does)`)
}
