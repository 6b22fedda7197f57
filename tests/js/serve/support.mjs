// What the serve suites and measurements share: a free loopback port, `tokenwarden serve`
// started and stopped as its users do (Ctrl-C), and headless Claude Code runs.
import { execFileSync, spawn } from 'node:child_process'
import { mkdirSync } from 'node:fs'
import { createRequire } from 'node:module'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** The CLI of the npm package, as `npx tokenwarden` runs it. */
export const cli = fileURLToPath(new URL('../../../bindings-node/bin/tokenwarden.mjs', import.meta.url))

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
  return new Promise((resolve) => {
    const child = spawn(bin, ['-p', prompt, '--allowedTools', 'Bash', ...extra], {
      cwd: work,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH, HOME: home, TMPDIR: dir, ANTHROPIC_BASE_URL: baseUrl, ANTHROPIC_API_KEY: 'sk-ant-dummy', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' },
    })
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
      resolve({ code, signal, stdout, stderr, work })
    })
  })
}
