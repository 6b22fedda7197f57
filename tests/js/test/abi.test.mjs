// The engine under test reads the lease request and the usage by the field names of the
// generated convention (`abi.ts`, from the Rust crate tokenwarden-js-abi), on its object
// path as well as on the register file: a value only the object path takes (a bigint past
// 2^64, a role that does not exist) is refused naming that very field.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { LEASE_REQUEST_FIELDS, USAGE_FIELDS } from 'tokenwarden-driver'
import { engineName, engines } from '../support/engine.mjs'

const config = { pools: [{ name: 'p', input_tokens_per_minute: 100_000, output_tokens_per_minute: 100_000, requests_per_minute: 1_000 }] }
const TOO_BIG = 2n ** 64n

test(`every lease-request field is read by its name (${engineName})`, () => {
  const engine = engines.create(config, 1, 0)
  for (const field of LEASE_REQUEST_FIELDS) {
    const bad = field === 'role' ? 'admiral' : field === 'pool' || field === 'unblocks' ? 2 ** 40 : TOO_BIG
    assert.throws(
      () => engine.requestLease(0, { agent: 1, pool: 0, [field]: bad }),
      (e) => e.field === field && e.code === 'invalid_argument',
      `a bad \`${field}\` is refused naming it`,
    )
  }
  // And the good values of every field arrive: a planner unblocking 2 with a signature.
  const d = engine.requestLease(0, { agent: 7n, pool: 0, inputTokens: 10n, cachedPrefixTokens: 0, maxTokens: 5, role: 'planner', unblocks: 2, failureSignature: 3n })
  assert.equal(d.kind, 'grant')
  assert.equal(engine.metrics(0).agents[0].agent, 7)
})

test(`every usage field is read by its name (${engineName})`, () => {
  const engine = engines.create(config, 1, 0)
  const d = engine.requestLease(0, { agent: 1, pool: 0, inputTokens: 10, maxTokens: 5 })
  for (const field of USAGE_FIELDS) {
    assert.throws(
      () => engine.settle(1, d.lease, { [field]: TOO_BIG }),
      (e) => e.field === field && e.code === 'invalid_argument',
      `a bad \`${field}\` is refused naming it`,
    )
  }
  const s = engine.settle(1, d.lease, { inputTokens: 9n, cacheCreationInputTokens: 0, cacheReadInputTokens: 0, outputTokens: 4 })
  assert.deepEqual(s.used.slice(0, 2), [9, 4])
})
