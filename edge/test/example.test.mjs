// examples/edge-worker/local.mjs as its README runs it: it starts, prints what to try, and
// what it prints works (the lease curl's ask and the protocol's, by fetch); Ctrl-C stops it.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

const dir = fileURLToPath(new URL('../../examples/edge-worker/', import.meta.url))

/** Runs local.mjs with `args`; resolves with the child and its output once `until` matches it (or it exits). */
function run(args, until) {
  const child = spawn(process.execPath, ['local.mjs', ...args], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`local.mjs printed nothing expected in 60 s:\n${out}`))
    }, 60_000)
    const seen = (chunk) => {
      out += chunk
      if (until.test(out)) {
        clearTimeout(timer)
        resolve({ child, out })
      }
    }
    child.stdout.on('data', seen)
    child.stderr.on('data', seen)
    child.on('exit', (code) => {
      clearTimeout(timer)
      resolve({ child, out, code })
    })
  })
}

test('local.mjs starts the limiter, and the curls it prints work', { timeout: 90_000 }, async () => {
  const { child, out } = await run(['--port', '0'], /proxy .*\n/)
  try {
    const base = /edge limiter on (http:\/\/127\.0\.0\.1:\d+)/.exec(out)?.[1]
    const secret = /secret: ([^)]+)\)/.exec(out)?.[1]
    assert.ok(base && secret, out)
    /** The body and URL of a printed curl, sent the way curl sends them. */
    const curl = async (name) => {
      const line = new RegExp(`${name} +curl[^\\n]*\\n +-d '([^']*)' (\\S+)`).exec(out)
      assert.ok(line, `no ${name} curl in:\n${out}`)
      const res = await fetch(line[2], { method: 'POST', headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' }, body: line[1] })
      return { status: res.status, body: await res.json() }
    }
    const lease = await curl('lease')
    assert.equal(lease.status, 200, JSON.stringify(lease.body))
    assert.equal(lease.body.kind, 'grant')
    const ask = await curl('protocol')
    assert.equal(ask.status, 200, JSON.stringify(ask.body))
    assert.equal(ask.body.output, 'send')
    const metrics = await fetch(`${base}/v1/fleets/demo/quotas/anthropic/metrics?format=prometheus`, { headers: { authorization: `Bearer ${secret}` } })
    assert.match(await metrics.text(), /tokenwarden_/)
  } finally {
    child.kill('SIGINT')
  }
  const code = await new Promise((resolve) => child.on('exit', resolve))
  // Its own handler exits 0; miniflare's, when it runs first, exits 130 as a shell does on Ctrl-C.
  assert.ok(code === 0 || code === 130, `Ctrl-C stops it (exit ${code})`)
})

test('local.mjs refuses a port that is not one', async () => {
  const { out, code } = await run(['--port', 'eighty'], /$^/)
  assert.equal(code, 2)
  assert.match(out, /--port takes a port number/)
})
