// Builds native `tokenwarden serve` (the Rust crate serve/, release) for this machine and
// puts the binary beside the addon as `tokenwarden-serve.<platform>` (linux-x64-gnu, …),
// where `tokenwarden serve` finds it in the repository and scripts/pack.mjs puts it into
// this platform's package (as `tokenwarden-serve`). Run by `npm run build:native-serve`.
import { execFileSync } from 'node:child_process'
import { chmodSync, copyFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('../../', import.meta.url))
const libc = process.platform === 'linux' ? (process.report?.getReport?.()?.header?.glibcVersionRuntime ? '-gnu' : '-musl') : ''
const key = `${process.platform}-${process.arch}${libc}`
execFileSync('cargo', ['build', '--release', '--quiet', '-p', 'tokenwarden-serve'], { cwd: root, stdio: 'inherit' })
const exe = process.platform === 'win32' ? 'tokenwarden.exe' : 'tokenwarden'
const out = fileURLToPath(new URL(`../tokenwarden-serve.${key}`, import.meta.url))
copyFileSync(`${root}target/release/${exe}`, out)
chmodSync(out, 0o755)
// The release profile keeps line tables (backtraces); the shipped binary does without
// them: 44 MB → 8 MB on linux-x64. Where no `strip` is installed it ships as built.
try {
  execFileSync('strip', [out], { stdio: 'ignore' })
} catch {
  console.log('native serve: no strip here; the binary keeps its debug info')
}
console.log(`native serve: bindings-node/tokenwarden-serve.${key}`)
