// `tokenwarden serve`'s command line and files: a bad config, a port in use and the data
// directory's permissions are dealt with before workerd starts; `--port 0` and `--version`.
// Needs only WORKERD (the workerd binary; the test script sets it), not Python.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { nativeServe } from './support.mjs'

const cli = fileURLToPath(new URL('../../../bindings-node/bin/tokenwarden.mjs', import.meta.url))
const pkg = JSON.parse(readFileSync(fileURLToPath(new URL('../../../bindings-node/package.json', import.meta.url)), 'utf8'))
const skip = process.env.WORKERD ? false : 'set WORKERD to the workerd binary'
const SECRET = 'cli-test-secret-0123456789'
const READY = 'Ctrl-C stops it'

/**
 * Spawns the CLI (under `umask` when given, through a shell that then execs it) in a process
 * group of its own, so that Ctrl-C can be sent as a terminal sends it: to the CLI and
 * workerd together.
 */
function spawnCli(args, umask, env) {
  const argv = [cli, ...args]
  const options = { stdio: /** @type {const} */ (['ignore', 'pipe', 'pipe']), detached: true, ...(env === undefined ? {} : { env: { ...process.env, ...env } }) }
  return umask === undefined ? spawn(process.execPath, argv, options) : spawn('sh', ['-c', `umask ${umask}; exec "$0" "$@"`, process.execPath, ...argv], options)
}

/** Ctrl-C: SIGINT to the CLI's process group. */
function ctrlC(child) {
  try {
    process.kill(-child.pid, 'SIGINT')
  } catch {
    // already gone
  }
}

/**
 * Runs the CLI to its end: `{ code, stdout, stderr, started }`. A run that gets as far as
 * serving (its banner, or the line it prints when workerd runs without answering) is stopped
 * with Ctrl-C and has `started` true.
 */
function run(args, { umask, env } = {}) {
  const child = spawnCli(args, umask, env)
  let stdout = ''
  let stderr = ''
  let started = false
  child.stdout.on('data', (d) => {
    stdout += d
    if (!started && (stdout.includes(READY) || stdout.includes('workerd started'))) {
      started = true
      ctrlC(child)
    }
  })
  child.stderr.on('data', (d) => {
    stderr += d
  })
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr, started })))
}

/** Starts serve; resolves once it printed its banner (rejects if it ends or runs without one). */
function serve(args, { umask } = {}) {
  const child = spawnCli(['serve', ...args], umask)
  return new Promise((resolve, reject) => {
    let out = ''
    let err = ''
    child.stdout.on('data', (d) => {
      out += d
      if (out.includes(READY)) resolve({ child, out })
      else if (out.includes('workerd started')) {
        ctrlC(child)
        reject(new Error(`serve runs without its banner: ${out}${err}`))
      }
    })
    child.stderr.on('data', (d) => {
      err += d
    })
    child.on('exit', (code) => reject(new Error(`serve exited (${code}) before it was ready: ${out}${err}`)))
  })
}

/** Stops serve as Ctrl-C does; resolves with its exit code. */
function stop(child) {
  return new Promise((resolve) => {
    child.removeAllListeners('exit')
    if (child.exitCode !== null) return resolve(child.exitCode)
    child.on('exit', (code) => resolve(code))
    ctrlC(child)
  })
}

async function freePort() {
  const s = createServer()
  await new Promise((r) => s.listen(0, '127.0.0.1', r))
  const { port } = s.address()
  await new Promise((r) => s.close(r))
  return port
}

const mode = (path) => statSync(path).mode & 0o777
const octal = (m) => `0${m.toString(8)}`

/** Every file and directory under `dir`, recursively. */
function walk(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name)
    return e.isDirectory() ? [p, ...walk(p)] : [p]
  })
}

// A run that hangs fails at this timeout instead of holding up the suite.
describe('tokenwarden serve: command line, config checks, files', { skip, timeout: 120_000 }, () => {
  let dir
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'tokenwarden-cli-'))
  })
  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  /** A config file with one fleet `ci` whose fleet fields and quota `q` are overridden. */
  let n = 0
  /** A config file: one fleet `ci` with one quota `q`, overridden; `edit` rewrites its text. */
  function configFile({ fleet = {}, quota = {}, top = {}, edit = (t) => t } = {}) {
    const file = join(dir, `config-${++n}.json`)
    const q = { config: { pools: [{ name: 'm', input_tokens_per_minute: 60_000 }] }, ...quota }
    writeFileSync(file, edit(JSON.stringify({ ...top, fleets: { ci: { secret: SECRET, quotas: { q }, ...fleet } } })))
    return file
  }

  test('plan sizes a fleet with the core: seed 003 and seed 000 as in the README; bad input exits 2 naming the field', async () => {
    const plans = fileURLToPath(new URL('../../../examples/plans/', import.meta.url))
    const seed003 = await run(['plan', join(plans, 'seed003.json')])
    assert.equal(seed003.code, 0, seed003.stderr)
    assert.match(seed003.stdout, /input_tokens +142270 \/min +of +170000 +83\.6 % +<- binds first/)
    assert.match(seed003.stdout, /agents of this mix that fit at 75 %: 17/)
    const mag = await run(['plan', join(plans, 'mag-gateway.json'), '--json'])
    assert.equal(mag.code, 0, mag.stderr)
    const p = JSON.parse(mag.stdout)
    assert.equal(p.bindingAxis, 'concurrent')
    assert.equal(p.agentsThatFit, 18)
    assert.deepEqual(p.axes.map((a) => [a.axis, a.demand, a.usedPermille]), [['requests', 80, 666], ['concurrent', 16, 800]])
    const dir = mkdtempSync(join(tmpdir(), 'tokenwarden-plan-'))
    try {
      const bad = join(dir, 'bad.json')
      writeFileSync(bad, JSON.stringify({ pool: { name: 'k' }, agents: [{ name: 'a', count: 1, calls_per_minute_milli: 1, input_tokens_first: 10, input_tokens_last: 5, output_tokens: 0 }] }))
      const r = await run(['plan', bad])
      assert.equal(r.code, 2)
      assert.match(r.stderr, /agents\[0\]\.input_tokens_last` must be at least input_tokens_first/)
      const missing = await run(['plan', join(dir, 'none.json')])
      assert.equal(missing.code, 2)
      assert.match(missing.stderr, /cannot read/)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  test('--version prints the package version and exits 0; --help mentions it', async () => {
    for (const args of [['--version'], ['serve', '--version']]) {
      const r = await run(args)
      assert.equal(r.code, 0, r.stderr)
      assert.equal(r.stdout, `tokenwarden ${pkg.version}\n`)
    }
    const help = await run(['--help'])
    assert.equal(help.code, 0)
    assert.match(help.stdout, /--version/)
  })

  const bad = [
    ['a secret under 16 characters', { fleet: { secret: 'short' } }, /fleets\.ci\.secret: must be a string of .*16/],
    ['a secret of 20 spaces', { fleet: { secret: ' '.repeat(20) } }, /fleets\.ci\.secret: .*only spaces/],
    ['proxy_open given as a string', { fleet: { proxy_open: 'true' } }, /fleets\.ci\.proxy_open: must be /],
    ['a misspelled fleet field', { fleet: { proxy_opne: true } }, /fleets\.ci\.proxy_opne: unknown field/],
    ['a misspelled quota field', { quota: { upstrem: 'https://api.anthropic.com' } }, /fleets\.ci\.quotas\.q\.upstrem: unknown field/],
    ['a field the file does not have', { top: { port: 8080 } }, /--config \S+: port: unknown field/],
    ['no fleet', { edit: () => '{ "fleets": {} }' }, /fleets: holds no fleet/],
    ['a limit past every number', { edit: (t) => t.replace('60000', '1e400') }, /out of range/],
    ['an ftp upstream', { quota: { upstream: 'ftp://api.anthropic.com' } }, /fleets\.ci\.quotas\.q\.upstream: must be https/],
    ['a negative limit', { quota: { config: { pools: [{ name: 'm', input_tokens_per_minute: -5 }] } } }, /fleets\.ci\.quotas\.q\.config\.pools\[0\]\.input_tokens_per_minute: .*-5/],
    ['an empty core config', { quota: { config: {} } }, /fleets\.ci\.quotas\.q\.config: .*missing field `pools`/],
    ['an upstream that does not resolve', { quota: { upstream: 'https://no-such-host.invalid' } }, /fleets\.ci\.quotas\.q\.upstream: .*no-such-host\.invalid.* does not resolve/],
  ]
  for (const [name, override, message] of bad) {
    test(`a bad config is refused before anything starts: ${name}`, async () => {
      const data = join(dir, `bad-${n + 1}`)
      const r = await run(['serve', '--config', configFile(override), '--port', '0', '--data', data])
      assert.equal(r.started, false, `it started: ${r.stdout}`)
      assert.equal(r.code, 2, r.stderr)
      assert.equal(r.stdout, '', 'no banner')
      assert.equal(r.stderr.split('\n').filter(Boolean).length, 1, `one line: ${r.stderr}`)
      assert.match(r.stderr, message)
      assert.equal(existsSync(join(data, 'workerd.capnp')), false, 'no workerd config was written')
    })
  }

  test('native serve: TOKENWARDEN_THREADS out of 1..1024 is one line naming it, exit 2; 1 serves', { skip: nativeServe ? false : 'native serve only' }, async () => {
    for (const v of ['0', 'two', '1025']) {
      const r = await run(['serve', '--config', configFile(), '--port', '0', '--data', join(dir, `threads-${v}`)], { env: { TOKENWARDEN_THREADS: v } })
      assert.equal(r.started, false, `it started: ${r.stdout}`)
      assert.equal(r.code, 2, r.stderr)
      assert.equal(r.stderr, `tokenwarden: TOKENWARDEN_THREADS must be a whole number from 1 to 1024, got "${v}"\n`)
    }
    const one = await run(['serve', '--config', configFile(), '--port', '0', '--data', join(dir, 'threads-1')], { env: { TOKENWARDEN_THREADS: '1' } })
    assert.equal(one.started, true, one.stderr)
  })

  test('a --data that cannot be made (under /proc) is one line, at once: it hung in mkdir', async () => {
    const started = Date.now()
    const r = await run(['serve', '--config', configFile(), '--port', '0', '--data', '/proc/tokenwarden-x'])
    assert.equal(r.started, false, `it started: ${r.stdout}`)
    assert.equal(r.code, 1, r.stderr)
    assert.match(r.stderr, /^tokenwarden: cannot make \/proc\/tokenwarden-x a private directory/)
    assert.ok(Date.now() - started < 10_000, 'no hang')
  })

  test('a port in use: one line naming it, exit 1, no banner', async () => {
    // Something else on the port that even answers /healthz.
    const other = createServer((req, res) => res.end('{"ok":true}'))
    await new Promise((r) => other.listen(0, '127.0.0.1', r))
    const { port } = other.address()
    try {
      const r = await run(['serve', '--config', configFile(), '--port', String(port), '--data', join(dir, 'in-use')])
      assert.equal(r.started, false, `it started: ${r.stdout}`)
      assert.equal(r.code, 1, r.stderr)
      assert.equal(r.stdout, '', 'no banner')
      assert.equal(r.stderr, `tokenwarden: port ${port} on 127.0.0.1 is in use (EADDRINUSE); pick another with --port\n`)
    } finally {
      await new Promise((r) => other.close(r))
    }
  })

  test('--port 0: the banner names the port it got, which answers', async () => {
    const s = await serve(['--config', configFile(), '--port', '0', '--data', join(dir, 'port-0')])
    try {
      const m = /on http:\/\/127\.0\.0\.1:(\d+)\n/.exec(s.out)
      assert.ok(m, s.out)
      const port = Number(m[1])
      assert.notEqual(port, 0)
      assert.ok(s.out.includes(`ANTHROPIC_BASE_URL=http://127.0.0.1:${port}/v1/fleets/ci/quotas/q/agents/<agent>/<role>/anthropic`), s.out)
      const r = await fetch(`http://127.0.0.1:${port}/healthz`)
      assert.equal(r.status, 200)
      assert.equal((await r.json()).ok, true)
    } finally {
      await stop(s.child)
    }
  })

  test('under umask 000, a secret file readable by others is refused, naming it and the fix', async () => {
    const data = join(dir, 'open-secret')
    mkdirSync(data)
    const secret = join(data, 'secret')
    writeFileSync(secret, `${SECRET}\n`)
    chmodSync(secret, 0o644)
    const r = await run(['serve', '--port', String(await freePort()), '--data', data], { umask: '000' })
    assert.equal(r.started, false, `it started with a world-readable secret: ${r.stdout}`)
    assert.equal(r.code, 2, r.stderr)
    assert.equal(r.stdout, '')
    assert.ok(r.stderr.includes(`${secret} can be read by other users (mode 0644)`), r.stderr)
    assert.ok(r.stderr.includes(`chmod 600 ${secret}`), r.stderr)
    assert.equal(mode(secret), 0o644, 'left as it was, for the operator to decide')
  })

  test('under umask 000: the data, storage and worker directories are 0700 and fleets.json 0600, even where they were open before', async () => {
    const data = join(dir, 'open-data')
    mkdirSync(join(data, 'storage'), { recursive: true })
    chmodSync(data, 0o777)
    chmodSync(join(data, 'storage'), 0o777)
    writeFileSync(join(data, 'fleets.json'), '{}')
    chmodSync(join(data, 'fleets.json'), 0o644)
    const port = await freePort()
    const s = await serve(['--config', configFile(), '--port', String(port), '--data', data], { umask: '000' })
    try {
      // The quota's Durable Object writes its storage on first use.
      const r = await fetch(`http://127.0.0.1:${port}/v1/fleets/ci/quotas/q/metrics`, { headers: { authorization: `Bearer ${SECRET}` } })
      assert.equal(r.status, 200, await r.text())
      assert.equal(JSON.parse(readFileSync(join(data, 'fleets.json'), 'utf8')).ci.secret, SECRET)
      // Native serve has no Worker to write (worker/, workerd.capnp).
      const own = nativeServe ? [] : [join(data, 'worker')]
      for (const d of [data, join(data, 'storage'), ...own]) assert.equal(octal(mode(d)), '0700', d)
      assert.equal(octal(mode(join(data, 'fleets.json'))), '0600')
      const stored = walk(join(data, 'storage'))
      assert.ok(stored.length > 0, 'the quota has storage')
      const files = nativeServe ? stored : [...stored, ...walk(join(data, 'worker')), join(data, 'workerd.capnp')]
      for (const f of files) assert.equal(mode(f) & 0o077, 0, `${f} is ${octal(mode(f))}`)
    } finally {
      await stop(s.child)
    }
  })

  test('under umask 000, the default fleet: a new data directory 0700, its secret and fleets.json 0600', async () => {
    const data = join(dir, 'fresh', 'state')
    const s = await serve(['--port', String(await freePort()), '--data', data], { umask: '000' })
    try {
      assert.match(s.out, /fleet local, quota anthropic/)
      for (const d of [data, join(data, 'storage'), ...(nativeServe ? [] : [join(data, 'worker')])]) assert.equal(octal(mode(d)), '0700', d)
      for (const f of ['secret', 'fleets.json']) assert.equal(octal(mode(join(data, f))), '0600', f)
      assert.equal(readFileSync(join(data, 'secret'), 'utf8').trim().length >= 16, true)
    } finally {
      await stop(s.child)
    }
  })
})
