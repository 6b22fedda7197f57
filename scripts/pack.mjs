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
//
// Beside them, `tokenwarden-bundled-<version>.tgz`: the `tokenwarden` package with every
// package of ours it needs inside it (npm's `bundleDependencies`: the driver, the wasm
// engine and each platform package packed here), so that one file installs it where our
// packages are on no registry (`npm i ./tokenwarden-bundled-0.1.0.tgz`). Every platform's
// addon is in it (npm installs a bundle whole; the loader picks the machine's), so it is
// about 23 MB where the package and one platform's are 8. The registry dependencies of
// the user's project (workerd, for `tokenwarden serve`) still come from the registry.
import { execFileSync } from 'node:child_process'
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
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

/**
 * Packs the staged package in `dir` into `out`, as `rename` if given (packed beside the
 * stage first: its own name is another tarball's); prints its line.
 */
function pack(dir, rename = null) {
  const into = rename === null ? out : dirname(dir)
  const [{ filename, size }] = JSON.parse(
    execFileSync('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', into], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }),
  )
  const file = join(out, rename ?? filename)
  // Copied, not renamed: the staging folder and `out` may be on different file systems.
  if (rename !== null) copyFileSync(join(into, filename), file)
  console.log(`${file} (${Math.round(size / 1024)} KiB)`)
}

/**
 * `tokenwarden` with the packages staged before it inside (see the header): each copied to
 * its `node_modules`, named in `bundleDependencies`.
 */
function bundle() {
  const main = join(staging, 'tokenwarden')
  const dir = join(staging, 'bundle', 'tokenwarden')
  cpSync(main, dir, { recursive: true })
  const manifest = JSON.parse(readFileSync(join(main, 'package.json'), 'utf8'))
  const ours = staged.filter((name) => name !== 'tokenwarden')
  for (const name of ours) cpSync(join(staging, name), join(dir, 'node_modules', name), { recursive: true })
  const wanted = [...Object.keys(manifest.dependencies ?? {}), ...Object.keys(manifest.optionalDependencies ?? {})]
  manifest.bundleDependencies = ours.filter((name) => wanted.includes(name))
  for (const name of Object.keys(manifest.dependencies ?? {})) {
    if (name.startsWith('tokenwarden') && !manifest.bundleDependencies.includes(name)) throw new Error(`the bundle needs ${name}, which was not packed`)
  }
  // A platform package not built here is not in the bundle, and not on a registry either.
  for (const name of Object.keys(manifest.optionalDependencies ?? {})) {
    if (!manifest.bundleDependencies.includes(name)) delete manifest.optionalDependencies[name]
  }
  writeFileSync(join(dir, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`)
  pack(dir, `tokenwarden-bundled-${version}.tgz`)
}

mkdirSync(out, { recursive: true })
const staging = mkdtempSync(join(tmpdir(), 'tokenwarden-pack-'))
/** The names of the packages staged so far. */
const staged = []
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
      // Native `tokenwarden serve` for the platform, where it was built
      // (bindings-node `npm run build:native-serve`).
      const platform = rel.slice('bindings-node/npm/'.length)
      const serve = join(root, 'bindings-node', `tokenwarden-serve.${platform}`)
      if (existsSync(serve)) {
        copyFileSync(serve, join(stage, 'tokenwarden-serve'))
        chmodSync(join(stage, 'tokenwarden-serve'), 0o755)
        manifest.files = [...manifest.files, 'tokenwarden-serve']
      } else console.log(`${manifest.name}: native serve not built (tokenwarden serve runs the Worker on workerd there)`)
    } else {
      for (const f of packedFiles(dir)) {
        if (f === 'package.json') continue
        mkdirSync(dirname(join(stage, f)), { recursive: true })
        copyFileSync(join(dir, f), join(stage, f))
      }
    }
    writeFileSync(join(stage, 'package.json'), `${JSON.stringify(published(manifest), null, 2)}\n`)
    pack(stage)
    staged.push(manifest.name)
  }
  bundle()
} finally {
  rmSync(staging, { recursive: true, force: true })
}
