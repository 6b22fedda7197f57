// The proxy's first step per proxied request (the gateway crate's `proxiedCall`: the path's
// names, the headers and query forwarded, the checks), through the addon and the wasm build
// in one run, for a Claude Code request's 19 headers; and the same through the engine's raw
// entry point (the string that crosses, the JSON that comes back):
//   cd bindings-node && node bench/proxied-call.mjs
// (a plain loop after a warm-up; these machines are noisy: compare the rows of one run).

import { wasmProviderRules } from 'tokenwarden-wasm'
import { nativeProviderRules } from '../dist/native.js'

const headers = [
  ['accept', 'application/json'],
  ['accept-encoding', 'gzip'],
  ['anthropic-beta', 'claude-code-20250219,oauth-2025-04-20'],
  ['anthropic-version', '2023-06-01'],
  ['connection', 'keep-alive'],
  ['content-type', 'application/json'],
  ['host', '127.0.0.1:8787'],
  ['user-agent', 'claude-cli/2.1.332 (external, cli)'],
  ['x-api-key', `sk-ant-api03-${'x'.repeat(90)}`],
  ['x-app', 'cli'],
  ['x-claude-code-session-id', '5e55a0a0-0000-4000-8000-000000000001'],
  ['x-stainless-arch', 'x64'],
  ['x-stainless-lang', 'js'],
  ['x-stainless-os', 'Linux'],
  ['x-stainless-package-version', '0.60.0'],
  ['x-stainless-retry-count', '0'],
  ['x-stainless-runtime', 'node'],
  ['x-stainless-runtime-version', 'v24.22.3'],
  ['x-stainless-timeout', '600'],
]
const secrets = ['a-fleet-secret-of-32-characters-x', 'an-admin-secret-of-32-characters']
const rest = '/agent/alice/role/worker/v1/messages'

function perCall(n, f) {
  for (let i = 0; i < Math.min(n, 2000); i++) f(i)
  const t = performance.now()
  for (let i = 0; i < n; i++) f(i)
  return ((performance.now() - t) * 1000) / n
}

const joined = headers.flat().join('\n')
const rows = []
for (const [name, rules] of [
  ['addon', nativeProviderRules],
  ['wasm', wasmProviderRules],
]) {
  const sent = JSON.parse(rules.proxiedCall(rest, '?beta=true', joined, secrets, null)).call.headers.length
  if (sent !== 16) throw new Error(`${name}: ${sent} headers forwarded, 16 expected (all but accept-encoding, connection, host)`)
  const raw = perCall(20000, () => rules.proxiedCall(rest, '?beta=true', joined, secrets, null))
  const whole = perCall(20000, () => {
    const read = JSON.parse(rules.proxiedCall(rest, '?beta=true', headers.flat().join('\n'), secrets, null))
    return new Headers(read.call.headers.map((i) => headers[i]))
  })
  const none = perCall(20000, () => rules.proxiedCall(rest, '?beta=true', '', secrets, null))
  rows.push([name, raw, whole, none])
}
console.log('| engine | proxiedCall, 19 headers (the engine call) | and the JavaScript around it (join, parse, Headers) | proxiedCall, no headers |')
console.log('|---|---:|---:|---:|')
for (const [name, ...xs] of rows) console.log(`| ${name} | ${xs.map((x) => `${x.toFixed(2)} µs`).join(' | ')} |`)
