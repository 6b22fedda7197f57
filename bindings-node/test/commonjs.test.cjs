// The package loads from CommonJS too (`require` of the ESM build, Node >= 20.19 / 22.12).
const assert = require('node:assert/strict')
const { test } = require('node:test')

test('require("tokenwarden") gives the same API', async () => {
  const tw = require('tokenwarden')
  assert.equal(typeof tw.createTokenwarden, 'function')
  assert.equal(typeof tw.Driver, 'function')
  const t = tw.createTokenwarden({ config: { pools: [{ name: 'p', requests_per_minute: 60 }] } })
  const lease = await t.acquire({ agent: 1, pool: 0 })
  assert.equal(lease.settle({}).reserved[3], 1)
  t.close()
  const driver = require('tokenwarden/driver')
  assert.equal(driver.Driver, tw.Driver, 'tokenwarden/driver is the same layer')
})
