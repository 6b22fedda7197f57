#!/usr/bin/env node
// Packs every npm package of this repository as it would be published, into one folder:
//
//   node scripts/pack.mjs [--out DIR]        # default: target/npm
//
// In the repository the packages point at each other with `file:` links and are marked
// private (nothing here is meant to be installed from a checkout by accident). This copies
// each package's files (exactly what `npm pack` would ship) to a staging folder, writes a
// package.json with the links replaced by the shared version and `private` dropped, and
// packs that. The per-platform packages (`bindings-node/npm/<platform>`) get the addon built
// for their platform (`bindings-node/tokenwarden.<platform>.node`); a platform whose addon
// was not built is left out, and says so. Prints one line per tarball. Run the builds
// first (`./scripts/test.sh` does, or: driver `npm run build`, bindings-node `npm run
// build`, bindings-wasm `./build.sh`).
import { execFileSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const { values: args } = parseArgs({ options: { out: { type: 'string', default: join(root, 'target', 'npm') } } })
const out = resolve(args.out)
const version = JSON.parse(readFileSync(join(root, 'bindings-node', 'package.json'), 'utf8')).version

/** The packages, in dependency order. */
const platforms = readdirSync(join(root, 'bindings-node', 'npm'), { withFileTypes: true })
  .filter((e) => e.isDirectory())
  .map((e) => `bindings-node/npm/${e.name}`)
const packages = ['driver', 'bindings-wasm', ...platforms, 'bindings-node']

/** What `npm pack` would put in the tarball of the package in `dir`. */
function packedFiles(dir) {
  const json = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
  return JSON.parse(json)[0].files.map((f) => f.path)
}

/** The manifest as published: links to sibling packages become the shared version. */
function published(manifest) {
  const m = structuredClone(manifest)
  delete m.private
  delete m.devDependencies
  delete m.scripts
  for (const field of ['dependencies', 'optionalDependencies']) {
    for (const [name, spec] of Object.entries(m[field] ?? {})) {
      if (typeof spec === 'string' && spec.startsWith('file:')) m[field][name] = version
    }
  }
  if (m.version !== version) throw new Error(`${m.name} is at ${m.version}, the repository at ${version}: one version for every package`)
  return m
}

mkdirSync(out, { recursive: true })
const staging = mkdtempSync(join(tmpdir(), 'tokenwarden-pack-'))
try {
  for (const rel of packages) {
    const dir = join(root, rel)
    const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'))
    const stage = join(staging, manifest.name)
    mkdirSync(stage, { recursive: true })
    if (rel.startsWith('bindings-node/npm/')) {
      const addon = manifest.main
      const built = join(root, 'bindings-node', addon)
      if (!existsSync(built)) {
        console.log(`skip ${manifest.name}: ${addon} was not built`)
        continue
      }
      copyFileSync(built, join(stage, addon))
    } else {
      for (const f of packedFiles(dir)) {
        if (f === 'package.json') continue
        mkdirSync(dirname(join(stage, f)), { recursive: true })
        copyFileSync(join(dir, f), join(stage, f))
      }
    }
    writeFileSync(join(stage, 'package.json'), `${JSON.stringify(published(manifest), null, 2)}\n`)
    const [{ filename, size }] = JSON.parse(
      execFileSync('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', out], { cwd: stage, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }),
    )
    console.log(`${join(out, filename)} (${Math.round(size / 1024)} KiB)`)
  }
} finally {
  rmSync(staging, { recursive: true, force: true })
}
