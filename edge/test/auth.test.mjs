// The edge limiter's authentication in Node, where the heap can be measured exactly: what
// an unauthenticated caller sends is hashed and forgotten, so 10,000 hostile requests leave
// nothing behind (before, the digest of every distinct expected string was kept, and for an
// unknown fleet that string held the presented secret: 4,000 random 60 kB bearers kept
// about 320 MiB).
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { HttpError, MAX_SECRET_CHARS, agentCredential, authenticate, authenticateAdmin, parseFleets } from '../src/auth.js'

setFlagsFromString('--expose-gc')
const gc = runInNewContext('gc')

const fleets = parseFleets(JSON.stringify({ f: { secret: 'the-fleet-secret-0123456789', quotas: { q: { config: { pools: [{ name: 'm' }] } } } } }))
const request = (headers) => new Request('http://limiter/x', { headers })
const random = (n, seed) => {
  let s = seed >>> 0 || 1
  let out = ''
  while (out.length < n) {
    s ^= s << 13
    s ^= s >>> 17
    s ^= s << 5
    out += (s >>> 0).toString(36)
  }
  return out.slice(0, n)
}

async function refused(promise) {
  await assert.rejects(promise, (e) => e instanceof HttpError && e.status === 401)
}

test('10,000 hostile authentications keep under 20 MiB of heap: nothing is keyed by what a caller sends', async (t) => {
  const shapes = [
    (i) => authenticate(fleets, 'nofleet', request({ authorization: `Bearer ${random(500, i + 1)}` })),
    (i) => authenticateAdmin(fleets, 'f', request({ authorization: `Bearer ${random(400, i + 7)}` })),
    (i) => authenticate(fleets, `fleet-${random(40, i + 3)}`, request({ authorization: `Bearer twa1.${random(40, i + 3)}.y.${random(43, i)}` })),
    (i) => authenticate(fleets, 'f', request({ 'x-tokenwarden-token': random(200, i + 11) })),
    (i) => authenticate(fleets, `g${i}`, request({ authorization: `Bearer ${random(60_000, i)}` })),
  ]
  for (let i = 0; i < 200; i++) await refused(shapes[i % shapes.length](i + 1_000_000))
  gc()
  const before = process.memoryUsage().heapUsed
  for (let i = 0; i < 10_000; i++) await refused(shapes[i % shapes.length](i))
  gc()
  const grown = (process.memoryUsage().heapUsed - before) / 1048576
  assert.ok(grown < 20, `the heap grew by ${grown.toFixed(1)} MiB`)
  t.diagnostic(`the heap grew by ${grown.toFixed(2)} MiB over 10,000 hostile authentications`)
})

test('an oversized secret is refused before it is hashed, in every place a secret is read', async () => {
  const big = 'x'.repeat(MAX_SECRET_CHARS + 1)
  for (const p of [
    authenticate(fleets, 'f', request({ authorization: `Bearer ${big}` })),
    authenticate(fleets, 'f', request({ 'x-tokenwarden-token': big })),
    authenticate(fleets, 'f', request({ 'x-tokenwarden-token': big }), { proxy: true }),
    authenticateAdmin(fleets, 'f', request({ authorization: `Bearer ${big}` })),
  ]) {
    await assert.rejects(p, (e) => e.status === 401 && /longer than 512 characters/.test(e.message))
  }
})

test('a fleet secret and a credential still open their fleet; another fleet or a forged MAC does not', async () => {
  const ok = await authenticate(fleets, 'f', request({ authorization: 'Bearer the-fleet-secret-0123456789' }))
  assert.equal(ok.agent, null)
  const cred = await agentCredential('the-fleet-secret-0123456789', 'f', 'alice')
  assert.equal((await authenticate(fleets, 'f', request({ authorization: `Bearer ${cred}` }))).agent, 'alice')
  await refused(authenticate(fleets, 'f', request({ authorization: `Bearer ${cred.slice(0, -2)}AA` })))
  await refused(authenticate(fleets, 'nofleet', request({ authorization: `Bearer ${cred}` })))
  await refused(authenticateAdmin(fleets, 'f', request({ authorization: 'Bearer the-fleet-secret-0123456789' })))
})

test('the fleets configuration names what is wrong', () => {
  const bad = (fleet, pattern) => assert.throws(() => parseFleets(JSON.stringify({ f: { quotas: { q: { config: { pools: [{ name: 'm' }] } } }, ...fleet } })), pattern)
  bad({ secret: 'short' }, /fleets\.f\.secret: must be a string of 16 to 512 characters/)
  bad({ secret: 'y'.repeat(600) }, /16 to 512/)
  bad({ secret: ' '.repeat(20) }, /fleets\.f\.secret: .*only spaces/)
  bad({ secret: 'the-fleet-secret-0123456789', proxy_open: 'true' }, /fleets\.f\.proxy_open: must be true, false or "credential"/)
  bad({ secret: 'the-fleet-secret-0123456789', proxy_opne: true }, /fleets\.f\.proxy_opne: unknown field/)
  bad({ secret: 'the-fleet-secret-0123456789', quotas: [] }, /fleets\.f\.quotas: must be an object of quotas/)
  bad({ secret: 'the-fleet-secret-0123456789', quotas: { q: { config: { pools: [{ name: 'm' }] }, upstrem: 'https://api.anthropic.com' } } }, /fleets\.f\.quotas\.q\.upstrem: unknown field/)
  bad({ secret: 'the-fleet-secret-0123456789', quotas: { q: { config: { pools: [{ name: 'm' }] }, upstream: 'ftp://api.anthropic.com' } } }, /fleets\.f\.quotas\.q\.upstream: must be https/)
  assert.throws(() => parseFleets('{}'), /TOKENWARDEN_FLEETS: fleets: holds no fleet/)
  assert.throws(() => parseFleets('{"f": {"secret": "the-fleet-secret-0123456789", "quotas": {"q": {"config": {"pools": [{"name": "m", "input_tokens_per_minute": 1e400}]}}}}}'), /out of range/)
})
